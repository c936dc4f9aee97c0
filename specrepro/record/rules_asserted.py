"""The scorecard's rules (:data:`specrepro.record.rulekit.RULES`, each docstring states its rule) for asserted
properties and closed forms at the paper's own inputs, judged by :data:`specrepro.record.verdicts.TEST_CLAUSES`, and
for a claim no regime here can test. Measured numbers: :mod:`~specrepro.record.rules_measured`; directions:
:mod:`~specrepro.record.rules_trends`."""

from __future__ import annotations

import numpy as np

from specrepro.record.rulekit import (GOF_LEVEL, as_array, as_truth, claim_rows, decimals_of, paper_range, param_float,
                                      param_names, params_of, rule)
from specrepro.record.tables import Tables
from specrepro.record.verdicts import EXACT, INCONCLUSIVE, NOT_REPRODUCED, NOT_TESTABLE, NotRun, Outcome, judge_test

__all__ = ["EXACT_RULES", "printed_precision", "exact_sampler", "all_identical", "identical_up_to_ties",
           "typical_shifts", "not_testable"]


#: chain rules that are exact (positive rows of notebook 01's tables); every other rule there is a negative control
EXACT_RULES = ("speculative", "block")


@rule("select", "compare", "value")
def printed_precision(claim, tables: Tables) -> Outcome:
    """For numbers the paper computed from a closed form at its own inputs (:data:`TEST_CLAUSES`): the test is whether
    every compared number of ours, rounded to the decimals the paper prints, equals the paper's (tolerance: half a unit
    of the last printed decimal); it compares printed digits, so it can fail. Reproduced exactly if it says yes, not
    reproduced if not (a closed form matches or it does not: no trend, no interval).

    Params: ``compare`` = ``ours=paper, ...`` column pairs compared row by row (the paper's numbers as the notebook
    tabulated them beside ours), or ``value`` = one column compared with ``paper_value``."""
    p = params_of(claim)
    df = claim_rows(claim, tables, p)
    if p.get("compare"):
        pairs = [tuple(s.strip() for s in part.split("=")) for part in p["compare"].split(",")]
        digits = max(decimals_of(" ".join(f"{v}" for v in df[b])) for _, b in pairs)
        ours = np.concatenate([as_array(df[a]) for a, _ in pairs])
        paper = np.concatenate([as_array(df[b]) for _, b in pairs])
    else:
        digits = decimals_of(claim["paper_value"])
        ours = as_array(df[p["value"]])
        paper = np.full(len(ours), paper_range(claim)[0])
    paper = np.round(paper, digits)
    ok = np.abs(ours - paper) <= 0.5 * 10 ** -digits + 1e-9
    if len(ours) == 1:
        text, value = f"{ours[0]:.{digits}f}", float(ours[0])
    else:
        text, value = f"{int(ok.sum())}/{len(ok)} equal at {digits} decimals", None
    verdict = judge_test(ok.all(), can_fail=True)
    if verdict == EXACT:
        return Outcome(verdict, text, value, n=len(ok), unit="numbers")
    worst = int(np.argmax(np.abs(ours - paper)))
    return Outcome(verdict, text, value, f"{(~ok).sum()} of {len(ok)} differ; worst: ours {ours[worst]:.{digits + 2}f} "
                   f"vs paper {paper[worst]:g}", n=len(ok), unit="numbers")


