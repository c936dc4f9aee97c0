"""The scorecard's rendering: markdown tables, the generated blocks of README.md and docs/*.md, key figures, benchmark
block and the verdict plot.

What this file is: everything that turns a scored card (:func:`specrepro.record.scorecard.score`) and the result files of
a profile into text or images for people: :func:`render_markdown` (the full scorecard with every reason, in its two
groups, for ``scorecard.md``), :func:`render_summary` (the README's short scorecard: two tables, each headed by its
group and its verdict counts), :func:`render_figures` (the README's key figures with their provenance),
:func:`render_bench` (the benchmark-of-record tables), :func:`render_targets` (the performance
targets checked on them), :func:`render_battery` (the exactness battery's power and false alarms), :func:`render_runtimes` (each committed
executed notebook's measured run time),
:func:`write_scorecard` (the ``scorecard`` table and ``scorecard.md``), :func:`replace_block` /
:func:`render_pages` / :func:`update_readme` (each generated block rendered into whichever page - README.md or a
docs/*.md file - holds its markers, atomically, only under ``make reproduce`` unless forced) and :func:`plot_verdicts`.

What it is not: the claims or the verdict rules (:mod:`specrepro.record.scorecard`); nothing here decides a verdict.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from specrepro.files import atomic_write_files, hold_record_lock_for, read_noted, repo_root
from specrepro.record.registry import with_registration
from specrepro.record.results import (
    STANDARD,
    figures_dir,
    record_dir,
    results_dir,
    save_table,
    writes_record,
)
from specrepro.record.scorecard import (
    COMPUTED,
    EXACT,
    GROUPS,
    INCONCLUSIVE,
    JUDGED,
    N_PHRASE,
    NOT_REPRODUCED,
    NOT_RUN,
    NOT_TESTABLE,
    TREND,
    VERDICTS,
    score,
    verdict_definitions,
)

__all__ = ["KEY_FIGURES", "VERDICT_COLORS", "BLOCKS", "README_BLOCKS", "group_counts", "render_markdown",
           "render_summary", "render_figures", "render_bench", "render_targets", "render_battery", "render_runtimes",
           "targets_table",
           "prediction_gaps", "write_scorecard", "replace_block", "block_names", "record_pages", "render_block",
           "render_pages", "update_readme", "plot_verdicts"]

#: the generated blocks, each rendered into whichever page (README.md or docs/*.md) holds its markers
BLOCKS = ("scorecard", "figures", "bench", "targets", "battery", "runtimes", "gpu", "arcost", "llamaaudit")
#: the blocks that must be in README.md itself (its first screen)
README_BLOCKS = ("scorecard", "figures")

#: the figures on the README's front page: (file stem, caption)
KEY_FIGURES = (
    ("fig_exactness_tv_vs_n", "Exactness (notebook 01): TV distance to the target vs samples N. The exact sampler "
                              "falls like 1/√N, the negative controls plateau."),
    ("fig_speedup_vs_gamma_predicted_vs_measured", "Speedup vs γ (notebook 04): Leviathan's constant-c prediction, "
                                                   "the hardware-aware prediction and the measured speedup with its "
                                                   "95% interval, for the draft and its int8 copy, beside the "
                                                   "paper's Table 2 speedups (T5-XXL on a TPU-v4)."),
    ("fig_speedup_limit_ladder", "The limit drawn (notebook 04): per draft and γ, Leviathan's tokens per step, the "
                                 "free-draft bound, the hardware-aware prediction (+ draft cost, + loop overhead) and "
                                 "the measured speedup with its 95% interval."),
    ("fig_tokens_per_step_vs_tree_width", "Token trees (notebook 05): verified tokens per step vs tree width, ours "
                                          "beside SpecInfer's Table 2."),
)

VERDICT_COLORS = {EXACT: "#1b9e77", TREND: "#7fc97f", INCONCLUSIVE: "#fdc086", NOT_REPRODUCED: "#d95f02",
                  COMPUTED: "#80b1d3", NOT_TESTABLE: "#969696", NOT_RUN: "#bdbdbd"}


def _cell(text) -> str:
    s = "" if text is None or (isinstance(text, float) and math.isnan(text)) else str(text)
    return s.replace("|", "\\|").replace("\n", " ")


def _rel(path: Path, base: Path | None) -> str:
    """``path`` as a link from a page in directory ``base`` (default: the repository root); a path outside the
    repository stays absolute."""
    root = repo_root()
    path = Path(path)
    if not path.is_relative_to(root):
        return str(path)
    return Path(os.path.relpath(path, base if base is not None else root)).as_posix()


def _groups(card: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The card's rows by group, in :data:`GROUPS` order (claims order within each), then any other group (a card
    without the column, or rows without a group, form one group named "")."""
    col = card["group"].fillna("").astype(str) if "group" in card else pd.Series("", index=card.index)
    names = [g for g in GROUPS if (col == g).any()] + sorted(set(col) - set(GROUPS))
    return [(g, card[col == g]) for g in names]


def group_counts(rows: pd.DataFrame, group: str = "") -> str:
    """``Performance: 17 claims, 14 judged — 2 reproduced exactly, 10 trend reproduced; not judged: 1 computed, 1 not
    testable here``: the number of claims, how many a verdict of :data:`specrepro.record.scorecard.JUDGED` judged
    and the count of each verdict with at least one claim, in :data:`VERDICTS` order (the judged ones, then the
    others after "not judged"); without a group name it starts at the number of claims."""
    counts = rows["verdict"].value_counts()
    n = rows["id"].nunique()
    judged = int(sum(counts.get(v, 0) for v in JUDGED))
    said = ", ".join(f"{int(counts[v])} {v}" for v in JUDGED if counts.get(v, 0))
    other = ", ".join(f"{int(counts[v])} {v}" for v in VERDICTS if v not in JUDGED and counts.get(v, 0))
    head = f"{group.capitalize()}: " if group else ""
    return (f"{head}{n} claim{'s' if n != 1 else ''}, {judged} judged — {said or 'none'}"
            + (f"; not judged: {other}" if other else ""))


def _card_head(card: pd.DataFrame, profile: str) -> str:
    counts = card["verdict"].value_counts()
    summary = " · ".join(f"{int(counts.get(v, 0))} {v}" for v in VERDICTS)
    head = f"{card['id'].nunique()} distinct claims, one per statement of a paper: {summary}"
    reg = card.get("registered", pd.Series(dtype=str)).fillna("").astype(str)
    if reg.str.len().gt(0).any():
        head += (f"; {int(reg.str.startswith('before').sum())} judged by a rule registered before its data, "
                 f"{int(reg.str.startswith('after').sum())} after it (data/claims_registry.csv)")
    return head


