"""Medusa's acceptance rules simulated on a toy copy of the target: one decoding step's samples, no transformer
forward per sample.

What it is not: the decoding loop (:mod:`specrepro.core.medusa`).
"""

from __future__ import annotations

import torch

from specrepro.core.medusa import (
    ACCEPTANCE_METHODS,
    MedusaProposer,
    typical_acceptance_verify,
)
from specrepro.core.sampling import SamplingConfig, sample
from specrepro.core.trees import verify_tree

__all__ = ["medusa_step_samples"]


# ----------------------------------------------------------------------------------------------------------------
# Simulation: the distribution one Medusa step emits (exactness battery, notebook 06)
# ----------------------------------------------------------------------------------------------------------------

@torch.inference_mode()
def medusa_step_samples(target, proposer: MedusaProposer, prompt: torch.Tensor, *, acceptance: str,
                        sampling: SamplingConfig, n_samples: int, length: int, generator: torch.Generator,
                        epsilon: float = 0.09, delta: float = 0.3) -> list[tuple[int, ...]]:
    """Monte Carlo over ONE Medusa step, continued autoregressively from the target to ``length`` tokens.

    The heads' tree is built at the target's last hidden state after ``prompt`` (long [L]); every node's target row
    comes from :class:`specrepro.sim.toy.ToyLM` (memoized per prefix, so no transformer forward per sample); the
    tree is verified by ``acceptance`` ("typical": :func:`typical_acceptance_verify`; "greedy"/"mss"/"naive":
    :func:`specrepro.core.trees.verify_tree`). The emitted tokens (accepted path + next token) are then continued by AR
    sampling from the target. The result is a sample of the distribution of the next ``length`` tokens, which for a
    distribution-preserving rule equals :func:`specrepro.sim.exact.target_distribution` — the quantity the
    goodness-of-fit test and the total-variation measurement compare (Medusa Sec. 3.3.1 for typical acceptance,
    SpecInfer Alg. 2 for MSS).

    Args:
        target: a small-vocabulary transformers causal LM (V up to a few dozen; see
            :func:`specrepro.sim.toy.tiny_random_lm`).
        n_samples: number of sequences; length: tokens per sequence (>= 1).

    Returns:
        ``n_samples`` tuples of ``length`` token ids.

    Raises:
        ValueError: unknown ``acceptance``, ``n_samples`` or ``length`` < 1.
    """
    from specrepro.sim.toy import ToyLM

    if acceptance not in ACCEPTANCE_METHODS:
        raise ValueError(f"unknown acceptance {acceptance!r}; expected one of {ACCEPTANCE_METHODS}")
    if n_samples < 1 or length < 1:
        raise ValueError(f"n_samples and length must be >= 1, got {n_samples}, {length}")
    prompt = torch.as_tensor(prompt, dtype=torch.long).reshape(-1)
    toy = ToyLM.from_transformer(target, prompt)
    h = target(input_ids=prompt[None], output_hidden_states=True).hidden_states[-1][0, -1]
    from tqdm.auto import tqdm

    # every sample starts from the same hidden state h, so the heads' logits at h and the target's processed rows
    # are computed once and reused (the same tensors each time: the draws, hence the samples, are unchanged)
    probs: dict = {}

    def row(prefix):
        if prefix not in probs:
            probs[prefix] = toy.probs(prefix, sampling)
        return probs[prefix]

    heads = proposer.heads
    proposer.heads = _HeadsAt(heads, h)
    out = []
    try:
        for _ in tqdm(range(n_samples), desc=f"sample {acceptance}", unit="seq", delay=2, disable=None):  # after 2 s
            proposer.reset()
            proposer.observe_hidden(h)
            tree = proposer.propose_tree(prompt, sampling, generator)
            toks, paths = tree.tokens.tolist(), []  # each node's root-to-node tokens (parents precede children)
            for i, parent in enumerate(tree.parents.tolist()):
                paths.append((paths[parent] if parent >= 0 else ()) + (toks[i],))
            p = torch.stack([row(())] + [row(path) for path in paths])
            if acceptance == "typical":
                path, nxt = typical_acceptance_verify(tree.parents, tree.tokens, p, generator, epsilon=epsilon,
                                                      delta=delta, sampling=sampling)
            else:
                q = None if tree.proposal_probs is None else tree.proposal_probs.double()
                path, nxt = verify_tree(tree.parents, tree.tokens, p, q, generator, acceptance)
            seq = tuple(tree.tokens[path].tolist()) + (int(nxt),)
            while len(seq) < length:
                seq = seq + (int(sample(row(seq), generator)),)
            out.append(seq[:length])
    finally:
        proposer.heads = heads
    return out


class _HeadsAt:
    """Medusa heads whose output at one hidden state ``h`` is computed once: called with ``h`` (bitwise) they
    return a copy of that output, with anything else they run the heads. ``blocks`` is the heads' own."""

    def __init__(self, heads, h: torch.Tensor):
        self.heads, self.blocks = heads, heads.blocks
        p0 = next(iter(heads.blocks.parameters()))
        self.h = h.to(p0.device, p0.dtype)
        self.out = heads(self.h)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape == self.h.shape and x.dtype == self.h.dtype and torch.equal(x, self.h):
            return self.out.clone()
        return self.heads(x)
