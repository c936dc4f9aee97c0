"""End-to-end exactness of the decoding loop on tiny random transformers (part b/c of the battery), the loop's
contract (EOS, max_new_tokens, errors), and greedy equality with AR.

Goodness-of-fit: sequences of 3 new tokens sampled end to end by `generate` (real KV caches, rollback, the draft
model's own cache) against the target's exact 3-token distribution, computed by enumerating every prefix with the
target. Chi-square with sparse bins pooled, significance level 1e-3 per test; 4 real-rule tests (3 sampling settings
with a fixed draft length, 1 with the dynamic draft length), so a correct loop fails one with probability <= 0.4 % for
a random seed (seeds are fixed here). Negative controls must fail. The tiny models run behind conftest.memo: each
distinct forward pass runs once and is replayed bit for bit afterwards (the same samples, several times faster).
"""

import functools

import pytest
import torch
from conftest import LEVEL, PROMPT, memo, tiny_lm

from specrepro.core import decoding
from specrepro.core.decoding import generate
from specrepro.core.sampling import SamplingConfig
from specrepro.drafters.base import Proposal
from specrepro.drafters.lookup import NGramDrafter, PromptLookupDrafter
from specrepro.drafters.model import DraftModelDrafter
from specrepro.sim.exact import RULES, exact_chain_distribution, target_distribution
from specrepro.sim.toy import ToyLM
from specrepro.stats import gof_test, rejection_rate

N = 1500
N_CONTROL = 600  # a negative control's n where the test's power against it (simulated from its exact law) is ~1
LENGTH = 3
CONFIGS = {
    "T=1": SamplingConfig(1.0),
    "T=0.8,top-k=4": SamplingConfig(0.8, top_k=4),
    "T=1.2,top-p=0.8": SamplingConfig(1.2, top_p=0.8),
}




def _run(target, drafter, cfg, n, seed, gamma=3):
    g = torch.Generator().manual_seed(seed)
    return [tuple(generate(target, PROMPT, drafter=drafter, gamma=gamma, max_new_tokens=LENGTH, sampling=cfg,
                           generator=g).tokens) for _ in range(n)]


@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_end_to_end_goodness_of_fit(pair, cfg):
    target, draft = memo(*pair)
    exact = target_distribution(ToyLM.from_transformer(target, PROMPT), CONFIGS[cfg], LENGTH)
    samples = _run(target, DraftModelDrafter(draft, 8), CONFIGS[cfg], N, seed=5)
    _, pval = gof_test(samples, exact)
    assert pval > LEVEL


def test_dynamic_draft_length_goodness_of_fit(pair):
    """Stopping the draft at an unsure token (DraftModelDrafter(stop_below=...)) keeps the target distribution."""
    target, draft = memo(*pair)
    cfg = CONFIGS["T=1"]
    drafter = DraftModelDrafter(draft, 8, stop_below=0.15)
    probe = generate(target, PROMPT, drafter=drafter, gamma=4, max_new_tokens=40, sampling=cfg,
                     generator=torch.Generator().manual_seed(0))
    assert min(probe.drafted[:-1]) < 4 and max(probe.drafted) == 4  # it really varies the draft length
    exact = target_distribution(ToyLM.from_transformer(target, PROMPT), cfg, LENGTH)
    samples = _run(target, drafter, cfg, N, seed=6, gamma=4)
    assert gof_test(samples, exact)[1] > LEVEL


def test_dynamic_draft_length_refuses_bad_threshold(pair):
    _, draft = pair
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(ValueError, match="stop_below"):
            DraftModelDrafter(draft, 8, stop_below=bad)


class RawQDrafter(DraftModelDrafter):
    """Negative control: samples from the processed q but reports the raw softmax as q (the bug of transformers#47932)."""

    def propose(self, ids, gamma, sampling, generator):
        prop = super().propose(ids, gamma, sampling, generator)
        raw = []
        for i in range(prop.tokens.numel()):
            ctx = torch.cat([ids, prop.tokens[:i]])
            raw.append(torch.softmax(self.model(input_ids=ctx[None]).logits[0, -1].float(), -1))
        return Proposal(prop.tokens, torch.stack(raw))


def _control_power(pair, cfg, rule, n):
    """The test's power at ``n`` samples against the mistake ``rule`` (its exact law by enumeration on these models):
    the rejection rate of 300 simulated experiments drawn from that law."""
    toy_t, toy_d = (ToyLM.from_transformer(m, PROMPT) for m in pair)
    exact = target_distribution(toy_t, cfg, LENGTH)
    return rejection_rate(exact, n, LEVEL, 300, 0, exact_chain_distribution(toy_t, toy_d, cfg, 3, LENGTH, rule=rule))