@rule("tolerance")
def exact_sampler(claim, tables: Tables) -> Outcome:
    """For an asserted (proved) exactness statement (:data:`TEST_CLAUSES`). The test says yes if (a) exact enumeration
    puts speculative sampling - and every other exact chain rule the table has (``block``: block verification, Sun
    et al. 2025) - within ``tolerance`` (TV, default 1e-12) of the target in every setting and (b) their chi-square
    goodness-of-fit tests are not rejected at level 1e-3; it can fail if negative controls were run (any other rule) and
    every one is caught by (a) somewhere (TV > 0.01) and rejected by (b). Reproduced exactly if both; not reproduced if
    the test says no; inconclusive if it says yes but a control passes unseen (or none ran). Tables:
    ``exactness_enumeration; exactness_goodness_of_fit`` (notebook 01)."""
    p = params_of(claim)
    enum_name, gof_name = param_names(claim["our_table"])
    enum, gof = tables.get(enum_name), tables.get(gof_name)
    tol = param_float(p, "tolerance", 1e-12)
    worst = enum.groupby("rule")["tv_to_target"].max()
    pvals = gof.set_index("rule")["p_value"].astype(float)
    if "speculative" not in worst or "speculative" not in pvals:
        raise NotRun("no 'speculative' rows")
    exact_rules = [r for r in EXACT_RULES if r in worst.index]
    controls = [r for r in worst.index if r not in EXACT_RULES]
    n_settings = int((enum["rule"] == "speculative").sum())
    n_text = f" (N = {int(gof.set_index('rule').loc['speculative', 'n'])} samples)" if "n" in gof else ""
    text = (f"worst TV {worst[exact_rules].max():.1e} over {n_settings} settings"
            f"{' (' + ' and '.join(exact_rules) + ' verification)' if len(exact_rules) > 1 else ''}; "
            f"χ² p = {', '.join(f'{pvals[r]:.2f}' for r in exact_rules if r in pvals)}{n_text}")
    fails = []
    for r in exact_rules:
        if worst[r] > tol:
            fails.append(f"{r}: enumerated TV {worst[r]:.2e} > {tol:g}")
        if r in pvals and pvals[r] < GOF_LEVEL:
            fails.append(f"{r}: χ² rejects the sampler (p = {pvals[r]:.1e})")
    blind = [r for r in controls if worst[r] <= 0.01 or pvals.get(r, 1.0) >= GOF_LEVEL]
    verdict = judge_test(not fails, can_fail=bool(controls) and not blind)
    why = "; ".join(fails) if fails else (f"negative controls not caught: {', '.join(blind)}" if blind
                                          else "" if controls else "no negative controls were run")
    if controls and not blind:
        text += f"; {len(controls)} negative controls caught"
    return Outcome(verdict, text, float(worst["speculative"]), why, n=n_settings, unit="settings")


@rule("select", "value")
def all_identical(claim, tables: Tables) -> Outcome:
    """For an asserted identity (greedy decoding of a method returns the baseline's greedy tokens; :data:`TEST_CLAUSES`:
    the test compares tokens, so it can fail). Reproduced exactly if every selected run's ``value`` column is true
    (output token-identical to the greedy baseline); not reproduced if any is false (the reason counts them); not run if
    no run recorded the comparison. n counts independent comparisons: greedy decoding repeated over timed passes returns
    the same tokens, so the runs of one (prompt, method) are one comparison."""
    p = params_of(claim)
    df = claim_rows(claim, tables, p)
    same = as_truth(df[p["value"]]).dropna()
    if same.empty:
        raise NotRun(f"no run recorded {p['value']}")
    n_ok = int(same.sum())
    prompts = df.loc[same.index, "prompt"].nunique() if "prompt" in df else None
    keys = [c for c in ("prompt", "method") if c in df]
    units = same.astype(bool).groupby([df.loc[same.index, c] for c in keys]).all() if keys else same.astype(bool)
    text = (f"{int(units.sum())}/{len(units)} comparisons identical ({' × '.join(keys) or 'run'}; {len(same)} runs"
            + (f", {prompts} prompt{'s' if prompts > 1 else ''}" if prompts else "") + ")")
    verdict = judge_test(n_ok == len(same), can_fail=True)
    if verdict == EXACT:
        return Outcome(verdict, text, 1.0, n=len(units), unit="comparisons")
    bad = df.loc[same.index[~same.astype(bool)]]
    who = ", ".join(sorted(set(bad["method"].astype(str)))) if "method" in bad else ""
    return Outcome(verdict, text, float(units.mean()), f"{len(same) - n_ok} runs differ from the baseline"
                   + (f" ({who})" if who else ""), n=len(units), unit="comparisons")


