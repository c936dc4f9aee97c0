"""Proposal sources (drafters) for chain speculative decoding.

What this file is: everything that proposes draft tokens x_1..x_gamma and says which distribution q_i each was drawn
from. A drafter is an object with

* ``propose(ids, gamma, sampling, generator) -> Proposal``: ``ids`` is the committed sequence (long [L], prompt and
  accepted tokens); the drafter returns at most ``gamma`` tokens and either their distributions q (float [g, V]) or
  None for point masses (deterministic drafts).
* ``reset()``: forget any per-sequence state (a KV cache).

Drafters keep their own state consistent by themselves: a draft model's KV cache is cropped to the longest prefix it
shares with ``ids``, so the decoding loop never has to tell a drafter what was rejected.

Drafters here: :class:`DraftModelDrafter` (an independent small LM, Leviathan/Chen), :class:`NGramDrafter`
(unigram and bigram drafts estimated from a corpus, Leviathan Table 3), :class:`PromptLookupDrafter` (n-gram copy of
the context, point masses), :class:`PrunedHeadDrafter` (a draft model whose LM head keeps N frequent tokens, FR-Spec),
:class:`HybridDrafter` (prompt lookup where it matches, a draft model elsewhere), :class:`AutoGammaDrafter` (any
drafter with γ chosen per step by the hardware-aware cost model) and :class:`AdaptiveLengthDrafter` (a draft model
whose block stops token by token where its calibrated confidence no longer pays for the next token). An int8 draft
model is a :class:`DraftModelDrafter` of :func:`specrepro.cheap_drafts.quantize_draft`'s copy.

What it is not: the verification rule (:mod:`specrepro.sampling`) or token trees (:mod:`specrepro.trees`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Protocol

import torch

from .kvcache import crop_cache, new_cache
from .sampling import SamplingConfig, logits_to_probs, sample

__all__ = ["Proposal", "Drafter", "DraftModelDrafter", "NGramDrafter", "PromptLookupDrafter", "PrunedHeadDrafter",
           "HybridDrafter", "AutoGammaDrafter", "AdaptiveLengthDrafter", "fit_width", "common_prefix"]


@dataclass
class Proposal:
    """Draft tokens and the distributions they were drawn from.

    Attributes:
        tokens: long [g] with 0 <= g <= gamma.
        probs: float [g, V] (row i = q_i, the processed distribution x_i was sampled from) or None for point masses.
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None


