"""Weight formats (specrepro.bench.formats) and llama.cpp's CPU variants (specrepro.backends.llamacpp): a re-encoded
tiny checkpoint keeps the model, the predictions follow Leviathan's formula, the AMX guard leaves the AMX variant out,
and a program's log names the variant it loaded."""

from __future__ import annotations

import math

import pytest
import torch

from specrepro.backends import llamacpp as lc
from specrepro.backends.tinygguf import TinyShape, tiny_llama_gguf
from specrepro.bench.formats import FORMATS, FormatError, format_predictions, reencode_gguf
from specrepro.sim.llamacpp_build import program_cpu_variant
from specrepro.theory import expected_tokens

_OK, _WHY = lc.llama_cpp_available()
needs_llama = pytest.mark.skipif(not _OK, reason=f"llama_cpp does not import ({_WHY})")


def _costs(t, draft_t1):
    ns = list(range(1, len(t) + 1))
    return {"ns": ns, "t_ms": list(t), "draft_t1_ms": draft_t1}


def test_predictions_follow_the_formula():
    # t(k) = 10 + 2k ms, a draft of 3 ms: the prediction at γ is E(α, γ) t(1) / (3γ + t(γ+1))
    t = [10 + 2 * k for k in range(1, 17)]
    out = format_predictions(_costs(t, 3.0), alpha=0.8, max_gamma=15)
    want = {g: float(expected_tokens(0.8, g)) * t[0] / (3 * g + t[g]) for g in range(1, 16)}
    g = max(want, key=want.get)
    assert out["gamma_best"] == g and math.isclose(out["predicted"], want[g], rel_tol=1e-12)
    free = {g: float(expected_tokens(0.8, g)) * t[0] / t[g] for g in range(1, 16)}
    assert math.isclose(out["free_draft_bound"], max(free.values()), rel_tol=1e-12)
    assert out["free_draft_bound"] >= out["predicted"]
    assert math.isclose(out["block_ratio"][4], t[4] / t[0])


def test_predictions_say_no_where_blocks_are_dear():
    # a block of k tokens costs k forwards: even a free draft cannot beat AR (E(α, γ) <= γ + 1)
    t = [10.0 * k for k in range(1, 17)]
    assert format_predictions(_costs(t, 0.0), alpha=0.9)["free_draft_bound"] <= 1.0 + 1e-12


def test_predictions_reject_bad_input():
    with pytest.raises(ValueError, match="alpha"):
        format_predictions(_costs([1.0] * 16, 0.1), alpha=1.0)
    with pytest.raises(ValueError, match="lacks"):
        format_predictions(_costs([1.0] * 4, 0.1), alpha=0.5, max_gamma=8)


def test_program_cpu_variant_reads_the_log():
    log = ("load_backend: loaded RPC backend from x\n"
           "load_backend: loaded CPU backend from /b/bin/libggml-cpu-zen4.so\n")
    assert program_cpu_variant(log) == "zen4"
    assert program_cpu_variant("main: no backend line") == "static"


@needs_llama
def test_the_amx_variant_is_left_out_where_amx_is_not_granted(monkeypatch, tmp_path):
    from specrepro.sim.llamacpp_build import link_cpu_variants

    mods = [tmp_path / f"libggml-cpu-{v}.so" for v in ("haswell", "zen4", "sapphirerapids")]
    for m in mods:
        m.write_bytes(b"")
    monkeypatch.setattr(lc, "cpu_variants", lambda: mods)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setattr(lc, "amx_granted", lambda: False)
    assert link_cpu_variants(bindir) == ["haswell", "zen4"]
    assert sorted(p.name for p in bindir.iterdir()) == ["libggml-cpu-haswell.so", "libggml-cpu-zen4.so"]
    monkeypatch.setattr(lc, "amx_granted", lambda: True)
    assert link_cpu_variants(bindir) == ["haswell", "zen4", "sapphirerapids"]


@needs_llama
def test_the_running_variant_is_reported():
    import os

    build = lc.llama_cpp_build()
    assert (lc.process_cpu_variant(os.getpid()) or "static") == build["cpu_variant"]
    variants = lc.cpu_variants()
    if variants:
        assert f"libggml-cpu-{build['cpu_variant']}.so" in {v.name for v in variants}
        if not lc.amx_granted():
            assert build["cpu_variant"] not in lc.AMX_VARIANTS
    else:
        assert build["cpu_variant"] == "static"


