"""The llama.cpp audit (specrepro.sim.llamacpp_audit): its pure parts everywhere, one audited setting where
llama.cpp's speculative programs are built.

* everywhere: the printed-text-to-ids mapping (a prefix-free code; errors on anything else), the outcome of a run
  (EOS absorbs; a run that stopped early ended at an unprinted EOS), and the exact law's sampler chain in llama.cpp's
  order (top-k, top-p, then temperature) against hand-computed cases and against specrepro's own logits_to_probs
  (equal at temperature 1, where the order does not matter).
* where llama_cpp imports: the exact law of the tiny target is a distribution with the expected support.
* where the programs are built (python -m specrepro.sim.llamacpp_build; the CI does not build them: skipped with the
  reason): llama-speculative-simple at T = 1 on N_CHECK runs passes the goodness-of-fit test at level 1e-3, with
  the detectable TV at 90 % power stated and checked (<= TV_90_CHECK).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specrepro.core.sampling import SamplingConfig, logits_to_probs
from specrepro.sim.llamacpp_audit import (
    LSETTINGS,
    PROGRAMS_AUDITED,
    llamacpp_probs,
    outcome,
    parse_run,
    text_to_ids,
)

PIECES = {0: "<unk>", 1: "<s>", 2: "</s>", 3: "\n", 4: "a", 5: "b", 6: "c", 30: "A"}


# ------------------------------------------------------------------------------------------------ text -> ids

def test_text_to_ids_is_exact_on_a_prefix_free_code():
    assert text_to_ids("", PIECES) == []
    assert text_to_ids("ab\nA<unk><s>c</s>", PIECES) == [4, 5, 3, 30, 0, 1, 6, 2]
    assert text_to_ids("\n\n", PIECES) == [3, 3]
    with pytest.raises(ValueError, match="no token piece"):
        text_to_ids("abz", PIECES)
    with pytest.raises(ValueError, match="no token piece"):
        text_to_ids("<un", PIECES)
    with pytest.raises(ValueError, match="prefix-free"):
        text_to_ids("ab", {1: "a", 2: "ab"})
    with pytest.raises(ValueError, match="prefix-free"):
        text_to_ids("a", {1: "a", 2: ""})


def test_parse_run_strips_the_frame_and_reads_the_counters():
    err = "main: n_draft   = 2\nmain: n_predict = 3\nmain: n_drafted = 3\nmain: n_accept  = 1\n"
    pieces = {**PIECES, 9: "f", 17: "n"}
    assert parse_run("\n\nbfnc" + "a\nb" + "\n\n\n\n", err, pieces) == ([4, 3, 5], 3, 1)
    # generated newlines are told from the frame by n_predict
    assert parse_run("\n\nbfnc" + "a\n\n" + "\n\n\n\n", err, pieces) == ([4, 3, 3], 3, 1)
    with pytest.raises(ValueError, match="3 tokens generated"):
        parse_run("\n\nbfnc" + "a\nb" + "\n\n", err, pieces)  # the last frame lost: refused (run again)
    with pytest.raises(ValueError, match="cut or unexpected"):
        parse_run("\n\nbfnca", "main: n_draft   = 2\n", pieces)  # the counters were lost
    with pytest.raises(ValueError, match="3 tokens generated"):
        parse_run("\n\nbfnc" + "a\n", err, pieces)  # cut inside the generated text
    with pytest.raises(ValueError, match="3 tokens generated"):
        parse_run("\n\nbfnc" + "a" + "\n\n\n\n", err, pieces)  # EOS printed (llama-speculative) but missing
    # llama-speculative-simple: an EOS stops the printing, both frames must be there
    assert parse_run("\n\nbfnc" + "a" + "\n\n\n\n", err, pieces, eos_printed=False) == ([4], 3, 1)


def test_outcome_absorbs_at_eos():
    assert outcome([4, 5, 6, 4]) == (4, 5, 6)
    assert outcome([4, 2, 6]) == (4, 2)
    assert outcome([2]) == (2,)
    assert outcome([4]) == (4, 2)  # stopped early without printing EOS (llama-speculative-simple)
    assert outcome([4, 5, 6, 2]) == (4, 5, 6)  # EOS after the first LENGTH tokens does not matter


# ------------------------------------------------------------------------------------------------ the sampler chain

def test_llamacpp_probs_by_hand():
    x = np.log(np.array([0.1, 0.4, 0.2, 0.3]))
    assert np.allclose(llamacpp_probs(x), [0.1, 0.4, 0.2, 0.3])
    assert np.allclose(llamacpp_probs(x, top_k=2), [0, 4 / 7, 0, 3 / 7])
    # top-p keeps the smallest prefix by probability with cumulative mass >= p (0.4 + 0.3 = 0.7 >= 0.7)
    assert np.allclose(llamacpp_probs(x, top_p=0.7), [0, 4 / 7, 0, 3 / 7])
    assert np.allclose(llamacpp_probs(x, top_p=0.71), [0, 4 / 9, 2 / 9, 3 / 9])
    assert np.allclose(llamacpp_probs(x, top_p=0.05), [0, 1, 0, 0])
    # top-p after top-k: renormalised over the top-2 (4/7 < 0.6 <= 1), so both stay
    assert np.allclose(llamacpp_probs(x, top_k=2, top_p=0.6), [0, 4 / 7, 0, 3 / 7])
    # temperature last: top-p decided on the untempered probabilities, then the kept logits are divided by T
    kept = np.exp(x[[1, 3]] / 2.0)
    assert np.allclose(llamacpp_probs(x, temperature=2.0, top_p=0.7)[[1, 3]], kept / kept.sum())
    assert np.allclose(llamacpp_probs(x, min_p=0.6), [0, 4 / 7, 0, 3 / 7])  # p >= 0.6 * 0.4
    with pytest.raises(ValueError):
        llamacpp_probs(x, temperature=0.0)
    with pytest.raises(ValueError):
        llamacpp_probs(x, top_p=0.0)


@pytest.mark.parametrize("name", list(LSETTINGS))
def test_llamacpp_probs_equal_ours_at_temperature_one(name):
    s = LSETTINGS[name]
    g = torch.Generator().manual_seed(3)
    for _ in range(50):
        logits = torch.randn(32, generator=g, dtype=torch.float64) * 3
        ours = logits_to_probs(logits, SamplingConfig(1.0, top_k=s.top_k or None, top_p=s.top_p)).numpy()
        theirs = llamacpp_probs(logits.numpy(), s.temperature, s.top_k, s.top_p)
        assert np.allclose(ours, theirs, atol=1e-12), name


def test_programs_and_settings_are_as_documented():
    assert [s.flags() for s in LSETTINGS.values()] == [
        ["--temp", "1", "--top-k", "0", "--top-p", "1", "--min-p", "0"],
        ["--temp", "1", "--top-k", "5", "--top-p", "1", "--min-p", "0"],
        ["--temp", "1", "--top-k", "0", "--top-p", "0.8", "--min-p", "0"]]
    assert {p.binary for p in PROGRAMS_AUDITED.values()} == {"llama-speculative-simple", "llama-speculative"}


# ------------------------------------------------------------------------------------------------ with llama.cpp

def _llama_cpp():
    from specrepro.backends.llamacpp import llama_cpp_available

    ok, why = llama_cpp_available()
    if not ok:
        pytest.skip(f"llama_cpp does not import ({why}); install it with the command in requirements-llamacpp.txt")


@pytest.fixture(scope="module")
def target_lm():
    _llama_cpp()
    from specrepro.backends.llamacpp import LlamaCppLM
    from specrepro.sim.llamacpp_audit import tiny_pair

    lm = LlamaCppLM(tiny_pair()[0], n_threads=1)
    yield lm
    lm.close()


def test_exact_law_of_the_tiny_target(target_lm, one_thread):
    from specrepro.sim.llamacpp_audit import exact_law, vocabulary_pieces

    pieces = vocabulary_pieces(target_lm)
    assert pieces[2] == "</s>" and pieces[3] == "\n" and pieces[4] == "a" and len(set(pieces.values())) == 32
    assert text_to_ids("bfnc", pieces) == [5, 9, 17, 6]
    law = exact_law(target_lm, LSETTINGS["top-k=5"])
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-9)
    assert len(law) <= 5 ** 3 and all(len(k) == 3 or k[-1] == 2 for k in law)
    law_p = exact_law(target_lm, LSETTINGS["top-p=0.8"])
    assert sum(law_p.values()) == pytest.approx(1.0, abs=1e-9) and len(law_p) < len(law)


def test_the_law_llama_speculative_code_implies_is_far_from_the_target(target_lm, one_thread):
    """The law derived from llama-speculative's code (argmax draft tokens accepted with min(1, p/q) as if sampled
    from q) is a distribution at TV > 0.3 from the target's in every setting: what the audit finds it samples."""
    from specrepro.backends.llamacpp import LlamaCppLM
    from specrepro.sim.llamacpp_audit import exact_law, predicted_speculative_law, tiny_pair
    from specrepro.stats import total_variation

    draft = LlamaCppLM(tiny_pair()[1], n_threads=1)
    try:
        for setting in LSETTINGS.values():
            law = predicted_speculative_law(target_lm, draft, setting)
            assert sum(law.values()) == pytest.approx(1.0, abs=1e-9)
            assert total_variation(law, exact_law(target_lm, setting)) > 0.3, setting.name
    finally:
        draft.close()


