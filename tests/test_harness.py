"""The one timing harness: interleaving, rotation, the seeding rule, paired speedups and their intervals."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from specrepro.measure.harness import (
    RunOutput,
    draft_of_method,
    in_run_cost_coefficient,
    paired_ratios,
    paired_speedup,
    run_interleaved,
    seed_for,
    speedup_table,
)
from specrepro.stats import bootstrap_ci, ratio_of_sums_ci


def _recording_runners(log, tokens_for=None):
    def make(label):
        def run(ids, generator):
            log.append((label, int(ids[0]), generator.initial_seed()))
            toks = (tokens_for or {}).get(label, [int(ids[0]), 7])
            return RunOutput(tokens=list(toks), drafted=[2], accepted=[1], alpha_terms=[0.5, 0.25])
        return run
    return {m: make(m) for m in ("ar", "a", "b")}


def test_interleaved_rotated_and_paired_seeds():
    log = []
    prompts = [(f"p{i}", torch.tensor([i, 1, 2])) for i in range(4)]
    runs = run_interleaved(_recording_runners(log), prompts, repeats=2, seed=5, progress=False, baseline="ar",
                           greedy=True)
    assert len(runs) == 2 * 4 * 3
    # interleaved: the calls for one (repeat, prompt) are contiguous, every method once
    for k in range(8):
        block = log[3 * k: 3 * k + 3]
        assert sorted(lbl for lbl, _, _ in block) == ["a", "ar", "b"]
        assert len({p for _, p, _ in block}) == 1
        # one seed per (repeat, prompt), shared by every method
        assert len({s for _, _, s in block}) == 1
    assert log[0][2] == seed_for(5, 0, 0) and log[3][2] == seed_for(5, 0, 1) and log[12][2] == seed_for(5, 1, 0)
    # rotated: the first method differs from prompt to prompt and every method is first somewhere
    firsts = [log[3 * k][0] for k in range(8)]
    assert firsts[:3] == ["ar", "a", "b"] and set(firsts) == {"ar", "a", "b"}
    assert runs["equal_to_baseline"].all()


def test_warmup_is_untimed_and_errors():
    log, warm = [], []
    prompts = [("p0", torch.tensor([3]))]
    runners = _recording_runners(log)
    w = {"a": lambda ids, g: warm.append(g.initial_seed()) or RunOutput(tokens=[1])}
    runs = run_interleaved(runners, prompts, warmup=w, progress=False)
    assert warm == [seed_for(0, 0, 0)] and len(runs) == 3
    with pytest.raises(ValueError, match="baseline"):
        run_interleaved(runners, prompts, baseline="zz", progress=False)
    with pytest.raises(ValueError, match="repeats"):
        run_interleaved(runners, prompts, repeats=0, progress=False)
    with pytest.raises(ValueError, match="prompt"):
        run_interleaved(runners, [], progress=False)
    with pytest.raises(ValueError, match="unknown methods"):
        run_interleaved(runners, prompts, warmup={"zz": runners["a"]}, progress=False)


def test_greedy_equality_detects_a_different_output():
    log = []
    prompts = [("p0", torch.tensor([3]))]
    runs = run_interleaved(_recording_runners(log, {"b": [9, 9]}), prompts, baseline="ar", greedy=True,
                           progress=False)
    eq = runs.set_index("method")["equal_to_baseline"]
    assert eq["a"] and not eq["b"]


def _synthetic(ratios_by_prompt, repeats=1):
    rows = []
    for r in range(repeats):
        for i, ratio in enumerate(ratios_by_prompt):
            rows.append({"repeat": r, "prompt": f"p{i}", "method": "ar", "tokens_per_s": 10.0, "new_tokens": 10,
                         "steps": 10, "drafted": [], "accepted": [], "alpha_terms": [], "equal_to_baseline": None})
            rows.append({"repeat": r, "prompt": f"p{i}", "method": "sd", "tokens_per_s": 10.0 * ratio,
                         "new_tokens": 10, "steps": 4, "drafted": [3] * 4, "accepted": [2] * 4,
                         "alpha_terms": [0.8] * 4, "equal_to_baseline": None})
    return pd.DataFrame(rows)


def test_paired_speedup_is_the_median_of_per_prompt_ratios_with_an_interval():
    ratios = [1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0]
    sp = paired_speedup(_synthetic(ratios), "sd", "ar")
    assert sp["speedup"] == pytest.approx(np.median(ratios))
    assert sp["n_prompts"] == 10 and sp["repeats"] == 1
    assert 1.1 <= sp["speedup_lo"] < sp["speedup"] < sp["speedup_hi"] <= 2.0
    assert sp["speedup_lo"] > 1.0  # every prompt faster: the interval excludes "no speedup"


def test_interval_straddles_one_when_the_prompts_disagree():
    sp = paired_speedup(_synthetic([0.6, 0.8, 1.0, 1.2, 1.4, 0.7, 1.3]), "sd", "ar")
    assert sp["speedup_lo"] < 1.0 < sp["speedup_hi"]


def test_repeats_average_geometrically_within_a_prompt():
    df = _synthetic([2.0, 2.0])
    df2 = _synthetic([0.5, 0.5]).assign(repeat=1)
    r = paired_ratios(pd.concat([df, df2]), "sd", "ar")
    assert np.allclose(r.to_numpy(), 1.0)  # sqrt(2 * 0.5)


def test_speedup_table_columns_and_unknown_method():
    t = speedup_table(_synthetic([1.5, 1.5, 1.5])).set_index("method")
    assert t.loc["ar", "speedup"] == 1.0
    assert t.loc["sd", "speedup"] == pytest.approx(1.5) and t.loc["sd", "speedup_lo"] == pytest.approx(1.5)
    assert t.loc["sd", "alpha"] == pytest.approx(0.8) and t.loc["sd", "tokens_per_step"] == pytest.approx(2.5)
    with pytest.raises(KeyError, match="no runs"):
        paired_speedup(_synthetic([1.0]), "nope")


def test_bootstrap_ci_edge_cases_and_reproducibility():
    assert np.isnan(bootstrap_ci([1.3])[1])
    assert bootstrap_ci([2.0, 2.0, 2.0]) == (2.0, 2.0, 2.0)
    assert np.isnan(bootstrap_ci([])[0])
    x = np.random.default_rng(1).normal(1.3, 0.2, size=30)
    a, b = bootstrap_ci(x, seed=3), bootstrap_ci(x, seed=3)
    assert a == b and a[1] < a[0] < a[2]
    # the interval is the sample's, whatever the order of the rows it came from
    m = bootstrap_ci(x, statistic=np.mean, seed=3)  # a continuous statistic: every resample counts
    assert bootstrap_ci(np.random.default_rng(2).permutation(x), statistic=np.mean, seed=3) == m


def test_ratio_of_sums_ci_keeps_the_pooled_rate_and_resamples_prompts():
    tokens = np.array([128, 128, 128, 128, 96, 128, 128, 128])
    steps = np.array([20, 40, 25, 31, 30, 18, 35, 22])
    est, lo, hi = ratio_of_sums_ci(tokens, steps, seed=2)
    assert est == pytest.approx(tokens.sum() / steps.sum())  # the pooled rate, not the mean of per-prompt rates
    assert lo < est < hi and lo > (tokens / steps).min() and hi < (tokens / steps).max()
    assert ratio_of_sums_ci(tokens, steps, seed=2) == (est, lo, hi)
    # prompts with one rate: a degenerate interval; one prompt: none; zero or NaN denominators dropped
    assert ratio_of_sums_ci([4, 8], [2, 4]) == (2.0, 2.0, 2.0)
    assert np.isnan(ratio_of_sums_ci([4], [2])[1]) and ratio_of_sums_ci([4], [2])[0] == 2.0
    assert ratio_of_sums_ci([4, 5, np.nan], [2, 0, 1]) [0] == 2.0
    assert np.isnan(ratio_of_sums_ci([], [])[0])
    with pytest.raises(ValueError, match="differ in length"):
        ratio_of_sums_ci([1, 2], [1])


class _CharTokenizer:
    """Maps characters to ids 0..7 (enough for the tiny random models)."""

    eos_token_id = None

    def __call__(self, text, return_tensors="pt"):
        return type("Enc", (), {"input_ids": torch.tensor([[ord(c) % 8 for c in text]])})()

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + int(i)) for i in ids)


def test_notebook_runners_share_the_harness():
    """speed_table, tree_vs_chain_speed and compare_methods all time through run_interleaved: the same columns,
    paired speedups, greedy outputs equal to AR."""
    from conftest import tiny_lm

    from specrepro.core.sampling import GREEDY
    from specrepro.data import Prompt
    from specrepro.drafters.model import DraftModelDrafter
    from specrepro.lab.leviathan import speed_table, summarize_speed
    from specrepro.lab.medusa import acceleration_table, compare_methods, make_runner
    from specrepro.lab.specinfer import tree_vs_chain_speed

    target, draft = tiny_lm("llama", seed=0), tiny_lm("llama", seed=1)
    tok = _CharTokenizer()
    prompts = [Prompt(f"p{i}", "abcdefg"[: 3 + i]) for i in range(3)]
    runs = speed_table(target, tok, {"AR": (None, 0), "sd": (DraftModelDrafter(draft, 8), 2)}, prompts,
                       max_new_tokens=6, progress=False)
    assert {"tokens", "seconds", "tokens_per_s", "same_as_ar", "overhead_ms", "repeat"} <= set(runs.columns)
    assert runs["same_as_ar"].all()
    summary = summarize_speed(runs, lambda n: 1.0, {"sd": None}).set_index("method")
    assert summary.loc["sd", "n_prompts"] == 3 and "measured_speedup_lo" in summary.columns

    speed = tree_vs_chain_speed(target, draft, tok, prompts, tree=(2, 2), gamma=2, sampling=GREEDY,
                                max_new_tokens=6, progress=False)
    assert speed["equal_to_baseline"].all() and len(speed) == 12  # AR, chains γ = 2 and γ = 4 (equal positions), tree
    assert set(speed["method"]) == {"AR", "chain γ=2", "chain γ=4 (equal positions)", "tree <2,1> (4 nodes)"}

    methods = {"AR": make_runner(target, "ar", max_new_tokens=6),
               "chain": make_runner(target, "chain", DraftModelDrafter(draft, 8), gamma=2, max_new_tokens=6)}
    cm = compare_methods(tok, methods, prompts, baseline="AR", progress=False)
    assert cm["same_as_baseline"].all() and set(cm["text"].str.len()) <= {6}
    table = acceleration_table(cm, baseline="AR").set_index("method")
    assert {"speedup_measured", "speedup_measured_lo", "speedup_measured_hi"} <= set(table.columns)
    assert table["paper_speedup"].isna().all()  # no Medusa row: no paper number beside AR or a chain


def test_paper_speedup_beside_medusa_rows_is_of_the_same_kind():
    """Medusa-2 rows get the paper's Medusa-2 figure, other Medusa rows Medusa-1's, baselines none (an 'AR (Medusa-2
    backbone)' row included); both figures come from data/papers, and Table 1's recalled columns are not there."""
    from specrepro.lab.medusa import PAPER_TABLE1, paper_speedup
    from specrepro.lab.papers import paper_table

    assert list(paper_table("medusa_table1").columns) == ["model", "mt_bench_speedup"]
    assert paper_speedup("Medusa-2") == PAPER_TABLE1["Medusa-2 Vicuna-7B"]
    assert paper_speedup("Medusa (accuracy tree)") == paper_speedup("Medusa-1") == PAPER_TABLE1["Medusa-1 Vicuna-7B"]
    assert PAPER_TABLE1["Medusa-1 Vicuna-7B"] != PAPER_TABLE1["Medusa-2 Vicuna-7B"]
    assert np.isnan(paper_speedup("AR (Medusa-2 backbone)")) and np.isnan(paper_speedup("AR"))


def test_alpha_summary_gives_each_cell_its_size_and_interval():
    from specrepro.lab.leviathan import alpha_summary

    rng = np.random.default_rng(0)
    runs = pd.DataFrame([{"workload": w, "temperature": t, "drafter": d, "prompt": f"p{i}", "positions": 64 - i,
                          "alpha": (0.9 if d == "model" else 0.2) + 0.05 * rng.standard_normal()}
                         for w in ("humaneval", "pydoc") for t in (0.0, 1.0) for d in ("bigram", "model")
                         for i in range(12)])
    out = alpha_summary(runs)
    assert len(out) == 8 and (out["prompts"] == 12).all() and (out["positions"] == sum(64 - i for i in range(12))).all()
    cell = runs[(runs["drafter"] == "model") & (runs["workload"] == "pydoc") & (runs["temperature"] == 1.0)]
    row = out.loc[("model", "pydoc", 1.0)]
    assert row["alpha"] == pytest.approx(cell["alpha"].mean())
    assert row["ci95_lo"] < row["alpha"] < row["ci95_hi"] and row["ci95_hi"] - row["ci95_lo"] < 0.1
    assert out.loc[("bigram", "humaneval", 0.0), "ci95_hi"] < out.loc[("model", "humaneval", 0.0), "ci95_lo"]


def test_an_interrupted_run_resumes_from_its_checkpoint(tmp_path):
    """Blocks saved before an interruption are loaded, not timed again; the rest run with the same seeds and
    rotation as an uninterrupted run; more repeats reuse the passes already done; another key starts afresh."""
    prompts = [(f"p{i}", torch.tensor([i, 1])) for i in range(3)]
    ckpt = tmp_path / "t.checkpoint"
    log = []
    runners = _recording_runners(log)
    calls = {"n": 0}

    def failing(ids, generator):  # interrupted during the 5th block (repeat 1, prompt 1)
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return runners["b"](ids, generator)

    with pytest.raises(KeyboardInterrupt):
        run_interleaved({**runners, "b": failing}, prompts, repeats=2, seed=3, progress=False,
                        checkpoint=ckpt, checkpoint_key={"machine": "x"})
    assert len(json.loads(ckpt.read_text())["rows"]) == 4 * 3  # 4 finished blocks of 3 methods
    log.clear()
    runs = run_interleaved(runners, prompts, repeats=2, seed=3, progress=False, checkpoint=ckpt,
                           checkpoint_key={"machine": "x"})
    assert runs.attrs["resumed_blocks"] == 4 and len(runs) == 2 * 3 * 3
    assert {(p, s) for _, p, s in log} == {(1, seed_for(3, 1, 1)), (2, seed_for(3, 1, 2))}  # only the missing blocks
    fresh = run_interleaved(_recording_runners([]), prompts, repeats=2, seed=3, progress=False)
    cols = ["repeat", "prompt", "method", "position", "new_tokens"]
    assert runs[cols].equals(fresh[cols])  # same order and content as an uninterrupted run
    log.clear()
    more = run_interleaved(runners, prompts, repeats=3, seed=3, progress=False, checkpoint=ckpt,
                           checkpoint_key={"machine": "x"})
    assert more.attrs["resumed_blocks"] == 6 and len(log) == 3 * 3 and len(more) == 3 * 3 * 3
    with pytest.warns(UserWarning, match="not resumed"):
        other = run_interleaved(runners, prompts, repeats=1, seed=3, progress=False, checkpoint=ckpt,
                                checkpoint_key={"machine": "y"})
    assert other.attrs["resumed_blocks"] == 0
    assert len(list(tmp_path.glob("t.checkpoint.stale-*"))) == 1  # the other machine's blocks are kept, not lost


def test_an_unreadable_checkpoint_is_set_aside(tmp_path):
    ckpt = tmp_path / "t.checkpoint"
    ckpt.write_text("{not json")
    with pytest.warns(UserWarning, match="cannot be read"):
        runs = run_interleaved(_recording_runners([]), [("p0", torch.tensor([1]))], progress=False,
                               checkpoint=ckpt, checkpoint_key={})
    assert len(runs) == 3 and json.loads(ckpt.read_text())["key"] == {}
    assert [p.read_text() for p in tmp_path.glob("t.checkpoint.stale-*")] == ["{not json"]


def sweep_runs(u=40.0, fixed=200.0, t=100.0, prompts=6, noise=0.0, seed=0):
    """Per-run rows of AR and a draft model at γ = 1, 2, 4: the draft's total time is fixed + u · drafted (ms),
    AR's target forward t ms per step; two passes (repeats), two temperatures, the T = 1 runs at one γ only."""
    rng = np.random.default_rng(seed)
    rows = []
    for temp in (0.0, 1.0):
        for rep in range(2):
            for i in range(prompts):
                rows.append({"temperature": temp, "repeat": rep, "prompt": f"p{i}", "method": "AR", "gamma": 0,
                             "drafted": 0, "draft_ms": np.nan, "target_ms": t * (1 + noise * rng.normal())})
                for g in ((1, 2, 4) if temp == 0 else (4,)):
                    drafted = 40 * g // (1 + g // 2)
                    total = fixed + u * (1 + noise * rng.normal()) * drafted
                    rows.append({"temperature": temp, "repeat": rep, "prompt": f"p{i}", "method": f"small γ={g}",
                                 "gamma": g, "drafted": drafted, "draft_ms": total / drafted, "target_ms": 2 * t})
    return pd.DataFrame(rows)


