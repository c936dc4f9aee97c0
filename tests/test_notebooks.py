"""The notebooks' conventions: one `parameters` cell, no algorithm code, executed quick-profile references that are
current (nbval re-executes those, so a stale reference would test old code), and no absolute paths in outputs."""

import json
import re
import time
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
def test_sources_are_stored_as_jupyter_saves_them(path):
    """Every cell has an id and the file is nbformat's own serialization (what JupyterLab writes on save), so opening
    and saving a notebook in JupyterLab leaves git status clean instead of adding ids and reordering keys."""
    raw = path.read_text(encoding="utf-8")
    cells = json.loads(raw)["cells"]
    missing = [i for i, c in enumerate(cells) if "id" not in c]
    assert not missing, f"{path.name}: cells without an id: {missing}"
    canonical = nbformat.writes(nbformat.reads(raw, as_version=4))
    assert raw == canonical + ("" if canonical.endswith("\n") else "\n"), f"{path.name} is not in nbformat's layout"


@pytest.mark.parametrize("path", SOURCES, ids=[p.name for p in SOURCES])
def test_quick_reference_is_current(path):
    ref = ROOT / "notebooks" / "executed" / "quick" / path.name
    assert ref.exists(), f"run `make nbval-refresh` to create {ref.relative_to(ROOT)}"
    assert _code(nbformat.read(ref, as_version=4)) == _code(nbformat.read(path, as_version=4)), (
        f"{ref.relative_to(ROOT)} is stale: rerun `make nbval-refresh`")


# a run in progress (or stopped) leaves an ignored *.partial.ipynb that nbclean has not cleaned yet: not a record
@pytest.mark.parametrize("path", sorted(p for p in (ROOT / "notebooks" / "executed").glob("*/*.ipynb")
                                        if not p.name.endswith(".partial.ipynb")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_executed_notebooks_have_no_absolute_paths_or_timestamps(path):
    text = path.read_text()
    assert not re.search(r"(/root/|/home/|/tmp/|/Users/)\w", text)
    assert '"start_time"' not in text and '"end_time"' not in text


def _parameters(path):
    nb = nbformat.read(path, as_version=4)
    src = next(c.source for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    ns: dict = {}
    exec(compile(src, str(path), "exec"), {}, ns)  # the parameters cell is plain assignments
    return ns


def _profile(name):
    import yaml

    return yaml.safe_load((ROOT / "profiles" / f"{name}.yaml").read_text())


@pytest.mark.parametrize("path", SOURCES, ids=[p.name for p in SOURCES])
def test_parameter_defaults_are_the_standard_profile(path):
    """Run All in JupyterLab runs the standard experiment: every default equals profiles/standard.yaml."""
    standard = _profile("standard")
    params = _parameters(path)
    shared = ("profile", "device", "dtype", "target", "draft", "workload", "n_prompts", "max_new_tokens", "gammas",
              "n_samples", "seed", "repeats")
    for key in shared:
        assert key in params, f"{path.name}: parameter {key} missing"
    for key, value in params.items():
        if key == "rewrite_readme":  # notebook 08's own switch, not a size
            continue
        assert key in standard, f"{path.name}: parameter {key} is not in profiles/standard.yaml"
        assert value == standard[key], f"{path.name}: {key} = {value!r}, standard profile {standard[key]!r}"


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "profiles").glob("*.yaml") if p.stem != "standard"))
def test_profiles_only_set_known_parameters(name):
    standard, other = _profile("standard"), _profile(name)
    assert set(other) <= set(standard), f"{name}.yaml sets keys the notebooks do not know: {set(other) - set(standard)}"


@pytest.mark.parametrize("path", SOURCES, ids=[p.name for p in SOURCES])
def test_sizes_come_from_the_profile_not_from_branches(path):
    """Per-notebook sizes live in the profiles: no code branches on the profile's name (they would override
    injected parameters)."""
    nb = nbformat.read(path, as_version=4)
    for src in _code(nb):
        assert not re.search(r"profile\s*[!=]=|\bquick\b\s*=|\.get\(profile", src), src[:200]


def _git_status():
    import subprocess

    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    return out.stdout if out.returncode == 0 else None


