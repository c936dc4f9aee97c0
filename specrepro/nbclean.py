"""Strip what changes run to run from an executed notebook: papermill's timestamps and durations, execution
timestamps, and absolute paths, so committed executed notebooks diff cleanly.

Usage: ``python -m specrepro.nbclean NOTEBOOK.ipynb [...]`` (rewrites each file atomically).

What it is not: an output remover; outputs stay, since readers look at them in JupyterLab without running anything.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

from .results import atomic_write_text, repo_root

__all__ = ["clean_notebook"]


def clean_notebook(path: str | Path) -> None:
    """Remove run-dependent metadata from ``path`` in place."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    pm = nb.metadata.get("papermill", {})
    for key in ("start_time", "end_time", "duration", "exception", "input_path", "output_path"):
        pm.pop(key, None)
    pm.get("environment_variables", {}).clear() if isinstance(pm.get("environment_variables"), dict) else None
    root = str(repo_root())
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        cpm = cell.metadata.get("papermill")
        if isinstance(cpm, dict):
            for key in ("start_time", "end_time", "duration", "status", "exception"):
                cpm.pop(key, None)
        for out in cell.get("outputs", []):
            if "text" in out and root in out["text"]:
                out["text"] = out["text"].replace(root, ".")
            for mime in ("text/plain", "text/html", "text/markdown"):
                data = out.get("data", {})
                if mime in data and root in data[mime]:
                    data[mime] = data[mime].replace(root, ".")
    atomic_write_text(path, nbformat.writes(nb) + "\n")


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        clean_notebook(arg)
