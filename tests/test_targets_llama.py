"""The llama.cpp targets, ladder and cost timing: the targets' kinds on synthetic bench JSON (met, met on the
median, missed, not run), the limit ladder of a synthetic run against numbers worked by hand, the bench block's
llama.cpp columns, and the BlockLM cost timing on the tiny GGUF checkpoints (skipped without llama_cpp)."""

import json

import pytest

from specrepro.bench.ladder import llama_ladder, llama_cost_line, ladder_markdown
from specrepro.bench.targets import MET, MET_MEDIAN, MISSED, NOT_RUN, TARGETS, check_targets
from specrepro.theory import alpha_from_acceptance_rate, expected_tokens

LLAMA_IDS = ("llama-greedy-vs-llama-ar", "llama-greedy-vs-llama-spec", "llama-greedy-predicted",
             "llama-chat-vs-llama-ar", "llama-t1-vs-llama-ar")
P = 12  # prompts
T1, T5, TD = 50.0, 70.0, 5.0  # llama.cpp cost model, ms: t(1), t(5) (t(n) = 45 + 5 n), t_draft(1)


def _cost_model():
    curve = {str(n): 45.0 + 5 * n for n in range(1, 22)}
    one = {"target_ms": curve, "target_ms_lo": {k: v - 1 for k, v in curve.items()},
           "target_ms_hi": {k: v + 1 for k, v in curve.items()}, "draft_ms": TD, "draft_ms_lo": 4.8,
           "draft_ms_hi": 5.3, "c": 0.1, "c_lo": 0.09, "c_hi": 0.11}
    return {"prefix_len": 200, "repeats": 5, "rounds": 3, "timed_on": "the prompts' tokens", "target_ms": curve,
            "draft_ms": TD, "c": 0.1, "before": one, "after": {**one, "c_lo": 0.085}}


def _run(sd_speed=1.85, server_spec=26.0, with_cost=True, with_server=True):
    """A greedy llama.cpp run: llama-ar 20 tokens/s, llama-sd@4 sd_speed × that (α 0.8), llama-lookup@3,
    llama.cpp's server AR (21 tokens/s) and its draft speculation (server_spec tokens/s, 40% of drafted accepted)."""
    runs = []
    speeds = {"ar": 5.0, "llama-ar": 20.0, "llama-sd@4": 20.0 * sd_speed, "llama-lookup@3": 24.0}
    if with_server:
        speeds.update({"llama-server-ar": 21.0, "llama-server-draft": server_spec,
                       "llama-server-ngram-simple": 20.0})
    for i in range(P):
        wobble = 1 + 0.01 * (i % 3)
        for m, v in speeds.items():
            row = {"method": m, "prompt": f"p{i}", "repeat": 0, "tokens_per_s": v * wobble, "new_tokens": 128}
            if m == "llama-ar":
                row.update(target_ms=T1, loop_ms=T1 + 1, steps=128)
            if m == "llama-sd@4":
                row.update(target_ms=T5, draft_ms=TD, loop_ms=T5 + 4 * TD + 2)
            if m == "llama-server-draft":  # the server's totals in the first step, as specrepro.bench.llamaserver
                row.update(drafted=[100] + [0] * 99, accepted=[40] + [0] * 99, steps=100)
            if m == "llama-server-ngram-simple":
                row.update(drafted=[30] + [0] * 111, accepted=[15] + [0] * 111, steps=112)
            runs.append(row)
    e = float(expected_tokens(0.8, 4))
    summary = [{"method": "ar", "tokens_per_s": 5.0, "exact": True},
               {"method": "llama-ar", "tokens_per_s": 20.0, "exact": True, "gamma": 0},
               {"method": "llama-sd@4", "tokens_per_s": 20 * sd_speed, "exact": True, "gamma": 4, "alpha": 0.8,
                "tokens_per_step": e, "drafted_per_step": 4.0, "speedup_vs_llama_ar": sd_speed,
                "speedup_vs_llama_ar_lo": sd_speed - 0.05, "speedup_vs_llama_ar_hi": sd_speed + 0.05,
                "speedup_vs_ar": 4 * sd_speed, "greedy_equal_to_llama_ar": True, "equal_to_llama_ar_runs": "12/12"},
               {"method": "llama-lookup@3", "tokens_per_s": 24.0, "exact": True, "gamma": 3, "alpha": 0.3,
                "drafted_per_step": 2.0, "tokens_per_step": 1.4, "speedup_vs_llama_ar": 1.2}]
    if with_server:
        s_ar = 20 * sd_speed / 21
        summary[2].update(speedup_vs_llama_server_ar=s_ar, speedup_vs_llama_server_ar_lo=s_ar - 0.05,
                          speedup_vs_llama_server_ar_hi=s_ar + 0.05)
        summary += [{"method": "llama-server-ar", "tokens_per_s": 21.0, "exact": True},
                    {"method": "llama-server-draft", "tokens_per_s": server_spec, "exact": True, "gamma": None,
                     "drafted_per_step": 1.0, "tokens_per_step": 1.28, "speedup_vs_llama_server_ar": server_spec / 21},
                    {"method": "llama-server-ngram-simple", "tokens_per_s": 20.0, "exact": True, "gamma": 0,
                     "drafted_per_step": 30 / 112, "speedup_vs_llama_server_ar": 20 / 21}]
    config = {"n_prompts": P, "temperature": 0.0, "seed": 0, "target": "qwen2.5-coder-1.5b",
              "draft": "qwen2.5-coder-0.5b", "workload": "humaneval"}
    if with_cost:
        config["llama_cost_model"] = _cost_model()
    return {"config": config, "summary": summary, "runs": runs}


