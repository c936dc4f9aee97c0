"""The figure functions of specrepro.lab.plots on small synthetic tables: each returns a Figure, draws the paper's points
where it says, carries error bars where the data has intervals, integer ticks on integer axes, and a legend that
covers no axes (so no data)."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.container import ErrorbarContainer  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from specrepro.lab.leviathan import (  # noqa: E402
    best_measured_drafts,
    leviathan_table1,
    limit_table,
    summarize_speed,
)
from specrepro.lab import plots  # noqa: E402
from specrepro.theory import (
    CostCurve,
    expected_tokens,
    free_draft_bound,
    hardware_aware_speedup,
    optimal_gamma,
    walltime_improvement,
)


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def _legends(fig):
    return list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]


def assert_legend_covers_no_axes(fig):
    """Every legend's box lies outside every axes' box (display coordinates), so it covers no data."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = _legends(fig)
    assert legends, "the figure has no legend"
    for leg in legends:
        box = leg.get_window_extent(renderer)
        for ax in fig.axes:
            a = ax.get_window_extent(renderer)
            overlap_w = min(box.x1, a.x1) - max(box.x0, a.x0)
            overlap_h = min(box.y1, a.y1) - max(box.y0, a.y0)
            assert overlap_w <= 0.5 or overlap_h <= 0.5, f"legend {box} overlaps axes {a}"


def assert_integer_ticks(ax, axis):
    ax.figure.canvas.draw()
    lo, hi = ax.get_xlim() if axis == "x" else ax.get_ylim()
    ticks = np.asarray(ax.get_xticks() if axis == "x" else ax.get_yticks(), dtype=float)
    ticks = ticks[(ticks >= lo - 1e-9) & (ticks <= hi + 1e-9)]
    assert len(ticks) >= 2
    assert np.allclose(ticks, np.round(ticks)), f"fractional {axis} ticks {ticks}"


def _line(ax, label_part):
    lines = [ln for ln in ax.get_lines() if label_part in str(ln.get_label())]
    assert lines, f"no line labelled with {label_part!r}: {[ln.get_label() for ln in ax.get_lines()]}"
    return lines[0]


def _errorbars(ax):
    return [c for c in ax.containers if isinstance(c, ErrorbarContainer)]


# --- the helpers themselves can fail -----------------------------------------------------------------------------

def test_legend_check_catches_a_legend_inside_the_axes():
    fig, ax = plt.subplots()
    ax.plot(np.arange(10), np.arange(10), label="data")
    ax.legend(loc="center")
    with pytest.raises(AssertionError):
        assert_legend_covers_no_axes(fig)


def test_integer_tick_check_catches_fractional_ticks():
    fig, ax = plt.subplots()
    ax.plot([1, 2], [1, 2])
    with pytest.raises(AssertionError):
        assert_integer_ticks(ax, "x")  # the default locator puts ticks at 1.0, 1.2, ...
    plots.integer_ticks(ax, "x")
    assert_integer_ticks(ax, "x")


# --- notebook 02 ---------------------------------------------------------------------------------------------------

def test_optimal_gamma_vs_alpha():
    paper = plots.leviathan_table2()
    measured = pd.DataFrame({"label": ["fp32 draft", "int8 draft"], "alpha": [0.88, 0.85], "c": [0.39, 0.18],
                             "best_gamma": [4, 3]})
    fig = plots.fig_optimal_gamma_vs_alpha(cs=(0.02, 0.1), measured=measured, paper=paper)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    curve = _line(ax, "c = 0.1")
    x, y = curve.get_data()
    finite = np.isfinite(y)
    assert finite.any() and np.all(y[finite] == [optimal_gamma(a, 0.1) for a in x[finite]])
    assert np.all(np.isnan(y[x < 0.1]))  # no speedup possible where α <= c: not drawn
    px, py = _line(ax, "Leviathan Table 2").get_data()
    assert np.allclose(px, paper["alpha"]) and np.allclose(py, paper["gamma"])
    sx, sy = _line(ax, "ours: fp32 draft (").get_data()
    assert np.allclose(sx, [0.88]) and np.allclose(sy, [optimal_gamma(0.88, 0.39)])
    _, by = _line(ax, "best measured γ = 3").get_data()
    assert np.allclose(by, [3])
    assert_integer_ticks(ax, "y")
    assert_legend_covers_no_axes(fig)


def test_optimal_gamma_vs_alpha_rejects_negative_cost():
    with pytest.raises(ValueError):
        plots.fig_optimal_gamma_vs_alpha(cs=(-0.1,))


