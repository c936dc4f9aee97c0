"""The replication scorecard's claims and rules: the claims file (one row per paper statement, each with a location
and a paper_kind), every verdict rule on synthetic tables (each one can say "not reproduced"; interval rules say
"inconclusive" when the interval holds the null), rules that raise propagate, and the committed standard tables
score without error into the committed scorecard."""

import ast
import io
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specrepro.record import rulekit, verdicts
from specrepro.record import scorecard as sc
from specrepro.record.results import record_dir
from specrepro.record.scorecard import (
    COMPUTED,
    EXACT,
    INCONCLUSIVE,
    NOT_REPRODUCED,
    NOT_RUN,
    NOT_TESTABLE,
    TREND,
    Tables,
)
from specrepro.record.tables import read_record_table

ROOT = Path(__file__).resolve().parent.parent
#: rules whose "ours" cell must carry an interval or say why there is none, and n
INTERVAL_RULES = {"paired_ratio", "computed_speedup", "value_in_interval", "row_order", "close_to_prediction",
                  "increases", "decreases", "grows_linearly", "speedup_peaks", "quality_unchanged", "falls_with_head"}


def claim(rule, params="", **kw) -> pd.Series:
    row = {c: "" for c in sc.CLAIM_COLUMNS}
    row.update({"id": "t", "paper": "P", "arxiv": "0000.00000v1", "source": "Table 9", "paper_kind": "measured",
                "claim": "a claim", "rule": rule, "params": params, "our_table": "t"})
    row.update({k: str(v) for k, v in kw.items()})
    return pd.Series(row)


def verdict(c, frames, provenances=None):
    return sc.score_claim(c, Tables("synthetic", frames, provenances))


# ------------------------------------------------------------------------------------------------ claims file


def _made_by_record_rule(name: str) -> bool:
    """``data/results/<name>.csv`` is the target of a Makefile rule that ``make reproduce`` runs in the standard
    profile (through a variable among reproduce's prerequisites); a rule may write several tables at once (grouped
    targets, ``a.csv b.csv &:``)."""
    makefile = (ROOT / "Makefile").read_text()
    target = rf"data/results/{re.escape(name)}\.csv"
    if not re.search(rf"^(?:data/results/\S+\.csv )*{target}(?: data/results/\S+\.csv)* ?&?:", makefile, re.M):
        return False
    var = re.search(rf"^(\w+) :=(?:.*\\\n)*.*{target}", makefile, re.M)
    reproduce = re.search(r"^reproduce:(.*)$", makefile, re.M).group(1)
    return bool(var) and f"$({var.group(1)})" in reproduce


def _notebook_shard(name: str, notebook: str) -> bool:
    """``data/results/<name>.csv`` is a shard: a Makefile rule writes it, and the notebook's executed copy waits for
    it (through a variable among that rule's prerequisites), as notebook 05's naive-vs-MSS table."""
    makefile = (ROOT / "Makefile").read_text()
    target = rf"data/results/{re.escape(name)}\.csv"
    var = re.search(rf"^(\w+) :=.*{target}", makefile, re.M)
    return (bool(re.search(rf"^{target}:", makefile, re.M)) and bool(var)
            and bool(re.search(rf"^\$\(EXECUTED_DIR\)/{re.escape(notebook)}\.ipynb:.*\$\({var.group(1)}\)", makefile,
                               re.M)))


def test_claims_file_parses_and_names_known_rules():
    claims = sc.load_claims()
    assert len(claims) >= 20
    assert set(claims["rule"]) <= set(sc.RULES)
    assert set(claims["paper_kind"]) <= set(sc.PAPER_KINDS)
    assert {"Leviathan et al. 2023", "Chen et al. 2023"} <= set(claims["paper"])
    assert any(p.startswith("SpecInfer") for p in claims["paper"]) and any(p.startswith("Medusa") for p in claims["paper"])
    for _, c in claims.iterrows():
        assert c["claim"] and c["paper_value"], c["id"]
        if c["our_table"]:
            assert c["notebook"] or all(_made_by_record_rule(n) for n in sc.param_names(c["our_table"])), (
                f"{c['id']}: name the notebook that writes {c['our_table']}")
        else:
            assert c["rule"] == "not_testable" and c["caveat"], f"{c['id']}: a claim nothing measures must say why"


def test_every_paper_number_has_a_location_a_reader_can_check():
    for _, c in sc.load_claims().iterrows():
        assert re.fullmatch(r"\d{4}\.\d{5}v\d+", c["arxiv"]), f"{c['id']}: arXiv id with its version"
        assert re.search(r"(Table|Figure|§|Eq\.|Abstract|Appendix|Theorem)", c["source"]), \
            f"{c['id']}: the source must name a table, figure, section, equation or theorem"
        assert c["paper_kind"] in ("measured", "computed", "asserted"), c["id"]


def test_claims_do_not_type_the_machine_or_date_of_a_run():
    """Where and when a table was measured is read from its provenance (the scorecard's hardware and commit
    columns); typed into a claim's setting it goes stale the day the table is rerun on another machine."""
    for _, c in sc.load_claims().iterrows():
        for column in ("our_setting", "caveat"):
            found = re.search(r"20\d\d-\d\d-\d\d|EPYC|Xeon|\bZen\b", c[column])
            assert not found, f"{c['id']}: {column} types {found.group(0)!r}; the provenance records it"


def test_no_claim_row_repeats_another():
    claims = sc.load_claims()
    key = claims["paper"] + "|" + claims["source"] + "|" + claims["paper_value"]
    assert not key.duplicated().any(), list(claims["id"][key.duplicated()])
    assert not claims["claim"].duplicated().any(), list(claims["id"][claims["claim"].duplicated()])
    # exactness once, greedy identity (on a sample or on a whole workload) at most once per paper and method, each
    # closed-form table once
    assert (claims["rule"] == "exact_sampler").sum() == 1
    identity = claims[claims["rule"].isin(["all_identical", "identical_up_to_ties"])]
    assert not (identity["paper"] + "|" + identity["paper_value"]).duplicated().any(), list(identity["id"])
    assert identity.groupby("paper").size().max() <= 1
    pp = claims[claims["rule"] == "printed_precision"]
    assert not pp["our_table"].duplicated().any()
    # a claim that takes a maximum over methods says "best of N" (checked by the rule; here the file states it)
    assert any("best of" in c for c in claims["claim"])


def test_every_method_a_claim_judges_on_a_bench_is_timed_by_its_make_rule():
    """A claim on a bench of record names its methods (``method == '...'``, judged, and ``beside``); the Makefile
    rule that writes that bench must time each of them, or the claim could never be scored on a rerun."""
    claims = sc.load_claims()
    makefile = (ROOT / "Makefile").read_text()
    checked = 0
    for _, c in claims.iterrows():
        names = sc.param_names(c["our_table"])
        if not names or not names[0].startswith("bench_"):
            continue
        rule = re.search(rf"^data/results/{names[0]}\.json:.*?\n((?:\t.*\n)+)", makefile, re.M)
        assert rule, f"{c['id']}: no make rule writes {names[0]}.json"
        if "--merge" in rule.group(1):  # merged from parts: the parts' pattern rule times the methods
            rule = re.search(rf"^\$\(\w+\): data/results/{names[0]}\.p%\.json:.*?\n((?:\t.*\n)+)", makefile,
                             re.M)
            assert rule, f"{c['id']}: {names[0]}.json is merged from parts, but no pattern rule writes them"
        timed = set(re.search(r"--methods (\S+)", rule.group(1)).group(1).split(","))
        for key in ("method", "baseline", "beside"):
            for name in re.findall(r"method == '([^']+)'", sc.params_of(c).get(key, "")):
                assert name in timed, f"{c['id']}: {key} {name} is not among {names[0]}'s --methods {sorted(timed)}"
                checked += 1
    assert checked >= 6


def test_a_judged_method_missing_from_its_table_is_not_run_with_what_stands_beside():
    """When the table predates the configuration a claim judges, the claim reads "not run" (never the extension's
    reading in its place), and the extension's paired ratio is still shown, marked as not judged."""
    runs = pd.DataFrame({"prompt": np.repeat(np.arange(6), 2), "repeat": 0, "method": ["AR", "int8"] * 6,
                         "tokens_per_s": np.tile([10.0, 25.0], 6) + np.repeat(np.arange(6) * 0.1, 2)})
    out = verdict(claim("paired_ratio", "method=method == 'sd γ=3'; baseline=method == 'AR'; beside=method == 'int8'",
                        paper_value="2.0"), {"t": runs})
    assert out["verdict"] == NOT_RUN and "rerun its make rule" in out["reason"]
    assert out["ours"].startswith("beside, not judged: int8 2.4")


def test_every_table_a_claim_reads_is_written_by_its_notebook():
    """A claim's table is saved by its notebook, or (a bench JSON of record) written by a Makefile rule that
    ``make reproduce`` runs."""
    claims = sc.load_claims()
    makefile = (ROOT / "Makefile").read_text()
    bench_results = re.search(r"^BENCH_RESULTS :=(.*?)\n(?!\s)", makefile, re.M | re.S).group(1)
    for _, c in claims[claims["our_table"] != ""].iterrows():
        if not c["notebook"]:  # a table of record written by a make rule, not by a notebook
            for name in sc.param_names(c["our_table"]):
                assert _made_by_record_rule(name), f"{c['id']}: no rule of make reproduce writes {name}.csv"
            continue
        source = (ROOT / "notebooks" / f"{c['notebook']}.ipynb").read_text()
        for name in sc.param_names(c["our_table"]):
            if name.startswith("bench_"):
                assert f"data/results/{name}.json:" in makefile and f"data/results/{name}.json" in bench_results, (
                    f"{c['id']}: no rule of make reproduce (BENCH_RESULTS) writes {name}.json")
                continue
            assert re.search(rf'\\"{re.escape(name)}\\"', source) or _notebook_shard(name, c["notebook"]), (
                f"{c['id']}: {c['notebook']} does not save {name}, nor does a shard rule its notebook waits for")


def test_every_rule_states_itself():
    table = sc.rules_table()
    assert set(table["rule"]) == set(sc.RULES)
    assert (table["statement"].str.len() > 80).all()
    for _, r in table.iterrows():
        assert any(v in r["statement"] for v in sc.VERDICTS), r["rule"]


