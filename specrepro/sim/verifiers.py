"""Exact output distributions of the verifiers of :mod:`specrepro.core.verifiers` (and of the project's own rules) on
toy models, by enumeration: every draft or drawn tree with its probability, every verification outcome with its
probability, step after step, to the distribution of the first ``length`` tokens.

What it is not: the rules themselves (:mod:`specrepro.core.verifiers`, :mod:`specrepro.core.trees`).
"""

from __future__ import annotations

import torch

from specrepro.core.sampling import SamplingConfig
from specrepro.sim.trees import drawn_tree_outcomes

__all__ = ["chain_step_distribution", "tree_step_distribution", "multistep_distribution"]


def chain_step_distribution(target, draft, config: SamplingConfig, gamma: int, outcomes_fn, prefix: tuple = ()):
    """{emitted tuple: probability} of one chain step after ``prefix``: every γ-token draft (weighted by q) and every
    outcome of ``outcomes_fn(ps [γ+1, V], qs [γ, V] or None, drafted tuple) -> [(n_accepted, next, prob)]``."""
    dist: dict = {}

    def rec(drafted, qprob, qs):
        if len(drafted) < gamma:
            q = draft.probs(prefix + drafted, config)
            for x in q.nonzero().flatten().tolist():
                rec(drafted + (x,), qprob * float(q[x]), qs + [q])
            return
        ps = torch.stack([target.probs(prefix + drafted[:i], config) for i in range(gamma + 1)])
        for n, y, pr in outcomes_fn(ps, torch.stack(qs) if qs else None, drafted):
            if pr * qprob > 0:
                key = drafted[:n] + (y,)
                dist[key] = dist.get(key, 0.0) + qprob * pr

    rec((), 1.0, [])
    return dist


def tree_step_distribution(target, draft, config: SamplingConfig, template, mode: str, outcomes_fn,
                           prefix: tuple = ()):
    """{emitted tuple: probability} of one tree step after ``prefix``: every tree the draft proposer can draw
    (:func:`drawn_tree_outcomes`) and every outcome of ``outcomes_fn(parents, tokens, target_rows, proposal_rows)
    -> [(path, next, prob)]``."""
    dist: dict = {}
    for tree, pt in drawn_tree_outcomes(draft, config, template, mode, prefix):
        toks = tree.tokens.tolist()
        tp = torch.stack([target.probs(prefix, config)] +
                         [target.probs(prefix + tuple(toks[j] for j in tree.path_to(i)), config)
                          for i in range(tree.n)])
        qp = None if tree.proposal_probs is None else tree.proposal_probs.to(tp.dtype)
        for path, y, pv in outcomes_fn(tree.parents, tree.tokens, tp, qp):
            if pv * pt > 0:
                key = tuple(toks[j] for j in path) + (y,)
                dist[key] = dist.get(key, 0.0) + pt * pv
    return dist


def multistep_distribution(step, length: int, prefix: tuple = ()) -> dict:
    """Exact distribution of the first ``length`` tokens of a decoding run whose one-step law after a context is
    ``step(context, remaining) -> {emitted tuple: probability}`` (memoized per context and remaining budget)."""
    out: dict = {}
    memo: dict = {}

    def rec(seq, prob):
        if len(seq) >= length:
            out[seq[:length]] = out.get(seq[:length], 0.0) + prob
            return
        key = (prefix + seq, length - len(seq))
        if key not in memo:
            memo[key] = step(prefix + seq, length - len(seq))
        for emitted, pr in memo[key].items():
            rec(seq + emitted, prob * pr)

    rec((), 1.0)
    return out