def _definitions_note() -> str:
    return ("Verdicts, as `specrepro/record/verdicts.py` defines them (`VERDICT_DEFINITIONS`, rendered from the same "
            "clauses the rules evaluate):\n\n" + verdict_definitions())


def render_markdown(card: pd.DataFrame, profile: str | None = None) -> str:
    """The full scorecard (``scorecard.md``): a line naming the profile, each machine with the number of claims
    measured on it, the commits, the number of distinct claims (one per statement of a paper) and the count of each
    verdict; then one table per group (correctness, performance), each headed by its group and its verdict counts.

    Each row: paper, location and arXiv version; the claim with the paper's setting; the paper's number with its
    kind (measured / computed / asserted); ours with its 95% interval and n, and our setting; the verdict; why.
    """
    profile = profile or next((p for p in card["profile"] if p), STANDARD)
    hw = card.loc[card["hardware"].fillna("").astype(str) != "", "hardware"].value_counts()
    commits = sorted({c for c in card["commit"] if c})
    machines = "; ".join(f"{h} ({n} claim{'s' if n > 1 else ''})" for h, n in hw.items())
    head = f"Profile **{profile}**" + (f" on {machines}" if machines else "")
    if commits:
        head += f", tables from commit{'s' if len(commits) > 1 else ''} " + ", ".join(f"`{c}`" for c in commits)
    head += (f". {_card_head(card, profile)}. Intervals are 95%; each row names how its interval is computed "
             f"(most are percentile bootstraps over prompts or problems).")
    lines = [head, "", _definitions_note().rstrip("\n")]
    for group, rows in _groups(card):
        lines += ["", f"### {group_counts(rows, group or 'ungrouped')}", "",
                  "| paper · where | claim (the paper's setting) | paper | ours (our setting) | verdict | why |",
                  "|---|---|---|---|---|---|"]
        for _, r in rows.iterrows():
            where = f"{r['paper']} · {r['source']}" + (f" (arXiv {r['arxiv']})" if r.get("arxiv") else "")
            claim = _cell(r["claim"]) + (f"<br><sub>{_cell(r['setting'])}</sub>" if r["setting"] else "")
            kind = " · ".join(x for x in (str(r.get("paper_kind") or ""),
                                          f"margin {r['margin']}" if r.get("margin") else "") if x)
            paper = _cell(r["paper_value"]) + (f"<br><sub>{_cell(kind)}</sub>" if kind else "")
            ours = _cell(r["ours"]) or "—"
            if r["ours"] and r["our_setting"]:
                ran = "; ".join(x for x in (f"ran on {r['hardware']}" if r.get("hardware") else "",
                                            f"tables of commit {r['commit']}" if r.get("commit") else "") if x)
                ours += f"<br><sub>{_cell(r['our_setting'])}" + (f"; {_cell(ran)}" if ran else "") + "</sub>"
            if r.get("interval"):
                ours += f"<br><sub>interval: {_cell(r['interval'])}</sub>"
            why = _cell(r["reason"]) + (f"<br><sub>{_cell(r['stability'])}</sub>" if r.get("stability") else "")
            if r.get("registered"):
                why += f"<br><sub>rule {_cell(r['registered'])}</sub>"
            lines.append("| " + " | ".join((_cell(where), claim, paper, ours, f"**{r['verdict']}**", why)) + " |")
    return "\n".join(lines) + "\n"


_N_REMOVE = (re.compile(r"\s*\(n = [^()]*\)"),
             re.compile(r"[,;]?\s*\bn = [\d,]+(?:[-–][\d,]+)?(?: [A-Za-z]+)*(?: × \d+ passes)?"))
#: the longest "ours" cell of the summary; a longer one is cut at its last "; " (else ", ") before this length
SUMMARY_OURS_CHARS = 150


def _short_ours(r) -> tuple[str, str]:
    """Our number for the summary (its interval kept, its "n = ..." phrases moved to the n column, cut to
    :data:`SUMMARY_OURS_CHARS`) and the n cell (the first "n = ..." phrase, else the card's n and its unit)."""
    text = "" if r.get("ours") is None or (isinstance(r["ours"], float) and math.isnan(r["ours"])) else str(r["ours"])
    m = N_PHRASE.search(text)
    n_val = r.get("n")
    if m:
        n_cell = " ".join(g for g in m.groups() if g)
    elif n_val is not None and not (isinstance(n_val, float) and math.isnan(n_val)) and str(n_val) != "":
        unit = r.get("n_unit")
        unit = "" if unit is None or (isinstance(unit, float) and math.isnan(unit)) else str(unit)
        n_cell = f"{int(float(n_val))} {unit}".strip()
    else:
        n_cell = "—"
    for pattern in _N_REMOVE:
        text = pattern.sub("", text)
    text = re.sub(r"\s+", " ", text).strip(" ,;")
    if len(text) > SUMMARY_OURS_CHARS:
        cut = text.rfind("; ", 0, SUMMARY_OURS_CHARS)
        cut = cut if cut > 0 else text.rfind(", ", 0, SUMMARY_OURS_CHARS)
        text = (text[:cut] if cut > 0 else text[:SUMMARY_OURS_CHARS]).rstrip() + " …"
    return text or "—", n_cell


def _bf16_note(cfg: dict) -> str:
    """" (emulated: ...)" after a bfloat16 CPU run's dtype when the CPU had no bfloat16 instructions, " (native)" when
    it had them; nothing for other dtypes, devices, or runs that did not record it (``cpu_bf16``)."""
    if cfg.get("dtype") != "bfloat16" or cfg.get("cpu_bf16") is None:
        return ""
    return " (native: AVX-512 BF16 or AMX)" if cfg["cpu_bf16"] else " (emulated: this CPU has no AVX-512 BF16 or AMX)"


def _dirty(r) -> bool:
    """Whether a scorecard row's table names a commit whose code differed from the tree (``...-dirty``)."""
    return str(r.get("commit") or "").endswith("-dirty")


