"""The notebooks' conventions: one `parameters` cell, no algorithm code, executed quick-profile references that are
current (nbval re-executes those, so a stale reference would test old code), and no absolute paths in outputs."""

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _code(nb):
    return [c.source for c in nb.cells if c.cell_type == "code" and "injected-parameters" not in c.metadata.get("tags", [])]


def test_there_are_notebooks():
    assert len(SOURCES) >= 5


@pytest.mark.parametrize("path", SOURCES, ids=[p.name for p in SOURCES])
def test_one_parameters_cell_and_no_outputs(path):
    nb = nbformat.read(path, as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters'"
    assert "profile" in tagged[0].source
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "source notebooks carry no outputs"
    for src in _code(nb):
        assert not re.search(r"^\s*(def |class )", src, re.M), "algorithm code belongs in the package"
        assert "%pip" not in src and "!pip" not in src


@pytest.mark.parametrize("path", SOURCES, ids=[p.name for p in SOURCES])
def test_quick_reference_is_current(path):
    ref = ROOT / "notebooks" / "executed" / "quick" / path.name
    assert ref.exists(), f"run `make notebooks PROFILE=quick` to create {ref.relative_to(ROOT)}"
    assert _code(nbformat.read(ref, as_version=4)) == _code(nbformat.read(path, as_version=4)), (
        f"{ref.relative_to(ROOT)} is stale: rerun `make notebooks PROFILE=quick`")


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks" / "executed").glob("*/*.ipynb")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_executed_notebooks_have_no_absolute_paths_or_timestamps(path):
    text = path.read_text()
    assert not re.search(r"(/root/|/home/|/tmp/|/Users/)\w", text)
    assert '"start_time"' not in text and '"end_time"' not in text
