"""The performance targets of the benchmark of record (issue 18), checked against the bench JSON files.

What this file is: :data:`TARGETS` (each target: the bench file it reads, what it compares, the threshold) and
:func:`check_targets`, which reads the bench JSON written by ``make reproduce`` (:func:`specrepro.bench.run_bench`)
and says for each target whether it was met, with the measured ratio and its 95% interval over prompts.

What it is not: a timed test. Targets live here, beside the benchmark, and are judged on the record's runs only;
nothing in ``make test`` times anything against them.

Statuses: **met** — the whole 95% interval clears the threshold (for a "within" target: lies inside the band);
**met on the median** — the median clears it but the interval does not (the run cannot rule out a miss);
**missed** — the median does not clear it; **not run** — the file or a method is missing from the record.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..harness import paired_speedup

__all__ = ["Target", "TARGETS", "MET", "MET_MEDIAN", "MISSED", "NOT_RUN", "check_targets"]

MET, MET_MEDIAN, MISSED, NOT_RUN = "met", "met on the median", "missed", "not run"


@dataclass(frozen=True)
class Target:
    """One performance target.

    Attributes:
        id: short name; text: the target as issue 18 states it.
        file: the bench JSON stem in the results directory (e.g. ``bench_qwen_greedy``).
        kind: ``at_least`` (a paired ratio column of the best of ``methods`` >= ``threshold``), ``within`` (a paired
            ratio column of ``methods[0]`` within ``threshold`` of 1, both ways), ``predicted`` (every chain with a
            prediction: measured / predicted within ``threshold`` of 1), ``tree_over_chain`` (the fastest
            ``sd-tree*`` method over the fastest other ``sd-*`` chain, paired per prompt, >= ``threshold``).
        column: the summary column (``speedup_vs_ar``, ``speedup_vs_hf_assisted``, ...) for at_least / within.
        methods: method-name prefixes the target may pick from ("best of" them, by the median).
        threshold: the number the target names.
    """

    id: str
    text: str
    file: str
    kind: str
    threshold: float
    column: str = "speedup_vs_ar"
    methods: tuple[str, ...] = ("sd-",)


#: Issue 18's targets, bench of record: qwen2.5-coder-1.5b + 0.5b, >= 20 HumanEval prompts x 128 tokens, one
#: interleaved run per file.
TARGETS: tuple[Target, ...] = (
    Target("greedy-vs-ar", "greedy: ≥ 1.8× our AR", "bench_qwen_greedy", "at_least", 1.8),
    Target("greedy-vs-hf-assisted", "greedy: ≥ 1.3× transformers' assisted generation (its default fp32 draft)",
           "bench_qwen_greedy", "at_least", 1.3, "speedup_vs_hf_assisted"),
    Target("greedy-vs-hf-assisted-int8", "greedy: ≥ 1.1× transformers' assisted generation given our int8 draft",
           "bench_qwen_greedy", "at_least", 1.1, "speedup_vs_hf_assisted_int8", ("sd-draft-int8",)),
    Target("nucleus-vs-ar", "nucleus (T = 0.8, top-p 0.95): ≥ 1.6× our AR", "bench_qwen_nucleus", "at_least", 1.6),
    Target("ar-vs-hf-ar", "our AR within 5% of transformers' greedy generate", "bench_qwen_greedy", "within", 0.05,
           "speedup_vs_hf_ar", ("ar",)),
    Target("greedy-predicted", "greedy: every draft's measured speedup within 10% of the hardware-aware prediction",
           "bench_qwen_greedy", "predicted", 0.10),
    Target("nucleus-predicted", "nucleus: every draft's measured speedup within 10% of the hardware-aware prediction",
           "bench_qwen_nucleus", "predicted", 0.10),
    Target("t1-tree-over-chain", "T = 1: best tree ≥ best chain (tokens/s, paired per prompt, same run)",
           "bench_qwen_t1_trees", "tree_over_chain", 1.0),
)


def _fin(v) -> bool:
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


def _ci(est, lo, hi) -> str:
    return f"{est:.2f}" + (f" [{lo:.2f}, {hi:.2f}]" if _fin(lo) and _fin(hi) else "")


def _picks(summary: list[dict], prefixes) -> list[dict]:
    return [r for r in summary if any(str(r["method"]).startswith(p) for p in prefixes)]


def _check_one(t: Target, data: dict | None) -> dict:
    out = {"id": t.id, "target": t.text, "file": t.file, "status": NOT_RUN, "measured": "", "method": "",
           "n_prompts": None}
    if data is None:
        out["measured"] = f"{t.file}.json not in the record"
        return out
    summary = data.get("summary") or []
    out["n_prompts"] = (data.get("config") or {}).get("n_prompts")
    if t.kind in ("at_least", "within"):
        rows = [r for r in _picks(summary, t.methods) if _fin(r.get(t.column))]
        if not rows:
            out["measured"] = f"no {'/'.join(t.methods)}* method with {t.column} in the run"
            return out
        r = max(rows, key=lambda r: r[t.column])
        est, lo, hi = r[t.column], r.get(f"{t.column}_lo"), r.get(f"{t.column}_hi")
        out["method"] = r["method"] + (f" (best of {len(rows)} by the median)" if len(rows) > 1 else "")
        out["measured"] = _ci(est, lo, hi) + "×"
        if t.kind == "at_least":
            ok, sure = est >= t.threshold, _fin(lo) and lo >= t.threshold
        else:
            ok = abs(est - 1) <= t.threshold
            sure = _fin(lo) and _fin(hi) and 1 - t.threshold <= lo and hi <= 1 + t.threshold
        out["status"] = (MET if sure else MET_MEDIAN) if ok else MISSED
        return out
    if t.kind == "predicted":
        rows = [r for r in summary if _fin(r.get("measured_over_predicted"))]
        if not rows:
            out["measured"] = "no chain with a prediction in the run"
            return out
        parts = [f"{r['method']} {r['measured_over_predicted']:.2f} (measured {r['speedup_vs_ar']:.2f}× vs "
                 f"predicted {r['predicted_speedup']:.2f}×)" for r in rows]
        out["method"] = ", ".join(r["method"] for r in rows)
        out["measured"] = "measured / predicted: " + "; ".join(parts)
        ok = all(abs(r["measured_over_predicted"] - 1) <= t.threshold for r in rows)
        out["status"] = MET_MEDIAN if ok else MISSED  # a ratio of a median to a model: no interval, never "met"
        return out
    if t.kind == "tree_over_chain":
        runs = pd.DataFrame(data.get("runs") or [])
        trees = [r for r in _picks(summary, ("sd-tree",)) if _fin(r.get("tokens_per_s"))]
        chains = [r for r in _picks(summary, ("sd-",)) if not str(r["method"]).startswith("sd-tree")
                  and _fin(r.get("tokens_per_s"))]
        if runs.empty or not trees or not chains:
            out["measured"] = "the run lacks a tree or a chain method"
            return out
        tree = max(trees, key=lambda r: r["tokens_per_s"])["method"]
        chain = max(chains, key=lambda r: r["tokens_per_s"])["method"]
        s = paired_speedup(runs, tree, chain)
        out["method"] = f"{tree} / {chain} (each the fastest of {len(trees)} trees / {len(chains)} chains)"
        out["measured"] = _ci(s["speedup"], s["speedup_lo"], s["speedup_hi"]) + "×"
        ok, sure = s["speedup"] >= t.threshold, _fin(s["speedup_lo"]) and s["speedup_lo"] >= t.threshold
        out["status"] = (MET if sure else MET_MEDIAN) if ok else MISSED
        return out
    raise ValueError(f"target {t.id}: unknown kind {t.kind!r}")


def check_targets(results_dir: str | Path, targets=TARGETS) -> pd.DataFrame:
    """Check each target against the bench JSON files in ``results_dir``.

    Args:
        results_dir: the directory holding ``bench_*.json`` (the record: ``data/results``).
        targets: the :class:`Target` list (default :data:`TARGETS`).

    Returns:
        one row per target: id, target, file, status (:data:`MET`, :data:`MET_MEDIAN`, :data:`MISSED`,
        :data:`NOT_RUN`), measured (the ratio with its 95% interval over prompts, ×), method, n_prompts.

    Raises:
        ValueError: a target of unknown kind; json.JSONDecodeError: a corrupt bench file (never read as "not run").
    """
    cache: dict[str, dict | None] = {}
    rows = []
    for t in targets:
        if t.file not in cache:
            path = Path(results_dir) / f"{t.file}.json"
            cache[t.file] = json.loads(path.read_text()) if path.exists() else None
        rows.append(_check_one(t, cache[t.file]))
    return pd.DataFrame(rows)
