"""The bench-file blocks of the record's pages: the benchmark of record (:func:`render_bench`, with the divergences
from greedy AR explained and the chat workload's categories), the performance targets checked on it
(:func:`targets_table`, :func:`render_targets`, :func:`prediction_gaps`), and the markdown helpers every block
shares (:func:`cell`, :func:`rel`, :func:`profile_results`, :func:`provenance_note`, :func:`render_template`: the
prose and table heads of the blocks are templates, ``specrepro/record/templates/*.md.j2``).

What it is not: the scorecard or the pages that hold the blocks (:mod:`specrepro.record.report`).
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
import re
from pathlib import Path

import pandas as pd

from specrepro.files import read_noted, repo_root
from specrepro.record.results import STANDARD, record_dir, results_dir

__all__ = ["cell", "rel", "profile_results", "render_template", "provenance_note", "bench_files", "render_bench",
           "targets_table", "prediction_gaps", "render_targets"]


def cell(text) -> str:
    """``text`` as one markdown table cell: None and NaN empty, pipes escaped, newlines as spaces."""
    s = "" if text is None or (isinstance(text, float) and math.isnan(text)) else str(text)
    return s.replace("|", "\\|").replace("\n", " ")


def rel(path: Path, base: Path | None) -> str:
    """``path`` as a link from a page in directory ``base`` (default: the repository root); a path outside the
    repository stays absolute."""
    root = repo_root()
    path = Path(path)
    if not path.is_relative_to(root):
        return str(path)
    return Path(os.path.relpath(path, base if base is not None else root)).as_posix()


def profile_results(profile: str) -> Path:
    """The tables the pages show for ``profile``: the committed record for the standard profile, whoever renders
    it, else :func:`specrepro.record.results.results_dir`."""
    return record_dir("results") if profile == STANDARD else results_dir(profile)


@functools.cache
def _templates():
    import jinja2

    return jinja2.Environment(loader=jinja2.PackageLoader("specrepro.record", "templates"), autoescape=False,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                              undefined=jinja2.StrictUndefined)


def render_template(name: str, **context) -> str:
    """The package's template ``templates/<name>.md.j2`` rendered with ``context`` (a missing name raises)."""
    return _templates().get_template(f"{name}.md.j2").render(**context)


def provenance_note(path: Path) -> str:
    """"commit `c`, profile p, device" from ``path``'s provenance sidecar, or "provenance unknown"."""
    sidecar = path.with_suffix(".provenance.json")
    try:
        prov = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        return "provenance unknown"
    return f"commit `{prov.get('commit', '?')}`, profile {prov.get('profile', '?')}, {prov.get('device', '?')}"


def _bf16_note(cfg: dict) -> str:
    """" (emulated: ...)" after a bfloat16 CPU run's dtype when the CPU had no bfloat16 instructions, " (native)" when
    it had them; nothing for other dtypes, devices, or runs that did not record it (``cpu_bf16``)."""
    if cfg.get("dtype") != "bfloat16" or cfg.get("cpu_bf16") is None:
        return ""
    return " (native: AVX-512 BF16 or AMX)" if cfg["cpu_bf16"] else " (emulated: this CPU has no AVX-512 BF16 or AMX)"


def _bench_cell(v, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "**no**"
    if isinstance(v, (list, tuple)):
        # positions no step reached (an adaptive length's long tail) are null in the JSON: shown as "-"
        return " ".join("-" if x is None or not math.isfinite(x) else f"{x:.2f}" for x in v) or "—"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _fin_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _ratio_cell(row: dict, key: str) -> str:
    """A value with its 95% bootstrap interval over prompts when the JSON has one (``key_lo``/``key_hi``): a paired
    speedup (:func:`specrepro.measure.harness.paired_speedup`) or a pooled rate, α or tokens per step
    (:func:`specrepro.bench.run.rate_intervals`); bench JSON written before intervals existed shows the value only."""
    v, lo, hi = row.get(key), row.get(f"{key}_lo"), row.get(f"{key}_hi")
    cell = _bench_cell(v)
    if cell == "—" or lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)) or lo == hi:
        return cell
    return f"{cell} [{lo:.2f}, {hi:.2f}]"


