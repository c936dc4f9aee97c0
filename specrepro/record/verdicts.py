"""The scorecard's verdicts, defined once: the clauses each judging helper evaluates (:data:`INTERVAL_CLAUSES`,
:data:`MARGIN_CLAUSES`, :data:`TEST_CLAUSES`) are also the text of :data:`VERDICT_DEFINITIONS`, which the README
renders (:func:`verdict_definitions`); a rule's outcome (:class:`Outcome`, :class:`NotRun`); the formatting of an
interval. The rules are in ``rules_asserted``, ``rules_measured`` and ``rules_trends``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable

__all__ = ["EXACT", "TREND", "INCONCLUSIVE", "NOT_REPRODUCED", "NOT_RUN", "COMPUTED", "NOT_TESTABLE", "VERDICTS",
           "JUDGED", "Clause", "INTERVAL_CLAUSES", "MARGIN_CLAUSES", "TEST_CLAUSES", "OTHER_DEFINITIONS",
           "VERDICT_DEFINITIONS", "verdict_definitions", "judge_interval", "judge_margin", "judge_test", "NotRun",
           "parse_margin", "fmt_margin", "margin_bounds", "within_margin", "Outcome", "N_PHRASE", "n_unit"]


EXACT, TREND, INCONCLUSIVE = "reproduced exactly", "trend reproduced", "inconclusive"
NOT_REPRODUCED, NOT_RUN = "not reproduced", "not run"
COMPUTED, NOT_TESTABLE = "computed", "not testable here"
VERDICTS = (EXACT, TREND, INCONCLUSIVE, NOT_REPRODUCED, COMPUTED, NOT_TESTABLE, NOT_RUN)
#: the verdicts that judge a claim against a reading of ours; computed, not testable here and not run judge nothing
JUDGED = (EXACT, TREND, INCONCLUSIVE, NOT_REPRODUCED)


@dataclass(frozen=True)
class Clause:
    """One clause of a verdict's definition: its text and the predicate a judging helper evaluates (the first clause
    that holds gives the verdict)."""

    verdict: str
    text: str
    holds: Callable[..., bool]


def has_ci(lo, hi) -> bool:
    return lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi)


def is_beyond(lo, hi, null: float, direction: int) -> bool:
    """Whether [lo, hi] excludes ``null`` on the side ``direction`` points to (+1: above, -1: below)."""
    return has_ci(lo, hi) and (lo > null if direction > 0 else hi < null)


#: a number or a direction the paper measured, read from our 95% interval [lo, hi] against the null on the paper's
#: side, and whether it lies within the paper's number ± the claim's margin; :func:`judge_interval`
INTERVAL_CLAUSES = (
    Clause(EXACT, "our whole 95% interval lies within the paper's number (or range) ± the equivalence margin "
                  "registered for the claim, and excludes the null on the paper's side (an equivalence test: more "
                  "data can only narrow the interval, never earn this by widening it; where the number and the null "
                  "are on two scales, each has its own interval)",
           lambda lo, hi, null, direction, holds_paper: is_beyond(lo, hi, null, direction) and holds_paper is True),
    Clause(TREND, "the interval excludes the null on the paper's side but does not lie within the paper's number ± "
                  "its margin (the reason says whether the effect is smaller or larger than the paper's by more "
                  "than the margin, or the interval still reaches out of it), or the paper states a direction and no "
                  "number",
           lambda lo, hi, null, direction, holds_paper: is_beyond(lo, hi, null, direction)),
    Clause(NOT_REPRODUCED, "the interval excludes the null on the other side",
           lambda lo, hi, null, direction, holds_paper: is_beyond(lo, hi, null, -direction)),
    Clause(INCONCLUSIVE, "the interval contains the null, or no interval can be computed",
           lambda lo, hi, null, direction, holds_paper: True),
)

#: agreement within a stated margin [m_lo, m_hi] (e.g. task quality unchanged within ±10 points); :func:`judge_margin`
MARGIN_CLAUSES = (
    Clause(EXACT, "for agreement within a stated margin: the whole interval lies within the margin",
           lambda lo, hi, m_lo, m_hi: has_ci(lo, hi) and m_lo <= lo and hi <= m_hi),
    Clause(NOT_REPRODUCED, "for agreement within a stated margin: the whole interval lies outside it",
           lambda lo, hi, m_lo, m_hi: has_ci(lo, hi) and (lo > m_hi or hi < m_lo)),
    Clause(INCONCLUSIVE, "for agreement within a stated margin: the interval straddles an end of the margin, or no "
                         "interval can be computed",
           lambda lo, hi, m_lo, m_hi: True),
)

#: an asserted yes/no property (exactness, greedy identity, a closed form at the paper's inputs), read from the stated
#: test's answer and whether the test can fail; :func:`judge_test`
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


#: verdict -> its definition: the texts of the clauses the judging helpers evaluate (one source for code and docs)
VERDICT_DEFINITIONS = {v: "; ".join([c.text for c in INTERVAL_CLAUSES + MARGIN_CLAUSES + TEST_CLAUSES if c.verdict == v]
                                    + ([OTHER_DEFINITIONS[v]] if v in OTHER_DEFINITIONS else [])) for v in VERDICTS}


def verdict_definitions(bold: bool = True) -> str:
    """Markdown: one bullet per verdict of :data:`VERDICTS`, with its definition (:data:`VERDICT_DEFINITIONS`)."""
    return "".join(f"* {f'**{v}**' if bold else v}: {VERDICT_DEFINITIONS[v]}.\n" for v in VERDICTS)


def first_clause(clauses, *args) -> Clause:
    return next(c for c in clauses if c.holds(*args))


def judge_interval(lo, hi, null: float, direction: int, holds_paper: bool | None) -> str:
    """The verdict of :data:`INTERVAL_CLAUSES` for our 95% interval [lo, hi] (None or NaN: none), the null, the paper's
    side of it (``direction`` +1: above) and ``holds_paper`` (:func:`within_margin`; None: a direction only)."""
    return first_clause(INTERVAL_CLAUSES, lo, hi, null, direction, holds_paper).verdict


def judge_margin(lo, hi, margin: tuple[float, float]) -> str:
    """The verdict of :data:`MARGIN_CLAUSES` for our 95% interval [lo, hi] against the stated margin (lo, hi)."""
    return first_clause(MARGIN_CLAUSES, lo, hi, *margin).verdict


def judge_test(says_yes: bool, can_fail: bool) -> str:
    """The verdict of :data:`TEST_CLAUSES` for an asserted property's test."""
    return first_clause(TEST_CLAUSES, bool(says_yes), bool(can_fail)).verdict


