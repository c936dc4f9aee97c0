"""The verdict history (specrepro.record.history): the record's commits re-scored; a verdict that moved with its rule
or with the data is marked unstable, with both readings."""

from __future__ import annotations

import pandas as pd
import pytest

from specrepro.record.history import HISTORY_COLUMNS, record_commits, stability, verdict_history


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
    h = verdict_history(max_commits=2)
    assert list(h.columns) == HISTORY_COLUMNS
    assert h["commit"].nunique() == 2 and h.groupby("commit")["claim"].nunique().min() > 10
    assert not h["verdict"].str.startswith("error").any(), h[h["verdict"].str.startswith("error")]


def test_a_claims_file_with_an_unquoted_comma_in_its_last_column_is_read(tmp_path):
    from specrepro.record.history import _claims_at

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "claims.csv").write_text(
        "id,rule,caveat\nx,r1,one, two\ny,r2,plain\n\nz,r3\n", encoding="utf-8")
    claims = _claims_at(tmp_path)
    assert list(claims["id"]) == ["x", "y", "z"]
    assert list(claims["caveat"]) == ["one, two", "plain", ""]
    assert claims.loc[0, "rule"] == "r1"