def test_interactive_run_never_touches_the_record(tmp_path, monkeypatch):
    """papermill without a profile (as a notebook run in JupyterLab): the standard profile's parameters, shrunk to
    a small case, write under build/standard/ and leave git status (data/results, figures, README) unchanged."""
    import papermill

    before = _git_status()
    if before is None:
        pytest.skip("not a git checkout")
    monkeypatch.delenv("SPECREPRO_RECORD", raising=False)
    # the quickstart: the cheapest notebook that writes a table (notebook 04, used here before, cost 146 s of make
    # unit's ~2100 worker-seconds); every parameter it has takes the quick profile's value, then smaller still; the
    # profile stays "standard", the case that must not write the record
    source = ROOT / "notebooks" / "00_quickstart.ipynb"
    written = ROOT / "build" / "standard" / "results" / "quickstart_ar_humaneval.csv"
    quick = {k: v for k, v in _profile("quick").items() if k in _parameters(source) and k != "profile"}
    small = dict(n_prompts=1, max_new_tokens=4)
    started = time.time()
    papermill.execute_notebook(str(source), str(tmp_path / "out.ipynb"), kernel_name="python3",
                               cwd=str(ROOT / "notebooks"), progress_bar=False, parameters={**quick, **small})
    assert _git_status() == before
    assert written.exists() and written.stat().st_mtime >= started - 1, f"{written} was not written by this run"


@pytest.mark.parametrize("path", SOURCES, ids=[p.name for p in SOURCES])
def test_papermill_reads_every_parameter(path):
    """papermill's parameter inspection (``papermill --help-notebook``, JupyterLab extensions) skips a line with a
    second '=' (e.g. in its comment): every name the parameters cell assigns must come back from it."""
    import papermill

    names = set(papermill.inspect_notebook(str(path)))
    assert set(_parameters(path)) <= names, f"papermill cannot read {sorted(set(_parameters(path)) - names)}"


@pytest.mark.parametrize("path", SOURCES, ids=[p.name for p in SOURCES])
def test_header_lists_exactly_the_notebooks_scorecard_rows(path):
    """The header's "Scorecard rows" names every claim of data/claims.csv that the notebook feeds, and no other id
    (a renamed or removed claim leaves no stale id for a reader to look up in vain)."""
    import csv

    with open(ROOT / "data" / "claims.csv", newline="") as f:
        own = {row["id"] for row in csv.DictReader(f) if row["notebook"] == path.stem}
    header = nbformat.read(path, as_version=4).cells[0].source
    line = re.search(r"\*\*Scorecard rows\*\*[^\n]*", header)
    listed = set(re.findall(r"`([a-z0-9][a-z0-9-]*)`", line.group(0))) if line else set()
    assert listed == own, f"{path.name} header lists {sorted(listed)}; data/claims.csv gives it {sorted(own)}"


def _assignments(src: str) -> dict:
    import ast

    out = {}
    for node in ast.parse(src).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = ast.literal_eval(node.value)
    return out


