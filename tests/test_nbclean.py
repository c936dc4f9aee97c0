"""specrepro.record.nbclean: executed notebooks keep each progress bar's final state and nothing run-dependent."""

import json

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from specrepro.files import repo_root
from specrepro.record.nbclean import (
    WIDGET_STATE,
    WIDGET_VIEW,
    clean_notebook,
    clean_notebook_node,
    resolve_carriage_returns,
)

IPROGRESS = ("./.venv/lib/python3.11/site-packages/tqdm/auto.py:21: TqdmWarning: IProgress not found. Please update "
             "jupyter and ipywidgets. See https://ipywidgets.readthedocs.io/en/stable/user_install.html\n"
             "  from .autonotebook import tqdm as notebook_tqdm\n")


def test_carriage_returns_keep_what_a_terminal_shows():
    assert resolve_carriage_returns("no bar\nhere\n") == "no bar\nhere\n"
    assert resolve_carriage_returns("\rx:   0%|  | 0/2\rx:  50%|# | 1/2\rx: 100%|##| 2/2\n") == "x: 100%|##| 2/2\n"
    # a shorter overwrite keeps the tail of the longer line, as a terminal does
    assert resolve_carriage_returns("abcdef\rxy") == "xycdef"
    # a bar that erased itself (tqdm leave=False: spaces, then a carriage return) leaves no blank line
    assert resolve_carriage_returns("a\n\rgone: 50%\r          \rb\n") == "a\nb\n"
    assert resolve_carriage_returns("\rgone: 50%\r          \r") == ""
    # Windows line ends are line ends, and blank lines without carriage returns stay
    assert resolve_carriage_returns("a\r\n\nb\r\n") == "a\n\nb\n"


def _model(name, **state):
    return {"model_module": "@jupyter-widgets/controls", "model_module_version": "2.0.0", "model_name": name,
            "state": {"_model_name": name, **state}}


def _tqdm_widget(state, key, left, value, maximum, right, hidden=False):
    """Store a tqdm notebook bar the way nbclient does: an HBox of HTML label, FloatProgress, HTML label."""
    state[f"{key}-l"] = _model("HTMLModel", value=left)
    state[f"{key}-p"] = _model("FloatProgressModel", value=value, max=maximum, min=0.0, bar_style="success")
    state[f"{key}-r"] = _model("HTMLModel", value=right)
    state[f"{key}-layout"] = _model("LayoutModel", visibility="hidden" if hidden else None)
    state[key] = _model("HBoxModel", children=[f"IPY_MODEL_{key}-{c}" for c in "lpr"],
                        layout=f"IPY_MODEL_{key}-layout")
    return new_output("display_data", data={WIDGET_VIEW: {"model_id": key, "version_major": 2, "version_minor": 0},
                                            "text/plain": f"{key}:   0%|          | 0/? [00:00<?, ?it/s]"})


def _stream(name, text):
    return new_output("stream", name=name, text=text)


def _synthetic():
    state = {}
    root = str(repo_root())
    nb = new_notebook()
    nb.metadata["papermill"] = {"start_time": "2026-01-01T00:00:00", "end_time": "2026-01-01T00:01:00",
                                "duration": 60.0, "parameters": {"profile": "quick"}}
    text_bar = [_stream("stderr", IPROGRESS)] + [
        _stream("stderr", f"\rtrain: {p:3d}%|{'#' * (p // 10):10s}| {p // 10}/10 [00:{p // 10:02d}<00:00, 1.00it/s]")
        for p in range(0, 101, 10)] + [_stream("stderr", "\n")]
    nb.cells = [
        new_markdown_cell("# a synthetic executed notebook"),
        new_code_cell("train()", outputs=[_stream("stdout", "start\n")] + text_bar + [_stream("stdout", "done\n")]),
        new_code_cell("fetch()", outputs=[
            _tqdm_widget(state, "fetch", "fetch\u2007model:\u2007100%", 22.0, 22.0,
                         "\u200722/22\u2007[05:30&lt;00:00,\u200715.0s/part]"),
            _tqdm_widget(state, "assemble", "assemble:\u2007\u200767%", 3.0, 3.0, "\u20072/3", hidden=True),
            _tqdm_widget(state, "split", "", 1.0, 1.0,
                         "\u2007164\u2007examples\u2007[00:00,\u200719505.62\u2007examples/s]"),
            new_output("display_data", data={WIDGET_VIEW: {"model_id": "slider"}, "text/plain": "IntSlider(value=3)"}),
            new_output("display_data", data={WIDGET_VIEW: {"model_id": "nothing"}}),
            _stream("stdout", f"cached under {root}/data/results\n"),
        ]),
    ]
    nb.cells[1].metadata["execution"] = {"iopub.execute_input": "2026-01-01T00:00:01"}
    nb.cells[1].metadata["papermill"] = {"start_time": "x", "end_time": "y", "duration": 1.0, "status": "completed"}
    state["slider"] = _model("IntSliderModel", value=3)
    nb.metadata["widgets"] = {WIDGET_STATE: {"state": state, "version_major": 2, "version_minor": 0}}
    return nb


