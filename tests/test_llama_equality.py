"""Greedy divergences on llama.cpp's kernels explained (or not) by a near-tie: specrepro.sim.llama_equality and the
llama.cpp branch of ``greedy-equality --from-bench``, on tiny random GGUF checkpoints (specrepro.backends.tinygguf).

* the rule on numbers: paths that order two tokens differently are a near-tie; a gap many times the paths'
  disagreement is not; paths equal to the last bit fall back to the absolute bound.
* the replayed paths: the one-token path is llama-ar's (its argmax is AR's token), the batch path differs from it by
  llama.cpp's batch rounding only, and the server path of an empty generated prefix is the batch path.
* a synthetic llama.cpp bench file: a target whose last token's output row is a copy of another's (the two tokens
  tied on every path) gives a divergence that is a near-tie under the default rule; a planted least-likely token is
  reported as not explained; the command saves the table and exits 1.

Skipped, with the import error, only where llama_cpp cannot be imported (install: requirements-llamacpp.txt).
"""

from __future__ import annotations

import hashlib
import json
import types

import pytest
import torch

from specrepro.backends.llamacpp import LlamaCppLM, llama_cpp_available
from specrepro.backends import tinygguf
from specrepro.backends.tinygguf import TinyShape, tiny_llama_gguf, write_tiny_llama_gguf
from specrepro.core.blocklm import chain_generate
from specrepro.sim import llama_equality as le

_OK, _WHY = llama_cpp_available()
pytestmark = [pytest.mark.skipif(not _OK, reason=f"llama_cpp does not import ({_WHY}); install it with the command "
                                                 "in requirements-llamacpp.txt"),
              pytest.mark.usefixtures("one_thread")]

SHAPE = TinyShape()  # vocabulary 32
TIED = SHAPE.vocab - 1  # its output row is a copy of another token's
TEXTS = ["abcd", "hello", "xyzw"]
N_NEW = 12


class _CharTokenizer:
    """Tokenizer stand-in for the tiny vocabulary: one id in [4, 32) per character."""

    def __call__(self, text, return_tensors=None):
        return types.SimpleNamespace(input_ids=torch.tensor([[4 + ord(c) % 28 for c in text]]))


def _ar(lm, ids):
    return chain_generate(lm, list(ids), max_new_tokens=N_NEW, eos_token_id=None).tokens


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    """A tiny target whose token TIED has the output row of a token its greedy output emits (so the two tie on every
    path wherever that token is chosen), opened by llama.cpp; and the token it copies."""
    d = tmp_path_factory.mktemp("tiny-gguf-tied")
    base = LlamaCppLM(tiny_llama_gguf(1, SHAPE, d), n_threads=1)
    ids = _CharTokenizer()(TEXTS[1]).input_ids[0].tolist()
    copied = next(t for t in _ar(base, ids)[1:] if t != TIED)
    base.close()
    original = tinygguf._random_tensors

    def with_tie(shape, generator):
        out = original(shape, generator)
        out["output.weight"][TIED] = out["output.weight"][copied]
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tinygguf, "_random_tensors", with_tie)
        path = write_tiny_llama_gguf(d / "tied.gguf", torch.Generator().manual_seed(1), SHAPE)
    return LlamaCppLM(path, n_threads=1), copied, path


# ------------------------------------------------------------------------------------------------ the rule

def test_the_rule_on_numbers():
    flip = le.near_tie({"one_token": (1.0, 0.99), "batch": (1.0, 1.01), "server": (1.0, 1.0)})
    assert flip["order_differs"] and flip["explained"]
    assert flip["disagreement"] == pytest.approx(0.02) and flip["bound"] == pytest.approx(0.08)
    far = le.near_tie({"one_token": (2.0, 1.5), "batch": (2.01, 1.5), "server": (2.0, 1.5)})
    assert not far["order_differs"] and not far["explained"]
    assert far["bound"] == pytest.approx(0.04) and far["max_abs_gap"] == pytest.approx(0.51)
    # within 4 disagreements but not within 2: the multiple is the rule's parameter
    close = {"one_token": (1.0, 0.97), "batch": (1.01, 0.97), "server": (1.0, 0.97)}
    assert le.near_tie(close)["explained"] and not le.near_tie(close, tie_disagreements=2)["explained"]
    same = {"one_token": (3.0, 3.0), "batch": (3.0, 3.0)}
    assert le.near_tie(same)["bound"] == 1e-3 and le.near_tie(same)["explained"]
    assert not le.near_tie({"one_token": (3.0, 2.99), "batch": (3.0, 2.99)})["explained"]


