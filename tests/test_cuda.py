"""Exactness on a CUDA device: the decoding loops run with the target, the draft (or the Medusa heads) and, where
named, the torch.Generator on the GPU, and their samples are compared with the target's exact distribution
computed on the CPU in float64 from the same weights (so a device-dependent sampling bug shows as a misfit).

Skipped on a machine without CUDA (CI has none); run on a GPU with ``python -m pytest tests/test_cuda.py``.
``SPECREPRO_TEST_DEVICE=cpu`` runs the same tests on the CPU (to check the tests themselves without a GPU).

- Chain (Leviathan Alg. 1 / Chen Alg. 2): 3 sampling settings with a CUDA generator and one with a CPU generator
  (the loop draws on the generator's device), block verification (Sun et al. 2025), the dynamic draft length.
- Token trees (SpecInfer Alg. 2, multi-step speculative sampling) through tree attention: children i.i.d.,
  without replacement, top-k point masses, and a merged tree.
- The verifiers after the papers (traversal verification, SpecTr's K-SEQ) through tree_generate, with their
  negative controls.
- Medusa-1 heads with exact stochastic verification (children i.i.d. from the heads, MSS).
- Negative controls on the same device, which the same tests must reject: verification without the residual
  update (chain, token tree and Medusa).
- Greedy: every method returns AR's tokens on the device, and AR on the device returns the CPU's tokens.

Chi-square goodness of fit (:func:`specrepro.stats.gof_test`, sparse bins pooled) at level 1e-3 per test; with
11 tests of correct samplers and fixed seeds, a correct implementation fails one with probability <= 1.1% for a
random seed (Bonferroni).
"""

import copy
import functools
import os

import pytest
import torch
from conftest import tiny_lm
from test_decoding import (  # the CPU tests' settings, prompt and sample size
    CONFIGS,
    LEVEL,
    PROMPT,
    N,
)
from test_trees import (  # the CPU tests' tree proposers and negative control
    MC_CASES as TREES,
)
from test_trees import _no_residual_mss
from test_verifiers import LOOP_CONTROLS, LOOP_LENGTH, LOOP_N, LOOP_TREES, T1  # the CPU tests' verifier cases

from specrepro.core import decoding
from specrepro.core.decoding import generate
from specrepro.core.medusa import MedusaProposer, medusa_generate
from specrepro.core.medusa_heads import random_heads
from specrepro.core.sampling import SamplingConfig
from specrepro.core.trees import DraftTreeProposer, tree_generate
from specrepro.drafters.lookup import PromptLookupDrafter
from specrepro.drafters.model import DraftModelDrafter
from specrepro.sim.exact import RULES, target_distribution
from specrepro.sim.toy import ToyLM
from specrepro.stats import gof_test

DEVICE = torch.device(os.environ.get("SPECREPRO_TEST_DEVICE", "cuda"))
pytestmark = pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def cpu_pair():
    return tiny_lm("llama", seed=1), tiny_lm("qwen2", seed=2)


@pytest.fixture(scope="module")
def pair(cpu_pair):
    """The same two models on DEVICE (float32)."""
    return tuple(copy.deepcopy(m).to(DEVICE) for m in cpu_pair)


def _exact(cpu_target, cfg, length):
    return target_distribution(ToyLM.from_transformer(cpu_target, PROMPT), cfg, length)


def _generator(seed, on=None):
    return torch.Generator(device=on or DEVICE).manual_seed(seed)


def _chain(target, drafter, cfg, n, seed, gamma=3, length=3, gen_device=None, **kw):
    g = _generator(seed, gen_device)
    prompt = PROMPT.to(DEVICE)
    return [tuple(generate(target, prompt, drafter=drafter, gamma=gamma, max_new_tokens=length, sampling=cfg,
                           generator=g, **kw).tokens) for _ in range(n)]


# --------------------------------------------------------------------------------------------------------- chains