def render_bench(profile: str = STANDARD, base: Path | None = None) -> str:
    """Markdown for the README's benchmark-of-record block: one table per ``bench_*.json`` that ``make reproduce``
    wrote into the profile's results directory (:func:`specrepro.bench.run_bench` JSON), each headed by its setting
    (pair, workload, prompts, tokens, sampling, γ, hardware, dtype, CPU linear path, library versions, commit).

    Columns: median tokens/s and ms/token, speedup over our AR and over transformers' assisted generation (ratios of
    the same interleaved run; over transformers' AR and its assisted generation with the int8 draft where the run has
    them), α and tokens per target step (pooled, with 95% intervals over prompts), per-position acceptance, the hardware-aware prediction (the decoding loop's,
    and the whole request's with AR's measured prefill), the free-draft bound and measured / predicted (against the
    whole request's) where the run measured costs (fixed-γ chains), and (greedy) whether every output equals
    greedy AR, and the largest resident memory of each method's calls where the run measured it (GB of 10^9 bytes;
    the header says whether the draft as loaded was released before timing). A file that cannot be read is named with the error rather than skipped silently. Links are relative
    to ``base``, the directory of the page that holds the block (default: the repository root).

    A run with methods on llama.cpp's kernels (``bench_llamacpp_*``) also gets, where present, the paired ratios over
    llama.cpp's own AR (``llama-server-ar``) and our loop's (``llama-ar``), whether each greedy output equals theirs,
    and below its table the llama.cpp cost model with its intervals and each method's limit ladder
    (:func:`specrepro.bench.ladder.ladder_markdown`). In the standard profile the block ends with the bench files a
    target names that are not in the record yet.
    """
    from specrepro.bench.ladder import is_llama_run, ladder_markdown
    from specrepro.bench.run import refresh_predictions

    rdir = profile_results(profile)
    paths = bench_files(rdir)
    if not paths:
        return f"No benchmark results for profile {profile} yet: `make reproduce PROFILE={profile}` writes them.\n"
    parts = []
    for path in paths:
        link = rel(path, base)
        try:
            data = refresh_predictions(json.loads(read_noted(path)))
            cfg, summary = data["config"], data["summary"]
        except (OSError, ValueError, KeyError) as exc:
            parts.append(f"`{link}`: unreadable ({exc}).\n")
            continue
        greedy = float(cfg.get("temperature") or 0) == 0
        sampling = "greedy (T = 0)" if greedy else f"T = {cfg.get('temperature')}, top-p {cfg.get('top_p')}" + (
            f", top-k {cfg['top_k']}" if cfg.get("top_k") else "")
        linear = f", CPU linear {cfg['cpu_linear']}" if cfg.get("cpu_linear") else ""
        # the run's --gamma reaches only the speculative methods named without "@γ"; the others carry theirs in
        # their name (sd-draft@4), and AR and transformers' assisted generation take none
        plain = [str(r["method"]) for r in summary if "@" not in str(r["method"]) and r.get("gamma")]
        gamma = f"γ = {cfg.get('gamma')} ({', '.join(plain)}) · " if plain else ""
        head = (f"**{cfg.get('target')} + {cfg.get('draft')}** · {cfg.get('workload')}, {cfg.get('n_prompts')} prompts "
                f"× {cfg.get('repeats', 1)} · {cfg.get('max_new_tokens')} new tokens · {sampling} · "
                f"{gamma}{cfg.get('device_description', cfg.get('device'))}"
                + (f" [{cfg['cpu']}]" if cfg.get("cpu") else "") + f", {cfg.get('dtype')}{_bf16_note(cfg)}{linear}"
                f" · torch "
                f"{cfg.get('torch')}, transformers {cfg.get('transformers')}"
                + (f" · commit `{cfg['commit']}`" if cfg.get("commit") else "")
                + ("" if cfg.get("float_draft_kept") is None else
                   f" · draft as loaded {'kept (a method drafts with it)' if cfg['float_draft_kept'] else 'released'}"
                   " before timing")
                + f" · [`{link}`]({link})")
        # transformers' and llama.cpp's baselines beyond hf-assisted get a column only where the file has them
        extra = [(key, title) for key, title in (("speedup_vs_hf_ar", "× HF AR [95% CI]"),
                                                 ("speedup_vs_hf_assisted_int8", "× HF assisted, int8 draft [95% CI]"),
                                                 ("speedup_vs_hf_assisted_int8_pruned",
                                                  "× HF assisted, int8 pruned-head draft [95% CI]"),
                                                 ("speedup_vs_hf_assisted_int4", "× HF assisted, 4-bit draft [95% CI]"),
                                                 ("speedup_vs_llama_server_ar",
                                                  "× llama.cpp AR (llama-server-ar) [95% CI]"),
                                                 ("speedup_vs_llama_ar", "× llama-ar [95% CI]"))
                 if any(key in r for r in summary)]
        # greedy runs with llama.cpp's AR: whether each output equals its greedy tokens too
        llama_eq = [b for b in ("llama-server-ar", "llama-ar") if greedy and any(
            f"greedy_equal_to_{b.replace('-', '_')}" in r for r in summary)]
        prefill = any(r.get("predicted_speedup_with_prefill") is not None for r in summary)

        def pred(r):
            with_prefill = r.get("predicted_speedup_with_prefill")
            return _bench_cell(r.get("predicted_speedup")) + (
                " / " + _bench_cell(with_prefill) if prefill and with_prefill is not None else "")

        def equal(r, b):
            return r.get(f"equal_to_{b}_runs") or _bench_cell(r.get(f"greedy_equal_to_{b}"))

        def has(key):
            return any(r.get(key) is not None for r in summary)

        # (title, alignment, cell of a summary row): one description of each column, None where the file lacks it
        decode = {}
        if is_llama_run(data) and data.get("runs"):  # llama.cpp files: decode time per token beside end to end
            from specrepro.measure.harness import decode_ms_per_token

            runs = pd.DataFrame(data["runs"])
            decode = {r["method"]: decode_ms_per_token(runs, r["method"]) for r in summary}

        def decode_cell(r):
            ms, lo, hi, _ = decode.get(r["method"], (math.nan,) * 3 + (0,))
            return "—" if not math.isfinite(ms) else (
                f"{ms:.1f} [{lo:.1f}, {hi:.1f}]" if math.isfinite(lo) else f"{ms:.1f}")

        columns = [("method", "---", lambda r: f"`{r['method']}`" + ("" if r.get("exact", True) else " (not exact)")),
                   ("tokens/s", "---:", lambda r: _bench_cell(r.get("tokens_per_s"))),
                   ("ms/token", "---:", lambda r: _bench_cell(r.get("ms_per_token"), 0)),
                   *([("decode ms/token, prefill left out [95% CI]", "---:", decode_cell)] if decode else []),
                   ("× our AR [95% CI]", "---:", lambda r: _ratio_cell(r, "speedup_vs_ar")),
                   ("× HF assisted [95% CI]", "---:", lambda r: _ratio_cell(r, "speedup_vs_hf_assisted")),
                   *[(title, "---:", lambda r, key=key: _ratio_cell(r, key)) for key, title in extra],
                   ("α [95% CI]", "---:", lambda r: _ratio_cell(r, "alpha")),
                   ("tokens/step [95% CI]", "---:", lambda r: _ratio_cell(r, "tokens_per_step")),
                   ("per-position acceptance", "---", lambda r: _bench_cell(r.get("per_position_acceptance"))),
                   *([("draft ms per drafted token (cost model)", "---:",
                       lambda r: _bench_cell(r.get("draft_ms_per_token"), 1)),
                      ("predicted × AR (hardware-aware" + (", loop / with the prefill" if prefill else "") + ")",
                       "---:", pred),
                      ("free-draft bound", "---:", lambda r: _bench_cell(r.get("free_draft_bound"))),
                      ("measured / predicted", "---:", lambda r: _bench_cell(r.get("measured_over_predicted")))]
                     if has("predicted_speedup") else []),
                   *([("predicted from the run's own costs", "---:",
                       lambda r: _bench_cell(r.get("predicted_speedup_in_run"))),
                      ("measured / that", "---:", lambda r: _bench_cell(r.get("measured_over_predicted_in_run")))]
                     if has("predicted_speedup") and has("predicted_speedup_in_run") else []),
                   # the largest resident high-water mark of the method's calls (MiB in the JSON), in 10^9 bytes
                   *([("peak resident GB", "---:", lambda r: _bench_cell(r["peak_rss_mb"] * 2**20 / 1e9, 1)
                       if _fin_number(r.get("peak_rss_mb")) else "—")]
                     if any(_fin_number(r.get("peak_rss_mb")) for r in summary) else []),
                   *([("equal to greedy AR", "---", lambda r: equal(r, "ar"))] if greedy else []),
                   *[(f"equal to greedy {b}", "---", lambda r, b=b: equal(r, b.replace("-", "_"))) for b in llama_eq]]
        lines = [head, "", "| " + " | ".join(c[0] for c in columns) + " |", "|" + "".join(c[1] + "|" for c in columns),
                 *("| " + " | ".join(c[2](r) for c in columns) + " |" for r in summary)]
        parts.append("\n".join(lines) + "\n")
        if is_llama_run(data):  # llama.cpp's cost model with its intervals and each method's limit ladder
            parts.append(ladder_markdown(data))
        explained = _render_divergences(path, summary) if greedy else ""
        if explained:
            parts.append(explained)
        if cfg.get("workload") == "chat" and data.get("runs"):
            parts.append(_render_groups(data["runs"]))
    if profile == STANDARD:  # the record's files a performance target reads that are not measured yet
        from specrepro.bench.targets import PENDING_FILES, TARGETS

        have = {p.stem for p in paths}
        missing = [f for f in dict.fromkeys(t.file for t in TARGETS) if f not in have]
        if missing:
            parts.append("Named by a performance target, not in the record yet: "
                         + ", ".join(f"`{f}.json`" + (" (no recipe yet)" if f in PENDING_FILES else "")
                                     for f in missing) + ".\n")
    return "\n".join(parts)


