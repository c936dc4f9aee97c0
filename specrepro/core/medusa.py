"""Medusa decoding: sparse trees, the proposer, typical acceptance, the decoding loop and its simulation.

What this file is: Medusa's accuracy-driven sparse tree (:func:`sparse_tree_from_accuracies`, Sec. 3.3.3) and its
expected acceptance length, :class:`MedusaProposer` (head k's candidates at depth k: top-s point masses, or children
sampled from the heads for exact multi-step speculative sampling), typical acceptance
(:func:`typical_acceptance_verify`, Sec. 3.3.1 - NOT distribution-preserving), :func:`medusa_generate` (one target
forward per step with tree attention; greedy, typical, MSS or naive acceptance) and :func:`medusa_step_samples`
(the distribution one Medusa step emits, for the exactness battery).

What it is not: the heads (:mod:`specrepro.core.medusa_heads`) or their training (:mod:`specrepro.train.medusa1`).
"""

from __future__ import annotations

import heapq

import torch

from specrepro.core.decoding import MODEL_EOS, GenerationResult
from specrepro.core.medusa_heads import MedusaHeads
from specrepro.core.sampling import GREEDY, SamplingConfig, logits_to_probs, sample
from specrepro.core.trees import TokenTree, TreeTemplate, sample_children, tree_generate

__all__ = ["PRIOR_HEAD_ACCURACY", "expected_acceptance_length", "sparse_tree_from_accuracies", "DEFAULT_CHOICES", "MedusaProposer", "ACCEPTANCE_METHODS", "typical_acceptance_verify", "medusa_generate"]


#: Top-1..5 accuracy of heads 1..5, a prior used only to build the default sparse tree
#: (:func:`sparse_tree_from_accuracies`). The figures are a Vicuna-7B set from our notes on the Medusa project; the
#: Medusa paper (arXiv 2401.10774v3) prints no per-head accuracy (Sec. 2.3.3 builds its tree from accuracies measured
#: on a calibration set), and we found no public source to check them against. No claim and no table compares with
#: them; notebook 06 measures our heads' own accuracies and builds its accuracy-driven tree from those.
PRIOR_HEAD_ACCURACY = [
    [0.560, 0.672, 0.727, 0.760, 0.780],
    [0.316, 0.424, 0.485, 0.528, 0.563],
    [0.201, 0.288, 0.348, 0.383, 0.417],
    [0.147, 0.225, 0.274, 0.311, 0.340],
    [0.118, 0.187, 0.235, 0.272, 0.300],
]
def expected_acceptance_length(choices, accuracies) -> float:
    """Expected accepted tokens per step from the tree (excluding the target's own next token), under Medusa's
    independence approximation: Σ over nodes of Π_k a_k(r_k), a_k(r) = P(rank-r candidate of head k is right)."""
    marg = _marginal_accuracy(accuracies)
    total = 0.0
    for path in choices:
        v = 1.0
        for k, r in enumerate(path):
            v *= marg[k][r] if k < len(marg) and r < len(marg[k]) else 0.0
        total += v
    return total


def _marginal_accuracy(accuracies) -> list[list[float]]:
    """Cumulative top-i accuracies [K][I] -> probabilities that exactly the rank-r candidate is right."""
    acc = [[float(a) for a in row] for row in (accuracies.values.tolist() if hasattr(accuracies, "values")
                                               else accuracies)]
    return [[row[0]] + [max(0.0, row[i] - row[i - 1]) for i in range(1, len(row))] for row in acc]


