"""The replication scorecard: each statement of the four papers beside our measurement, with a verdict.

The claims are ``data/claims.csv`` (:func:`load_claims`): per statement, where the paper makes it, its number and
whether the paper **measured**, **computed** or **asserted** it, the table that measures it, and a rule of
:data:`specrepro.record.rulekit.RULES` with its parameters; :func:`score` applies the rules to the result tables. No
rule takes a maximum over γ or methods unless its claim says "best of N", no verdict is typed by hand, no rule reads a
claim's id, and a rule that raises is a bug and propagates (only :class:`NotRun` becomes a verdict, "not run").
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from specrepro.files import repo_root
from specrepro.record import rules_asserted, rules_measured, rules_trends  # noqa: F401 - they fill RULES
from specrepro.record.results import STANDARD
from specrepro.record.rulekit import COMMON_PARAMS, RULE_PARAMS, RULES, param_names, params_of
from specrepro.record.tables import Tables, hardware_of
# the verdict names are also imported from here (report.py, tests)
from specrepro.record.verdicts import (COMPUTED, EXACT, INCONCLUSIVE, JUDGED, N_PHRASE, NOT_REPRODUCED,  # noqa: F401
                                       NOT_RUN, NOT_TESTABLE, TREND, VERDICTS, NotRun, Outcome, fmt_margin, n_unit,
                                       parse_margin, verdict_definitions)

__all__ = ["PAPER_KINDS", "GROUPS", "CLAIM_COLUMNS", "CARD_COLUMNS", "RULE_INTERVALS", "claims_path", "load_claims",
           "artifacts", "score_claim", "score", "earlier_rule_notes", "stability_notes", "rules_table"]

#: what the paper's number is: measured in an experiment, computed from a formula, or asserted (stated or proved,
#: no measurement behind it)
PAPER_KINDS = ("measured", "computed", "asserted")
#: what a claim is about, for the scorecard's two tables (no rule reads it): **correctness** - exact by construction or
#: proved by a test that could fail (exactness, greedy identity, closed forms at the paper's inputs); **performance** -
#: timed or counted in runs (speedups, acceptance rates, tokens per step, quality under sampling, closed forms at our
#: measured inputs)
GROUPS = ("correctness", "performance")
CLAIM_COLUMNS = ("id", "paper", "arxiv", "source", "setting", "claim", "paper_value", "paper_kind", "group", "rule",
                 "params", "our_table", "notebook", "our_setting", "caveat")
CARD_COLUMNS = ["id", "paper", "arxiv", "source", "setting", "claim", "paper_value", "paper_kind", "group", "ours",
                "ours_value", "ours_lo", "ours_hi", "n", "n_unit", "our_setting", "hardware", "profile", "commit",
                "verdict", "reason", "rule", "our_table", "stability", "margin", "registered", "interval"]

_MED = "sign-test interval of the median over prompts (order statistics; ≥ 95% coverage at any n ≥ 6)"
_BCA = "BCa bootstrap over prompts (9,999 resamples, rows sorted first)"
#: rule -> how its 95% interval is computed (why: :func:`specrepro.stats.stat_ci`), named on every row of the card
#: ("" for a test or an exact comparison)
RULE_INTERVALS = {
    "printed_precision": "", "exact_sampler": "", "all_identical": "", "typical_shifts": "", "not_testable": "",
    "identical_up_to_ties": "Clopper-Pearson (exact binomial) interval of the share of departures",
    "paired_ratio": _MED, "needs_precondition": _MED, "computed_speedup": _MED, "value_in_interval": _BCA,
    "close_to_prediction": _MED + "; ρ: " + _BCA,
    "quality_unchanged": _BCA.replace("prompts", "problems") + "; where every completion is identical, ± the "
                         "Clopper-Pearson bound of the share of problems whose pass/fail differs", "row_order": _BCA,
    "increases": _BCA + "; on summary points, Fisher's z interval of Spearman's ρ",
    "decreases": _BCA + "; on summary points, Fisher's z interval of Spearman's ρ",
    "grows_linearly": "t-interval of the least-squares slope",
    "speedup_peaks": _MED + " (the ratio); percentile bootstrap over prompts, 2,000 resamples (the best K)",
    "falls_with_head": "Newcombe's interval of a difference of two proportions",
}


def claims_path() -> Path:
    """``data/claims.csv`` in the repository."""
    return repo_root() / "data" / "claims.csv"


def load_claims(path: str | Path | None = None) -> pd.DataFrame:
    """Read the claims file (every field as text, empty fields as ""). Raises ValueError for a missing column, an
    empty or repeated id, an unknown rule, paper_kind or group, or a parameter its rule does not take or a value
    :data:`COMMON_PARAMS` does not allow."""
    df = pd.read_csv(path or claims_path(), dtype=str, keep_default_na=False)
    df = df.apply(lambda col: col.str.strip())
    missing = [c for c in CLAIM_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"claims file lacks columns {missing}")
    if (df["id"] == "").any() or df["id"].duplicated().any():
        raise ValueError(f"claim ids must be present and unique: {sorted(df['id'][df['id'].duplicated()])}")
    for col, label, known in (("rule", "rules", sorted(RULES)), ("paper_kind", "paper_kind", list(PAPER_KINDS)),
                              ("group", "group", list(GROUPS))):
        bad = sorted(set(df[col]) - set(known))
        if bad:
            raise ValueError(f"unknown {label} {bad}; known: {known}")
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


def _int8_drafted(prov: dict) -> bool:
    """Whether a table's provenance names the int8 copy of the draft (its ``draft`` or ``draft_method``)."""
    return any("int8" in str(prov.get(k) or "") for k in ("draft", "draft_method"))


