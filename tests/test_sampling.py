"""Unit tests of the sampling core and the exact-enumeration part of the exactness battery (no models).

Exact enumeration: the output distribution of chain speculative sampling, computed exactly from the same building
blocks verify_chain uses, equals the target's to 1e-12 (random and adversarial target/draft pairs, temperature,
top-k, top-p, greedy, gamma 1..4). The horizon is gamma + 1 tokens or more, so an all-accepted block AND its bonus
token are observed. The same comparison FAILS for each negative control; under greedy sampling, where the sampling
controls cannot differ from the target, a control that commits draft tokens unverified gives the greedy cells power.
"""

import math

import pytest
import torch

from conftest import LEVEL
from specrepro.core.sampling import (
    SamplingConfig,
    draw,
    logits_to_probs,
    residual_distribution,
    sample,
    verify_chain,
)
from specrepro.sim.exact import (
    NEGATIVE_CONTROLS,
    RULES,
    exact_chain_distribution,
    sample_chain_sequences,
    target_distribution,
)
from specrepro.sim.toy import ToyLM, adversarial_pairs
from specrepro.stats import gof_test, total_variation

CONFIGS = {
    "T=1": SamplingConfig(1.0),
    "T=0.7,top-k=2": SamplingConfig(0.7, top_k=2),
    "T=1.3,top-p=0.8": SamplingConfig(1.3, top_p=0.8),
    "T=0.9,top-k=3,top-p=0.9": SamplingConfig(0.9, top_k=3, top_p=0.9),
    "greedy": SamplingConfig(0.0),
}


# --- logits processing ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [dict(temperature=-1), dict(temperature=float("nan")), dict(top_p=0),
                                    dict(top_p=1.5), dict(top_k=-2), dict(top_k=1.5)])
def test_config_rejects_impossible_parameters(kwargs):
    with pytest.raises(ValueError):
        SamplingConfig(**kwargs)


def test_greedy_is_one_hot_argmax():
    logits = torch.tensor([[0.1, 3.0, -1.0], [2.0, 1.0, 0.0]])
    p = logits_to_probs(logits, SamplingConfig(0.0))
    assert torch.equal(p, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))


def test_top_k_and_top_p_truncate_as_specified():
    logits = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05], dtype=torch.float64))
    pk = logits_to_probs(logits, SamplingConfig(1.0, top_k=2))
    assert torch.allclose(pk, torch.tensor([5 / 7, 2 / 7, 0, 0, 0], dtype=torch.float64))
    # top-p 0.8: smallest prefix with mass >= 0.8 is {0.5, 0.2, 0.15} (0.85)
    pp = logits_to_probs(logits, SamplingConfig(1.0, top_p=0.8))
    assert torch.allclose(pp, torch.tensor([0.5, 0.2, 0.15, 0, 0], dtype=torch.float64) / 0.85)
    # top-p just at a boundary keeps the boundary token: mass before token 2 is 0.7 < 0.7000001
    assert (logits_to_probs(logits, SamplingConfig(1.0, top_p=0.7000001)) > 0).sum() == 3
    pt = logits_to_probs(logits, SamplingConfig(0.5))
    assert torch.allclose(pt, torch.softmax(2 * logits, -1))


def test_nan_logits_raise():
    with pytest.raises(ValueError, match="NaN"):
        logits_to_probs(torch.tensor([0.0, float("nan")]), SamplingConfig(1.0))


def test_residual_is_never_nan():
    p = torch.tensor([0.3, 0.7])
    r = residual_distribution(p, p.clone(), 0)  # no mass in max(0, p - q)
    assert torch.equal(r, p)
    r = residual_distribution(torch.tensor([0.0, 1.0]), None, 1)  # point mass on the only token of p
    assert not torch.isnan(r).any()


def test_verify_chain_shapes_and_point_mass():
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    n, nxt = verify_chain(p, None, torch.tensor([1, 2]), g)
    assert (n, nxt) == (2, 0)  # both point-mass drafts have p = 1, bonus from the last row
    n, nxt = verify_chain(p, None, torch.tensor([0, 2]), g)
    assert (n, nxt) == (0, 1)  # p(0) = 0: rejected, residual = p with token 0 removed = one-hot on 1
    with pytest.raises(ValueError):
        verify_chain(p, None, torch.tensor([1]), g)


