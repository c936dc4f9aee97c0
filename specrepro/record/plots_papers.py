"""SpecInfer, Medusa, Chen and verifier figures (notebooks 05-07 and 09), in the style of
:mod:`specrepro.record.plotkit` (importable from :mod:`specrepro.record.plots`).

Each function takes the summary table its notebook saves and returns a Figure: our estimates with error bars from
their 95% intervals, the paper's numbers beside ours (``PAPER_STYLE``) where the paper prints them, integer ticks on
integer axes, the legend outside every axes (below the panels or to their right) and a caption under it that says
where the paper's numbers come from or why there are none. save_figure's footer goes below all of it.
"""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from specrepro.record.plotkit import (PAPER_STYLE, integer_ticks, interval_error, interval_errorbar, readable,
                                      unique_handles)

__all__ = ["legend_below", "add_caption", "fig_chen_k_sweep", "fig_specinfer_tree_width", "fig_medusa_dense_vs_sparse",
           "fig_medusa_tokens_per_s", "fig_verifier_node_budget"]


def _lowest_y(fig) -> float:
    """The bottom of everything drawn on ``fig``, in figure coordinates (may be < 0 under bbox_inches='tight')."""
    fig.canvas.draw()
    return min(0.0, fig.get_tightbbox(fig.canvas.get_renderer()).y0 / fig.get_figheight())


def legend_below(fig, axes, ncol: int | None = None, **kwargs):
    """One legend for ``axes`` (an Axes or a list), centred under the lowest artist of ``fig`` (x labels included),
    so it covers no data and no label; duplicate labels are merged. Call after the panels are drawn and laid out.

    Returns:
        the Legend, or None when no artist has a label.
    """
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


def _finish(fig, axes, caption: str | None, ncol: int | None = None):
    fig.tight_layout()
    legend_below(fig, axes, ncol=ncol)
    if caption:
        add_caption(fig, caption)
    return fig


def fig_chen_k_sweep(summary, *, title: str | None = None):
    """Chen et al. 2023, Figure 1 analogue: speedup over AR, accepted fraction and loop time vs K (three panels).

    Args:
        summary: one row per K (:func:`specrepro.lab.chen.k_sweep_summary`): K (int, 0 = AR), speedup / _lo / _hi
            (paired tokens/s ratio over AR, 95% interval), accepted_fraction / _lo / _hi (tokens per loop / (K + 1)),
            predicted_fraction (Leviathan Eq. 1 from the measured α), loop_ms / _lo / _hi (ms per draft-and-verify
            loop), and optionally paper_speedup (Chen Table 1, HumanEval; NaN elsewhere).
        title: the figure's suptitle.

    Returns:
        a matplotlib Figure; the paper's HumanEval speedup (K = 4) in :data:`PAPER_STYLE` on the left panel.

    Raises:
        KeyError: a required column is missing.
    """
    s = summary.sort_values("K")
    k = s["K"].to_numpy(dtype=float)
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    interval_errorbar(axes[0], k, s["speedup"], s["speedup_lo"], s["speedup_hi"], fmt="o-", color="C0",
                      label="ours: median over prompts, 95% CI")
    axes[0].axhline(1, color="0.5", lw=0.8)
    if "paper_speedup" in s and s.loc[s["K"] > 0, "paper_speedup"].notna().any():
        p = s[(s["K"] > 0) & s["paper_speedup"].notna()]
        axes[0].plot(p["K"], p["paper_speedup"], **{**PAPER_STYLE, "linestyle": "none", "markersize": 7},
                     label="Chen et al. Table 1 (HumanEval, 70B + 4B, TPU)")
    axes[0].set(xlabel="K (draft tokens per loop)", ylabel="speedup over AR", title="speedup")
    interval_errorbar(axes[1], k, s["accepted_fraction"], s["accepted_fraction_lo"], s["accepted_fraction_hi"],
                      fmt="o-", color="C0")
    if "predicted_fraction" in s:
        axes[1].plot(k, s["predicted_fraction"], "x:", color="C2",
                     label=r"prediction $(1-\alpha^{K+1})/((1-\alpha)(K+1))$ from our α")
    axes[1].set(xlabel="K", ylabel="tokens per loop / (K + 1)", title="accepted fraction",
                ylim=(0, 1.05))
    interval_errorbar(axes[2], k, s["loop_ms"], s["loop_ms_lo"], s["loop_ms_hi"], fmt="o-", color="C0")
    axes[2].set(xlabel="K", ylabel="ms per loop (prefill excluded)", title="loop time")
    for ax in axes:
        integer_ticks(ax, "x")
        ax.set_xlim(np.min(k) - 0.5, np.max(k) + 0.5)
    if title:
        fig.suptitle(title, fontsize=9)
    return _finish(fig, axes, "Paper's numbers: Chen et al. 2023 Table 1 gives one HumanEval point (K = 4, 2.46x; "
                              "Chinchilla 70B + 4B draft on TPU v4). Their Figure 1 curves (speedup, accepted "
                              "fraction, loop time vs K) are for XSum and their values are not printed in the text, "
                              "so the middle and right panels show ours only. Error bars: 95% percentile-bootstrap "
                              "intervals over prompts.")


