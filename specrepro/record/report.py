"""The scorecard's rendering and the pages that hold the record's generated blocks.

:func:`render_markdown` (``scorecard.md``), :func:`render_summary` (the README's scorecard), the figures, battery,
runtimes, arcost and llamaaudit blocks (bench and targets, re-exported here: :mod:`specrepro.record.bench_blocks`;
gpu, speed and formats: :mod:`specrepro.record.gpu`, :mod:`specrepro.record.speed`), and :func:`render_pages` /
:func:`update_readme`, which render each block into whichever page (README.md or docs/*.md) holds its markers.
Each block's prose and layout is a template (``templates/<block>.md.j2``); nothing here decides a verdict.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from specrepro.files import atomic_write_files, hold_record_lock_for, repo_root
from specrepro.record.bench_blocks import (prediction_gaps, profile_figures, profile_results, provenance_note, rel,
                                           render_bench, render_targets, render_template, targets_table)
from specrepro.record.decompose import speedup_decomposition
from specrepro.record.gpu import render_gpu
from specrepro.record.registry import with_registration
from specrepro.record.results import STANDARD, read_json, save_table, table_at, writes_record
from specrepro.record.scorecard import (COMPUTED, EXACT, GROUPS, INCONCLUSIVE, JUDGED, N_PHRASE, NOT_REPRODUCED,
                                        NOT_RUN, NOT_TESTABLE, TREND, VERDICTS, load_claims, score, verdict_definitions)
from specrepro.record.speed import render_formats, render_speed
from specrepro.record.tables import Tables

__all__ = ["VERDICT_COLORS", "BLOCKS", "README_BLOCKS", "group_counts", "render_markdown",
           "render_summary", "render_figures", "render_bench", "render_targets", "render_battery", "render_runtimes",
           "targets_table", "prediction_gaps", "write_scorecard", "replace_block", "block_names", "record_pages",
           "render_block", "render_pages", "update_readme", "plot_verdicts"]

#: every generated block but the scorecard: name -> (profile, directory of its page) -> markdown
_RENDERERS = {"figures": lambda p, base: render_figures(p, base), "bench": lambda p, base: render_bench(p, base),
              "targets": lambda p, base: render_targets(p), "battery": lambda p, base: render_battery(p),
              "runtimes": lambda p, base: render_runtimes(), "gpu": lambda p, base: render_gpu(p),
              "arcost": lambda p, base: render_ar_cost(p), "llamaaudit": lambda p, base: render_llama_audit(p),
              "speed": lambda p, base: render_speed(p, base), "formats": lambda p, base: render_formats(p, base)}
#: the generated blocks, each rendered into whichever page (README.md or docs/*.md) holds its markers
BLOCKS = ("scorecard", *_RENDERERS)
#: the blocks that must be in README.md itself (its first screen)
README_BLOCKS = ("scorecard", "figures")

VERDICT_COLORS = {EXACT: "#1b9e77", TREND: "#7fc97f", INCONCLUSIVE: "#fdc086", NOT_REPRODUCED: "#d95f02",
                  COMPUTED: "#80b1d3", NOT_TESTABLE: "#969696", NOT_RUN: "#bdbdbd"}


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


def _card(card: pd.DataFrame, profile: str | None, row=lambda r: r) -> dict:
    """What the full card and the README's summary share: the profile, the head, the verdicts' definitions and
    ``groups``: per group (:data:`GROUPS` order, then any other; rows without one are "ungrouped") its
    :func:`group_counts` heading and ``row(r)`` per row, in the claims' order."""
    counts = card["verdict"].value_counts()
    summary = " · ".join(f"{int(counts.get(v, 0))} {v}" for v in VERDICTS)
    head = f"{card['id'].nunique()} distinct claims, one per statement of a paper: {summary}"
    reg = card.get("registered", pd.Series(dtype=str)).fillna("").astype(str)
    if reg.str.len().gt(0).any():
        head += (f"; {int(reg.str.startswith('before').sum())} judged by a rule registered before its data, "
                 f"{int(reg.str.startswith('after').sum())} after it (data/claims_registry.csv)")
    col = card.get("group", pd.Series("", index=card.index)).fillna("").astype(str)
    names = [g for g in GROUPS if (col == g).any()] + sorted(set(col) - set(GROUPS))
    return {"profile": profile or next((p for p in card["profile"] if p), STANDARD), "card_head": head,
            "definitions": verdict_definitions().rstrip("\n"),
            "groups": [(group_counts(card[col == g], g or "ungrouped"), [row(r) for _, r in card[col == g].iterrows()])
                       for g in names]}


