"""The README's speed block: which way of running the pair is fastest on the CPU of record, where speculation pays
and where it cannot, and why, from the weight-format table of llama.cpp (``data/results/llamacpp_formats.csv``,
:mod:`specrepro.bench.formats`)."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pandas as pd

from specrepro.files import read_noted
from specrepro.record.bench_blocks import profile_results, rel, render_template
from specrepro.record.results import STANDARD, figures_dir

__all__ = ["FORMATS_TABLE", "FORMATS_FIGURE", "render_speed", "speed_rows", "gap_rows"]

#: the table the block reads and the figure it shows
FORMATS_TABLE = "llamacpp_formats.csv"
FORMATS_FIGURE = "fig_llamacpp_formats.png"


def _ci(v, lo, hi, fmt: str = "{:.2f}") -> str:
    if any(not isinstance(x, (int, float)) or not math.isfinite(x) for x in (v, lo, hi)):
        return "—" if not (isinstance(v, (int, float)) and math.isfinite(v)) else fmt.format(v)
    return f"{fmt.format(v)} [{fmt.format(lo)}, {fmt.format(hi)}]"


def speed_rows(df: pd.DataFrame) -> list[tuple]:
    """One markdown row per weight format: file size, llama.cpp's AR decode ms per token, our chain's, the
    block-cost ratio at the measured γ, the free-draft bound, the prediction at the measured α, the measured decode
    and end-to-end speedups (95% intervals) and α."""
    rows = []
    for r in df.itertuples():
        rows.append((
            f"`{r.format}`", f"{r.file_mib:.0f}", _ci(r.ar_decode_ms, r.ar_decode_ms_lo, r.ar_decode_ms_hi, "{:.1f}"),
            _ci(r.sd_decode_ms, r.sd_decode_ms_lo, r.sd_decode_ms_hi, "{:.1f}"), str(int(r.measured_gamma)),
            f"{r.block_ratio:.2f}", f"{r.free_draft_bound:.2f}×", f"{r.predicted_at_measured_alpha:.2f}×",
            _ci(r.decode_speedup, r.decode_speedup_lo, r.decode_speedup_hi) + "×",
            _ci(r.speedup, r.speedup_lo, r.speedup_hi) + "×",
            _ci(r.measured_alpha, r.measured_alpha_lo, r.measured_alpha_hi)))
    return rows


def gap_rows(df: pd.DataFrame) -> list[tuple]:
    """One markdown row per weight format: measured over predicted and the four measured ratios that make up the
    gap (:func:`specrepro.bench.formats.formats_shard`)."""
    return [(f"`{r.format}`", f"{r.measured_over_predicted:.2f}", f"{r.ar_decode_over_t1:.2f}",
             f"{r.tokens_per_step_over_eq1:.2f}", f"{r.target_step_over_cost:.2f}", f"{r.draft_step_over_t1:.2f}")
            for r in df.itertuples()]


def render_speed(profile: str = STANDARD, base: Path | None = None) -> str:
    """Markdown for the ``speed`` block: the weight-format table of ``profile`` (the committed record for the
    standard profile) as sentences and one table, every number from the table with its 95% interval and n; a
    missing table is named with the command that makes it."""
    path = profile_results(profile) / FORMATS_TABLE
    context: dict = {"table": rel(path, base), "have": path.exists()}
    if path.exists():
        df = pd.read_csv(io.BytesIO(read_noted(path)))
        prov = json.loads(path.with_suffix(".provenance.json").read_text())
        ar = df.loc[df["ar_decode_ms"].idxmin()]
        sd = df.loc[df["sd_decode_ms"].idxmin()]
        best = ("ar", ar) if ar["ar_decode_ms"] <= sd["sd_decode_ms"] else ("sd", sd)
        pays = df[df["decode_speedup_lo"] > 1.0]
        loses = df[df["decode_speedup_hi"] < 1.0]
        fig = figures_dir(profile) / FORMATS_FIGURE
        context.update(
            rows=speed_rows(df), gaps=gap_rows(df), commit=prov.get("commit", "?"), cpu=prov.get("cpu", "?"),
            variant=", ".join(sorted(set(df["cpu_variant"].astype(str)))), threads=int(df["threads"].iloc[0]),
            n_prompts=int(df["n_prompts"].iloc[0]), passes=int(df["passes"].iloc[0]),
            alpha=float(df["alpha"].iloc[0]), alpha_from=(prov.get("alpha") or {}).get("method", "?"),
            best_kind=best[0], best=best[1], pays=list(pays["format"]), loses=list(loses["format"]),
            n_formats=len(df), figure=rel(fig, base) if fig.exists() else None)
    return render_template("speed", **context)
