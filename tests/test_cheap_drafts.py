"""Cheap drafts : int8 draft models, FR-Spec's vocabulary-pruned draft head, the hybrid lookup/model
drafter, the per-step γ choice, the free-draft bound, and their bench methods.

Exactness: each new drafter runs end to end through `generate` on tiny random transformers; 3-token sequences are
tested against the target's exact 3-token distribution (chi-square, sparse bins pooled, level 1e-3; seeds fixed), and
a wrong q of the kind each drafter could plausibly report (fp32 q for int8 samples, the unpruned softmax for a pruned
head, the draft model's q for copied tokens) must fail the same test. Greedy decoding must equal AR token for token.
The tiny models of the goodness-of-fit tests run behind conftest.memo (each distinct forward pass runs once, then is
replayed bit for bit: the same samples).
"""

import pytest
import torch
from conftest import LEVEL, PROMPT, memo, tiny_lm

from specrepro import theory
from specrepro.core.decoding import generate
from specrepro.core.sampling import SamplingConfig
from specrepro.drafters import compress
from specrepro.drafters.adaptive import AdaptiveLengthDrafter, AutoGammaDrafter
from specrepro.drafters.base import Proposal
from specrepro.drafters.compress import (
    check_int8_backend,
    frequent_token_ids,
    pruned_head,
    quantize_draft,
    quantize_linear,
    token_frequencies,
)
from specrepro.drafters.lookup import HybridDrafter, PromptLookupDrafter
from specrepro.drafters.model import DraftModelDrafter, PrunedHeadDrafter
from specrepro.measure.alpha import measure_alpha, target_probs_along
from specrepro.sim.exact import target_distribution
from specrepro.sim.toy import ToyLM
from specrepro.stats import gof_test

N = 2000  # 3 tokens of V = 8 (512 outcomes): detects TV <= 0.1 with 90% power (test_gof_tests_here_have_power)
N_HYBRID = 3000  # the hybrid's prompt gives a flatter target: more samples for the same power
N_CONTROL = 600  # the negative controls deviate far more than TV 0.1: the original n catches them
LENGTH = 3
T1 = SamplingConfig(1.0)
KEPT = torch.tensor([0, 2, 5, 7])  # half of the tiny vocabulary


pytestmark = pytest.mark.usefixtures("one_thread")





@pytest.fixture(scope="module")
def coarse_int8(pair):
    """A draft whose int8 copy differs visibly from it (TV ~0.3 between their next-token distributions), so that a
    q taken from the wrong one shows: an outlier LM-head weight in a hidden dimension that the final norm zeroes
    leaves the fp32 logits alone but sets the per-tensor scale, which quantizes every other head weight coarsely."""
    import copy

    d = copy.deepcopy(pair[1])
    with torch.no_grad():
        d.model.norm.weight[5] = 0.0
        d.lm_head.weight[0, 5] = 100.0
    return d, quantize_draft(d, "torch-per-tensor")


def _int8(module) -> bool:
    """An int8 linear layer of torch.ao (its class is also called Linear)."""
    return type(module).__module__.startswith("torch.ao.nn.quantized")


def _samples(target, drafter, cfg, n, seed, gamma=3, prompt=PROMPT, length=LENGTH):
    g = torch.Generator().manual_seed(seed)
    return [tuple(generate(target, prompt, drafter=drafter, gamma=gamma, max_new_tokens=length, sampling=cfg,
                           generator=g).tokens) for _ in range(n)]


def _exact(target, cfg, prompt=PROMPT, length=LENGTH):
    return target_distribution(ToyLM.from_transformer(target, prompt), cfg, length)


def _fp32_q_drafter(fp32, quantized):
    """Negative control of a quantized draft: samples from ``quantized``, reports the fp32 draft's q for them."""
    from specrepro.core.sampling import logits_to_probs

    class Fp32QForQuantizedSamples(DraftModelDrafter):
        def propose(self, ids, gamma, sampling, generator):
            prop = super().propose(ids, gamma, sampling, generator)
            ctx = torch.cat([ids, prop.tokens])
            with torch.inference_mode():
                logits = fp32(input_ids=ctx[None]).logits[0, ids.numel() - 1: ids.numel() - 1 + prop.tokens.numel()]
            return Proposal(prop.tokens, logits_to_probs(logits, sampling))

    return Fp32QForQuantizedSamples(quantized, 8)


# ------------------------------------------------------------------------------------------------------ int8 draft

def test_int8_draft_goodness_of_fit_and_a_wrong_q_fails(pair, coarse_int8):
    target = memo(pair[0])
    fp32, int8 = memo(*coarse_int8)
    exact = _exact(target, T1)
    assert gof_test(_samples(target, DraftModelDrafter(int8, 8), T1, N, seed=11), exact)[1] > LEVEL

    assert gof_test(_samples(target, _fp32_q_drafter(fp32, int8), T1, N_CONTROL, seed=11), exact)[1] < LEVEL


def test_quantize_draft_copies_converts_and_refuses(pair):
    _, draft = pair
    import copy

    from specrepro.models import OneDNNLinear, use_onednn_linear

    packed = copy.deepcopy(draft)
    use_onednn_linear(packed)
    assert isinstance(packed.model.layers[0].mlp.up_proj, OneDNNLinear)
    q = quantize_draft(packed)
    layer = q.model.layers[0].mlp.up_proj
    assert _int8(layer) and _int8(q.lm_head)
    assert isinstance(packed.model.layers[0].mlp.up_proj, OneDNNLinear)  # the original is untouched
    skip = quantize_draft(draft, skip_lm_head=True)
    assert type(skip.lm_head) is torch.nn.Linear
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.inference_mode():
        err = (q(input_ids=ids).logits - draft(input_ids=ids).logits).abs().max()
    assert 0 < err < 0.5  # quantized, not broken
    with pytest.raises(ValueError, match="int8 backend"):
        quantize_draft(draft, "int4")
    with pytest.raises(ValueError, match="float32"):
        quantize_draft(copy.deepcopy(draft).double())
    head = quantize_linear(pruned_head(draft, KEPT))
    assert head(torch.zeros(2, 32)).shape == (2, 4)


