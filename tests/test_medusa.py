"""Medusa heads and the distilled draft.

What is tested:
* heads: output shape [K, ..., V]; with W1 = 0 and b1 = 0 at initialisation every head's logits equal the LM head's
  (separate copied projections and the shared frozen LM head alike); save/load round trip gives identical logits;
  loading for another base model raises HeadMismatchError.
* training: Medusa-1 training on tiny self-distillation data lowers the weighted loss Σ 0.8^k CE_k; the trained heads
  are cached and come back from the cache; head_topk_accuracy is monotone in i.
* trees: the accuracy-driven sparse tree is prefix-closed and picks the highest-value nodes first.
* decoding: greedy Medusa decoding (medusa_generate, and trees.tree_generate with the same proposer) is
  token-identical to AR greedy, on tiny random models and on SmolLM2-135M (real_model).
* exactness: one Medusa decoding step with children sampled from the heads' softmax and MSS verification, continued
  by AR sampling, passes a chi-square goodness-of-fit test against the target's exact 3-token distribution, level
  1e-3 (2 tests with fixed seeds: a correct implementation fails one with probability <= 0.2 %); typical acceptance
  fails the same test (p ~ 0) with a total-variation shift > 0.1 (measured 0.98 here: the tiny model's flat
  distributions let typical acceptance take the heads' top candidate almost always; the exact sampler's empirical
  TV, pure sampling noise over 512 bins, is ~0.12-0.14); siblings drawn without replacement but claimed i.i.d.
  fail it too (same heads and temperature). The full sampling loop (medusa_generate, MSS) passes a goodness of fit of
  4 new tokens, and MSS without the residual update through the same loop fails it.
* distilled draft: copying all layers reproduces the target; KL distillation lowers the KL; loading for another base
  model is refused; the draft drives chain and tree speculative decoding with output identical to AR greedy.
"""

import pytest
import torch
from conftest import LEVEL, PROMPT, memo, tiny_lm

from specrepro.core.decoding import generate
from specrepro.core.medusa import (
    DEFAULT_CHOICES,
    PRIOR_HEAD_ACCURACY,
    MedusaProposer,
    expected_acceptance_length,
    medusa_generate,
    sparse_tree_from_accuracies,
    typical_acceptance_verify,
)
from specrepro.core.medusa_heads import HeadMismatchError, MedusaHeads, random_heads
from specrepro.core.sampling import SamplingConfig, logits_to_probs
from specrepro.core.trees import TokenTree, TreeTemplate, tree_generate
from specrepro.sim.exact import target_distribution
from specrepro.sim.medusa import medusa_step_samples
from specrepro.sim.toy import ToyLM
from specrepro.stats import empirical_distribution, gof_test, total_variation
from specrepro.train.medusa1 import (
    MedusaTrainConfig,
    get_or_train_heads,
    head_topk_accuracy,
    self_distillation_data,
    train_medusa_heads,
)

CHOICES = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


@pytest.fixture(scope="module")
def target():
    return tiny_lm("llama", vocab=8, seed=1)


def _perturbed_heads(model, k=3, seed=0, scale=0.6):
    return random_heads(model, k, scale=scale, seed=seed)


@pytest.mark.parametrize("shared", [False, True])
def test_heads_shapes_and_zero_init_equal_lm_head(target, shared):
    heads = MedusaHeads.from_base(target, n_heads=4, share_lm_head=shared)
    h = torch.randn(5, 32)
    out = heads(h)
    assert out.shape == (4, 5, 8)
    lm = target.lm_head(h)
    for k in range(4):
        torch.testing.assert_close(out[k], lm)
    n_train = sum(p.numel() for p in heads.parameters())
    assert n_train == 4 * (32 * 32 + 32) + (0 if shared else 4 * 8 * 32)


def test_save_load_round_trip_and_refusal(tmp_path, target):
    heads = _perturbed_heads(target)
    heads.save(tmp_path / "h")
    back = MedusaHeads.load(tmp_path / "h", target)
    h = torch.randn(3, 32)
    torch.testing.assert_close(back(h), heads(h))
    other = tiny_lm("llama", vocab=8, seed=2)
    with pytest.raises(HeadMismatchError, match="trained for base model"):
        MedusaHeads.load(tmp_path / "h", other)
    with pytest.raises(FileNotFoundError):
        MedusaHeads.load(tmp_path / "nothing", target)


