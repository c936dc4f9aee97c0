"""The scorecard's rendering (specrepro.record.report): the markdown table counts distinct claims and verdicts, escapes
pipes and shows each paper number's kind, in two groups with their own counts; the README's summary is short; the
generated blocks are replaced atomically and idempotently in whichever page (README.md or docs/*.md) holds them, only
under ``make reproduce`` unless forced; the bench block tabulates each JSON and names unreadable ones."""

import json
from pathlib import Path

import pandas as pd
import pytest

from specrepro.record import bench_blocks, report
from specrepro.record import scorecard as sc
from specrepro.record.gpu import GPU_ALPHA_METHOD
from specrepro.record.results import record_dir
from specrepro.record.scorecard import Tables
from specrepro.record.verdicts import VERDICT_DEFINITIONS

ROOT = Path(__file__).resolve().parent.parent

README = """# title

intro

<!-- scorecard:start -->
old table
<!-- scorecard:end -->

## Key figures

<!-- figures:start -->
<!-- figures:end -->

## Tests
"""


def empty_card() -> pd.DataFrame:
    return sc.score("synthetic", tables=Tables("synthetic", {}))


def test_markdown_counts_distinct_claims_escapes_pipes_and_shows_kinds():
    card = empty_card()
    card.loc[0, "reason"] = "a | b"
    md = report.render_markdown(card, "standard")
    head = md.splitlines()[0]
    assert "a \\| b" in md
    assert f"{card['id'].nunique()} distinct claims" in head
    for v in sc.VERDICTS:
        assert v in head
    groups = card["group"].nunique()
    assert groups == 2
    assert len([ln for ln in md.splitlines() if ln.startswith("| ")]) == len(card) + groups
    assert "<sub>measured</sub>" in md and "(arXiv 2211.17192v2)" in md


def test_markdown_and_summary_have_one_table_per_group_headed_by_its_counts():
    card = empty_card()
    card["verdict"] = [sc.EXACT if i % 3 else sc.TREND for i in range(len(card))]
    for md in (report.render_markdown(card, "standard"), report.render_summary(card, "standard")):
        for group in sc.GROUPS:
            rows = card[card["group"] == group]
            heading = report.group_counts(rows, group)
            assert heading.startswith(f"{group.capitalize()}: {len(rows)} claims, {len(rows)} judged — ")
            assert heading in md
            counts = rows["verdict"].value_counts()
            for v, n in counts.items():
                assert f"{n} {v}" in heading
            assert sc.NOT_RUN not in heading and "not judged" not in heading  # verdicts without a claim left out
    summary = report.render_summary(card, "standard")
    assert summary.index("Correctness:") < summary.index("Performance:")
    # correctness first, the claims' order within each group
    shown = [ln.rsplit("`", 2)[-2] for ln in summary.splitlines() if ln.startswith("| ") and "<sub>" in ln]
    assert shown == [*card[card["group"] == "correctness"]["id"], *card[card["group"] == "performance"]["id"]]


def test_summary_rows_are_short_and_move_n_to_its_own_column():
    card = empty_card().iloc[:2].copy()
    card.loc[card.index[0], ["ours", "n", "verdict", "reason"]] = [
        "1.43× [1.26, 1.66], n = 5 prompts (draft / ar)", 5, sc.TREND, "x" * 700]
    card.loc[card.index[1], ["ours", "n", "verdict"]] = ["; ".join(f"cell {i}: 0.1{i} [0.0{i}, 0.2{i}]"
                                                                   for i in range(20)), 20, sc.TREND]
    md = report.render_summary(card, "standard")
    rows = [ln for ln in md.splitlines() if ln.startswith("| ") and "<sub>" in ln]
    assert len(rows) == 2
    assert "| 1.43× [1.26, 1.66] (draft / ar) | 5 prompts | **trend reproduced** |" in rows[0]
    assert "x" * 100 not in md  # the reasons stay in scorecard.md
    cells = rows[1].split(" | ")
    assert cells[2].endswith(" …") and len(cells[2]) <= report.SUMMARY_OURS_CHARS + 2 and cells[3] == "20"
    assert all(len(ln) < 600 for ln in rows)
    assert "[`data/results/scorecard.md`](data/results/scorecard.md)" in md


