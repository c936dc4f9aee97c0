"""Golden render of the record: everything the record layer renders from the committed tables equals, byte for byte,
what the repository holds (README.md, docs/*.md, data/results/scorecard.md and scorecard.csv), and ``status`` finds
every shard, executed notebook and figure current. Writes nothing.

So a refactoring of :mod:`specrepro.record` that changes no verdict changes no rendered byte. Not covered: the
figures' PNG/PDF bytes (their sidecars' sha256 and inputs are checked by ``status``) and the run-time estimates of
``status`` (they depend on this machine's CPU).
"""

from __future__ import annotations

import pytest

from specrepro.files import repo_root
from specrepro.record import report
from specrepro.record.registry import with_registration
from specrepro.record.scorecard import score

pytestmark = pytest.mark.skipif(not (repo_root() / "data" / "results" / "scorecard.csv").exists(),
                                reason="no committed record")


@pytest.fixture(scope="module")
def card():
    return with_registration(score("standard"))


def test_scorecard_table_and_markdown_as_committed(card):
    results = repo_root() / "data" / "results"
    assert card.to_csv(index=False, float_format="%.6g") == (results / "scorecard.csv").read_text()
    assert report.render_markdown(card, "standard") == (results / "scorecard.md").read_text()


def test_every_generated_block_as_committed(card):
    pages = report.render_pages("standard", card)
    assert len(pages) >= 2
    rendered = {name for _, new in pages.values() for name in report.block_names(new)}
    assert rendered == set(report.BLOCKS)
    for path, (old, new) in pages.items():
        assert new == old, f"{path.name} renders differently from what is committed"


def test_every_block_renders_the_same_without_a_card(card):
    """render_block scores the card itself when given none: the same README scorecard block."""
    assert report.render_block("scorecard") == report.render_block("scorecard", card=card)


def test_status_finds_the_record_current():
    from specrepro.record.status import status_table

    df = status_table()
    stale = df[df["state"] != "current"]
    assert stale.empty, stale[["name", "state", "why"]].to_string()
    assert set(df["kind"]) == {"shard", "notebook", "figure"}


def test_the_block_templates_are_package_data():
    """A non-editable install carries every template the blocks render from (pyproject's package-data)."""
    import fnmatch
    import tomllib
    from importlib.resources import files

    patterns = tomllib.loads((repo_root() / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    templates = [p.name for p in files("specrepro.record").joinpath("templates").iterdir() if p.name.endswith(".j2")]
    assert templates
    assert all(any(fnmatch.fnmatch(f"templates/{t}", pat) for pat in patterns["specrepro.record"]) for t in templates)
