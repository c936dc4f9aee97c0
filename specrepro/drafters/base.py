"""The drafter protocol of chain speculative decoding: what a drafter proposes and the hook that tells it what was kept.

What it is not: a drafter (see :mod:`.model`, :mod:`.lookup`, :mod:`.adaptive`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specrepro.core.sampling import SamplingConfig

__all__ = ["Proposal", "Drafter", "check_stop_below", "stop_after"]


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
    """What the chain decoding loop (:func:`specrepro.core.decoding.generate`) asks of a drafter.

    * ``propose(ids, gamma, sampling, generator)``: up to ``gamma`` draft tokens continuing ``ids`` (long [L], the
      committed sequence on the target's device) with the distributions they were drawn from (:class:`Proposal`).
      Randomness comes only from ``generator``.
    * ``reset()``: forget everything about the previous sequence (called once before each generation).
    * ``feedback(n_drafted, n_accepted)`` (optional): called after each verification of a non-empty block with
      how many of the ``n_drafted`` proposed tokens verification kept (0 <= n_accepted <= n_drafted), as
      transformers' candidate generators hear ``update_candidate_strategy``. Adaptive drafters learn their α and
      lengths from it; a drafter without the method is simply not told.
    * ``prefill(ids)`` (optional): take the prompt (long [L], L >= 2) into the draft's own KV cache before the
      first step, every token but the last (the target's cache convention). The loop times it as its own phase,
      ``draft_prefill``, so that the draft's time per drafted token is the drafting step alone; a drafter without
      the method reads the prompt inside its first ``propose`` (counted as draft time).
    """

    name: str

    def propose(self, ids: torch.Tensor, gamma: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Proposal: ...

    def reset(self) -> None: ...

    def feedback(self, n_drafted: int, n_accepted: int) -> None: ...


def stop_after(drafter, i: int, logits: torch.Tensor, j) -> bool:
    """Whether a model drafter with a dynamic draft length stops after its i-th token (index ``j`` into ``logits``,
    its raw draft logits): ``drafter.stop_rule(i, c)`` when one is set (:class:`AdaptiveLengthDrafter`), else
    c < ``drafter.stop_below``, with c the token's temperature-1 probability (transformers' confidence)."""
    rule = getattr(drafter, "stop_rule", None)
    if rule is None and drafter.stop_below <= 0.0:
        return False
    logits = logits.float()
    c = float(torch.exp(logits[j] - torch.logsumexp(logits, -1)))  # softmax(logits)[j] without the whole row
    return bool(rule(i, c)) if rule is not None else c < drafter.stop_below


def check_stop_below(stop_below) -> float:
    """``stop_below`` (a dynamic draft length's threshold on the draft's temperature-1 probability of its own token)
    as a float. Raises ValueError outside [0, 1), NaN included."""
    stop_below = float(stop_below)
    if not 0.0 <= stop_below < 1.0:  # also refuses NaN
        raise ValueError(f"stop_below (draft confidence threshold) must be in [0, 1), got {stop_below!r}")
    return stop_below