def test_in_run_cost_coefficient_leaves_the_prefill_out_of_c():
    out = in_run_cost_coefficient(sweep_runs(u=40.0, fixed=200.0, t=100.0))
    assert list(out["draft"]) == ["small"]
    r = out.iloc[0]
    # the slope over the γ sweep is the draft's time per token: c = 40 / 100, not draft_ms (which carries the prefill)
    assert r["c"] == pytest.approx(0.4) and r["draft_fixed_ms"] == pytest.approx(200.0)
    assert r["target_ms"] == pytest.approx(100.0) and r["n_prompts"] == 6 and r["cells"] == 12  # T = 1: one γ, skipped
    noisy = in_run_cost_coefficient(sweep_runs(noise=0.05, seed=1)).iloc[0]
    assert noisy["c_lo"] < 0.4 < noisy["c_hi"] and noisy["c_hi"] - noisy["c_lo"] < 0.1


def test_in_run_cost_coefficient_errors_and_draft_labels():
    assert draft_of_method("int8 qwen γ=4") == "int8 qwen" and draft_of_method("bigram") == "bigram"
    with pytest.raises(KeyError, match="draft_ms"):
        in_run_cost_coefficient(sweep_runs().drop(columns="draft_ms"))
    with pytest.raises(KeyError, match="baseline"):
        in_run_cost_coefficient(sweep_runs(), baseline="ar")
    single = sweep_runs().query("method in ('AR', 'small γ=4')")  # no sweep: c cannot be separated from the prefill
    assert in_run_cost_coefficient(single).empty


