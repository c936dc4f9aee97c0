"""Staleness is detected, not remembered: figures and executed notebooks record the sha256 of the tables they were
drawn from, `python -m specrepro status` compares them with today's bytes, and every timed block records whether the
machine was idle."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from specrepro import files  # noqa: E402
from specrepro.bench.cli import command_settings  # noqa: E402
from specrepro.record import nbrun, results, status  # noqa: E402

ROOT = files.repo_root()

@pytest.fixture(scope="module")
def table():
    return status.status_table()


def _flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-2] = ord("7") if data[-2] != ord("7") else ord("8")
    path.write_bytes(bytes(data))


def test_the_committed_record_is_current(table):
    """Every shard, executed notebook and figure of the record is current: no list of exceptions."""
    bad = [f"{row.name}: {row.state} ({row.why})" for row in table.itertuples() if row.state != "current"]
    assert bad == []


def test_a_shard_too_long_for_the_slowest_cpu_of_the_record_is_noted(table):
    """Each shard's run time is scaled to the slowest CPU the record has met (its forward cost over the CPU's that
    ran the shard); a shard within the bound on its own CPU but over it there says so."""
    costs = status.forward_costs()
    slowest = max(costs.values())
    checked = 0
    for row in table[table["kind"] == "shard"].itertuples():
        if row.cpu not in costs or not math.isfinite(row.minutes):
            assert not math.isfinite(row.slowest_min)
            continue
        checked += 1
        assert row.slowest_min == pytest.approx(row.minutes * slowest / costs[row.cpu], abs=0.06)
        noted = "to be split" in (row.note if isinstance(row.note, str) else "")
        assert noted == (row.minutes <= status.SHARD_BOUND_MIN < row.slowest_min), row.name
    assert checked > 10


def test_every_makefile_rule_writing_the_record_outside_a_notebook_is_a_shard():
    text = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^(data/results/[\w.]+)(?: data/results/[\w.]+)*\s*&?:", text, flags=re.M))
    targets |= {t for group in re.findall(r"^((?:data/results/[\w.]+ ?)+)&:", text, flags=re.M)
                for t in group.split()}
    outputs = {o for s in status.SHARDS for o in s.outputs}
    assert targets and targets <= outputs, sorted(targets - outputs)


def test_a_figure_goes_stale_on_a_one_byte_change_to_a_table_it_was_drawn_from(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "repo_root", lambda: tmp_path)
    monkeypatch.setattr(results, "repo_root", lambda: tmp_path)
    (tmp_path / "pyproject.toml").write_text("")
    files.clear_reads()
    results.save_table(pd.DataFrame({"n": [1, 2], "ms": [10.5, 12.25]}), "curve", profile="unit")
    results.save_table(pd.DataFrame({"x": [0]}), "other", profile="unit")
    fig, ax = plt.subplots()
    ax.plot([1, 2], [10.5, 12.25])
    results.save_figure(fig, "fig_curve", profile="unit")
    plt.close(fig)
    files.clear_reads()
    sidecar = tmp_path / "build/unit/figures/fig_curve.provenance.json"
    inputs = json.loads(sidecar.read_text())["inputs"]
    assert sorted(inputs) == ["build/unit/results/curve.csv", "build/unit/results/other.csv"]
    assert status.figure_status(sidecar, tmp_path)["state"] == "current"
    _flip_one_byte(tmp_path / "build/unit/results/curve.csv")
    row = status.figure_status(sidecar, tmp_path)
    assert row["state"] == "stale" and row["why"] == "build/unit/results/curve.csv changed"
    (tmp_path / "build/unit/results/other.csv").unlink()
    assert "build/unit/results/other.csv missing" in status.figure_status(sidecar, tmp_path)["why"]


def test_a_committed_figure_goes_stale_on_a_one_byte_change_to_its_table(tmp_path):
    """The same check on a copy of the record: a figure of it that records its inputs is stale once one of them
    changes by one byte (skips while no committed figure records its inputs yet)."""
    recorded = [p for p in sorted((ROOT / "figures").glob("*.provenance.json"))
                if json.loads(p.read_text()).get("inputs")]
    if not recorded:
        pytest.skip("no committed figure records its inputs")
    sidecar = recorded[0]
    inputs = json.loads(sidecar.read_text())["inputs"]
    (tmp_path / "figures").mkdir()
    for name in json.loads(sidecar.read_text())["sha256"]:
        shutil.copy(sidecar.parent / name, tmp_path / "figures" / name)
    shutil.copy(sidecar, tmp_path / "figures" / sidecar.name)
    for rel in inputs:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    copy = tmp_path / "figures" / sidecar.name
    assert status.figure_status(copy, tmp_path)["state"] == "current"
    first = sorted(inputs)[0]
    _flip_one_byte(tmp_path / first)
    assert status.figure_status(copy, tmp_path)["why"] == f"{first} changed"


def test_an_executed_notebook_records_and_checks_what_it_read(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "repo_root", lambda: tmp_path)
    src = tmp_path / "nb.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_markdown_cell("text")]
    nbformat.write(nb, str(src))
    executed = tmp_path / "executed.ipynb"
    shutil.copy(src, executed)
    table = tmp_path / "data/results/t.csv"
    table.parent.mkdir(parents=True)
    table.write_text("a\n1\n")
    log = tmp_path / "reads.log"
    monkeypatch.setenv(files.READS_ENV, str(log))
    files.note_read(table)
    table.write_text("a\n2\n")
    files.note_read(table)  # the last bytes count
    with open(log, "a") as f:
        f.write('{"path": "cut sh')  # an interrupted write names nothing
    inputs = nbrun.read_log(log)
    assert inputs == {"data/results/t.csv": files.sha256_bytes(b"a\n2\n")}
    nbrun.stamp_inputs(executed, inputs, src)
    assert nbrun.recorded_inputs(executed) == inputs
    assert status.notebook_status(src, executed, tmp_path)["state"] == "current"
    table.write_text("a\n3\n")
    row = status.notebook_status(src, executed, tmp_path)
    assert row["state"] == "stale" and row["why"] == "data/results/t.csv changed"
    # markdown alone does not change the code's hash; code does
    assert nbrun.source_code_sha256(src) == nbrun.source_code_sha256(executed)
    nb.cells[0].source = "x = 2"
    nbformat.write(nb, str(src))
    assert "code cells 1 changed since" in status.notebook_status(src, executed, tmp_path)["why"]


def test_bench_settings_are_compared_with_the_make_recipe():
    line = ("/x/.venv/bin/python -m specrepro bench --pair qwen-coder --workload humaneval --n-prompts 20 "
            "--max-new-tokens 64 --seed 0 --repeats 3 --methods ar,sd-draft-int8@4 --opt draft_kind=int8 "
            "--temperature 0.8 --top-p 0.95 --json data/results/x.json")
    recipe = command_settings(line)
    config = {"methods": ["ar", "sd-draft-int8@4"], "n_prompts": 20, "max_new_tokens": 64, "temperature": 0.8,
              "top_p": 0.95, "top_k": 0, "seed": 0, "repeats": 3, "workload": "humaneval",
              "options": {"draft_kind": "int8", "other": "kept"}, "chat_template": False, "dtype": "float32"}
    assert status.bench_setting_changes(config, recipe) == []
    assert status.bench_setting_changes({**config, "repeats": 1}, recipe) == [
        "repeats: recorded 1, the Makefile asks 3"]
    assert status.bench_setting_changes({**config, "options": {"draft_kind": "float32"}}, recipe) == [
        "options: recorded {'draft_kind': 'float32'}, the Makefile asks {'draft_kind': 'int8'}"]
    # a file written before --prompt-offset existed started at the first prompt; a held-out recipe differs from it
    held_out = command_settings(line.replace("--n-prompts 20", "--prompt-offset 20 --n-prompts 20"))
    assert status.bench_setting_changes(config, held_out) == ["prompt_offset: recorded 0, the Makefile asks 20"]
    assert status.bench_setting_changes({**config, "prompt_offset": 20}, held_out) == []
    # a part of a run too long for one sitting (--part I/K) is compared as a part
    part = command_settings(line.replace("--n-prompts 20", "--n-prompts 20 --part 1/4"))
    assert status.bench_setting_changes({**config, "part": [1, 4]}, part) == []
    assert status.bench_setting_changes({**config, "part": [2, 4]}, part) == [
        "part: recorded [2, 4], the Makefile asks [1, 4]"]
    assert status.bench_setting_changes(config, part) == ["part: recorded None, the Makefile asks [1, 4]"]


def test_a_merged_bench_file_is_current_with_its_parts_and_bounded_by_its_longest(tmp_path):
    """A bench file merged from parts (bench --merge) reports its longest part's sitting, and goes stale when a part
    it was merged from changes or goes missing."""
    from specrepro.bench.run import BenchResult, write_bench_json

    folder = tmp_path / "data" / "results"
    folder.mkdir(parents=True)
    parts = []
    for i, seconds in enumerate((1500.0, 2400.0)):
        f = folder / f"b.p{i}.json"
        f.write_text(json.dumps({"config": {"part": [i, 2], "seconds": seconds}}))
        parts.append({"part": [i, 2], "seconds": seconds, "file": f.name, "sha256": files.sha256_bytes(f.read_bytes())})
    write_bench_json(BenchResult(summary=pd.DataFrame(), runs=pd.DataFrame(),
                                 config={"cpu": "x", "seconds": None, "parts": parts}), folder / "b.json")
    merge = ["python -m specrepro bench --merge data/results/b.p0.json data/results/b.p1.json --json data/results/b.json"]
    row = status.shard_status(status.Shard("data/results/b.json", ("data/results/b.json",)), tmp_path, recipe=merge)
    assert row["state"] == "current" and row["minutes"] == 40.0 and "merged from 2 parts" in row["note"]
    assert "over 60 min" not in row["note"]
    (folder / "b.p1.json").write_text("{}")
    row = status.shard_status(status.Shard("data/results/b.json", ("data/results/b.json",)), tmp_path, recipe=merge)
    assert row["state"] == "stale" and "b.p1.json changed since the merge" in row["why"]
    (folder / "b.p0.json").unlink()
    row = status.shard_status(status.Shard("data/results/b.json", ("data/results/b.json",)), tmp_path, recipe=merge)
    assert "b.p0.json is missing" in row["why"]


def test_machine_state_reads_other_processes_and_steal():
    hz = 100.0
    before = files.MachineSnapshot((0.0, 0.5, 1000.0, 500.0, 0.0, 1.0))
    # 200 jiffies pass: 100 idle, 20 stolen, 80 busy of which this process used 0.3 s = 30 jiffies
    after = files.MachineSnapshot((1.0, 1.5, 1200.0, 600.0, 20.0, 1.3))
    state = files.machine_state(before, after)
    if files.os.sysconf("SC_CLK_TCK") != hz:
        pytest.skip("a clock tick other than 1/100 s")
    assert state == {"load_before": 0.5, "load_after": 1.5, "steal_pct": 10.0, "other_cpu_pct": 25.0,
                     "under_load": True}
    idle = files.MachineSnapshot((1.0, 1.0, 1200.0, 690.0, 0.0, 2.0))
    assert files.machine_state(before, idle)["under_load"] is False
    assert files.machine_state(before, before)["under_load"] is None  # no time passed: nothing to say


def test_every_timed_block_records_the_machine_state():
    import torch

    from specrepro.measure.harness import RunOutput, run_interleaved

    runners = {"a": lambda ids, gen: RunOutput(tokens=ids.tolist()), "b": lambda ids, gen: RunOutput(tokens=ids.tolist())}
    prompts = [("p0", torch.tensor([1, 2, 3])), ("p1", torch.tensor([4, 5]))]
    out = run_interleaved(runners, prompts, repeats=2, progress=False)
    for col in ("load_before", "load_after", "steal_pct", "other_cpu_pct", "under_load"):
        assert col in out.columns
    # one state per (repeat, prompt) block: the methods timed side by side share it
    assert (out.groupby(["repeat", "prompt_index"])["load_before"].nunique() <= 1).all()