def meets_range(lo, hi, paper: tuple[float, float]) -> bool:
    """Whether the interval [lo, hi] holds the paper's number (or meets its range ``paper`` = (lo, hi))."""
    return has_ci(lo, hi) and lo <= paper[1] and hi >= paper[0]


def parse_margin(text) -> tuple[str, float] | None:
    """A claim's ``margin`` parameter: ``"10%"`` relative (the paper's number × (1 ± 0.10)), ``"0.05"`` absolute;
    empty or None: no margin. Raises ValueError for text that is neither, or a negative margin."""
    if text is None or str(text).strip() == "":
        return None
    t = str(text).strip()
    try:
        kind, value = ("relative", float(t[:-1]) / 100) if t.endswith("%") else ("absolute", float(t))
    except ValueError:
        raise ValueError(f"margin {text!r}: write a relative margin as '10%' or an absolute one as '0.05'") from None
    if not value >= 0:
        raise ValueError(f"margin {text!r} must be >= 0")
    return kind, value


def fmt_margin(margin: tuple[str, float] | None) -> str:
    """``±10%`` or ``±0.05``; "" for no margin."""
    if margin is None:
        return ""
    return f"±{margin[1] * 100:g}%" if margin[0] == "relative" else f"±{margin[1]:g}"


def margin_bounds(paper: tuple[float, float], margin: tuple[str, float]) -> tuple[float, float]:
    """The paper's number (or range) widened by its margin: relative margins scale with the number's size."""
    kind, m = margin
    if kind == "relative":
        return paper[0] - abs(paper[0]) * m, paper[1] + abs(paper[1]) * m
    return paper[0] - m, paper[1] + m


def within_margin(lo, hi, paper: tuple[float, float], margin: tuple[str, float] | None) -> bool:
    """Whether the whole interval [lo, hi] lies within the paper's number ± ``margin`` (the equivalence test)."""
    if margin is None or not has_ci(lo, hi):
        return False
    b_lo, b_hi = margin_bounds(paper, margin)
    return b_lo <= lo and hi <= b_hi


