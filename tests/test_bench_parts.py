"""A bench run timed in parts (``--part I/K``) and merged gives the runs and summary of the whole run."""

import json
import math

import pytest

from specrepro.bench import merge_part_files, merge_parts, part_bounds, run_bench
from specrepro.bench.options import BenchOptionError

PROMPTS = ["def f(x):\n", "class A:\n", "import os\n", "x = [", "for i in range(", "while True:\n", "# add\n"]


def test_parts_split_the_prompts_into_consecutive_slices():
    assert [part_bounds(20, i, 3) for i in range(3)] == [(0, 7), (7, 14), (14, 20)]
    assert [part_bounds(4, i, 4) for i in range(4)] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    for n, k in [(20, 4), (7, 2), (164, 9), (5, 1)]:
        spans = [part_bounds(n, i, k) for i in range(k)]
        assert spans[0][0] == 0 and spans[-1][1] == n and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        assert max(b - a for a, b in spans) - min(b - a for a, b in spans) <= 1
    for bad in [(3, 3), (-1, 2), (0, 0)]:
        with pytest.raises(BenchOptionError, match="part"):
            part_bounds(10, *bad)
    with pytest.raises(BenchOptionError, match="at least one prompt"):
        part_bounds(3, 0, 4)


def _bench(tiny, **kw):
    model, tok = tiny
    return run_bench(models=(model, model, tok), prompts=PROMPTS, methods="ar,sd-draft@2,sd-draft@3",
                     max_new_tokens=6, temperature=1.0, top_p=0.9, seed=7, repeats=2, warmup=False, progress=False,
                     **kw)


def test_merged_parts_give_the_whole_runs_rows_and_summary(tiny_with_tokenizer, tmp_path, one_thread):
    whole = _bench(tiny_with_tokenizer)
    paths = [tmp_path / f"b.p{i}.json" for i in range(3)]
    for i in (2, 0, 1):  # parts may be timed in any order, in separate sittings
        part = _bench(tiny_with_tokenizer, part=f"{i}/3", json_path=paths[i])
        assert part.config["part"] == [i, 3] and part.config["n_prompts"] == len(PROMPTS)
        assert part.config["part_prompts"] == list(part_bounds(len(PROMPTS), i, 3))
    merged = merge_part_files(paths, tmp_path / "b.json")
    key = ["repeat", "prompt_index", "method"]
    a = whole.runs.sort_values(key).reset_index(drop=True)
    b = merged.runs.sort_values(key).reset_index(drop=True)
    # every timed call drew the same tokens: same seeds, same prompts, every method
    assert list(a["prompt"]) == list(b["prompt"]) and list(a["method"]) == list(b["method"])
    assert [list(x) for x in a["token_ids"]] == [list(x) for x in b["token_ids"]]
    assert [list(x) for x in a["accepted"]] == [list(x) for x in b["accepted"]]
    # and in the same method order within each (pass, prompt) block
    order = lambda r: r.groupby(["repeat", "prompt_index"], sort=True)["method"].apply(list).tolist()  # noqa: E731
    assert order(whole.runs) == order(merged.runs)
    s, t = whole.summary.set_index("method"), merged.summary.set_index("method")
    assert list(s.index) == list(t.index)
    for col in ("n_prompts", "runs", "new_tokens", "alpha", "tokens_per_step", "accepted_per_step",
                "alpha_lo", "alpha_hi", "tokens_per_step_lo", "tokens_per_step_hi"):
        assert s[col].tolist() == pytest.approx(t[col].tolist(), nan_ok=True), col
    assert t.loc["sd-draft@2", "n_prompts"] == len(PROMPTS)
    assert all(math.isfinite(x) for x in t.loc[["sd-draft@2", "sd-draft@3"], "speedup_vs_ar"])
    assert all(math.isfinite(x) for x in t.loc[["sd-draft@2", "sd-draft@3"], "predicted_speedup"])
    c = merged.config
    assert c["prompt_ids"] == whole.config["prompt_ids"] and c["part"] is None and c["seconds"] is None
    assert [p["part"] for p in c["parts"]] == [[0, 3], [1, 3], [2, 3]]
    assert all(p["seconds"] > 0 and len(p["sha256"]) == 64 for p in c["parts"])
    assert len(c["cost_model"]["parts"]) == 3 and c["blocks"] == 2 * len(PROMPTS)
    # the merged file has its sidecar (its sha256, each part's sitting)
    from specrepro.files import sha256_bytes

    side = json.loads((tmp_path / "b.provenance.json").read_text())
    assert side["sha256"] == {"b.json": sha256_bytes((tmp_path / "b.json").read_bytes())}
    assert [p["file"] for p in side["parts"]] == [p.name for p in paths]