def test_negative_control_raw_q_fails(pair):
    """n = 600, not the exact tests' N: the raw-q law (TV ~0.19 from the target here) is rejected at 600 in every
    simulated experiment, so the loop's run needs no more."""
    target, draft = memo(*pair)
    cfg = CONFIGS["T=0.8,top-k=4"]
    assert _control_power(pair, cfg, "raw_q", N_CONTROL) >= 0.99
    exact = target_distribution(ToyLM.from_transformer(target, PROMPT), cfg, LENGTH)
    samples = _run(target, RawQDrafter(draft, 8), cfg, N_CONTROL, seed=5)
    assert gof_test(samples, exact)[1] < LEVEL


def test_negative_control_no_residual_fails(pair, monkeypatch):
    """The no-residual law is closer (TV ~0.13): it takes the exact tests' N for power ~0.98."""
    target, draft = memo(*pair)
    cfg = CONFIGS["T=1"]
    assert _control_power(pair, cfg, "no_residual", N) >= 0.95
    wrong = functools.partial(decoding.verify_chain, residual_fn=RULES["no_residual"].residual)
    monkeypatch.setattr(decoding, "verify_chain", wrong)
    exact = target_distribution(ToyLM.from_transformer(target, PROMPT), cfg, LENGTH)
    samples = _run(target, DraftModelDrafter(draft, 8), cfg, N, seed=5)
    assert gof_test(samples, exact)[1] < LEVEL


# --- the loop's contract -------------------------------------------------------------------------------------------

def test_greedy_speculative_equals_ar_on_tiny_models(pair):
    target, draft = pair
    prompt = torch.tensor([3, 1, 4, 1, 5, 2, 6])
    ar = generate(target, prompt, max_new_tokens=40).tokens
    corpus = [prompt.tolist() + ar]
    for drafter in (DraftModelDrafter(draft, 8), PromptLookupDrafter(), NGramDrafter(corpus, 8, 2),
                    DraftModelDrafter(target, 8), DraftModelDrafter(draft, 8, stop_below=0.5)):
        for gamma in (1, 2, 5):
            out = generate(target, prompt, drafter=drafter, gamma=gamma, max_new_tokens=40)
            assert out.tokens == ar, (drafter.name, gamma)


def test_self_draft_accepts_everything(pair):
    target, _ = pair
    out = generate(target, PROMPT, drafter=DraftModelDrafter(target, 8), gamma=4, max_new_tokens=20,
                   sampling=SamplingConfig(1.0), generator=torch.Generator().manual_seed(0))
    assert out.accepted[:3] == [4, 4, 4] and out.alpha == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_max_new_tokens_and_eos_are_exact(pair, gamma):
    target, draft = pair
    for limit in (1, 2, 5, 9):
        out = generate(target, PROMPT, drafter=DraftModelDrafter(draft, 8), gamma=gamma, max_new_tokens=limit,
                       sampling=SamplingConfig(1.0), generator=torch.Generator().manual_seed(limit))
        assert len(out.tokens) == limit
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        out = generate(target, PROMPT, drafter=DraftModelDrafter(draft, 8), gamma=gamma, max_new_tokens=30,
                       sampling=SamplingConfig(1.0), generator=g, eos_token_id=3)
        if 3 in out.tokens:
            assert out.tokens.index(3) == len(out.tokens) - 1 and out.stopped_at_eos
        else:
            assert len(out.tokens) == 30


