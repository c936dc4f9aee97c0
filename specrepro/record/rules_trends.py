"""The scorecard's rules (:data:`specrepro.record.rulekit.RULES`, each docstring states its rule) for a direction the
paper states (an ordering, a rise or fall with x, a plateau), judged by
:data:`specrepro.record.verdicts.INTERVAL_CLAUSES` with the paper's number where it gives one. Measured numbers:
:mod:`~specrepro.record.rules_measured`; asserted properties: :mod:`~specrepro.record.rules_asserted`."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from specrepro.measure.harness import paired_ratios
from specrepro.record.rulekit import param_float, param_names, as_array, paper_range, claim_rows, params_of, rule
from specrepro.record.tables import Tables
from specrepro.record.verdicts import (EXACT, INCONCLUSIVE, NOT_REPRODUCED, TREND, NotRun, Outcome, all_of, fmt_ci,
                                       fmt_margin, has_ci, judge_interval, judge_reading, parse_margin, prompt_unit,
                                       within_margin)
from specrepro.stats import spearman, spearman_interval, stat_ci

__all__ = ["row_order", "increases", "decreases", "grows_linearly", "speedup_peaks", "falls_with_head"]


@rule("select", "key", "lower", "higher", "value", "cells")
def row_order(claim, tables: Tables) -> Outcome:
    """For a measured ordering (row ``lower`` below row ``higher`` in every setting), a direction without a number
    (:data:`INTERVAL_CLAUSES`, null 0): per prompt and setting (the ``cells`` columns, e.g. workload and temperature),
    the paired difference value(higher) − value(lower); per setting, its mean over prompts with a 95% BCa bootstrap
    interval. Trend reproduced if every setting's interval lies above 0; not reproduced if any lies below 0;
    inconclusive otherwise. No exact verdict: the papers' numbers come from other models, tokenizers and corpora, so
    only the direction is judged."""
    p = params_of(claim)
    df = claim_rows(claim, tables, p)
    key, value = p["key"], p["value"]
    cells = [c.strip() for c in p.get("cells", "").split(",") if c.strip()]
    parts, verdicts, los = [], {}, []
    n_min = None
    for cell, d in (df.groupby(cells, sort=True) if cells else [((), df)]):
        wide = d.pivot_table(index="prompt", columns=key, values=value, aggfunc="mean")
        if p["lower"] not in wide or p["higher"] not in wide:
            raise NotRun(f"rows {p['lower']!r} and {p['higher']!r} not both measured")
        est, lo, hi, n = stat_ci((wide[p["higher"]] - wide[p["lower"]]).to_numpy(), np.mean)
        n_min = n if n_min is None else min(n_min, n)
        label = " ".join(str(x) for x in (cell if isinstance(cell, tuple) else (cell,)))
        parts.append(f"{label}: {fmt_ci(est, lo, hi, n, 'prompts', digits=3)}")
        los.append(lo)
        verdicts[label] = judge_reading(lo, hi, None, 0.0, +1, label)[0]
    text = f"{p['higher']} − {p['lower']} {value}: " + "; ".join(parts)
    verdict = all_of(verdicts.values())
    where = ", ".join(k for k, v in verdicts.items() if v == verdict)
    why = {NOT_REPRODUCED: f"{p['higher']} is below {p['lower']} in {where}",
           INCONCLUSIVE: f"the interval contains 0 (or cannot be computed) in {where}",
           TREND: "direction only: other models, tokenizers and corpora than the paper's"}[verdict]
    return Outcome(verdict, text, float(min(los)) if verdict == TREND else None, why, n=n_min)


def monotone(claim, tables: Tables, sign: int) -> Outcome:
    p = params_of(claim)
    df = claim_rows(claim, tables, p)
    x_col, y_col = p["x"], p["y"]
    groups = list(df.groupby(p["series"], sort=False)) if p.get("series") else [(y_col, df)]
    texts, verdicts, stats_, n_all = [], {}, [], None
    paper_change = series_numbers(claim, p.get("paper_change", ""))
    for label, d in groups:
        if d[x_col].nunique() < 3:
            raise NotRun(f"fewer than 3 values of {x_col}")
        xs = np.sort(d[x_col].unique())
        if "prompt" in d.columns:  # per-prompt rows: paired difference y(last x) − y(first x) per prompt
            wide = d.pivot_table(index="prompt", columns=x_col, values=y_col, aggfunc="mean")
            est, lo, hi, n = stat_ci((wide[xs[-1]] - wide[xs[0]]).to_numpy(), np.mean)
            target = paper_change.get(str(label))
            texts.append(f"{label}: {y_col} at {x_col} = {xs[-1]:g} minus at {xs[0]:g}: "
                         + fmt_ci(est, lo, hi, n, "prompts", sign=True)
                         + (f" (paper {target:+.2f})" if target is not None else ""))
            verdicts[str(label)] = judge_reading(lo, hi, None if target is None else (target, target), 0.0, sign,
                                                 str(label), parse_margin(p.get("margin")))
        else:  # summary points: Spearman's test over the x values (a direction, no interval of the change)
            d = d.sort_values(x_col)
            ys = as_array(d[y_col])
            est, pval = spearman(as_array(d[x_col]), ys)
            n = len(d)
            r_lo, r_hi = spearman_interval(est, n)
            texts.append(f"{label}: {ys[0]:.2f} → {ys[-1]:.2f}"
                         + ("" if math.isnan(est) else f" (ρ = {est:.2f} [{r_lo:.2f}, {r_hi:.2f}], p = {pval:.2g}, "
                                                       f"n = {n} points)"))
            verdicts[str(label)] = judge_reading(r_lo, r_hi, None, 0.0, sign, str(label))
        n_all = n if n_all is None else min(n_all, n)
        stats_.append(est)
    verdict = all_of(v for v, _ in verdicts.values())
    why = "; ".join(f"{k}: {r}" for k, (v, r) in verdicts.items() if v == verdict and r)
    return Outcome(verdict, "; ".join(texts), float(np.mean(stats_)) if verdict in (EXACT, TREND) else None, why,
                   n=n_all)


def series_numbers(claim, text: str) -> dict[str, float]:
    """``"greedy:0.48,stochastic:0.59"`` -> {"greedy": 0.48, "stochastic": 0.59} (the ``paper_change`` parameter);
    raises ValueError if an item is not ``series:number``."""
    out = {}
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        name, sep, value = item.rpartition(":")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise ValueError(f"claim {claim['id']}: paper_change item {item!r} is not series:number")
    return out


@rule("select", "x", "y", "series", "paper_change", "margin")
def increases(claim, tables: Tables) -> Outcome:
    """For a measured direction (y rises with x; :data:`INTERVAL_CLAUSES`, null 0). Per-prompt rows: per prompt the
    paired difference y(largest x) − y(smallest x), its mean over prompts with a 95% BCa bootstrap interval, judged
    against the paper's own change where ``paper_change`` gives it (``series:number,...``: the paper's y at the largest
    x minus at the smallest) - reproduced exactly if the whole interval lies within it ± the registered ``margin`` and
    above 0, trend reproduced if it lies above 0 only (or the paper gives no change); summary rows (no ``prompt``
    column): Spearman's ρ over the x values with its 95% interval by Fisher's z, a direction only. Not reproduced if an
    interval lies below 0; inconclusive if one contains 0. Every ``series`` must hold: the claim's verdict is the
    weakest of its series' (not reproduced, then inconclusive, then trend reproduced, then reproduced exactly)."""
    return monotone(claim, tables, +1)


