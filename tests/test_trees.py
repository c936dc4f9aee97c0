"""Token trees (SpecInfer / Sequoia / Medusa trees): structure, tree attention, verification and the exactness battery.

a. Structure: TokenTree validation, expansion and Medusa-choices templates, pruning, compiled masks, merge rule.
b. Tree attention: one tree forward equals the chain forward passes of every root-to-node path (llama and qwen2
   tiny models, float tolerance); the cache after keeping the accepted path equals the chain's cache.
c. Exact enumeration (analytic, 1e-9): the distribution of the first 2 emitted tokens of tree decoding, summed over
   every drawn tree (children i.i.d., without replacement with renormalized rows, top-k point masses, Medusa-choices
   shapes, merged point-mass trees) and every verification outcome, equals the target's, for MSS and naive sampling;
   greedy follows the target argmax. Negative controls (MSS told that children drawn without replacement or by top-k
   were i.i.d. draws with the plain proposal rows; MSS without the residual update) differ from the target.
d. Monte Carlo goodness-of-fit through real tree-attention decoding (`tree_generate`) with tiny random transformers:
   chi-square (scipy.stats.chisquare, sparse bins pooled) at level LEVEL = 1e-3 per test. There are 5 tests of
   correct configurations, so with fixed seeds a correct implementation would fail at least one with probability
   <= 5e-3 (Bonferroni) for a random seed; the negative controls must fail the same test (p < 1e-3). Also
   verify_tree itself against verify_tree_outcomes on fixed trees. The tiny models run behind conftest.memo (each
   distinct forward pass runs once, then is replayed bit for bit: the same samples).
e. The loop's contract: EOS and max_new_tokens exact, N = 0 steps, the Medusa hidden-state hook, clear errors.
f. Real model: greedy tree decoding equals AR greedy on SmolLM2-135M for 2 HumanEval prompts (near-tie accounting as
   in test_real_models.py).
"""

import types

import pytest
import torch
from conftest import LEVEL, PROMPT, memo, tiny_lm

from specrepro.core.decoding import generate
from specrepro.core.kvcache import new_cache
from specrepro.core.sampling import SamplingConfig
from specrepro.core.tree_attention import (
    check_tree_attention,
    compile_topology,
    keep_path,
    tree_forward,
)
from specrepro.core.trees import (
    DraftTreeProposer,
    MergedTreeProposer,
    TokenTree,
    TreeTemplate,
    children_outcomes,
    merge_chains,
    sample_children,
    tree_generate,
    verify_tree,
    verify_tree_outcomes,
)
from specrepro.drafters.base import Proposal
from specrepro.drafters.lookup import NGramDrafter, PromptLookupDrafter
from specrepro.drafters.model import DraftModelDrafter
from specrepro.sim.exact import target_distribution
from specrepro.sim.toy import ToyLM
from specrepro.sim.trees import drawn_tree_outcomes, exact_tree_distribution
from specrepro.stats import gof_test, total_variation


pytestmark = pytest.mark.usefixtures("one_thread")




# ---------------------------------------------------------------------------------------------------- a. structure

def test_token_tree_validation_and_helpers():
    with pytest.raises(ValueError, match="precede"):
        TokenTree(torch.tensor([-1, 2, 0]), torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="tokens"):
        TokenTree(torch.tensor([-1, 0]), torch.tensor([1]))
    with pytest.raises(ValueError, match="proposal_probs"):
        TokenTree(torch.tensor([-1, 0]), torch.tensor([1, 2]), torch.ones(3, 4) / 4)
    t = TokenTree(torch.tensor([-1, -1, 0, 0, 2]), torch.tensor([5, 6, 7, 8, 9]))
    assert t.depth.tolist() == [1, 1, 2, 2, 3] and t.max_depth == 3
    assert t.children(-1) == [0, 1] and t.children(0) == [2, 3] and t.path_to(4) == [0, 2, 4]
    p = t.prune(2)
    assert p.parents.tolist() == [-1, -1, 0, 0] and p.tokens.tolist() == [5, 6, 7, 8]
    c = t.compile()  # root is fed position 0
    assert c.depth.tolist() == [0, 1, 1, 2, 2, 3]
    assert c.ancestors[5].nonzero().flatten().tolist() == [0, 1, 3, 5]
    assert not c.ancestors[2, 1] and not c.ancestors[4, 3]  # siblings never see each other
    assert sorted(map(tuple, c.retrieve.tolist())) == [(0, 1, 3, 5), (0, 1, 4, -1), (0, 2, -1, -1)]
    assert compile_topology([-1, 0, 0]) is compile_topology(torch.tensor([-1, 0, 0]))  # compiled once
    assert TokenTree.empty().n == 0 and TokenTree.chain(torch.tensor([3, 4])).parents.tolist() == [-1, 0]


