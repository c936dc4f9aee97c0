"""Draft-model drafters: a small causal LM proposes γ tokens with their distributions q (Leviathan et al. 2023,
Chen et al. 2023): a transformers model, optionally with a vocabulary-pruned LM head (FR-Spec), or any
:class:`~specrepro.core.blocklm.BlockLM` backend (a llama.cpp GGUF model).
"""

from __future__ import annotations

import torch

from specrepro.core.blocklm import draft_block, prefill_block
from specrepro.core.decoding import common_prefix
from specrepro.core.kvcache import crop_cache, new_cache
from specrepro.core.sampling import SamplingConfig, fit_width, logits_to_probs, sample
from specrepro.drafters.base import Proposal, check_stop_below, stop_after

__all__ = ["DraftModelDrafter", "PrunedHeadDrafter", "BlockLMDrafter"]


class DraftModelDrafter:
    """An independent draft model with its own KV cache (Leviathan et al. 2023, Sec. 3; Chen et al. 2023, Alg. 2).

    Each call runs gamma single-token forward passes of the draft, sampling x_i ~ q_i where q_i is the draft's logits
    processed by the same :func:`~specrepro.core.sampling.logits_to_probs` as the target.

    Dynamic draft length (``stop_below > 0``): ``gamma`` becomes the maximum, and drafting stops after the first token
    x_i whose draft confidence c_i(x_i) is below ``stop_below`` - a token the draft is unsure of is likely to be
    rejected, so drafting past it mostly wastes draft forwards (the stopping rule of transformers' assisted
    generation, ``assistant_confidence_threshold``). The confidence c_i is the softmax of the draft's raw logits at
    temperature 1 (no top-k/top-p), as in transformers, not the processed q_i: at temperature 0 q_i is one-hot, so
    q_i(x_i) = 1 and the rule would never stop. It stays exact at every temperature: whether a block continues after
    x_i depends only on the draft's own values up to x_i, so, given the tokens emitted so far, the next one is
    either verified against q_{i+1} by Leviathan's rule or sampled from the target row as the bonus; both give the
    target's distribution (Leviathan Thm. 3.5 holds position by position); under greedy decoding every emitted token
    is the target's argmax whatever the draft length. The exactness battery runs it end to end.

    Args:
        model: a transformers causal LM sharing the target's tokenizer.
        vocab_size: the target's logits width V; the draft's logits are padded with -inf or cut to it.
        name: a label for tables.
        stop_below: threshold in [0, 1) on the draft's temperature-1 probability of its own token; 0 (default)
            drafts exactly gamma tokens.

    Raises:
        ValueError: ``stop_below`` outside [0, 1).
    """

    def __init__(self, model, vocab_size: int | None = None, name: str = "draft model", stop_below: float = 0.0):
        stop_below = check_stop_below(stop_below)
        self.model = model
        self.vocab_size = vocab_size
        self.name = name
        self.stop_below = stop_below
        self.stop_rule = None  # set by AdaptiveLengthDrafter for the length of one call
        self.reset()

    stop_after = stop_after

    def reset(self) -> None:
        self.cache = new_cache(self.model)
        self.cached_ids = torch.empty(0, dtype=torch.long)

    @torch.inference_mode()
    def propose(self, ids, gamma, sampling, generator):
        device = self.model.device
        keep = min(common_prefix(self.cached_ids, ids.cpu()), ids.shape[0] - 1)
        crop_cache(self.cache, keep)
        feed = ids[keep:].to(device)
        tokens, probs = [], []
        for _ in range(gamma):
            out = self.model(input_ids=feed[None], past_key_values=self.cache, use_cache=True, logits_to_keep=1)
            logits = fit_width(out.logits[0, -1], self.vocab_size)
            q = logits_to_probs(logits, sampling)
            x = q.argmax() if sampling.greedy else sample(q, generator)
            tokens.append(x)
            probs.append(q)
            feed = x.reshape(1)
            if self.stop_after(len(tokens), logits, x):
                break
        tok = torch.stack(tokens) if tokens else torch.empty(0, dtype=torch.long, device=device)
        # the cache now holds ids + x_1..x_{gamma-1}
        self.cached_ids = torch.cat([ids.cpu(), tok[:-1].cpu()]) if tokens else ids.cpu()
        return Proposal(tok, torch.stack(probs) if probs else None)


