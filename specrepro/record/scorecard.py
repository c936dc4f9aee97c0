"""The replication scorecard's rules: each statement of the four papers beside our measurement, with a verdict.

What this file is: the claims live in ``data/claims.csv``, one row per statement a paper makes (paper, arXiv
version, exact location, the paper's setting, a sentence, the paper's number and whether that number was
**measured**, **computed** or **asserted** by the paper, its group - **correctness** or **performance**, which only
the rendering reads - the result table that measures it, the name of a rule and
the rule's parameters). Each rule is a function registered in :data:`RULES` whose docstring states how it turns our
numbers into one verdict. The verdicts are defined once, in :data:`VERDICT_DEFINITIONS`, assembled from the clauses
that the judging helpers evaluate (:data:`INTERVAL_CLAUSES` for a number or direction read from a 95% interval,
:data:`MARGIN_CLAUSES` for agreement within a stated margin, :data:`TEST_CLAUSES` for an asserted yes/no property);
the README's and ``scorecard.md``'s definitions are rendered from the same text (:func:`verdict_definitions`).

Intervals are 95% percentile-bootstrap intervals over prompts (or problems) of per-prompt values, from
:func:`specrepro.stats.bootstrap_ci` / :func:`specrepro.measure.harness.paired_ratios` (the harness's one definition of a
paired speedup); trends use ``scipy.stats`` tests. No rule takes a maximum over γ or methods unless its claim says
"best of N" (then the chosen row's interval is reported). No verdict is typed by hand and no rule reads a claim's id; a
rule that raises is a bug and propagates (only :class:`NotRun`, "this profile did not measure it", becomes a verdict).

What it is not: the rendering of the scorecard (markdown, README blocks, figures: :mod:`specrepro.record.report`), an
experiment (nothing here runs a model) or a store of the papers' numbers beyond ``data/claims.csv``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from specrepro.files import repo_root
from specrepro.measure.harness import (
    draft_of_method,
    in_run_cost_coefficient,
    paired_ratios,
)
from specrepro.record.results import STANDARD, read_dirs
from specrepro.stats import spearman, spearman_interval, stat_ci
from specrepro.theory import expected_tokens, walltime_improvement

__all__ = ["VERDICTS", "JUDGED", "PAPER_KINDS", "GROUPS", "CLAIM_COLUMNS", "CARD_COLUMNS", "ALPHA_TEST", "GOF_LEVEL",
           "Clause", "INTERVAL_CLAUSES", "MARGIN_CLAUSES", "TEST_CLAUSES", "OTHER_DEFINITIONS", "VERDICT_DEFINITIONS",
           "verdict_definitions", "judge_interval", "judge_margin", "judge_test", "NotRun", "Outcome", "N_PHRASE",
           "n_unit", "Tables", "claims_path", "params_of", "load_claims", "RULES", "RULE_PARAMS", "COMMON_PARAMS",
           "rule", "EXACT_RULES", "printed_precision", "exact_sampler", "all_identical", "identical_up_to_ties",
           "paired_ratio", "computed_speedup", "value_in_interval", "row_order", "close_to_prediction", "increases",
           "decreases", "grows_linearly", "speedup_peaks", "quality_unchanged", "falls_with_head", "typical_shifts",
           "needs_precondition", "not_testable", "score_claim", "score", "rules_table"]

EXACT, TREND, INCONCLUSIVE = "reproduced exactly", "trend reproduced", "inconclusive"
NOT_REPRODUCED, NOT_RUN = "not reproduced", "not run"
COMPUTED, NOT_TESTABLE = "computed", "not testable here"
VERDICTS = (EXACT, TREND, INCONCLUSIVE, NOT_REPRODUCED, COMPUTED, NOT_TESTABLE, NOT_RUN)
#: the verdicts that judge a claim against a reading of ours; computed, not testable here and not run judge nothing
JUDGED = (EXACT, TREND, INCONCLUSIVE, NOT_REPRODUCED)
#: what the paper's number is: measured in an experiment, computed from a formula, or asserted (stated or proved,
#: no measurement behind it)
PAPER_KINDS = ("measured", "computed", "asserted")
#: what a claim is about, for the scorecard's two tables (rendering only; no rule reads it): **correctness** - what is
#: exact by construction or proved by a test that could fail: exactness, greedy identity (and task quality under
#: greedy decoding, equal because the completions are identical), closed forms evaluated at the paper's inputs;
#: **performance** - everything timed or counted in runs: speedups, loop times, acceptance rates, tokens per step,
#: task quality under sampling, and closed forms evaluated at our measured inputs
GROUPS = ("correctness", "performance")
CLAIM_COLUMNS = ("id", "paper", "arxiv", "source", "setting", "claim", "paper_value", "paper_kind", "group", "rule",
                 "params", "our_table", "notebook", "our_setting", "caveat")
CARD_COLUMNS = ["id", "paper", "arxiv", "source", "setting", "claim", "paper_value", "paper_kind", "group", "ours",
                "ours_value", "ours_lo", "ours_hi", "n", "n_unit", "our_setting", "hardware", "profile", "commit", "verdict",
                "reason", "rule", "our_table", "stability"]
#: level of every significance test and chi-square goodness-of-fit test the rules read (5% for trends)
ALPHA_TEST = 0.05
GOF_LEVEL = 1e-3


# ------------------------------------------------------------------------------------------- verdict definitions


@dataclass(frozen=True)
class Clause:
    """One clause of a verdict's definition: the verdict, its text (rendered into the README's definitions) and the
    predicate that a judging helper evaluates; a helper returns the verdict of the first clause that holds."""

    verdict: str
    text: str
    holds: Callable[..., bool]


def _has_ci(lo, hi) -> bool:
    return lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi)


def _beyond(lo, hi, null: float, direction: int) -> bool:
    """Whether [lo, hi] excludes ``null`` on the side ``direction`` points to (+1: above, -1: below)."""
    return _has_ci(lo, hi) and (lo > null if direction > 0 else hi < null)


#: a number or a direction the paper measured, read from our 95% interval [lo, hi] of the statistic against its
#: null (``null``, on the paper's side ``direction``), and whether the interval holds the paper's number
#: (``holds_paper``: None when the paper states a direction only); :func:`judge_interval`
INTERVAL_CLAUSES = (
    Clause(EXACT, "our 95% interval holds the paper's number (or meets its range) and excludes the null on the "
                  "paper's side (where the number and the null are on two scales, each has its own interval)",
           lambda lo, hi, null, direction, holds_paper: _beyond(lo, hi, null, direction) and holds_paper is True),
    Clause(TREND, "the interval excludes the null on the paper's side but does not hold the paper's number, or the "
                  "paper states a direction and no number",
           lambda lo, hi, null, direction, holds_paper: _beyond(lo, hi, null, direction)),
    Clause(NOT_REPRODUCED, "the interval excludes the null on the other side",
           lambda lo, hi, null, direction, holds_paper: _beyond(lo, hi, null, -direction)),
    Clause(INCONCLUSIVE, "the interval contains the null, or no interval can be computed",
           lambda lo, hi, null, direction, holds_paper: True),
)
#: agreement within a stated margin (task quality unchanged within ±10 points; a formula that the measurement follows
#: within its tolerance), read from our 95% interval [lo, hi] and the margin [m_lo, m_hi]; :func:`judge_margin`
MARGIN_CLAUSES = (
    Clause(EXACT, "for agreement within a stated margin: the whole interval lies within the margin",
           lambda lo, hi, m_lo, m_hi: _has_ci(lo, hi) and m_lo <= lo and hi <= m_hi),
    Clause(NOT_REPRODUCED, "for agreement within a stated margin: the whole interval lies outside it",
           lambda lo, hi, m_lo, m_hi: _has_ci(lo, hi) and (lo > m_hi or hi < m_lo)),
    Clause(INCONCLUSIVE, "for agreement within a stated margin: the interval straddles an end of the margin, or no "
                         "interval can be computed",
           lambda lo, hi, m_lo, m_hi: True),
)
#: an asserted yes/no property (exactness, greedy identity, a closed form at the paper's own inputs), read from the
#: stated test's answer and whether the test can fail (it catches negative controls, or compares outputs or printed
#: numbers exactly); :func:`judge_test`
TEST_CLAUSES = (
    Clause(EXACT, "for an asserted property or a closed form: the stated test says yes and can fail (it catches "
                  "the negative controls, or compares tokens or printed digits exactly)",
           lambda says_yes, can_fail: says_yes and can_fail),
    Clause(NOT_REPRODUCED, "for an asserted property or a closed form: the stated test says no",
           lambda says_yes, can_fail: not says_yes),
    Clause(INCONCLUSIVE, "for an asserted property: the test says yes but is not shown to catch a wrong answer",
           lambda says_yes, can_fail: True),
)
#: the verdicts that judge nothing, with their definitions
OTHER_DEFINITIONS = {
    COMPUTED: "our number is the paper's closed form evaluated at our measured inputs (e.g. our α): shown beside the "
              "paper's, with our measurement beside it, never counted as a reproduction",
    NOT_TESTABLE: "the claim needs a regime we cannot reach here; the reason says which (from a measured "
                  "precondition where there is one)",
    NOT_RUN: "the table that would measure it is not in the record for this profile",
}


def _definitions() -> dict[str, str]:
    out = {}
    for v in VERDICTS:
        texts = [c.text for clauses in (INTERVAL_CLAUSES, MARGIN_CLAUSES, TEST_CLAUSES) for c in clauses
                 if c.verdict == v]
        if v in OTHER_DEFINITIONS:
            texts.append(OTHER_DEFINITIONS[v])
        out[v] = "; ".join(texts)
    return out


#: verdict -> its definition, assembled from the clauses the judging helpers evaluate (one source for code and docs)
VERDICT_DEFINITIONS = _definitions()


def verdict_definitions(bold: bool = True) -> str:
    """Markdown: each verdict in :data:`VERDICTS` order with its definition from :data:`VERDICT_DEFINITIONS`, one
    bullet each, and which verdicts judge a claim (:data:`JUDGED`)."""
    name = (lambda v: f"**{v}**") if bold else (lambda v: v)
    lines = [f"* {name(v)}: {VERDICT_DEFINITIONS[v]}." for v in VERDICTS]
    return "\n".join(lines) + "\n"


def _first(clauses, *args) -> Clause:
    return next(c for c in clauses if c.holds(*args))


def judge_interval(lo, hi, null: float, direction: int, holds_paper: bool | None) -> str:
    """The verdict of :data:`INTERVAL_CLAUSES` for our 95% interval [lo, hi] (None or NaN: no interval), the null on
    the paper's side ``direction`` (+1: the paper's side is above it) and whether the interval holds the paper's
    number (``holds_paper``; None: the paper states a direction only)."""
    return _first(INTERVAL_CLAUSES, lo, hi, null, direction, holds_paper).verdict


def judge_margin(lo, hi, margin: tuple[float, float]) -> str:
    """The verdict of :data:`MARGIN_CLAUSES` for our 95% interval [lo, hi] against the stated margin (lo, hi)."""
    return _first(MARGIN_CLAUSES, lo, hi, *margin).verdict


def judge_test(says_yes: bool, can_fail: bool) -> str:
    """The verdict of :data:`TEST_CLAUSES` for an asserted property's test."""
    return _first(TEST_CLAUSES, bool(says_yes), bool(can_fail)).verdict