_SHAPE_LABEL = {"paper": "⟨1,1,k,1,…,1⟩ (SpecInfer's shape)", "root": "⟨k,1,…,1⟩ (branching at the first token)"}


def fig_specinfer_tree_width(summary, *, title: str | None = None):
    """SpecInfer Table 2 and latency vs tree width: verified tokens per step (left) and ms per token (right) vs
    the tree width k, greedy and stochastic, for each tree shape in ``summary``.

    Args:
        summary: :func:`specrepro.lab.specinfer.tree_width_summary` rows: shape ("paper" = ⟨1,1,k,1,...⟩,
            "root" = ⟨k,1,...,1⟩), decoding ("greedy" / "stochastic"), width (int), tokens_per_step / _lo / _hi,
            ms_per_token / _lo / _hi, paper (SpecInfer Table 2 tokens per step; NaN where the paper has none).
        title: the figure's suptitle.

    Returns:
        a matplotlib Figure: ours with 95% error bars (shape "paper" solid, "root" hollow and dotted, the two shifted
        by ±0.1 in width), SpecInfer's Table 2 values in :data:`PAPER_STYLE`.

    Raises:
        KeyError: a required column is missing.
    """
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    shapes = [sh for sh in ("paper", "root") if (summary["shape"] == sh).any()]
    colors = {"greedy": "C0", "stochastic": "C1"}
    for si, sh in enumerate(shapes):
        for dec in ("greedy", "stochastic"):
            d = summary[(summary["shape"] == sh) & (summary["decoding"] == dec)].sort_values("width")
            if d.empty:
                continue
            x = d["width"].to_numpy(dtype=float) + (0.1 * (2 * si - 1) if len(shapes) > 1 else 0.0)
            style = dict(color=colors[dec], fmt="o-" if sh == "paper" else "o:",
                         markerfacecolor=colors[dec] if sh == "paper" else "white")
            label = f"{dec}, ours, {_SHAPE_LABEL[sh]}"
            interval_errorbar(axes[0], x, d["tokens_per_step"], d["tokens_per_step_lo"], d["tokens_per_step_hi"],
                              label=label, **style)
            interval_errorbar(axes[1], x, d["ms_per_token"], d["ms_per_token_lo"], d["ms_per_token_hi"], **style)
    paper = summary[(summary["shape"] == "paper") & summary["paper"].notna()] if "paper" in summary else \
        summary.iloc[:0]
    for dec, d in paper.groupby("decoding"):
        d = d.sort_values("width")
        axes[0].plot(d["width"], d["paper"], **{**PAPER_STYLE, "color": colors.get(dec, "0.35")},
                     label=f"{dec}, SpecInfer Table 2 (LLaMA-7B/68M, Alpaca)")
    axes[0].set(xlabel="tree width k", ylabel="verified tokens per step", title="tokens per step (Table 2)")
    axes[1].set(xlabel="tree width k", ylabel="ms per generated token", title="latency per token")
    for ax in axes:
        integer_ticks(ax, "x")
    if title:
        fig.suptitle(title, fontsize=9)
    left = ("Left: SpecInfer Table 2 (§6.4, trees ⟨1,1,k,1,1,1,1,1⟩, LLaMA-7B + LLaMA-68M on Alpaca, GPU) beside "
            "ours." if len(paper) else "Left: SpecInfer Table 2 is not drawn: its trees ⟨1,1,k,1,1,1,1,1⟩ have depth "
            "8, these another depth (or no tree of SpecInfer's shape was run).")
    return _finish(fig, axes, left + " Right: SpecInfer's per-token latency vs width is not "
                              "transcribed in our paper notes, so ours only; our tree runs are sequential (not "
                              "interleaved with each other), so machine drift between widths is not paired away. "
                              "Error bars: 95% percentile-bootstrap intervals over prompts.", ncol=2)


_KIND_STYLE = {"chain": dict(color="C2", marker="^"), "dense": dict(color="C0", marker="o"),
               "sparse": dict(color="C1", marker="s")}


