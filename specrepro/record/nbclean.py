"""Strip what changes run to run, and what only a live kernel needs, from an executed notebook, so committed executed
notebooks diff cleanly and stay small; every other output stays (readers look at them in JupyterLab).

Usage: ``python -m specrepro.record.nbclean NOTEBOOK.ipynb [...]`` (rewrites each file atomically).

Removed: papermill's and the cells' timestamps and durations, absolute paths (the repository root becomes ``.``),
tqdm's ``IProgress not found`` warning, and progress bars down to their final state: a text bar as a terminal shows it
(:func:`resolve_carriage_returns`), a notebook bar (tqdm's ipywidgets bar, whose live state nbclient stores in the
notebook's metadata) as a plain-text output of its final line, or nothing if it hid itself (``leave=False``), and the
stored widget state (kilobytes per bar) dropped.
"""

from __future__ import annotations

import functools
import html
import re
import sys
from pathlib import Path

import nbformat

from specrepro.files import atomic_write_text, repo_root

__all__ = ["clean_notebook", "clean_notebook_node", "resolve_carriage_returns"]

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
_PROGRESS_MODELS = ("FloatProgressModel", "IntProgressModel")
# tqdm's warning when tqdm.auto finds a kernel but no ipywidgets: "<file>:<line>: TqdmWarning: IProgress not found..."
# followed by the indented source line that triggered it
_IPROGRESS_WARNING = re.compile(r"^[^\n]*TqdmWarning: IProgress not found[^\n]*\n?(?:[ \t]+[^\n]*\n?)?", re.M)
_CR_LINE = re.compile(r"([^\n]*\r[^\n]*)(\n|\Z)")  # a line holding a carriage return, and its line end if any


def resolve_carriage_returns(text: str) -> str:
    """The text a terminal shows for stream ``text``: after a carriage return the line is overwritten from its start
    (``"abcdef\\rxy"`` shows ``"xycdef"``; ``"\\r\\n"`` is a line end), then loses its trailing spaces (a bar's
    padding), and its line end too if it ends up blank (a bar that erased itself); other lines are kept as they are."""
    def shown(match: re.Match) -> str:  # match: a line with a carriage return, and its line end
        line = functools.reduce(lambda seen, segment: segment + seen[len(segment):], match[1].split("\r"), "").rstrip()
        return line + match[2] if line else ""

    return _CR_LINE.sub(shown, text.replace("\r\n", "\n"))


def _model(state: dict, ref) -> dict | None:
    """The stored model a widget reference (``"IPY_MODEL_<id>"`` or a bare id) points to, or None."""
    return state.get(ref.removeprefix("IPY_MODEL_")) if isinstance(ref, str) else None


def _tqdm_final_line(model: dict, state: dict) -> tuple[str | None, bool]:
    """``(final text, hidden)`` of a stored tqdm notebook bar (an HBox of label, progress bar, label), or
    ``(None, False)`` when ``model`` is not shaped like one."""
    box = model.get("state", {}) if (model or {}).get("model_name") == "HBoxModel" else {}
    parts = [model, *(_model(state, ref) for ref in box.get("children", []))]
    if [(m or {}).get("model_name") for m in parts] not in (["HBoxModel", "HTMLModel", p, "HTMLModel"]
                                                            for p in _PROGRESS_MODELS):
        return None, False
    _, left, bar, right = parts
    hidden = (_model(state, box.get("layout")) or {}).get("state", {}).get("visibility") == "hidden"
    # tqdm's HTML labels: entities escaped, spaces as figure spaces (U+2007)
    ltext, rtext = (html.unescape(str(m.get("state", {}).get("value") or "")).replace("\u2007", " ")
                    for m in (left, right))
    if not ltext:  # a bar without a total: tqdm puts the whole meter (count, elapsed, rate) in the right label
        return rtext.strip(), hidden
    from tqdm.std import Bar

    bstate = bar.get("state", {})
    lo, hi, value = float(bstate.get("min") or 0.0), float(bstate.get("max") or 0.0), float(bstate.get("value") or 0.0)
    frac = min(max((value - lo) / (hi - lo), 0.0), 1.0) if hi > lo else 0.0
    return f"{ltext}|{format(Bar(frac, default_len=10), '')}|{rtext}", hidden


def _clean_outputs(outputs: list, state: dict, root: str) -> list:
    """A code cell's outputs cleaned: each widget view as plain text (a tqdm bar as its final line, dropped if it hid
    itself; any other widget as its ``text/plain`` fallback, dropped if it has none), consecutive outputs of one
    stream merged, then resolved as a terminal shows them (dropped if nothing is left), ``root`` written ``.``."""
    kept = []
    for out in outputs:
        data = out.get("data", {})
        if out.get("output_type") in ("display_data", "execute_result") and WIDGET_VIEW in data:
            view = data[WIDGET_VIEW] if isinstance(data[WIDGET_VIEW], dict) else {}
            text, hidden = _tqdm_final_line(_model(state, view.get("model_id")), state)
            if hidden or (text is None and not data.get("text/plain")) or view.get("model_id") == "":
                continue
            data.pop(WIDGET_VIEW)
            out["data"] = data if text is None else {"text/plain": text}
        last = kept[-1] if kept else {}
        if out.get("output_type") == last.get("output_type") == "stream" and last.get("name") == out.get("name"):
            last["text"] += out["text"]
        else:
            kept.append(out)
    for out in kept:
        if out.get("output_type") == "stream":
            out["text"] = resolve_carriage_returns(_IPROGRESS_WARNING.sub("", out["text"]))
        data = out.get("data", {})
        for node, key in ((out, "text"), (data, "text/plain"), (data, "text/html"), (data, "text/markdown")):
            if isinstance(node.get(key), str) and root in node[key]:
                node[key] = node[key].replace(root, ".")
    return [o for o in kept if o.get("output_type") != "stream" or o["text"]]


def clean_notebook_node(nb) -> None:
    """Clean a notebook in memory (an ``nbformat`` v4 NotebookNode) as the module docstring says."""
    pm = nb.metadata.get("papermill", {})
    for key in ("start_time", "end_time", "duration", "exception", "input_path", "output_path"):
        pm.pop(key, None)
    if isinstance(pm.get("environment_variables"), dict):
        pm["environment_variables"].clear()
    widgets = nb.metadata.pop("widgets", None) or {}
    state = (widgets.get(WIDGET_STATE) or {}).get("state") or {}
    root = str(repo_root())
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        for key in ("start_time", "end_time", "duration", "status", "exception"):
            cell.metadata.get("papermill", {}).pop(key, None)
        if cell.get("cell_type") == "code":
            cell["outputs"] = _clean_outputs(cell.get("outputs", []), state, root)


def clean_notebook(path: str | Path) -> None:
    """Clean the executed notebook at ``path`` in place, atomically (:func:`clean_notebook_node`).

    Raises:
        FileNotFoundError: ``path`` does not exist; nbformat's errors for a file that is not a notebook.
    """
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    clean_notebook_node(nb)
    atomic_write_text(path, nbformat.writes(nb) + "\n")


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        clean_notebook(arg)