def artifacts(prov: dict) -> str:
    """What the models of a table were: each zoo checkpoint its provenance names (``target``, ``draft``) with its file
    and quantization (:data:`specrepro.models.ZOO`), and the dtype the arithmetic ran in; "" for no zoo model."""
    from specrepro.models import ZOO

    names = [str(prov.get(k)) for k in ("target", "draft") if prov.get(k) and str(prov.get(k)) in ZOO]
    if not names:
        return ""
    files = "; ".join(f"{n}: {ZOO[n].description}" for n in dict.fromkeys(names))
    return f"checkpoints: {files}; dequantized, arithmetic in {prov.get('dtype') or 'float32'}"


def score_claim(claim: pd.Series, tables: Tables) -> dict:
    """Apply the claim's rule to the tables and return one scorecard row (:data:`CARD_COLUMNS`): "not run" for a
    missing table, a rule's :class:`NotRun`, or a table drafted by the int8 copy of the draft for a claim that judges
    the draft in its own dtype; any other exception of a rule propagates."""
    names = param_names(claim["our_table"])
    prov = tables.provenance(names[0]) if names else {}
    draft = str(prov.get("draft") or "")
    if draft and _int8_drafted(prov) and "int8" not in draft:
        draft += " (int8)"  # the draft model's name, and its int8 copy where a draft_method says so
    models = " + ".join(m for m in (str(prov.get("target") or ""), draft) if m)
    row = {k: claim[k] for k in ("id", "paper", "arxiv", "source", "setting", "claim", "paper_value", "paper_kind",
                                 "rule", "our_table")}
    row["group"] = claim.get("group", "")
    row.update(our_setting="; ".join(s for s in (models, claim["our_setting"], artifacts(prov)) if s),
               hardware=hardware_of(prov), profile=prov.get("profile", tables.profile if names else ""),
               commit=prov.get("commit", ""))
    params, missing = params_of(claim), [n for n in names if tables.get(n) is None]
    notebook = f"notebooks/{claim['notebook']}.ipynb" if claim["notebook"] else ""
    if missing:
        where = notebook or " ".join(f"make data/results/{n}.csv" for n in missing)
        out = Outcome(NOT_RUN, "", None, f"{', '.join(missing)} not written for profile {tables.profile}: run {where}")
    else:
        try:
            out = RULES[claim["rule"]](claim, tables)
        except NotRun as e:
            out = Outcome(NOT_RUN, e.ours, None, str(e))
        # a claim that judges the draft in its own dtype: a table drafted by the int8 copy stands beside, not judged
        int8 = [n for n in names if params.get("draft") == "own dtype" and _int8_drafted(tables.provenance(n))]
        if int8:
            ours = (f"beside, not judged: the int8 copy of the draft: {out.ours} ({out.verdict})" if out.ours
                    and out.verdict != NOT_RUN else out.ours)
            out = Outcome(NOT_RUN, ours, None, f"the committed {', '.join(int8)} was drafted by the int8 copy of the "
                          f"draft; the claim judges the draft in its own dtype: rerun {notebook or 'its make rule'}")
    margin = params.get("margin")
    if claim["rule"] == "close_to_prediction" and claim["paper_kind"] == "computed":
        margin = params.get("tolerance", "0.10")  # its equivalence margin, on the signed gap's scale
    row.update(verdict=out.verdict, ours=out.ours, ours_value=out.value, ours_lo=out.lo, ours_hi=out.hi, n=out.n,
               n_unit=n_unit(out), reason=out.reason, margin=fmt_margin(parse_margin(margin)),
               interval=RULE_INTERVALS.get(claim["rule"], "") if out.lo is not None or out.n else "")
    return row


