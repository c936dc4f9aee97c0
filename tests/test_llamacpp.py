"""Our exact verifiers on llama.cpp's kernels: the llama.cpp backend (specrepro.backends.llamacpp) under the
backend-neutral chain loop (specrepro.core.blocklm.chain_generate), on two tiny random GGUF checkpoints written by
the project (specrepro.backends.tinygguf; vocabulary 32, 2 layers, float32).

* the backend: block logits equal one-token-at-a-time logits (float tolerance); cutting the cache back and feeding
  again gives the logits of a fresh cache; errors.
* greedy: speculative decoding through the backend returns llama.cpp's own greedy tokens (AR through the same
  backend, one token per forward, and llama-cpp-python's ``Llama.generate`` at temperature 0), with drafts that are
  mostly rejected (another seed), partly accepted (the target's first layer) and always accepted (the target).
* exactness at T = 1: the first LENGTH = 3 tokens of speculative sampling through the backend (gamma 2: a block of 2
  draft tokens, then a second step after a rejection) against the target's exact joint law over 32^3 outcomes,
  enumerated from the target's llama.cpp logits; chi-square with sparse bins pooled (specrepro.stats.gof_test), level
  LEVEL = 1e-3, with two drafts: another seed (about 2 % of draft tokens accepted: the residual carries the law) and
  the target's first layer under its head (an early-exit draft, about 70 % accepted). Its power is stated and checked
  as the battery states it (docs/battery.md): at n = N = 2000 the test detects a total-variation deviation of
  TV_90 = 0.08 along a random tilt of the exact law with >= 90 % power (specrepro.stats.min_detectable_tv; 0.066
  measured). A negative control (every draft token of the early-exit draft accepted, through the project's own
  verify_chain with the acceptance probability replaced by 1; TV ~0.33 from the target's law) must fail at
  N_CONTROL = 400 samples, where the test's power against that control's exact law (enumerated the same way) is
  >= 0.99. Two exact tests at level 1e-3 with fixed seeds: deterministic outcomes.

Skipped, with the import error, only where llama_cpp cannot be imported (install: requirements-llamacpp.txt).
"""

from __future__ import annotations

import functools
import hashlib

import pytest
import torch

from specrepro.backends.llamacpp import LlamaCppLM, llama_cpp_available
from specrepro.backends.tinygguf import TinyShape, tiny_llama_gguf, write_tiny_llama_gguf
from specrepro.core.blocklm import BlockLM, chain_generate
from specrepro.core.sampling import SamplingConfig, verify_chain
from specrepro.sim.exact import Rule, exact_chain_distribution, target_distribution
from specrepro.sim.toy import ToyLM
from specrepro.stats import gof_test, min_detectable_tv, rejection_rate, total_variation

_OK, _WHY = llama_cpp_available()
pytestmark = [pytest.mark.skipif(not _OK, reason=f"llama_cpp does not import ({_WHY}); install it with the command "
                                                 "in requirements-llamacpp.txt"),
              # torch's intra-op threads spin against llama.cpp's OpenMP threads between decodes: one torch thread
              pytest.mark.usefixtures("one_thread")]

SHAPE = TinyShape()  # vocabulary 32, 2 layers, hidden 32, 4 heads (2 key/value heads), float32
TARGET_SEED, DRAFT_SEED = 1, 2
PROMPT = [5, 9, 17, 6]
LEVEL = 1e-3
T1 = SamplingConfig(1.0)
LENGTH, GAMMA = 3, 2  # the first step drafts min(GAMMA, LENGTH - 1) = 2 tokens; a second step follows a rejection
N = 2000
TV_90 = 0.08  # the deviation the test at n = N detects with >= 90 % power along a random tilt (0.066 measured)
N_CONTROL = 400


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny-gguf")


@pytest.fixture(scope="module")
def paths(gguf_dir):
    return {"target": tiny_llama_gguf(TARGET_SEED, SHAPE, gguf_dir), "draft": tiny_llama_gguf(DRAFT_SEED, SHAPE, gguf_dir),
            # the target's first layer and its head (same seed, one layer): an early-exit draft, often accepted
            "early": tiny_llama_gguf(TARGET_SEED, TinyShape(n_layer=1), gguf_dir)}


@pytest.fixture(scope="module")
def models(paths):
    return {k: LlamaCppLM(p, n_threads=1) for k, p in paths.items()}


def _toy(lm: LlamaCppLM, prompt) -> ToyLM:
    """The model's next-token logits after prompt + prefix (float64 [V]), as llama.cpp computes them one block at a
    time on a cache cut back to the longest prefix it shares with the asked sequence (memoized)."""
    memo = {}

    def fn(prefix):
        if prefix not in memo:
            seq = list(prompt) + list(prefix)
            keep = 0
            while keep < min(len(lm.tokens), len(seq) - 1) and lm.tokens[keep] == seq[keep]:
                keep += 1
            lm.truncate(keep)
            memo[prefix] = lm.forward_block(seq[keep:], logits_to_keep=1)[-1].double()
        return memo[prefix]

    return ToyLM(lm.vocab_size, fn)