def test_bad_input_is_refused(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="gamma"):
        generate(target, PROMPT, drafter=DraftModelDrafter(draft, 8), gamma=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(target, PROMPT, max_new_tokens=0)
    with pytest.raises(ValueError, match="empty prompt"):
        generate(target, torch.tensor([], dtype=torch.long))
    with pytest.raises(ValueError, match="Generator"):
        generate(target, PROMPT, sampling=SamplingConfig(1.0))


def test_metrics_are_consistent(pair):
    target, draft = pair
    out = generate(target, PROMPT, drafter=DraftModelDrafter(draft, 8), gamma=3, max_new_tokens=30,
                   sampling=SamplingConfig(1.0), generator=torch.Generator().manual_seed(0))
    assert sum(out.accepted) + out.n_steps >= len(out.tokens)  # truncation at the limit may drop tokens
    assert 0 <= out.alpha <= 1 and len(out.per_position_acceptance(3)) == 3
    assert set(out.times) >= {"prefill", "draft", "target", "verify", "total"}
    assert out.forward_sizes and all(1 <= s <= 4 for s in out.forward_sizes)


def test_a_batch_is_refused_and_one_row_is_one_prompt(pair):
    target, draft = pair
    flat = generate(target, PROMPT, max_new_tokens=6).tokens
    assert generate(target, PROMPT[None], max_new_tokens=6).tokens == flat
    for bad in (PROMPT.repeat(2, 1), PROMPT.reshape(1, 1, -1).repeat(2, 1, 1)):
        with pytest.raises(ValueError, match="batches are not supported"):
            generate(target, bad, drafter=DraftModelDrafter(draft, 8), max_new_tokens=6)


# --- EOS default, seed, devices ------------------------------------------------------------------------------------

def test_eos_defaults_to_the_generation_config(pair, monkeypatch):
    target, draft = pair
    free = generate(target, PROMPT, max_new_tokens=30).tokens
    assert target.generation_config.eos_token_id is None  # tiny_random_lm clears it: simulations never stop early
    stop = free[3]
    first = free.index(stop)
    monkeypatch.setattr(target.generation_config, "eos_token_id", [stop])
    assert decoding.default_eos_ids(target) == [stop]
    other = (stop + 1) % 8
    assert decoding.default_eos_ids(target, type("Tok", (), {"eos_token_id": other})()) == [stop, other]
    assert decoding.default_eos_ids(target, type("Tok", (), {"eos_token_id": stop})()) == [stop]
    for drafter in (None, DraftModelDrafter(draft, 8)):
        out = generate(target, PROMPT, drafter=drafter, max_new_tokens=30)
        assert out.tokens == free[: first + 1] and out.stopped_at_eos
        assert decoding.speculative(target, DraftModelDrafter(draft, 8), PROMPT, max_new_tokens=30).tokens == \
            free[: first + 1]
        for none in (None, ()):  # explicitly no EOS stop
            assert generate(target, PROMPT, drafter=drafter, max_new_tokens=30, eos_token_id=none).tokens == free
    assert decoding.autoregressive(target, PROMPT, max_new_tokens=30).tokens == free[: first + 1]


def test_seed_is_an_alternative_to_a_generator(pair):
    target, draft = pair
    cfg = SamplingConfig(1.0)
    a = generate(target, PROMPT, drafter=DraftModelDrafter(draft, 8), max_new_tokens=12, sampling=cfg, seed=11)
    b = generate(target, PROMPT, drafter=DraftModelDrafter(draft, 8), max_new_tokens=12, sampling=cfg,
                 generator=torch.Generator().manual_seed(11))
    assert a.tokens == b.tokens
    with pytest.raises(ValueError, match="either generator= or seed="):
        generate(target, PROMPT, sampling=cfg, seed=1, generator=torch.Generator())
    with pytest.raises(ValueError, match="seed must be an integer"):
        generate(target, PROMPT, sampling=cfg, seed=1.5)


def test_draws_are_made_on_the_generators_device():
    """sample / uniform draw on the generator's device (a CPU generator with CUDA probabilities must work) and leave
    the stream of a same-device generator unchanged."""
    from specrepro.core.sampling import rng_device, sample, uniform

    probs = torch.softmax(torch.randn(3, 8, generator=torch.Generator().manual_seed(0)), -1)
    assert sample(probs, torch.Generator().manual_seed(4)).tolist() == \
        torch.multinomial(probs, 2, replacement=True, generator=torch.Generator().manual_seed(4))[:, 0].tolist()
    u = uniform(5, torch.Generator().manual_seed(4), device="cpu", dtype=torch.float64)
    assert u.dtype == torch.float64 and torch.equal(u, torch.rand(5, generator=torch.Generator().manual_seed(4),
                                                                  dtype=torch.float64))
    assert rng_device(None, "cpu") == torch.device("cpu")
    gen = torch.Generator()
    gen.manual_seed(0)
    assert rng_device(gen, "meta") == torch.device("cpu")  # the generator's device wins over the tensors'


def test_a_draft_in_another_dtype_is_verified_on_the_targets_terms(pair):
    """A float64 draft (its probabilities float64) against a float32 target: the loop runs, greedy equals AR, and
    sampling stays seeded."""
    import copy

    target, draft = pair
    draft64 = copy.deepcopy(draft).double()
    ar = generate(target, PROMPT, max_new_tokens=20).tokens
    assert generate(target, PROMPT, drafter=DraftModelDrafter(draft64, 8), gamma=3, max_new_tokens=20).tokens == ar
    cfg = SamplingConfig(1.0)
    runs = [generate(target, PROMPT, drafter=DraftModelDrafter(draft64, 8), gamma=3, max_new_tokens=12, sampling=cfg,
                     seed=3).tokens for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 12


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cpu_generator_and_cpu_draft_with_a_cuda_target(pair):
    import copy

    target, draft = pair
    cuda_target = copy.deepcopy(target).cuda()
    cfg = SamplingConfig(1.0)
    out = generate(cuda_target, PROMPT, drafter=DraftModelDrafter(draft, 8), gamma=3, max_new_tokens=12,
                   sampling=cfg, generator=torch.Generator().manual_seed(0))
    assert len(out.tokens) == 12
    greedy = generate(cuda_target, PROMPT, drafter=DraftModelDrafter(draft, 8), gamma=3, max_new_tokens=12)
    assert greedy.tokens == generate(target, PROMPT, max_new_tokens=12).tokens


# --- dynamic draft length ------------------------------------------------------------------------------------------

def test_dynamic_draft_length_acts_under_greedy_decoding(pair):
    """stop_below reads the draft's temperature-1 confidence, so it also shortens drafts at temperature 0 (where the
    processed q is one-hot and q(x) = 1 would never stop), and greedy outputs stay those of AR."""
    target, draft = pair
    prompt = torch.tensor([3, 1, 4, 1, 5, 2, 6])
    ar = generate(target, prompt, max_new_tokens=40).tokens
    fixed = generate(target, prompt, drafter=DraftModelDrafter(draft, 8), gamma=5, max_new_tokens=40)
    assert fixed.tokens == ar and fixed.drafted[:20] == [5] * 20
    lengths = set()
    for stop in (0.16, 0.2, 0.25):  # the tiny draft's greedy confidences here lie in 0.15..0.28
        out = generate(target, prompt, drafter=DraftModelDrafter(draft, 8, stop_below=stop), gamma=5,
                       max_new_tokens=40)
        assert out.tokens == ar, stop
        assert min(out.drafted[:20]) < 5, stop  # drafts stopped early (before: q(x) = 1 under greedy, never)
        lengths |= set(out.drafted)
    assert len(lengths) > 2  # the draft length really varies


# --- the target behind the BlockLM interface (specrepro.backends.hf.HFCausalLM) --------------------------------------

#: tokens and accepted counts of the loop before it drove transformers models through HFCausalLM (its own
#: DynamicCache, prefill, crop_cache), on the tiny pair, PROMPT, gamma 3, 24 new tokens: the adapter must not change
#: a single token or draw. (kind, sampling, seed) -> (tokens, accepted)
_BEFORE_ADAPTER = {
    ("ar", 0.0, None, None, None): ([4, 5, 3, 7] + [3] * 20, [0] * 24),
    ("draft", 0.0, None, None, None): ([4, 5, 3, 7] + [3] * 20, [1, 0, 1] + [0] * 19),
    ("ar", 1.0, None, 1.0, 2): ([6, 0, 5, 1, 3, 1, 3, 6, 5, 3, 6, 2, 4, 5, 2, 0, 1, 3, 3, 3, 3, 6, 0, 1], [0] * 24),
    ("draft", 1.0, None, 1.0, 0): ([7, 4, 3, 3, 7, 3, 3, 3, 7, 3, 5, 3, 7, 4, 0, 3, 7, 3, 2, 5, 2, 4, 4, 4],
                                   [2, 2, 0, 0, 1, 1, 3, 1, 3, 1]),
    ("draft", 0.8, 4, 1.0, 1): ([3, 3, 7, 3, 6, 0, 0, 0, 1, 2, 3, 7, 3, 3, 6, 0, 4, 2, 4, 2, 0, 3, 3, 2],
                                [0, 0, 1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 1, 1, 3, 0]),
    ("lookup", 1.2, None, 0.8, 3): ([0, 3, 7, 4, 7, 4, 4, 4, 2, 7, 3, 0, 0, 3, 2, 6, 0, 1, 5, 3, 2, 3, 7, 5],
                                    [0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0]),
}


@pytest.mark.parametrize("case", list(_BEFORE_ADAPTER), ids=lambda c: f"{c[0]}-T{c[1]}-k{c[2]}-p{c[3]}-seed{c[4]}")
def test_the_adapter_keeps_every_token_and_draw_of_the_loop_before_it(pair, case):
    """generate(model) (wrapped automatically) and generate(HFCausalLM(model)) give, bit for bit, the tokens and
    acceptances the loop gave when it managed the transformers cache itself (greedy and seeded sampling)."""
    from specrepro.backends.hf import HFCausalLM

    target, draft = pair
    kind, temperature, top_k, top_p, seed = case
    cfg = SamplingConfig(temperature, top_k=top_k, top_p=top_p if top_p is not None else 1.0)
    for tgt in (target, HFCausalLM(target)):
        drafter = {"ar": None, "draft": DraftModelDrafter(draft, 8), "lookup": PromptLookupDrafter()}[kind]
        out = generate(tgt, PROMPT, drafter=drafter, gamma=3, max_new_tokens=24, sampling=cfg, seed=seed)
        assert (out.tokens, out.accepted) == _BEFORE_ADAPTER[case]


def test_the_adapter_is_a_blocklm_over_the_models_own_cache(pair):
    """HFCausalLM.forward_block returns the model's own KV-cached logits (same dtype and device, no copy), keeps
    the last k rows, computes none for a prefill; truncate drops positions as DynamicCache.crop does."""
    from transformers import DynamicCache

    from specrepro.backends.hf import HFCausalLM
    from specrepro.core.blocklm import BlockLM

    target, _ = pair
    lm = HFCausalLM(target)
    assert isinstance(lm, BlockLM) and lm.vocab_size == 8 and lm.device == target.device
    seq = torch.tensor([3, 1, 4, 1, 5, 2, 6])
    cache = DynamicCache(config=target.config)
    with torch.inference_mode():
        ref = target(input_ids=seq[None, :4], past_key_values=cache, use_cache=True, logits_to_keep=4).logits[0]
        ref2 = target(input_ids=seq[None, 4:], past_key_values=cache, use_cache=True, logits_to_keep=2).logits[0]
    lm.reset()
    got = lm.forward_block(seq[:4])
    assert got.dtype == ref.dtype and torch.equal(got, ref) and len(lm) == 4
    assert torch.equal(lm.forward_block(seq[4:].tolist(), logits_to_keep=2), ref2) and len(lm) == 7
    lm.truncate(4)
    lm.truncate(9)  # no-op: the cache is shorter
    assert len(lm) == 4 and torch.equal(lm.forward_block(seq[4:], logits_to_keep=2), ref2)
    lm.reset()
    assert lm.forward_block(seq[:5], logits_to_keep=0).shape == (0, 8) and len(lm) == 5
    with pytest.raises(ValueError):
        lm.truncate(-1)
    with pytest.raises(ValueError):
        lm.forward_block([])


class _ScriptedLM:
    """A BlockLM whose logits rows are scripted: row k of ``rows`` for the k-th position it scores (cycling)."""

    def __init__(self, rows: torch.Tensor):
        self.rows, self.vocab_size, self.n = rows, rows.shape[1], 0

    def reset(self):
        self.n = 0

    def truncate(self, length):
        pass

    def forward_block(self, token_ids, logits_to_keep=None):
        keep = len(token_ids) if logits_to_keep is None else logits_to_keep
        out = self.rows[[(self.n + i) % len(self.rows) for i in range(keep)]]
        self.n += keep
        return out


def test_a_greedy_ar_step_is_the_argmax_and_refuses_nan_logits():
    """Greedy AR takes the argmax of each row (ties: the first, as the one-hot row of logits_to_probs and a draw
    from it give) without building a V-wide row, and NaN logits still raise, greedy or not."""
    rows = torch.tensor([[0.0, 3.0, 3.0, -1.0], [5.0, 1.0, 2.0, 7.0], [-2.0, -1.0, -3.0, -4.0]])
    out = generate(_ScriptedLM(rows), [0, 1], drafter=None, max_new_tokens=6, sampling=SamplingConfig(0.0),
                   eos_token_id=())
    assert out.tokens == [1, 3, 1, 1, 3, 1]
    nan = rows.clone()
    nan[1, 2] = float("nan")
    for cfg in (SamplingConfig(0.0), SamplingConfig(1.0)):
        with pytest.raises(ValueError, match="NaN in logits"):
            generate(_ScriptedLM(nan), [0, 1], drafter=None, max_new_tokens=4, sampling=cfg, seed=0,
                     eos_token_id=())