def sparse_tree_from_accuracies(accuracies, n_nodes: int, max_depth: int | None = None) -> list[list[int]]:
    """Medusa's accuracy-driven sparse tree (Medusa Sec. 3.3.3): greedily add the node with the largest expected
    acceptance Π_k a_k(r_k), a node's value never exceeding its parent's, so the result is a valid tree (prefix
    closed).

    Args:
        accuracies: cumulative top-i accuracies, [K][I] (rows = heads, e.g. :data:`PRIOR_HEAD_ACCURACY` or the
            ``top1..`` columns of :func:`head_topk_accuracy`).
        n_nodes: number of tree nodes (the root, the committed token, not counted).
        max_depth: optional cap on depth (default K).

    Returns:
        ``choices``: list of rank paths, e.g. [[0], [1], [0, 0], ...], usable with
        :meth:`specrepro.core.trees.TreeTemplate.from_choices`.

    Raises:
        ValueError: n_nodes < 1 or an empty accuracy table.
    """
    marg = _marginal_accuracy(accuracies)
    if n_nodes < 1 or not marg or not marg[0]:
        raise ValueError(f"need n_nodes >= 1 and a non-empty accuracy table, got {n_nodes}")
    depth = min(len(marg), max_depth or len(marg))
    heap = [(-marg[0][r], (r,)) for r in range(len(marg[0]))]
    heapq.heapify(heap)
    chosen = []
    while heap and len(chosen) < n_nodes:
        negv, path = heapq.heappop(heap)
        chosen.append(list(path))
        d = len(path)
        if d < depth:
            for r in range(len(marg[d])):
                heapq.heappush(heap, (negv * marg[d][r], path + (r,)))
    return chosen


#: The default static sparse tree: Medusa's recipe (greedy on top-i accuracies, as behind ``mc_sim_7b_63``'s 63 nodes
#: for a GPU) applied to the prior :data:`PRIOR_HEAD_ACCURACY`, sized for a small model on a CPU, where a target
#: forward over n nodes costs several single-token steps once n exceeds a few tokens: 16 nodes, depth 3 (with the
#: prior's accuracies the 4th head's candidates are not worth a node at this size).
DEFAULT_CHOICES = sparse_tree_from_accuracies(PRIOR_HEAD_ACCURACY[:4], n_nodes=16)


# ----------------------------------------------------------------------------------------------------------------
# Proposer
# ----------------------------------------------------------------------------------------------------------------

class MedusaProposer:
    """Token trees from Medusa heads for :func:`specrepro.core.trees.tree_generate` or :func:`medusa_generate`.

    ``needs_hidden = True``: the loop calls :meth:`observe_hidden` with h_t (float [H]), the hidden state whose LM-head
    row produced the last committed token (the tree's root); head k's output on h_t then gives the candidates at
    depth k. Before any hidden state the tree is empty (an autoregressive step).

    Args:
        heads: :class:`MedusaHeads`.
        choices: Medusa-style rank paths (default :data:`DEFAULT_CHOICES`); depth must not exceed K.
        mode: "topk" (Medusa: node of rank r at depth k = head k's r-th most likely token, point masses; under
            greedy and typical acceptance), "iid" or "without_replacement" (children of every node drawn from head
            k's processed softmax, independently per parent: the exact stochastic mode with MSS verification).

    Raises:
        ValueError: unknown mode, a tree deeper than K.
    """

    needs_hidden = True

    def __init__(self, heads: MedusaHeads, choices=None, mode: str = "topk", name: str | None = None):
        if mode not in ("topk", "iid", "without_replacement"):
            raise ValueError(f"unknown Medusa proposal mode {mode!r}; expected 'topk', 'iid' or 'without_replacement'")
        self.heads, self.mode = heads, mode
        self.choices = [list(c) for c in (choices if choices is not None else DEFAULT_CHOICES)]
        self.template = TreeTemplate.from_choices(self.choices)
        depths = self.template.depth_of()
        if depths and max(depths) > heads.n_heads:
            raise ValueError(f"tree depth {max(depths)} exceeds the number of Medusa heads ({heads.n_heads})")
        self.topk = max(self.template.ranks) + 1 if self.template.n else 1
        self._groups: dict = {}
        for i, p in enumerate(self.template.parents):
            self._groups.setdefault(p, []).append(i)
        self.name = name or f"Medusa ({len(self.choices)} nodes, {mode})"
        self.reset()

    def reset(self) -> None:
        self.h = None

    def observe_hidden(self, h: torch.Tensor) -> None:
        self.h = h.reshape(-1)

    @torch.no_grad()
    def propose_tree(self, ids, sampling, generator) -> TokenTree:
        device = ids.device
        if self.h is None or self.template.n == 0:
            return TokenTree.empty(device)
        p0 = next(iter(self.heads.blocks.parameters()))
        logits = self.heads(self.h.to(p0.device, p0.dtype)).float()  # [K, V]
        if self.mode == "topk" or sampling.greedy:
            cand = logits.topk(self.topk, dim=-1).indices
            tree = self.template.fill(cand.to(device))
            return tree
        depth = self.template.depth_of()
        q = logits_to_probs(logits[: max(depth)], sampling)
        n = self.template.n
        tokens = torch.empty(n, dtype=torch.long)
        rows = torch.empty(n, q.shape[-1], dtype=q.dtype)
        for parent, kids in self._groups.items():
            qk = q[depth[kids[0]] - 1]
            toks, rws = sample_children(qk, len(kids), self.mode, generator)
            if toks.numel() < len(kids):  # without replacement from a support smaller than the sibling count
                raise ValueError(f"a head distribution has {toks.numel()} tokens of support but the tree asks for "
                                 f"{len(kids)} distinct children; use mode='iid' or a narrower tree")
            tokens[kids] = toks.cpu()
            rows[kids] = rws.cpu()
        return TokenTree(torch.tensor(self.template.parents, dtype=torch.long), tokens.to(device), rows.to(device))