def _render_divergences(bench_path: Path, summary) -> str:
    """Below a greedy bench table whose methods do not all equal greedy AR: the divergences explained, from the
    table ``greedy-equality --from-bench`` wrote beside the file (``divergences_<stem>.csv``), or a line saying that
    no table explains them, or that the table explains another run of the file (its recorded sha256 differs)."""
    import hashlib

    unequal = [r for r in summary if r.get("greedy_equal_to_ar") is False]
    if not unequal:
        return ""
    table = bench_path.with_name(f"divergences_{bench_path.stem}.csv")
    make = f"`make {table.relative_to(repo_root()) if table.is_relative_to(repo_root()) else table}`"
    if not table.exists():
        methods = {str(r.get("method")) for r in summary}
        if "ar" in methods and all(str(r.get("method")).startswith("llama-") for r in unequal):
            return ("Only llama.cpp's methods part from our greedy AR here: the two backends run different "
                    "arithmetic on the same weights (llama.cpp's quantized kernels against float32 on the "
                    "dequantized weights), so their greedy outputs are compared within each backend (the columns "
                    "above), not across.\n")
        return f"Outputs that differ from greedy AR are not explained yet ({make}).\n"
    try:
        prov = json.loads(table.with_suffix(".provenance.json").read_text())
    except (OSError, ValueError):
        prov = {}
    if prov.get("bench_sha256") != hashlib.sha256(bench_path.read_bytes()).hexdigest():
        return f"The table of divergences explains another run of this file; rerun {make}.\n"
    df = pd.read_csv(io.BytesIO(read_noted(table)))
    if df.empty:
        return ""
    if "reference" in df.columns:  # a llama.cpp file: its outputs against its baseline and llama-ar
        return _render_llama_divergences(df, prov, table)
    bound = (f"max({prov.get('tie_bound', 1e-3):g}, {prov.get('tie_spacings', 2):g} spacings of the dtype at those "
             "logits)")
    n_ok = int(df["explained"].astype(bool).sum())
    items = "; ".join(
        f"`{r.method}` {r.prompt_id} ({r.passes} passes) at token {int(r.diverged_at)}: "
        + (f"gap {r.gap:+.4g} / {r.gap_incremental:+.4g} (full forward / AR's cached path), spacing {r.spacing:.4g}"
           if "gap" in df.columns and pd.notna(r.gap) else "one output ends where the other goes on")
        for r in df.itertuples())
    return (f"Greedy outputs that differ from greedy AR: {len(df)} (method, prompt) pairs, {n_ok} of them near-ties "
            f"(AR's token and the other's within {bound}); `{table.name}`: {items}.\n")


