"""Measurements made on a lent GPU (``data/gpu/``, not by ``make reproduce``): their provenance sidecars
(:func:`write_gpu_sidecars`) and the ``gpu`` block of docs/gpu.md (:func:`render_gpu`).
"""

from __future__ import annotations

import json
from pathlib import Path

from specrepro.files import read_noted, repo_root
from specrepro.record.bench_blocks import profile_results, render_template
from specrepro.record.results import STANDARD

__all__ = ["GPU_ALPHA_METHOD", "gpu_dir", "gpu_files", "write_gpu_sidecars", "render_gpu"]


#: the draft method of the bench of record whose α the GPU block's predictions take (the draft in its own dtype)
GPU_ALPHA_METHOD = "sd-draft@4"


def gpu_dir() -> Path:
    """``data/gpu``: measurements made on a lent GPU, each file naming its device, commit and versions."""
    return repo_root() / "data" / "gpu"


def gpu_files(gdir: Path, prefix: str) -> list[Path]:
    """The measurement files ``<prefix>*.json`` under ``gdir`` (their provenance sidecars left out), sorted."""
    return sorted(p for p in Path(gdir).glob(f"{prefix}*.json") if not p.name.endswith(".provenance.json"))


def write_gpu_sidecars(gdir: Path | None = None) -> list[Path]:
    """Give each measurement under ``data/gpu`` a sidecar ``<name>.provenance.json``: the run's commit, date, device
    and versions (from the file) and the sha256 of the file and its log (``test_cuda_<gpu>.log``; ``run_<gpu>.log``
    for ``cost_curves_<gpu>.json``), which ``record_hash_mismatches`` checks; one already recording the same is left.
    Returns the sidecars written. Raises ValueError for a measurement file that names no commit."""
    from specrepro.files import atomic_write_text, sha256_bytes

    gdir = gpu_dir() if gdir is None else Path(gdir)
    written = []
    for prefix in ("cost_curves_", "test_cuda_"):
        for path in gpu_files(gdir, prefix):
            data = json.loads(path.read_text())
            meta = data.get("config", data)
            if not meta.get("commit"):
                raise ValueError(f"{path}: names no commit")
            gpu = path.stem.removeprefix(prefix)
            log = gdir / (f"run_{gpu}.log" if prefix == "cost_curves_" else f"{path.stem}.log")
            prov = {**{k: meta[k] for k in ("commit", "date", "torch", "transformers") if meta.get(k) is not None},
                    "device": meta.get("device_description") or meta.get("device"),
                    "what": "measured on a lent GPU outside make reproduce (see docs/gpu.md); the log is the run's own "
                            "output",
                    "sha256": {f.name: sha256_bytes(f.read_bytes()) for f in (path, log) if f.exists()}}
            side = path.with_name(f"{path.stem}.provenance.json")
            text = json.dumps(prov, indent=1, sort_keys=True) + "\n"
            if not side.exists() or side.read_text() != text:
                atomic_write_text(side, text)
                written.append(side)
    return written


def render_gpu(profile: str = STANDARD, gdir: Path | None = None) -> str:
    """Markdown for the ``gpu`` block of docs/gpu.md from the files under ``gdir`` (default :func:`gpu_dir`): each
    ``cost_curves_*.json``'s t(n) per cache mode (ms, 95% interval where the file has one) and, for a target and a
    draft, per mode c and the predicted speedups (:func:`specrepro.bench.costcurves.mode_predictions`) at the α of
    :data:`GPU_ALPHA_METHOD` in the CPU's bench of record; each ``test_cuda_*.json`` with its log: tests collected,
    passed, failed and not reached."""
    from specrepro.bench.costcurves import MODES, mode_predictions

    gdir = gpu_dir() if gdir is None else Path(gdir)
    bench = profile_results(profile) / "bench_qwen_greedy.json"
    summary = json.loads(read_noted(bench))["summary"] if bench.exists() else []
    ref = next((r for r in summary if r["method"] == GPU_ALPHA_METHOD and r.get("alpha") is not None), None)
    alpha = None if ref is None else float(ref["alpha"])
    files = []
    for path in gpu_files(gdir, "cost_curves_"):
        res = json.loads(read_noted(path))
        models = res["models"]
        files.append({
            "name": path.name, "cfg": res["config"], "models": [Path(m).name for m in models],  # target, draft
            "predictions": mode_predictions(res, alpha) if len(models) == 2 and alpha is not None else [],
            "diffs": {Path(m).name: v["graphs_max_abs_logit_diff"] for m, v in models.items()
                      if v.get("graphs_max_abs_logit_diff") is not None},
            # per model and mode with times: (t(n), low, high) per n, ms
            "times": [(Path(m).name, mode, list(zip(ms, *(v.get(f"{mode}_ms_{end}") or [None] * len(ms)
                                                         for end in ("low", "high")))))
                      for m, v in models.items() for mode in MODES if (ms := v.get(f"{mode}_ms")) is not None],
            "with_ci": any(v.get(f"{mode}_ms_low") is not None for v in models.values() for mode in MODES)})
    tests = []
    for meta_path in gpu_files(gdir, "test_cuda_"):
        meta = json.loads(meta_path.read_text())
        log = meta_path.with_suffix(".log")
        text = log.read_text() if log.exists() else ""
        passed, failed = text.count(" PASSED"), text.count(" FAILED") + text.count(" ERROR")
        tests.append({**meta, "passed": passed, "failed": failed, "log": log.name,
                      "unreached": max(0, meta["collected"] - (passed + failed + text.count(" SKIPPED")))})
    return render_template("gpu", files=files, tests=tests, alpha=alpha, ref=ref, bench=bench.name,
                           alpha_method=GPU_ALPHA_METHOD)
