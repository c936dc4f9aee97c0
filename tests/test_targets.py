"""Issue 18's performance targets, checked on bench JSON files (specrepro.bench.targets): each status can come out,
a best-of pick says so, a missing file is 'not run', a corrupt one raises."""

import json

import pytest

from specrepro.bench.targets import MET, MET_MEDIAN, MISSED, NOT_RUN, TARGETS, Target, check_targets


def _row(method, **kw):
    return {"method": method, "tokens_per_s": kw.pop("tokens_per_s", 1.0), **kw}


def _write(tmp_path, name, summary, runs=(), n_prompts=20):
    (tmp_path / f"{name}.json").write_text(json.dumps({"config": {"n_prompts": n_prompts}, "summary": summary,
                                                       "runs": list(runs)}))


def _status(table, tid):
    return table.set_index("id").loc[tid, "status"]


def test_at_least_uses_the_interval_and_names_the_best_of_several(tmp_path):
    _write(tmp_path, "bench_qwen_greedy", [
        _row("ar", speedup_vs_ar=1.0, speedup_vs_hf_ar=1.02, speedup_vs_hf_ar_lo=0.97, speedup_vs_hf_ar_hi=1.04),
        _row("sd-draft@4", speedup_vs_ar=1.7, speedup_vs_ar_lo=1.5, speedup_vs_ar_hi=1.9, speedup_vs_hf_assisted=1.2),
        _row("sd-draft-int8@4", speedup_vs_ar=3.0, speedup_vs_ar_lo=2.6, speedup_vs_ar_hi=3.1,
             speedup_vs_hf_assisted=1.31, speedup_vs_hf_assisted_lo=1.2, speedup_vs_hf_assisted_hi=1.5,
             speedup_vs_hf_assisted_int8=1.05, speedup_vs_hf_assisted_int8_lo=0.9,
             speedup_vs_hf_assisted_int8_hi=1.2, measured_over_predicted=0.85,
             predicted_speedup=3.5),
        _row("hf-assisted", speedup_vs_ar=1.3),
    ])
    t = check_targets(tmp_path)
    assert _status(t, "greedy-vs-ar") == MET  # 2.6 >= 1.8: the whole interval clears it
    assert "best of 2" in t.set_index("id").loc["greedy-vs-ar", "method"]
    assert _status(t, "greedy-vs-hf-assisted") == MET_MEDIAN  # median 1.31 >= 1.3, lower bound 1.2 is not
    assert _status(t, "greedy-vs-hf-assisted-int8") == MISSED  # 1.05 < 1.1
    assert _status(t, "ar-vs-hf-ar") == MET  # [0.97, 1.04] inside [0.95, 1.05]
    assert _status(t, "greedy-predicted") == MISSED  # 0.85 is 15% below the prediction
    assert _status(t, "nucleus-vs-ar") == NOT_RUN and _status(t, "t1-tree-over-chain") == NOT_RUN
    assert t.set_index("id").loc["greedy-vs-ar", "n_prompts"] == 20


def test_within_target_fails_both_ways(tmp_path):
    target = (Target("x", "x", "b", "within", 0.05, "speedup_vs_hf_ar", ("ar",)),)
    for est, status in ((1.08, MISSED), (0.93, MISSED), (1.01, MET_MEDIAN)):
        _write(tmp_path, "b", [_row("ar", speedup_vs_hf_ar=est, speedup_vs_hf_ar_lo=est - 0.1,
                                    speedup_vs_hf_ar_hi=est + 0.1)])
        assert check_targets(tmp_path, target)["status"].iloc[0] == status


def test_tree_over_chain_pairs_the_fastest_tree_with_the_fastest_chain(tmp_path):
    runs = []
    for i in range(12):
        for m, v in (("ar", 3.0), ("sd-draft-int8@4", 6.0 + 0.1 * (i % 3)), ("sd-tree-int8@2x1", 6.6 + 0.1 * (i % 2)),
                     ("sd-tree-int8@1x2", 5.0)):
            runs.append({"method": m, "prompt": f"p{i}", "repeat": 0, "tokens_per_s": v})
    summary = [_row("ar", tokens_per_s=3.0), _row("sd-draft-int8@4", tokens_per_s=6.1),
               _row("sd-tree-int8@2x1", tokens_per_s=6.65), _row("sd-tree-int8@1x2", tokens_per_s=5.0)]
    _write(tmp_path, "bench_qwen_t1_trees", summary, runs, n_prompts=12)
    t = check_targets(tmp_path).set_index("id").loc["t1-tree-over-chain"]
    assert t["status"] == MET and t["method"].startswith("sd-tree-int8@2x1 / sd-draft-int8@4")
    slow = [dict(r, tokens_per_s=r["tokens_per_s"] * (0.8 if r["method"].startswith("sd-tree") else 1)) for r in runs]
    _write(tmp_path, "bench_qwen_t1_trees", summary, slow, n_prompts=12)
    assert check_targets(tmp_path).set_index("id").loc["t1-tree-over-chain", "status"] == MISSED


def test_a_corrupt_bench_file_raises_instead_of_reading_not_run(tmp_path):
    (tmp_path / "bench_qwen_greedy.json").write_text("{not json")
    with pytest.raises(json.JSONDecodeError):
        check_targets(tmp_path)


def test_every_target_reads_a_bench_file_of_the_record():
    from pathlib import Path

    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    for t in TARGETS:
        assert f"data/results/{t.file}.json:" in makefile, f"{t.id}: no Makefile rule writes {t.file}.json"


def test_render_targets_block(tmp_path, monkeypatch):
    import specrepro.report as report

    _write(tmp_path, "bench_qwen_nucleus", [_row("ar", speedup_vs_ar=1.0),
                                            _row("sd-draft-int8@4", speedup_vs_ar=1.4, speedup_vs_ar_lo=1.2,
                                                 speedup_vs_ar_hi=1.6)])
    monkeypatch.setattr(report, "results_dir", lambda profile: tmp_path)
    text = report.render_targets("quick")
    assert "| nucleus (T = 0.8, top-p 0.95): ≥ 1.6× our AR | **missed** | 1.40 [1.20, 1.60]×" in text
    assert "0 met · 0 met on the median · 1 missed · 7 not run" in text
