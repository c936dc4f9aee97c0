"""The memoizing model wrapper behind the goodness-of-fit tests (specrepro.sim.memo, conftest.memo): through the real
loops it draws exactly the samples the bare model draws, every replayed forward pass recomputed and compared bit for
bit here (check_every=1); a replay that differs from the model is an error; calls it cannot key run the model.
"""

import pytest
import torch
from conftest import PROMPT

from specrepro.core.decoding import generate
from specrepro.core.medusa import MedusaProposer, medusa_generate
from specrepro.core.medusa_heads import random_heads
from specrepro.core.sampling import SamplingConfig
from specrepro.core.trees import DraftTreeProposer, tree_generate
from specrepro.drafters.model import DraftModelDrafter, PrunedHeadDrafter
from specrepro.sim.memo import MemoizedLM, memoized

pytestmark = pytest.mark.usefixtures("one_thread")

T1 = SamplingConfig(1.0)


def _chain(target, draft, n, cfg=T1, seed=3, drafter=None):
    g = torch.Generator().manual_seed(seed)
    drafter = drafter or DraftModelDrafter(draft, 8)
    return [tuple(generate(target, PROMPT, drafter=drafter, gamma=3, max_new_tokens=4, sampling=cfg,
                           generator=g).tokens) for _ in range(n)]


def test_chain_samples_are_the_models_own(pair):
    target, draft = pair
    plain = _chain(target, draft, 80)
    mt, md = memoized(target, draft, check_every=1)
    assert _chain(mt, md, 80) == plain
    assert mt.hits > 50 and md.hits > 50 and mt.checked == mt.hits and md.checked == md.hits
    assert mt.passed_through == 0 and md.passed_through == 0
    # without the checks: replays only, the same samples again
    mt, md = memoized(target, draft)
    assert _chain(mt, md, 80) == plain and mt.checked == 0 and mt.hits > 50
    cfg = SamplingConfig(0.8, top_k=4)
    assert _chain(*memoized(target, draft, check_every=1), 30, cfg) == _chain(target, draft, 30, cfg)
    # the pruned-head drafter runs the draft's backbone (get_decoder) and a head of its own
    kept = torch.tensor([0, 2, 5, 7])
    mt, md = memoized(target, draft, check_every=1)
    assert (_chain(mt, md, 30, drafter=PrunedHeadDrafter(md, kept, 8))
            == _chain(target, draft, 30, drafter=PrunedHeadDrafter(draft, kept, 8)))
    assert md.get_decoder() is md.get_decoder() and md.get_decoder().hits > 10
    assert md.get_decoder().checked == md.get_decoder().hits


def test_tree_and_medusa_samples_are_the_models_own(pair):
    """Token trees feed custom masks and position ids and keep the accepted path with select_cache_positions; Medusa
    reads hidden states: all keyed and replayed."""
    target, draft = pair

    def trees(t, d):
        g = torch.Generator().manual_seed(4)
        return [tuple(tree_generate(t, PROMPT, DraftTreeProposer(d, [2, 1], "iid", 8), max_new_tokens=4, sampling=T1,
                                    generator=g).tokens) for _ in range(60)]

    mt, md = memoized(target, draft, check_every=1)
    assert trees(mt, md) == trees(target, draft)
    assert mt.hits > 20 and md.hits > 20 and mt.checked == mt.hits and mt.passed_through == 0

    heads = random_heads(target, 3, scale=0.6, seed=0)
    choices = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]

    def medusa(t):
        g = torch.Generator().manual_seed(5)
        return [tuple(medusa_generate(t, PROMPT, MedusaProposer(heads, choices, mode="iid"), acceptance="mss",
                                      max_new_tokens=4, sampling=T1, generator=g).tokens) for _ in range(40)]

    mt = MemoizedLM(target, check_every=1)
    assert medusa(mt) == medusa(target) and mt.hits > 20 and mt.checked == mt.hits


def test_a_replay_that_differs_from_the_model_is_an_error(pair):
    target, draft = pair
    mt = MemoizedLM(target, check_every=1)
    _chain(mt, draft, 5)
    with torch.inference_mode():
        for fields, _ in mt._memo.values():
            fields["logits"].add_(1e-3)  # a stale or mis-keyed entry
    with pytest.raises(AssertionError, match="differs"):
        _chain(mt, draft, 5)


def test_calls_it_cannot_key_run_the_model(pair):
    target, _ = pair
    m = MemoizedLM(target)
    with torch.inference_mode():
        a = m(PROMPT[None]).logits  # positional
        b = m(input_ids=PROMPT[None], return_dict=True).logits  # an argument it does not key on
        c = m(input_ids=PROMPT[None]).logits
        d = m(input_ids=PROMPT[None]).logits  # replayed
    assert m.passed_through == 2 and m.hits == 1 and m.calls == 4
    assert torch.equal(a, b) and torch.equal(a, c) and torch.equal(c, d)
    assert m.config is target.config and m.wrapped is target and "MemoizedLM" in repr(m)