# ------------------------------------------------------------------------------------------------ the tiny GGUF files

def test_tiny_gguf_is_deterministic_per_seed(tmp_path, paths):
    a = write_tiny_llama_gguf(tmp_path / "a.gguf", torch.Generator().manual_seed(TARGET_SEED), SHAPE)
    b = write_tiny_llama_gguf(tmp_path / "b.gguf", torch.Generator().manual_seed(TARGET_SEED), SHAPE)
    digest = [hashlib.sha256(p.read_bytes()).hexdigest() for p in (a, b, paths["target"], paths["draft"])]
    assert digest[0] == digest[1] == digest[2] != digest[3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.gguf", "b.gguf"]  # no temporary file left behind
    with pytest.raises(ValueError, match="vocab"):
        TinyShape(vocab=4).check()


def test_backend_loads_the_tiny_pair(models):
    for lm in models.values():
        assert isinstance(lm, BlockLM)
        assert lm.vocab_size == SHAPE.vocab and lm.eos_token_ids == (2,)


# ------------------------------------------------------------------------------------------------ the backend

@pytest.mark.parametrize("exact_attention", [False, True], ids=["llama.cpp defaults", "no flash attn, f32 KV"])
def test_block_logits_equal_one_token_logits(models, paths, exact_attention):
    """With llama.cpp's defaults (flash attention, whose CPU kernel rounds queries to float16; float16 KV cache) block
    and one-token logits (|logit| <= ~8) differ by ~5e-4; without flash attention and with a float32 cache, by
    float32 rounding (~3e-6)."""
    lm = LlamaCppLM(paths["target"], n_threads=1, flash_attn=False, kv_cache_type="f32") if exact_attention \
        else models["target"]
    tol = 2e-5 if exact_attention else 2e-3
    seq = PROMPT + [3, 30, 12, 12, 7, 0, 21, 8]
    lm.reset()
    block = lm.forward_block(seq)
    assert block.dtype == torch.float32 and block.shape == (len(seq), SHAPE.vocab) and lm.tokens == seq
    lm.reset()
    one = torch.cat([lm.forward_block([t]) for t in seq])
    assert torch.allclose(block, one, rtol=0, atol=tol), float((block - one).abs().max())
    assert block.std() > 1.0  # the logits are spread (sharpness 3), not a near-uniform model
    lm.reset()
    last3 = lm.forward_block(seq, logits_to_keep=3)
    assert torch.equal(last3, block[-3:])
    lm.reset()
    assert lm.forward_block(seq[:5], logits_to_keep=0).shape == (0, SHAPE.vocab)
    assert torch.allclose(lm.forward_block(seq[5:]), block[5:], rtol=0, atol=tol)


def test_truncate_then_refeed_gives_the_same_logits(models):
    lm = models["target"]
    head, tail, other = PROMPT + [11, 4, 25, 3], [8, 19, 2, 13], [31, 0, 22]
    lm.reset()
    first = lm.forward_block(head + tail)[len(head):]
    lm.truncate(len(head))
    assert lm.tokens == head
    detour = lm.forward_block(other)
    lm.truncate(len(head))
    again = lm.forward_block(tail)
    assert torch.allclose(again, first, rtol=1e-5, atol=1e-5), float((again - first).abs().max())
    assert not torch.allclose(detour, first[:3], atol=1e-2)  # the detour really saw other tokens
    lm.truncate(2)
    lm.truncate(10)  # no-op: the cache is shorter
    assert lm.tokens == head[:2]
    with pytest.raises(ValueError):
        lm.truncate(-1)
    with pytest.raises(ValueError):
        lm.forward_block([SHAPE.vocab])
    with pytest.raises(ValueError):
        lm.forward_block([])


# ------------------------------------------------------------------------------------------------ greedy

def test_greedy_speculative_equals_llamacpp_greedy(models, paths):
    from llama_cpp import Llama

    target = models["target"]
    ar = chain_generate(target, PROMPT, max_new_tokens=40, eos_token_id=None)
    assert ar.forward_sizes == [1] * 40  # one token per forward: llama.cpp's own autoregressive greedy decoding
    llm = Llama(str(paths["target"]), n_ctx=SHAPE.n_ctx, n_threads=1, verbose=False)
    theirs = []
    for tok in llm.generate(PROMPT, temp=0.0, repeat_penalty=1.0):
        theirs.append(int(tok))
        if len(theirs) == 40:
            break
    assert theirs == ar.tokens
    self_draft = LlamaCppLM(paths["target"], n_threads=1)
    accepted = {}
    for name, draft in (("draft", models["draft"]), ("early", models["early"]), ("self", self_draft)):
        for gamma in (1, 2, 5):
            out = chain_generate(target, PROMPT, draft=draft, gamma=gamma, max_new_tokens=40, eos_token_id=None)
            assert out.tokens == ar.tokens, (name, gamma)
            accepted[name, gamma] = (sum(out.accepted), sum(out.drafted))
        block = chain_generate(target, PROMPT, draft=draft, gamma=3, max_new_tokens=40, eos_token_id=None,
                               verification="block")
        assert block.tokens == ar.tokens, name
    assert accepted["self", 5][0] == accepted["self", 5][1] > 0  # a copy of the target: every draft token kept
    # the other drafts are rejected somewhere, and the early-exit one is also accepted somewhere
    assert all(a < d for (name, _), (a, d) in accepted.items() if name != "self")
    assert sum(a for (name, _), (a, _) in accepted.items() if name == "early") > 0


def test_errors(models, gguf_dir):
    target, draft = models["target"], models["draft"]
    with pytest.raises(ValueError, match="gamma"):
        chain_generate(target, PROMPT, draft=draft, gamma=0, max_new_tokens=4)
    with pytest.raises(ValueError, match="generator"):
        chain_generate(target, PROMPT, draft=draft, max_new_tokens=4, sampling=T1)
    small = LlamaCppLM(tiny_llama_gguf(3, TinyShape(vocab=24), gguf_dir), n_threads=1)
    with pytest.raises(ValueError, match="vocabularies differ"):
        chain_generate(target, PROMPT, draft=small, max_new_tokens=4)

    class NaNDraft:
        vocab_size = draft.vocab_size

        def forward_block(self, token_ids, logits_to_keep=None):
            out = draft.forward_block(token_ids, logits_to_keep)
            out[..., 0] = float("nan")
            return out

        def truncate(self, length):
            draft.truncate(length)

        def reset(self):
            draft.reset()

    with pytest.raises(ValueError, match="NaN"):
        chain_generate(target, PROMPT, draft=NaNDraft(), max_new_tokens=4, seed=0, sampling=T1)


# ------------------------------------------------------------------------------------------------ exactness at T = 1

@pytest.fixture(scope="module")
def exact_law(models):
    """The target's exact law of its first LENGTH tokens after PROMPT at T = 1 (from its llama.cpp logits)."""
    return target_distribution(_toy(models["target"], PROMPT), T1, LENGTH)


def _sample(models, draft, n, seed, verification="token"):
    """n runs of LENGTH new tokens at T = 1 through the backend: the token tuples and the draft tokens accepted /
    drafted over all runs."""
    g = torch.Generator().manual_seed(seed)
    runs = [chain_generate(models["target"], PROMPT, draft=models[draft], gamma=GAMMA, max_new_tokens=LENGTH,
                           sampling=T1, generator=g, eos_token_id=None, verification=verification) for _ in range(n)]
    return [tuple(r.tokens) for r in runs], sum(sum(r.accepted) for r in runs) / sum(sum(r.drafted) for r in runs)


def test_goodness_of_fit_power_is_as_stated(exact_law):
    assert sum(exact_law.values()) == pytest.approx(1.0, abs=1e-9)
    assert min_detectable_tv(exact_law, N, LEVEL, 0.9, trials=300) <= TV_90


@pytest.mark.parametrize("draft, accepted", [("draft", (0.005, 0.1)), ("early", (0.4, 0.95))],
                         ids=["other-seed draft, mostly rejected", "early-exit draft, mostly accepted"])
def test_speculative_sampling_through_llamacpp_follows_the_target(models, exact_law, draft, accepted):
    """Both drafts, so that both the residual after a rejection and the acceptance path carry much of the law."""
    samples, rate = _sample(models, draft, N, seed=7)
    assert accepted[0] < rate < accepted[1], rate
    _, pval = gof_test(samples, exact_law)
    assert pval > LEVEL, pval


_ALWAYS_ACCEPT = Rule("always_accept", accept=lambda p, q: torch.ones_like(p))


def test_negative_control_accepting_every_draft_token_is_caught(models, exact_law):
    """The early-exit draft with every draft token accepted: its law lies at TV ~0.33 from the target's."""
    control_law = exact_chain_distribution(_toy(models["target"], PROMPT), _toy(models["early"], PROMPT), T1, GAMMA,
                                           LENGTH, rule=_ALWAYS_ACCEPT)
    assert total_variation(control_law, exact_law) > 2 * TV_90
    assert rejection_rate(exact_law, N_CONTROL, LEVEL, 300, 0, control_law) >= 0.99
    wrong = functools.partial(verify_chain, accept_fn=_ALWAYS_ACCEPT.accept)
    samples, rate = _sample(models, "early", N_CONTROL, seed=7, verification=wrong)
    assert rate == 1.0
    assert gof_test(samples, exact_law)[1] < LEVEL