@needs_llama
@pytest.mark.parametrize("fmt,tol", [("F16", 0.01), ("Q8_0", 0.05)])
def test_a_reencoded_checkpoint_is_the_same_model(tmp_path, fmt, tol):
    # next-token distributions at every position of a prompt: the re-encoded file within `tol` in total variation of
    # its source (measured: F16 0.0012, Q8_0 0.023), another random model of the same shape far outside it
    shape = TinyShape()
    src, other = tiny_llama_gguf(3, shape, tmp_path), tiny_llama_gguf(4, shape, tmp_path)
    dst = reencode_gguf(src, tmp_path / f"tiny-{fmt}.gguf", fmt, threads=1)
    ids = [5, 9, 17, 6, 11]
    probs = {}
    for name, path in (("src", src), ("dst", dst), ("other", other)):
        lm = lc.LlamaCppLM(path, n_threads=1)
        try:
            probs[name] = lm.forward_block(ids, logits_to_keep=len(ids)).double().softmax(-1)
        finally:
            lm.close()

    def tv(a, b):
        return float(0.5 * (probs[a] - probs[b]).abs().sum(-1).max())

    assert probs["dst"].shape == (len(ids), shape.vocab)
    assert tv("dst", "src") < tol < tv("other", "src")


@needs_llama
def test_unknown_formats_are_refused(tmp_path):
    assert "BF16" in FORMATS and "Q4_K_M" in FORMATS
    with pytest.raises(FormatError, match="re-encodes"):
        reencode_gguf(tmp_path / "x.gguf", tmp_path / "y.gguf", "Q3_X")


def _runs(ar_decode_s, sd_decode_s, prompts=4, passes=2, prefill_ms=500.0, draft_prefill_ms=300.0, n=64):
    rows = []
    for r in range(passes):
        for i in range(prompts):
            for m, dec in (("llama-server-ar", ar_decode_s), ("llama-sd@3", sd_decode_s)):
                dp = draft_prefill_ms if m != "llama-server-ar" else float("nan")
                sec = dec * (1 + 0.01 * i) + prefill_ms / 1000 + (0 if math.isnan(dp) else dp / 1000)
                rows.append({"repeat": r, "prompt": f"P/{i}", "method": m, "seconds": sec, "new_tokens": n,
                             "prefill_ms": prefill_ms, "draft_prefill_ms": dp, "tokens_per_s": n / sec})
    import pandas as pd

    return pd.DataFrame(rows)


def test_decode_speedup_leaves_out_both_prefills():
    from specrepro.measure.harness import decode_speedup

    runs = _runs(ar_decode_s=4.0, sd_decode_s=2.0)
    out = decode_speedup(runs, "llama-sd@3", "llama-server-ar")
    assert math.isclose(out["speedup"], 2.0, rel_tol=1e-9) and out["n_prompts"] == 4
    assert out["speedup_lo"] <= 2.0 + 1e-9 <= out["speedup_hi"] + 2e-9
    assert math.isclose(out["baseline_ms"], 4000 * 1.015 / 64, rel_tol=0.02)
    # end to end, the prefills are paid: the same runs give less than 2x
    from specrepro.measure.harness import paired_speedup

    assert paired_speedup(runs, "llama-sd@3", "llama-server-ar")["speedup"] < 1.9


def _speed_table():
    import pandas as pd

    row = dict(format="BF16", file_mib=3000.0, ar_decode_ms=100.0, ar_decode_ms_lo=98.0, ar_decode_ms_hi=102.0,
               sd_decode_ms=50.0, sd_decode_ms_lo=48.0, sd_decode_ms_hi=53.0, measured_gamma=5, block_ratio=1.3,
               free_draft_bound=3.1, predicted_at_measured_alpha=2.2, decode_speedup=2.0, decode_speedup_lo=1.9,
               decode_speedup_hi=2.1, speedup=1.6, speedup_lo=1.5, speedup_hi=1.7, measured_alpha=0.9,
               measured_alpha_lo=0.88, measured_alpha_hi=0.92, measured_over_predicted=0.91, ar_decode_over_t1=0.95,
               tokens_per_step_over_eq1=1.0, target_step_over_cost=1.02, draft_step_over_t1=1.3, cpu_variant="zen4",
               threads=2, n_prompts=20, passes=3, alpha=0.913)
    slow = {**row, "format": "Q4_K_M", "ar_decode_ms": 35.0, "ar_decode_ms_lo": 34.0, "ar_decode_ms_hi": 36.0,
            "sd_decode_ms": 52.0, "decode_speedup": 0.67, "decode_speedup_lo": 0.63, "decode_speedup_hi": 0.7}
    return pd.DataFrame([slow, row])