def render_markdown(card: pd.DataFrame, profile: str | None = None) -> str:
    """The full scorecard (``scorecard.md``): the profile, each machine with its number of claims, the commits and
    the count of each verdict; one table per group headed by its verdict counts, a row per claim (paper and where, the
    claim in the paper's setting, the paper's number, ours in our setting, verdict, why); then where each speedup
    comes from (:func:`specrepro.record.decompose.speedup_decomposition`)."""
    context = _card(card, profile)
    read = set(card.loc[card["ours"].fillna("").astype(str) != "", "id"])  # the claims the card holds a reading of
    claims = load_claims()
    return render_template(
        "scorecard", **context, commits=sorted({c for c in card["commit"] if c}),
        machines=card.loc[card["hardware"].fillna("").astype(str) != "", "hardware"].value_counts().items(),
        decomposition=speedup_decomposition(claims[claims["id"].isin(read)], Tables(context["profile"])))


_N_REMOVE = (re.compile(r"\s*\(n = [^()]*\)"),
             re.compile(r"[,;]?\s*\bn = [\d,]+(?:[-–][\d,]+)?(?: [A-Za-z]+)*(?: × \d+ passes)?"))
#: the longest "ours" cell of the summary; a longer one is cut at its last "; " (else ", ") before this length
SUMMARY_OURS_CHARS = 150


def _summary_row(r) -> dict:
    """The values of one row of the README's scorecard: the card's row; our number (its interval kept, its "n = ..."
    phrases moved to the n column, cut to :data:`SUMMARY_OURS_CHARS`); the n cell (the first "n = ..." phrase, else
    the card's n and its unit); the paper as "Leviathan 2023" for "Leviathan et al. 2023"; and whether its table came
    from uncommitted code (its commit ends in ``-dirty``)."""
    text = "" if pd.isna(r.get("ours")) else str(r["ours"])
    m = N_PHRASE.search(text)
    if m:
        n_cell = " ".join(g for g in m.groups() if g)
    elif not pd.isna(r.get("n")) and str(r["n"]) != "":
        n_cell = f"{int(float(r['n']))} {'' if pd.isna(r.get('n_unit')) else r['n_unit']}".strip()
    else:
        n_cell = "—"
    for pattern in _N_REMOVE:
        text = pattern.sub("", text)
    text = re.sub(r"\s+", " ", text).strip(" ,;")
    if len(text) > SUMMARY_OURS_CHARS:
        cut = text.rfind("; ", 0, SUMMARY_OURS_CHARS)
        cut = cut if cut > 0 else text.rfind(", ", 0, SUMMARY_OURS_CHARS)
        text = (text[:cut] if cut > 0 else text[:SUMMARY_OURS_CHARS]).rstrip() + " …"
    year = re.search(r"(\d{4})", str(r["paper"]))
    return {"r": r, "ours": text or "—", "n": n_cell, "dirty": str(r.get("commit") or "").endswith("-dirty"),
            "paper": f"{str(r['paper']).split()[0]} {year.group(1)}" if year else str(r["paper"])}


def render_summary(card: pd.DataFrame, profile: str | None = None, base: Path | None = None) -> str:
    """The README's scorecard: the count of each verdict, a link to the full card (relative to ``base``, the
    directory of the page that holds the block) and one short table per group (:func:`group_counts` heading)."""
    context = _card(card, profile, _summary_row)
    return render_template("summary", **context, link=rel(profile_results(context["profile"]) / "scorecard.md", base),
                           unstable=card.get("stability", pd.Series(dtype=str)).astype(bool).any(),
                           dirty=card.get("commit", pd.Series(dtype=str)).astype(str).str.endswith("-dirty").any())