def test_merge_refuses_parts_that_are_not_one_run(tiny_with_tokenizer, tmp_path, one_thread):
    model, tok = tiny_with_tokenizer
    kw = dict(models=(model, None, tok), prompts=PROMPTS[:4], methods="ar", max_new_tokens=2, warmup=False,
              progress=False, predict=False)
    p0 = run_bench(part="0/2", json_path=tmp_path / "p0.json", **kw).to_json()
    p1 = run_bench(part="1/2", json_path=tmp_path / "p1.json", **kw).to_json()
    other = run_bench(part="1/2", **{**kw, "max_new_tokens": 3}).to_json()
    whole = run_bench(**kw).to_json()
    assert merge_parts([p1, p0]).runs["prompt"].tolist() == [p for p in whole["config"]["prompt_ids"]]
    with pytest.raises(ValueError, match="max_new_tokens"):
        merge_parts([p0, other])
    with pytest.raises(ValueError, match="0..1 of 2, each once"):
        merge_parts([p0])
    with pytest.raises(ValueError, match="0..1 of 2, each once"):
        merge_parts([p0, p0])
    with pytest.raises(ValueError, match="without config.part"):
        merge_parts([p0, whole])
    machine = json.loads(json.dumps(p1))
    machine["config"]["cpu"] = "another CPU"
    with pytest.raises(ValueError, match="cpu"):  # a table never mixes machines
        merge_parts([p0, machine])
    # a part whose bytes changed since it was written is refused, and nothing is written
    (tmp_path / "p1.json").write_text((tmp_path / "p1.json").read_text().replace('"repeats": 1', '"repeats": 1 '))
    with pytest.raises(ValueError, match="sha256"):
        merge_part_files([tmp_path / "p0.json", tmp_path / "p1.json"], tmp_path / "out.json")
    with pytest.raises(FileNotFoundError, match="--part"):
        merge_part_files([tmp_path / "p0.json", tmp_path / "p9.json"], tmp_path / "out.json")
    assert not (tmp_path / "out.json").exists()


def _llama_cost(t1: float, c: float, prefix: int) -> dict:
    one = {"target_ms": {"1": t1, "2": 1.5 * t1}, "draft_ms": c * t1, "c": c, "c_lo": c - 0.01, "c_hi": c + 0.01,
           "prefix_len": prefix, "repeats": 5, "rounds": 3}
    return {**one, "before": one, "after": {**one, "c_lo": c - 0.03}, "prefix_len": prefix, "repeats": 5,
            "rounds": 3}


def _server(port: int) -> dict:
    return {"methods": {"llama-server-ar": {"command": f"llama-server -m t.gguf --threads 2 --port {port}",
                                            "log": f"build/llama-server/s-{port}.log", "setting_from": "defaults"}}}


