"""The record's figures: Leviathan's (notebooks 02 and 04) here, the others in :mod:`specrepro.record.plots_papers`,
and the shared style and helpers of :mod:`specrepro.record.plotkit` (:func:`setup`, one call at the top of each
notebook); all importable from here.

Leviathan et al. 2023's computed curves (arXiv 2211.17192v2, Sec. 3, from :mod:`specrepro.theory`) with the paper's
printed numbers and our measurements marked on them, and notebook 04's "limit drawn" (tokens per step -> free draft
-> hardware-aware -> measured, per draft and γ). Every function returns a Figure with its legend outside the axes
(:func:`legend_outside`), so no legend covers data.

What it is not: the saving of figures (that is :func:`specrepro.record.results.save_figure`, which adds provenance).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from specrepro.record import plotkit, plots_papers
from specrepro.record.plotkit import *  # noqa: F401,F403 - re-exported: the notebooks call them as plots.<name>
from specrepro.record.plotkit import PAPER_STYLE, integer_ticks, interval_errorbar, readable, unique_handles
from specrepro.record.plots_papers import *  # noqa: F401,F403 - re-exported: notebooks 05-07 and 09's figures

__all__ = [*plotkit.__all__, *plots_papers.__all__,
           # Leviathan figures (notebooks 02 and 04)
           "LADDER", "leviathan_table2", "legend_outside", "fig_optimal_gamma_vs_alpha",
           "fig_speedup_and_operations_vs_alpha", "fig_speedup_vs_gamma_closed_form", "fig_forward_cost_vs_tokens",
           "fig_speedup_vs_gamma_measured", "fig_limit_ladder"]

#: the rungs of the limit ladder (keys of :func:`specrepro.theory.speedup_decomposition`) and their labels
LADDER = (("tokens_per_step", "tokens per step (Leviathan, c = 0, flat verification)"),
          ("free_draft", "free draft (measured verification cost)"),
          ("hardware_aware", "hardware-aware (+ draft cost)"),
          ("with_overhead", "hardware-aware + loop overhead"))


def leviathan_table2():
    """Leviathan et al. 2023 Tables 2/4 as a DataFrame: columns task, draft, temperature, gamma, alpha, c,
    predicted (the paper's EXP), measured (EMP); 12 rows (T5-XXL target on one TPU-v4)."""
    from specrepro.lab.papers import paper_table

    return paper_table("leviathan_table2")


def legend_outside(target, handles=None, labels=None, **kwargs):
    """A legend placed to the right of the axes (``target`` an Axes) or of every axes (``target`` a Figure), where it
    cannot cover data; ``save_figure``'s tight bounding box keeps it in the saved file. Returns the Legend (None if
    there is nothing to label)."""
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


def fig_optimal_gamma_vs_alpha(cs=(0.01, 0.02, 0.05, 0.1, 0.2, 0.4), alphas=None, max_gamma: int = 64,
                               measured=None, paper=None):
    """Leviathan et al. 2023, Figure 3: the optimal draft length γ* vs α for several cost ratios c (computed, as in
    the paper, by maximizing Thm 3.8's walltime improvement over integer γ: :func:`specrepro.theory.optimal_gamma`),
    not drawn where no γ gives a speedup (α too small for c).

    Args:
        cs: cost ratios c = t_draft / t_target, one curve each. alphas: the curves' α (default 0.01..0.95).
        max_gamma: the largest γ searched (integer >= 1).
        measured: optional DataFrame of our drafts, columns label, alpha, c (and optionally best_gamma, the γ whose
            measured speedup was highest): each drawn at (α, γ*(α, c)) as a filled star, best_gamma as an open one.
        paper: optional DataFrame with columns alpha, gamma (e.g. :func:`leviathan_table2`): the settings the paper
            ran, drawn in :data:`PAPER_STYLE`.

    Returns:
        matplotlib Figure (one axes; integer γ ticks; legend outside the axes).

    Raises:
        ValueError: a c < 0, α outside [0, 1] or max_gamma < 1.
    """
    from specrepro.theory import optimal_gamma, walltime_improvement

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
        ax.plot(paper["alpha"], paper["gamma"], linestyle="none", marker=PAPER_STYLE["marker"],
                color=PAPER_STYLE["color"], mfc="none", label="Leviathan Table 2: (α, γ) the paper ran")
    if measured is not None and len(measured):
        for i, (_, row) in enumerate(measured.iterrows()):
            color = f"C{(len(cs) + i) % 10}"
            gstar = optimal_gamma(float(row["alpha"]), float(row["c"]), max_gamma)
            ax.plot([row["alpha"]], [gstar], marker="*", markersize=13, linestyle="none", color=color,
                    markeredgecolor="k", label=f"ours: {row['label']} (α = {row['alpha']:.2f}, c = {row['c']:.2f})"
                                              f", γ* = {gstar}")
            if "best_gamma" in measured and np.isfinite(row.get("best_gamma", np.nan)):
                ax.plot([row["alpha"]], [row["best_gamma"]], marker="*", markersize=13, linestyle="none",
                        mfc="none", color=color, label=f"ours: {row['label']}, best measured γ = "
                                                       f"{int(row['best_gamma'])}")
    ax.set(xlabel="α (acceptance rate)", ylabel="optimal γ (draft length)", ylim=(0, None),
           title="Optimal γ vs α (Leviathan Fig. 3, computed)")
    integer_ticks(ax, "y")
    legend_outside(ax)
    return fig


def fig_speedup_and_operations_vs_alpha(gammas=(2, 3, 5, 10), c: float = 0.0, c_hat: float = 0.0, alphas=None,
                                        paper=None, measured=None):
    """Leviathan et al. 2023, Figure 4 view: walltime improvement (Thm 3.8) and arithmetic-operations factor
    (Thm 3.11) vs α, one curve per γ, at draft cost ratios c (time) and ĉ (operations).

    Args:
        gammas: integer draft lengths, one curve each (default: the γ of the paper's Table 1).
        c, c_hat: cost ratios (>= 0) of the two panels (Table 1 uses c = ĉ = 0). alphas: α grid (default 0..0.99).
        paper: optional DataFrame with columns alpha, gamma, paper_speed, paper_operations (e.g.
            :func:`specrepro.lab.leviathan.leviathan_table1`), drawn in :data:`PAPER_STYLE` on both panels.
        measured: optional DataFrame of ours, columns label, alpha, speedup, speedup_lo, speedup_hi (95% interval;
            NaN allowed), drawn on the speedup panel with error bars.

    Returns:
        matplotlib Figure with two axes (speedup, operations); legend outside the axes.

    Raises:
        ValueError: c or ĉ < 0.
    """
    from specrepro.theory import operations_factor, walltime_improvement

    if c < 0 or c_hat < 0:
        raise ValueError(f"c and c_hat must be >= 0, got {c}, {c_hat}")
    alphas = np.linspace(0, 0.99, 100) if alphas is None else np.asarray(alphas, dtype=float)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, g in enumerate(gammas):
        left.plot(alphas, walltime_improvement(alphas, g, c), color=f"C{i}", label=f"γ = {g}")
        right.plot(alphas, operations_factor(alphas, g, c_hat), color=f"C{i}")
    if paper is not None and len(paper):
        style = dict(linestyle="none", marker=PAPER_STYLE["marker"], color=PAPER_STYLE["color"], mfc="none",
                     markersize=8)
        left.plot(paper["alpha"], paper["paper_speed"], label="Leviathan Table 1 (c = ĉ = 0)", **style)
        right.plot(paper["alpha"], paper["paper_operations"], **style)
    if measured is not None and len(measured):
        for j, (_, row) in enumerate(measured.iterrows()):
            interval_errorbar(left, [row["alpha"]], [row["speedup"]], [row.get("speedup_lo", np.nan)],
                              [row.get("speedup_hi", np.nan)], fmt="*", markersize=11, color=f"C{len(gammas) + j}",
                              markeredgecolor="k", label=f"ours, measured: {row['label']}")
    left.axhline(1, color="0.5", lw=0.8)
    right.axhline(1, color="0.5", lw=0.8)
    left.set(xlabel="α (acceptance rate)", ylabel="walltime improvement (×)",
             title=f"Speedup vs α (Thm 3.8, c = {c:g})")
    right.set(xlabel="α (acceptance rate)", ylabel="arithmetic operations (×)",
              title=f"Operations vs α (Thm 3.11, ĉ = {c_hat:g})")
    fig.tight_layout()
    legend_outside(fig)
    return fig


def fig_speedup_vs_gamma_closed_form(cs=(0.02, 0.1, 0.3), alphas=(0.5, 0.7, 0.8, 0.9), max_gamma: int = 12):
    """Thm 3.8's walltime improvement vs γ (Leviathan et al. 2023), one panel per c, one curve per α, each curve's
    optimum (:func:`specrepro.theory.optimal_gamma` within 1..max_gamma) ringed. Computed only: the paper draws no
    such figure (its Fig. 3 is the optimum's position, :func:`fig_optimal_gamma_vs_alpha`).

    Returns:
        matplotlib Figure, one axes per c (shared y), integer γ ticks, legend outside the axes.
    """
    from specrepro.theory import optimal_gamma, walltime_improvement

    gs = np.arange(1, int(max_gamma) + 1)
    fig, axes = plt.subplots(1, len(cs), figsize=(3.6 * len(cs), 3.6), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, c in zip(axes, cs):
        for i, a in enumerate(alphas):
            ax.plot(gs, walltime_improvement(a, gs, c), marker=".", color=f"C{i}", label=f"α = {a:g}")
            best = optimal_gamma(a, c, int(max_gamma))
            ax.plot([best], [walltime_improvement(a, best, c)], marker="o", markersize=10, mfc="none",
                    color=f"C{i}", linestyle="none")
        ax.axhline(1, color="0.5", lw=0.8)
        ax.set(title=f"c = {c:g}", xlabel="γ (draft length)")
        integer_ticks(ax, "x")
    axes[0].set_ylabel("walltime improvement (Thm 3.8, ×)")
    axes[0].plot([], [], marker="o", mfc="none", color="0.3", linestyle="none",
                 label=f"best γ in 1..{int(max_gamma)} (ringed)")
    fig.tight_layout()
    legend_outside(fig)
    return fig


def fig_forward_cost_vs_tokens(curves):
    """Measured time of one KV-cached forward pass over n new tokens, one line per model, beside Leviathan's model
    of it (verification of n tokens costs one step: flat at the model's n = 1 time, dashed in :data:`PAPER_STYLE`).
    Points are medians of repeated rounds (:func:`specrepro.measure.cost.measure_cost_table`), with their 95%
    interval as error bars where the table has one (columns ms_low, ms_high).

    Args:
        curves: DataFrame with columns model, n (tokens, integer), ms (milliseconds), optionally ms_low, ms_high.

    Returns:
        matplotlib Figure (integer n ticks, legend outside the axes).
    """
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
    integer_ticks(ax, "x")
    legend_outside(ax)
    return fig


def fig_speedup_vs_gamma_measured(summary, draft_col: str = "draft", paper=None, title: str = ""):
    """Measured speedup over AR vs γ with its 95% interval, beside the hardware-aware and constant-c (Leviathan
    Thm 3.8) predictions, one colour per draft; the paper's measured Table 2 speedups (T5-XXL on a TPU-v4, other
    hardware and tasks) drawn in :data:`PAPER_STYLE` at their γ.

    Args:
        summary: DataFrame, one row per (draft, γ), columns ``draft_col`` and
            :func:`specrepro.lab.leviathan.summarize_speed`'s measured_speedup (with _lo, _hi; NaN allowed),
            predicted_speedup_hardware and predicted_speedup_constant_c (or, where every row of a draft has it,
            predicted_speedup_constant_c_in_run: c measured in the timed runs, as its legend says).
        paper: optional DataFrame with columns gamma, measured, draft (e.g. :func:`leviathan_table2` rows).

    Returns:
        matplotlib Figure (integer γ ticks, legend outside the axes).
    """
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for i, (name, d) in enumerate(summary.groupby(draft_col, sort=False)):
        d = d.sort_values("gamma")
        col = f"C{i}"
        interval_errorbar(ax, d["gamma"], d["measured_speedup"], d["measured_speedup_lo"],
                          d["measured_speedup_hi"], fmt="o-", color=col, label=f"{readable(name)}: measured (95% CI)")
        ax.plot(d["gamma"], d["predicted_speedup_hardware"], "s--", color=col, mfc="none",
                label=f"{readable(name)}: predicted, hardware-aware")
        in_run = "predicted_speedup_constant_c_in_run" in d and d["predicted_speedup_constant_c_in_run"].notna().all()
        ax.plot(d["gamma"], d["predicted_speedup_constant_c_in_run" if in_run else "predicted_speedup_constant_c"],
                "^:", color=col, mfc="none", label=f"{readable(name)}: predicted, constant c (Leviathan)"
                + (", c measured in the runs" if in_run else ""))
    if paper is not None and len(paper):
        ax.plot(paper["gamma"], paper["measured"], linestyle="none", marker=PAPER_STYLE["marker"],
                color=PAPER_STYLE["color"], label="Leviathan Table 2, measured (T5-XXL, TPU-v4)")
        for _, row in paper.iterrows():
            if "draft" in row:
                ax.annotate(f"{row.get('task', '')} {str(row['draft']).replace('T5-', '')}".strip(),
                            (row["gamma"], row["measured"]), xytext=(4, 0), textcoords="offset points",
                            fontsize=6, color=PAPER_STYLE["color"], va="center")
        # room right of the last γ for its labels ("EnDe small" at γ = 7), which would otherwise cross the frame
        lo, hi = ax.get_xlim()
        ax.set_xlim(lo, max(hi, float(paper["gamma"].max()) + 0.9))
    ax.axhline(1, color="0.5", lw=0.8)
    ax.set(xlabel="γ (draft length)", ylabel="speedup over AR (×)", title=title)
    integer_ticks(ax, "x")
    legend_outside(ax)
    return fig


def fig_limit_ladder(limits, draft_col: str = "draft", title: str = ""):
    """The limit drawn: per draft (one panel each) and γ, bars for the successive predictions of
    :func:`specrepro.theory.speedup_decomposition` (:data:`LADDER`'s rungs) and the measured speedup with its 95%
    interval as a black point: the drops between bars are the gap's shares due to verification, draft cost and
    overhead; the rest (measured below the last bar) is unexplained by the cost model.

    Args:
        limits: DataFrame, one row per (draft, γ), columns ``draft_col``, gamma, tokens_per_step, free_draft,
            hardware_aware, with_overhead, measured, measured_lo, measured_hi (as
            :func:`specrepro.lab.leviathan.limit_table`).

    Returns:
        matplotlib Figure, one axes per draft (shared y), integer γ ticks, legend outside the axes.

    Raises:
        ValueError: a missing column or an empty table.
    """
    need = {draft_col, "gamma", "measured", "measured_lo", "measured_hi"} | {k for k, _ in LADDER}
    missing = need - set(limits.columns)
    if missing or not len(limits):
        raise ValueError(f"fig_limit_ladder needs a non-empty table with columns {sorted(need)}; "
                         f"missing {sorted(missing)}")
    drafts = list(dict.fromkeys(limits[draft_col]))
    fig, axes = plt.subplots(1, len(drafts), figsize=(4.2 * len(drafts) + 0.6, 3.8), sharey=True, squeeze=False)
    axes = axes[0]
    width = 0.8 / len(LADDER)
    for ax, name in zip(axes, drafts):
        d = limits[limits[draft_col] == name].sort_values("gamma")
        x = d["gamma"].to_numpy(dtype=float)
        for j, (key, label) in enumerate(LADDER):
            ax.bar(x + (j - (len(LADDER) - 1) / 2) * width, d[key], width=width, color=f"C{j}", alpha=0.75,
                   label=label)
        interval_errorbar(ax, x + (len(LADDER) - 1) / 2 * width, d["measured"], d["measured_lo"],
                          d["measured_hi"], fmt="o", color="k", markersize=5, zorder=5,
                          label="measured (95% CI over prompts)")
        ax.axhline(1, color="0.3", lw=0.8)
        ax.set(title=readable(name), xlabel="γ (draft length)", xticks=np.unique(x))  # the integer γ measured
    axes[0].set_ylabel("speedup over AR (×)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    legend_outside(fig)
    return fig
