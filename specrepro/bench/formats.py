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

:func:`formats_shard` (``python -m specrepro formats --measure``) adds, per format, a bench part of llama.cpp's AR
against our chain at the predicted best γ (``python -m specrepro bench --opt target_format=FMT``) and the measured
speedups beside the prediction.

What it is not: the decoding methods (:mod:`specrepro.bench.llama`) or the harness that times them.
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


def bench_alpha(path: str | Path, method: str) -> tuple[float, float, float, int]:
    """The acceptance rate α of ``method`` in a bench JSON (its ``summary`` row): ``(alpha, alpha_lo, alpha_hi,
    runs)``.

    Raises:
        KeyError: the file has no row for ``method`` or the row has no α.
    """
    import json

    for row in json.loads(Path(path).read_text())["summary"]:
        if row.get("method") == method and row.get("alpha") is not None:
            return float(row["alpha"]), float(row["alpha_lo"]), float(row["alpha_hi"]), int(row["runs"])
    raise KeyError(f"{path} has no acceptance rate for {method!r}")


def _cost_columns(fmt: str, costs: dict, pred: dict, alpha: float, *, file: str, file_mib: float, cpu_variant: str,
                  gamma: int | None = None) -> tuple[dict, dict]:
    """One format's row of the table, in two halves: the leading columns (the file, the draft's c, the block-cost
    ratios, and the prediction at ``alpha``; with ``gamma``, also t(γ+1)/t(1) as ``block_ratio``) and the cost curve
    t(k) with its interval (``t{k}_ms``, ``_low``, ``_high``), which ends the row."""
    t = dict(zip(costs["ns"], costs["t_ms"]))
    head = {"format": fmt, "file": file, "file_mib": file_mib, "cpu_variant": cpu_variant,
            "threads": costs["threads"], "prefix_len": costs["prefix_len"], "rounds": costs["repeats"],
            "draft_t1_ms": costs["draft_t1_ms"], "draft_t1_ms_low": costs["draft_t1_ms_low"],
            "draft_t1_ms_high": costs["draft_t1_ms_high"], "c": costs["c"],
            "ratio_t5_t1": t[5] / t[1], "ratio_t8_t1": t[8] / t[1],
            **({} if gamma is None else {"block_ratio": t[gamma + 1] / t[1]}),
            "alpha": alpha, "gamma_best": pred["gamma_best"], "predicted_speedup": pred["predicted"],
            "gamma_free": pred["gamma_free"], "free_draft_bound": pred["free_draft_bound"]}
    curve = {}
    for k, ms, lo, hi in zip(costs["ns"], costs["t_ms"], costs["t_ms_low"], costs["t_ms_high"]):
        curve[f"t{k}_ms"], curve[f"t{k}_ms_low"], curve[f"t{k}_ms_high"] = ms, lo, hi
    return head, curve


def formats_table(target: str, draft: str, formats=FORMATS, *, alpha: float, ns=range(1, 17), prefix_len: int = 128,
                  repeats: int = 7, seed: int = 0, progress: bool = True):
    """One row per weight format of ``target`` (:func:`format_gguf`; the draft stays its shipped file): the cost
    curve t(k) with 95% intervals (:func:`format_costs`), the draft's c, the block-cost ratios t(5)/t(1) and
    t(8)/t(1), and the chain's free-draft bound and hardware-aware prediction at acceptance rate ``alpha``
    (:func:`format_predictions`). Formats are timed one after another in one process (each its own round-robin over
    k); the CPU variant that ran is in every row.

    Returns:
        pandas DataFrame (ms; ratios unitless).
    """
    import sys

    import pandas as pd

    from specrepro.backends.llamacpp import llama_cpp_build
    from specrepro.models import fetch_gguf

    build = llama_cpp_build()
    draft_path = fetch_gguf(draft)
    rows = []
    for fmt in formats:
        path = format_gguf(target, fmt)
        costs = format_costs(path, draft_path, ns=ns, prefix_len=prefix_len, repeats=repeats, seed=seed)
        pred = format_predictions(costs, alpha)
        t = dict(zip(costs["ns"], costs["t_ms"]))
        head, curve = _cost_columns(fmt, costs, pred, alpha, file=path.name,
                                    file_mib=round(path.stat().st_size / 2**20, 1), cpu_variant=build["cpu_variant"])
        rows.append({**head, **curve})
        if progress:
            print(f"[formats] {fmt:7s} t(1) {t[1]:7.1f} ms  t(5)/t(1) {t[5] / t[1]:.2f}  t(8)/t(1) {t[8] / t[1]:.2f}  "
                  f"c {costs['c']:.3f}  bound {pred['free_draft_bound']:.2f}x  predicted {pred['predicted']:.2f}x "
                  f"(gamma {pred['gamma_best']})", file=sys.stderr, flush=True)
    return pd.DataFrame(rows)


