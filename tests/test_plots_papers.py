"""Figures of notebooks 05-07 (SpecInfer, Medusa, Chen) on small synthetic tables: each returns a Figure, draws the
paper's numbers where it says so, carries error bars from the intervals, has integer ticks on integer axes, a legend
that covers no data and a footer that overlaps no label. The checks are run on deliberately bad figures too, so
they can fail."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.container import BarContainer, ErrorbarContainer  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from specrepro.lab.chen import CHEN_TABLE1_HUMANEVAL, k_sweep_runs, k_sweep_summary  # noqa: E402
from specrepro.lab.medusa_ablation import chain_choices, dense_choices, tree_kind  # noqa: E402
from specrepro.lab.specinfer import (  # noqa: E402
    SPECINFER_TABLE2,
    expansion_widths,
    tree_width_summary,
)
from specrepro.lab import plots  # noqa: E402
from specrepro.record.results import add_footer  # noqa: E402


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


# ----------------------------------------------------------------------------------------------- checks on figures
def _renderer(fig):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _data_points(fig):
    """Display coordinates of every plotted data point (lines, error-bar markers, bar ends) of every axes."""
    pts = []
    for ax in fig.axes:
        for line in ax.get_lines():
            xy = np.column_stack([np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)])
            xy = xy[np.isfinite(xy).all(axis=1)]
            if len(xy):
                pts.append(ax.transData.transform(xy))
        for c in ax.containers:
            if isinstance(c, BarContainer):
                for p in c.patches:
                    x0, y0, w, h = p.get_x(), p.get_y(), p.get_width(), p.get_height()
                    pts.append(ax.transData.transform([[x0 + w, y0 + h / 2]]))
    return np.vstack(pts) if pts else np.empty((0, 2))


def legend_covers_data(fig) -> bool:
    """True if some legend's box contains a plotted data point or overlaps an axes (where data can be)."""
    r = _renderer(fig)
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    pts = _data_points(fig)
    for leg in legends:
        bb = leg.get_window_extent(r)
        if len(pts) and np.any((pts[:, 0] >= bb.x0) & (pts[:, 0] <= bb.x1) & (pts[:, 1] >= bb.y0)
                               & (pts[:, 1] <= bb.y1)):
            return True
        if any(bb.overlaps(ax.get_window_extent(r)) for ax in fig.axes):
            return True
    return False


def _label_boxes(fig, r, exclude=None):
    boxes = []
    for ax in fig.axes:
        for t in ax.get_xticklabels() + ax.get_yticklabels() + [ax.xaxis.label, ax.yaxis.label, ax.title]:
            if t.get_visible() and t.get_text():
                boxes.append(t.get_window_extent(r))
    for leg in fig.legends:
        boxes.append(leg.get_window_extent(r))
    for t in fig.texts:
        if t.get_text() and t is not exclude:
            boxes.append(t.get_window_extent(r))
    return boxes


def footer_overlaps(fig, footer: Text) -> bool:
    r = _renderer(fig)
    fb = footer.get_window_extent(r)
    return any(fb.overlaps(b) for b in _label_boxes(fig, r, exclude=footer))


def integer_x_ticks(ax) -> bool:
    lo, hi = sorted(ax.get_xlim())
    ticks = [t for t in ax.get_xticks() if lo - 1e-9 <= t <= hi + 1e-9]
    return bool(ticks) and all(abs(t - round(t)) < 1e-9 for t in ticks)


def errorbars(ax) -> list:
    """The error-bar containers of ``ax`` that draw at least one bar (plus bar charts' error bars)."""
    def drawn(cols):  # a bar is drawn when its segment has finite ends and a length
        return any(len(seg) and np.all(np.isfinite(seg)) and np.ptp(np.asarray(seg), axis=0).max() > 0
                   for lc in cols for seg in lc.get_segments())

    out = []
    for c in ax.containers:
        if isinstance(c, ErrorbarContainer) and drawn(c[2]):
            out.append(c)
        if isinstance(c, BarContainer) and c.errorbar is not None and drawn(c.errorbar[2]):
            out.append(c)
    return out