def render_figures(profile: str = STANDARD, base: Path | None = None) -> str:
    """Markdown for the README's key figures (``templates/figures.md.j2``), each with the commit, profile, device and
    date of the run that drew it, or a note that it is not drawn yet; links relative to ``base`` (as :func:`rel`)."""
    fdir = profile_figures(profile)
    return render_template("figures", profile=profile, link=rel(fdir, base),  # provenance: None for a figure not drawn
                           provenance=lambda stem: read_json(fdir / f"{stem}.provenance.json")
                           if (fdir / f"{stem}.png").exists() else None)


def write_scorecard(profile: str = STANDARD, device: str = "cpu", claims: pd.DataFrame | None = None) -> pd.DataFrame:
    """Score every claim for ``profile`` (:func:`specrepro.record.scorecard.score`), save it as the ``scorecard``
    table (CSV + provenance) with its markdown ``scorecard.md`` beside it; returns the scorecard."""
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


def block_names(text: str) -> list[str]:
    """The generated blocks whose start markers ``text`` holds, in order (a repeated one as often as it appears)."""
    return re.findall(r"<!-- ([A-Za-z0-9_-]+):start -->", text)


def record_pages(readme: str | Path | None = None) -> list[Path]:
    """The pages that may hold generated blocks: README.md (``readme``, default the repository's) first, then the
    ``docs/*.md`` files beside it, sorted."""
    path = Path(readme) if readme is not None else repo_root() / "README.md"
    return [path, *sorted((path.parent / "docs").glob("*.md"))]


def render_block(name: str, profile: str = STANDARD, card: pd.DataFrame | None = None,
                 base: Path | None = None) -> str:
    """The content of generated block ``name`` (:data:`BLOCKS`) for ``profile``, links relative to ``base`` (the
    directory of the page that holds it). Raises ValueError for a name not in :data:`BLOCKS`."""
    if name not in BLOCKS:
        raise ValueError(f"unknown generated block {name!r}; known: {list(BLOCKS)}")
    if name == "scorecard":
        return render_summary(with_registration(score(profile)) if card is None else card, profile, base)
    return _RENDERERS[name](profile, base)


def render_llama_audit(profile: str = STANDARD) -> str:
    """Markdown for the ``llamaaudit`` block (docs/battery.md) from the table ``audit_llamacpp`` (``python -m
    specrepro audit --runtime llama.cpp``): per setting and sampler its n, TV, p-values, power, verdict, acceptance
    rates and the TV and fit of the law its code implies; a missing table is named."""
    path = profile_results(profile) / "audit_llamacpp.csv"
    if (df := table_at(path)) is None:
        return render_template("llamaaudit", rows=None)
    df = df.assign(**{c: df.get(c, math.nan) for c in ("tv_null_mean", "code_law_tv_to_exact", "p_value_vs_code_law")})
    return render_template("llamaaudit", prov=provenance_note(path), first=df.iloc[0], rows=list(df.itertuples()))


def render_ar_cost(profile: str = STANDARD) -> str:
    """Markdown for the ``arcost`` block (docs/cost-model.md): :func:`specrepro.bench.run.ar_cost_table` of the
    profile's bench files, one row per file."""
    from specrepro.bench.run import ar_cost_table

    return render_template("arcost", profile=profile, rows=list(ar_cost_table(profile_results(profile)).itertuples()))