def _paper_short(paper: str) -> str:
    """"Leviathan et al. 2023" -> "Leviathan 2023"; "SpecInfer (Miao et al. 2024)" -> "SpecInfer 2024"."""
    year = re.search(r"(\d{4})", paper)
    return f"{paper.split()[0]} {year.group(1)}" if year and paper else paper


def render_summary(card: pd.DataFrame, profile: str | None = None, base: Path | None = None) -> str:
    """The README's scorecard: the number of distinct claims and of each verdict, where the full card is, then one
    short table per group (claim | paper | ours [95% CI] | n | verdict), each headed by its group and its verdict
    counts (:func:`group_counts`). The settings, hardware, commits and every reason stay in ``scorecard.md``
    (:func:`render_markdown`), linked relative to ``base``, the directory of the page that holds the block."""
    profile = profile or next((p for p in card["profile"] if p), STANDARD)
    full = (record_dir("results") if profile == STANDARD else results_dir(profile)) / "scorecard.md"
    link = _rel(full, base)
    lines = [f"Profile **{profile}**: {_card_head(card, profile)}. Each claim's setting, ours, the hardware and "
             f"commit of the table that measured it and the reason for its verdict: [`{link}`]({link}) "
             f"(and `scorecard.csv` beside it). Intervals are 95%; most are percentile bootstraps over prompts (or "
             f"problems), and the full card names each row's method.",
             "", _definitions_note().rstrip("\n")]
    for group, rows in _groups(card):
        lines += ["", f"**{group_counts(rows, group or 'ungrouped')}**", "",
                  "| claim | paper | ours [95% CI] | n | verdict |", "|---|---|---|---|---|"]
        for _, r in rows.iterrows():
            ours, n_cell = _short_ours(r)
            claim = f"{_cell(r['claim'])} <sub>{_cell(_paper_short(str(r['paper'])))} · `{_cell(r['id'])}`</sub>"
            marks = (" · unstable" if r.get("stability") else "") + (" · uncommitted code" if _dirty(r) else "")
            lines.append("| " + " | ".join((claim, _cell(r["paper_value"]), _cell(ours), _cell(n_cell),
                                             f"**{r['verdict']}**" + marks)) + " |")
    if card.get("stability", pd.Series(dtype=str)).astype(bool).any():
        lines += ["", "*unstable*: the verdict history (`verdict_stability.csv`) read another verdict from other evidence "
                      "(another committed version of the claim's tables, or of its rule); both readings are in the full card."]
    if any(_dirty(r) for _, r in card.iterrows()):
        lines += ["", "*uncommitted code*: the table behind the row was written from a working tree whose code "
                      "differed from its commit (the card's commit ends in `-dirty`), so no commit holds the exact "
                      "code that measured it; its notebook's next standard run replaces it."]
    return "\n".join(lines) + "\n"


def render_figures(profile: str = STANDARD, base: Path | None = None) -> str:
    """Markdown for the README's key figures: each image with its caption and the commit, profile and device of the
    run that drew it (from its provenance sidecar), or a note that ``make reproduce`` has not drawn it yet; links
    relative to ``base``, the directory of the page that holds the block (default: the repository root)."""
    # the README shows the committed record for the standard profile, whoever renders it
    fdir = record_dir("figures") if profile == STANDARD else figures_dir(profile)
    rel = _rel(fdir, base)
    parts = []
    for stem, caption in KEY_FIGURES:
        prov_path = fdir / f"{stem}.provenance.json"
        if (fdir / f"{stem}.png").exists() and prov_path.exists():
            prov = json.loads(prov_path.read_text())
            origin = (f"commit `{prov.get('commit', '?')}`, profile {prov.get('profile', profile)}, "
                      f"{prov.get('device', '?')}, {prov.get('date', '?')}")
        else:
            origin = f"not drawn yet for profile {profile}: `make reproduce` writes it"
        parts.append(f"![{caption}]({rel}/{stem}.png)\n\n*{caption}* [PDF]({rel}/{stem}.pdf); {origin}.\n")
    return "\n".join(parts)


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

    rdir = record_dir("results") if profile == STANDARD else results_dir(profile)
    paths = bench_files(rdir)
    if not paths:
        return f"No benchmark results for profile {profile} yet: `make reproduce PROFILE={profile}` writes them.\n"
    parts = []
    for path in paths:
        rel = _rel(path, base)
        try:
            data = refresh_predictions(json.loads(read_noted(path)))
            cfg, summary = data["config"], data["summary"]
        except (OSError, ValueError, KeyError) as exc:
            parts.append(f"`{rel}`: unreadable ({exc}).\n")
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
                + f" · [`{rel}`]({rel})")
        # transformers baselines beyond hf-assisted get a column only where the file has them
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
        predicted = any(r.get("predicted_speedup") is not None for r in summary)
        prefill = any(r.get("predicted_speedup_with_prefill") is not None for r in summary)
        in_run = any(r.get("predicted_speedup_in_run") is not None for r in summary)
        memory = any(_fin_number(r.get("peak_rss_mb")) for r in summary)
        pred_head = ((" draft ms per drafted token (cost model) | predicted × AR (hardware-aware" + (", loop / with the prefill" if prefill else "")
                      + ") | free-draft bound | measured / predicted |"
                      + (" predicted from the run's own costs | measured / that |" if in_run else ""))
                     if predicted else "")
        lines = [head, "", "| method | tokens/s | ms/token | × our AR [95% CI] | × HF assisted [95% CI] |"
                 + "".join(f" {title} |" for _, title in extra) + " α [95% CI] | tokens/step [95% CI] | per-position acceptance |"
                 + pred_head + (" peak resident GB |" if memory else "") + (" equal to greedy AR |" if greedy else "")
                 + "".join(f" equal to greedy {b} |" for b in llama_eq),
                 "|---|---:|---:|---:|---:|" + "---:|" * len(extra) + "---:|---:|---|"
                 + ("---:|" * (6 if in_run else 4) if predicted else "") + ("---:|" if memory else "")
                 + ("---|" if greedy else "") + "---|" * len(llama_eq)]
        for r in summary:
            row = [f"`{r['method']}`" + ("" if r.get("exact", True) else " (not exact)"),
                   _bench_cell(r.get("tokens_per_s")), _bench_cell(r.get("ms_per_token"), 0),
                   _ratio_cell(r, "speedup_vs_ar"), _ratio_cell(r, "speedup_vs_hf_assisted"),
                   *[_ratio_cell(r, key) for key, _ in extra],
                   _ratio_cell(r, "alpha"), _ratio_cell(r, "tokens_per_step"),
                   _bench_cell(r.get("per_position_acceptance"))]
            if predicted:
                pred = _bench_cell(r.get("predicted_speedup"))
                if prefill and r.get("predicted_speedup_with_prefill") is not None:
                    pred += " / " + _bench_cell(r.get("predicted_speedup_with_prefill"))
                row += [_bench_cell(r.get("draft_ms_per_token"), 1), pred, _bench_cell(r.get("free_draft_bound")),
                        _bench_cell(r.get("measured_over_predicted"))]
                if in_run:
                    row += [_bench_cell(r.get("predicted_speedup_in_run")),
                            _bench_cell(r.get("measured_over_predicted_in_run"))]
            if memory:  # the largest resident high-water mark of the method's calls (MiB in the JSON), 10^9 bytes
                row.append(_bench_cell(r["peak_rss_mb"] * 2**20 / 1e9, 1) if _fin_number(r.get("peak_rss_mb"))
                           else "—")
            if greedy:
                row.append(r.get("equal_to_ar_runs") or _bench_cell(r.get("greedy_equal_to_ar")))
            for b in llama_eq:
                key = b.replace("-", "_")
                row.append(r.get(f"equal_to_{key}_runs") or _bench_cell(r.get(f"greedy_equal_to_{key}")))
            lines.append("| " + " | ".join(row) + " |")
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