def _meets(lo, hi, paper: tuple[float, float]) -> bool:
    """Whether the interval [lo, hi] holds the paper's number (or meets its range ``paper`` = (lo, hi))."""
    return _has_ci(lo, hi) and lo <= paper[1] and hi >= paper[0]


class NotRun(Exception):
    """Raised by a rule when the rows it needs were not measured in this profile (message = reason). ``ours``: what
    the table does hold that a reader should still see (e.g. an extension's reading, never judged), or empty."""

    def __init__(self, reason: str, ours: str = ""):
        super().__init__(reason)
        self.ours = ours


@dataclass
class Outcome:
    """One rule's result: the verdict, our number as text (with its interval and n), our point estimate and its
    95% interval (None where not one number), the sample size n, and the reason (empty when reproduced exactly).
    ``unit`` names what n counts ("runs", "settings"); empty when our text already says it in an "n = 20 prompts"
    phrase, from which :func:`n_unit` reads it."""

    verdict: str
    ours: str
    value: float | None = None
    reason: str = ""
    lo: float | None = None
    hi: float | None = None
    n: int | None = None
    unit: str = ""


#: "n = 20 prompts × 3 passes" inside our number's text: the sample size and what it counts
N_PHRASE = re.compile(r"\bn = ([\d,]+(?:[-–][\d,]+)?)(?: ([A-Za-z]+(?: × \d+ passes)?))?")


def n_unit(out: Outcome) -> str:
    """What an outcome's n counts: its ``unit``, else the unit of the first "n = <number> <unit>" phrase of its text
    ("prompts", "prompts × 3 passes", "points"), else "" (no n, or a text that does not say)."""
    if out.unit or out.n is None:
        return out.unit if out.n is not None else ""
    m = N_PHRASE.search(out.ours or "")
    return (m.group(2) or "") if m else ""


def _read_csv(path: Path) -> pd.DataFrame | None:
    return pd.read_csv(path) if path.exists() else None


def _read_table(directory: Path, name: str) -> pd.DataFrame | None:
    """``<name>.csv``, or the per-run rows of a bench JSON ``<name>.json`` (``python -m specrepro bench --json``:
    columns method, prompt, repeat, tokens_per_s, ...), or None."""
    df = _read_csv(directory / f"{name}.csv")
    if df is None and (directory / f"{name}.json").exists():
        runs = json.loads((directory / f"{name}.json").read_text()).get("runs")
        df = pd.DataFrame(runs) if runs else None
    return df


def _bench_provenance(path: Path) -> dict:
    """The provenance of a bench JSON: its config (commit, target, draft, workload, ...)."""
    try:
        return dict(json.loads(path.read_text()).get("config") or {})
    except (OSError, ValueError):
        return {}


def _hardware(prov: dict) -> str:
    """The machine a table was measured on, from its provenance: the device (a bench JSON's ``device_description``
    where it has one, else ``device``) and, on a CPU, the CPU model with its widest SIMD extension (``cpu``; tables
    written before it was recorded say so; a table whose rows were decoded over several sittings names every CPU of
    its rows, ``row_cpus``). Empty without a provenance."""
    device = str(prov.get("device_description") or prov.get("device") or "")
    if not device.startswith("cpu"):
        return device
    cpus = prov.get("row_cpus") or ([prov["cpu"]] if prov.get("cpu") else [])
    return f"{device}, {'; '.join(cpus)}" if cpus else f"{device}, CPU model not recorded"


class Tables:
    """The result tables and provenance records of one profile, read lazily and cached.

    Args:
        profile: the profile whose tables are read, from :func:`specrepro.record.results.read_dirs` (this run's output
            directory, then, for the standard profile outside ``make reproduce``, the committed data/results/).
        frames: optional ``{name: DataFrame}`` used instead of the files (tests); names absent from it are missing.
        provenances: optional ``{name: dict}`` to go with ``frames``.
        dirs: optional directories searched instead of :func:`specrepro.record.results.read_dirs` (e.g. only the record).
    """

    def __init__(self, profile: str = STANDARD, frames: dict | None = None, provenances: dict | None = None,
                 dirs: Sequence[Path] | None = None):
        self.profile = profile
        self._frames = dict(frames) if frames is not None else None
        self._prov = dict(provenances or {})
        self._dirs = [Path(d) for d in dirs] if dirs is not None else None
        self._cache: dict[str, pd.DataFrame | None] = {}

    def dirs(self) -> list[Path]:
        """The directories searched, in order."""
        return self._dirs if self._dirs is not None else read_dirs(self.profile)

    def get(self, name: str) -> pd.DataFrame | None:
        """The table ``name`` (a copy), or None if it has not been written."""
        if name not in self._cache:
            if self._frames is not None:
                self._cache[name] = self._frames.get(name)
            else:
                self._cache[name] = next((df for df in (_read_table(d, name) for d in self.dirs())
                                          if df is not None), None)
        df = self._cache[name]
        return None if df is None else df.copy()

    def provenance(self, name: str) -> dict:
        """The provenance record of table ``name`` (commit, profile, device, target, ...); {} if there is none."""
        if name not in self._prov:
            rec = {}
            if self._frames is None:
                path = next((p for p in (d / f"{name}.provenance.json" for d in self.dirs()) if p.exists()), None)
                if path is not None:
                    try:
                        rec = json.loads(path.read_text())
                    except (OSError, ValueError):
                        rec = {}
                else:
                    bench = next((p for p in (d / f"{name}.json" for d in self.dirs()) if p.exists()), None)
                    rec = _bench_provenance(bench) if bench is not None else {}
            self._prov[name] = rec
        return self._prov[name]


# ------------------------------------------------------------------------------------------------------ claims


def claims_path() -> Path:
    """``data/claims.csv`` in the repository."""
    return repo_root() / "data" / "claims.csv"


def params_of(claim) -> dict[str, str]:
    """The claim's ``params`` field ``key=value; key=value`` as a dict (values may contain ``=``, not ``;``).

    Raises:
        ValueError: an item lacks ``=`` or a key is repeated.
    """
    out: dict[str, str] = {}
    for item in (s.strip() for s in str(claim["params"]).split(";")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"claim {claim['id']}: params item {item!r} is not key=value")
        if key in out:
            raise ValueError(f"claim {claim['id']}: params key {key!r} repeated")
        out[key] = value.strip()
    return out


def load_claims(path: str | Path | None = None) -> pd.DataFrame:
    """Read the claims file (every field as text, empty fields as "").

    Raises:
        ValueError: a column is missing, an id is empty or repeated, a rule is not in :data:`RULES`, a paper_kind is
            not measured / computed / asserted, a group is not correctness / performance, a claim passes a parameter
            neither its rule nor :data:`COMMON_PARAMS` takes, or a common parameter has a value it does not allow.
    """
    df = pd.read_csv(path or claims_path(), dtype=str, keep_default_na=False)
    df = df.apply(lambda col: col.str.strip())
    missing = [c for c in CLAIM_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"claims file lacks columns {missing}")
    if (df["id"] == "").any() or df["id"].duplicated().any():
        raise ValueError(f"claim ids must be present and unique: {sorted(df['id'][df['id'].duplicated()])}")
    unknown = sorted(set(df["rule"]) - set(RULES))
    if unknown:
        raise ValueError(f"unknown rules {unknown}; known: {sorted(RULES)}")
    bad = sorted(set(df["paper_kind"]) - set(PAPER_KINDS))
    if bad:
        raise ValueError(f"unknown paper_kind {bad}; known: {list(PAPER_KINDS)}")
    bad = sorted(set(df["group"]) - set(GROUPS))
    if bad:
        raise ValueError(f"unknown group {bad}; known: {list(GROUPS)}")
    for _, c in df.iterrows():
        p = params_of(c)
        extra = set(p) - set(RULE_PARAMS[c["rule"]]) - set(COMMON_PARAMS)
        if extra:
            raise ValueError(f"claim {c['id']}: rule {c['rule']} takes no parameters {sorted(extra)} "
                             f"(it takes {list(RULE_PARAMS[c['rule']])}, and any claim {list(COMMON_PARAMS)})")
        for key, allowed in COMMON_PARAMS.items():
            if key in p and p[key] not in allowed:
                raise ValueError(f"claim {c['id']}: {key}={p[key]!r}; allowed: {list(allowed)}")
    return df


def _names(field: str) -> list[str]:
    return [s.strip() for s in str(field).split(";") if s.strip()]


def _float(params: dict, key: str, default: float) -> float:
    return float(params[key]) if params.get(key, "") != "" else default


#: a signed number (ASCII or Unicode minus, optional +), optionally followed by a range's other end ("1.2-1.5",
#: "-0.32 to +0.29", "1.2–1.5")
_NUMBER_RANGE = re.compile(r"(?<![\d.])([-+−]?\d+(?:\.\d+)?)(?:\s*(?:-|–|to)\s*([-+−]?\d+(?:\.\d+)?))?")


def _paper_range(claim) -> tuple[float, float]:
    """The paper's number ``x`` or range ``lo-hi`` / ``lo to hi`` (the first number(s) of ``paper_value``, signs
    kept) as (lo, hi).

    Raises:
        ValueError: ``paper_value`` has no number.
    """
    text = claim["paper_value"].replace("×", "")
    m = _NUMBER_RANGE.search(text)
    if not m:
        raise ValueError(f"claim {claim['id']}: no number in paper_value {claim['paper_value']!r}")
    lo = float(m.group(1).replace("−", "-"))
    return lo, float(m.group(2).replace("−", "-")) if m.group(2) else lo


def _decimals(text: str, default: int = 2) -> int:
    """The most decimals of any number printed in ``text``."""
    found = [len(d) for d in re.findall(r"\d\.(\d+)", text)]
    return max(found) if found else default


def _table(claim, tables: Tables, index: int = 0) -> pd.DataFrame:
    return tables.get(_names(claim["our_table"])[index])


def _rows(claim, tables: Tables, params: dict, index: int = 0) -> pd.DataFrame:
    """The claim's table (``index``-th of ``our_table``) filtered by the ``select`` query; NotRun if nothing left."""
    df = _table(claim, tables, index)
    if params.get("select"):
        df = df.query(params["select"], engine="python")
    if df.empty:
        raise NotRun(f"no rows of {_names(claim['our_table'])[index]} match the claim's selection"
                     + (f" ({claim['caveat']})" if claim["caveat"] else ""))
    return df


