"""The bench blocks of the record's pages and the helpers every block shares: :func:`render_bench` (the benchmark
of record, its divergences from greedy AR explained, the chat workload's categories), the performance targets
(:func:`targets_table`, :func:`render_targets`, :func:`prediction_gaps`), the cells (:func:`cell`, :func:`ci_cell`),
links (:func:`rel`), directories and :func:`render_template`: every block's prose and layout is a template,
``templates/<name>.md.j2``. The pages that hold the blocks are :mod:`specrepro.record.report`'s.
"""

from __future__ import annotations

import functools
import json
import math
import numbers
import os
from pathlib import Path

import pandas as pd

from specrepro.files import read_noted, repo_root, sha256_bytes
from specrepro.record.equality import divergences_name
from specrepro.record.results import STANDARD, figures_dir, read_json, record_dir, results_dir, table_at

__all__ = ["cell", "ci_cell", "rel", "profile_results", "profile_figures", "render_template", "provenance_note",
           "render_bench", "targets_table", "prediction_gaps", "render_targets"]


def cell(text) -> str:
    """``text`` as one markdown table cell: None and NaN empty, pipes escaped, newlines as spaces."""
    s = "" if text is None or (isinstance(text, float) and math.isnan(text)) else str(text)
    return s.replace("|", "\\|").replace("\n", " ")


def _finite(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def ci_cell(v, lo=None, hi=None, spec: str = ".2f") -> str:
    """``v [lo, hi]`` in format ``spec``; ``v`` alone without a finite interval; "—" when ``v`` is not finite."""
    if not _finite(v):
        return "—"
    if not (_finite(lo) and _finite(hi)):
        return format(float(v), spec)
    return f"{float(v):{spec}} [{float(lo):{spec}}, {float(hi):{spec}}]"


def rel(path: Path, base: Path | None) -> str:
    """``path`` as a link from a page in directory ``base`` (default: the repository root); a path outside the
    repository stays absolute."""
    root, path = repo_root(), Path(path)
    return Path(os.path.relpath(path, base or root)).as_posix() if path.is_relative_to(root) else str(path)


def profile_results(profile: str) -> Path:
    """The tables the pages show for ``profile``: the committed record for the standard profile, whoever renders
    it, else :func:`specrepro.record.results.results_dir`."""
    return record_dir("results") if profile == STANDARD else results_dir(profile)


def profile_figures(profile: str) -> Path:
    """The figures the pages show for ``profile``, as :func:`profile_results` the tables."""
    return record_dir("figures") if profile == STANDARD else figures_dir(profile)


@functools.cache
def _templates():
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("specrepro.record", "templates"), autoescape=False,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)

    def _strict(f):  # f raising jinja's UndefinedError (which names the missing field) when given an undefined value
        def strict(*args, **kwargs):
            for a in (*args, *kwargs.values()):
                if isinstance(a, jinja2.Undefined):
                    a._fail_with_undefined_error()
            return f(*args, **kwargs)
        return strict

    # a bad table fails, never renders a default: int and float raise on NaN or text as Python's do (jinja's own
    # print 0), and every filter and test raises on a missing column (jinja's Undefined) naming it
    env.filters.update({name: _strict(f) for name, f in
                        dict(cell=cell, ci=ci_cell, fmt=format, int=int, float=float).items()})
    env.tests.update(notna=_strict(pd.notna), finite=_strict(math.isfinite))
    return env


def render_template(name: str, **context) -> str:
    """The package's template ``templates/<name>.md.j2`` rendered with ``context`` (a missing name raises); the
    templates have the filters ``cell`` (:func:`cell`), ``ci`` (:func:`ci_cell`) and ``fmt`` (:func:`format`)
    and the test ``notna`` (:func:`pandas.notna`)."""
    return _templates().get_template(f"{name}.md.j2").render(**context)


def provenance_note(path: Path) -> str:
    """"commit `c`, profile p, device" from ``path``'s provenance sidecar, or "provenance unknown"."""
    prov = read_json(path.with_suffix(".provenance.json"))
    if prov is None:
        return "provenance unknown"
    return f"commit `{prov.get('commit', '?')}`, profile {prov.get('profile', '?')}, {prov.get('device', '?')}"