def has_point(ax, x, y, tol=1e-9) -> bool:
    for line in ax.get_lines():
        xs, ys = np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)
        if np.any((np.abs(xs - x) < tol) & (np.abs(ys - y) < tol)):
            return True
    return False


def test_checks_catch_bad_figures():
    """Negative controls: a legend drawn on top of the data, fractional ticks, a footer at a fixed spot under long
    x labels and no error bars are all detected."""
    fig, ax = plt.subplots()
    ax.plot(np.linspace(0, 1, 50), np.full(50, 0.5), label="a curve through the middle")
    ax.legend(loc="center", fontsize=20)
    assert legend_covers_data(fig)
    ax.set_xlim(0, 1)
    assert not integer_x_ticks(ax)
    assert not errorbars(ax)
    fig2, ax2 = plt.subplots()
    ax2.plot([0, 1], [0, 1])
    ax2.set_xlabel("a label\nspanning\nseveral\nlines")
    fixed = fig2.text(0.5, 0.0, "footer " * 20, ha="center", va="bottom", fontsize=8)
    assert footer_overlaps(fig2, fixed)


# --------------------------------------------------------------------------------------------------- synthetic data
def _chen_summary():
    ks = np.arange(8)
    sp = np.array([1.0, 1.3, 1.5, 1.6, 1.55, 1.5, 1.4, 1.3])
    frac = np.array([1.0, .9, .8, .72, .65, .6, .55, .5])
    loop = 100 + 40 * ks
    return pd.DataFrame({"K": ks, "speedup": sp, "speedup_lo": sp - .1, "speedup_hi": sp + .1,
                         "accepted_fraction": frac, "accepted_fraction_lo": frac - .05,
                         "accepted_fraction_hi": np.minimum(frac + .05, 1), "predicted_fraction": frac + .01,
                         "loop_ms": loop, "loop_ms_lo": loop - 10, "loop_ms_hi": loop + 10,
                         "paper_speedup": [CHEN_TABLE1_HUMANEVAL.get(int(k), (np.nan, np.nan))[1] for k in ks]})


def _specinfer_summary():
    rows = []
    for shape in ("paper", "root"):
        for dec, base in (("greedy", 3.0), ("stochastic", 2.0)):
            for w in range(1, 6):
                t = base + 0.1 * w
                rows.append({"shape": shape, "decoding": dec, "width": w, "tokens_per_step": t,
                             "tokens_per_step_lo": t - .2, "tokens_per_step_hi": t + .2, "ms_per_token": 200 + 10 * w,
                             "ms_per_token_lo": 190 + 10 * w, "ms_per_token_hi": 215 + 10 * w,
                             "paper": SPECINFER_TABLE2[w][0 if dec == "greedy" else 1] if shape == "paper"
                             else np.nan})
    return pd.DataFrame(rows)


def _medusa_summary():
    rows = [("chain", 4, 2.0), ("dense", 6, 2.2), ("dense", 14, 2.5), ("dense", 30, 2.7), ("sparse", 6, 2.4),
            ("sparse", 14, 2.7), ("sparse", 32, 2.9), ("sparse", 64, 3.0)]
    return pd.DataFrame([{"tree": f"{k} {n}", "kind": k, "nodes": n, "tokens_per_step": t,
                          "tokens_per_step_lo": t - .15, "tokens_per_step_hi": t + .1,
                          "predicted_tokens_per_step": t + .2} for k, n, t in rows])


def _common_checks(fig, axes_with_int_x):
    assert isinstance(fig, Figure)
    for ax in axes_with_int_x:
        assert integer_x_ticks(ax), ax.get_xticks()
    assert not legend_covers_data(fig)
    footer = add_footer(fig, "specrepro 0123456789ab · profile test · cpu (2 cores, x86_64)")
    assert not footer_overlaps(fig, footer)