def _num(series) -> np.ndarray:
    return pd.to_numeric(series, errors="coerce").to_numpy(dtype=float)


def _truth(series) -> pd.Series:
    """Booleans from a column of True/False/"True"/"False"/NaN; NaN stays NaN (not compared)."""
    def one(v):
        if isinstance(v, (bool, np.bool_)):
            return bool(v)
        if isinstance(v, str) and v.strip().lower() in ("true", "false"):
            return v.strip().lower() == "true"
        if isinstance(v, (int, float, np.number)) and not (isinstance(v, float) and math.isnan(v)):
            return bool(v)
        return np.nan
    return series.map(one)


def _prompt_unit(df) -> str:
    """The unit of n for per-prompt rows: "prompts", or "prompts × 3 passes" when each prompt was timed in several
    passes (a ``repeat`` column; the passes of a prompt are one unit of the interval, so n counts prompts)."""
    passes = int(df["repeat"].nunique()) if "repeat" in getattr(df, "columns", ()) else 1
    return "prompts" if passes <= 1 else f"prompts × {passes} passes"


def _fmt_ci(est: float, lo: float, hi: float, n: int, unit: str, digits: int = 2, suffix: str = "",
            sign: bool = False) -> str:
    """``1.43× [1.26, 1.66], n = 5 prompts`` (or ``..., no interval (n = 1 ...)``); ``unit``'s first word is made
    singular for n = 1 ("1 prompt × 3 passes"); ``sign``: every number with its sign (``-0.16 [-0.19, -0.14]``)."""
    f = f"{'+' if sign else ''}.{digits}f"
    head = f"{est:{f}}{suffix}"
    first, _, rest = unit.partition(" ")
    unit = (first[:-1] if n == 1 and first.endswith("s") else first) + (f" {rest}" if rest else "")
    if _has_ci(lo, hi):
        return f"{head} [{lo:{f}}, {hi:{f}}], n = {n} {unit}"
    return f"{head}, no interval (n = {n} {unit})"


def _judge(lo, hi, paper: tuple[float, float] | None, null: float, direction: int, what: str) -> tuple[str, str]:
    """The verdict of :data:`INTERVAL_CLAUSES` (:func:`judge_interval`) for a measured claim whose number (``paper``,
    a value or range; None: a direction only) and null lie on the scale of our interval [lo, hi], with the reason:
    where the interval lies against the null and the paper's number. Returns (verdict, reason); the reason of
    "reproduced exactly" is empty."""
    holds = None if paper is None else _meets(lo, hi, paper)
    verdict = judge_interval(lo, hi, null, direction, holds)
    if not _has_ci(lo, hi):
        return verdict, f"no interval for {what} (fewer than 2 prompts)"
    pv = "" if paper is None else f"{paper[0]:g}" if paper[0] == paper[1] else f"{paper[0]:g} to {paper[1]:g}"
    side = "above" if direction > 0 else "below"
    if verdict == EXACT:
        return verdict, ""
    if verdict == TREND:
        if paper is None:
            return verdict, f"the interval lies {side} {null:g}; the paper states a direction, no number to hold"
        where = "below" if hi < paper[0] else "above"
        return verdict, f"the interval lies {side} {null:g} but {where} the paper's {pv}"
    if verdict == NOT_REPRODUCED:
        return verdict, f"the interval [{lo:.2f}, {hi:.2f}] lies on the other side of {null:g}"
    return verdict, f"the interval [{lo:.2f}, {hi:.2f}] contains {null:g}" + (
        f" (and the paper's {pv})" if holds else f" (and not the paper's {pv})" if paper is not None else "")


def _all_of(verdicts) -> str:
    """The verdict of a claim that must hold in every setting or series: not reproduced if any is, else inconclusive if
    any is, else trend reproduced if any is, else reproduced exactly."""
    verdicts = list(verdicts)
    return next(v for v in (NOT_REPRODUCED, INCONCLUSIVE, TREND, EXACT) if v in verdicts)


def _steps(df: pd.DataFrame) -> np.ndarray:
    tokens = _num(df[_tokens_col(df)])
    if "steps" in df:
        return _num(df["steps"])
    if "tokens_per_step" in df:
        return tokens / _num(df["tokens_per_step"])
    return np.full(len(df), np.nan)


def _tokens_col(df: pd.DataFrame) -> str:
    return "tokens" if "tokens" in df else "new_tokens"


def _bench_cost_ratio(tables: Tables, source: str, n: int) -> tuple[float, str] | None:
    """The same ratio from a bench JSON's own cost model (``config.cost_model.target_ms``, measured in the run that
    timed the claim's methods, on the CPU its config names); None if ``source`` is not such a file."""
    cfg = tables.provenance(source)
    target_ms = (cfg.get("cost_model") or {}).get("target_ms") if isinstance(cfg.get("cost_model"), dict) else None
    if not target_ms:
        return None
    pts = sorted((int(k), float(v)) for k, v in target_ms.items())
    ratio = _relative_cost(np.array([k for k, _ in pts], dtype=float), np.array([v for _, v in pts]), n)
    if ratio is None:
        return None
    where = cfg.get("device_description", cfg.get("device", "this device"))
    return ratio, where + (f" [{cfg['cpu']}]" if cfg.get("cpu") else "") + f", this run's cost model"


def _relative_cost(ns: np.ndarray, ms: np.ndarray, n: int) -> float | None:
    """t(n) / t(1) on a measured curve (linear interpolation, clamped at its largest n); None without n = 1."""
    if not len(ns) or ns.min() > 1:
        return None
    return float(np.interp(min(n, ns.max()), ns, ms)) / float(np.interp(1, ns, ms))


def _cost_ratio(tables: Tables, n: int, source: str | None = None) -> tuple[float, str] | None:
    """Measured cost of one target forward over ``n`` new tokens relative to one token, and the device it was
    measured on; None if not measured. From the bench file ``source``'s own cost model where it has one (the same run
    and machine as the ratio it explains), else from ``cost_curves`` of notebook 04 (the target is its first model)."""
    if source:
        ratio = _bench_cost_ratio(tables, source, n)
        if ratio is not None:
            return ratio
    cost = tables.get("cost_curves")
    if cost is None or cost.empty or not {"model", "n", "ms"} <= set(cost.columns):
        return None
    d = cost[cost["model"] == cost["model"].iloc[0]].sort_values("n")
    ratio = _relative_cost(_num(d["n"]), _num(d["ms"]), n)
    return None if ratio is None else (ratio, tables.provenance("cost_curves").get("device", "this device"))


def _in_run_forward_ratio(method_rows: pd.DataFrame, base_rows: pd.DataFrame) -> float | None:
    """The method's median target forward per step over the baseline's, from the runs' own ``target_ms`` (bench
    runs record it); None where either lacks it."""
    if "target_ms" not in method_rows or "target_ms" not in base_rows:
        return None
    m, b = _num(method_rows["target_ms"]), _num(base_rows["target_ms"])
    m, b = m[np.isfinite(m)], b[np.isfinite(b)]
    if not len(m) or not len(b) or np.median(b) <= 0:
        return None
    return float(np.median(m) / np.median(b))


def _tree_nodes(rows: pd.DataFrame) -> int:
    """The largest token tree a method's runs verified (bench runs list per-step ``depths`` and ``drafted`` nodes;
    a chain has no depths > 0): 0 for chains and AR."""
    if "depths" not in rows or "drafted" not in rows:
        return 0
    best = 0
    for depths, drafted in zip(rows["depths"], rows["drafted"]):
        if isinstance(depths, (list, tuple)) and any(int(d) > 0 for d in depths) and isinstance(drafted, (list, tuple)):
            best = max(best, max((int(x) for x in drafted), default=0))
    return best


def _explain(method_rows: pd.DataFrame, base_rows: pd.DataFrame, tables: Tables, source: str | None = None) -> str:
    """What a speed ratio is made of: tokens per target step against the time of a step relative to the baseline's
    step (speedup ≈ tokens per step / step-time ratio), and the cost of verifying: the method's target forward per
    step over the baseline's in the same runs where they record it, else for a chain or tree the measured cost of
    verifying γ + 1 tokens or the tree (from the table ``source``'s own cost model where it is a bench file that has
    one, else notebook 04's cost curve)."""
    parts = []
    steps, base_steps = _steps(method_rows), _steps(base_rows)
    tok, base_tok = _num(method_rows[_tokens_col(method_rows)]), _num(base_rows[_tokens_col(base_rows)])
    if np.isfinite(steps).all() and np.isfinite(base_steps).all() and steps.sum() > 0 and base_steps.sum() > 0:
        tps, base_tps = tok.sum() / steps.sum(), base_tok.sum() / base_steps.sum()
        step_ratio = ((_num(method_rows["seconds"]).sum() / steps.sum())
                      / (_num(base_rows["seconds"]).sum() / base_steps.sum()))
        parts.append(f"{tps / base_tps:.2f}× the tokens per target step, each step {step_ratio:.2f}× as long")
    if "alpha" in method_rows and np.isfinite(_num(method_rows["alpha"])).any():
        parts.append(f"α = {np.nanmean(_num(method_rows['alpha'])):.2f}")
    tree_nodes = _tree_nodes(method_rows)
    in_run = _in_run_forward_ratio(method_rows, base_rows)
    if in_run is not None:  # the same runs' own target forwards (a cost model measured apart may catch another
        # state of a shared machine: specrepro.bench.run.with_in_run_predictions)
        parts.append(f"its target forward per step took {in_run:.2f}× the baseline's in these runs (medians)")
    elif tree_nodes:
        ratio = _cost_ratio(tables, tree_nodes + 1, source)
        if ratio is not None:
            parts.append(f"verifying a {tree_nodes}-node tree ({tree_nodes + 1} tokens) costs {ratio[0]:.1f}× a "
                         f"1-token forward on {ratio[1]}")
    elif "gamma" in method_rows and np.isfinite(_num(method_rows["gamma"])).all():
        gamma = int(np.nanmax(_num(method_rows["gamma"])))
        ratio = _cost_ratio(tables, gamma + 1, source) if gamma >= 1 else None
        if ratio is not None:
            parts.append(f"verifying γ + 1 = {gamma + 1} tokens costs {ratio[0]:.1f}× a 1-token forward on "
                         f"{ratio[1]}")
    return "; ".join(parts)


def _methods(df: pd.DataFrame, query: str, what: str) -> list[str]:
    if not query:
        raise ValueError(f"the rule needs a '{what}' parameter (a query on the selected rows)")
    names = list(dict.fromkeys(df.query(query, engine="python")["method"].astype(str)))
    if not names:
        raise NotRun(f"no rows for {what} ({query})")
    return names


