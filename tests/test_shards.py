"""Notebook 04's measurements as shards: slices of the workload timed apart give the rows the whole run would give,
parts combine into one table, and a shard is read (not measured again) under the same setting only."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from specrepro.lab import table2
from specrepro.measure.harness import RunOutput, run_interleaved
from specrepro.record import results, shardkit, shards

PARAMS = dict(target="t", draft="d", table2_prompts=12, table2_tokens=8, table2_repeats=2, table2_shard_prompts=5,
              gammas=[1, 3], int8_draft=True)


def test_parts_cover_the_prompts_once_and_name_the_shards():
    s = table2.Table2Setting.from_params(PARAMS)
    assert table2.part_slices(s) == [(0, 5), (5, 10), (10, 12)]
    assert table2.shard_names(s) == ["cost_curves", "leviathan_table2_runs_t0_p0", "leviathan_table2_runs_t0_p1",
                                     "leviathan_table2_runs_t0_p2", "leviathan_table2_runs_t1_p0",
                                     "leviathan_table2_runs_t1_p1", "leviathan_table2_runs_t1_p2"]
    assert s.draft_labels == ["d", "int8 d"]
    with pytest.raises(ValueError, match="shard_prompts"):
        table2.Table2Setting.from_params({**PARAMS, "table2_shard_prompts": 0})


def test_the_standard_profile_has_the_shards_the_makefile_names():
    import re

    import yaml

    from specrepro.files import repo_root

    root = repo_root()
    setting = table2.Table2Setting.from_params(yaml.safe_load((root / "profiles/standard.yaml").read_text()))
    text = (root / "Makefile").read_text()
    parts = re.search(r"foreach k,([\d ]+),data/results/leviathan_table2_runs", text).group(1).split()
    assert len(parts) == len(table2.part_slices(setting))


def _sampler(ids, gen):
    """A stochastic runner: its tokens depend only on the generator's seed."""
    return RunOutput(tokens=torch.randint(0, 1000, (4,), generator=gen).tolist())


