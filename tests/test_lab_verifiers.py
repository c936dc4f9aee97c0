"""The verifier table (read from bench files) and the node-budget sweep of notebook 09, on synthetic runs and tiny
random models."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import tiny_lm
from specrepro.lab.verifiers import VERIFIERS, node_budget_runs, node_budget_summary, verifier_rows


def _bench(tps: dict, speed: dict, prompts=4, repeats=2):
    """A bench JSON with per-method tokens per step and tokens/s (prompt i scales both by 1 + i/10)."""
    runs = []
    for r in range(repeats):
        for i in range(prompts):
            for m in tps:
                steps = 20
                runs.append({"repeat": r, "prompt": f"P/{i}", "method": m, "new_tokens": tps[m] * steps * (1 + i / 10),
                             "steps": steps, "tokens_per_s": speed[m] * (1 + i / 10)})
    return {"config": {}, "summary": [], "runs": runs}


def test_verifier_rows_ratios_and_paper_gains():
    bench = _bench({"ar": 1.0, "sd-draft-int8@4": 3.0, "sd-draft-int8-block@4": 3.3, "sd-tree-int8@2x1x1x1": 3.6,
                    "sd-tree-int8-traversal@2x1x1x1": 3.78},
                   {"ar": 2.0, "sd-draft-int8@4": 4.0, "sd-draft-int8-block@4": 4.2, "sd-tree-int8@2x1x1x1": 4.4,
                    "sd-tree-int8-traversal@2x1x1x1": 4.4})
    t = verifier_rows(bench, "T = 1").set_index("verifier")
    assert list(t.index) == ["token", "block", "mss", "traversal"]
    assert t.loc["token", "nodes"] == 4 and t.loc["mss", "nodes"] == 8
    assert t.loc["block", "compared_with"] == "token" and t.loc["traversal", "compared_with"] == "mss"
    assert t.loc["block", "tps_ratio"] == pytest.approx(1.1) and t.loc["traversal", "tps_ratio"] == pytest.approx(1.05)
    assert t.loc["block", "speed_ratio"] == pytest.approx(1.05) and t.loc["traversal", "speed_ratio"] == pytest.approx(1.0)
    assert t.loc["block", "speedup_vs_ar"] == pytest.approx(2.1)
    assert (t["n_prompts"] == 4).all() and (t["repeats"] == 2).all()
    assert t.loc["block", "paper_low"] == pytest.approx(1.05) and t.loc["block", "paper_high"] == pytest.approx(1.08)
    assert np.isnan(t.loc["token", "tps_ratio"])  # the baseline rule has nothing to be compared with


def test_verifier_rows_need_the_draft_length_in_the_label():
    with pytest.raises(ValueError, match="draft length or tree"):
        verifier_rows(_bench({"sd-draft-int8": 3.0}, {"sd-draft-int8": 4.0}), "T = 1")


class _Tok:
    eos_token_id = None

    def __call__(self, text, return_tensors="pt"):
        return SimpleNamespace(input_ids=torch.tensor([[int(c) for c in text]]))


def test_node_budget_runs_on_tiny_models(one_thread):
    target, draft = tiny_lm("llama", seed=1), tiny_lm("llama", seed=2)
    prompts = [SimpleNamespace(id="a", text="1527"), SimpleNamespace(id="b", text="3046")]
    runs = node_budget_runs(target, draft, _Tok(), prompts, budgets=(2, 4), max_new_tokens=8,
                            verifiers=("token", "block", "mss", "traversal", "spectr"), progress=False)
    assert set(runs["verifier"]) == {"token", "block", "mss", "traversal", "spectr"}
    assert len(runs) == 2 * 5 * 2 and (runs["tokens"] == 8).all()
    depth = np.where(runs["structure"] == "chain", runs["budget"], runs["budget"] // 2)
    assert ((runs["tokens_per_step"] >= 1) & (runs["tokens_per_step"] <= depth + 1)).all()
    assert set(runs.loc[runs["verifier"] == "mss", "shape"]) == {"⟨2⟩", "⟨2,1⟩"}
    s = node_budget_summary(runs)
    assert len(s) == 5 * 2 and (s["tokens_per_step_lo"] <= s["tokens_per_step"]).all()
    assert (s["tokens_per_step"] <= s["tokens_per_step_hi"]).all() and (s["n_prompts"] == 2).all()


def test_node_budget_runs_refuse_impossible_budgets():
    target = tiny_lm("llama", seed=1)
    p = [SimpleNamespace(id="a", text="12")]
    with pytest.raises(ValueError, match="multiple of paths"):
        node_budget_runs(target, target, _Tok(), p, budgets=(3,), verifiers=("mss",), progress=False)
    with pytest.raises(ValueError, match=">= 1"):
        node_budget_runs(target, target, _Tok(), p, budgets=(0,), progress=False)
    with pytest.raises(ValueError, match="unknown verifier"):
        node_budget_runs(target, target, _Tok(), p, verifiers=("nope",), progress=False)
    assert set(VERIFIERS) >= {"token", "block", "mss", "traversal", "spectr", "gbv"}


def test_node_budget_figure():
    import pandas as pd

    from specrepro.lab.plots import fig_verifier_node_budget

    s = pd.DataFrame({"verifier": ["token", "token", "mss", "mss"], "label": ["token"] * 2 + ["mss"] * 2,
                      "structure": ["chain", "chain", "tree", "tree"], "budget": [2, 4, 2, 4],
                      "tokens_per_step": [2.0, 2.5, 2.2, 2.8], "tokens_per_step_lo": [1.8, 2.2, 2.0, 2.5],
                      "tokens_per_step_hi": [2.2, 2.9, 2.4, 3.0]})
    fig = fig_verifier_node_budget(s, title="t")
    assert len(fig.axes[0].lines) >= 2
    with pytest.raises(ValueError):
        fig_verifier_node_budget(s.iloc[:0])
