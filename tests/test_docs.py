"""The README and docs/ as a citable record: README.md is short and opens with the scorecard in its two groups; every
generated block, in README.md or docs/*.md, is exactly what the committed tables render; prose carries no hand-typed
measurement and no process words; every relative link resolves; code in the pages imports what it names."""

import importlib
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from specrepro.record import report
from specrepro.record import scorecard as sc
from specrepro.record.results import record_dir

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
#: README's budget, in bytes
README_MAX_BYTES = 20_000
#: the project's own tracker references ("issue 18", "issues 17-19", "issue #20"); upstream threads are cited as
#: owner/repo#N and are fine
PROCESS_WORDS = re.compile(r"\bissues?\s*#?\s*\d+", re.I)
#: what a hand-typed measurement looks like in prose: a ratio or speedup (1.5x, 2×; not a dimension such as 1,536 ×
#: 32,768), a rate (tokens/s), a duration or size, an interval, a percentage, a count of runs
MEASUREMENT = re.compile(r"\b\d+(?:\.\d+)?\s?[×x](?![\w])(?!\s?[\d,]*\d)"
                         r"|\b\d+(?:\.\d+)?\s?(?:tokens?/s|tok/s)"
                         r"|\b\d+(?:\.\d+)?\s?(?:ms|min|GB|MB|h|s)\b"
                         r"|\[\s?[-+]?\d+(?:\.\d+)?,\s?[-+]?\d+(?:\.\d+)?\s?\]"
                         r"|\b\d+(?:\.\d+)?\s?%"
                         r"|\b\d+/\d+ (?:runs|problems|prompts)")
#: measurement-like phrases allowed in prose: levels and thresholds, not results
PROSE_ALLOWED = {"95%", "90%", "10%"}


def _blocks_removed(text: str) -> str:
    """``text`` without its generated blocks, fenced code and inline code: the hand-written prose."""
    text = re.sub(r"<!-- ([A-Za-z0-9_-]+):start -->.*?<!-- \1:end -->", "", text, flags=re.S)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.sub(r"`[^`\n]*`", "", text)


@pytest.fixture(scope="module")
def committed_card() -> pd.DataFrame:
    from specrepro.record.registry import with_registration

    return with_registration(sc.score("standard", tables=sc.Tables("standard", dirs=[record_dir("results")])))


def _scorecard_block() -> str:
    return README.read_text().split("<!-- scorecard:start -->")[1].split("<!-- scorecard:end -->")[0]


def test_readme_is_short_and_opens_with_the_commands_the_scorecard_and_the_figures():
    text = README.read_text()
    assert len(text.encode()) <= README_MAX_BYTES, f"README.md is {len(text.encode())} bytes"
    order = [text.index(s) for s in ("make test", "make reproduce", "<!-- scorecard:start -->",
                                     "<!-- figures:start -->", "## More", "## Citing")]
    assert order == sorted(order)


def test_readme_scorecard_has_the_two_groups_with_their_counts():
    block = _scorecard_block()
    claims = sc.load_claims()
    card = pd.read_csv(record_dir("results") / "scorecard.csv", keep_default_na=False)
    assert list(card["group"]) == list(claims["group"]), "scorecard.csv's groups differ from data/claims.csv"
    headings = re.findall(r"^\*\*(\w+): (\d+) claims?, (\d+) judged — (.*?)(?:; not judged: (.*))?\*\*$", block, re.M)
    assert [h[0].lower() for h in headings] == list(sc.GROUPS)
    for name, n, judged, verdicts, others in headings:
        rows = card[card["group"] == name.lower()]
        assert int(n) == len(rows) and int(judged) == rows["verdict"].isin(sc.JUDGED).sum()
        parts = [p for p in (verdicts.split(", ") if verdicts != "none" else []) + (others.split(", ") if others else [])]
        stated = {v: int(k) for k, v in (part.split(" ", 1) for part in parts)}
        assert stated == {v: int(k) for v, k in rows["verdict"].value_counts().items()}
    assert sc.verdict_definitions() in block, "the block prints the verdicts' definitions from the code"
    # one short row per claim, in two tables
    rows = [ln for ln in block.splitlines() if ln.startswith("| ") and "<sub>" in ln]
    assert len(rows) == len(claims)
    assert max(len(ln) for ln in rows) < 600


def test_every_generated_block_is_what_the_committed_tables_render(committed_card):
    pages = report.render_pages("standard", committed_card, PAGES)
    names = [n for p in PAGES for n in report.block_names(p.read_text())]
    assert sorted(names) == sorted(report.BLOCKS)
    stale = [p.relative_to(ROOT).as_posix() for p, (old, new) in pages.items() if old != new]
    assert not stale, f"generated blocks out of date in {stale}: commit the code, then run make scorecard"
    committed = (record_dir("results") / "scorecard.md").read_text()
    assert committed == report.render_markdown(committed_card, "standard"), "run make scorecard"
    assert list(pd.read_csv(record_dir("results") / "scorecard.csv", keep_default_na=False)["verdict"]) == \
        list(committed_card["verdict"])


def test_no_process_words_in_readme_docs_or_notebook_markdown():
    texts = {p.relative_to(ROOT).as_posix(): p.read_text() for p in PAGES}
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        texts[nb.name] = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    found = {name: PROCESS_WORDS.findall(text) for name, text in texts.items()}
    assert not {k: v for k, v in found.items() if v}