@rule("select", "value", "explained")
def identical_up_to_ties(claim, tables: Tables) -> Outcome:
    """For an asserted identity checked on a whole workload in floating point (one greedy speculative and one greedy AR
    output per prompt; :data:`TEST_CLAUSES`: the test compares tokens, so it can fail). The test says yes if every
    output is token-identical to AR's (``value``) or departs from it only at a near-tie of the target's top-2 logits
    (``explained``: the run's tie bound, fixed by its command before any output exists; batched verification and
    one-token decoding round differently and may break an exact or near tie either way), the reason then counting those
    near-ties: reproduced exactly; not reproduced if any output departs where the target's choice was not a near-tie;
    not run without the table. Our number is the share of prompts with a departure that is not a near-tie, with its 95%
    Clopper-Pearson interval over prompts."""
    from scipy.stats import binomtest

    p = params_of(claim)
    df = claim_rows(claim, tables, p)
    same = as_truth(df[p.get("value") or "identical"])
    tie = as_truth(df[p.get("explained") or "explained"]).fillna(False).astype(bool)
    if same.isna().any():
        raise NotRun(f"{int(same.isna().sum())} prompts lack the comparison")
    same = same.astype(bool)
    n, n_same = len(df), int(same.sum())
    n_tie = int((~same & tie).sum())
    n_bad = n - n_same - n_tie
    ci = binomtest(n_bad, n).proportion_ci(0.95, method="exact")
    text = (f"{n_same}/{n} prompts identical, {n_tie} near-tie departures, {n_bad} other departures "
            f"(share {n_bad / n:.3f} [{ci.low:.3f}, {ci.high:.3f}], n = {n} prompts)")
    verdict = judge_test(n_bad == 0, can_fail=True)
    if verdict != EXACT:
        bad = df.loc[~same & ~tie]
        who = ", ".join(map(str, bad["prompt_id" if "prompt_id" in bad else "prompt"].head(5)))
        return Outcome(verdict, text, n_bad / n, f"{n_bad} outputs depart from AR where the target's top-2 logits "
                       f"were not a near-tie ({who})", lo=ci.low, hi=ci.high, n=n)

    reason = (f"{n_tie} outputs depart from AR, each at a near-tie of the target's top-2 logits (floating-point "
              "rounding, not the algorithm)" if n_tie else "")
    return Outcome(verdict, text, 0.0, reason, lo=ci.low, hi=ci.high, n=n)


@rule("select")
def typical_shifts(claim, tables: Tables) -> Outcome:
    """For the asserted "typical acceptance does not preserve the target's distribution" (:data:`TEST_CLAUSES`). The
    test says yes if the chi-square test rejects typical acceptance (p < 1e-3); it can fail (it is shown to tell the
    cases apart) if it rejects none of the distribution-preserving modes (p ≥ 1e-3). Reproduced exactly if both; not
    reproduced if it does not reject typical acceptance; inconclusive if it rejects a preserving mode too."""
    p = params_of(claim)
    df = claim_rows(claim, tables, p)
    keep = as_truth(df["distribution_preserving"]).astype(bool)
    typ, exact = df[~keep], df[keep]
    if typ.empty or exact.empty:
        raise NotRun("needs typical acceptance and at least one distribution-preserving mode")
    tv_t, tv_e = float(as_array(typ["tv_distance"]).max()), float(as_array(exact["tv_distance"]).max())
    p_t, p_e = float(as_array(typ["gof_p_value"]).max()), float(as_array(exact["gof_p_value"]).min())
    n = int(as_array(df["samples"]).min()) if "samples" in df else None
    text = (f"TV {tv_t:.3f} (typical) vs ≤ {tv_e:.3f} (exact modes); χ² p = {p_t:.1e} vs ≥ {p_e:.2f}"
            + (f", n = {n} samples each" if n else ""))
    verdict = judge_test(p_t < GOF_LEVEL, can_fail=p_e >= GOF_LEVEL)
    why = {EXACT: "", NOT_REPRODUCED: "the χ² test does not reject typical acceptance",
           INCONCLUSIVE: "the χ² test also rejects a distribution-preserving mode"}[verdict]
    return Outcome(verdict, text, tv_t, why, n=n)


@rule()
def not_testable(claim, tables: Tables) -> Outcome:
    """For a statement whose regime nothing here can reach (the claim's ``caveat`` says why, e.g. a multi-GPU serving
    system): always "not testable here", never reproduced, never not reproduced."""
    return Outcome(NOT_TESTABLE, "", None, claim["caveat"] or "no regime here can test this claim")