@pytest.mark.parametrize("path", SOURCES, ids=[p.name for p in SOURCES])
def test_quick_reference_parameters_are_the_quick_profile(path):
    """nbval re-executes the references with their own injected cell: it must hold exactly the quick profile's values
    of the parameters the notebook declares (what `make nbval-refresh` injects), or nbval tests stale sizes."""
    from specrepro.record.nbrun import notebook_parameters

    ref = ROOT / "notebooks" / "executed" / "quick" / path.name
    injected = [c.source for c in nbformat.read(ref, as_version=4).cells
                if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1, f"{ref.name}: expected one injected-parameters cell"
    assert _assignments(injected[0]) == notebook_parameters(_profile("quick"), path), (
        f"{ref.relative_to(ROOT)} was run with other parameters than profiles/quick.yaml: `make nbval-refresh`")


def test_declared_parameters_filter_the_profile():
    from specrepro.record.nbrun import declared_parameters, notebook_parameters

    source = ROOT / "notebooks" / "05_specinfer_trees.ipynb"
    declared = declared_parameters(source)
    assert declared[:3] == ["profile", "device", "dtype"] and "widths" in declared and "m2_epochs" not in declared
    quick = _profile("quick")
    kept = notebook_parameters(quick, source)
    assert set(kept) == set(quick) & set(declared) and "m2_epochs" not in kept


def test_first_look_writes_under_build_only():
    """`make reproduce PROFILE=quick` (a new user's first look) executes every notebook into build/quick/ and runs no
    record writer: a dry run lists the commands, and none writes a tracked path."""
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = subprocess.run(["make", "-n", "-B", "reproduce", "PROFILE=quick"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    runs = [line.split() for line in out.stdout.splitlines() if "specrepro.record.nbrun" in line]
    assert len(runs) == len(SOURCES), out.stdout
    assert all(words[-1].startswith("build/quick/") for words in runs), [w[-1] for w in runs]
    for forbidden in ("notebooks/executed/", "data/results/", "figures/", "README.md", "--json", "verdict-history",
                      "audit --out", "greedy-equality", "pass-at-1"):
        assert forbidden not in out.stdout, f"the quick reproduce would run {forbidden!r}"


def _tiny_notebook(path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# t"), nbformat.v4.new_code_cell("x = 1")]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def test_a_run_stamps_its_own_run_time_without_a_timestamp(tmp_path):
    """The run time of an executed notebook is measured by the run and kept in the notebook (never typed into prose);
    the stamp holds a day, not a time of day, so executed notebooks still carry no timestamps."""
    from specrepro.record.nbrun import run_facts, stamp_run

    nb = _tiny_notebook(tmp_path / "00_t.ipynb")
    assert run_facts(nb) is None
    facts = stamp_run(nb, 125.0, "standard")
    assert run_facts(nb) == facts
    assert facts["minutes"] == 2.1 and facts["profile"] == "standard" and re.fullmatch(r"\d{4}-\d\d-\d\d", facts["date"])
    assert facts["commit"] and facts["cpu"]
    text = nb.read_text()
    assert '"start_time"' not in text and '"end_time"' not in text and not re.search(r"T\d\d:\d\d", text)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            stamp_run(nb, bad, "standard")


def test_runtimes_block_gives_the_stamped_minutes_or_says_not_recorded(tmp_path):
    from specrepro.record.nbrun import stamp_run
    from specrepro.record.report import render_runtimes

    stamp_run(_tiny_notebook(tmp_path / "standard" / "00_a.ipynb"), 600.0, "standard")
    _tiny_notebook(tmp_path / "standard" / "01_b.ipynb")
    _tiny_notebook(tmp_path / "quick" / "00_a.ipynb")  # CI's references are not a record of run time
    stamp_run(_tiny_notebook(tmp_path / "standard" / "08_scorecard.ipynb"), 60.0, "standard")  # renders the block
    block = render_runtimes(tmp_path)
    rows = [line for line in block.splitlines() if line.startswith("| `")]
    assert len(rows) == 2, block
    assert rows[0].startswith("| `00_a` | standard | 10.0 |") and "not recorded" in rows[1]
    assert "1 notebook(s) were executed before run times were stamped" in block


def test_code_drift_finds_the_changed_cells_and_skips_the_injected_parameters(tmp_path):
    from specrepro.record.nbrun import code_drift
    from specrepro.record.report import render_runtimes

    src = _tiny_notebook(tmp_path / "src" / "00_a.ipynb")
    nb = nbformat.read(str(src), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("y = 2"))
    nbformat.write(nb, str(src))
    ran = nbformat.read(str(src), as_version=4)
    injected = nbformat.v4.new_code_cell("profile = 'standard'")
    injected.metadata["tags"] = ["injected-parameters"]
    ran.cells.insert(1, injected)
    ran.cells[1 + 1].outputs = [nbformat.v4.new_output("stream", text="out")]  # outputs are not code
    out = tmp_path / "executed" / "standard" / "00_a.ipynb"
    out.parent.mkdir(parents=True)
    nbformat.write(ran, str(out))
    assert code_drift(src, out) == []
    ran.cells[-1].source = "y = 3"
    nbformat.write(ran, str(out))
    assert code_drift(src, out) == [2]
    ran.cells.append(nbformat.v4.new_code_cell("z = 4"))
    nbformat.write(ran, str(out))
    assert code_drift(src, out) == [2, 3]
    block = render_runtimes(tmp_path / "executed", sources=tmp_path / "src")
    assert "**no**: code cells 2, 3 changed since" in block and "1 executed notebook(s) show code" in block
    with pytest.raises(FileNotFoundError):
        code_drift(tmp_path / "nope.ipynb", out)


@pytest.mark.parametrize("path", SOURCES, ids=[p.name for p in SOURCES])
def test_the_standard_executed_notebook_shows_the_code_of_its_source(path):
    """The committed record's notebook runs what its source holds today: a reader opening
    notebooks/executed/standard/<nb>.ipynb sees the outputs of the code in notebooks/<nb>.ipynb."""
    from specrepro.record.nbrun import code_drift

    executed = ROOT / "notebooks" / "executed" / "standard" / path.name
    if not executed.is_file():
        pytest.skip(f"{path.name} has no executed standard copy")
    drift = code_drift(path, executed)
    assert not drift, (f"notebooks/executed/standard/{path.name}: code cells {drift} differ from the source; rerun "
                       f"it with `make reproduce` (or its make target) so the record shows what the source runs")