N_CHECK = 300
TV_90_CHECK = 0.2


def test_llama_speculative_simple_at_t1_follows_the_target(target_lm, one_thread):
    """One setting, quickly: llama-speculative-simple at T = 1 (exact by construction) passes at level 1e-3 with
    N_CHECK runs; the test at that n detects TV_90_CHECK with >= 90 % power along a random tilt."""
    from specrepro.sim.llamacpp_audit import (
        LEVEL,
        exact_law,
        run_many,
        run_seeds,
        tiny_pair,
        vocabulary_pieces,
    )
    from specrepro.sim.llamacpp_build import speculative_programs
    from specrepro.stats import gof_test, min_detectable_tv

    bins = speculative_programs()
    if bins is None:
        pytest.skip("llama.cpp's speculative programs are not built (python -m specrepro.sim.llamacpp_build; the "
                    "CI does not build llama.cpp's examples)")
    setting = LSETTINGS["T=1"]
    exact = exact_law(target_lm, setting)
    assert min_detectable_tv(exact, N_CHECK, LEVEL, 0.9, trials=200) <= TV_90_CHECK
    target, draft = tiny_pair()
    prog = PROGRAMS_AUDITED["llama-speculative-simple"]
    pieces = {i: s for i, s in vocabulary_pieces(target_lm).items() if s}
    seqs, drafted, accepted = run_many(bins[prog.binary], prog, setting, target, draft, run_seeds(N_CHECK), pieces)
    assert drafted > 0 and 0 < accepted < drafted
    assert gof_test(seqs, exact)[1] > LEVEL


