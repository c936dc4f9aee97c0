"""llama.cpp as a model backend of the decoding loops: a GGUF checkpoint behind :class:`specrepro.core.blocklm.BlockLM`.

What this file is: :class:`LlamaCppLM`, one llama.cpp model and context (llama-cpp-python's low-level ctypes API,
pinned in requirements-llamacpp.txt and built from source for the CPU) over one sequence: ``forward_block`` decodes a
block of tokens on the cached prefix and returns float32 logits for the rows asked for (the batch's per-token output
flags: no logits are computed for a prefill), ``truncate`` cuts the KV cache back (``llama_memory_seq_rm``), ``reset``
clears it. :func:`load_zoo` opens a model of the zoo from its assembled GGUF file as shipped (quantized weights run by
llama.cpp's own kernels; nothing is dequantized). :func:`specrepro.core.blocklm.chain_generate` decodes with such
models (autoregressively or by chain speculative decoding).

What it is not: a sampler or verifier (all of that is :mod:`specrepro.core`; ``tokenize``/``detokenize`` only turn text
into the ids the loops take and back), or llama-cpp-python's high-level ``Llama`` class (whose ``eval`` keeps a logits
row for every token of its context when ``logits_all`` is set).

llama_cpp is imported when a model is opened, not when this module is imported, so the rest of the package works
without it.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import platform
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

__all__ = ["LlamaCppLM", "LlamaCppError", "load_zoo", "llama_cpp_available", "llama_cpp_build", "load_cpu_backend",
           "cpu_variants", "amx_granted", "AMX_VARIANTS", "VARIANT_ENV", "process_cpu_variant"]

_BACKEND_READY = False
#: the CPU variants of llama.cpp's all-variants build that run AMX tile instructions (ggml/src/CMakeLists.txt)
AMX_VARIANTS = ("sapphirerapids",)
#: environment variable naming the one CPU variant to load instead of llama.cpp's choice (:func:`load_cpu_backend`)
VARIANT_ENV = "SPECREPRO_LLAMA_CPU_VARIANT"
_CPU_VARIANT: str | None = None
_CPU_LOADED = False


class LlamaCppError(RuntimeError):
    """llama.cpp refused: a model that does not load, a context it cannot create, a decode that failed."""


def llama_cpp_available() -> tuple[bool, str]:
    """Whether ``llama_cpp`` imports here, and why not (its import error) when it does not."""
    try:
        import llama_cpp  # noqa: F401
    except Exception as e:  # a missing package, or a shared library that does not load
        return False, f"{type(e).__name__}: {e}"
    return True, ""


def amx_granted() -> bool:
    """Whether the kernel grants AMX tile data to this process: ``arch_prctl(ARCH_REQ_XCOMP_PERM,
    XFEATURE_XTILEDATA)``, the request llama.cpp's AMX code makes itself, succeeds. False off x86-64 Linux and on VMs
    whose CPUID advertises AMX without the kernel granting it (there an AMX kernel dies with SIGILL)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 158, 0x1023, 18
    return libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0


def cpu_variants() -> list[Path]:
    """The CPU backend modules (``libggml-cpu-<variant>.so``) installed beside llama_cpp's libraries: one per CPU
    variant of a ``GGML_BACKEND_DL``/``GGML_CPU_ALL_VARIANTS`` build (the Makefile's), none for a build that links its
    CPU backend in (the earlier portable AVX2 build).

    Raises:
        ImportError: llama_cpp is not installed.
    """
    import llama_cpp

    return sorted((Path(llama_cpp.__file__).parent / "lib").glob("libggml-cpu-*.so"))