def test_tree_vs_chain_speed_resumes_its_timing_from_a_checkpoint(tmp_path):
    """An interrupted tree-vs-chain timing resumes at the first unfinished (pass, prompt) block; a checkpoint saved
    for other models is set aside, not resumed."""
    from conftest import tiny_lm

    from specrepro.core.sampling import GREEDY
    from specrepro.data import Prompt
    from specrepro.lab.specinfer import tree_vs_chain_speed

    target, draft = tiny_lm("llama", seed=0), tiny_lm("llama", seed=1)
    tok = _CharTokenizer()
    prompts = [Prompt(f"p{i}", "abcdefg"[: 3 + i]) for i in range(3)]
    ckpt = tmp_path / "speed.json"
    kw = dict(tree=(2, 2), gamma=2, sampling=GREEDY, max_new_tokens=6, progress=False, checkpoint=ckpt)
    first = tree_vs_chain_speed(target, draft, tok, prompts[:2], checkpoint_key={"draft": "d"}, **kw)
    assert ckpt.exists() and first.attrs.get("resumed_blocks", 0) == 0
    saved = json.loads(ckpt.read_text())
    assert saved["key"]["draft"] == "d" and saved["key"]["code"]
    # the same two prompts again: every block comes from the checkpoint, with the times it saved
    again = tree_vs_chain_speed(target, draft, tok, prompts[:2], checkpoint_key={"draft": "d"}, **kw)
    assert again.attrs["resumed_blocks"] == 2
    assert sorted(again["seconds"]) == sorted(first["seconds"])
    with pytest.warns(UserWarning, match="not resumed"):
        other = tree_vs_chain_speed(target, draft, tok, prompts[:2], checkpoint_key={"draft": "d (int8)"}, **kw)
    assert other.attrs["resumed_blocks"] == 0 and list(tmp_path.glob("speed.json.stale-*"))


