"""Greedy identity on a whole workload, the analysis side: a bench file's greedy outputs that differ from greedy AR's,
each explained by a near-tie or not (:func:`bench_divergences`), on the bench's own prompts (:func:`bench_prompt_ids`)
and, for a llama.cpp bench file, its own target file (:func:`open_llama_bench_target`, for
:func:`specrepro.sim.llama_equality.llama_bench_divergences`). The command that saves these tables is
``python -m specrepro greedy-equality --from-bench`` (:mod:`specrepro.record.equality`).
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["bench_prompt_ids", "open_llama_bench_target", "bench_divergences"]


def bench_prompt_ids(cfg: dict, tokenizer) -> dict:
    """A bench file's prompts rebuilt as the bench built them (its workload, first ``n_prompts``, chat template or
    not), encoded by the target's tokenizer: prompt id -> long [L] tensor."""
    from specrepro.data import format_prompt, load_workload

    chat = bool(cfg.get("chat_template"))
    return {p.id: tokenizer(format_prompt(p, tokenizer, chat=chat), return_tensors="pt").input_ids[0]
            for p in load_workload(cfg["workload"], int(cfg["n_prompts"]))}


def open_llama_bench_target(cfg: dict):
    """A llama.cpp bench file's target as the bench opened it: its GGUF file (:func:`specrepro.bench.llama.gguf_path`,
    or :func:`specrepro.bench.formats.format_gguf`'s for a recorded ``<model>-<format>.gguf``) in a
    :class:`~specrepro.backends.llamacpp.LlamaCppLM` with the recorded context length, threads and KV cache type.

    Raises:
        ValueError: the GGUF file here is not the one the bench ran (another sha256).
    """
    from specrepro.backends.llamacpp import LlamaCppLM
    from specrepro.bench.llama import gguf_path
    from specrepro.models import sha256_file

    note = cfg["llamacpp"]
    g = note["target_gguf"]
    path = gguf_path(g["model"])
    if g.get("file") and g["file"] != path.name:
        from specrepro.bench.formats import FORMATS, format_gguf

        fmt = next((f for f in FORMATS if g["file"] == f"{g['model']}-{f}.gguf"), None)
        path = format_gguf(g["model"], fmt) if fmt else path
    if g.get("sha256") and sha256_file(path) != g["sha256"]:
        raise ValueError(f"{path} is not the target GGUF file the bench ran (sha256 {g['sha256'][:12]}...)")
    return LlamaCppLM(path, n_ctx=int(note.get("n_ctx") or 4096), n_threads=note.get("n_threads"),
                      kv_cache_type=note.get("kv_cache_type") or "f16")


def bench_divergences(bench_json: str | Path, *, tie_bound: float = 1e-3, tie_spacings: float = 2.0,
                      model=None, tokenizer=None):
    """Every greedy output of a bench file that differs from greedy AR's on the same prompt and pass, explained or not
    by a near-tie (:func:`specrepro.sim.real.explain_divergence`), on the bench's prompts (:func:`bench_prompt_ids`)
    and its target (name and dtype, on the CPU) unless ``model`` and ``tokenizer`` are given.

    Returns:
        pandas.DataFrame, one row per (method, prompt) (greedy decoding diverges alike in every pass): method,
        prompt_id, passes (diverged / run), then explain_divergence's fields. Empty if nothing diverges (or not greedy).

    Raises:
        ValueError: a divergent run without an ``ar`` run of its prompt.
    """
    import pandas as pd

    from specrepro.sim.real import explain_divergence

    data = json.loads(Path(bench_json).read_text())
    cfg, runs = data["config"], data.get("runs") or []
    bad = [r for r in runs if r.get("equal_to_baseline") is False]
    if float(cfg.get("temperature") or 0) != 0 or not bad:
        return pd.DataFrame(columns=["method", "prompt_id", "passes"])
    ar = {(r["repeat"], r["prompt_index"]): r["token_ids"] for r in runs if r["method"] == "ar"}
    if model is None:
        from specrepro.models import load_model

        model, tokenizer = load_model(cfg["target"], dtype=cfg.get("dtype") or "float32")
    encoded = bench_prompt_ids(cfg, tokenizer)
    rows = []
    for (method, idx), group in pd.DataFrame(bad).groupby(["method", "prompt_index"], sort=True):
        first = group.sort_values("repeat").iloc[0]
        key = (int(first["repeat"]), int(idx))
        if key not in ar:
            raise ValueError(f"{bench_json}: {method} diverges on prompt {idx} but the file has no ar run to compare")
        n_runs = sum(1 for r in runs if r["method"] == method and r["prompt_index"] == idx)
        why = explain_divergence(model, encoded[first["prompt"]], ar[key], list(first["token_ids"]),
                                 tie_bound=tie_bound, tie_spacings=tie_spacings)
        if why is None:  # equal on the common length: one output is a prefix of the other (an EOS on one side)
            why = {"diverged_at": min(len(ar[key]), len(first["token_ids"])), "explained": False}
        rows.append({"method": method, "prompt_id": first["prompt"], "passes": f"{len(group)}/{n_runs}", **why})
    return pd.DataFrame(rows)