@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_chain_goodness_of_fit_on_device(cpu_pair, pair, cfg):
    target, draft = pair
    samples = _chain(target, DraftModelDrafter(draft, 8), CONFIGS[cfg], N, seed=5)
    assert gof_test(samples, _exact(cpu_pair[0], CONFIGS[cfg], 3))[1] > LEVEL


def test_chain_with_a_cpu_generator_on_device(cpu_pair, pair):
    target, draft = pair
    cfg = CONFIGS["T=1"]
    samples = _chain(target, DraftModelDrafter(draft, 8), cfg, N, seed=8, gen_device="cpu")
    assert gof_test(samples, _exact(cpu_pair[0], cfg, 3))[1] > LEVEL


def test_block_verification_on_device(cpu_pair, pair):
    target, draft = pair
    cfg = CONFIGS["T=1"]
    samples = _chain(target, DraftModelDrafter(draft, 8), cfg, 1000, seed=9, verification="block")
    assert gof_test(samples, _exact(cpu_pair[0], cfg, 3))[1] > LEVEL


def test_dynamic_draft_length_on_device(cpu_pair, pair):
    target, draft = pair
    cfg = CONFIGS["T=1"]
    samples = _chain(target, DraftModelDrafter(draft, 8, stop_below=0.15), cfg, N, seed=6, gamma=4)
    assert gof_test(samples, _exact(cpu_pair[0], cfg, 3))[1] > LEVEL


def test_chain_without_residual_is_rejected_on_device(cpu_pair, pair, monkeypatch):
    """Negative control: Leviathan's rule without the residual distribution max(0, p - q) on rejection."""
    target, draft = pair
    cfg = CONFIGS["T=1"]
    wrong = functools.partial(decoding.verify_chain, residual_fn=RULES["no_residual"].residual)
    monkeypatch.setattr(decoding, "verify_chain", wrong)
    samples = _chain(target, DraftModelDrafter(draft, 8), cfg, N, seed=5)
    assert gof_test(samples, _exact(cpu_pair[0], cfg, 3))[1] < LEVEL


# ---------------------------------------------------------------------------------------------------------- trees

def _trees(target, proposer, cfg, n, seed, length=2):
    g = _generator(seed)
    prompt = PROMPT.to(DEVICE)
    return [tuple(tree_generate(target, prompt, proposer, max_new_tokens=length, sampling=cfg, generator=g).tokens)
            for _ in range(n)]


@pytest.mark.parametrize("case", list(TREES))
def test_tree_goodness_of_fit_on_device(cpu_pair, pair, case):
    target, draft = pair
    cfg = SamplingConfig(1.0)
    samples = _trees(target, TREES[case](draft), cfg, 1000, seed=7)
    assert gof_test(samples, _exact(cpu_pair[0], cfg, 2))[1] > LEVEL


def test_tree_without_residual_is_rejected_on_device(cpu_pair, pair):
    """Negative control: multi-step speculative sampling without the residual update after a rejected child."""
    target, draft = pair
    cfg = SamplingConfig(1.0)
    g = _generator(7)
    prompt = PROMPT.to(DEVICE)
    samples = [tuple(tree_generate(target, prompt, DraftTreeProposer(draft, [2, 1], "iid", 8), max_new_tokens=2,
                                   sampling=cfg, generator=g, verify=_no_residual_mss).tokens) for _ in range(1000)]
    assert gof_test(samples, _exact(cpu_pair[0], cfg, 2))[1] < LEVEL


@pytest.mark.parametrize("case", [*LOOP_TREES, *LOOP_CONTROLS])
def test_verifiers_after_the_papers_on_device(cpu_pair, pair, case):
    """Traversal verification and SpecTr's K-SEQ through tree_generate on the device (3 tokens, so the first tree
    keeps its depth): the exact rules fit, their negative controls are rejected."""
    target, draft = pair
    build, verify = (LOOP_TREES.get(case) or LOOP_CONTROLS[case])[:2]
    g = _generator(21)
    prompt = PROMPT.to(DEVICE)
    samples = [tuple(tree_generate(target, prompt, build(draft), max_new_tokens=LOOP_LENGTH, sampling=T1, generator=g,
                                   verify=verify).tokens) for _ in range(LOOP_N)]
    pval = gof_test(samples, _exact(cpu_pair[0], T1, LOOP_LENGTH))[1]
    assert pval > LEVEL if case in LOOP_TREES else pval < LEVEL