@rule("select", "x", "y", "series", "paper_change", "margin")
def decreases(claim, tables: Tables) -> Outcome:
    """As :func:`increases` with the direction reversed: the paper's side of the null 0 is below it (y falls with x);
    reproduced exactly if the interval lies below 0 and within the paper's (negative) change ± its ``margin``, trend
    reproduced if below 0 only, not reproduced if above 0, inconclusive if it contains 0; the weakest series decides."""
    return monotone(claim, tables, -1)


@rule("select", "x", "y")
def grows_linearly(claim, tables: Tables) -> Outcome:
    """For a measured "about linear in x" statement without a number (:data:`INTERVAL_CLAUSES`, a direction: the null is
    slope 0, the paper's side above it). Least squares y = a + b·x (scipy.stats.linregress) over the selected rows, with
    the slope's 95% t-interval and r² shown. Trend reproduced if the slope's interval lies above 0; not reproduced if it
    lies below 0; inconclusive if it contains 0. No exact verdict: the paper gives no number. Rows that repeat a timing
    (a ``repeat`` column beside ``prompt``) are averaged per prompt and x first: the prompt is the unit, so repeated
    passes do not narrow the interval."""
    from scipy import stats

    p = params_of(claim)
    df = claim_rows(claim, tables, p)
    if {"prompt", "repeat"} <= set(df.columns) and df["repeat"].nunique() > 1:
        df = (df.assign(**{p["y"]: as_array(df[p["y"]])}).groupby(["prompt", p["x"]], as_index=False)[p["y"]].mean())
    x, y = as_array(df[p["x"]]), as_array(df[p["y"]])
    keep = ~(np.isnan(x) | np.isnan(y))
    x, y = x[keep], y[keep]
    if len(np.unique(x)) < 3:
        raise NotRun(f"fewer than 3 values of {p['x']}")
    fit = stats.linregress(x, y)
    t = stats.t.ppf(0.975, len(x) - 2)
    lo, hi = float(fit.slope - t * fit.stderr), float(fit.slope + t * fit.stderr)
    text = (f"{fit.slope:+.1f} {p['y'].replace('_', ' ')} per unit {p['x']} [{lo:+.1f}, {hi:+.1f}], "
            f"r² = {fit.rvalue ** 2:.2f}, n = {len(x)} points")
    verdict, why = judge_reading(lo, hi, None, 0.0, +1, "the slope")
    return Outcome(verdict, text, float(fit.slope), why, lo, hi, len(x))


