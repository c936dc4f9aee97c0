"""The notebooks' figures (``plots.<name>``) and their shared style and helpers: :func:`setup` (one call
at the top of each notebook; Agg outside Jupyter), integer ticks, 95%-interval error bars, readable labels, and legends
and captions placed outside the axes so they cover no data (save_figure's tight bounding box keeps them in the file).
Each figure takes its notebook's table and returns a Figure: ours with 95%-interval error bars, the paper's numbers in
:data:`PAPER_STYLE` where printed, integer ticks on integer axes, the legend outside the axes: right of Leviathan et
al. 2023's (notebooks 02, 04), below the others' (05-07, 09) above a caption on where the paper's numbers come from.
Drawing only: a notebook saves a figure with its provenance through :func:`specrepro.record.results.save_figure`.
"""

from __future__ import annotations

import builtins
import os
import textwrap

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from specrepro.lab.papers import paper_table
from specrepro.theory import operations_factor, optimal_gamma, walltime_improvement

PAPER_STYLE = {"marker": "s", "linestyle": "--", "color": "0.35"}  # how the papers' numbers are drawn beside ours
_PAPER_POINTS = {**PAPER_STYLE, "linestyle": "none"}  # a paper's numbers as unconnected markers
#: the rungs of the limit ladder (keys of :func:`specrepro.theory.speedup_decomposition`) and their labels
LADDER = (("tokens_per_step", "tokens per step (Leviathan, c = 0, flat verification)"),
          ("free_draft", "free draft (measured verification cost)"),
          ("hardware_aware", "hardware-aware (+ draft cost)"), ("with_overhead", "hardware-aware + loop overhead"))


def setup(context: str = "notebook"):
    """Seaborn whitegrid theme, colorblind palette, 150 dpi; returns the ``matplotlib.pyplot`` module."""
    import seaborn as sns

    in_jupyter = "JPY_PARENT_PID" in os.environ or "ipykernel" in os.environ.get("MPLBACKEND", "")
    if not in_jupyter and not hasattr(builtins, "get_ipython"):  # IPython kernels define get_ipython there
        matplotlib.use("Agg")

    sns.set_theme(context=context, style="whitegrid", palette="colorblind")
    plt.rcParams.update({"figure.dpi": 110, "savefig.dpi": 150, "figure.figsize": (6.4, 4.0)})
    return plt


def integer_ticks(ax, axis: str = "x"):
    """Only integer ticks on ``axis`` ("x", "y" or "both") of ``ax`` (γ, K, tree width, head: integer axes must not
    get fractional ticks). Returns ``ax``."""
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
    return ax.errorbar(x, est, yerr=interval_error(est, lo, hi), **{"capsize": 3, "fmt": "o", **kwargs})


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
        handles, labels = unique_handles(target.axes if isinstance(target, plt.Figure) else [target])
    if not handles:
        return None
    kwargs = {"fontsize": 8, "frameon": False, **kwargs}
    if isinstance(target, plt.Figure):
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
    kwargs = {"fontsize": 8, "frameon": False, **kwargs}
    return fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, _lowest_y(fig) - 0.01),
                      ncol=ncol or min(len(labels), 3), **kwargs)


def add_caption(fig, text: str, width: int = 130):
    """A caption (``text`` wrapped at ``width`` characters, left-aligned, small) under everything already drawn on
    ``fig`` (panels, labels, a :func:`legend_below` legend). Returns the Text artist."""
    return fig.text(0.01, _lowest_y(fig) - 0.015, textwrap.fill(text, width), ha="left", va="top", fontsize=7,
                    color="0.25")


def leviathan_table2():
    """Leviathan et al. 2023 Tables 2/4 as a DataFrame: columns task, draft, temperature, gamma, alpha, c,
    predicted (the paper's EXP), measured (EMP); 12 rows (T5-XXL target on one TPU-v4)."""
    return paper_table("leviathan_table2")