# ------------------------------------------------------------------------------------------------------ int4 draft

@pytest.fixture(scope="module")
def coarse_int4(pair):
    """A draft whose 4-bit copy differs visibly from it: a large weight in a hidden dimension that the final norm
    zeroes leaves the fp32 logits alone but stretches every head row's group range, so each row's other weights share
    a few coarse levels (the int4 analogue of ``coarse_int8``)."""
    import copy

    d = copy.deepcopy(pair[1])
    with torch.no_grad():
        d.model.norm.weight[5] = 0.0
        d.lm_head.weight[:, 5] = 30.0
    return d, compress.quantize_draft_int4(d, 32)


def test_int4_linear_multiplies_by_its_dequantized_weight():
    torch.manual_seed(0)
    for n, k, g in [(40, 64, 32), (16, 256, 128), (3, 32, 32)]:  # 40 and 3 rows: padded to 48 and 16, then cut
        layer = torch.nn.Linear(k, n)
        q = compress.quantize_linear_int4(layer, g)
        w_hat = q.dequantized_weight()
        assert w_hat.shape == (n, k)
        x = torch.randn(2, 5, k)
        y = q(x)
        assert y.dtype == torch.float32
        # the kernel takes x in bfloat16 (its fast path): the product of the rounded x with Ŵ, to bfloat16 precision
        torch.testing.assert_close(y, x.bfloat16().float() @ w_hat.T + layer.bias, atol=2e-2, rtol=2e-2)
        # each weight lies within half a quantization step of its group's 16 levels
        groups = layer.weight.detach().reshape(n, k // g, g)
        step = (groups.amax(-1) - groups.amin(-1)) / 15
        err = (w_hat - layer.weight).abs().reshape(n, k // g, g).amax(-1)
        assert (err <= step / 2 + 1e-5).all()
    with pytest.raises(ValueError, match="group size"):
        compress.Int4WeightOnlyLinear(torch.nn.Linear(48, 16), 32)  # 32 does not divide 48
    with pytest.raises(ValueError, match="divides"):
        compress.quantize_linear_int4(torch.nn.Linear(48, 16), 128)  # nor does any allowed size
    assert compress.quantize_linear_int4(torch.nn.Linear(64, 16), 128).group_size == 64
    with pytest.raises(ValueError, match="group size"):
        compress.check_int4(16)
    with pytest.raises(TypeError):
        compress.quantize_linear_int4(torch.nn.Conv1d(4, 4, 1))


def test_quantize_draft_int4_copies_converts_and_refuses(pair):
    import copy

    _, draft = pair
    q = compress.quantize_draft_int4(draft, 32)
    assert isinstance(q.model.layers[0].mlp.up_proj, compress.Int4WeightOnlyLinear)
    assert isinstance(q.lm_head, compress.Int4WeightOnlyLinear) and q.specrepro_int4_float_layers == []
    assert type(draft.model.layers[0].mlp.up_proj) is not compress.Int4WeightOnlyLinear  # the original is untouched
    assert type(compress.quantize_draft_int4(draft, 32, skip_lm_head=True).lm_head) is torch.nn.Linear
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.inference_mode():
        err = (q(input_ids=ids).logits - draft(input_ids=ids).logits).abs().max()
    assert 0 < err < 0.5  # quantized, not broken
    with pytest.raises(ValueError, match="float32"):
        compress.quantize_draft_int4(copy.deepcopy(draft).double())
    with pytest.raises(ValueError, match="group size"):
        compress.quantize_draft_int4(draft, 100)


def test_int4_draft_goodness_of_fit_and_a_wrong_q_fails(pair, coarse_int4):
    """The 4-bit draft through the real loop: its samples fit the target's exact distribution (n = 2000: TV <= 0.1
    detected with 90% power), and the same samples verified with the fp32 draft's q fail."""
    target = memo(pair[0])
    fp32, int4 = memo(*coarse_int4)
    with torch.inference_mode():
        ids = PROMPT[None]
        tv = 0.5 * (torch.softmax(fp32(input_ids=ids).logits[0, -1], -1)
                    - torch.softmax(int4(input_ids=ids).logits[0, -1], -1)).abs().sum()
    assert tv > 0.1, "the fixture must make the 4-bit q differ from the fp32 q"
    exact = _exact(target, T1)
    assert gof_test(_samples(target, DraftModelDrafter(int4, 8), T1, N, seed=12), exact)[1] > LEVEL

    assert gof_test(_samples(target, _fp32_q_drafter(fp32, int4), T1, N_CONTROL, seed=12), exact)[1] < LEVEL


def test_tied_embeddings_stay_float_when_the_head_is_quantized():
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.random.fork_rng():
        torch.manual_seed(0)
        m = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True))
    m.eval().requires_grad_(False)
    q = quantize_draft(m)
    assert q.model.embed_tokens.weight.dtype == torch.float32
    assert torch.equal(q.model.embed_tokens.weight, m.model.embed_tokens.weight)
    assert _int8(q.lm_head)


def test_torchao_backend_when_installed(pair):
    pytest.importorskip("torchao")
    _, draft = pair
    q = quantize_draft(draft, "torchao-weight-only")
    with torch.inference_mode():
        assert (q(input_ids=PROMPT[None]).logits - draft(input_ids=PROMPT[None]).logits).abs().max() < 0.5


def test_torchao_backend_missing_is_a_clear_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    with pytest.raises(ValueError, match="pip install torchao"):
        check_int8_backend("torchao-dynamic")


# ----------------------------------------------------------------------------------------------- pruned draft head

