"""What every scorecard rule shares: the registry (:data:`RULES`, :data:`RULE_PARAMS`, filled by :func:`rule`), a
claim's parameters (:func:`params_of`, :data:`COMMON_PARAMS`) and paper number (:func:`paper_range`), the selection of
its rows (:func:`claim_rows`, :func:`matching_methods`, :func:`best_of`), and :func:`explain_gap` (tokens per target
step, step time and verification cost behind a speed ratio). The rules live in the ``rules_*`` modules, the verdicts'
definitions in :mod:`specrepro.record.verdicts`."""

from __future__ import annotations

import math
import re
from typing import Callable

import numpy as np
import pandas as pd

from specrepro.record.tables import Tables
from specrepro.record.verdicts import NotRun, Outcome

__all__ = ["GOF_LEVEL", "RULES", "RULE_PARAMS", "rule", "COMMON_PARAMS", "params_of"]


#: level of the chi-square goodness-of-fit tests the rules read (exactness, typical acceptance)
GOF_LEVEL = 1e-3

#: rule name -> function(claim, tables) -> Outcome; the docstring of each states its rule
RULES: dict[str, Callable[[pd.Series, Tables], Outcome]] = {}

#: rule name -> the parameter keys its claims may pass in ``params``
RULE_PARAMS: dict[str, tuple[str, ...]] = {}

#: parameters any claim may pass, whatever its rule (read by :func:`score_claim`, not by the rule): ``draft=own dtype``
#: judges a draft model in its own dtype (the configuration closest to the paper's), so a table whose provenance names
#: the draft's int8 copy (``draft`` or ``draft_method`` containing "int8") gives "not run", its reading shown beside
COMMON_PARAMS = {"draft": ("own dtype",)}


def rule(*keys: str):
    """Decorator: register the function in :data:`RULES` and its claims' parameter keys in :data:`RULE_PARAMS`."""
    def register(fn):
        RULES[fn.__name__] = fn
        RULE_PARAMS[fn.__name__] = tuple(keys)
        return fn
    return register


def params_of(claim) -> dict[str, str]:
    """The claim's ``params`` field ``key=value; key=value`` as a dict (values may contain ``=``, not ``;``); raises
    ValueError if an item lacks ``=`` or a key is repeated."""
    out: dict[str, str] = {}
    for item in (s.strip() for s in str(claim["params"]).split(";")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"claim {claim['id']}: params item {item!r} is not key=value")
        if key in out:
            raise ValueError(f"claim {claim['id']}: params key {key!r} repeated")
        out[key] = value.strip()
    return out


def param_names(field: str) -> list[str]:
    return [s.strip() for s in str(field).split(";") if s.strip()]


def param_float(params: dict, key: str, default: float) -> float:
    return float(params[key]) if params.get(key, "") != "" else default


#: a signed number (ASCII or Unicode minus, optional +), maybe with a range's other end ("1.2-1.5", "-0.32 to +0.29")
NUMBER_RANGE = re.compile(r"(?<![\d.])([-+−]?\d+(?:\.\d+)?)(?:\s*(?:-|–|to)\s*([-+−]?\d+(?:\.\d+)?))?")


def paper_range(claim) -> tuple[float, float]:
    """The paper's number ``x`` or range ``lo-hi`` / ``lo to hi`` (the first number(s) of ``paper_value``, signs
    kept) as (lo, hi); raises ValueError if ``paper_value`` has no number."""
    text = claim["paper_value"].replace("×", "")
    m = NUMBER_RANGE.search(text)
    if not m:
        raise ValueError(f"claim {claim['id']}: no number in paper_value {claim['paper_value']!r}")
    lo = float(m.group(1).replace("−", "-"))
    return lo, float(m.group(2).replace("−", "-")) if m.group(2) else lo


def decimals_of(text: str, default: int = 2) -> int:
    """The most decimals of any number printed in ``text``."""
    found = [len(d) for d in re.findall(r"\d\.(\d+)", text)]
    return max(found) if found else default


def claim_table(claim, tables: Tables, index: int = 0) -> pd.DataFrame:
    return tables.get(param_names(claim["our_table"])[index])


