"""The scorecard's rules (:data:`specrepro.record.rulekit.RULES`, each docstring states its rule) for a number the
paper measured or computed: paired ratios (speedups), rates, the gap to a prediction and quality within a margin,
judged by :data:`specrepro.record.verdicts.INTERVAL_CLAUSES` or :data:`~specrepro.record.verdicts.MARGIN_CLAUSES`, and
a closed form evaluated at our inputs ("computed"). Directions: :mod:`~specrepro.record.rules_trends`; asserted
properties: :mod:`~specrepro.record.rules_asserted`."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from specrepro.measure.harness import draft_of_method, in_run_cost_coefficient, paired_ratios
from specrepro.record.rulekit import (as_array, best_of, claim_rows, claim_table, explain_gap, matching_methods,
                                      paper_range, param_float, param_names, params_of, rule)
from specrepro.record.tables import Tables
from specrepro.record.verdicts import (COMPUTED, EXACT, INCONCLUSIVE, NOT_REPRODUCED, NOT_TESTABLE, NotRun, Outcome,
                                       fmt_ci, fmt_margin, has_ci, is_beyond, judge_margin, judge_reading,
                                       margin_bounds, meets_range, parse_margin, prompt_unit)
from specrepro.stats import spearman, stat_ci
from specrepro.theory import expected_tokens, walltime_improvement

__all__ = ["paired_ratio", "needs_precondition", "computed_speedup", "value_in_interval", "close_to_prediction",
           "quality_unchanged"]


@rule("select", "method", "baseline", "value", "null", "summary", "beside", "margin")
def paired_ratio(claim, tables: Tables) -> Outcome:
    """For a measured ratio (a speedup over AR, tree over chain, MSS over naive sampling). Per prompt, the method's
    ``value`` (default tokens_per_s) over the baseline's on the same prompt (and repeat), from
    :func:`specrepro.measure.harness.paired_ratios`; our number is the median over prompts with its 95% sign-test
    interval, judged by :data:`INTERVAL_CLAUSES` with the null ``null`` (default 1) and the paper's side above it.
    Reproduced exactly if the whole interval lies within the paper's value (or range) ± the claim's registered
    ``margin`` (``10%``: relative; an equivalence test) and above the null; trend reproduced if the interval lies above
    the null only (the reason says whether the effect is smaller or larger than the paper's by more than the margin);
    not reproduced if it lies below; inconclusive if it contains the null, or if the table is summary-only (no
    ``prompt`` column: one pooled row per method, so no interval; ``summary`` names the pooled ratio column shown
    instead). ``beside`` (a method query) names extensions of ours shown after the verdict's number with their own
    paired ratio and interval, never judged: the verdict uses the configuration closest to the paper's (e.g. a draft
    model in its own dtype), the int8 draft and other extensions stand beside it.

    Params: ``select`` (rows of the table, e.g. one temperature), ``method`` / ``baseline`` (queries choosing the method
    rows and the one baseline method). Several methods are allowed only if the claim says "best of N": then the one with
    the highest median is reported with its own interval."""
    p = params_of(claim)
    df = claim_rows(claim, tables, p)
    value = p.get("value") or "tokens_per_s"
    null = param_float(p, "null", 1.0)
    paper = paper_range(claim)
    if "prompt" not in df.columns:
        cands = matching_methods(df, p.get("method", ""), "method")
        best_of(claim, len(cands))
        col = p.get("summary") or value
        rows = df[df["method"].astype(str).isin(cands)]
        i = int(np.nanargmax(as_array(rows[col])))
        est = float(as_array(rows[col])[i])
        n = int(rows["runs"].iloc[i]) if "runs" in rows else None
        name = str(rows["method"].iloc[i])
        return Outcome(INCONCLUSIVE, f"{est:.2f}× ({name}), pooled, no interval" + (f" (n = {n} prompts)" if n else ""),
                       est, f"{param_names(claim['our_table'])[0]} is summary-only (one pooled row per method, no "
                       f"per-prompt rows): no interval can be computed; its notebook must save per-prompt runs", n=n)
    bases = matching_methods(df, p.get("baseline", ""), "baseline")
    if len(bases) != 1:
        raise ValueError(f"claim {claim['id']}: the baseline query matches {bases}, not one method")

    def beside() -> str:
        text = ""
        for m in matching_methods(df, p["beside"], "beside") if p.get("beside") else []:
            b_est, b_lo, b_hi, b_n = stat_ci(paired_ratios(df, m, bases[0], value).to_numpy())
            text += f"; beside, not judged: {m} {fmt_ci(b_est, b_lo, b_hi, b_n, prompt_unit(df), suffix='×')}"
        return text

    try:
        cands = matching_methods(df, p.get("method", ""), "method")
    except NotRun as e:  # the judged configuration is not in the table: say so, and still show what stands beside it
        raise NotRun(f"{e} in the committed {param_names(claim['our_table'])[0]}: the table predates the method; rerun "
                     f"its make rule", ours=beside().removeprefix("; ")) from None
    note = best_of(claim, len(cands))
    results = []
    for m in cands:
        r = paired_ratios(df, m, bases[0], value)
        results.append((m, *stat_ci(r.to_numpy())))
    name, est, lo, hi, n = max(results, key=lambda t: t[1])
    verdict, why = judge_reading(lo, hi, paper, null, +1, f"{name} over {bases[0]}", parse_margin(p.get("margin")))
    text = fmt_ci(est, lo, hi, n, prompt_unit(df), suffix="×") + (
        f"; best of {len(cands)}: {name}" if len(cands) > 1 else f" ({name} / {bases[0]})")
    text += beside()
    if verdict != EXACT:
        expl = explain_gap(df[df["method"].astype(str) == name], df[df["method"].astype(str) == bases[0]], tables,
                        param_names(claim["our_table"])[0])
        why = why + (f"; {expl}" if expl else "")
    why = "; ".join(s for s in (why, note) if s)
    return Outcome(verdict, text, est, why, lo, hi, n)


@rule("select", "method", "baseline", "value", "null", "summary", "beside", "requires", "requires_baseline", "margin")
def needs_precondition(claim, tables: Tables) -> Outcome:
    """For a claim whose regime needs a precondition that our own runs must show first (Medusa-2 fine-tunes a backbone
    that Medusa-1 heads already speed up): the precondition is the paired ratio of ``requires`` over
    ``requires_baseline`` (queries on the same table, :func:`specrepro.measure.harness.paired_ratios`, median over
    prompts with a 95% sign-test interval), and it holds if the interval lies above ``null`` (default 1). If it holds,
    the claim is judged exactly as :func:`paired_ratio` judges it; if not, "not testable here": the reason gives the
    precondition's reading, and the claim's own paired ratio is shown beside, never judged."""
    p = params_of(claim)
    df = claim_rows(claim, tables, p)
    (req,) = matching_methods(df, p.get("requires", ""), "requires")
    (req_base,) = matching_methods(df, p.get("requires_baseline", ""), "requires_baseline")
    est, lo, hi, n = stat_ci(paired_ratios(df, req, req_base, p.get("value") or "tokens_per_s").to_numpy())
    out = paired_ratio(claim, tables)
    null = param_float(p, "null", 1.0)
    if is_beyond(lo, hi, null, +1):
        return out
    pre = fmt_ci(est, lo, hi, n, prompt_unit(df), suffix="×")
    return Outcome(NOT_TESTABLE, f"precondition {req} / {req_base} {pre}; not judged: {out.ours}", None, f"needs {req} "
                   f"to speed up {req_base} first; here {req} / {req_base} = {pre}, not above {null:g}", n=out.n)


@rule("select", "method", "baseline", "c", "tolerance")
def computed_speedup(claim, tables: Tables) -> Outcome:
    """For a speedup the paper computed from α (Leviathan Thm 3.8 with its c), not measured: always "computed"
    (:data:`OTHER_DEFINITIONS`), never a reproduction. Ours, computed the same way: per prompt, the walltime improvement
    (1 − α^(γ+1)) / ((1 − α)(γc + 1)) at that prompt's measured α, γ and the paper's ``c`` (default 0), averaged over
    the prompt's timed passes; median over prompts with its 95% sign-test interval. The reason says whether the paper's
    number lies inside that interval (or within the relative ``tolerance``, default 10%, of our median), i.e. whether
    our α gives the paper's computed number. Our measured speedup of the same runs (paired per-prompt ratio over
    ``baseline``, with its interval) is reported beside it, not judged: the paper measured nothing here."""
    p = params_of(claim)
    df = claim_rows(claim, tables, p)
    (name,) = matching_methods(df, p.get("method", ""), "method")
    rows = df[df["method"].astype(str) == name]
    c = param_float(p, "c", 0.0)
    predicted = walltime_improvement(np.clip(as_array(rows["alpha"]), 0, 0.999999), as_array(rows["gamma"]), c)
    # repeated passes of a prompt are one unit: average them per prompt first, so they do not narrow the interval
    predicted = pd.Series(np.asarray(predicted, dtype=float), index=rows["prompt"].to_numpy()).groupby(level=0).mean()
    est, lo, hi, n = stat_ci(predicted.to_numpy())
    paper = paper_range(claim)[0]
    tol = param_float(p, "tolerance", 0.10)
    text = ("computed " + fmt_ci(est, lo, hi, n, prompt_unit(rows), suffix="×")
            + f" (α = {np.nanmean(as_array(rows['alpha'])):.2f}, c = {c:g})")
    measured = ""
    if p.get("baseline"):
        (base,) = matching_methods(df, p["baseline"], "baseline")
        m_est, m_lo, m_hi, m_n = stat_ci(paired_ratios(df, name, base).to_numpy())
        measured = "; measured beside, not judged: " + fmt_ci(m_est, m_lo, m_hi, m_n, prompt_unit(df), suffix="×")
    agree = meets_range(lo, hi, (paper, paper)) or abs(est / paper - 1) <= tol
    why = (f"a closed form at our measured α, not a measurement: the paper's {paper:g} "
           + ("lies within our computed interval or tolerance" if agree else
              f"is {abs(est / paper - 1):.0%} from our computed {est:.2f}× (tolerance {tol:.0%}): our α differs"))
    return Outcome(COMPUTED, text + measured, est, why, lo, hi, n)


@rule("select", "value", "null", "margin")
def value_in_interval(claim, tables: Tables) -> Outcome:
    """For a measured rate (an acceptance rate α). Per prompt the ``value`` column (one row per prompt); our number is
    the mean over prompts with its 95% BCa bootstrap interval (:data:`INTERVAL_CLAUSES`). Reproduced exactly if the
    whole interval lies within the paper's value ± the registered ``margin`` and above the ``null`` (default 0.5: "most
    of the time"); trend reproduced if it lies above the null only; not reproduced if below; inconclusive if it contains
    the null."""
    p = params_of(claim)
    df = claim_rows(claim, tables, p)
    est, lo, hi, n = stat_ci(as_array(df[p["value"]]), np.mean)
    positions = int(as_array(df["positions"]).sum()) if "positions" in df else None
    verdict, why = judge_reading(lo, hi, paper_range(claim), param_float(p, "null", 0.5), +1, p["value"],
                                 parse_margin(p.get("margin")))
    text = fmt_ci(est, lo, hi, n, "prompts") + (f", {positions} positions" if positions else "")
    return Outcome(verdict, text, est, why, lo, hi, n)


def measured_and_predicted(claim, tables: Tables, p: dict) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, str]:
    """The rows :func:`close_to_prediction` compares, their measured and predicted values, and a note on c."""
    df = claim_rows(claim, tables, p)
    rows = df.query(p["method"], engine="python") if p.get("method") else df
    if rows.empty:
        raise NotRun("no rows to compare with the prediction")
    alpha = np.clip(as_array(rows["alpha"]), 0, 0.999999)
    gamma = as_array(rows["gamma"])
    if p["measured"] == "tokens_per_step":
        return rows, as_array(rows["tokens_per_step"]), np.asarray(expected_tokens(alpha, gamma), dtype=float), ""
    if p["measured"] != "speedup":
        raise ValueError(f"claim {claim['id']}: measured must be tokens_per_step or speedup, not {p['measured']!r}")
    summary = claim_table(claim, tables, 1)
    key = ["method", "temperature"] if "temperature" in summary else ["method"]
    c_summary = rows[key].merge(summary[key + ["c"]].drop_duplicates(key), on=key, how="left")["c"]
    c_source = p.get("c", "summary")
    if c_source == "in_run":
        baseline = df.loc[pd.to_numeric(df["gamma"], errors="coerce") == 0, "method"]
        if baseline.empty:
            raise NotRun(f"no AR runs (gamma 0) in {param_names(claim['our_table'])[0]} to measure c against")
        by_draft = in_run_cost_coefficient(df, baseline=str(baseline.iloc[0])).set_index("draft")
        drafts = rows["method"].map(draft_of_method)
        c = drafts.map(by_draft["c"]).to_numpy(dtype=float)
        if not np.isfinite(c).all():
            raise NotRun(f"no γ sweep in {param_names(claim['our_table'])[0]} to measure c in the runs for "
                         f"{sorted(set(drafts[~np.isfinite(c)]))}")
        shown = by_draft.loc[list(dict.fromkeys(drafts))]
        c_note = "; c in the runs " + ", ".join(
            f"{d} {r.c:.2f} [{r.c_lo:.2f}, {r.c_hi:.2f}]" for d, r in shown.iterrows())
        before = c_summary.groupby(drafts.to_numpy()).median()
        if before.notna().any():
            c_note += " (pre-run cost curve: " + ", ".join(f"{before[d]:.2f}" for d in shown.index
                                                           if pd.notna(before.get(d))) + ")"
    elif c_source == "summary":
        c, c_note = c_summary.to_numpy(dtype=float), ""
    else:
        raise ValueError(f"claim {claim['id']}: c must be in_run or summary, not {c_source!r}")
    # the same prompt's AR run at the same temperature and in the same timed pass (repeat)
    key = [k for k in ("temperature", "repeat") if k in df] + ["prompt"]
    ar = df[df["gamma"] == 0].set_index(key)
    idx = pd.MultiIndex.from_frame(rows[key]) if len(key) > 1 else pd.Index(rows["prompt"])
    measured = as_array(rows["tokens_per_s"]) / ar["tokens_per_s"].reindex(idx).to_numpy(dtype=float)
    return rows, measured, np.asarray(walltime_improvement(alpha, gamma, np.nan_to_num(c)), dtype=float), c_note


@rule("select", "method", "measured", "tolerance", "c", "margin")
def close_to_prediction(claim, tables: Tables) -> Outcome:
    """Measured against Leviathan's prediction, row by row (one row per prompt and setting of the first table).
    ``measured`` = tokens_per_step (predicted by Eq. 1 at the row's α and γ) or speedup (the row's tokens/s over the
    same prompt's AR tokens/s at the same temperature and in the same timed pass (``repeat``, where recorded), predicted
    by Thm 3.8 at the row's α, γ and a cost coefficient c). Where c comes from: ``c=in_run`` measures it in the first
    table's own runs (:func:`specrepro.measure.harness.in_run_cost_coefficient`: per draft model, the draft's time per
    drafted token without its prompt prefill over AR's target forward per step, same prompt and pass), so that
    prediction and measurement share one machine state; otherwise (``c=summary``, the default) it is the ``c`` that the
    second table records for the method (notebook 04: from cost curves timed once, before the runs).

    The statistic keeps its sign: per row the gap measured / predicted − 1 (negative: slower than predicted), per prompt
    its median over settings and passes, our number the median over prompts with a 95% sign-test interval. Beside it,
    whether the measurement rises with the prediction: Spearman's ρ over each prompt's rows (at least 3), the mean over
    prompts with a 95% BCa bootstrap interval (prompts are the independent units).

    A formula the paper computed (paper_kind computed): :data:`MARGIN_CLAUSES` with the margin ±``tolerance`` (default
    10%, absorbing that acceptance is not i.i.d. in real text) on the gap's interval. A gap the paper measured
    (paper_value: the paper's own signed gap, e.g. the median over its table's rows): the paper's signed gap is the
    claim's number, and agreement with it is judged two-sided on the gap's own scale by :data:`MARGIN_CLAUSES` around
    the paper's gap ± the registered ``margin`` (absolute): the whole interval within it reads exactly, wholly outside
    it not reproduced, straddling an end inconclusive (so is a claim with no registered margin). Whether the measurement
    rises with the prediction (ρ) is shown beside, never judged."""
    p = params_of(claim)
    rows, measured, predicted, c_note = measured_and_predicted(claim, tables, p)
    gap = measured / predicted - 1
    per_prompt = pd.Series(gap, index=rows["prompt"].to_numpy()).groupby(level=0).median()
    est, lo, hi, n = stat_ci(per_prompt.to_numpy())
    pairs = pd.DataFrame({"prompt": rows["prompt"].to_numpy(), "pred": predicted, "meas": measured})
    rhos = [spearman(g["pred"].to_numpy(), g["meas"].to_numpy())[0] for _, g in pairs.groupby("prompt", sort=False)
            if len(g) >= 3]
    rhos = np.asarray([r for r in rhos if np.isfinite(r)], dtype=float)
    rho, rho_lo, rho_hi, rho_n = stat_ci(rhos, np.mean) if rhos.size else (math.nan, math.nan, math.nan, 0)
    text = (f"median signed gap {fmt_ci(est, lo, hi, n, 'prompts', sign=True)} ({len(gap)} runs)"
            + ("" if math.isnan(rho) else f"; ρ within prompts {fmt_ci(rho, rho_lo, rho_hi, rho_n, 'prompts')}")
            + c_note)
    if claim["paper_kind"] == "computed":
        tol = param_float(p, "tolerance", 0.10)
        verdict = judge_margin(lo, hi, (-tol, tol))
        why = {EXACT: "", NOT_REPRODUCED: f"the gap's interval lies outside ±{tol:.0%}",
               INCONCLUSIVE: f"the gap's interval is not within ±{tol:.0%}"}[verdict]
        return Outcome(verdict, text, est, why, lo, hi, n)
    paper = paper_range(claim)
    margin = parse_margin(p.get("margin"))
    pv = f"{paper[0]:+.2f}" if paper[0] == paper[1] else f"{paper[0]:+.2f} to {paper[1]:+.2f}"
    if margin is None:
        verdict, why = INCONCLUSIVE, f"no equivalence margin is registered around the paper's gap {pv}"
    else:
        b_lo, b_hi = margin_bounds(paper, margin)
        verdict = judge_margin(lo, hi, (b_lo, b_hi))
        band = f"the paper's gap {pv} {fmt_margin(margin)} [{b_lo:+.2f}, {b_hi:+.2f}]"
        reach = f"the gap's interval reaches out of {band}" if has_ci(lo, hi) else "no gap interval"
        outside = f"the gap's interval lies wholly outside {band}"
        why = {EXACT: "", NOT_REPRODUCED: outside, INCONCLUSIVE: reach}[verdict]
    if not math.isnan(rho):
        why = "; ".join(s for s in (why, f"ρ beside, not judged: {rho:.2f}") if s)
    return Outcome(verdict, text, est, why, lo, hi, n)


@rule("setting", "method", "baseline", "margin")
def quality_unchanged(claim, tables: Tables) -> Outcome:
    """For "task quality is unchanged under speculative sampling" (:data:`MARGIN_CLAUSES`, the margin ±``margin``,
    default 0.10 = 10 points). Per problem of the completions table (second table; columns setting, method, prompt,
    completion, and ``passed`` when the notebook stored per-problem results), the paired difference passed(method) −
    passed(baseline): 0 where the two completions are token-identical (same text, hence the same pass/fail), else from
    ``passed``. Our number is the mean difference (pass@1 points) with its 95% BCa bootstrap interval over problems.
    Where every completion is token-identical there is no difference to resample: the interval is then ± the
    Clopper-Pearson upper bound of the share of problems whose pass/fail differs (0 of n), which narrows as n grows (a
    fixed [0, 0] would say the same at any n). Reproduced exactly ("quality unchanged") if the interval lies within the
    margin; not reproduced if it lies wholly outside (quality changed); inconclusive otherwise, and when completions
    differ but the table has no per-problem ``passed`` column (then no paired interval can be computed; the pooled
    pass@1 of the first table is shown)."""
    p = params_of(claim)
    setting, method, base = p["setting"], p["method"], p.get("baseline") or "ar"
    margin = param_float(p, "margin", 0.10)
    comp = claim_table(claim, tables, 1)
    comp = comp[comp["setting"] == setting]
    a = comp[comp["method"] == method].set_index("prompt")
    b = comp[comp["method"] == base].set_index("prompt")
    if a.empty or b.empty:
        raise NotRun(f"no {setting} completions for {method} and {base}")
    common = a.index.intersection(b.index)
    same = (a.loc[common, "completion"].fillna("") == b.loc[common, "completion"].fillna("")).to_numpy()
    summary = claim_table(claim, tables, 0)
    pooled = summary[summary["setting"] == setting].set_index("method")["pass@1"] if "pass@1" in summary else None
    pooled_text = (f"pass@1 {base} {float(pooled[base]):.0%} vs {method} {float(pooled[method]):.0%}"
                   if pooled is not None and {base, method} <= set(pooled.index) else "")
    if "passed" in comp.columns:
        diff = as_array(a.loc[common, "passed"]) - as_array(b.loc[common, "passed"])
    elif same.all():
        diff = np.zeros(len(common))
    else:
        return Outcome(judge_margin(None, None, (-margin, margin)), f"{pooled_text} (n = {len(common)} problems, "
                       f"{int(same.sum())} identical completions), no paired interval", None, "per-problem pass/fail "
                       f"is not stored ({param_names(claim['our_table'])[1]} has no 'passed' column) and "
                       f"{int((~same).sum())} completions differ: no paired interval can be computed", n=len(common))
    if same.all():  # nothing to resample: bound the share of problems whose pass/fail could differ (none did)
        from scipy.stats import binomtest

        n = len(common)
        u = float(binomtest(0, n).proportion_ci(0.95, method="exact").high)
        est, lo, hi = 0.0, -u, u
    else:
        est, lo, hi, n = stat_ci(diff, np.mean)
    text = (f"Δ pass@1 = {est * 100:+.0f} points [{lo * 100:+.0f}, {hi * 100:+.0f}], n = {n} problems"
            if has_ci(lo, hi) else f"Δ pass@1 = {est * 100:+.0f} points, no interval (n = {n})")
    if same.all():
        text += ", every completion token-identical"
    if pooled_text:
        text += f" ({pooled_text})"
    verdict = judge_margin(lo, hi, (-margin, margin))
    why = {EXACT: "", NOT_REPRODUCED: f"the interval lies outside ±{margin * 100:.0f} points: quality changed",
           INCONCLUSIVE: f"the interval is not within ±{margin * 100:.0f} points"}[verdict]
    return Outcome(verdict, text, est, why, lo, hi, n)
