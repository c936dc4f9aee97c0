"""The papers' numbers (data/papers, specrepro.lab.papers): every table is listed with its source, and the shapes the
notebooks print keep the paper's figures."""

import pytest

from specrepro.files import repo_root
from specrepro.lab.papers import PAPER_TABLES, paper_table


def test_every_paper_table_is_read_and_named_with_its_source():
    readme = (repo_root() / "data" / "papers" / "README.md").read_text()
    on_disk = {p.stem for p in (repo_root() / "data" / "papers").glob("*.csv")}
    assert on_disk == set(PAPER_TABLES)
    for name in PAPER_TABLES:
        assert len(paper_table(name)) and f"`{name}.csv`" in readme
    with pytest.raises(KeyError, match="unknown paper table"):
        paper_table("leviathan_table9")


def test_leviathan_table3_in_notebook_03s_shape():
    from specrepro.lab.leviathan import leviathan_table3_paper

    wide = leviathan_table3_paper("qwen2.5-coder-0.5b")
    assert list(wide.index) == ["unigram", "bigram", "qwen2.5-coder-0.5b"]
    assert set(wide.columns) == {(c, t) for c in ("paper GPT-like 97M", "paper T5-XXL EnDe", "paper T5-XXL CNNDM")
                                 for t in (0.0, 1.0)}
    # Leviathan Table 3 as printed: T5-XXL EnDe, T5-small draft .75 / .62; GPT-like 97M, bigram .05
    assert wide.loc["qwen2.5-coder-0.5b", ("paper T5-XXL EnDe", 1.0)] == pytest.approx(0.62)
    assert wide.loc["qwen2.5-coder-0.5b", ("paper T5-XXL EnDe", 0.0)] == pytest.approx(0.75)
    assert wide.loc["bigram", ("paper GPT-like 97M", 0.0)] == pytest.approx(0.05)
    assert wide.loc["unigram", ("paper T5-XXL CNNDM", 1.0)] == pytest.approx(0.08)
    assert list(leviathan_table3_paper(None).index) == ["unigram", "bigram"]
