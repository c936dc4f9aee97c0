"""Model-free drafters: n-gram tables, prompt lookup (point-mass drafts) and the hybrid of lookup and a draft model.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

import torch

from specrepro.core.sampling import logits_to_probs, sample
from specrepro.drafters.base import Proposal

__all__ = ["NGramDrafter", "PromptLookupDrafter", "HybridDrafter"]


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

    The fallback may choose its own block length: with an :class:`~specrepro.drafters.adaptive.AdaptiveLengthDrafter`
    as ``model``, the draft model's blocks end where its calibrated confidence stops paying, and verification's
    ``feedback`` reaches it after its own blocks only (a copied block tells it nothing about its confidence). Its stop
    rule depends only on the committed tokens and the draft's own values, so the hybrid stays exact.

    Args:
        lookup: the prompt-lookup drafter (its ``min_ngram`` decides how strong a match must be: 2 ignores matches
            of the last token alone).
        model: the fallback drafter.
        name: a label for tables.
        lookup_max_gamma: the longest copied block (None: the step's γ). With a large γ for an adaptive fallback
            (20), copying 20 tokens makes every failed copy pay a 21-token verification; transformers' prompt
            lookup copies at most 10.

    Attributes:
        steps: per source ('lookup', 'model'), the blocks it drafted since the last :meth:`reset` (one sequence).

    Raises:
        ValueError: ``lookup_max_gamma`` < 1.
    """

    def __init__(self, lookup: "PromptLookupDrafter", model, name: str | None = None,
                 lookup_max_gamma: int | None = None):
        if lookup_max_gamma is not None and (int(lookup_max_gamma) != lookup_max_gamma or lookup_max_gamma < 1):
            raise ValueError(f"lookup_max_gamma must be an integer >= 1 or None, got {lookup_max_gamma!r}")
        self.lookup, self.model = lookup, model
        self.lookup_max_gamma = None if lookup_max_gamma is None else int(lookup_max_gamma)
        self.name = name or f"lookup + {getattr(model, 'name', 'draft model')}"
        self.reset()

    def prefill(self, ids) -> None:
        """The model drafter's prompt prefill, where it has one (:class:`~specrepro.drafters.base.Drafter`)."""
        warm = getattr(self.model, "prefill", None)
        if warm is not None:
            warm(ids)

    def reset(self) -> None:
        self.lookup.reset()
        self.model.reset()
        self.steps = {"lookup": 0, "model": 0}
        self._last_source: str | None = None

    def propose(self, ids, gamma, sampling, generator):
        cap = gamma if self.lookup_max_gamma is None else min(gamma, self.lookup_max_gamma)
        prop = self.lookup.propose(ids, cap, sampling, generator)
        if prop.tokens.numel():
            self.steps["lookup"] += 1
            self._last_source = "lookup"
            return prop
        self.steps["model"] += 1
        self._last_source = "model"
        return self.model.propose(ids, gamma, sampling, generator)

    def feedback(self, n_drafted: int, n_accepted: int) -> None:
        """Verification kept ``n_accepted`` of the ``n_drafted`` tokens of the last block: passed on to the source
        that drafted it, where that source listens (an adaptive fallback calibrates on its own blocks only)."""
        source, self._last_source = self._last_source, None
        hook = getattr(self.model if source == "model" else self.lookup, "feedback", None) if source else None
        if hook is not None:
            hook(n_drafted, n_accepted)
