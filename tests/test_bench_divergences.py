"""Greedy divergences from AR explained (or not) by a near-tie: specrepro.sim.real.explain_divergence, the bench
file reader behind ``greedy-equality --from-bench`` and the line the bench block prints under a greedy table."""

import fnmatch
import hashlib
import json

import pandas as pd
import pytest
import torch
from conftest import PROMPT, tiny_lm

from specrepro.core.decoding import generate
from specrepro.lab import equality as lab_equality
from specrepro.record import bench_blocks, equality, report
from specrepro.sim.real import explain_divergence, logit_spacing


def test_logit_spacing_is_one_unit_in_the_last_place():
    assert logit_spacing(20.0, torch.bfloat16) == 0.125  # 16 <= 20 < 32: 2^4 x 2^-7
    assert logit_spacing(-3.0, torch.bfloat16) == 2.0 ** -6
    assert logit_spacing(1.0, torch.float32) == 2.0 ** -23
    assert logit_spacing(0.0, torch.float32) == torch.finfo(torch.float32).eps


@pytest.fixture(scope="module")
def model():
    return tiny_lm("llama", vocab=8, seed=3, sharpness=2.0)


def test_a_runner_up_within_the_bound_is_a_near_tie_and_a_far_token_is_not(model):
    ar = generate(model, PROMPT, max_new_tokens=6, eos_token_id=None).tokens
    assert explain_divergence(model, PROMPT, ar, ar) is None
    assert explain_divergence(model, PROMPT, ar, ar[:3]) is None  # a prefix is not a divergence
    with torch.inference_mode():
        logits = model(input_ids=torch.cat([PROMPT, torch.tensor(ar[:2])])[None]).logits[0, -1]
    order = logits.argsort(descending=True).tolist()
    assert order[0] == ar[2]
    far = ar[:2] + [order[-1]] + ar[3:]  # the least likely token at index 2
    why = explain_divergence(model, PROMPT, ar, far)
    assert why["diverged_at"] == 2 and why["ar_token"] == ar[2] and why["other_token"] == order[-1]
    assert why["gap"] == pytest.approx(float(logits[order[0]] - logits[order[-1]]), abs=1e-4)
    assert why["gap_incremental"] >= 0  # AR's own path chose its token
    assert why["gap"] > why["bound"] == 1e-3 and not why["explained"]  # float32: the absolute bound rules
    # the same divergence with a bound that covers the gap is a near-tie: the rule reads the gap, not the tokens
    assert explain_divergence(model, PROMPT, ar, far, tie_bound=why["gap"] + 1)["explained"]


class _CharTokenizer:
    """Tokenizer stand-in for an 8-token model: one id per character (its code mod 8)."""

    def __call__(self, text, return_tensors=None):
        class Out:
            input_ids = torch.tensor([[ord(c) % 8 for c in text]])

        return Out()


def _bench_file(tmp_path, model, tamper):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n" for i, t in enumerate(["abcd", "efg"])))
    tok = _CharTokenizer()
    runs = []
    for i, text in enumerate(["abcd", "efg"]):
        ar = generate(model, tok(text).input_ids[0], max_new_tokens=5, eos_token_id=None).tokens
        for rep in range(2):
            runs.append({"repeat": rep, "prompt": f"p{i}", "prompt_index": i, "method": "ar", "token_ids": ar,
                         "equal_to_baseline": True})
            other = tamper(ar) if i == 1 else ar
            runs.append({"repeat": rep, "prompt": f"p{i}", "prompt_index": i, "method": "sd", "token_ids": other,
                         "equal_to_baseline": other == ar})
    cfg = {"temperature": 0.0, "workload": str(prompts), "n_prompts": 2, "chat_template": False, "target": "tiny",
           "dtype": "float32"}
    path = tmp_path / "bench_tiny.json"
    path.write_text(json.dumps({"config": cfg, "summary": [], "runs": runs}))
    return path, tok


def test_bench_divergences_one_row_per_method_and_prompt(tmp_path, model):
    path, tok = _bench_file(tmp_path, model, lambda ar: ar[:1] + [(ar[1] + 1) % 8] + ar[2:])
    table = lab_equality.bench_divergences(path, model=model, tokenizer=tok)
    assert len(table) == 1
    row = table.iloc[0]
    assert (row["method"], row["prompt_id"], row["passes"], row["diverged_at"]) == ("sd", "p1", "2/2", 1)
    assert equality.divergences_name(path) == "divergences_bench_tiny"
    # the bench block reads every bench_*.json: the table's sidecar must not look like a bench file
    assert not fnmatch.fnmatch(equality.divergences_name(path) + ".provenance.json", "bench_*.json")
    same, _ = _bench_file(tmp_path, model, lambda ar: ar)
    assert lab_equality.bench_divergences(same, model=model, tokenizer=tok).empty


def test_the_bench_block_says_what_explains_a_divergence(tmp_path, model, monkeypatch):
    path, tok = _bench_file(tmp_path, model, lambda ar: ar[:1] + [(ar[1] + 1) % 8] + ar[2:])
    summary = [{"method": "sd", "greedy_equal_to_ar": False}]
    monkeypatch.setattr(bench_blocks, "repo_root", lambda: tmp_path)
    assert "not explained yet" in bench_blocks._render_divergences(path, summary)
    table = lab_equality.bench_divergences(path, model=model, tokenizer=tok)
    table.to_csv(tmp_path / "divergences_bench_tiny.csv", index=False)
    sidecar = tmp_path / "divergences_bench_tiny.provenance.json"
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    sidecar.write_text(json.dumps({"bench_sha256": sha, "tie_bound": 1e-3, "tie_spacings": 2}))
    text = bench_blocks._render_divergences(path, summary)
    explained = int(pd.read_csv(tmp_path / "divergences_bench_tiny.csv")["explained"].sum())
    assert f"1 (method, prompt) pairs, {explained} of them near-ties" in text and "`sd` p1 (2/2 passes) at token 1" in text
    sidecar.write_text(json.dumps({"bench_sha256": "0" * 64}))
    assert "explains another run" in bench_blocks._render_divergences(path, summary)
    assert bench_blocks._render_divergences(path, [{"method": "sd", "greedy_equal_to_ar": True}]) == ""