def test_summary_marks_rows_whose_table_came_from_uncommitted_code():
    card = empty_card().iloc[:2].copy()
    card["commit"] = ["0123456789ab-dirty", "0123456789ab"]
    rows = [ln for ln in report.render_summary(card, "standard").splitlines() if ln.startswith("| ") and "<sub>" in ln]
    assert rows[0].endswith("· uncommitted code |") and "uncommitted" not in rows[1]
    assert "*uncommitted code*:" in report.render_summary(card, "standard")
    card["commit"] = "0123456789ab"
    assert "uncommitted" not in report.render_summary(card, "standard")


def test_markdown_head_names_each_machine_with_its_claim_count():
    card = empty_card().iloc[:3].copy()
    card["hardware"] = ["cpu (2 cores), AMD EPYC, avx512f", "cpu (2 cores), AMD EPYC, avx512f",
                        "cpu (2 cores), CPU model not recorded"]
    head = report.render_markdown(card, "standard").splitlines()[0]
    assert ("on cpu (2 cores), AMD EPYC, avx512f (2 claims); cpu (2 cores), CPU model not recorded (1 claim)"
            in head)


def test_markdown_shows_intervals_in_the_ours_cell():
    card = empty_card().iloc[:1].copy()
    card.loc[card.index[0], ["ours", "verdict"]] = ["1.43× [1.26, 1.66], n = 5 prompts", sc.TREND]
    assert "1.43× [1.26, 1.66], n = 5 prompts" in report.render_markdown(card, "standard")


def test_update_readme_is_idempotent_and_only_make_reproduce_writes_it(tmp_path, monkeypatch):
    path = tmp_path / "README.md"
    path.write_text(README)
    card = empty_card()
    monkeypatch.delenv("SPECREPRO_RECORD", raising=False)
    # an interactive run of the standard profile (no SPECREPRO_RECORD) leaves the README alone
    assert report.update_readme("standard", card, readme=path) is False and path.read_text() == README
    monkeypatch.setenv("SPECREPRO_RECORD", "1")
    assert report.update_readme("quick", card, readme=path) is False and path.read_text() == README
    assert report.update_readme("standard", card, readme=path) is True
    once = path.read_text()
    assert "old table" not in once and "| claim | paper | ours [95% CI] | n | verdict |" in once
    assert once.startswith("# title\n\nintro\n\n<!-- scorecard:start -->\n") and once.endswith("## Tests\n")
    assert "figures/fig_exactness_tv_vs_n.png" in once
    assert report.update_readme("standard", card, readme=path) is False
    assert path.read_text() == once
    twice = report.replace_block(report.replace_block(once, "scorecard", "x"), "scorecard", "x")
    assert report.replace_block(once, "scorecard", "x") == twice


