"""The drafter protocol of chain speculative decoding: what a drafter proposes and the hook that tells it what was kept.

What it is not: a drafter (see :mod:`.model`, :mod:`.lookup`, :mod:`.adaptive`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specrepro.core.decoding import common_prefix
from specrepro.core.sampling import SamplingConfig

__all__ = ["Proposal", "Drafter"]


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


def block_outcome(last: tuple, ids: torch.Tensor) -> tuple[int, int] | None:
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