def test_templates():
    t = TreeTemplate.expansion([2, 1, 3])
    assert t.n == 2 + 2 + 6 and t.parents[:4] == (-1, -1, 0, 1) and t.ranks[4:7] == (0, 1, 2)
    m = TreeTemplate.from_choices([[0, 1], [1], [0], [0, 0]])
    assert m.parents == (-1, -1, 0, 0) and m.ranks == (0, 1, 0, 1)
    tree = m.fill(torch.tensor([[10, 11], [20, 21]]))
    assert tree.tokens.tolist() == [10, 11, 20, 21] and tree.proposal_probs is None
    with pytest.raises(ValueError, match="parent"):
        TreeTemplate.from_choices([[0, 0]])
    with pytest.raises(ValueError, match="duplicate"):
        TreeTemplate.from_choices([[0], [0]])
    with pytest.raises(ValueError, match=">= 1"):
        TreeTemplate.expansion([2, 0])


def test_sample_children_modes():
    g = torch.Generator().manual_seed(0)
    q = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)
    toks, rows = sample_children(q, 5, "without_replacement", g)
    assert sorted(toks.tolist()) == [0, 1, 2]  # at most the support
    for j in range(3):
        assert abs(float(rows[j].sum()) - 1) < 1e-12 and (rows[j][toks[:j]] == 0).all()
    toks, rows = sample_children(q, 4, "iid", g)
    assert toks.numel() == 4 and (rows == q).all() and 3 not in toks.tolist()
    toks, rows = sample_children(q, 2, "topk", None)
    assert toks.tolist() == [0, 1] and rows is None
    assert abs(sum(p for *_, p in children_outcomes(q, 2, "without_replacement")) - 1) < 1e-12
    with pytest.raises(ValueError, match="mode"):
        sample_children(q, 2, "beam", g)


def test_merge_rule():
    v = 6
    q = torch.full((3, v), 1 / v)
    chains = [Proposal(torch.tensor([1, 2, 3]), None), Proposal(torch.tensor([1, 2, 4]), None),
              Proposal(torch.tensor([1, 5]), q[:2]), Proposal(torch.tensor([1]), q[:1])]
    tree = merge_chains(chains, v)
    # point masses share the prefix 1,2; sampled nodes are never merged (they are separate draws)
    assert tree.parents.tolist() == [-1, 0, 1, 1, -1, 4, -1]
    assert tree.tokens.tolist() == [1, 2, 3, 4, 1, 5, 1]
    assert (tree.proposal_probs[0] == torch.eye(v)[1]).all() and (tree.proposal_probs[4] == q[0]).all()
    assert merge_chains([Proposal(torch.tensor([1, 2]), None), Proposal(torch.tensor([1, 3]), None)],
                        v).proposal_probs is None


# ---------------------------------------------------------------------------------------------- b. tree attention

@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tree_forward_equals_chain_forwards(arch):
    model = tiny_lm(arch, vocab=16, seed=3)
    prompt = torch.tensor([1, 2, 3, 4, 5, 6])
    tree = TokenTree(torch.tensor([-1, -1, 0, 0, 1, 2, 5]), torch.tensor([7, 3, 9, 7, 1, 4, 4]))
    cache = new_cache(model)
    with torch.inference_mode():
        model(input_ids=prompt[None, :-1], past_key_values=cache, use_cache=True)
        out = tree_forward(model, cache, torch.cat([prompt[-1:], tree.tokens]), tree.compile(), 5)
        for i in range(-1, tree.n):
            ids = torch.cat([prompt, tree.tokens[tree.path_to(i)]]) if i >= 0 else prompt
            ref = model(input_ids=ids[None]).logits[0, -1]
            torch.testing.assert_close(out.logits[0, i + 1], ref, atol=1e-5, rtol=1e-5)
        # keep the path to node 6 (0 -> 2 -> 5 -> 6): the cache then equals the chain's, next logits agree
        keep_path(cache, 5, [0, 1, 3, 6, 7])
        assert cache.get_seq_length() == 5 + 5
        nxt = torch.tensor([2])
        a = model(input_ids=nxt[None], past_key_values=cache, use_cache=True).logits[0, -1]
        ids = torch.cat([prompt, tree.tokens[[0, 2, 5, 6]], nxt])
        torch.testing.assert_close(a, model(input_ids=ids[None]).logits[0, -1], atol=1e-5, rtol=1e-5)