def _ci(ax, x, table, col: str, **kwargs):
    """:func:`interval_errorbar` of ``table[col]`` with its 95% interval ``col``_lo, ``col``_hi."""
    return interval_errorbar(ax, x, table[col], table[f"{col}_lo"], table[f"{col}_hi"], **kwargs)


def _outside(fig, target, ticks: str | None = None):
    """Integer ``ticks`` on ``target`` (an Axes), the figure laid out (``target`` the Figure), a legend right of it."""
    if ticks:
        integer_ticks(target, ticks)
    else:
        fig.tight_layout()
    legend_outside(target)
    return fig


def _below(fig, axes, caption: str, ncol: int | None = None, title: str | None = None):
    """``title`` (the axes' title of a one-axes figure, else the suptitle), layout, a legend and ``caption`` below."""
    if title:
        (fig.axes[0].set_title if len(fig.axes) == 1 else fig.suptitle)(title, fontsize=9)
    fig.tight_layout()
    legend_below(fig, axes, ncol=ncol)
    add_caption(fig, caption)
    return fig


def fig_optimal_gamma_vs_alpha(cs=(0.01, 0.02, 0.05, 0.1, 0.2, 0.4), alphas=None, max_gamma: int = 64,
                               measured=None, paper=None):
    """Leviathan Figure 3: the optimal γ* (Thm 3.8 maximized over integer γ <= max_gamma) vs α, one curve per c in
    ``cs``, not drawn where no γ gives a speedup; ``measured`` (label, alpha, c, optionally best_gamma): our drafts
    as filled stars at γ*, their best measured γ as open ones; ``paper`` (alpha, gamma; :func:`leviathan_table2`):
    the settings the paper ran. Raises ValueError for a c < 0, an α outside [0, 1] or max_gamma < 1."""
    if max_gamma < 1:
        raise ValueError(f"max_gamma must be >= 1, got {max_gamma}")
    alphas = np.linspace(0.01, 0.95, 189) if alphas is None else np.asarray(alphas, dtype=float)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for c in cs:
        if c < 0:
            raise ValueError(f"c must be >= 0, got {c}")
        g = np.array([optimal_gamma(a, c, max_gamma) for a in alphas], dtype=float)
        gain = np.array([walltime_improvement(a, gi, c) for a, gi in zip(alphas, g)])
        g[gain <= 1] = np.nan
        ax.plot(alphas, g, drawstyle="steps-post", label=f"c = {c:g}")
    if paper is not None and len(paper):
        ax.plot(paper["alpha"], paper["gamma"], **_PAPER_POINTS, mfc="none",
                label="Leviathan Table 2: (α, γ) the paper ran")
    for i, (_, row) in enumerate(() if measured is None else measured.iterrows()):
        star = dict(marker="*", markersize=13, linestyle="none", color=f"C{(len(cs) + i) % 10}")
        gstar = optimal_gamma(float(row["alpha"]), float(row["c"]), max_gamma)
        ax.plot([row["alpha"]], [gstar], markeredgecolor="k", **star,
                label=f"ours: {row['label']} (α = {row['alpha']:.2f}, c = {row['c']:.2f}), γ* = {gstar}")
        if "best_gamma" in measured and np.isfinite(row.get("best_gamma", np.nan)):
            ax.plot([row["alpha"]], [row["best_gamma"]], mfc="none", **star,
                    label=f"ours: {row['label']}, best measured γ = {int(row['best_gamma'])}")
    ax.set(xlabel="α (acceptance rate)", ylabel="optimal γ (draft length)", ylim=(0, None),
           title="Optimal γ vs α (Leviathan Fig. 3, computed)")
    return _outside(fig, ax, "y")