# --------------------------------------------------------------------------------------------------------- Medusa

MEDUSA_CHOICES = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


@pytest.mark.parametrize("rule", ["mss", "mss without residual (negative control)"])
def test_medusa_exact_sampling_on_device(cpu_pair, pair, rule):
    """4 new tokens (the first step is AR, the second verifies the heads' tree); new tokens 2-3, the tree step's,
    against the target's exact marginal, as tests/test_medusa.py does on the CPU."""
    cpu_target, target = cpu_pair[0], pair[0]
    heads = random_heads(cpu_target, 3, scale=0.6, seed=0).to(DEVICE)
    prop = MedusaProposer(heads, MEDUSA_CHOICES, mode="iid")
    cfg = SamplingConfig(1.0)
    g = _generator(21)
    prompt = PROMPT.to(DEVICE)
    samples = []
    for _ in range(1200):
        if rule == "mss":
            out = medusa_generate(target, prompt, prop, acceptance="mss", max_new_tokens=4, sampling=cfg, generator=g)
        else:
            out = tree_generate(target, prompt, prop, max_new_tokens=4, sampling=cfg, generator=g,
                                verify=_no_residual_mss)
        samples.append(tuple(out.tokens)[1:3])
    marginal: dict = {}
    for seq, pr in _exact(cpu_target, cfg, 4).items():
        marginal[seq[1:3]] = marginal.get(seq[1:3], 0.0) + pr
    pval = gof_test(samples, marginal)[1]
    assert (pval > LEVEL) if rule == "mss" else (pval < LEVEL), pval


# --------------------------------------------------------------------------------------------------------- greedy

def test_greedy_methods_equal_ar_on_device(cpu_pair, pair):
    target, draft = pair
    prompt = PROMPT.to(DEVICE)
    ar = generate(target, prompt, max_new_tokens=24).tokens
    assert ar == generate(cpu_pair[0], PROMPT, max_new_tokens=24).tokens  # the device's AR is the CPU's
    heads = random_heads(cpu_pair[0], 3, scale=0.6, seed=0).to(DEVICE)
    runs = {
        "chain": generate(target, prompt, drafter=DraftModelDrafter(draft, 8), gamma=3, max_new_tokens=24),
        "block": generate(target, prompt, drafter=DraftModelDrafter(draft, 8), gamma=3, max_new_tokens=24,
                          verification="block"),
        "prompt lookup": generate(target, prompt, drafter=PromptLookupDrafter(2), gamma=3, max_new_tokens=24),
        "tree": tree_generate(target, prompt, DraftTreeProposer(draft, [2, 2, 1], "topk", 8), max_new_tokens=24),
        "medusa": medusa_generate(target, prompt, MedusaProposer(heads, MEDUSA_CHOICES), max_new_tokens=24),
    }
    assert {name: out.tokens for name, out in runs.items()} == {name: ar for name in runs}


def test_cost_curve_cuda_graphs_replay_the_eager_forward():
    """A forward captured as a CUDA graph over a static cache returns the eager forward's logits bit for bit, for
    every n, and the timed curve covers every n (what ``python -m specrepro cost-curves --cuda-graphs`` reports)."""
    from specrepro.measure.cost import measure_cost_curve_static

    model = tiny_lm("qwen2", vocab=50).to(DEVICE)
    if DEVICE.type != "cuda":
        pytest.skip("CUDA graphs need a CUDA device")
    curve, diff = measure_cost_curve_static(model, ns=[1, 2, 5], prefix_len=12, repeats=3, cuda_graphs=True,
                                            generator=torch.Generator().manual_seed(0))
    assert diff == 0.0
    assert list(curve.n) == [1, 2, 5] and all(ms > 0 for ms in curve.ms)