def judge_reading(lo, hi, paper: tuple[float, float] | None, null: float, direction: int, what: str,
                  margin: tuple[str, float] | None = None) -> tuple[str, str]:
    """(verdict, reason) of :func:`judge_interval` for a measured claim whose number (``paper``, a range; None: a
    direction only) and null lie on the scale of our interval [lo, hi]; the reason says where the interval lies
    against the null and the paper's number ± ``margin`` (:func:`parse_margin`); "" for "reproduced exactly"."""
    holds = None if paper is None else within_margin(lo, hi, paper, margin)
    verdict = judge_interval(lo, hi, null, direction, holds)
    if not has_ci(lo, hi):
        return verdict, f"no interval for {what} (too few prompts: a median's needs 6, a mean's 2)"
    pv = "" if paper is None else f"{paper[0]:g}" if paper[0] == paper[1] else f"{paper[0]:g} to {paper[1]:g}"
    side = "above" if direction > 0 else "below"
    if verdict == EXACT:
        return verdict, ""
    if verdict == TREND:
        if paper is None:
            return verdict, f"the interval lies {side} {null:g}; the paper states a direction, no number to hold"
        if margin is None:
            return verdict, (f"the interval lies {side} {null:g}; no equivalence margin is registered for the "
                             f"paper's {pv}, so it cannot read exactly")
        b_lo, b_hi = margin_bounds(paper, margin)
        band = f"the paper's {pv} {fmt_margin(margin)} [{b_lo:.3g}, {b_hi:.3g}]"
        if hi < b_lo or lo > b_hi:
            size = "smaller" if (hi < b_lo) == (direction > 0) else "larger"
            return verdict, (f"the interval lies {side} {null:g} and wholly {'below' if hi < b_lo else 'above'} "
                             f"{band}: an effect on the paper's side, {size} than the paper's by more than the margin")
        return verdict, f"the interval lies {side} {null:g} but reaches out of {band}; more data may sharpen it"
    if verdict == NOT_REPRODUCED:
        return verdict, f"the interval [{lo:.2f}, {hi:.2f}] lies on the other side of {null:g}" + (
            f" from the paper's {pv}" if paper is not None else "")
    near = paper is not None and meets_range(lo, hi, paper)
    return verdict, f"the interval [{lo:.2f}, {hi:.2f}] contains {null:g}" + (
        f" (and the paper's {pv})" if near else f" (and not the paper's {pv})" if paper is not None else "")


def all_of(verdicts) -> str:
    """The verdict of a claim that must hold in every setting: the first of not reproduced, inconclusive, trend
    reproduced and reproduced exactly among ``verdicts``."""
    verdicts = list(verdicts)
    return next(v for v in (NOT_REPRODUCED, INCONCLUSIVE, TREND, EXACT) if v in verdicts)


class NotRun(Exception):
    """Raised by a rule when the rows it needs were not measured in this profile (message = reason); ``ours``: what
    the table holds that a reader should still see, not judged."""

    def __init__(self, reason: str, ours: str = ""):
        super().__init__(reason)
        self.ours = ours


@dataclass
class Outcome:
    """One rule's result: the verdict, our number as text, our estimate with its 95% interval and n (None where not
    one number), the reason, and what n counts (``unit``; empty when the text says it: :func:`n_unit`)."""

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
    """What an outcome's n counts: its ``unit``, else the unit of its text's first :data:`N_PHRASE`, else ""."""
    if out.n is None:
        return ""
    m = N_PHRASE.search(out.ours or "")
    return out.unit or (m and m.group(2)) or ""


def prompt_unit(df) -> str:
    """The unit of n for per-prompt rows: "prompts", or "prompts × 3 passes" when a ``repeat`` column says so."""
    passes = int(df["repeat"].nunique()) if "repeat" in getattr(df, "columns", ()) else 1
    return "prompts" if passes <= 1 else f"prompts × {passes} passes"


def fmt_ci(est: float, lo: float, hi: float, n: int, unit: str, digits: int = 2, suffix: str = "",
            sign: bool = False) -> str:
    """``1.43× [1.26, 1.66], n = 5 prompts`` (or ``..., no interval (n = 1 ...)``); ``unit``'s first word is made
    singular for n = 1 ("1 prompt × 3 passes"); ``sign``: every number with its sign (``-0.16 [-0.19, -0.14]``)."""
    f = f"{'+' if sign else ''}.{digits}f"
    head = f"{est:{f}}{suffix}"
    first, _, rest = unit.partition(" ")
    unit = (first[:-1] if n == 1 and first.endswith("s") else first) + (f" {rest}" if rest else "")
    if has_ci(lo, hi):
        return f"{head} [{lo:{f}}, {hi:{f}}], n = {n} {unit}"
    return f"{head}, no interval (n = {n} {unit})"
