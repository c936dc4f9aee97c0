"""Where each speedup comes from (specrepro.record.decompose): the three factors recover known step costs, their
product is the decode-time speedup, and claims that are not speed ratios of timed runs get none."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from specrepro.record.decompose import decompose_claim, speedup_decomposition
from specrepro.record.tables import Tables


def _runs(prompts: int = 6, passes: int = 2, jitter: float = 0.0) -> pd.DataFrame:
    """AR: 40 tokens in 40 steps, target 100 ms and loop 101 ms per step; the chain: 40 tokens in 16 steps (2.5
    per step), target 125 ms and loop 200 ms per step; prefill 500 ms each."""
    rng = np.random.default_rng(0)
    rows = []
    for rep in range(passes):
        for i in range(prompts):
            for method, steps, target, loop in (("ar", 40, 100.0, 101.0), ("sd", 16, 125.0, 200.0)):
                f = 1.0 + jitter * rng.standard_normal()
                seconds = (500.0 + steps * loop * f) / 1e3
                rows.append({"repeat": rep, "prompt": f"p{i}", "method": method, "tokens": 40, "steps": steps,
                             "target_ms": target * f, "loop_ms": loop * f, "seconds": seconds,
                             "tokens_per_s": 40 / seconds})
    return pd.DataFrame(rows)


def _claim(rule: str = "paired_ratio", params: str = "method=method == 'sd'; baseline=method == 'ar'") -> pd.Series:
    return pd.Series({"id": "x-speed", "rule": rule, "params": params, "our_table": "runs", "claim": "a speedup",
                      "caveat": ""})


def _num(text: str) -> float:
    return float(text.split(" ")[0].rstrip("×"))


def test_factors_recover_the_step_costs_and_multiply_to_the_decode_speedup():
    d = decompose_claim(_claim(), Tables(frames={"runs": _runs()}))
    assert (d["method"], d["baseline"], d["n"]) == ("sd", "ar", "6 prompts × 2 passes")
    assert _num(d["tps"]) == pytest.approx(2.5, abs=0.005)
    assert _num(d["fwd"]) == pytest.approx(100 / 125, abs=0.005)  # t(1) / t(γ + 1)
    assert _num(d["share"]) == pytest.approx((125 / 200) / (100 / 101), abs=0.005)
    assert _num(d["decode"]) == pytest.approx(2.5 * 101 / 200, abs=0.005)
    assert "[" in d["decode"]  # an interval over prompts


def test_noisy_runs_keep_the_product_and_give_intervals():
    d = decompose_claim(_claim(), Tables(frames={"runs": _runs(prompts=10, jitter=0.05)}))
    lo, hi = (float(x) for x in d["decode"].split("[")[1].rstrip("×]").replace("]", "").split(", "))
    assert lo < _num(d["decode"]) < hi
    assert _num(d["tps"]) * _num(d["fwd"]) * _num(d["share"]) == pytest.approx(_num(d["decode"]), rel=0.05)


def test_claims_without_a_timed_speed_ratio_get_none():
    tables = Tables(frames={"runs": _runs()})
    assert decompose_claim(_claim(rule="increases"), tables) is None
    assert decompose_claim(_claim(params="method=method == 'sd'; baseline=method == 'ar'; value=tokens_per_step"),
                           tables) is None
    assert decompose_claim(_claim(), Tables(frames={"runs": _runs().drop(columns="target_ms")})) is None
    assert decompose_claim(_claim(), Tables(frames={})) is None  # not measured in this profile
    claims = pd.DataFrame([_claim(), _claim(rule="increases")])
    assert [r["id"] for r in speedup_decomposition(claims, tables)] == ["x-speed"]