def fig_speedup_and_operations_vs_alpha(gammas=(2, 3, 5, 10), c: float = 0.0, c_hat: float = 0.0, alphas=None,
                                        paper=None, measured=None):
    """Leviathan Figure 4 view vs α, one curve per γ: walltime improvement (Thm 3.8, cost ratio c) and operations
    (Thm 3.11, ĉ) panels; ``paper`` (alpha, paper_speed, paper_operations: Table 1, c = ĉ = 0) on both, ``measured``
    (label, alpha, speedup, optionally speedup_lo / _hi) as starred error bars on the left. ValueError: c or ĉ < 0."""
    if c < 0 or c_hat < 0:
        raise ValueError(f"c and c_hat must be >= 0, got {c}, {c_hat}")
    alphas = np.linspace(0, 0.99, 100) if alphas is None else np.asarray(alphas, dtype=float)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, g in enumerate(gammas):
        left.plot(alphas, walltime_improvement(alphas, g, c), color=f"C{i}", label=f"γ = {g}")
        right.plot(alphas, operations_factor(alphas, g, c_hat), color=f"C{i}")
    if paper is not None and len(paper):
        left.plot(paper["alpha"], paper["paper_speed"], **_PAPER_POINTS, mfc="none", markersize=8,
                  label="Leviathan Table 1 (c = ĉ = 0)")
        right.plot(paper["alpha"], paper["paper_operations"], **_PAPER_POINTS, mfc="none", markersize=8)
    for j, (_, row) in enumerate(() if measured is None else measured.iterrows()):
        interval_errorbar(left, [row["alpha"]], [row["speedup"]], [row.get("speedup_lo", np.nan)],
                          [row.get("speedup_hi", np.nan)], fmt="*", markersize=11, color=f"C{len(gammas) + j}",
                          markeredgecolor="k", label=f"ours, measured: {row['label']}")
    for ax, ylabel, title in ((left, "walltime improvement (×)", f"Speedup vs α (Thm 3.8, c = {c:g})"),
                              (right, "arithmetic operations (×)", f"Operations vs α (Thm 3.11, ĉ = {c_hat:g})")):
        ax.axhline(1, color="0.5", lw=0.8)
        ax.set(xlabel="α (acceptance rate)", ylabel=ylabel, title=title)
    return _outside(fig, fig)


def fig_speedup_vs_gamma_closed_form(cs=(0.02, 0.1, 0.3), alphas=(0.5, 0.7, 0.8, 0.9), max_gamma: int = 12):
    """Thm 3.8's walltime improvement vs γ = 1..max_gamma, one panel per c, one curve per α, each optimum ringed.
    Computed only: the paper draws no such figure (its Fig. 3 is the optimum's position)."""
    gs = np.arange(1, int(max_gamma) + 1)
    fig, (axes,) = plt.subplots(1, len(cs), figsize=(3.6 * len(cs), 3.6), sharey=True, squeeze=False)
    for ax, c in zip(axes, cs):
        for i, a in enumerate(alphas):
            ax.plot(gs, walltime_improvement(a, gs, c), marker=".", color=f"C{i}", label=f"α = {a:g}")
            best = optimal_gamma(a, c, int(max_gamma))
            ax.plot([best], [walltime_improvement(a, best, c)], marker="o", markersize=10, mfc="none",
                    color=f"C{i}", linestyle="none")
        ax.axhline(1, color="0.5", lw=0.8)
        integer_ticks(ax, "x").set(title=f"c = {c:g}", xlabel="γ (draft length)")
    axes[0].set_ylabel("walltime improvement (Thm 3.8, ×)")
    axes[0].plot([], [], marker="o", mfc="none", color="0.3", linestyle="none",
                 label=f"best γ in 1..{int(max_gamma)} (ringed)")
    return _outside(fig, fig)