def test_every_claim_has_a_group_that_fits_its_rule():
    """correctness: what is exact by construction or proved by a test that could fail (exactness, greedy identity and
    quality under greedy decoding, closed forms at the paper's inputs); performance: anything timed or counted in runs
    (speedups, loop times, acceptance, tokens per step, quality under sampling, a closed form at our measured α). The
    group is rendering only: no rule reads it."""
    claims = sc.load_claims()
    assert set(claims["group"]) == set(sc.GROUPS)
    by_rule = claims.groupby("rule")["group"].agg(set)
    for rule in ("exact_sampler", "identical_up_to_ties", "all_identical", "printed_precision", "typical_shifts"):
        assert by_rule[rule] == {"correctness"}, rule
    for rule in ("paired_ratio", "value_in_interval", "row_order", "increases", "decreases", "speedup_peaks",
                 "grows_linearly", "computed_speedup", "needs_precondition", "not_testable", "falls_with_head",
                 "close_to_prediction"):  # Eq. 1 against tokens per step counted in runs is a measurement
        assert by_rule[rule] == {"performance"}, rule
    # nothing timed is correctness
    timed = re.compile(r"tokens_per_s\b|_ms\b|speedup|seconds")
    for _, c in claims[claims["group"] == "correctness"].iterrows():
        assert not timed.search(c["params"]), f"{c['id']} is timed ({c['params']}): performance"
    # quality under greedy decoding follows from greedy identity (identical completions score alike): a check, not a
    # finding; quality under sampling is measured
    quality = claims[claims["rule"] == "quality_unchanged"]
    greedy = quality["params"].str.contains(r"\bsetting=greedy\b")
    assert greedy.any() and (~greedy).any()
    assert (quality.loc[greedy, "group"] == "correctness").all() and (quality.loc[~greedy, "group"] == "performance").all()
    card = sc.score("synthetic", tables=Tables("synthetic", {}))
    assert list(card["group"]) == list(claims["group"])


def test_bad_claims_files_are_refused(tmp_path):
    good = sc.load_claims()
    for column, value, match in (("rule", "vibes", "vibes"), ("paper_kind", "guessed", "paper_kind"),
                                 ("params", "no_such_param=1", "no_such_param"), ("group", "vibes", "group")):
        bad = good.copy()
        bad.loc[0, column] = value
        bad.to_csv(tmp_path / "a.csv", index=False)
        with pytest.raises(ValueError, match=match):
            sc.load_claims(tmp_path / "a.csv")
    pd.concat([good, good.iloc[:1]]).to_csv(tmp_path / "b.csv", index=False)
    with pytest.raises(ValueError, match="unique"):
        sc.load_claims(tmp_path / "b.csv")
    bad = good.copy()
    bad.loc[0, "params"] = "select"
    bad.to_csv(tmp_path / "c.csv", index=False)
    with pytest.raises(ValueError, match="key=value"):
        sc.load_claims(tmp_path / "c.csv")


# ------------------------------------------------------------------------------------------ synthetic tables


def runs(ratios, base_tps=2.0, method="sd γ=3", gamma=3, alpha=0.8, steps=40, tokens=128, extra=None):
    """Per-prompt runs of AR and ``method`` whose tokens/s ratio on prompt i is ratios[i]."""
    rows = []
    for i, r in enumerate(ratios):
        for m, tps, g, a, s in (("AR", base_tps, 0, np.nan, tokens), (method, base_tps * r, gamma, alpha, steps)):
            rows.append({"prompt": f"p{i}", "method": m, "gamma": g, "tokens": tokens, "seconds": tokens / tps,
                         "tokens_per_s": tps, "steps": s, "tokens_per_step": tokens / s, "alpha": a,
                         "temperature": 0})
    df = pd.DataFrame(rows)
    return pd.concat([df, extra]) if extra is not None else df


def ratio_claim(value="1.5", extra="", text="a speedup", margin="10%"):
    return claim("paired_ratio", "method=gamma > 0; baseline=method == 'AR'" + extra
                 + (f"; margin={margin}" if margin else ""), paper_value=value, claim=text)


def test_paired_ratio_shows_extensions_beside_but_judges_the_closest_configuration():
    t = runs([1.4, 1.5, 1.6, 1.45, 1.55, 1.5],
             extra=runs([2.4, 2.5, 2.6, 2.45, 2.55, 2.5], method="int8").query("method == 'int8'"))
    out = verdict(claim("paired_ratio", "method=method == 'sd γ=3'; baseline=method == 'AR'; beside=method == 'int8'",
                        paper_value="2.5"), {"t": t})
    assert out["verdict"] == TREND and out["ours_value"] == pytest.approx(1.5)  # the extension's 2.5 is not the verdict
    assert "beside, not judged: int8 2.50×" in out["ours"]


def test_paired_ratio_gives_every_verdict():
    # medians carry the sign test's interval: at 8 prompts (min, max), 99.2% coverage; below 6 prompts none
    up = runs([1.4, 1.5, 1.6, 1.45, 1.55, 1.48, 1.52, 1.5])
    out = verdict(ratio_claim("1.5"), {"t": up})
    assert out["verdict"] == EXACT and "n = 8 prompts" in out["ours"] and out["ours_lo"] <= 1.5 <= out["ours_hi"]
    out = verdict(ratio_claim("3.4"), {"t": up})
    assert out["verdict"] == TREND and "below the paper's 3.4 ±10%" in out["reason"] and "smaller" in out["reason"]
    # equivalence: a wide interval that holds the paper's number is not enough, only one inside its margin is
    wide = runs([1.1, 1.9, 1.3, 1.7, 1.5, 1.2, 1.8])
    out = verdict(ratio_claim("1.5"), {"t": wide})
    assert out["ours_lo"] < 1.5 * 0.9 and out["ours_hi"] > 1.5 * 1.1
    assert out["verdict"] == TREND and "reaches out of the paper's 1.5 ±10%" in out["reason"]
    # a measured number with no registered margin never reads exactly
    out = verdict(ratio_claim("1.5", margin=""), {"t": up})
    assert out["verdict"] == TREND and "no equivalence margin" in out["reason"]
    out = verdict(ratio_claim("1.5"), {"t": runs([0.7, 0.8, 0.75, 0.72, 0.78, 0.74])})
    assert out["verdict"] == NOT_REPRODUCED and out["ours_hi"] < 1
    out = verdict(ratio_claim("1.5"), {"t": runs([0.8, 1.3, 0.9, 1.2, 1.1, 1.0])})
    assert out["verdict"] == INCONCLUSIVE and "contains 1" in out["reason"]
    assert verdict(ratio_claim("1.5"), {"t": runs([1.4, 1.5, 1.6, 1.45, 1.55])})["verdict"] == INCONCLUSIVE  # n = 5
    assert verdict(ratio_claim("1.5"), {"t": runs([1.5])})["verdict"] == INCONCLUSIVE  # one prompt: no interval
    # a range: exactly if the interval lies within the range widened by the margin
    assert verdict(ratio_claim("1.3-1.5"), {"t": up})["verdict"] == EXACT
    assert verdict(ratio_claim("1.2-1.3"), {"t": up})["verdict"] == TREND


def test_paired_ratio_reports_step_counts_and_verification_cost():
    cost = pd.DataFrame({"model": "target", "n": [1, 2, 3, 4, 8], "ms": [100, 105, 110, 200, 300]})
    out = verdict(ratio_claim("1.5"), {"t": runs([0.7, 0.8, 0.75, 0.72, 0.78]), "cost_curves": cost})
    assert "4 tokens costs 2.0×" in out["reason"] and "tokens per target step" in out["reason"]


def test_paired_ratio_takes_a_maximum_only_when_the_claim_says_best_of_n():
    two = runs([1.2, 1.3, 1.25], method="sd γ=2", gamma=2, extra=runs([1.6, 1.7, 1.65], method="sd γ=4",
                                                                         gamma=4).query("method != 'AR'"))
    with pytest.raises(ValueError, match="best of 2"):
        verdict(ratio_claim("1.6"), {"t": two})
    out = verdict(ratio_claim("1.6", text="a speedup (best of 2 γ)"), {"t": two})
    assert "best of 2: sd γ=4" in out["ours"] and out["ours_value"] == pytest.approx(1.65)
    # a profile that sweeps another number of γ says so instead of failing
    out = verdict(ratio_claim("1.6", text="a speedup (best of 5 γ)"), {"t": two})
    assert "best of 2: sd γ=4" in out["ours"] and "best of 5 is a best of 2 here" in out["reason"]


def test_summary_only_tables_are_inconclusive_not_a_silent_pass():
    summary = pd.DataFrame({"setting": "nucleus", "method": ["ar", "sd@4"], "speedup_vs_ar": [1.0, 2.5],
                            "runs": [5, 5]})
    c = claim("paired_ratio", "method=method == 'sd@4'; baseline=method == 'ar'; summary=speedup_vs_ar",
              paper_value="2.46")
    out = verdict(c, {"t": summary})
    assert out["verdict"] == INCONCLUSIVE and "summary-only" in out["reason"] and "no interval" in out["ours"]


def test_a_rule_that_raises_propagates():
    c = claim("paired_ratio", "method=gamma > 0; baseline=method == 'AR'; value=no_such_column", paper_value="2")
    with pytest.raises(KeyError):
        verdict(c, {"t": runs([1.2, 1.3])})
    with pytest.raises(ValueError, match="not one method"):
        verdict(claim("paired_ratio", "method=gamma > 0; baseline=gamma >= 0", paper_value="2"),
                {"t": runs([1.2, 1.3])})


def test_printed_precision():
    t1 = pd.DataFrame({"alpha": [0.8, 0.9], "gamma": [5, 10], "speed": [3.68928, 6.86189],
                       "paper_speed": [3.69, 6.86], "operations": [1.62633, 1.60306], "paper_operations": [1.63, 1.60]})
    one = claim("printed_precision", "select=alpha == 0.8; value=speed", paper_value="3.69", paper_kind="computed")
    assert verdict(one, {"t": t1})["verdict"] == EXACT
    both = claim("printed_precision", "compare=operations=paper_operations, speed=paper_speed", paper_value="1.63/3.69")
    assert verdict(both, {"t": t1})["ours"] == "4/4 equal at 2 decimals"
    out = verdict(both, {"t": t1.assign(speed=[3.70, 6.86189])})
    assert out["verdict"] == NOT_REPRODUCED and "1 of 4" in out["reason"]


