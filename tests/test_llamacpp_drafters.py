"""Our drafters on llama.cpp's kernels: BlockLMDrafter (a llama.cpp draft behind specrepro.drafters), its adaptive block
length (AdaptiveLengthDrafter) and the hybrid of prompt lookup and that draft (HybridDrafter), all through the one
decoding loop (specrepro.core.decoding.generate) with a llama.cpp target, on the tiny random GGUF pair of
tests/test_llamacpp.py (specrepro.backends.tinygguf; vocabulary 32, 2 layers; the draft the target's first layer
under its head, an early-exit draft); and the bench methods built on them (specrepro.bench.llama:
llama-sd-adaptive@G, llama-lookup@G, llama-hybrid-adaptive@G) on a 2-prompt tiny bench.

* greedy: every drafter returns llama.cpp's own greedy tokens (AR through the backend), with block lengths that
  really vary (the adaptive stop, lookup blocks beside draft blocks).
* exactness at T = 1: the first LENGTH = 3 tokens of the adaptive and the hybrid path (largest block GAMMA = 2) against
  the target's exact joint law over 32^3 outcomes enumerated from its llama.cpp logits; chi-square with sparse bins
  pooled (specrepro.stats.gof_test) at level LEVEL = 1e-3, n = N = 2000, where the test detects a total-variation
  deviation of TV_90 = 0.08 along a random tilt of the exact law with >= 90 % power (checked here as in
  tests/test_llamacpp.py). Negative control: the same adaptive and hybrid drafters with every draft token accepted
  (the project's verify_chain with the acceptance probability replaced by 1), under costs where the adaptive draft
  always drafts both tokens so that the control's law is the enumerable fixed-γ one (TV ~0.33 from the target's);
  at N_CONTROL = 400 the test's power against it is >= 0.99, and it must fail. Fixed seeds: deterministic outcomes.
* the bench methods: names resolve (``@G`` is the largest block length, default 20; llama-lookup's ``@G`` its γ),
  greedy runs equal llama-ar's in the harness, the costs are measured once per bench, the summary gives
  ``speedup_vs_llama_ar`` and greedy equality to llama-ar.

Skipped, with the import error, only where llama_cpp cannot be imported (install: requirements-llamacpp.txt).
"""

from __future__ import annotations

import functools

import pytest
import torch

from specrepro.backends.llamacpp import LlamaCppLM, llama_cpp_available
from specrepro.backends.tinygguf import TinyShape, tiny_llama_gguf
from specrepro.core.blocklm import chain_generate
from specrepro.core.decoding import generate
from specrepro.core.sampling import GREEDY, SamplingConfig, verify_chain
from specrepro.drafters.adaptive import AdaptiveLengthDrafter
from specrepro.drafters.lookup import HybridDrafter, PromptLookupDrafter
from specrepro.drafters.model import BlockLMDrafter
from specrepro.sim.exact import Rule, exact_chain_distribution, target_distribution
from specrepro.sim.toy import ToyLM
from specrepro.stats import gof_test, min_detectable_tv, rejection_rate, total_variation
from specrepro.theory import CostCurve

_OK, _WHY = llama_cpp_available()
pytestmark = [pytest.mark.skipif(not _OK, reason=f"llama_cpp does not import ({_WHY}); install it with the command "
                                                 "in requirements-llamacpp.txt"),
              pytest.mark.usefixtures("one_thread")]

SHAPE = TinyShape()
PROMPT = [5, 9, 17, 6]
LEVEL = 1e-3
T1 = SamplingConfig(1.0)
LENGTH, GAMMA = 3, 2
N = 2000
TV_90 = 0.08
N_CONTROL = 400
#: costs (ms) under which the adaptive draft stops after an unsure first token and goes on after a sure one
#: (the target's t(n) flat: a longer block costs only draft time)
VARYING = (CostCurve([1, 2, 3, 4, 6, 8], [10.0] * 6), 2.0)
#: costs under which a draft token is nearly free: the adaptive draft always drafts the largest block
FREE = (CostCurve([1, 2, 3, 4, 6, 8], [10.0] * 6), 1e-6)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-gguf")
    return {"target": LlamaCppLM(tiny_llama_gguf(1, SHAPE, d), n_threads=1),
            "early": LlamaCppLM(tiny_llama_gguf(1, TinyShape(n_layer=1), d), n_threads=1),
            "draft": LlamaCppLM(tiny_llama_gguf(2, SHAPE, d), n_threads=1)}


def _adaptive(lm, costs=VARYING, **kw):
    return AdaptiveLengthDrafter(BlockLMDrafter(lm), *costs, **kw)