def load_cpu_backend() -> str | None:
    """Load the CPU variant llama.cpp scores best for this CPU (``ggml_backend_load_all_from_path`` over
    :func:`cpu_variants`, llama.cpp's own choice by CPUID), once per process, before any model is opened; the AMX
    variants (:data:`AMX_VARIANTS`) are left out where :func:`amx_granted` says no. The environment variable
    :data:`VARIANT_ENV` (e.g. ``haswell``, the AVX2 level of a portable build) loads that one variant instead, so
    that builds can be compared side by side (:func:`specrepro.bench.formats.compare_variants`). Returns the variant
    that runs (e.g. ``"zen4"``, ``"haswell"``), or None for a build with its CPU backend linked in.

    Raises:
        ImportError: llama_cpp is not installed.
        LlamaCppError: the build has variants and none could be loaded; :data:`VARIANT_ENV` names a variant the
            build lacks, or one this CPU cannot run (llama.cpp refuses it).
    """
    global _CPU_VARIANT, _CPU_LOADED
    if _CPU_LOADED:
        return _CPU_VARIANT
    variants = cpu_variants()
    if not variants:
        _CPU_LOADED = True
        return None
    libdir = variants[0].parent
    ggml = ctypes.CDLL(_loaded_ggml(libdir))
    ggml.ggml_backend_reg_count.restype = ctypes.c_size_t
    ggml.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
    search = libdir
    forced = os.environ.get(VARIANT_ENV, "").strip()
    if forced and not any(v.name == f"libggml-cpu-{forced}.so" for v in variants):
        raise LlamaCppError(f"{VARIANT_ENV}={forced}: this build has no such CPU variant; it has "
                            f"{', '.join(v.name[len('libggml-cpu-'):-3] for v in variants)}")
    if forced in AMX_VARIANTS and not amx_granted():
        raise LlamaCppError(f"{VARIANT_ENV}={forced}: its AMX kernels need tile data this kernel does not grant")
    if forced or not amx_granted():
        keep = [v for v in variants if v.name == f"libggml-cpu-{forced}.so"] if forced else [
            v for v in variants if not any(v.name == f"libggml-cpu-{a}.so" for a in AMX_VARIANTS)]
        search = Path(tempfile.mkdtemp(prefix="specrepro-ggml-cpu-"))
        atexit.register(shutil.rmtree, search, True)
        for v in keep:
            (search / v.name).symlink_to(v)
    if int(ggml.ggml_backend_reg_count()) == 0:
        ggml.ggml_backend_load_all_from_path(str(search).encode())
    _CPU_VARIANT = process_cpu_variant()
    if _CPU_VARIANT is None:
        raise LlamaCppError(f"llama.cpp loaded none of its CPU variants from {search} ({len(variants)} installed"
                            + (f"; {VARIANT_ENV}={forced}: this CPU cannot run it)" if forced else ")"))
    _CPU_LOADED = True
    return _CPU_VARIANT


def _loaded_ggml(libdir: Path) -> str:
    """The path of the libggml that llama_cpp's libllama has loaded (/proc/self/maps): a wheel stores the library's
    symlinks as copies, and each copy dlopen'ed under another name is a registry of its own, so the backends must be
    loaded into the very file libllama linked (``libggml.so.0`` by its soname where the maps cannot be read)."""
    import llama_cpp  # noqa: F401  (loads libllama and, with it, libggml)

    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            path = line.split(maxsplit=5)[-1] if len(line.split()) >= 6 else ""
            if Path(path).parent == libdir and Path(path).name.startswith("libggml.so"):
                return path
    except OSError:
        pass
    return str(libdir / "libggml.so.0")


