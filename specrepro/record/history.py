"""The verdict history: every committed state of the record re-scored, claim by claim, so that a verdict that moves
when its rule moves, or that two committed runs disagree on, shows.

What this file is: ``python -m specrepro verdict-history``. For each commit that changed the record (``data/results``
or ``data/claims.csv``), the tables and the claims file of that commit are read from git (``git archive``, nothing is
checked out) and every claim is scored by today's rule code with that commit's rule and parameters. One row per
(commit, claim): date, rule, its parameters, the rule version (a hash of rule and parameters), our number, verdict.
A claim is *unstable* when its verdict differs between commits: :func:`stability` says whether it moved with its
rule (a new rule version) or with the data (the same rule on other committed runs), with both readings.

What it is not: the scorecard (:mod:`specrepro.record.scorecard`, today's record only).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import subprocess
import tarfile
import tempfile
from pathlib import Path

import pandas as pd

from specrepro.files import repo_root
from specrepro.record.scorecard import (
    CLAIM_COLUMNS,
    NOT_RUN,
    RULE_PARAMS,
    COMMON_PARAMS,
    RULES,
    Tables,
    params_of,
    score_claim,
)

__all__ = ["record_commits", "score_commit", "verdict_history", "stability", "configure_parser", "run_command"]

RECORD_PATHS = ("data/results", "data/claims.csv")
HISTORY_COLUMNS = ["commit", "date", "claim", "rule", "params", "rule_version", "ours", "ours_value", "verdict"]


def _git(*args: str, root: Path | None = None, text: bool = True):
    return subprocess.run(["git", *args], cwd=root or repo_root(), capture_output=True, text=text, check=True).stdout


def record_commits(root: Path | None = None, max_commits: int | None = None) -> list[tuple[str, str]]:
    """``(commit, date)`` of every commit that changed the record, oldest first (the newest ``max_commits``)."""
    out = _git("log", "--format=%H %ad", "--date=short", "--", *RECORD_PATHS, root=root).split("\n")
    rows = [tuple(line.split()) for line in out if line.strip()]
    rows = rows[:max_commits] if max_commits else rows
    return list(reversed(rows))


def rule_version(rule: str, params: str) -> str:
    """A short hash of a claim's rule and parameters: two rows with the same version were judged by the same rule."""
    return hashlib.sha256(f"{rule}|{params}".encode()).hexdigest()[:8]


