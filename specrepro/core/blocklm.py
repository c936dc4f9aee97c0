"""Chain speculative decoding on any model backend that gives block logits and a cache that can be cut back.

What this file is: the :class:`BlockLM` protocol (the three things a decoding loop needs of a model: a block forward
on the cached prefix returning logits for every new position, cutting the cache back to a length, and the vocabulary
size), :func:`draft_block` (the draft side of chain speculative decoding over a BlockLM draft: its own cache cut back
to the longest prefix it shares with the committed sequence, then one forward per drafted token), and
:func:`chain_generate`, the loop of Leviathan et al. (2023), Algorithm 1 / Chen et al. (2023), Algorithm 2 with a
BlockLM target and a BlockLM draft: a thin wrapper of :func:`specrepro.core.decoding.generate`, the one decoding loop,
which drives every target through this protocol (a transformers model through
:class:`specrepro.backends.hf.HFCausalLM`). Backends: :class:`specrepro.backends.llamacpp.LlamaCppLM` (llama.cpp),
:class:`specrepro.backends.hf.HFCausalLM` (transformers).

The drafter of a BlockLM draft with a dynamic block length (``stop_below``, the stop rule of
:class:`~specrepro.drafters.adaptive.AdaptiveLengthDrafter`) is :class:`specrepro.drafters.model.BlockLMDrafter`,
which drafts with :func:`draft_block`.

What it is not: a token-tree or Medusa loop, or a batched server (batch size 1).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Protocol, Sequence, runtime_checkable

import torch

from specrepro.core.decoding import MODEL_EOS, GenerationResult, common_prefix, generate
from specrepro.core.sampling import GREEDY, SamplingConfig, fit_width, logits_to_probs, sample

__all__ = ["BlockLM", "chain_generate", "draft_block"]


@runtime_checkable
class BlockLM(Protocol):
    """A causal LM with a KV cache over one sequence, as the decoding loop drives it.

    * ``vocab_size``: V, the width of every logits row.
    * ``forward_block(token_ids, logits_to_keep=None)``: append ``token_ids`` (n >= 1 ints: a sequence of ints;
      :class:`~specrepro.backends.hf.HFCausalLM` also takes a long [n] tensor) to the cached prefix, run them through
      the model in one call, and return the logits of the last ``logits_to_keep`` of them (all n when None; none for
      0) as float [k, V] on the model's device (float32 on the CPU for llama.cpp; the model's dtype and device for
      transformers), row i being the next-token logits after new token i.
    * ``truncate(length)``: keep the first ``length`` cached positions, drop the rest (no-op when not longer).
    * ``reset()``: empty the cache.

    Optional: ``device`` (where the logits are; the CPU when absent) and ``eos_token_ids`` (the model's stop ids,
    the default of the loop's ``eos_token_id``).
    """

    vocab_size: int

    def forward_block(self, token_ids: Sequence[int], logits_to_keep: int | None = None) -> torch.Tensor: ...

    def truncate(self, length: int) -> None: ...

    def reset(self) -> None: ...


def draft_block(lm: BlockLM, cached: torch.Tensor, ids: torch.Tensor, gamma: int, sampling: SamplingConfig,
                generator: torch.Generator | None, *, vocab_size: int | None = None,
                stop: Callable[[int, torch.Tensor, int], bool] | None = None):
    """Draft up to ``gamma`` tokens continuing ``ids`` with the BlockLM ``lm`` (the draft model of Leviathan et al.
    2023, Alg. 1: x_i ~ q_i, one forward per token, on the draft's own KV cache).

    The cache, which holds ``cached``, is first cut back to the longest prefix ``cached`` shares with ``ids`` (at most
    L - 1 tokens, so that one forward yields the next-token logits); the rest of ``ids`` is fed in one block, then
    each drafted token. q_i is the draft's logits (padded with -inf or cut to ``vocab_size`` when given)
    processed by :func:`~specrepro.core.sampling.logits_to_probs`; x_i its argmax under greedy decoding, else a draw
    with ``generator``. ``stop(i, logits, x_i)`` (raw logits float [V], called after the i-th token) ends the block
    early when it returns True (a dynamic draft length).

    Args:
        lm: the draft :class:`BlockLM`; cached: long [C] on the CPU, the tokens ``lm``'s cache holds;
        ids: long [L], L >= 1, the committed sequence (any device); gamma: the most tokens to draft (>= 0).

    Returns:
        ``(tokens, probs, cached)``: long [g] on the CPU (0 <= g <= gamma), float [g, V] on ``lm``'s device (None when
        g = 0), and long [L + g - 1] on the CPU (L' = keep when g = 0), what ``lm``'s cache holds afterwards.

    Raises:
        ValueError: NaN logits (from :func:`~specrepro.core.sampling.logits_to_probs`).
    """
    ids = ids.cpu()
    keep = min(common_prefix(cached, ids), ids.shape[0] - 1)
    lm.truncate(keep)
    feed = ids[keep:].tolist()
    tokens: list[int] = []
    probs: list[torch.Tensor] = []
    for _ in range(int(gamma)):
        logits = fit_width(lm.forward_block(feed, logits_to_keep=1)[-1], vocab_size)
        q = logits_to_probs(logits, sampling)
        x = int(q.argmax()) if sampling.greedy else int(sample(q, generator))
        tokens.append(x)
        probs.append(q)
        feed = [x]
        if stop is not None and stop(len(tokens), logits, x):
            break
    tok = torch.tensor(tokens, dtype=torch.long)
    cached = torch.cat([ids, tok[:-1]]) if tokens else ids[:keep].clone()  # the last token is not fed yet
    return tok, (torch.stack(probs) if probs else None), cached


def prefill_block(lm: BlockLM, ids: torch.Tensor) -> torch.Tensor:
    """Reset the BlockLM ``lm`` and take the prompt ``ids`` (long [L], L >= 2) into its cache, every token but the
    last, in one ``forward_block`` with no logits; returns the tokens its cache now holds (long [L - 1], CPU), the
    ``cached`` that :func:`draft_block` takes next."""
    ids = ids.cpu()
    lm.reset()
    lm.forward_block(ids[:-1].tolist(), logits_to_keep=0)
    return ids[:-1].clone()


class _Proposal(NamedTuple):
    tokens: torch.Tensor
    probs: torch.Tensor | None


class _FixedLengthDraft:
    """The drafter :func:`chain_generate` wraps a BlockLM draft in: exactly ``gamma`` tokens by :func:`draft_block`
    (:class:`specrepro.drafters.model.BlockLMDrafter` without a dynamic length)."""

    def __init__(self, lm: BlockLM):
        self.lm = lm
        self.name = "draft model"
        self.reset()

    def reset(self) -> None:
        self.lm.reset()
        self.cached_ids = torch.empty(0, dtype=torch.long)

    def prefill(self, ids):
        self.cached_ids = prefill_block(self.lm, ids)

    def propose(self, ids, gamma, sampling, generator):
        tok, probs, self.cached_ids = draft_block(self.lm, self.cached_ids, ids, gamma, sampling, generator)
        return _Proposal(tok, probs)


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
    model ``draft`` (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023, Algorithm 2), both :class:`BlockLM`:
    :func:`specrepro.core.decoding.generate` with the draft drafting exactly γ tokens per step (:func:`draft_block`).

    Each step: the draft, on its own cache (cut back to the longest prefix it shares with the committed sequence),
    samples x_1..x_g, g = min(gamma, tokens left - 1), one forward each, x_i ~ q_i with q_i its logits processed by
    :func:`~specrepro.core.sampling.logits_to_probs`; the target runs ``[last committed token, x_1..x_g]`` in one
    forward (g + 1 rows of logits, row i its distribution before x_{i+1}, row g the bonus position), processed by the
    same function into p; ``verification`` accepts a prefix of the block and draws the correction or bonus token;
    the target's cache is cut back to the committed length minus one, which drops the rejected positions.

    Args:
        target, draft: :class:`BlockLM` models over the same vocabulary (e.g.
            :class:`specrepro.backends.llamacpp.LlamaCppLM`). Both are reset first.
        input_ids: the prompt, long [L] or [1, L] (a tensor), or a sequence of L ints; L >= 1.
        gamma: draft length γ >= 1 (ignored without a draft).
        max_new_tokens: the exact cap on new tokens (>= 1).
        sampling: temperature / top-k / top-p, applied identically to target and draft (temperature 0 = greedy).
        generator: a ``torch.Generator`` on the target's device (the CPU for llama.cpp), the only source of
            randomness (needed unless greedy).
        seed: instead of ``generator``: a new generator seeded with ``seed``.
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
    if draft is not None and (isinstance(gamma, bool) or int(gamma) != gamma or gamma < 1):
        raise ValueError(f"gamma (draft length) must be an integer >= 1, got {gamma!r}")
    if isinstance(max_new_tokens, bool):
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if draft is not None and int(draft.vocab_size) != int(target.vocab_size):
        raise ValueError(f"target and draft vocabularies differ: {target.vocab_size} vs {draft.vocab_size} tokens "
                         f"(draft tokens would mean other strings to the target)")
    return generate(target, input_ids, drafter=_FixedLengthDraft(draft) if draft is not None else None,
                    gamma=int(gamma), max_new_tokens=max_new_tokens, sampling=sampling, generator=generator,
                    seed=seed, eos_token_id=eos_token_id, verification=verification)