def _tiny_data(model, n=6, new=12, sampling=SamplingConfig(0.0), cache=False):
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 8, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g) for _ in range(n)]
    return self_distillation_data(model, None, prompts, max_new_tokens=new, batch_size=4, cache=cache,
                                  progress=False, sampling=sampling, seed=1)


def test_self_distillation_data_matches_unbatched_greedy(target):
    data = _tiny_data(target)
    for p, r, h in zip(data.prompts, data.responses, data.hidden):
        ar = generate(target, p, max_new_tokens=12).tokens
        assert r.tolist() == ar
        torch.testing.assert_close(target.lm_head(h).argmax(-1), r)


def test_training_reduces_loss_and_is_cached(tmp_path, monkeypatch, target):
    monkeypatch.setenv("SPECREPRO_CACHE", str(tmp_path))
    data = _tiny_data(target, sampling=SamplingConfig(1.0), cache=True)
    cfg = MedusaTrainConfig(n_heads=3, lr=1e-2, epochs=40, batch_size=16, seed=0)
    heads, losses, cached = get_or_train_heads(target, data, cfg, progress=False)
    assert not cached
    first, last = losses.loss.iloc[:3].mean(), losses.loss.iloc[-3:].mean()
    assert last < 0.8 * first, (first, last)
    again, losses2, cached2 = get_or_train_heads(target, data, cfg, progress=False)
    assert cached2 and len(losses2) == len(losses)
    h = torch.randn(2, 32)
    torch.testing.assert_close(again(h), heads(h))
    acc = head_topk_accuracy(heads, data, topk=4)
    vals = acc[[f"top{i}" for i in range(1, 5)]].values
    assert (vals[:, 1:] >= vals[:, :-1]).all() and acc.shape[0] == 3


def test_sparse_tree_from_accuracies():
    choices = sparse_tree_from_accuracies(PRIOR_HEAD_ACCURACY, 30)
    assert len(choices) == 30 and choices[0] == [0]
    known = {tuple(c) for c in choices}
    assert all(len(c) == 1 or tuple(c[:-1]) in known for c in choices)
    TreeTemplate.from_choices(choices)  # a valid static tree
    # adding nodes never lowers the expected acceptance length, and the greedy tree beats a chain of equal size
    e10 = expected_acceptance_length(choices[:10], PRIOR_HEAD_ACCURACY)
    assert expected_acceptance_length(choices, PRIOR_HEAD_ACCURACY) >= e10
    assert e10 > expected_acceptance_length([[0] * d for d in range(1, 6)], PRIOR_HEAD_ACCURACY)
    assert len(DEFAULT_CHOICES) == 16
    with pytest.raises(ValueError):
        sparse_tree_from_accuracies(PRIOR_HEAD_ACCURACY, 0)


def test_greedy_medusa_equals_ar_tiny(target):
    heads = _perturbed_heads(target)
    prop = MedusaProposer(heads, CHOICES)
    ar = generate(target, PROMPT, max_new_tokens=25).tokens
    out = medusa_generate(target, PROMPT, prop, max_new_tokens=25)
    assert out.tokens == ar
    assert sum(out.drafted) > 0 and out.forward_sizes[0] == 1  # first step has no hidden state yet
    assert tree_generate(target, PROMPT, prop, max_new_tokens=25).tokens == ar
    with pytest.raises(ValueError, match="deeper|exceeds"):
        MedusaProposer(heads, [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]])


def test_bad_input(target):
    prop = MedusaProposer(_perturbed_heads(target), CHOICES)
    with pytest.raises(ValueError, match="acceptance"):
        medusa_generate(target, PROMPT, prop, acceptance="bogus")
    with pytest.raises(ValueError, match="Generator"):
        medusa_generate(target, PROMPT, prop, acceptance="typical", sampling=SamplingConfig(1.0))
    with pytest.raises(ValueError, match="temperature 0"):
        medusa_generate(target, PROMPT, prop, acceptance="greedy", sampling=SamplingConfig(1.0),
                        generator=torch.Generator())
    with pytest.raises(ValueError, match="mode"):
        MedusaProposer(prop.heads, CHOICES, mode="beam")
    with pytest.raises(ValueError, match="epsilon"):
        typical_acceptance_verify(torch.tensor([-1]), torch.tensor([0]), torch.full((2, 8), 1 / 8), None, epsilon=0)