def _check(tmp_path, data, name="bench_llamacpp_greedy"):
    (tmp_path / f"{name}.json").write_text(json.dumps(data))
    if name == "bench_llamacpp_greedy":  # the own-speculation target reads its own file: the same run here
        (tmp_path / "bench_llamacpp_spec.json").write_text(json.dumps(data))
    return check_targets(tmp_path, [t for t in TARGETS if t.id in LLAMA_IDS]).set_index("id")


def test_the_llama_targets_exist_with_their_files():
    ids = {t.id: t for t in TARGETS}
    assert set(LLAMA_IDS) <= set(ids)
    assert ids["llama-chat-vs-llama-ar"].file == "bench_llamacpp_chat"
    assert ids["llama-t1-vs-llama-ar"].file == "bench_llamacpp_t1"
    assert ids["llama-greedy-vs-llama-spec"].file == "bench_llamacpp_spec"
    assert "llama-server-ar" in ids["llama-greedy-vs-llama-ar"].text


def test_llama_targets_read_met_and_not_run(tmp_path):
    t = _check(tmp_path, _run())
    row = t.loc["llama-greedy-vs-llama-ar"]
    # 1.85 × 20 / 21 = 1.76 over llama.cpp's own AR, interval [1.71, 1.81]: the whole interval clears 1.5
    assert row["status"] == MET and "× llama-server-ar" in row["measured"] and "1.85 [1.80, 1.90]× llama-ar" in (
        row["measured"])
    assert row["method"].startswith("llama-sd@4")
    # ours 37 tokens/s over the server's draft speculation at 26: 1.42 per prompt, every prompt alike
    spec = t.loc["llama-greedy-vs-llama-spec"]
    assert spec["status"] == MET and spec["method"].startswith("llama-sd@4 / llama-server-draft")
    # predicted 3.3616 × 50 / (4 × 5 + 70) = 1.868; measured 1.85: 0.99
    pred = t.loc["llama-greedy-predicted"]
    assert pred["status"] == MET_MEDIAN and "llama-sd@4 0.99" in pred["measured"]
    assert t.loc["llama-chat-vs-llama-ar", "status"] == NOT_RUN and t.loc["llama-t1-vs-llama-ar", "status"] == NOT_RUN


def test_llama_targets_read_met_on_the_median_and_missed_with_the_ladder_as_why(tmp_path):
    data = _run(sd_speed=1.6)  # 1.6 × 20 / 21 = 1.524 [1.474, 1.574] over llama-server-ar
    t = _check(tmp_path, data)
    assert t.loc["llama-greedy-vs-llama-ar", "status"] == MET_MEDIAN
    assert "Leviathan" in t.loc["llama-greedy-vs-llama-ar", "why"] and "a step" in t.loc["llama-greedy-vs-llama-ar",
                                                                                         "why"]
    assert t.loc["llama-greedy-predicted", "status"] == MISSED  # 1.6 / 1.868 = 0.86
    t = _check(tmp_path, _run(sd_speed=1.2, server_spec=30.0))
    assert t.loc["llama-greedy-vs-llama-ar", "status"] == MISSED
    assert t.loc["llama-greedy-vs-llama-spec", "status"] == MISSED  # 24 / 30 (llama-lookup is our fastest)
    assert "llama-server-draft" in t.loc["llama-greedy-vs-llama-spec", "why"]