# ----------------------------------------------------------------------------------------------------------------
# Typical acceptance and the decoding loop
# ----------------------------------------------------------------------------------------------------------------

#: acceptance rules of :func:`medusa_generate`
ACCEPTANCE_METHODS = ("greedy", "typical", "mss", "naive")


def typical_acceptance_verify(parents: torch.Tensor, tokens: torch.Tensor, target_probs: torch.Tensor,
                              generator: torch.Generator | None, *, epsilon: float = 0.09, delta: float = 0.3,
                              sampling: SamplingConfig | None = None) -> tuple[list[int], int]:
    """Medusa's typical acceptance (Medusa Sec. 3.3.1): accept candidate x at a node if
    p(x) > min(ε, δ·exp(−H(p))), with p the target's (processed) distribution at the node and H its entropy in
    nats; the longest accepted root-to-node path wins (ties: the first in node order); the next token is then sampled
    from the target's distribution at the last accepted node (argmax under greedy sampling).

    THIS IS NOT DISTRIBUTION-PRESERVING: the output does not follow the target's distribution (it favours tokens
    that are likely under the target, and the acceptance does not depend on the heads' probabilities at all). It
    trades fidelity for a higher acceptance rate; at temperature 0 it reduces to greedy acceptance.

    Args:
        parents, tokens: long [N] (tree topology and tokens, as :func:`specrepro.core.trees.verify_tree`).
        target_probs: float [N+1, V]; row 0 = target at the root, row i+1 after node i.
        generator: torch.Generator for the next token.
        epsilon, delta: the hard threshold ε and the entropy-scaled threshold δ (Medusa defaults 0.09, 0.3).
        sampling: if greedy, the next token is the argmax.

    Returns:
        (accepted_path, next_token).

    Raises:
        ValueError: ε or δ outside (0, 1], inconsistent shapes.
    """
    if not (0 < epsilon <= 1 and 0 < delta <= 1):
        raise ValueError(f"typical acceptance needs 0 < epsilon, delta <= 1, got {epsilon}, {delta}")
    parents = torch.as_tensor(parents).reshape(-1).cpu()
    tokens = torch.as_tensor(tokens).reshape(-1).cpu()
    n = parents.numel()
    if target_probs.shape[0] != n + 1 or tokens.numel() != n:
        raise ValueError(f"target_probs must be [N+1={n + 1}, V] and tokens [N], got {tuple(target_probs.shape)}, "
                         f"{tokens.numel()}")
    p = target_probs.double()
    ent = -(p * p.clamp_min(1e-300).log()).sum(-1)  # [N+1], nats
    thresh = torch.minimum(torch.full_like(ent, epsilon), delta * torch.exp(-ent))
    ok = torch.zeros(n, dtype=torch.bool)
    if n:
        par_row = (parents + 1)  # row of the parent node (0 = root)
        ok = p[par_row, tokens.to(p.device)].cpu() > thresh[par_row].cpu()
    # longest accepted path: a node is reachable if it is accepted and its parent is reachable (or is the root)
    reach = torch.zeros(n, dtype=torch.bool)
    depth = torch.zeros(n, dtype=torch.long)
    for i in range(n):
        par = int(parents[i])
        if ok[i] and (par < 0 or reach[par]):
            reach[i] = True
            depth[i] = 1 if par < 0 else depth[par] + 1
    if bool(reach.any()):
        best = int(torch.where(reach, depth, torch.full_like(depth, -1)).argmax())
        path = []
        node = best
        while node >= 0:
            path.append(node)
            node = int(parents[node])
        path = path[::-1]
    else:
        path = []
    row = target_probs[path[-1] + 1 if path else 0]
    nxt = int(row.argmax()) if (sampling is not None and sampling.greedy) else int(sample(row, generator))
    return path, nxt