def fig_forward_cost_vs_tokens(curves):
    """Measured ms (column ms, optionally ms_low / ms_high) of one KV-cached forward over n new tokens, one line per
    model of ``curves`` (:func:`specrepro.measure.cost.measure_cost_table`), beside Leviathan's model of it: flat at
    the n = 1 time (verifying n tokens costs one step), dashed."""
    fig, ax = plt.subplots()
    for i, (name, d) in enumerate(curves.groupby("model", sort=False)):
        d = d.sort_values("n")
        if {"ms_low", "ms_high"} <= set(d.columns):
            interval_errorbar(ax, d["n"], d["ms"], d["ms_low"], d["ms_high"], color=f"C{i}", fmt="-o",
                              label=readable(name))
        else:
            ax.plot(d["n"], d["ms"], marker="o", color=f"C{i}", label=readable(name))
        one = d.loc[d["n"] == d["n"].min(), "ms"].iloc[0]
        ax.plot([d["n"].min(), max(curves["n"])], [one, one], linestyle=PAPER_STYLE["linestyle"], color=f"C{i}",
                lw=1, alpha=0.7)
    ax.plot([], [], linestyle=PAPER_STYLE["linestyle"], color="0.35",
            label="Leviathan's model: verification as cheap as one step")
    ax.set(xlabel="new tokens n in one forward pass", ylabel="ms per forward (median, 95% interval)", ylim=(0, None),
           title="Forward cost vs tokens (KV-cached)")
    return _outside(fig, ax, "x")


def fig_speedup_vs_gamma_measured(summary, draft_col: str = "draft", paper=None, title: str = ""):
    """Measured speedup over AR vs γ (95% CI) beside the hardware-aware and constant-c (Thm 3.8) predictions, one
    colour per ``draft_col`` value of ``summary`` (:func:`specrepro.lab.leviathan.summarize_speed`: measured_speedup
    (_lo, _hi), predicted_speedup_hardware, predicted_speedup_constant_c, or its _in_run variant where a draft has it
    on every row); ``paper`` (gamma, measured, draft, task; :func:`leviathan_table2`): the paper's, labelled."""
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for i, (name, d) in enumerate(summary.groupby(draft_col, sort=False)):
        d = d.sort_values("gamma")
        col = f"C{i}"
        _ci(ax, d["gamma"], d, "measured_speedup", fmt="o-", color=col, label=f"{readable(name)}: measured (95% CI)")
        ax.plot(d["gamma"], d["predicted_speedup_hardware"], "s--", color=col, mfc="none",
                label=f"{readable(name)}: predicted, hardware-aware")
        in_run = "predicted_speedup_constant_c_in_run" in d and d["predicted_speedup_constant_c_in_run"].notna().all()
        ax.plot(d["gamma"], d["predicted_speedup_constant_c_in_run" if in_run else "predicted_speedup_constant_c"],
                "^:", color=col, mfc="none", label=f"{readable(name)}: predicted, constant c (Leviathan)"
                + (", c measured in the runs" if in_run else ""))
    if paper is not None and len(paper):
        ax.plot(paper["gamma"], paper["measured"], **_PAPER_POINTS,
                label="Leviathan Table 2, measured (T5-XXL, TPU-v4)")
        for _, row in paper.iterrows() if "draft" in paper else ():
            ax.annotate(f"{row.get('task', '')} {str(row['draft']).replace('T5-', '')}".strip(),
                        (row["gamma"], row["measured"]), xytext=(4, 0), textcoords="offset points", fontsize=6,
                        color=PAPER_STYLE["color"], va="center")
        # room right of the last γ for its labels ("EnDe small" at γ = 7), which would otherwise cross the frame
        lo, hi = ax.get_xlim()
        ax.set_xlim(lo, max(hi, float(paper["gamma"].max()) + 0.9))
    ax.axhline(1, color="0.5", lw=0.8)
    ax.set(xlabel="γ (draft length)", ylabel="speedup over AR (×)", title=title)
    return _outside(fig, ax, "x")


