"""The verdict history (``python -m specrepro verdict-history``): every distinct reading of a claim the record has
held - (claim, :func:`rule_version`, :func:`evidence_key`), not one per commit - re-scored by today's rule code from
git (nothing is checked out), so that a verdict that moved with its rule or with the data shows (:func:`stability`).
"""

from __future__ import annotations

import argparse
import ast
import csv
import datetime
import hashlib
import inspect
import io
import subprocess
import tarfile
import tempfile
import textwrap
from pathlib import Path

import pandas as pd

from specrepro.files import repo_root
from specrepro.record.rulekit import COMMON_PARAMS, RULE_PARAMS, param_names, params_of
from specrepro.record.scorecard import CLAIM_COLUMNS, RULES, score_claim  # RULES filled by the rules' modules
from specrepro.record.tables import Tables
from specrepro.record.verdicts import NOT_RUN, NOT_TESTABLE, Clause

__all__ = ["git", "record_commits", "rule_source", "rule_version", "evidence_key", "score_commit", "verdict_history",
           "stability", "configure_parser", "run_command"]

RECORD_PATHS = ("data/results", "data/claims.csv")
HISTORY_COLUMNS = ["commit", "date", "states", "claim", "rule", "params", "rule_version", "evidence", "ours",
                   "ours_value", "verdict"]
#: the files of a result table whose bytes are its evidence (a table is a CSV or a bench JSON, with its provenance)
TABLE_SUFFIXES = (".csv", ".json", ".provenance.json")


def git(*args: str, root: Path | None = None, text: bool = True, input_text: str | None = None):
    """The output of ``git args`` run in ``root`` (default: the repository); raises CalledProcessError on failure."""
    return subprocess.run(["git", *args], cwd=root or repo_root(), capture_output=True, text=text, check=True,
                          input=input_text).stdout


def record_commits(root: Path | None = None, max_commits: int | None = None) -> list[tuple[str, str]]:
    """``(commit, date)`` of every commit that changed the record, oldest first (the newest ``max_commits``)."""
    out = git("log", "--format=%H %ad", "--date=short", "--", *RECORD_PATHS, root=root)
    rows = [tuple(line.split()) for line in out.splitlines() if line.strip()]
    return rows[:max_commits or None][::-1]


#: the modules whose functions and clause tables make up the scorecard's rule code
SCORECARD_MODULES = ("specrepro.record.scorecard", "specrepro.record.verdicts", "specrepro.record.tables",
                     "specrepro.record.rulekit", "specrepro.record.rules_asserted", "specrepro.record.rules_measured",
                     "specrepro.record.rules_trends")
#: ... and the statistics they compute with (intervals, paired ratios), so a rule's fingerprint moves with them too
RULE_MODULES = SCORECARD_MODULES + ("specrepro.stats", "specrepro.measure.harness")


def _code_only(source: str) -> str:
    """``source`` without docstrings, laid out by ``ast.unparse`` (a reworded docstring is no new rule version)."""
    tree = ast.parse(textwrap.dedent(source))
    for node in ast.walk(tree):
        if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and ast.get_docstring(node, clean=False) is not None):
            node.body = node.body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def rule_source(rule: str) -> str:
    """Today's code of rule ``rule`` (:func:`_code_only`): the rule function and every function or clause table of
    :data:`RULE_MODULES` it reaches by name, transitively, in a fixed order; "" for a rule unknown today."""
    fn = RULES.get(rule)
    if fn is None:
        return ""
    seen, todo, parts = set(), [fn], set()
    while todo:  # functions only: RULES holds the rules' functions, and only functions are added
        obj = todo.pop()
        if obj in seen:
            continue
        seen.add(obj)
        parts.add((obj.__name__, _code_only(inspect.getsource(obj))))
        codes = [obj.__code__]
        while codes:
            code = codes.pop()
            for name in code.co_names:
                ref = obj.__globals__.get(name)
                if inspect.isfunction(ref) and ref.__module__ in RULE_MODULES:
                    todo.append(ref)
                elif isinstance(ref, tuple) and ref and all(isinstance(c, Clause) for c in ref):
                    parts.add((name, repr([(c.verdict, c.text, inspect.getsource(c.holds).strip()) for c in ref])))
            codes += [c for c in code.co_consts if inspect.iscode(c)]
    return "\n".join(src for _, src in sorted(parts))


