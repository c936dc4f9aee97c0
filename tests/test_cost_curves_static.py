"""``python -m specrepro cost-curves`` and the static-cache cost curve, on a tiny model on the CPU (the CUDA-graph
path is checked by tests/test_cuda.py on a GPU)."""

import json

import pytest
import torch
from conftest import tiny_lm

from specrepro.bench.costcurves import _parse_ns, run_cost_curves
from specrepro.measure.cost import _rewind_static_cache, measure_cost_curve_static, measure_cost_table_static
from specrepro.models import random_weights_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    tiny_lm("qwen2", vocab=50).save_pretrained(path)
    return path


def test_static_cache_step_equals_the_full_forward():
    """The static-cache step the curve times (rewind to the prefix, forward n tokens) computes the full forward's
    logits at those positions, however often it is repeated: the cache is rewound, not appended to."""
    from transformers import StaticCache

    model = tiny_lm("qwen2", vocab=50)
    ids = torch.randint(0, 50, (1, 14), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        full = model(input_ids=ids).logits
        cache = StaticCache(config=model.config, max_cache_len=14)
        model(input_ids=ids[:, :10], past_key_values=cache, use_cache=True, position_ids=torch.arange(10)[None])
        for _ in range(3):
            _rewind_static_cache(cache, 10)
            pos = torch.arange(10, 14)
            out = model(input_ids=ids[:, 10:], past_key_values=cache, use_cache=True, position_ids=pos[None],
                        cache_position=pos).logits
            torch.testing.assert_close(out, full[:, 10:], rtol=0, atol=1e-5)


def test_static_curve_and_its_errors():
    model = tiny_lm("qwen2", vocab=50)
    curve, diff = measure_cost_curve_static(model, ns=[1, 3], prefix_len=8, repeats=2,
                                            generator=torch.Generator().manual_seed(0))
    assert list(curve.n) == [1, 3] and diff is None and all(ms > 0 for ms in curve.ms)
    table, _ = measure_cost_table_static(model, ns=[3, 1], prefix_len=8, repeats=6,
                                         generator=torch.Generator().manual_seed(0))
    assert table["n"].tolist() == [1, 3] and set(table["rounds"]) == {6}
    assert ((table["ms_low"] <= table["ms"]) & (table["ms"] <= table["ms_high"])).all()
    with pytest.raises(ValueError, match="CUDA"):
        measure_cost_curve_static(model, cuda_graphs=True)
    with pytest.raises(ValueError, match="n >= 1"):
        measure_cost_curve_static(model, ns=[0, 1])


def test_run_cost_curves_writes_json(tiny_dir, tmp_path):
    out = tmp_path / "curves.json"
    res = run_cost_curves([str(tiny_dir)], ns=(2, 1), prefix_len=8, repeats=2, warmup_rounds=1, static=True,
                          random_weights=True, json_path=out)
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(res))
    cfg, row = saved["config"], saved["models"][str(tiny_dir)]
    assert cfg["ns"] == [1, 2] and cfg["random_weights"] is True and cfg["dtype"] == "float32"
    assert {"commit", "code_fingerprint", "device_description", "torch", "transformers"} <= set(cfg)
    assert len(row["eager_ms"]) == 2 and len(row["static_ms"]) == 2 and row["graphs_ms"] is None
    # 2 rounds give no 95% interval of a median: null, not a made-up one
    assert row["eager_ms_low"] == [None, None] and row["static_ms_high"] == [None, None]
    assert "interval" in cfg
    res = run_cost_curves([str(tiny_dir)], ns=(1,), prefix_len=8, repeats=9, warmup_rounds=1, random_weights=True)
    row = res["models"][str(tiny_dir)]
    assert row["eager_ms_low"][0] <= row["eager_ms"][0] <= row["eager_ms_high"][0]
    assert row["params"] == sum(p.numel() for p in tiny_lm("qwen2", vocab=50).parameters())


def test_cost_curves_refuses_impossible_settings(tiny_dir):
    with pytest.raises(ValueError, match="CUDA"):
        run_cost_curves([str(tiny_dir)], device="cpu", cuda_graphs=True)
    with pytest.raises(ValueError, match="at least one model"):
        run_cost_curves([])
    with pytest.raises(ValueError, match="repeats"):
        run_cost_curves([str(tiny_dir)], repeats=0)
    with pytest.raises(ValueError, match="integers"):
        _parse_ns("1,two")
    with pytest.raises(ValueError, match=">= 1"):
        _parse_ns("0,1")


def test_random_weights_are_seeded_and_leave_the_global_rng(tiny_dir):
    state = torch.random.get_rng_state()
    a = random_weights_model(str(tiny_dir), seed=3)
    b = random_weights_model(str(tiny_dir), seed=3)
    c = random_weights_model(str(tiny_dir), seed=4)
    assert torch.equal(torch.random.get_rng_state(), state)
    wa, wb, wc = (m.get_input_embeddings().weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert not a.training and not any(p.requires_grad for p in a.parameters())