def test_update_readme_writes_atomically(tmp_path, monkeypatch):
    import specrepro.record.results as results

    path = tmp_path / "README.md"
    path.write_text(README)

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(results.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        report.update_readme("standard", empty_card(), readme=path, force=True)
    assert path.read_text() == README
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md"]  # no temporary file left behind


def test_markers_missing_or_repeated_are_refused(tmp_path):
    path = tmp_path / "README.md"
    path.write_text("# no markers\n")
    with pytest.raises(ValueError, match="scorecard:start"):
        report.update_readme("standard", empty_card(), readme=path, force=True)
    assert path.read_text() == "# no markers\n"
    with pytest.raises(ValueError):
        report.replace_block(README + README, "scorecard", "x")


def test_blocks_are_rendered_into_whichever_page_holds_them(tmp_path, monkeypatch):
    """A block moved to docs/*.md is rewritten there, with its links relative to that page; README keeps the
    scorecard and figures; a block on two pages, an unknown block or README without its blocks is refused."""
    path = tmp_path / "README.md"
    path.write_text(README)
    docs = tmp_path / "docs"
    docs.mkdir()
    bench_dir = tmp_path / "results"
    bench_dir.mkdir()
    monkeypatch.setattr(bench_blocks, "results_dir", lambda profile: bench_dir)
    (docs / "bench.md").write_text("# Bench\n\n<!-- bench:start -->\nold\n<!-- bench:end -->\n\ntail\n")
    (docs / "battery.md").write_text("# Battery\n\n<!-- battery:start -->\n<!-- battery:end -->\n")
    (docs / "plain.md").write_text("# no blocks\n")
    card = empty_card()
    assert report.update_readme("synthetic", card, readme=path, force=True) is True
    bench = (docs / "bench.md").read_text()
    assert "old" not in bench and "No benchmark results for profile synthetic" in bench and bench.endswith("tail\n")
    assert "No power / false-alarm table for profile synthetic" in (docs / "battery.md").read_text()
    assert (docs / "plain.md").read_text() == "# no blocks\n"
    assert "Correctness:" in path.read_text()
    assert all(old == new for old, new in report.render_pages("synthetic", card,
                                                                report.record_pages(path)).values())
    assert report.update_readme("synthetic", card, readme=path, force=True) is False
    # links from docs/ go one level up
    cfg = {"target": "t", "draft": "d", "n_prompts": 1, "max_new_tokens": 8, "temperature": 0.0}
    monkeypatch.setattr(bench_blocks, "record_dir", lambda kind="results": bench_dir)
    monkeypatch.setattr(bench_blocks, "repo_root", lambda: tmp_path)
    (bench_dir / "bench_a.json").write_text(json.dumps({"config": cfg, "summary": [], "runs": []}))
    assert "[`../results/bench_a.json`](../results/bench_a.json)" in report.render_bench("standard", docs)
    assert "[`results/bench_a.json`](results/bench_a.json)" in report.render_bench("standard")
    # misplaced blocks
    (docs / "plain.md").write_text("<!-- bench:start -->\n<!-- bench:end -->\n")
    with pytest.raises(ValueError, match="bench block is in both"):
        report.update_readme("synthetic", card, readme=path, force=True)
    (docs / "plain.md").write_text("<!-- nonsense:start -->\n<!-- nonsense:end -->\n")
    with pytest.raises(ValueError, match="unknown generated block"):
        report.update_readme("synthetic", card, readme=path, force=True)
    (docs / "plain.md").write_text("<!-- figures:start -->\n<!-- figures:end -->\n")
    path.write_text(README.replace("<!-- figures:start -->\n<!-- figures:end -->\n", ""))
    with pytest.raises(ValueError, match="figures:start"):
        report.update_readme("synthetic", card, readme=path, force=True)


def test_repository_pages_hold_each_block_once_and_the_committed_scorecard():
    pages = report.record_pages(ROOT / "README.md")
    names = [n for p in pages for n in report.block_names(p.read_text())]
    assert sorted(names) == sorted(report.BLOCKS), names
    readme = (ROOT / "README.md").read_text()
    for name in report.README_BLOCKS:
        report.replace_block(readme, name, "x")  # raises if the markers are missing or repeated


def test_render_bench_tabulates_each_json_and_names_unreadable_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_blocks, "results_dir", lambda profile: tmp_path)
    assert "No benchmark results" in report.render_bench("synthetic")
    cfg = {"target": "t", "draft": "d", "workload": "humaneval", "n_prompts": 2, "repeats": 1, "max_new_tokens": 8,
           "temperature": 0.0, "gamma": 3, "device_description": "cpu (2 cores)", "dtype": "float32",
           "commit": "abc123"}
    summary = [{"method": "ar", "tokens_per_s": 2.0, "ms_per_token": 500.0, "speedup_vs_ar": 1.0,
                "speedup_vs_hf_assisted": None, "alpha": None, "tokens_per_step": 1.0, "per_position_acceptance": [],
                "equal_to_ar_runs": "2/2"},
               {"method": "sd-draft@3", "tokens_per_s": 3.0, "ms_per_token": 333.3, "speedup_vs_ar": 1.5,
                "speedup_vs_hf_assisted": float("nan"), "alpha": 0.9, "tokens_per_step": 3.2,
                "per_position_acceptance": [0.9, 0.8], "equal_to_ar_runs": "1/2"}]
    (tmp_path / "bench_a.json").write_text(json.dumps({"config": cfg, "summary": summary, "runs": []}))
    (tmp_path / "bench_b.json").write_text("{not json")
    md = report.render_bench("synthetic")
    rows = [ln for ln in md.splitlines() if ln.startswith("| `")]
    assert rows[0].split(" | ")[1:4] == ["2.00", "500", "1.00"]
    assert "| 1.50 | — | 0.90 | 3.20 | 0.90 0.80 | 1/2 |" in rows[1]
    assert "greedy (T = 0)" in md and "commit `abc123`" in md
    assert "γ = 3" not in md  # every speculative method names its own γ (sd-draft@3): the run's --gamma reached none
    assert "bench_b.json`: unreadable" in md
    summary[1].update(method="sd-draft", gamma=3)  # named without @γ: the run's γ is its γ, and the header says so
    (tmp_path / "bench_a.json").write_text(json.dumps({"config": cfg, "summary": summary, "runs": []}))
    assert "γ = 3 (sd-draft) · cpu (2 cores)" in report.render_bench("synthetic")
    assert "emulated" not in report.render_bench("synthetic") and "native" not in report.render_bench("synthetic")
    for bf16, note in ((False, "bfloat16 (emulated: this CPU has no AVX-512 BF16 or AMX)"),
                       (True, "bfloat16 (native: AVX-512 BF16 or AMX)")):
        (tmp_path / "bench_a.json").write_text(json.dumps({"config": {**cfg, "dtype": "bfloat16", "cpu_bf16": bf16},
                                                           "summary": summary, "runs": []}))
        assert note in report.render_bench("synthetic")