def _hybrid(lm, costs=VARYING, min_ngram=1):
    return HybridDrafter(PromptLookupDrafter(max_ngram=3, min_ngram=min_ngram), _adaptive(lm, costs))


def _toy(lm: LlamaCppLM, prompt) -> ToyLM:
    """The model's next-token logits after prompt + prefix (float64 [V]) from llama.cpp (memoized)."""
    memo = {}

    def fn(prefix):
        if prefix not in memo:
            lm.reset()
            memo[prefix] = lm.forward_block(list(prompt) + list(prefix), logits_to_keep=1)[-1].double()
        return memo[prefix]

    return ToyLM(lm.vocab_size, fn)


# ------------------------------------------------------------------------------------------------ greedy

def test_block_lm_drafter_is_the_fixed_length_draft_of_chain_generate(models):
    """BlockLMDrafter without a stop drafts what chain_generate's draft drafts: same tokens, acceptances and alpha
    terms, greedy and seeded at T = 1."""
    target, early = models["target"], models["early"]
    for cfg, seed in ((GREEDY, None), (T1, 3), (SamplingConfig(0.8, top_k=6), 4)):
        a = chain_generate(target, PROMPT, draft=early, gamma=3, max_new_tokens=30, sampling=cfg, seed=seed,
                           eos_token_id=None)
        b = generate(target, PROMPT, drafter=BlockLMDrafter(early), gamma=3, max_new_tokens=30, sampling=cfg,
                     seed=seed, eos_token_id=None)
        assert (a.tokens, a.accepted, a.drafted, a.alpha_terms) == (b.tokens, b.accepted, b.drafted, b.alpha_terms)
    with pytest.raises(ValueError, match="stop_below"):
        BlockLMDrafter(early, stop_below=1.0)


def test_greedy_adaptive_and_hybrid_equal_llamacpp_greedy(models):
    target = models["target"]
    ar = chain_generate(target, PROMPT, max_new_tokens=40, eos_token_id=None).tokens
    for name in ("early", "draft"):
        lengths, sources = set(), {"lookup": 0, "model": 0}
        for make in (lambda lm: BlockLMDrafter(lm, stop_below=0.5), _adaptive, _hybrid):
            drafter = make(models[name])
            for gamma in (2, 5):
                out = generate(target, PROMPT, drafter=drafter, gamma=gamma, max_new_tokens=40, eos_token_id=None)
                assert out.tokens == ar, (name, type(drafter).__name__, gamma)
                lengths |= set(out.drafted[:-1])
                if isinstance(drafter, HybridDrafter):
                    sources = {k: sources[k] + v for k, v in drafter.steps.items()}
        assert len(lengths) > 2, (name, lengths)  # block lengths really vary
        assert sources["lookup"] > 0 and sources["model"] > 0, (name, sources)


# ------------------------------------------------------------------------------------------------ exactness at T = 1

@pytest.fixture(scope="module")
def exact_law(models):
    return target_distribution(_toy(models["target"], PROMPT), T1, LENGTH)


def _sample(models, drafter, n, seed, verification="token"):
    g = torch.Generator().manual_seed(seed)
    runs = [generate(models["target"], PROMPT, drafter=drafter, gamma=GAMMA, max_new_tokens=LENGTH, sampling=T1,
                     generator=g, eos_token_id=None, verification=verification) for _ in range(n)]
    return [tuple(r.tokens) for r in runs], runs


def test_goodness_of_fit_power_is_as_stated(exact_law):
    assert sum(exact_law.values()) == pytest.approx(1.0, abs=1e-9)
    assert min_detectable_tv(exact_law, N, LEVEL, 0.9, trials=300) <= TV_90


@pytest.mark.parametrize("kind", ["adaptive", "hybrid"])
def test_adaptive_and_hybrid_sampling_through_llamacpp_follow_the_target(models, exact_law, kind):
    drafter = _adaptive(models["early"]) if kind == "adaptive" else _hybrid(models["early"])
    samples, runs = _sample(models, drafter, N, seed=7)
    first = [r.drafted[0] for r in runs]
    assert 0 < first.count(1) < len(first)  # the adaptive stop ends some first blocks after one token, not all
    rate = sum(sum(r.accepted) for r in runs) / sum(sum(r.drafted) for r in runs)
    assert 0.3 < rate < 0.95, rate  # both the acceptance path and the residual carry much of the law
    if kind == "hybrid":  # copied blocks happen (after a rejection, a token that occurred before)
        assert any(len(r.drafted) > 1 and r.drafted[1] > 0 for r in runs)
    _, pval = gof_test(samples, exact_law)
    assert pval > LEVEL, pval


_ALWAYS_ACCEPT = Rule("always_accept", accept=lambda p, q: torch.ones_like(p))


