"""Where each speedup on the card comes from. Per timed run the decoding time per token (prefill left out) is
``loop_ms / tokens_per_step`` (:func:`specrepro.measure.harness.run_interleaved`), so a method's decode-time speedup
over its baseline is the product of three ratios paired per prompt and pass in the runs the verdict reads
(:func:`specrepro.measure.harness.paired_ratios`): tokens per step, the forward-cost ratio (the baseline's target
forward per step over the method's) and the target forward's share of a step (what the draft and the loop leave);
each a median over prompts with its 95% interval (:func:`specrepro.stats.stat_ci`). No verdict depends on it; the
scorecard's "Where each speedup comes from" (``templates/scorecard.md.j2``) says how to read it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from specrepro.measure.harness import paired_ratios
from specrepro.record.rulekit import (claim_rows, matching_methods, param_names, params_of, step_counts,
                                      tokens_column)
from specrepro.record.tables import Tables
from specrepro.record.verdicts import NotRun, fmt_ci, prompt_unit
from specrepro.stats import stat_ci

__all__ = ["SPEED_RULES", "decompose_claim", "speedup_decomposition"]

#: the rules whose claims are speed ratios of timed runs (with ``value`` tokens_per_s, the default)
SPEED_RULES = ("paired_ratio", "needs_precondition")


def _derived(df: pd.DataFrame) -> pd.DataFrame:
    """Per run: tokens per step, 1 / target forward per step (ms), the target forward's share of a step, and the
    decode rate (tokens per ms of decoding)."""
    steps = step_counts(df)
    target, loop = (pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=float) for c in ("target_ms", "loop_ms"))
    with np.errstate(divide="ignore", invalid="ignore"):  # a run without steps or times has no factors (NaN)
        tps = np.where(steps > 0, np.asarray(df[tokens_column(df)], dtype=float) / steps, np.nan)
        fwd = np.where(target > 0, 1.0 / target, np.nan)
        share = np.where(loop > 0, target / loop, np.nan)
        decode = np.where(loop > 0, tps / loop, np.nan)
    return df.assign(tps=tps, fwd=fwd, share=share, decode=decode)


def decompose_claim(claim, tables: Tables) -> dict | None:
    """The decomposition of one speed claim: its method (the fastest by the median paired ratio where the claim
    names several) over its baseline, each factor (``tps``, ``fwd``, ``share``) and the decode-time speedup
    (``decode``) as ``fmt_ci`` text, and n. None for a claim that is not a speed ratio of timed runs with per-step
    times, or whose rows were not measured in this profile."""
    if claim["rule"] not in SPEED_RULES:
        return None
    p = params_of(claim)
    if (p.get("value") or "tokens_per_s") != "tokens_per_s":
        return None
    try:
        df = claim_rows(claim, tables, p)
    except (NotRun, TypeError, AttributeError):
        return None
    if df is None or not {"prompt", "target_ms", "loop_ms"} <= set(df.columns):
        return None
    try:
        bases = matching_methods(df, p.get("baseline", ""), "baseline")
        cands = matching_methods(df, p.get("method", ""), "method")
    except (NotRun, ValueError):
        return None
    if len(bases) != 1:
        return None
    df = _derived(df)
    name = max(cands, key=lambda m: float(np.median(paired_ratios(df, m, bases[0]).to_numpy())))
    unit = prompt_unit(df)
    out = {"id": claim["id"], "method": name, "baseline": bases[0], "table": param_names(claim["our_table"])[0]}
    for col in ("tps", "fwd", "share", "decode"):
        r = paired_ratios(df, name, bases[0], col).to_numpy()
        r = r[np.isfinite(r)]
        if not len(r):
            return None
        est, lo, hi, n = stat_ci(r)
        out[col] = fmt_ci(est, lo, hi, n, unit, suffix="×" if col == "decode" else "").split(", n = ")[0]
        out["n"] = f"{n} {unit}"
    return out


def speedup_decomposition(claims: pd.DataFrame, tables: Tables) -> list[dict]:
    """:func:`decompose_claim` of every claim that has one, in the claims' order."""
    return [r for _, c in claims.iterrows() if (r := decompose_claim(c, tables)) is not None]