def _best_of(claim, n: int) -> str:
    """A maximum over several methods is allowed only if the claim says "best of N" (N as in the standard profile;
    another profile may sweep fewer: then the returned note says so, and the scorecard shows the actual N).

    Raises:
        ValueError: ``n`` > 1 candidates and the claim does not say "best of".
    """
    if n <= 1:
        return ""
    m = re.search(r"best of (\d+)", claim["claim"])
    if not m:
        raise ValueError(f"claim {claim['id']}: the selection has {n} candidate methods; a maximum over them must "
                         f"say 'best of {n}' in the claim")
    return "" if int(m.group(1)) == n else f"the claim's best of {m.group(1)} is a best of {n} here"


# ------------------------------------------------------------------------------------------------------- rules

#: rule name -> function(claim, tables) -> Outcome; the docstring of each states its rule
RULES: dict[str, Callable[[pd.Series, Tables], Outcome]] = {}
#: rule name -> the parameter keys its claims may pass in ``params``
RULE_PARAMS: dict[str, tuple[str, ...]] = {}


def rule(*keys: str):
    def register(fn):
        RULES[fn.__name__] = fn
        RULE_PARAMS[fn.__name__] = tuple(keys)
        return fn
    return register


#: parameters any claim may pass, whatever its rule (read by :func:`score_claim`, not by the rule): ``draft=own dtype``
#: - the claim judges a draft model in its own dtype (the configuration closest to the paper's), so a table whose
#: provenance names the draft's int8 copy (``draft`` or ``draft_method`` containing "int8") gives "not run", with
#: that table's reading shown beside the verdict, never as it
COMMON_PARAMS = {"draft": ("own dtype",)}


#: chain rules that are exact (positive rows of notebook 01's tables); every other rule there is a negative control
EXACT_RULES = ("speculative", "block")


@rule("select", "compare", "value")
def printed_precision(claim, tables: Tables) -> Outcome:
    """For numbers the paper computed from a closed form at its own inputs (:data:`TEST_CLAUSES`): the test is
    whether every compared number of ours, rounded to the decimals the paper prints, equals the paper's (tolerance:
    half a unit of the last printed decimal); it compares printed digits, so it can fail. Reproduced exactly if it
    says yes, not reproduced if not (a closed form matches or it does not: no trend, no interval).

    Params: ``compare`` = ``ours=paper, ...`` column pairs compared row by row (the paper's numbers as the notebook
    tabulated them beside ours), or ``value`` = one column compared with ``paper_value``.
    """
    p = params_of(claim)
    df = _rows(claim, tables, p)
    if p.get("compare"):
        pairs = [tuple(s.strip() for s in part.split("=")) for part in p["compare"].split(",")]
        digits = max(_decimals(" ".join(f"{v}" for v in df[b])) for _, b in pairs)
        ours = np.concatenate([_num(df[a]) for a, _ in pairs])
        paper = np.concatenate([_num(df[b]) for _, b in pairs])
    else:
        digits = _decimals(claim["paper_value"])
        ours = _num(df[p["value"]])
        paper = np.full(len(ours), _paper_range(claim)[0])
    paper = np.round(paper, digits)
    ok = np.abs(ours - paper) <= 0.5 * 10 ** -digits + 1e-9
    if len(ours) == 1:
        text, value = f"{ours[0]:.{digits}f}", float(ours[0])
    else:
        text, value = f"{int(ok.sum())}/{len(ok)} equal at {digits} decimals", None
    verdict = judge_test(ok.all(), can_fail=True)
    if verdict == EXACT:
        return Outcome(verdict, text, value, n=len(ok), unit="numbers")
    worst = int(np.argmax(np.abs(ours - paper)))
    return Outcome(verdict, text, value,
                   f"{(~ok).sum()} of {len(ok)} differ; worst: ours {ours[worst]:.{digits + 2}f} vs paper "
                   f"{paper[worst]:g}", n=len(ok), unit="numbers")


@rule("tolerance")
def exact_sampler(claim, tables: Tables) -> Outcome:
    """For an asserted (proved) exactness statement (:data:`TEST_CLAUSES`). The test says yes if (a) exact
    enumeration puts speculative sampling - and every other exact chain rule the table has (``block``: block
    verification, Sun et al. 2025) - within ``tolerance`` (TV, default 1e-12) of the target in every setting and (b)
    their chi-square goodness-of-fit tests are not rejected at level 1e-3; it can fail if negative controls were run
    (any other rule) and every one is caught by (a) somewhere (TV > 0.01) and rejected by (b). Reproduced exactly if
    both; not reproduced if the test says no; inconclusive if it says yes but a control passes unseen (or none ran).
    Tables: ``exactness_enumeration; exactness_goodness_of_fit`` (notebook 01).
    """
    p = params_of(claim)
    enum_name, gof_name = _names(claim["our_table"])
    enum, gof = tables.get(enum_name), tables.get(gof_name)
    tol = _float(p, "tolerance", 1e-12)
    worst = enum.groupby("rule")["tv_to_target"].max()
    pvals = gof.set_index("rule")["p_value"].astype(float)
    if "speculative" not in worst or "speculative" not in pvals:
        raise NotRun("no 'speculative' rows")
    exact_rules = [r for r in EXACT_RULES if r in worst.index]
    controls = [r for r in worst.index if r not in EXACT_RULES]
    n_settings = int((enum["rule"] == "speculative").sum())
    n_text = f" (N = {int(gof.set_index('rule').loc['speculative', 'n'])} samples)" if "n" in gof else ""
    text = (f"worst TV {worst[exact_rules].max():.1e} over {n_settings} settings"
            f"{' (' + ' and '.join(exact_rules) + ' verification)' if len(exact_rules) > 1 else ''}; "
            f"χ² p = {', '.join(f'{pvals[r]:.2f}' for r in exact_rules if r in pvals)}{n_text}")
    fails = []
    for r in exact_rules:
        if worst[r] > tol:
            fails.append(f"{r}: enumerated TV {worst[r]:.2e} > {tol:g}")
        if r in pvals and pvals[r] < GOF_LEVEL:
            fails.append(f"{r}: χ² rejects the sampler (p = {pvals[r]:.1e})")
    blind = [r for r in controls if worst[r] <= 0.01 or pvals.get(r, 1.0) >= GOF_LEVEL]
    verdict = judge_test(not fails, can_fail=bool(controls) and not blind)
    why = "; ".join(fails) if fails else (
        f"negative controls not caught: {', '.join(blind)}" if blind else
        "" if controls else "no negative controls were run")
    if controls and not blind:
        text += f"; {len(controls)} negative controls caught"
    return Outcome(verdict, text, float(worst["speculative"]), why, n=n_settings, unit="settings")


@rule("select", "value")
def all_identical(claim, tables: Tables) -> Outcome:
    """For an asserted identity (greedy decoding of a method returns the baseline's greedy tokens;
    :data:`TEST_CLAUSES`: the test compares tokens, so it can fail). Reproduced exactly if every selected run's
    ``value`` column is true (output token-identical to the greedy baseline); not reproduced if any is false (the
    reason counts them); not run if no run recorded the comparison.
    """
    p = params_of(claim)
    df = _rows(claim, tables, p)
    same = _truth(df[p["value"]]).dropna()
    if same.empty:
        raise NotRun(f"no run recorded {p['value']}")
    n_ok = int(same.sum())
    prompts = df.loc[same.index, "prompt"].nunique() if "prompt" in df else None
    text = f"{n_ok}/{len(same)} runs identical" + (f" ({prompts} prompt{'s' if prompts > 1 else ''})" if prompts else "")
    verdict = judge_test(n_ok == len(same), can_fail=True)
    if verdict == EXACT:
        return Outcome(verdict, text, 1.0, n=len(same), unit="runs")
    bad = df.loc[same.index[~same.astype(bool)]]
    who = ", ".join(sorted(set(bad["method"].astype(str)))) if "method" in bad else ""
    return Outcome(verdict, text, n_ok / len(same),
                   f"{len(same) - n_ok} runs differ from the baseline" + (f" ({who})" if who else ""), n=len(same),
                   unit="runs")


@rule("select", "value", "explained")
def identical_up_to_ties(claim, tables: Tables) -> Outcome:
    """For an asserted identity checked on a whole workload in floating point (one greedy speculative and one greedy
    AR output per prompt; :data:`TEST_CLAUSES`: the test compares tokens, so it can fail). The test says yes if
    every output is token-identical to AR's (``value``) or departs from it only at a near-tie of the target's top-2
    logits (``explained``: the run's tie bound, fixed by its command before any output exists; batched verification
    and one-token decoding round differently and may break an exact or near tie either way), the reason then
    counting those near-ties: reproduced exactly; not reproduced if any output departs where the target's choice was
    not a near-tie; not run without the table. Our number is the share of prompts with a departure that is not a
    near-tie, with its 95% Clopper-Pearson interval over prompts.
    """
    from scipy.stats import binomtest

    p = params_of(claim)
    df = _rows(claim, tables, p)
    same = _truth(df[p.get("value") or "identical"])
    tie = _truth(df[p.get("explained") or "explained"]).fillna(False).astype(bool)
    if same.isna().any():
        raise NotRun(f"{int(same.isna().sum())} prompts lack the comparison")
    same = same.astype(bool)
    n, n_same = len(df), int(same.sum())
    n_tie = int((~same & tie).sum())
    n_bad = n - n_same - n_tie
    ci = binomtest(n_bad, n).proportion_ci(0.95, method="exact")
    text = (f"{n_same}/{n} prompts identical, {n_tie} near-tie departures, {n_bad} other departures "
            f"(share {n_bad / n:.3f} [{ci.low:.3f}, {ci.high:.3f}], n = {n} prompts)")
    verdict = judge_test(n_bad == 0, can_fail=True)
    if verdict != EXACT:
        bad = df.loc[~same & ~tie]
        who = ", ".join(map(str, bad["prompt_id" if "prompt_id" in bad else "prompt"].head(5)))
        return Outcome(verdict, text, n_bad / n,
                       f"{n_bad} outputs depart from AR where the target's top-2 logits were not a near-tie ({who})",
                       lo=ci.low, hi=ci.high, n=n)
    reason = (f"{n_tie} outputs depart from AR, each at a near-tie of the target's top-2 logits (floating-point "
              "rounding, not the algorithm)" if n_tie else "")
    return Outcome(verdict, text, 0.0, reason, lo=ci.low, hi=ci.high, n=n)


