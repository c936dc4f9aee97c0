"""The limit ladder of each method run on llama.cpp's kernels, from one bench JSON.

What this file is: :func:`llama_ladder`, which reads a bench run holding llama.cpp methods and, for each speculative
one, puts four speedups beside its measured one: Leviathan et al.'s prediction from α and c alone (a verification
as cheap as one token), the free-draft bound (the measured verification curve t(γ + 1), a draft that costs nothing),
the hardware-aware prediction (the curve and the draft's measured t_draft(1)), and the same model with the costs the
timed runs themselves recorded, then the decoding loop's own arithmetic (tokens per step × the AR step / the step,
from the runs' step records); :func:`llama_cost_line` states the cost model with its intervals and
:func:`ladder_markdown` renders both. The targets (:mod:`specrepro.bench.targets`) and the bench block
(:func:`specrepro.record.report.render_bench`) read these.

Which baseline: our methods on llama.cpp's kernels (``llama-sd@G``, ``llama-sd-block@G``, ``llama-sd-adaptive@G``,
``llama-lookup@G``, ``llama-hybrid-adaptive@G``) against ``llama-ar`` (our loop, llama.cpp's logits: the same loop
without a draft, so the ratio is the speculation's alone); llama.cpp's own speculation (``llama-server-*``) against
``llama-server-ar`` (its server without speculation), with α from its reported drafted and accepted counts
(:func:`specrepro.theory.alpha_from_acceptance_rate`). The cost curve is the one measured in the bench's process
on the same GGUF files (``config.llama_cost_model``, :func:`specrepro.bench.run.measure_llama_costs`); the server
runs its own process with its own threads, so for its methods the curve is the kernels', not the server's.

What it is not: a timing (nothing is run here) or the PyTorch methods' predictions
(:func:`specrepro.bench.run.add_predictions`).
"""

from __future__ import annotations

import math

import pandas as pd

__all__ = ["llama_ladder", "llama_cost_curve", "llama_cost_line", "ladder_markdown", "is_llama_run", "draft_overhead",
           "llama_ar_baseline", "OUR_LLAMA_SPEC", "LLAMA_AR", "LLAMA_SERVER_AR", "FIXED_GAMMA", "NO_DRAFT_MODEL"]

#: our speculative methods on llama.cpp's kernels (name prefixes)
OUR_LLAMA_SPEC = ("llama-sd", "llama-lookup", "llama-hybrid")
#: our loop's AR on llama.cpp's logits, and llama.cpp's own AR (its server without speculation)
LLAMA_AR, LLAMA_SERVER_AR = "llama-ar", "llama-server-ar"
#: method bases whose γ is fixed by the name (the others choose it per step: their γ is the mean drafted per step)
FIXED_GAMMA = ("llama-sd", "llama-sd-block")
#: method-name prefixes that draft without a draft model (n-gram lookups in the text: c = 0)
NO_DRAFT_MODEL = ("llama-lookup", "llama-server-ngram")