def exactness_frames(spec_tv=1e-16, control_tv=0.3, spec_p=0.4, control_p=1e-20):
    enum = pd.DataFrame({"rule": ["speculative", "no_residual"] * 2, "tv_to_target": [spec_tv, control_tv] * 2})
    gof = pd.DataFrame({"rule": ["speculative", "no_residual"], "n": 1000, "p_value": [spec_p, control_p]})
    return {"enum": enum, "gof": gof}


def test_exact_sampler():
    c = claim("exact_sampler", "tolerance=1e-12", our_table="enum; gof", paper_kind="asserted")
    assert verdict(c, exactness_frames())["verdict"] == EXACT
    assert verdict(c, exactness_frames(spec_tv=1e-3))["verdict"] == NOT_REPRODUCED
    assert verdict(c, exactness_frames(spec_p=1e-5))["verdict"] == NOT_REPRODUCED
    blind = verdict(c, exactness_frames(control_p=0.5))  # a check that cannot see a wrong sampler proves nothing
    assert blind["verdict"] == INCONCLUSIVE and "no_residual" in blind["reason"]
    none = exactness_frames()
    none = {"enum": none["enum"][none["enum"]["rule"] == "speculative"], "gof": none["gof"].iloc[:1]}
    out = verdict(c, none)
    assert out["verdict"] == INCONCLUSIVE and "no negative controls" in out["reason"]


def test_all_identical():
    r = pd.DataFrame({"prompt": ["a", "a", "b", "b"], "method": ["AR", "sd", "sd", "sd"],
                      "same_as_ar": [True, True, "True", np.nan]})
    c = claim("all_identical", "select=method != 'AR'; value=same_as_ar", paper_kind="asserted")
    out = verdict(c, {"t": r})
    assert out["verdict"] == EXACT and out["ours"].startswith("2/2 comparisons identical") and out["n"] == 2
    # the two runs of prompt b (repeated greedy passes) are one comparison: n counts independent comparisons
    out = verdict(c, {"t": r.assign(same_as_ar=[True, True, "True", True])})
    assert out["ours"].startswith("2/2 comparisons identical") and "3 runs" in out["ours"] and out["n"] == 2
    assert out["n_unit"] == "comparisons"
    out = verdict(c, {"t": r.assign(same_as_ar=[True, True, False, "False"])})
    assert out["verdict"] == NOT_REPRODUCED and "2 runs differ" in out["reason"]
    assert verdict(c, {"t": r.assign(same_as_ar=np.nan)})["verdict"] == NOT_RUN


def test_identical_up_to_ties_counts_near_ties_apart_and_fails_on_any_other_departure():
    t = pd.DataFrame({"prompt_id": [f"HumanEval/{i}" for i in range(40)], "identical": [True] * 40,
                      "explained": [False] * 40})
    c = claim("identical_up_to_ties", "value=identical; explained=explained", paper_kind="asserted")
    out = verdict(c, {"t": t})
    assert out["verdict"] == EXACT and out["ours"].startswith("40/40 prompts identical") and not out["reason"]
    assert out["ours_lo"] == 0 and 0.08 < out["ours_hi"] < 0.09 and out["n"] == 40  # Clopper-Pearson: 1 - 0.025^(1/40)
    ties = t.assign(identical=[False, False] + [True] * 38, explained=[True, True] + [False] * 38)
    out = verdict(c, {"t": ties})
    assert out["verdict"] == EXACT and "2 near-tie departures, 0 other" in out["ours"] and "near-tie" in out["reason"]
    bad = ties.assign(explained=[True, False] + [False] * 38)
    out = verdict(c, {"t": bad})
    assert out["verdict"] == NOT_REPRODUCED and "HumanEval/1" in out["reason"] and out["ours_value"] == 1 / 40
    assert out["ours_lo"] > 0
    assert verdict(c, {"t": t.assign(identical=np.nan)})["verdict"] == NOT_RUN


def test_a_claim_on_a_make_rule_table_says_which_command_writes_it():
    claims = sc.load_claims()
    row = sc.score_claim(claims[claims["id"] == "lev-greedy"].iloc[0], Tables("synthetic", {}))
    assert row["verdict"] == NOT_RUN and "make data/results/greedy_equality_humaneval.csv" in row["reason"]


def alpha_table(values, drafter="draft", workload="w", temperature=0):
    return pd.DataFrame({"workload": workload, "temperature": temperature, "drafter": drafter,
                         "prompt": [f"p{i}" for i in range(len(values))], "positions": 64, "alpha": values})


def test_value_in_interval():
    c = claim("value_in_interval", "value=alpha; null=0.5; margin=0.05", paper_value="0.88")
    assert verdict(c, {"t": alpha_table([0.85, 0.9, 0.88, 0.87, 0.91])})["verdict"] == EXACT
    assert verdict(c, {"t": alpha_table([0.7, 0.72, 0.68, 0.71])})["verdict"] == TREND
    assert verdict(c, {"t": alpha_table([0.2, 0.3, 0.25, 0.22])})["verdict"] == NOT_REPRODUCED
    assert verdict(c, {"t": alpha_table([0.2, 0.9, 0.4, 0.8])})["verdict"] == INCONCLUSIVE


def test_row_order():
    def table(big):
        return pd.concat([alpha_table([0.05, 0.06, 0.04, 0.05], "unigram"), alpha_table(big, "bigram"),
                          alpha_table([0.05, 0.06, 0.04, 0.05], "unigram", temperature=1),
                          alpha_table([0.15, 0.16, 0.14, 0.15], "bigram", temperature=1)])
    c = claim("row_order", "key=drafter; lower=unigram; higher=bigram; value=alpha; cells=workload, temperature")
    assert verdict(c, {"t": table([0.15, 0.2, 0.12, 0.18])})["verdict"] == TREND
    assert verdict(c, {"t": table([0.01, 0.02, 0.0, 0.01])})["verdict"] == NOT_REPRODUCED
    out = verdict(c, {"t": table([0.2, 0.0, 0.1, 0.0])})
    assert out["verdict"] == INCONCLUSIVE and "w 0" in out["reason"]


def test_close_to_prediction_rise_is_judged_within_prompts_not_over_pooled_runs():
    """Prompts that differ in α make measured and predicted values rise together over the pooled runs even when,
    within every prompt, the measurement falls as the prediction rises: that is no trend (the prompt is the unit)."""
    c = claim("close_to_prediction", "method=gamma > 0; measured=tokens_per_step; margin=0.10", paper_value="+0.00")
    rows = []
    for i, a in enumerate((0.3, 0.4, 0.5, 0.6, 0.7, 0.8)):
        for g in (1, 2, 3):
            tps_step = (1.0 + 4 * a) * (1.3 - 0.1 * g)  # rises with the prompt's α, falls with γ within the prompt
            rows.append({"prompt": f"p{i}", "method": f"sd{g}", "gamma": g, "tokens": 128, "steps": 128 / tps_step,
                         "tokens_per_step": tps_step, "alpha": a, "temperature": 0, "tokens_per_s": 1.0,
                         "seconds": 128.0})
    t = pd.DataFrame(rows)
    pred = (1 - t["alpha"] ** (t["gamma"] + 1)) / (1 - t["alpha"])
    from scipy import stats
    assert stats.spearmanr(pred, t["tokens_per_step"]).pvalue < 0.05  # pooled, the old fallback's "rise"
    out = verdict(c, {"t": t})
    assert "ρ within prompts -1.00" in out["ours"]
    # the verdict is the gap's own (two-sided, against the paper's gap ± its margin), with ρ beside, not judged
    assert out["verdict"] == verdicts.judge_margin(out["ours_lo"], out["ours_hi"], (-0.10, 0.10))
    assert "ρ beside, not judged: -1.00" in out["reason"]


def test_close_to_prediction_can_take_c_from_the_runs_themselves():
    """c=in_run: c is measured in the runs (the draft's per-token slope over AR's target step), not read from a
    summary whose c was timed in another machine state; without a γ sweep there is nothing to measure it from."""
    from specrepro.theory import walltime_improvement
    rng = np.random.default_rng(0)
    rows = []
    for i in range(8):
        rows.append({"prompt": f"p{i}", "method": "AR", "gamma": 0, "tokens_per_s": 10.0, "alpha": np.nan,
                     "drafted": 0, "draft_ms": np.nan, "target_ms": 100.0, "temperature": 0})
        for g in (1, 2, 4):
            drafted = 10 * g
            speed = 10.0 * walltime_improvement(0.8, g, 0.3) * (1 + 0.02 * rng.normal())
            rows.append({"prompt": f"p{i}", "method": f"sd γ={g}", "gamma": g, "tokens_per_s": speed, "alpha": 0.8,
                         "drafted": drafted, "draft_ms": (250 + 30 * drafted) / drafted, "target_ms": 130.0,
                         "temperature": 0})
    t = pd.DataFrame(rows)
    stale = pd.DataFrame({"method": [f"sd γ={g}" for g in (1, 2, 4)], "temperature": 0, "c": 0.05})
    base = "method=gamma > 0; measured=speedup; margin=0.10"
    out = verdict(claim("close_to_prediction", base + "; c=in_run", our_table="t; s", paper_value="+0.00"),
                  {"t": t, "s": stale})
    assert out["verdict"] == EXACT and -0.05 < out["ours_lo"] <= out["ours_hi"] < 0.05
    assert "c in the runs sd 0.30" in out["ours"] and "pre-run cost curve: 0.05" in out["ours"]
    # the same runs against the stale c: slower than predicted by about a third
    out = verdict(claim("close_to_prediction", base, our_table="t; s", paper_value="+0.00"), {"t": t, "s": stale})
    assert out["verdict"] != EXACT and out["ours_hi"] < -0.25
    one_gamma = t[t["gamma"].isin([0, 4])]
    out = verdict(claim("close_to_prediction", base + "; c=in_run", our_table="t; s", paper_value="+0.00"),
                  {"t": one_gamma, "s": stale})
    assert out["verdict"] == NOT_RUN and "no γ sweep" in out["reason"]


def width_runs(per_prompt):
    """per_prompt: {prompt: [tokens per step at widths 1..]}; two series (greedy, stochastic) alike."""
    return pd.DataFrame([{"decoding": d, "prompt": p, "width": w + 1, "tokens_per_step": y}
                         for d in ("greedy", "stochastic") for p, ys in per_prompt.items() for w, y in enumerate(ys)])