def test_parts_with_llama_cpp_cost_models_merge_to_their_mean(tiny_with_tokenizer, tmp_path, one_thread):
    """Parts timed with llama.cpp's cost model merge: the model is the parts' mean (each part's whole under parts,
    c's interval the widest of theirs), and the servers' settings must agree but for their ports and logs."""
    from specrepro.bench.ladder import llama_cost_line

    model, tok = tiny_with_tokenizer
    kw = dict(models=(model, None, tok), prompts=PROMPTS[:4], methods="ar", max_new_tokens=2, warmup=False,
              progress=False, predict=False)
    p0 = run_bench(part="0/2", **kw).to_json()
    p1 = run_bench(part="1/2", **kw).to_json()
    p0["config"].update(llama_cost_model=_llama_cost(80.0, 0.2, 138), llama_server=_server(4000))
    p1["config"].update(llama_cost_model=_llama_cost(90.0, 0.3, 111), llama_server=_server(5000))
    merged = merge_parts([p1, p0])
    cost = merged.config["llama_cost_model"]
    assert cost["target_ms"] == {"1": pytest.approx(85.0), "2": pytest.approx(127.5)}
    assert (cost["c"], cost["c_lo"], cost["c_hi"], cost["prefix_len"]) == (pytest.approx(0.25), pytest.approx(0.17),
                                                                          pytest.approx(0.31), 124)
    assert [m["prefix_len"] for m in cost["parts"]] == [138, 111]  # part order, whatever order they were given in
    assert "--port 4000" in merged.config["llama_server"]["methods"]["llama-server-ar"]["command"]
    assert len(merged.config["llama_server"]["parts"]) == 2
    assert "the mean of 2 parts' models" in llama_cost_line(merged.to_json())
    other = json.loads(json.dumps(p1))
    other["config"]["llama_server"]["methods"]["llama-server-ar"]["command"] += " --spec-type draft-simple"
    with pytest.raises(ValueError, match="llama_server"):  # another server setting is another run
        merge_parts([p0, other])
    bare = json.loads(json.dumps(p1))
    del bare["config"]["llama_cost_model"]
    with pytest.raises(ValueError, match="llama.cpp cost model"):
        merge_parts([p0, bare])


def test_bench_command_merges_parts_and_needs_an_output(tiny_with_tokenizer, tmp_path, capsys, one_thread):
    from specrepro.__main__ import main

    model, tok = tiny_with_tokenizer
    kw = dict(models=(model, None, tok), prompts=PROMPTS[:2], methods="ar", max_new_tokens=2, warmup=False,
              progress=False, predict=False)
    for i in range(2):
        run_bench(part=(i, 2), json_path=tmp_path / f"p{i}.json", **kw)
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--merge", str(tmp_path / "p0.json"), str(tmp_path / "p1.json")])
    assert exc.value.code == 2 and "--merge needs --json" in capsys.readouterr().err
    assert main(["bench", "--merge", str(tmp_path / "p0.json"), str(tmp_path / "p1.json"), "--json",
                 str(tmp_path / "m.json")]) == 0
    assert json.loads((tmp_path / "m.json").read_text())["config"]["n_prompts"] == 2
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:  # a library error: one line, status 2, nothing written
        main(["bench", "--merge", str(tmp_path / "p0.json"), "--json", str(tmp_path / "m2.json")])
    assert exc.value.code == 2 and "each once" in capsys.readouterr().err
    assert not (tmp_path / "m2.json").exists()
    with pytest.raises(BenchOptionError, match="part must be"):
        run_bench(part="1of2", **kw)


def test_the_record_lists_a_run_timed_in_parts_once(tmp_path):
    from specrepro.bench.run import bench_files

    for name in ("bench_a.json", "bench_a.provenance.json", "bench_b.p0.json", "bench_b.p0.provenance.json",
                 "bench_b.p1.json", "bench_b.json", "bench_b.provenance.json", "bench_pq.json"):
        (tmp_path / name).write_text("{}")
    assert [p.name for p in bench_files(tmp_path)] == ["bench_a.json", "bench_b.json", "bench_pq.json"]


def test_a_rerun_resumes_across_new_servers_and_cost_models():
    """The checkpoint key of a run leaves out what every run measures or starts anew (the cost models, the servers'
    ports and logs), so an interrupted llama.cpp bench resumes; another server setting is another run."""
    from specrepro.bench.run import checkpoint_key

    base = {"methods": ["llama-server-ar"], "commit": "a", "cost_model": {"x": 1}}
    one = checkpoint_key({**base, "llama_cost_model": _llama_cost(80.0, 0.2, 138), "llama_server": _server(4000)})
    two = checkpoint_key({**base, "commit": "b", "llama_cost_model": _llama_cost(90.0, 0.3, 111),
                          "llama_server": _server(5000)})
    assert one == two
    other = _server(5000)
    other["methods"]["llama-server-ar"]["command"] += " --spec-type ngram-simple"
    assert checkpoint_key({**base, "llama_server": other}) != two
