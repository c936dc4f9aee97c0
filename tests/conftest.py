"""Shared fixtures: tiny random transformers with peaked, mutually different distributions, and the real SmolLM2."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub here: fail fast instead of retrying
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def tiny_lm(arch: str = "llama", vocab: int = 8, seed: int = 0, sharpness: float = 8.0):
    """A 2-layer random causal LM whose logits are scaled up so its distributions are far from uniform.

    Two such models with different seeds make a target/draft pair with alpha well below 1, so a wrong rule is
    visible in a goodness-of-fit test of a few thousand samples.
    """
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    kw = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
    with torch.random.fork_rng():  # weight init draws from the global RNG; keep it out of everything else
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**kw)) if arch == "llama" else Qwen2ForCausalLM(Qwen2Config(**kw))
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)
    return model.eval().requires_grad_(False)


@pytest.fixture(scope="session")
def smollm2():
    from specrepro.models import load_model

    return load_model("smollm2-135m")
