"""bfloat16 as a precision of the bench: the int8 and 4-bit copies of a bfloat16 draft, greedy equality with
bfloat16 AR through the bench (our methods and transformers' baselines in the same run), and the draft as loaded
released before the timed passes when only its copies draft.

Exactness of the cheap drafts under sampling is tested in float32 (tests/test_cheap_drafts.py); nothing in the
verification depends on the draft's dtype: q is the processed softmax of the logits the tokens were drawn from,
computed in float32 (:func:`specrepro.core.sampling.probs_from_logits`).
"""

import copy

import pytest
import torch
from conftest import tiny_lm

from specrepro.drafters import compress
from specrepro.drafters.compress import pruned_head, quantize_draft, quantize_draft_int4, quantize_linear

pytestmark = pytest.mark.usefixtures("one_thread")

KEPT = torch.tensor([0, 2, 5, 7])


@pytest.fixture(scope="module")
def bf16_draft():
    """A tiny random qwen2 (vocabulary 8, hidden 32) in bfloat16."""
    return tiny_lm("qwen2", seed=2).to(torch.bfloat16)


def test_int4_layer_returns_its_inputs_dtype():
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 24)
    layer = compress.quantize_linear_int4(lin, 32)
    x = torch.randn(3, 64)
    y32, y16 = layer(x), layer(x.to(torch.bfloat16))
    assert y32.dtype == torch.float32 and y16.dtype == torch.bfloat16 and y16.shape == (3, 24)
    # the kernel rounds x to bfloat16 either way: the two differ only by the output's rounding
    torch.testing.assert_close(y16.float(), y32, atol=0.05, rtol=0.01)


def test_int8_and_int4_copies_of_a_bfloat16_draft(bf16_draft):
    q8, q4 = quantize_draft(bf16_draft), quantize_draft_int4(bf16_draft, 32)
    assert q8.dtype == torch.float32  # the int8 CPU kernels take float32 activations
    assert type(q8.model.layers[0].mlp.up_proj).__module__.startswith("torch.ao.nn.quantized")
    assert q4.dtype == torch.bfloat16 and isinstance(q4.lm_head, compress.Int4WeightOnlyLinear)
    assert bf16_draft.dtype == torch.bfloat16 and type(bf16_draft.lm_head) is torch.nn.Linear  # untouched
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.inference_mode():
        ref = bf16_draft(input_ids=ids).logits.float()
        l8, l4 = q8(input_ids=ids).logits, q4(input_ids=ids).logits
    assert l8.dtype == torch.float32 and l4.dtype == torch.bfloat16
    for logits in (l8, l4):
        assert 0 < (logits.float() - ref).abs().max() < 0.5  # quantized, not broken
    head = quantize_linear(pruned_head(bf16_draft, KEPT))
    assert head(torch.zeros(2, 32)).shape == (2, 4)
    with pytest.raises(ValueError, match="bfloat16"):
        quantize_draft(copy.deepcopy(bf16_draft).double())


def _llama(tok, seed: int, dtype=torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             eos_token_id=tok.eos_token_id))
    return model.to(dtype).eval().requires_grad_(False)


@pytest.fixture(scope="module")
def tok():
    from specrepro.models import load_tokenizer

    return load_tokenizer("smollm2-135m")


PROMPTS = ["def f(x):\n    return x", "x = [1, 2]\ny = [1, 2"]


def test_bfloat16_bench_equals_bfloat16_ar(tok):
    """Greedy in bfloat16: our chains with the bfloat16 draft, its int8 and 4-bit copies, and transformers' plain and
    assisted generation all give bfloat16 AR's tokens, in one run that records the precision."""
    from specrepro.bench import run_bench

    target, draft = _llama(tok, 0, torch.bfloat16), _llama(tok, 1, torch.bfloat16)
    methods = "sd-draft@2,sd-draft-adaptive-int8@4,sd-draft-int4@2,hf-ar,hf-assisted,hf-assisted-int8"
    res = run_bench(models=(target, draft, tok), prompts=PROMPTS, methods=methods, max_new_tokens=8, warmup=False,
                    progress=False, predict=False)
    assert res.config["dtype"] == "bfloat16"
    assert res.runs["equal_to_baseline"].all(), res.runs[["method", "prompt", "token_ids"]]
    assert set(res.runs["method"]) == {"ar", *methods.split(",")}
    assert res.config["float_draft_kept"] is True  # the caller holds it (models=...)


def test_the_draft_as_loaded_is_released_when_only_its_copies_draft(tok, monkeypatch):
    """A run whose methods draft only with copies built from the draft (int8, 4-bit) frees the draft as loaded before
    timing; a run with a method that drafts with it keeps it, and both still equal AR."""
    import specrepro.models
    from specrepro.bench import run_bench

    monkeypatch.setattr(specrepro.models, "load_pair",
                        lambda target, draft, device=None, dtype=None: (_llama(tok, 0), _llama(tok, 1), tok))
    kept = {}
    for methods in ("sd-draft-int8@2,sd-draft-int4@2,hf-assisted-int8", "sd-draft-int8@2,sd-draft@2"):
        res = run_bench("t", "d", methods=methods, prompts=PROMPTS, max_new_tokens=6, warmup=True, progress=False,
                        predict=False)
        assert res.runs["equal_to_baseline"].all()
        kept[methods] = res.config["float_draft_kept"]
    assert kept == {"sd-draft-int8@2,sd-draft-int4@2,hf-assisted-int8": False, "sd-draft-int8@2,sd-draft@2": True}
