"""KV-cache operations the decoding loops need on top of transformers' ``DynamicCache``.

What this file is: rollback of rejected positions (:func:`crop_cache`) and, for token trees, keeping only the
accepted path's entries (:func:`select_cache_positions`). What it is not: a cache implementation; transformers owns that.
"""

from __future__ import annotations

import torch

__all__ = ["new_cache", "crop_cache", "select_cache_positions"]


def new_cache(model):
    """An empty ``DynamicCache`` for ``model``."""
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def crop_cache(cache, length: int) -> None:
    """Drop every cached position at index >= ``length`` (no-op if the cache is not longer).

    Raises:
        ValueError: length < 0.
    """
    if length < 0:
        raise ValueError(f"cannot crop a cache to a negative length ({length})")
    remove = cache.get_seq_length() - length
    if remove > 0:
        cache.crop(-remove)


def select_cache_positions(cache, start: int, keep: torch.Tensor) -> None:
    """Keep cached positions ``[0, start)`` plus ``start + keep`` (in that order) and drop the rest.

    Used after tree verification: the tree's nodes were appended at ``start..start+N-1`` and ``keep`` (long [k]) holds
    the accepted path's node indices, root first; afterwards the cache is contiguous again, length start + k.
    """
    idx = torch.cat([torch.arange(start, device=keep.device), start + keep]) if start else start + keep
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", True) or layer.keys is None:
            continue
        i = idx.to(layer.keys.device)
        layer.keys = layer.keys.index_select(-2, i)
        layer.values = layer.values.index_select(-2, i)