def _bench_dir(profile: str) -> Path:
    return record_dir("results") if profile == STANDARD else results_dir(profile)


def targets_table(profile: str = STANDARD) -> pd.DataFrame:
    """The performance targets checked against the profile's bench JSON files (the record in the standard
    profile): :func:`specrepro.bench.targets.check_targets`, one row per target with its status and ``why``."""
    from specrepro.bench.targets import check_targets

    return check_targets(_bench_dir(profile))


def prediction_gaps(profile: str = STANDARD) -> pd.DataFrame:
    """For every bench JSON of the profile that measured a cost model, each fixed-γ chain's measured / predicted
    speedup split into factors (:func:`specrepro.bench.targets.prediction_gap`), with a ``file`` column; empty when
    no bench file has a cost model. Raises json.JSONDecodeError on a corrupt file."""
    from specrepro.bench.targets import prediction_gap

    frames = [prediction_gap(json.loads(read_noted(f))).assign(file=f.name)
              for f in bench_files(_bench_dir(profile))]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def render_targets(profile: str = STANDARD) -> str:
    """Markdown for the README's performance-targets block: each target of
    :data:`specrepro.bench.targets.TARGETS`  checked against the profile's bench JSON files
    (:func:`specrepro.bench.targets.check_targets`): status, the measured ratio with its 95% interval over prompts,
    the method (best of several by the median, said so), the prompts and the file."""
    table = targets_table(profile)
    counts = table["status"].value_counts()
    head = (f"{len(table)} targets: " + " · ".join(f"{int(counts.get(s, 0))} {s}" for s in
                                                  ("met", "met on the median", "missed", "not run")) + ". "
            "**met**: the whole 95% interval over prompts clears the target; **met on the median**: the median does, "
            "the interval does not rule out a miss; a prediction ratio has no interval, so it is judged on the median.")
    lines = [head, "", "| target | status | measured [95% CI] | method | prompts | bench file |",
             "|---|---|---|---|---:|---|"]
    for r in table.to_dict(orient="records"):
        n = r["n_prompts"]
        status = r["status"] if r["status"] != "missed" else "**missed**"
        lines.append(f"| {_cell(r['target'])} | {status} | {_cell(r['measured'])} | {_cell(r['method'])} | "
                     f"{'' if n is None or n != n else int(n)} | `{r['file']}.json` |")
    why = [r for r in table.to_dict(orient="records") if r.get("why")]
    if why:
        lines += ["", "Why, for each target not clearly met (from the run's cost model and step timings; "
                  "`specrepro.bench.targets.prediction_gap`, notebook 08):", ""]
        lines += [f"- *{r['target']}*: {r['why']}" for r in why]
    return "\n".join(lines) + "\n"


def write_scorecard(profile: str = STANDARD, device: str = "cpu", claims: pd.DataFrame | None = None) -> pd.DataFrame:
    """Score every claim for ``profile`` (:func:`specrepro.record.scorecard.score`), save it as the ``scorecard`` table (CSV
    + provenance) and its markdown as ``scorecard.md`` beside it; returns the scorecard."""
    card = with_registration(score(profile, claims))
    save_table(card, "scorecard", profile=profile, device=device,
               companions={"scorecard.md": render_markdown(card, profile)})
    return card


def replace_block(text: str, name: str, content: str) -> str:
    """Replace what lies between ``<!-- name:start -->`` and ``<!-- name:end -->`` in ``text`` with ``content``.

    Raises:
        ValueError: the markers are missing, repeated or out of order.
    """
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ValueError(f"expected one {start} before one {end}")
    before, rest = text.split(start)
    _, after = rest.split(end)
    return f"{before}{start}\n{content.strip()}\n{end}{after}"


_START = re.compile(r"<!-- ([A-Za-z0-9_-]+):start -->")


def block_names(text: str) -> list[str]:
    """The generated blocks whose start markers ``text`` holds, in order (a repeated one as often as it appears)."""
    return _START.findall(text)


def record_pages(readme: str | Path | None = None) -> list[Path]:
    """The pages that may hold generated blocks: README.md (``readme``, default the repository's) first, then the
    ``docs/*.md`` files beside it, sorted."""
    path = Path(readme) if readme is not None else repo_root() / "README.md"
    return [path, *sorted((path.parent / "docs").glob("*.md"))]


def render_block(name: str, profile: str = STANDARD, card: pd.DataFrame | None = None,
                 base: Path | None = None) -> str:
    """The content of generated block ``name`` (:data:`BLOCKS`) for ``profile``, with links relative to ``base`` (the
    directory of the page that holds it).

    Raises:
        ValueError: ``name`` is not a generated block.
    """
    if name == "scorecard":
        return render_summary(with_registration(score(profile)) if card is None else card, profile, base)
    if name == "figures":
        return render_figures(profile, base)
    if name == "bench":
        return render_bench(profile, base)
    if name == "targets":
        return render_targets(profile)
    if name == "battery":
        return render_battery(profile)
    if name == "runtimes":
        return render_runtimes()
    if name == "gpu":
        return render_gpu(profile)
    if name == "arcost":
        return render_ar_cost(profile)
    if name == "llamaaudit":
        return render_llama_audit(profile)
    raise ValueError(f"unknown generated block {name!r}; known: {list(BLOCKS)}")