def rule_version(rule: str, params: str, paper_value: str = "", paper_kind: str = "") -> str:
    """A short hash of how a claim is judged: its rule's name, the claim's parameters, the paper's number and kind,
    and today's code of the rule (:func:`rule_source`)."""
    text = "|".join((rule, params, paper_value, paper_kind, rule_source(rule)))
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def evidence_key(tables: str, blobs: dict[str, str]) -> str:
    """A short hash of the bytes of a claim's tables (``tables``: its ``our_table`` field) at one commit, from the git
    blob ids ``blobs`` of data/results (:data:`TABLE_SUFFIXES` of each table; an absent file counts as absent)."""
    ids = [f"{n}{s}:{blobs.get(f'data/results/{n}{s}', '-')}" for n in param_names(tables) for s in TABLE_SUFFIXES]
    return hashlib.sha256("|".join(ids).encode()).hexdigest()[:12]


def _claims_at(directory: Path | None, text: str | None = None) -> pd.DataFrame:
    """The claims file of a state of the record (``directory``'s, or ``text``); a row's fields beyond the header's
    (an unquoted comma in the free-text last column) stay in that last column."""
    if text is None:
        text = (directory / "data" / "claims.csv").read_bytes().decode("utf-8")
    rows = list(csv.reader(io.StringIO(text, newline="")))
    header, width = rows[0], len(rows[0])
    body = [r[:width - 1] + [",".join(r[width - 1:])] if len(r) > width else r + [""] * (width - len(r))
            for r in rows[1:] if any(cell.strip() for cell in r)]
    df = pd.DataFrame(body, columns=header, dtype=str)
    df = df.reindex(columns=[*header, *(c for c in CLAIM_COLUMNS if c not in header)], fill_value="")
    return df.apply(lambda col: col.str.strip())


def score_commit(commit: str, root: Path | None = None, seen: dict | None = None) -> list[dict]:
    """The readings of the record at ``commit`` not in ``seen`` (evidence -> the row that first read it; a reading
    already there counts one more state), scored with that commit's claims file and tables: one dict each
    (:data:`HISTORY_COLUMNS` but commit and date); verdict "rule gone" for a rule unknown today or parameters it no
    longer takes, "error: ..." for a rule that raises on those tables."""
    present = git("ls-tree", "--name-only", commit, "--", *RECORD_PATHS, root=root).split()
    if "data/claims.csv" not in present:  # a record before the claims file: nothing to score
        return []
    tree = git("ls-tree", "-r", commit, "--", "data/results", root=root) if "data/results" in present else ""
    blobs = {path: meta.split()[2] for meta, _, path in (line.partition("\t") for line in tree.splitlines())}
    with tempfile.TemporaryDirectory() as tmp:
        def extract() -> Path:  # the commit's record on disk, only where it holds a new reading
            data = git("archive", "--format=tar", commit, *present, root=root, text=False)
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                tar.extractall(tmp, filter="data")
            return Path(tmp) / "data" / "results"  # absent in a commit without tables: Tables reads none there

        claims = _claims_at(None, git("show", f"{commit}:data/claims.csv", root=root))
        return _score(claims, blobs, {} if seen is None else seen, extract)


def _score(claims: pd.DataFrame, blobs: dict[str, str], seen: dict, results) -> list[dict]:
    """The readings of ``claims`` on the tables ``blobs`` not in ``seen`` (a seen one counts one more state), scored
    on the tables in the folder ``results()`` returns (see :func:`score_commit`)."""
    todo = []
    for _, claim in claims.iterrows():
        key = (claim["id"], rule_version(claim["rule"], claim["params"], claim["paper_value"], claim["paper_kind"]),
               evidence_key(claim["our_table"], blobs))
        if key in seen:
            seen[key]["states"] += 1
        else:
            todo.append((key, claim))
    tables = Tables("standard", dirs=[results()]) if todo else None
    for key, claim in todo:
        row = seen[key] = {"claim": claim["id"], "rule": claim["rule"], "params": claim["params"],
                           "rule_version": key[1], "evidence": key[2], "states": 1, "ours": "", "ours_value": None}
        if claim["rule"] not in RULES or set(params_of(claim)) - set(RULE_PARAMS[claim["rule"]]) - set(COMMON_PARAMS):
            row["verdict"] = "rule gone"
            continue
        try:
            card = score_claim(claim, tables)
            row.update(ours=card["ours"], ours_value=card["ours_value"], verdict=card["verdict"])
        except Exception as exc:  # an old table this rule cannot read: recorded, not fatal
            row["verdict"] = f"error: {type(exc).__name__}"
    return [seen[key] for key, _ in todo]


