"""``python -m specrepro cost-curves``: the forward cost t(n) of models over n new tokens, eager, with a static
cache and with CUDA graphs, side by side in one run.

What this file is: :func:`run_cost_curves` (the measurement, written as JSON), its command line, and what a
target's and a draft's curves predict (:func:`mode_predictions`). The cost of a step is the input of Leviathan et
al.'s model (c = t_draft(1) / t_target(1), Theorem 3.8) and of the hardware-aware prediction
(:func:`specrepro.theory.hardware_aware_speedup`). With ``--random-weights`` only a model's config is needed, so the
architectures of a pair can be timed on a machine its checkpoints cannot reach (a GPU without a network): the cost of
a dense forward does not depend on the weights.

What it is not: the timing of decoding methods (``python -m specrepro bench``) or the cost-model arithmetic
(:mod:`specrepro.theory`).
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import torch

from specrepro.theory import CostCurve, free_draft_bound, hardware_aware_speedup, optimal_gamma_hardware

__all__ = ["MODES", "run_cost_curves", "table", "mode_predictions", "configure_parser", "run_command"]

#: a result's cache modes: eager (dynamic cache), static cache, CUDA graphs
MODES = ("eager", "static", "graphs")


def _parse_ns(text: str) -> list[int]:
    try:
        ns = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--ns expects comma-separated integers, got {text!r}") from None
    if not ns or min(ns) < 1:
        raise ValueError(f"--ns needs token counts >= 1, got {text!r}")
    return sorted(set(ns))


def run_cost_curves(models: list[str], device: str = "cpu", dtype: str = "auto", ns=(1, 2, 3, 4, 5, 8),
                    prefix_len: int = 200, repeats: int = 20, warmup_rounds: int = 3, static: bool = False,
                    cuda_graphs: bool = False, random_weights: bool = False, seed: int = 0,
                    json_path: str | Path | None = None) -> dict:
    """Time each model's KV-cached forward over n new tokens after a ``prefix_len``-token prefix (median of
    ``repeats`` round-robin rounds, ms): with transformers' dynamic cache (eager, what the decoding loops of this
    package run), and optionally with a ``StaticCache`` (eager) and with that cache's forward captured as a CUDA
    graph per n (:func:`specrepro.measure.cost.measure_cost_table_static`). Models are loaded one at a time and
    freed before the next.

    Args:
        models: zoo names, hub ids or local directories (with ``random_weights``, only their configs are read).
        device: 'cpu', 'cuda', 'cuda:N'; dtype: 'float32', 'bfloat16', 'float16' or 'auto' (fp32 on CPU, bf16 on CUDA).
        ns: token counts n (each >= 1); prefix_len: cached prefix tokens (>= 1); repeats: timed rounds (>= 1);
        warmup_rounds: untimed rounds (>= 0).
        static, cuda_graphs: also time the static cache eager, and its CUDA graphs (needs CUDA; implies ``static``).
        random_weights: build each model from its config with random weights (:func:`specrepro.models.random_weights_model`).
        seed: seeds the random token ids (one ``torch.Generator``) and the random weights.
        json_path: write the result there (atomically).

    Returns:
        ``{"config": {...commit, code fingerprint, device, versions, settings}, "models": {name: {"params": int,
        "eager_ms": [...], "static_ms": [...] | None, "graphs_ms": [...] | None, "graphs_max_abs_logit_diff": float |
        None, and per timed mode "<mode>_ms_low", "<mode>_ms_high": [...]}}}``: medians and their 95% intervals
        (:func:`specrepro.stats.median_interval`; null below 6 repeats), ms, in the order of ``config["ns"]``.

    Raises:
        ValueError: no models, ``cuda_graphs`` on a device that is not CUDA (or CUDA unavailable), impossible sizes.
    """
    from specrepro.files import (atomic_write_text, code_fingerprint, cpu_description, device_description, git_commit,
                                 hold_record_lock_for)
    from specrepro.measure.cost import measure_cost_table, measure_cost_table_static
    from specrepro.models import load_model, random_weights_model, resolve_dtype

    if not models:
        raise ValueError("cost-curves needs at least one model")
    ns = sorted({int(n) for n in ns})
    if not ns or ns[0] < 1 or int(prefix_len) < 1 or int(repeats) < 1 or int(warmup_rounds) < 0:
        raise ValueError(f"cost-curves needs ns >= 1, prefix_len >= 1, repeats >= 1, warmup_rounds >= 0; got {ns}, "
                         f"{prefix_len}, {repeats}, {warmup_rounds}")
    dev = torch.device(device)
    if cuda_graphs and (dev.type != "cuda" or not torch.cuda.is_available()):
        raise ValueError(f"--cuda-graphs needs a CUDA device; got {device!r} (CUDA available: "
                         f"{torch.cuda.is_available()})")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but CUDA is not available")
    static = static or cuda_graphs
    torch_dtype = resolve_dtype(dtype, device)
    import transformers

    out = {"config": {"commit": git_commit(), "code_fingerprint": code_fingerprint(),
                      "date": datetime.date.today().isoformat(), "device": device,
                      "device_description": device_description(device), "cpu": cpu_description(),
                      "dtype": str(torch_dtype).replace("torch.", ""), "torch": torch.__version__,
                      "transformers": transformers.__version__, "random_weights": bool(random_weights),
                      "ns": ns, "prefix_len": int(prefix_len), "repeats": int(repeats),
                      "warmup_rounds": int(warmup_rounds), "seed": int(seed), "timing": "time.perf_counter",
                      "statistic": "median over repeats, each round timing every n once (round-robin)",
                      "interval": "95% distribution-free interval of the median (sign test; null under 6 repeats)"},
           "models": {}}
    for name in models:
        if random_weights:
            model = random_weights_model(name, device, torch_dtype, seed)
        else:
            model, _ = load_model(name, device, torch_dtype)
        gen = torch.Generator().manual_seed(int(seed))
        row = {"params": int(sum(p.numel() for p in model.parameters())), "static_ms": None, "graphs_ms": None,
               "graphs_max_abs_logit_diff": None}
        kw = dict(ns=ns, prefix_len=int(prefix_len), repeats=int(repeats), warmup_rounds=int(warmup_rounds))
        tables = {"eager": measure_cost_table(model, generator=gen, **kw)}
        if static:
            tables["static"] = measure_cost_table_static(model, generator=gen, **kw)[0]
        if cuda_graphs:
            tables["graphs"], row["graphs_max_abs_logit_diff"] = measure_cost_table_static(
                model, generator=gen, cuda_graphs=True, **kw)
        for mode, t in tables.items():
            for col in ("ms", "ms_low", "ms_high"):
                row[f"{mode}_{col}"] = [None if v != v else float(v) for v in t[col]]  # NaN (no interval) -> null
        out["models"][name] = row
        del model
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if json_path is not None:
        hold_record_lock_for(json_path)
        atomic_write_text(Path(json_path), json.dumps(out, indent=1) + "\n")
    return out


def table(result: dict):
    """The result as a pandas DataFrame: one row per (model, cache mode), one column per n (ms)."""
    import pandas as pd

    ns = result["config"]["ns"]
    rows = []
    for name, r in result["models"].items():
        for mode in MODES:
            ms = r.get(f"{mode}_ms")
            if ms is not None:
                rows.append({"model": name, "mode": mode, **{f"t({n}) ms": v for n, v in zip(ns, ms)}})
    return pd.DataFrame(rows)


def mode_predictions(result: dict, alpha: float) -> list[dict]:
    """What a result of two models (target, then draft) predicts at acceptance rate ``alpha``, per cache mode that
    timed both (in :data:`MODES` order): ``mode``, c = t_draft(1) / t_target(1), the best ``gamma``
    (:func:`specrepro.theory.optimal_gamma_hardware`, up to the largest n - 1), the hardware-aware speedup
    (:func:`specrepro.theory.hardware_aware_speedup`) at γ = 4 (``at_4``) and at the best γ (``at_best``), and the
    free-draft bound at γ = 4 (``free``). ValueError unless the result holds exactly two models."""
    ns = result["config"]["ns"]
    (_, target), (_, draft) = result["models"].items()
    out = []
    for mode in MODES:
        if target.get(f"{mode}_ms") is None or draft.get(f"{mode}_ms") is None:
            continue
        t_curve, d_curve = CostCurve(ns, target[f"{mode}_ms"]), CostCurve(ns, draft[f"{mode}_ms"])
        g = optimal_gamma_hardware(alpha, t_curve, d_curve, max_gamma=max(ns) - 1)
        out.append({"mode": mode, "c": d_curve(1) / t_curve(1), "gamma": g,
                    "at_4": hardware_aware_speedup(alpha, 4, t_curve, d_curve),
                    "at_best": hardware_aware_speedup(alpha, g, t_curve, d_curve),
                    "free": free_draft_bound(alpha, 4, t_curve)})
    return out


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Options of ``python -m specrepro cost-curves``."""
    p.add_argument("--model", action="append", required=True,
                   help="zoo name, hub id or local directory; repeat for several models (timed one after another)")
    p.add_argument("--random-weights", action="store_true",
                   help="build each model from its config with random weights (timing only)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (default: cpu)")
    p.add_argument("--dtype", default="auto", help="float32, bfloat16, float16 or auto (default: auto)")
    p.add_argument("--ns", default="1,2,3,4,5,8", help="new-token counts n (default: 1,2,3,4,5,8)")
    p.add_argument("--prefix-len", type=int, default=200, help="cached prefix tokens (default: 200)")
    p.add_argument("--repeats", type=int, default=20, help="timed round-robin rounds (default: 20)")
    p.add_argument("--warmup-rounds", type=int, default=3, help="untimed rounds (default: 3)")
    p.add_argument("--static", action="store_true", help="also time transformers' StaticCache, eager")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="also time the StaticCache forward captured as one CUDA graph per n (CUDA only)")
    p.add_argument("--seed", type=int, default=0, help="seeds the random ids and random weights (default: 0)")
    p.add_argument("--json", dest="json_path", metavar="OUT", help="write the result as JSON")


def run_command(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    """Run ``cost-curves``; library errors propagate to :func:`specrepro.__main__.main` (one line, status 2)."""
    result = run_cost_curves(args.model, device=args.device, dtype=args.dtype, ns=_parse_ns(args.ns),
                             prefix_len=args.prefix_len, repeats=args.repeats, warmup_rounds=args.warmup_rounds,
                             static=args.static, cuda_graphs=args.cuda_graphs, random_weights=args.random_weights,
                             seed=args.seed, json_path=args.json_path)
    print(f"{result['config']['device_description']}, {result['config']['dtype']}, prefix {args.prefix_len} tokens, "
          f"median of {args.repeats} rounds")
    print(table(result).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if args.json_path:
        print(f"wrote {args.json_path}")
    return 0