def fig_limit_ladder(limits, draft_col: str = "draft", title: str = ""):
    """The limit drawn, one panel per draft: per γ, bars for :data:`LADDER`'s successive predictions and the measured
    speedup (95% CI) as a black point; the drops between bars are the gap's shares due to verification, draft cost
    and overhead. ``limits``: :func:`specrepro.lab.leviathan.limit_table`'s ``draft_col``, gamma, the rungs, measured
    (_lo, _hi). Raises ValueError for a missing column or an empty table."""
    need = {draft_col, "gamma", "measured", "measured_lo", "measured_hi"} | {k for k, _ in LADDER}
    missing = need - set(limits.columns)
    if missing or not len(limits):
        raise ValueError(f"fig_limit_ladder needs a non-empty table with columns {sorted(need)}; "
                         f"missing {sorted(missing)}")
    drafts = list(dict.fromkeys(limits[draft_col]))
    fig, (axes,) = plt.subplots(1, len(drafts), figsize=(4.2 * len(drafts) + 0.6, 3.8), sharey=True, squeeze=False)
    width = 0.8 / len(LADDER)
    for ax, name in zip(axes, drafts):
        d = limits[limits[draft_col] == name].sort_values("gamma")
        x = d["gamma"].to_numpy(dtype=float)
        for j, (key, label) in enumerate(LADDER):
            ax.bar(x + (j - (len(LADDER) - 1) / 2) * width, d[key], width=width, color=f"C{j}", alpha=0.75, label=label)
        _ci(ax, x + (len(LADDER) - 1) / 2 * width, d, "measured", fmt="o", color="k", markersize=5, zorder=5,
            label="measured (95% CI over prompts)")
        ax.axhline(1, color="0.3", lw=0.8)
        ax.set(title=readable(name), xlabel="γ (draft length)", xticks=np.unique(x))  # the integer γ measured
    axes[0].set_ylabel("speedup over AR (×)")
    if title:
        fig.suptitle(title)
    return _outside(fig, fig)


def fig_chen_k_sweep(summary, *, title: str | None = None):
    """Chen et al. 2023 Figure 1 analogue, three panels vs K (0 = AR) of ``summary``
    (:func:`specrepro.lab.chen.k_sweep_summary`): speedup, accepted_fraction (with Leviathan Eq. 1's
    predicted_fraction) and loop_ms, each with _lo / _hi; paper_speedup (Chen Table 1) where given. KeyError: a
    missing column."""
    s = summary.sort_values("K")
    k = s["K"].to_numpy(dtype=float)
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    _ci(axes[0], k, s, "speedup", fmt="o-", color="C0", label="ours: median over prompts, 95% CI")
    axes[0].axhline(1, color="0.5", lw=0.8)
    if "paper_speedup" in s and s.loc[s["K"] > 0, "paper_speedup"].notna().any():
        p = s[(s["K"] > 0) & s["paper_speedup"].notna()]
        axes[0].plot(p["K"], p["paper_speedup"], **_PAPER_POINTS, markersize=7,
                     label="Chen et al. Table 1 (HumanEval, 70B + 4B, TPU)")
    axes[0].set(xlabel="K (draft tokens per loop)", ylabel="speedup over AR", title="speedup")
    _ci(axes[1], k, s, "accepted_fraction", fmt="o-", color="C0")
    if "predicted_fraction" in s:
        axes[1].plot(k, s["predicted_fraction"], "x:", color="C2",
                     label=r"prediction $(1-\alpha^{K+1})/((1-\alpha)(K+1))$ from our α")
    axes[1].set(xlabel="K", ylabel="tokens per loop / (K + 1)", title="accepted fraction", ylim=(0, 1.05))
    _ci(axes[2], k, s, "loop_ms", fmt="o-", color="C0")
    axes[2].set(xlabel="K", ylabel="ms per loop (prefill excluded)", title="loop time")
    for ax in axes:
        integer_ticks(ax, "x").set_xlim(np.min(k) - 0.5, np.max(k) + 0.5)
    return _below(fig, axes, "Paper's numbers: Chen et al. 2023 Table 1 gives one HumanEval point (K = 4, 2.46x; "
                             "Chinchilla 70B + 4B draft on TPU v4). Their Figure 1 curves (speedup, accepted "
                             "fraction, loop time vs K) are for XSum and their values are not printed in the text, "
                             "so the middle and right panels show ours only. Error bars: 95% percentile-bootstrap "
                             "intervals over prompts.", title=title)