def _bench_cell(v, digits: int | None = 2, lo=None, hi=None) -> str:
    """A bench cell: a float to ``digits`` places with its interval ``[lo, hi]`` (2 places) where both ends are finite
    and differ (unlike :func:`ci_cell`, a bool is yes / **no**, a list its values with "-" for a position no step
    reached, anything else as it is); "—" for None, NaN or an empty list."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "**no**"
    if isinstance(v, (list, tuple)):
        return " ".join("-" if x is None or not math.isfinite(x) else f"{x:.2f}" for x in v) or "—"
    text = f"{v:.{digits}f}" if isinstance(v, float) and digits is not None else str(v)
    return f"{text} [{lo:.2f}, {hi:.2f}]" if _finite(lo) and _finite(hi) and lo != hi else text


#: a bench table's columns in order: (title, key of the summary row, digits, None for a text column aligned left;
#: shown: always (None), where a row has the key ("key"), or where the file has what :func:`_bench_table` names).
#: A "[95% CI]" title shows the key's 95% interval over prompts, ``<key>_lo`` and ``<key>_hi``, where the row has one.
_BENCH_COLUMNS = (
    ("method", "method", None, None), ("tokens/s", "tokens_per_s", 2, None), ("ms/token", "ms_per_token", 0, None),
    ("decode ms/token, prefill left out [95% CI]", "decode", 1, "decode"),
    ("× our AR [95% CI]", "speedup_vs_ar", 2, None), ("× HF assisted [95% CI]", "speedup_vs_hf_assisted", 2, None),
    ("× HF AR [95% CI]", "speedup_vs_hf_ar", 2, "key"),
    ("× HF assisted, int8 draft [95% CI]", "speedup_vs_hf_assisted_int8", 2, "key"),
    ("× HF assisted, int8 pruned-head draft [95% CI]", "speedup_vs_hf_assisted_int8_pruned", 2, "key"),
    ("× HF assisted, 4-bit draft [95% CI]", "speedup_vs_hf_assisted_int4", 2, "key"),
    ("× llama.cpp AR (llama-server-ar) [95% CI]", "speedup_vs_llama_server_ar", 2, "key"),
    ("× llama-ar [95% CI]", "speedup_vs_llama_ar", 2, "key"),
    ("α [95% CI]", "alpha", 2, None), ("tokens/step [95% CI]", "tokens_per_step", 2, None),
    ("per-position acceptance", "per_position_acceptance", None, None),
    ("draft ms per drafted token (cost model)", "draft_ms_per_token", 1, "predicted"),
    ("predicted × AR (hardware-aware{prefill})", "predicted", 2, "predicted"),
    ("free-draft bound", "free_draft_bound", 2, "predicted"),
    ("measured / predicted", "measured_over_predicted", 2, "predicted"),
    ("predicted from the run's own costs", "predicted_speedup_in_run", 2, "in_run"),
    ("measured / that", "measured_over_predicted_in_run", 2, "in_run"),
    ("peak resident GB", "peak_gb", 1, "peak"),
    *((f"equal to greedy {name}", f"equal_{b}", None, f"equal_{b}")
      for b, name in (("ar", "AR"), ("llama_server_ar", "llama-server-ar"), ("llama_ar", "llama-ar"))))


def _bench_table(data: dict, greedy: bool) -> dict:
    """A bench file's table (see :func:`render_bench`): ``columns`` (title, alignment) of :data:`_BENCH_COLUMNS`
    and ``rows``, a row per method, each cell a :func:`_bench_cell` of the summary row or of a cell computed here."""
    from specrepro.bench.ladder import is_llama_run
    from specrepro.measure.harness import decode_ms_per_token

    summary, runs = data["summary"], pd.DataFrame(data.get("runs") or [])

    def has(key):
        return any(r.get(key) is not None for r in summary)

    prefill, predicted = has("predicted_speedup_with_prefill"), has("predicted_speedup")
    decode = is_llama_run(data) and not runs.empty  # llama.cpp files: decode time per token beside end to end
    # greedy runs: whether each output equals greedy AR's, and llama.cpp's AR's where the file has it
    equal = ["ar", *(b for b in ("llama_server_ar", "llama_ar") if has(f"greedy_equal_to_{b}"))] if greedy else []
    shown = {None: True, "decode": decode, "predicted": predicted,
             "in_run": predicted and has("predicted_speedup_in_run"),
             "peak": any(_finite(r.get("peak_rss_mb")) for r in summary), **{f"equal_{b}": True for b in equal}}
    rows = [{**r, "method": f"`{r['method']}`" + ("" if r.get("exact", True) else " (not exact)"),
             "decode": decode and ci_cell(*decode_ms_per_token(runs, r["method"])[:3], spec=".1f"),
             "predicted": _bench_cell(r.get("predicted_speedup")) + (
                 "" if (both := r.get("predicted_speedup_with_prefill")) is None else f" / {_bench_cell(both)}"),
             # the largest resident high-water mark of the method's calls (MiB in the JSON), in 10^9 bytes
             "peak_gb": r["peak_rss_mb"] * 2**20 / 1e9 if _finite(r.get("peak_rss_mb")) else None,
             **{f"equal_{b}": r.get(f"equal_to_{b}_runs") or _bench_cell(r.get(f"greedy_equal_to_{b}"))
                for b in equal}} for r in summary]
    columns = [(title.format(prefill=", loop / with the prefill" if prefill else ""), key, digits)
               for title, key, digits, when in _BENCH_COLUMNS
               if (any(key in r for r in summary) if when == "key" else shown.get(when, False))]
    return {"columns": [(title, "---" if digits is None else "---:") for title, _, digits in columns],
            "rows": [[_bench_cell(r.get(key), digits, *((r.get(f"{key}_lo"), r.get(f"{key}_hi"))
                                                        if "[95% CI]" in title else ()))
                      for title, key, digits in columns] for r in rows]}


def render_bench(profile: str = STANDARD, base: Path | None = None) -> str:
    """Markdown for the benchmark-of-record block: per bench JSON of the profile
    (:func:`specrepro.bench.run.bench_files`) its setting and a table, a row per method and a column per quantity the
    file has (:data:`_BENCH_COLUMNS`: speeds, paired speedups over each baseline, α, tokens per step, the cost model's
    predictions, peak memory, greedy equality; 95% intervals over prompts), then a llama.cpp run's limit ladders
    (:func:`specrepro.bench.ladder.ladder_markdown`), the divergences from greedy AR explained and the chat workload's
    categories. An unreadable file is named with its error; in the standard profile the block ends with the bench
    files a target names that the record lacks. Links are relative to ``base``, the directory of the page that holds
    the block (default: the repository root)."""
    from specrepro.bench.ladder import is_llama_run, ladder_markdown
    from specrepro.bench.run import bench_files, refresh_predictions

    paths = bench_files(profile_results(profile))
    if not paths:
        return render_template("bench", kind="none", profile=profile)
    parts = []
    for path in paths:
        link = rel(path, base)
        try:
            data = refresh_predictions(json.loads(read_noted(path)))
            cfg, summary = data["config"], data["summary"]
        except (OSError, ValueError, KeyError) as exc:
            parts.append(render_template("bench", kind="unreadable", link=link, error=exc))
            continue
        greedy = float(cfg.get("temperature") or 0) == 0
        # the run's --gamma reaches only the speculative methods named without "@γ"
        plain = [str(r["method"]) for r in summary if "@" not in str(r["method"]) and r.get("gamma")]
        parts.append(render_template("bench", kind="table", cfg=cfg, greedy=greedy, plain=plain, link=link,
                                     **_bench_table(data, greedy)))
        if is_llama_run(data):  # llama.cpp's cost model with its intervals and each method's limit ladder
            parts.append(ladder_markdown(data))
        if greedy and (explained := _render_divergences(path, summary)):
            parts.append(explained)
        if cfg.get("workload") == "chat" and data.get("runs"):
            parts.append(_render_groups(data["runs"]))
    if profile == STANDARD:  # the record's files a performance target reads that are not measured yet
        from specrepro.bench.targets import PENDING_FILES, TARGETS

        missing = [f for f in dict.fromkeys(t.file for t in TARGETS) if f not in {p.stem for p in paths}]
        if missing:
            parts.append(render_template("bench", kind="missing", missing=missing, pending=PENDING_FILES))
    return "\n".join(parts)


def _render_divergences(bench_path: Path, summary) -> str:
    """Below a greedy bench table whose methods do not all equal greedy AR: the divergences explained, from the
    table ``greedy-equality --from-bench`` wrote beside the file (``divergences_<stem>.csv``), or a line saying that
    no table explains them, or that the table explains another run of the file (its recorded sha256 differs); "" when
    every method equals greedy AR or the table is empty."""
    unequal = [r for r in summary if r.get("greedy_equal_to_ar") is False]
    if not unequal:
        return ""
    table = bench_path.with_name(f"{divergences_name(bench_path)}.csv")
    make = f"`make {rel(table, None)}`"
    if not table.exists():
        across = any(r.get("method") == "ar" for r in summary) and all(
            str(r.get("method")).startswith("llama-") for r in unequal)
        return render_template("divergences", kind="across_backends" if across else "unexplained", make=make)
    prov = read_json(table.with_suffix(".provenance.json")) or {}
    if prov.get("bench_sha256") != sha256_bytes(bench_path.read_bytes()):
        return render_template("divergences", kind="other_run", make=make)
    df = table_at(table)
    if df.empty:
        return ""
    counts = dict(n=len(df), n_ok=int(df["explained"].astype(bool).sum()), prov=prov, table=table.name)
    if "reference" in df.columns:  # a llama.cpp file: per divergence point the methods, passes and each path's gap
        return render_template("divergences", kind="llama", **counts,
                               points=list(df.groupby(["prompt_id", "diverged_at", "ref_token", "other_token"],
                                                      sort=False)),
                               n_order=int(df["order_differs"].astype(bool).sum()) if "order_differs" in df else 0)
    return render_template("divergences", kind="ours", **counts, rows=list(df.itertuples()), gap="gap" in df.columns)


def _render_groups(runs) -> str:
    """Per category of the chat workload: each method's speedup over our AR paired within the category's prompts,
    with its 95% interval, and its tokens per step (:func:`specrepro.bench.run.group_speedups`)."""
    from specrepro.bench.run import group_speedups

    try:
        g = group_speedups(runs)
    except KeyError:
        return render_template("bench", kind="no_ar")
    if g.empty:
        return ""

    speedups = [_bench_cell(r.speedup, 2, r.speedup_lo, r.speedup_hi) for r in g.itertuples()]
    g["cell"] = [x + ("×" if x != "—" else "") + (f"; {tps:.2f}" if math.isfinite(tps) else "")
                 for x, tps in zip(speedups, g["tokens_per_step"])]
    cells = (g.drop_duplicates(["method", "group"]).pivot(index="method", columns="group", values="cell")
             .reindex(index=list(dict.fromkeys(g["method"])), columns=list(dict.fromkeys(g["group"]))).fillna("—"))
    return render_template("bench", kind="groups", cells=cells,
                           n=g.groupby("group", sort=False)["n_prompts"].max().astype(int))


def targets_table(profile: str = STANDARD) -> pd.DataFrame:
    """The performance targets checked against the profile's bench JSON files (the record in the standard
    profile): :func:`specrepro.bench.targets.check_targets`, one row per target with its status and ``why``."""
    from specrepro.bench.targets import check_targets

    return check_targets(profile_results(profile))


def prediction_gaps(profile: str = STANDARD) -> pd.DataFrame:
    """For every bench JSON of the profile that measured a cost model, each fixed-γ chain's measured / predicted
    speedup split into factors (:func:`specrepro.bench.targets.prediction_gap`), with a ``file`` column; empty when
    no bench file has a cost model. Raises json.JSONDecodeError on a corrupt file."""
    from specrepro.bench.run import bench_files
    from specrepro.bench.targets import prediction_gap

    frames = [prediction_gap(json.loads(read_noted(f))).assign(file=f.name)
              for f in bench_files(profile_results(profile))]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def render_targets(profile: str = STANDARD) -> str:
    """Markdown for the performance-targets block: each target of :data:`specrepro.bench.targets.TARGETS` checked on
    the profile's bench files (:func:`targets_table`) with its status, measured ratio [95% CI], method and file."""
    return render_template("targets", rows=targets_table(profile).to_dict(orient="records"))