def test_speed_table_resumes_its_timing_from_a_checkpoint(tmp_path):
    """Notebook 04's γ sweep resumes at the first unfinished (pass, prompt) block; other methods, another sampling
    setting or other model names set the checkpoint aside."""
    from conftest import tiny_lm

    from specrepro.core.sampling import GREEDY, SamplingConfig
    from specrepro.data import Prompt
    from specrepro.drafters.model import DraftModelDrafter
    from specrepro.lab.leviathan import speed_table

    target, draft = tiny_lm("llama", seed=0), tiny_lm("llama", seed=1)
    tok = _CharTokenizer()
    prompts = [Prompt(f"p{i}", "abcdefg"[: 3 + i]) for i in range(2)]
    methods = {"AR": (None, 0), "sd γ=2": (DraftModelDrafter(draft, 8), 2)}
    ckpt = tmp_path / "runs.json"
    kw = dict(max_new_tokens=6, progress=False, checkpoint=ckpt, checkpoint_key={"draft": "d"})
    first = speed_table(target, tok, methods, prompts, sampling=GREEDY, **kw)
    assert first.attrs["resumed_blocks"] == 0 and first["same_as_ar"].all()
    again = speed_table(target, tok, methods, prompts, sampling=GREEDY, **kw)
    assert again.attrs["resumed_blocks"] == 2 and "gamma" in again and again["same_as_ar"].all()
    assert sorted(again["seconds"]) == sorted(first["seconds"])
    with pytest.warns(UserWarning, match="not resumed"):
        t1 = speed_table(target, tok, methods, prompts, sampling=SamplingConfig(1.0), **kw)
    assert t1.attrs["resumed_blocks"] == 0


def test_timing_checkpoint_key_names_the_settings_machine_and_code():
    from specrepro.measure.harness import timing_checkpoint_key

    prompts = [("a", torch.arange(5)), ("b", torch.arange(3))]
    key = timing_checkpoint_key(("specrepro.lab.specinfer",), prompts, "cpu", draft="d", gamma=2)
    assert key["draft"] == "d" and key["prompts"] == ["a", "b"] and key["prompt_tokens"] == [5, 3]
    assert {"cpu", "torch", "threads", "code", "device"} <= set(key) and json.dumps(key)
    other = timing_checkpoint_key(("specrepro.lab.leviathan",), prompts, "cpu", draft="d", gamma=2)
    assert other["code"] != key["code"]
    with pytest.raises(ModuleNotFoundError):
        timing_checkpoint_key(("specrepro.nope",), prompts)