def test_unsupported_architectures_are_refused():
    with pytest.raises(ValueError, match="model types"):
        check_tree_attention(types.SimpleNamespace(config=types.SimpleNamespace(model_type="gpt2")))
    cfg = types.SimpleNamespace(model_type="llama", _attn_implementation="flash_attention_2")
    with pytest.raises(ValueError, match="4D tree mask"):
        check_tree_attention(types.SimpleNamespace(config=cfg))
    model = tiny_lm("llama")
    check_tree_attention(model)


# ----------------------------------------------------------------------------------------- c. exact enumeration

def _toys(vocab=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return ToyLM.random(vocab, g, scale=2.0), ToyLM.random(vocab, g, scale=2.0)


EXACT_CASES = {
    "iid <2,1>": (TreeTemplate.expansion([2, 1]), "iid"),
    "without replacement <2,2>": (TreeTemplate.expansion([2, 2]), "without_replacement"),
    "top-k <3,1> point masses": (TreeTemplate.expansion([3, 1]), "topk"),
    "medusa choices, iid": (TreeTemplate.from_choices([[0], [1], [0, 0], [1, 0]]), "iid"),
    "medusa choices, top-k": (TreeTemplate.from_choices([[0], [2], [0, 1], [2, 0]]), "topk"),
}
CONFIGS = {"T=1": SamplingConfig(1.0), "T=0.7,top-k=3": SamplingConfig(0.7, top_k=3)}


@pytest.mark.parametrize("method", ["mss", "naive"])
@pytest.mark.parametrize("cfg", list(CONFIGS))
@pytest.mark.parametrize("case", list(EXACT_CASES))
def test_exact_enumeration_matches_target(case, cfg, method):
    target, draft = _toys()
    template, mode = EXACT_CASES[case]
    exact = exact_tree_distribution(target, draft, CONFIGS[cfg], template, mode, 2, method)
    want = target_distribution(target, CONFIGS[cfg], 2)
    assert abs(sum(exact.values()) - 1) < 1e-9
    assert total_variation(exact, want) < 1e-9


def test_exact_greedy_follows_target_argmax():
    target, draft = _toys()
    cfg = SamplingConfig(0.0)
    template = TreeTemplate.expansion([3, 2])
    exact = exact_tree_distribution(target, draft, cfg, template, "topk", 3, "greedy")
    assert exact == pytest.approx(target_distribution(target, cfg, 3))
    # verify_tree itself, on every tree the greedy proposer can draw: the accepted path and the next token are the
    # target's argmax chain
    argmax_chain = next(iter(target_distribution(target, cfg, 3)))
    trees = drawn_tree_outcomes(draft, cfg, template, "topk")
    assert trees
    for tree, _ in trees:
        toks = tree.tokens.tolist()
        rows = torch.stack([target.probs((), cfg)] + [target.probs(tuple(toks[j] for j in tree.path_to(i)), cfg)
                                                      for i in range(tree.n)])
        path, nxt = verify_tree(tree.parents, tree.tokens, rows, None, None, "greedy")
        emitted = tuple(toks[j] for j in path) + (nxt,)
        assert emitted == argmax_chain[: len(emitted)]


def test_exact_merged_point_mass_tree():
    """Merged point-mass chains (e.g. prompt lookup + greedy drafts) verified with MSS are exact, one step."""
    target, _ = _toys()
    cfg = SamplingConfig(1.0)
    chains = [Proposal(torch.tensor([1, 2]), None), Proposal(torch.tensor([1, 3]), None),
              Proposal(torch.tensor([0]), None)]
    tree = merge_chains(chains, 4)
    rows = torch.stack([target.probs((), cfg)] + [target.probs(tuple(tree.tokens[tree.path_to(i)].tolist()), cfg)
                                                  for i in range(tree.n)])
    first = {}
    for path, nxt, pv in verify_tree_outcomes(tree.parents, tree.tokens, rows, None, "mss"):
        tok = int(tree.tokens[path[0]]) if path else nxt
        first[tok] = first.get(tok, 0.0) + pv
    p0 = target.probs((), cfg)
    assert all(abs(first.get(x, 0.0) - float(p0[x])) < 1e-12 for x in range(4))


def _iid_rows(q, toks, rows):
    return q.unsqueeze(0).expand(len(toks), -1)


NEGATIVE = {
    "without replacement told i.i.d.": (TreeTemplate.expansion([3]), "without_replacement", _iid_rows, {}),
    "top-k told i.i.d.": (TreeTemplate.expansion([2]), "topk", _iid_rows, {}),
    "mss without residual update": (TreeTemplate.expansion([2, 1]), "iid", None,
                                    {"residual_fn": lambda p, q, x: p}),
}


@pytest.mark.parametrize("case", list(NEGATIVE))
def test_exact_enumeration_negative_controls(case):
    target, draft = _toys()
    template, mode, override, rule = NEGATIVE[case]
    cfg = SamplingConfig(1.0)
    got = exact_tree_distribution(target, draft, cfg, template, mode, 2, "mss", row_override=override, **rule)
    assert total_variation(got, target_distribution(target, cfg, 2)) > 1e-3


# ------------------------------------------------------------------------------------------- d. Monte Carlo GoF

def test_verify_tree_matches_its_enumeration():
    """The sampler verify_tree against verify_tree_outcomes on fixed trees (MSS, i.i.d. rows; naive)."""
    g = torch.Generator().manual_seed(11)
    v = 5
    tree = TokenTree(torch.tensor([-1, -1, -1, 0, 0, 1]), torch.tensor([0, 0, 2, 1, 3, 4]))
    tp = torch.softmax(2 * torch.randn(tree.n + 1, v, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(2 * torch.randn(v, generator=g, dtype=torch.float64), -1)
    qp = torch.stack([q, q, q, tp[1].flip(0), tp[1].flip(0), tp[2]])  # a node's children share their parent's q
    for method in ("mss", "naive"):
        exact = {}
        for path, nxt, pv in verify_tree_outcomes(tree.parents, tree.tokens, tp, qp, method):
            exact[(*path, -1, nxt)] = exact.get((*path, -1, nxt), 0.0) + pv
        samples = [(*p, -1, x) for p, x in (verify_tree(tree.parents, tree.tokens, tp, qp, g, method)
                                             for _ in range(4000))]
        _, pval = gof_test(samples, exact)
        assert pval > LEVEL, method




def _tree_samples(target, proposer, cfg, n, seed, length=2, method="mss"):
    g = torch.Generator().manual_seed(seed)
    return [tuple(tree_generate(target, PROMPT, proposer, max_new_tokens=length, sampling=cfg, generator=g,
                                method=method).tokens) for _ in range(n)]


class ClaimsIID(DraftTreeProposer):
    """Negative control: children drawn without replacement (or top-k) but reported with the plain rows q."""

    def _children(self, q, logits, template_kids, generator):
        toks, _ = super()._children(q, logits, template_kids, generator)
        return toks, [q] * len(toks)


MC_CASES = {
    "iid <2,1>": lambda d: DraftTreeProposer(d, [2, 1], "iid", 8),
    "without replacement <3,1>": lambda d: DraftTreeProposer(d, [3, 1], "without_replacement", 8),
    "top-k <2,2> point masses": lambda d: DraftTreeProposer(d, [2, 2], "topk", 8),
    "merged: draft + prompt lookup + bigram": lambda d: MergedTreeProposer(
        [DraftModelDrafter(d, 8), PromptLookupDrafter(2), NGramDrafter([[1, 5, 2, 7, 1, 5, 3, 3, 4]], 8)], 2, 8),
}


@pytest.mark.parametrize("case", list(MC_CASES))
def test_tree_decoding_goodness_of_fit(pair, case):
    target, draft = memo(*pair)
    cfg = SamplingConfig(1.0)
    exact = target_distribution(ToyLM.from_transformer(target, PROMPT), cfg, 2)
    _, pval = gof_test(_tree_samples(target, MC_CASES[case](draft), cfg, 1000, seed=7), exact)
    assert pval > LEVEL


def test_tree_decoding_goodness_of_fit_naive(pair):
    target, draft = memo(*pair)
    cfg = SamplingConfig(0.8, top_k=5)
    exact = target_distribution(ToyLM.from_transformer(target, PROMPT), cfg, 2)
    samples = _tree_samples(target, DraftTreeProposer(draft, [2, 1], "iid", 8), cfg, 1000, seed=8, method="naive")
    assert gof_test(samples, exact)[1] > LEVEL


def _no_residual_mss(parents, tokens, p, q, generator):
    """Negative control: MSS without the residual update after a rejected child."""
    return verify_tree(parents, tokens, p, q, generator, "mss", residual_fn=lambda p, q, x: p)


def test_tree_decoding_negative_control_same_models_and_temperature(pair):
    """Paired with test_tree_decoding_goodness_of_fit (same pair, T = 1, same n and level): MSS without the residual
    update, through tree_generate, fails."""
    target, draft = memo(*pair)
    cfg = SamplingConfig(1.0)
    exact = target_distribution(ToyLM.from_transformer(target, PROMPT), cfg, 2)
    g = torch.Generator().manual_seed(7)
    samples = [tuple(tree_generate(target, PROMPT, DraftTreeProposer(draft, [2, 1], "iid", 8), max_new_tokens=2,
                                   sampling=cfg, generator=g, verify=_no_residual_mss).tokens) for _ in range(1000)]
    assert gof_test(samples, exact)[1] < LEVEL


PROMPT4 = torch.tensor([1, 3, 2, 0])


@pytest.fixture(scope="module")
def pair4():
    return tiny_lm("llama", vocab=4, seed=1), tiny_lm("qwen2", vocab=4, seed=2)


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["mss", "mss without residual (negative control)"])
def test_depth3_sampled_tree_through_tree_generate(pair4, rule):
    """A depth-3 tree <2,1,1> sampled i.i.d. through tree_generate with a budget of 4 new tokens, so the first step
    keeps all 3 levels (prune(budget - 1)); 4-token distribution against the target's (V = 4: 256 outcomes).
    The correct rule passes; MSS without the residual update on the same models and temperature fails."""
    target, draft = memo(*pair4)
    cfg = SamplingConfig(1.0)
    exact = target_distribution(ToyLM.from_transformer(target, PROMPT4), cfg, 4)
    g = torch.Generator().manual_seed(3)
    kw = {} if rule == "mss" else {"verify": _no_residual_mss}
    samples, deepest = [], 0
    for _ in range(1500):
        out = tree_generate(target, PROMPT4, DraftTreeProposer(draft, [2, 1, 1], "iid", 4), max_new_tokens=4,
                            sampling=cfg, generator=g, **kw)
        samples.append(tuple(out.tokens))
        deepest = max(deepest, out.accepted[0])
    assert deepest == 3  # the whole depth was sampled and accepted at least once
    pval = gof_test(samples, exact)[1]
    assert (pval > LEVEL) if rule == "mss" else (pval < LEVEL), pval


@pytest.mark.parametrize("mode", ["without_replacement", "topk"])
def test_tree_decoding_negative_control_fails(mode):
    # a pair where the draft is peaked and far from the target (alpha = 0.17 at T = 0.5): exact enumeration of this
    # control gives a first-token TV distance of 0.34 (without replacement) and 0.76 (top-k) from the target
    target, draft = memo(tiny_lm("llama", seed=3), tiny_lm("qwen2", seed=4))
    cfg = SamplingConfig(0.5)
    exact = target_distribution(ToyLM.from_transformer(target, PROMPT), cfg, 1)
    # two new tokens so the first step drafts a tree (a 1-token budget is a plain AR step); test the first token
    samples = [s[:1] for s in _tree_samples(target, ClaimsIID(draft, [3], mode, 8), cfg, 300, seed=9)]
    assert gof_test(samples, exact)[1] < LEVEL


# ---------------------------------------------------------------------------------------------- e. the contract

def test_greedy_tree_equals_ar_and_contract(pair):
    target, draft = pair
    ar = generate(target, PROMPT, max_new_tokens=12).tokens
    for prop in (DraftTreeProposer(draft, [2, 2, 1], "topk", 8), DraftTreeProposer(target, [1, 2, 1, 1], "topk", 8),
                 MergedTreeProposer([PromptLookupDrafter(2), DraftModelDrafter(draft, 8)], 3, 8), None):
        out = tree_generate(target, PROMPT, prop, max_new_tokens=12)
        assert out.tokens == ar and len(out.drafted) == len(out.accepted) == out.n_steps
    # self-draft: the whole tree depth is accepted every step, and the budget is exact
    out = tree_generate(target, PROMPT, DraftTreeProposer(target, [1, 2, 1, 1], "topk", 8), max_new_tokens=7)
    assert out.accepted[0] == 4 and len(out.tokens) == 7 and out.tokens == ar[:7]
    # EOS: stop right after the first EOS
    eos = ar[3]
    out = tree_generate(target, PROMPT, DraftTreeProposer(target, [2, 2], "topk", 8), max_new_tokens=12,
                        eos_token_id=eos)
    assert out.tokens == ar[: ar.index(eos) + 1] and out.stopped_at_eos


def test_tree_generate_seed_eos_default_and_batch(pair, monkeypatch):
    target, draft = pair
    cfg = SamplingConfig(1.0)
    prop = DraftTreeProposer(draft, [2, 1], "iid", 8)
    a = tree_generate(target, PROMPT, prop, max_new_tokens=10, sampling=cfg, seed=5).tokens
    assert a == tree_generate(target, PROMPT, prop, max_new_tokens=10, sampling=cfg,
                              generator=torch.Generator().manual_seed(5)).tokens
    with pytest.raises(ValueError, match="either generator= or seed="):
        tree_generate(target, PROMPT, prop, sampling=cfg, seed=5, generator=torch.Generator())
    with pytest.raises(ValueError, match="batches are not supported"):
        tree_generate(target, PROMPT.repeat(2, 1), prop)
    ar = generate(target, PROMPT, max_new_tokens=12).tokens
    monkeypatch.setattr(target.generation_config, "eos_token_id", ar[3])  # the default stop set is the model's
    out = tree_generate(target, PROMPT, DraftTreeProposer(draft, [2, 1], "topk", 8), max_new_tokens=12)
    assert out.tokens == ar[: ar.index(ar[3]) + 1] and out.stopped_at_eos
    assert tree_generate(target, PROMPT, None, max_new_tokens=12, eos_token_id=None).tokens == ar


def test_errors(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="generator"):
        tree_generate(target, PROMPT, None, sampling=SamplingConfig(1.0))
    with pytest.raises(ValueError, match="method"):
        tree_generate(target, PROMPT, None, method="beam")
    with pytest.raises(ValueError, match="max_new_tokens"):
        tree_generate(target, PROMPT, None, max_new_tokens=0)
    with pytest.raises(ValueError, match="target_probs"):
        verify_tree(torch.tensor([-1]), torch.tensor([1]), torch.ones(1, 4) / 4, None, None, "mss")
    with pytest.raises(ValueError, match="mode"):
        DraftTreeProposer(draft, [2], "beam", 8)


class HiddenProbe:
    """A Medusa-like proposer: empty tree until it has a hidden state, then a fixed two-branch tree."""

    needs_hidden = True

    def __init__(self):
        self.seen = []

    def reset(self):
        self.seen = []

    def observe_hidden(self, h):
        self.seen.append(h.clone())

    def propose_tree(self, ids, sampling, generator):
        if not self.seen:
            return TokenTree.empty()
        return TreeTemplate.from_choices([[0], [1], [0, 0]]).fill(torch.tensor([[3, 4], [5, 6]]))


def test_hidden_state_hook(pair):
    target, _ = pair
    probe = HiddenProbe()
    out = tree_generate(target, PROMPT, probe, max_new_tokens=8)
    assert out.drafted[0] == 0 and len(probe.seen) == out.n_steps
    ids = torch.cat([PROMPT, torch.tensor(out.tokens)])
    with torch.inference_mode():
        hs = target(input_ids=ids[None], output_hidden_states=True).hidden_states[-1][0]
    end = PROMPT.numel()
    for k, step in enumerate(out.accepted):  # h = hidden state at the position whose row produced the next token
        end += step + 1
        torch.testing.assert_close(probe.seen[k], hs[end - 2], atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------------------------- f. real model

@pytest.mark.real_model
def test_greedy_tree_equals_ar_on_smollm2(smollm2):
    from specrepro.data import load_workload
    from specrepro.lab.leviathan import encode
    from specrepro.sim.real import greedy_divergence

    model, tok = smollm2
    vocab = model.get_output_embeddings().weight.shape[0]
    flips = []
    for prompt in load_workload("humaneval", 2):
        ids = encode(tok, prompt.text)
        ar = generate(model, ids, max_new_tokens=24, eos_token_id=tok.eos_token_id).tokens
        for prop in (MergedTreeProposer([PromptLookupDrafter(3), PromptLookupDrafter(1)], 4, vocab),
                     DraftTreeProposer(model, [2, 2, 1], "topk", vocab)):
            out = tree_generate(model, ids, prop, max_new_tokens=24, eos_token_id=tok.eos_token_id)
            div = greedy_divergence(model, ids, ar, out.tokens)
            if div is not None:
                flips.append((prompt.id, div))
                assert div[1] < 1e-3, f"{prompt.id}: diverged at {div[0]} with logit gap {div[1]}"
            else:
                assert len(out.tokens) == len(ar)
    assert len(flips) <= 1, flips