def _claims_at(directory: Path) -> pd.DataFrame:
    """The claims file of a committed state of the record. A row with more fields than the header (a state whose
    last, free-text column held an unquoted comma) keeps the overflow in that last column, as it was written."""
    import csv

    with open(directory / "data" / "claims.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    header, width = rows[0], len(rows[0])
    body = [r[:width - 1] + [",".join(r[width - 1:])] if len(r) > width else r + [""] * (width - len(r))
            for r in rows[1:] if any(cell.strip() for cell in r)]
    df = pd.DataFrame(body, columns=header, dtype=str)
    for c in CLAIM_COLUMNS:
        if c not in df.columns:
            df[c] = ""
    return df.apply(lambda col: col.str.strip())


def score_commit(commit: str, root: Path | None = None) -> list[dict]:
    """Every claim of the record at ``commit``, scored by today's rule code with that commit's claims file.

    Returns:
        one dict per claim (:data:`HISTORY_COLUMNS` without commit and date); a rule unknown today, or parameters it
        no longer takes, gives the verdict "rule gone"; a rule that raises on that commit's tables, "error: ...".
    """
    present = [p for p in RECORD_PATHS
               if subprocess.run(["git", "cat-file", "-e", f"{commit}:{p}"], cwd=root or repo_root(),
                                 capture_output=True).returncode == 0]
    if "data/claims.csv" not in present:  # a record before the claims file: nothing to score
        return []
    data = _git("archive", "--format=tar", commit, *present, root=root, text=False)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(tmp, filter="data")
        tmp = Path(tmp)
        claims = _claims_at(tmp)
        (tmp / "data" / "results").mkdir(parents=True, exist_ok=True)
        tables = Tables("standard", dirs=[tmp / "data" / "results"])
        for _, claim in claims.iterrows():
            base = {"claim": claim["id"], "rule": claim["rule"], "params": claim["params"],
                    "rule_version": rule_version(claim["rule"], claim["params"])}
            if claim["rule"] not in RULES or set(params_of(claim)) - set(RULE_PARAMS[claim["rule"]]) - set(COMMON_PARAMS):
                rows.append({**base, "ours": "", "ours_value": None, "verdict": "rule gone"})
                continue
            try:
                card = score_claim(claim, tables)
                rows.append({**base, "ours": card["ours"], "ours_value": card["ours_value"],
                             "verdict": card["verdict"]})
            except Exception as exc:  # an old table this rule cannot read: recorded, not fatal
                rows.append({**base, "ours": "", "ours_value": None,
                             "verdict": f"error: {type(exc).__name__}"})
    return rows


def verdict_history(root: Path | None = None, max_commits: int | None = None, progress: bool = False) -> pd.DataFrame:
    """The history of every claim's verdict over the record's commits (:func:`record_commits`), one row per
    (commit, claim), oldest first."""
    rows = []
    commits = record_commits(root, max_commits)
    for i, (commit, date) in enumerate(commits):
        if progress:
            print(f"[{i + 1}/{len(commits)}] {commit[:12]} {date}", flush=True)
        rows += [{"commit": commit[:12], "date": date, **r} for r in score_commit(commit, root)]
    return pd.DataFrame(rows, columns=HISTORY_COLUMNS)


def stability(history: pd.DataFrame) -> pd.DataFrame:
    """Per claim: whether its verdict ever changed across the committed record (verdicts of commits that scored it,
    "not run", "rule gone" and errors left out), and why.

    Returns:
        DataFrame with columns claim, readings (number of commits that scored it), verdicts (each distinct verdict
        with the commits that gave it), unstable (bool), moved_with_rule (a verdict change coincided with a new rule
        version), moved_with_data (two commits with the same rule version disagree).
    """
    out = []
    scored = history[~history["verdict"].isin([NOT_RUN, "rule gone"]) & ~history["verdict"].str.startswith("error")]
    for claim, d in scored.groupby("claim", sort=False):
        by_verdict = d.groupby("verdict", sort=False)["commit"].agg(lambda c: ", ".join(c))
        same_rule_disagrees = bool((d.groupby("rule_version")["verdict"].nunique() > 1).any())
        changes = d["verdict"].ne(d["verdict"].shift()) & d.index.isin(d.index[1:])
        moved_rule = bool((changes & d["rule_version"].ne(d["rule_version"].shift())).any())
        out.append({"claim": claim, "readings": len(d),
                    "verdicts": "; ".join(f"{v} ({c})" for v, c in by_verdict.items()),
                    "unstable": d["verdict"].nunique() > 1, "moved_with_rule": moved_rule,
                    "moved_with_data": same_rule_disagrees})
    return pd.DataFrame(out, columns=["claim", "readings", "verdicts", "unstable", "moved_with_rule",
                                      "moved_with_data"])


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m specrepro verdict-history``."""
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    parser.add_argument("--max-commits", type=int, default=None, help="only the newest N commits of the record")
    parser.add_argument("--profile", default="standard", help="profile the tables are saved under")


def run_command(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    """Re-score the record's history; save ``verdict_history`` and ``verdict_stability`` (the committed record only
    under ``make reproduce``) and print the unstable claims."""
    from specrepro.record.results import check_clean_for_record, save_table

    check_clean_for_record(args.profile)
    history = verdict_history(max_commits=args.max_commits, progress=True)
    stable = stability(history)
    save_table(history, "verdict_history", profile=args.profile, commits=int(history["commit"].nunique()))
    save_table(stable, "verdict_stability", profile=args.profile, commits=int(history["commit"].nunique()))
    unstable = stable[stable["unstable"]]
    print(f"{history['commit'].nunique()} commits of the record, {len(stable)} claims scored; "
          f"{len(unstable)} unstable:")
    with pd.option_context("display.width", 200, "display.max_colwidth", 120):
        print(unstable.to_string(index=False) if len(unstable) else "(none)")
    return 0
