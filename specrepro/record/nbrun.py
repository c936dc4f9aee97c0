"""Execute one notebook under a profile: papermill with only the parameters the notebook declares, then nbclean.

Usage: ``python -m specrepro.record.nbrun --profile profiles/quick.yaml notebooks/05_specinfer_trees.ipynb OUT.ipynb``

The step of every ``make`` rule that executes a notebook. The profile is filtered to the notebook's ``parameters``
cell (:func:`notebook_parameters`: papermill would warn of, and inject, every other key); the notebook runs from
``notebooks/`` and is written atomically, cleaned (:mod:`specrepro.record.nbclean`) and stamped with its own run
(:func:`stamp_run`, tabulated by docs/profiles.md's ``runtimes`` block) and what it was drawn from
(:func:`stamp_inputs`, compared by ``python -m specrepro status``). Where outputs go is the Makefile's ``EXECUTED_DIR``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime
import hashlib
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path

from specrepro.files import READS_ENV, atomic_write_text, cpu_description, git_commit, hold_record_lock_for

__all__ = ["RUN_KEY", "declared_parameters", "notebook_parameters", "stamp_run", "run_facts", "code_drift",
           "run_notebook", "read_log", "source_code_sha256", "stamp_inputs", "recorded_inputs", "main"]

RUN_KEY = "specrepro"  # the executed notebook's metadata key that holds {"run": {...}} (:func:`stamp_run`)


def _read(notebook: str | Path):
    import nbformat  # the notebooks' extra: imported only where a notebook is read

    return nbformat.read(str(notebook), as_version=4)


def _stamp(notebook: str | Path, **entries) -> None:
    """Set ``metadata.specrepro.<key>`` to each of ``entries`` in ``notebook``, atomically."""
    import nbformat

    nb = _read(notebook)
    nb.metadata.setdefault(RUN_KEY, {}).update(entries)
    atomic_write_text(Path(notebook), nbformat.writes(nb) + "\n")


def _code_cells(notebook: str | Path) -> list[str]:
    """The code cells' text, each stripped at its end, papermill's injected-parameters cell left out."""
    return [c.source.rstrip() for c in _read(notebook).cells
            if c.cell_type == "code" and "injected-parameters" not in c.metadata.get("tags", [])]


def declared_parameters(notebook: str | Path) -> list[str]:
    """The names assigned in ``notebook``'s cell tagged ``parameters``, in order.

    Raises:
        ValueError: the notebook has no parameters cell, or more than one.
    """
    cells = [c for c in _read(notebook).cells if "parameters" in c.metadata.get("tags", [])]
    if len(cells) != 1:
        raise ValueError(f"{notebook}: expected one cell tagged 'parameters', found {len(cells)}")
    return list(dict.fromkeys(t.id for node in ast.parse(cells[0].source).body if isinstance(node, ast.Assign)
                              for t in node.targets if isinstance(t, ast.Name)))


def notebook_parameters(profile: dict, notebook: str | Path) -> dict:
    """The entries of ``profile`` that ``notebook`` declares (:func:`declared_parameters`), in the profile's order."""
    declared = set(declared_parameters(notebook))
    return {k: v for k, v in profile.items() if k in declared}


