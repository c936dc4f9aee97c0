"""The README's speed block and docs/bench.md's formats block: which way of running the pair is fastest on the CPU of
record, where speculation pays and where it cannot, and why, from llama.cpp's weight-format table
(``data/results/llamacpp_formats.csv``, :mod:`specrepro.bench.formats`)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd

from specrepro.files import read_noted
from specrepro.record.bench_blocks import ci_cell, profile_figures, profile_results, rel, render_template
from specrepro.record.results import STANDARD, read_json, table_at

__all__ = ["FORMATS_TABLE", "FORMATS_FIGURE", "VARIANTS_TABLE", "SIXTEEN_BIT_TARGETS", "variant_rows", "render_speed",
           "render_formats", "sixteen_bit_rows", "save_formats_figure"]

#: the table the block reads and the figure it shows; the CPU variants' table shown beside them
FORMATS_TABLE = "llamacpp_formats.csv"
VARIANTS_TABLE = "llamacpp_variants.csv"
FORMATS_FIGURE = "fig_llamacpp_formats.png"
#: the 16-bit files' targets the block reports (:data:`specrepro.bench.targets.TARGETS`), with their short labels
SIXTEEN_BIT_TARGETS = {"llama-16bit-decode-vs-llama-ar": "greedy, over its AR in decode time",
                       "llama-16bit-vs-llama-ar": "end to end",
                       "llama-16bit-vs-llama-spec": "over its best speculation",
                       "llama-16bit-t1-vs-llama-spec": "T = 1, over its best exact speculation"}


def sixteen_bit_rows(profile: str = STANDARD, base: Path | None = None) -> list[dict]:
    """The 16-bit files' targets (:data:`SIXTEEN_BIT_TARGETS`) whose file ``profile`` has, checked
    (:func:`specrepro.bench.targets.check_targets`): label, threshold, status, the (first) measured ratio [95% CI],
    our method and llama.cpp's, n and the file's link."""
    from specrepro.bench.targets import TARGETS, check_targets

    results = profile_results(profile)
    chosen = [t for t in TARGETS if t.id in SIXTEEN_BIT_TARGETS and (results / f"{t.file}.json").exists()]
    rows = []
    for t, r in zip(chosen, check_targets(results, chosen).to_dict("records")):
        path = results / f"{t.file}.json"
        cfg = json.loads(read_noted(path)).get("config") or {}
        ours, _, theirs = str(r["method"]).split(" (")[0].partition(" / ")
        rows.append({"label": SIXTEEN_BIT_TARGETS[t.id], "threshold": f"{t.threshold:g}", "status": r["status"],
                     "measured": str(r["measured"]).split("×")[0] + "×", "ours": ours, "theirs": theirs,
                     "file": rel(path, base), "name": t.file,
                     "n": f"{cfg.get('n_prompts')} prompts × {cfg.get('repeats')} passes"})
    return rows


def variant_rows(df: pd.DataFrame) -> list[tuple]:
    """One markdown row per weight format and forward (the target's t(k), the draft's t(1)) of
    :func:`specrepro.bench.formats.compare_variants`' table: each build's median ms over the alternations with the
    widest of their 95% intervals, and portable over chosen (the ratio of those medians, its interval from the
    intervals' ends: conservative)."""
    rows, none = [], pd.Series(dtype=float)  # none: a column the table lacks, its ends NaN
    for fmt, g in df.groupby("format", sort=False):
        for col, label in [(c, f"target t({c[1:-3]})") for c in df.columns if c[0] == "t" and c.endswith("_ms")] + [
                ("draft_t1_ms", "draft t(1)")]:
            ends = [(b[col].median(), b.get(f"{col}_low", none).min(), b.get(f"{col}_high", none).max())
                    for b in (g[g["build"] == build] for build in ("portable", "chosen"))]
            (mp, lp, hp), (mc, lc, hc) = ends
            rows.append((f"`{fmt}`", label, *(ci_cell(*e, spec=".1f") for e in ends),
                         ci_cell(mp / mc, lp / hc, hp / lc) + "×"))
    return rows


def _context(profile: str, base: Path | None) -> dict:
    path = profile_results(profile) / FORMATS_TABLE
    context: dict = {"table": rel(path, base), "have": path.exists()}
    if (df := table_at(path)) is not None:
        prov = read_json(path.with_suffix(".provenance.json")) or {}
        ar, sd = df.loc[df["ar_decode_ms"].idxmin()], df.loc[df["sd_decode_ms"].idxmin()]
        best = ("ar", ar) if ar["ar_decode_ms"] <= sd["sd_decode_ms"] else ("sd", sd)
        fig = profile_figures(profile) / FORMATS_FIGURE
        context.update(
            rows=list(df.itertuples()), commit=prov.get("commit", "?"), cpu=prov.get("cpu", "?"),
            variant=", ".join(sorted(set(df["cpu_variant"].astype(str)))), threads=int(df["threads"].iloc[0]),
            n_prompts=int(df["n_prompts"].iloc[0]), passes=int(df["passes"].iloc[0]), alpha=float(df["alpha"].iloc[0]),
            alpha_from=(prov.get("alpha") or {}).get("method", "?"), best_kind=best[0], best=best[1],
            pays=list(df.loc[df["decode_speedup_lo"] > 1.0, "format"]), figure=rel(fig, base) if fig.exists() else None,
            loses=list(df.loc[df["decode_speedup_hi"] < 1.0, "format"]))
    return context


def render_speed(profile: str = STANDARD, base: Path | None = None) -> str:
    """Markdown for the README's ``speed`` block from ``profile``'s weight-format table (a missing table is named with
    its command): the fastest way to run the pair, where our exact chain beats llama.cpp's AR on the same file and
    where it loses, one short table, then the 16-bit files' targets (:func:`sixteen_bit_rows`)."""
    return render_template("speed", **_context(profile, base), sixteen=sixteen_bit_rows(profile, base))


def render_formats(profile: str = STANDARD, base: Path | None = None) -> str:
    """Markdown for docs/bench.md's ``formats`` block: the whole weight-format table (costs, bound, prediction and
    measurement with 95% intervals and n), the measured ratios that account for each gap between prediction and
    measurement, and the build's portable AVX2 level beside the CPU variant llama.cpp chose (:func:`variant_rows`)."""
    path, variants = profile_results(profile) / VARIANTS_TABLE, None
    if (df := table_at(path)) is not None:
        prov = read_json(path.with_suffix(".provenance.json")) or {}
        variants = {"rows": variant_rows(df), "table": rel(path, base), "commit": prov.get("commit", "?"),
                    "cpu": prov.get("cpu", "?"), "alternations": int(df["alternation"].nunique()),
                    **{build: ", ".join(sorted(set(df.loc[df["build"] == build, "cpu_variant"].astype(str))))
                       for build in ("chosen", "portable")}}
    return render_template("formats", **_context(profile, base), variants=variants)


def save_formats_figure(profile: str = STANDARD) -> Path:
    """Draw :func:`specrepro.bench.formats.plot_formats` from ``profile``'s weight-format table and save it as
    :data:`FORMATS_FIGURE` (:func:`specrepro.record.results.save_figure`). Returns the PNG path; FileNotFoundError
    without the table."""
    from specrepro.bench.formats import plot_formats
    from specrepro.record.results import save_figure

    ax = plot_formats(pd.read_csv(io.BytesIO(read_noted(profile_results(profile) / FORMATS_TABLE))))
    return save_figure(ax.figure, Path(FORMATS_FIGURE).stem, profile=profile)