# ------------------------------------------------------------------------------------------------ the command

def test_runtime_option_writes_the_llamacpp_table_and_repros(tmp_path, monkeypatch):
    """python -m specrepro audit --runtime llama.cpp, on a stand-in table (no llama.cpp run): the table is saved as
    audit_llamacpp, a reproduction script is written for the failing audited row only, and a misbehaving control
    gives exit status 1. The default runtime stays transformers."""
    import argparse
    import os

    import pandas as pd

    from specrepro.record import audit as audit_cli
    from specrepro.record import results
    from specrepro.sim import llamacpp_audit
    from specrepro.sim.llamacpp_audit import COLUMNS, EXTRA_COLUMNS

    def row(impl, role, verdict, expected):
        r = {c: 0.0 for c in COLUMNS + EXTRA_COLUMNS}
        r.update(setting="T=1", implementation=impl, role=role, verdict=verdict, expected=expected,
                 as_expected=verdict == expected, llama_cpp_python="0.3.36", description="")
        return r

    table = pd.DataFrame([row("specrepro_chain", "control", "pass", "pass"),
                          row("neg_always_accept", "negative control", "fail", "fail"),
                          row("llama-speculative-simple", "audited", "pass", "pass"),
                          row("llama-speculative", "audited", "fail", "pass")])
    table.attrs["seconds"] = 1.0
    monkeypatch.setattr(llamacpp_audit, "audit_llamacpp_table", lambda **kw: table)
    monkeypatch.setattr(results, "results_dir", lambda profile=results.STANDARD: tmp_path / "results")
    parser = argparse.ArgumentParser()
    audit_cli.configure_parser(parser)
    assert parser.parse_args([]).runtime == "transformers"
    args = parser.parse_args(["--runtime", "llama.cpp", "--out", str(tmp_path / "out")])
    assert audit_cli.run_command(args) == 0
    assert sorted(os.listdir(tmp_path / "out")) == ["repro_llamacpp_T1_llama_speculative.py"]
    compile((tmp_path / "out" / "repro_llamacpp_T1_llama_speculative.py").read_text(), "repro", "exec")
    assert (tmp_path / "results" / "audit_llamacpp.csv").exists()
    table.loc[0, "as_expected"] = False
    assert audit_cli.run_command(args) == 1


def test_build_fails_clearly_without_cmake_or_compiler(tmp_path, monkeypatch):
    from specrepro.sim import llamacpp_build

    monkeypatch.setattr(llamacpp_build.shutil, "which", lambda name: None)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(llamacpp_build.BuildError, match="missing cmake, a C\\+\\+ compiler"):
        llamacpp_build.build_speculative_programs(tmp_path)
    assert not any(tmp_path.iterdir())  # nothing downloaded or written
    assert llamacpp_build.speculative_programs(tmp_path) is None