def test_typical_acceptance_rule():
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.05, 0.9, 0.05, 0.0], [0.25, 0.25, 0.25, 0.25]])
    parents, tokens = torch.tensor([-1, 0]), torch.tensor([1, 1])
    # root: H = 1.03 nats, threshold min(.09, .3 e^-H) = 0.0536 < p(1) = .3 -> accept; node 0: p(1) = .9 -> accept
    path, nxt = typical_acceptance_verify(parents, tokens, p, torch.Generator().manual_seed(0))
    assert path == [0, 1] and 0 <= nxt < 4
    path, _ = typical_acceptance_verify(parents, torch.tensor([3, 1]), p, torch.Generator().manual_seed(0))
    assert path == []  # p(3) = 0 at the root


N_GOF = 2000
# siblings drawn without replacement but claimed i.i.d. move the distribution little: at n = 2000 the negative control
# below was caught (p < 0.001) for 1 of 6 seeds, at 4000 for 2 of 6, at 16,000 for 4 of 4 (2026-11-26); the exact
# sampler it is paired with gets the same n
N_GOF_WITHOUT_REPLACEMENT = 16_000
LENGTH = 3


def _step_samples(target, toy, prop, acceptance, cfg, seed, n=N_GOF):
    return medusa_step_samples(target, prop, PROMPT, acceptance=acceptance, sampling=cfg, n_samples=n,
                               length=LENGTH, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def toy(target):
    return ToyLM.from_transformer(target, PROMPT)


@pytest.mark.parametrize("mode", ["iid", "without_replacement"])
def test_exact_stochastic_medusa_goodness_of_fit(target, toy, mode):
    cfg = SamplingConfig(1.0)
    prop = MedusaProposer(_perturbed_heads(target), CHOICES, mode=mode)
    n = N_GOF_WITHOUT_REPLACEMENT if mode == "without_replacement" else N_GOF
    samples = _step_samples(target, toy, prop, "mss", cfg, seed=11, n=n)
    _, pval = gof_test(samples, target_distribution(toy, cfg, LENGTH))
    assert pval > LEVEL


def test_typical_acceptance_is_not_distribution_preserving(target, toy):
    cfg = SamplingConfig(1.0)
    exact = target_distribution(toy, cfg, LENGTH)
    prop = MedusaProposer(_perturbed_heads(target), CHOICES, mode="topk")
    typical = _step_samples(target, toy, prop, "typical", cfg, seed=12)
    _, pval = gof_test(typical, exact)
    tv = total_variation(empirical_distribution(typical), exact)
    assert pval < LEVEL and tv > 0.1, (pval, tv)


def _no_residual_mss(parents, tokens, p, q, generator):
    from specrepro.core.trees import verify_tree
    return verify_tree(parents, tokens, p, q, generator, "mss", residual_fn=lambda p, q, x: p)


class _ClaimsIID(MedusaProposer):
    """Negative control: children drawn without replacement but reported with the plain head rows (as i.i.d.)."""

    def propose_tree(self, ids, sampling, generator):
        tree = super().propose_tree(ids, sampling, generator)
        if tree.n and tree.proposal_probs is not None:
            depth = self.template.depth_of()
            p0 = next(iter(self.heads.blocks.parameters()))
            q = logits_to_probs(self.heads(self.h.to(p0.device, p0.dtype)).float(), sampling)
            rows = torch.stack([q[depth[i] - 1] for i in range(tree.n)]).to(tree.proposal_probs)
            tree = TokenTree(tree.parents, tree.tokens, rows)
        return tree


def test_stochastic_medusa_mss_negative_control(target, toy):
    """Paired with test_exact_stochastic_medusa_goodness_of_fit (same heads, tree, T = 1, n, level): siblings drawn
    without replacement but claimed i.i.d. fail the same test."""
    cfg = SamplingConfig(1.0)
    prop = _ClaimsIID(_perturbed_heads(target), CHOICES, mode="without_replacement")
    samples = _step_samples(target, toy, prop, "mss", cfg, seed=11, n=N_GOF_WITHOUT_REPLACEMENT)
    assert gof_test(samples, target_distribution(toy, cfg, LENGTH))[1] < LEVEL


N_E2E = 600  # the loop costs ~0.1 s per sequence on a loaded 2-core machine


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["mss", "mss without residual (negative control)"])
def test_stochastic_medusa_end_to_end_goodness_of_fit(target, toy, rule):
    """The full loop (KV cache, hidden-state hand-over, tree attention) with children sampled i.i.d. from the heads:
    4 new tokens (the first step is AR, the second verifies a depth-2 tree), N_E2E sequences, chi-square at 1e-3 of
    new tokens 2-3 (the tree step's) against the target's exact marginal; MSS without the residual update on the
    same heads and temperature fails (measured p ~ 1e-5; on all 4 tokens, 4096 outcomes, it is not detected at
    this n). The target runs behind conftest.memo (each distinct forward pass once, then replayed bit for bit)."""
    cfg = SamplingConfig(1.0)
    model = memo(target)
    prop = MedusaProposer(_perturbed_heads(target), CHOICES, mode="iid")
    g = torch.Generator().manual_seed(21)
    samples = []
    for _ in range(N_E2E):
        if rule == "mss":
            out = medusa_generate(model, PROMPT, prop, acceptance="mss", max_new_tokens=4, sampling=cfg, generator=g)
        else:
            out = tree_generate(model, PROMPT, prop, max_new_tokens=4, sampling=cfg, generator=g,
                                verify=_no_residual_mss)
        samples.append(tuple(out.tokens))
    # tokens 2-3 = the first two tokens emitted by the tree step (token 1 is the AR step): their exact joint law is
    # the target's 4-token distribution marginalized; 64 outcomes give the test power at this n
    marginal: dict = {}
    for seq, pr in target_distribution(toy, cfg, 4).items():
        marginal[seq[1:3]] = marginal.get(seq[1:3], 0.0) + pr
    pval = gof_test([s[1:3] for s in samples], marginal)[1]
    assert (pval > LEVEL) if rule == "mss" else (pval < LEVEL), pval