def ar_cost_table(profile: str = STANDARD) -> pd.DataFrame:
    """Our AR baseline's cost in every bench file of ``profile`` beside what the same file measured of the machine:
    one row per file with the CPU and dtype it ran on, AR's ms per token (median over prompts of each prompt's
    median over passes, 95% bootstrap interval over prompts, n prompts), AR's target forward per step inside those
    runs (ms, the same statistic), the cost model's one-token target forward measured before and after the timed
    passes (ms; the mean of its rounds, as the file records it), and how many (pass, prompt) blocks ran under load
    where the file records it. Files without a cost model give NaN there."""
    from specrepro.stats import bootstrap_ci

    rdir = record_dir("results") if profile == STANDARD else results_dir(profile)
    rows = []
    for path in bench_files(rdir):
        data = json.loads(read_noted(path))
        cfg, runs = data.get("config") or {}, pd.DataFrame(data.get("runs") or [])
        if runs.empty or "method" not in runs:
            continue
        ar = runs[runs["method"] == "ar"]
        if ar.empty:
            continue
        per_prompt = ar.groupby("prompt")[["ms_per_token", "target_ms"]].median()
        ms, ms_lo, ms_hi = bootstrap_ci(per_prompt["ms_per_token"].to_numpy(float))
        fwd, fwd_lo, fwd_hi = bootstrap_ci(per_prompt["target_ms"].to_numpy(float))
        cm = cfg.get("cost_model") or {}
        before = ((cm.get("before") or {}).get("target_ms") or {}).get("1")
        after = ((cm.get("after") or {}).get("target_ms") or {}).get("1")
        rows.append({"file": path.name, "cpu": cfg.get("cpu") or "not recorded", "dtype": cfg.get("dtype", ""),
                     "threads": cfg.get("torch_threads"), "n_prompts": int(len(per_prompt)),
                     "ar_ms_per_token": ms, "ar_ms_lo": ms_lo, "ar_ms_hi": ms_hi,
                     "ar_forward_ms": fwd, "ar_forward_lo": fwd_lo, "ar_forward_hi": fwd_hi,
                     "t1_before_ms": float(before) if before is not None else math.nan,
                     "t1_after_ms": float(after) if after is not None else math.nan,
                     "blocks_under_load": cfg.get("blocks_under_load"), "blocks": cfg.get("blocks")})
    return pd.DataFrame(rows)