def test_pruned_head_goodness_of_fit_with_target_mass_outside_the_kept_set(pair):
    target, draft = memo(*pair)
    cfg = SamplingConfig(0.9, top_p=0.95)
    exact = _exact(target, cfg)
    outside = sum(pr for seq, pr in exact.items() if any(t not in KEPT.tolist() for t in seq))
    assert outside > 0.3  # the target's residual has real work to do
    drafter = PrunedHeadDrafter(draft, KEPT, 8)
    samples = _samples(target, drafter, cfg, N, seed=12)
    assert any(s[0] not in KEPT.tolist() for s in samples)  # tokens outside the kept set are emitted
    assert gof_test(samples, exact)[1] > LEVEL

    class FullSoftmaxQ(PrunedHeadDrafter):
        """Negative control: samples from the pruned head, reports the unpruned head's softmax (T = 1)."""

        def _kept_logits(self, hidden):
            self.hidden = hidden
            return super()._kept_logits(hidden)

        def _widen(self, q_kept):
            return torch.softmax(draft.lm_head(self.hidden[None])[0].float(), -1)

    exact = _exact(target, T1)
    assert gof_test(_samples(target, FullSoftmaxQ(draft, KEPT, 8), T1, N_CONTROL, seed=12), exact)[1] < LEVEL


def test_pruned_head_q_lives_on_the_kept_set_and_matches_teacher_forcing(pair):
    target, draft = pair
    drafter = PrunedHeadDrafter(draft, KEPT, 8)
    prop = drafter.propose(PROMPT, 3, T1, torch.Generator().manual_seed(0))
    assert prop.probs.shape == (3, 8)
    outside = [t for t in range(8) if t not in KEPT.tolist()]
    assert torch.all(prop.probs[:, outside] == 0) and torch.allclose(prop.probs.sum(-1), torch.ones(3))
    assert set(prop.tokens.tolist()) <= set(KEPT.tolist())
    ids = torch.cat([PROMPT, prop.tokens])
    tf = drafter.teacher_forced_probs(ids, PROMPT.numel(), T1)
    assert torch.allclose(tf[:3], prop.probs, atol=1e-5)
    # the q of the kept tokens is the renormalized full softmax restricted to them (no top-k/top-p here)
    with torch.inference_mode():
        full = torch.softmax(draft(input_ids=PROMPT[None]).logits[0, -1], -1)
    restricted = full[KEPT] / full[KEPT].sum()
    assert torch.allclose(prop.probs[0, KEPT], restricted, atol=1e-5)
    terms = measure_alpha(target, drafter, ids, PROMPT.numel(), T1)
    assert len(terms) == 3 and all(0 <= a <= 1 for a in terms)
    with pytest.raises(ValueError, match="kept_ids"):
        PrunedHeadDrafter(draft, torch.tensor([0, 8]), 8)
    with pytest.raises(ValueError, match="unique"):
        PrunedHeadDrafter(draft, torch.tensor([1, 1]), 8)


def test_pruned_head_dynamic_draft_length(pair):
    """stop_below on the pruned head (the dynamic draft length of sd-draft-dynamic with draft_kind=pruned/int8-pruned):
    it really shortens blocks, keeps the target distribution at T = 1, greedy output equals AR, and bad thresholds
    are refused."""
    target, draft = memo(*pair)
    with torch.inference_mode():  # the pruned head's temperature-1 confidences along a greedy continuation
        conf = torch.softmax(draft(input_ids=PROMPT[None]).logits[0, -1, KEPT], -1).max()
    stop = float(conf) + 0.05  # above the first confidence: the first block stops after one token
    drafter = PrunedHeadDrafter(draft, KEPT, 8, stop_below=stop)
    assert drafter.propose(PROMPT, 5, SamplingConfig(0.0), None).tokens.numel() == 1
    probe = generate(target, PROMPT, drafter=PrunedHeadDrafter(draft, KEPT, 8, stop_below=0.3), gamma=4,
                     max_new_tokens=40, sampling=T1, generator=torch.Generator().manual_seed(0))
    assert min(probe.drafted[:-1]) < 4 and max(probe.drafted) == 4  # the length varies
    samples = _samples(target, PrunedHeadDrafter(draft, KEPT, 8, stop_below=0.3), T1, N, seed=13, gamma=4)
    assert gof_test(samples, _exact(target, T1))[1] > LEVEL
    greedy = SamplingConfig(0.0)
    ar = generate(target, PROMPT, max_new_tokens=30, sampling=greedy).tokens
    assert generate(target, PROMPT, drafter=PrunedHeadDrafter(draft, KEPT, 8, stop_below=0.3), gamma=5,
                    max_new_tokens=30, sampling=greedy).tokens == ar
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(ValueError, match="stop_below"):
            PrunedHeadDrafter(draft, KEPT, 8, stop_below=bad)


def test_full_width_pruned_head_drafts_what_the_pruned_drafter_drafts(pair):
    """FullWidthHead + with_output_head (transformers' assisted generation drafting with the pruned head): logits at
    the kept ids are the pruned head's, the lowest value elsewhere; the greedy draft equals PrunedHeadDrafter's; the
    model passed in keeps its own head."""
    from specrepro.drafters.compress import FullWidthHead, with_output_head

    _, draft = pair
    head = pruned_head(draft, KEPT)
    copy_ = with_output_head(draft, FullWidthHead(head, KEPT, 8))
    assert draft.get_output_embeddings() is not copy_.get_output_embeddings()
    assert isinstance(draft.get_output_embeddings(), torch.nn.Linear)
    with torch.inference_mode():
        full = copy_(input_ids=PROMPT[None]).logits[0, -1]
        hidden = draft.get_decoder()(input_ids=PROMPT[None]).last_hidden_state[0, -1]
        original = draft(input_ids=PROMPT[None]).logits[0, -1]
    assert torch.allclose(full[KEPT], head(hidden[None])[0], atol=1e-6)
    outside = [t for t in range(8) if t not in KEPT.tolist()]
    assert torch.all(full[outside] == torch.finfo(full.dtype).min)
    assert not torch.allclose(original, full)  # the original still has its full head
    greedy = SamplingConfig(0.0)
    ours = PrunedHeadDrafter(draft, KEPT, 8).propose(PROMPT, 4, greedy, None).tokens
    ids = PROMPT.clone()
    for _ in range(4):  # greedy drafting through the full-width copy
        with torch.inference_mode():
            ids = torch.cat([ids, copy_(input_ids=ids[None]).logits[0, -1].argmax().reshape(1)])
    assert ids[PROMPT.numel():].tolist() == ours.tolist()
    with pytest.raises(ValueError, match="kept ids"):
        FullWidthHead(head, torch.tensor([0, 8]), 8)