def stamp_run(notebook: str | Path, seconds: float, profile: str) -> dict:
    """Stamp the run that produced ``notebook`` into its metadata (atomically) and return it:
    ``metadata.specrepro.run = {profile, minutes (seconds / 60, one decimal), commit, cpu, date}``, the date a UTC day
    (YYYY-MM-DD: executed notebooks carry no timestamps).

    Raises:
        ValueError: ``seconds`` is negative or not finite.
    """
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"seconds must be finite and >= 0, got {seconds}")
    facts = {"profile": profile, "minutes": round(seconds / 60, 1), "commit": git_commit(), "cpu": cpu_description(),
             "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat()}
    _stamp(notebook, run=facts)
    return facts


def run_facts(notebook: str | Path) -> dict | None:
    """The run :func:`stamp_run` stamped into ``notebook``, or None (executed before runs were stamped)."""
    run = _read(notebook).metadata.get(RUN_KEY, {}).get("run")
    return dict(run) if run else None


def code_drift(source: str | Path, executed: str | Path) -> list[int]:
    """The 1-based numbers of the code cells (papermill's injected cell skipped) whose text differs between
    ``source`` and ``executed`` at the same place, a cell on one side only included; empty when they agree.

    Raises:
        FileNotFoundError: either notebook is missing.
    """
    pairs = itertools.zip_longest(_code_cells(source), _code_cells(executed))  # a missing cell is None
    return [i + 1 for i, (a, b) in enumerate(pairs) if a != b]


def run_notebook(source: str | Path, output: str | Path, profile: str | Path, kernel: str = "python3") -> Path:
    """Execute ``source`` in its own folder with the parameters of ``profile`` (a YAML file) that it declares and
    this process's environment; ``output`` (returned) appears only when the run succeeded (written as
    ``<output>.partial.ipynb``, cleaned, stamped by :func:`stamp_run` and :func:`stamp_inputs`, then renamed).

    Raises:
        FileNotFoundError: no such notebook or profile. papermill.PapermillExecutionError: a cell raised.
    """
    import papermill
    import yaml

    from specrepro.record.nbclean import clean_notebook

    source, output, profile = Path(source), Path(output), Path(profile)
    params = notebook_parameters(yaml.safe_load(profile.read_text()) or {}, source)  # FileNotFoundError if missing
    output.parent.mkdir(parents=True, exist_ok=True)
    hold_record_lock_for(output)  # an executed notebook of record: one job at a time (its kernel shares the lock)
    t0 = time.perf_counter()
    stem = output.name.removesuffix(".ipynb")
    partial, log = output.with_name(f"{stem}.partial.ipynb"), output.with_name(f"{stem}.partial.reads")
    log.unlink(missing_ok=True)
    previous = os.environ.get(READS_ENV)
    os.environ[READS_ENV] = str(log.resolve())  # the kernel inherits it: every table it reads is logged there
    try:
        papermill.execute_notebook(str(source), str(partial), parameters=params, kernel_name=kernel,
                                   cwd=str(source.resolve().parent), progress_bar=False)
    finally:
        if previous is None:
            os.environ.pop(READS_ENV, None)
        else:
            os.environ[READS_ENV] = previous
    clean_notebook(partial)
    stamp_run(partial, time.perf_counter() - t0, profile.stem)
    stamp_inputs(partial, read_log(log), source)
    log.unlink(missing_ok=True)
    os.replace(partial, output)
    return output


def read_log(path: str | Path) -> dict[str, str]:
    """``{path: sha256}`` (the last, sorted by path) of the tables a kernel read or wrote, from the JSON lines log
    :func:`specrepro.files.note_read` appends to; empty when there is no log."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path(path).read_text().splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):  # a line cut short by an interrupted write
                entry = json.loads(line)
                out[str(entry["path"])] = str(entry["sha256"])
    return dict(sorted(out.items()))


def source_code_sha256(source: str | Path) -> str:
    """The sha256 of a notebook's code cells (as :func:`code_drift` compares them) joined by a NUL: a change to the
    code makes an executed notebook stale, a change to markdown alone does not."""
    return hashlib.sha256("\0".join(_code_cells(source)).encode()).hexdigest()


def stamp_inputs(notebook: str | Path, inputs: dict[str, str], source: str | Path) -> None:
    """Stamp into an executed notebook (atomically) what it was drawn from: ``metadata.specrepro.inputs`` (``inputs``,
    :func:`read_log`'s) and ``metadata.specrepro.source_code_sha256`` (of ``source``)."""
    _stamp(notebook, inputs=dict(inputs), source_code_sha256=source_code_sha256(source))


def recorded_inputs(notebook: str | Path) -> dict[str, str] | None:
    """The inputs :func:`stamp_inputs` stamped into an executed notebook, or None (executed before they were)."""
    inputs = _read(notebook).metadata.get(RUN_KEY, {}).get("inputs")
    return dict(inputs) if inputs is not None else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specrepro.record.nbrun", description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", required=True, help="the profile YAML (profiles/<name>.yaml)")
    p.add_argument("--kernel", default="python3")
    p.add_argument("source")
    p.add_argument("output")
    args = p.parse_args(argv)
    run_notebook(args.source, args.output, args.profile, kernel=args.kernel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