# ------------------------------------------------------------------------------------------------------ the figures
def test_fig_chen_k_sweep():
    fig = plots.fig_chen_k_sweep(_chen_summary(), title="synthetic")
    axes = fig.axes
    assert len(axes) == 3
    assert has_point(axes[0], 4, 2.46)  # Chen Table 1, HumanEval, K = 4
    for ax in axes:
        assert errorbars(ax)
    _common_checks(fig, axes)


def test_fig_chen_k_sweep_no_bar_without_interval():
    s = _chen_summary()
    s[["speedup_lo", "speedup_hi"]] = np.nan
    fig = plots.fig_chen_k_sweep(s)
    assert not errorbars(fig.axes[0]) and errorbars(fig.axes[1])


def test_fig_specinfer_tree_width():
    fig = plots.fig_specinfer_tree_width(_specinfer_summary())
    left, right = fig.axes[:2]
    for w, (g, st) in SPECINFER_TABLE2.items():
        assert has_point(left, w, g) and has_point(left, w, st)
    assert len(errorbars(left)) == 4 and len(errorbars(right)) == 4  # 2 shapes x 2 decodings
    _common_checks(fig, [left, right])


def test_fig_specinfer_tree_width_paper_shape_only():
    s = _specinfer_summary()
    fig = plots.fig_specinfer_tree_width(s[s["shape"] == "paper"])
    assert len(errorbars(fig.axes[0])) == 2
    assert has_point(fig.axes[0], 1, 3.1)  # unshifted when one shape
    caption = " ".join(t.get_text() for t in fig.texts)
    assert "beside ours" in caption
    no_paper = plots.fig_specinfer_tree_width(s[s["shape"] == "paper"].assign(paper=np.nan))
    assert "is not drawn" in " ".join(t.get_text() for t in no_paper.texts)
    assert not any(has_point(no_paper.axes[0], w, g) for w, (g, _) in SPECINFER_TABLE2.items())


def test_fig_medusa_dense_vs_sparse():
    fig = plots.fig_medusa_dense_vs_sparse(_medusa_summary(), title="synthetic")
    ax = fig.axes[0]
    assert len(errorbars(ax)) == 3  # chain, dense, sparse
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(lab.startswith("dense") for lab in labels) and any(lab.startswith("sparse") for lab in labels)
    _common_checks(fig, [ax])


def test_fig_medusa_tokens_per_s_labels_each_bar_with_its_own_method():
    greedy = pd.DataFrame({"method": ["AR", "Medusa (default tree)", "prompt lookup (γ=4)"],
                           "tokens_per_s": [30.0, 45.0, 35.0], "tokens_per_s_lo": [28.0, 40.0, 30.0],
                           "tokens_per_s_hi": [33.0, 50.0, 38.0]})
    sampled = pd.DataFrame({"method": ["AR", "Medusa typical"], "tokens_per_s": [29.0, 40.0],
                            "tokens_per_s_lo": [27.0, np.nan], "tokens_per_s_hi": [31.0, np.nan]})
    fig = plots.fig_medusa_tokens_per_s({"greedy": greedy, "T = 0.7": sampled})
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["AR · greedy", "Medusa (default tree) · greedy", "prompt lookup (γ=4) · greedy", "AR · T = 0.7",
                      "Medusa typical · T = 0.7"]
    assert errorbars(ax)
    assert not legend_covers_data(fig)
    footer = add_footer(fig, "specrepro 0123456789ab · profile test · cpu")
    assert not footer_overlaps(fig, footer)
    with pytest.raises(ValueError):
        plots.fig_medusa_tokens_per_s({})


