"""Exact enumeration of chain speculative sampling on toy models: the output distribution of every verification
rule, and the target distribution it must equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from specrepro.core.sampling import (
    SamplingConfig,
    acceptance_probability,
    block_verification_terms,
    residual_distribution,
    verify_block,
    verify_chain,
)
from specrepro.sim.toy import ToyLM

__all__ = ["Rule", "RULES", "NEGATIVE_CONTROLS", "target_distribution", "exact_chain_distribution", "sample_chain_sequences", "expected_tokens_per_step"]


@dataclass(frozen=True)
class Rule:
    """The pieces of a verification rule: acceptance probability, residual, and which q the rule divides by.

    ``q_for_rule='processed'`` is correct; 'raw' uses the draft's unprocessed softmax in the ratio and the residual
    while drafts are still sampled from the processed q (the bug of transformers#47932).
    ``kind='token'`` is token verification (Leviathan Alg. 1, pieces ``accept`` and ``residual``); ``kind='block'``
    is block verification (Sun et al. 2025), whose pieces are ``block_terms(p [g+1, V], q [g, V], tokens [g]) ->
    (h [g], residual_rows [g, V])`` (:func:`~specrepro.core.sampling.block_verification_terms`).
    """

    name: str
    accept: Callable = acceptance_probability
    residual: Callable = residual_distribution
    q_for_rule: str = "processed"
    kind: str = "token"
    block_terms: Callable = block_verification_terms


RULES = {
    "speculative": Rule("speculative"),
    # negative controls: each is a plausible mistake that must fail the battery
    "no_residual": Rule("no_residual", residual=lambda p, q, tok: p),
    "resample_from_q": Rule("resample_from_q", residual=lambda p, q, tok: p if q is None else q),
    "raw_q": Rule("raw_q", q_for_rule="raw"),
    # the second exact chain rule
    "block": Rule("block", kind="block"),
}
NEGATIVE_CONTROLS = ("no_residual", "resample_from_q", "raw_q")


def target_distribution(target: ToyLM, config: SamplingConfig, length: int, prefix: tuple = ()) -> dict:
    """Exact distribution of the next ``length`` tokens sampled autoregressively from the processed target."""
    out = {}

    def rec(seq, prob):
        if len(seq) == length:
            out[seq] = out.get(seq, 0.0) + prob
            return
        p = target.probs(prefix + seq, config)
        for x in torch.nonzero(p).flatten().tolist():
            rec(seq + (x,), prob * float(p[x]))

    rec((), 1.0)
    return out


def chain_verify_outcomes(ps: torch.Tensor, qs: torch.Tensor | None, drafted: tuple, rule: Rule) -> list:
    """Every outcome of verifying one fixed drafted block: list of (n_accepted, next_token, probability), with the
    same pieces the samplers use (``rule.accept``/``rule.residual`` for token verification, ``rule.block_terms``
    for block verification). ps: float [g+1, V]; qs: float [g, V] (the q the rule divides by) or None if g = 0."""
    g = len(drafted)
    out = []
    if g == 0:
        p = ps[0]
        return [(0, y, float(p[y])) for y in torch.nonzero(p).flatten().tolist()]
    if rule.kind == "block":
        h, rrows = rule.block_terms(ps, qs, torch.tensor(drafted, dtype=torch.long))
        h = h.tolist()
        survive = 1.0
        for k in range(g, -1, -1):
            pk = survive * (h[k - 1] if k > 0 else 1.0)
            survive *= 1.0 - (h[k - 1] if k > 0 else 1.0)
            if pk <= 0:
                continue
            if k == g:
                row = ps[g]
            else:
                mass = rrows[k].sum()
                row = rrows[k] / mass if bool(mass > 0) else ps[k]
            for y in torch.nonzero(row).flatten().tolist():
                out.append((k, y, pk * float(row[y])))
        return out
    reach = 1.0
    for i, x in enumerate(drafted):
        p = ps[i]
        a = float(rule.accept(p[x:x + 1], qs[i][x:x + 1])[0])
        if a < 1:
            r = rule.residual(p, qs[i], x)
            for y in torch.nonzero(r).flatten().tolist():
                out.append((i, y, reach * (1 - a) * float(r[y])))
        reach *= a
        if reach == 0:
            return out
    for y in torch.nonzero(ps[g]).flatten().tolist():
        out.append((g, y, reach * float(ps[g][y])))
    return out


def _step_outcomes(target, draft, config, rule, gamma, prefix, memo=None):
    """Every outcome of one verification step: list of (emitted tokens tuple, probability)."""
    memo = {} if memo is None else memo

    def probs(model, kind, ctx):
        key = (kind, ctx)
        if key not in memo:
            memo[key] = model.probs(ctx, config) if kind != "raw" else model.raw(ctx)
        return memo[key]

    outcomes = []

    def rec(drafted, q_prob, qs):
        if len(drafted) < gamma:
            q = probs(draft, "q", prefix + drafted)
            q_rule = q if rule.q_for_rule == "processed" else probs(draft, "raw", prefix + drafted)
            for x in torch.nonzero(q).flatten().tolist():
                rec(drafted + (x,), q_prob * float(q[x]), qs + [q_rule])
            return
        ps = torch.stack([probs(target, "p", prefix + drafted[:i]) for i in range(len(drafted) + 1)])
        for n, y, pr in chain_verify_outcomes(ps, torch.stack(qs) if qs else None, drafted, rule):
            if pr > 0:
                outcomes.append((drafted[:n] + (y,), q_prob * pr))

    rec((), 1.0, [])
    return outcomes


def exact_chain_distribution(target: ToyLM, draft: ToyLM, config: SamplingConfig, gamma: int, length: int,
                             rule: Rule | str = "speculative", prefix: tuple = ()) -> dict:
    """Exact distribution of the first ``length`` tokens emitted by chain speculative sampling.

    Enumerates every drafted block (weighted by q), every accept/reject outcome (weighted by the rule's acceptance
    probabilities) and every residual/bonus token, over as many verification steps as it takes to emit ``length``
    tokens. Leviathan et al. 2023, Thm. 3.5 says the result equals :func:`target_distribution` for the correct rule
    (Sun et al. 2025, Thm. 1 for block verification). Like :func:`specrepro.core.decoding.generate`, a step drafts
    g = min(gamma, remaining - 1) tokens, so an all-accepted block and its bonus token both fall inside the horizon
    (choose ``length >= gamma + 1`` to see a full block and its bonus token).

    Returns:
        dict mapping token tuples of length ``length`` to probabilities (float, summing to 1).
    """
    rule = RULES[rule] if isinstance(rule, str) else rule
    out: dict = {}
    memo: dict = {}

    def rec(seq, prob):
        if len(seq) >= length:
            key = seq[:length]
            out[key] = out.get(key, 0.0) + prob
            return
        g = min(gamma, length - len(seq) - 1)  # as generate: the block and its bonus token fit in the horizon
        for emitted, pr in _step_outcomes(target, draft, config, rule, g, prefix + seq, memo):
            if pr > 0:
                rec(seq + emitted, prob * pr)

    rec((), 1.0)
    return out


def sample_chain_sequences(target: ToyLM, draft: ToyLM, config: SamplingConfig, gamma: int, length: int, n: int,
                           generator: torch.Generator, rule: Rule | str = "speculative", prefix: tuple = ()) -> list:
    """Draw ``n`` length-``length`` sequences with the real :func:`~specrepro.core.sampling.verify_chain` (or
    :func:`~specrepro.core.sampling.verify_block` for block rules; and ``rule``'s pieces for negative controls). Each step
    drafts g = min(gamma, remaining - 1) tokens, as :func:`exact_chain_distribution` and the decoding loop."""
    rule = RULES[rule] if isinstance(rule, str) else rule
    kw = {}
    if rule.kind == "block":
        if rule.block_terms is not block_verification_terms:
            kw["terms_fn"] = rule.block_terms
    else:
        if rule.accept is not acceptance_probability:
            kw["accept_fn"] = rule.accept
        if rule.residual is not residual_distribution:
            kw["residual_fn"] = rule.residual
    verify = verify_block if rule.kind == "block" else verify_chain
    from tqdm.auto import tqdm

    memo: dict = {}  # each context's rows are computed once (the same tensors every time: the draws are unchanged)

    def rows(model, kind, ctx):
        key = (kind, ctx)
        if key not in memo:
            memo[key] = model.raw(ctx) if kind == "raw" else model.probs(ctx, config)
        return memo[key]

    out = []
    for _ in tqdm(range(n), desc=f"sample {rule.name}", unit="seq", delay=2, disable=None):  # bar after 2 s only
        seq = ()
        while len(seq) < length:
            g = min(gamma, length - len(seq) - 1)
            toks, qs = [], []
            for _ in range(g):
                q = rows(draft, "q", prefix + seq + tuple(toks))
                toks.append(int(torch.multinomial(q, 1, generator=generator)))
                qs.append(q if rule.q_for_rule == "processed" else rows(draft, "raw", prefix + seq + tuple(toks[:-1])))
            ps = torch.stack([rows(target, "p", prefix + seq + tuple(toks[:i])) for i in range(g + 1)])
            k, nxt = verify(ps, torch.stack(qs) if qs else None, torch.tensor(toks, dtype=torch.long), generator, **kw)
            seq = seq + tuple(toks[:k]) + (nxt,)
        out.append(seq[:length])
    return out


# ----------------------------------------------------------------------------------------------------------------
# Block vs token verification: expected (enumerated) and measured tokens per step
# ----------------------------------------------------------------------------------------------------------------

def expected_tokens_per_step(target: ToyLM, draft: ToyLM, config: SamplingConfig, gamma: int,
                             rule: Rule | str = "speculative", prefix: tuple = ()) -> float:
    """E[tokens emitted by one verification step of gamma drafted tokens] after ``prefix``, by exact enumeration
    (accepted draft tokens + the correction or bonus token; between 1 and gamma + 1). Token verification is
    ``rule="speculative"``, block verification ``rule="block"``; Sun et al. 2025 Thm. 2 says block >= token."""
    rule = RULES[rule] if isinstance(rule, str) else rule
    return float(sum(len(e) * p for e, p in _step_outcomes(target, draft, config, rule, gamma, prefix)))
