"""Exact verifiers from papers after Leviathan / Chen / SpecInfer, as pure functions over probability tensors.

What this file is: three verification rules with the contracts of :func:`specrepro.core.sampling.verify_chain`
(chains) and :func:`specrepro.core.trees.verify_tree` (trees), each with an ``*_outcomes`` function that
enumerates every outcome with its exact probability (the analytic side of the exactness battery), and the
enumeration drivers that turn one step's outcomes into the exact distribution of the first ``length`` tokens.

* :func:`verify_tree_traversal` / :func:`verify_chain_traversal` — Traversal Verification (Weng et al., NeurIPS 2025,
  arXiv:2505.12398; its verification algorithm, reconstructed: the docstring of :func:`verify_tree_traversal`): leaf-to-root, sequence-level acceptance on a token tree. On a chain it IS block
  verification (Sun et al. 2025): the same stopping probabilities h_k and residuals.
* :func:`verify_multipath_gbv` / :func:`verify_tree_gbv` — greedy multi-path block verification (GBV; Thomas & Pal
  2026, arXiv:2602.16961, the paper's multi-path part, Sec. 4 as its reviews cite it): pick the best of K i.i.d.
  draft paths under a lexicographic p/q order, then block verification of that one path against the law of the pick
  (the "skewed draft"). The paper's algorithm text was not reachable here; the rule follows the authors' reference
  implementation (see :func:`verify_multipath_gbv`).
* :func:`verify_multipath_block` — another multi-path generalization of block verification over K draft paths:
  block verification along each path, recursive rejection across paths at the root (= traversal verification on the
  tree of K unmerged paths). It is NOT the paper's GBV (a different outcome law, by enumeration in the tests).
* :func:`verify_tree_spectr` — SpecTr's K-SEQ draft selection (Sun et al., NeurIPS 2023, arXiv:2310.15141, the
  K-SEQ algorithm with its choice rho* of rho; SpecTr writes p for the draft and q for the target, here the project's
  p = target, q = draft), applied level by level to i.i.d. draft paths.

The project's Sequoia-style sampling without replacement + MSS (``core.trees``: child j drawn from q renormalized
without the earlier siblings, accepted with min(1, P/Q_j), residual norm(max(0, P - Q_j))) already IS recursive
rejection sampling without replacement (RRSw, Jeon et al. 2024, arXiv:2402.14160), so it is not re-implemented here.

Notation: w is a node's sequence-level acceptance weight (the paper's p_alpha), p the target row at the node
(M_b), q the proposal row of a child (M_s; given the earlier siblings, so i.i.d. and without-replacement children
both work).
"""

from __future__ import annotations

import numpy as np
import torch

from specrepro.core.sampling import check_chain_shapes, sample, uniform
from specrepro.core.trees import check_verify_args, children_lists

__all__ = ["child_weight", "after_rejection", "verify_tree_traversal", "traversal_outcomes", "verify_chain_traversal",
           "chain_traversal_outcomes", "multipath_tree", "verify_multipath_block", "multipath_block_outcomes",
           "gbv_rank", "gbv_skew", "gbv_select", "verify_multipath_gbv", "gbv_outcomes", "tree_chains",
           "verify_tree_gbv", "gbv_tree_outcomes",
           "kseq_rho", "kseq_residual", "kseq_outcomes", "verify_tree_spectr", "spectr_tree_outcomes"]


# ----------------------------------------------------------------------------------------------------------------
# Traversal verification (Weng et al. 2025, arXiv:2505.12398)
# ----------------------------------------------------------------------------------------------------------------

def child_weight(w: float, p: torch.Tensor, q: torch.Tensor | None, x: int) -> float:
    """p_alpha of a child with token x: min(1, w · p(x) / q(x)) (q = None: a point mass, q(x) = 1).
    q(x) = 0 (a token its row could not draw) gives 1 if w·p(x) > 0 else 0, as acceptance_probability."""
    px, qx = w * float(p[x]), 1.0 if q is None else float(q[x])
    return min(1.0, px / qx) if qx > 0 else float(px > 0)