def test_increases_and_decreases_on_per_prompt_rows():
    up = claim("increases", "x=width; y=tokens_per_step; series=decoding")
    rising = width_runs({"a": [2, 2.5, 3], "b": [3, 3.2, 3.5], "c": [1, 1.4, 1.6], "d": [2, 2.2, 2.6]})
    assert verdict(up, {"t": rising})["verdict"] == TREND
    falling = width_runs({"a": [3, 2.5, 2], "b": [3.5, 3.2, 3], "c": [1.6, 1.4, 1], "d": [2.6, 2.2, 2]})
    assert verdict(up, {"t": falling})["verdict"] == NOT_REPRODUCED
    flat = width_runs({"a": [2, 2.5, 3], "b": [3, 3, 3], "c": [1.6, 1.4, 1.5]})
    out = verdict(up, {"t": flat})
    assert out["verdict"] == INCONCLUSIVE and "] contains 0" in out["reason"]
    down = claim("decreases", "x=width; y=tokens_per_step; series=decoding")
    assert verdict(down, {"t": falling})["verdict"] == TREND
    assert verdict(down, {"t": rising})["verdict"] == NOT_REPRODUCED
    assert verdict(down, {"t": width_runs({"a": [3, 2]})})["verdict"] == NOT_RUN  # fewer than 3 widths


def test_increases_and_decreases_on_summary_points_use_spearman():
    sweep = pd.DataFrame({"K": range(1, 8), "accepted_fraction": [0.91, 0.9, 0.85, 0.79, 0.8, 0.73, 0.72]})
    down = claim("decreases", "x=K; y=accepted_fraction")
    out = verdict(down, {"t": sweep})
    assert out["verdict"] == TREND and "p = " in out["ours"] and "n = 7 points" in out["ours"]
    assert verdict(down, {"t": sweep.assign(accepted_fraction=sweep["accepted_fraction"][::-1].to_numpy())}
)["verdict"] == NOT_REPRODUCED
    noisy = sweep.assign(accepted_fraction=[0.8, 0.9, 0.7, 0.85, 0.75, 0.88, 0.78])
    assert verdict(down, {"t": noisy})["verdict"] == INCONCLUSIVE


def test_grows_linearly():
    sweep = pd.DataFrame({"K": range(8), "loop_ms": [100 + 20 * k for k in range(8)]})
    c = claim("grows_linearly", "x=K; y=loop_ms")
    out = verdict(c, {"t": sweep})
    assert out["verdict"] == TREND and "r² = 1.00" in out["ours"]  # a direction: the paper gives no number
    assert verdict(c, {"t": sweep.assign(loop_ms=sweep["loop_ms"][::-1].to_numpy())})["verdict"] == NOT_REPRODUCED
    assert verdict(c, {"t": sweep.assign(loop_ms=[100, 140, 90, 130, 95, 135, 100, 120])})["verdict"] == INCONCLUSIVE


def test_grows_linearly_counts_prompts_not_repeated_passes():
    rows = [{"prompt": f"p{i}", "repeat": r, "K": k, "loop_ms": 100 + 20 * k + 5 * i + r}
            for i in range(4) for r in range(3) for k in range(8)]
    out = verdict(claim("grows_linearly", "x=K; y=loop_ms"), {"t": pd.DataFrame(rows)})
    assert "n = 32 points" in out["ours"] and "+20.0 loop ms per unit K" in out["ours"]


