"""A Hugging Face transformers causal LM as a :class:`specrepro.core.blocklm.BlockLM`: the model and its KV cache.

What this file is: :class:`HFCausalLM`, one transformers causal LM (``AutoModelForCausalLM``, on any device, in any
dtype) over one sequence, with a transformers ``DynamicCache``: ``forward_block`` runs a block of tokens on the cached
prefix in one forward pass (``logits_to_keep`` rows of logits, left on the model's device in the model's dtype: no
copy, no device sync), ``truncate`` crops the cache (``DynamicCache.crop``), ``reset`` starts a new cache. It is
the target side of :func:`specrepro.core.decoding.generate`, which wraps a transformers model in it.

What it is not: a sampler or a drafter; the token-tree and Medusa loops (:mod:`specrepro.core.trees`,
:mod:`specrepro.core.medusa`), which manage their caches themselves.
"""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["HFCausalLM", "logits_width"]


def logits_width(model) -> int:
    """V, the width of ``model``'s logits rows: its output layer's ``out_features`` (the LM head), else its
    (text) config's ``vocab_size``."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    width = getattr(head, "out_features", None)
    if width is None and getattr(head, "weight", None) is not None and isinstance(head.weight, torch.Tensor):
        width = head.weight.shape[0]
    if width is None:
        config = model.config
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        width = config.vocab_size
    return int(width)


class HFCausalLM:
    """A transformers causal LM with a KV cache over one sequence (a :class:`~specrepro.core.blocklm.BlockLM`).

    Args:
        model: a transformers causal LM (or a wrapper with the same call, e.g.
            :class:`specrepro.sim.memo.MemoizedLM`); it is called as ``model(input_ids=[1, n], past_key_values=cache,
            use_cache=True, logits_to_keep=k)``.

    Attributes:
        model: the wrapped model; device: its device; vocab_size: V (:func:`logits_width`); cache: the
            ``DynamicCache`` of the sequence (its length is the number of cached positions).
    """

    def __init__(self, model):
        self.model = model
        self.device = model.device
        self.vocab_size = logits_width(model)
        self.reset()

    def __repr__(self) -> str:
        return f"HFCausalLM({type(self.model).__name__}, V={self.vocab_size}, cached={len(self)})"

    def __len__(self) -> int:
        return int(self.cache.get_seq_length())

    def reset(self) -> None:
        """A new, empty ``DynamicCache``."""
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` cached positions (``DynamicCache.crop``); no-op when the cache is not longer.

        Raises:
            ValueError: length < 0.
        """
        if length < 0:
            raise ValueError(f"cannot truncate a cache to a negative length ({length})")
        remove = self.cache.get_seq_length() - length
        if remove > 0:
            self.cache.crop(-remove)

    @torch.inference_mode()
    def forward_block(self, token_ids: torch.Tensor | Sequence[int], logits_to_keep: int | None = None) -> torch.Tensor:
        """Run ``token_ids`` after the cached prefix in one forward pass (they join the cache); next-token logits.

        Args:
            token_ids: n >= 1 ids, a long tensor [n] (best already on the model's device: no copy) or a sequence
                of ints.
            logits_to_keep: how many of the last positions to return logits for (None: all n; 0: none, as for a
                prefill, which still computes one row: transformers reads 0 as "all").

        Returns:
            [k, V] in the model's dtype on the model's device (a view of the model's output), k = min(keep, n);
            row i holds the logits after the (n - k + i)-th new token.

        Raises:
            ValueError: no tokens, or logits_to_keep < 0.
        """
        ids = token_ids if isinstance(token_ids, torch.Tensor) else \
            torch.as_tensor([int(t) for t in token_ids], dtype=torch.long)
        ids = ids.reshape(1, -1).to(self.device)
        n = ids.shape[1]
        if n == 0:
            raise ValueError("forward_block needs at least one token")
        keep = n if logits_to_keep is None else int(logits_to_keep)
        if keep < 0:
            raise ValueError(f"logits_to_keep must be >= 0 or None, got {logits_to_keep!r}")
        keep = min(keep, n)
        out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True, logits_to_keep=max(keep, 1))
        return out.logits[0, out.logits.shape[1] - keep:] if keep else out.logits[0, :0]
