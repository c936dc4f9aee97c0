"""Toy language models with known distributions: :class:`ToyLM` and tiny random transformers.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import torch

from specrepro.core.sampling import SamplingConfig, logits_to_probs

__all__ = ["ToyLM", "adversarial_pairs", "product_table", "tiny_random_lm"]


@dataclass
class ToyLM:
    """A language model over a small vocabulary given by a function prefix -> logits (float64 [V]).

    ``probs(prefix, config)`` is the processed distribution; ``raw(prefix)`` the plain softmax (temperature 1, no
    truncation), which a wrong implementation might use as q.
    """

    vocab: int
    logits_fn: Callable[[tuple], torch.Tensor]

    def probs(self, prefix: tuple, config: SamplingConfig) -> torch.Tensor:
        return logits_to_probs(self.logits_fn(prefix).double(), config)

    def raw(self, prefix: tuple) -> torch.Tensor:
        return torch.softmax(self.logits_fn(prefix).double(), -1)

    @classmethod
    def random(cls, vocab: int, generator: torch.Generator, scale: float = 2.0, context: int = 2) -> "ToyLM":
        """Random logits depending on the last ``context`` tokens (a random n-gram table, N(0, scale^2) entries)."""
        table = {}

        def fn(prefix):
            key = prefix[-context:] if context else ()
            if key not in table:
                table[key] = scale * torch.randn(vocab, generator=generator, dtype=torch.float64)
            return table[key]

        return cls(vocab, fn)

    @classmethod
    def from_transformer(cls, model, prompt: torch.Tensor) -> "ToyLM":
        """Logits of a (tiny) transformers causal LM after ``prompt`` (long [L]) + prefix, cached per prefix."""
        memo = {}

        @torch.inference_mode()
        def fn(prefix):
            if prefix not in memo:
                ids = torch.cat([prompt, torch.tensor(prefix, dtype=torch.long)])
                memo[prefix] = model(input_ids=ids[None]).logits[0, -1].double()
            return memo[prefix]

        return cls(model.config.vocab_size, fn)


def adversarial_pairs(vocab: int, generator: torch.Generator) -> dict:
    """Named (p, q) logits pairs (float64 [V]) that stress the rule: disjoint supports, zeros in q, one-hot,
    identical, near-identical, and random."""
    inf = float("-inf")
    half = vocab // 2
    base = torch.randn(vocab, generator=generator, dtype=torch.float64)
    disjoint_p = torch.full((vocab,), inf, dtype=torch.float64)
    disjoint_p[:half] = base[:half]
    disjoint_q = torch.full((vocab,), inf, dtype=torch.float64)
    disjoint_q[half:] = base[half:]
    zeros_q = base.clone()
    zeros_q[::2] = inf
    one_hot = torch.full((vocab,), inf, dtype=torch.float64)
    one_hot[1] = 0.0
    return {
        "disjoint supports": (disjoint_p, disjoint_q),
        "zeros in q": (base, zeros_q),
        "one-hot q": (base, one_hot),
        "one-hot p": (one_hot, base),
        "identical": (base, base.clone()),
        "near-identical": (base, base + 1e-6 * torch.randn(vocab, generator=generator, dtype=torch.float64)),
        "random": (2 * base, 2 * torch.randn(vocab, generator=generator, dtype=torch.float64)),
    }


def product_table(vocab: int, length: int):
    """All token tuples of a length (for small vocabularies)."""
    return list(itertools.product(range(vocab), repeat=length))


def tiny_random_lm(arch: str = "llama", vocab: int = 8, seed: int = 0, sharpness: float = 8.0):
    """A 2-layer random transformers causal LM over ``vocab`` tokens, for exactness simulations of the real loops.

    Its LM head is scaled by ``sharpness`` so its distributions are far from uniform; two such models with different
    seeds make a target/draft pair with α well below 1, so a wrong rule shows in a goodness-of-fit test of a few
    thousand samples. Weight initialisation uses a forked global RNG seeded with ``seed`` (the caller's RNG state is
    left untouched). It has no EOS token: ``generation_config.eos_token_id`` is cleared (transformers' llama config
    would name token 2), so the decoding loops' default EOS (:data:`specrepro.core.decoding.MODEL_EOS`) never stops a
    simulation early; pass ``eos_token_id`` explicitly to test EOS handling.

    Args:
        arch: "llama" (LlamaForCausalLM) or "qwen2" (Qwen2ForCausalLM).

    Returns:
        the model in eval mode without gradients (float32, CPU; hidden size 32).

    Raises:
        ValueError: unknown ``arch``.
    """
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
)

    if arch not in ("llama", "qwen2"):
        raise ValueError(f"unknown tiny architecture {arch!r}; expected 'llama' or 'qwen2'")
    kw = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**kw)) if arch == "llama" else Qwen2ForCausalLM(Qwen2Config(**kw))
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)
    model.generation_config.eos_token_id = None  # no EOS: the loops' default stop set is empty
    return model.eval().requires_grad_(False)