def render_pages(profile: str = STANDARD, card: pd.DataFrame | None = None,
                 pages: list[Path] | None = None) -> dict[Path, tuple[str, str]]:
    """``{path: (old, new)}`` for each of ``pages`` (default :func:`record_pages`): its text, and with each generated
    block it holds the markers of rendered. Writes nothing.

    Raises:
        ValueError: README.md (the first page) lacks a block of :data:`README_BLOCKS`, a block's markers are missing,
            repeated or out of order, a block appears on two pages, or a page names a block not in :data:`BLOCKS`.
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
    out = {}
    for p, old in texts.items():
        new = old
        for name in dict.fromkeys(block_names(old)):
            new = replace_block(new, name, render_block(name, profile, card, p.parent))
        out[p] = (old, new)
    return out


def update_readme(profile: str = STANDARD, card: pd.DataFrame | None = None, readme: str | Path | None = None,
                  force: bool = False) -> bool:
    """Rewrite every generated block of README.md (``readme``) and the docs/*.md beside it (:func:`render_pages`)
    from ``card`` (default: scored now) and ``profile``'s tables and figures, the changed pages in one step; only
    under ``make reproduce`` / ``make scorecard`` (:func:`specrepro.record.results.writes_record`) unless ``force``.
    True if a page changed.

    Raises:
        ValueError: a block is missing from README.md or misplaced (:func:`render_pages`).
    """
    if not writes_record(profile) and not force:
        return False
    hold_record_lock_for(repo_root() / "README.md")
    pages = render_pages(profile, card, record_pages(readme))
    changed = {p: new.encode() for p, (old, new) in pages.items() if new != old}
    atomic_write_files(changed)  # nothing when no page changed
    return bool(changed)


def render_battery(profile: str = STANDARD) -> str:
    """Markdown for the exactness-battery block from notebook 01's tables: each goodness-of-fit test's false-alarm
    rate (± binomial s.e.) and smallest TV detected at 90% power, and the published bugs' negative controls caught
    and look-alikes passed. A missing table is named."""
    power_path = profile_results(profile) / "exactness_power_false_alarm.csv"
    power, bugs = table_at(power_path), table_at(power_path.with_name("exactness_bug_registry.csv"))
    return render_template("battery", profile=profile, prov=provenance_note(power_path),
                           rows=None if power is None else list(power.itertuples()),
                           bugs=None if bugs is None else list(bugs.itertuples()))


#: the committed executed notebooks whose run times the ``runtimes`` block lists (nbval's quick references are not a
#: record of run time: they run two kernels at once in CI)
RUNTIME_PROFILES = ("standard", "humaneval164")
#: the notebook that renders the generated blocks (its run time cannot be in them)
SCORECARD_NOTEBOOK = "08_scorecard"


def render_runtimes(executed: Path | None = None, sources: Path | None = None) -> str:
    """Markdown for the ``runtimes`` block of docs/profiles.md: per committed executed notebook of
    :data:`RUNTIME_PROFILES` (under ``executed``, default ``notebooks/executed/``) the run time its run stamped into it
    (:func:`specrepro.record.nbrun.stamp_run`) with the run's commit, CPU and date, and whether its code is its
    source's today (``sources``, default ``notebooks/``; :func:`specrepro.record.nbrun.code_drift`)."""
    from specrepro.record.nbrun import code_drift, run_facts

    root = Path(executed) if executed is not None else repo_root() / "notebooks" / "executed"
    sources = Path(sources) if sources is not None else repo_root() / "notebooks"
    rows = [{"stem": nb.stem, "profile": prof, "run": run_facts(nb),
             "drift": code_drift(sources / nb.name, nb) if (sources / nb.name).is_file() else None}
            for prof in RUNTIME_PROFILES for nb in sorted((root / prof).glob("[0-9][0-9]_*.ipynb"))
            if not nb.name.endswith(".partial.ipynb") and nb.stem != SCORECARD_NOTEBOOK]
    return render_template("runtimes", rows=rows, scorecard_notebook=SCORECARD_NOTEBOOK)


def plot_verdicts(card: pd.DataFrame, ax=None):
    """Horizontal stacked bars: the number of distinct claims of each paper per verdict. Returns the axes."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 2.8))
    counts = card.groupby(["paper", "verdict"], sort=False).size().unstack(fill_value=0)
    counts = counts.reindex(columns=[v for v in VERDICTS if v in counts.columns])
    left = counts.cumsum(axis=1) - counts  # each bar starts where the paper's bars before it end
    for v in counts.columns:
        ax.barh(counts.index, counts[v], left=left[v], color=VERDICT_COLORS[v], label=v)
    ax.invert_yaxis()
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("claims")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return ax
