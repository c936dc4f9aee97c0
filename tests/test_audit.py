"""The audit of transformers' speculative samplers (specrepro.sim.audit, specrepro.record.audit), in quick mode: it runs, has its columns, our controls
pass, the negative controls fail, drafts are really proposed, and the reproduction scripts are standalone Python.

One quick audit (audit_table(quick=True)) is shared by the module: ~30-40 s on 2 CPU cores.
"""

import argparse
import os
import runpy
import sys

import pytest

from specrepro.record import audit as audit_cli
from specrepro.sim import audit


@pytest.fixture(scope="module")
def quick_table():
    return audit.audit_table(quick=True, seed=0)


def test_columns_and_version(quick_table):
    import transformers

    for col in audit.COLUMNS + audit.EXTRA_COLUMNS:
        assert col in quick_table.columns, col
    assert list(quick_table.columns[: len(audit.COLUMNS)]) == audit.COLUMNS
    assert set(quick_table["transformers_version"]) == {transformers.__version__}
    assert set(quick_table["verdict"]) <= {"pass", "fail"}
    assert set(quick_table["setting"]) == set(audit.QUICK_SETTINGS)
    for s in audit.QUICK_SETTINGS:  # both transformers modes, audited in every quick setting
        rows = quick_table[quick_table["setting"] == s]
        assert {"hf_assisted", "hf_prompt_lookup"} <= set(rows["implementation"])
    assert (quick_table["n"] > 0).all()
    assert quick_table["p_value"].between(0, 1).all()
    # NaN: not even a full-size deviation along the random tilt is detected with 90 % power (quick n is a smoke test;
    # the full audit's n detects TV <= 0.1: the docstring of specrepro.sim.audit)
    mdt = quick_table["min_detectable_tv_90"]
    assert (mdt.between(0, 1) | mdt.isna()).all()
    assert mdt[quick_table["setting"] == "greedy"].between(0, 1).all()


def test_our_controls_pass(quick_table):
    controls = quick_table[quick_table["role"] == "control"]
    assert {"specrepro_draft_model", "specrepro_prompt_lookup"} <= set(controls["implementation"])
    assert (controls["verdict"] == "pass").all(), controls[["setting", "implementation", "p_value"]]


def test_negative_controls_fail(quick_table):
    neg = quick_table[quick_table["role"] == "negative control"]
    assert len(neg) >= 2  # one sampling setting, one greedy
    assert (neg["verdict"] == "fail").all(), neg[["setting", "implementation", "p_value"]]
    sampling = neg[neg["setting"] == "T=1"]
    assert (sampling["p_value"] < audit.LEVEL).all()
    assert (sampling["tv"] > sampling["tv_null_mean"] + 0.2).all()  # far above the sampling-noise floor


def test_transformers_really_drafts_and_verifies(quick_table):
    t1 = quick_table[quick_table["setting"] == "T=1"].set_index("implementation")
    for impl in ("hf_assisted", "hf_prompt_lookup", "specrepro_draft_model", "specrepro_prompt_lookup"):
        assert t1.loc[impl, "drafted_per_call"] >= 1.0, impl  # the first step drafts min(GAMMA, LENGTH - 1) = 2
        assert t1.loc[impl, "accepted_per_call"] > 0, impl
        assert t1.loc[impl, "drafted_per_call"] <= audit.GAMMA * t1.loc[impl, "steps_per_call"]


def test_exact_distribution_is_what_transformers_claims_to_sample(quick_table):
    # our logits_to_probs and transformers' warpers (temperature -> top-k -> top-p) give the same distribution
    sampling = quick_table[quick_table["setting"] != "greedy"]
    assert (sampling["hf_vs_specrepro_processing_tv"] < 1e-5).all()
    target, _ = audit.tiny_pair()
    for name in ("top-k", "top-p"):
        s = audit.SETTINGS[name]
        tv = audit.total_variation(audit.exact_distribution(target, s, length=2),
                                   audit.hf_exact_distribution(target, s, length=2))
        assert tv < 1e-5, (name, tv)


def test_reproduction_scripts_are_standalone_and_run(tmp_path, monkeypatch, capsys):
    for s in audit.SETTINGS:
        for impl in ("hf_assisted", "hf_assisted_defaults", "hf_early_exit", "hf_prompt_lookup"):
            src = audit.reproduction_script(s, impl)
            compile(src, f"repro_{s}_{impl}.py", "exec")
            assert "specrepro" not in src.split('"""', 2)[2]  # no import of this project after the docstring
    with pytest.raises(ValueError):
        audit.reproduction_script("T=1", "specrepro_draft_model")
    # standalone: imports nothing but the standard library, numpy, torch and transformers
    import ast
    src = audit.reproduction_script("T=1", "hf_prompt_lookup")
    mods = {(n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
            for n in ast.walk(ast.parse(src)) if isinstance(n, (ast.Import, ast.ImportFrom))
            for a in (n.names if isinstance(n, ast.Import) else [None])}
    assert mods == {"collections", "sys", "numpy", "torch", "transformers"}, mods
    # and it runs (in this process, to save the imports: N = 20 draws, exit status 0 = no failure)
    path = tmp_path / "repro.py"
    path.write_text(src)
    monkeypatch.setattr(sys, "argv", [str(path), "20"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(path), run_name="__main__")
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "TV(empirical, exact)" in out and "lookup" in out


def test_run_command_writes_the_table_and_repro_of_failing_rows(quick_table, tmp_path, monkeypatch):
    from specrepro.record import results

    fake = quick_table.copy()
    fake.attrs = dict(quick_table.attrs)
    i = fake.index[(fake["implementation"] == "hf_assisted") & (fake["setting"] == "T=1")][0]
    fake.loc[i, "verdict"] = "fail"  # a (simulated) finding
    monkeypatch.setattr(audit, "audit_table", lambda **kw: fake)
    monkeypatch.setattr(results, "results_dir", lambda profile=results.STANDARD: tmp_path / "results")
    parser = argparse.ArgumentParser()
    audit_cli.configure_parser(parser)
    args = parser.parse_args(["--quick", "--out", str(tmp_path / "out")])
    assert audit_cli.run_command(args) == 0
    assert sorted(os.listdir(tmp_path / "out")) == ["repro_T1_hf_assisted.py"]
    assert (tmp_path / "results" / "audit_transformers_quick.csv").exists()
    # a control that fails makes the audit untrustworthy: exit status 1
    j = fake.index[fake["implementation"] == "specrepro_draft_model"][0]
    fake.loc[j, "as_expected"] = False
    assert audit_cli.run_command(args) == 1