def _render_llama_divergences(df: pd.DataFrame, prov: dict, table: Path) -> str:
    """The divergences of a llama.cpp bench file (``greedy-equality --from-bench``, llama.cpp branch): counts, the
    rule fixed in advance, and per divergence point the methods, passes and each replayed path's gap."""
    n_ok = int(df["explained"].astype(bool).sum())
    n_order = int(df["order_differs"].astype(bool).sum()) if "order_differs" in df.columns else 0
    bound = (f"max({prov.get('tie_bound', 1e-3):g}, {prov.get('tie_disagreements', 4):g} d), d the replayed paths' "
             "largest disagreement on either token's logit")
    points = df.groupby(["prompt_id", "diverged_at", "ref_token", "other_token"], sort=False)
    items = "; ".join(
        f"{pid} token {int(at)}: "
        + ", ".join(f"`{r.method}` vs `{r.reference}` ({r.passes})" for r in g.itertuples())
        + f" — gap one token / batch / server {g['gap_one_token'].iloc[0]:+.3g} / {g['gap_batch'].iloc[0]:+.3g} / "
          f"{g['gap_server'].iloc[0]:+.3g}, d {g['disagreement'].iloc[0]:.3g}"
        for (pid, at, _, _), g in points)
    return (f"Greedy outputs that differ from the baseline's or llama-ar's: {len(df)} (method, reference, prompt) "
            f"rows at {points.ngroups} points, {n_ok} of them near-ties (the two tokens' logits within {bound}, on "
            f"every path: one token per decode as llama-ar, the whole prefix in one decode, the prompt in one decode "
            f"then one token each as llama-server-ar), {n_order} where the replayed paths themselves rank the two "
            f"tokens differently; `{table.name}`: {items}.\n")