@pytest.mark.parametrize("kind", ["adaptive", "hybrid"])
def test_negative_control_accepting_every_draft_token_is_caught(models, exact_law, kind):
    """Under FREE costs the adaptive draft drafts both tokens of the first block, and with every draft token
    accepted the first step emits all LENGTH tokens (no lookup block can follow): the control's law is the fixed-γ
    always-accept law, enumerated, at TV ~0.33 from the target's."""
    control_law = exact_chain_distribution(_toy(models["target"], PROMPT), _toy(models["early"], PROMPT), T1, GAMMA,
                                           LENGTH, rule=_ALWAYS_ACCEPT)
    assert total_variation(control_law, exact_law) > 2 * TV_90
    assert rejection_rate(exact_law, N_CONTROL, LEVEL, 300, 0, control_law) >= 0.99
    drafter = _adaptive(models["early"], FREE) if kind == "adaptive" else _hybrid(models["early"], FREE)
    wrong = functools.partial(verify_chain, accept_fn=_ALWAYS_ACCEPT.accept)
    samples, runs = _sample(models, drafter, N_CONTROL, seed=7, verification=wrong)
    assert all(r.drafted == [GAMMA] and r.accepted == [GAMMA] for r in runs)
    assert gof_test(samples, exact_law)[1] < LEVEL


# ------------------------------------------------------------------------------------------------ bench methods

PROMPTS = [[5, 9, 17, 6, 5, 9, 17], [1, 30, 12]]
NEW = 24
NEW_METHODS = ("llama-sd-adaptive", "llama-lookup", "llama-hybrid-adaptive")


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-gguf-bench")
    return {"target": tiny_llama_gguf(1, SHAPE, d), "draft": tiny_llama_gguf(1, TinyShape(n_layer=1), d)}


def _ctx(paths, sampling=GREEDY):
    from specrepro.bench import BenchContext

    return BenchContext(target=None, tokenizer=None, draft=None, prompts=[], sampling=sampling, gamma=2,
                        max_new_tokens=NEW, eos_token_id=[], vocab_size=SHAPE.vocab, seed=0, device="cpu",
                        target_name=str(paths["target"]), draft_name=str(paths["draft"]),
                        cost_text=torch.tensor([t for p in PROMPTS for t in p] * 40))


def test_the_new_methods_resolve_with_their_configuration():
    from specrepro.bench import REGISTRY, BenchOptionError, resolve_method, validate_options

    for name in NEW_METHODS:
        assert resolve_method(name)[1].family == "llama.cpp" and REGISTRY[name].exact
        assert REGISTRY[name].description
    assert not REGISTRY["llama-lookup"].needs_draft
    assert REGISTRY["llama-sd-adaptive"].needs_draft and REGISTRY["llama-hybrid-adaptive"].needs_draft
    out = validate_options(methods="llama-ar,llama-sd-adaptive,llama-sd-adaptive@8,llama-lookup@5,"
                                   "llama-hybrid-adaptive@12", gamma=3, n_prompts=1, max_new_tokens=8,
                           temperature=0.0, top_p=1.0, top_k=0, repeats=1, device="cpu", has_draft=True,
                           options={"lookup_gamma": "6", "hybrid_min_ngram": "1"})
    assert [(label, g) for label, _, g in out][1:] == [("llama-sd-adaptive", 20), ("llama-sd-adaptive@8", 8),
                                                       ("llama-lookup@5", 5), ("llama-hybrid-adaptive@12", 12)]
    with pytest.raises(BenchOptionError, match="largest draft length"):
        validate_options(methods="llama-sd-adaptive@x", gamma=3, n_prompts=1, max_new_tokens=8, temperature=0.0,
                         top_p=1.0, top_k=0, repeats=1, device="cpu", has_draft=True)
    with pytest.raises(BenchOptionError, match="lookup_gamma"):
        validate_options(methods="llama-lookup@5", gamma=3, n_prompts=1, max_new_tokens=8, temperature=0.0,
                         top_p=1.0, top_k=0, repeats=1, device="cpu", has_draft=False, options={"lookup_gamma": "6"})


