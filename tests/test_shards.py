"""Notebook 04's measurements as shards: slices of the workload timed apart give the rows the whole run would give,
parts combine into one table, and a shard is read (not measured again) under the same setting only."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from specrepro.lab import table2
from specrepro.measure.harness import RunOutput, run_interleaved
from specrepro.record import results, shards

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
    labels = list(table2.greedy_methods(shards._Labels(table2.Table2Setting.from_params(PARAMS))))
    assert labels == ["AR", "d γ=1", "d γ=3", "int8 d γ=1", "int8 d γ=3", "bigram γ=3", "prompt lookup γ=4"]
    best = pd.DataFrame({"draft": ["d", "int8 d"], "best_gamma": [3, 1]})
    assert list(table2.t1_methods(None, best)) == ["AR", "bigram γ=3", "prompt lookup γ=4", "d γ=3", "int8 d γ=1"]