def _render_groups(runs) -> str:
    """Per category of the chat workload: each method's speedup over our AR paired within the category's prompts,
    with its 95% interval, and its tokens per step (:func:`specrepro.bench.run.group_speedups`)."""
    from specrepro.bench.run import group_speedups

    try:
        g = group_speedups(runs)
    except KeyError:
        return "Per category: the run has no AR to pair with.\n"
    if g.empty:
        return ""
    groups = list(dict.fromkeys(g["group"]))
    n = g.groupby("group", sort=False)["n_prompts"].max()
    lines = ["Per category (× our AR [95% CI], paired within the category's prompts; then tokens per step):", "",
             "| method | " + " | ".join(f"{c} (n = {int(n[c])})" for c in groups) + " |",
             "|---|" + "---:|" * len(groups)]
    for m in dict.fromkeys(g["method"]):
        cells = []
        for c in groups:
            r = g[(g["group"] == c) & (g["method"] == m)]
            if r.empty:
                cells.append("—")
                continue
            r = r.iloc[0].to_dict()
            cell = _ratio_cell({"x": r["speedup"], "x_lo": r["speedup_lo"], "x_hi": r["speedup_hi"]}, "x")
            cell += "×" if cell != "—" else ""
            if math.isfinite(r["tokens_per_step"]):
                cell += f"; {r['tokens_per_step']:.2f}"
            cells.append(cell)
        lines.append(f"| `{m}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def targets_table(profile: str = STANDARD) -> pd.DataFrame:
    """The performance targets checked against the profile's bench JSON files (the record in the standard
    profile): :func:`specrepro.bench.targets.check_targets`, one row per target with its status and ``why``."""
    from specrepro.bench.targets import check_targets

    return check_targets(profile_results(profile))


def prediction_gaps(profile: str = STANDARD) -> pd.DataFrame:
    """For every bench JSON of the profile that measured a cost model, each fixed-γ chain's measured / predicted
    speedup split into factors (:func:`specrepro.bench.targets.prediction_gap`), with a ``file`` column; empty when
    no bench file has a cost model. Raises json.JSONDecodeError on a corrupt file."""
    from specrepro.bench.targets import prediction_gap

    frames = [prediction_gap(json.loads(read_noted(f))).assign(file=f.name)
              for f in bench_files(profile_results(profile))]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def render_targets(profile: str = STANDARD) -> str:
    """Markdown for the README's performance-targets block: each target of
    :data:`specrepro.bench.targets.TARGETS`  checked against the profile's bench JSON files
    (:func:`specrepro.bench.targets.check_targets`): status, the measured ratio with its 95% interval over prompts,
    the method (best of several by the median, said so), the prompts and the file."""
    table = targets_table(profile)
    counts = table["status"].value_counts()
    records = table.to_dict(orient="records")
    rows = [(cell(r["target"]), r["status"] if r["status"] != "missed" else "**missed**", cell(r["measured"]),
             cell(r["method"]), "" if r["n_prompts"] is None or r["n_prompts"] != r["n_prompts"] else
             int(r["n_prompts"]), f"`{r['file']}.json`") for r in records]
    return render_template("targets", rows=rows, why=[(r["target"], r["why"]) for r in records if r.get("why")],
                           counts=" · ".join(f"{int(counts.get(s, 0))} {s}"
                                             for s in ("met", "met on the median", "missed", "not run")))


def bench_files(directory: Path) -> list[Path]:
    """The bench JSON files of a results directory (``bench_*.json``), sorted, without their provenance sidecars
    (``bench_*.provenance.json``) and without the parts of a run timed in parts (``bench_*.p<k>.json``, ``bench
    --part``): the file merged from them (``bench --merge``) stands for the run."""
    return sorted(p for p in Path(directory).glob("bench_*.json")
                  if not p.name.endswith(".provenance.json") and not re.search(r"\.p\d+\.json$", p.name))