def test_speedup_and_operations_vs_alpha_puts_table1_on_the_curves():
    table1 = leviathan_table1()
    measured = pd.DataFrame({"label": ["draft, γ = 3 (c = 0.39)"], "alpha": [0.89], "speedup": [1.43],
                             "speedup_lo": [1.26], "speedup_hi": [1.66]})
    fig = plots.fig_speedup_and_operations_vs_alpha(gammas=(2, 3, 5, 10), paper=table1, measured=measured)
    assert isinstance(fig, Figure)
    left, right = fig.axes[:2]
    px, py = _line(left, "Leviathan Table 1").get_data()
    assert np.allclose(px, table1["alpha"]) and np.allclose(py, table1["paper_speed"])
    ox, oy = [ln for ln in right.get_lines() if ln.get_marker() == plots.PAPER_STYLE["marker"]][0].get_data()
    assert np.allclose(oy, table1["paper_operations"])
    # at c = 0 the paper's printed numbers lie on our curves (to their two decimals)
    for (a, g, s) in zip(table1["alpha"], table1["gamma"], table1["paper_speed"]):
        cx, cy = _line(left, f"γ = {g}").get_data()
        assert abs(np.interp(a, cx, cy) - s) < 0.02
    bars = _errorbars(left)
    assert len(bars) == 1
    seg = bars[0].lines[2][0].get_segments()[0]
    assert np.allclose([seg[0][1], seg[1][1]], [1.26, 1.66])
    assert_legend_covers_no_axes(fig)


def test_speedup_vs_gamma_closed_form_rings_the_optimum():
    fig = plots.fig_speedup_vs_gamma_closed_form(cs=(0.1, 0.3), alphas=(0.7, 0.9), max_gamma=10)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    for ax in fig.axes:
        assert_integer_ticks(ax, "x")
    rings = [ln for ln in fig.axes[0].get_lines() if ln.get_marker() == "o" and len(ln.get_xdata()) == 1]
    assert sorted(int(r.get_xdata()[0]) for r in rings) == sorted([optimal_gamma(0.7, 0.1, 10),
                                                                   optimal_gamma(0.9, 0.1, 10)])
    assert_legend_covers_no_axes(fig)


# --- notebook 04 ---------------------------------------------------------------------------------------------------

def test_forward_cost_vs_tokens():
    curves = pd.DataFrame({"model": ["target"] * 4 + ["draft"] * 2, "n": [1, 2, 4, 8, 1, 2],
                           "ms": [10.0, 11.0, 20.0, 25.0, 4.0, 4.5]})
    fig = plots.fig_forward_cost_vs_tokens(curves)
    ax = fig.axes[0]
    flat = [ln for ln in ax.get_lines() if ln.get_linestyle() == plots.PAPER_STYLE["linestyle"]
            and len(ln.get_xdata()) == 2]
    assert sorted(float(ln.get_ydata()[0]) for ln in flat) == [4.0, 10.0]
    assert_integer_ticks(ax, "x")
    assert_legend_covers_no_axes(fig)


def test_forward_cost_vs_tokens_draws_the_intervals_it_has():
    """With the cost table's ms_low / ms_high, each point gets its 95% error bar; a point without an interval (under
    6 rounds) gets none rather than a zero-length one."""
    nan = float("nan")
    curves = pd.DataFrame({"model": ["target"] * 3 + ["draft"] * 2, "n": [1, 2, 4, 1, 2],
                           "ms": [10.0, 11.0, 20.0, 4.0, 4.5], "ms_low": [9.0, 10.5, 18.0, nan, nan],
                           "ms_high": [12.0, 11.5, 21.0, nan, nan], "rounds": [9, 9, 9, 5, 5]})
    ax = plots.fig_forward_cost_vs_tokens(curves).axes[0]
    bars = [c for c in ax.containers if c.has_yerr]
    assert len(bars) == 2
    segments = [seg for c in bars for seg in c.lines[2][0].get_segments() if len(seg)]
    assert sorted(float(np.ptp(seg[:, 1])) for seg in segments) == pytest.approx([1.0, 3.0, 3.0])


def _summary():
    rows = []
    for draft, base in (("fp32", 1.3), ("int8", 1.6)):
        for g in (1, 2, 4):
            s = base + 0.05 * g
            rows.append({"draft": draft, "gamma": g, "measured_speedup": s, "measured_speedup_lo": s - 0.1,
                         "measured_speedup_hi": s + 0.15, "predicted_speedup_hardware": s + 0.05,
                         "predicted_speedup_constant_c": s + 0.2})
    return pd.DataFrame(rows)


def test_speedup_vs_gamma_measured_has_error_bars_and_paper_points():
    paper = plots.leviathan_table2().query("temperature == 0")
    fig = plots.fig_speedup_vs_gamma_measured(_summary(), paper=paper)
    ax = fig.axes[0]
    bars = _errorbars(ax)
    assert len(bars) == 2
    low_high = [(s[0][1], s[1][1]) for s in bars[0].lines[2][0].get_segments()]
    assert np.allclose(low_high, [(1.25, 1.5), (1.3, 1.55), (1.4, 1.65)])
    px, py = _line(ax, "Leviathan Table 2").get_data()
    assert np.allclose(px, paper["gamma"]) and np.allclose(py, paper["measured"])
    assert_integer_ticks(ax, "x")
    assert_legend_covers_no_axes(fig)


