"""Exact output distributions of token-tree speculative sampling on toy models, by enumeration.

What this file is: every drawn tree and every verification outcome of :mod:`specrepro.core.trees`' rules,
enumerated with their probabilities. What it is not: the sampler (``core.trees``).
"""

from __future__ import annotations

import torch

from specrepro.core.sampling import SamplingConfig
from specrepro.core.trees import (
    TokenTree,
    TreeTemplate,
    children_outcomes,
    verify_tree_outcomes,
)

__all__ = ["drawn_tree_outcomes", "exact_tree_distribution"]


def drawn_tree_outcomes(draft, config: SamplingConfig, template: TreeTemplate, mode: str, prefix: tuple = (),
                        row_override=None):
    """Every token tree a :class:`DraftTreeProposer` with ``template`` and ``mode`` can draw after ``prefix``, with
    its probability (exact enumeration for small vocabularies; the exactness battery's analytic side).

    Args:
        draft: a :class:`~specrepro.sim.toy.ToyLM` (``probs(prefix, config)`` float64 [V]; ``logits_fn`` ranks
            top-k children, as the proposer ranks by raw logits).
        row_override: only for negative controls: ``f(q, tokens tuple, rows) -> rows`` replaces the proposal rows
            the tree claims (e.g. claim i.i.d. rows for children drawn without replacement).

    Returns:
        list of (TokenTree, probability).
    """
    t = template
    groups: dict = {}
    for i, p in enumerate(t.parents):
        groups.setdefault(p, []).append(i)
    order = sorted(groups)  # parent -1 first; a parent is placed before its own children's group
    out = []

    def rec(gi, placed, parents, tokens, rows, prob):
        # placed: template node -> (tree node index, context tuple)
        if gi == len(order):
            if not tokens:
                out.append((TokenTree.empty(), prob))
                return
            rws = None if mode == "topk" and row_override is None else torch.stack(rows)
            out.append((TokenTree(torch.tensor(parents), torch.tensor(tokens), rws), prob))
            return
        tparent = order[gi]
        if tparent >= 0 and tparent not in placed:  # the parent was never drawn (fewer children than asked)
            rec(gi + 1, placed, parents, tokens, rows, prob)
            return
        node, ctx = placed[tparent] if tparent >= 0 else (-1, prefix)
        kids = groups[tparent]
        q = draft.probs(ctx, config)
        k = (max(t.ranks[c] for c in kids) + 1) if mode == "topk" else len(kids)
        for toks, rws, pr in children_outcomes(q, k, mode, scores=draft.logits_fn(ctx).double()):
            if mode == "topk":
                toks = tuple(toks[min(t.ranks[c], len(toks) - 1)] for c in kids)
                rws = None
            if row_override is not None:
                rws = row_override(q, toks, rws)
            new_placed = dict(placed)
            par, tok, row = list(parents), list(tokens), list(rows)
            for j, x in enumerate(toks):
                new_placed[kids[j]] = (len(par), ctx + (x,))
                par.append(node)
                tok.append(x)
                if rws is not None:
                    row.append(rws[j])
            rec(gi + 1, new_placed, par, tok, row, prob * pr)

    rec(0, {}, [], [], [], 1.0)
    return out


def exact_tree_distribution(target, draft, config: SamplingConfig, template: TreeTemplate, mode: str, length: int,
                            method: str = "mss", prefix: tuple = (), row_override=None, **rule) -> dict:
    """Exact distribution of the first ``length`` tokens emitted by token-tree speculative decoding.

    Enumerates every drawn tree (:func:`drawn_tree_outcomes`), every outcome of its verification
    (:func:`verify_tree_outcomes`, the same acceptance probability and residual as :func:`verify_tree`) and every
    later step until ``length`` tokens are out. For an exact rule the result equals
    :func:`specrepro.sim.exact.target_distribution` (SpecInfer Thm 4.2; Sequoia Thm 3.2 for sampling without
    replacement).

    Args:
        target, draft: :class:`~specrepro.sim.toy.ToyLM`.
        rule: ``accept_fn`` / ``residual_fn`` replacements (negative controls).

    Returns:
        dict token tuple (length ``length``) -> probability.
    """
    out: dict = {}
    steps: dict = {}  # context -> {emitted tuple: probability} of one step (memoized)
    probs: dict = {}

    def tprobs(ctx):
        if ctx not in probs:
            probs[ctx] = target.probs(ctx, config)
        return probs[ctx]

    def step(ctx):
        if ctx not in steps:
            dist: dict = {}
            for tree, pt in drawn_tree_outcomes(draft, config, template, mode, ctx, row_override):
                toks = tree.tokens.tolist()
                rows = [tprobs(ctx)] + [tprobs(ctx + tuple(toks[j] for j in tree.path_to(i))) for i in range(tree.n)]
                tp = torch.stack(rows)
                qp = None if tree.proposal_probs is None else tree.proposal_probs.to(tp.dtype)
                for path, nxt, pv in verify_tree_outcomes(tree.parents, tree.tokens, tp, qp, method, **rule):
                    if pv * pt > 0:
                        key = tuple(toks[j] for j in path) + (nxt,)
                        dist[key] = dist.get(key, 0.0) + pt * pv
            steps[ctx] = dist
        return steps[ctx]

    def rec(seq, prob):
        if len(seq) >= length:
            out[seq[:length]] = out.get(seq[:length], 0.0) + prob
            return
        for emitted, pr in step(prefix + seq).items():
            rec(seq + emitted, prob * pr)

    rec((), 1.0)
    return out