def test_frequent_token_ids_and_cached_frequencies(tmp_path, monkeypatch):
    counts = torch.tensor([5, 0, 9, 9, 1, 7])
    assert frequent_token_ids(counts, 3, 6).tolist() == [2, 3, 5]
    assert frequent_token_ids(counts, 3, 6, always=[1]).tolist() == [1, 2, 3]  # stop ids kept, N in all
    assert frequent_token_ids(counts, 10, 4).tolist() == [0, 1, 2, 3]  # at most V, ids < V only
    with pytest.raises(ValueError):
        frequent_token_ids(counts, 0, 6)
    with pytest.raises(ValueError):
        frequent_token_ids(counts, 2, 6, always=[6])

    class CharTokenizer:
        """One token per character of 'abc ', id 4 for anything else."""

        vocab = {"a": 0, "b": 1, "c": 2, " ": 3, "?": 4}

        def __len__(self):
            return 5

        def get_vocab(self):
            return dict(self.vocab)

        def __call__(self, texts, add_special_tokens=False, verbose=False):
            return {"input_ids": [[self.vocab.get(ch, 4) for ch in t] for t in texts]}

    monkeypatch.setenv("SPECREPRO_CACHE", str(tmp_path))
    (tmp_path / "x.py").write_text("aab c")
    (tmp_path / "y.py").write_text("b!")
    files = [tmp_path / "x.py", tmp_path / "y.py"]
    counts = token_frequencies(CharTokenizer(), files)
    assert counts.tolist() == [2, 2, 1, 1, 1]
    assert list((tmp_path / "fr_spec").glob("*.safetensors"))
    monkeypatch.setattr(CharTokenizer, "__call__", lambda *a, **k: pytest.fail("cache not used"))
    assert token_frequencies(CharTokenizer(), files).tolist() == [2, 2, 1, 1, 1]


def test_stdlib_corpus_leaves_out_tests_and_third_party():
    from specrepro.drafters.compress import stdlib_sources

    files = stdlib_sources()
    assert len(files) > 100
    parts = {part for f in files for part in f.parts}
    assert not {"site-packages", "test", "tests"} & parts
    assert any(f.name == "functools.py" for f in files)


# ---------------------------------------------------------------------------------------------------- hybrid drafter

def test_hybrid_goodness_of_fit_uses_both_sources_and_a_model_q_for_copies_fails(pair):
    target, draft = memo(*pair)
    prompt = torch.tensor([1, 5, 2, 7, 1, 5])  # ends in a repeated bigram: lookup proposes first
    hybrid = HybridDrafter(PromptLookupDrafter(max_ngram=3, min_ngram=2), DraftModelDrafter(draft, 8))
    used = {"lookup": 0, "model": 0}
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        generate(target, prompt, drafter=hybrid, gamma=3, max_new_tokens=LENGTH, sampling=T1, generator=g)
        for k in used:
            used[k] += hybrid.steps[k]
    assert used["lookup"] > 0 and used["model"] > 0
    exact = _exact(target, T1, prompt)
    assert gof_test(_samples(target, hybrid, T1, N_HYBRID, seed=13, prompt=prompt), exact)[1] > LEVEL

    class ModelQForCopies(HybridDrafter):
        """Negative control: copied tokens reported with the draft model's q at their positions (as if the model had
        drawn them), not as the point masses they are."""

        def propose(self, ids, gamma, sampling, generator):
            prop = super().propose(ids, gamma, sampling, generator)
            if prop.probs is not None:
                return prop
            ctx = torch.cat([ids, prop.tokens])
            from specrepro.core.sampling import logits_to_probs

            with torch.inference_mode():
                logits = draft(input_ids=ctx[None]).logits[0, ids.numel() - 1: ids.numel() - 1 + prop.tokens.numel()]
            return Proposal(prop.tokens, logits_to_probs(logits, sampling))

    wrong = ModelQForCopies(PromptLookupDrafter(max_ngram=3, min_ngram=2), DraftModelDrafter(draft, 8))
    assert gof_test(_samples(target, wrong, T1, N_CONTROL, seed=13, prompt=prompt), exact)[1] < LEVEL