def test_without_the_server_llama_ar_is_the_baseline_and_without_costs_no_prediction(tmp_path):
    t = _check(tmp_path, _run(with_server=False, with_cost=False))
    row = t.loc["llama-greedy-vs-llama-ar"]
    assert row["status"] == MET and "1.85 [1.80, 1.90]× llama-ar (the run has no llama-server-ar)" in row["measured"]
    assert t.loc["llama-greedy-vs-llama-spec", "status"] == NOT_RUN
    assert t.loc["llama-greedy-predicted", "status"] == NOT_RUN
    assert "no llama.cpp cost model" in t.loc["llama-greedy-predicted", "measured"]


def test_chat_and_t1_targets_read_their_own_files_and_only_exact_methods(tmp_path):
    data = _run()
    data["summary"][2]["exact"] = False  # not exact: cannot count for a target that asks for the target's law
    t = _check(tmp_path, data, "bench_llamacpp_t1")
    assert t.loc["llama-t1-vs-llama-ar", "status"] == NOT_RUN
    t = _check(tmp_path, _run(), "bench_llamacpp_chat")
    assert t.loc["llama-chat-vs-llama-ar", "status"] == MET


def test_the_ladder_of_a_synthetic_run_matches_the_hand_computation():
    lad = llama_ladder(_run()).set_index("method")
    assert set(lad.index) == {"llama-sd@4", "llama-lookup@3", "llama-server-draft", "llama-server-ngram-simple"}
    sd = lad.loc["llama-sd@4"]
    e = (1 - 0.8 ** 5) / 0.2
    assert sd["baseline"] == "llama-ar" and sd["gamma"] == 4 and sd["c"] == pytest.approx(0.1)
    assert (sd["c_lo"], sd["c_hi"]) == (0.085, 0.11)  # the widest of the two measurements' intervals
    assert sd["leviathan"] == pytest.approx(e / 1.4)
    assert sd["free_draft"] == pytest.approx(e * T1 / T5)
    assert sd["predicted"] == pytest.approx(e * T1 / (4 * TD + T5))
    assert sd["predicted_in_run"] == pytest.approx(e * T1 / (T5 + 4 * TD))  # the runs' own costs, the same here
    assert sd["step_split"] == pytest.approx(e * (T1 + 1) / (T5 + 4 * TD + 2))
    assert sd["measured_over_predicted"] == pytest.approx(1.85 / sd["predicted"])
    lookup = lad.loc["llama-lookup@3"]  # no draft model: c = 0, the prediction is the free-draft bound at γ = 2
    assert lookup["c"] == 0 and lookup["gamma"] == 2 and lookup["predicted"] == pytest.approx(lookup["free_draft"])
    server = lad.loc["llama-server-draft"]  # α from 40 of 100 drafted accepted at 1 drafted per step: 0.4
    assert server["baseline"] == "llama-server-ar" and server["acceptance_rate"] == pytest.approx(0.4)
    assert server["gamma"] == 1 and server["alpha"] == pytest.approx(0.4) and server["c"] == pytest.approx(0.1)
    assert server["measured"] == pytest.approx(26 / 21)
    ngram = lad.loc["llama-server-ngram-simple"]  # no draft model: c = 0; α from 15 of 30 at 0.27 per step
    assert ngram["c"] == 0 and ngram["alpha"] == pytest.approx(0.5) and ngram["gamma"] == pytest.approx(30 / 112)
    text = ladder_markdown(_run())
    assert "| `llama-sd@4` | `llama-ar` | 4.0 | 0.80 | 0.10 [0.09, 0.11] |" in text
    assert "c 0.10 [0.09, 0.11]" in llama_cost_line(_run()) and "after the timed passes" in llama_cost_line(_run())
    assert llama_ladder({"summary": [{"method": "ar"}], "runs": []}).empty
    # a run without our loop's AR (the 16-bit T = 1 file): our methods stand against llama.cpp's own AR
    data = _run()
    data["summary"] = [r for r in data["summary"] if r["method"] != "llama-ar"]
    data["runs"] = [r for r in data["runs"] if r["method"] != "llama-ar"]
    sd = llama_ladder(data).set_index("method").loc["llama-sd@4"]
    assert sd["baseline"] == "llama-server-ar" and sd["measured"] == pytest.approx(20 * 1.85 / 21, rel=0.02)