def after_rejection(w: float, p: torch.Tensor, q: torch.Tensor | None, x: int) -> tuple[float, torch.Tensor]:
    """A node's new (p_alpha, M_b) after the subtree of a child with token x drawn from q was rejected.

    r = max(0, w·p − q), Z = Σ r; the new target row is r / Z and the new weight Z / (Z + 1 − w): of the
    1 − w + Z probability that the child's subtree fails, Z is still owed to this node's own continuations and 1 − w
    is the node's own failure. (With w = 1 this is the residual of SpecInfer/RRS; on a chain it is block
    verification's h_k.) Z = 0 keeps p, and Z + 1 − w = 0 keeps w: both are reached with probability 0 (up to
    rounding), and keeping w = 1 at the root means the root is never rejected."""
    if q is None:
        q = torch.zeros_like(p)
        q[x] = 1.0
    r = (w * p - q.to(p.dtype)).clamp_min(0.0)
    z = float(r.sum())
    denom = z + 1.0 - w
    return (z / denom if denom > 0 else w), (r / z if z > 0 else p)


def _prepare(parents, tokens, target_probs, proposal_probs):
    parents = torch.as_tensor(parents).reshape(-1)
    tokens = torch.as_tensor(tokens).reshape(-1)
    check_verify_args(parents, tokens, target_probs, proposal_probs, "mss")
    return children_lists(parents.cpu()), tokens.tolist()


def verify_tree_traversal(parents: torch.Tensor, tokens: torch.Tensor, target_probs: torch.Tensor,
                          proposal_probs: torch.Tensor | None, generator: torch.Generator | None, *,
                          update_fn=None) -> tuple[list[int], int]:
    """Verify a token tree with Traversal Verification (Weng et al. 2025, arXiv:2505.12398).

    Every node X carries p_alpha(X) = min(1, p_alpha(parent) · M_b(x | parent) / M_s(x | parent)) (root: 1). The
    verifier visits the tree in post-order (children in index order, a node after all its children): the node
    visited is accepted with probability p_alpha, which accepts the whole path root → node; a bonus token is then
    drawn from the node's current target row M_b. A rejected node is deleted and its parent updated
    (:func:`after_rejection`): M_b(parent) := norm(max(0, p_alpha(parent)·M_b(parent) − M_s)), p_alpha(parent) :=
    Z / (Z + 1 − p_alpha(parent)), and the p_alpha of the remaining siblings' subtrees are recomputed from it. The
    root is never rejected (its p_alpha stays 1); if all its children are rejected the next token comes from its
    final M_b. Equivalent to the paper's loop "take the first leaf in post-order DFS, accept or delete it".

    Exact (the emitted tokens are distributed as target samples: the paper's losslessness theorem, and the
    enumeration of tests/test_verifiers.py) whenever row c of
    ``proposal_probs`` is the law node c was drawn from given its earlier siblings: i.i.d. children, children
    drawn without replacement with renormalized rows (Sequoia), or point masses. On a chain it coincides with
    block verification (Sun et al. 2025), which is optimal there.

    Args:
        parents: long [N], -1 = child of the root, parents precede children.
        tokens: long [N].
        target_probs: float [N+1, V]; row 0 = target at the root, row i+1 = target after node i.
        proposal_probs: float [N, V] (row i = distribution node i was drawn from given its earlier siblings) or None
            (point masses).
        generator: the torch.Generator for all randomness.
        update_fn: replacement for :func:`after_rejection`; only for negative controls.

    Returns:
        (accepted_path, next_token): accepted node indices from the root down, and the bonus/correction token.

    Raises:
        ValueError: inconsistent shapes.
    """
    kids, toks = _prepare(parents, tokens, target_probs, proposal_probs)
    update = update_fn or after_rejection

    def visit(node: int, w: float, p: torch.Tensor):
        for c in kids.get(node, []):
            q = None if proposal_probs is None else proposal_probs[c]
            found = visit(c, child_weight(w, p, q, toks[c]), target_probs[c + 1])
            if found is not None:
                return [c] + found[0], found[1]
            w, p = update(w, p, q, toks[c])
        if float(uniform((), generator, device=p.device, dtype=torch.float64)) < w:
            return [], int(sample(p, generator))
        return None

    return visit(-1, 1.0, target_probs[0])


def traversal_outcomes(parents, tokens, target_probs, proposal_probs, *, update_fn=None) -> list:
    """Every outcome of :func:`verify_tree_traversal` with its exact probability (same pieces: :func:`child_weight`
    and :func:`after_rejection`). Returns list of (accepted_path tuple, next_token, probability)."""
    kids, toks = _prepare(parents, tokens, target_probs, proposal_probs)
    update = update_fn or after_rejection
    out = []

    def visit(node, w, p, path, reach):
        """Adds the accepting outcomes of node's subtree (weighted by reach); returns the probability it fails."""
        fail = 1.0
        for c in kids.get(node, []):
            q = None if proposal_probs is None else proposal_probs[c]
            fail *= visit(c, child_weight(w, p, q, toks[c]), target_probs[c + 1], path + (c,), reach * fail)
            if fail == 0:
                return 0.0
            w, p = update(w, p, q, toks[c])
        if w > 0:
            for y in (p > 0).nonzero().flatten().tolist():
                out.append((path, y, reach * fail * w * float(p[y])))
        return fail * (1.0 - w)

    visit(-1, 1.0, target_probs[0], (), 1.0)
    return out


