"""Shared fixtures: tiny random transformers with peaked, mutually different distributions, and the real SmolLM2."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub here: fail fast instead of retrying
# Under pytest-xdist the workers share the cores: give each worker its share of torch threads, so that n workers
# never run more than cpu_count threads (oversubscribed, the tiny models' many small ops run many times slower).
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // max(1, _workers))))


@pytest.fixture(autouse=True)
def _own_record_lock(tmp_path_factory, monkeypatch):
    """Each test takes the record lock (:func:`specrepro.files.hold_record_lock`) in its own folder: a test that
    writes a record-like table in-process holds its lock until the worker ends, and neither another worker nor a
    ``make reproduce`` in this checkout should meet it (tests/test_cache.py checks the real lock in subprocesses)."""
    import specrepro.files as files

    path = tmp_path_factory.mktemp("record-lock") / "record.lock"
    monkeypatch.setattr(files, "record_lock_path", lambda: path)


def tiny_lm(arch: str = "llama", vocab: int = 8, seed: int = 0, sharpness: float = 8.0):
    """See :func:`specrepro.sim.toy.tiny_random_lm` (kept under this short name for the tests)."""
    from specrepro.sim.toy import tiny_random_lm

    return tiny_random_lm(arch, vocab, seed, sharpness)


def memo(*models):
    """The models' forward passes replayed bit for bit after their first run (:class:`specrepro.sim.memo.MemoizedLM`),
    for goodness-of-fit tests that draw thousands of sequences through the real loops on tiny models; every 50th
    replay is recomputed and must be bitwise equal. Same samples as the models themselves, several times faster."""
    from specrepro.sim.memo import memoized

    return memoized(*models, check_every=50)


@pytest.fixture(scope="session")
def smollm2():
    from specrepro.models import load_model

    return load_model("smollm2-135m")


#: the prompt of every toy-model test, and the level below which a goodness-of-fit p-value fails a test
PROMPT = torch.tensor([1, 5, 2, 7])
LEVEL = 1e-3


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core machine two threads spin-wait (the
    goodness-of-fit runs take ~10x longer with 2 threads under load)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="module")
def pair():
    """A tiny random (target, draft) pair of different architectures, vocabulary 8."""
    return tiny_lm("llama", seed=1), tiny_lm("qwen2", seed=2)


@pytest.fixture(scope="module")
def tiny_with_tokenizer():
    """A random 2-layer llama with SmolLM2's vocabulary and tokenizer (fast; outputs are gibberish)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specrepro.models import load_tokenizer

    tok = load_tokenizer("smollm2-135m")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             eos_token_id=tok.eos_token_id))
    return model.eval().requires_grad_(False), tok