class BlockLMDrafter:
    """A draft model behind the :class:`~specrepro.core.blocklm.BlockLM` interface (e.g. a llama.cpp GGUF model,
    :class:`specrepro.backends.llamacpp.LlamaCppLM`) with its own KV cache: :class:`DraftModelDrafter` on any backend
    (Leviathan et al. 2023, Sec. 3 and Alg. 1; Chen et al. 2023, Alg. 2).

    Each call cuts the draft's cache back to the longest prefix it shares with the committed sequence
    (``truncate``), feeds the rest in one ``forward_block``, then drafts one token per forward: x_i ~ q_i, q_i the
    draft's logits processed by the same :func:`~specrepro.core.sampling.logits_to_probs` as the target
    (:func:`specrepro.core.blocklm.draft_block`). Tokens are returned as long [g] on the CPU, q as float [g, V] on the
    model's device (float32 on the CPU for llama.cpp); the loop moves them to the target's device.

    Dynamic draft length exactly as :class:`DraftModelDrafter`: ``stop_below > 0`` makes ``gamma`` the maximum and
    ends the block after the first token whose temperature-1 draft confidence is below it; a ``stop_rule`` (set by
    :class:`~specrepro.drafters.adaptive.AdaptiveLengthDrafter` for one call) replaces the threshold
    (:func:`~specrepro.drafters.base.stop_after`). Exact for the same reason: the stop depends only on the draft's own
    values up to that token.

    Args:
        lm: the draft :class:`~specrepro.core.blocklm.BlockLM` (its cache is this drafter's: :meth:`reset` clears it).
        vocab_size: the target's logits width V; the draft's logits are padded with -inf or cut to it (None: the
            draft's own width, which must then be the target's).
        name: a label for tables.
        stop_below: threshold in [0, 1) on the draft's temperature-1 probability of its own token; 0 (default)
            drafts exactly gamma tokens.

    Raises:
        ValueError: ``stop_below`` outside [0, 1).
    """

    def __init__(self, lm, vocab_size: int | None = None, name: str = "draft model", stop_below: float = 0.0):
        stop_below = check_stop_below(stop_below)
        self.lm = lm
        self.vocab_size = vocab_size
        self.name = name
        self.stop_below = stop_below
        self.stop_rule = None  # set by AdaptiveLengthDrafter for the length of one call
        self.reset()

    stop_after = stop_after

    def reset(self) -> None:
        self.lm.reset()
        self.cached_ids = torch.empty(0, dtype=torch.long)

    def prefill(self, ids) -> None:
        """Take the prompt (long [L], L >= 2) into the draft's cache, every token but the last, in one forward with
        no logits (the loop's ``draft_prefill`` phase; see :class:`~specrepro.drafters.base.Drafter`)."""
        self.cached_ids = prefill_block(self.lm, ids)

    def propose(self, ids, gamma, sampling, generator):
        dynamic = self.stop_rule is not None or self.stop_below > 0.0
        tok, probs, self.cached_ids = draft_block(self.lm, self.cached_ids, ids, gamma, sampling, generator,
                                                  vocab_size=self.vocab_size,
                                                  stop=self.stop_after if dynamic else None)
        return Proposal(tok, probs)


