"""Weight formats of one GGUF checkpoint: the shipped file re-encoded by llama.cpp's own quantizer, and the forward
cost of each format on this CPU.

What this file is: :func:`format_gguf` re-encodes a zoo model's shipped GGUF file (Q4_K_M mixes) into another of
llama.cpp's weight formats (:data:`FORMATS`: Q4_0, Q8_0, F16, BF16) with ``llama_model_quantize``, the library
function llama.cpp's ``llama-quantize --allow-requantize`` calls (nothing of ours touches a weight). Every format
holds the same weights re-encoded: the shipped 4-bit values are dequantized and written again, exactly where the
format can hold them and rounded where it cannot (Q4_0 and Q8_0 quantize again; F16 and BF16 round the dequantized
values to their 16-bit grids), so the formats are the same model up to that rounding, not the original checkpoint in
16 bits. The files are cache entries (:func:`specrepro.cache.build_entry`: built once, under a lock, verified).
:func:`format_costs` times one format's forward of k new tokens, t(k) for k = 1..16, after a fixed prefix
(:func:`specrepro.measure.cost.measure_cost_table` on :class:`~specrepro.backends.llamacpp.LlamaCppLM`) and the
draft's one-token forward beside it, so that c = t_draft(1) / t(1) and the block-cost ratio t(γ+1)/t(1) come from one
run; :func:`format_predictions` turns them and an acceptance rate α into the free-draft bound and the hardware-aware
prediction (Leviathan et al. 2023, Eq. 1 with measured t(k): :func:`specrepro.theory.hardware_aware_speedup`).

What it is not: the decoding methods or their timing (``python -m specrepro bench`` runs a format's file when given
its path as ``--target``).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

__all__ = ["FORMATS", "FTYPES", "reencode_gguf", "format_gguf", "format_costs", "format_predictions", "FormatError"]

#: the weight formats: the shipped file's and those llama.cpp re-encodes it into (``llama_ftype`` values, llama.h)
FTYPES = {"Q4_0": 2, "Q8_0": 7, "F16": 1, "BF16": 32}
FORMATS = ("Q4_K_M", *FTYPES)


class FormatError(RuntimeError):
    """A format llama.cpp does not make here, or a re-encoding that failed."""


def format_gguf(model: str, fmt: str, threads: int | None = None) -> Path:
    """The GGUF file of zoo model ``model`` in weight format ``fmt``: the shipped file for ``"Q4_K_M"``, else the
    shipped file re-encoded by ``llama_model_quantize`` (``allow_requantize``, llama.cpp's default output and
    embedding types for the format), cached as ``<cache>/gguf-formats/<model>-<fmt>.gguf``.

    Raises:
        KeyError: ``model`` is not in the zoo. FormatError: ``fmt`` is not in :data:`FORMATS`, or llama.cpp's
        quantizer failed (its return code). ImportError: llama_cpp is not installed.
    """
    from specrepro.cache import build_entry, cache_root
    from specrepro.models import fetch_gguf

    if fmt not in FORMATS:
        raise FormatError(f"unknown weight format {fmt!r}; known: {', '.join(FORMATS)}")
    src = fetch_gguf(model)
    if fmt == "Q4_K_M":
        return src

    final = cache_root() / "gguf-formats" / f"{model}-{fmt}.gguf"
    final.parent.mkdir(parents=True, exist_ok=True)
    return build_entry(final, lambda tmp: reencode_gguf(src, tmp, fmt, threads), f"{model} in {fmt}", kind="file")


def reencode_gguf(src: str | Path, dst: str | Path, fmt: str, threads: int | None = None) -> Path:
    """Write GGUF file ``src`` re-encoded in weight format ``fmt`` (:data:`FTYPES`) to ``dst`` with llama.cpp's
    ``llama_model_quantize`` (``allow_requantize``; the format's default output and embedding types) and return
    ``dst``.

    Raises:
        FormatError: ``fmt`` is not in :data:`FTYPES`, or the quantizer failed (its return code).
        ImportError: llama_cpp is not installed.
    """
    import llama_cpp

    from specrepro.backends.llamacpp import load_cpu_backend

    if fmt not in FTYPES:
        raise FormatError(f"llama.cpp re-encodes into {', '.join(FTYPES)}; got {fmt!r}")
    load_cpu_backend()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[fmt]
    params.allow_requantize = True
    if threads:
        params.nthread = int(threads)
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0 or not Path(dst).is_file():
        raise FormatError(f"llama_model_quantize({Path(src).name} -> {fmt}) returned {rc}")
    return Path(dst)


def format_costs(target: str | Path, draft: str | Path, ns=range(1, 17), prefix_len: int = 128, repeats: int = 7,
                 threads: int | None = None, seed: int = 0) -> dict:
    """Time a target GGUF file's forward over k new tokens after a ``prefix_len``-token prefix (k in ``ns``) and the
    draft file's one-token forward, side by side in one run (round-robin rounds, median of ``repeats`` and its 95%
    interval; random token ids from a ``torch.Generator`` seeded with ``seed``).

    Returns:
        ``{"ns": [...], "t_ms": [...], "t_ms_low": [...], "t_ms_high": [...], "draft_t1_ms": float,
        "draft_t1_ms_low": float, "draft_t1_ms_high": float, "c": draft_t1 / t(1), "prefix_len": int,
        "repeats": int, "threads": int}``, ms.
    """
    import torch

    from specrepro.backends.llamacpp import LlamaCppLM
    from specrepro.measure.cost import measure_cost_table

    threads = int(threads or torch.get_num_threads())
    ns = sorted(set(int(n) for n in ns))
    out: dict = {"ns": ns, "prefix_len": int(prefix_len), "repeats": int(repeats), "threads": threads}
    for role, path, role_ns in (("target", target, ns), ("draft", draft, [1])):
        lm = LlamaCppLM(Path(path), n_ctx=prefix_len + max(ns) + 32, n_threads=threads)
        try:
            table = measure_cost_table(lm, ns=role_ns, prefix_len=prefix_len, repeats=repeats,
                                       generator=torch.Generator().manual_seed(int(seed)))
        finally:
            lm.close()
        if role == "target":
            out["t_ms"], out["t_ms_low"], out["t_ms_high"] = (
                [float(v) for v in table[col]] for col in ("ms", "ms_low", "ms_high"))
        else:
            row = table.iloc[0]
            out["draft_t1_ms"], out["draft_t1_ms_low"], out["draft_t1_ms_high"] = (
                float(row["ms"]), float(row["ms_low"]), float(row["ms_high"]))
    out["c"] = out["draft_t1_ms"] / out["t_ms"][0]
    return out


def format_predictions(costs: dict, alpha: float, max_gamma: int = 15) -> dict:
    """The speculative prediction for one format from :func:`format_costs` and an acceptance rate α: for the chain at
    each γ in 1..``max_gamma`` the hardware-aware speedup E[tokens](α, γ) · t(1) / (γ · t_draft(1) + t(γ+1)) and the
    free-draft bound E[tokens](α, γ) · t(1) / t(γ+1) (Leviathan et al. 2023, Eq. 1 with measured costs), and the
    best γ of each.

    Returns:
        ``{"gamma_best": int, "predicted": float, "gamma_free": int, "free_draft_bound": float,
        "block_ratio": {γ: t(γ+1)/t(1)}}``.

    Raises:
        ValueError: α outside [0, 1), or ``costs`` without t(γ+1) for γ = 1..max_gamma.
    """
    from specrepro.theory import free_draft_bound, hardware_aware_speedup

    if not 0.0 <= float(alpha) < 1.0:
        raise ValueError(f"alpha must lie in [0, 1), got {alpha}")
    t = dict(zip(costs["ns"], costs["t_ms"]))
    missing = [g + 1 for g in range(1, max_gamma + 1) if g + 1 not in t]
    if missing or 1 not in t:
        raise ValueError(f"the cost curve lacks t(k) for k = {missing or [1]}")
    tt = t.__getitem__
    td = (lambda n: float(costs["draft_t1_ms"]) * n)  # noqa: E731  (one forward per drafted token)
    gammas = range(1, max_gamma + 1)
    pred = {g: hardware_aware_speedup(alpha, g, tt, td) for g in gammas}
    free = {g: free_draft_bound(alpha, g, tt) for g in gammas}
    g_best, g_free = max(pred, key=pred.get), max(free, key=free.get)
    return {"gamma_best": int(g_best), "predicted": float(pred[g_best]), "gamma_free": int(g_free),
            "free_draft_bound": float(free[g_free]), "block_ratio": {g: t[g + 1] / t[1] for g in gammas}}