def test_prose_carries_no_hand_typed_measurements():
    """Numbers measured by a run live in generated blocks (or a test reads them from a committed file)."""
    found = {}
    for p in PAGES:
        hits = [m for m in MEASUREMENT.findall(_blocks_removed(p.read_text())) if m.strip() not in PROSE_ALLOWED]
        if hits:
            found[p.name] = hits
    assert not found, found


#: measurement-like phrases allowed in notebook markdown: a level written with a space, and the pass@1 harness's
#: per-problem timeout (a setting, not a result)
NOTEBOOK_ALLOWED = PROSE_ALLOWED | {"90 %", "5 s"}


def _papers_numbers() -> set[float]:
    """Every number in data/papers/*.csv (the papers' own figures), rounded to 4 decimals."""
    numbers = set()
    for path in sorted((ROOT / "data" / "papers").glob("*.csv")):
        for value in pd.read_csv(path).to_numpy().ravel():
            try:
                numbers.add(round(float(value), 4))
            except (TypeError, ValueError):
                pass
    return numbers


def test_notebook_markdown_carries_only_the_papers_numbers():
    """A measured number in a notebook belongs in an output cell; its markdown may quote a paper's figure only if
    data/papers holds it (a percentage as the fraction the table stores), so that what is printed as the paper's
    can be traced to the paper's table."""
    papers = _papers_numbers()
    found = {}
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        text = _blocks_removed("\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown"))
        for hit in MEASUREMENT.findall(text):
            if hit.strip() in NOTEBOOK_ALLOWED:
                continue
            number = re.search(r"\d+(?:\.\d+)?", hit)
            value = float(number.group()) if number else None
            if value is None or not ({round(value, 4), round(value / 100, 4)} & papers) or hit.startswith("["):
                found.setdefault(nb.name, []).append(hit)
    assert not found, found


def test_every_relative_link_resolves():
    assert "docs/" in README.read_text()
    for p in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", _without_code(p.read_text())):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (p.parent / target.split("#")[0]).resolve()
            assert path.exists(), f"{p.relative_to(ROOT)}: broken link {target}"
    linked = set(re.findall(r"\]\((docs/[^)#\s]+)\)", README.read_text()))
    assert linked == {d.relative_to(ROOT).as_posix() for d in DOCS}, "every docs page linked from README, and only those"


def _without_code(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.S)


def test_code_in_the_pages_imports_what_it_names():
    for p in PAGES:
        for block in re.findall(r"```python\n(.*?)```", p.read_text(), flags=re.S):
            for module, names in re.findall(r"^from (specrepro[\w.]*) import ([\w, ]+)", block, re.M):
                mod = importlib.import_module(module)
                for name in (n.strip() for n in names.split(",")):
                    assert hasattr(mod, name), f"{p.name}: {module} has no {name}"


def test_model_hashes_in_the_docs_are_the_zoo_s():
    code = (ROOT / "specrepro" / "models.py").read_text()
    hashes = re.findall(r"`([0-9a-f]{64})`", (ROOT / "docs" / "models.md").read_text())
    assert len(hashes) >= 3
    assert all(h in code for h in hashes)


def test_no_verdict_is_defined_in_hand_written_prose():
    """The verdicts are defined once, in code (``VERDICT_DEFINITIONS``), and rendered into the generated blocks; a
    page's prose that defines one (``**inconclusive**: ...``) could disagree with the code."""
    for p in PAGES:
        prose = _blocks_removed(p.read_text())
        defined = [v for v in sc.VERDICTS if re.search(rf"\*\*{re.escape(v)}\*\*\s*[:(—-]", prose)]
        assert not defined, f"{p.name} defines {defined} in prose: render them from the code instead"


def test_a_commands_heading_counts_its_commands():
    """"## Two commands" is followed by a block of exactly two commands."""
    numbers = {"one": 1, "two": 2, "three": 3, "four": 4}
    checked = 0
    for p in PAGES:
        for word, block in re.findall(r"^## (\w+) commands?\n.*?```bash\n(.*?)```", p.read_text(), re.M | re.S):
            if word.lower() not in numbers:
                continue
            commands = [ln for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
            assert len(commands) == numbers[word.lower()], f"{p.name}: '{word} commands' lists {len(commands)}"
            checked += 1
    assert checked >= 1


def test_a_gpu_named_in_prose_is_one_the_gpu_record_holds():
    """A GPU model named in a page's prose (``NVIDIA H200``) must be one that a file under data/gpu/ records as its
    device: the pages may not say a test passed on hardware no record shows."""
    recorded = " ".join(json.dumps(json.loads(f.read_text())) for f in sorted((ROOT / "data" / "gpu").glob("*.json")))
    for p in PAGES:
        for gpu in re.findall(r"NVIDIA ([A-Z]+\d+\w*)", _blocks_removed(p.read_text())):
            assert f"NVIDIA {gpu}" in recorded, f"{p.name} names NVIDIA {gpu}; data/gpu/ records no run on it"


def test_data_readme_lists_exactly_the_scorecards_verdicts():
    text = " ".join((ROOT / "data" / "README.md").read_text().split())
    listed = re.search(r"The verdicts, [^:]*: ([^.]*)\.", text)
    assert listed, "data/README.md lists the verdicts after 'The verdicts, ...:'"
    assert [v.strip() for v in listed.group(1).split(";")] == list(sc.VERDICTS)
    assert not re.search(r"partly reproduced|not measured", text)