def render_llama_audit(profile: str = STANDARD) -> str:
    """Markdown for the ``llamaaudit`` block (docs/battery.md): the table ``audit_llamacpp`` (``python -m specrepro
    audit --runtime llama.cpp``), one row per setting and sampler with its role, n, the TV to the exact law, the
    chi-square and G-test p-values, the TV detected with 90% power at that n, the verdict at the table's level, and
    the acceptance rates (llama.cpp's as its program reports it, ours on the same pair); a missing table is named."""
    rdir = record_dir("results") if profile == STANDARD else results_dir(profile)
    path = rdir / "audit_llamacpp.csv"
    if not path.exists():
        return ("No llama.cpp audit in the record yet: `make data/results/audit_llamacpp.csv` builds llama.cpp's "
                "speculative programs and runs it.\n")
    df = pd.read_csv(io.BytesIO(read_noted(path)))

    def num(x, fmt):
        return format(float(x), fmt) if pd.notna(x) and math.isfinite(float(x)) else "—"

    lines = [f"{_provenance_note(path)}; level {num(df['level'].iloc[0], 'g')}; llama.cpp of llama-cpp-python "
             f"{df['llama_cpp_python'].iloc[0]}; prompt ids of `{df['prompt'].iloc[0]}`, {int(df['length'].iloc[0])} "
             f"tokens, γ = {int(df['gamma'].iloc[0])}.", "",
             "| setting | sampler | role | n | TV (an exact sampler's mean at this n) | p (χ²) | p (G) | "
             "TV detected at 90% power | verdict | acceptance: llama.cpp / ours |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in df.itertuples():
        acc = f"{num(r.llamacpp_accept_rate, '.2f')} / {num(r.specrepro_accept_rate, '.2f')}"
        null = getattr(r, "tv_null_mean", float("nan"))
        tv = num(r.tv, '.3f') + (f" ({num(null, '.3f')})" if pd.notna(null) else "")
        lines.append(f"| {r.setting} | `{r.implementation}` | {r.role} | {int(r.n)} | {tv} | "
                     f"{num(r.p_value, '.2g')} | {num(r.g_test_p, '.2g')} | {num(r.min_detectable_tv_90, '.3f')} | "
                     f"**{r.verdict}** | {acc} |")
    lines += ["", "The empirical TV of an exact sampler does not fall to 0 at finite n (its mean is in brackets: many "
              "outcomes, few samples each); the verdict is the test's, at the stated level, whose power is the "
              "TV column beside it (the smallest tilt away from the exact law it detects 90% of the time)."]
    return "\n".join(lines) + "\n"


def render_ar_cost(profile: str = STANDARD) -> str:
    """Markdown for the ``arcost`` block (docs/cost-model.md): :func:`ar_cost_table`, one row per bench file."""
    df = ar_cost_table(profile)
    if df.empty:
        return f"No bench file for profile {profile} yet.\n"

    def ci(est, lo, hi):
        if not math.isfinite(est):
            return "—"
        return f"{est:.0f} [{lo:.0f}, {hi:.0f}]" if math.isfinite(lo) else f"{est:.0f}"

    def num(x):
        return f"{x:.0f}" if isinstance(x, (int, float)) and math.isfinite(x) else "—"

    lines = ["| bench file | CPU | dtype | n prompts | AR ms per token | AR target forward per step, ms | "
             "cost model t(1) before / after, ms | blocks under load |", "|---|---|---|---|---|---|---|---|"]
    for r in df.itertuples():
        load = (f"{int(r.blocks_under_load)} of {int(r.blocks)}" if r.blocks is not None and r.blocks == r.blocks
                else "not recorded")
        lines.append(f"| `{r.file}` | {_cell(r.cpu)} | {r.dtype} | {r.n_prompts} | "
                     f"{ci(r.ar_ms_per_token, r.ar_ms_lo, r.ar_ms_hi)} | "
                     f"{ci(r.ar_forward_ms, r.ar_forward_lo, r.ar_forward_hi)} | "
                     f"{num(r.t1_before_ms)} / {num(r.t1_after_ms)} | {load} |")
    return ("Our AR baseline in each bench file of record, beside what the same file measured of its machine "
            "(medians over prompts with 95% bootstrap intervals over prompts; the cost model's forward is the mean "
            "of its rounds, before and after the timed passes, on a prefix of the file's prompt length; "
            "`ar_cost_table` in `specrepro/record/report.py`):\n\n" + "\n".join(lines) + "\n")


def render_pages(profile: str = STANDARD, card: pd.DataFrame | None = None,
                 pages: list[Path] | None = None) -> dict[Path, tuple[str, str]]:
    """Every page's text as it is and as rendered: ``{path: (old, new)}`` for each of ``pages`` (default
    :func:`record_pages`), each generated block rendered into the page that holds its markers. Writes nothing.

    Raises:
        ValueError: README.md (the first page) lacks the markers of a block of :data:`README_BLOCKS`, a block's
            markers are missing, repeated or out of order, a block appears on two pages, or a page names a block
            that is not in :data:`BLOCKS`.
    """
    pages = [Path(p) for p in (record_pages() if pages is None else pages)]
    texts = {p: p.read_text() for p in pages}
    home: dict[str, Path] = {}
    for p, text in texts.items():
        for name in block_names(text):
            if name not in BLOCKS:
                raise ValueError(f"{p.name}: unknown generated block {name!r}; known: {list(BLOCKS)}")
            if home.setdefault(name, p) != p:
                raise ValueError(f"the {name} block is in both {home[name].name} and {p.name}")
    for name in README_BLOCKS:
        if home.get(name) != pages[0]:
            raise ValueError(f"expected one <!-- {name}:start --> before one <!-- {name}:end --> in {pages[0].name}")
    if "scorecard" in home and card is None:
        card = with_registration(score(profile))
    out = {}
    for p, old in texts.items():
        new = old
        for name in dict.fromkeys(block_names(old)):
            new = replace_block(new, name, render_block(name, profile, card, p.parent))
        out[p] = (old, new)
    return out


def update_readme(profile: str = STANDARD, card: pd.DataFrame | None = None, readme: str | Path | None = None,
                  force: bool = False) -> bool:
    """Rewrite every generated block (:data:`BLOCKS`) in whichever page holds its markers - README.md (``readme``)
    or a docs/*.md file beside it (:func:`render_pages`) - from ``card`` (default:
    :func:`specrepro.record.scorecard.score`) and the result files and figures of ``profile``; the changed pages are
    written in one step (:func:`specrepro.files.atomic_write_files`). Returns True if any page changed.

    Only ``make reproduce`` (and ``make scorecard``) rewrites the pages (:func:`specrepro.record.results.writes_record`:
    the standard profile with ``SPECREPRO_RECORD=1``; an interactive run or the quick profile in CI must not), unless
    ``force``.

    Raises:
        ValueError: README.md lacks the scorecard or figures markers, or a block is misplaced (:func:`render_pages`).
    """
    if not writes_record(profile) and not force:
        return False
    hold_record_lock_for(repo_root() / "README.md")
    pages = render_pages(profile, card, record_pages(readme))
    changed = {p: new.encode() for p, (old, new) in pages.items() if new != old}
    if not changed:
        return False
    atomic_write_files(changed)
    return True


def render_battery(profile: str = STANDARD) -> str:
    """Markdown for the README's exactness-battery block, from notebook 01's tables of ``profile`` (the committed
    record for the standard profile): each goodness-of-fit test's measured false-alarm rate (with its binomial
    standard error, over the null experiments) and the smallest TV deviation it detects with 90% power, and the
    published-bug registry's count of negative controls caught and look-alikes passed. A missing table is named."""
    rdir = record_dir("results") if profile == STANDARD else results_dir(profile)
    parts = []
    power_path, bugs_path = rdir / "exactness_power_false_alarm.csv", rdir / "exactness_bug_registry.csv"
    if power_path.exists():
        power = pd.read_csv(io.BytesIO(read_noted(power_path)))
        prov = _provenance_note(power_path)
        ok = int(power["within_level"].astype(bool).sum())
        parts.append(f"Goodness-of-fit tests of the battery ({len(power)}; {prov}): {ok}/{len(power)} at or under "
                     f"their level (+3 binomial s.e.).\n")
        lines = ["| test | n | level | false alarms (± s.e.) | smallest TV detected (90% power) |",
                 "|---|---|---|---|---|"]
        for r in power.itertuples():
            tv = f"{r.min_tv_detected_90:.3f}" if math.isfinite(r.min_tv_detected_90) else "—"
            lines.append(f"| {_cell(r.test)} | {int(r.n)} | {r.level:g} | {r.false_alarm:.2%} ± {r.false_alarm_se:.2%} "
                         f"| {tv} |")
        parts.append("\n".join(lines) + "\n")
        if not power["min_tv_detected_90"].map(math.isfinite).all():
            parts.append("— : even the largest deviation along the tested direction (a random tilt of the exact "
                         "distribution) is detected less than 90% of the time at this n (few, nearly deterministic "
                         "outcomes); those controls are caught by their own larger deviation or by exact "
                         "enumeration.\n")
    else:
        parts.append(f"No power / false-alarm table for profile {profile} yet: notebook 01 writes "
                     f"`exactness_power_false_alarm`.\n")
    if bugs_path.exists():
        bugs = pd.read_csv(io.BytesIO(read_noted(bugs_path)))
        neg, pos = bugs[bugs["negative"].astype(bool)], bugs[~bugs["negative"].astype(bool)]
        cited = int((neg["thread"].astype(str) != "(not tied to a thread)").sum())
        parts.append(f"Published bugs replayed through the decoding loop (`specrepro.sim.controls`): "
                     f"**{int(neg['detected'].astype(bool).sum())}/{len(neg)} negative controls caught** ({cited} with "
                     f"a cited thread), {int((~pos['detected'].astype(bool)).sum())}/{len(pos)} look-alike positive "
                     f"controls passed as exact.\n")
    return "\n".join(parts)


#: the committed executed notebooks whose run times the ``runtimes`` block lists (nbval's quick references are not a
#: record of run time: they run two kernels at once in CI)
RUNTIME_PROFILES = ("standard", "humaneval164")
#: the notebook that renders the generated blocks (its run time cannot be in them)
SCORECARD_NOTEBOOK = "08_scorecard"


def render_runtimes(executed: Path | None = None, sources: Path | None = None) -> str:
    """Markdown for the ``runtimes`` block of docs/profiles.md: for each committed executed notebook of
    :data:`RUNTIME_PROFILES` (under ``executed``, default ``notebooks/executed/``), the wall-clock run time in minutes
    that its run stamped into it (:func:`specrepro.record.nbrun.stamp_run`), with the commit, CPU and date of that run.
    A notebook executed before run times were stamped says so instead of giving a number. The last column says
    whether the executed notebook's code is its source's today (``sources``, default ``notebooks/``;
    :func:`specrepro.record.nbrun.code_drift`), and which code cells changed since it ran."""
    from specrepro.record.nbrun import code_drift, run_facts

    root = Path(executed) if executed is not None else repo_root() / "notebooks" / "executed"
    sources = Path(sources) if sources is not None else repo_root() / "notebooks"
    lines = ["| notebook | profile | run time (min) | commit | CPU | date | code as in `notebooks/` today |",
             "|---|---|---|---|---|---|---|"]
    missing = stale = 0
    for prof in RUNTIME_PROFILES:
        for nb in sorted((root / prof).glob("[0-9][0-9]_*.ipynb")):
            if nb.name.endswith(".partial.ipynb") or nb.stem == SCORECARD_NOTEBOOK:
                continue
            src = sources / nb.name
            drift = code_drift(src, nb) if src.is_file() else None
            stale += bool(drift)
            same = ("no source" if drift is None else "yes" if not drift else
                    f"**no**: code cell{'s' if len(drift) > 1 else ''} {', '.join(map(str, drift))} changed since")
            run = run_facts(nb)
            if run is None:
                missing += 1
                lines.append(f"| `{nb.stem}` | {prof} | not recorded | | | | {same} |")
            else:
                lines.append(f"| `{nb.stem}` | {run.get('profile', prof)} | {float(run['minutes']):.1f} | "
                             f"`{run.get('commit', '?')}` | {_cell(run.get('cpu', '?'))} | {run.get('date', '?')} | "
                             f"{same} |")
    note = ("Wall-clock minutes of each committed executed notebook's own run, stamped into the notebook by the run "
            "(`specrepro.record.nbrun`); a notebook whose tables were reused from an earlier run (resumed) took less "
            "than a run from scratch. On a shared machine a run beside another CPU-heavy job takes several times "
            f"longer. `{SCORECARD_NOTEBOOK}` is not listed: it renders this table, so its own run ends after the table "
            "is written (it only reads the other notebooks' tables).")
    if missing:
        note += (f" {missing} notebook(s) were executed before run times were stamped: \"not recorded\" until "
                 "their next standard run.")
    note += (" The last column compares each executed notebook's code cells with its source in `notebooks/`: "
             + (f"{stale} executed notebook(s) show code that their source has since changed; their outputs are "
                "those of the older code until their next run." if stale else "every one shows its source's code."))
    return note + "\n\n" + "\n".join(lines) + "\n"


#: the draft method of the bench of record whose α the GPU block's predictions take (the draft in its own dtype)
GPU_ALPHA_METHOD = "sd-draft@4"


def gpu_dir() -> Path:
    """``data/gpu``: measurements made on a lent GPU (not by ``make reproduce``), each file naming its device,
    commit and versions."""
    return repo_root() / "data" / "gpu"


def gpu_files(gdir: Path, prefix: str) -> list[Path]:
    """The measurement files ``<prefix>*.json`` under ``gdir`` (their provenance sidecars left out), sorted."""
    return sorted(p for p in Path(gdir).glob(f"{prefix}*.json") if not p.name.endswith(".provenance.json"))


def write_gpu_sidecars(gdir: Path | None = None) -> list[Path]:
    """Give each measurement under ``data/gpu`` the provenance sidecar every table of the record has,
    ``<name>.provenance.json``: the run's commit, date, device and library versions (read from the file itself) and
    the sha256 of the file and of its companion log (``test_cuda_<gpu>.log``; ``run_<gpu>.log`` for
    ``cost_curves_<gpu>.json``), so that ``record_hash_mismatches`` checks them too. A sidecar already recording
    the same bytes is left as it is. Returns the sidecars written.

    Raises:
        ValueError: a measurement file that names no commit.
    """
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
            files = [path] + ([log] if log.exists() else [])
            prov = {k: meta.get(k) for k in ("commit", "date", "torch", "transformers") if meta.get(k) is not None}
            prov["device"] = meta.get("device_description") or meta.get("device")
            prov["what"] = ("measured on a lent GPU outside make reproduce (see docs/gpu.md); the log is the run's "
                            "own output")
            prov["sha256"] = {f.name: sha256_bytes(f.read_bytes()) for f in files}
            side = path.with_name(f"{path.stem}.provenance.json")
            text = json.dumps(prov, indent=1, sort_keys=True) + "\n"
            if not side.exists() or side.read_text() != text:
                atomic_write_text(side, text)
                written.append(side)
    return written


def render_gpu(profile: str = STANDARD, gdir: Path | None = None) -> str:
    """Markdown for the ``gpu`` block of docs/gpu.md, from the files under :func:`gpu_dir`:

    * each ``cost_curves_*.json`` of ``python -m specrepro cost-curves`` (a target and a draft architecture): t(n) in
      ms per cache mode (eager dynamic cache, static cache, CUDA graphs), with the median's 95% interval where the
      file has one (files written before the command kept per-round spreads have none, and say so), Leviathan et al.'s c = t_draft(1) /
      t_target(1) per mode, and the hardware-aware prediction (:func:`specrepro.theory.hardware_aware_speedup`) of the
      draft-model chain at γ = 4 and at its best γ, and of a free draft (:func:`specrepro.theory.free_draft_bound`),
      with the α that the bench of record measured on the CPU (:data:`GPU_ALPHA_METHOD` in
      ``bench_qwen_greedy.json``): predictions, not measured speedups;
    * each ``test_cuda_*.json`` with its ``.log``: tests collected, passed, failed, and not reached.
    """
    from specrepro.theory import CostCurve, free_draft_bound, hardware_aware_speedup, optimal_gamma_hardware

    gdir = gpu_dir() if gdir is None else Path(gdir)
    parts = []
    bench = _bench_dir(profile) / "bench_qwen_greedy.json"
    alpha = alpha_n = None
    if bench.exists():
        for row in json.loads(read_noted(bench))["summary"]:
            if row["method"] == GPU_ALPHA_METHOD and row.get("alpha") is not None:
                alpha, alpha_n = float(row["alpha"]), f"{row['n_prompts']} prompts x {row['runs'] // row['n_prompts']} passes"
    for path in gpu_files(gdir, "cost_curves_"):
        res = json.loads(read_noted(path))
        cfg, models = res["config"], res["models"]
        ns = cfg["ns"]
        names = list(models)
        short = {m: Path(m).name for m in names}
        with_ci = any(models[m].get(f"{mode}_ms_low") is not None for m in names for mode in ("eager", "static", "graphs"))
        parts.append(f"`{path.name}`: {cfg['device_description']}, {cfg['dtype']}, "
                     f"{'random weights, ' if cfg.get('random_weights') else ''}torch {cfg['torch']}, transformers "
                     f"{cfg['transformers']}, commit `{cfg['commit']}`, {cfg['date']}; one forward of n new tokens "
                     f"after a {cfg['prefix_len']}-token prefix, median of {cfg['repeats']} round-robin rounds (ms)"
                     + (" [95% interval of the median]" if with_ci else
                        "; this file keeps no per-round times, so its medians carry no interval") + ".\n")
        lines = ["| model | mode | " + " | ".join(f"t({n})" for n in ns) + " |", "|---|---|" + "---|" * len(ns)]
        for m in names:
            for mode in ("eager", "static", "graphs"):
                ms = models[m].get(f"{mode}_ms")
                if ms is None:
                    continue
                low = models[m].get(f"{mode}_ms_low") or [None] * len(ms)
                high = models[m].get(f"{mode}_ms_high") or [None] * len(ms)
                cells = [f"{v:.2f}" + (f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else "")
                         for v, lo, hi in zip(ms, low, high)]
                lines.append(f"| {short[m]} | {mode} | " + " | ".join(cells) + " |")
        parts.append("\n".join(lines) + "\n")
        diffs = {short[m]: models[m].get("graphs_max_abs_logit_diff") for m in names}
        if any(d is not None for d in diffs.values()):
            parts.append("Largest |logit| difference between a graph replay and the eager forward: " +
                         ", ".join(f"{k} {v:g}" for k, v in diffs.items() if v is not None) + ".\n")
        if len(names) == 2 and alpha is not None:
            target, draft = names
            lines = [f"| mode | c | γ = 4 | best γ | free draft, γ = 4 |", "|---|---|---|---|---|"]
            for mode in ("eager", "static", "graphs"):
                t_ms, d_ms = models[target].get(f"{mode}_ms"), models[draft].get(f"{mode}_ms")
                if t_ms is None or d_ms is None:
                    continue
                t_curve, d_curve = CostCurve(ns, t_ms), CostCurve(ns, d_ms)
                g = optimal_gamma_hardware(alpha, t_curve, d_curve, max_gamma=max(ns) - 1)
                lines.append(f"| {mode} | {d_curve(1) / t_curve(1):.2f} | "
                             f"{hardware_aware_speedup(alpha, 4, t_curve, d_curve):.2f}x | "
                             f"{hardware_aware_speedup(alpha, g, t_curve, d_curve):.2f}x (γ = {g}) | "
                             f"{free_draft_bound(alpha, 4, t_curve):.2f}x |")
            parts.append(f"Predicted speedup over AR of the chain with {short[draft]} drafting for {short[target]}, "
                         f"at α = {alpha:.3f} (`{GPU_ALPHA_METHOD}` in `{bench.name}`, float32 on the CPU, "
                         f"{alpha_n}); c = t_draft(1) / t_target(1). A prediction from measured costs, not a measured "
                         f"speedup:\n")
            parts.append("\n".join(lines) + "\n")
    for meta_path in gpu_files(gdir, "test_cuda_"):
        meta = json.loads(meta_path.read_text())
        log = meta_path.with_suffix(".log")
        text = log.read_text() if log.exists() else ""
        passed, failed = text.count(" PASSED"), text.count(" FAILED") + text.count(" ERROR")
        reached = passed + failed + text.count(" SKIPPED")
        parts.append(f"`tests/test_cuda.py` on {meta['device']} (commit `{meta['commit']}`, torch {meta['torch']}, "
                     f"transformers {meta['transformers']}, {meta['date']}): **{passed} passed, {failed} failed** of "
                     f"{meta['collected']} collected"
                     + (f"; {meta['collected'] - reached} not reached within the run's {meta['time_limit_s']} s"
                        if reached < meta["collected"] else "") + f" (`{log.name}`).\n")
    if not parts:
        parts.append("No GPU measurements under `data/gpu/` yet.\n")
    return "\n".join(parts)


def bench_files(directory: Path) -> list[Path]:
    """The bench JSON files of a results directory (``bench_*.json``), sorted, without their provenance sidecars
    (``bench_*.provenance.json``) and without the parts of a run timed in parts (``bench_*.p<k>.json``, ``bench
    --part``): the file merged from them (``bench --merge``) stands for the run."""
    import re

    return sorted(p for p in Path(directory).glob("bench_*.json")
                  if not p.name.endswith(".provenance.json") and not re.search(r"\.p\d+\.json$", p.name))


def _provenance_note(path: Path) -> str:
    sidecar = path.with_suffix(".provenance.json")
    try:
        prov = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        return "provenance unknown"
    return f"commit `{prov.get('commit', '?')}`, profile {prov.get('profile', '?')}, {prov.get('device', '?')}"


def plot_verdicts(card: pd.DataFrame, ax=None):
    """Horizontal stacked bars: the number of distinct claims of each paper per verdict (integer ticks). Returns the
    axes."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 2.8))
    counts = card.groupby(["paper", "verdict"], sort=False).size().unstack(fill_value=0)
    counts = counts.reindex(columns=[v for v in VERDICTS if v in counts.columns])
    left = np.zeros(len(counts))
    for v in counts.columns:
        ax.barh(counts.index, counts[v], left=left, color=VERDICT_COLORS[v], label=v)
        left += counts[v].to_numpy()
    ax.invert_yaxis()
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("claims")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return ax