# ------------------------------------------------------------------------------------------- the tables behind them
def test_expansion_widths():
    assert expansion_widths(3, 8, "paper") == [1, 1, 3, 1, 1, 1, 1, 1]
    assert expansion_widths(3, 8, "root") == [3, 1, 1, 1, 1, 1, 1, 1]
    assert expansion_widths(2, 2, "paper") == [1, 2]
    with pytest.raises(ValueError):
        expansion_widths(2, 8, "middle")


def test_tree_width_summary_intervals_and_paper_column():
    rng = np.random.default_rng(0)
    rows = []
    for shape in ("paper", "root"):
        for dec in ("greedy", "stochastic"):
            for w in (1, 2):
                for p in range(4):
                    tokens, steps = 48, int(rng.integers(8, 20))
                    rows.append({"shape": shape, "tree": str(expansion_widths(w, 8, shape)), "decoding": dec,
                                 "width": w, "prompt": f"p{p}", "tokens": tokens, "steps": steps,
                                 "tokens_per_step": tokens / steps, "seconds": rng.uniform(5, 10),
                                 "nodes_per_step": 8.0 * w})
    s = tree_width_summary(pd.DataFrame(rows))
    assert len(s) == 8
    assert (s["tokens_per_step_lo"] <= s["tokens_per_step"]).all()
    assert (s["tokens_per_step"] <= s["tokens_per_step_hi"]).all()
    paper = s[s["shape"] == "paper"].set_index(["decoding", "width"])["paper"]
    assert paper[("greedy", 2)] == SPECINFER_TABLE2[2][0] and paper[("stochastic", 1)] == SPECINFER_TABLE2[1][1]
    assert s.loc[s["shape"] == "root", "paper"].isna().all()
    shallow = tree_width_summary(pd.DataFrame(rows).assign(depth=4))  # the paper's trees have depth 8
    assert shallow["paper"].isna().all()


def test_k_sweep_runs_and_summary():
    rng = np.random.default_rng(1)
    rows = []
    for p in range(6):
        ar_tps = rng.uniform(2, 3)
        for k in range(0, 4):
            steps = 40 if k == 0 else int(40 / (1 + 0.8 * k))
            tps = ar_tps * (1 + 0.3 * k - 0.05 * k * k) * rng.uniform(0.95, 1.05)
            rows.append({"repeat": 0, "prompt": f"p{p}", "prompt_index": p, "method": "ar" if k == 0 else f"sd@{k}",
                         "gamma": None if k == 0 else k, "new_tokens": 40, "seconds": 40 / tps, "tokens_per_s": tps,
                         "ms_per_token": 1000 / tps, "steps": steps, "loop_ms": 100 + 30 * k + rng.normal(0, 2),
                         "token_ids": [1] * 40, "drafted": [k] * steps, "accepted": [0] * steps,
                         "alpha_terms": [0.8] * (k * steps), "depths": []})
    runs = k_sweep_runs(pd.DataFrame(rows))
    assert list(runs["K"].unique()) == [0, 1, 2, 3]
    assert np.allclose(runs.loc[runs["K"] == 0, "accepted_fraction"], 1.0)
    s = k_sweep_summary(runs)
    assert s.loc[s["K"] == 0, "speedup"].item() == 1.0
    for col in ("speedup", "accepted_fraction", "loop_ms"):
        assert (s[f"{col}_lo"] <= s[col] + 1e-12).all() and (s[col] <= s[f"{col}_hi"] + 1e-12).all()
    assert s["loop_ms"].is_monotonic_increasing
    assert np.isnan(s.loc[s["K"] == 0, "alpha"]).all() and np.allclose(s.loc[s["K"] > 0, "alpha"], 0.8)
    with pytest.raises(ValueError):
        k_sweep_summary(runs[runs["K"] > 0])


def test_tree_kind():
    assert tree_kind(chain_choices(4)) == "chain"
    assert tree_kind(dense_choices((2, 2, 2))) == "dense"
    assert tree_kind(dense_choices((3, 2))) == "dense"
    assert tree_kind([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]) == "sparse"
    with pytest.raises(ValueError):
        tree_kind([])