def test_the_new_methods_on_a_tiny_bench(paths):
    from specrepro.bench import REGISTRY, resolve_method
    from specrepro.bench.run import _summarize
    from specrepro.measure.harness import run_interleaved

    ctx = _ctx(paths)
    labels = {"llama-ar": 1, "llama-sd-adaptive@6": 6, "llama-lookup@4": 4, "llama-hybrid-adaptive@6": 6}
    runners = {}
    for label, gamma in labels.items():
        name = label.split("@")[0]
        runners[label] = REGISTRY[name].factory(ctx, label if REGISTRY[name].prepare else name, gamma)
    assert [k for k in ctx._shared if k.startswith("llama_costs")] == ["llama_costs:6"]  # measured once
    for label in ("llama-sd-adaptive@6", "llama-hybrid-adaptive@6"):
        run = runners[label]
        assert run.gamma == 6 and list(run.cost_curve.n) == list(range(1, 8)) and run.t_draft_ms > 0
        assert getattr(run, "cost_drafter", None) is None  # not a fixed-γ chain: the bench predicts nothing
    prompts = [(f"p{i}", torch.tensor(p)) for i, p in enumerate(PROMPTS)]
    runs = run_interleaved(runners, prompts, repeats=1, seed=0, baseline="llama-ar", greedy=True, progress=False)
    assert runs["equal_to_baseline"].all() and (runs["new_tokens"] == NEW).all()
    for label in labels:
        if label != "llama-ar":
            d = runs[runs["method"] == label]
            assert sum(map(sum, d["accepted"])) > 0 and (d["steps"] < NEW).all(), label
    resolved = [(label, resolve_method(label)[1], g) for label, g in labels.items()]
    summary = _summarize(runs, resolved, greedy=True).set_index("method")
    for label in labels:
        assert summary.loc[label, "speedup_vs_llama_ar"] > 0
        assert summary.loc[label, "greedy_equal_to_llama_ar"]
    assert summary.loc["llama-lookup@4", "gamma"] == 4 and summary.loc["llama-sd-adaptive@6", "gamma"] == 6
    sampled = _ctx(paths, sampling=T1)
    run = REGISTRY["llama-hybrid-adaptive"].factory(sampled, "llama-hybrid-adaptive@6", 6)
    a, b = (run(torch.tensor(PROMPTS[0]), torch.Generator().manual_seed(11)).tokens for _ in range(2))
    assert len(a) == NEW and a != run(torch.tensor(PROMPTS[0]), torch.Generator().manual_seed(12)).tokens


def test_chain_costs_of_a_llamacpp_target_and_draft(models):
    """measure_chain_costs on a BlockLM target (timed through forward_block / truncate) and a BlockLMDrafter: the
    same (CostCurve, {label: ms}) as for transformers models; the models' caches are left empty."""
    from specrepro.measure.cost import measure_chain_costs, measure_cost_table

    curve, draft_ms = measure_chain_costs(models["target"], {"draft": BlockLMDrafter(models["early"])}, ns=(1, 2, 4),
                                          vocab=SHAPE.vocab, prefix_len=20, repeats=2, rounds=2,
                                          generator=torch.Generator().manual_seed(0), sampling=T1)
    assert list(curve.n) == [1, 2, 4] and (curve.ms > 0).all()
    assert set(draft_ms) == {"draft"} and draft_ms["draft"] > 0
    assert models["target"].tokens == [] and models["early"].tokens == []
    table = measure_cost_table(models["target"], ns=(3, 1), prefix_len=10, repeats=6, warmup_rounds=1)
    assert list(table["n"]) == [1, 3] and list(table["rounds"]) == [6, 6] and table["ms_low"].notna().all()


def test_the_draft_reads_the_prompt_in_its_own_timed_phase(models):
    """A drafter with ``prefill`` takes the prompt into its cache before the first step (every token but the last),
    timed as ``draft_prefill``; the tokens are those of the same drafter reading the prompt inside its first
    ``propose`` (greedy: the target's argmax either way), and the wrappers pass the prefill on."""
    target, early = models["target"], models["early"]
    drafter = BlockLMDrafter(early)
    drafter.reset()
    drafter.prefill(torch.tensor(PROMPT))
    assert early.tokens == list(PROMPT[:-1]) and drafter.cached_ids.tolist() == list(PROMPT[:-1])

    class NoPrefill:  # the same drafter without the hook: the prompt is read in the first propose
        def __init__(self, inner):
            self.inner, self.name = inner, "no prefill"

        def reset(self):
            self.inner.reset()

        def propose(self, *a):
            return self.inner.propose(*a)

    for make in (lambda: BlockLMDrafter(early), lambda: _adaptive(early), lambda: _hybrid(early)):
        with_hook = generate(target, PROMPT, drafter=make(), gamma=3, max_new_tokens=24, eos_token_id=None)
        without = generate(target, PROMPT, drafter=NoPrefill(make()), gamma=3, max_new_tokens=24, eos_token_id=None)
        assert with_hook.tokens == without.tokens
        assert with_hook.times["draft_prefill"] > 0 and "draft_prefill" not in without.times
    ar = generate(target, PROMPT, drafter=None, max_new_tokens=8, eos_token_id=None)
    assert "draft_prefill" not in ar.times