def claim_rows(claim, tables: Tables, params: dict, index: int = 0) -> pd.DataFrame:
    """The claim's table (``index``-th of ``our_table``) filtered by the ``select`` query; NotRun if nothing left."""
    df = claim_table(claim, tables, index)
    if params.get("select"):
        df = df.query(params["select"], engine="python")
    if df.empty:
        raise NotRun(f"no rows of {param_names(claim['our_table'])[index]} match the claim's selection"
                     + (f" ({claim['caveat']})" if claim["caveat"] else ""))
    return df


def as_array(series) -> np.ndarray:
    return pd.to_numeric(series, errors="coerce").to_numpy(dtype=float)


def as_truth(series) -> pd.Series:
    """Booleans from a column of True/False/"True"/"False"/NaN; NaN stays NaN (not compared)."""
    def one(v):
        if isinstance(v, (bool, np.bool_)):
            return bool(v)
        if isinstance(v, str) and v.strip().lower() in ("true", "false"):
            return v.strip().lower() == "true"
        if isinstance(v, (int, float, np.number)) and not (isinstance(v, float) and math.isnan(v)):
            return bool(v)
        return np.nan
    return series.map(one)


def step_counts(df: pd.DataFrame) -> np.ndarray:
    tokens = as_array(df[tokens_column(df)])
    if "steps" in df:
        return as_array(df["steps"])
    if "tokens_per_step" in df:
        return tokens / as_array(df["tokens_per_step"])
    return np.full(len(df), np.nan)


def tokens_column(df: pd.DataFrame) -> str:
    return "tokens" if "tokens" in df else "new_tokens"


def bench_cost_ratio(tables: Tables, source: str, n: int) -> tuple[float, str] | None:
    """:func:`cost_ratio` from a bench JSON's own cost model (``config.cost_model.target_ms``, measured in the run that
    timed the claim's methods, on the CPU its config names); None if ``source`` is not such a file."""
    cfg = tables.provenance(source)
    target_ms = (cfg.get("cost_model") or {}).get("target_ms") if isinstance(cfg.get("cost_model"), dict) else None
    if not target_ms:
        return None
    pts = sorted((int(k), float(v)) for k, v in target_ms.items())
    ratio = relative_cost(np.array([k for k, _ in pts], dtype=float), np.array([v for _, v in pts]), n)
    if ratio is None:
        return None
    where = cfg.get("device_description", cfg.get("device", "this device"))
    return ratio, where + (f" [{cfg['cpu']}]" if cfg.get("cpu") else "") + f", this run's cost model"


def relative_cost(ns: np.ndarray, ms: np.ndarray, n: int) -> float | None:
    """t(n) / t(1) on a measured curve (linear interpolation, clamped at its largest n); None without n = 1."""
    if not len(ns) or ns.min() > 1:
        return None
    return float(np.interp(min(n, ns.max()), ns, ms)) / float(np.interp(1, ns, ms))


def cost_ratio(tables: Tables, n: int, source: str | None = None) -> tuple[float, str] | None:
    """Measured cost of one target forward over ``n`` new tokens relative to one token, and the device it was
    measured on; None if not measured. From the bench file ``source``'s own cost model where it has one (the same run
    and machine as the ratio it explains), else from ``cost_curves`` of notebook 04 (the target is its first model)."""
    if source:
        ratio = bench_cost_ratio(tables, source, n)
        if ratio is not None:
            return ratio
    cost = tables.get("cost_curves")
    if cost is None or cost.empty or not {"model", "n", "ms"} <= set(cost.columns):
        return None
    d = cost[cost["model"] == cost["model"].iloc[0]].sort_values("n")
    ratio = relative_cost(as_array(d["n"]), as_array(d["ms"]), n)
    return None if ratio is None else (ratio, tables.provenance("cost_curves").get("device", "this device"))


def in_run_forward_ratio(method_rows: pd.DataFrame, base_rows: pd.DataFrame) -> float | None:
    """The method's median target forward per step over the baseline's, from the runs' ``target_ms``; else None."""
    if "target_ms" not in method_rows or "target_ms" not in base_rows:
        return None
    m, b = as_array(method_rows["target_ms"]), as_array(base_rows["target_ms"])
    m, b = m[np.isfinite(m)], b[np.isfinite(b)]
    if not len(m) or not len(b) or np.median(b) <= 0:
        return None
    return float(np.median(m) / np.median(b))