def verify_chain_traversal(target_probs: torch.Tensor, draft_probs: torch.Tensor | None, draft_tokens: torch.Tensor,
                           generator: torch.Generator | None, *, update_fn=None) -> tuple[int, int]:
    """Traversal Verification of one drafted chain (arXiv:2505.12398 on a width-1 tree).

    Same contract as :func:`specrepro.core.sampling.verify_chain`. Leaf first: accept all γ tokens with probability
    p_alpha(X_γ) = w_γ; on rejection step back to X_{γ−1} with the updated p_alpha = Z_{γ−1}/(Z_{γ−1} + 1 − w_{γ−1})
    and M_b = norm(max(0, w_{γ−1} p_{γ−1} − q_{γ−1})), and so on to the root. These are exactly block verification's
    h_k and residuals (Sun et al. 2025, Alg. 2), visited in the order that makes τ = the last k with η_k <= h_k, so
    the output law equals :func:`~specrepro.core.sampling.verify_block`'s (checked by enumeration).

    Args:
        target_probs: float [gamma+1, V]; draft_probs: float [gamma, V] or None (point masses); draft_tokens: long
            [gamma]; generator: the torch.Generator for all randomness; update_fn: negative controls only.

    Returns:
        ``(n_accepted, next_token)`` as Python ints.

    Raises:
        ValueError: shapes disagree.
    """
    g = check_chain_shapes(draft_tokens, target_probs, draft_probs)
    path, nxt = verify_tree_traversal(torch.arange(-1, g - 1), draft_tokens, target_probs, draft_probs, generator,
                                      update_fn=update_fn)
    return len(path), nxt


def chain_traversal_outcomes(ps: torch.Tensor, qs: torch.Tensor | None, drafted: tuple, *, update_fn=None) -> list:
    """Every outcome of :func:`verify_chain_traversal`: list of (n_accepted, next_token, probability)
    (the format of the chain enumeration's ``chain_verify_outcomes``). ps float [g+1, V]; qs float [g, V] or None."""
    g = len(drafted)
    outs = traversal_outcomes(torch.arange(-1, g - 1), torch.tensor(drafted, dtype=torch.long).reshape(-1), ps, qs,
                              update_fn=update_fn)
    return [(len(path), y, pr) for path, y, pr in outs]


# ----------------------------------------------------------------------------------------------------------------
# Multi-path block verification by recursive rejection across paths (not the paper's GBV; GBV is below)
# ----------------------------------------------------------------------------------------------------------------

def multipath_tree(target_probs: torch.Tensor, draft_probs: torch.Tensor | None, draft_tokens: torch.Tensor):
    """The K draft paths as one token tree of K unmerged chains under the root (path k, position i is node
    k·γ + i). Returns (parents long [Kγ], tokens long [Kγ], tree target rows [Kγ+1, V], proposal rows [Kγ, V] or
    None). Raises ValueError unless target_probs is [K, γ+1, V], draft_tokens [K, γ], draft_probs [K, γ, V]."""
    if draft_tokens.dim() != 2 or target_probs.dim() != 3:
        raise ValueError(f"expected draft_tokens [K, gamma] and target_probs [K, gamma+1, V], got "
                         f"{tuple(draft_tokens.shape)} and {tuple(target_probs.shape)}")
    k, g = draft_tokens.shape
    if tuple(target_probs.shape[:2]) != (k, g + 1):
        raise ValueError(f"target_probs must be [K={k}, gamma+1={g + 1}, V], got {tuple(target_probs.shape)}")
    if draft_probs is not None and tuple(draft_probs.shape) != (k, g, target_probs.shape[-1]):
        raise ValueError(f"draft_probs must be [K={k}, gamma={g}, V], got {tuple(draft_probs.shape)}")
    parents = torch.tensor([-1 if i == 0 else j * g + i - 1 for j in range(k) for i in range(g)], dtype=torch.long)
    rows = torch.cat([target_probs[0, :1], target_probs[:, 1:].reshape(k * g, -1)])
    qs = None if draft_probs is None else draft_probs.reshape(k * g, -1)
    return parents, draft_tokens.reshape(-1), rows, qs