def _fin(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _nan(v) -> float:
    return float(v) if _fin(v) else float("nan")


def is_llama_run(data: dict) -> bool:
    """Whether a bench JSON holds a method run on llama.cpp's kernels (``llama-*``)."""
    return any(str(r.get("method", "")).startswith("llama-") for r in data.get("summary") or [])


def llama_ar_baseline(data: dict) -> str | None:
    """"llama.cpp AR" of a run: ``llama-server-ar`` (llama.cpp's own AR) where the run has it, else ``llama-ar``
    (our loop on llama.cpp's logits), else None."""
    methods = {r.get("method") for r in data.get("summary") or []}
    return LLAMA_SERVER_AR if LLAMA_SERVER_AR in methods else LLAMA_AR if LLAMA_AR in methods else None


def llama_cost_curve(data: dict):
    """The llama.cpp target's cost curve of a run (:class:`specrepro.theory.CostCurve`, ms; the mean of the
    measurements before and after timing) and the draft's t(1) (ms, NaN without a draft); (None, NaN) where the file
    has no ``config.llama_cost_model``."""
    from specrepro.theory import CostCurve

    cost = (data.get("config") or {}).get("llama_cost_model") or {}
    pts = sorted((int(k), float(v)) for k, v in (cost.get("target_ms") or {}).items() if _fin(v))
    if not pts:
        return None, float("nan")
    return CostCurve([n for n, _ in pts], [v for _, v in pts]), _nan(cost.get("draft_ms"))


def _interval(block: dict, key: str, n: str | None = None) -> str:
    if n is None:
        est, lo, hi = block.get(key), block.get(f"{key}_lo"), block.get(f"{key}_hi")
    else:
        est, lo, hi = ((block.get(k) or {}).get(n) for k in (key, f"{key}_lo", f"{key}_hi"))
    if not _fin(est):
        return "—"
    digits = 2 if key == "c" else 1
    return f"{est:.{digits}f}" + (f" [{lo:.{digits}f}, {hi:.{digits}f}]" if _fin(lo) and _fin(hi) else "")


def llama_cost_line(data: dict) -> str:
    """One paragraph: the llama.cpp cost model of a run (t(1), t(5), t(21), t_draft(1) in ms and c), each measurement
    (before / after the timed passes) with its 95% interval over the timed calls; empty without one."""
    cost = (data.get("config") or {}).get("llama_cost_model") or {}
    if not cost.get("target_ms"):
        return ""
    ns = [n for n in ("1", "5", "21") if n in (cost.get("target_ms") or {})]
    parts = []
    for when in ("before", "after"):
        b = cost.get(when)
        if not b:
            continue
        parts.append(f"{when} the timed passes: " + ", ".join(f"t({n}) {_interval(b, 'target_ms', n)}" for n in ns)
                     + f", t_draft(1) {_interval(b, 'draft_ms')}, c {_interval(b, 'c')}")
    if not parts and cost.get("parts"):  # a file merged from parts: each part's two measurements, then their mean
        parts.append(f"the mean of {len(cost['parts'])} parts' models, each measured before and after its own timed "
                     "passes: " + ", ".join(f"t({n}) {_interval(cost, 'target_ms', n)}" for n in ns)
                     + f", t_draft(1) {_interval(cost, 'draft_ms')}, c {_interval(cost, 'c')} (c's interval the "
                     "widest of theirs)")
    if not parts:  # one measurement only
        parts.append(", ".join(f"t({n}) {_interval(cost, 'target_ms', n)}" for n in ns)
                     + f", t_draft(1) {_interval(cost, 'draft_ms')}, c {_interval(cost, 'c')}")
    return (f"llama.cpp cost model (ms, on a {cost.get('prefix_len')}-token prefix of {cost.get('timed_on', '?')}; "
            f"[95% interval of the median over the timed calls, {cost.get('rounds')} rounds × {cost.get('repeats')} "
            f"calls per size; c over alternating target/draft one-token pairs]): " + "; ".join(parts)
            + (f"; the ladder uses their means (c = {cost['c']:.2f})" if _fin(cost.get("c")) and "before" in cost
               else "") + ".")


def _runs_median(runs: pd.DataFrame, method: str, column: str) -> float:
    """The median of ``method``'s ``column`` over the per-run table (NaN where absent). The bench's printout imports
    this module, so it does not import :mod:`specrepro.bench.run`."""
    if runs.empty or column not in runs:
        return float("nan")
    v = pd.to_numeric(runs.loc[runs["method"] == method, column], errors="coerce").dropna()
    return float(v.median()) if len(v) else float("nan")


def _server_counts(runs: pd.DataFrame, method: str) -> tuple[float, float]:
    """Σ drafted, Σ accepted of a method's runs: columns ``draft_n`` / ``draft_n_accepted`` (the server's totals)
    where the runs have them, else the harness's per-step lists ``drafted`` / ``accepted`` (where
    :mod:`specrepro.bench.llamaserver` puts the server's totals, in their first entry); NaN otherwise."""
    d = runs[runs["method"] == method] if "method" in runs else runs.iloc[0:0]
    for dk, ak in (("draft_n", "draft_n_accepted"), ("drafted", "accepted")):
        if dk in d and ak in d and len(d):
            def total(col):
                return float(sum(sum(x) if isinstance(x, (list, tuple)) else (x if _fin(x) else 0) for x in d[col]))
            dn, an = total(dk), total(ak)
            if dn > 0:
                return dn, an
    return float("nan"), float("nan")


def _measured(data: dict, runs: pd.DataFrame, row: dict, baseline: str) -> tuple[float, float, float]:
    col = "speedup_vs_" + baseline.replace("-", "_")
    if _fin(row.get(col)):
        return float(row[col]), _nan(row.get(f"{col}_lo")), _nan(row.get(f"{col}_hi"))
    if runs.empty or not (runs["method"] == baseline).any():
        return (float("nan"),) * 3
    from specrepro.measure.harness import paired_speedup

    s = paired_speedup(runs, row["method"], baseline, seed=int((data.get("config") or {}).get("seed") or 0))
    return _nan(s.get("speedup")), _nan(s.get("speedup_lo")), _nan(s.get("speedup_hi"))


def llama_ladder(data: dict) -> pd.DataFrame:
    """The limit ladder of every speculative llama.cpp method of one bench JSON, each against its AR.

    For each method (ours: ``llama-sd*``, ``llama-lookup*``, ``llama-hybrid*`` against ``llama-ar``, or against
    ``llama-server-ar`` in a run without ``llama-ar``; llama.cpp's:
    ``llama-server-*`` but its AR, against ``llama-server-ar``), at its α and γ:

    * ``leviathan``: Leviathan et al.'s walltime improvement (1 - α^(γ+1)) / ((1 - α)(γc + 1)) (Thm 3.8), c from the
      cost model (0 for a lookup, which drafts without a model);
    * ``free_draft``: E[tokens](α, γ) · t(1) / t(γ + 1) (:func:`specrepro.theory.free_draft_bound`);
    * ``predicted``: E[tokens](α, γ) · t(1) / (γ t_draft(1) + t(γ + 1)) (:func:`specrepro.theory.
      hardware_aware_speedup`; t_draft 0 for a lookup, the draft model's for a hybrid, which drafts by lookup where
      it can: an upper bound on its drafting cost), and ``predicted_with_prefill``
      (:func:`specrepro.theory.with_prefill` with the baseline's median prefill and new tokens): the speedup the
      ``predicted`` target holds the measurement to;
    * ``predicted_in_run``: the same model with the run's own step records (t(1): the baseline's median target
      forward per step; t(γ + 1): the method's; t_draft: its median draft time per drafted token), with the prefill;
    * ``step_split``: the decoding loop's own arithmetic, measured tokens per step × the baseline's median step / the
      method's median step (``loop_ms``), and ``step_split_free_draft``, the same without the step's draft time;
    * ``measured``: the paired speedup over the baseline (median over prompts, 95% interval over prompts).

    γ is the name's for fixed chains (``llama-sd@G``, ``llama-sd-block@G``), else the mean drafted per step. α is
    the run's (the mean acceptance term, Leviathan Def. 3.1) where it records one, else the i.i.d. α that keeps the
    reported fraction of drafted tokens at that γ (:func:`specrepro.theory.alpha_from_acceptance_rate`: llama.cpp's
    server reports only drafted and accepted counts).

    Returns:
        one row per method: method, baseline, side ("ours" / "llama.cpp"), gamma, gamma_from, alpha, alpha_from,
        acceptance_rate, c, c_lo, c_hi, tokens_per_step, expected_tokens, leviathan, free_draft, predicted,
        predicted_with_prefill, predicted_in_run, step_split, step_split_free_draft, measured, measured_lo,
        measured_hi, measured_over_predicted (against ``predicted_with_prefill`` where finite, else ``predicted``),
        why (one line: the ladder and where the measurement parts from it). Empty where the run holds no such
        method; the model's columns NaN where the file has no llama.cpp cost model.
    """
    from specrepro.theory import (
        alpha_from_acceptance_rate,
        expected_tokens,
        hardware_aware_speedup,
        walltime_improvement,
        with_prefill,
    )

    summary = data.get("summary") or []
    runs = pd.DataFrame(data.get("runs") or [])
    methods = {r.get("method") for r in summary}
    curve, t_draft = llama_cost_curve(data)
    cost = (data.get("config") or {}).get("llama_cost_model") or {}
    c_model = _nan(cost.get("c"))
    if not _fin(c_model) and curve is not None and _fin(t_draft):
        c_model = t_draft / float(curve(1))
    c_ends = {}
    for end in ("lo", "hi"):  # the widest of the measurements' intervals
        vals = [(cost.get(w) or {}).get(f"c_{end}") for w in ("before", "after")] + [cost.get(f"c_{end}")]
        vals = [float(v) for v in vals if _fin(v)]
        c_ends[end] = (min(vals) if end == "lo" else max(vals)) if vals else float("nan")
    rows = []
    for r in summary:
        m = str(r.get("method", ""))
        base = m.split("@", 1)[0]
        if m.startswith("llama-server-") and m != LLAMA_SERVER_AR:
            baseline, side = LLAMA_SERVER_AR, "llama.cpp"
        elif any(m.startswith(p) for p in OUR_LLAMA_SPEC):  # against our loop's AR, else llama.cpp's own
            baseline, side = (LLAMA_AR if LLAMA_AR in methods else LLAMA_SERVER_AR), "ours"
        else:
            continue
        if baseline not in methods:
            continue
        nan = float("nan")
        out = {"method": m, "baseline": baseline, "side": side}
        drafted = _nan(r.get("drafted_per_step"))
        if base in FIXED_GAMMA and _fin(r.get("gamma")):
            g, out["gamma_from"] = float(r["gamma"]), "the name's γ"
        elif _fin(drafted) and drafted > 0:
            g, out["gamma_from"] = drafted, "mean drafted per step"
        elif _fin(r.get("gamma")) and r["gamma"] > 0:
            g, out["gamma_from"] = float(r["gamma"]), "the setting's γ"
        else:
            g, out["gamma_from"] = nan, "unknown"
        dn, an = _server_counts(runs, m) if not runs.empty else (nan, nan)
        out["acceptance_rate"] = an / dn if _fin(dn) and dn > 0 else nan
        if _fin(r.get("alpha")):
            alpha, out["alpha_from"] = float(r["alpha"]), "the run's acceptance terms"
        elif _fin(out["acceptance_rate"]) and _fin(g) and g > 0:
            alpha = alpha_from_acceptance_rate(min(max(out["acceptance_rate"], 0.0), 1.0), g)
            out["alpha_from"] = "reported drafted / accepted, i.i.d. at that γ"
        else:
            alpha, out["alpha_from"] = nan, "not recorded"
        no_model = any(base.startswith(p) for p in NO_DRAFT_MODEL)
        c = 0.0 if no_model else c_model
        out.update(gamma=g, alpha=alpha, c=c, c_lo=0.0 if no_model else c_ends["lo"],
                   c_hi=0.0 if no_model else c_ends["hi"], tokens_per_step=_nan(r.get("tokens_per_step")))
        ok = _fin(alpha) and _fin(g) and g > 0
        out["expected_tokens"] = float(expected_tokens(alpha, g)) if ok else nan
        out["leviathan"] = float(walltime_improvement(alpha, g, c)) if ok and _fin(c) else nan
        if ok and curve is not None:
            td = None if no_model else (lambda n, t=t_draft: t * n)
            out["free_draft"] = hardware_aware_speedup(alpha, g, curve, None)
            out["predicted"] = (hardware_aware_speedup(alpha, g, curve, td) if td is None or _fin(t_draft) else nan)
        else:
            out["free_draft"] = out["predicted"] = nan
        # the baseline's prefill and new tokens, for whole-request predictions
        prefill, n_new = _runs_median(runs, baseline, "prefill_ms"), _runs_median(runs, baseline, "new_tokens")
        whole = _fin(prefill) and _fin(n_new) and n_new > 0
        out["predicted_with_prefill"] = (with_prefill(out["predicted"], prefill, n_new, float(curve(1)))
                                         if whole and _fin(out["predicted"]) and out["predicted"] > 0 else nan)
        t1, tv, tdr = (_runs_median(runs, baseline, "target_ms"), _runs_median(runs, m, "target_ms"),
                       _runs_median(runs, m, "draft_ms"))
        if ok and _fin(t1) and _fin(tv) and tv > 0:
            loop = out["expected_tokens"] * t1 / (tv + g * (tdr if _fin(tdr) else 0.0))
            out["predicted_in_run"] = with_prefill(loop, prefill, n_new, t1) if whole else loop
        else:
            out["predicted_in_run"] = nan
        step, ar_step = _runs_median(runs, m, "loop_ms"), _runs_median(runs, baseline, "loop_ms")
        tps = out["tokens_per_step"]
        if _fin(step) and _fin(ar_step) and _fin(tps) and step > 0:
            out["step_split"] = tps * ar_step / step
            dstep = tdr * drafted if _fin(tdr) and _fin(drafted) else 0.0
            out["step_split_free_draft"] = tps * ar_step / max(step - dstep, 1e-9)
        else:
            out["step_split"] = out["step_split_free_draft"] = nan
        out["measured"], out["measured_lo"], out["measured_hi"] = _measured(data, runs, r, baseline)
        pred = out["predicted_with_prefill"] if _fin(out["predicted_with_prefill"]) else out["predicted"]
        out["measured_over_predicted"] = out["measured"] / pred if _fin(pred) and pred > 0 else nan
        out["why"] = _why(out, step, ar_step, tv, t1, tdr, drafted)
        rows.append(out)
    return pd.DataFrame(rows)


def _x(v, digits: int = 2) -> str:
    return f"{v:.{digits}f}×" if _fin(v) else "—"


def _why(o: dict, step, ar_step, tv, t1, tdr, drafted) -> str:
    """One line: the ladder from Leviathan's prediction down to the measurement, then the step's parts."""
    head = (f"{o['method']} vs {o['baseline']}: α {o['alpha']:.2f} ({o['alpha_from']}), γ {o['gamma']:.1f} "
            f"({o['gamma_from']}), c {o['c']:.2f}" if _fin(o["alpha"]) and _fin(o["gamma"]) and _fin(o["c"])
            else f"{o['method']} vs {o['baseline']}: α or γ not recorded")
    ladder = (f"Leviathan {_x(o['leviathan'])} → free draft {_x(o['free_draft'])} → hardware-aware "
              f"{_x(o['predicted'])}" + (f" ({_x(o['predicted_with_prefill'])} with the prefill)"
                                         if _fin(o["predicted_with_prefill"]) else "")
              + f" → from the run's own costs {_x(o['predicted_in_run'])} → the loop's arithmetic "
              f"{_x(o['step_split'])} → measured {_x(o['measured'])}")
    parts = [head, ladder]
    if _fin(step) and _fin(ar_step):
        draft = tdr * drafted if _fin(tdr) and _fin(drafted) else float("nan")
        parts.append(f"a step {step:.0f} ms (target {tv:.0f}" + (f", draft {draft:.0f} = {drafted:.1f} × {tdr:.1f}"
                                                                   if _fin(draft) else "")
                     + f") vs its AR's {ar_step:.0f} ms (target {t1:.0f}); tokens per step "
                     f"{o['tokens_per_step']:.2f} vs Eq. 1 {o['expected_tokens']:.2f}"
                     if _fin(o["tokens_per_step"]) and _fin(o["expected_tokens"]) and _fin(tv) and _fin(t1)
                     else f"a step {step:.0f} ms vs its AR's {ar_step:.0f} ms")
    return "; ".join(parts)


def ladder_markdown(data: dict) -> str:
    """Markdown: the llama.cpp cost model line and one table row per speculative llama.cpp method of the run (its
    baseline, γ, α, c [95% CI], then the ladder: Leviathan, free draft, hardware-aware (loop / with the prefill),
    from the run's costs, the loop's arithmetic, measured [95% CI], measured / predicted); empty where the run holds
    no llama.cpp method."""
    if not is_llama_run(data):
        return ""
    lad = llama_ladder(data)
    cost = llama_cost_line(data)
    lines = [cost or ("No llama.cpp cost model in this file (written before the bench measured one, or run with "
                      "--no-predict): the ladder's model columns read —."), ""]
    if lad.empty:
        return "\n".join(lines) + "\n"

    def ci(v, lo, hi, digits=2):
        return "—" if not _fin(v) else f"{v:.{digits}f}" + (f" [{lo:.{digits}f}, {hi:.{digits}f}]"
                                                            if _fin(lo) and _fin(hi) else "")

    lines += ["The limit ladder of each speculative method on llama.cpp's kernels, against its AR "
              "(`specrepro.bench.ladder.llama_ladder`):", "",
              "| method | vs | γ | α | c [95% CI] | Leviathan (α, c) | free draft | hardware-aware (loop / with the "
              "prefill) | from the run's costs | the loop's arithmetic | measured [95% CI] | measured / predicted |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for o in lad.to_dict("records"):
        hw = _x(o["predicted"]) + (f" / {_x(o['predicted_with_prefill'])}" if _fin(o["predicted_with_prefill"])
                                   else "")
        lines.append(f"| `{o['method']}` | `{o['baseline']}` | " + (f"{o['gamma']:.1f}" if _fin(o["gamma"]) else "—")
                     + " | "
                     + (f"{o['alpha']:.2f}" if _fin(o["alpha"]) else "—")
                     + f" | {ci(o['c'], o['c_lo'], o['c_hi'])} | {_x(o['leviathan'])} | {_x(o['free_draft'])} | "
                     f"{hw} | {_x(o['predicted_in_run'])} | {_x(o['step_split'])} | "
                     f"{ci(o['measured'], o['measured_lo'], o['measured_hi'])}× | "
                     + (f"{o['measured_over_predicted']:.2f}" if _fin(o["measured_over_predicted"]) else "—") + " |")
    return "\n".join(lines) + "\n"


def draft_overhead(data: dict, methods=("llama-sd",)) -> pd.DataFrame:
    """How far our loop's draft time lies above the bare draft forwards it makes, per method, from one bench JSON.

    A block's drafting (:func:`specrepro.core.blocklm.draft_block`) makes one draft forward per drafted token: the
    first feeds what the draft has not seen (one token, or two after a fully accepted block: its last draft token and
    the bonus token), each later one the token just drafted. Its bare cost is therefore t_draft(2) + (d - 1) ·
    t_draft(1) after a fully accepted block and d · t_draft(1) otherwise, for d drafted tokens, with t_draft(1) and
    t_draft(2) the run's own llama.cpp cost model (``config.llama_cost_model``: ``draft_ms``, ``draft2_ms``, the
    means of the measurements before and after the timed passes, :func:`specrepro.measure.blockcost.measure_block_costs`).
    The measured side is the loop's draft time (``draft_ms`` × drafted tokens per run: sampling, probabilities,
    cache bookkeeping and Python included). Per prompt, every pass's measured total over every pass's bare total;
    the ratio reported is the median over prompts with its distribution-free 95% interval
    (:func:`specrepro.stats.median_interval`), n = the prompts.

    Args:
        data: a bench JSON (``config.llama_cost_model`` and ``runs`` with ``drafted``/``accepted`` per step).
        methods: method-name prefixes to report (default our draft-model chains, ``llama-sd*``).

    Returns:
        one row per method: method, n_prompts, ratio, ratio_lo, ratio_hi (measured / bare, 1 = no overhead),
        catchup_share (the share of draft forwards that fed two tokens), draft_t1_ms, draft_t2_ms. Empty when the
        file's cost model has no t_draft(2) (files timed before it was measured) or no such method ran.
    """
    from specrepro.stats import median_interval

    cost = (data.get("config") or {}).get("llama_cost_model") or {}
    t1, t2 = cost.get("draft_ms"), cost.get("draft2_ms")
    runs = pd.DataFrame(data.get("runs") or [])
    cols = ["method", "n_prompts", "ratio", "ratio_lo", "ratio_hi", "catchup_share", "draft_t1_ms", "draft_t2_ms"]
    if not (_fin(t1) and _fin(t2)) or runs.empty or "drafted" not in runs:
        return pd.DataFrame(columns=cols)
    rows = []
    for m in sorted({str(x) for x in runs["method"] if any(str(x).startswith(p) for p in methods)}):
        per_prompt, forwards, catchups = {}, 0, 0
        for r in runs[runs["method"] == m].itertuples():
            drafted, accepted = list(r.drafted), list(r.accepted)
            full = [False] + [d > 0 and a == d for d, a in zip(drafted[:-1], accepted[:-1])]
            bare = sum(t2 + (d - 1) * t1 if f else d * t1 for d, f in zip(drafted, full) if d > 0)
            measured = float(r.draft_ms) * sum(drafted)
            forwards += sum(d for d in drafted if d > 0)
            catchups += sum(1 for d, f in zip(drafted, full) if d > 0 and f)
            mine = per_prompt.setdefault(r.prompt_index, [0.0, 0.0])
            mine[0], mine[1] = mine[0] + measured, mine[1] + bare
        est, lo, hi, n = median_interval([a / b for a, b in per_prompt.values() if b > 0])
        rows.append({"method": m, "n_prompts": n, "ratio": est, "ratio_lo": lo, "ratio_hi": hi,
                     "catchup_share": catchups / forwards if forwards else float("nan"),
                     "draft_t1_ms": float(t1), "draft_t2_ms": float(t2)})
    return pd.DataFrame(rows, columns=cols)
