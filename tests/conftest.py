"""Shared fixtures: tiny random transformers with peaked, mutually different distributions, and the real SmolLM2."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub here: fail fast instead of retrying
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def tiny_lm(arch: str = "llama", vocab: int = 8, seed: int = 0, sharpness: float = 8.0):
    """See :func:`specrepro.exactness.tiny_random_lm` (kept under this short name for the tests)."""
    from specrepro.exactness import tiny_random_lm

    return tiny_random_lm(arch, vocab, seed, sharpness)


@pytest.fixture(scope="session")
def smollm2():
    from specrepro.models import load_model

    return load_model("smollm2-135m")