@rule("select", "method", "baseline", "value", "null", "summary", "beside")
def paired_ratio(claim, tables: Tables) -> Outcome:
    """For a measured ratio (a speedup over AR, tree over chain, MSS over naive sampling). Per prompt, the method's
    ``value`` (default tokens_per_s) over the baseline's on the same prompt (and repeat), from
    :func:`specrepro.measure.harness.paired_ratios`; our number is the median over prompts with its 95% bootstrap interval,
    judged by :data:`INTERVAL_CLAUSES` with the null ``null`` (default 1) and the paper's side above it.
    Reproduced exactly if the interval holds the paper's value (or meets its range) and lies above the null; trend
    reproduced if the interval lies above the null only; not reproduced if it lies
    below; inconclusive if it contains the null, or if the table is summary-only (no ``prompt`` column: one pooled
    row per method, so no interval; ``summary`` names the pooled ratio column shown instead). ``beside`` (a method
    query) names extensions of ours shown after the verdict's number with their own paired ratio and interval, never
    judged: the verdict uses the configuration closest to the paper's (e.g. a draft model in its own dtype), the
    int8 draft and other extensions stand beside it.

    Params: ``select`` (rows of the table, e.g. one temperature), ``method`` / ``baseline`` (queries choosing the
    method rows and the one baseline method). Several methods are allowed only if the claim says "best of N": then
    the one with the highest median is reported with its own interval.
    """
    p = params_of(claim)
    df = _rows(claim, tables, p)
    value = p.get("value") or "tokens_per_s"
    null = _float(p, "null", 1.0)
    paper = _paper_range(claim)
    if "prompt" not in df.columns:
        cands = _methods(df, p.get("method", ""), "method")
        _best_of(claim, len(cands))
        col = p.get("summary") or value
        rows = df[df["method"].astype(str).isin(cands)]
        i = int(np.nanargmax(_num(rows[col])))
        est = float(_num(rows[col])[i])
        n = int(rows["runs"].iloc[i]) if "runs" in rows else None
        name = str(rows["method"].iloc[i])
        return Outcome(INCONCLUSIVE, f"{est:.2f}× ({name}), pooled, no interval" + (f" (n = {n} prompts)" if n else ""),
                       est, f"{_names(claim['our_table'])[0]} is summary-only (one pooled row per method, no "
                            f"per-prompt rows): no interval can be computed; its notebook must save per-prompt runs",
                       n=n)
    bases = _methods(df, p.get("baseline", ""), "baseline")
    if len(bases) != 1:
        raise ValueError(f"claim {claim['id']}: the baseline query matches {bases}, not one method")

    def beside() -> str:
        text = ""
        for m in _methods(df, p["beside"], "beside") if p.get("beside") else []:
            b_est, b_lo, b_hi, b_n = stat_ci(paired_ratios(df, m, bases[0], value).to_numpy())
            text += f"; beside, not judged: {m} {_fmt_ci(b_est, b_lo, b_hi, b_n, _prompt_unit(df), suffix='×')}"
        return text

    try:
        cands = _methods(df, p.get("method", ""), "method")
    except NotRun as e:  # the judged configuration is not in the table: say so, and still show what stands beside it
        raise NotRun(f"{e} in the committed {_names(claim['our_table'])[0]}: the table predates the method; rerun "
                     f"its make rule", ours=beside().removeprefix("; ")) from None
    note = _best_of(claim, len(cands))
    results = []
    for m in cands:
        r = paired_ratios(df, m, bases[0], value)
        results.append((m, *stat_ci(r.to_numpy())))
    name, est, lo, hi, n = max(results, key=lambda t: t[1])
    verdict, why = _judge(lo, hi, paper, null, +1, f"{name} over {bases[0]}")
    text = _fmt_ci(est, lo, hi, n, _prompt_unit(df), suffix="×") + (
        f"; best of {len(cands)}: {name}" if len(cands) > 1 else f" ({name} / {bases[0]})")
    text += beside()
    if verdict != EXACT:
        expl = _explain(df[df["method"].astype(str) == name], df[df["method"].astype(str) == bases[0]], tables,
                        _names(claim["our_table"])[0])
        why = why + (f"; {expl}" if expl else "")
    why = "; ".join(s for s in (why, note) if s)
    return Outcome(verdict, text, est, why, lo, hi, n)


@rule("select", "method", "baseline", "c", "tolerance")
def computed_speedup(claim, tables: Tables) -> Outcome:
    """For a speedup the paper computed from α (Leviathan Thm 3.8 with its c), not measured: always "computed"
    (:data:`OTHER_DEFINITIONS`), never a reproduction. Ours, computed the same way: per prompt, the walltime
    improvement (1 − α^(γ+1)) / ((1 − α)(γc + 1)) at that prompt's measured α, γ and the paper's ``c`` (default 0),
    averaged over the prompt's timed passes; median over prompts with its 95% bootstrap interval. The reason says
    whether the paper's number lies inside that interval (or within the relative ``tolerance``, default 10%, of our
    median), i.e. whether our α gives the paper's computed number. Our measured speedup of the same runs (paired
    per-prompt ratio over ``baseline``, with its interval) is reported beside it, not judged: the paper measured
    nothing here.
    """
    p = params_of(claim)
    df = _rows(claim, tables, p)
    (name,) = _methods(df, p.get("method", ""), "method")
    rows = df[df["method"].astype(str) == name]
    c = _float(p, "c", 0.0)
    predicted = walltime_improvement(np.clip(_num(rows["alpha"]), 0, 0.999999), _num(rows["gamma"]), c)
    # repeated passes of a prompt are one unit: average them per prompt first, so they do not narrow the interval
    predicted = pd.Series(np.asarray(predicted, dtype=float), index=rows["prompt"].to_numpy()).groupby(level=0).mean()
    est, lo, hi, n = stat_ci(predicted.to_numpy())
    paper = _paper_range(claim)[0]
    tol = _float(p, "tolerance", 0.10)
    text = ("computed " + _fmt_ci(est, lo, hi, n, _prompt_unit(rows), suffix="×")
            + f" (α = {np.nanmean(_num(rows['alpha'])):.2f}, c = {c:g})")
    measured = ""
    if p.get("baseline"):
        (base,) = _methods(df, p["baseline"], "baseline")
        m_est, m_lo, m_hi, m_n = stat_ci(paired_ratios(df, name, base).to_numpy())
        measured = "; measured beside, not judged: " + _fmt_ci(m_est, m_lo, m_hi, m_n, _prompt_unit(df), suffix="×")
    agree = _meets(lo, hi, (paper, paper)) or abs(est / paper - 1) <= tol
    why = (f"a closed form at our measured α, not a measurement: the paper's {paper:g} "
           + ("lies within our computed interval or tolerance" if agree else
              f"is {abs(est / paper - 1):.0%} from our computed {est:.2f}× (tolerance {tol:.0%}): our α differs"))
    return Outcome(COMPUTED, text + measured, est, why, lo, hi, n)


@rule("select", "value", "null")
def value_in_interval(claim, tables: Tables) -> Outcome:
    """For a measured rate (an acceptance rate α). Per prompt the ``value`` column (one row per prompt); our number
    is the mean over prompts with its 95% bootstrap interval (:data:`INTERVAL_CLAUSES`). Reproduced exactly if the
    interval holds the paper's value and lies above the ``null`` (default 0.5: "most of the time"); trend reproduced if it lies
    above the null only; not reproduced if below; inconclusive if it contains the null.
    """
    p = params_of(claim)
    df = _rows(claim, tables, p)
    est, lo, hi, n = stat_ci(_num(df[p["value"]]), np.mean)
    positions = int(_num(df["positions"]).sum()) if "positions" in df else None
    verdict, why = _judge(lo, hi, _paper_range(claim), _float(p, "null", 0.5), +1, p["value"])
    text = _fmt_ci(est, lo, hi, n, "prompts") + (f", {positions} positions" if positions else "")
    return Outcome(verdict, text, est, why, lo, hi, n)


@rule("select", "key", "lower", "higher", "value", "cells")
def row_order(claim, tables: Tables) -> Outcome:
    """For a measured ordering (row ``lower`` below row ``higher`` in every setting), a direction without a number
    (:data:`INTERVAL_CLAUSES`, null 0): per prompt and setting (the ``cells`` columns, e.g. workload and
    temperature), the paired difference value(higher) − value(lower); per setting, its mean over prompts with a 95%
    bootstrap interval. Trend reproduced if every setting's interval lies above 0; not reproduced if any lies below
    0; inconclusive otherwise. No exact verdict: the papers' numbers come from other models, tokenizers and corpora,
    so only the direction is judged.
    """
    p = params_of(claim)
    df = _rows(claim, tables, p)
    key, value = p["key"], p["value"]
    cells = [c.strip() for c in p.get("cells", "").split(",") if c.strip()]
    parts, verdicts, los = [], {}, []
    n_min = None
    for cell, d in (df.groupby(cells, sort=True) if cells else [((), df)]):
        wide = d.pivot_table(index="prompt", columns=key, values=value, aggfunc="mean")
        if p["lower"] not in wide or p["higher"] not in wide:
            raise NotRun(f"rows {p['lower']!r} and {p['higher']!r} not both measured")
        est, lo, hi, n = stat_ci((wide[p["higher"]] - wide[p["lower"]]).to_numpy(), np.mean)
        n_min = n if n_min is None else min(n_min, n)
        label = " ".join(str(x) for x in (cell if isinstance(cell, tuple) else (cell,)))
        parts.append(f"{label}: {_fmt_ci(est, lo, hi, n, 'prompts', digits=3)}")
        los.append(lo)
        verdicts[label] = _judge(lo, hi, None, 0.0, +1, label)[0]
    text = f"{p['higher']} − {p['lower']} {value}: " + "; ".join(parts)
    verdict = _all_of(verdicts.values())
    where = ", ".join(k for k, v in verdicts.items() if v == verdict)
    why = {NOT_REPRODUCED: f"{p['higher']} is below {p['lower']} in {where}",
           INCONCLUSIVE: f"the interval contains 0 (or cannot be computed) in {where}",
           TREND: "direction only: other models, tokenizers and corpora than the paper's"}[verdict]
    return Outcome(verdict, text, float(min(los)) if verdict == TREND else None, why, n=n_min)