def test_render_bench_gives_tokens_per_step_and_alpha_intervals_from_the_runs(tmp_path, monkeypatch):
    """A file whose summary predates the intervals gets them from its own runs (a bootstrap over prompts)."""
    monkeypatch.setattr(bench_blocks, "results_dir", lambda profile: tmp_path)
    cfg = {"target": "t", "draft": "d", "workload": "humaneval", "n_prompts": 4, "repeats": 1, "max_new_tokens": 8,
           "temperature": 1.0, "gamma": 3, "seed": 0}
    steps, terms = [2, 3, 4, 2], [[1.0, 0.5], [0.5, 0.0, 0.5], [0.0, 0.5, 0.0, 0.5], [1.0, 1.0]]
    runs = [{"prompt": f"p{i}", "method": "sd-draft@3", "new_tokens": 8, "steps": s, "alpha_terms": a}
            for i, (s, a) in enumerate(zip(steps, terms))]
    summary = [{"method": "sd-draft@3", "tokens_per_s": 3.0, "ms_per_token": 333.3, "speedup_vs_ar": 1.5,
                "alpha": 0.5, "tokens_per_step": 32 / 11, "per_position_acceptance": []}]
    (tmp_path / "bench_a.json").write_text(json.dumps({"config": cfg, "summary": summary, "runs": runs}))
    md = report.render_bench("synthetic")
    assert "α [95% CI] | tokens/step [95% CI]" in md
    row = next(ln for ln in md.splitlines() if ln.startswith("| `sd-draft@3`"))
    alpha_cell, tps_cell = row.split(" | ")[5:7]
    assert alpha_cell.startswith("0.50 [") and tps_cell.startswith("2.91 [")
    lo, hi = (float(x) for x in tps_cell.split("[")[1].rstrip("]").split(", "))
    assert 2.0 <= lo < 32 / 11 < hi <= 4.0  # within the per-prompt extremes 8/4 and 8/2


def test_plot_verdicts_uses_integer_ticks():
    import matplotlib

    matplotlib.use("Agg")
    card = empty_card()
    ax = report.plot_verdicts(card)
    ticks = [t for t in ax.get_xticks() if t >= 0]
    assert all(float(t).is_integer() for t in ticks)
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {sc.NOT_RUN, sc.NOT_TESTABLE}


def test_plot_helpers_integer_ticks_interval_bars_and_labels():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from specrepro.lab import plots

    fig, ax = plt.subplots()
    ax.plot([1, 2, 3, 4, 6], [1.2, 1.3, 1.5, 1.4, 1.3])
    plots.integer_ticks(ax, "x")
    fig.canvas.draw()
    assert all(float(t).is_integer() for t in ax.get_xticks())
    bars = plots.interval_errorbar(ax, [1, 2, 3], [1.2, 1.4, 1.5], [1.1, np.nan, 1.3], [1.3, np.nan, 1.6])
    segments = bars.lines[2][0].get_segments()
    assert len(segments) == 3
    assert len(segments[1]) == 0 or np.isnan(segments[1]).any()  # no bar where the interval is unknown
    assert segments[0][0][1] == pytest.approx(1.1) and segments[0][1][1] == pytest.approx(1.3)
    with pytest.raises(ValueError, match="contain"):
        plots.interval_errorbar(ax, [1], [2.0], [1.0], [1.5])
    assert plots.readable("no_residual") == "no residual (control)" and plots.readable("loop_ms") == "ms per loop"
    assert plots.readable("some_name") == "some name"
    plt.close(fig)