def test_hybrid_with_an_adaptive_fallback_is_exact_and_hears_only_its_own_blocks(pair):
    """Prompt lookup where it matches, an adaptive-length draft model elsewhere: the target's distribution is kept,
    copies are capped at lookup_max_gamma, and verification's feedback reaches the adaptive draft after its own
    blocks only (its calibration would otherwise count copied tokens as its own)."""
    target, draft = memo(*pair)
    prompt = torch.tensor([1, 5, 2, 7, 1, 5])

    heard = []

    class Listening(AdaptiveLengthDrafter):
        def feedback(self, n_drafted, n_accepted):
            heard.append(n_drafted)
            super().feedback(n_drafted, n_accepted)

    def hybrid():
        return HybridDrafter(PromptLookupDrafter(max_ngram=3, min_ngram=2),
                             Listening(DraftModelDrafter(draft, 8),
                                       theory.CostCurve([1, 2, 3, 4, 5], [10, 10.2, 10.4, 10.6, 10.8]), 0.3),
                             lookup_max_gamma=2)

    h = hybrid()
    g = torch.Generator().manual_seed(0)
    used = {"lookup": 0, "model": 0}
    for _ in range(20):
        heard.clear()
        out = generate(target, prompt, drafter=h, gamma=4, max_new_tokens=LENGTH, sampling=T1, generator=g)
        assert len(heard) == h.steps["model"]  # one feedback per model block, none for copied blocks
        assert all(n <= 4 for n in heard) and out.tokens
        for k in used:
            used[k] += h.steps[k]
    assert used["lookup"] > 0 and used["model"] > 0
    copied = h.lookup.propose(torch.tensor([1, 5, 2, 7, 1, 5, 2, 7, 1, 5]), 4, T1, g).tokens.numel()
    assert copied > 2 and h.propose(torch.tensor([1, 5, 2, 7, 1, 5, 2, 7, 1, 5]), 4, T1, g).tokens.numel() == 2
    exact = _exact(target, T1, prompt)
    assert gof_test(_samples(target, hybrid(), T1, N_HYBRID, seed=17, gamma=4, prompt=prompt), exact)[1] > LEVEL
    with pytest.raises(ValueError, match="lookup_max_gamma"):
        HybridDrafter(PromptLookupDrafter(), DraftModelDrafter(draft, 8), lookup_max_gamma=0)


# ------------------------------------------------------------------------------------------------ per-step γ choice

def _auto(draft):
    # verification nearly flat up to 4 tokens, then a jump (as the CPU GEMM's); a drafted token costs 1.5 ms:
    # γ* = 1 for α̂ <= 0.5, 2 or 3 above (theory.gamma_for_step)
    return AutoGammaDrafter(DraftModelDrafter(draft, 8), theory.CostCurve([1, 2, 3, 4, 5], [10, 10.5, 11, 11.5, 30]),
                            1.5, alpha_prior=0.6, prior_weight=1.0, decay=0.8)


def test_auto_gamma_goodness_of_fit_and_gamma_varies(pair):
    target, draft = memo(*pair)
    drafter = _auto(draft)
    generate(target, PROMPT, drafter=drafter, gamma=3, max_new_tokens=60, sampling=T1,
             generator=torch.Generator().manual_seed(0))
    assert {1, 3} <= set(drafter.gammas)  # the choice really follows α̂
    cfg = SamplingConfig(0.8, top_k=4)
    assert gof_test(_samples(target, _auto(draft), cfg, N, seed=14), _exact(target, cfg))[1] > LEVEL


def test_auto_gamma_estimates_alpha_from_its_own_blocks():
    class Fixed:
        name = "fixed"

        def __init__(self):
            self.blocks = [torch.tensor([4, 4, 4]), torch.tensor([5, 5, 5])]

        def reset(self):
            pass

        def propose(self, ids, gamma, sampling, generator):
            return Proposal(self.blocks.pop(0)[:gamma], None)

    flat = theory.CostCurve([1, 2], [10.0, 10.0])
    d = AutoGammaDrafter(Fixed(), flat, 0.0, alpha_prior=0.5, prior_weight=2.0, decay=1.0)
    ids = torch.tensor([1, 2])
    assert d.alpha_hat == 0.5
    d.propose(ids, 3, T1, None)  # free draft, flat verification: the longest γ
    assert d.gammas == [3]
    d.feedback(3, 1)  # 1 accepted, rejected at the 2nd
    assert d.alpha_hat == pytest.approx((1 + 2 * 0.5) / (2 + 2))
    with pytest.raises(ValueError, match="decay"):
        AutoGammaDrafter(Fixed(), flat, 0.0, decay=0.0)
    with pytest.raises(ValueError, match="positive"):
        AutoGammaDrafter(Fixed(), theory.CostCurve([1, 2], [0.0, 0.0]), 0.0)
    # a noisy curve whose last measured segment falls (as tiny models time under load): beyond it the cost stays
    # at the last point instead of falling towards negative costs, so the drafter is built and chooses
    falling = theory.CostCurve([1, 2, 3, 4], [1.9, 6.6, 4.0, 1.3])
    assert falling(4) == pytest.approx(1.3) and falling(9) == pytest.approx(1.3)
    assert theory.CostCurve([1, 2], [10.0, 12.0])(4) == pytest.approx(16.0)  # a rising slope is kept
    AutoGammaDrafter(Fixed(), falling, 1.2).propose(ids, 3, T1, None)


# ------------------------------------------------------------------------------- block length chosen token by token

def _adaptive(drafter, t_draft=0.3):
    # verification rising 2% per token and a cheap draft: the tiny draft's confidences (about 0.1-0.4 over 8
    # tokens) then end blocks anywhere from 1 to 4 tokens at T = 1
    return AdaptiveLengthDrafter(drafter, theory.CostCurve([1, 2, 3, 4, 5], [10, 10.2, 10.4, 10.6, 10.8]), t_draft)


