"""Shared figure style and helpers, all importable from :mod:`specrepro.record.plots`: :func:`setup` (one call at the
top of each notebook; Agg outside Jupyter), integer ticks, 95%-interval error bars, readable labels, and legends and
captions placed outside the axes so they cover no data (save_figure's tight bounding box keeps them in the file)."""

from __future__ import annotations

import os
import textwrap

import numpy as np
from matplotlib.figure import Figure

__all__ = ["setup", "PAPER_STYLE", "integer_ticks", "interval_error", "interval_errorbar", "READABLE", "readable",
           "unique_handles", "legend_outside", "legend_below", "add_caption"]


PAPER_STYLE = {"marker": "s", "linestyle": "--", "color": "0.35"}  # how the papers' numbers are drawn beside ours


def setup(context: str = "notebook"):
    """Seaborn whitegrid theme, colorblind palette, 150 dpi; returns the ``matplotlib.pyplot`` module."""
    import matplotlib

    if "JPY_PARENT_PID" not in os.environ and "ipykernel" not in os.environ.get("MPLBACKEND", ""):
        try:
            get_ipython()  # noqa: F821 - defined inside IPython kernels
        except NameError:
            matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(context=context, style="whitegrid", palette="colorblind")
    plt.rcParams.update({"figure.dpi": 110, "savefig.dpi": 150, "figure.figsize": (6.4, 4.0)})
    return plt


def integer_ticks(ax, axis: str = "x"):
    """Only integer ticks on ``axis`` ("x", "y" or "both") of ``ax`` (γ, K, tree width, head: integer axes must not
    get fractional ticks). Returns ``ax``."""
    from matplotlib.ticker import MaxNLocator

    for name in ("x", "y") if axis == "both" else (axis,):
        getattr(ax, f"{name}axis").set_major_locator(MaxNLocator(integer=True))
    return ax


def interval_errorbar(ax, x, estimate, low, high, **kwargs):
    """Points at ``estimate`` with asymmetric error bars from 95% intervals ``[low, high]`` (1-D, equal lengths, e.g.
    columns speedup, speedup_lo, speedup_hi): no bar where a bound is NaN, never a zero-length one that would look
    exact. ``kwargs`` go to ``ax.errorbar`` (``capsize`` 3, ``fmt`` "o" by default). Returns the ErrorbarContainer.
    Raises ValueError for unequal lengths or an interval that does not contain its estimate."""
    x, est, lo, hi = (np.asarray(v, dtype=float) for v in (x, estimate, low, high))
    if not (x.shape == est.shape == lo.shape == hi.shape):
        raise ValueError("x, estimate, low and high must have the same length")
    known = np.isfinite(lo) & np.isfinite(hi)
    if np.any(known & ((lo > est + 1e-12) | (hi < est - 1e-12))):
        raise ValueError("an interval does not contain its estimate")
    kwargs.setdefault("capsize", 3)
    kwargs.setdefault("fmt", "o")
    return ax.errorbar(x, est, yerr=interval_error(est, lo, hi), **kwargs)


def interval_error(estimate, low, high):
    """The ``[2, n]`` error-bar lengths ``estimate - low`` and ``high - estimate`` of 95% intervals, NaN (no bar)
    where either bound is not finite."""
    est, lo, hi = (np.asarray(v, dtype=float) for v in (estimate, low, high))
    known = np.isfinite(lo) & np.isfinite(hi)
    return np.vstack([np.where(known, est - lo, np.nan), np.where(known, hi - est, np.nan)])


#: code names that figures show as words
READABLE = {"no_residual": "no residual (control)", "resample_from_q": "resample from q (control)",
            "raw_q": "raw q ratio (control)", "speculative": "speculative sampling", "ar": "AR",
            "tokens_per_step": "tokens per step", "tokens_per_s": "tokens/s", "accepted_fraction": "accepted / (K + 1)",
            "loop_ms": "ms per loop"}


def readable(name: str) -> str:
    """A label for a code name (``no_residual`` -> "no residual (control)"; unknown names: underscores to spaces)."""
    return READABLE.get(name, str(name).replace("_", " "))


def unique_handles(axes) -> tuple[list, list]:
    """The legend entries of every axes in ``axes``, each label once (its first handle): ``(handles, labels)``."""
    pairs = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            pairs.setdefault(lab, h)
    return list(pairs.values()), list(pairs)


def legend_outside(target, handles=None, labels=None, **kwargs):
    """A legend (small, frameless) to the right of the axes (``target`` an Axes) or of every axes (``target`` a
    Figure), duplicate labels merged. Returns the Legend (None if there is nothing to label)."""
    if handles is None:
        handles, labels = unique_handles(target.axes if isinstance(target, Figure) else [target])
    if not handles:
        return None
    kwargs.setdefault("fontsize", 8)
    kwargs.setdefault("frameon", False)
    if isinstance(target, Figure):
        right = max(ax.get_position().x1 for ax in target.axes)
        return target.legend(handles, labels, loc="center left", bbox_to_anchor=(right + 0.01, 0.5), **kwargs)
    return target.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0, **kwargs)


def _lowest_y(fig) -> float:
    """The bottom of everything drawn on ``fig``, in figure coordinates (may be < 0 under bbox_inches='tight')."""
    fig.canvas.draw()
    return min(0.0, fig.get_tightbbox(fig.canvas.get_renderer()).y0 / fig.get_figheight())


def legend_below(fig, axes, ncol: int | None = None, **kwargs):
    """One legend for ``axes`` (an Axes or a list; duplicate labels merged), centred under the lowest artist of
    ``fig`` (x labels included) in ``ncol`` columns (default: up to 3). Call after the panels are laid out.
    Returns the Legend, or None when no artist has a label."""
    handles, labels = unique_handles(np.atleast_1d(axes).ravel())
    if not handles:
        return None
    y = _lowest_y(fig)
    kwargs.setdefault("fontsize", 8)
    kwargs.setdefault("frameon", False)
    return fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, y - 0.01),
                      ncol=ncol or min(len(labels), 3), **kwargs)


def add_caption(fig, text: str, width: int = 130):
    """A caption (``text`` wrapped at ``width`` characters, left-aligned, small) under everything already drawn on
    ``fig`` (panels, labels, a :func:`legend_below` legend). Returns the Text artist."""
    return fig.text(0.01, _lowest_y(fig) - 0.015, textwrap.fill(text, width), ha="left", va="top", fontsize=7,
                    color="0.25")