# ------------------------------------------------------------------------------------------------ the paths

def test_the_replayed_paths(tied):
    lm, _, _ = tied
    ids = _CharTokenizer()(TEXTS[0]).input_ids[0].tolist()
    ar = _ar(lm, ids)
    shared = ar[:5]
    one = le.path_logits(lm, ids, shared, "one_token")
    assert int(one.argmax()) == ar[5] or float(one[ar[5]]) == float(one.max())  # llama-ar's own path
    batch = le.path_logits(lm, ids, shared, "batch")
    server = le.path_logits(lm, ids, shared, "server")
    for z in (batch, server):  # llama.cpp's batch rounding only (flash attention's float16 queries: ~5e-4)
        assert z.shape == (SHAPE.vocab,) and torch.allclose(z, one, rtol=0, atol=2e-3)
    assert torch.equal(le.path_logits(lm, ids, [], "server"), le.path_logits(lm, ids, [], "batch"))
    with pytest.raises(ValueError, match="path"):
        le.path_logits(lm, ids, shared, "sideways")


# ------------------------------------------------------------------------------------------------ a bench file

def _bench(tmp_path, lm, copied):
    """A llama.cpp bench file of 3 prompts x 2 passes: llama-server-ar and llama-ar equal everywhere, llama-sd@2
    equal on TEXTS[0], taking the tied token on TEXTS[1] and a planted least-likely token on TEXTS[2]."""
    workload = tmp_path / "prompts.jsonl"
    workload.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n" for i, t in enumerate(TEXTS)))
    tok = _CharTokenizer()
    runs, planted = [], {}
    for i, text in enumerate(TEXTS):
        ids = tok(text).input_ids[0].tolist()
        ar = _ar(lm, ids)
        other = list(ar)
        if i == 1:
            at = next(k for k, t in enumerate(ar) if t in (copied, TIED))
            other[at] = TIED if ar[at] == copied else copied
            planted[f"p{i}"] = at
        elif i == 2:  # a position where the target's top token is not one of the tied pair
            at = next(k for k in range(2, N_NEW) if ar[k] not in (copied, TIED))
            other[at] = int(le.path_logits(lm, ids, ar[:at], "one_token").argmin())
            planted[f"p{i}"] = at
        for rep in range(2):
            for m, toks in (("llama-server-ar", ar), ("llama-ar", ar), ("llama-sd@2", other)):
                runs.append({"repeat": rep, "prompt": f"p{i}", "prompt_index": i, "method": m, "token_ids": toks,
                             "prompt_tokens": len(ids), "equal_to_baseline": toks == ar})
    cfg = {"temperature": 0.0, "workload": str(workload), "n_prompts": len(TEXTS), "chat_template": False,
           "target": "tiny", "baseline": "llama-server-ar",
           "llamacpp": {"n_threads": 1, "n_ctx": 256, "kv_cache_type": "f16",
                        "target_gguf": {"model": str(lm.path), "file": lm.path.name,
                                        "sha256": hashlib.sha256(lm.path.read_bytes()).hexdigest()}}}
    path = tmp_path / "bench_tiny_llama.json"
    data = {"config": cfg, "summary": [], "runs": runs}
    path.write_text(json.dumps(data))
    return path, data, tok, planted


