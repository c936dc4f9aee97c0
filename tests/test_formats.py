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