class PrunedHeadDrafter:
    """A draft model whose LM head keeps only N tokens (FR-Spec: Zhao et al. 2025, frequency-ranked speculative
    sampling), with its own KV cache.

    Each drafted token runs the draft's backbone (``model.get_decoder()``, the transformer without its head) on the
    new tokens and multiplies the last hidden state by the N kept rows of the head only (``head``: float [N, H] as a
    module, e.g. :func:`specrepro.drafters.compress.pruned_head`, possibly int8 via
    :func:`~specrepro.drafters.compress.quantize_linear`). q is the processed distribution
    (:func:`~specrepro.core.sampling.logits_to_probs`, the target's settings) of those N logits, placed at the kept ids of
    a V-wide row: q = 0 outside the kept set, a proper distribution over it. Leviathan's rule stays exact because q
    is the distribution x was sampled from; a token outside the kept set can still be emitted, by the target's
    residual norm(max(0, p - q)) after a rejection or as the bonus token (Leviathan Thm. 3.5 asks nothing of q's
    support). Under greedy decoding q is one-hot on the argmax over the kept set, and every emitted token is the
    target's argmax.

    Args:
        model: a transformers causal LM (backbone from ``get_decoder()``; Gemma's ``final_logit_softcapping`` is
            applied if its config sets one). Its own LM head is not used.
        kept_ids: long [N], unique token ids in [0, vocab_size), N >= 1 (:func:`~specrepro.drafters.compress.
            frequent_token_ids`); the rows of ``head``'s output, in order.
        vocab_size: the target's logits width V (q rows are V wide).
        head: a module mapping float [..., H] to float [..., N]; default :func:`~specrepro.drafters.compress.pruned_head`
            of ``model`` (a float copy of the kept rows).
        name: a label for tables.
        stop_below: dynamic draft length as in :class:`DraftModelDrafter`: ``gamma`` becomes the maximum and drafting
            stops after the first token whose temperature-1 probability under the N kept logits is below it (0, the
            default, drafts exactly gamma tokens). Exact for the same reason: the stop depends only on the draft's
            own values up to that token.

    Raises:
        ValueError: empty, repeated or out-of-range ``kept_ids``; a ``head`` whose output width is not N;
            ``stop_below`` outside [0, 1).
    """

    def __init__(self, model, kept_ids: torch.Tensor, vocab_size: int, head=None, name: str = "pruned-head draft",
                 stop_below: float = 0.0):
        stop_below = check_stop_below(stop_below)
        self.stop_below = stop_below
        self.stop_rule = None  # set by AdaptiveLengthDrafter for the length of one call
        kept = torch.as_tensor(kept_ids, dtype=torch.long).reshape(-1).cpu()
        if kept.numel() == 0 or int(kept.min()) < 0 or int(kept.max()) >= vocab_size:
            raise ValueError(f"kept_ids must be N >= 1 ids in [0, {vocab_size}) (the target's width)")
        if kept.unique().numel() != kept.numel():
            raise ValueError("kept_ids must be unique")
        if head is None:
            from specrepro.drafters.compress import pruned_head

            head = pruned_head(model, kept)
        self.model = model
        self.backbone = model.get_decoder()
        self.head = head
        self.vocab_size = int(vocab_size)
        self.name = name
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        self.device = next(model.parameters()).device
        self.kept = kept.to(self.device)
        with torch.inference_mode():
            width = self.head(torch.zeros(1, model.config.hidden_size, device=self.device)).shape[-1]
        if width != kept.numel():
            raise ValueError(f"head outputs {width} logits for {kept.numel()} kept ids")
        self.reset()

    stop_after = stop_after

    def reset(self) -> None:
        self.cache = new_cache(self.model)
        self.cached_ids = torch.empty(0, dtype=torch.long)

    def _kept_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float [..., H] -> float [..., N] (int8 linear layers want at least 2 dimensions)."""
        logits = self.head(hidden[None])[0]
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def _widen(self, q_kept: torch.Tensor) -> torch.Tensor:
        """float [..., N] -> float [..., V] with zeros outside the kept ids."""
        q = q_kept.new_zeros((*q_kept.shape[:-1], self.vocab_size))
        return q.index_copy_(-1, self.kept, q_kept)

    @torch.inference_mode()
    def propose(self, ids, gamma, sampling, generator):
        keep = min(common_prefix(self.cached_ids, ids.cpu()), ids.shape[0] - 1)
        crop_cache(self.cache, keep)
        feed = ids[keep:].to(self.device)
        tokens, probs = [], []
        for _ in range(gamma):
            out = self.backbone(input_ids=feed[None], past_key_values=self.cache, use_cache=True)
            logits = self._kept_logits(out.last_hidden_state[0, -1])
            q_kept = logits_to_probs(logits, sampling)
            j = q_kept.argmax() if sampling.greedy else sample(q_kept, generator)
            x = self.kept[j]
            tokens.append(x)
            probs.append(self._widen(q_kept))
            feed = x.reshape(1)
            if self.stop_after(len(tokens), logits, j):
                break
        tok = torch.stack(tokens) if tokens else torch.empty(0, dtype=torch.long, device=self.device)
        self.cached_ids = torch.cat([ids.cpu(), tok[:-1].cpu()]) if tokens else ids.cpu()
        return Proposal(tok, torch.stack(probs) if probs else None)

    @torch.inference_mode()
    def teacher_forced_probs(self, ids: torch.Tensor, start: int, sampling: SamplingConfig) -> torch.Tensor:
        """q at every position t in [start, L) of ``ids`` (long [L]) given ids[:t], in one forward pass: float
        [L - start, V] on the CPU (for :func:`specrepro.measure.alpha.measure_alpha`)."""
        hidden = self.backbone(input_ids=ids.reshape(1, -1).to(self.device)).last_hidden_state[0, start - 1: -1]
        return self._widen(logits_to_probs(self._kept_logits(hidden), sampling)).cpu()