@torch.inference_mode()
def medusa_generate(
    target,
    input_ids: torch.Tensor,
    proposer: MedusaProposer,
    *,
    acceptance: str = "greedy",
    max_new_tokens: int = 128,
    sampling: SamplingConfig = GREEDY,
    generator: torch.Generator | None = None,
    eos_token_id: int | list[int] | None = MODEL_EOS,
    epsilon: float = 0.09,
    delta: float = 0.3,
    seed: int | None = None,
) -> GenerationResult:
    """Decode with Medusa heads: each step the heads' candidate tree is scored in ONE target forward with tree
    attention, then accepted by ``acceptance``; the hidden state at the last accepted node feeds the next tree.

    Runs :func:`specrepro.core.trees.tree_generate` (same cache convention and bookkeeping) with Medusa's checks on
    top; "typical" passes :func:`typical_acceptance_verify` as its acceptance rule.

    Args:
        target: a transformers causal LM accepted by :func:`~specrepro.core.tree_attention.check_tree_attention`.
        input_ids: long [L] or [1, L].
        proposer: :class:`MedusaProposer` (mode "topk" for greedy/typical; "iid"/"without_replacement" for "mss").
        acceptance: "greedy" (exact: output = AR greedy up to float ties), "typical" (Medusa's typical acceptance,
            NOT distribution-preserving), "mss" (exact multi-step speculative sampling, SpecInfer) or "naive".
        max_new_tokens, sampling, generator, eos_token_id, seed: as :func:`specrepro.core.decoding.generate` (EOS default:
            the target's generation config; ``seed`` instead of ``generator``).
        epsilon, delta: typical acceptance thresholds.

    Returns:
        :class:`~specrepro.core.decoding.GenerationResult`; ``drafted`` = tree nodes per step, ``accepted`` = accepted path
        length per step, ``tokens_per_step`` = Medusa's acceleration rate.

    Raises:
        ValueError: unknown acceptance, max_new_tokens < 1, empty prompt, missing generator for sampling, greedy
            acceptance with a non-greedy sampling config, an architecture without tree attention.
    """
    if acceptance not in ACCEPTANCE_METHODS:
        raise ValueError(f"unknown acceptance {acceptance!r}; expected one of {ACCEPTANCE_METHODS}")
    if int(max_new_tokens) != max_new_tokens or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if acceptance == "greedy" and not sampling.greedy:
        raise ValueError("greedy acceptance needs temperature 0 sampling; use 'typical' or 'mss' otherwise")
    if acceptance != "greedy" and not sampling.greedy and generator is None and seed is None:
        raise ValueError("sampling needs an explicit torch.Generator (pass generator=torch.Generator().manual_seed(s) "
                         "or seed=s)")
    def typical(parents, tokens, p, q, gen):
        return typical_acceptance_verify(parents, tokens, p, gen, epsilon=epsilon, delta=delta, sampling=sampling)

    # under "typical", `method` is only validated by tree_generate: the rule applied is `typical`
    method = ("greedy" if sampling.greedy else "mss") if acceptance == "typical" else acceptance
    verify = typical if acceptance == "typical" else None
    return tree_generate(target, input_ids, proposer, max_new_tokens=max_new_tokens, sampling=sampling,
                         generator=generator, eos_token_id=eos_token_id, method=method, verify=verify, seed=seed)