def test_scorecard_command_leaves_the_readme_alone_outside_the_record(monkeypatch, capsys):
    """`python -m specrepro scorecard --readme` run by hand (no SPECREPRO_RECORD) scores and prints, but the generated
    blocks of README.md and docs/ are the record's: only `make scorecard` rewrites them."""
    import argparse
    from pathlib import Path

    from specrepro.record import cli

    root = Path(__file__).resolve().parent.parent
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    before = {p: p.read_bytes() for p in pages}
    monkeypatch.delenv("SPECREPRO_RECORD", raising=False)
    assert cli.run_command(argparse.Namespace(profile="standard", device="cpu", readme=True)) == 0
    assert "README.md not rewritten" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in pages} == before


def test_gpu_block_from_cost_curves_and_a_cuda_test_log(tmp_path):
    """The gpu block recomputes c and the predictions from the cost-curve file and counts the CUDA test log's
    results, naming the tests that the run did not reach."""
    from specrepro.theory import CostCurve, hardware_aware_speedup

    ns = [1, 2, 5, 8]
    cfg = {"device_description": "cuda: Test GPU", "dtype": "bfloat16", "random_weights": True, "torch": "t",
           "transformers": "x", "commit": "abc", "date": "2026-01-01", "ns": ns, "prefix_len": 10, "repeats": 3}
    target = {"eager_ms": [10.0, 10.5, 11.0, 12.0], "static_ms": None, "graphs_ms": [2.0, 2.1, 2.2, 2.4],
              "graphs_max_abs_logit_diff": 0.0}
    draft = {"eager_ms": [5.0, 5.0, 5.0, 5.0], "static_ms": None, "graphs_ms": [0.5, 0.5, 0.5, 0.5],
             "graphs_max_abs_logit_diff": 0.0}
    (tmp_path / "cost_curves_test.json").write_text(json.dumps({"config": cfg, "models": {"/x/big": target,
                                                                                         "/x/small": draft}}))
    (tmp_path / "test_cuda_test.json").write_text(json.dumps({"device": "cuda: Test GPU", "commit": "abc", "torch": "t",
                                                              "transformers": "x", "date": "d", "collected": 4,
                                                              "time_limit_s": 9}))
    (tmp_path / "test_cuda_test.log").write_text("t::a PASSED [25%]\nt::b PASSED [50%]\nt::c FAILED [75%]\n")
    text = report.render_gpu("standard", tmp_path)
    alpha = next(r["alpha"] for r in json.loads((record_dir("results") / "bench_qwen_greedy.json").read_text())
                 ["summary"] if r["method"] == GPU_ALPHA_METHOD)
    want = hardware_aware_speedup(alpha, 4, CostCurve(ns, target["graphs_ms"]), CostCurve(ns, draft["graphs_ms"]))
    assert "| small | graphs | 0.50 | 0.50 | 0.50 | 0.50 |" in text
    assert f"| graphs | 0.25 | {want:.2f}x |" in text and "| eager | 0.50 |" in text
    assert "**2 passed, 1 failed** of 4 collected; 1 not reached within the run's 9 s" in text
    assert report.render_gpu("standard", tmp_path / "empty").startswith("No GPU measurements")
    assert "keeps no per-round times, so its medians carry no interval" in text


def test_gpu_block_prints_the_intervals_a_cost_curve_file_has(tmp_path):
    """A cost-curve file with per-mode intervals (ms_low / ms_high; null where under 6 rounds) gets them beside each
    median; none is made up where the file has null."""
    cfg = {"device_description": "cuda: Test GPU", "dtype": "bfloat16", "torch": "t", "transformers": "x",
           "commit": "abc", "date": "2026-01-01", "ns": [1, 2], "prefix_len": 10, "repeats": 9}
    row = {"eager_ms": [10.0, 11.0], "eager_ms_low": [9.5, None], "eager_ms_high": [10.25, None], "static_ms": None,
           "graphs_ms": None, "graphs_max_abs_logit_diff": None}
    (tmp_path / "cost_curves_test.json").write_text(json.dumps({"config": cfg, "models": {"/x/big": row}}))
    text = report.render_gpu("standard", tmp_path)
    assert "| big | eager | 10.00 [9.50, 10.25] | 11.00 |" in text and "[95% interval of the median]" in text