class Drafter(Protocol):
    name: str

    def propose(self, ids: torch.Tensor, gamma: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Proposal: ...

    def reset(self) -> None: ...


def _stop_after(drafter, i: int, logits: torch.Tensor, j) -> bool:
    """Whether a model drafter with a dynamic draft length stops after its i-th token (index ``j`` into ``logits``,
    its raw draft logits): ``drafter.stop_rule(i, c)`` when one is set (:class:`AdaptiveLengthDrafter`), else
    c < ``drafter.stop_below``, with c the token's temperature-1 probability (transformers' confidence)."""
    rule = getattr(drafter, "stop_rule", None)
    if rule is None and drafter.stop_below <= 0.0:
        return False
    logits = logits.float()
    c = float(torch.exp(logits[j] - torch.logsumexp(logits, -1)))  # softmax(logits)[j] without the whole row
    return bool(rule(i, c)) if rule is not None else c < drafter.stop_below


def _block_outcome(last: tuple, ids: torch.Tensor) -> tuple[int, int] | None:
    """(accepted, reached) of a drafter's previous block ``last = (start, block, ...)`` given the committed ``ids``:
    the first emitted token that differs from the draft is the rejection point (the residual never re-emits the
    rejected token), so n accepted out of n + 1 positions reached (n out of n when the whole block was accepted).
    None when nothing was committed after the block or the block was empty."""
    start, block = last[0], last[1]
    if ids.shape[0] <= start or block.numel() == 0:
        return None
    committed = ids[start:].cpu()
    g = block.numel()
    n = common_prefix(block, committed[:g])
    return n, n + (1 if n < g and committed.numel() > n else 0)


def fit_width(logits: torch.Tensor, width: int | None) -> torch.Tensor:
    """Pad (with -inf) or cut logits [..., V'] to the target's width V, so q and p index the same tokens."""
    if width is None or logits.shape[-1] == width:
        return logits
    if logits.shape[-1] > width:
        return logits[..., :width]
    pad = logits.new_full((*logits.shape[:-1], width - logits.shape[-1]), float("-inf"))
    return torch.cat([logits, pad], dim=-1)


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the longest common prefix of two long [L] token sequences (to reuse a draft model's KV cache)."""
    n = min(a.shape[0], b.shape[0])
    if n == 0:
        return 0
    diff = (a[:n] != b[:n]).nonzero()
    return int(diff[0, 0]) if diff.numel() else n


class DraftModelDrafter:
    """An independent draft model with its own KV cache (Leviathan et al. 2023, Sec. 3; Chen et al. 2023, Alg. 2).

    Each call runs gamma single-token forward passes of the draft, sampling x_i ~ q_i where q_i is the draft's logits
    processed by the same :func:`~specrepro.sampling.logits_to_probs` as the target.

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
        stop_below = float(stop_below)
        if not 0.0 <= stop_below < 1.0:  # also refuses NaN
            raise ValueError(f"stop_below (draft confidence threshold) must be in [0, 1), got {stop_below!r}")
        self.model = model
        self.vocab_size = vocab_size
        self.name = name
        self.stop_below = stop_below
        self.stop_rule = None  # set by AdaptiveLengthDrafter for the length of one call
        self.reset()

    _stop_after = _stop_after

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
            if self._stop_after(len(tokens), logits, x):
                break
        tok = torch.stack(tokens) if tokens else torch.empty(0, dtype=torch.long, device=device)
        # the cache now holds ids + x_1..x_{gamma-1}
        self.cached_ids = torch.cat([ids.cpu(), tok[:-1].cpu()]) if tokens else ids.cpu()
        return Proposal(tok, torch.stack(probs) if probs else None)


class NGramDrafter:
    """Unigram (n=1) or bigram (n=2) draft estimated from a token corpus (Leviathan et al. 2023, Table 3).

    The bigram distribution is interpolated with the unigram one, q(x | prev) = (c(prev, x) + k u(x)) / (c(prev) + k),
    so it is a full distribution over the vocabulary and never zero where the unigram is not. Its log-probabilities
    go through the same logits processing as the target (temperature 0 makes the draft its argmax).

    Args:
        token_ids: iterable of token-id sequences (the corpus).
        vocab_size: the target's logits width V.
        n: 1 (unigram) or 2 (bigram).
        smoothing: add-one counts for the unigram (float), and k above.

    Raises:
        ValueError: n not in {1, 2}, or an empty corpus.
    """

    def __init__(self, token_ids: Iterable[Iterable[int]], vocab_size: int, n: int = 2, smoothing: float = 1.0):
        if n not in (1, 2):
            raise ValueError(f"n must be 1 (unigram) or 2 (bigram), got {n}")
        self.n, self.vocab_size, self.k = n, vocab_size, float(smoothing)
        uni = torch.zeros(vocab_size, dtype=torch.float64)
        bi: dict[int, Counter] = {}
        total = 0
        for seq in token_ids:
            seq = [int(t) for t in seq if 0 <= int(t) < vocab_size]
            total += len(seq)
            if seq:
                uni += torch.bincount(torch.tensor(seq), minlength=vocab_size).double()
            if n == 2:
                for a, b in zip(seq, seq[1:]):
                    bi.setdefault(a, Counter())[b] += 1
        if total == 0:
            raise ValueError("the n-gram corpus is empty")
        self.unigram = ((uni + 1e-3) / (uni + 1e-3).sum()).float()
        self._log_unigram = self.unigram.log()
        self.bigram = {a: (torch.tensor(list(c.keys())), torch.tensor(list(c.values()), dtype=torch.float32))
                       for a, c in bi.items()}
        self.name = "unigram" if n == 1 else "bigram"
        self.reset()

    def reset(self) -> None:
        pass

    def distribution(self, prev: int | None) -> torch.Tensor:
        """q(. | prev) as float32 [V] (unprocessed)."""
        if self.n == 1 or prev is None or prev not in self.bigram:
            return self.unigram
        nxt, counts = self.bigram[prev]
        q = self.k * self.unigram.clone()
        q.index_add_(0, nxt, counts)
        return q / (counts.sum() + self.k)

    def propose(self, ids, gamma, sampling, generator):
        prev = int(ids[-1]) if ids.numel() else None
        tokens, probs = [], []
        for _ in range(gamma):
            q = logits_to_probs(self.distribution(prev).log(), sampling)
            x = q.argmax() if sampling.greedy else sample(q, generator)
            tokens.append(x)
            probs.append(q)
            prev = int(x)
        device = ids.device
        return Proposal(torch.stack(tokens).to(device), torch.stack(probs).to(device))


class PromptLookupDrafter:
    """Prompt lookup decoding: copy what followed the most recent earlier occurrence of the last n tokens.

    Tries n = max_ngram down to min_ngram; proposes up to gamma tokens as point masses (q = 1 on the copied token),
    so verification accepts x with probability p(x). Proposes nothing when no n-gram matches.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.name = "prompt lookup"

    def reset(self) -> None:
        pass

    def propose(self, ids, gamma, sampling, generator):
        L = ids.shape[0]
        for n in range(min(self.max_ngram, L - 1), self.min_ngram - 1, -1):
            pattern = ids[L - n:]
            windows = ids[: L - 1].unfold(0, n, 1) if L - 1 >= n else ids.new_empty(0, n)
            hits = (windows == pattern).all(dim=1).nonzero().flatten()
            hits = hits[hits + n < L]
            if hits.numel():
                start = int(hits[-1]) + n
                cont = ids[start: start + gamma]
                if cont.numel():
                    return Proposal(cont.clone(), None)
        return Proposal(ids.new_empty(0), None)



class PrunedHeadDrafter:
    """A draft model whose LM head keeps only N tokens (FR-Spec: Zhao et al. 2025, frequency-ranked speculative
    sampling), with its own KV cache.

    Each drafted token runs the draft's backbone (``model.get_decoder()``, the transformer without its head) on the
    new tokens and multiplies the last hidden state by the N kept rows of the head only (``head``: float [N, H] as a
    module, e.g. :func:`specrepro.cheap_drafts.pruned_head`, possibly int8 via
    :func:`~specrepro.cheap_drafts.quantize_linear`). q is the processed distribution
    (:func:`~specrepro.sampling.logits_to_probs`, the target's settings) of those N logits, placed at the kept ids of
    a V-wide row: q = 0 outside the kept set, a proper distribution over it. Leviathan's rule stays exact because q
    is the distribution x was sampled from; a token outside the kept set can still be emitted, by the target's
    residual norm(max(0, p - q)) after a rejection or as the bonus token (Leviathan Thm. 3.5 asks nothing of q's
    support). Under greedy decoding q is one-hot on the argmax over the kept set, and every emitted token is the
    target's argmax.

    Args:
        model: a transformers causal LM (backbone from ``get_decoder()``; Gemma's ``final_logit_softcapping`` is
            applied if its config sets one). Its own LM head is not used.
        kept_ids: long [N], unique token ids in [0, vocab_size), N >= 1 (:func:`~specrepro.cheap_drafts.
            frequent_token_ids`); the rows of ``head``'s output, in order.
        vocab_size: the target's logits width V (q rows are V wide).
        head: a module mapping float [..., H] to float [..., N]; default :func:`~specrepro.cheap_drafts.pruned_head`
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
        stop_below = float(stop_below)
        if not 0.0 <= stop_below < 1.0:  # also refuses NaN
            raise ValueError(f"stop_below (draft confidence threshold) must be in [0, 1), got {stop_below!r}")
        self.stop_below = stop_below
        self.stop_rule = None  # set by AdaptiveLengthDrafter for the length of one call
        kept = torch.as_tensor(kept_ids, dtype=torch.long).reshape(-1).cpu()
        if kept.numel() == 0 or int(kept.min()) < 0 or int(kept.max()) >= vocab_size:
            raise ValueError(f"kept_ids must be N >= 1 ids in [0, {vocab_size}) (the target's width)")
        if kept.unique().numel() != kept.numel():
            raise ValueError("kept_ids must be unique")
        if head is None:
            from .cheap_drafts import pruned_head

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

    _stop_after = _stop_after

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
            if self._stop_after(len(tokens), logits, j):
                break
        tok = torch.stack(tokens) if tokens else torch.empty(0, dtype=torch.long, device=self.device)
        self.cached_ids = torch.cat([ids.cpu(), tok[:-1].cpu()]) if tokens else ids.cpu()
        return Proposal(tok, torch.stack(probs) if probs else None)

    @torch.inference_mode()
    def teacher_forced_probs(self, ids: torch.Tensor, start: int, sampling: SamplingConfig) -> torch.Tensor:
        """q at every position t in [start, L) of ``ids`` (long [L]) given ids[:t], in one forward pass: float
        [L - start, V] on the CPU (for :func:`specrepro.theory.measure_alpha`)."""
        hidden = self.backbone(input_ids=ids.reshape(1, -1).to(self.device)).last_hidden_state[0, start - 1: -1]
        return self._widen(logits_to_probs(self._kept_logits(hidden), sampling)).cpu()


class HybridDrafter:
    """Prompt lookup where it finds a match, a draft model where it does not.

    Each step first asks ``lookup`` (a :class:`PromptLookupDrafter`: copy what followed the last earlier occurrence
    of the context's final n-gram, point masses); when it proposes nothing, ``model`` (any drafter with
    distributions, e.g. a :class:`DraftModelDrafter` of an int8 draft, or a :class:`PrunedHeadDrafter`) drafts the
    block. Every block is the proposal of one source with that source's own q (point masses for the copied tokens,
    the model's processed distributions otherwise), and which source drafts depends only on the committed tokens,
    so Leviathan's rule is exact block by block (Thm. 3.5) and greedy decoding emits the target's argmax. The model
    drafter keeps its KV cache in step by itself (it crops to the longest prefix it shares with the context) after
    blocks it did not draft. A copied block costs no draft forward pass, which pays off on repetitive code.

    Args:
        lookup: the prompt-lookup drafter (its ``min_ngram`` decides how strong a match must be: 2 ignores matches
            of the last token alone).
        model: the fallback drafter.
        name: a label for tables.

    Attributes:
        steps: per source ('lookup', 'model'), the blocks it drafted since the last :meth:`reset` (one sequence).
    """

    def __init__(self, lookup: "PromptLookupDrafter", model, name: str | None = None):
        self.lookup, self.model = lookup, model
        self.name = name or f"lookup + {getattr(model, 'name', 'draft model')}"
        self.reset()

    def reset(self) -> None:
        self.lookup.reset()
        self.model.reset()
        self.steps = {"lookup": 0, "model": 0}

    def propose(self, ids, gamma, sampling, generator):
        prop = self.lookup.propose(ids, gamma, sampling, generator)
        if prop.tokens.numel():
            self.steps["lookup"] += 1
            return prop
        self.steps["model"] += 1
        return self.model.propose(ids, gamma, sampling, generator)


class AutoGammaDrafter:
    """Any drafter with its draft length chosen at every step by the hardware-aware cost model.

    Before each block the wrapper picks γ_t = argmax over γ in [min_gamma, gamma] of
    (1 - α̂^(γ+1)) / (1 - α̂) / (t_target(γ + 1) + γ · t_draft + o) (:func:`specrepro.theory.gamma_for_step`):
    Leviathan's expected tokens per step (Eq. 1) per millisecond of a step under measured costs, with α̂ the running
    acceptance rate of this sequence. ``gamma`` (the decoding loop's argument) is the largest draft length allowed.

    α̂ is estimated from the drafter's own past blocks: on each call the wrapper compares its previous block with the
    tokens that were committed after it (the first emitted token that differs from the draft is the rejection point:
    the residual never re-emits the rejected token), so n accepted out of n + 1 positions reached (n out of n when
    the whole block was accepted). With exponential forgetting ``decay`` and a prior of ``prior_weight`` positions
    at ``alpha_prior``: α̂ = (A + w α0) / (R + w), A and R the decayed accepted / reached counts. α̂ restarts at the
    prior with every sequence (:meth:`reset`), so outputs do not depend on the order sequences are decoded in.

    Exactness: γ_t depends only on values of past steps (committed tokens, past drafts) and on fixed cost curves,
    never on the current block's random draws, so each block is verified by Leviathan's rule against the q its tokens
    were drawn from, and Leviathan Thm. 3.5 holds step by step; under greedy decoding every emitted token is the
    target's argmax. The costs are fixed numbers (measured before decoding, e.g. with
    :func:`specrepro.theory.measure_cost_curve` and :func:`specrepro.cheap_drafts.measure_draft_step_ms`), never
    timings of the running loop, so a seeded run is reproducible.

    Args:
        drafter: the wrapped drafter.
        t_target: callable n -> ms, the target's forward time over n new tokens (:class:`specrepro.theory.CostCurve`).
        t_draft: ms per drafted token (a number, or a callable n -> ms read at n = 1); 0 for a free draft.
        overhead_ms: per-step time outside the forward passes (ms).
        alpha_prior: α0 in [0, 1]; prior_weight: w >= 0 (positions); decay: forgetting factor in (0, 1] per step
            (1 = the plain running mean).
        min_gamma: the smallest draft length chosen (>= 1, so every step keeps measuring α).
        name: a label for tables (default: the wrapped drafter's name + ", auto γ").

    Attributes:
        gammas: the draft lengths chosen in this sequence (one per step).
        alpha_hat: the current estimate α̂.

    Raises:
        ValueError: an argument outside its range, or costs that are not positive and finite.
    """

    def __init__(self, drafter, t_target, t_draft, *, overhead_ms: float = 0.0, alpha_prior: float = 0.8,
                 prior_weight: float = 2.0, decay: float = 0.9, min_gamma: int = 1, name: str | None = None):
        from .theory import step_costs_ms

        if not 0.0 <= float(alpha_prior) <= 1.0:
            raise ValueError(f"alpha_prior must lie in [0, 1], got {alpha_prior!r}")
        if not float(prior_weight) >= 0.0:
            raise ValueError(f"prior_weight must be >= 0, got {prior_weight!r}")
        if not 0.0 < float(decay) <= 1.0:
            raise ValueError(f"decay must lie in (0, 1], got {decay!r}")
        if int(min_gamma) != min_gamma or min_gamma < 1:
            raise ValueError(f"min_gamma must be an integer >= 1, got {min_gamma!r}")
        self.drafter = drafter
        self.t_target, self.t_draft, self.overhead_ms = t_target, t_draft, float(overhead_ms)
        self.alpha_prior, self.prior_weight, self.decay = float(alpha_prior), float(prior_weight), float(decay)
        self.min_gamma = int(min_gamma)
        self.name = name or f"{getattr(drafter, 'name', 'draft')}, auto γ"
        self._costs = step_costs_ms(t_target, t_draft, 8, self.overhead_ms)  # checks the costs now
        self.reset()

    def reset(self) -> None:
        self.drafter.reset()
        self._acc = 0.0
        self._reached = 0.0
        self._last: tuple[int, torch.Tensor] | None = None
        self.gammas: list[int] = []

    @property
    def alpha_hat(self) -> float:
        w = self.prior_weight
        if self._reached + w == 0:
            return self.alpha_prior
        return (self._acc + w * self.alpha_prior) / (self._reached + w)

    def _observe(self, ids: torch.Tensor) -> None:
        if self._last is None:
            return
        outcome, self._last = _block_outcome(self._last, ids), None
        if outcome is None:
            return
        n, reached = outcome
        self._acc = self.decay * self._acc + n
        self._reached = self.decay * self._reached + reached

    def propose(self, ids, gamma, sampling, generator):
        from .theory import gamma_for_step, step_costs_ms

        self._observe(ids)
        if gamma < 1:
            return Proposal(ids.new_empty(0), None)
        if len(self._costs) <= gamma:
            self._costs = step_costs_ms(self.t_target, self.t_draft, int(gamma), self.overhead_ms)
        g = gamma_for_step(self.alpha_hat, self._costs[: gamma + 1], min(self.min_gamma, gamma))
        self.gammas.append(g)
        prop = self.drafter.propose(ids, g, sampling, generator)
        self._last = (int(ids.shape[0]), prop.tokens.detach().cpu())
        return prop


class AdaptiveLengthDrafter:
    """A draft model's block length chosen token by token from its calibrated confidence and the measured costs.

    After each drafted token x_i the wrapper decides whether the block goes on. It keeps π_i, the estimated
    probability that x_1..x_i are all accepted (the product of â(c_j), the acceptance rate this sequence has shown so
    far for tokens drafted with a confidence like c_j, c_j the draft's temperature-1 probability of its own token as
    in transformers' assisted generation). Drafting x_{i+1} adds π_i ᾱ expected tokens (ᾱ the running acceptance
    rate of all tokens) and cost[i + 1] - cost[i] ms, with cost[γ] = t_target(γ + 1) + γ t_draft + o
    (:func:`specrepro.theory.step_costs_ms`, the target's curve made non-decreasing so that a noisy measurement
    cannot make a token look free). The block goes on while π_i ᾱ > λ (cost[i + 1] - cost[i]), λ the long-run
    tokens per ms: a step maximizes E[tokens] - λ E[ms] when the ratio of the whole run is to be maximal (the
    renewal-reward argument behind Dinkelbach's method for ratio objectives). λ is estimated from the steps so far:
    the tokens they emitted over their modelled costs, exponentially forgotten like the calibration, starting from the
    best fixed γ under Leviathan Eq. 1 at ``alpha_prior``. (The rule of the first version compared the next token's
    rate with the block's own E_i / cost[i]; a confident block then set itself a higher bar than the run's rate and
    stopped early.) So a confident run of tokens is drafted long and a block stops early where the draft hesitates -
    the idea of transformers' fixed threshold (stop below 0.4) and of SpecDec++'s learned stopping head (Huang et al.
    2024), with the threshold derived from the costs and calibrated online instead of fixed or trained.

    Calibration: ``bins`` equal-width confidence bins, each with exponentially forgotten (``decay`` per step) counts of
    drafted tokens that were reached by verification and of those accepted, and a prior of ``prior_weight`` tokens at a
    pooled calibration curve (:meth:`acceptance`: a logistic fit in logit(c) over all bins, Platt scaling; before any
    verification the identity, a calibrated draft). After each block the wrapper compares it with the tokens
    committed after it (the first emitted token that differs from the draft is the rejection point, as in
    :class:`AutoGammaDrafter`). State restarts with each sequence (:meth:`reset`) unless ``keep_calibration``.

    Exactness: whether the block continues after x_i depends only on values of past steps and on the draft's own
    values up to x_i, never on x_{i+1} or the target, so given the emitted prefix the next token is either verified
    against the q it was drawn from (Leviathan's rule) or sampled from the target as the bonus token: Leviathan
    Thm. 3.5 holds position by position, as for :class:`DraftModelDrafter`'s ``stop_below``; under greedy decoding
    every emitted token is the target's argmax. The costs are fixed numbers measured before decoding, so a seeded
    run is reproducible.

    Args:
        drafter: a :class:`DraftModelDrafter` or :class:`PrunedHeadDrafter` (its ``stop_below`` is ignored while
            the wrapper proposes).
        t_target: callable n -> ms (:class:`specrepro.theory.CostCurve`); t_draft: ms per drafted token (a number
            or a callable read at n = 1).
        overhead_ms: per-step time outside the forward passes (ms).
        bins: confidence bins (>= 1); prior_weight: w > 0 (pseudo-tokens per bin for the calibration, pseudo-steps
            for λ); decay: in (0, 1] per step.
        alpha_prior: ᾱ before any verification and the α of λ's prior, in [0, 1].
        keep_calibration: carry the calibration and λ from one sequence to the next (:meth:`reset` keeps them).
            Each output stays an exact sample, but under sampling which sample a seed gives then depends on the
            sequences decoded before (the default restarts the calibration with every sequence, as
            :class:`AutoGammaDrafter` does).
        name: a label for tables (default: the wrapped drafter's name + ", adaptive length").

    Attributes:
        gammas: the block lengths drafted in this sequence (one per step).

    Raises:
        ValueError: a drafter without a dynamic draft length, an argument outside its range, or costs that are not
            positive and finite.
    """

    def __init__(self, drafter, t_target, t_draft, *, overhead_ms: float = 0.0, bins: int = 10,
                 prior_weight: float = 4.0, decay: float = 0.98, alpha_prior: float = 0.8,
                 keep_calibration: bool = False, name: str | None = None):
        if not hasattr(drafter, "_stop_after"):
            raise ValueError(f"{type(drafter).__name__} has no dynamic draft length (use DraftModelDrafter or "
                             "PrunedHeadDrafter)")
        if int(bins) != bins or bins < 1:
            raise ValueError(f"bins must be an integer >= 1, got {bins!r}")
        if not float(prior_weight) > 0.0:
            raise ValueError(f"prior_weight must be > 0, got {prior_weight!r}")
        if not 0.0 < float(decay) <= 1.0:
            raise ValueError(f"decay must lie in (0, 1], got {decay!r}")
        if not 0.0 <= float(alpha_prior) <= 1.0:
            raise ValueError(f"alpha_prior must lie in [0, 1], got {alpha_prior!r}")
        self.drafter = drafter
        self.t_target, self.t_draft, self.overhead_ms = t_target, t_draft, float(overhead_ms)
        self.bins, self.prior_weight, self.decay = int(bins), float(prior_weight), float(decay)
        self.alpha_prior = float(alpha_prior)
        self.keep_calibration = bool(keep_calibration)
        self.name = name or f"{getattr(drafter, 'name', 'draft')}, adaptive length"
        self._set_costs(8)  # checks the costs now
        self._centres = (torch.arange(self.bins, dtype=torch.float64) + 0.5).numpy() / self.bins  # float64 [bins]
        self._acc = torch.zeros(self.bins, dtype=torch.float64)
        self._reached = torch.zeros(self.bins, dtype=torch.float64)
        self._platt = (0.0, 1.0)  # (a, b): pooled acceptance sigmoid(a + b logit(c)); identity before any data
        self._tokens = 0.0  # decayed tokens emitted by the observed steps
        self._ms = 0.0  # decayed modelled cost of those steps (ms)
        self._refresh_table()
        self.reset()

    def _set_costs(self, max_gamma: int) -> None:
        """cost[γ] for γ = 0..max_gamma (the target's part made non-decreasing) and λ's prior, the best fixed γ's
        expected tokens per ms under Leviathan Eq. 1 at ``alpha_prior``: computed when the largest γ grows, not per
        step."""
        import numpy as np

        from .theory import expected_tokens, step_costs_ms

        costs = step_costs_ms(self.t_target, self.t_draft, int(max_gamma), self.overhead_ms)
        t = np.array([float(self.t_target(g + 1)) for g in range(len(costs))])
        self._costs = costs - t + np.maximum.accumulate(t)
        self._rate_prior = max(float(expected_tokens(self.alpha_prior, g)) / float(self._costs[g])
                               for g in range(len(self._costs)))

    def reset(self) -> None:
        """A new sequence: the draft's cache and the block lengths restart; the calibration and the rate λ too
        unless ``keep_calibration``."""
        self.drafter.reset()
        if not self.keep_calibration:
            self._acc = torch.zeros(self.bins, dtype=torch.float64)
            self._reached = torch.zeros(self.bins, dtype=torch.float64)
            self._platt = (0.0, 1.0)
            self._tokens = self._ms = 0.0
            self._refresh_table()
        self._last: tuple[int, torch.Tensor, list[int], list[float]] | None = None
        self.gammas: list[int] = []

    def _bin(self, c: float) -> int:
        return min(max(int(c * self.bins), 0), self.bins - 1)

    def _pooled(self, c):
        import numpy as np

        from scipy.special import expit

        a, b = self._platt
        c = np.clip(np.asarray(c, dtype=np.float64), 1e-4, 1 - 1e-4)
        return expit(a + b * np.log(c / (1 - c)))

    def _fit_platt(self) -> None:
        """Refit the pooled curve: logistic regression of acceptance on logit(bin centre) over the bins' counts, with
        ``prior_weight`` pseudo-tokens per bin at the identity (a calibrated draft) so that sparse data bend it only
        as far as they show; Newton steps from the last fit."""
        import numpy as np
        from scipy.special import expit

        c = self._centres
        x = np.log(c / (1 - c))
        w0 = self.prior_weight
        n = self._reached.numpy() + w0
        y = (self._acc.numpy() + w0 * c) / n
        X = np.stack([np.ones_like(x), x], 1)

        def loglik(beta):
            z = X @ beta
            return float(np.sum(n * (y * z - np.logaddexp(0.0, z))))

        beta = np.array(self._platt, dtype=np.float64)
        for _ in range(20):  # Newton's method with backtracking (the log-likelihood is concave)
            p = expit(X @ beta)
            g = X.T @ (n * (y - p))
            H = (X * (n * p * (1 - p))[:, None]).T @ X + 1e-9 * np.eye(2)
            step, now = np.linalg.solve(H, g), loglik(beta)
            while loglik(beta + step) < now and float(np.abs(step).max()) > 1e-9:
                step = step / 2
            beta = beta + step
            if float(np.abs(step).max()) < 1e-7:
                break
        self._platt = (float(beta[0]), float(beta[1]))

    def _refresh_table(self) -> None:
        """â per bin (float64 [bins]), recomputed once per observed step so that the stop rule's per-token work
        is a lookup."""
        w = self.prior_weight
        prior = torch.from_numpy(self._pooled(self._centres))
        self._table = ((self._acc + w * prior) / (self._reached + w)).tolist()

    def acceptance(self, confidence: float) -> float:
        """â(c): the calibrated acceptance rate of a token drafted with confidence c in [0, 1]: the bin's own counts,
        shrunk (``prior_weight`` tokens) toward the pooled calibration curve sigmoid(a + b logit(c)) fitted over
        all bins (:meth:`_fit_platt`; the identity before any verification), so bins with few tokens borrow what
        the others show."""
        return self._table[self._bin(confidence)]

    @property
    def alpha_hat(self) -> float:
        """ᾱ: the running acceptance rate over all reached draft tokens (prior ``alpha_prior``, weight
        ``prior_weight``)."""
        w = self.prior_weight
        return float((self._acc.sum() + w * self.alpha_prior) / (self._reached.sum() + w))

    @property
    def rate(self) -> float:
        """λ: the long-run expected tokens per ms the stop rule compares a token's marginal gain with: the observed
        steps' emitted tokens over their modelled costs (decayed), with ``prior_weight`` pseudo-steps at the best
        fixed γ under Leviathan Eq. 1 at ``alpha_prior``."""
        w, c1 = self.prior_weight, float(self._costs[1])
        return (self._tokens + w * self._rate_prior * c1) / (self._ms + w * c1)

    def _observe(self, ids: torch.Tensor) -> None:
        if self._last is None:
            return
        bins = self._last[2]
        k = int(self._last[1].numel())
        outcome, self._last = _block_outcome(self._last, ids), None
        if outcome is None:
            return
        n, reached = outcome
        self._acc *= self.decay
        self._reached *= self.decay
        self._tokens *= self.decay
        self._ms *= self.decay
        for i in range(reached):
            self._acc[bins[i]] += 1.0 if i < n else 0.0
            self._reached[bins[i]] += 1.0
        self._tokens += n + 1.0
        self._ms += float(self._costs[min(k, len(self._costs) - 1)])
        self._fit_platt()
        self._refresh_table()

    def propose(self, ids, gamma, sampling, generator):
        self._observe(ids)
        if gamma < 1:
            return Proposal(ids.new_empty(0), None)
        if len(self._costs) <= gamma:
            self._set_costs(int(gamma))
        costs, abar, lam = self._costs, self.alpha_hat, self.rate
        state = {"pi": 1.0}
        bins: list[int] = []
        confs: list[float] = []

        def stop(i: int, c: float) -> bool:  # after the i-th drafted token, confidence c
            bins.append(self._bin(c))
            confs.append(float(c))
            if i >= gamma:
                return True
            state["pi"] *= self.acceptance(c)
            return state["pi"] * abar <= lam * float(costs[i + 1] - costs[i])

        self.drafter.stop_rule = stop
        try:
            prop = self.drafter.propose(ids, gamma, sampling, generator)
        finally:
            self.drafter.stop_rule = None
        self.gammas.append(int(prop.tokens.numel()))
        k = prop.tokens.numel()
        self._last = (int(ids.shape[0]), prop.tokens.detach().cpu(), bins[:k], confs[:k])
        return prop