def test_speedup_vs_gamma_measured_uses_c_measured_in_the_runs_where_every_row_has_it():
    summary = _summary()
    summary["predicted_speedup_constant_c_in_run"] = summary["measured_speedup"] + 0.1
    summary.loc[summary["draft"] == "int8", "predicted_speedup_constant_c_in_run"] = np.nan  # int8: not measured
    ax = plots.fig_speedup_vs_gamma_measured(summary).axes[0]
    fp32 = summary[summary["draft"] == "fp32"]
    assert np.allclose(_line(ax, "fp32: predicted, constant c (Leviathan), c measured in the runs").get_ydata(),
                       fp32["predicted_speedup_constant_c_in_run"])
    int8 = summary[summary["draft"] == "int8"]
    line = _line(ax, "int8: predicted, constant c (Leviathan)")
    assert "measured in the runs" not in line.get_label()
    assert np.allclose(line.get_ydata(), int8["predicted_speedup_constant_c"])


def _ladder():
    t_target, t_draft = CostCurve([1, 2, 3, 5], [100, 110, 120, 200]), CostCurve([1, 2], [30, 32])
    rows = []
    for draft, td in (("fp32 draft", t_draft), ("n-gram", None)):
        for g in (1, 2, 4):
            hw = hardware_aware_speedup(0.8, g, t_target, td)
            rows.append({"draft": draft, "gamma": g, "tokens_per_step": float(expected_tokens(0.8, g)),
                         "free_draft": free_draft_bound(0.8, g, t_target), "hardware_aware": hw,
                         "with_overhead": 0.95 * hw, "measured": 0.9 * hw, "measured_lo": 0.8 * hw,
                         "measured_hi": (1.0 if g > 1 else np.nan) * hw})
    return pd.DataFrame(rows)


def test_limit_ladder_draws_every_rung_and_the_measurement():
    limits = _ladder()
    fig = plots.fig_limit_ladder(limits)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    for ax, name in zip(fig.axes, ["fp32 draft", "n-gram"]):
        d = limits[limits["draft"] == name].sort_values("gamma")
        heights = sorted(round(p.get_height(), 9) for p in ax.patches)
        want = sorted(round(v, 9) for key, _ in plots.LADDER for v in d[key])
        assert heights == want
        bars = _errorbars(ax)
        assert len(bars) == 1
        ys = bars[0].lines[0].get_ydata()
        assert np.allclose(ys, d["measured"])
        segs = [s for s in bars[0].lines[2][0].get_segments() if len(s)]
        assert len(segs) == 2  # γ = 1 has no upper bound (NaN): no bar drawn for it
        assert_integer_ticks(ax, "x")
    assert_legend_covers_no_axes(fig)


def test_limit_ladder_needs_its_columns():
    with pytest.raises(ValueError):
        plots.fig_limit_ladder(_ladder().drop(columns=["free_draft"]))


# --- the table behind the ladder -----------------------------------------------------------------------------------

def _runs():
    """Synthetic per-run rows of two prompts: AR, a draft model at γ = 2, a free draft at γ = 3."""
    rows = []
    for i, prompt in enumerate(("p0", "p1")):
        for method, gamma, secs, alpha, drafted, steps in (("AR", 0, 10.0, np.nan, 0, 64),
                                                           ("draft γ=2", 2, 7.0 + i, 0.8, 60, 30),
                                                           ("lookup γ=3", 3, 9.0, 0.5, 30, 45)):
            rows.append({"repeat": 0, "prompt": prompt, "method": method, "gamma": gamma, "tokens": 64,
                         "new_tokens": 64, "seconds": secs, "tokens_per_s": 64 / secs, "accepted": 0,
                         "drafted": drafted, "steps": steps, "overhead_ms": 2.0 if gamma else 1.0, "alpha": alpha})
    return pd.DataFrame(rows)