def test_a_tie_is_explained_and_a_planted_token_is_not(tmp_path, tied):
    from specrepro.lab.equality import bench_prompt_ids

    lm, copied, _ = tied
    path, data, tok, planted = _bench(tmp_path, lm, copied)
    assert le.is_llamacpp_bench(data["config"]) and not le.is_llamacpp_bench({"target": "tiny"})
    ids = bench_prompt_ids(data["config"], tok)
    assert sorted(ids) == ["p0", "p1", "p2"] and ids["p1"].tolist() == tok(TEXTS[1]).input_ids[0].tolist()
    table = le.llama_bench_divergences(data, ids, lm)
    # llama-sd@2 against the baseline and against llama-ar, on p1 and p2; llama-ar against the baseline: equal
    assert sorted(zip(table["method"], table["reference"], table["prompt_id"])) == [
        ("llama-sd@2", "llama-ar", "p1"), ("llama-sd@2", "llama-ar", "p2"),
        ("llama-sd@2", "llama-server-ar", "p1"), ("llama-sd@2", "llama-server-ar", "p2")]
    assert set(table["passes"]) == {"2/2"}
    for r in table.itertuples():
        assert r.diverged_at == planted[r.prompt_id]
        for p in le.PATHS:  # each path's top two and their gap are reported
            assert getattr(r, f"top2_gap_{p}") >= 0 and getattr(r, f"top1_{p}") != getattr(r, f"top2_{p}")
        assert r.gap == r.gap_batch and r.gap_incremental == r.gap_one_token
    tie = table[table["prompt_id"] == "p1"]
    assert tie["explained"].all() and (tie["max_abs_gap"] <= tie["bound"]).all()
    assert {int(tie["ref_token"].iloc[0]), int(tie["other_token"].iloc[0])} == {copied, TIED}
    assert (tie["top2_gap_one_token"] <= tie["bound"]).all()  # the two tied tokens are the top two
    far = table[table["prompt_id"] == "p2"]
    assert not far["explained"].any() and (far["max_abs_gap"] > 100 * far["bound"]).all()
    assert (far["top1_one_token"] == far["ref_token"]).all() and (far["gap_one_token"] > 1.0).all()
    # a prompt rebuilt at another length than the bench decoded is refused
    data["runs"][0]["prompt_tokens"] += 1
    with pytest.raises(ValueError, match="rebuilt"):
        le.llama_bench_divergences(data, ids, lm)
    # no divergence: an empty table
    same = {"config": data["config"], "runs": [r for r in data["runs"] if r["method"] != "llama-sd@2"]}
    same["runs"][0]["prompt_tokens"] -= 1
    assert le.llama_bench_divergences(same, ids, lm).empty


def test_the_command_saves_the_table_and_fails_on_a_non_tie(tmp_path, tied, monkeypatch, capsys):
    import specrepro.models
    from specrepro.lab import equality as lab_equality
    from specrepro.record import equality, results

    lm, copied, gguf = tied
    path, _, tok, _ = _bench(tmp_path, lm, copied)
    out = tmp_path / "results"
    out.mkdir()
    monkeypatch.delenv("SPECREPRO_RECORD", raising=False)
    monkeypatch.setattr(results, "results_dir", lambda profile="standard": out)
    monkeypatch.setattr(specrepro.models, "load_tokenizer", lambda name: tok)
    opened = lab_equality.open_llama_bench_target(json.loads(path.read_text())["config"])  # the recorded file, checked
    assert opened.path == gguf and opened.n_threads == 1
    opened.close()
    monkeypatch.setattr(lab_equality, "open_llama_bench_target", lambda cfg: lm)
    args = types.SimpleNamespace(from_bench=str(path), tie_bound=1e-3, tie_spacings=2.0, tie_disagreements=4.0,
                                 profile="standard")
    assert equality.run_command(args) == 1
    said = capsys.readouterr().out
    assert "4 (method, reference, prompt) divergences" in said and "2 near-ties" in said and "2 not explained" in said
    table = out / "divergences_bench_tiny_llama.csv"
    prov = json.loads(table.with_suffix(".provenance.json").read_text())
    assert prov["tie_disagreements"] == 4.0 and prov["references"] == ["llama-server-ar", "llama-ar"]
    assert prov["bench_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_gguf_file_other_than_the_benchs_is_refused(tmp_path, tied):
    from specrepro.lab.equality import open_llama_bench_target

    lm, _, _ = tied
    cfg = {"llamacpp": {"n_threads": 1, "n_ctx": 256,
                        "target_gguf": {"model": str(lm.path), "sha256": "0" * 64}}}
    with pytest.raises(ValueError, match="sha256"):
        open_llama_bench_target(cfg)