def fig_specinfer_tree_width(summary, *, title: str | None = None):
    """SpecInfer Table 2 and latency vs tree width: ``summary``'s (:func:`specrepro.lab.specinfer.tree_width_summary`)
    tokens_per_step (left) and ms_per_token (right), each with _lo / _hi, per decoding (colour) and shape ("paper" =
    ⟨1,1,k,1,...⟩ solid, "root" = ⟨k,1,...,1⟩ hollow, dotted, shifted by ±0.1 in width); its paper column (Table 2,
    NaN where none) on the left. Raises KeyError for a missing column."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    shapes = [sh for sh in ("paper", "root") if (summary["shape"] == sh).any()]
    colors = {"greedy": "C0", "stochastic": "C1"}
    names = {"paper": "⟨1,1,k,1,…,1⟩ (SpecInfer's shape)", "root": "⟨k,1,…,1⟩ (branching at the first token)"}
    for si, sh in enumerate(shapes):
        for dec, color in colors.items():
            d = summary[(summary["shape"] == sh) & (summary["decoding"] == dec)].sort_values("width")
            if d.empty:
                continue
            x = d["width"].to_numpy(dtype=float) + (0.1 * (2 * si - 1) if len(shapes) > 1 else 0.0)
            style = dict(color=color, fmt="o-" if sh == "paper" else "o:",
                         markerfacecolor=color if sh == "paper" else "white")
            _ci(axes[0], x, d, "tokens_per_step", label=f"{dec}, ours, {names[sh]}", **style)
            _ci(axes[1], x, d, "ms_per_token", **style)
    paper = summary[(summary["shape"] == "paper") & summary["paper"].notna()] if "paper" in summary else summary[:0]
    for dec, d in paper.groupby("decoding"):
        d = d.sort_values("width")
        axes[0].plot(d["width"], d["paper"], **{**PAPER_STYLE, "color": colors.get(dec, "0.35")},
                     label=f"{dec}, SpecInfer Table 2 (LLaMA-7B/68M, Alpaca)")
    for ax, ylabel, name in zip(axes, ("verified tokens per step", "ms per generated token"),
                                ("tokens per step (Table 2)", "latency per token")):
        integer_ticks(ax, "x").set(xlabel="tree width k", ylabel=ylabel, title=name)
    left = ("Left: SpecInfer Table 2 (§6.4, trees ⟨1,1,k,1,1,1,1,1⟩, LLaMA-7B + LLaMA-68M on Alpaca, GPU) beside "
            "ours." if len(paper) else "Left: SpecInfer Table 2 is not drawn: its trees ⟨1,1,k,1,1,1,1,1⟩ have depth "
            "8, these another depth (or no tree of SpecInfer's shape was run).")
    return _below(fig, axes, left + " Right: SpecInfer's per-token latency vs width is not "
                             "transcribed in our paper notes, so ours only; our tree runs are sequential (not "
                             "interleaved with each other), so machine drift between widths is not paired away. "
                             "Error bars: 95% percentile-bootstrap intervals over prompts.", ncol=2, title=title)


def fig_medusa_dense_vs_sparse(summary, *, title: str | None = None):
    """Medusa §3.3.1 / Figure 5 analogue: ``summary``'s (:func:`specrepro.lab.medusa_ablation.tree_ablation`)
    tokens_per_step (_lo, _hi) vs nodes per kind (chain, dense, sparse trees of the same heads), the
    predicted_tokens_per_step from head accuracies (if given) hollow and dotted. KeyError: a missing column."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for kind, color, marker in (("chain", "C2", "^"), ("dense", "C0", "o"), ("sparse", "C1", "s")):
        d = summary[summary["kind"] == kind].sort_values("nodes")
        if d.empty:
            continue
        _ci(ax, d["nodes"], d, "tokens_per_step", fmt="-", marker=marker, color=color,
            label=f"{kind} tree{'s' if len(d) > 1 else ''}, measured (95% CI over prompts)")
        if "predicted_tokens_per_step" in d and d["predicted_tokens_per_step"].notna().any():
            ax.plot(d["nodes"], d["predicted_tokens_per_step"], linestyle=":", marker=marker, markerfacecolor="white",
                    color=color, label=f"{kind}, predicted from head accuracies")
    integer_ticks(ax, "x").set(xlabel="tree nodes (candidate tokens per step)",
                               ylabel="tokens per target step (greedy)")
    return _below(fig, ax, "Medusa's dense-vs-sparse comparison (§3.3.1, Figure 5; Vicuna-7B on GPU) is not "
                           "transcribed in our paper notes, so no paper numbers are drawn; its claim is the shape: "
                           "sparse trees reach a dense tree's tokens per step with fewer nodes. Error bars: 95% "
                           "percentile-bootstrap intervals over prompts.", ncol=2, title=title)