def test_summarize_speed_predicts_with_c_measured_in_the_runs_when_given():
    t_target, t_draft = CostCurve([1, 2, 3, 4], [100, 110, 120, 180]), CostCurve([1, 2], [30, 32])
    drafts = {"AR": None, "draft γ=2": t_draft, "lookup γ=3": None}
    plain = summarize_speed(_runs(), t_target, drafts).set_index("method")
    assert "c_in_run" not in plain
    s = summarize_speed(_runs(), t_target, drafts, c_in_run={"draft": 0.5}).set_index("method")
    assert s.loc["draft γ=2", "c"] == pytest.approx(0.3) and s.loc["draft γ=2", "c_in_run"] == 0.5
    # Thm 3.8 at the method's α (0.8) and drafted per step (60 / 30 = 2) with c = 0.5 instead of the curves' 0.3
    assert s.loc["draft γ=2", "predicted_speedup_constant_c_in_run"] == pytest.approx(
        walltime_improvement(0.8, 2, 0.5))
    assert s.loc["draft γ=2", "predicted_speedup_constant_c"] == pytest.approx(walltime_improvement(0.8, 2, 0.3))
    assert np.isnan(s.loc["lookup γ=3", "c_in_run"]) and np.isnan(s.loc["AR", "predicted_speedup_constant_c_in_run"])
    pd.testing.assert_frame_equal(s.drop(columns=["c_in_run", "predicted_speedup_constant_c_in_run"]), plain)


def test_limit_table_ladder_matches_summarize_speed_and_shares_sum_to_one():
    t_target, t_draft = CostCurve([1, 2, 3, 4], [100, 110, 120, 180]), CostCurve([1, 2], [30, 32])
    drafts = {"AR": None, "draft γ=2": t_draft, "lookup γ=3": None}
    summary = summarize_speed(_runs(), t_target, drafts).assign(temperature=0.0)
    limits = limit_table(summary, t_target, drafts)
    assert list(limits["method"]) == ["draft γ=2", "lookup γ=3"]
    assert list(limits["draft"]) == ["draft", "lookup"]
    merged = limits.merge(summary, on="method")
    assert np.allclose(merged["with_overhead"], merged["predicted_speedup_hardware"])
    assert np.allclose(merged["measured"], merged["measured_speedup"])
    assert np.all(limits["tokens_per_step"] >= limits["free_draft"] - 1e-12)
    assert np.all(limits["free_draft"] >= limits["hardware_aware"] - 1e-12)
    lookup = limits.set_index("method").loc["lookup γ=3"]
    assert lookup["draft_share"] == pytest.approx(0.0)  # a free draft costs nothing
    shares = limits[["verification_share", "draft_share", "overhead_share", "unexplained_share"]].sum(axis=1)
    assert np.allclose(shares, 1.0)
    product = limits[["verification_factor", "draft_factor", "overhead_factor", "unexplained_factor"]].prod(axis=1)
    assert np.allclose(product, limits["measured"] / limits["tokens_per_step"])
    assert lookup["draft_factor"] == pytest.approx(1.0)


def test_limit_table_leaves_shares_out_where_there_is_no_gap():
    t_target, t_draft = CostCurve([1, 2, 3, 4], [100, 100, 100, 100]), CostCurve([1, 2], [1, 1])
    drafts = {"draft γ=2": t_draft}
    summary = summarize_speed(_runs(), t_target, drafts)
    summary.loc[summary["method"] == "draft γ=2", "measured_speedup"] = 5.0  # above Leviathan's ideal
    limits = limit_table(summary, t_target, drafts).set_index("method")
    assert np.isnan(limits.loc["draft γ=2", "verification_share"])
    assert limits.loc["draft γ=2", "unexplained_factor"] > 1


def test_limit_table_needs_the_ar_row():
    t_target = CostCurve([1, 2], [100, 110])
    summary = summarize_speed(_runs(), t_target, {}).assign(temperature=0.0)
    with pytest.raises(ValueError):
        limit_table(summary[summary["gamma"] > 0], t_target, {})


def test_best_measured_drafts_keeps_draft_models_and_their_best_gamma():
    summary = pd.DataFrame({
        "method": ["AR", "d γ=1", "d γ=2", "int8 d γ=2", "bigram γ=3", "d γ=2"],
        "gamma": [0, 1, 2, 2, 3, 2], "alpha": [np.nan, 0.9, 0.88, 0.85, 0.15, 0.8], "c": [0, 0.4, 0.4, 0.2, 0, 0.4],
        "measured_speedup": [1.0, 1.3, 1.4, 1.7, 0.9, 1.2], "measured_speedup_lo": [1, 1.2, 1.3, 1.5, 0.8, 1.1],
        "measured_speedup_hi": [1, 1.4, 1.5, 1.9, 1.0, 1.3], "temperature": [0, 0, 0, 0, 0, 1]})
    best = best_measured_drafts(summary).set_index("draft")
    assert list(best.index) == ["d", "int8 d"]
    assert best.loc["d", "best_gamma"] == 2 and best.loc["d", "n_gammas"] == 2
    assert best.loc["d", "alpha"] == pytest.approx(0.88) and best.loc["d", "speedup_hi"] == pytest.approx(1.5)
    assert "best of 2 γ" in best.loc["d", "label"]
    assert best_measured_drafts(None).empty
    old = summary.drop(columns=["measured_speedup_lo", "measured_speedup_hi", "temperature"])
    assert np.isnan(best_measured_drafts(old)["speedup_lo"]).all()