def best_k_draws(ratios: pd.DataFrame, seed: int = 0, n_resamples: int = 2000) -> np.ndarray:
    """The best K (the column of ``ratios`` - prompts × K, paired speedups over AR - with the highest median over
    prompts) in each of ``n_resamples`` bootstrap resamples of the prompts (rows sorted by prompt first, so the draw
    does not depend on the table's row order)."""
    rng = np.random.default_rng(seed)
    ratios = ratios.sort_index()
    values, ks = ratios.to_numpy(dtype=float), np.asarray(ratios.columns, dtype=float)
    picks = rng.integers(0, len(values), size=(n_resamples, len(values)))
    return ks[np.nanargmax(np.nanmedian(values[picks], axis=1), axis=1)]


@rule("select", "x", "tolerance", "margin")
def speedup_peaks(claim, tables: Tables) -> Outcome:
    """For "the speedup plateaus or regresses as K grows, optimal at K = k" (paper_value: k; :data:`INTERVAL_CLAUSES` on
    two scales). Needs per-prompt runs (``prompt``, ``method``, ``tokens_per_s`` and the draft length column ``x``; x =
    0 is AR). The statistic: per prompt, the tokens/s at the largest K swept over the tokens/s at the paper's k
    (:func:`specrepro.measure.harness.paired_ratios`), median over prompts with a 95% sign-test interval; its null is 1
    + ``tolerance`` (default 0.05: still a gain past k), the paper's side below it (a plateau or a regression). The
    paper's number k is held if the whole 95% bootstrap interval (over prompts) of our best K (highest median paired
    speedup over AR) lies within k ± the registered ``margin`` (in K; an equivalence test). Reproduced exactly if both;
    trend reproduced if the interval lies below the null only; not reproduced if it lies above it (the speedup still
    grows past k); inconclusive otherwise, and always for a summary-only table (no per-prompt rows: no interval)."""
    p = params_of(claim)
    df = claim_rows(claim, tables, p)
    x = p.get("x") or "K"
    k_paper = int(paper_range(claim)[0])
    tol = param_float(p, "tolerance", 0.05)
    if "prompt" not in df.columns:
        col = "speedup_vs_ar"
        best = df.iloc[int(np.nanargmax(as_array(df[col])))]
        runs = int(best["runs"]) if "runs" in best else None
        return Outcome(INCONCLUSIVE, f"best K = {int(best[x])} ({float(best[col]):.2f}×, pooled), no interval"
                       + (f" (n = {runs} prompts)" if runs else ""), float(best[x]),
                       f"{param_names(claim['our_table'])[0]} is summary-only (one pooled row per K): no per-prompt "
                       f"interval; its notebook must save per-prompt runs", n=runs)
    by_k = df.groupby(x)["method"].first()
    if 0 not in by_k.index or k_paper not in by_k.index:
        raise NotRun(f"the sweep lacks K = 0 (AR) or the paper's K = {k_paper}")
    ks = sorted(k for k in by_k.index if k > 0)
    over_ar = pd.DataFrame({k: paired_ratios(df, by_k[k], by_k[0]) for k in ks}).dropna()
    medians = over_ar.median()
    k_best = int(medians.idxmax())
    draws = best_k_draws(over_ar)
    k_lo, k_hi = float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))
    shares = ", ".join(f"K = {k:g} {int((draws == k).sum())}" for k in ks if (draws == k).any())
    margin = parse_margin(p.get("margin"))
    est, lo, hi, n = stat_ci(paired_ratios(df, by_k[ks[-1]], by_k[k_paper]).to_numpy())
    text = (f"best K = {k_best} [{k_lo:g}, {k_hi:g}] ({medians[k_best]:.2f}× AR; best in {shares} of {len(draws)} "
            f"resamples); K = {ks[-1]} over K = {k_paper}: " + fmt_ci(est, lo, hi, n, prompt_unit(df), suffix="×")
            + f", null {1 + tol:g}")
    verdict = judge_interval(lo, hi, 1 + tol, -1, within_margin(k_lo, k_hi, (k_paper, k_paper), margin))
    band = f"K = {k_paper} {fmt_margin(margin)}" if margin else f"K = {k_paper} (no margin registered)"
    why = {EXACT: "", TREND: f"no gain past K = {k_paper} (K = {ks[-1]} over K = {k_paper} below {1 + tol:g}), but "
                             f"the best K's interval [{k_lo:g}, {k_hi:g}] does not lie within {band}",
           NOT_REPRODUCED: f"the speedup still grows past K = {k_paper}",
           INCONCLUSIVE: "the interval does not tell a plateau from a gain" if has_ci(lo, hi) else
           "no interval (too few prompts: a median's needs 6)"}[verdict]
    return Outcome(verdict, text, float(k_best), why, lo, hi, n)