@rule("select", "method", "measured", "tolerance", "c")
def close_to_prediction(claim, tables: Tables) -> Outcome:
    """Measured against Leviathan's prediction, row by row (one row per prompt and setting of the first table).
    ``measured`` = tokens_per_step (predicted by Eq. 1 at the row's α and γ) or speedup (the row's tokens/s over the
    same prompt's AR tokens/s at the same temperature and in the same timed pass (``repeat``, where recorded),
    predicted by Thm 3.8 at the row's α, γ and a cost coefficient c). Where c comes from: ``c=in_run`` measures it in
    the first table's own runs (:func:`specrepro.measure.harness.in_run_cost_coefficient`: per draft model, the draft's time
    per drafted token without its prompt prefill over AR's target forward per step, same prompt and pass), so that
    prediction and measurement share one machine state; otherwise (``c=summary``, the default) it is the ``c`` that
    the second table records for the method (notebook 04: from cost curves timed once, before the runs).

    The statistic keeps its sign: per row the gap measured / predicted − 1 (negative: slower than predicted), per
    prompt its median over settings and passes, our number the median over prompts with a 95% bootstrap interval.
    Beside it, whether the measurement rises with the prediction: Spearman's ρ over each prompt's rows (at least 3),
    the mean over prompts with a 95% bootstrap interval (prompts are the independent units).

    A formula the paper computed (paper_kind computed): :data:`MARGIN_CLAUSES` with the margin ±``tolerance``
    (default 10%, absorbing that acceptance is not i.i.d. in real text) on the gap's interval. A gap the paper
    measured (paper_value: the paper's own signed gap, e.g. the median over its table's rows):
    :data:`INTERVAL_CLAUSES` on two scales - the gap's interval must hold the paper's signed gap, and ρ's interval
    must exclude its null 0 (a prediction that tells nothing about the measurement) on the positive side.
    """
    p = params_of(claim)
    rows, measured, predicted, c_note = _measured_and_predicted(claim, tables, p)
    gap = measured / predicted - 1
    per_prompt = pd.Series(gap, index=rows["prompt"].to_numpy()).groupby(level=0).median()
    est, lo, hi, n = stat_ci(per_prompt.to_numpy())
    pairs = pd.DataFrame({"prompt": rows["prompt"].to_numpy(), "pred": predicted, "meas": measured})
    rhos = [spearman(g["pred"].to_numpy(), g["meas"].to_numpy())[0] for _, g in pairs.groupby("prompt", sort=False)
            if len(g) >= 3]
    rhos = np.asarray([r for r in rhos if np.isfinite(r)], dtype=float)
    rho, rho_lo, rho_hi, rho_n = stat_ci(rhos, np.mean) if rhos.size else (math.nan, math.nan, math.nan, 0)
    text = (f"median signed gap {_fmt_ci(est, lo, hi, n, 'prompts', sign=True)} ({len(gap)} runs)"
            + ("" if math.isnan(rho) else f"; ρ within prompts {_fmt_ci(rho, rho_lo, rho_hi, rho_n, 'prompts')}")
            + c_note)
    if claim["paper_kind"] == "computed":
        tol = _float(p, "tolerance", 0.10)
        verdict = judge_margin(lo, hi, (-tol, tol))
        why = {EXACT: "", NOT_REPRODUCED: f"the gap's interval lies outside ±{tol:.0%}",
               INCONCLUSIVE: f"the gap's interval is not within ±{tol:.0%}"}[verdict]
        return Outcome(verdict, text, est, why, lo, hi, n)
    paper = _paper_range(claim)
    holds = _meets(lo, hi, paper)
    verdict = judge_interval(rho_lo, rho_hi, 0.0, +1, holds)
    pv = f"{paper[0]:+.2f}" if paper[0] == paper[1] else f"{paper[0]:+.2f} to {paper[1]:+.2f}"
    gap_part = (f"the gap's interval holds the paper's {pv}" if holds else
                f"the gap's interval [{lo:+.2f}, {hi:+.2f}] does not hold the paper's {pv}" if _has_ci(lo, hi)
                else "no gap interval")
    why = {EXACT: "",
           TREND: f"ρ's interval lies above 0 but {gap_part}",
           NOT_REPRODUCED: "ρ's interval lies below 0: the measurement falls as the prediction rises",
           INCONCLUSIVE: f"ρ's interval contains 0 or cannot be computed; {gap_part}"}[verdict]
    return Outcome(verdict, text, est, why, lo, hi, n)


def _monotone(claim, tables: Tables, sign: int) -> Outcome:
    p = params_of(claim)
    df = _rows(claim, tables, p)
    x_col, y_col = p["x"], p["y"]
    groups = list(df.groupby(p["series"], sort=False)) if p.get("series") else [(y_col, df)]
    texts, verdicts, stats_, n_all = [], {}, [], None
    paper_change = _series_numbers(claim, p.get("paper_change", ""))
    for label, d in groups:
        if d[x_col].nunique() < 3:
            raise NotRun(f"fewer than 3 values of {x_col}")
        xs = np.sort(d[x_col].unique())
        if "prompt" in d.columns:  # per-prompt rows: paired difference y(last x) − y(first x) per prompt
            wide = d.pivot_table(index="prompt", columns=x_col, values=y_col, aggfunc="mean")
            est, lo, hi, n = stat_ci((wide[xs[-1]] - wide[xs[0]]).to_numpy(), np.mean)
            target = paper_change.get(str(label))
            texts.append(f"{label}: {y_col} at {x_col} = {xs[-1]:g} minus at {xs[0]:g}: "
                         + _fmt_ci(est, lo, hi, n, "prompts", sign=True)
                         + (f" (paper {target:+.2f})" if target is not None else ""))
            verdicts[str(label)] = _judge(lo, hi, None if target is None else (target, target), 0.0, sign,
                                          str(label))
        else:  # summary points: Spearman's test over the x values (a direction, no interval of the change)
            d = d.sort_values(x_col)
            ys = _num(d[y_col])
            est, pval = spearman(_num(d[x_col]), ys)
            n = len(d)
            r_lo, r_hi = spearman_interval(est, n)
            texts.append(f"{label}: {ys[0]:.2f} → {ys[-1]:.2f}"
                         + ("" if math.isnan(est) else f" (ρ = {est:.2f} [{r_lo:.2f}, {r_hi:.2f}], p = {pval:.2g}, "
                                                       f"n = {n} points)"))
            verdicts[str(label)] = _judge(r_lo, r_hi, None, 0.0, sign, str(label))
        n_all = n if n_all is None else min(n_all, n)
        stats_.append(est)
    verdict = _all_of(v for v, _ in verdicts.values())
    why = "; ".join(f"{k}: {r}" for k, (v, r) in verdicts.items() if v == verdict and r)
    return Outcome(verdict, "; ".join(texts), float(np.mean(stats_)) if verdict in (EXACT, TREND) else None, why,
                   n=n_all)


def _series_numbers(claim, text: str) -> dict[str, float]:
    """``"greedy:0.48,stochastic:0.59"`` -> {"greedy": 0.48, "stochastic": 0.59} (the ``paper_change`` parameter).

    Raises:
        ValueError: an item is not ``series:number``.
    """
    out = {}
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        name, sep, value = item.rpartition(":")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise ValueError(f"claim {claim['id']}: paper_change item {item!r} is not series:number")
    return out


@rule("select", "x", "y", "series", "paper_change")
def increases(claim, tables: Tables) -> Outcome:
    """For a measured direction (y rises with x; :data:`INTERVAL_CLAUSES`, null 0). Per-prompt rows: per prompt the
    paired difference y(largest x) − y(smallest x), its mean over prompts with a 95% bootstrap interval, judged
    against the paper's own change where ``paper_change`` gives it (``series:number,...``: the paper's y at the
    largest x minus at the smallest) - reproduced exactly if the interval holds it and lies above 0, trend
    reproduced if it lies above 0 only (or the paper gives no change); summary rows (no ``prompt`` column):
    Spearman's ρ over the x values with its 95% interval by Fisher's z, a direction only. Not reproduced if an
    interval lies below 0; inconclusive if one contains 0. Every ``series`` must hold: the claim's verdict is the
    weakest of its series' (not reproduced, then inconclusive, then trend reproduced, then reproduced exactly).
    """
    return _monotone(claim, tables, +1)


@rule("select", "x", "y", "series", "paper_change")
def decreases(claim, tables: Tables) -> Outcome:
    """As :func:`increases` with the direction reversed: the paper's side of the null 0 is below it (y falls with
    x); reproduced exactly if the interval lies below 0 and holds the paper's (negative) change, trend reproduced if
    below 0 only, not reproduced if above 0, inconclusive if it contains 0; the weakest series decides.
    """
    return _monotone(claim, tables, -1)


@rule("select", "x", "y")
def grows_linearly(claim, tables: Tables) -> Outcome:
    """For a measured "about linear in x" statement without a number (:data:`INTERVAL_CLAUSES`, a direction: the
    null is slope 0, the paper's side above it). Least squares y = a + b·x (scipy.stats.linregress) over the selected
    rows, with the slope's 95% t-interval and r² shown. Trend reproduced if the slope's interval lies above 0; not
    reproduced if it lies below 0; inconclusive if it contains 0. No exact verdict: the paper gives no number. Rows
    that repeat a timing (a ``repeat`` column beside ``prompt``) are averaged per prompt and x first: the prompt is
    the unit, so repeated passes do not narrow the interval.
    """
    from scipy import stats

    p = params_of(claim)
    df = _rows(claim, tables, p)
    if {"prompt", "repeat"} <= set(df.columns) and df["repeat"].nunique() > 1:
        df = (df.assign(**{p["y"]: _num(df[p["y"]])}).groupby(["prompt", p["x"]], as_index=False)[p["y"]].mean())
    x, y = _num(df[p["x"]]), _num(df[p["y"]])
    keep = ~(np.isnan(x) | np.isnan(y))
    x, y = x[keep], y[keep]
    if len(np.unique(x)) < 3:
        raise NotRun(f"fewer than 3 values of {p['x']}")
    fit = stats.linregress(x, y)
    t = stats.t.ppf(0.975, len(x) - 2)
    lo, hi = float(fit.slope - t * fit.stderr), float(fit.slope + t * fit.stderr)
    text = (f"{fit.slope:+.1f} {p['y'].replace('_', ' ')} per unit {p['x']} [{lo:+.1f}, {hi:+.1f}], "
            f"r² = {fit.rvalue ** 2:.2f}, n = {len(x)} points")
    verdict, why = _judge(lo, hi, None, 0.0, +1, "the slope")
    return Outcome(verdict, text, float(fit.slope), why, lo, hi, len(x))