def test_medusa_sampling_modes_run(target):
    """typical / naive acceptance in the sampling loop (exactness is not claimed for typical; naive is covered by
    the tree tests): lengths and token range."""
    heads = _perturbed_heads(target)
    g = torch.Generator().manual_seed(0)
    for mode, acc in [("topk", "typical"), ("topk", "naive")]:
        out = medusa_generate(target, PROMPT, MedusaProposer(heads, CHOICES, mode=mode), acceptance=acc,
                              max_new_tokens=20, sampling=SamplingConfig(1.0), generator=g)
        assert len(out.tokens) == 20 and all(0 <= t < 8 for t in out.tokens)


def test_distilled_draft(tmp_path, monkeypatch, target):
    from specrepro.core.trees import DraftTreeProposer
    from specrepro.drafters.model import DraftModelDrafter
    from specrepro.train.distill import (
        DistillConfig,
        draft_kl,
        get_or_train_draft,
        init_draft_from_target,
        load_draft,
)

    full = init_draft_from_target(target, layers=(0, 1))
    torch.testing.assert_close(full(input_ids=PROMPT[None]).logits, target(input_ids=PROMPT[None]).logits)
    monkeypatch.setenv("SPECREPRO_CACHE", str(tmp_path))
    data = _tiny_data(target, sampling=SamplingConfig(1.0))
    cfg = DistillConfig(layers=(-1,), lr=1e-2, epochs=15, batch_size=3)
    before, _ = draft_kl(target, init_draft_from_target(target, cfg.layers), data)
    draft, losses, cached = get_or_train_draft(target, data, cfg, progress=False)
    after, _ = draft_kl(target, draft, data)
    assert not cached and float(after) < 0.8 * float(before), (float(before), float(after))
    _, _, cached = get_or_train_draft(target, data, cfg, progress=False)
    assert cached
    with pytest.raises(HeadMismatchError):
        d = next((tmp_path / "distill").iterdir())
        load_draft(d, tiny_lm("llama", vocab=8, seed=2))
    ar = generate(target, PROMPT, max_new_tokens=20).tokens
    assert generate(target, PROMPT, drafter=DraftModelDrafter(draft, 8), gamma=3, max_new_tokens=20).tokens == ar
    assert tree_generate(target, PROMPT, DraftTreeProposer(draft, [2, 1, 1], mode="topk", vocab_size=8),
                         max_new_tokens=20).tokens == ar


@pytest.mark.real_model
def test_greedy_medusa_equals_ar_smollm2(smollm2):
    model, tok = smollm2
    ids = tok("def fibonacci(n):\n    ", return_tensors="pt").input_ids[0]
    heads = _perturbed_heads(model, k=4, scale=0.02)
    ar = generate(model, ids, max_new_tokens=12).tokens
    out = medusa_generate(model, ids, MedusaProposer(heads, DEFAULT_CHOICES[:12]), max_new_tokens=12)
    assert out.tokens == ar