def verify_multipath_block(target_probs: torch.Tensor, draft_probs: torch.Tensor | None, draft_tokens: torch.Tensor,
                           generator: torch.Generator | None, *, update_fn=None) -> tuple[int, int, int]:
    """Multi-path block verification of K draft paths by recursive rejection across the paths.

    NOT Thomas & Pal's GBV (that is :func:`verify_multipath_gbv`, which verifies one selected path; the two rules
    have different outcome laws, shown by enumeration in the tests). This is the multi-path generalization of block
    verification that we can prove exact (and do, by enumeration): block verification along path 1 (leaf to root,
    Sun et al. 2025 Alg. 2); if path 1 fails down to the root, the root's target row becomes the residual
    norm(max(0, p_0 − q_0)) (recursive rejection sampling across paths, SpecInfer/SpecTr) and path 2 is verified
    against it with the updated first-token ratio, and so on; if every path fails the next token comes from the final
    residual. It is :func:`verify_tree_traversal` on the tree of K unmerged chains (:func:`multipath_tree`); with
    K = 1 it is block verification.

    Args:
        target_probs: float [K, gamma+1, V]; row [k, i] = target after the first i tokens of path k (rows [k, 0] are
            all the root's row; row [0, 0] is used).
        draft_probs: float [K, gamma, V] (row [k, i] = law path k's token i was drawn from, given the path and the
            earlier paths' first tokens at i = 0) or None for point masses.
        draft_tokens: long [K, gamma].
        generator: the torch.Generator for all randomness; update_fn: negative controls only.

    Returns:
        ``(path_index, n_accepted, next_token)`` as Python ints (path_index 0 when nothing is accepted).

    Raises:
        ValueError: shapes disagree.
    """
    g = draft_tokens.shape[-1]
    path, nxt = verify_tree_traversal(*multipath_tree(target_probs, draft_probs, draft_tokens), generator,
                                      update_fn=update_fn)
    return (path[0] // g if path else 0), len(path), nxt


def multipath_block_outcomes(target_probs, draft_probs, draft_tokens, *, update_fn=None) -> list:
    """Every outcome of :func:`verify_multipath_block`: list of (path_index, n_accepted, next_token, probability)."""
    g = draft_tokens.shape[-1]
    return [((path[0] // g if path else 0), len(path), y, pr)
            for path, y, pr in traversal_outcomes(*multipath_tree(target_probs, draft_probs, draft_tokens),
                                                  update_fn=update_fn)]


# ----------------------------------------------------------------------------------------------------------------
# Greedy multi-path block verification, GBV (Thomas & Pal 2026, arXiv:2602.16961)
# ----------------------------------------------------------------------------------------------------------------

def gbv_rank(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """GBV's order of the vocabulary at one prefix: long [V], the position of each token when sorted by p(t)/q(t)
    ascending, ties broken by token id (the smaller id ranks lower). Higher rank = preferred. Tokens with q(t) = 0
    (which no draft can hold) get ratio 0; they carry no draft mass, so where they sit changes nothing.
    p, q: float [V] (target and draft rows at the prefix)."""
    p, q = p.double(), q.double()
    ratio = torch.where(q > 0, p / torch.where(q > 0, q, torch.ones_like(q)), torch.zeros_like(q))
    order = torch.argsort(ratio, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)
    return rank


def gbv_skew(q: torch.Tensor, below: torch.Tensor, a: float, x: float, k: int) -> torch.Tensor:
    """The law of the next token of the best of k i.i.d. draft paths, given that the best path starts with prefix c.

    Args:
        q: float [V], the draft row at c.
        below: float [V], Σ q(u) over the tokens u ranked below t (:func:`gbv_rank`), per t.
        a: the probability that one draft path lies, in the lexicographic order, below every path starting with c.
        x: the probability that one draft path starts with c.
        k: the number of i.i.d. paths.

    Returns:
        float64 [V]: s(t) = [(a + x·below(t) + x·q(t))^k − (a + x·below(t))^k] / [(a + x)^k − a^k], computed as
        q(t)·S(b_t, a_t) / S(1, a / (a + x)) with S(b, a) = Σ_{j<k} b^j a^(k−1−j) and b_t, a_t the two bases
        divided by a + x (no cancellation), then renormalized against rounding. k = 1 (or x = 0) gives q.
    """
    q = q.double()
    tot = a + x
    if k == 1 or not tot > 0:
        return q
    lo = (a + x * below.double()) / tot
    hi = lo + x * q / tot
    num = sum(hi ** j * lo ** (k - 1 - j) for j in range(k))
    den = sum((a / tot) ** (k - 1 - j) for j in range(k))
    s = (q * num / den).clamp_min(0.0)
    z = s.sum()
    return s / z if bool(z > 0) else q


def gbv_select(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor, *,
               skew_fn=None) -> tuple[int, torch.Tensor]:
    """GBV's path selection: the index of the best of the K draft paths and the skewed draft rows along it.

    Walks from the root: at position i, among the paths that agree with the chosen prefix, the token of highest
    :func:`gbv_rank` (target and draft rows of the first such path) extends the prefix; the chosen path is the first
    path carrying the whole chosen prefix (the lexicographic maximum). Along the way, row i of the skewed draft is
    :func:`gbv_skew` at the chosen prefix of length i.

    Args: as :func:`verify_multipath_gbv` (draft_probs not None); skew_fn replaces :func:`gbv_skew` (negative
    controls only).

    Returns:
        (path_index, skew rows float64 [gamma, V]).
    """
    k, g = draft_tokens.shape
    toks = draft_tokens.tolist()
    skew = skew_fn or gbv_skew
    active, a, x, rows = list(range(k)), 0.0, 1.0, []
    for i in range(g):
        head = active[0]
        q = draft_probs[head, i].double()
        rank = gbv_rank(target_probs[head, i], q)
        best = max({toks[j][i] for j in active}, key=lambda t: int(rank[t]))
        order = torch.empty_like(rank)  # rank's inverse permutation: the tokens in rank order (no second sort)
        order[rank] = torch.arange(rank.numel(), device=rank.device)
        below = torch.empty_like(q)
        below[order] = torch.cat([q.new_zeros(1), torch.cumsum(q[order], 0)[:-1]])
        rows.append(skew(q, below, a, x, k))
        a, x = a + x * float(below[best]), x * float(q[best])
        active = [j for j in active if toks[j][i] == best]
    if not rows:
        return 0, draft_probs.new_empty(0, draft_probs.shape[-1]).double()
    return active[0], torch.stack(rows)


def _check_gbv_args(target_probs, draft_probs, draft_tokens):
    multipath_tree(target_probs, draft_probs, draft_tokens)  # shape checks
    if draft_probs is None:
        raise ValueError("GBV needs the law of the i.i.d. draft paths (draft_probs), not point masses")


def verify_multipath_gbv(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
                         generator: torch.Generator | None, *, skew_fn=None,
                         update_fn=None) -> tuple[int, int, int]:
    """Greedy multi-path block verification (GBV) of K i.i.d. draft paths (Thomas & Pal 2026, arXiv:2602.16961).

    Source: the paper's multi-path part (Sec. 4, as the paper's OpenReview reviews cite it, e.g. its Theorem 4.6: the
    multi-path linear program, its decomposition into a path selection that "skews" the draft followed by single-path
    block verification, and the greedy class that ranks paths with on-path probabilities only). Neither that text nor
    the algorithm's number in the paper was reachable from here; the rule follows the authors' reference
    implementation (``TreeVerifier.gbv_verify`` / ``compute_skew``), with one tie-breaking order used throughout (see
    below). Steps:

    1. Selection (:func:`gbv_select`): order paths lexicographically, each position by p(t)/q(t) at its prefix
       (:func:`gbv_rank`); take the largest of the K drafted paths (a greedy walk from the root).
    2. Skewed draft (:func:`gbv_skew`): the chosen path is distributed as the maximum of K i.i.d. draft paths, whose
       next-token law at a prefix c is s_c(t) = [(A + Y_t + Z_t)^K − (A + Y_t)^K] / [(A + X)^K − A^K] (X = q(c), A =
       the draft mass below c, Y_t = X·q-mass of the tokens ranked below t, Z_t = X·q_c(t)).
    3. Block verification (Sun et al. 2025; here :func:`verify_chain_traversal`, the same law) of the chosen path with
       the rows s in place of the draft rows q: weights min(1, w·p/s), stopping probabilities, residual
       norm(max(0, w·p − s)) at the last accepted prefix, or a bonus token from p after the whole path.

    Exact (emitted tokens distributed as target samples; enumeration in tests/test_verifiers.py) when the K paths are
    i.i.d. draws from the draft and ``draft_probs`` holds that draft's rows: the chosen path is then an
    autoregressive draw from s, and block verification is exact for the law it is given. With K = 1 it is block
    verification. The authors' code breaks ties in p/q differently in its walk (first child) and in its skew (token
    id), which is not exact when two drafted tokens tie; here both use (ratio, token id).

    Args:
        target_probs: float [K, gamma+1, V]; row [k, i] = target after the first i tokens of path k (rows of paths
            sharing a prefix must agree; the first such path's rows are used).
        draft_probs: float [K, gamma, V]; row [k, i] = the draft's law of path k's token i given its first i tokens
            (the same for every path: i.i.d. paths).
        draft_tokens: long [K, gamma].
        generator: the torch.Generator for all randomness.
        skew_fn, update_fn: replacements for :func:`gbv_skew` and :func:`after_rejection`; negative controls only.

    Returns:
        ``(path_index, n_accepted, next_token)`` as Python ints: the chosen path, how many of its tokens are
        accepted, and the correction or bonus token.

    Raises:
        ValueError: shapes disagree (as :func:`verify_multipath_block`), or draft_probs is None.
    """
    _check_gbv_args(target_probs, draft_probs, draft_tokens)
    k, rows = gbv_select(target_probs, draft_probs, draft_tokens, skew_fn=skew_fn)
    n, nxt = verify_chain_traversal(target_probs[k], rows.to(target_probs.device), draft_tokens[k], generator,
                                    update_fn=update_fn)
    return k, n, nxt


def gbv_outcomes(target_probs, draft_probs, draft_tokens, *, skew_fn=None, update_fn=None) -> list:
    """Every outcome of :func:`verify_multipath_gbv` with its exact probability (the selection is a function of the
    drafts; the rest is :func:`chain_traversal_outcomes` with the skewed rows): list of (path_index, n_accepted,
    next_token, probability)."""
    _check_gbv_args(target_probs, draft_probs, draft_tokens)
    k, rows = gbv_select(target_probs, draft_probs, draft_tokens, skew_fn=skew_fn)
    drafted = tuple(draft_tokens[k].tolist())
    return [(k, n, y, pr) for n, y, pr in chain_traversal_outcomes(target_probs[k], rows.to(target_probs.dtype),
                                                                   drafted, update_fn=update_fn)]


def tree_chains(parents: torch.Tensor) -> list[list[int]]:
    """The node paths of a tree made of K chains of equal depth under the root (an expansion tree ⟨K,1,...,1⟩, or
    :func:`multipath_tree`'s layout): list of K lists of node indices, root to leaf, chains in the order of their
    first nodes. Raises ValueError for any other shape."""
    kids = children_lists(torch.as_tensor(parents).reshape(-1).cpu())
    chains = []
    for first in kids.get(-1, []):
        nodes = [first]
        while nodes[-1] in kids:
            if len(kids[nodes[-1]]) != 1:
                raise ValueError("GBV verifies K unbranched paths under the root (a <K,1,...,1> tree); node "
                                 f"{nodes[-1]} has {len(kids[nodes[-1]])} children")
            nodes.append(kids[nodes[-1]][0])
        chains.append(nodes)
    if len({len(c) for c in chains}) > 1:
        raise ValueError(f"GBV needs paths of equal length, got {[len(c) for c in chains]}")
    return chains


def _tree_as_paths(parents, tokens, target_probs, proposal_probs):
    parents = torch.as_tensor(parents).reshape(-1)
    tokens = torch.as_tensor(tokens).reshape(-1)
    check_verify_args(parents, tokens, target_probs, proposal_probs, "mss")
    if proposal_probs is None and parents.numel():
        raise ValueError("GBV needs the law of the i.i.d. draft paths (proposal_probs), not point masses")
    chains = tree_chains(parents)
    if not chains:
        return chains, None
    idx = torch.tensor(chains, dtype=torch.long, device=target_probs.device)
    tp = torch.cat([target_probs[0].expand(len(chains), 1, -1), target_probs[idx + 1]], 1)
    return chains, (tp, proposal_probs[idx.to(proposal_probs.device)], tokens[idx.to(tokens.device)])


def verify_tree_gbv(parents: torch.Tensor, tokens: torch.Tensor, target_probs: torch.Tensor,
                    proposal_probs: torch.Tensor, generator: torch.Generator | None, *, skew_fn=None,
                    update_fn=None) -> tuple[list[int], int]:
    """:func:`verify_multipath_gbv` on a token tree of K i.i.d. unmerged draft paths under the root (the expansion
    tree ⟨K,1,...,1⟩ of :class:`~specrepro.core.trees.DraftTreeProposer` in "iid" mode), with the contract of
    :func:`specrepro.core.trees.verify_tree` (a ``verify=`` rule of :func:`~specrepro.core.trees.tree_generate`).

    Args:
        parents, tokens, target_probs: as :func:`verify_tree_traversal` (long [N], long [N], float [N+1, V]).
        proposal_probs: float [N, V], the draft row each node was drawn from (i.i.d. paths).
        generator: the torch.Generator for all randomness; skew_fn, update_fn: negative controls only.

    Returns:
        (accepted_path, next_token): the accepted node indices on the chosen path from the root down, and the
        correction or bonus token. An empty tree gives ([], a token from target row 0).

    Raises:
        ValueError: inconsistent shapes, point masses (None), or a tree that is not K unbranched paths of equal
        length under the root.
    """
    chains, paths = _tree_as_paths(parents, tokens, target_probs, proposal_probs)
    if not chains:
        return [], int(sample(target_probs[0], generator))
    k, n, nxt = verify_multipath_gbv(*paths, generator, skew_fn=skew_fn, update_fn=update_fn)
    return chains[k][:n], nxt


def gbv_tree_outcomes(parents, tokens, target_probs, proposal_probs, *, skew_fn=None, update_fn=None) -> list:
    """Every outcome of :func:`verify_tree_gbv`: list of (accepted_path tuple, next_token, probability)."""
    chains, paths = _tree_as_paths(parents, tokens, target_probs, proposal_probs)
    if not chains:
        p = target_probs[0]
        return [((), y, float(p[y])) for y in (p > 0).nonzero().flatten().tolist()]
    return [(tuple(chains[k][:n]), y, pr) for k, n, y, pr in gbv_outcomes(*paths, skew_fn=skew_fn,
                                                                            update_fn=update_fn)]


# ----------------------------------------------------------------------------------------------------------------
# SpecTr K-SEQ draft selection (Sun et al. 2023, arXiv:2310.15141)
# ----------------------------------------------------------------------------------------------------------------

def kseq_rho(p: torch.Tensor, q: torch.Tensor, k: int, iters: int = 60) -> float:
    """The smallest ρ in [1, k] with 1 − (1 − β(ρ))^k <= ρ β(ρ), where β(ρ) = Σ_x min(q(x), p(x)/ρ) is the
    probability that one draw x ~ q is accepted with min(1, p(x)/(ρ q(x))): SpecTr's ρ*, the most accepting ρ for
    which K-SEQ's residual is a distribution. The left side falls and the right side rises with ρ, and ρ = k always
    satisfies it (Bernoulli's inequality), so the valid ρ form an interval [ρ*, k]; bisection returns a ρ on the
    valid side (within 2^-iters·k of ρ*)."""
    pn, qn = p.double().cpu().numpy(), q.double().cpu().numpy()

    def valid(rho):
        b = float(np.minimum(qn, pn / rho).sum())
        return 1.0 - (1.0 - b) ** k <= rho * b

    lo, hi = 1.0, float(k)
    if valid(lo):
        return lo
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if valid(mid) else (mid, hi)
    return hi


def kseq_residual(p: torch.Tensor, q: torch.Tensor, k: int, rho: float) -> torch.Tensor:
    """K-SEQ's residual: with α(x) = min(q(x), p(x)/ρ) and β = Σ α, a draw-phase output has law
    α · (1 − (1 − β)^k)/β, so p_res = (p − α (1 − (1 − β)^k)/β) / (1 − β)^k (rounding negatives clamped, then
    renormalized). β = 0 (p and q disjoint) gives p."""
    alpha = torch.minimum(q, p / rho)
    beta = float(alpha.sum())
    if beta <= 0:
        return p
    r = (p - alpha * ((1.0 - (1.0 - beta) ** k) / beta)).clamp_min(0.0)
    return r / r.sum() if bool(r.sum() > 0) else p


def kseq_outcomes(p: torch.Tensor, q: torch.Tensor, draws: list, *, rho: float | None = None, residual_fn=None):
    """Every outcome of K-SEQ on the draws (x_1..x_k i.i.d. from q): list of (token, from_draft bool, probability).
    Draw i is accepted with probability min(1, p(x_i)/(ρ q(x_i))) if all earlier ones were rejected; if none is,
    the token comes from :func:`kseq_residual`."""
    k = len(draws)
    rho = kseq_rho(p, q, k) if rho is None else rho
    out, reach = [], 1.0
    for x in draws:
        a = min(1.0, float(p[x]) / (rho * float(q[x]))) if float(q[x]) > 0 else float(p[x] > 0)
        if a > 0:
            out.append((x, True, reach * a))
        reach *= 1.0 - a
        if reach == 0:
            return out
    res = (residual_fn or kseq_residual)(p, q, k, rho)
    out += [(y, False, reach * float(res[y])) for y in (res > 0).nonzero().flatten().tolist()]
    return out


def _level(kids, active, proposal_probs):
    """The candidate children of the nodes in ``active`` (all with the same token path) and their common row."""
    cands = [c for a in active for c in kids.get(a, [])]
    if not cands:
        return cands, None
    q = proposal_probs[cands[0]]
    if any(not torch.equal(proposal_probs[c], q) for c in cands[1:]):
        raise ValueError("K-SEQ needs i.i.d. candidates: children of the same token path must share one proposal row")
    return cands, q


def verify_tree_spectr(parents: torch.Tensor, tokens: torch.Tensor, target_probs: torch.Tensor,
                       proposal_probs: torch.Tensor | None, generator: torch.Generator | None, *,
                       residual_fn=None) -> tuple[list[int], int]:
    """Verify i.i.d. draft paths with SpecTr's K-SEQ draft selection (Sun et al. 2023, arXiv:2310.15141),
    level by level (its draft-tree procedure: the drafts consistent with the accepted prefix are i.i.d. given it).

    At the current prefix, the candidates are the children of every node whose token path equals it (k of them, i.i.d.
    from one row q); with p the target row there and ρ = :func:`kseq_rho`, K-SEQ tries them in order, accepting x_i
    with min(1, p(x_i)/(ρ q(x_i))); an accepted token extends the prefix (all candidates with that token carry on),
    otherwise the step ends with a token from :func:`kseq_residual`. At a prefix without candidates the bonus token
    comes from p. With one candidate per level (k = 1, ρ = 1) this is Leviathan's token verification.

    Args:
        parents, tokens, target_probs: as :func:`specrepro.core.trees.verify_tree`.
        proposal_probs: float [N, V]; children of the same token path must share one row (i.i.d. drafts).
        generator: the torch.Generator for all randomness; residual_fn: negative controls only.

    Returns:
        (accepted_path, next_token): accepted node indices (the first candidate with each accepted token) and the
        correction or bonus token.

    Raises:
        ValueError: inconsistent shapes, point-mass proposals (None), or candidates with different rows.
    """
    kids, toks = _prepare(parents, tokens, target_probs, proposal_probs)
    if proposal_probs is None and len(toks):
        raise ValueError("K-SEQ needs the proposal distribution of i.i.d. drafts, not point masses")
    path, active = [], [-1]
    while True:
        p = target_probs[active[0] + 1]
        cands, q = _level(kids, active, proposal_probs)
        if not cands:
            return path, int(sample(p, generator))
        k, rho = len(cands), kseq_rho(p, q, len(cands))
        for c in cands:
            x = toks[c]
            a = min(1.0, float(p[x]) / (rho * float(q[x]))) if float(q[x]) > 0 else float(p[x] > 0)
            if float(uniform((), generator, device=p.device, dtype=torch.float64)) < a:
                active = [d for d in cands if toks[d] == x]
                path.append(active[0])
                break
        else:
            return path, int(sample((residual_fn or kseq_residual)(p, q, k, rho), generator))


def spectr_tree_outcomes(parents, tokens, target_probs, proposal_probs, *, residual_fn=None) -> list:
    """Every outcome of :func:`verify_tree_spectr`: list of (accepted_path tuple, next_token, probability)."""
    kids, toks = _prepare(parents, tokens, target_probs, proposal_probs)
    out = []

    def rec(active, path, prob):
        p = target_probs[active[0] + 1]
        cands, q = _level(kids, active, proposal_probs)
        if not cands:
            out.extend((path, y, prob * float(p[y])) for y in (p > 0).nonzero().flatten().tolist())
            return
        for y, drafted, pr in kseq_outcomes(p, q, [toks[c] for c in cands], residual_fn=residual_fn):
            if not drafted:
                out.append((path, y, prob * pr))
            elif pr > 0:
                nxt = [d for d in cands if toks[d] == y]
                rec(nxt, path + (nxt[0],), prob * pr)

    rec([-1], (), 1.0)
    return out