def k_sweep(speed_by_k, n_prompts=8):
    """Per-prompt tokens/s for K = 0.. (K = 0 is AR) with small prompt-to-prompt noise."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n_prompts):
        for k, s in enumerate(speed_by_k):
            rows.append({"prompt": f"p{i}", "K": k, "method": "ar" if k == 0 else f"sd@{k}",
                         "tokens_per_s": s * (1 + 0.01 * rng.standard_normal())})
    return pd.DataFrame(rows)


def test_speedup_peaks():
    c = claim("speedup_peaks", "x=K; tolerance=0.05; margin=1", paper_value="K = 3 (XSum)")
    out = verdict(c, {"t": k_sweep([1, 1.4, 1.6, 1.8, 1.7, 1.6])})
    assert out["verdict"] == EXACT and "best in K = 3 2000 of 2000 resamples" in out["ours"] and "null 1.05" in out["ours"]
    assert verdict(c, {"t": k_sweep([1, 1.4, 1.6, 1.7, 1.8, 1.6])})["verdict"] == EXACT  # best is 4: within 3 ± 1
    out = verdict(c, {"t": k_sweep([1, 1.4, 1.6, 1.7, 1.72, 1.75, 1.74, 1.72])})  # no gain past 3, best is 5
    assert out["verdict"] == TREND and "does not lie within K = 3 ±1" in out["reason"]
    out = verdict(c, {"t": k_sweep([1, 1.2, 1.4, 1.6, 1.8, 2.0])})
    assert out["verdict"] == NOT_REPRODUCED and "still grows past K = 3" in out["reason"]
    noisy = k_sweep([1, 1.4, 1.6, 1.8, 1.7, 1.8])
    k3 = noisy.loc[noisy["K"] == 3, "tokens_per_s"].to_numpy()
    noisy.loc[noisy["K"] == 5, "tokens_per_s"] = k3 * [0.95, 1.15, 1.0, 1.2, 1.05, 0.98, 1.1, 1.02]  # K5/K3 per prompt
    assert verdict(c, {"t": noisy})["verdict"] == INCONCLUSIVE
    summary = pd.DataFrame({"K": range(4), "speedup_vs_ar": [1, 1.2, 1.4, 1.3], "runs": 2})
    out = verdict(c, {"t": summary})
    assert out["verdict"] == INCONCLUSIVE and "summary-only" in out["reason"]


def quality_frames(ar, sd, same=False, passed=True):
    n = len(ar)
    comp = pd.DataFrame({"setting": "nucleus", "method": ["ar"] * n + ["sd"] * n,
                         "prompt": [f"H/{i}" for i in range(n)] * 2,
                         "completion": [f"a{i}" for i in range(n)] + [(f"a{i}" if same else f"b{i}") for i in range(n)]})
    if passed:
        comp["passed"] = list(ar) + list(sd)
    t = pd.DataFrame({"setting": "nucleus", "method": ["ar", "sd"], "pass@1": [np.mean(ar), np.mean(sd)]})
    return {"t": t, "c": comp}


def test_quality_unchanged():
    c = claim("quality_unchanged", "setting=nucleus; method=sd; baseline=ar; margin=0.10", our_table="t; c")
    rng = np.random.default_rng(1)
    ar = (rng.random(200) < 0.45).astype(int)
    sd = ar.copy()
    sd[:6] = 1 - sd[:6]  # 6 of 200 problems flip: the paired interval stays within ±10 points
    out = verdict(c, quality_frames(ar, sd))
    assert out["verdict"] == EXACT and "n = 200 problems" in out["ours"]
    # five problems, 40% vs 80%: the interval is far wider than ±10 points
    out = verdict(c, quality_frames([1, 1, 0, 0, 0], [1, 1, 1, 1, 0]))
    assert out["verdict"] == INCONCLUSIVE
    out = verdict(c, quality_frames([0] * 60, [1] * 40 + [0] * 20))
    assert out["verdict"] == NOT_REPRODUCED and "quality changed" in out["reason"]
    # identical completions need no per-problem results; differing ones without them give no interval
    # every completion identical: 0 of n problems changed, bounded by Clopper-Pearson, so n decides (3: far too few;
    # 36 problems bring the 95% bound under 10 points), never a fixed [0, 0]
    out = verdict(c, quality_frames([1, 0, 1], [1, 0, 1], same=True, passed=False))
    assert out["verdict"] == INCONCLUSIVE and "identical" in out["ours"] and out["ours_hi"] > 0.5
    out = verdict(c, quality_frames([1, 0] * 18, [1, 0] * 18, same=True, passed=False))
    assert out["verdict"] == EXACT and 0.0 < out["ours_hi"] < 0.10 and out["ours_lo"] == -out["ours_hi"]
    out = verdict(c, quality_frames([1, 0, 1], [1, 1, 1], passed=False))
    assert out["verdict"] == INCONCLUSIVE and "'passed'" in out["reason"]


def test_falls_with_head():
    def acc(top1):
        return pd.DataFrame({"head": range(1, len(top1) + 1), "positions": 300, "top1": top1})
    c = claim("falls_with_head", "value=top1; count=positions", paper_kind="asserted", paper_value="L_k grows with k")
    assert verdict(c, {"t": acc([0.3, 0.2, 0.12, 0.08])})["verdict"] == TREND
    assert verdict(c, {"t": acc([0.1, 0.15, 0.2, 0.3])})["verdict"] == NOT_REPRODUCED
    assert verdict(c, {"t": acc([0.2, 0.21, 0.19, 0.18])})["verdict"] == INCONCLUSIVE


def test_typical_shifts():
    def tv(p_typ, p_ex):
        return pd.DataFrame({"method": ["typical", "exact iid", "exact wor"],
                             "distribution_preserving": [False, True, "True"], "samples": 1000,
                             "tv_distance": [0.9, 0.1, 0.12], "gof_p_value": [p_typ, p_ex, 0.5]})
    c = claim("typical_shifts", paper_kind="asserted")
    assert verdict(c, {"t": tv(0.0, 0.6)})["verdict"] == EXACT
    assert verdict(c, {"t": tv(0.3, 0.6)})["verdict"] == NOT_REPRODUCED
    assert verdict(c, {"t": tv(0.0, 1e-5)})["verdict"] == INCONCLUSIVE


def test_every_rule_has_its_own_test_and_every_judging_rule_can_say_not_reproduced():
    chunks = Path(__file__).read_text().split("\ndef test_")
    never_judge = {"not_testable": "NOT_TESTABLE", "computed_speedup": "COMPUTED"}
    for name in sc.RULES:
        tested = [c for c in chunks if f'claim("{name}"' in c or (name == "paired_ratio" and "ratio_claim(" in c)]
        assert tested, f"rule {name} has no test"
        expected = never_judge.get(name, "NOT_REPRODUCED")
        assert any(expected in c for c in tested), f"rule {name} is never shown to say {expected}"
    assert any("INCONCLUSIVE" in c for c in chunks)


def test_provenance_fills_setting_and_hardware():
    prov = {"t": {"target": "big", "draft": "small", "device": "cuda: H100", "profile": "full", "commit": "abc"}}
    out = verdict(ratio_claim("1.5"), {"t": runs([1.4, 1.5, 1.6])}, prov)
    assert out["our_setting"] == "big + small" and out["hardware"] == "cuda: H100"
    assert out["profile"] == "full" and out["commit"] == "abc"


def test_hardware_names_the_cpu_where_the_provenance_records_it():
    cpu = "AMD EPYC (family 25, model 1), avx2"
    assert sc.hardware_of({"device": "cpu (2 cores, x86_64)", "cpu": cpu}) == f"cpu (2 cores, x86_64), {cpu}"
    # a bench JSON's config: device "cpu" and its description
    assert sc.hardware_of({"device": "cpu", "device_description": "cpu (2 cores)", "cpu": cpu}) == f"cpu (2 cores), {cpu}"
    assert sc.hardware_of({"device": "cpu (2 cores)"}) == "cpu (2 cores), CPU model not recorded"
    assert sc.hardware_of({"device": "cuda: H100", "cpu": cpu}) == "cuda: H100" and sc.hardware_of({}) == ""
    # rows decoded over several sittings (greedy equality resumed on another machine): every CPU of the rows
    assert sc.hardware_of({"device": "cpu", "cpu": "B", "row_cpus": ["A", "B"]}) == "cpu, A; B"


# ------------------------------------------------------------------------------------ the committed record


@pytest.fixture(scope="module")
def committed_card():
    """Every claim scored on the committed standard tables (data/results only): a rule that raises fails here."""
    return sc.score("standard", tables=Tables("standard", dirs=[record_dir("results")]))


def test_committed_tables_score_without_error_and_match_the_committed_scorecard(committed_card):
    card = committed_card
    claims = sc.load_claims()
    assert list(card["id"]) == list(claims["id"])
    measured = (claims["rule"] != "not_testable").to_numpy()
    # a measured claim is "not run" only while its table is not yet in the record (a notebook section added since
    # the last standard rerun), predates the method the claim judges (a make rule that now times it), or was drafted
    # by the int8 copy of a draft the claim judges in its own dtype (a notebook to rerun); any other "not run" is a bug
    pending = card["verdict"].eq(NOT_RUN) & card["reason"].astype(str).str.contains(
        "not written|rerun its make rule|drafted by the int8 copy")
    assert (card.loc[measured, "verdict"].ne(NOT_RUN) | pending[measured]).all(), \
        card[(card["verdict"] == NOT_RUN) & ~pending]["id"].tolist()
    committed = pd.read_csv(record_dir("results") / "scorecard.csv", keep_default_na=False)
    assert list(committed["id"]) == list(card["id"]), "regenerate data/results/scorecard.csv (make reproduce)"
    assert list(committed["verdict"]) == list(card["verdict"])


def _sign_test_interval(values) -> tuple[float, float]:
    """A referee's own 95% interval of a median: order statistics x_(k), x_(n+1-k) with the largest k whose binomial
    coverage 1 - 2 P(Bin(n, 1/2) <= k - 1) is at least 95% (written here from the definition, not the package's)."""
    from scipy import stats

    x = np.sort(np.asarray(values, dtype=float))
    n = len(x)
    ks = [k for k in range(1, n // 2 + 1) if 1 - 2 * stats.binom.cdf(k - 1, n, 0.5) >= 0.95]
    return (x[max(ks) - 1], x[n - max(ks)]) if ks else (float("nan"), float("nan"))


def test_a_referee_recomputes_every_paired_ratio_on_the_card(committed_card):
    """Every judged paired ratio on the card: the median over prompts of the per-prompt ratios (the harness's one
    definition of pairing) and its interval recomputed from the committed table with the sign test's order
    statistics written from the definition; the card's number and interval are those."""
    from specrepro.measure.harness import paired_ratios
    from specrepro.record.rulekit import claim_rows, matching_methods, params_of

    tables = Tables("standard", dirs=[record_dir("results")])
    claims = sc.load_claims().set_index("id")
    rows = committed_card[(committed_card["rule"] == "paired_ratio") & committed_card["ours_lo"].notna()]
    assert len(rows) >= 5
    for _, row in rows.iterrows():
        claim = claims.loc[row["id"]].copy()
        claim["id"] = row["id"]
        p = params_of(claim)
        df = claim_rows(claim, tables, p)
        base = matching_methods(df, p["baseline"], "baseline")[0]
        ratios = {m: paired_ratios(df, m, base, p.get("value") or "tokens_per_s")
                  for m in matching_methods(df, p["method"], "method")}
        best = max(ratios, key=lambda m: float(np.median(ratios[m])))
        lo, hi = _sign_test_interval(ratios[best])
        assert row["ours_value"] == pytest.approx(float(np.median(ratios[best])), rel=1e-12), row["id"]
        assert (row["ours_lo"], row["ours_hi"]) == pytest.approx((lo, hi), rel=1e-12), row["id"]
        assert row["n"] == len(ratios[best]), row["id"]


def test_every_speed_and_acceptance_row_shows_its_interval_and_n(committed_card):
    rows = committed_card[committed_card["rule"].isin(INTERVAL_RULES) & (committed_card["verdict"] != NOT_RUN)]
    assert len(rows) >= 10
    for _, r in rows.iterrows():
        assert re.search(r"n = \d+", r["ours"]), (r["id"], r["ours"])
        assert re.search(r"\[[-+]?\d", r["ours"]) or "no interval" in r["ours"] or "no paired interval" in r["ours"], \
            (r["id"], r["ours"])
        if r["verdict"] in (EXACT, TREND) and r["rule"] != "falls_with_head":
            assert np.isfinite(r["ours_lo"]) or r["rule"] in ("row_order", "increases", "decreases"), r["id"]


def test_every_performance_claim_read_exactly_prints_its_equivalence_margin(committed_card):
    """"Reproduced exactly" on a measured quantity is an equivalence test: the card prints the margin it used (a
    computed formula's tolerance on the signed gap included)."""
    exact = committed_card[(committed_card["group"] == "performance") & (committed_card["verdict"] == EXACT)]
    assert len(exact) >= 1
    assert exact["margin"].fillna("").astype(str).str.startswith("±").all(), exact[["id", "margin"]]


def test_every_n_says_what_it_counts(committed_card):
    """The card's n carries its unit (runs, settings, prompts × passes, points, samples): never a bare number, in the
    CSV or in the README's n column."""
    from specrepro.record.report import render_summary

    scored = committed_card[committed_card["n"].notna()]
    assert len(scored) >= 20
    assert scored["n_unit"].astype(str).str.strip().ne("").all(), scored[scored["n_unit"] == ""]["id"].tolist()
    assert scored["n_unit"].isin(["runs", "settings", "numbers"]).any()
    n_cells = [line.rsplit(" | ", 2)[1] for line in render_summary(committed_card).splitlines() if "<sub>" in line]
    assert n_cells and not [c for c in n_cells if re.fullmatch(r"[\d,]+", c)], n_cells


def test_n_unit_reads_the_rules_unit_or_its_n_phrase():
    assert sc.n_unit(sc.Outcome(EXACT, "3/3 runs identical", n=3, unit="runs")) == "runs"
    assert sc.n_unit(sc.Outcome(TREND, "1.5× [1.2, 1.8] (n = 20 prompts × 3 passes)", n=20)) == "prompts × 3 passes"
    assert sc.n_unit(sc.Outcome(TREND, "+3 ms per K [+2, +4], n = 160 points", n=160)) == "points"
    assert sc.n_unit(sc.Outcome(TREND, "1.5×", n=20)) == ""  # says nothing: the committed-card test above catches it
    assert sc.n_unit(sc.Outcome(NOT_RUN, "", unit="runs")) == ""


def test_a_smaller_profile_without_a_draft_model_scores_without_error():
    """Quick-profile-like tables (one prompt, no draft model, no accuracy tree, fewer γ) give verdicts, not errors."""
    names = {n for field in sc.load_claims()["our_table"] for n in sc.param_names(field)} | {"cost_curves"}
    frames = {}
    for name in names:
        df = read_record_table(record_dir("results"), name)  # a CSV, or a bench JSON's runs
        if df is None:  # not in the record yet: its claims score "not run"
            continue
        if "prompt" in df:
            df = df[df["prompt"] == df["prompt"].iloc[0]]
        for col in ("method", "drafter"):
            if col in df:
                df = df[~df[col].astype(str).str.contains("qwen|accuracy tree|γ=2")]
        frames[name] = df
    card = sc.score("quick", tables=Tables("quick", frames))
    assert set(card["verdict"]) <= set(sc.VERDICTS)
    assert (card.loc[card["id"] == "lev-t2-t0", "verdict"] == NOT_RUN).all()
    assert (card.loc[card["id"] == "lev-eq1", "verdict"] != NOT_RUN).all()


def test_tree_runs_are_explained_by_their_tree_size():
    rows = pd.DataFrame({"depths": [[0, 3, 2], [0, 3]], "drafted": [[0, 8, 8], [0, 8]]})
    assert rulekit.count_tree_nodes(rows) == 8
    chain = pd.DataFrame({"depths": [[], []], "drafted": [[4, 4], [4]]})
    assert rulekit.count_tree_nodes(chain) == 0
    assert rulekit.count_tree_nodes(pd.DataFrame({"gamma": [3]})) == 0


def test_a_bench_claim_is_explained_by_its_own_runs_cost_model():
    """A speed ratio timed in a bench file is explained with the verification cost that run measured (its machine),
    not notebook 04's cost curve from another run; tables without a cost model fall back to notebook 04's."""
    curves = pd.DataFrame({"model": ["t", "t"], "n": [1, 5], "ms": [300.0, 240.0]})
    bench_cfg = {"device_description": "cpu (2 cores)", "cpu": "Some CPU, avx2",
                 "cost_model": {"target_ms": {"1": 280.0, "3": 300.0, "5": 364.0}}}
    tables = Tables("synthetic", {"cost_curves": curves}, {"cost_curves": {"device": "nb04 cpu"}, "b": bench_cfg})
    ratio, where = rulekit.cost_ratio(tables, 5, "b")
    assert ratio == pytest.approx(1.3) and "Some CPU, avx2" in where and "this run's cost model" in where
    ratio, where = rulekit.cost_ratio(tables, 5, "other")  # no cost model in its provenance: notebook 04's curve
    assert ratio == pytest.approx(0.8) and where == "nb04 cpu"
    assert rulekit.cost_ratio(tables, 5)[0] == pytest.approx(0.8)


def test_a_ratio_is_explained_by_the_forwards_its_own_runs_timed():
    """Where the runs record their target forward per step (bench runs), the explanation quotes its ratio to the
    baseline's from those same runs (120 / 100 ms), not a cost model measured apart; without it, the cost model."""
    method = pd.DataFrame({"gamma": [4, 4], "target_ms": [118.0, 122.0], "seconds": [1.0, 1.0],
                           "new_tokens": [40, 40], "accepted": [[3] * 10, [3] * 10]})
    base = pd.DataFrame({"gamma": [0, 0], "target_ms": [99.0, 101.0], "seconds": [4.0, 4.0],
                         "new_tokens": [40, 40], "accepted": [[0] * 40, [0] * 40]})
    curves = pd.DataFrame({"model": ["t", "t"], "n": [1, 5], "ms": [300.0, 240.0]})
    tables = Tables("synthetic", {"cost_curves": curves}, {"cost_curves": {"device": "nb04 cpu"}})
    assert "took 1.20× the baseline's in these runs" in rulekit.explain_gap(method, base, tables)
    text = rulekit.explain_gap(method.drop(columns="target_ms"), base, tables)
    assert "costs 0.8× a 1-token forward on nb04 cpu" in text


def repeated(ratios_per_pass, **kw):
    """runs() for several timed passes, each pass's rows tagged with its ``repeat``."""
    return pd.concat([runs(r, **kw).assign(repeat=i) for i, r in enumerate(ratios_per_pass)], ignore_index=True)


def test_rules_on_repeated_passes_pair_within_a_pass_and_count_prompts_once():
    summary = pd.DataFrame({"method": ["sd γ=3"], "temperature": [0], "c": [0.1]})
    t = repeated([[2.2, 2.3, 2.27, 2.4, 2.1, 2.25], [2.25, 2.28, 2.2, 2.35, 2.15, 2.3], [2.3, 2.2, 2.3, 2.3, 2.2, 2.2]],
                 gamma=3, alpha=0.8)
    t.loc[t["repeat"] == 1, "tokens_per_s"] *= 2  # a fast pass, both sides: paired within it, no gap appears
    c = claim("close_to_prediction", "method=gamma > 0; measured=speedup", our_table="t; s", paper_value="+0.00")
    out = verdict(c, {"t": t, "s": summary})
    assert "n = 6 prompts" in out["ours"] and "(18 runs)" in out["ours"] and out["ours_lo"] <= 0 <= out["ours_hi"]
    # one setting per prompt: its passes share one prediction, so no ρ within prompts and no verdict past inconclusive
    assert out["verdict"] == INCONCLUSIVE and "ρ within" not in out["ours"]
    c = claim("computed_speedup", "method=gamma > 0; c=0; tolerance=0.10", paper_value="1.25", paper_kind="computed")
    out = verdict(c, {"t": repeated([[0.9] * 4] * 3, gamma=3, alpha=0.2)})
    assert out["verdict"] == COMPUTED and "n = 4 prompts" in out["ours"]


def test_unstable_claims_carry_both_readings():
    stab = pd.DataFrame([{"claim": "lev-t1", "readings": 3, "verdicts": "trend reproduced (a, b); reproduced exactly (c)",
                          "unstable": True, "moved_with_rule": True, "moved_with_data": False},
                         {"claim": "lev-exact", "readings": 3, "verdicts": "reproduced exactly (a, b, c)",
                          "unstable": False, "moved_with_rule": False, "moved_with_data": False}])
    notes = sc.stability_notes(Tables(frames={"verdict_stability": stab}))
    assert notes == {"lev-t1": "unstable over 3 distinct readings: trend reproduced ×2; reproduced exactly ×1 "
                               "(moved with its rule)"}
    assert sc.stability_notes(Tables(frames={})) == {}


def test_a_claim_on_the_draft_in_its_own_dtype_is_not_judged_on_the_int8_copy():
    """``draft=own dtype`` (any rule): a table whose provenance names the int8 copy gives "not run", its reading
    beside the verdict; the same rows drafted by the draft in its own dtype are judged; other values are refused."""
    rows = pd.DataFrame({"prompt": [f"p{i}" for i in range(8) for _ in (0, 1)],
                         "method": ["ar", "sd"] * 8,
                         "tokens_per_s": [v for i in range(8) for v in (10.0 + i % 3, 20.0 + i % 2)]})
    base = dict(rule="paired_ratio", params="method=method == 'sd'; baseline=method == 'ar'; draft=own dtype",
                our_table="t", paper_value="2.0", notebook="07_chen_humaneval")
    for prov, judged in (({"draft": "d", "draft_method": "sd-draft-int8"}, False), ({"draft": "d (int8)"}, False),
                         ({"draft": "d", "draft_method": "sd-draft"}, True), ({"draft": "d"}, True)):
        card = sc.score_claim(claim(**base), Tables(frames={"t": rows}, provenances={"t": prov}))
        assert (card["verdict"] != NOT_RUN) == judged, (prov, card)
        if not judged:
            assert card["ours"].startswith("beside, not judged: the int8 copy of the draft: ") and "×" in card["ours"]
            assert "rerun notebooks/07_chen_humaneval.ipynb" in card["reason"] and card["ours_value"] is None
            assert "d (int8)" in card["our_setting"] or "int8" in prov["draft"]
    # without the parameter, the int8 table is judged as before
    plain = claim(**{**base, "params": "method=method == 'sd'; baseline=method == 'ar'"})
    card = sc.score_claim(plain, Tables(frames={"t": rows}, provenances={"t": {"draft_method": "sd-draft-int8"}}))
    assert card["verdict"] != NOT_RUN
    claims = pd.read_csv(sc.claims_path(), dtype=str, keep_default_na=False)
    claims.loc[0, "params"] += "; draft=int8"
    with pytest.raises(ValueError, match="draft='int8'"):
        sc.load_claims(io.StringIO(claims.to_csv(index=False)))


def test_no_rule_reads_a_claims_id_to_decide():
    """A rule is a function of the claim's parameters, paper number and tables: its id may name the claim in an error
    message, never choose a branch."""
    import inspect

    for name, fn in sc.RULES.items():
        src = inspect.getsource(fn)
        assert not re.search(r"""claim\[["']id["']\]\s*(==|!=|in\b|not in\b)|\bif\b[^\n]*claim\[["']id["']\]""", src), name


def test_missing_tables_empty_selections_and_unreachable_claims():
    out = verdict(ratio_claim(), {})
    assert out["verdict"] == NOT_RUN and "t not written" in out["reason"]
    out = verdict(claim("paired_ratio", "select=gamma == 99; method=gamma > 0; baseline=method == 'AR'",
                        paper_value="2"), {"t": runs([1.2, 1.3])})
    assert out["verdict"] == NOT_RUN and "selection" in out["reason"]
    out = verdict(claim("not_testable", our_table="", caveat="no cluster here", paper_value="2.8"), {})
    assert out["verdict"] == NOT_TESTABLE and out["reason"] == "no cluster here"


def test_computed_speedup_is_computed_never_a_reproduction():
    c = claim("computed_speedup", "method=gamma > 0; baseline=method == 'AR'; c=0; tolerance=0.10",
              paper_value="1.25", paper_kind="computed")
    t = runs([0.9, 0.95, 0.92, 0.88], gamma=3, alpha=0.2)  # Thm 3.8 at α = 0.2, γ = 3, c = 0: 1.248
    out = verdict(c, {"t": t})
    assert out["verdict"] == COMPUTED and "measured beside, not judged: 0.9" in out["ours"]
    assert "lies within our computed interval" in out["reason"]
    out = verdict(c, {"t": runs([1.5, 1.6, 1.55], gamma=3, alpha=0.6)})  # computed 2.18: our α is another
    assert out["verdict"] == COMPUTED and "our α differs" in out["reason"]


def test_close_to_prediction_of_a_computed_formula_reads_a_signed_gap_within_its_tolerance():
    c = claim("close_to_prediction", "method=gamma > 0; measured=tokens_per_step; tolerance=0.10",
              paper_kind="computed", paper_value="(1 − α^(γ+1)) / (1 − α)")
    # Eq. 1 at α = 0.8, γ = 3: 2.952 tokens per call; 128 tokens in 43 steps = 2.977
    good = pd.concat([runs([1.2] * 4, gamma=3, alpha=0.8, steps=43), runs([1.3] * 4, method="sd γ=4", gamma=4,
                                                                          alpha=0.8, steps=38)])
    out = verdict(c, {"t": good})
    assert out["verdict"] == EXACT and -0.1 < out["ours_lo"] <= out["ours_hi"] < 0.1
    # 30% fewer tokens per call than Eq. 1 in every setting: the signed gap lies below -10%
    short = pd.concat([runs([1.2] * 4, gamma=3, alpha=0.8, steps=61), runs([1.3] * 4, method="sd γ=4", gamma=4,
                                                                           alpha=0.8, steps=54)])
    out = verdict(c, {"t": short})
    assert out["verdict"] == NOT_REPRODUCED and out["ours_hi"] < -0.1 and "median signed gap -0.29" in out["ours"]
    # 30% more is as far: the sign is kept, the margin is two-sided
    over = pd.concat([runs([1.2] * 4, gamma=3, alpha=0.8, steps=33), runs([1.3] * 4, method="sd γ=4", gamma=4,
                                                                          alpha=0.8, steps=29)])
    out = verdict(c, {"t": over})
    assert out["verdict"] == NOT_REPRODUCED and out["ours_lo"] > 0.1
    # prompts that straddle the margin's end
    mixed = pd.concat([runs([1.2] * 3, gamma=3, alpha=0.8, steps=43),  # gap about 0
                       runs([1.2] * 3, gamma=3, alpha=0.8, steps=55).assign(prompt=lambda d: d["prompt"] + "b")])
    assert verdict(c, {"t": mixed})["verdict"] == INCONCLUSIVE


def gap_runs(gap, n_prompts=8, shuffle=False, flip=False, seed=0):
    """Per prompt, AR and γ = 1..4 at α = 0.8 whose speedup over AR is Thm 3.8's (c = 0.1) times (1 + gap), with
    1% noise; ``shuffle`` permutes the speedups within each prompt (no relation to the prediction), ``flip``
    reverses them (the measurement falls as the prediction rises)."""
    from specrepro.theory import walltime_improvement

    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_prompts):
        pred = np.array([walltime_improvement(0.8, g, 0.1) for g in (1, 2, 3, 4)])
        speed = pred * (1 + gap) * (1 + 0.01 * rng.standard_normal(4))
        if shuffle:
            speed = rng.permutation(speed)
        if flip:
            speed = speed[::-1]  # the prediction rises with γ
        rows.append({"prompt": f"p{i}", "method": "AR", "gamma": 0, "alpha": np.nan, "tokens_per_s": 10.0,
                     "temperature": 0})
        rows += [{"prompt": f"p{i}", "method": f"sd γ={g}", "gamma": g, "alpha": 0.8, "tokens_per_s": 10.0 * s,
                  "temperature": 0} for g, s in zip((1, 2, 3, 4), speed)]
    summary = pd.DataFrame({"method": [f"sd γ={g}" for g in (1, 2, 3, 4)], "temperature": 0, "c": 0.1})
    return {"t": pd.DataFrame(rows), "s": summary}


def test_close_to_prediction_of_a_measured_gap_keeps_its_sign_and_is_judged_on_the_gap():
    """A gap the paper measured is the claim's own statistic, judged two-sided: the signed gap's whole interval
    within the paper's gap ± the registered margin reads exactly, wholly outside it not reproduced (the same size of
    gap with the other sign included), straddling an end inconclusive; ρ (does the measurement rise with the
    prediction, within prompts) is shown beside and judges nothing; no registered margin, no verdict."""
    c = claim("close_to_prediction", "method=gamma > 0; measured=speedup; margin=0.10", our_table="t; s",
              paper_value="median +0.08 (rows −0.32 to +0.29)")
    out = verdict(c, gap_runs(0.08))
    assert out["verdict"] == EXACT and -0.02 <= out["ours_lo"] <= 0.08 <= out["ours_hi"] <= 0.18
    out = verdict(c, gap_runs(-0.08))
    assert out["verdict"] == NOT_REPRODUCED and out["ours_hi"] < 0 and "wholly outside the paper's gap +0.08" in out["reason"]
    assert "median signed gap -0.08" in out["ours"]
    out = verdict(c, gap_runs(-0.02))
    assert out["verdict"] == INCONCLUSIVE and "reaches out of" in out["reason"]
    # the gap decides, whatever ρ: the measurement falling as the prediction rises is shown beside
    out = verdict(c, gap_runs(0.08, flip=True))
    assert "ρ beside, not judged: -" in out["reason"]
    no_margin = claim("close_to_prediction", "method=gamma > 0; measured=speedup", our_table="t; s",
                      paper_value="median +0.08 (rows −0.32 to +0.29)")
    out = verdict(no_margin, gap_runs(0.08))
    assert out["verdict"] == INCONCLUSIVE and "no equivalence margin" in out["reason"]


def test_an_interval_that_holds_0_is_inconclusive_whatever_the_papers_change():
    """An interval containing the null is inconclusive, also when it excludes the paper's own change (the
    definition); an interval above 0 that holds the paper's change is reproduced exactly, one that misses it a
    trend."""
    flat = width_runs({"a": [2, 2.1, 2.2], "b": [3, 3, 2.9], "c": [1.6, 1.5, 1.5], "d": [2, 2.1, 2.05]})
    base = "x=width; y=tokens_per_step; series=decoding"
    assert verdict(claim("increases", base), {"t": flat})["verdict"] == INCONCLUSIVE
    out = verdict(claim("increases", base + "; paper_change=greedy:0.48,stochastic:0.59"), {"t": flat})
    assert out["verdict"] == INCONCLUSIVE and "contains 0 (and not the paper's 0.48)" in out["reason"]
    rising = width_runs({"a": [2, 2.3, 2.5], "b": [3, 3.2, 3.5], "c": [1, 1.4, 1.6], "d": [2, 2.2, 2.55]})
    out = verdict(claim("increases", base + "; paper_change=greedy:0.5,stochastic:0.5; margin=0.3"), {"t": rising})
    assert out["verdict"] == EXACT
    out = verdict(claim("increases", base + "; paper_change=greedy:0.5,stochastic:0.5; margin=0.05"), {"t": rising})
    assert out["verdict"] == TREND and "reaches out of the paper's 0.5 ±0.05" in out["reason"]
    out = verdict(claim("increases", base + "; paper_change=greedy:0.5,stochastic:2.0"), {"t": rising})
    assert out["verdict"] == TREND and "stochastic" in out["reason"]
    with pytest.raises(ValueError, match="series:number"):
        verdict(claim("increases", base + "; paper_change=greedy"), {"t": flat})


def test_needs_precondition():
    """Judged as a paired ratio only where the same runs show the precondition (here: Medusa-1 speeds up its
    backbone); otherwise not testable here, with the precondition's reading as the reason."""
    def medusa(m1, m2, n=6):
        rows = []
        for i in range(n):
            for m, tps in (("AR", 20.0), ("Medusa-1", 20.0 * m1[i % len(m1)]), ("AR2", 20.0),
                           ("Medusa-2", 20.0 * m2[i % len(m2)])):
                rows.append({"prompt": f"p{i}", "method": m, "tokens_per_s": tps, "tokens": 64, "seconds": 64 / tps})
        return pd.DataFrame(rows)
    c = claim("needs_precondition", "method=method == 'Medusa-2'; baseline=method == 'AR2'; "
              "requires=method == 'Medusa-1'; requires_baseline=method == 'AR'; margin=10%", paper_value="2.83")
    out = verdict(c, {"t": medusa([0.85, 0.9, 0.88], [0.9, 0.95, 0.92])})
    assert out["verdict"] == NOT_TESTABLE and "needs Medusa-1 to speed up AR first" in out["reason"]
    assert out["ours"].startswith("precondition Medusa-1 / AR 0.8") and "; not judged: 0.9" in out["ours"]
    assert out["ours_value"] is None
    out = verdict(c, {"t": medusa([1.3, 1.4, 1.35], [0.8, 0.85, 0.82])})
    assert out["verdict"] == NOT_REPRODUCED
    out = verdict(c, {"t": medusa([1.3, 1.4, 1.35], [2.7, 2.9, 2.8])})
    assert out["verdict"] == EXACT


# ------------------------------------------------------------------------------- the verdicts' one definition


#: (lo, hi, null, direction, holds_paper) -> the verdict the definitions give
INTERVAL_CASES = [
    ((1.2, 1.6, 1.0, +1, True), EXACT),
    ((1.2, 1.6, 1.0, +1, False), TREND),
    ((1.2, 1.6, 1.0, +1, None), TREND),        # a direction without a number
    ((0.6, 0.9, 1.0, +1, False), NOT_REPRODUCED),
    ((0.6, 0.9, 1.0, +1, True), NOT_REPRODUCED),
    ((0.9, 1.6, 1.0, +1, True), INCONCLUSIVE),  # contains the null, holds the paper's number
    ((0.9, 1.6, 1.0, +1, False), INCONCLUSIVE),  # contains the null, excludes the paper's number
    ((0.0, 0.41, 0.0, +1, False), INCONCLUSIVE),  # touches the null: does not exclude it
    ((-1.29, 0.08, 0.0, +1, False), INCONCLUSIVE),
    ((-0.3, -0.2, 0.0, -1, True), EXACT),       # the paper's side below the null
    ((0.2, 0.3, 0.0, -1, None), NOT_REPRODUCED),
    ((float("nan"), float("nan"), 1.0, +1, None), INCONCLUSIVE),  # no interval
    ((None, None, 1.0, +1, True), INCONCLUSIVE),
]


@pytest.mark.parametrize("args, expected", INTERVAL_CASES)
def test_interval_verdicts_follow_their_definitions(args, expected):
    """Each case's verdict is the code's, and its clause - the text rendered into the README - is part of that
    verdict's definition and says what the case shows."""
    assert verdicts.judge_interval(*args) == expected
    clause = next(c for c in verdicts.INTERVAL_CLAUSES if c.holds(*args))
    assert clause.verdict == expected and clause.text in verdicts.VERDICT_DEFINITIONS[expected]
    lo, hi, null, direction, holds = args
    if expected == INCONCLUSIVE:
        assert "contains the null" in clause.text and "no interval" in clause.text
    if expected == EXACT:
        assert "within the paper's number" in clause.text and "margin" in clause.text
        assert "excludes the null on the paper's side" in clause.text


def test_margin_and_test_verdicts_follow_their_definitions():
    for (lo, hi), expected in (((-0.03, 0.12), INCONCLUSIVE), ((-0.05, 0.05), EXACT), ((0.11, 0.2), NOT_REPRODUCED),
                               ((-0.3, -0.2), NOT_REPRODUCED), ((float("nan"), 0.0), INCONCLUSIVE)):
        assert verdicts.judge_margin(lo, hi, (-0.1, 0.1)) == expected
        clause = next(c for c in verdicts.MARGIN_CLAUSES if c.holds(lo, hi, -0.1, 0.1))
        assert clause.verdict == expected and clause.text in verdicts.VERDICT_DEFINITIONS[expected]
    for (yes, can_fail), expected in (((True, True), EXACT), ((False, True), NOT_REPRODUCED),
                                      ((False, False), NOT_REPRODUCED), ((True, False), INCONCLUSIVE)):
        assert verdicts.judge_test(yes, can_fail) == expected
        clause = next(c for c in verdicts.TEST_CLAUSES if c.holds(yes, can_fail))
        assert clause.text in verdicts.VERDICT_DEFINITIONS[expected]


def test_every_verdict_has_one_definition_and_the_rendered_text_is_it():
    assert list(verdicts.VERDICT_DEFINITIONS) == list(sc.VERDICTS)
    assert set(sc.JUDGED) < set(sc.VERDICTS)
    rendered = sc.verdict_definitions()
    for v in sc.VERDICTS:
        assert verdicts.VERDICT_DEFINITIONS[v] and f"**{v}**: {verdicts.VERDICT_DEFINITIONS[v]}." in rendered
    # every clause of every family belongs to a verdict's definition, and no verdict judged by a clause is missing one
    for clauses in (verdicts.INTERVAL_CLAUSES, verdicts.MARGIN_CLAUSES, verdicts.TEST_CLAUSES):
        assert {c.verdict for c in clauses} <= set(sc.JUDGED)
        assert clauses[-1].verdict == INCONCLUSIVE  # what no other clause decides is inconclusive


def test_paper_numbers_keep_their_sign_and_ranges():
    assert rulekit.paper_range(claim("x", paper_value="1.2-1.5")) == (1.2, 1.5)
    assert rulekit.paper_range(claim("x", paper_value="median +0.08 (rows −0.32 to +0.29)")) == (0.08, 0.08)
    assert rulekit.paper_range(claim("x", paper_value="−0.32 to +0.29")) == (-0.32, 0.29)
    assert rulekit.paper_range(claim("x", paper_value="2.46×")) == (2.46, 2.46)
    assert rulekit.paper_range(claim("x", paper_value="K = 3 (XSum)")) == (3, 3)


def test_the_prediction_claims_paper_number_is_the_median_signed_gap_of_the_papers_table():
    """lev-t2-prediction's paper_value is computed from data/papers/leviathan_table2.csv (EMP / EXP − 1 per row), not
    typed: its median and its range."""
    t2 = pd.read_csv(ROOT / "data" / "papers" / "leviathan_table2.csv")
    gaps = t2["measured"] / t2["predicted"] - 1
    claims = sc.load_claims().set_index("id")
    value = claims.loc["lev-t2-prediction", "paper_value"]
    assert rulekit.paper_range(claims.loc["lev-t2-prediction"]) == (round(float(gaps.median()), 2),) * 2
    low, high = (float(x.replace("−", "-")) for x in re.search(r"rows (\S+) to (\S+)\)", value).groups())
    assert (low, high) == (round(float(gaps.min()), 2), round(float(gaps.max()), 2))


def test_the_scorecard_is_split_into_short_files_and_every_name_imported_from_it_is_there():
    """Registry, verdicts, tables, rule helpers and rules live in their own files, each under 600 lines; every name
    that the package or a notebook imports from specrepro.record.scorecard is importable from it."""
    import importlib

    from specrepro.record.history import SCORECARD_MODULES

    for name in SCORECARD_MODULES:
        path = Path(importlib.import_module(name).__file__)
        assert len(path.read_text().splitlines()) < 600, path.name
    imported = set()
    for path in [*(ROOT / "specrepro").rglob("*.py"), *(ROOT / "notebooks").glob("*.ipynb")]:
        codes = [path.read_text()] if path.suffix == ".py" else [
            "".join(line for line in cell["source"] if not line.startswith(("%", "!")))
            for cell in json.loads(path.read_text())["cells"] if cell["cell_type"] == "code"]
        imported |= {alias.name for code in codes for node in ast.walk(ast.parse(code))
                     if isinstance(node, ast.ImportFrom) and node.module == "specrepro.record.scorecard"
                     for alias in node.names}
    assert {"load_claims", "rules_table", "score", "EXACT"} <= imported
    assert not [n for n in imported if not hasattr(sc, n)]
    assert {fn.__module__ for fn in sc.RULES.values()} == {"specrepro.record.rules_asserted",
                                                           "specrepro.record.rules_measured",
                                                           "specrepro.record.rules_trends"}


# ------------------------------------------------------------------------------------------- the claims registry


def test_every_claim_is_registered_as_it_is_judged_today():
    """Each claim's rule, parameters, paper number and kind and its rule's statistic equal its latest registration
    in data/claims_registry.csv: a change to how a claim is judged must be registered (python -m
    specrepro.record.registry), stamped with its commit and date."""
    from specrepro.record import registry

    assert set(registry.STATISTICS) == set(sc.RULES)
    stale = registry.pending()
    assert stale.empty, f"register: python -m specrepro.record.registry ({list(stale['id'])})"
    reg = registry.load_registry()
    assert reg["registered_date"].str.fullmatch(r"\d{4}-\d{2}-\d{2}").all()
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True,
                             text=True).stdout.strip() == "true"
    for commit in sorted(set(reg["registered_commit"])):
        ok = subprocess.run(["git", "merge-base", "--is-ancestor", commit, "HEAD"], cwd=ROOT, capture_output=True)
        if ok.returncode != 0 and shallow:
            pytest.skip("a shallow clone: the registration commits are not all here")
        assert ok.returncode == 0, f"registered_commit {commit} is not a commit of this history"


def test_the_registry_only_grows():
    """Every committed state of data/claims_registry.csv is a prefix of today's: rows are appended, never edited or
    removed; a column added later (at the end) is empty in every row written before it."""
    import csv
    import io

    def rows(text):
        return list(csv.reader(io.StringIO(text)))

    today = rows((ROOT / "data" / "claims_registry.csv").read_text())
    log = subprocess.run(["git", "log", "--format=%H", "--", "data/claims_registry.csv"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    for commit in log:
        then = rows(subprocess.run(["git", "show", f"{commit}:data/claims_registry.csv"], cwd=ROOT,
                                   capture_output=True, text=True, check=True).stdout)
        width = len(then[0])
        assert today[0][:width] == then[0], f"data/claims_registry.csv at {commit[:12]}: columns changed"
        for old, new in zip(then[1:], today[1:len(then)]):
            assert new[:width] == old and not any(new[width:]), (
                f"data/claims_registry.csv at {commit[:12]}: a row was edited ({old} -> {new})")


def test_a_change_to_a_rule_s_code_is_a_new_registration(monkeypatch):
    """The registry's rule_version is a fingerprint of the rule's code: changing what a rule computes (here one of the
    verdict clauses every interval rule reaches) leaves every claim judged by it pending registration."""
    from specrepro.record import history, registry, verdicts

    assert registry.pending().empty
    by_rule = sc.load_claims().groupby("rule")["id"].apply(set).to_dict()
    changed = tuple(verdicts.Clause(c.verdict, c.text + " (edited)", c.holds) for c in verdicts.INTERVAL_CLAUSES)
    for mod in (verdicts, *(m for m in map(__import__("sys").modules.get, history.RULE_MODULES) if m is not None)):
        if getattr(mod, "INTERVAL_CLAUSES", None) is not None:
            monkeypatch.setattr(mod, "INTERVAL_CLAUSES", changed)
    stale = set(registry.pending()["id"])
    reaching = {r for r in by_rule if "INTERVAL_CLAUSES" in history.rule_source(r)}
    assert reaching and stale == set().union(*(by_rule[r] for r in reaching))


def test_register_appends_only_what_changed_and_keeps_every_earlier_row(tmp_path):
    from specrepro.record import registry

    path = tmp_path / "reg.csv"
    first = registry.register(path, commit="c1", date="2026-01-01")
    assert len(first) == len(sc.load_claims()) and (first["registered_commit"] == "c1").all()
    assert registry.register(path, commit="c2", date="2026-01-02").empty
    # a registration that differs from today's claim (an older way of judging it): the claim is registered again
    reg = registry.load_registry(path)
    reg.loc[len(reg)] = {**reg.iloc[0].to_dict(), "params": "an older parameter", "registered_commit": "c0"}
    reg.to_csv(path, index=False)
    before = path.read_text()
    again = registry.register(path, commit="c3", date="2026-01-03")
    assert list(again["id"]) == [reg.iloc[0]["id"]] and path.read_text().startswith(before)
    assert registry.load_registry(path).iloc[-1]["registered_commit"] == "c3"


def test_a_registry_written_before_a_column_existed_gains_it_and_a_foreign_one_is_refused(tmp_path):
    """A registry whose header is a beginning of today's columns gets the new columns, empty in its earlier rows,
    before rows are appended (so it stays readable); one with other columns is refused, not appended to."""
    from specrepro.record import registry

    path = tmp_path / "reg.csv"
    registry.register(path, commit="c1", date="2026-01-01")
    old = registry.load_registry(path).drop(columns="rule_version")
    old.to_csv(path, index=False)
    again = registry.register(path, commit="c2", date="2026-01-02")  # every claim: its rule version is new
    reg = registry.load_registry(path)
    assert len(again) == len(old) and len(reg) == 2 * len(old) and list(reg.columns) == registry.REGISTRY_COLUMNS
    assert (reg["rule_version"].iloc[:len(old)] == "").all() and reg["rule_version"].iloc[len(old):].astype(bool).all()
    foreign = tmp_path / "foreign.csv"
    foreign.write_text("id,rule,foo\nx,y,z\n")
    with pytest.raises(ValueError, match="not a beginning"):
        registry.register(foreign, commit="c3", date="2026-01-03")
    assert foreign.read_text() == "id,rule,foo\nx,y,z\n"


def test_every_rule_names_how_its_interval_is_computed():
    """The card names each row's interval method (a referee recomputing it needs the method, not only the level);
    a rule whose reading is a test or an exact comparison names none."""
    assert set(sc.RULE_INTERVALS) == set(sc.RULES)
    card = sc.score("standard", tables=sc.Tables("standard", dirs=[record_dir("results")]))
    with_ci = card[card["ours_lo"].notna()]
    assert len(with_ci) > 10 and with_ci["interval"].astype(bool).all()
    assert (card.loc[card["rule"] == "grows_linearly", "interval"].str.contains("t-interval")).all()


def test_a_rule_changed_after_its_data_shows_the_verdict_it_replaced():
    """Where a claim's rule changed after it had judged a table and the verdict changed with it, the card shows the
    earlier rule's last verdict beside today's (medusa2: not reproduced under paired_ratio, then not testable here
    under needs_precondition); a change of data alone under the same rule is not such a note."""
    hist = pd.DataFrame([
        {"commit": "a1", "claim": "m", "rule": "paired_ratio", "params": "p", "verdict": NOT_REPRODUCED,
         "ours": "0.92× [0.88, 0.97], n = 10 prompts"},
        {"commit": "b2", "claim": "m", "rule": "needs_precondition", "params": "p", "verdict": NOT_TESTABLE,
         "ours": "precondition 0.83×; not judged: 0.92×"},
        {"commit": "a1", "claim": "d", "rule": "paired_ratio", "params": "p", "verdict": INCONCLUSIVE, "ours": "x"},
        {"commit": "b2", "claim": "d", "rule": "paired_ratio", "params": "p; margin=10%", "verdict": TREND, "ours": "y"},
    ])
    claims = pd.DataFrame([{"id": "m", "rule": "needs_precondition", "params": "p"},
                           {"id": "d", "rule": "paired_ratio", "params": "p; margin=10%"}])
    notes = sc.earlier_rule_notes(Tables("synthetic", {"verdict_history": hist}), claims)
    assert notes == {"m": "under its earlier rule paired_ratio (read at a1): not reproduced, 0.92× [0.88, 0.97], "
                          "n = 10 prompts"}
    card = sc.score("standard", tables=sc.Tables("standard", dirs=[record_dir("results")]))
    assert "under its earlier rule paired_ratio" in card.set_index("id").loc["medusa2-speedup", "stability"]