def score_working_tree(root: Path | None = None, seen: dict | None = None) -> list[dict]:
    """:func:`score_commit` for the record on disk that no commit holds yet (what ``make reproduce`` wrote): its
    evidence keys are the blob ids the files will have once committed, so that commit adds no second reading."""
    root = root or repo_root()
    if not ((root / "data" / "claims.csv").exists() and git("status", "--porcelain", "--", *RECORD_PATHS, root=root)):
        return []  # no record, or the record as committed: its readings are the last commit's
    files = sorted(p for p in (root / "data" / "results").glob("*") if p.is_file())
    ids = git("hash-object", "--stdin-paths", root=root,
              input_text="\n".join(str(p) for p in files)).split() if files else []
    blobs = {f"data/results/{p.name}": h for p, h in zip(files, ids)}
    return _score(_claims_at(root), blobs, {} if seen is None else seen, lambda: root / "data" / "results")


def verdict_history(root: Path | None = None, max_commits: int | None = None, progress: bool = False,
                    working_tree: bool = True) -> pd.DataFrame:
    """Every reading of the record's commits (:func:`record_commits`), oldest first, at the first commit that held it
    and with the number of commits that did (``states``); then, unless ``working_tree=False``, those of the tables on
    disk that no commit holds yet, as commit "uncommitted" (:func:`score_working_tree`)."""
    rows, seen = [], {}
    commits = record_commits(root, max_commits)
    for i, (commit, date) in enumerate(commits):
        if progress:
            print(f"[{i + 1}/{len(commits)}] {commit[:12]} {date}", flush=True)
        for r in score_commit(commit, root, seen):
            r.update(commit=commit[:12], date=date)
            rows.append(r)
    for r in score_working_tree(root, seen) if working_tree else []:  # tables written since the last commit
        r.update(commit="uncommitted", date=datetime.date.today().isoformat())
        rows.append(r)
    return pd.DataFrame(rows, columns=HISTORY_COLUMNS)


def stability(history: pd.DataFrame) -> pd.DataFrame:
    """Per claim of ``history`` (verdicts that judge nothing, and errors, left out): readings, verdicts (each with
    the first commits of its readings), unstable, moved_with_rule (a change came with a new rule version),
    moved_with_data (two readings of one rule version disagree)."""
    out = []
    verdict = history["verdict"]
    scored = history[~verdict.isin([NOT_RUN, NOT_TESTABLE, "rule gone"]) & ~verdict.str.startswith("error")]
    for claim, d in scored.groupby("claim", sort=False):
        by_verdict = d.groupby("verdict", sort=False)["commit"].agg(", ".join)
        moved = d["verdict"].ne(d["verdict"].shift()) & d["rule_version"].ne(d["rule_version"].shift())
        out.append({"claim": claim, "readings": len(d),
                    "verdicts": "; ".join(f"{v} ({c})" for v, c in by_verdict.items()),
                    "unstable": d["verdict"].nunique() > 1,
                    "moved_with_rule": bool(moved.iloc[1:].any()),  # a verdict changed together with the rule version
                    "moved_with_data": bool((d.groupby("rule_version")["verdict"].nunique() > 1).any())})
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
    commits = len(record_commits(max_commits=args.max_commits))
    save_table(history, "verdict_history", profile=args.profile, commits=commits, readings=len(history))
    save_table(stable, "verdict_stability", profile=args.profile, commits=commits, readings=len(history))
    unstable = stable[stable["unstable"]]
    print(f"{len(history)} distinct readings over {commits} commits of the record (new evidence at "
          f"{history['commit'].nunique()} of them), {len(stable)} claims scored; {len(unstable)} unstable:")
    with pd.option_context("display.width", 200, "display.max_colwidth", 120):
        print(unstable.to_string(index=False) if len(unstable) else "(none)")
    return 0