def test_speed_block_names_the_fastest_way_and_where_speculation_pays(tmp_path, monkeypatch):
    import json

    import specrepro.record.speed as sp

    _speed_table().to_csv(tmp_path / sp.FORMATS_TABLE, index=False)
    (tmp_path / "llamacpp_formats.provenance.json").write_text(json.dumps(
        {"commit": "abc", "cpu": "a CPU", "alpha": {"method": "llama-sd@4"}}))
    monkeypatch.setattr(sp, "profile_results", lambda profile: tmp_path)
    text = sp.render_speed()
    assert "plain AR on llama.cpp with the `Q4_K_M` file, 35.0 ms per decoded token [34.0, 36.0]" in text
    assert "in BF16 and loses in Q4_K_M" in text
    assert "| `BF16` | 100.0 [98.0, 102.0] | 5 | 2.00 [1.90, 2.10]× | 1.60 [1.50, 1.70]× |" in text
    full = sp.render_formats()
    assert "Speculation pays (the decode-time interval above 1) in BF16" in full
    assert "it loses (the interval below 1) in Q4_K_M" in full
    assert "| `BF16` | 3000 | 100.0 [98.0, 102.0] | 50.0 [48.0, 53.0] | 5 | 1.30 |" in full
    assert "| `BF16` | 0.91 | 0.95 | 1.00 | 1.02 | 1.30 |" in full
    monkeypatch.setattr(sp, "profile_results", lambda profile: tmp_path / "none")
    assert "Not measured in this profile" in sp.render_speed()


@needs_llama
def test_a_forced_cpu_variant_is_the_one_that_runs_and_a_missing_one_is_refused():
    # each in a fresh process: the CPU backend is loaded once per process
    import os
    import subprocess
    import sys

    if "haswell" not in {v.name[len("libggml-cpu-"):-3] for v in lc.cpu_variants()}:
        pytest.skip("this llama.cpp build has no haswell variant (not an all-variants x86-64 build)")
    code = "from specrepro.backends.llamacpp import load_cpu_backend as f; print(f())"
    run = lambda v: subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,  # noqa: E731
                                   env={**os.environ, lc.VARIANT_ENV: v})
    ok = run("haswell")
    if ok.returncode != 0 and "cannot run it" in ok.stderr:
        pytest.skip("this CPU lacks AVX2")
    assert ok.returncode == 0 and ok.stdout.strip().splitlines()[-1] == "haswell", ok.stderr[-500:]
    bad = run("no-such-variant")
    assert bad.returncode != 0 and "has no such CPU variant" in bad.stderr


def test_compare_variants_ratios_are_portable_over_chosen(monkeypatch):
    import pandas as pd

    from specrepro.bench import formats

    def fake(pythons, target, draft, fmts, ns, **kw):
        assert set(pythons) == {"portable", "chosen"}
        assert pythons["portable"][1] == {lc.VARIANT_ENV: formats.PORTABLE_VARIANT}
        rows = []
        for a in range(2):
            for b, scale in (("portable", 2.0), ("chosen", 1.0)):
                for f in fmts:
                    rows.append({"alternation": a, "build": b, "format": f, "cpu_variant": b,
                                 **{f"t{k}_ms": scale * k * (1 + a) for k in ns}, "draft_t1_ms": 3 * scale})
        return pd.DataFrame(rows)

    monkeypatch.setattr(formats, "compare_builds", fake)
    df = formats.compare_variants("t", "d", ("Q4_K_M", "BF16"), ns=(1, 5))
    chosen = df[df["build"] == "chosen"]
    assert (chosen["ratio_t1"] == 2.0).all() and (chosen["ratio_t5"] == 2.0).all()
    assert (chosen["ratio_draft_t1"] == 2.0).all() and df.loc[df["build"] == "portable", "ratio_t1"].isna().all()


def test_variant_rows_give_each_build_its_median_and_a_conservative_ratio_interval():
    import pandas as pd

    from specrepro.record.speed import variant_rows

    rows = []
    for a in range(2):
        for build, ms in (("portable", 20.0), ("chosen", 10.0)):
            rows.append({"alternation": a, "build": build, "format": "BF16", "cpu_variant": build,
                         "t1_ms": ms + a, "t1_ms_low": ms - 1, "t1_ms_high": ms + 2,
                         "draft_t1_ms": 5.0, "draft_t1_ms_low": 4.0, "draft_t1_ms_high": 6.0})
    out = variant_rows(pd.DataFrame(rows))
    assert out[0] == ("`BF16`", "target t(1)", "20.5 [19.0, 22.0]", "10.5 [9.0, 12.0]", "1.95 [1.58, 2.44]×")
    assert out[1][1] == "draft t(1)" and out[1][-1] == "1.00 [0.67, 1.50]×"
