"""Tree attention: one forward pass of a transformers causal LM over every node of a token tree.

What this file is: the compiled form of a tree topology (:class:`CompiledTree`: ancestor mask, depths, retrieval
paths), the 4D attention mask and depth-based position ids that turn a KV-cached forward into a *tree* forward
(SpecInfer, Miao et al. 2023, Sec. 4.2 "tree-based parallel decoding": each node attends to the prefix, its
ancestors and itself; its position id is prefix length + depth), and the cache bookkeeping afterwards (keep the
accepted path's entries, drop the rest: :func:`specrepro.core.kvcache.select_cache_positions`).

How a custom mask reaches the model in transformers 5.23: ``masking_utils._preprocess_mask_arguments`` returns any
4D ``attention_mask`` tensor unchanged ("already prepared, or custom"), and both the ``sdpa`` and the ``eager``
attention functions consume it. Eager *adds* the mask to the attention scores, while SDPA accepts either a bool or
an additive float mask, so we pass an additive float mask (0 = attend, ``finfo(dtype).min`` = masked) of shape
[1, 1, n_query, n_kv] in the model's dtype: it works for both. Flash-attention and flex-attention kernels cannot
take such a mask; :func:`check_tree_attention` raises for them and for architectures not verified here.

What it is not: tree construction or verification (:mod:`specrepro.core.trees`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from specrepro.core.kvcache import select_cache_positions

__all__ = ["SUPPORTED_MODEL_TYPES", "MASKABLE_ATTENTION", "check_tree_attention", "CompiledTree", "compile_topology",
           "attention_inputs", "tree_forward", "keep_path"]

#: architectures whose tree forward is tested equal to the chain forward passes (tests/test_trees.py)
SUPPORTED_MODEL_TYPES = frozenset({"llama", "qwen2"})
#: attention implementations that consume a custom additive 4D mask
MASKABLE_ATTENTION = frozenset({"sdpa", "eager"})


def check_tree_attention(model) -> None:
    """Raise if ``model`` cannot run tree attention (a custom 4D mask with depth-based position ids).

    Raises:
        ValueError: the architecture (``config.model_type``) is not one verified here, or the attention
            implementation (``config._attn_implementation``) cannot take a custom 4D mask (e.g. flash_attention_2,
            flex_attention); reload with ``attn_implementation="sdpa"`` or ``"eager"``.
    """
    cfg = getattr(model, "config", None)
    mtype = getattr(cfg, "model_type", None)
    if mtype not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"tree attention is verified only for model types {sorted(SUPPORTED_MODEL_TYPES)}; "
                         f"got {mtype!r} (its attention may not accept a custom 4D mask / position ids)")
    impl = getattr(cfg, "_attn_implementation", None)
    if impl not in MASKABLE_ATTENTION:
        raise ValueError(f"attention implementation {impl!r} cannot take a custom 4D tree mask; load the model with "
                         f"attn_implementation='sdpa' or 'eager'")
    if getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None):
        raise ValueError("sliding-window attention with a custom tree mask is not supported (the mask is passed "
                         "to every layer as is, so sliding layers would attend beyond their window)")


@dataclass(frozen=True)
class CompiledTree:
    """A tree topology compiled into tensors (once per topology: see :func:`compile_topology`).

    Nodes here are the *fed* positions: the topology's nodes in index order, parents before children.

    Attributes:
        parents: long [M]; -1 for a node whose parent is the (cached) prefix.
        ancestors: bool [M, M]; ancestors[i, j] = node j is node i or an ancestor of i (the tree part of the mask).
        depth: long [M]; 0 for parentless nodes; the position id of node i is prefix_len + depth[i].
        retrieve: long [n_leaves, max_depth + 1]; each row the node indices of one root-to-leaf path, padded with -1
            (Medusa's "retrieve indices").
    """

    parents: torch.Tensor
    ancestors: torch.Tensor
    depth: torch.Tensor
    retrieve: torch.Tensor

    @property
    def n(self) -> int:
        return int(self.parents.numel())


@lru_cache(maxsize=512)
def _compile(parents: tuple) -> CompiledTree:
    m = len(parents)
    anc = torch.eye(m, dtype=torch.bool)
    depth = torch.zeros(m, dtype=torch.long)
    for i, p in enumerate(parents):
        if p >= 0:
            anc[i] |= anc[p]
            depth[i] = depth[p] + 1
    is_parent = torch.zeros(m, dtype=torch.bool)
    for p in parents:
        if p >= 0:
            is_parent[p] = True
    leaves = (~is_parent).nonzero().flatten().tolist()
    width = int(depth.max()) + 1 if m else 1
    retrieve = torch.full((len(leaves), width), -1, dtype=torch.long)
    for r, leaf in enumerate(leaves):
        path = anc[leaf].nonzero().flatten()  # ancestors have smaller indices, so this is root-first order
        retrieve[r, : path.numel()] = path
    return CompiledTree(torch.tensor(parents, dtype=torch.long), anc, depth, retrieve)


def compile_topology(parents) -> CompiledTree:
    """Compile a topology (parents long [M] or a sequence of ints, -1 = child of the prefix) into a
    :class:`CompiledTree`. Results are cached by topology, so a static tree compiles once.

    Raises:
        ValueError: a parent index is not smaller than its child's index (parents must precede children) or < -1.
    """
    if isinstance(parents, torch.Tensor):
        parents = parents.reshape(-1).tolist()
    parents = tuple(int(p) for p in parents)
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"node {i} has parent {p}: parents must precede children (-1 <= parent < index)")
    return _compile(parents)


def attention_inputs(compiled: CompiledTree, prefix_len: int, rows: tuple[int, int] | None = None,
                     dtype: torch.dtype = torch.float32, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The 4D additive mask and position ids for feeding nodes ``rows = (a, b)`` of a compiled tree.

    The cache must hold ``prefix_len`` prefix positions followed by nodes 0..a-1 of the tree (in index order); nodes
    a..b-1 are fed. Every fed node attends the whole prefix, its ancestors and itself (SpecInfer's topology-aware
    causal mask); its position id is ``prefix_len + depth``.

    Returns:
        mask: ``dtype`` [1, 1, b - a, prefix_len + b], 0 where attended, ``finfo(dtype).min`` elsewhere.
        position_ids: long [1, b - a].
    """
    a, b = rows if rows is not None else (0, compiled.n)
    if not 0 <= a < b <= compiled.n:
        raise ValueError(f"rows {rows} outside the tree's {compiled.n} nodes")
    allowed = torch.cat([torch.ones(b - a, prefix_len, dtype=torch.bool), compiled.ancestors[a:b, :b]], dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    pos = prefix_len + compiled.depth[a:b]
    return mask[None, None].to(device), pos[None].to(device)


def tree_forward(model, cache, tokens: torch.Tensor, compiled: CompiledTree, prefix_len: int,
                 rows: tuple[int, int] | None = None, output_hidden_states: bool = False):
    """One KV-cached forward of ``model`` over tree nodes ``rows`` (default: all), appending them to ``cache``.

    Args:
        model: a transformers causal LM that passes :func:`check_tree_attention`.
        cache: its ``DynamicCache``, holding ``prefix_len`` positions plus nodes 0..a-1.
        tokens: long [b - a], the fed nodes' token ids.
        compiled: the tree's :class:`CompiledTree`.
        prefix_len: number of cached positions every node attends.
        output_hidden_states: also return every layer's hidden states.

    Returns:
        the model output; ``logits`` float [1, b - a, V], row i = the model's next-token logits after node a + i.
    """
    mask, pos = attention_inputs(compiled, prefix_len, rows, dtype=model.dtype, device=model.device)
    return model(input_ids=tokens.reshape(1, -1).to(model.device), attention_mask=mask, position_ids=pos,
                 past_key_values=cache, use_cache=True, output_hidden_states=output_hidden_states)


def keep_path(cache, start: int, path_positions: list[int] | torch.Tensor) -> None:
    """After a tree forward at cache positions ``start..``, keep only ``path_positions`` (relative to ``start``,
    root first), so the cache is contiguous again with length ``start + len(path_positions)``."""
    keep = torch.as_tensor(path_positions, dtype=torch.long)
    select_cache_positions(cache, start, keep)