def test_group_counts_separate_what_was_judged_from_what_was_not():
    rows = pd.DataFrame({"id": list("abcdef"), "verdict": [sc.EXACT, sc.TREND, sc.TREND, sc.COMPUTED,
                                                            sc.NOT_TESTABLE, sc.NOT_RUN]})
    assert report.group_counts(rows, "performance") == (
        "Performance: 6 claims, 3 judged — 1 reproduced exactly, 2 trend reproduced; not judged: 1 computed, "
        "1 not testable here, 1 not run")
    assert report.group_counts(rows.iloc[3:]) == "3 claims, 0 judged — none; not judged: 1 computed, 1 not testable " \
                                                  "here, 1 not run"


def test_the_rendered_scorecards_carry_the_verdicts_definitions_from_the_code():
    card = empty_card()
    for md in (report.render_markdown(card, "standard"), report.render_summary(card, "standard")):
        assert sc.verdict_definitions() in md + "\n"
        for v in sc.VERDICTS:
            assert f"**{v}**: {VERDICT_DEFINITIONS[v]}." in md


def test_the_llama_audit_block_renders_every_row_with_its_power(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_blocks, "record_dir", lambda kind="results": tmp_path)
    assert "No llama.cpp audit" in report.render_llama_audit()
    rows = [dict(setting="T=1", implementation=impl, role=role, n=2000, tv=tv, p_value=p, g_test_p=p,
                 min_detectable_tv_90=0.069, verdict=v, llamacpp_accept_rate=acc, specrepro_accept_rate=0.72,
                 llama_cpp_python="0.3.36", level=0.001, prompt="bfnc", length=3, gamma=2)
            for impl, role, tv, p, v, acc in (("llama-speculative-simple", "audited", 0.115, 0.75, "pass", 0.40),
                                               ("llama-speculative", "audited", 0.41, 1e-5, "fail", 0.63),
                                               ("specrepro_chain", "control", 0.107, 0.49, "pass", float("nan")))]
    pd.DataFrame(rows).to_csv(tmp_path / "audit_llamacpp.csv", index=False)
    text = report.render_llama_audit()
    assert "| T=1 | `llama-speculative` | audited | 2000 | 0.410 | 1e-05 | 1e-05 | 0.069 | **fail** | 0.63 / 0.72 |" in text
    assert "| T=1 | `specrepro_chain` | control | 2000 | 0.107 | 0.49 | 0.49 | 0.069 | **pass** | — / 0.72 |" in text
    pd.DataFrame([{**rows[0], "tv_null_mean": 0.109}]).to_csv(tmp_path / "audit_llamacpp.csv", index=False)
    assert "| 2000 | 0.115 (0.109) |" in report.render_llama_audit()
    assert "γ = 2" in text and "level 0.001" in text


def test_llama_divergences_render_counts_rule_and_each_paths_gap(tmp_path):
    import hashlib

    row = dict(method="llama-sd@4", reference="llama-ar", prompt_id="HumanEval/2", passes="3/3", diverged_at=26,
               ref_token=1, other_token=2, gap_one_token=-0.04, gap_batch=-0.12, gap_server=0.03, disagreement=0.13,
               order_differs=True, explained=True)
    bench = tmp_path / "bench_llama.json"
    bench.write_text("{}")
    pd.DataFrame([row, dict(row, method="llama-lookup@4", explained=False, order_differs=False)]).to_csv(
        tmp_path / "divergences_bench_llama.csv", index=False)
    (tmp_path / "divergences_bench_llama.provenance.json").write_text(json.dumps(
        {"bench_sha256": hashlib.sha256(b"{}").hexdigest(), "tie_bound": 1e-3, "tie_disagreements": 4.0}))
    text = bench_blocks._render_divergences(bench, [{"method": "llama-sd@4", "greedy_equal_to_ar": False}])
    assert "2 (method, reference, prompt) rows at 1 points, 1 of them near-ties" in text
    assert "max(0.001, 4 d)" in text and "1 where the replayed paths themselves rank" in text
    assert "-0.04 / -0.12 / +0.03, d 0.13" in text and "`llama-lookup@4` vs `llama-ar` (3/3)" in text