def test_synthetic_notebook_keeps_each_bar_final_state(tmp_path):
    path = tmp_path / "executed.ipynb"
    nbformat.write(_synthetic(), path)
    clean_notebook(path)
    nb = nbformat.read(path, as_version=4)
    assert "widgets" not in nb.metadata
    assert nb.metadata["papermill"] == {"parameters": {"profile": "quick"}}
    assert "execution" not in nb.cells[1].metadata and nb.cells[1].metadata["papermill"] == {}
    train = nb.cells[1].outputs
    assert [(o.output_type, o.name, o.text) for o in train] == [
        ("stream", "stdout", "start\n"),
        ("stream", "stderr", "train: 100%|##########| 10/10 [00:10<00:00, 1.00it/s]\n"),
        ("stream", "stdout", "done\n")]
    fetch = nb.cells[2].outputs
    assert [o.output_type for o in fetch] == ["display_data", "display_data", "display_data", "stream"]
    assert fetch[0].data == {"text/plain": "fetch model: 100%|██████████| 22/22 [05:30<00:00, 15.0s/part]"}
    assert fetch[1].data == {"text/plain": "164 examples [00:00, 19505.62 examples/s]"}  # a bar without a total
    assert fetch[2].data == {"text/plain": "IntSlider(value=3)"}  # another widget: its text fallback
    assert fetch[3].text == "cached under ./data/results\n"
    text = path.read_text()
    assert "IProgress" not in text and "\\r" not in text and WIDGET_VIEW not in text and "assemble" not in text


def test_cleaning_twice_changes_nothing(tmp_path):
    path = tmp_path / "executed.ipynb"
    nbformat.write(_synthetic(), path)
    clean_notebook(path)
    once = path.read_text()
    clean_notebook(path)
    assert path.read_text() == once


def test_real_tqdm_bars_from_a_kernel(tmp_path):
    """tqdm.auto inside a real kernel (as papermill runs the notebooks): the stored widget state gives each bar's
    final line, the leave=False bar goes, and the notebook shrinks to a fraction of its size."""
    pytest.importorskip("ipywidgets")
    nbclient = pytest.importorskip("nbclient")
    nb = new_notebook(cells=[new_code_cell(
        "from tqdm.auto import tqdm\n"
        "for _ in tqdm(range(7), desc='kept', unit='step'):\n    pass\n"
        "for _ in tqdm(range(3), desc='gone', leave=False):\n    pass\n"
        "bar = tqdm(total=4, desc='loss bar')\n"
        "for i in range(4):\n    bar.update(1)\n    bar.set_postfix(loss=f'{1 / (i + 1):.3f}')\n"
        "bar.close()\nprint('end')")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    try:
        nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    except Exception as exc:  # no usable kernel on this machine
        pytest.skip(f"no python3 kernel to execute a notebook: {exc}")
    raw = len(json.dumps(nb))
    assert WIDGET_VIEW in nb.cells[0].outputs[0].data, "tqdm.auto did not pick the notebook bar"
    clean_notebook_node(nb)
    outs = nb.cells[0].outputs
    texts = [o.data["text/plain"] if o.output_type == "display_data" else o.text for o in outs]
    assert len(texts) == 3, texts
    assert texts[0].startswith("kept: 100%|██████████| 7/7 [") and "step/s]" in texts[0]
    assert texts[1].startswith("loss bar: 100%|██████████| 4/4 [") and texts[1].endswith("loss=0.250]")
    assert texts[2] == "end\n"
    assert len(json.dumps(nb)) < raw / 4
