"""Benchmark methods on llama.cpp's kernels: the target's and the draft's forwards run by llama.cpp, the decoding loop
and the verifiers ours.

What this file is: three methods, each of which names its whole configuration:

* ``llama-ar`` — autoregressive decoding of the target's GGUF file as shipped (quantized weights, llama.cpp's own
  kernels): :func:`specrepro.core.blocklm.chain_generate` without a draft over
  :class:`specrepro.backends.llamacpp.LlamaCppLM`, one token per ``llama_decode`` call. The next token is the argmax of
  llama.cpp's logits under greedy decoding (llama.cpp's own greedy tokens: tests/test_llamacpp.py checks them against
  llama-cpp-python's ``Llama.generate`` at temperature 0), else a draw by our sampler
  (:func:`specrepro.core.sampling.logits_to_probs`, temperature / top-k / top-p) from the harness's
  ``torch.Generator`` of the (pass, prompt), as every other method draws.
* ``llama-sd@G`` — chain speculative sampling (Leviathan et al. 2023, Alg. 1; token verification,
  :func:`specrepro.core.sampling.verify_chain`) with γ = G, the draft's GGUF file proposing one ``llama_decode`` per
  token and the target verifying the block in one ``llama_decode``.
* ``llama-sd-block@G`` — the same with block verification (Sun et al. 2025, :func:`specrepro.core.sampling.verify_block`).

The GGUF files are the zoo's (:func:`specrepro.models.fetch_gguf`) of the bench's target and draft names (or, for a
name that is a path to a ``.gguf`` file, that file), opened once per bench run with ``n_threads`` =
``torch.get_num_threads()`` at build time, llama.cpp's default attention (flash attention "auto") and a float16 KV
cache of 4096 tokens at most; the methods take the bench's prompts as token ids (same tokenizer, chat template,
token budget, stop ids, seeds and interleaving as every other method). Which llama.cpp build ran, ``OMP_WAIT_POLICY``
and those settings go to the bench JSON's ``config["llamacpp"]``.

Threads: llama.cpp and torch share one OpenMP runtime in the bench's process (llama.cpp's libggml-cpu needs
``libgomp.so.1``, which resolves to the copy torch loaded first), so ``OMP_WAIT_POLICY`` reaches every method of a run,
ours included; the JSON records it. :class:`~specrepro.backends.llamacpp.LlamaCppLM` explains why it may be set to
PASSIVE (workers that spin while other threads need the cores). With the same thread count on both sides, on this
project's 2-core machine while another process took part of the CPU (2026-11-29, 150-token prefix, medians of 10-13
one-token forwards, two alternations per setting): PASSIVE made llama.cpp's 1.5B token 69-83 ms instead of 43-87 ms
and our float32 0.5B forward 189-197 ms instead of 120-254 ms; a setting for a run of record is best chosen by such
an A/B on the quiet machine.

What it is not: llama.cpp's own speculative example (``llama-speculative``), or its sampler chain.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from specrepro.bench.options import BenchOptionError
from specrepro.bench.registry import BenchContext, register_method

#: KV cache length (tokens) of the llama.cpp contexts the methods open, at most (less where the model was trained on
#: less); a HumanEval prompt plus its new tokens fits with room to spare.
LLAMA_N_CTX = 4096


def gguf_path(name: str | None) -> Path:
    """The GGUF file of a model named to the bench: the zoo's assembled file for a zoo name (fetched on first use), or
    ``name`` itself when it is a path to a ``.gguf`` file.

    Raises:
        BenchOptionError: no name, or a name that is neither a zoo model nor a GGUF file.
    """
    from specrepro.models import ZOO, fetch_gguf

    if name is not None and name in ZOO:
        return fetch_gguf(name)
    if name is not None and str(name).endswith(".gguf") and Path(name).is_file():
        return Path(name)
    raise BenchOptionError(f"the llama.cpp methods run the zoo's GGUF files ({', '.join(ZOO)}) or a .gguf path; "
                           f"got model {name!r}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _model(ctx: BenchContext, role: str):
    """The :class:`~specrepro.backends.llamacpp.LlamaCppLM` of ``role`` ('target' or 'draft'), opened once per bench
    (``ctx.shared``; a model drafting for itself gets a second context, its own cache), and the bench's
    ``config_notes["llamacpp"]`` filled in."""
    from specrepro.backends.llamacpp import LlamaCppLM, llama_cpp_available, llama_cpp_build

    ok, why = llama_cpp_available()
    if not ok:
        raise BenchOptionError(f"the llama.cpp methods need llama_cpp ({why}); install it with the command in "
                               f"requirements-llamacpp.txt")
    name = ctx.target_name if role == "target" else ctx.draft_name
    path = gguf_path(name)
    threads = torch.get_num_threads()

    def build():
        lm = LlamaCppLM(path, n_ctx=LLAMA_N_CTX, n_threads=threads)
        note = ctx.config_notes.setdefault("llamacpp", {
            **llama_cpp_build(), "n_threads": threads, "n_threads_from": "torch.get_num_threads()",
            "n_ctx": lm.n_ctx, "flash_attn": "llama.cpp default (auto)", "kv_cache_type": "f16",
            "loop": "specrepro.core.blocklm.chain_generate over specrepro.backends.llamacpp.LlamaCppLM "
                    "(llama-ar: one token per llama_decode)"})
        note[f"{role}_gguf"] = {"model": name, "file": path.name, "sha256": _sha256(path),
                                "vocab_size": lm.vocab_size}
        return lm

    lm = ctx.shared(f"llamacpp:{role}", build)
    if lm.vocab_size != ctx.vocab_size:
        raise BenchOptionError(f"the {role}'s GGUF file {path.name} has {lm.vocab_size} tokens, the bench's target "
                               f"{ctx.vocab_size}: its token ids would mean other strings")
    return lm


def _runner(ctx: BenchContext, gamma: int, verification: str | None):
    """``runner(ids, generator)`` of :func:`~specrepro.core.blocklm.chain_generate` on the llama.cpp target, with the
    llama.cpp draft at ``gamma`` (``verification`` 'token' or 'block'), or autoregressive (``verification`` None)."""
    from specrepro.core.blocklm import chain_generate

    target = _model(ctx, "target")
    draft = _model(ctx, "draft") if verification is not None else None

    def run(ids, generator):
        return chain_generate(target, ids.cpu(), draft=draft, gamma=gamma, max_new_tokens=ctx.max_new_tokens,
                              sampling=ctx.sampling, generator=generator, eos_token_id=ctx.eos_token_id,
                              verification=verification or "token")

    return run


@register_method("llama-ar", uses_gamma=False, family="llama.cpp",
                 description="AR decoding of the target's GGUF file as shipped on llama.cpp (one token per "
                             "llama_decode; argmax = llama.cpp's greedy, else our sampler with the bench's generator)")
def _llama_ar(ctx, name, gamma):
    """llama-ar's runner: :func:`~specrepro.core.blocklm.chain_generate` without a draft on the llama.cpp target."""
    return _runner(ctx, 1, None)


@register_method("llama-sd", needs_draft=True, family="llama.cpp",
                 description="our chain speculative sampling (Leviathan Alg. 1, token verification) with the target's "
                             "and the draft's GGUF forwards on llama.cpp")
def _llama_sd(ctx, name, gamma):
    """llama-sd's runner: :func:`~specrepro.core.blocklm.chain_generate`, llama.cpp target and draft, γ = ``gamma``."""
    return _runner(ctx, gamma, "token")


@register_method("llama-sd-block", needs_draft=True, family="llama.cpp",
                 description="llama-sd with block verification (Sun et al. 2025); exact")
def _llama_sd_block(ctx, name, gamma):
    """llama-sd-block's runner: as llama-sd's, ``verification="block"``."""
    return _runner(ctx, gamma, "block")