def diff_of_proportions(h1: int, n1: int, h2: int, n2: int) -> tuple[float, float, float]:
    """p1 − p2 with Newcombe's 95% hybrid score interval (from each proportion's Wilson interval)."""
    from scipy import stats

    a = stats.binomtest(int(h1), int(n1)).proportion_ci(method="wilson")
    b = stats.binomtest(int(h2), int(n2)).proportion_ci(method="wilson")
    p1, p2 = h1 / n1, h2 / n2
    return (p1 - p2, p1 - p2 - math.hypot(p1 - a.low, b.high - p2), p1 - p2 + math.hypot(a.high - p1, p2 - b.low))


@rule("select", "value", "count")
def falls_with_head(claim, tables: Tables) -> Outcome:
    """For "head k's prediction gets worse with k" (an asserted direction without a number; :data:`INTERVAL_CLAUSES`,
    null 0). Rows = heads with the held-out accuracy ``value`` (default top1) over ``count`` positions (default
    positions). The statistic: head 1's accuracy minus the last head's, with Newcombe's 95% interval (the heads are
    scored on nearly the same positions, which the interval treats as independent samples). Trend reproduced if the
    interval lies above 0; not reproduced if below 0; inconclusive if it contains 0. No exact verdict: the paper gives
    no number. Each head's Wilson interval, Fisher's one-sided p and any rise from one head to the next are shown
    beside."""
    from scipy import stats

    p = params_of(claim)
    df = claim_rows(claim, tables, p).sort_values("head")
    acc = as_array(df[p.get("value") or "top1"])
    cnt = as_array(df[p.get("count") or "positions"]).astype(int)
    if len(acc) < 2:
        raise NotRun("fewer than 2 heads")
    hits = np.round(acc * cnt).astype(int)
    p_fall = float(stats.fisher_exact([[hits[0], cnt[0] - hits[0]], [hits[-1], cnt[-1] - hits[-1]]],
                                      alternative="greater").pvalue)
    est, lo, hi = diff_of_proportions(hits[0], cnt[0], hits[-1], cnt[-1])
    cis = [stats.binomtest(int(h), int(c)).proportion_ci(method="wilson") for h, c in zip(hits, cnt)]
    text = ("top-1 " + ", ".join(f"head {int(h)} {a:.2f} [{ci.low:.2f}, {ci.high:.2f}]"
                                 for h, a, ci in zip(df["head"], acc, cis))
            + f"; head 1 − head {int(df['head'].iloc[-1])}: {est:+.2f} [{lo:+.2f}, {hi:+.2f}]"
            + f"; n = {int(cnt.min())}-{int(cnt.max())} positions per head; Fisher p = {p_fall:.1e}")
    rises = [f"head {int(df['head'].iloc[i + 1])} > head {int(df['head'].iloc[i])}"
             for i in range(len(acc) - 1) if acc[i + 1] > acc[i]]
    verdict, why = judge_reading(lo, hi, None, 0.0, +1, "head 1 − the last head")
    if rises:
        why += f"; beside: {', '.join(rises)}"
    return Outcome(verdict, text, float(acc[0]), why, lo, hi, n=int(cnt.min()))