def test_slices_timed_apart_give_the_whole_runs_seeds_and_orders():
    prompts = [(f"p{i}", torch.tensor([i + 1, 2, 3])) for i in range(5)]
    runners = {"a": _sampler, "b": _sampler, "c": _sampler}
    whole = run_interleaved(runners, prompts, repeats=2, seed=3, progress=False)
    parts = [run_interleaved(runners, prompts[a:b], repeats=2, seed=3, progress=False, prompt_offset=a)
             for a, b in ((0, 2), (2, 5))]
    combined = table2.combine_parts(parts)
    cols = ["repeat", "prompt", "prompt_index", "method", "position", "token_ids"]
    whole = whole.sort_values(["repeat", "prompt_index", "position"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(whole[cols], combined[cols])
    # without the offset the second slice would be seeded as the first one
    wrong = run_interleaved(runners, prompts[2:5], repeats=2, seed=3, progress=False)
    assert wrong["token_ids"].tolist() != parts[1]["token_ids"].tolist()


def test_combine_parts_refuses_a_block_in_two_parts():
    part = pd.DataFrame({"repeat": [0], "prompt_index": [0], "method": ["AR"], "position": [0]})
    with pytest.raises(ValueError, match="two parts"):
        table2.combine_parts([part, part])
    with pytest.raises(ValueError):
        table2.combine_parts([])


def test_a_shard_is_read_under_its_setting_and_measured_again_under_another(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "results_dir", lambda profile=results.STANDARD: tmp_path)
    calls = []

    def fake_cost_curves(ctx):
        calls.append(1)
        return pd.DataFrame({"model": ["t", "t"], "n": [1, 2], "ms": [10.0, 11.0], "ms_low": [9.0, 10.0],
                             "ms_high": [11.0, 12.0], "rounds": [6, 6]})

    monkeypatch.setattr(table2, "measure_cost_curves", fake_cost_curves)
    monkeypatch.setattr(shards.Table2Shards, "ctx", property(lambda self: None))
    first = shards.Table2Shards(PARAMS, profile="unit", progress=False)
    a = first.cost_curves()
    assert first.measured == ["cost_curves"] and len(calls) == 1
    again = shards.Table2Shards(PARAMS, profile="unit", progress=False)
    b = again.cost_curves()
    assert again.measured == [] and len(calls) == 1
    pd.testing.assert_frame_equal(a, b)
    other = shards.Table2Shards({**PARAMS, "cost_repeats": 12}, profile="unit", progress=False)
    other.cost_curves()
    assert other.measured == ["cost_curves"] and len(calls) == 2
    import json

    prov = json.loads((tmp_path / "cost_curves.provenance.json").read_text())
    assert prov["shard"] == "cost_curves" and prov["cost_repeats"] == 12 and prov["seconds"] >= 0
    assert "cpu" in prov and "load_before" in prov


def test_t1_parts_need_the_greedy_best_and_unknown_shards_are_named():
    s = shards.Table2Shards(PARAMS, profile="unit", progress=False)
    with pytest.raises(ValueError, match="best"):
        s.part(1.0, 0)
    with pytest.raises(KeyError, match="not a shard"):
        s.run("leviathan_table2_runs_t0_p9")


def test_greedy_method_labels_need_no_model():
    labels = list(table2.greedy_methods(table2.Table2Setting.from_params(PARAMS)))
    assert labels == ["AR", "d γ=1", "d γ=3", "int8 d γ=1", "int8 d γ=3", "bigram γ=3", "prompt lookup γ=4"]
    best = pd.DataFrame({"draft": ["d", "int8 d"], "best_gamma": [3, 1]})
    assert list(table2.t1_methods(None, best)) == ["AR", "bigram γ=3", "prompt lookup γ=4", "d γ=3", "int8 d γ=1"]


class _Tok:
    """A stand-in tokenizer: a prompt's text is its token ids, space-separated."""

    eos_token_id = None

    def __call__(self, text, return_tensors="pt"):
        from types import SimpleNamespace

        return SimpleNamespace(input_ids=torch.tensor([[int(t) for t in text.split()]]))


def _prompts(n):
    from types import SimpleNamespace

    return [SimpleNamespace(id=f"p{i}", text=f"{i % 8} {(i + 3) % 8} 1") for i in range(n)]


def test_naive_vs_mss_passes_are_paired_seeded_and_resume_from_the_checkpoint(tmp_path, pair, monkeypatch):
    from specrepro.lab import specinfer
    from specrepro.measure.harness import paired_ratios

    target, draft = pair
    kw = dict(width=2, depth=2, max_new_tokens=6, seed=5, progress=False)
    ckpt = tmp_path / "mss.json"
    full = specinfer.naive_vs_mss_table(target, draft, _Tok(), _prompts(2), repeats=2, checkpoint=ckpt, **kw)
    assert len(full) == 8 and sorted(full["repeat"].unique()) == [0, 1]
    assert set(full.groupby(["repeat", "prompt"])["method"].apply(tuple)) == {("naive", "mss")}
    # pass 0 is the one-pass table; pass 1 is another draw
    one = specinfer.naive_vs_mss_table(target, draft, _Tok(), _prompts(2), repeats=1, **kw)
    cols = ["method", "prompt", "tokens", "steps", "accepted"]
    pd.testing.assert_frame_equal(one[cols], full[full["repeat"] == 0][cols].reset_index(drop=True))
    assert full[full["repeat"] == 1]["accepted"].tolist() != one["accepted"].tolist()
    assert paired_ratios(full, "mss", "naive", "tokens_per_step").size == 2
    # the checkpoint holds every block: a second call with the same key measures nothing
    monkeypatch.setattr(specinfer, "tree_generate", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    again = specinfer.naive_vs_mss_table(target, draft, _Tok(), _prompts(2), repeats=2, checkpoint=ckpt, **kw)
    pd.testing.assert_frame_equal(again[cols], full[cols])
    with pytest.raises(ValueError, match="repeats"):
        specinfer.naive_vs_mss_table(target, draft, _Tok(), _prompts(2), repeats=0, **kw)


def test_the_mss_shard_is_measured_once_and_read_under_the_same_setting(tmp_path, pair, monkeypatch):
    from specrepro import data
    from specrepro.lab import specinfer

    monkeypatch.setattr(results, "results_dir", lambda profile=results.STANDARD: tmp_path)
    monkeypatch.setattr(data, "load_workload", lambda name, n: _prompts(n))
    target, draft = pair
    params = dict(target="t", draft="d", dtype="float32", device="cpu", workload="humaneval", widths=[1, 2],
                  tree_depth=2, seed=0, mss_prompts=2, mss_tokens=4, mss_repeats=2)
    calls = []
    real = specinfer.naive_vs_mss_table
    monkeypatch.setattr(specinfer, "naive_vs_mss_table", lambda *a, **k: calls.append(k) or real(*a, **k))
    first = shards.MSSShard(params, profile="unit", models=(target, draft, _Tok(), "d"), progress=False).table()
    assert first.attrs["measured"] and len(first) == 8 and calls[0]["repeats"] == 2 and calls[0]["width"] == 2
    again = shards.MSSShard(params, profile="unit", models=(target, draft, _Tok(), "d"), progress=False).table()
    assert not again.attrs.get("measured") and len(calls) == 1
    import json

    prov = json.loads((tmp_path / "specinfer_table3_runs.provenance.json").read_text())
    assert prov["shard"] == "specinfer_table3_runs" and prov["repeats"] == 2 and prov["prompts"] == 2
    assert prov["seconds"] >= 0 and "cpu" in prov
    other = shards.MSSShard({**params, "mss_tokens": 6}, profile="unit", models=(target, draft, _Tok(), "d"),
                            progress=False).table()
    assert other.attrs["measured"] and len(calls) == 2
    assert shards.MSSShard({**params, "draft": None}, profile="unit").settings()["draft"] == "t (bf16 copy)"


def test_a_shard_resumed_over_sittings_records_their_summed_time(tmp_path, monkeypatch):
    import json

    monkeypatch.setattr(results, "results_dir", lambda profile=results.STANDARD: tmp_path)
    monkeypatch.setattr(shardkit, "shard_checkpoint", lambda name, profile: tmp_path / f"{name}.ckpt.json")
    table = pd.DataFrame({"x": [1, 2]})

    def interrupted(ckpt):
        ckpt.write_text("{}")  # a block was kept
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        shards.read_or_measure("s", "unit", "cpu", {"shard": "s"}, interrupted)
    log = tmp_path / "s.ckpt.json.sittings.json"
    (first,) = json.loads(log.read_text())
    log.write_text(json.dumps([first + 100.0]))  # as if that sitting had lasted 100 s longer
    out = shards.read_or_measure("s", "unit", "cpu", {"shard": "s"}, lambda ckpt: table)
    prov = json.loads((tmp_path / "s.provenance.json").read_text())
    assert out.attrs["measured"] and prov["sittings"] == 2 and prov["seconds"] >= 100.0
    assert prov["seconds"] == pytest.approx(first + 100.0 + prov["seconds_this_sitting"], abs=0.11)
    assert not log.exists() and not (tmp_path / "s.ckpt.json").exists()
    # SIGTERM (kill) ends a sitting like Ctrl-C: its time is logged
    import os
    import signal

    def killed(ckpt):
        ckpt.write_text("{}")
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the sitting")

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit):
        shards.read_or_measure("u", "unit", "cpu", {"shard": "u"}, killed)
    assert len(json.loads((tmp_path / "u.ckpt.json.sittings.json").read_text())) == 1
    assert signal.getsignal(signal.SIGTERM) == before
    # a sitting that kept nothing leaves no log: the next one starts the count afresh
    with pytest.raises(RuntimeError):
        shards.read_or_measure("t", "unit", "cpu", {"shard": "t"}, lambda ckpt: (_ for _ in ()).throw(RuntimeError()))
    assert not (tmp_path / "t.ckpt.json.sittings.json").exists()


TREE_PARAMS = dict(target="t", draft="d", dtype="float32", device="cpu", workload="humaneval", widths=[1, 2],
                   tree_depth=2, seed=0, tree_prompts=3, tree_tokens=6, cost_sizes=[0, 1, 2, 4],
                   tree_cost_repeats=1, speed_tokens=5, speed_repeats=2, speed_shard_prompts=2)


def test_tree_speed_parts_time_the_equal_positions_chain_and_add_up_to_the_whole_run(tmp_path, pair, monkeypatch):
    import json

    from specrepro import data
    from specrepro.lab import specinfer

    monkeypatch.setattr(results, "results_dir", lambda profile=results.STANDARD: tmp_path)
    monkeypatch.setattr(data, "load_workload", lambda name, n: _prompts(n))
    target, draft = pair
    models = (target, draft, _Tok(), "d")
    trees = shards.TreeSpeedShards(TREE_PARAMS, profile="unit", models=models, progress=False)
    assert trees.slices() == [(0, 2), (2, 3)]
    assert trees.names() == ["specinfer_tree_costs", "specinfer_tree_speed_p0", "specinfer_tree_speed_p1"]
    costs = trees.costs()
    assert costs.attrs["measured"] and set(costs["model"]) == {"t", "d"}
    # the root runs were missing: measured and saved under the notebook's name and settings
    picks = trees.picks()
    assert (tmp_path / "specinfer_table2_root_runs.csv").is_file()
    assert picks == trees.recorded_picks(tmp_path)  # what `make status` compares, measuring nothing
    w, d = picks["tree"]
    table = trees.table()
    methods = set(table["method"])
    assert f"chain γ={w * d} (equal positions)" in methods and "AR" in methods
    assert any(m.startswith("tree") for m in methods) and len(methods) == 3 + (picks["gamma"] != w * d)
    assert sorted(table["prompt_index"].unique()) == [0, 1, 2] and sorted(table["repeat"].unique()) == [0, 1]
    # parts timed apart draw what one whole run draws (same seeds, same method order per prompt)
    whole = specinfer.tree_vs_chain_speed(target, draft, _Tok(), _prompts(3), tree=tuple(picks["tree"]),
                                          gamma=picks["gamma"], max_new_tokens=5, seed=0, repeats=2, progress=False)
    cols = ["repeat", "prompt_index", "method", "position", "new_tokens", "steps"]
    key = ["repeat", "prompt_index", "position"]
    pd.testing.assert_frame_equal(whole.sort_values(key)[cols].reset_index(drop=True),
                                  table.sort_values(key)[cols].reset_index(drop=True), check_dtype=False)
    prov = json.loads((tmp_path / "specinfer_tree_speed_p1.provenance.json").read_text())
    assert prov["part_prompts"] == [2, 3] and prov["tree"] == [w, d] and prov["gamma"] == picks["gamma"]
    assert "seconds" in prov and "cpu" in prov and prov["blocks"] == 2
    # read, not measured, under the same setting
    again = shards.TreeSpeedShards(TREE_PARAMS, profile="unit", models=models, progress=False)
    again.table()
    assert again.measured == []
    with pytest.raises(KeyError, match="not a tree-speed shard"):
        again.run("specinfer_tree_speed_p2")
    with pytest.raises(ValueError, match=">= 1"):
        specinfer.tree_vs_chain_speed(target, draft, _Tok(), _prompts(1), tree=(2, 1), gamma=0, progress=False)


def test_the_makefile_names_every_tree_speed_part_of_the_standard_profile():
    import re

    import yaml

    from specrepro.files import repo_root
    from specrepro.record import status

    root = repo_root()
    trees = shards.TreeSpeedShards(yaml.safe_load((root / "profiles/standard.yaml").read_text()))
    text = (root / "Makefile").read_text()
    named = re.findall(r"data/results/(specinfer_tree_(?:costs|speed_p\d+))\.csv", text)
    assert sorted(set(named) - {"specinfer_tree_speed_p"}) == sorted(trees.names())
    assert sorted(s.name for s in status.SHARDS if s.name.startswith("specinfer_tree")) == sorted(trees.names())


def test_tree_width_passes_run_apart_give_one_calls_rows_and_resume_from_the_checkpoint(tmp_path, pair, monkeypatch):
    from specrepro.lab import specinfer

    target, draft = pair
    kw = dict(widths=(1, 2), depth=3, max_new_tokens=6, seed=4, decodings=("stochastic",), shape="paper",
              progress=False)
    both = specinfer.tree_width_table(target, draft, _Tok(), _prompts(2), passes=(0, 1), **kw)
    apart = [specinfer.tree_width_table(target, draft, _Tok(), _prompts(2), passes=(r,), **kw) for r in (0, 1)]
    cols = ["repeat", "prompt", "width", "tokens", "steps", "accepted"]
    pd.testing.assert_frame_equal(both[cols], pd.concat(apart, ignore_index=True)[cols])
    assert both[both["repeat"] == 1]["accepted"].tolist() != both[both["repeat"] == 0]["accepted"].tolist()
    ckpt = tmp_path / "widths.json"
    first = specinfer.tree_width_table(target, draft, _Tok(), _prompts(2), passes=(1,), checkpoint=ckpt, **kw)
    monkeypatch.setattr(specinfer, "tree_generate", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    again = specinfer.tree_width_table(target, draft, _Tok(), _prompts(2), passes=(1,), checkpoint=ckpt, **kw)
    pd.testing.assert_frame_equal(first[cols], again[cols])
    with pytest.raises(ValueError, match="pass"):
        specinfer.tree_width_table(target, draft, _Tok(), _prompts(2), passes=(), **kw)


def test_width_shards_name_each_decoding_and_pass_and_are_read_under_their_setting(tmp_path, pair, monkeypatch):
    import json

    from specrepro import data

    monkeypatch.setattr(results, "results_dir", lambda profile=results.STANDARD: tmp_path)
    monkeypatch.setattr(data, "load_workload", lambda name, n: _prompts(n))
    target, draft = pair
    params = dict(TREE_PARAMS, width_prompts=2, width_tokens=5, width_passes=2)
    widths = shards.WidthShards(params, profile="unit", models=(target, draft, _Tok(), "d"), progress=False)
    assert widths.names() == ["specinfer_table2_width_greedy", "specinfer_table2_width_t1_r0",
                              "specinfer_table2_width_t1_r1"]
    table = widths.table()
    assert widths.measured == widths.names()
    assert set(table.groupby("decoding")["repeat"].unique().map(tuple)) == {(0,), (0, 1)}
    assert len(table) == 2 * 2 + 2 * 2 * 2 and set(table["shape"]) == {"paper"}
    prov = json.loads((tmp_path / "specinfer_table2_width_t1_r1.provenance.json").read_text())
    assert prov["pass"] == 1 and prov["decoding"] == "stochastic" and prov["prompts"] == 2 and "seconds" in prov
    again = shards.WidthShards(params, profile="unit", models=(target, draft, _Tok(), "d"), progress=False)
    again.table()
    assert again.measured == []
    with pytest.raises(KeyError, match="not a tree-width shard"):
        again.run("specinfer_table2_width_t1_r2")
    with pytest.raises(ValueError, match="width_passes"):
        shards.WidthShards({**params, "width_passes": 0}).names()


def test_the_makefile_names_every_width_shard_of_the_standard_profile():
    import re

    import yaml

    from specrepro.files import repo_root
    from specrepro.record import status

    root = repo_root()
    widths = shards.WidthShards(yaml.safe_load((root / "profiles/standard.yaml").read_text()))
    text = (root / "Makefile").read_text()
    listed = re.search(r"\$\(foreach s,([\w ]+),data/results/specinfer_table2_width_", text).group(1).split()
    assert [widths.prefix + s for s in listed] == widths.names()
    assert [s.name for s in status.SHARDS if s.name.startswith(widths.prefix)] == widths.names()


ALPHA_PARAMS = dict(target="t", draft="d", dtype="float32", device="cpu", alpha_prompts=2, alpha_tokens=5, seed=3)


def _alpha_context(pair, n=2):
    from specrepro.drafters.model import DraftModelDrafter

    target, draft = pair
    vocab = target.get_output_embeddings().weight.shape[0]
    return {"target": target, "tokenizer": _Tok(), "drafters": {"d": DraftModelDrafter(draft, vocab)},
            "workloads": {"humaneval": _prompts(n), "pydoc": _prompts(n)[::-1]}, "trajectory": None}


def test_alpha_jobs_seed_themselves_so_parts_give_the_whole_table_and_resume(tmp_path, pair, monkeypatch):
    from specrepro.lab import leviathan

    c = _alpha_context(pair, 3)
    kw = dict(max_new_tokens=6, seed=3, progress=False)
    whole = leviathan.alpha_table(c["target"], c["tokenizer"], c["drafters"], c["workloads"], **kw)
    parts = pd.concat([leviathan.alpha_table(c["target"], c["tokenizer"], c["drafters"], {w: c["workloads"][w]},
                                             temperatures=(t,), **kw)
                       for w in ("pydoc", "humaneval") for t in (1.0, 0.0)], ignore_index=True)
    key = ["workload", "temperature", "drafter", "prompt"]
    pd.testing.assert_frame_equal(whole.sort_values(key).reset_index(drop=True),
                                  parts.sort_values(key).reset_index(drop=True))
    assert len(whole) == 2 * 3 * 2 and whole["positions"].gt(0).all()
    # another seed draws other T = 1 continuations (and the same greedy ones)
    other = leviathan.alpha_table(c["target"], c["tokenizer"], c["drafters"], c["workloads"], **{**kw, "seed": 4})
    t1 = whole["temperature"] == 1.0
    assert whole[t1]["alpha"].tolist() != other[t1]["alpha"].tolist()
    assert whole[~t1]["alpha"].tolist() == other[~t1]["alpha"].tolist()
    ckpt = tmp_path / "alpha.json"
    first = leviathan.alpha_table(c["target"], c["tokenizer"], c["drafters"], c["workloads"], checkpoint=ckpt, **kw)
    monkeypatch.setattr(leviathan, "generate", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    again = leviathan.alpha_table(c["target"], c["tokenizer"], c["drafters"], c["workloads"], checkpoint=ckpt, **kw)
    pd.testing.assert_frame_equal(first, again)


def test_alpha_shards_are_one_per_workload_and_temperature_and_read_under_their_setting(tmp_path, pair, monkeypatch):
    import json

    monkeypatch.setattr(results, "results_dir", lambda profile=results.STANDARD: tmp_path)
    alphas = shards.AlphaShards(ALPHA_PARAMS, profile="unit", context=_alpha_context(pair), progress=False)
    assert alphas.names() == [f"leviathan_table3_runs_{w}_t{t}" for w in ("humaneval", "pydoc") for t in (0, 1)]
    table = alphas.table()
    assert alphas.measured == alphas.names()
    assert len(table) == 2 * 2 * 2 and list(table["workload"].unique()) == ["humaneval", "pydoc"]
    prov = json.loads((tmp_path / "leviathan_table3_runs_pydoc_t1.provenance.json").read_text())
    assert prov["temperature"] == 1.0 and prov["workload"] == "pydoc" and prov["trajectory"] == "d int8"
    assert prov["drafters"] == ["unigram", "bigram", "prompt lookup", "d"] and "seconds" in prov
    again = shards.AlphaShards(ALPHA_PARAMS, profile="unit", context=_alpha_context(pair), progress=False)
    pd.testing.assert_frame_equal(again.table(), table)
    assert again.measured == []
    moved = shards.AlphaShards({**ALPHA_PARAMS, "alpha_tokens": 4}, profile="unit", context=_alpha_context(pair),
                               progress=False)
    moved.run(moved.names()[0])
    assert moved.measured == [moved.names()[0]]
    with pytest.raises(KeyError, match="not an alpha shard"):
        again.settings("leviathan_table3_runs_lm1b_t0")


def test_the_makefile_and_status_name_every_alpha_shard():
    import re

    import yaml

    from specrepro.files import repo_root
    from specrepro.record import status

    root = repo_root()
    alphas = shards.AlphaShards(yaml.safe_load((root / "profiles/standard.yaml").read_text()))
    text = (root / "Makefile").read_text()
    m = re.search(r"\$\(foreach w,([\w ]+),\$\(foreach t,([\d ]+),data/results/leviathan_table3_runs_", text)
    assert [f"{alphas.prefix}{w}_t{t}" for w in m.group(1).split() for t in m.group(2).split()] == alphas.names()
    assert [s.name for s in status.SHARDS if s.name.startswith(alphas.prefix)] == alphas.names()
    assert status.expected_settings(status.Shard(f"data/results/{alphas.names()[0]}.csv", ()), root) == \
        alphas.settings(alphas.names()[0])


MEDUSA_PARAMS = dict(medusa_target="m", device="cpu", dtype="float32", seed=0, workload="humaneval", n_prompts=2,
                     n_train_prompts=4, sd_max_new_tokens=8, max_prompt_tokens=32, medusa_heads=3,
                     share_lm_head=False, medusa_epochs=1, medusa_batch_size=4, medusa_max_steps=2,
                     distill_epochs=1, distill_max_steps=1, tree_nodes=4, medusa_speed_prompts=2, medusa_tokens=8,
                     medusa_repeats=1, medusa_tree_sizes=[2, 4], stochastic_temperature=0.7, large_target="big",
                     large_head_vocab=64, large_distill_tokens=256, large_epochs=1, large_ablation_prompts=2,
                     large_ablation_tokens=8, large_sparse_sizes=[4], large_dense_topk=[[2, 2]], m2_train_seqs=2,
                     m2_eval_seqs=2, m2_chunk_tokens=16, m2_epochs=1, m2_speed_prompts=2)


def _head_accuracy(top1):
    return pd.DataFrame({"head": [1, 2, 3], "positions": [50, 49, 48], "top1": top1,
                         **{f"top{k}": [1 - (1 - a) * 0.7 ** (k - 1) for a in top1] for k in range(2, 6)}})


def test_medusa_shards_decode_with_the_tree_their_accuracy_table_gives_and_read_without_a_model(tmp_path, monkeypatch):
    from specrepro.lab import medusa_parts

    monkeypatch.setattr(results, "results_dir", lambda profile=results.STANDARD: tmp_path)
    calls, accuracy = [], {"top1": [0.3, 0.1, 0.05]}
    monkeypatch.setattr(medusa_parts, "head_accuracy", lambda ctx: calls.append("accuracy") or
                        _head_accuracy(accuracy["top1"]))
    monkeypatch.setattr(medusa_parts, "greedy_methods", lambda ctx, tree: calls.append(tree) or {"AR": None})

    def fake_runs(ctx, methods, prompts, **kw):
        assert kw["checkpoint"] is not None and kw["checkpoint_key"]["cpu"]
        return pd.DataFrame({"repeat": 0, "prompt": [p.id for p in prompts], "prompt_index": [0, 1],
                             "method": "AR", "tokens_per_s": 5.0, "text": ["def f():", ""]})

    monkeypatch.setattr(medusa_parts, "timed_runs", fake_runs)
    group = shards.MedusaShards(MEDUSA_PARAMS, profile="unit", progress=False)
    runs = group.run("medusa_greedy_runs")  # its accuracy table first, then the runs with that table's tree
    tree = medusa_parts.accuracy_tree(_head_accuracy(accuracy["top1"]), 4)
    assert group.measured == ["medusa_head_accuracy", "medusa_greedy_runs"] and calls == ["accuracy", tree]
    assert list(runs["text"]) == ["def f():", ""]  # an empty output reads back as "", not NaN
    assert group.settings("medusa_greedy_runs")["tree"] == tree
    assert group.recorded_trees("medusa_greedy_runs", tmp_path) == {"tree": tree}
    again = shards.MedusaShards(MEDUSA_PARAMS, profile="unit", progress=False)
    pd.testing.assert_frame_equal(again.run("medusa_greedy_runs"), runs)
    assert again.measured == [] and again.context is None and len(calls) == 2  # read: no model, no training
    # new accuracies give another tree: the timed shard is measured again with it
    accuracy["top1"] = [0.9, 0.85, 0.8]
    moved = shards.MedusaShards({**MEDUSA_PARAMS, "medusa_epochs": 2}, profile="unit", progress=False)
    moved.run("medusa_greedy_runs")
    deeper = medusa_parts.accuracy_tree(_head_accuracy(accuracy["top1"]), 4)
    assert deeper != tree and calls[-1] == deeper and moved.measured == ["medusa_head_accuracy", "medusa_greedy_runs"]
    with pytest.raises(KeyError, match="notebook 06"):
        group.settings("medusa_table1")


def test_medusa_shards_settings_follow_the_profile_and_name_no_tree_without_an_accuracy_table(tmp_path):
    group = shards.MedusaShards(MEDUSA_PARAMS, profile="unit")
    assert group.recorded_trees("medusa_greedy_runs", tmp_path) is None  # nothing recorded there
    assert group.recorded_trees("medusa2_quality", tmp_path) == {}
    s = group.settings("medusa_tree_size_runs", {})
    assert s["shard"] == "medusa_tree_size_runs" and s["sizes"] == [2, 4] and s["temperature"] == 0.0
    assert group.settings("medusa_sampling_runs", {})["temperature"] == 0.7
    assert group.settings("medusa2_runs")["target"] == "m"
    assert group.settings("medusa_large_head_accuracy")["target"] == "big"
    trees = group.trees("medusa_large_tree_ablation", _head_accuracy([0.5, 0.3, 0.2]))["trees"]
    assert list(trees) == ["heads as a chain (3 nodes)", "dense tree, top-2x2 (6 nodes)", "sparse tree (6 nodes)",
                           "sparse tree (4 nodes)"]
    assert [len(c) for c in trees.values()] == [3, 6, 6, 4]


def test_the_makefile_and_status_name_every_medusa_shard():
    import re

    import yaml

    from specrepro.files import repo_root
    from specrepro.record import status

    root = repo_root()
    group = shards.MedusaShards(yaml.safe_load((root / "profiles/standard.yaml").read_text()))
    text = (root / "Makefile").read_text()
    listed = re.search(r"MEDUSA_SHARDS := \$\(if \$\(filter standard,\$\(PROFILE\)\),\$\(foreach s,([\w \\\n]+),data/results/",
                       text).group(1)
    assert listed.replace("\\", " ").split() == group.names()
    assert [s.name for s in status.SHARDS if s.name.startswith("medusa")] == group.names()
    first = group.names()[0]
    assert status.expected_settings(status.Shard(f"data/results/{first}.csv", ()), root) == group.settings(first)
