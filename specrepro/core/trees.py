"""Token trees: construction, verification and the tree decoding loop (SpecInfer; Sequoia's sampling without
replacement; Medusa's static trees).

What this file is:

* :class:`TokenTree` — N speculated tokens arranged as a tree under the last committed token (the root), with the
  distribution each node was drawn from. Parents precede children; siblings are ordered (verification tries them
  in index order).
* Construction: :class:`TreeTemplate` (a topology with per-node ranks: expansion-based ⟨k1,...,km⟩ as in SpecInfer,
  or a static tree from Medusa-style ``choices``), :func:`sample_children` (i.i.d. with replacement, without
  replacement by sequential draws from the renormalized proposal rows of Sequoia, or deterministic top-k = point masses),
  :func:`merge_chains` (merge-based trees from several proposal sources, shared point-mass prefixes merged).
* Proposers: :class:`DraftTreeProposer` (a draft model expanded level by level with tree attention),
  :class:`MergedTreeProposer` (several chain drafters of :mod:`specrepro.drafters` merged into one tree).
* :func:`verify_tree` — SpecInfer's VerifyGreedy and multi-step speculative sampling (MSS, VerifyStochastic), and
  the naive-sampling baseline of SpecInfer Table 3.
* :func:`verify_tree_outcomes`, :func:`drawn_tree_outcomes`, :func:`exact_tree_distribution` — the same rules by
  exact enumeration (every drawn tree, every accept/reject outcome) for the exactness battery.
* :func:`tree_generate` — the KV-cached decoding loop: one target forward over all nodes with tree attention
  (:mod:`specrepro.core.tree_attention`), verification, then the cache keeps only the accepted path.

The proposer protocol (:class:`TreeProposer`): ``propose_tree(ids, sampling, generator) -> TokenTree`` and
``reset()``. A proposer that needs the target's hidden states (Medusa heads) sets ``needs_hidden = True``; the loop
then calls the target with ``output_hidden_states=True`` and, after each step, ``proposer.observe_hidden(h)`` with
``h`` float [hidden] = ``outputs.hidden_states[-1]`` at the node whose target row produced the next token (the last
accepted node, or the root). Before it has seen a hidden state such a proposer returns an empty tree (N = 0), which
the loop treats as a plain autoregressive step.

What it is not: chain speculative decoding (:mod:`specrepro.core.decoding`), Medusa heads (:mod:`specrepro.core.medusa`), or
the attention-mask mechanics (:mod:`specrepro.core.tree_attention`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from specrepro.core.decoding import (
    MODEL_EOS,
    GenerationResult,
    Stopwatch,
    commit_step,
    common_prefix,
    make_generator,
    prefill,
    prompt_ids,
    resolve_eos,
)
from specrepro.core.kvcache import crop_cache, new_cache
from specrepro.core.sampling import (
    GREEDY,
    SamplingConfig,
    acceptance_probability,
    draw,
    fit_width,
    logits_to_probs,
    residual_distribution,
    sample,
    uniform,
)
from specrepro.core.tree_attention import (
    check_tree_attention,
    compile_topology,
    keep_path,
    tree_forward,
)

__all__ = ["SAMPLING_MODES", "VERIFY_METHODS", "TokenTree", "TreeTemplate", "renormalized_without", "sample_children", "children_outcomes", "merge_chains", "TreeProposer", "DraftTreeProposer", "MergedTreeProposer", "verify_tree", "verify_tree_outcomes", "tree_generate"]

#: how children of a node are drawn from its proposal distribution q
SAMPLING_MODES = ("iid", "without_replacement", "topk")
#: verification rules accepted by :func:`verify_tree`
VERIFY_METHODS = ("greedy", "mss", "naive")


# ----------------------------------------------------------------------------------------------------------------
# The tree
# ----------------------------------------------------------------------------------------------------------------

@dataclass
class TokenTree:
    """A token tree under the root (the last committed token).

    Attributes:
        parents: long [N]; parents[i] = index of node i's parent, -1 for a child of the root; parents[i] < i.
        tokens: long [N]; the token of each node.
        proposal_probs: float [N, V] or None. Row i is the distribution node i was drawn from *given its earlier
            siblings* (the proposal q for i.i.d. children, q renormalized without the earlier siblings' tokens for
            sampling without replacement, a one-hot row for a point mass). None means every node is a point mass
            (deterministic proposals: top-k, prompt lookup, Medusa).

    Raises:
        ValueError: shapes disagree, a parent does not precede its child, or proposal rows are not distributions.
    """

    parents: torch.Tensor
    tokens: torch.Tensor
    proposal_probs: torch.Tensor | None = None
    _depth: torch.Tensor | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        self.parents = torch.as_tensor(self.parents, dtype=torch.long).reshape(-1)
        self.tokens = torch.as_tensor(self.tokens, dtype=torch.long).reshape(-1)
        n = self.parents.numel()
        if self.tokens.numel() != n:
            raise ValueError(f"parents has {n} entries but tokens {self.tokens.numel()}")
        if n and not bool(((self.parents >= -1) & (self.parents < torch.arange(n))).all()):
            raise ValueError(f"parents must precede children (-1 <= parents[i] < i), got {self.parents.tolist()}")
        if self.proposal_probs is not None:
            if self.proposal_probs.dim() != 2 or self.proposal_probs.shape[0] != n:
                raise ValueError(f"proposal_probs must be [N={n}, V], got {tuple(self.proposal_probs.shape)}")
            if torch.isnan(self.proposal_probs).any():
                raise ValueError("NaN in proposal_probs")

    @classmethod
    def empty(cls, device="cpu") -> "TokenTree":
        """The tree with no nodes (the decoding step is then plain autoregressive)."""
        z = torch.empty(0, dtype=torch.long, device=device)
        return cls(z, z.clone(), None)

    @classmethod
    def chain(cls, tokens: torch.Tensor, probs: torch.Tensor | None = None) -> "TokenTree":
        """A chain x_1..x_g (width 1): a draft block of chain speculative decoding as a tree."""
        g = int(torch.as_tensor(tokens).numel())
        return cls(torch.arange(-1, g - 1), tokens, probs)

    @property
    def n(self) -> int:
        """Number of nodes N."""
        return int(self.parents.numel())

    def __len__(self) -> int:
        return self.n

    @property
    def depth(self) -> torch.Tensor:
        """long [N]: 1 for children of the root, parent's depth + 1 otherwise."""
        if self._depth is None:
            self._depth = compile_topology(self.parents).depth + 1
        return self._depth

    @property
    def max_depth(self) -> int:
        return int(self.depth.max()) if self.n else 0

    def children(self, node: int = -1) -> list[int]:
        """Indices of ``node``'s children in sibling order (node -1 = the root)."""
        return (self.parents == node).nonzero().flatten().tolist()

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node``."""
        path = []
        while node >= 0:
            path.append(node)
            node = int(self.parents[node])
        return path[::-1]

    def point_mass_rows(self, vocab_size: int, dtype=torch.float32) -> torch.Tensor:
        """float [N, V]: ``proposal_probs``, or one-hot rows if every node is a point mass."""
        if self.proposal_probs is not None:
            return self.proposal_probs
        return torch.zeros(self.n, vocab_size, dtype=dtype, device=self.tokens.device).scatter_(
            1, self.tokens[:, None], 1.0)

    def prune(self, max_depth: int) -> "TokenTree":
        """The subtree of nodes with depth <= ``max_depth`` (reindexed, order kept). Dropping deeper nodes does not
        change the distribution of the first ``max_depth + 1`` tokens a step emits."""
        if max_depth < 0:
            raise ValueError(f"max_depth must be >= 0, got {max_depth}")
        keep = (self.depth <= max_depth).nonzero().flatten()
        if keep.numel() == self.n:
            return self
        remap = torch.full((self.n + 1,), -1, dtype=torch.long)
        remap[keep] = torch.arange(keep.numel())
        parents = self.parents[keep]
        new_parents = torch.where(parents >= 0, remap[parents.clamp_min(0)], parents)
        probs = None if self.proposal_probs is None else self.proposal_probs[keep.to(self.proposal_probs.device)]
        return TokenTree(new_parents, self.tokens[keep.to(self.tokens.device)], probs)

    def compile(self):
        """The compiled topology with the root as fed node 0 (:class:`~specrepro.core.tree_attention.CompiledTree` of
        M = N + 1 nodes: root, then node i at i + 1): attention mask, depth (= position offsets) and retrieval
        paths. Cached per topology, so a static tree compiles once."""
        return compile_topology([-1] + (torch.where(self.parents >= 0, self.parents + 1, 0)).tolist())


# ----------------------------------------------------------------------------------------------------------------
# Construction
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TreeTemplate:
    """A tree topology with a rank per node: the shape of an expansion-based or static tree.

    ``parents`` (tuple of ints, -1 = child of the root, parents precede children) and ``ranks`` (node i is its
    parent's ``ranks[i]``-th candidate: for top-k trees the rank in the proposal, for sampled trees only the sibling
    order). Build with :meth:`expansion` or :meth:`from_choices`.
    """

    parents: tuple
    ranks: tuple

    @classmethod
    def expansion(cls, widths) -> "TreeTemplate":
        """SpecInfer's expansion-based tree ⟨k1, ..., km⟩: every node at depth d - 1 gets k_d children (nodes in
        breadth-first order). E.g. ⟨1,1,3,1,1,1,1,1⟩ is SpecInfer's default; ⟨w,1,...,1⟩ is w chains of length m.

        Raises:
            ValueError: a width < 1.
        """
        widths = [int(k) for k in widths]
        if any(k < 1 for k in widths):
            raise ValueError(f"expansion widths must be >= 1, got {widths}")
        parents, ranks, frontier = [], [], [-1]
        for k in widths:
            nxt = []
            for p in frontier:
                for r in range(k):
                    nxt.append(len(parents))
                    parents.append(p)
                    ranks.append(r)
            frontier = nxt
        return cls(tuple(parents), tuple(ranks))

    @classmethod
    def from_choices(cls, choices) -> "TreeTemplate":
        """A static tree from Medusa-style ``choices``: a list of paths of top-rank indices, e.g.
        ``[[0], [0, 0], [1], [0, 1]]`` = the top-1 and top-2 candidates at depth 1, and the top-1 and top-2 after
        the top-1 at depth 2. Nodes are ordered by depth, then lexicographically (Medusa's order).

        Raises:
            ValueError: an empty or negative path, a duplicate, or a path whose prefix is missing.
        """
        paths = [tuple(int(r) for r in c) for c in choices]
        if any(len(p) == 0 or min(p) < 0 for p in paths):
            raise ValueError("every choice must be a non-empty list of ranks >= 0")
        if len(set(paths)) != len(paths):
            raise ValueError("duplicate paths in choices")
        known = set(paths)
        for p in paths:
            if len(p) > 1 and p[:-1] not in known:
                raise ValueError(f"choice {list(p)} has no parent {list(p[:-1])} in the tree")
        paths.sort(key=lambda p: (len(p), p))
        index = {p: i for i, p in enumerate(paths)}
        return cls(tuple(index[p[:-1]] if len(p) > 1 else -1 for p in paths), tuple(p[-1] for p in paths))

    @property
    def n(self) -> int:
        return len(self.parents)

    def depth_of(self) -> list[int]:
        d = []
        for p in self.parents:
            d.append(1 if p < 0 else d[p] + 1)
        return d

    def fill(self, candidates: torch.Tensor) -> TokenTree:
        """A point-mass tree from per-depth candidate lists (Medusa: head d's top-K tokens, independent of the
        parent): node at depth d with rank r gets ``candidates[d - 1, r]``.

        Args:
            candidates: long [D, K] with D >= the template's depth and K > its largest rank.
        """
        depth = self.depth_of()
        if self.n and (candidates.shape[0] < max(depth) or candidates.shape[1] <= max(self.ranks)):
            raise ValueError(f"candidates {tuple(candidates.shape)} too small for depth {max(depth)} "
                             f"and rank {max(self.ranks)}")
        d = torch.tensor(depth, dtype=torch.long) - 1
        r = torch.tensor(self.ranks, dtype=torch.long)
        toks = candidates[d.to(candidates.device), r.to(candidates.device)] if self.n else candidates.new_empty(0)
        return TokenTree(torch.tensor(self.parents, dtype=torch.long), toks, None)


def renormalized_without(q: torch.Tensor, excluded) -> torch.Tensor:
    """q with the ``excluded`` tokens zeroed and renormalized (Sequoia: the proposal row of a child sampled without
    replacement, given its earlier siblings). Returns q unchanged if ``excluded`` is empty; an all-zero row if
    nothing is left."""
    excluded = list(excluded)
    if not excluded:
        return q
    r = q.clone()
    r[torch.as_tensor(excluded, dtype=torch.long, device=q.device)] = 0.0
    s = r.sum()
    return r / s if bool(s > 0) else r


def sample_children(q: torch.Tensor, k: int, mode: str, generator: torch.Generator | None,
                    scores: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Draw the children of one node from its proposal distribution.

    Args:
        q: float [V], the processed proposal distribution at the node.
        k: number of children wanted.
        mode: "iid" (k independent draws, with replacement; every row is q: SpecInfer), "without_replacement"
            (sequential sampling without replacement: child j is drawn from row j, q renormalized without the earlier
            siblings' tokens: Sequoia; at most the size of q's support), "topk" (the k highest ``scores``,
            deterministic: point masses).
        scores: float [V] ranking for "topk" (default q; pass the raw logits when q is one-hot under greedy).

    Returns:
        (tokens long [k'], rows float [k', V] or None for point masses), k' <= k.

    Raises:
        ValueError: unknown mode, k < 0.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if mode == "iid":
        toks = draw(q, k, generator) if k else q.new_empty(0).long()
        return toks, q.unsqueeze(0).expand(k, -1)
    if mode == "without_replacement":
        # sequentially: child j is one draw from q renormalized without the earlier children's tokens, the very row
        # its verification uses; this is sampling without replacement (the law of Gumbel top-k), one cumulative
        # search per child instead of V Gumbel keys per node
        k = min(k, int((q > 0).sum()))
        toks, rows = [], []
        for _ in range(k):
            rows.append(renormalized_without(q, toks))
            toks.append(int(sample(rows[-1], generator)))
        return (torch.tensor(toks, dtype=torch.long, device=q.device),
                torch.stack(rows) if rows else q.new_empty(0, q.shape[-1]))
    if mode == "topk":
        s = q if scores is None else scores
        return torch.topk(s, min(k, s.shape[-1])).indices, None
    raise ValueError(f"unknown sampling mode {mode!r}; expected one of {SAMPLING_MODES}")


def children_outcomes(q: torch.Tensor, k: int, mode: str, scores: torch.Tensor | None = None):
    """Every outcome of :func:`sample_children` with its probability (for exact enumeration over small vocabularies).

    Returns:
        list of (tokens tuple, rows float [k', V] or None, probability float).
    """
    support = (q > 0).nonzero().flatten().tolist()
    if mode == "iid":
        rows = q.unsqueeze(0).expand(k, -1)
        return [(t, rows, float(torch.prod(q[list(t)]))) if k else ((), rows, 1.0)
                for t in itertools.product(support, repeat=k)]
    if mode == "without_replacement":
        k = min(k, len(support))
        out = []
        for t in itertools.permutations(support, k):
            rows = [renormalized_without(q, t[:j]) for j in range(k)]
            pr = 1.0
            for j in range(k):
                pr *= float(rows[j][t[j]])
            out.append((t, torch.stack(rows) if rows else q.new_empty(0, q.shape[-1]), pr))
        return out
    if mode == "topk":
        toks, _ = sample_children(q, k, "topk", None, scores)
        return [(tuple(toks.tolist()), None, 1.0)]
    raise ValueError(f"unknown sampling mode {mode!r}; expected one of {SAMPLING_MODES}")


def merge_chains(chains, vocab_size: int) -> TokenTree:
    """Merge-based token tree (SpecInfer Sec. 3) from several proposal chains, in source order.

    Chains are inserted into a trie under the root. Two nodes are merged only when both are point masses with the
    same token under the same parent: trying the same point mass twice is pointless (after its rejection the
    residual gives it probability 0), so merging keeps MSS exact. A sampled node (with a proposal row) is never
    merged: it is an independent draw that MSS must try on its own, so equal sampled tokens stay separate siblings.

    Args:
        chains: iterable of :class:`~specrepro.drafters.base.Proposal` (tokens long [g], probs float [g, V] or None).
        vocab_size: V, the width of one-hot rows for point masses in a mixed tree.

    Returns:
        a :class:`TokenTree`; ``proposal_probs`` is None if every node is a point mass, else float [N, V] with
        one-hot rows for the point masses.
    """
    parents, tokens, rows = [], [], []
    index: dict = {}  # (parent, token) -> node, point masses only
    for prop in chains:
        toks = prop.tokens.reshape(-1).tolist()
        parent = -1
        for j, x in enumerate(toks):
            row = None if prop.probs is None else prop.probs[j]
            key = (parent, x)
            if row is None and key in index:
                parent = index[key]
                continue
            node = len(parents)
            parents.append(parent)
            tokens.append(x)
            rows.append(row)
            if row is None:
                index[key] = node
            parent = node
    if not parents:
        return TokenTree.empty()
    if all(r is None for r in rows):
        return TokenTree(torch.tensor(parents), torch.tensor(tokens), None)
    ref = next(r for r in rows if r is not None)
    full = torch.zeros(len(rows), vocab_size, dtype=ref.dtype, device=ref.device)
    for i, r in enumerate(rows):
        if r is None:
            full[i, tokens[i]] = 1.0
        else:
            full[i, : r.shape[-1]] = r[:vocab_size]
    return TokenTree(torch.tensor(parents), torch.tensor(tokens), full)


# ----------------------------------------------------------------------------------------------------------------
# Proposers
# ----------------------------------------------------------------------------------------------------------------

@runtime_checkable
class TreeProposer(Protocol):
    """What :func:`tree_generate` needs from a proposal source.

    ``propose_tree(ids long [L], sampling, generator) -> TokenTree`` (nodes under ids[-1]); ``reset()`` forgets
    per-sequence state. Optional: ``needs_hidden: bool`` and ``observe_hidden(h float [hidden])`` (Medusa).
    """

    def propose_tree(self, ids: torch.Tensor, sampling: SamplingConfig,
                     generator: torch.Generator | None) -> TokenTree: ...

    def reset(self) -> None: ...


class DraftTreeProposer:
    """Expansion-based (or static-shaped) token trees from one draft model (SpecInfer Sec. 3, Sequoia Sec. 3).

    The draft processes the tree level by level with tree attention on its own KV cache: one draft forward per
    depth, over all nodes of that depth, gives each node's distribution q; its children are drawn by
    :func:`sample_children` (``mode``). Afterwards the draft cache is cropped back to the committed sequence, and
    the next call reuses the longest common prefix (as :class:`~specrepro.drafters.model.DraftModelDrafter` does).

    Args:
        model: a transformers causal LM accepted by :func:`~specrepro.core.tree_attention.check_tree_attention`.
        template: a :class:`TreeTemplate`, or a list of widths ⟨k1..km⟩ (expansion).
        mode: "iid", "without_replacement" or "topk" (see :func:`sample_children`). Under greedy sampling q is
            one-hot, so "topk" ranks by the draft's raw logits there (SpecInfer's greedy trees).
        vocab_size: the target's logits width V.

    Raises:
        ValueError: unknown mode, an unsupported draft architecture.
    """

    def __init__(self, model, template, mode: str = "iid", vocab_size: int | None = None, name: str | None = None):
        if mode not in SAMPLING_MODES:
            raise ValueError(f"unknown sampling mode {mode!r}; expected one of {SAMPLING_MODES}")
        check_tree_attention(model)
        self.model, self.mode, self.vocab_size = model, mode, vocab_size
        self.template = template if isinstance(template, TreeTemplate) else TreeTemplate.expansion(template)
        self.name = name or f"draft tree ({mode})"
        t = self.template
        self._kids = {p: [i for i in range(t.n) if t.parents[i] == p] for p in range(-1, t.n)}
        self.reset()

    def reset(self) -> None:
        self.cache = new_cache(self.model)
        self.cached_ids = torch.empty(0, dtype=torch.long)

    def _children(self, q, logits, template_kids, generator):
        if not template_kids:
            return [], []
        ranks = [self.template.ranks[c] for c in template_kids]
        if self.mode == "topk":
            toks, _ = sample_children(q, max(ranks) + 1, "topk", None, scores=logits.float())
            toks = toks[torch.as_tensor(ranks, device=toks.device).clamp_max(toks.numel() - 1)]
            return toks.tolist(), [None] * len(ranks)
        toks, rows = sample_children(q, len(template_kids), self.mode, generator)
        return toks.tolist(), list(rows)

    @torch.inference_mode()
    def propose_tree(self, ids, sampling, generator):
        device = self.model.device
        ids = ids.reshape(-1)
        keep = min(common_prefix(self.cached_ids, ids.cpu()), ids.shape[0] - 1)
        crop_cache(self.cache, keep)
        out = self.model(input_ids=ids[keep:][None].to(device), past_key_values=self.cache, use_cache=True,
                         logits_to_keep=1)
        self.cached_ids = ids.cpu().clone()
        L = ids.shape[0]
        # expand level by level; `nodes` grows in breadth-first order (parents before children)
        parents, tokens, rows, tmpl_of, path_of = [], [], [], [], []
        frontier = [(-1, -1, out.logits[0, -1])]  # (tree node, template node, logits after it)
        while frontier:
            new = []
            # nodes with the same token path (i.i.d. siblings that drew the same token) draw their children from one
            # row: the draft's law after a path is one distribution, and K-SEQ needs the draws i.i.d. from it
            # bit for bit (the batched tree forward can give two copies of a path rows that differ in the last bits)
            first_logits: dict = {}
            for node, tnode, logits in frontier:
                logits = first_logits.setdefault(path_of[node] if node >= 0 else (), logits)
                logits = fit_width(logits, self.vocab_size)
                q = logits_to_probs(logits, sampling)
                toks, rws = self._children(q, logits, self._kids[tnode], generator)
                for x, r, tchild in zip(toks, rws, self._kids[tnode]):
                    parents.append(node)
                    tokens.append(int(x))
                    rows.append(r)
                    tmpl_of.append(tchild)
                    path_of.append((path_of[node] if node >= 0 else ()) + (int(x),))
                    new.append(len(parents) - 1)
            expandable = [i for i in new if self._kids[tmpl_of[i]]]
            if not expandable:
                break
            # one draft forward over this level's new nodes (those that will have children)
            a, b = new[0], new[-1] + 1
            compiled = compile_topology(parents[:b])
            o = tree_forward(self.model, self.cache, torch.tensor(tokens[a:b]), compiled, L, rows=(a, b))
            frontier = [(i, tmpl_of[i], o.logits[0, i - a]) for i in expandable]
        crop_cache(self.cache, L)
        if not parents:
            return TokenTree.empty(device)
        toks = torch.tensor(tokens, dtype=torch.long, device=device)
        if any(r is None for r in rows):  # top-k: point masses
            return TokenTree(torch.tensor(parents), toks, None)
        return TokenTree(torch.tensor(parents), toks, torch.stack(rows))


class MergedTreeProposer:
    """Merge-based token trees: each chain drafter (:mod:`specrepro.drafters`) proposes up to ``gamma`` tokens and
    the chains are merged by :func:`merge_chains` (SpecInfer's merge-based speculation, here over heterogeneous
    sources: a draft model, prompt lookup, a bigram model).

    Args:
        drafters: list of drafters (``propose(ids, gamma, sampling, generator)``, ``reset()``), in sibling order.
        gamma: chain length per drafter (an int or one per drafter).
        vocab_size: V (for one-hot rows of point masses in a mixed tree).
    """

    def __init__(self, drafters, gamma, vocab_size: int, name: str = "merged tree"):
        self.drafters = list(drafters)
        self.gammas = [int(gamma)] * len(self.drafters) if isinstance(gamma, int) else [int(g) for g in gamma]
        if len(self.gammas) != len(self.drafters) or any(g < 1 for g in self.gammas):
            raise ValueError("gamma must be an int >= 1 or one int >= 1 per drafter")
        self.vocab_size, self.name = vocab_size, name

    def reset(self) -> None:
        for d in self.drafters:
            d.reset()

    def propose_tree(self, ids, sampling, generator):
        props = [d.propose(ids, g, sampling, generator) for d, g in zip(self.drafters, self.gammas)]
        tree = merge_chains(props, self.vocab_size)
        return TokenTree(tree.parents, tree.tokens.to(ids.device), tree.proposal_probs)


# ----------------------------------------------------------------------------------------------------------------
# Verification
# ----------------------------------------------------------------------------------------------------------------

def children_lists(parents: torch.Tensor) -> dict:
    kids: dict = {}
    for i, p in enumerate(parents.tolist()):
        kids.setdefault(p, []).append(i)
    return kids


def check_verify_args(parents, tokens, target_probs, proposal_probs, method):
    if method not in VERIFY_METHODS:
        raise ValueError(f"unknown verification method {method!r}; expected one of {VERIFY_METHODS}")
    n = parents.numel()
    if tokens.numel() != n:
        raise ValueError(f"parents has {n} entries, tokens {tokens.numel()}")
    if target_probs.dim() != 2 or target_probs.shape[0] != n + 1:
        raise ValueError(f"target_probs must be [N+1={n + 1}, V], got {tuple(target_probs.shape)}")
    if proposal_probs is not None and tuple(proposal_probs.shape) != (n, target_probs.shape[1]):
        raise ValueError(f"proposal_probs must be [N={n}, V={target_probs.shape[1]}], "
                         f"got {tuple(proposal_probs.shape)}")


def verify_tree(parents: torch.Tensor, tokens: torch.Tensor, target_probs: torch.Tensor,
                proposal_probs: torch.Tensor | None, generator: torch.Generator | None, method: str = "mss",
                *, accept_fn=None, residual_fn=None) -> tuple[list[int], int]:
    """Verify a token tree against the target (SpecInfer, Miao et al. 2023, Algorithm 2 / Sec. 4.3).

    Starting at the root, repeatedly decide which child (if any) to descend into:

    * "greedy" (VerifyGreedy): descend into the first child whose token is the target's argmax; otherwise the argmax
      is the next token.
    * "mss" (multi-step speculative sampling, VerifyStochastic): with P the target row at the node, try the children
      in index order; accept child c with probability min(1, P(x_c) / Q_c(x_c)); on rejection
      P := norm(max(0, P − Q_c)) (:func:`~specrepro.core.sampling.residual_distribution`). If every child is rejected the
      next token is drawn from the final residual P; at a leaf the bonus token is drawn from the target row. Q_c is
      row c of ``proposal_probs`` (a point mass: one-hot, if None). The emitted tokens are distributed exactly as
      target samples when the children are independent draws (with replacement), sequential draws without
      replacement with renormalized rows (Sequoia), or point masses.
    * "naive" (SpecInfer Table 3 baseline): draw x from P; descend into the first child with token x, else x is the
      next token. Also exact, but rejects more often (SpecInfer Thm 4.3).

    Args:
        parents: long [N], -1 = child of the root, parents precede children.
        tokens: long [N].
        target_probs: float [N+1, V]; row 0 = target at the root, row i+1 = target after node i (processed by
            :func:`~specrepro.core.sampling.logits_to_probs`; one-hot under greedy).
        proposal_probs: float [N, V] (row i = distribution node i was drawn from given its earlier siblings) or None.
        generator: the torch.Generator for all randomness (unused by "greedy").
        method: "greedy", "mss" or "naive".
        accept_fn, residual_fn: replacements for the acceptance probability and the residual, only for negative
            controls in the exactness battery.

    Returns:
        (accepted_path, next_token): the accepted node indices from the root down, and the correction or bonus token.

    Raises:
        ValueError: unknown method or inconsistent shapes.
    """
    parents = torch.as_tensor(parents).reshape(-1)
    tokens = torch.as_tensor(tokens).reshape(-1)
    check_verify_args(parents, tokens, target_probs, proposal_probs, method)
    accept = accept_fn or acceptance_probability
    residual = residual_fn or residual_distribution
    kids = children_lists(parents.cpu())
    toks = tokens.tolist()
    path: list[int] = []
    node = -1
    while True:
        p = target_probs[node + 1]
        children = kids.get(node, [])
        if method in ("greedy", "naive"):  # the target's own choice (argmax or a sample), accepted if it is a child
            x = int(p.argmax()) if method == "greedy" else int(sample(p, generator))
            nxt = next((c for c in children if toks[c] == x), None)
            if nxt is None:
                return path, x
        else:
            if not children:
                return path, int(sample(p, generator))
            nxt = None
            for c in children:
                x = toks[c]
                q = None if proposal_probs is None else proposal_probs[c]
                q_x = p.new_ones(()) if q is None else q[x].to(p.dtype)
                a = accept(p[x], q_x)
                u = uniform((), generator, device=p.device, dtype=p.dtype)
                if bool(u < a):
                    nxt = c
                    break
                p = residual(p, None if q is None else q.to(p.dtype), x)
            if nxt is None:
                return path, int(sample(p, generator))
        path.append(nxt)
        node = nxt


def verify_tree_outcomes(parents, tokens, target_probs, proposal_probs, method: str = "mss", *, accept_fn=None,
                         residual_fn=None) -> list[tuple[tuple, int, float]]:
    """Every outcome of :func:`verify_tree` for a fixed tree with its exact probability (enumeration, same building
    blocks: acceptance probability and residual).

    Returns:
        list of (accepted_path tuple, next_token, probability).
    """
    parents = torch.as_tensor(parents).reshape(-1)
    tokens = torch.as_tensor(tokens).reshape(-1)
    check_verify_args(parents, tokens, target_probs, proposal_probs, method)
    accept = accept_fn or acceptance_probability
    residual = residual_fn or residual_distribution
    kids = children_lists(parents.cpu())
    toks = tokens.tolist()
    out = []

    def rec(node, path, prob):
        p = target_probs[node + 1]
        children = kids.get(node, [])
        if method in ("greedy", "naive"):
            xs = [int(p.argmax())] if method == "greedy" else (p > 0).nonzero().flatten().tolist()
            for x in xs:
                px = 1.0 if method == "greedy" else float(p[x])
                c = next((c for c in children if toks[c] == x), None)
                if c is None:
                    out.append((tuple(path), x, prob * px))
                else:
                    rec(c, path + [c], prob * px)
            return
        reach = prob
        for c in children:
            x = toks[c]
            q = None if proposal_probs is None else proposal_probs[c]
            q_x = p.new_ones(()) if q is None else q[x].to(p.dtype)
            a = float(accept(p[x], q_x))
            if a > 0:
                rec(c, path + [c], reach * a)
            reach *= 1 - a
            if reach == 0:
                return
            p = residual(p, None if q is None else q.to(p.dtype), x)
        for y in (p > 0).nonzero().flatten().tolist():
            out.append((tuple(path), y, reach * float(p[y])))

    rec(-1, [], 1.0)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Decoding loop
# ----------------------------------------------------------------------------------------------------------------

@torch.inference_mode()
def tree_generate(
    target,
    input_ids: torch.Tensor,
    proposer=None,
    *,
    max_new_tokens: int = 128,
    sampling: SamplingConfig = GREEDY,
    generator: torch.Generator | None = None,
    eos_token_id: int | list[int] | None = MODEL_EOS,
    method: str | None = None,
    verify=None,
    seed: int | None = None,
) -> GenerationResult:
    """Token-tree speculative decoding (SpecInfer Algorithm 1 with tree attention and MSS verification).

    Each step: the proposer builds a token tree under the last committed token; the target scores the root and all
    N nodes in ONE forward pass with tree attention (:mod:`specrepro.core.tree_attention`); :func:`verify_tree` picks
    the accepted path and the next token; the cache keeps the root and the accepted path and drops the rest.
    Cache convention as :func:`specrepro.core.decoding.generate`: the cache holds every committed token but the last;
    each step feeds [last committed token] + tree nodes (N + 1 tokens). Trees deeper than the remaining budget are
    pruned, an empty tree (N = 0) is a plain autoregressive step.

    Args:
        target: a transformers causal LM accepted by :func:`~specrepro.core.tree_attention.check_tree_attention`.
        input_ids: long [L] or [1, L], the prompt (L >= 1); batch size 1.
        proposer: a :class:`TreeProposer`, or None (autoregressive).
        max_new_tokens: exact cap on new tokens.
        sampling: applied identically to target and proposals (temperature 0 = greedy).
        generator: torch.Generator (required unless greedy; draws are made on its device), or ``seed``: a new
            generator on the target's device seeded with it.
        eos_token_id: stop after this token (or any of these); it is included in the output. Default
            :data:`~specrepro.core.decoding.MODEL_EOS`: the target's generation config's EOS ids; None: no EOS stop.
        method: "greedy", "mss" or "naive"; default "greedy" under greedy sampling, else "mss".
        verify: optional acceptance rule replacing :func:`verify_tree`, called as ``verify(parents, tokens,
            target_probs, proposal_probs, generator) -> (accepted_path, next_token)`` with the shapes of
            :func:`verify_tree` (e.g. Medusa's typical acceptance, :func:`specrepro.core.medusa.medusa_generate`); the
            exactness of the loop is then that of the rule.

    Returns:
        :class:`~specrepro.core.decoding.GenerationResult` with ``drafted`` = nodes per step (N), ``depths`` = the verified
        tree's depth per step (after pruning to the budget) and ``accepted`` = accepted path length per step; ``forward_sizes`` = N + 1 and ``target_times`` (s) per target forward.

    Raises:
        ValueError: max_new_tokens < 1, empty prompt or a batch [B > 1, L], missing generator (or both generator and
        seed), unknown method, an architecture that cannot take a tree mask, or a tree whose proposal rows do not
        match the target's vocabulary width.
    """
    if int(max_new_tokens) != max_new_tokens or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    method = method or ("greedy" if sampling.greedy else "mss")
    if method not in VERIFY_METHODS:
        raise ValueError(f"unknown verification method {method!r}; expected one of {VERIFY_METHODS}")
    check_tree_attention(target)
    device = target.device
    ids = prompt_ids(input_ids, device)
    generator = make_generator(generator, seed, device)
    if generator is None and method != "greedy" and not sampling.greedy:
        raise ValueError("sampling needs an explicit torch.Generator (pass generator=torch.Generator().manual_seed(s) "
                         "or seed=s)")
    needs_hidden = bool(getattr(proposer, "needs_hidden", False))
    eos = resolve_eos(eos_token_id, target)
    clock = Stopwatch(device)
    res = GenerationResult(tokens=[], prompt_len=int(ids.numel()))
    if proposer is not None:
        proposer.reset()

    t_start = clock.start()
    cache = prefill(target, ids)
    t = clock.stop("prefill", t_start)

    new: list[int] = []
    while len(new) < max_new_tokens:
        budget = max_new_tokens - len(new)
        tree = TokenTree.empty(device)
        if proposer is not None and budget > 1:
            tree = proposer.propose_tree(ids, sampling, generator)
            tree = tree.prune(budget - 1) if tree.n else tree
            t = clock.stop("draft", t)
        n = tree.n
        start = ids.numel() - 1
        feed = torch.cat([ids[-1:], tree.tokens.to(device)])
        if n:
            out = tree_forward(target, cache, feed, tree.compile(), start, output_hidden_states=needs_hidden)
        else:
            out = target(input_ids=feed[None], past_key_values=cache, use_cache=True,
                         output_hidden_states=needs_hidden)
        t_new = clock.stop("target", t)
        res.forward_sizes.append(n + 1)
        res.target_times.append(t_new - t)
        t = t_new
        p = logits_to_probs(out.logits[0, -(n + 1):], sampling)
        q = tree.proposal_probs
        if q is not None:
            if q.shape[-1] != p.shape[-1]:
                raise ValueError(f"proposal rows have width {q.shape[-1]}, target logits {p.shape[-1]}")
            q = q.to(p.device)
        if verify is None:
            path, nxt = verify_tree(tree.parents, tree.tokens, p, q, generator, method)
        else:
            path, nxt = verify(tree.parents, tree.tokens, p, q, generator)
        keep = [0] + [c + 1 for c in path]
        keep_path(cache, start, keep)
        if needs_hidden:
            proposer.observe_hidden(out.hidden_states[-1][0, keep[-1]])
        step = commit_step(tree.tokens[path].tolist() + [nxt] if path else [nxt], budget, eos, res)
        res.drafted.append(n)
        res.depths.append(tree.max_depth if n else 0)
        res.accepted.append(len(path))
        new.extend(step)
        ids = torch.cat([ids, torch.tensor(step, dtype=ids.dtype, device=device)])
        t = clock.stop("verify", t)
        if res.stopped_at_eos:
            break
    clock.stop("total", t_start)
    res.tokens = new
    res.times = dict(clock.totals)
    return res