# --- exact enumeration ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg", list(CONFIGS), ids=list(CONFIGS))
@pytest.mark.parametrize("gamma", [1, 2, 3, 4])
def test_exact_enumeration_matches_target(cfg, gamma):
    g = torch.Generator().manual_seed(100 + gamma)
    # length >= gamma + 1: a full block and its bonus token inside the horizon (the loop drafts min(gamma, left - 1))
    vocab, length = (4, 3) if gamma <= 2 else (3, 4) if gamma == 3 else (3 if cfg != "T=1" else 2, 5)
    target, draft = ToyLM.random(vocab, g), ToyLM.random(vocab, g)
    exact = target_distribution(target, CONFIGS[cfg], length)
    spec = exact_chain_distribution(target, draft, CONFIGS[cfg], gamma, length)
    assert math.isclose(sum(spec.values()), 1.0, abs_tol=1e-12)
    assert total_variation(spec, exact) < 1e-12


@pytest.mark.parametrize("pair", list(adversarial_pairs(6, torch.Generator().manual_seed(0))))
@pytest.mark.parametrize("cfg", ["T=1", "T=1.3,top-p=0.8", "greedy"])
def test_exact_enumeration_adversarial_pairs(pair, cfg):
    p_logits, q_logits = adversarial_pairs(6, torch.Generator().manual_seed(0))[pair]
    target, draft = ToyLM(6, lambda prefix: p_logits), ToyLM(6, lambda prefix: q_logits)
    exact = target_distribution(target, CONFIGS[cfg], 3)
    for gamma in (1, 2):
        for rule in ("speculative", "block"):
            spec = exact_chain_distribution(target, draft, CONFIGS[cfg], gamma, 3, rule=rule)
            assert total_variation(spec, exact) < 1e-12, (pair, gamma, rule)
    if cfg == "greedy":
        # power of the greedy cells: committing the draft unverified moves the output wherever the argmaxes differ
        unverified = RULES["speculative"].__class__("unverified", accept=lambda p, q: torch.ones_like(p))
        tv = total_variation(exact_chain_distribution(target, draft, CONFIGS[cfg], 2, 3, rule=unverified), exact)
        differ = int(p_logits.argmax()) != int(q_logits.argmax())
        assert (tv > 0.5) if differ else (tv < 1e-12), (pair, tv)


@pytest.mark.parametrize("control", NEGATIVE_CONTROLS)
def test_negative_controls_fail_exact_enumeration(control):
    """Each wrong rule must move the output distribution away from the target (same comparison as above)."""
    g = torch.Generator().manual_seed(7)
    target, draft = ToyLM.random(4, g), ToyLM.random(4, g)
    cfg = CONFIGS["T=0.7,top-k=2"]
    exact = target_distribution(target, cfg, 2)
    tv = total_variation(exact_chain_distribution(target, draft, cfg, 2, 2, rule=control), exact)
    assert tv > 1e-2, f"negative control {control} was not detected (TV {tv:.2e})"


# --- Monte Carlo through the real verify_chain ---------------------------------------------------------------------
# Significance level 1e-3 per test; 1 + 3 tests here, so a correct sampler fails one with probability <= 0.4 %
# (Bonferroni) for a random seed; the seeds are fixed, so the outcome is deterministic run to run.
N_MC = 3000


def _mc_setup():
    g = torch.Generator().manual_seed(11)
    target, draft = ToyLM.random(4, g), ToyLM.random(4, g)
    cfg = CONFIGS["T=0.9,top-k=3,top-p=0.9"]
    return target, draft, cfg, target_distribution(target, cfg, 3)


def test_monte_carlo_goodness_of_fit_real_rule():
    target, draft, cfg, exact = _mc_setup()  # gamma 2, 3 tokens: full blocks end with their bonus token
    samples = sample_chain_sequences(target, draft, cfg, 2, 3, N_MC, torch.Generator().manual_seed(1))
    _, pval = gof_test(samples, exact)
    assert pval > LEVEL


@pytest.mark.parametrize("control", NEGATIVE_CONTROLS)
def test_monte_carlo_negative_controls_fail(control):
    target, draft, cfg, exact = _mc_setup()
    samples = sample_chain_sequences(target, draft, cfg, 2, 3, N_MC, torch.Generator().manual_seed(1), rule=control)
    _, pval = gof_test(samples, exact)
    assert pval < LEVEL, f"{control}: p-value {pval:.3g} - the test would not catch this wrong rule"