@rule("select", "x", "tolerance")
def speedup_peaks(claim, tables: Tables) -> Outcome:
    """For "the speedup plateaus or regresses as K grows, optimal at K = k" (paper_value: k;
    :data:`INTERVAL_CLAUSES` on two scales). Needs per-prompt runs (``prompt``, ``method``, ``tokens_per_s`` and the
    draft length column ``x``; x = 0 is AR). The statistic: per prompt, the tokens/s at the largest K swept over the
    tokens/s at the paper's k (:func:`specrepro.measure.harness.paired_ratios`), median over prompts with a 95%
    bootstrap interval; its null is 1 + ``tolerance`` (default 0.05: still a gain past k), the paper's side below it
    (a plateau or a regression). The paper's number k is held if it lies in the 95% bootstrap interval (over prompts)
    of our best K (highest median paired speedup over AR). Reproduced exactly if both; trend reproduced if the
    interval lies below the null only; not reproduced if it lies above it (the speedup still grows past k);
    inconclusive otherwise, and always for a summary-only table (no per-prompt rows: no interval).
    """
    p = params_of(claim)
    df = _rows(claim, tables, p)
    x = p.get("x") or "K"
    k_paper = int(_paper_range(claim)[0])
    tol = _float(p, "tolerance", 0.05)
    if "prompt" not in df.columns:
        col = "speedup_vs_ar"
        best = df.iloc[int(np.nanargmax(_num(df[col])))]
        runs = int(best["runs"]) if "runs" in best else None
        return Outcome(INCONCLUSIVE, f"best K = {int(best[x])} ({float(best[col]):.2f}×, pooled), no interval"
                       + (f" (n = {runs} prompts)" if runs else ""), float(best[x]),
                       f"{_names(claim['our_table'])[0]} is summary-only (one pooled row per K): no per-prompt "
                       f"interval; its notebook must save per-prompt runs", n=runs)
    by_k = df.groupby(x)["method"].first()
    if 0 not in by_k.index or k_paper not in by_k.index:
        raise NotRun(f"the sweep lacks K = 0 (AR) or the paper's K = {k_paper}")
    ks = sorted(k for k in by_k.index if k > 0)
    over_ar = pd.DataFrame({k: paired_ratios(df, by_k[k], by_k[0]) for k in ks}).dropna()
    medians = over_ar.median()
    k_best = int(medians.idxmax())
    k_lo, k_hi = _best_k_interval(over_ar)
    est, lo, hi, n = stat_ci(paired_ratios(df, by_k[ks[-1]], by_k[k_paper]).to_numpy())
    text = (f"best K = {k_best} [{k_lo:g}, {k_hi:g}] ({medians[k_best]:.2f}× AR); K = {ks[-1]} over K = {k_paper}: "
            + _fmt_ci(est, lo, hi, n, _prompt_unit(df), suffix="×"))
    verdict = judge_interval(lo, hi, 1 + tol, -1, k_lo <= k_paper <= k_hi)
    why = {EXACT: "",
           TREND: f"no gain past K = {k_paper}, but the best K's interval [{k_lo:g}, {k_hi:g}] excludes {k_paper}",
           NOT_REPRODUCED: f"the speedup still grows past K = {k_paper}",
           INCONCLUSIVE: "the interval does not tell a plateau from a gain" if _has_ci(lo, hi) else
           "no interval (fewer than 2 prompts)"}[verdict]
    return Outcome(verdict, text, float(k_best), why, lo, hi, n)


@rule("setting", "method", "baseline", "margin")
def quality_unchanged(claim, tables: Tables) -> Outcome:
    """For "task quality is unchanged under speculative sampling" (:data:`MARGIN_CLAUSES`, the margin ±``margin``,
    default 0.10 = 10 points). Per problem of the completions table (second table; columns setting, method, prompt,
    completion, and ``passed`` when the notebook stored per-problem results), the paired difference passed(method) −
    passed(baseline): 0 where the two completions are token-identical (same text, hence the same pass/fail), else
    from ``passed``. Our number is the mean difference (pass@1 points) with its 95% bootstrap interval over problems.
    Reproduced exactly ("quality unchanged") if the interval lies within the margin; not reproduced if it lies wholly
    outside (quality changed); inconclusive otherwise, and when completions differ but the table has no per-problem
    ``passed`` column (then no paired interval can be computed; the pooled pass@1 of the first table is shown).
    """
    p = params_of(claim)
    setting, method, base = p["setting"], p["method"], p.get("baseline") or "ar"
    margin = _float(p, "margin", 0.10)
    comp = _table(claim, tables, 1)
    comp = comp[comp["setting"] == setting]
    a = comp[comp["method"] == method].set_index("prompt")
    b = comp[comp["method"] == base].set_index("prompt")
    if a.empty or b.empty:
        raise NotRun(f"no {setting} completions for {method} and {base}")
    common = a.index.intersection(b.index)
    same = (a.loc[common, "completion"].fillna("") == b.loc[common, "completion"].fillna("")).to_numpy()
    summary = _table(claim, tables, 0)
    pooled = summary[summary["setting"] == setting].set_index("method")["pass@1"] if "pass@1" in summary else None
    pooled_text = (f"pass@1 {base} {float(pooled[base]):.0%} vs {method} {float(pooled[method]):.0%}"
                   if pooled is not None and {base, method} <= set(pooled.index) else "")
    if "passed" in comp.columns:
        diff = _num(a.loc[common, "passed"]) - _num(b.loc[common, "passed"])
    elif same.all():
        diff = np.zeros(len(common))
    else:
        return Outcome(judge_margin(None, None, (-margin, margin)),
                       f"{pooled_text} (n = {len(common)} problems, {int(same.sum())} identical completions), no "
                       f"paired interval", None,
                       f"per-problem pass/fail is not stored ({_names(claim['our_table'])[1]} has no 'passed' "
                       f"column) and {int((~same).sum())} completions differ: no paired interval can be computed",
                       n=len(common))
    est, lo, hi, n = stat_ci(diff, np.mean)
    text = (f"Δ pass@1 = {est * 100:+.0f} points [{lo * 100:+.0f}, {hi * 100:+.0f}], n = {n} problems"
            if _has_ci(lo, hi) else f"Δ pass@1 = {est * 100:+.0f} points, no interval (n = {n})")
    if same.all():
        text += ", every completion token-identical"
    if pooled_text:
        text += f" ({pooled_text})"
    verdict = judge_margin(lo, hi, (-margin, margin))
    why = {EXACT: "", NOT_REPRODUCED: f"the interval lies outside ±{margin * 100:.0f} points: quality changed",
           INCONCLUSIVE: f"the interval is not within ±{margin * 100:.0f} points"}[verdict]
    return Outcome(verdict, text, est, why, lo, hi, n)


@rule("select", "value", "count")
def falls_with_head(claim, tables: Tables) -> Outcome:
    """For "head k's prediction gets worse with k" (an asserted direction without a number; :data:`INTERVAL_CLAUSES`,
    null 0). Rows = heads with the held-out accuracy ``value`` (default top1) over ``count`` positions (default
    positions). The statistic: head 1's accuracy minus the last head's, with Newcombe's 95% interval (the heads are
    scored on nearly the same positions, which the interval treats as independent samples). Trend reproduced if the
    interval lies above 0; not reproduced if below 0; inconclusive if it contains 0. No exact verdict: the paper
    gives no number. Each head's Wilson interval, Fisher's one-sided p and any rise from one head to the next are
    shown beside.
    """
    from scipy import stats

    p = params_of(claim)
    df = _rows(claim, tables, p).sort_values("head")
    acc = _num(df[p.get("value") or "top1"])
    cnt = _num(df[p.get("count") or "positions"]).astype(int)
    if len(acc) < 2:
        raise NotRun("fewer than 2 heads")
    hits = np.round(acc * cnt).astype(int)
    p_fall = float(stats.fisher_exact([[hits[0], cnt[0] - hits[0]], [hits[-1], cnt[-1] - hits[-1]]],
                                      alternative="greater").pvalue)
    est, lo, hi = _diff_of_proportions(hits[0], cnt[0], hits[-1], cnt[-1])
    cis = [stats.binomtest(int(h), int(c)).proportion_ci(method="wilson") for h, c in zip(hits, cnt)]
    text = ("top-1 " + ", ".join(f"head {int(h)} {a:.2f} [{ci.low:.2f}, {ci.high:.2f}]"
                                 for h, a, ci in zip(df["head"], acc, cis))
            + f"; head 1 − head {int(df['head'].iloc[-1])}: {est:+.2f} [{lo:+.2f}, {hi:+.2f}]"
            + f"; n = {int(cnt.min())}-{int(cnt.max())} positions per head; Fisher p = {p_fall:.1e}")
    rises = [f"head {int(df['head'].iloc[i + 1])} > head {int(df['head'].iloc[i])}"
             for i in range(len(acc) - 1) if acc[i + 1] > acc[i]]
    verdict, why = _judge(lo, hi, None, 0.0, +1, "head 1 − the last head")
    if rises:
        why += f"; beside: {', '.join(rises)}"
    return Outcome(verdict, text, float(acc[0]), why, lo, hi, n=int(cnt.min()))


@rule("select")
def typical_shifts(claim, tables: Tables) -> Outcome:
    """For the asserted "typical acceptance does not preserve the target's distribution" (:data:`TEST_CLAUSES`). The
    test says yes if the chi-square test rejects typical acceptance (p < 1e-3); it can fail (it is shown to tell the
    cases apart) if it rejects none of the distribution-preserving modes (p ≥ 1e-3). Reproduced exactly if both; not
    reproduced if it does not reject typical acceptance; inconclusive if it rejects a preserving mode too.
    """
    p = params_of(claim)
    df = _rows(claim, tables, p)
    keep = _truth(df["distribution_preserving"]).astype(bool)
    typ, exact = df[~keep], df[keep]
    if typ.empty or exact.empty:
        raise NotRun("needs typical acceptance and at least one distribution-preserving mode")
    tv_t, tv_e = float(_num(typ["tv_distance"]).max()), float(_num(exact["tv_distance"]).max())
    p_t, p_e = float(_num(typ["gof_p_value"]).max()), float(_num(exact["gof_p_value"]).min())
    n = int(_num(df["samples"]).min()) if "samples" in df else None
    text = (f"TV {tv_t:.3f} (typical) vs ≤ {tv_e:.3f} (exact modes); χ² p = {p_t:.1e} vs ≥ {p_e:.2f}"
            + (f", n = {n} samples each" if n else ""))
    verdict = judge_test(p_t < GOF_LEVEL, can_fail=p_e >= GOF_LEVEL)
    why = {EXACT: "", NOT_REPRODUCED: "the χ² test does not reject typical acceptance",
           INCONCLUSIVE: "the χ² test also rejects a distribution-preserving mode"}[verdict]
    return Outcome(verdict, text, tv_t, why, n=n)