def test_adaptive_length_goodness_of_fit_and_the_length_varies(pair):
    """The block stops where the draft's calibrated confidence stops paying: lengths vary, the target's distribution
    is kept (T = 1 and T = 0.8 / top-k, draft model and pruned head), and a rule that peeks at the token after the
    stop - drafting it, then dropping it when the draft is unsure of it - fails the same test."""
    target, draft = memo(*pair)
    drafter = _adaptive(DraftModelDrafter(draft, 8))
    generate(target, PROMPT, drafter=drafter, gamma=4, max_new_tokens=60, sampling=T1,
             generator=torch.Generator().manual_seed(0))
    assert min(drafter.gammas[:-1]) < 4 and max(drafter.gammas) == 4
    exact = _exact(target, T1)
    assert gof_test(_samples(target, _adaptive(DraftModelDrafter(draft, 8)), T1, N, seed=15, gamma=4),
                    exact)[1] > LEVEL
    cfg = SamplingConfig(0.8, top_k=4)
    assert gof_test(_samples(target, _adaptive(PrunedHeadDrafter(draft, KEPT, 8)), cfg, N, seed=16, gamma=4),
                    _exact(target, cfg))[1] > LEVEL

    class PeeksAhead(DraftModelDrafter):
        """Negative control: drafts one token, keeps it only when the draft is sure of it (a stop that looks at
        the token it stops before)."""

        def propose(self, ids, gamma, sampling, generator):
            prop = super().propose(ids, 1, sampling, generator)
            with torch.inference_mode():
                logits = self.model(input_ids=ids[None]).logits[0, -1]
            if float(torch.softmax(logits, -1)[prop.tokens[0]]) < 0.3:
                return Proposal(prop.tokens[:0], prop.probs[:0])
            return prop

    assert gof_test(_samples(target, PeeksAhead(draft, 8), T1, N_CONTROL, seed=15, gamma=1), exact)[1] < LEVEL