@pytest.mark.parametrize("alpha, gamma", [(0.3, 4), (0.8, 16), (0.95, 2.5)])
def test_alpha_from_acceptance_rate_inverts_the_iid_acceptance(alpha, gamma):
    rate = (float(expected_tokens(alpha, gamma)) - 1) / gamma
    assert alpha_from_acceptance_rate(rate, gamma) == pytest.approx(alpha, abs=1e-7)
    assert alpha_from_acceptance_rate(0.4, 1) == 0.4 and alpha_from_acceptance_rate(1.0, 5) == 1.0
    with pytest.raises(ValueError):
        alpha_from_acceptance_rate(1.2, 4)


def test_the_bench_block_shows_the_llama_columns_and_ladder(tmp_path, monkeypatch):
    import specrepro.record.bench_blocks as bench_blocks
    import specrepro.record.report as report

    (tmp_path / "bench_llamacpp_greedy.json").write_text(json.dumps(_run()))
    monkeypatch.setattr(bench_blocks, "results_dir", lambda profile: tmp_path)
    text = report.render_bench("quick")
    assert "× llama.cpp AR (llama-server-ar) [95% CI]" in text and "× llama-ar [95% CI]" in text
    assert "equal to greedy llama-ar" in text and "12/12" in text
    assert "The limit ladder" in text and "llama.cpp cost model" in text
    monkeypatch.setattr(bench_blocks, "record_dir", lambda kind="results": tmp_path)  # the record: missing files named
    text = report.render_bench("standard")
    assert "not in the record yet: `bench_qwen_greedy.json`" in text
    # every target's file has a recipe but those named before their recipe (PENDING_FILES), which say so
    from specrepro.bench.targets import PENDING_FILES

    assert "`bench_llamacpp_t1.json`" in text and text.count("(no recipe yet)") == len(PENDING_FILES)
    assert all(f"`{f}.json` (no recipe yet)" in text for f in PENDING_FILES)
    assert "`bench_llamacpp_greedy.json`," not in text.split("not in the record yet")[1]


def test_block_costs_time_the_tiny_gguf_models():
    from specrepro.backends.llamacpp import llama_cpp_available

    ok, why = llama_cpp_available()
    if not ok:
        pytest.skip(f"llama_cpp does not import ({why})")
    import torch

    from specrepro.backends.llamacpp import LlamaCppLM
    from specrepro.backends.tinygguf import tiny_llama_gguf
    from specrepro.measure.blockcost import block_costs_json, measure_block_costs

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target, draft = LlamaCppLM(tiny_llama_gguf(1), n_threads=1), LlamaCppLM(tiny_llama_gguf(2), n_threads=1)
        target.forward_block([5, 9], logits_to_keep=1)  # a stale cache: the timing resets it
        out = measure_block_costs(target, draft, ns=(1, 3, 5), prefix_len=40, repeats=3, rounds=2,
                                  text=list(range(4, 30)) * 3)
    finally:
        torch.set_num_threads(saved)
    assert sorted(out["target_ms"]) == [1, 3, 5] and out["target_calls"] == {1: 12, 3: 6, 5: 6}
    for n in (1, 3, 5):
        assert 0 < out["target_ms_lo"][n] <= out["target_ms"][n] <= out["target_ms_hi"][n]
    assert out["draft_calls"] == out["c_pairs"] == 6 and out["c_lo"] <= out["c"] <= out["c_hi"]
    assert out["draft_ms"] > 0 and out["prefix_len"] == 40
    assert out["draft2_ms_lo"] <= out["draft2_ms"] <= out["draft2_ms_hi"]  # t_draft(2): 3 calls x 2 rounds
    assert target.tokens == [] and draft.tokens == []  # both caches left empty
    assert set(block_costs_json(out)["target_ms"]) == {"1", "3", "5"}
    no_draft = measure_block_costs(target, None, ns=(2,), prefix_len=10, repeats=2, rounds=1)
    assert no_draft["c"] is None and no_draft["target_ms_lo"][2] is None  # 2 calls: too few for an interval