def fig_medusa_tokens_per_s(tables):
    """One horizontal bar of tokens_per_s (error bar from tokens_per_s_lo / _hi where given) per (method, setting) of
    ``tables`` (setting -> :func:`specrepro.lab.medusa.acceleration_table` output), labelled with its own table's
    method. Raises ValueError for no tables."""
    if not tables:
        raise ValueError("fig_medusa_tokens_per_s needs at least one table")
    both = pd.concat([t.assign(setting=s) for s, t in tables.items()], ignore_index=True)
    bounds = both.reindex(columns=["tokens_per_s_lo", "tokens_per_s_hi"])  # NaN where a table has no interval
    xerr = interval_error(both["tokens_per_s"], bounds["tokens_per_s_lo"], bounds["tokens_per_s_hi"])
    fig, ax = plt.subplots(figsize=(7.5, 0.34 * len(both) + 1.4))
    y = np.arange(len(both))
    for i, s in enumerate(tables):
        m = (both["setting"] == s).to_numpy()
        ax.barh(y[m], both.loc[m, "tokens_per_s"], xerr=xerr[:, m], color=f"C{i}", capsize=3,
                error_kw={"elinewidth": 1}, label=readable(s))
    ax.set_yticks(y, [f"{readable(mth)} · {readable(s)}" for mth, s in zip(both["method"], both["setting"])],
                  fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("tokens/s, median over prompts (95% CI; shared CPU)")
    return _below(fig, ax, "No paper numbers: tokens/s depend on the hardware; Medusa's speedups (Vicuna, GPU) "
                           "are compared with ours in the scorecard.", ncol=len(tables))


def fig_verifier_node_budget(summary, *, title: str | None = None):
    """Tokens per step (_lo, _hi) vs node budget N, one line per verifier of ``summary``
    (:func:`specrepro.lab.verifiers.node_budget_summary`: label, structure "chain" dashed / "tree" solid, budget),
    shifted by up to ±0.15 in N. KeyError: a missing column; ValueError: an empty summary."""
    if summary.empty:
        raise ValueError("fig_verifier_node_budget needs at least one row")
    fig, ax = plt.subplots(figsize=(6.8, 4.0))
    keys = list(dict.fromkeys(summary["verifier"]))
    for i, key in enumerate(keys):
        d = summary[summary["verifier"] == key].sort_values("budget")
        shift = 0.3 * (i / max(1, len(keys) - 1) - 0.5)
        _ci(ax, d["budget"] + shift, d, "tokens_per_step", fmt="o--" if d["structure"].iloc[0] == "chain" else "o-",
            color=f"C{i}", label=d["label"].iloc[0])
    integer_ticks(ax).set(xlabel="node budget N (drafted tokens per step)", ylabel="tokens per step (95% CI)")
    return _below(fig, ax, "Same draft model and prompts for every verifier; chains draft γ = N tokens, trees "
                           "N/2-deep pairs of unmerged paths. No paper numbers: each paper measured its own models "
                           "and drafts (their reported gains are in the verifier table).", ncol=2, title=title)