def count_tree_nodes(rows: pd.DataFrame) -> int:
    """The largest token tree the runs verified (per-step ``drafted`` where ``depths`` > 0); 0 for chains and AR."""
    if "depths" not in rows or "drafted" not in rows:
        return 0
    best = 0
    for depths, drafted in zip(rows["depths"], rows["drafted"]):
        if isinstance(depths, (list, tuple)) and any(int(d) > 0 for d in depths) and isinstance(drafted, (list, tuple)):
            best = max(best, max((int(x) for x in drafted), default=0))
    return best


def explain_gap(method_rows: pd.DataFrame, base_rows: pd.DataFrame, tables: Tables, source: str | None = None) -> str:
    """What a speed ratio is made of: tokens per target step against the time of a step relative to the baseline's
    step (speedup ≈ tokens per step / step-time ratio), and the cost of verifying: the method's target forward per
    step over the baseline's in the same runs where they record it, else for a chain or tree the measured cost of
    verifying γ + 1 tokens or the tree (from the table ``source``'s own cost model where it is a bench file that has
    one, else notebook 04's cost curve)."""
    parts = []
    counted = all(any(c in rows for c in ("tokens", "new_tokens")) and "seconds" in rows
                  for rows in (method_rows, base_rows))  # a table of tokens/s alone has no steps to count
    steps, base_steps = (step_counts(method_rows), step_counts(base_rows)) if counted else (np.array([np.nan]),) * 2
    tok = as_array(method_rows[tokens_column(method_rows)]) if counted else None
    base_tok = as_array(base_rows[tokens_column(base_rows)]) if counted else None
    if (counted and np.isfinite(steps).all() and np.isfinite(base_steps).all() and steps.sum() > 0
            and base_steps.sum() > 0):
        tps, base_tps = tok.sum() / steps.sum(), base_tok.sum() / base_steps.sum()
        step_ratio = ((as_array(method_rows["seconds"]).sum() / steps.sum())
                      / (as_array(base_rows["seconds"]).sum() / base_steps.sum()))
        parts.append(f"{tps / base_tps:.2f}× the tokens per target step, each step {step_ratio:.2f}× as long")
    if "alpha" in method_rows and np.isfinite(as_array(method_rows["alpha"])).any():
        parts.append(f"α = {np.nanmean(as_array(method_rows['alpha'])):.2f}")
    tree_nodes = count_tree_nodes(method_rows)
    in_run = in_run_forward_ratio(method_rows, base_rows)
    if in_run is not None:  # the runs' own forwards (why: specrepro.bench.run.with_in_run_predictions)
        parts.append(f"its target forward per step took {in_run:.2f}× the baseline's in these runs (medians)")
    elif tree_nodes:
        ratio = cost_ratio(tables, tree_nodes + 1, source)
        if ratio is not None:
            parts.append(f"verifying a {tree_nodes}-node tree ({tree_nodes + 1} tokens) costs {ratio[0]:.1f}× a "
                         f"1-token forward on {ratio[1]}")
    elif "gamma" in method_rows and np.isfinite(as_array(method_rows["gamma"])).all():
        gamma = int(np.nanmax(as_array(method_rows["gamma"])))
        ratio = cost_ratio(tables, gamma + 1, source) if gamma >= 1 else None
        if ratio is not None:
            parts.append(f"verifying γ + 1 = {gamma + 1} tokens costs {ratio[0]:.1f}× a 1-token forward on {ratio[1]}")
    return "; ".join(parts)


def matching_methods(df: pd.DataFrame, query: str, what: str) -> list[str]:
    if not query:
        raise ValueError(f"the rule needs a '{what}' parameter (a query on the selected rows)")
    names = list(dict.fromkeys(df.query(query, engine="python")["method"].astype(str)))
    if not names:
        raise NotRun(f"no rows for {what} ({query})")
    return names


def best_of(claim, n: int) -> str:
    """A maximum over ``n`` > 1 methods is allowed only if the claim says "best of N" (else ValueError); N is the
    standard profile's: another profile may sweep fewer, and the returned note then says so."""
    if n <= 1:
        return ""
    m = re.search(r"best of (\d+)", claim["claim"])
    if not m:
        raise ValueError(f"claim {claim['id']}: the selection has {n} candidate methods; a maximum over them must "
                         f"say 'best of {n}' in the claim")
    return "" if int(m.group(1)) == n else f"the claim's best of {m.group(1)} is a best of {n} here"
