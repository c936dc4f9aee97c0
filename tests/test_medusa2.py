"""Medusa-2: heads and LoRA adapters trained jointly (specrepro.train.medusa2).

What is tested (tiny random llama, V = 8, one thread): joint training lowers the combined loss and leaves the original
backbone untouched; the adapter and heads are cached and come back identical, and are refused for another base
model; greedy Medusa-2 decoding equals greedy AR of the fine-tuned backbone (exactness holds w.r.t. the model it
decodes); the quality cost's interval contains 0 for an unchanged model (LoRA at its zero initialisation) and
excludes it for a perturbed one (the check can fail).
"""

import copy

import pytest
import torch
from conftest import PROMPT, tiny_lm

from specrepro.core.decoding import generate
from specrepro.core.medusa import MedusaProposer, medusa_generate
from specrepro.core.medusa_heads import HeadMismatchError, random_heads
from specrepro.train.medusa2 import (
    Medusa2Config,
    get_or_train_medusa2,
    quality_cost,
    train_medusa2,
)

CHOICES = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


@pytest.fixture(scope="module")
def base():
    return tiny_lm("llama", vocab=8, seed=1)


def _seqs(n=12, length=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 8, (length,), generator=g) for _ in range(n)]


CFG = Medusa2Config(lora_r=4, lora_alpha=8, lr_lora=5e-3, lr_heads=1e-2, epochs=4, seed=0)


def test_training_lowers_loss_and_keeps_the_base(base):
    before = {k: v.clone() for k, v in base.state_dict().items()}
    heads = random_heads(base, 3, scale=0.3, seed=0)
    tuned, h, losses, adapter = train_medusa2(base, heads, _seqs(), CFG, progress=False)
    assert losses.loss.iloc[-6:].mean() < 0.9 * losses.loss.iloc[:6].mean()
    assert adapter and all("lora" in k for k in adapter)
    for k, v in base.state_dict().items():
        torch.testing.assert_close(v, before[k])
    assert h.base_fingerprint != heads.base_fingerprint  # the heads now belong to the fine-tuned backbone
    changed = any(not torch.equal(a, b) for a, b in zip(tuned.state_dict().values(), base.state_dict().values()))
    assert changed


def test_cache_round_trip_and_refusal(tmp_path, monkeypatch, base):
    monkeypatch.setenv("SPECREPRO_CACHE", str(tmp_path))
    heads = random_heads(base, 3, scale=0.3, seed=0)
    cfg = Medusa2Config(lora_r=4, lora_alpha=8, epochs=1, max_steps=5, seed=0)
    first = get_or_train_medusa2(base, heads, _seqs(), cfg, progress=False)
    again = get_or_train_medusa2(base, heads, _seqs(), cfg, progress=False)
    assert not first["cached"] and again["cached"]
    x = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(again["tuned"](input_ids=x).logits, first["tuned"](input_ids=x).logits)
    hs = torch.randn(2, 32)
    torch.testing.assert_close(again["heads"](hs), first["heads"](hs))
    from specrepro.train.medusa2 import load_medusa2

    with pytest.raises(HeadMismatchError, match="trained on base model"):
        load_medusa2(first["directory"], tiny_lm("llama", vocab=8, seed=2))


def test_greedy_medusa2_equals_ar_of_the_tuned_backbone(base):
    tuned, h, _, _ = train_medusa2(base, random_heads(base, 3, scale=0.3, seed=0), _seqs(), CFG, progress=False)
    ar = generate(tuned, PROMPT, max_new_tokens=25).tokens
    assert medusa_generate(tuned, PROMPT, MedusaProposer(h, CHOICES), max_new_tokens=25).tokens == ar


def test_quality_cost_interval(base):
    unchanged, _, _, _ = train_medusa2(base, random_heads(base, 3, seed=0), _seqs(), 
                                       Medusa2Config(lora_r=4, epochs=1, max_steps=1, lr_lora=1e-12, lr_heads=1e-12),
                                       progress=False)
    held = _seqs(10, 24, seed=5)
    _, s = quality_cost(base, unchanged, held)
    assert s["n"] == 10 and s["delta_lo"] <= 0 <= s["delta_hi"] and abs(s["delta_nll"]) < 1e-3
    worse = copy.deepcopy(base)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in worse.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=g))
    _, s2 = quality_cost(base, worse, held)
    assert s2["delta_lo"] > 0, s2
