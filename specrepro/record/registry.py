"""The claims registry, ``data/claims_registry.csv`` (``python -m specrepro.record.registry``): how each claim is
judged (:data:`JUDGED_BY`), stamped with the commit and date it was registered on, again whenever that changes; rows
are only appended, so the registry shows whether each way of judging a claim was fixed before or after its data.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import subprocess
from pathlib import Path

import pandas as pd

from specrepro.files import atomic_write_text, repo_root
from specrepro.record.history import git, rule_version
from specrepro.record.scorecard import load_claims

__all__ = ["REGISTRY_COLUMNS", "JUDGED_BY", "STATISTICS", "registry_path", "load_registry", "pending", "register",
           "with_registration", "main"]

#: one registration: the claim, how it is judged, and the commit and date it was registered on
REGISTRY_COLUMNS = ["id", "rule", "params", "paper_value", "paper_kind", "statistic", "registered_commit",
                    "registered_date", "rule_version"]
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
    """The registry (every field as text; the columns a registry written before they existed lacks, empty); an empty
    one if the file does not exist. ValueError for a header that is not a beginning of :data:`REGISTRY_COLUMNS`."""
    path = Path(path) if path is not None else registry_path()
    if not path.exists():
        return pd.DataFrame(columns=REGISTRY_COLUMNS, dtype=str)
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    if list(df.columns) != REGISTRY_COLUMNS[:len(df.columns)]:
        raise ValueError(f"{path}: columns {list(df.columns)} are not a beginning of {REGISTRY_COLUMNS}")
    return df.reindex(columns=REGISTRY_COLUMNS, fill_value="")


def pending(claims: pd.DataFrame | None = None, registry: pd.DataFrame | None = None) -> pd.DataFrame:
    """The claims of ``claims`` (default: ``data/claims.csv``) whose latest registration is missing or differs from
    how it is judged today (:data:`JUDGED_BY`), as unstamped registry rows; KeyError for a rule not in STATISTICS."""
    claims = load_claims() if claims is None else claims
    registry = load_registry() if registry is None else registry
    latest = registry.groupby("id", sort=False).tail(1).set_index("id")
    judging = ["rule", "params", "paper_value", "paper_kind"]
    now = claims[["id", *judging]].assign(
        statistic=[STATISTICS[r] for r in claims["rule"]],
        rule_version=[rule_version(*c) for c in claims[judging].itertuples(index=False)])
    stale = now[JUDGED_BY].ne(now[["id"]].join(latest[JUDGED_BY], on="id")[JUDGED_BY]).any(axis=1)
    return now[stale].reset_index(drop=True)  # the columns of REGISTRY_COLUMNS but the stamp


def register(path: str | Path | None = None, commit: str | None = None, date: str | None = None) -> pd.DataFrame:
    """Append the registrations :func:`pending` finds to the registry, stamped with ``commit`` (default: ``git
    rev-parse HEAD``, 12 characters) and ``date`` (default: today, UTC); the file is rewritten atomically, with the
    columns an older registry lacks added, empty in its earlier rows. Returns the rows appended."""
    path = Path(path) if path is not None else registry_path()
    registry = load_registry(path)
    new = pending(registry=registry)
    if new.empty:
        return new
    new = new.assign(registered_commit=git("rev-parse", "HEAD").strip()[:12] if commit is None else commit,
                     registered_date=date or _dt.datetime.now(_dt.timezone.utc).date().isoformat())
    atomic_write_text(path, pd.concat([registry, new])[REGISTRY_COLUMNS].to_csv(index=False))
    return new


def with_registration(card: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``card`` (:func:`specrepro.record.scorecard.score`) whose ``registered`` column says whether each
    claim's latest registration precedes the commit that wrote its table ("before its data"; else "after its data
    (registered <date>)"); "" for a claim with no table, or whose judging today is not registered."""
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
    argparse.ArgumentParser(description=main.__doc__).parse_args(argv)
    new = register()
    print(f"{len(new)} registration(s) appended to {registry_path().relative_to(repo_root())}"
          + (":\n" + new[["id", "rule", "registered_commit"]].to_string(index=False) if len(new) else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
