"""Shared figure style: one call, :func:`setup`, at the top of each notebook (headless-safe: Agg outside Jupyter),
and the helpers every figure uses (integer ticks, interval error bars, readable labels, merged legend entries).
All are importable from :mod:`specrepro.record.plots`.
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["setup", "PAPER_STYLE", "integer_ticks", "interval_error", "interval_errorbar", "READABLE", "readable",
           "unique_handles"]


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
    """Points at ``estimate`` with asymmetric error bars from a 95% interval ``[low, high]`` (e.g. the harness's
    ``speedup``, ``speedup_lo``, ``speedup_hi`` columns; 1-D array-likes of equal length, NaN allowed in low/high),
    drawn without a bar where an interval is missing, never with a zero-length one that would look exact.
    ``kwargs`` go to ``ax.errorbar`` (``capsize`` defaults to 3, ``fmt`` to "o"). Returns the ErrorbarContainer.

    Raises:
        ValueError: the arrays differ in length, or an interval does not contain its estimate.
    """
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