def score(profile: str = STANDARD, claims: pd.DataFrame | None = None, tables: Tables | None = None) -> pd.DataFrame:
    """The scorecard of ``profile``: one row per claim (:data:`CARD_COLUMNS`, :func:`score_claim`)."""
    claims = load_claims() if claims is None else claims
    tables = Tables(profile) if tables is None else tables
    card = pd.DataFrame([score_claim(c, tables) for _, c in claims.iterrows()], columns=CARD_COLUMNS)
    notes, earlier = stability_notes(tables), earlier_rule_notes(tables, claims)
    card["stability"] = ["; ".join(x for x in (notes.get(i, ""), earlier.get(i, "")) if x) for i in card["id"]]
    card["registered"] = ""  # filled by specrepro.record.registry.with_registration (the registry reads the claims)
    return card


def earlier_rule_notes(tables: Tables, claims: pd.DataFrame) -> dict[str, str]:
    """Claim id -> the latest reading of the ``verdict_history`` table under a rule other than today's, where it gave
    a judged verdict other than the claim's latest reading ("under its earlier rule paired_ratio (read at
    35a878247632): not reproduced, 0.92× ..."); empty without the table."""
    hist = tables.get("verdict_history")
    if hist is None or hist.empty:
        return {}
    hist = hist.astype(object).fillna("")
    now = hist.groupby("claim")["verdict"].transform("last")
    today = hist["claim"].map(claims.set_index("id")["rule"])
    keep = today.notna() & (hist["rule"] != today) & hist["verdict"].isin(JUDGED) & (hist["verdict"] != now)
    return {r["claim"]: f"under its earlier rule {r['rule']} (read at {r['commit']}): {r['verdict']}, "
                        f"{str(r['ours']).split('; not judged')[0]}"
            for _, r in hist[keep].groupby("claim").tail(1).iterrows()}


def stability_notes(tables: Tables) -> dict[str, str]:
    """Claim id -> a note for each claim the ``verdict_stability`` table marks unstable: each verdict with the number
    of readings that gave it, and whether it moved with its rule, the data or both; empty without the table."""
    stab = tables.get("verdict_stability")
    if stab is None:
        return {}
    notes = {}
    for _, r in stab[stab["unstable"].astype(str).str.lower() == "true"].iterrows():
        readings = [f"{m.group(1).strip()} ×{len(m.group(2).split(','))}"
                    for m in re.finditer(r"([^;(]+?) \(([^)]*)\)", str(r["verdicts"]))]
        why = [w for w, k in (("its rule", "moved_with_rule"), ("the committed runs", "moved_with_data"))
               if str(r[k]).lower() == "true"]
        notes[r["claim"]] = (f"unstable over {int(r['readings'])} distinct readings: {'; '.join(readings)} "
                             f"(moved with {' and '.join(why)})")
    return notes


def rules_table() -> pd.DataFrame:
    """Each rule's name, its parameters and its statement (its docstring on one line)."""
    return pd.DataFrame([{"rule": name, "params": ", ".join(RULE_PARAMS[name]),
                          "statement": " ".join((fn.__doc__ or "").split())} for name, fn in RULES.items()])
