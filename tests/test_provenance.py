"""The record's provenance is bound to its content: every committed table and figure carries, in its sidecar, the
sha256 of its bytes; a table and its sidecar are written in one step; the record is never written from a dirty tree."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from specrepro.record import results


def test_provenance_hashes_match_the_committed_record():
    assert results.record_hash_mismatches() == []


def test_provenance_check_catches_one_changed_byte(tmp_path):
    src = results.record_dir("results")
    for name in ("leviathan_table1.csv", "leviathan_table1.provenance.json"):
        shutil.copy(src / name, tmp_path / name)
    assert results.record_hash_mismatches([tmp_path]) == []
    table = tmp_path / "leviathan_table1.csv"
    data = bytearray(table.read_bytes())
    data[-2] = ord("7") if data[-2] != ord("7") else ord("8")
    table.write_bytes(bytes(data))
    assert results.record_hash_mismatches([tmp_path]) == [f"{table}: sha256 differs from leviathan_table1.provenance.json"]


def test_provenance_without_a_hash_is_reported(tmp_path):
    (tmp_path / "t.csv").write_text("a\n1\n")
    (tmp_path / "t.provenance.json").write_text(json.dumps({"commit": "abc"}))
    assert results.record_hash_mismatches([tmp_path]) == [f"{tmp_path / 't.provenance.json'}: no sha256 recorded"]


def test_save_table_writes_the_hash_of_what_it_wrote(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "results_dir", lambda profile=results.STANDARD: tmp_path)
    path = results.save_table(pd.DataFrame({"a": [1, 2]}), "t", profile="quick", companions={"t.md": "| a |\n"})
    prov = json.loads((tmp_path / "t.provenance.json").read_text())
    assert set(prov["sha256"]) == {"t.csv", "t.md"} and path == tmp_path / "t.csv"
    assert results.record_hash_mismatches([tmp_path]) == []
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


def test_an_identical_resave_keeps_the_provenance_of_the_run_that_made_the_table(tmp_path, monkeypatch):
    """A resumed notebook saves again a table it derived from finished work: same bytes and settings, so the sidecar
    that names the original run stays; new bytes or new settings are written with a new sidecar."""
    monkeypatch.setattr(results, "results_dir", lambda profile=results.STANDARD: tmp_path)
    monkeypatch.setattr(results, "git_commit", lambda: "aaaaaaaaaaaa")
    results.save_table(pd.DataFrame({"a": [1, 2]}), "t", profile="quick", prompts=2)
    monkeypatch.setattr(results, "git_commit", lambda: "bbbbbbbbbbbb")
    results.save_table(pd.DataFrame({"a": [1, 2]}), "t", profile="quick", prompts=2)
    assert json.loads((tmp_path / "t.provenance.json").read_text())["commit"] == "aaaaaaaaaaaa"
    results.save_table(pd.DataFrame({"a": [1, 2]}), "t", profile="quick", prompts=3)  # other settings
    assert json.loads((tmp_path / "t.provenance.json").read_text())["commit"] == "bbbbbbbbbbbb"
    monkeypatch.setattr(results, "git_commit", lambda: "cccccccccccc")
    results.save_table(pd.DataFrame({"a": [1, 5]}), "t", profile="quick", prompts=3)  # other bytes
    prov = json.loads((tmp_path / "t.provenance.json").read_text())
    assert prov["commit"] == "cccccccccccc" and results.record_hash_mismatches([tmp_path]) == []


def test_the_record_is_not_written_from_a_dirty_tree(tmp_path, monkeypatch):
    monkeypatch.setenv(results.RECORD_ENV, "1")
    monkeypatch.setattr(results, "git_commit", lambda: "0123456789ab-dirty")
    monkeypatch.setattr(results, "results_dir", lambda profile=results.STANDARD: tmp_path)
    with pytest.raises(results.DirtyTreeError, match="dirty tree"):
        results.save_table(pd.DataFrame({"a": [1]}), "t")
    assert list(tmp_path.iterdir()) == []
    # a run outside the record (any other profile, or no SPECREPRO_RECORD) is not refused
    results.save_table(pd.DataFrame({"a": [1]}), "t", profile="quick")
    assert (tmp_path / "t.csv").exists()


def test_every_gpu_measurement_has_a_sidecar_naming_its_files():
    """``data/gpu`` holds runs made on a lent GPU: each of its files is described by a provenance sidecar (commit,
    device, sha256), as every table of the record is, and the record's hash check covers them."""
    import json as _json
    from pathlib import Path as _Path

    from specrepro.record.gpu import gpu_dir

    gdir = gpu_dir()
    if not gdir.exists():
        pytest.skip("no GPU measurements in this checkout")
    sides = sorted(_Path(gdir).glob("*.provenance.json"))
    described = set().union(*(_json.loads(s.read_text())["sha256"] for s in sides)) if sides else set()
    files = {p.name for p in _Path(gdir).iterdir() if not p.name.endswith(".provenance.json")}
    assert files == described
    assert all(_json.loads(s.read_text()).get("commit") for s in sides)