def test_adaptive_length_follows_the_costs_and_calibrates_from_its_blocks(pair):
    target, draft = pair
    ids = torch.tensor([1, 5, 2, 7])
    free = AdaptiveLengthDrafter(DraftModelDrafter(draft, 8), theory.CostCurve([1, 2], [10.0, 10.0]), 0.0)
    assert free.propose(ids, 6, T1, torch.Generator().manual_seed(0)).tokens.numel() == 6  # a free draft: all γ
    dear = _adaptive(DraftModelDrafter(draft, 8), t_draft=1000.0)
    assert dear.propose(ids, 6, T1, torch.Generator().manual_seed(0)).tokens.numel() == 1  # never worth a 2nd
    # calibration: the first two tokens of a block accepted, the third rejected
    d = AdaptiveLengthDrafter(DraftModelDrafter(draft, 8), theory.CostCurve([1, 2], [10.0, 10.0]), 0.0, decay=1.0)
    before = [d.acceptance(c) for c in (0.05, 0.95)]
    assert before == pytest.approx([0.05, 0.95]) and d.alpha_hat == pytest.approx(0.8)
    block = d.propose(ids, 3, T1, torch.Generator().manual_seed(1)).tokens
    assert block.numel() == 3
    bins = d._last[1]
    d.feedback(3, 2)
    assert float(d._reached.sum()) == 3 and float(d._acc.sum()) == 2
    assert float(d._acc[bins[0]]) >= 1 and float(d._reached[bins[2]]) >= 1
    assert d.alpha_hat == pytest.approx((2 + 4 * 0.8) / (3 + 4))
    # a bin nothing fell in borrows the pooled calibration curve fitted over all bins
    empty = next(b for b in range(10) if float(d._reached[b]) == 0)
    assert d.acceptance((empty + 0.5) / 10) == pytest.approx(float(d._pooled((empty + 0.5) / 10)))
    # λ: the observed step's tokens (2 accepted + 1) over its modelled cost, beside the prior pseudo-steps
    costs = d._costs
    prior = max(float(theory.expected_tokens(0.8, g)) / costs[g] for g in range(len(costs)))
    assert d.rate == pytest.approx((3 + 4 * prior * costs[1]) / (costs[3] + 4 * costs[1]))
    # a draft that proves under-confident (every token accepted, whatever its confidence) bends the pooled curve up
    u = AdaptiveLengthDrafter(DraftModelDrafter(draft, 8), theory.CostCurve([1, 2], [10.0, 10.0]), 0.0)
    u._acc += 20.0
    u._reached += 20.0
    u._fit_platt()
    assert all(float(u._pooled(c)) > c + 0.1 for c in (0.2, 0.5, 0.8))
    # a noisy cost curve that dips is made non-decreasing: no drafted token looks free
    dip = AdaptiveLengthDrafter(DraftModelDrafter(draft, 8), theory.CostCurve([1, 2, 3, 4], [10, 12, 9, 13]), 0.5)
    assert all(b - a >= 0.5 for a, b in zip(dip._costs[:-1], dip._costs[1:]))
    kept = AdaptiveLengthDrafter(DraftModelDrafter(draft, 8), theory.CostCurve([1, 2], [10.0, 10.0]), 0.0,
                                 keep_calibration=True)
    kept._reached += d._reached
    kept.reset()  # a new sequence: the calibration carries over
    assert float(kept._reached.sum()) == 3 and kept.gammas == []
    d.reset()
    assert float(d._reached.sum()) == 0 and d.gammas == []
    # greedy: every emitted token is the target's argmax
    ar = generate(target, ids, max_new_tokens=24).tokens
    for drafter in (_adaptive(DraftModelDrafter(draft, 8)), _adaptive(PrunedHeadDrafter(draft, KEPT, 8))):
        assert generate(target, ids, drafter=drafter, gamma=5, max_new_tokens=24).tokens == ar
    for bad in ({"bins": 0}, {"decay": 0.0}, {"prior_weight": 0.0}, {"alpha_prior": 1.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            AdaptiveLengthDrafter(DraftModelDrafter(draft, 8), theory.CostCurve([1, 2], [10.0, 10.0]), 0.0, **bad)
    with pytest.raises(ValueError, match="dynamic draft length"):
        AdaptiveLengthDrafter(PromptLookupDrafter(), theory.CostCurve([1, 2], [10.0, 10.0]), 0.0)


# ------------------------------------------------------------------------------------------ greedy equality with AR

def test_greedy_equals_ar_for_every_cheap_drafter(pair):
    target, draft = pair
    prompt = torch.tensor([3, 1, 4, 1, 5, 2, 6])
    ar = generate(target, prompt, max_new_tokens=24).tokens
    drafters = [DraftModelDrafter(quantize_draft(draft), 8), PrunedHeadDrafter(draft, KEPT, 8),
                PrunedHeadDrafter(quantize_draft(draft, skip_lm_head=True), KEPT, 8,
                                  head=quantize_linear(pruned_head(draft, KEPT))),
                HybridDrafter(PromptLookupDrafter(3, 1), DraftModelDrafter(draft, 8)),
                HybridDrafter(PromptLookupDrafter(3, 1), _adaptive(DraftModelDrafter(draft, 8)), lookup_max_gamma=2),
                _auto(draft), _auto(target)]
    for drafter in drafters:
        for gamma in (1, 4):
            out = generate(target, prompt, drafter=drafter, gamma=gamma, max_new_tokens=24)
            assert out.tokens == ar, (drafter.name, gamma)


# ----------------------------------------------------------------------------------------------------------- theory

def test_free_draft_bound_and_the_decomposition():
    curve = theory.CostCurve([1, 2, 4, 8], [100.0, 110.0, 160.0, 200.0])
    for alpha in (0.0, 0.5, 0.89, 1.0):
        for gamma in (1, 3, 4, 7):
            bound = theory.free_draft_bound(alpha, gamma, curve)
            assert bound == pytest.approx(theory.expected_tokens(alpha, gamma) * 100.0 / curve(gamma + 1))
            assert bound >= theory.hardware_aware_speedup(alpha, gamma, curve, lambda n: 39.0)
            d = theory.speedup_decomposition(alpha, gamma, curve, lambda n: 39.0, overhead_ms=5.0)
            assert d["tokens_per_step"] >= d["free_draft"] >= d["hardware_aware"] >= d["with_overhead"]
    flat = theory.CostCurve.constant_ratio(1.0, 100.0)
    assert theory.free_draft_bound(0.8, 4, flat) == pytest.approx(theory.expected_tokens(0.8, 4))
    # the targets' worked example: α = 0.89, verification of 5 tokens 1.28x a one-token step -> about 3x at γ = 4
    assert theory.free_draft_bound(0.89, 4, theory.CostCurve([1, 5], [1.0, 1.28])) == pytest.approx(3.14, abs=0.01)
    with pytest.raises(ValueError):
        theory.free_draft_bound(1.5, 4, curve)


def test_gamma_for_step_agrees_with_the_hardware_aware_optimum():
    curve = theory.CostCurve([1, 2, 3, 4, 8, 16], [229, 243, 250, 466, 643, 773])
    costs = theory.step_costs_ms(curve, lambda n: 44.0, 12)
    assert costs[0] == pytest.approx(229) and costs[3] == pytest.approx(466 + 3 * 44)
    for alpha in (0.1, 0.5, 0.7, 0.89, 0.97, 1.0):
        assert theory.gamma_for_step(alpha, costs) == theory.optimal_gamma_hardware(alpha, curve, lambda n: 44.0, 12)
    assert theory.gamma_for_step(0.0, costs) == 1 and theory.gamma_for_step(0.0, costs, min_gamma=0) == 0
    with pytest.raises(ValueError):
        theory.step_costs_ms(curve, -1.0, 4)
    with pytest.raises(ValueError):
        theory.gamma_for_step(0.5, costs, min_gamma=13)


# ----------------------------------------------------------------------------------------------------- bench methods

NEW_METHODS = ("sd-draft-int8,sd-draft-pruned,sd-draft-int8-pruned,sd-hybrid,sd-draft-auto@2,sd-draft-dynamic@3,"
               "sd-draft-adaptive@3,sd-draft-adaptive-int8@3,hf-assisted-int8-gamma,hf-assisted-int8-pruned,"
               "sd-draft-int4,sd-draft-int4-pruned,sd-draft-adaptive-int4@3,hf-assisted-int4,sd-hybrid-adaptive@3")


@pytest.mark.parametrize("options, message", [
    ({"draft_vocab": "0"}, "draft_vocab"),
    ({"draft_vocab": "lots"}, "draft_vocab"),
    ({"int8_backend": "int4"}, "int8_backend"),
    ({"int4_group_size": "48"}, "int4_group_size"),
    ({"int4_group_size": "many"}, "int4_group_size"),
    ({"draft_kind": "fp16"}, "draft_kind"),
    ({"hybrid_min_ngram": "4"}, "hybrid_min_ngram"),
    ({"hybrid_min_ngram": "0"}, "hybrid_min_ngram"),
])
def test_cheap_draft_options_are_checked_before_models_load(options, message):
    from specrepro.bench import BenchOptionError, validate_options

    with pytest.raises(BenchOptionError, match=message):
        validate_options(methods=NEW_METHODS.split(","), gamma=3, n_prompts=1, max_new_tokens=4, temperature=0.0,
                         top_p=1.0, top_k=0, repeats=1, device="cpu", options=options)
    with pytest.raises(BenchOptionError, match="sd-draft-auto@x"):
        validate_options(methods=["sd-draft-auto@x"], gamma=3, n_prompts=1, max_new_tokens=4, temperature=0.0,
                         top_p=1.0, top_k=0, repeats=1, device="cpu")
    with pytest.raises(BenchOptionError, match="only used by"):  # an option none of the chosen methods reads
        validate_options(methods=["sd-draft-int8"], gamma=3, n_prompts=1, max_new_tokens=4, temperature=0.0,
                         top_p=1.0, top_k=0, repeats=1, device="cpu", options={"draft_vocab": "100"})


def test_cheap_draft_methods_equal_ar_in_the_bench(tmp_path, monkeypatch):
    """Greedy: every new method's tokens equal our AR's on a random llama with SmolLM2's tokenizer (49152 tokens), the
    methods that take a draft_kind drafting with the int8 pruned draft; the FR-Spec counts come from two small
    stdlib files (the real corpus takes tens of seconds to tokenize)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specrepro.bench import run_bench
    from specrepro.models import load_tokenizer

    tok = load_tokenizer("smollm2-135m")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             eos_token_id=tok.eos_token_id)).eval().requires_grad_(False)
    stdlib = compress.stdlib_sources()
    monkeypatch.setattr(compress, "stdlib_sources",
                        lambda root=None: [f for f in stdlib if f.name in ("bisect.py", "keyword.py")])
    monkeypatch.setenv("SPECREPRO_CACHE", str(tmp_path))
    res = run_bench(models=(model, model, tok), prompts=["def f(x):\n    return x", "x = [1, 2]\ny = [1, 2"],
                    methods=NEW_METHODS, max_new_tokens=6, gamma=2, warmup=False, progress=False,
                    options={"draft_vocab": "2000", "draft_kind": "int8-pruned", "draft_stop": "0.01"},
                    json_path=tmp_path / "b.json")
    assert res.runs["equal_to_baseline"].all(), res.runs[["method", "prompt", "token_ids"]]
    # the methods whose draft the option chose are recorded under the names that fix it (sd-draft-adaptive@3 ->
    # sd-draft-adaptive-int8-pruned@3): a name is the method's whole configuration
    from specrepro.bench.registry import canonical_method

    named = {canonical_method(m, {"draft_kind": "int8-pruned"}) for m in NEW_METHODS.split(",")}
    assert "sd-draft-adaptive-int8-pruned@3" in named and "sd-draft-adaptive@3" not in named
    assert set(res.runs["method"]) == {"ar", *named}
    assert (res.runs["new_tokens"] == 6).all()
    assert list((tmp_path / "fr_spec").glob("*.safetensors"))  # the kept vocabulary came from the (small) corpus


def test_measure_alpha_knows_the_new_drafters(pair):
    target, draft = pair
    ids = torch.tensor([1, 5, 2, 7, 1, 5, 2, 3, 4])
    model = measure_alpha(target, DraftModelDrafter(draft, 8), ids, 4, T1)
    auto = measure_alpha(target, _auto(draft), ids, 4, T1)
    assert auto == model  # α does not depend on the draft length
    lookup = PromptLookupDrafter(3, 2)
    hybrid = measure_alpha(target, HybridDrafter(lookup, DraftModelDrafter(draft, 8)), ids, 4, T1)
    with torch.inference_mode():
        p = torch.softmax(target(input_ids=ids[None]).logits[0, 3:-1], -1)
    for i, t in enumerate(range(4, ids.numel())):
        prop = lookup.propose(ids[:t], 1, T1, None)
        expected = float(p[i, int(prop.tokens[0])]) if prop.tokens.numel() else model[i]
        assert hybrid[i] == pytest.approx(expected, abs=1e-6)
    assert hybrid != model  # the lookup proposed somewhere (after "1 5" comes "2")
    # one target forward shared by every drafter (alpha_table) scores exactly as a forward per drafter
    shared = target_probs_along(target, ids, 4, T1)
    hybrid_drafter = HybridDrafter(lookup, DraftModelDrafter(draft, 8))
    for drafter, terms in ((DraftModelDrafter(draft, 8), model), (hybrid_drafter, hybrid)):
        assert measure_alpha(target, drafter, ids, 4, T1, target_probs=shared) == terms
    with pytest.raises(ValueError, match="rows"):
        measure_alpha(target, DraftModelDrafter(draft, 8), ids, 3, T1, target_probs=shared)


def test_measure_chain_costs_times_every_point_and_drafter_under_the_runs_sampling(monkeypatch):
    """The shared cost measurement of the bench and sd-draft-auto: one curve point per n, one cost per drafter, the
    drafter timed under the sampling it is given (not always greedy), bad sizes refused."""
    import specrepro.measure.cost as cd

    model = tiny_lm(vocab=16)
    seen = []

    class Spy(DraftModelDrafter):
        def propose(self, ids, gamma, sampling, generator):
            seen.append(sampling)
            return super().propose(ids, gamma, sampling, generator)

    nucleus = SamplingConfig(0.8, top_p=0.95)
    gen = torch.Generator().manual_seed(0)
    curve, draft_ms = cd.measure_chain_costs(model, {"a": Spy(model, 16), "b": DraftModelDrafter(model, 16)},
                                             ns=range(1, 4), vocab=16, prefix_len=8, repeats=2, rounds=3,
                                             generator=gen, sampling=nucleus)
    assert list(curve.n) == [1, 2, 3] and all(v > 0 for v in curve.ms)
    assert set(draft_ms) == {"a", "b"} and all(v > 0 for v in draft_ms.values())
    assert seen and all(s is nucleus for s in seen)  # all under nucleus:
    assert len(seen) == 3 * (1 + 10 + 2)  # 3 rounds x (the prefill, 10 warm-up calls, 2 timed calls)
    for bad in ({"rounds": 0}, {"repeats": 0}, {"ns": []}):
        kw = dict(ns=range(1, 3), vocab=16, prefix_len=8, repeats=1, rounds=1) | bad
        with pytest.raises(ValueError, match="measure_chain_costs"):
            cd.measure_chain_costs(model, {}, **kw)


@pytest.mark.parametrize("cfg, prompt, n", [(T1, PROMPT, N), (SamplingConfig(0.9, top_p=0.95), PROMPT, N),
                                            (SamplingConfig(0.8, top_k=4), PROMPT, N),
                                            (T1, torch.tensor([1, 5, 2, 7, 1, 5]), N_HYBRID)])
def test_gof_tests_here_have_power(pair, cfg, prompt, n):
    """Each goodness-of-fit test of this file detects a deviation of TV 0.1 from the target with 90% power at its n
    (a random-tilt direction, as the battery's power table measures it)."""
    from specrepro.stats import min_detectable_tv

    assert min_detectable_tv(_exact(pair[0], cfg, prompt), n, LEVEL, 0.9, 300, 0) <= 0.1
