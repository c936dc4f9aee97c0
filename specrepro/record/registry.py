"""The claims registry: each claim's rule, parameters, paper number and statistic as data, stamped with the commit and
date it was registered; the registry only grows.

What this file is: ``data/claims_registry.csv``, one row per registration (:data:`REGISTRY_COLUMNS`). A claim is
registered when it first appears in ``data/claims.csv`` and again whenever how it is judged changes (its rule, its
parameters, the paper's number or kind, the statistic its rule computes, :data:`STATISTICS`, or the rule's code:
``rule_version``, :func:`specrepro.record.history.rule_version`, a hash of the rule function's source and of every
scorecard function and clause it reaches, with the claim's parameters and paper number); a row is never edited or
removed, so the registry shows when each way of judging a claim was fixed, before or after the tables it judged. A
column added later is empty in the rows written before it (``rule_version`` in the first registrations).
:func:`register` appends the registrations that ``data/claims.csv`` needs, stamped with the commit they were made
on (``git rev-parse HEAD``: the parent of the commit that adds them) and the date;
``python -m specrepro.record.registry`` runs it.

What it is not: the claims (``data/claims.csv``, :mod:`specrepro.record.scorecard`) or a verdict.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import subprocess
from pathlib import Path

import pandas as pd

from specrepro.files import atomic_write_text, repo_root
from specrepro.record.history import rule_version
from specrepro.record.scorecard import RULES, load_claims

__all__ = ["REGISTRY_COLUMNS", "JUDGED_BY", "STATISTICS", "registry_path", "load_registry", "pending", "register",
           "with_registration", "main"]

#: one registration: the claim, how it is judged, and the commit and date it was registered on
REGISTRY_COLUMNS = ["id", "rule", "params", "paper_value", "paper_kind", "statistic", "registered_commit",
                    "registered_date", "rule_version"]
#: the stamp of a registration (when, not how)
STAMP = ["registered_commit", "registered_date"]
#: the fields of a registration that say how a claim is judged (a change in any one is a new registration)
JUDGED_BY = ["rule", "params", "paper_value", "paper_kind", "statistic", "rule_version"]
#: rule -> the statistic it computes from the claim's tables (its docstring gives the verdict rule)
STATISTICS = {
    "printed_precision": "our closed-form numbers against the paper's, rounded to its printed decimals",
    "exact_sampler": "worst enumerated TV and χ² p of each exact sampler; the same for each negative control",
    "all_identical": "share of runs whose output is token-identical to the greedy baseline",
    "identical_up_to_ties": "share of prompts departing from AR other than at a near-tie (Clopper-Pearson interval)",
    "typical_shifts": "χ² p of typical acceptance and of each distribution-preserving mode",
    "not_testable": "none (no regime here can test the claim)",
    "paired_ratio": "median over prompts of the per-prompt paired ratio method / baseline (sign-test interval)",
    "needs_precondition": "median paired ratio of the precondition (requires / requires_baseline), then as "
                          "paired_ratio",
    "computed_speedup": "median over prompts of Thm 3.8 at each prompt's measured α, γ and the paper's c",
    "value_in_interval": "mean over prompts of the per-prompt value (BCa bootstrap interval)",
    "close_to_prediction": "median over prompts of the signed gap measured / predicted − 1; mean within-prompt "
                           "Spearman ρ between predicted and measured",
    "quality_unchanged": "mean over problems of the paired pass/fail difference method − baseline",
    "row_order": "per setting, mean over prompts of the paired difference higher − lower",
    "increases": "per series, mean over prompts of y(largest x) − y(smallest x); Spearman ρ on summary rows",
    "decreases": "per series, mean over prompts of y(largest x) − y(smallest x); Spearman ρ on summary rows",
    "grows_linearly": "least-squares slope of y on x (t-interval), r² beside",
    "speedup_peaks": "median over prompts of tokens/s at the largest K over at the paper's K; bootstrap interval "
                     "of the best K",
    "falls_with_head": "head 1's accuracy minus the last head's (Newcombe interval)",
}


def registry_path() -> Path:
    """``data/claims_registry.csv`` in the repository."""
    return repo_root() / "data" / "claims_registry.csv"


def load_registry(path: str | Path | None = None) -> pd.DataFrame:
    """The registry (every field as text); an empty one with :data:`REGISTRY_COLUMNS` if the file does not exist."""
    path = Path(path) if path is not None else registry_path()
    if not path.exists():
        return pd.DataFrame(columns=REGISTRY_COLUMNS, dtype=str)
    # a column added after a registry was written is empty in its rows
    return pd.read_csv(path, dtype=str, keep_default_na=False).reindex(columns=REGISTRY_COLUMNS, fill_value="")


def pending(claims: pd.DataFrame | None = None, registry: pd.DataFrame | None = None) -> pd.DataFrame:
    """The claims of ``claims`` (default: ``data/claims.csv``) whose latest registration is missing or differs from
    how the claim is judged today (:data:`JUDGED_BY`), as registry rows without their stamp.

    Raises:
        KeyError: a claim's rule has no statistic in :data:`STATISTICS`.
    """
    claims = load_claims() if claims is None else claims
    registry = load_registry() if registry is None else registry
    latest = registry.groupby("id", sort=False).tail(1).set_index("id")
    judging = ["rule", "params", "paper_value", "paper_kind"]
    now = claims[["id", *judging]].assign(
        statistic=[STATISTICS[r] for r in claims["rule"]],
        rule_version=[rule_version(*c) for c in claims[judging].itertuples(index=False)])
    stale = now[JUDGED_BY].ne(now[["id"]].join(latest[JUDGED_BY], on="id")[JUDGED_BY]).any(axis=1)
    return now[stale].reset_index(drop=True)[[c for c in REGISTRY_COLUMNS if c not in STAMP]]


def register(path: str | Path | None = None, commit: str | None = None, date: str | None = None) -> pd.DataFrame:
    """Append the registrations :func:`pending` finds to the registry, stamped with ``commit`` (default: ``git
    rev-parse HEAD``, 12 characters) and ``date`` (default: today, UTC); earlier rows are kept as they are. Returns
    the rows appended."""
    path = Path(path) if path is not None else registry_path()
    registry = load_registry(path)
    new = pending(registry=registry)
    if new.empty:
        return new
    if commit is None:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo_root(), capture_output=True, text=True,
                                check=True).stdout.strip()[:12]
    new = new.assign(registered_commit=commit,
                     registered_date=date or _dt.datetime.now(_dt.timezone.utc).date().isoformat())
    if path.exists():
        _add_columns(path)
    header = not path.exists()
    with open(path, "a", encoding="utf-8", newline="") as f:
        new[REGISTRY_COLUMNS].to_csv(f, header=header, index=False)
    return new


def _add_columns(path: Path) -> None:
    """Give a registry written before a column of :data:`REGISTRY_COLUMNS` existed that column, at the end, empty in
    every earlier row: each earlier line stays as it was, followed by one comma per added column."""
    lines = path.read_text(encoding="utf-8").splitlines()
    have = lines[0].split(",") if lines else REGISTRY_COLUMNS
    if have == REGISTRY_COLUMNS:
        return
    if have != REGISTRY_COLUMNS[:len(have)]:
        raise ValueError(f"{path}: columns {have} are not a beginning of {REGISTRY_COLUMNS}")
    added = REGISTRY_COLUMNS[len(have):]
    rows = [line + "," * len(added) for line in lines[1:]]
    atomic_write_text(path, "\n".join([lines[0] + "," + ",".join(added), *rows]) + "\n")


def with_registration(card: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``card`` (:func:`specrepro.record.scorecard.score`) whose ``registered`` column says, per row,
    whether the way its claim is judged today (its latest registration) was registered before the data it judges:
    "before its data" when the registration's commit is an ancestor of the commit that wrote the claim's table,
    "after its data (registered <date>)" otherwise, "" for a claim with no table or no registration matching
    today's judging."""
    registry = load_registry()
    stale = set(pending(registry=registry)["id"])
    latest = registry.groupby("id", sort=False).tail(1).set_index("id")
    notes = []
    for _, r in card.iterrows():
        commit = str(r.get("commit") or "").removesuffix("-dirty")
        if r["id"] in stale or r["id"] not in latest.index or not commit:
            notes.append("")
            continue
        reg = latest.loc[r["id"]]
        before = subprocess.run(["git", "merge-base", "--is-ancestor", reg["registered_commit"], commit],
                                cwd=repo_root(), capture_output=True).returncode == 0
        notes.append("before its data" if before and reg["registered_commit"][:12] != commit[:12]
                     else f"after its data (registered {reg['registered_date']})")
    return card.assign(registered=notes)


def main(argv: list[str] | None = None) -> int:
    """``python -m specrepro.record.registry``: register the claims whose judging changed; print them."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.parse_args(argv)
    new = register()
    print(f"{len(new)} registration(s) appended to {registry_path().relative_to(repo_root())}"
          + (":\n" + new[["id", "rule", "registered_commit"]].to_string(index=False) if len(new) else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