def _measured_and_predicted(claim, tables: Tables, p: dict) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, str]:
    """The rows :func:`close_to_prediction` compares, their measured and predicted values, and a note on c."""
    df = _rows(claim, tables, p)
    rows = df.query(p["method"], engine="python") if p.get("method") else df
    if rows.empty:
        raise NotRun("no rows to compare with the prediction")
    alpha = np.clip(_num(rows["alpha"]), 0, 0.999999)
    gamma = _num(rows["gamma"])
    if p["measured"] == "tokens_per_step":
        return rows, _num(rows["tokens_per_step"]), np.asarray(expected_tokens(alpha, gamma), dtype=float), ""
    if p["measured"] != "speedup":
        raise ValueError(f"claim {claim['id']}: measured must be tokens_per_step or speedup, not {p['measured']!r}")
    summary = _table(claim, tables, 1)
    key = ["method", "temperature"] if "temperature" in summary else ["method"]
    c_summary = rows[key].merge(summary[key + ["c"]].drop_duplicates(key), on=key, how="left")["c"]
    c_source = p.get("c", "summary")
    if c_source == "in_run":
        baseline = df.loc[pd.to_numeric(df["gamma"], errors="coerce") == 0, "method"]
        if baseline.empty:
            raise NotRun(f"no AR runs (gamma 0) in {_names(claim['our_table'])[0]} to measure c against")
        by_draft = in_run_cost_coefficient(df, baseline=str(baseline.iloc[0])).set_index("draft")
        drafts = rows["method"].map(draft_of_method)
        c = drafts.map(by_draft["c"]).to_numpy(dtype=float)
        if not np.isfinite(c).all():
            raise NotRun(f"no γ sweep in {_names(claim['our_table'])[0]} to measure c in the runs for "
                         f"{sorted(set(drafts[~np.isfinite(c)]))}")
        shown = by_draft.loc[list(dict.fromkeys(drafts))]
        c_note = "; c in the runs " + ", ".join(
            f"{d} {r.c:.2f} [{r.c_lo:.2f}, {r.c_hi:.2f}]" for d, r in shown.iterrows())
        before = c_summary.groupby(drafts.to_numpy()).median()
        if before.notna().any():
            c_note += " (pre-run cost curve: " + ", ".join(f"{before[d]:.2f}" for d in shown.index
                                                           if pd.notna(before.get(d))) + ")"
    elif c_source == "summary":
        c, c_note = c_summary.to_numpy(dtype=float), ""
    else:
        raise ValueError(f"claim {claim['id']}: c must be in_run or summary, not {c_source!r}")
    # the same prompt's AR run at the same temperature and in the same timed pass (repeat)
    key = [k for k in ("temperature", "repeat") if k in df] + ["prompt"]
    ar = df[df["gamma"] == 0].set_index(key)
    idx = pd.MultiIndex.from_frame(rows[key]) if len(key) > 1 else pd.Index(rows["prompt"])
    measured = _num(rows["tokens_per_s"]) / ar["tokens_per_s"].reindex(idx).to_numpy(dtype=float)
    return rows, measured, np.asarray(walltime_improvement(alpha, gamma, np.nan_to_num(c)), dtype=float), c_note


def _best_k_interval(ratios: pd.DataFrame, seed: int = 0, n_resamples: int = 2000) -> tuple[float, float]:
    """The 95% percentile-bootstrap interval of the best K (the column of ``ratios`` - prompts × K, paired speedups
    over AR - with the highest median over prompts), resampling prompts."""
    rng = np.random.default_rng(seed)
    values, ks = ratios.to_numpy(dtype=float), np.asarray(ratios.columns, dtype=float)
    picks = rng.integers(0, len(values), size=(n_resamples, len(values)))
    best = ks[np.nanargmax(np.nanmedian(values[picks], axis=1), axis=1)]
    return float(np.percentile(best, 2.5)), float(np.percentile(best, 97.5))


def _diff_of_proportions(h1: int, n1: int, h2: int, n2: int) -> tuple[float, float, float]:
    """p1 − p2 with Newcombe's 95% hybrid score interval (from each proportion's Wilson interval)."""
    from scipy import stats

    a = stats.binomtest(int(h1), int(n1)).proportion_ci(method="wilson")
    b = stats.binomtest(int(h2), int(n2)).proportion_ci(method="wilson")
    p1, p2 = h1 / n1, h2 / n2
    return (p1 - p2, p1 - p2 - math.hypot(p1 - a.low, b.high - p2), p1 - p2 + math.hypot(a.high - p1, p2 - b.low))


@rule("select", "method", "baseline", "value", "null", "summary", "beside", "requires", "requires_baseline")
def needs_precondition(claim, tables: Tables) -> Outcome:
    """For a claim whose regime needs a precondition that our own runs must show first (Medusa-2 fine-tunes a
    backbone that Medusa-1 heads already speed up): the precondition is the paired ratio of ``requires`` over
    ``requires_baseline`` (queries on the same table, :func:`specrepro.measure.harness.paired_ratios`, median over
    prompts with a 95% bootstrap interval), and it holds if the interval lies above ``null`` (default 1). If it
    holds, the claim is judged exactly as :func:`paired_ratio` judges it; if not, "not testable here": the reason
    gives the precondition's reading, and the claim's own paired ratio is shown beside, never judged.
    """
    p = params_of(claim)
    df = _rows(claim, tables, p)
    (req,) = _methods(df, p.get("requires", ""), "requires")
    (req_base,) = _methods(df, p.get("requires_baseline", ""), "requires_baseline")
    est, lo, hi, n = stat_ci(paired_ratios(df, req, req_base, p.get("value") or "tokens_per_s").to_numpy())
    out = paired_ratio(claim, tables)
    null = _float(p, "null", 1.0)
    if _beyond(lo, hi, null, +1):
        return out
    pre = _fmt_ci(est, lo, hi, n, _prompt_unit(df), suffix="×")
    return Outcome(NOT_TESTABLE, f"not judged: {out.ours}", None,
                   f"needs {req} to speed up {req_base} first; here {req} / {req_base} = {pre}, not above {null:g}",
                   n=out.n)


@rule()
def not_testable(claim, tables: Tables) -> Outcome:
    """For a statement whose regime nothing here can reach (the claim's ``caveat`` says why, e.g. a multi-GPU serving
    system): always "not testable here", never reproduced, never not reproduced.
    """
    return Outcome(NOT_TESTABLE, "", None, claim["caveat"] or "no regime here can test this claim")


# ------------------------------------------------------------------------------------------------------ scoring


def _int8_drafted(prov: dict) -> bool:
    """Whether a table's provenance names the int8 copy of the draft (its ``draft`` or ``draft_method``)."""
    return any("int8" in str(prov.get(k) or "") for k in ("draft", "draft_method"))


def _judged_draft(claim, tables: Tables, names: list[str], out: Outcome) -> Outcome:
    """``out``, or "not run" where the claim judges the draft in its own dtype (``draft=own dtype``) and one of its
    tables was drafted by the int8 copy: that table's reading then stands beside the verdict, not judged."""
    if params_of(claim).get("draft") != "own dtype":
        return out
    int8 = [n for n in names if _int8_drafted(tables.provenance(n))]
    if not int8:
        return out
    where = f"notebooks/{claim['notebook']}.ipynb" if claim["notebook"] else "its make rule"
    ours = (f"beside, not judged: the int8 copy of the draft: {out.ours} ({out.verdict})" if out.ours
            and out.verdict != NOT_RUN else out.ours)
    return Outcome(NOT_RUN, ours, None, f"the committed {', '.join(int8)} was drafted by the int8 copy of the draft; "
                                        f"the claim judges the draft in its own dtype: rerun {where}")


def score_claim(claim: pd.Series, tables: Tables) -> dict:
    """Apply the claim's rule to the tables and return one scorecard row (:data:`CARD_COLUMNS`).

    A missing table or a rule's :class:`NotRun` gives "not run" (a claim that names no table is its rule's alone:
    :func:`not_testable`), and so does a table drafted by the int8 copy of the
    draft for a claim that judges the draft in its own dtype (``draft=own dtype``); any other exception of a rule propagates (a rule
    that raises on the committed tables is a bug, and ``make test`` must fail on it).
    """
    names = _names(claim["our_table"])
    prov = tables.provenance(names[0]) if names else {}
    draft = str(prov.get("draft") or "")
    if draft and _int8_drafted(prov) and "int8" not in draft:
        draft += " (int8)"  # the draft model's name, and its int8 copy where a draft_method says so
    models = " + ".join(m for m in (str(prov.get("target") or ""), draft) if m)
    row = {k: claim[k] for k in ("id", "paper", "arxiv", "source", "setting", "claim", "paper_value", "paper_kind",
                                 "rule", "our_table")}
    row["group"] = claim.get("group", "")
    row.update(our_setting="; ".join(s for s in (models, claim["our_setting"]) if s),
               hardware=_hardware(prov), profile=prov.get("profile", tables.profile if names else ""),
               commit=prov.get("commit", ""))
    missing = [n for n in names if tables.get(n) is None]
    if missing:
        where = (f"notebooks/{claim['notebook']}.ipynb" if claim["notebook"]
                 else " ".join(f"make data/results/{n}.csv" for n in missing))
        out = Outcome(NOT_RUN, "", None, f"{', '.join(missing)} not written for profile {tables.profile}: run {where}")
    else:
        try:
            out = RULES[claim["rule"]](claim, tables)
        except NotRun as e:
            out = Outcome(NOT_RUN, e.ours, None, str(e))
        out = _judged_draft(claim, tables, names, out)
    row.update(verdict=out.verdict, ours=out.ours, ours_value=out.value, ours_lo=out.lo, ours_hi=out.hi, n=out.n,
               n_unit=n_unit(out), reason=out.reason)
    return row


def score(profile: str = STANDARD, claims: pd.DataFrame | None = None, tables: Tables | None = None) -> pd.DataFrame:
    """The scorecard of ``profile``: one row per claim (:data:`CARD_COLUMNS`): the paper's number and kind, ours with
    its interval and n, our setting, hardware, profile, commit, the verdict and its reason."""
    claims = load_claims() if claims is None else claims
    tables = Tables(profile) if tables is None else tables
    card = pd.DataFrame([score_claim(c, tables) for _, c in claims.iterrows()], columns=CARD_COLUMNS)
    notes = stability_notes(tables)
    card["stability"] = [notes.get(i, "") for i in card["id"]]
    return card


def stability_notes(tables: Tables) -> dict[str, str]:
    """Claim id -> a note for every claim the verdict history (``verdict_stability``, written by ``python -m
    specrepro verdict-history``) marks unstable: each verdict it read with the number of distinct readings (tables'
    bytes and rule version) that gave it, and whether the verdict moved with its rule, with the data, or both. Empty
    without the table."""
    import re

    stab = tables.get("verdict_stability")
    if stab is None:
        return {}
    notes = {}
    for _, r in stab.iterrows():
        if str(r["unstable"]).lower() != "true":
            continue
        readings = [f"{m.group(1).strip()} ×{len(m.group(2).split(','))}" for m in re.finditer(r"([^;(]+?) \(([^)]*)\)",
                                                                                        str(r["verdicts"]))]
        why = [w for w, k in (("its rule", "moved_with_rule"), ("the committed runs", "moved_with_data"))
               if str(r[k]).lower() == "true"]
        notes[r["claim"]] = (f"unstable over {int(r['readings'])} distinct readings: {'; '.join(readings)} "
                             f"(moved with {' and '.join(why)})")
    return notes


def rules_table() -> pd.DataFrame:
    """Each rule's name, its parameters and its statement (its docstring on one line)."""
    return pd.DataFrame([{"rule": name, "params": ", ".join(RULE_PARAMS[name]),
                          "statement": " ".join((fn.__doc__ or "").split())} for name, fn in RULES.items()])