def process_cpu_variant(pid: int | str = "self") -> str | None:
    """The CPU variant a process running llama.cpp has loaded: the ``libggml-cpu-<variant>.so`` in its memory map
    (``/proc/<pid>/maps``; this process by default; a llama.cpp server logs its choice only at debug verbosity). None
    when none is mapped (a build with its CPU backend linked in) or the map cannot be read."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        name = line.rsplit("/", 1)[-1]
        if name.startswith("libggml-cpu-") and name.endswith(".so"):
            return name[len("libggml-cpu-"):-len(".so")]
    return None


def _lib(verbose: bool):
    global _BACKEND_READY
    import llama_cpp

    # llama-cpp-python prints every llama.cpp log line through this logger unless its level is raised
    logging.getLogger("llama-cpp-python").setLevel(logging.DEBUG if verbose else logging.ERROR)
    if not _BACKEND_READY:
        load_cpu_backend()
        llama_cpp.llama_backend_init()
        _BACKEND_READY = True
    return llama_cpp


def _free(lib, batch, ctx, model):
    if batch is not None:
        lib.llama_batch_free(batch)
    if ctx:
        lib.llama_free(ctx)
    if model:
        lib.llama_model_free(model)


class LlamaCppLM:
    """One GGUF model run by llama.cpp on the CPU, with a KV cache over one sequence (a :class:`BlockLM`).

    Args:
        model_path: a GGUF file.
        n_ctx: context (KV cache) length in tokens; default the model's training context, at most 4096.
        n_threads: CPU threads for decoding and batches; default min(2, cpu count).
        n_batch: tokens per llama_decode call (a longer block is decoded in several calls); at most n_ctx.
        flash_attn: llama.cpp's flash attention: None (default) leaves llama.cpp's choice ("auto": on for the CPU),
            True or False forces it. Its CPU kernel rounds the queries to float16, so block and one-token logits of
            the tiny float32 models differ by ~5e-4 with it and ~3e-6 without it (and a float32 KV cache).
        kv_cache_type: "f16" (llama.cpp's default) or "f32", the type of the cached keys and values.
        verbose: let llama.cpp's log lines through (default: errors only).

    Threads: this build of llama.cpp runs its threads with OpenMP, whose workers spin while they wait. On a small
    shared CPU (2 cores, other processes running) two spinning threads made one decode of the 1.5B model take
    seconds instead of ~0.15 s; with ``OMP_WAIT_POLICY=PASSIVE`` in the environment before Python starts they sleep
    instead. The tiny test models run with ``n_threads=1`` and one torch thread, which avoids it.

    Attributes:
        vocab_size: V, the width of every logits row (``llama_vocab_n_tokens``).
        eos_token_ids: the vocabulary's end-of-sequence and end-of-turn ids (those it has).
        tokens: the token ids in the cache, in order (its length is the cache length).
        path: the GGUF file.

    Raises:
        FileNotFoundError: no such file.
        ValueError: an unknown ``kv_cache_type``.
        LlamaCppError: llama.cpp could not load the model or create the context.
        ImportError: llama_cpp is not installed (``pip install -r requirements-llamacpp.txt``, see that file).
    """

    def __init__(self, model_path: str | os.PathLike, *, n_ctx: int | None = None, n_threads: int | None = None,
                 n_batch: int = 512, flash_attn: bool | None = None, kv_cache_type: str = "f16",
                 verbose: bool = False):
        path = Path(model_path)
        if not path.is_file():
            raise FileNotFoundError(f"no GGUF file at {path}")
        if kv_cache_type not in ("f16", "f32"):
            raise ValueError(f"kv_cache_type must be 'f16' or 'f32', got {kv_cache_type!r}")
        lib = self._lib = _lib(verbose)
        mparams = lib.llama_model_default_params()
        mparams.n_gpu_layers = 0
        model = lib.llama_model_load_from_file(str(path).encode(), mparams)
        if not model:
            raise LlamaCppError(f"llama.cpp could not load {path} (run with verbose=True for its log)")
        train_ctx = int(lib.llama_model_n_ctx_train(model))
        self.n_ctx = int(n_ctx) if n_ctx is not None else min(4096, train_ctx if train_ctx > 0 else 4096)
        self.n_batch = max(1, min(int(n_batch), self.n_ctx))
        threads = int(n_threads) if n_threads is not None else min(2, os.cpu_count() or 1)
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = self.n_ctx
        cparams.n_batch = self.n_batch
        cparams.n_ubatch = self.n_batch
        cparams.n_seq_max = 1
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.no_perf = True
        if flash_attn is not None:
            cparams.flash_attn_type = (lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                                       else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        cparams.type_k = cparams.type_v = lib.GGML_TYPE_F16 if kv_cache_type == "f16" else lib.GGML_TYPE_F32
        ctx = lib.llama_init_from_model(model, cparams)
        if not ctx:
            lib.llama_model_free(model)
            raise LlamaCppError(f"llama.cpp could not create a context of {self.n_ctx} tokens for {path}")
        batch = lib.llama_batch_init(self.n_batch, 0, 1)
        self._finalizer = weakref.finalize(self, _free, lib, batch, ctx, model)
        self._model, self._ctx, self._batch = model, ctx, batch
        self._mem = lib.llama_get_memory(ctx)
        vocab = self._vocab = lib.llama_model_get_vocab(model)
        self.vocab_size = int(lib.llama_vocab_n_tokens(vocab))
        eos = [int(lib.llama_vocab_eos(vocab)), int(lib.llama_vocab_eot(vocab))]
        self.eos_token_ids = tuple(dict.fromkeys(e for e in eos if e >= 0))
        self.n_threads = threads
        self.path = path
        self.tokens: list[int] = []

    def __repr__(self) -> str:
        return (f"LlamaCppLM({self.path.name}, V={self.vocab_size}, n_ctx={self.n_ctx}, threads={self.n_threads}, "
                f"cached={len(self.tokens)})")

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of ``text`` by the model's own vocabulary (``llama_tokenize``; ``add_special``: a BOS token
        where the vocabulary adds one)."""
        import ctypes

        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (ctypes.c_int32 * cap)()
        n = self._lib.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, False)
        if n < 0:
            cap = -n
            buf = (ctypes.c_int32 * cap)()
            n = self._lib.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, False)
        return list(buf[:n])

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """The text of ``token_ids`` (``llama_detokenize``, special tokens kept as text)."""
        import ctypes

        toks = (ctypes.c_int32 * max(1, len(token_ids)))(*[int(t) for t in token_ids])
        cap = 16 * len(token_ids) + 16
        out = ctypes.create_string_buffer(cap)
        n = self._lib.llama_detokenize(self._vocab, toks, len(token_ids), out, cap, False, True)
        if n < 0:
            cap = -n
            out = ctypes.create_string_buffer(cap)
            n = self._lib.llama_detokenize(self._vocab, toks, len(token_ids), out, cap, False, True)
        return out.raw[:n].decode("utf-8", errors="replace")

    def close(self) -> None:
        """Free the context and the model now (also done when the object is collected)."""
        self._finalizer()

    def reset(self) -> None:
        """Empty the KV cache."""
        self._lib.llama_memory_clear(self._mem, True)
        self.tokens = []

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` cached positions (``llama_memory_seq_rm`` of [length, end)); no-op when the
        cache is not longer.

        Raises:
            ValueError: length < 0.
            LlamaCppError: llama.cpp could not remove the positions (a model whose memory cannot be cut).
        """
        if isinstance(length, bool) or int(length) != length or length < 0:
            raise ValueError(f"cannot truncate a cache to length {length!r}")
        if length >= len(self.tokens):
            return
        if not self._lib.llama_memory_seq_rm(self._mem, 0, int(length), -1):
            raise LlamaCppError(f"llama.cpp could not cut the cache of {self.path.name} back to {length} tokens")
        del self.tokens[int(length):]

    def forward_block(self, token_ids: Sequence[int], logits_to_keep: int | None = None) -> torch.Tensor:
        """Decode ``token_ids`` after the cached prefix (they join the cache) and return next-token logits.

        Args:
            token_ids: n >= 1 token ids in [0, vocab_size).
            logits_to_keep: how many of the last positions to return logits for (None: all n; 0: none, as for a
                prefill). Only those rows are computed by llama.cpp's output layer.

        Returns:
            float32 [k, V] on the CPU, k = min(logits_to_keep, n) (n when None); row i holds the logits after the
            (n - k + i)-th new token.

        Raises:
            ValueError: no tokens, an id outside [0, V), logits_to_keep < 0, or more tokens than the context has room
                for (n_ctx).
            LlamaCppError: llama_decode failed (the cache is cut back to its length before the call).
        """
        toks = [int(t) for t in token_ids]
        n = len(toks)
        if n == 0:
            raise ValueError("forward_block needs at least one token")
        if min(toks) < 0 or max(toks) >= self.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.vocab_size}), got min {min(toks)}, max {max(toks)}")
        keep = n if logits_to_keep is None else int(logits_to_keep)
        if keep < 0:
            raise ValueError(f"logits_to_keep must be >= 0 or None, got {logits_to_keep!r}")
        keep = min(keep, n)
        start = len(self.tokens)
        if start + n > self.n_ctx:
            raise ValueError(f"{start} cached + {n} new tokens exceed the context of {self.n_ctx} tokens "
                             f"(open the model with a larger n_ctx)")
        lib, b = self._lib, self._batch
        rows = []
        for c0 in range(0, n, self.n_batch):
            chunk = toks[c0:c0 + self.n_batch]
            m = len(chunk)
            n_out = 0
            for i, tok in enumerate(chunk):
                b.token[i] = tok
                b.pos[i] = start + c0 + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                out = c0 + i >= n - keep
                b.logits[i] = 1 if out else 0
                n_out += out
            b.n_tokens = m
            rc = lib.llama_decode(self._ctx, b)
            if rc != 0:
                lib.llama_memory_seq_rm(self._mem, 0, start, -1)
                del self.tokens[start:]
                raise LlamaCppError(f"llama_decode returned {rc} on a block of {m} tokens at position {start + c0}")
            self.tokens.extend(chunk)
            if n_out:
                ptr = lib.llama_get_logits(self._ctx)
                rows.append(np.ctypeslib.as_array(ptr, shape=(n_out * self.vocab_size,))
                            .reshape(n_out, self.vocab_size).copy())
        if not rows:
            return torch.empty(0, self.vocab_size, dtype=torch.float32)
        return torch.from_numpy(np.concatenate(rows) if len(rows) > 1 else rows[0])


def load_zoo(name: str, **kwargs) -> LlamaCppLM:
    """A zoo model (:data:`specrepro.models.ZOO`) as llama.cpp runs it: its assembled, checksummed GGUF file
    (:func:`specrepro.models.fetch_gguf`, fetched on first use) opened by :class:`LlamaCppLM` with ``kwargs``."""
    from specrepro.models import fetch_gguf

    return LlamaCppLM(fetch_gguf(name), **kwargs)


def llama_cpp_build() -> dict:
    """Which llama.cpp runs here, for a results file: ``version`` (``llama_cpp.__version__``, the llama-cpp-python
    release that pins its llama.cpp), ``cpu_variant`` (the CPU variant that runs, :func:`load_cpu_backend`: e.g.
    ``"zen4"``; ``"static"`` for a build with one CPU backend linked in), ``system_info``
    (``llama_print_system_info()``: the CPU features the running variant uses, e.g. AVX512_BF16, OPENMP), and ``omp_wait_policy`` (the ``OMP_WAIT_POLICY`` environment variable, None when unset;
    see :class:`LlamaCppLM` on threads).

    Raises:
        ImportError: llama_cpp is not installed.
    """
    import llama_cpp

    variant = load_cpu_backend()
    info = getattr(llama_cpp, "llama_print_system_info", None)
    text = info() if info is not None else None
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    return {"version": getattr(llama_cpp, "__version__", None), "cpu_variant": variant or "static",
            "system_info": text.strip() if isinstance(text, str) else None,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}
