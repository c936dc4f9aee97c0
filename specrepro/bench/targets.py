"""The performance targets of the benchmark of record , checked against the bench JSON files.

What this file is: :data:`TARGETS` (each target: the bench file it reads, what it compares, the threshold) and
:func:`check_targets`, which reads the bench JSON written by ``make reproduce`` (:func:`specrepro.bench.run_bench`)
and says for each target whether it was met, with the measured ratio and its 95% interval over prompts.

What it is not: a timed test. Targets live here, beside the benchmark, and are judged on the record's runs only;
nothing in ``make test`` times anything against them.

Statuses: **met** — the whole 95% interval clears the threshold (for a "within" target: lies inside the band);
**met on the median** — the median clears it but the interval does not (the run cannot rule out a miss);
**missed** — the median does not clear it; **not run** — the file or a method is missing from the record.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from specrepro.bench.run import refresh_predictions
from specrepro.bench.run import run_median as _median
from specrepro.measure.harness import paired_speedup

__all__ = ["Target", "TARGETS", "MET", "MET_MEDIAN", "MISSED", "NOT_RUN", "check_targets", "prediction_gap",
           "draft_kind_of", "draft_cost_rows", "PENDING_FILES"]

MET, MET_MEDIAN, MISSED, NOT_RUN = "met", "met on the median", "missed", "not run"


@dataclass(frozen=True)
class Target:
    """One performance target.

    Attributes:
        id: short name; text: the target as the project states it.
        file: the bench JSON stem in the results directory (e.g. ``bench_qwen_greedy``).
        kind: ``at_least`` (a paired ratio column of the best of ``methods`` >= ``threshold``), ``within`` (a paired
            ratio column of ``methods[0]`` within ``threshold`` of 1, both ways), ``predicted`` (every chain with a
            prediction: measured / predicted within ``threshold`` of 1, the prediction from the run's own recorded
            costs where the file has them, :func:`specrepro.bench.run.with_in_run_predictions`), ``tree_over_chain``
            (the fastest ``sd-tree*`` method over the fastest other ``sd-*`` chain, paired per prompt,
            >= ``threshold``), ``draft_cost`` (a cheaper draft: the in-loop draft time per drafted token of the best
            of ``methods`` over ``baseline``'s, paired per prompt, <= ``threshold``, while its α is at most
            ``alpha_drop`` below ``baseline``'s, the difference paired per prompt), ``peak_memory`` (the largest
            resident high-water mark of any timed call in the file, ``peak_rss_mb``, <= ``threshold`` GB of 10^9
            bytes: a maximum over every call, not an estimate, so it reads met or missed); on llama.cpp's kernels
            (:mod:`specrepro.bench.ladder`): ``llama_vs_ar`` (the best exact one of ``methods`` over llama.cpp's AR,
            ``llama-server-ar`` where the run has it, else ``llama-ar``, paired per prompt, >= ``threshold``; the
            other AR's ratio shown beside), ``llama_decode_vs_ar`` (the same in decode time, the prompt's prefill
            left out: :func:`specrepro.measure.harness.decode_speedup`), ``llama_vs_server_spec`` (the fastest of ``methods`` over the fastest
            ``llama-server-*`` speculative method, paired per prompt, >= ``threshold``), ``llama_predicted`` (each
            of ``methods``' measured speedup over ``llama-ar`` / the hardware-aware prediction from the run's
            llama.cpp cost curve within ``threshold`` of 1, :func:`specrepro.bench.ladder.llama_ladder`),
            ``llama_draft_step`` (each of ``methods``' draft time in the loop over the bare draft forwards it makes,
            from the run's own cost model, at most 1 + ``threshold``: :func:`specrepro.bench.ladder.draft_overhead`).
        column: the summary column (``speedup_vs_ar``, ``speedup_vs_hf_assisted``, ...) for at_least / within.
        methods: method-name prefixes the target may pick from ("best of" them, by the median).
        threshold: the number the target names.
        draft: when set (``"int8"``), only methods drafting with that draft count: ``sd-*-int8*`` by name, and
            ``sd-draft-auto`` / ``sd-draft-dynamic`` / ``sd-draft-adaptive`` / ``sd-hybrid`` when the run's
            ``--opt draft_kind`` names it.
        baseline: the method a ``draft_cost`` target compares with (e.g. ``sd-draft-int8@4``).
        alpha_drop: how far below ``baseline``'s α a ``draft_cost`` candidate's α may lie (absolute).
    """

    id: str
    text: str
    file: str
    kind: str
    threshold: float
    column: str = "speedup_vs_ar"
    methods: tuple[str, ...] = ("sd-",)
    draft: str | None = None
    baseline: str | None = None
    alpha_drop: float = 0.03


#: our speculative methods on llama.cpp's kernels (name prefixes; :data:`specrepro.bench.ladder.OUR_LLAMA_SPEC`)
_OURS_ON_LLAMA = ("llama-sd", "llama-lookup", "llama-hybrid")

#: The targets of the bench of record: qwen2.5-coder-1.5b + 0.5b, >= 20 HumanEval prompts x 128 tokens, one
#: interleaved run per file.
TARGETS: tuple[Target, ...] = (
    Target("greedy-vs-ar", "greedy: ≥ 1.8× our AR", "bench_qwen_greedy", "at_least", 1.8),
    Target("greedy-vs-ar-3x", "greedy on code: ≥ 3.0× our AR", "bench_qwen_greedy", "at_least", 3.0),
    Target("greedy-vs-hf-assisted", "greedy: ≥ 1.3× transformers' assisted generation (its default fp32 draft)",
           "bench_qwen_greedy", "at_least", 1.3, "speedup_vs_hf_assisted"),
    Target("greedy-vs-hf-assisted-int8", "greedy: ≥ 1.1× transformers' assisted generation given our int8 draft",
           "bench_qwen_greedy", "at_least", 1.1, "speedup_vs_hf_assisted_int8", ("sd-",), "int8"),
    Target("greedy-vs-hf-assisted-int8-pruned", "greedy: ≥ 1.1× transformers' assisted generation given our cheapest "
           "draft (the int8 copy with the FR-Spec pruned head)", "bench_qwen_greedy", "at_least", 1.1,
           "speedup_vs_hf_assisted_int8_pruned", ("sd-",), "int8-pruned"),
    Target("nucleus-vs-ar", "nucleus (T = 0.8, top-p 0.95): ≥ 1.6× our AR", "bench_qwen_nucleus", "at_least", 1.6),
    Target("ar-vs-hf-ar", "our AR within 5% of transformers' greedy generate", "bench_qwen_greedy", "within", 0.05,
           "speedup_vs_hf_ar", ("ar",)),
    Target("greedy-predicted", "greedy: every draft's measured speedup within 10% of the hardware-aware prediction "
           "(from the forward and draft times the run itself recorded)", "bench_qwen_greedy", "predicted", 0.10),
    Target("nucleus-predicted", "nucleus: every draft's measured speedup within 10% of the hardware-aware prediction "
           "(from the forward and draft times the run itself recorded)", "bench_qwen_nucleus", "predicted", 0.10),
    Target("t1-tree-over-chain", "T = 1: best tree ≥ best chain (tokens/s, paired per prompt, same run)",
           "bench_qwen_t1_trees", "tree_over_chain", 1.0),
    Target("draft-cost-half", "greedy: a draft half as costly: draft time per drafted token ≤ 0.5× the int8 draft's, "
           "with α at most 0.03 below it (γ = 4 chains, same run)", "bench_qwen_drafts", "draft_cost", 0.5,
           methods=("sd-draft-int4", "sd-draft-int8-pruned"), baseline="sd-draft-int8@4"),
    Target("greedy-vs-hf-assisted-int4", "greedy: ≥ 1.25× transformers' assisted generation given the same draft (our "
           "4-bit copy)", "bench_qwen_drafts", "at_least", 1.25, "speedup_vs_hf_assisted_int4", ("sd-",), "int4"),
    Target("chat-vs-ar", "chat workload (six categories, chat template), greedy: ≥ 2.0× our AR", "bench_qwen_chat",
           "at_least", 2.0),
    Target("chat-vs-hf-assisted-int8", "chat workload, greedy: ≥ 1.25× transformers' assisted generation given the "
           "same int8 draft", "bench_qwen_chat", "at_least", 1.25, "speedup_vs_hf_assisted_int8", ("sd-",), "int8"),
    Target("bf16-vs-ar", "bfloat16, greedy: ≥ 1.8× our bfloat16 AR (the float32 target's threshold)",
           "bench_qwen_bf16", "at_least", 1.8),
    Target("bf16-vs-hf-ar", "bfloat16, greedy: ≥ 1.8× transformers' bfloat16 greedy generate", "bench_qwen_bf16",
           "at_least", 1.8, "speedup_vs_hf_ar"),
    Target("bf16-vs-hf-assisted", "bfloat16, greedy: ≥ 1.25× transformers' assisted generation given the same "
           "bfloat16 draft", "bench_qwen_bf16", "at_least", 1.25, "speedup_vs_hf_assisted", ("sd-",), "fp32"),
    Target("memory-fp32-drafts", "float32: peak resident memory ≤ 12 GB (the cheaper-draft file)",
           "bench_qwen_drafts", "peak_memory", 12.0),
    Target("memory-fp32-chat", "float32: peak resident memory ≤ 12 GB (the chat file)", "bench_qwen_chat",
           "peak_memory", 12.0),
    Target("memory-bf16", "bfloat16: peak resident memory ≤ 8 GB", "bench_qwen_bf16", "peak_memory", 8.0),
    Target("greedy-heldout-vs-ar", "greedy code on held-out prompts (HumanEval/20-39, 64 tokens; no choice in the "
           "record saw them): the greedy file's best method, named before the run (sd-draft-adaptive-int8@20), "
           "≥ 1.8× our AR", "bench_qwen_heldout_greedy", "at_least", 1.8, methods=("sd-draft-adaptive-int8@",)),
    Target("chat-heldout-vs-ar", "chat workload on held-out prompts (its prompts 25-44, chat template, 64 tokens): "
           "the chat file's best method, named before the run (sd-hybrid-adaptive-int8@20), ≥ 2.0× our AR",
           "bench_qwen_heldout_chat", "at_least", 2.0, methods=("sd-hybrid-adaptive-int8@",)),
    Target("llama-greedy-vs-llama-ar", "llama.cpp's kernels, greedy code: our exact speculative decoding ≥ 1.5× "
           "llama.cpp's AR on the same GGUF files (llama.cpp's own: its server without speculation, llama-server-ar, "
           "where the run has it, else our loop on llama.cpp's logits, llama-ar; the other shown beside)",
           "bench_llamacpp_greedy", "llama_vs_ar", 1.5, methods=_OURS_ON_LLAMA),
    Target("llama-greedy-vs-llama-spec", "llama.cpp's kernels, greedy code: our exact speculative decoding ≥ 1.3× "
           "llama.cpp's own speculation at its best setting (the fastest llama-server-* speculative method by the "
           "median, paired per prompt, same run)", "bench_llamacpp_spec", "llama_vs_server_spec", 1.3,
           methods=_OURS_ON_LLAMA),
    Target("llama-greedy-predicted", "llama.cpp's kernels, greedy code: each of our speculative methods' measured "
           "speedup over llama-ar within 10% of the hardware-aware prediction (from the llama.cpp cost curve t(n) "
           "and draft time the run measured, at its α)", "bench_llamacpp_greedy", "llama_predicted", 0.10,
           methods=_OURS_ON_LLAMA),
    Target("llama-chat-vs-llama-ar", "llama.cpp's kernels, chat workload, greedy: our exact speculative decoding ≥ "
           "1.3× llama.cpp's AR (llama-server-ar where run, else llama-ar)", "bench_llamacpp_chat", "llama_vs_ar",
           1.3, methods=_OURS_ON_LLAMA),
    Target("llama-t1-vs-llama-ar", "llama.cpp's kernels, T = 1: our exact speculative sampling (outputs distributed "
           "as the target's: exact methods only) ≥ 1.3× llama.cpp's AR (llama-server-ar where run, else llama-ar)",
           "bench_llamacpp_t1", "llama_vs_ar", 1.3, methods=_OURS_ON_LLAMA),
    Target("llama-16bit-decode-vs-llama-ar", "llama.cpp's kernels, the target's 16-bit file (BF16 where the CPU has "
           "AVX-512 BF16, else F16), greedy code: our best exact method ≥ 1.8× llama.cpp's AR on the same file in "
           "decode time per token (the prompt's prefill left out)", "bench_llamacpp_16bit_greedy",
           "llama_decode_vs_ar", 1.8, methods=_OURS_ON_LLAMA),
    Target("llama-16bit-vs-llama-ar", "llama.cpp's kernels, the 16-bit file, greedy code: our best exact method "
           "≥ 1.5× llama.cpp's AR end to end", "bench_llamacpp_16bit_greedy", "llama_vs_ar", 1.5,
           methods=_OURS_ON_LLAMA),
    Target("llama-16bit-vs-llama-spec", "llama.cpp's kernels, the 16-bit file, greedy code: our best exact method "
           "≥ 1.0× llama.cpp's own speculation at its best setting (draft max 3, 7 or 16, or n-gram; the fastest by "
           "the median, paired per prompt, same run)", "bench_llamacpp_16bit_greedy", "llama_vs_server_spec", 1.0,
           methods=_OURS_ON_LLAMA),    Target("llama-16bit-t1-vs-llama-spec", "llama.cpp's kernels, the 16-bit file, T = 1: our best exact method ≥ "
           "1.3× llama.cpp's best exact own speculation (its server keeps a draft token only when it equals the "
           "target's sample; draft max 3, 7 or 16, or n-gram; the fastest by the median, paired per prompt, same run)",
           "bench_llamacpp_16bit_t1", "llama_vs_server_spec", 1.3, methods=_OURS_ON_LLAMA),
    Target("llama-draft-step", "llama.cpp's kernels, chat workload, greedy: our loop's draft time within 15% of the "
           "bare draft forwards it makes (t_draft(1) per drafted token, t_draft(2) for the first forward after a fully "
           "accepted block, which feeds its last draft token and the bonus token; the run's own cost model), each "
           "draft-model chain of ours", "bench_llamacpp_chat", "llama_draft_step", 0.15, methods=("llama-sd",)),
)


#: bench files a target names before the Makefile has a rule that writes them (their targets read "not run" until
#: then); tests/test_targets.py checks every other target's file has a rule, and that these still lack one
PENDING_FILES: tuple[str, ...] = ()


def _fin(v) -> bool:
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


def _ci(est, lo, hi) -> str:
    return f"{est:.2f}" + (f" [{lo:.2f}, {hi:.2f}]" if _fin(lo) and _fin(hi) else "")


def _picks(summary: list[dict], prefixes) -> list[dict]:
    return [r for r in summary if any(str(r["method"]).startswith(p) for p in prefixes)]


def draft_kind_of(method: str, options: dict | None = None) -> str | None:
    """The draft a bench method drafts with: ``int8`` / ``int8-pruned`` / ``int4`` / ``int4-pruned`` / ``pruned`` /
    ``fp32`` from its name
    (``sd-draft-int8@4``, ``sd-tree-int8@2x1``), the run's ``draft_kind`` option for ``sd-draft-auto``,
    ``sd-draft-dynamic``, ``sd-draft-adaptive``, ``sd-hybrid`` and ``sd-hybrid-adaptive`` (default fp32); None for our methods without a
    draft model (AR, lookup) and for transformers' own methods (``hf-*``: not ours to pick for a target)."""
    base = str(method).split("@", 1)[0]
    if not base.startswith("sd-"):
        return None
    if base in ("sd-draft-auto", "sd-hybrid", "sd-hybrid-adaptive", "sd-draft-dynamic", "sd-draft-adaptive"):
        return str((options or {}).get("draft_kind", "fp32"))
    for kind in ("int8-pruned", "int4-pruned", "int8", "int4", "pruned"):
        if base.endswith("-" + kind):
            return kind
    return "fp32" if base in ("sd-draft", "sd-tree", "sd-draft-block") else None


def prediction_gap(data: dict) -> pd.DataFrame:
    """Where each fixed-γ chain's measured speedup parts from the hardware-aware prediction, from one bench JSON.

    The prediction (:func:`specrepro.bench.run.add_predictions`) is E[tokens] · t_target(1) / (γ · t_draft +
    t_target(γ + 1)) with the costs measured before the timed runs, or (files written since 2026-11-25 evening) the
    mean of a measurement before and one after them (``config.cost_model``, ms), turned into a whole-request
    prediction with AR's measured prefill (:func:`specrepro.theory.with_prefill`; files written before that get it
    from their own runs, :func:`specrepro.bench.run.refresh_predictions`). The timed runs record where
    each step's time went (:func:`specrepro.measure.harness.run_interleaved`: ``loop_ms`` per step after the prefill,
    ``target_ms`` per step, ``draft_ms`` per drafted token, ``overhead_ms`` per step). measured / predicted is the
    product of four factors, each 1 when the model holds:

    * ``tokens_factor`` = measured tokens per step / Leviathan Eq. 1 at the run's pooled α (acceptances not i.i.d.);
    * ``step_factor`` = the model's step (γ · t_draft + t_target(γ + 1)) / the chain's median measured step;
    * ``ar_factor`` = AR's median measured step / t_target(1) (a slow AR step raises the measured speedup);
    * ``rest_factor`` = what is left: the spread of per-prompt ratios around the product of medians, and how far
      the prefill's dilution differs from the model's (``prefill_factor``, the prediction with the prefill over the
      one without, is in the prediction itself; 1 where the file has no prefill times).

    Returns:
        one row per chain with a prediction: method, gamma, alpha, tokens_per_step, predicted_tokens_per_step,
        model_target_ms, loop_target_ms, model_draft_ms (γ · t_draft), loop_draft_ms (draft_ms × drafted per step),
        loop_overhead_ms, model_step_ms, loop_step_ms, ar_model_ms (t_target(1)), ar_loop_ms, prefill_factor, the
        four factors, measured_over_predicted, and ``why`` (one line naming them). Empty when the run has no cost
        model.
    """
    data = refresh_predictions(data)
    cost = (data.get("config") or {}).get("cost_model") or {}
    target_ms = {int(k): float(v) for k, v in (cost.get("target_ms") or {}).items()}
    draft_ms = cost.get("draft_ms_per_token") or {}
    runs = pd.DataFrame(data.get("runs") or [])
    rows = []
    for r in data.get("summary") or []:
        m = r["method"]
        if m not in draft_ms or not _fin(r.get("measured_over_predicted")) or not target_ms:
            continue
        g = int(r["gamma"])
        t1, tv = target_ms.get(1, float("nan")), target_ms.get(g + 1, float("nan"))
        mdraft = g * float(draft_ms[m])
        drafted = r.get("drafted_per_step") if _fin(r.get("drafted_per_step")) else g
        out = {"method": m, "gamma": g, "alpha": r.get("alpha"), "tokens_per_step": r.get("tokens_per_step"),
               "predicted_tokens_per_step": r.get("predicted_tokens_per_step"),
               "model_target_ms": tv, "loop_target_ms": _median(runs, m, "target_ms"),
               "model_draft_ms": mdraft, "loop_draft_ms": _median(runs, m, "draft_ms") * drafted,
               "loop_overhead_ms": _median(runs, m, "overhead_ms"),
               "model_step_ms": mdraft + tv, "loop_step_ms": _median(runs, m, "loop_ms"),
               "ar_model_ms": t1, "ar_loop_ms": _median(runs, "ar", "loop_ms"),
               "measured_over_predicted": r["measured_over_predicted"]}
        wp = r.get("predicted_speedup_with_prefill")
        out["prefill_factor"] = wp / r["predicted_speedup"] if _fin(wp) and _fin(r.get("predicted_speedup")) else 1.0
        out["tokens_factor"] = (out["tokens_per_step"] / out["predicted_tokens_per_step"]
                                if _fin(out["tokens_per_step"]) and _fin(out["predicted_tokens_per_step"])
                                else float("nan"))
        out["step_factor"] = out["model_step_ms"] / out["loop_step_ms"]
        out["ar_factor"] = out["ar_loop_ms"] / t1
        known = out["tokens_factor"] * out["step_factor"] * out["ar_factor"]
        out["rest_factor"] = out["measured_over_predicted"] / known if _fin(known) and known else float("nan")
        out["why"] = (f"{m}: tokens/step {out['tokens_per_step']:.2f} vs Eq. 1 {out['predicted_tokens_per_step']:.2f} "
                      f"(×{out['tokens_factor']:.2f}); step {out['loop_step_ms']:.0f} ms measured vs "
                      f"{out['model_step_ms']:.0f} ms modelled (×{out['step_factor']:.2f}: target "
                      f"{out['loop_target_ms']:.0f} vs {tv:.0f}, draft {out['loop_draft_ms']:.0f} vs {mdraft:.0f}, "
                      f"loop overhead {out['loop_overhead_ms']:.0f} vs 0); AR step {out['ar_loop_ms']:.0f} vs "
                      f"t_target(1) {t1:.0f} ms (×{out['ar_factor']:.2f}); spread "
                      f"×{out['rest_factor']:.2f}" + (f" (the prefill, in the prediction, ×{out['prefill_factor']:.2f})"
                                                     if out["prefill_factor"] != 1.0 else ""))
        rows.append(out)
    return pd.DataFrame(rows)


def _tree_vs_chain_why(runs: pd.DataFrame, summary: list[dict], tree: str, chain: str) -> str:
    """Each side's tokens per step and median step time (target forward inside it), then the trade in one line:
    the tree's tokens per step and step time as multiples of the chain's, and the tokens per step at which its
    step time would break even (tokens/s = tokens per step / step time, so the tree wins only if its gain in
    tokens per step exceeds its extra step time)."""
    by = {r["method"]: r for r in summary}
    parts, sides = [], []
    for m in (tree, chain):
        r = by.get(m, {})
        tps, drafted = r.get("tokens_per_step"), r.get("drafted_per_step")
        step, tgt = _median(runs, m, "loop_ms"), _median(runs, m, "target_ms")
        ok = _fin(tps) and _fin(drafted) and _fin(step) and _fin(tgt)
        parts.append(f"{m}: {tps:.2f} tokens per step, {drafted:.1f} drafted, step {step:.0f} ms (target {tgt:.0f})"
                     if ok else f"{m}: no step record")
        sides.append((tps, step) if ok else None)
    if all(sides):
        (tps_t, step_t), (tps_c, step_c) = sides
        parts.append(f"the tree keeps {tps_t / tps_c:.2f}x the chain's tokens per step at {step_t / step_c:.2f}x its "
                     f"step time ({tps_t / tps_c * step_c / step_t:.2f}x its tokens/s by this arithmetic); to break "
                     f"even at its step time it would need {tps_c * step_t / step_c:.2f} tokens per step")
    return "; ".join(parts)


def _at_least_why(data: dict, r: dict) -> str:
    """What the cost model says about a chain that did not clearly clear a speed target: its draft length, tokens per
    step and, where the run measured costs, the prediction at its γ and at the model's best γ for its α among the
    draft lengths whose verification the run measured (no extrapolation of the target's cost curve)."""
    from specrepro.theory import CostCurve, hardware_aware_speedup

    parts = []
    if _fin(r.get("drafted_per_step")) and _fin(r.get("tokens_per_step")):
        parts.append(f"{r['method']} drafts {r['drafted_per_step']:.1f} tokens per step and keeps "
                     f"{r['tokens_per_step']:.2f}")
        step = _step_decomposition(data, r)
        if step:
            parts.append(step)
    cost = (data.get("config") or {}).get("cost_model") or {}
    t_d = (cost.get("draft_ms_per_token") or {}).get(r["method"])
    if t_d is not None and cost.get("target_ms") and _fin(r.get("alpha")) and _fin(r.get("gamma")):
        pts = sorted((int(k), float(v)) for k, v in cost["target_ms"].items())
        curve = CostCurve([n for n, _ in pts], [v for _, v in pts])
        pred = {g: float(hardware_aware_speedup(r["alpha"], g, curve, lambda n: float(t_d)))
                for g in range(1, pts[-1][0])}  # only γ whose verification (γ + 1 tokens) was measured
        best = max(pred, key=pred.get)
        g = int(r["gamma"])
        parts.append(f"cost model at α = {r['alpha']:.2f}: {pred.get(g, float('nan')):.2f}× at γ = {g}, best γ <= "
                     f"{pts[-1][0] - 1} (the measured curve) is {best} at {pred[best]:.2f}×")
    return "; ".join(parts)


def _step_decomposition(data: dict, r: dict) -> str:
    """Where a speculative method's decoding step goes, from the run's own step records (medians over its runs, ms):
    the step, the target forward in it, the draft's share (ms per drafted token × drafted per step) and what the
    draft costs per token against AR's step (c, Leviathan et al.'s cost coefficient measured in the loop); then the
    decoding loop's speedup this arithmetic gives (tokens per step × AR's step / the step) and the same without the
    draft's share (the free-draft bound of this run). Empty where the runs do not record steps."""
    runs = pd.DataFrame(data.get("runs") or [])
    m, tps, drafted = r["method"], r["tokens_per_step"], r["drafted_per_step"]
    step, tgt, per = _median(runs, m, "loop_ms"), _median(runs, m, "target_ms"), _median(runs, m, "draft_ms")
    ar = _median(runs, "ar", "loop_ms")
    if not all(_fin(v) and v > 0 for v in (step, tgt, per, ar)):
        return ""
    draft = per * drafted
    return (f"a step takes {step:.0f} ms: target {tgt:.0f}, draft {draft:.0f} ({drafted:.1f} × {per:.0f} ms, "
            f"c = {per / ar:.2f} of AR's {ar:.0f} ms per token), the rest {max(step - tgt - draft, 0):.0f}; so the "
            f"loop gives {tps * ar / step:.2f}× AR, and {tps * ar / max(step - draft, 1e-9):.2f}× if drafting cost "
            "nothing")


def _cost_model_prediction(r: dict) -> str:
    if _fin(r.get("predicted_speedup_with_prefill")):
        return (f"{r['predicted_speedup_with_prefill']:.2f}× with the prefill, {r['predicted_speedup']:.2f}× for the "
                f"decoding loop")
    return f"{r['predicted_speedup']:.2f}×"


def _check_one(t: Target, data: dict | None) -> dict:
    out = {"id": t.id, "target": t.text, "file": t.file, "status": NOT_RUN, "measured": "", "method": "",
           "n_prompts": None, "why": ""}
    if data is None:
        out["measured"] = f"{t.file}.json not in the record"
        return out
    summary = data.get("summary") or []
    out["n_prompts"] = (data.get("config") or {}).get("n_prompts")
    if t.kind in ("at_least", "within"):
        rows = [r for r in _picks(summary, t.methods) if _fin(r.get(t.column))]
        if t.draft is not None:
            options = (data.get("config") or {}).get("options") or {}
            rows = [r for r in rows if draft_kind_of(r["method"], options) == t.draft]
        if not rows:
            out["measured"] = f"no {'/'.join(t.methods)}* method with {t.column} in the run"
            return out
        r = max(rows, key=lambda r: r[t.column])
        est, lo, hi = r[t.column], r.get(f"{t.column}_lo"), r.get(f"{t.column}_hi")
        out["method"] = r["method"] + (f" (best of {len(rows)} by the median)" if len(rows) > 1 else "")
        out["measured"] = _ci(est, lo, hi) + "×"
        if t.kind == "at_least":
            ok, sure = est >= t.threshold, _fin(lo) and lo >= t.threshold
        else:
            ok = abs(est - 1) <= t.threshold
            sure = _fin(lo) and _fin(hi) and 1 - t.threshold <= lo and hi <= 1 + t.threshold
        out["status"] = (MET if sure else MET_MEDIAN) if ok else MISSED
        if out["status"] != MET:
            out["why"] = _at_least_why(data, r)
        return out
    if t.kind == "predicted":
        rows = [r for r in summary if _fin(r.get("measured_over_predicted"))]
        if not rows:
            out["measured"] = "no chain with a prediction in the run"
            return out
        # held to the prediction from the runs' own costs where the file has it (see with_in_run_predictions: the
        # cost model measured outside the timed runs caught other states of this shared machine)
        key = ("measured_over_predicted_in_run" if all(_fin(r.get("measured_over_predicted_in_run")) for r in rows)
               else "measured_over_predicted")

        def part(r):
            text = f"{r['method']} {r[key]:.2f} (measured {r['speedup_vs_ar']:.2f}× vs "
            if key.endswith("_in_run"):
                return text + (f"predicted {r['predicted_speedup_in_run']:.2f}× from the runs' own costs; "
                               f"{_cost_model_prediction(r)} from the cost model measured outside them, "
                               f"measured / predicted {r['measured_over_predicted']:.2f})")
            return text + f"predicted {_cost_model_prediction(r)})"

        out["method"] = ", ".join(r["method"] for r in rows)
        out["measured"] = "measured / predicted: " + "; ".join(part(r) for r in rows)
        ok = all(abs(r[key] - 1) <= t.threshold for r in rows)
        out["status"] = MET_MEDIAN if ok else MISSED  # a ratio of a median to a model: no interval, never "met"
        gap = prediction_gap(data)
        out["why"] = " | ".join(gap["why"]) if len(gap) else ""
        return out
    if t.kind == "tree_over_chain":
        runs = pd.DataFrame(data.get("runs") or [])
        trees = [r for r in _picks(summary, ("sd-tree",)) if _fin(r.get("tokens_per_s"))]
        chains = [r for r in _picks(summary, ("sd-",)) if not str(r["method"]).startswith("sd-tree")
                  and _fin(r.get("tokens_per_s"))]
        if runs.empty or not trees or not chains:
            out["measured"] = "the run lacks a tree or a chain method"
            return out
        tree = max(trees, key=lambda r: r["tokens_per_s"])["method"]
        chain = max(chains, key=lambda r: r["tokens_per_s"])["method"]
        s = paired_speedup(runs, tree, chain)
        out["method"] = f"{tree} / {chain} (each the fastest of {len(trees)} trees / {len(chains)} chains)"
        out["measured"] = _ci(s["speedup"], s["speedup_lo"], s["speedup_hi"]) + "×"
        ok, sure = s["speedup"] >= t.threshold, _fin(s["speedup_lo"]) and s["speedup_lo"] >= t.threshold
        out["status"] = (MET if sure else MET_MEDIAN) if ok else MISSED
        if out["status"] != MET:
            out["why"] = _tree_vs_chain_why(runs, summary, tree, chain)
        return out
    if t.kind == "draft_cost":
        return _check_draft_cost(t, data, out)
    if t.kind == "llama_draft_step":
        return _check_draft_step(t, data, out)
    if t.kind in ("llama_vs_ar", "llama_decode_vs_ar", "llama_vs_server_spec", "llama_predicted"):
        return _check_llama(t, data, out)
    if t.kind == "peak_memory":
        return _check_peak_memory(t, data, out)
    raise ValueError(f"target {t.id}: unknown kind {t.kind!r}")


def _llama_why(data: dict, methods) -> str:
    """For a llama.cpp target not clearly met: each named method's limit ladder and step split
    (:func:`specrepro.bench.ladder.llama_ladder`'s ``why``), or what the run lacks for one."""
    from specrepro.bench.ladder import llama_ladder

    lad = llama_ladder(data)
    if lad.empty:
        return "no speculative llama.cpp method with its AR in the run"
    lines = [w for m, w in zip(lad["method"], lad["why"]) if m in methods]
    extra = "" if (data.get("config") or {}).get("llama_cost_model") else (
        " (the file has no llama.cpp cost model: the model's rungs read —)")
    return " | ".join(lines) + extra


def _check_llama(t: Target, data: dict, out: dict) -> dict:
    """The llama.cpp kinds (see :class:`Target`)."""
    from specrepro.bench.ladder import LLAMA_AR, LLAMA_SERVER_AR, llama_ar_baseline, llama_ladder

    summary = data.get("summary") or []
    runs = pd.DataFrame(data.get("runs") or [])
    ours = [r for r in _picks(summary, t.methods) if r.get("exact", True) is not False]
    if t.kind == "llama_vs_ar":
        base = llama_ar_baseline(data)
        col = None if base is None else "speedup_vs_" + base.replace("-", "_")
        rows = [r for r in ours if col is not None and _fin(r.get(col))]
        if not rows:
            out["measured"] = (f"no {'/'.join(t.methods)}* method with a ratio over llama.cpp's AR "
                               f"({LLAMA_SERVER_AR} or {LLAMA_AR}) in the run")
            return out
        r = max(rows, key=lambda r: r[col])
        est, lo, hi = r[col], r.get(f"{col}_lo"), r.get(f"{col}_hi")
        out["method"] = r["method"] + (f" (best of {len(rows)} by the median)" if len(rows) > 1 else "")
        other = LLAMA_AR if base == LLAMA_SERVER_AR else None
        ocol = None if other is None else "speedup_vs_" + other.replace("-", "_")
        out["measured"] = (f"{_ci(est, lo, hi)}× {base}"
                           + (f"; {_ci(r[ocol], r.get(f'{ocol}_lo'), r.get(f'{ocol}_hi'))}× {other}"
                              if ocol and _fin(r.get(ocol)) else "")
                           + ("" if base == LLAMA_SERVER_AR else " (the run has no llama-server-ar)"))
        ok, sure = est >= t.threshold, _fin(lo) and lo >= t.threshold
        out["status"] = (MET if sure else MET_MEDIAN) if ok else MISSED
        if out["status"] != MET:
            out["why"] = _llama_why(data, {r["method"]})
        return out
    if t.kind == "llama_decode_vs_ar":
        from specrepro.measure.harness import decode_speedup

        base = llama_ar_baseline(data)
        mine = [r for r in ours if _fin(r.get("tokens_per_s"))]
        if base is None or runs.empty or not mine or "prefill_ms" not in runs:
            out["measured"] = "the run lacks one of ours, llama.cpp's AR or the prefill times"
            return out
        seed = int((data.get("config") or {}).get("seed") or 0)
        best = {r["method"]: decode_speedup(runs, r["method"], base, seed=seed) for r in mine}
        a = max(best, key=lambda m: best[m]["speedup"])
        s = best[a]
        out["method"] = a + (f" (best of {len(best)} by the median)" if len(best) > 1 else "")
        out["measured"] = (f"{_ci(s['speedup'], s['speedup_lo'], s['speedup_hi'])}× {base} in decode time "
                           f"({s['method_ms']:.1f} against {s['baseline_ms']:.1f} ms per token)")
        ok, sure = s["speedup"] >= t.threshold, _fin(s["speedup_lo"]) and s["speedup_lo"] >= t.threshold
        out["status"] = (MET if sure else MET_MEDIAN) if ok else MISSED
        if out["status"] != MET:
            out["why"] = _llama_why(data, {a})
        return out
    if t.kind == "llama_vs_server_spec":
        mine = [r for r in ours if _fin(r.get("tokens_per_s"))]
        theirs = [r for r in summary if str(r["method"]).startswith("llama-server-")
                  and r["method"] != LLAMA_SERVER_AR and _fin(r.get("tokens_per_s"))]
        if runs.empty or not mine or not theirs:
            out["measured"] = "the run lacks one of ours or a llama-server-* speculative method"
            return out
        a = max(mine, key=lambda r: r["tokens_per_s"])["method"]
        b = max(theirs, key=lambda r: r["tokens_per_s"])["method"]
        s = paired_speedup(runs, a, b, seed=int((data.get("config") or {}).get("seed") or 0))
        out["method"] = f"{a} / {b} (each the fastest of {len(mine)} / {len(theirs)} by the median)"
        out["measured"] = _ci(s["speedup"], s["speedup_lo"], s["speedup_hi"]) + "×"
        ok, sure = s["speedup"] >= t.threshold, _fin(s["speedup_lo"]) and s["speedup_lo"] >= t.threshold
        out["status"] = (MET if sure else MET_MEDIAN) if ok else MISSED
        if out["status"] != MET:
            out["why"] = _llama_why(data, {a, b})
        return out
    # llama_predicted
    lad = llama_ladder(data)
    lad = lad[[any(str(m).startswith(p) for p in t.methods) for m in lad["method"]]] if len(lad) else lad
    lad = lad[lad["measured_over_predicted"].map(_fin)] if len(lad) else lad
    if lad.empty:
        out["measured"] = ("no method of ours with a prediction in the run"
                           + ("" if (data.get("config") or {}).get("llama_cost_model")
                              else " (the file has no llama.cpp cost model)"))
        return out
    out["method"] = ", ".join(lad["method"])
    out["measured"] = "measured / predicted: " + "; ".join(
        f"{o['method']} {o['measured_over_predicted']:.2f} (measured {o['measured']:.2f}× {o['baseline']} vs "
        f"predicted {o['predicted_with_prefill'] if _fin(o['predicted_with_prefill']) else o['predicted']:.2f}×"
        + (f"; from the run's own costs {o['predicted_in_run']:.2f}×" if _fin(o["predicted_in_run"]) else "") + ")"
        for o in lad.to_dict("records"))
    ok = bool((abs(lad["measured_over_predicted"] - 1) <= t.threshold).all())
    out["status"] = MET_MEDIAN if ok else MISSED  # a ratio of a median to a model: no interval, never "met"
    out["why"] = _llama_why(data, set(lad["method"]))
    return out


def _check_draft_step(t: Target, data: dict, out: dict) -> dict:
    """``llama_draft_step``: met when every method's interval of measured / bare draft time lies at or below
    1 + threshold, on the median when every median does, else missed."""
    from specrepro.bench.ladder import draft_overhead

    d = draft_overhead(data, t.methods)
    if d.empty:
        out["measured"] = ("the file's llama.cpp cost model has no t_draft(2) (timed before it was measured) or the "
                           "run has no " + "/".join(t.methods) + "* method")
        return out
    out["method"] = ", ".join(d["method"])
    out["measured"] = "measured / bare draft forwards: " + "; ".join(
        f"{r.method} {_ci(r.ratio, r.ratio_lo, r.ratio_hi)} (n = {r.n_prompts} prompts; {r.catchup_share:.0%} of "
        f"draft forwards fed two tokens)" for r in d.itertuples())
    t1, t2 = d["draft_t1_ms"].iloc[0], d["draft_t2_ms"].iloc[0]
    out["why"] = f"t_draft(1) {t1:.1f} ms, t_draft(2) {t2:.1f} ms (t_draft(2) / t_draft(1) = {t2 / t1:.2f})"
    limit = 1 + t.threshold
    if (d["ratio"] <= limit).all():
        out["status"] = MET if (d["ratio_hi"] <= limit).all() else MET_MEDIAN
    else:
        out["status"] = MISSED
    return out


def _alpha_by_prompt(runs: pd.DataFrame, method: str) -> pd.Series:
    """Per prompt: the mean of every α term of ``method``'s runs on it (all repeats pooled)."""
    d = runs[runs["method"] == method]
    return d.groupby("prompt", sort=False)["alpha_terms"].agg(
        lambda xs: float(sum(sum(x or []) for x in xs) / max(1, sum(len(x or []) for x in xs))))


def draft_cost_rows(data: dict, candidates, baseline: str, seed: int = 0) -> pd.DataFrame:
    """Each candidate draft against ``baseline``'s, from one bench JSON: the draft time per drafted token and α.

    Both are paired per prompt: ``cost_ratio`` is the median over prompts of the candidate's in-loop draft time per
    drafted token (``draft_ms`` of each run, averaged geometrically over the passes) over the baseline's on the same
    prompt and pass, with its 95% bootstrap interval over prompts; ``alpha_diff`` is the mean over prompts of the
    candidate's α minus the baseline's (each prompt's α pooled over its verified positions, Leviathan Def. 3.1),
    with its 95% bootstrap interval. The draft times of the run's cost model (measured outside the timed runs,
    ``config.cost_model.draft_ms_per_token``) are shown beside them where the file has them.

    Args:
        data: a bench JSON (dict); candidates: method-name prefixes; baseline: the reference method's label.
        seed: the bootstrap's seed.

    Returns:
        one row per candidate method present with draft times: method, draft_ms (median in-loop ms per drafted
        token), baseline_draft_ms, cost_ratio, cost_ratio_lo, cost_ratio_hi, alpha, baseline_alpha, alpha_diff,
        alpha_diff_lo, alpha_diff_hi, n_prompts, model_cost_ratio (from the cost model, NaN without it).
    """
    import numpy as np

    from specrepro.measure.harness import paired_ratios
    from specrepro.stats import bootstrap_ci

    runs = pd.DataFrame(data.get("runs") or [])
    if runs.empty or "draft_ms" not in runs or not (runs["method"] == baseline).any():
        return pd.DataFrame()
    model = ((data.get("config") or {}).get("cost_model") or {}).get("draft_ms_per_token") or {}
    base_alpha = _alpha_by_prompt(runs, baseline)
    rows = []
    for m in dict.fromkeys(runs["method"]):
        if m == baseline or not any(str(m).startswith(p) for p in candidates):
            continue
        d = runs[runs["method"] == m]
        if not d["draft_ms"].notna().any():
            continue
        ratio = paired_ratios(runs, m, baseline, value="draft_ms")
        est, lo, hi = bootstrap_ci(ratio.to_numpy(), seed=seed)
        diff = (_alpha_by_prompt(runs, m) - base_alpha).dropna()
        a_est, a_lo, a_hi = bootstrap_ci(diff.to_numpy(), statistic=np.mean, seed=seed)
        rows.append({"method": m, "draft_ms": float(d["draft_ms"].median()),
                     "baseline_draft_ms": float(runs.loc[runs["method"] == baseline, "draft_ms"].median()),
                     "cost_ratio": est, "cost_ratio_lo": lo, "cost_ratio_hi": hi,
                     "alpha": float(_alpha_by_prompt(runs, m).mean()), "baseline_alpha": float(base_alpha.mean()),
                     "alpha_diff": a_est, "alpha_diff_lo": a_lo, "alpha_diff_hi": a_hi, "n_prompts": int(ratio.size),
                     "model_cost_ratio": (float(model[m]) / float(model[baseline])
                                          if m in model and baseline in model else float("nan"))})
    return pd.DataFrame(rows)


def _check_draft_cost(t: Target, data: dict, out: dict) -> dict:
    rows = draft_cost_rows(data, t.methods, t.baseline)
    if rows.empty:
        out["measured"] = f"no {'/'.join(t.methods)}* chain with draft times beside {t.baseline} in the run"
        return out
    rank = {MET: 0, MET_MEDIAN: 1, MISSED: 2}
    judged = []
    for r in rows.to_dict(orient="records"):
        ok = r["cost_ratio"] <= t.threshold and r["alpha_diff"] >= -t.alpha_drop
        sure = (_fin(r["cost_ratio_hi"]) and r["cost_ratio_hi"] <= t.threshold and _fin(r["alpha_diff_lo"])
                and r["alpha_diff_lo"] >= -t.alpha_drop)
        judged.append(((MET if sure else MET_MEDIAN) if ok else MISSED, r))
    status, r = min(judged, key=lambda sr: (rank[sr[0]], sr[1]["cost_ratio"]))
    out["status"], out["n_prompts"] = status, r["n_prompts"]
    out["method"] = f"{r['method']} / {t.baseline}" + (f" (the best of {len(rows)})" if len(rows) > 1 else "")
    out["measured"] = (f"draft time per token {_ci(r['cost_ratio'], r['cost_ratio_lo'], r['cost_ratio_hi'])}× "
                       f"({r['draft_ms']:.1f} vs {r['baseline_draft_ms']:.1f} ms); α "
                       f"{r['alpha']:.3f} vs {r['baseline_alpha']:.3f}, difference "
                       f"{r['alpha_diff']:+.3f}" + (f" [{r['alpha_diff_lo']:+.3f}, {r['alpha_diff_hi']:+.3f}]"
                                                    if _fin(r["alpha_diff_lo"]) else ""))
    if status != MET:
        out["why"] = "; ".join(
            f"{x['method']}: {x['cost_ratio']:.2f}× the draft time per token"
            + (f" (the cost model, measured outside the timed runs: {x['model_cost_ratio']:.2f}×)"
               if _fin(x["model_cost_ratio"]) else "") + f", α {x['alpha_diff']:+.3f}" for x in rows.to_dict("records"))
    return out


def _check_peak_memory(t: Target, data: dict, out: dict) -> dict:
    runs = pd.DataFrame(data.get("runs") or [])
    if runs.empty or "peak_rss_mb" not in runs or not runs["peak_rss_mb"].notna().any():
        out["measured"] = "the run recorded no peak resident memory"
        return out
    runs = runs[runs["peak_rss_mb"].notna()]
    gb = runs["peak_rss_mb"] * 2**20 / 1e9
    top = runs.loc[gb.idxmax()]
    out["method"] = f"{top['method']} (the largest of {len(runs)} calls)"
    split = ""
    if "rss_anon_mb" in runs and _fin(top.get("rss_anon_mb")) and _fin(top.get("rss_file_mb")):
        split = (f"; resident after that call: {top['rss_anon_mb'] * 2**20 / 1e9:.1f} GB anonymous, "
                 f"{top['rss_file_mb'] * 2**20 / 1e9:.1f} GB file-backed")
    kept = (data.get("config") or {}).get("float_draft_kept")
    dtype = (data.get("config") or {}).get("dtype")
    out["measured"] = f"{gb.max():.1f} GB peak ({dtype}){split}"
    out["status"] = MET if gb.max() <= t.threshold else MISSED
    if out["status"] != MET:
        per = (runs.assign(gb=gb).groupby("method", sort=False)["gb"].max())
        out["why"] = ("largest peak per method: " + ", ".join(f"{m} {v:.1f} GB" for m, v in per.items())
                      + ("" if kept is None else "; the draft as loaded was " + ("kept (a method drafts with it)"
                                                                                 if kept else "released")
                         + " before timing")
                      + ("; the file predates the release of the draft as loaded (float_draft_kept not recorded)"
                         if "float_draft_kept" not in (data.get("config") or {}) else ""))
    return out


def check_targets(results_dir: str | Path, targets=TARGETS) -> pd.DataFrame:
    """Check each target against the bench JSON files in ``results_dir``.

    Args:
        results_dir: the directory holding ``bench_*.json`` (the record: ``data/results``).
        targets: the :class:`Target` list (default :data:`TARGETS`).

    Returns:
        one row per target: id, target, file, status (:data:`MET`, :data:`MET_MEDIAN`, :data:`MISSED`,
        :data:`NOT_RUN`), measured (the ratio with its 95% interval over prompts, ×), method, n_prompts, why (for a
        target not clearly met: what the cost model and the step timings say, see :func:`prediction_gap`; else
        empty).

    Raises:
        ValueError: a target of unknown kind; json.JSONDecodeError: a corrupt bench file (never read as "not run").
    """
    cache: dict[str, dict | None] = {}
    rows = []
    for t in targets:
        if t.file not in cache:
            path = Path(results_dir) / f"{t.file}.json"
            cache[t.file] = refresh_predictions(json.loads(path.read_text())) if path.exists() else None
        rows.append(_check_one(t, cache[t.file]))
    return pd.DataFrame(rows)
