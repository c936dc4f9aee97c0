"""Shared fixtures: tiny random transformers with peaked, mutually different distributions, and the real SmolLM2."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub here: fail fast instead of retrying
# Under pytest-xdist the workers share the cores: give each worker its share of torch threads, so that n workers
# never run more than cpu_count threads (oversubscribed, the tiny models' many small ops run many times slower).
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // max(1, _workers))))


def tiny_lm(arch: str = "llama", vocab: int = 8, seed: int = 0, sharpness: float = 8.0):
    """See :func:`specrepro.sim.toy.tiny_random_lm` (kept under this short name for the tests)."""
    from specrepro.sim.toy import tiny_random_lm

    return tiny_random_lm(arch, vocab, seed, sharpness)


@pytest.fixture(scope="session")
def smollm2():
    from specrepro.models import load_model

    return load_model("smollm2-135m")
