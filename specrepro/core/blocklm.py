"""Chain speculative decoding on any model backend that gives block logits and a cache that can be cut back.

What this file is: the :class:`BlockLM` protocol (the three things a decoding loop needs of a model: a block forward
on the cached prefix returning logits for every new position, cutting the cache back to a length, and the vocabulary
size) and :func:`chain_generate`, the chain speculative decoding loop of Leviathan et al. (2023), Algorithm 1 /
Chen et al. (2023), Algorithm 2, driven through it: the draft proposes gamma tokens one forward at a time, the target
scores the whole block in one forward, and :func:`~specrepro.core.sampling.verify_chain` (or
:func:`~specrepro.core.sampling.verify_block`) decides; both caches are cut back after a rejection. The verifiers are
the project's own (:mod:`specrepro.core.sampling`), not a copy: the loop never knows which backend it drives.

It follows :func:`specrepro.core.decoding.generate` step for step (same cache convention, same commit rule, same
:class:`~specrepro.core.decoding.GenerationResult`); that loop stays the one for transformers models, whose
``DynamicCache`` it manages directly. A llama.cpp backend is :class:`specrepro.backends.llamacpp.LlamaCppLM`.

What it is not: a token-tree or Medusa loop, or a batched server (batch size 1).
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch

from specrepro.core.decoding import (
    MODEL_EOS,
    GenerationResult,
    Stopwatch,
    commit_step,
    common_prefix,
    make_generator,
    prompt_ids,
)
from specrepro.core.sampling import GREEDY, SamplingConfig, logits_to_probs, sample, verify_block, verify_chain

__all__ = ["BlockLM", "chain_generate"]


@runtime_checkable
class BlockLM(Protocol):
    """A causal LM with a KV cache over one sequence, as the backend-neutral loop drives it.

    * ``vocab_size``: V, the width of every logits row.
    * ``forward_block(token_ids, logits_to_keep=None)``: append ``token_ids`` (n >= 1 ints) to the cached prefix,
      run them through the model in one call, and return the logits of the last ``logits_to_keep`` of them (all n
      when None; none for 0) as float32 [k, V] on the CPU, row i being the next-token logits after new token i.
    * ``truncate(length)``: keep the first ``length`` cached positions, drop the rest (no-op when not longer).
    * ``reset()``: empty the cache.
    """

    vocab_size: int

    def forward_block(self, token_ids: Sequence[int], logits_to_keep: int | None = None) -> torch.Tensor: ...

    def truncate(self, length: int) -> None: ...

    def reset(self) -> None: ...


def _stop_ids(eos_token_id, target) -> set[int]:
    if eos_token_id is MODEL_EOS:
        return {int(e) for e in getattr(target, "eos_token_ids", ())}
    if eos_token_id is None:
        return set()
    if isinstance(eos_token_id, int):
        return {eos_token_id}
    return {int(e) for e in eos_token_id}


def chain_generate(
    target: BlockLM,
    input_ids,
    *,
    draft: BlockLM | None = None,
    gamma: int = 4,
    max_new_tokens: int = 128,
    sampling: SamplingConfig = GREEDY,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    eos_token_id=MODEL_EOS,
    verification="token",
) -> GenerationResult:
    """Decode from ``target`` autoregressively (``draft=None``) or by chain speculative decoding with the draft
    model ``draft`` (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023, Algorithm 2), both :class:`BlockLM`.

    Each step: the draft, on its own cache (cut back to the longest prefix it shares with the committed sequence),
    samples x_1..x_g, g = min(gamma, tokens left - 1), one forward each, x_i ~ q_i with q_i its logits processed by
    :func:`~specrepro.core.sampling.logits_to_probs`; the target runs ``[last committed token, x_1..x_g]`` in one
    forward (g + 1 rows of logits, row i its distribution before x_{i+1}, row g the bonus position), processed by the
    same function into p; ``verification`` accepts a prefix of the block and draws the correction or bonus token;
    the target's cache is cut back to the committed length minus one (the cache convention of
    :func:`specrepro.core.decoding.generate`), which drops the rejected positions.

    Args:
        target, draft: :class:`BlockLM` models over the same vocabulary (e.g.
            :class:`specrepro.backends.llamacpp.LlamaCppLM`). Both are reset first.
        input_ids: the prompt, long [L] or [1, L] (a tensor), or a sequence of L ints; L >= 1.
        gamma: draft length γ >= 1 (ignored without a draft).
        max_new_tokens: the exact cap on new tokens (>= 1).
        sampling: temperature / top-k / top-p, applied identically to target and draft (temperature 0 = greedy).
        generator: a CPU ``torch.Generator``, the only source of randomness (needed unless greedy).
        seed: instead of ``generator``: a new CPU generator seeded with ``seed``.
        eos_token_id: stop after this token (or any of these), which is kept; default :data:`MODEL_EOS`: the
            target's ``eos_token_ids`` attribute (none if it has none); None or ``()``: never stop early.
        verification: "token" (:func:`~specrepro.core.sampling.verify_chain`, Leviathan Alg. 1), "block"
            (:func:`~specrepro.core.sampling.verify_block`, Sun et al. 2025), or a callable with verify_chain's
            signature (negative controls: a wrong rule must fail the same tests).

    Returns:
        :class:`~specrepro.core.decoding.GenerationResult` (tokens, per-step drafted/accepted counts, alpha terms,
        phase times in seconds: 'prefill', 'draft', 'target', 'verify', 'total'). The tokens are distributed exactly
        as AR sampling from the processed target (Leviathan Thm. 3.5); under greedy they equal the target's AR
        greedy tokens up to floating-point ties between block and one-token logits.

    Raises:
        ValueError: gamma < 1 (or not an integer) with a draft; max_new_tokens < 1; an empty prompt or a batch;
            target and draft vocabulary sizes that differ; sampling without a generator or seed, or both given;
            NaN logits (from :func:`~specrepro.core.sampling.logits_to_probs`); unknown ``verification``.
    """
    if not callable(verification) and verification not in ("token", "block"):
        raise ValueError(f"unknown verification {verification!r}; expected 'token' or 'block'")
    if draft is not None and (isinstance(gamma, bool) or int(gamma) != gamma or gamma < 1):
        raise ValueError(f"gamma (draft length) must be an integer >= 1, got {gamma!r}")
    if isinstance(max_new_tokens, bool) or int(max_new_tokens) != max_new_tokens or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if draft is not None and int(draft.vocab_size) != int(target.vocab_size):
        raise ValueError(f"target and draft vocabularies differ: {target.vocab_size} vs {draft.vocab_size} tokens "
                         f"(draft tokens would mean other strings to the target)")
    ids_t = input_ids if isinstance(input_ids, torch.Tensor) else torch.as_tensor(list(input_ids), dtype=torch.long)
    ids: list[int] = prompt_ids(ids_t, "cpu").tolist()
    generator = make_generator(generator, seed, "cpu")
    if generator is None and not sampling.greedy:
        raise ValueError("sampling needs an explicit torch.Generator (pass generator=torch.Generator().manual_seed(s) "
                         "or seed=s)")
    verify = verification if callable(verification) else (verify_chain if verification == "token" else verify_block)
    eos = _stop_ids(eos_token_id, target)
    clock = Stopwatch("cpu")
    res = GenerationResult(tokens=[], prompt_len=len(ids))

    t_start = clock.start()
    target.reset()
    if len(ids) > 1:
        target.forward_block(ids[:-1], logits_to_keep=0)
    draft_cached: list[int] = []  # what the draft's cache holds
    if draft is not None:
        draft.reset()
    t = clock.stop("prefill", t_start)

    new: list[int] = []
    while len(new) < max_new_tokens:
        budget = max_new_tokens - len(new)
        g = min(int(gamma), budget - 1) if draft is not None else 0
        drafted: list[int] = []
        q_rows: list[torch.Tensor] = []
        if g > 0:
            keep = min(common_prefix(torch.tensor(draft_cached, dtype=torch.long),
                                     torch.tensor(ids, dtype=torch.long)), len(ids) - 1)
            draft.truncate(keep)
            feed = ids[keep:]
            draft_cached = ids[:keep]
            for _ in range(g):
                logits = draft.forward_block(feed, logits_to_keep=1)[-1]
                draft_cached = draft_cached + list(feed)
                q = logits_to_probs(logits, sampling)
                x = int(q.argmax()) if sampling.greedy else int(sample(q, generator))
                drafted.append(x)
                q_rows.append(q)
                feed = [x]
            t = clock.stop("draft", t)
        draft_tokens = torch.tensor(drafted, dtype=torch.long)
        draft_probs = torch.stack(q_rows) if q_rows else None
        logits = target.forward_block([ids[-1]] + drafted)
        t_new = clock.stop("target", t)
        res.forward_sizes.append(g + 1)
        res.target_times.append(t_new - t)
        t = t_new
        if logits.shape != (g + 1, int(target.vocab_size)):
            raise ValueError(f"the target returned logits of shape {tuple(logits.shape)} for a block of {g + 1} "
                             f"tokens over {target.vocab_size}")
        p = logits_to_probs(logits, sampling)
        n, nxt = verify(p, draft_probs, draft_tokens, generator)
        if g:
            rows = p[: min(n + 1, g)]
            qs = draft_probs[: rows.shape[0]]
            # a probability: a float32 sum over the vocabulary may pass 1 by rounding when q = p
            res.alpha_terms.extend(torch.minimum(rows, qs).sum(-1).clamp(max=1.0).tolist())
        step = commit_step(drafted[:n] + [nxt], budget, eos, res)
        res.drafted.append(g)
        res.accepted.append(n)
        new.extend(step)
        ids.extend(step)
        target.truncate(len(ids) - 1)
        t = clock.stop("verify", t)
        if res.stopped_at_eos:
            break
    clock.stop("total", t_start)
    res.tokens = new
    res.times = dict(clock.totals)
    return res