def test_the_bench_measures_the_llama_cost_model_before_and_after(tmp_path):
    from specrepro.backends.llamacpp import llama_cpp_available

    ok, why = llama_cpp_available()
    if not ok:
        pytest.skip(f"llama_cpp does not import ({why})")
    import torch

    from specrepro.backends.tinygguf import TinyShape, tiny_llama_gguf
    from specrepro.bench import BenchContext
    from specrepro.bench.run import llama_cost_model_json, measure_llama_costs
    from specrepro.core.sampling import GREEDY

    saved = torch.get_num_threads()
    torch.set_num_threads(1)  # the methods open llama.cpp with torch's thread count
    try:
        ctx = BenchContext(target=None, tokenizer=None, draft=None, prompts=[], sampling=GREEDY, gamma=2,
                           max_new_tokens=8, eos_token_id=[], vocab_size=32, seed=0, device="cpu",
                           cost_text=torch.arange(4, 30).repeat(4),
                           target_name=str(tiny_llama_gguf(1, TinyShape(), tmp_path)),
                           draft_name=str(tiny_llama_gguf(1, TinyShape(n_layer=1), tmp_path)))
        encoded = [torch.tensor([5, 9, 17, 6]), torch.tensor([1, 30, 12, 2, 3, 4])]
        assert measure_llama_costs(ctx, ["ar", "sd-draft@4"], encoded) is None  # no llama.cpp method
        runs = [measure_llama_costs(ctx, ["ar", "llama-ar", "llama-sd@2"], encoded, ns=(1, 2, 3), repeats=2,
                                    rounds=3) for _ in range(2)]
    finally:
        torch.set_num_threads(saved)
    assert runs[0]["prefix_len"] == 5 + 4 and runs[0]["timed_on"] == "the prompts' tokens"
    out = json.loads(json.dumps(llama_cost_model_json({"before": runs[0], "after": runs[1]})))
    assert set(out["target_ms"]) == {"1", "2", "3"} and out["before"]["target_calls"]["1"] == 12
    assert out["target_ms"]["2"] == pytest.approx((runs[0]["target_ms"][2] + runs[1]["target_ms"][2]) / 2)
    assert out["c"] == pytest.approx((runs[0]["c"] + runs[1]["c"]) / 2) and out["before"]["c_lo"] is not None
    assert "llamacpp" in ctx.config_notes  # the models were the bench's own, opened by specrepro.bench.llama


def _draft_step_run(over: float, n_prompts: int = 8) -> dict:
    """A chat file whose chain drafts [2, 2, 2, 0] with [2, 1, 2, 0] accepted per run: the second block follows a
    fully accepted one, so its bare cost is t_draft(2) + t_draft(1) = 25 ms and the run's 2·10 + 25 + 2·10 = 65 ms;
    the loop's draft time is ``over`` times that."""
    runs = [{"method": "llama-sd@2", "prompt_index": i, "repeat": 0, "drafted": [2, 2, 2, 0], "accepted": [2, 1, 2, 0],
             "draft_ms": over * 65 / 6} for i in range(n_prompts)]
    return {"config": {"n_prompts": n_prompts, "llama_cost_model": {"draft_ms": 10.0, "draft2_ms": 15.0}},
            "summary": [{"method": "llama-sd@2"}], "runs": runs}


def test_the_draft_step_counts_the_catch_up_forward_after_a_fully_accepted_block(tmp_path):
    from specrepro.bench.ladder import draft_overhead

    d = draft_overhead(_draft_step_run(1.1)).iloc[0]
    # 1.1 exactly on every prompt; a model without the two-token forward (60 ms) would read 1.19
    assert d["ratio"] == pytest.approx(1.1) and d["ratio_lo"] == pytest.approx(1.1) and d["n_prompts"] == 8
    assert d["catchup_share"] == pytest.approx(1 / 6)
    target = [t for t in TARGETS if t.id == "llama-draft-step"]
    assert target and target[0].file == "bench_llamacpp_chat"
    for over, status in ((1.1, MET), (1.2, MISSED)):
        (tmp_path / "bench_llamacpp_chat.json").write_text(json.dumps(_draft_step_run(over)))
        row = check_targets(tmp_path, target).iloc[0]
        assert row["status"] == status and "n = 8 prompts" in row["measured"]
    old = _draft_step_run(1.1)
    del old["config"]["llama_cost_model"]["draft2_ms"]  # a file timed before t_draft(2) was measured
    (tmp_path / "bench_llamacpp_chat.json").write_text(json.dumps(old))
    row = check_targets(tmp_path, target).iloc[0]
    assert row["status"] == NOT_RUN and "no t_draft(2)" in row["measured"]