def fig_medusa_dense_vs_sparse(summary, *, title: str | None = None):
    """Medusa §3.3.1 / Figure 5 analogue: tokens per step vs tree size (nodes) for dense (Cartesian) and sparse
    (accuracy-driven) trees of the same heads, and the heads as a chain.

    Args:
        summary: :func:`specrepro.lab.medusa_ablation.tree_ablation` summary rows: kind ("chain" / "dense" /
            "sparse"), nodes (int), tokens_per_step / _lo / _hi (mean over prompts, 95% interval), and optionally
            predicted_tokens_per_step (from the heads' held-out accuracies).
        title: the axes' title.

    Returns:
        a matplotlib Figure: one series per kind, ours with 95% error bars, the accuracy-based prediction as
        unfilled markers on a dotted line.

    Raises:
        KeyError: a required column is missing.
    """
    fig, ax = plt.subplots(figsize=(7, 4))
    for kind in [k for k in ("chain", "dense", "sparse") if (summary["kind"] == k).any()]:
        d = summary[summary["kind"] == kind].sort_values("nodes")
        st = _KIND_STYLE[kind]
        interval_errorbar(ax, d["nodes"], d["tokens_per_step"], d["tokens_per_step_lo"], d["tokens_per_step_hi"],
                          fmt="-", marker=st["marker"], color=st["color"],
                          label=f"{kind} tree{'s' if len(d) > 1 else ''}, measured (95% CI over prompts)")
        if "predicted_tokens_per_step" in d and d["predicted_tokens_per_step"].notna().any():
            ax.plot(d["nodes"], d["predicted_tokens_per_step"], linestyle=":", marker=st["marker"],
                    markerfacecolor="white", color=st["color"], label=f"{kind}, predicted from head accuracies")
    ax.set(xlabel="tree nodes (candidate tokens per step)", ylabel="tokens per target step (greedy)")
    if title:
        ax.set_title(title, fontsize=9)
    integer_ticks(ax, "x")
    return _finish(fig, ax, "Medusa's dense-vs-sparse comparison (§3.3.1, Figure 5; Vicuna-7B on GPU) is not "
                            "transcribed in our paper notes, so no paper numbers are drawn; its claim is the shape: "
                            "sparse trees reach a dense tree's tokens per step with fewer nodes. Error bars: 95% "
                            "percentile-bootstrap intervals over prompts.", ncol=2)


def fig_medusa_tokens_per_s(tables):
    """Tokens/s of every method in every decoding setting of notebook 06, one horizontal bar per (method, setting),
    labelled with its own table's method name and the setting.

    Args:
        tables: setting label (e.g. "greedy", "T = 0.7") -> :func:`specrepro.lab.medusa.acceleration_table` output
            (columns method, tokens_per_s and optionally tokens_per_s_lo / _hi, the 95% interval over prompts).

    Returns:
        a matplotlib Figure; bars carry error bars where the interval is known.

    Raises:
        ValueError: no tables.
    """
    if not tables:
        raise ValueError("fig_medusa_tokens_per_s needs at least one table")
    both = pd.concat([t.assign(setting=s) for s, t in tables.items()], ignore_index=True)
    bounds = both.reindex(columns=["tokens_per_s_lo", "tokens_per_s_hi"])  # NaN where a table has no interval
    xerr = interval_error(both["tokens_per_s"], bounds["tokens_per_s_lo"], bounds["tokens_per_s_hi"])
    colors = {s: f"C{i}" for i, s in enumerate(tables)}
    fig, ax = plt.subplots(figsize=(7.5, 0.34 * len(both) + 1.4))
    y = np.arange(len(both))
    for s in tables:
        m = (both["setting"] == s).to_numpy()
        ax.barh(y[m], both.loc[m, "tokens_per_s"], xerr=xerr[:, m], color=colors[s], capsize=3,
                error_kw={"elinewidth": 1}, label=readable(s))
    ax.set_yticks(y, [f"{readable(mth)} · {readable(s)}" for mth, s in zip(both["method"], both["setting"])],
                  fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("tokens/s, median over prompts (95% CI; shared CPU)")
    return _finish(fig, ax, "No paper numbers: tokens/s depend on the hardware; Medusa's speedups (Vicuna, GPU) "
                            "are compared with ours in the scorecard.", ncol=len(tables))


def fig_verifier_node_budget(summary, *, title: str | None = None):
    """Tokens per step against the node budget N (drafted tokens per step), one line per exact verifier.

    Args:
        summary: :func:`specrepro.lab.verifiers.node_budget_summary` rows: verifier, label, structure ("chain" or
            "tree"), budget (int), tokens_per_step / _lo / _hi.
        title: the axes' title.

    Returns:
        a matplotlib Figure: chains dashed, trees of unmerged paths solid, 95% intervals over prompts as error bars
        (points shifted by up to ±0.15 in N so bars do not hide each other).

    Raises:
        KeyError: a required column is missing. ValueError: an empty summary.
    """
    if summary.empty:
        raise ValueError("fig_verifier_node_budget needs at least one row")
    fig, ax = plt.subplots(figsize=(6.8, 4.0))
    keys = list(dict.fromkeys(summary["verifier"]))
    for i, key in enumerate(keys):
        d = summary[summary["verifier"] == key].sort_values("budget")
        shift = 0.3 * (i / max(1, len(keys) - 1) - 0.5)
        interval_errorbar(ax, d["budget"] + shift, d["tokens_per_step"], d["tokens_per_step_lo"],
                          d["tokens_per_step_hi"], fmt="o--" if d["structure"].iloc[0] == "chain" else "o-",
                          color=f"C{i}", label=d["label"].iloc[0])
    integer_ticks(ax)
    ax.set_xlabel("node budget N (drafted tokens per step)")
    ax.set_ylabel("tokens per step (95% CI)")
    if title:
        ax.set_title(title, fontsize=9)
    return _finish(fig, ax, "Same draft model and prompts for every verifier; chains draft γ = N tokens, trees "
                            "N/2-deep pairs of unmerged paths. No paper numbers: each paper measured its own models "
                            "and drafts (their reported gains are in the verifier table).", ncol=2)