def test_sample_uses_the_generator():
    p = torch.full((5, 10), 0.1)
    a = sample(p, torch.Generator().manual_seed(3))
    b = sample(p, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


def test_draw_fits_its_row_and_a_shifted_row_is_caught():
    """sample/draw keep the first of >= 2 i.i.d. multinomial draws: a chi-square goodness-of-fit test on 60,000
    draws per row accepts the rows drawn from, never sees a zero-probability token, and rejects a row shifted by
    0.01 of mass (the same test, so it could have failed)."""
    from scipy import stats

    probs = torch.tensor([[0.4, 0.25, 0.0, 0.2, 0.1, 0.05], [0.0, 0.0, 0.5, 0.0, 0.25, 0.25]], dtype=torch.float32)
    n = 60_000
    g = torch.Generator().manual_seed(7)
    singles = torch.stack([sample(probs, g) for _ in range(n // 2)], dim=1)  # [2, n/2]
    pairs = draw(probs, 3, g).reshape(2, -1)
    for row, q in enumerate(probs):
        for xs in (singles[row], pairs[row], torch.cat([singles[row], draw(probs[row], n // 2, g)])):
            counts = torch.bincount(xs, minlength=q.numel()).double()
            assert counts[q == 0].sum() == 0
            support = q > 0
            expected = q[support].double() * counts.sum() / q[support].sum()
            assert stats.chisquare(counts[support].numpy(), expected.numpy()).pvalue > 1e-3
    shifted = probs[0].clone()
    shifted[0] -= 0.01
    shifted[1] += 0.01
    counts = torch.bincount(draw(shifted, n, g), minlength=6).double()
    expected = probs[0][probs[0] > 0].double() * n
    assert stats.chisquare(counts[probs[0] > 0].numpy(), expected.numpy()).pvalue < 1e-3
    assert draw(probs, 2, g).shape == (2, 2) and sample(probs, g).shape == (2,)
    with pytest.raises(ValueError, match="n must be"):
        draw(probs, 0, g)


def _top_p_reference(x, top_p):
    """Nucleus filtering by a full sort of every row (the textbook definition the fast path must equal), and each
    token's preceding mass in that order."""
    sorted_x, order = torch.sort(x, dim=-1, descending=True)
    sorted_p = torch.softmax(sorted_x, dim=-1)
    before_sorted = torch.cumsum(sorted_p, dim=-1) - sorted_p
    drop = torch.zeros_like(before_sorted, dtype=torch.bool).scatter_(-1, order, before_sorted >= top_p)
    return drop, torch.zeros_like(before_sorted).scatter_(-1, order, before_sorted)


def _assert_same_nucleus(drop, x, top_p):
    """``drop`` equals the full-sort filter, but for tokens whose preceding mass is top_p to within float rounding."""
    ref, before = _top_p_reference(x, top_p)
    differ = drop != ref
    tol = 1e-12 if x.dtype == torch.float64 else 1e-5
    assert bool((before[differ] - top_p).abs().le(tol).all()), (top_p, before[differ])
    assert int(differ.sum()) <= 2 * x.shape[0], int(differ.sum())  # at most the boundary token of each row moves


@pytest.mark.parametrize("first_k", [2, 256])
@pytest.mark.parametrize("scale", [0.05, 1.0, 8.0])  # flat rows need the candidate set to grow; peaked rows do not
def test_top_p_over_the_largest_logits_drops_what_a_full_sort_drops(monkeypatch, first_k, scale):
    import specrepro.core.sampling as sp

    monkeypatch.setattr(sp, "TOP_P_FIRST_K", first_k)
    gen = torch.Generator().manual_seed(int(10 * scale) + first_k)
    for vocab, dtype in ((50, torch.float64), (5000, torch.float32), (151_936, torch.float32), (40_000, torch.float64)):
        x = scale * torch.randn(3, vocab, generator=gen, dtype=dtype)
        ties = x.clone()
        ties[:, :3] = x.max() + 1.0  # three tied leaders: which of them comes first is torch's choice either way
        for top_p in (0.05, 0.5, 0.9, 0.95, 0.999):
            _assert_same_nucleus(sp._top_p_drop(x, top_p), x, top_p)
            config = SamplingConfig(0.8, top_p=top_p)
            _assert_same_nucleus(logits_to_probs(x, config) == 0, x / 0.8, top_p)
            kept, ref = ~sp._top_p_drop(ties, top_p), ~_top_p_reference(ties, top_p)[0]
            if dtype == torch.float64:
                assert torch.equal(kept.sum(-1), ref.sum(-1)) and torch.equal(kept[:, 3:], ref[:, 3:])
    x = torch.randn(2, 300, generator=gen, dtype=torch.float64)
    x[:, 100:] = float("-inf")  # rows already cut by top-k: the -inf tokens stay dropped
    assert torch.equal(sp._top_p_drop(x, 0.9), _top_p_reference(x, 0.9)[0])


def test_top_p_fast_path_would_catch_a_wrong_boundary(monkeypatch):
    """The comparison above can fail: a filter that keeps one token too many is caught."""
    x = torch.randn(2, 5000, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    drop = _top_p_reference(x, 0.9)[0]
    wrong = drop.clone()
    wrong[0, torch.nonzero(drop[0])[0]] = False
    with pytest.raises(AssertionError):
        _assert_same_nucleus(wrong, x, 0.9)
