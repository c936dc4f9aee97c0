"""The verdict history (specrepro.record.history): the record's commits re-scored, one reading per distinct (table
bytes, rule version) pair; a verdict that moved with its rule or with the data is marked unstable, with both
readings."""

from __future__ import annotations

import os
import subprocess

import pandas as pd
import pytest

from specrepro.record.history import HISTORY_COLUMNS, record_commits, rule_version, stability, verdict_history


def _rows(*rows):
    return pd.DataFrame([dict(zip(["commit", "claim", "rule_version", "verdict"], r)) for r in rows])


def test_stability_separates_a_rule_change_from_disagreeing_runs():
    h = _rows(("a", "x", "v1", "trend"), ("b", "x", "v2", "reproduced exactly"),   # moved when the rule moved
              ("a", "y", "v1", "trend"), ("b", "y", "v1", "inconclusive"),         # same rule, runs disagree
              ("a", "z", "v1", "trend"), ("b", "z", "v1", "not run"), ("c", "z", "v1", "trend"))  # stable
    s = stability(h).set_index("claim")
    assert s.loc["x", "unstable"] and s.loc["x", "moved_with_rule"] and not s.loc["x", "moved_with_data"]
    assert s.loc["y", "unstable"] and s.loc["y", "moved_with_data"] and not s.loc["y", "moved_with_rule"]
    assert not s.loc["z", "unstable"] and s.loc["z", "readings"] == 2
    assert s.loc["x", "verdicts"] == "trend (a); reproduced exactly (b)"


def test_history_rescores_committed_states_of_the_record():
    commits = record_commits(max_commits=2)
    if len(commits) < 2:
        pytest.skip("a shallow clone: fewer than two commits of the record")
    h = verdict_history(max_commits=2, working_tree=False)
    assert list(h.columns) == HISTORY_COLUMNS
    assert h["claim"].nunique() > 10 and h["commit"].iloc[0] == commits[0][0][:12]
    # every claim of the two states is read once per distinct evidence: its states add up to the states holding it
    assert h.groupby("claim")["states"].sum().max() == 2
    assert not h.duplicated(["claim", "rule_version", "evidence"]).any()
    assert not h["verdict"].str.startswith("error").any(), h[h["verdict"].str.startswith("error")]


def _git(root, *args):
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t"})


def _one_identity_claim(root):
    """A record under ``root`` with one asserted-identity claim ``g`` on table ``t``; returns t's all-identical rows."""
    from specrepro.record.scorecard import CLAIM_COLUMNS

    (root / "data" / "results").mkdir(parents=True)
    row = {c: "" for c in CLAIM_COLUMNS}
    row.update(id="g", paper="P", arxiv="0000.00000v1", source="Table 1", claim="identical", paper_value="identical",
               paper_kind="asserted", group="correctness", rule="all_identical", params="value=same", our_table="t")
    pd.DataFrame([row]).to_csv(root / "data" / "claims.csv", index=False)
    return pd.DataFrame({"prompt": ["a", "b"], "method": "sd", "same": [True, True]})


def test_a_reading_is_one_distinct_pair_of_table_bytes_and_rule_version_not_one_commit(tmp_path):
    """Three commits of a record: the second changes another table only (the claim's evidence is the same: one
    reading, two states), the third changes the claim's table (a second reading, on other data)."""
    table = _one_identity_claim(tmp_path)
    _git(tmp_path, "init", "-q")
    for i, (name, df) in enumerate((("t", table), ("u", table), ("t", table.assign(same=[True, False])))):
        df.to_csv(tmp_path / "data" / "results" / f"{name}.csv", index=False)
        _git(tmp_path, "add", "data")
        _git(tmp_path, "commit", "-q", "-m", f"state {i}")
    h = verdict_history(root=tmp_path)
    assert len(record_commits(root=tmp_path)) == 3
    assert list(h["states"]) == [2, 1] and list(h["verdict"]) == ["reproduced exactly", "not reproduced"]
    assert h["rule_version"].nunique() == 1 and h["evidence"].nunique() == 2
    s = stability(h).set_index("claim")
    assert s.loc["g", "readings"] == 2 and s.loc["g", "moved_with_data"] and not s.loc["g", "moved_with_rule"]


def test_the_tables_on_disk_that_no_commit_holds_yet_are_the_last_reading(tmp_path):
    """A run rewrites the claim's table and has not committed it: the history's last reading is that table
    ("uncommitted"); once committed, the same evidence is one reading at its commit, and a record as committed adds
    no state of its own."""
    table = _one_identity_claim(tmp_path)
    table.to_csv(tmp_path / "data" / "results" / "t.csv", index=False)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "data")
    _git(tmp_path, "commit", "-q", "-m", "state 0")
    assert list(verdict_history(root=tmp_path)["states"]) == [1]
    table.assign(same=[True, False]).to_csv(tmp_path / "data" / "results" / "t.csv", index=False)
    h = verdict_history(root=tmp_path)
    assert list(h["commit"].str.len() == 12) == [True, False] and h["commit"].iloc[-1] == "uncommitted"
    assert list(h["verdict"]) == ["reproduced exactly", "not reproduced"]
    _git(tmp_path, "commit", "-q", "-am", "state 1")
    after = verdict_history(root=tmp_path)
    assert list(after["evidence"]) == list(h["evidence"]) and list(after["states"]) == [1, 1]
    assert "uncommitted" not in set(after["commit"])


def test_the_rule_version_changes_with_the_rule_code_and_its_inputs(monkeypatch):
    from specrepro.record import history, scorecard

    v = rule_version("paired_ratio", "method=x")
    assert v == rule_version("paired_ratio", "method=x")
    assert v != rule_version("paired_ratio", "method=y") and v != rule_version("paired_ratio", "method=x", "2.0")
    # the rule's source, and the helpers and clauses it reaches, are part of it
    src = history.rule_source("paired_ratio")
    assert "def paired_ratio(" in src and "def judge_reading(" in src and "def judge_interval(" in src
    assert "within the paper's number (or range) ± the equivalence margin" in src  # INTERVAL_CLAUSES' text
    # code only: a docstring or the layout of a line is not a new version
    assert '"""' not in src and history._code_only(
        'def f(x):\n    """Doc."""\n    return (x +\n            1)\n') == history._code_only("def f(x):\n    return x + 1\n")

    def paired_ratio(claim, tables):  # same name, other code
        return None

    monkeypatch.setitem(scorecard.RULES, "paired_ratio", paired_ratio)
    assert rule_version("paired_ratio", "method=x") != v
    assert rule_version("no_such_rule", "") == rule_version("no_such_rule", "")


def test_a_claims_file_with_an_unquoted_comma_in_its_last_column_is_read(tmp_path):
    from specrepro.record.history import _claims_at

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "claims.csv").write_text(
        "id,rule,caveat\nx,r1,one, two\ny,r2,plain\n\nz,r3\n", encoding="utf-8")
    claims = _claims_at(tmp_path)
    assert list(claims["id"]) == ["x", "y", "z"]
    assert list(claims["caveat"]) == ["one, two", "plain", ""]
    assert claims.loc[0, "rule"] == "r1"