def configure_parser(p) -> None:
    """Options of ``python -m specrepro formats``."""
    p.add_argument("--target", default="qwen2.5-coder-1.5b", help="zoo name of the target (default: %(default)s)")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b", help="zoo name of the draft (default: %(default)s)")
    p.add_argument("--formats", default=",".join(FORMATS), help="weight formats (default: %(default)s)")
    p.add_argument("--alpha-from", metavar="BENCH_JSON",
                   help="a llama.cpp bench JSON whose acceptance rate the predictions use")
    p.add_argument("--alpha-method", default="llama-sd@4", help="its method row (default: %(default)s)")
    p.add_argument("--prefix-len", type=int, default=128, help="cached prefix tokens (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=7, help="timed round-robin rounds (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seeds the random token ids (default: %(default)s)")
    p.add_argument("--csv", metavar="OUT", help="write the table and its provenance sidecar OUT.provenance.json")
    p.add_argument("--compare-variants", action="store_true",
                   help="time the all-variants build at its portable AVX2 level and at the variant llama.cpp chooses, "
                        "side by side (the --formats given, k = 1, 5, 8; no --alpha-from needed)")
    p.add_argument("--measure", action="store_true",
                   help="also time each format's speedup (a bench part per format beside OUT, resumable; needs --csv)")
    p.add_argument("--n-prompts", type=int, default=20, help="HumanEval prompts of each bench part (default: %(default)s)")
    p.add_argument("--passes", type=int, default=3, help="timed passes of each bench part (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per prompt (default: %(default)s)")


def _start_record(csv) -> str:
    """Before timing a table of record: hold the record's lock for ``csv`` and refuse a dirty tree where ``csv`` goes
    to data/results. Returns the commit the run's code is (:func:`specrepro.files.git_commit`), for its sidecar.

    Raises:
        FormatError: a dirty tree.
    """
    from specrepro.files import git_commit, hold_record_lock_for

    hold_record_lock_for(csv)
    commit = git_commit()
    if commit.endswith("-dirty") and Path(csv).resolve().parent.name == "results":
        raise FormatError(f"refusing to write {csv} from a dirty tree ({commit}): commit the code first")
    return commit


def _write_table(out: Path, df, commit: str, **prov) -> None:
    """Write the table ``df`` to ``out`` and its provenance sidecar (``commit``, date, CPU, torch, the formats
    module's code fingerprint, the table's sha256 and ``prov``) in one atomic step."""
    import datetime
    import json

    import torch

    from specrepro.files import atomic_write_files, code_fingerprint, cpu_description, sha256_bytes

    data = df.to_csv(index=False).encode()
    prov = {"commit": commit, "date": datetime.date.today().isoformat(), "cpu": cpu_description(),
            "torch": torch.__version__, "code": code_fingerprint(["specrepro.bench.formats"]), **prov,
            "sha256": {out.name: sha256_bytes(data)}}
    sidecar = out.with_suffix(".provenance.json")
    atomic_write_files({out: data, sidecar: (json.dumps(prov, indent=1, sort_keys=True) + "\n").encode()})
    print(f"wrote {out} and {sidecar.name}")


def run_command(args, parser=None) -> int:
    """Run ``formats``: the table on stdout, and with ``--csv`` the table and its sidecar written in one step."""
    import json

    from specrepro.files import sha256_bytes

    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise FormatError(f"unknown weight formats {unknown}; known: {', '.join(FORMATS)}")
    if getattr(args, "compare_variants", False):
        return _variants_command(args, formats)
    if not args.alpha_from:
        raise FormatError("--alpha-from BENCH_JSON is required (the α the predictions use)")
    alpha, lo, hi, runs = bench_alpha(args.alpha_from, args.alpha_method)
    if args.measure and not args.csv:
        raise FormatError("--measure writes its parts beside the table: give --csv OUT")
    commit = _start_record(args.csv) if args.csv else None
    if args.measure:
        df = formats_shard(args.csv, args.target, args.draft, formats, alpha=alpha, n_prompts=args.n_prompts,
                           repeats=args.passes, max_new_tokens=args.max_new_tokens, prefix_len=args.prefix_len,
                           cost_rounds=args.repeats, seed=args.seed)
        cols = ["format", "cpu_variant", "t1_ms", "block_ratio", "c", "free_draft_bound", "gamma_best",
                "predicted_at_measured_alpha", "decode_speedup", "decode_speedup_lo", "decode_speedup_hi", "speedup"]
    else:
        df = formats_table(args.target, args.draft, formats, alpha=alpha, prefix_len=args.prefix_len,
                           repeats=args.repeats, seed=args.seed)
        cols = ["format", "cpu_variant", "t1_ms", "ratio_t5_t1", "ratio_t8_t1", "c", "free_draft_bound",
                "predicted_speedup", "gamma_best"]
    print(df[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if args.csv:
        out = Path(args.csv)
        prov = {"command": "python -m specrepro formats " + " ".join(
                    f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                    if k in ("target", "draft", "formats", "alpha_from", "alpha_method", "prefix_len", "repeats",
                             "seed", "n_prompts", "passes", "max_new_tokens")) + (" --measure" if args.measure else ""),
                "alpha": {"value": alpha, "low": lo, "high": hi, "runs": runs, "from": str(args.alpha_from),
                          "method": args.alpha_method}}
        if args.measure:  # the parts the table was made from, by hash, with each bench part's run time (its sitting)
            prov["parts"] = [
                {"file": p.name, "sha256": sha256_bytes(p.read_bytes()),
                 "seconds": (json.loads(p.with_suffix(".provenance.json").read_text()).get("seconds") or 0.0)
                 if p.with_suffix(".provenance.json").is_file() else 0.0}
                for f in formats for p in part_paths(out, f)]
        _write_table(out, df, commit, **prov)
    return 0


def _variants_command(args, formats: list[str]) -> int:
    """``formats --compare-variants``: :func:`compare_variants`'s table on stdout, and with ``--csv`` the table and its
    sidecar written in one step (the record refuses a dirty tree)."""
    import time

    commit = _start_record(args.csv) if args.csv else None
    started = time.monotonic()
    df = compare_variants(args.target, args.draft, formats, prefix_len=args.prefix_len, repeats=args.repeats,
                          seed=args.seed)
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if args.csv:
        _write_table(Path(args.csv), df, commit, seconds=round(time.monotonic() - started, 1),
                     command=f"python -m specrepro formats --compare-variants --target {args.target} --draft "
                             f"{args.draft} --formats {','.join(formats)} --prefix-len {args.prefix_len} "
                             f"--repeats {args.repeats} --seed {args.seed}")
    return 0


def compare_builds(pythons: dict, target: str, draft: str, formats=("Q4_K_M", "BF16"), ns=(1, 5, 8), *,
                   prefix_len: int = 128,
                   repeats: int = 7, alternations: int = 2, seed: int = 0):
    """llama.cpp builds side by side: for each label in ``pythons`` (``{label: python executable}`` or
    ``{label: (python executable, extra environment)}``, each an environment with its own llama-cpp-python, e.g.
    the portable AVX2 build and the all-variants one, or one build with a CPU variant forced, :func:`compare_variants`),
    a subprocess times t(k) of each format (:func:`format_costs`, the draft's t(1) beside) and reports the CPU
    variant it ran; the labels alternate ``alternations`` times (A B A B), so that drift on a shared machine falls on
    both alike.

    Returns:
        pandas DataFrame, one row per (alternation, label, format): ``build``, ``cpu_variant``, ``t{k}_ms`` (with
        ``_low``/``_high``), ``draft_t1_ms`` (with ``_low``/``_high``; ms, 95% intervals of the medians).

    Raises:
        RuntimeError: a subprocess failed (its stderr's end).
    """
    import json
    import os
    import subprocess

    import pandas as pd

    for fmt in formats:  # re-encode once, before any timing
        format_gguf(target, fmt)
    rows = []
    for a in range(int(alternations)):
        for label, spec in pythons.items():
            python, env = spec if isinstance(spec, tuple) else (spec, {})
            code = ("import json, sys; from specrepro.bench.formats import _build_costs; "
                    f"print(json.dumps(_build_costs({target!r}, {draft!r}, {list(formats)!r}, {list(ns)!r}, {prefix_len}, "
                    f"{repeats}, {seed})))")
            r = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env={**os.environ, **env})
            if r.returncode != 0:
                raise RuntimeError(f"{label} ({python}) failed: {r.stderr[-2000:]}")
            for row in json.loads(r.stdout.strip().splitlines()[-1]):
                rows.append({"alternation": a, "build": label, **row})
    return pd.DataFrame(rows)


#: the CPU variant that stands for a portable build: AVX2 with FMA and F16C, no AVX-512 (the flags of the record's
#: former portable llama.cpp build, and of llama.cpp's own portable x64 release binaries' baseline)
PORTABLE_VARIANT = "haswell"


def compare_variants(target: str, draft: str, formats=("Q4_K_M", "BF16"), ns=(1, 5, 8), *, prefix_len: int = 128,
                     repeats: int = 7, alternations: int = 2, seed: int = 0):
    """The all-variants llama.cpp build at its portable AVX2 level (:data:`PORTABLE_VARIANT`, forced through
    :data:`specrepro.backends.llamacpp.VARIANT_ENV`) and at the variant llama.cpp chooses for this CPU (``chosen``),
    side by side in one run (:func:`compare_builds`: alternating subprocesses of this Python, one source tree and
    compiler, so the instruction set is the only difference).

    Returns:
        :func:`compare_builds`' rows (``build``: ``portable`` or ``chosen``) plus, per format and k, ``ratio_t{k}``
        (and ``ratio_draft_t1``) on the ``chosen`` rows: the portable build's median ms over alternations over the
        chosen build's (> 1: the chosen variant is faster), NaN on the ``portable`` rows.

    Raises:
        RuntimeError: a subprocess failed (e.g. a CPU without AVX2).
    """
    import sys

    from specrepro.backends.llamacpp import VARIANT_ENV

    df = compare_builds({"portable": (sys.executable, {VARIANT_ENV: PORTABLE_VARIANT}),
                         "chosen": (sys.executable, {VARIANT_ENV: ""})},
                        target, draft, formats, ns, prefix_len=prefix_len, repeats=repeats,
                        alternations=alternations, seed=seed)
    med = df.groupby(["format", "build"])[[f"t{k}_ms" for k in ns] + ["draft_t1_ms"]].median()
    for col in [f"t{k}_ms" for k in ns] + ["draft_t1_ms"]:
        ratio = med[col].xs("portable", level="build") / med[col].xs("chosen", level="build")
        df[f"ratio_{col.removesuffix('_ms')}"] = [ratio[f] if b == "chosen" else float("nan")
                                                  for f, b in zip(df["format"], df["build"])]
    return df


def _build_costs(target: str, draft: str, formats, ns, prefix_len: int, repeats: int, seed: int) -> list[dict]:
    """One process's part of :func:`compare_builds`: the rows of its build."""
    from specrepro.backends.llamacpp import llama_cpp_build

    build = llama_cpp_build()
    draft = format_gguf(draft, "Q4_K_M")
    out = []
    for fmt in formats:
        costs = format_costs(format_gguf(target, fmt), draft, ns=ns, prefix_len=prefix_len, repeats=repeats,
                             seed=seed)
        row = {"format": fmt, "cpu_variant": build["cpu_variant"], "draft_t1_ms": costs["draft_t1_ms"],
               "draft_t1_ms_low": costs["draft_t1_ms_low"], "draft_t1_ms_high": costs["draft_t1_ms_high"]}
        for k, ms, lo, hi in zip(costs["ns"], costs["t_ms"], costs["t_ms_low"], costs["t_ms_high"]):
            row[f"t{k}_ms"], row[f"t{k}_ms_low"], row[f"t{k}_ms_high"] = ms, lo, hi
        out.append(row)
    return out


# ---------------------------------------------------------------------------------------------------------------
# The shard of record: every format's costs, prediction and measured speedup in one table
# ---------------------------------------------------------------------------------------------------------------
#: the methods each format's bench part times: llama.cpp's own AR through its server (the baseline) and our chain
#: (Leviathan Alg. 1, token verification) on llama.cpp's kernels at the format's predicted best γ
BASELINE = "llama-server-ar"


def part_paths(csv: str | Path, fmt: str) -> tuple[Path, Path]:
    """The two parts of format ``fmt`` of the table ``csv``: its cost curve (``<stem>.<fmt>.costs.json``) and its
    bench file (``<stem>.<fmt>.json``, with the bench's own sidecar)."""
    csv = Path(csv)
    return csv.with_name(f"{csv.stem}.{fmt}.costs.json"), csv.with_name(f"{csv.stem}.{fmt}.json")


def bench_command(fmt: str, gamma: int, json_path: str | Path, *, target: str, draft: str, n_prompts: int,
                  repeats: int, max_new_tokens: int, seed: int = 0, python: str | None = None) -> list[str]:
    """The ``python -m specrepro bench`` command line of one format's bench part: greedy HumanEval prompts, llama.cpp's
    AR through its server against our chain at ``gamma``, the target's file in weight format ``fmt``
    (``--opt target_format``), the draft's shipped file; ``--no-predict``: the bench's own cost measurements are
    left out, the shard times each format's cost curve itself (:func:`format_costs`)."""
    import sys

    return [python or sys.executable, "-m", "specrepro", "bench", "--target", target, "--draft", draft,
            "--workload", "humaneval", "--n-prompts", str(n_prompts), "--max-new-tokens", str(max_new_tokens),
            "--seed", str(seed), "--repeats", str(repeats), "--baseline", BASELINE,
            "--methods", f"{BASELINE},llama-sd@{int(gamma)}", "--temperature", "0",
            "--opt", f"target_format={fmt}", "--no-predict", "--json", str(json_path)]


def measured_row(bench_json: str | Path, method: str) -> dict:
    """The measured columns of one format from its bench part: end-to-end and decode-only speedups of ``method``
    over llama.cpp's AR (with 95% intervals and n), decode ms per token of both, α and tokens per step with their
    intervals, the draft's prompt prefill (ms) and its time per drafted token in the loop (ms, median over runs:
    the drafting steps alone, a fully accepted block's bonus token fed with the next block's first), the greedy
    equality count, and the CPU variants that ran (ours and the server's)."""
    import json

    import pandas as pd

    from specrepro.measure.harness import decode_speedup

    data = json.loads(Path(bench_json).read_text())
    runs = pd.DataFrame(data["runs"])
    row = next(r for r in data["summary"] if r["method"] == method)
    base = next(r for r in data["summary"] if r["method"] == BASELINE)
    dec = decode_speedup(runs, method, BASELINE)
    cfg = data["config"]
    return {
        "measured_gamma": int(row["gamma"]), "n_prompts": int(row["n_prompts"]), "passes": int(cfg["repeats"]),
        "speedup": row["speedup_vs_llama_server_ar"], "speedup_lo": row["speedup_vs_llama_server_ar_lo"],
        "speedup_hi": row["speedup_vs_llama_server_ar_hi"],
        "decode_speedup": dec["speedup"], "decode_speedup_lo": dec["speedup_lo"],
        "decode_speedup_hi": dec["speedup_hi"],
        "sd_decode_ms": dec["method_ms"], "sd_decode_ms_lo": dec["method_ms_lo"], "sd_decode_ms_hi": dec["method_ms_hi"],
        "ar_decode_ms": dec["baseline_ms"], "ar_decode_ms_lo": dec["baseline_ms_lo"],
        "ar_decode_ms_hi": dec["baseline_ms_hi"],
        "ar_tokens_per_s": base["tokens_per_s"], "sd_tokens_per_s": row["tokens_per_s"],
        "sd_draft_prefill_ms": float(runs.loc[runs["method"] == method, "draft_prefill_ms"].median())
        if "draft_prefill_ms" in runs else float("nan"),
        "sd_draft_ms_per_token": float(runs.loc[runs["method"] == method, "draft_ms"].median()),
        "sd_target_ms_per_step": float(runs.loc[runs["method"] == method, "target_ms"].median()),
        "measured_alpha": row["alpha"], "measured_alpha_lo": row.get("alpha_lo"),
        "measured_alpha_hi": row.get("alpha_hi"), "tokens_per_step": row["tokens_per_step"],
        "tokens_per_step_lo": row.get("tokens_per_step_lo"), "tokens_per_step_hi": row.get("tokens_per_step_hi"),
        "equal_to_ar_runs": row.get("equal_to_llama_server_ar_runs", ""),
        "server_cpu_variant": (cfg.get("llama_server") or {}).get("cpu_variant"),
        "bench_file": Path(bench_json).name,
    }


def formats_shard(csv: str | Path, target: str, draft: str, formats=FORMATS, *, alpha: float, n_prompts: int = 20,
                  repeats: int = 3, max_new_tokens: int = 64, prefix_len: int = 128, cost_rounds: int = 7,
                  seed: int = 0, progress: bool = True):
    """Build the weight-format table part by part, resumably: for each format, its cost curve and predictions
    (:func:`format_costs`, :func:`format_predictions` at acceptance rate ``alpha``; part ``<stem>.<fmt>.costs.json``),
    then its bench (:func:`bench_command` at the predicted best γ; part ``<stem>.<fmt>.json``, itself resumable from
    the bench's timing checkpoint). A part that exists is read, not redone. The prediction is also evaluated at
    the format's own measured α (``predicted_at_measured_alpha``) so that a gap between prediction and measurement
    is told apart from a different acceptance rate.

    The gap between prediction and measurement is told by four measured ratios, each 1 where the prediction's
    assumption holds: ``ar_decode_over_t1`` (llama.cpp's AR decode time per token over the cost curve's t(1): the
    baseline the prediction assumes), ``tokens_per_step_over_eq1`` (tokens per step over Eq. 1 at the measured α:
    i.i.d. acceptances), ``target_step_over_cost`` (the loop's target forward per step over t(γ+1)) and
    ``draft_step_over_t1`` (the loop's draft time per drafted token over the draft's t(1): the catch-up forward of a
    fully accepted block's last token and bonus token is not in Eq. 1).

    Returns:
        pandas DataFrame, one row per format: the cost columns of :func:`formats_table`, the measured columns of
        :func:`measured_row`, the ratios above, and ``measured_over_predicted`` (decode-only speedup over the
        prediction at the measured α).
    """
    import json
    import subprocess
    import sys

    import pandas as pd

    from specrepro.backends.llamacpp import llama_cpp_build
    from specrepro.files import atomic_write_text
    from specrepro.models import fetch_gguf
    from specrepro.theory import expected_tokens, hardware_aware_speedup

    build = llama_cpp_build()
    draft_path = fetch_gguf(draft)
    rows = []
    for fmt in formats:
        cost_part, bench_part = part_paths(csv, fmt)
        path = format_gguf(target, fmt)
        if cost_part.exists():
            costs = json.loads(cost_part.read_text())
        else:
            costs = format_costs(path, draft_path, prefix_len=prefix_len, repeats=cost_rounds, seed=seed)
            costs.update(format=fmt, file=path.name, file_mib=round(path.stat().st_size / 2**20, 1),
                         cpu_variant=build["cpu_variant"])
            atomic_write_text(cost_part, json.dumps(costs, indent=1, sort_keys=True) + "\n")
        pred = format_predictions(costs, alpha)
        t = dict(zip(costs["ns"], costs["t_ms"]))
        g = pred["gamma_best"]
        if not bench_part.exists():
            cmd = bench_command(fmt, g, bench_part, target=target, draft=draft, n_prompts=n_prompts,
                                repeats=repeats, max_new_tokens=max_new_tokens, seed=seed)
            if progress:
                print(f"[formats] {fmt}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
            subprocess.run(cmd, check=True)
        meas = measured_row(bench_part, f"llama-sd@{g}")
        td = (lambda n: float(costs["draft_t1_ms"]) * n)  # noqa: E731
        at_alpha = hardware_aware_speedup(min(float(meas["measured_alpha"]), 0.999999), g, t.__getitem__, td)
        head, curve = _cost_columns(fmt, costs, pred, alpha, file=costs["file"], file_mib=costs["file_mib"],
                                    cpu_variant=costs["cpu_variant"], gamma=g)
        row = {**head, **meas,
               "predicted_at_measured_alpha": at_alpha,
               "draft_step_over_t1": meas["sd_draft_ms_per_token"] / float(costs["draft_t1_ms"]),
               "target_step_over_cost": meas["sd_target_ms_per_step"] / t[g + 1],
               "ar_decode_over_t1": meas["ar_decode_ms"] / t[1],
               "tokens_per_step_over_eq1": meas["tokens_per_step"] / expected_tokens(
                   min(float(meas["measured_alpha"]), 0.999999), g),
               "measured_over_predicted": meas["decode_speedup"] / at_alpha, **curve}
        rows.append(row)
        if progress:
            print(f"[formats] {fmt:7s} t(1) {t[1]:6.1f} ms  t({g + 1})/t(1) {t[g + 1] / t[1]:.2f}  predicted "
                  f"{at_alpha:.2f}x  measured decode {meas['decode_speedup']:.2f}x "
                  f"[{meas['decode_speedup_lo']:.2f}, {meas['decode_speedup_hi']:.2f}]  end to end "
                  f"{meas['speedup']:.2f}x", file=sys.stderr, flush=True)
    return pd.DataFrame(rows)


def plot_formats(df, ax=None):
    """"When speculation pays": per weight format, the chain's decode-time speedup over llama.cpp's AR against what a
    verified token slot costs, t(γ+1) / ((γ+1) · t(1)) at the measured γ (1: a block costs as many forwards as it has
    tokens, and nothing speculative can win; lower: the block is cheap per token): the measurement with its 95%
    interval, the hardware-aware prediction at the measured α, and the free-draft bound; the break-even line at 1.
    Returns the axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7.4, 4.2))
    x = df["block_ratio"].to_numpy(float) / (df["measured_gamma"].to_numpy(float) + 1)
    y = df["decode_speedup"].to_numpy(float)
    err = [y - df["decode_speedup_lo"].to_numpy(float), df["decode_speedup_hi"].to_numpy(float) - y]
    ax.errorbar(x, y, yerr=err, fmt="o", color="C0", capsize=3, label="measured (decode time, 95% CI)")
    ax.scatter(x, df["predicted_at_measured_alpha"], marker="x", color="C1", zorder=3,
               label="predicted (Eq. 1, measured costs and α)")
    ax.scatter(x, df["free_draft_bound"], marker="_", s=200, color="C2", zorder=3, label="free-draft bound")
    for k, i in enumerate(x.argsort()):  # labels alternate above and below, in order of x, so neighbours do not clash
        ax.annotate(f"{df['format'].iloc[i]} (γ = {int(df['measured_gamma'].iloc[i])})", (x[i], y[i]),
                    textcoords="offset points", xytext=(6, 10 if k % 2 == 0 else -14), fontsize=8)
    ax.axhline(1.0, color="0.5", lw=0.8, ls="--")
    ax.set_xlabel("cost of a verified token slot, t(γ+1) / ((γ+1) · t(1)), at the measured γ")
    ax.set_ylabel("speedup over llama.cpp AR (×)")
    ax.set_title("When speculation pays on this CPU: one pair, every weight format")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return ax
