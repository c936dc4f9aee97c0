"""Experiment runners behind the Leviathan notebooks: one function per table, returning tidy pandas DataFrames.

What this file is: the loops over prompts, drafters, temperatures and γ that notebooks 03 and 04 call, so the
notebooks only choose settings, tabulate and plot. Timed runs go through the one harness
(:mod:`specrepro.measure.harness`: interleaved prompt by prompt, rotated order, paired per-prompt speedups with intervals).

What it is not: the benchmark command (:mod:`specrepro.bench`, which also runs HF transformers' own generation) or
the algorithms (:mod:`specrepro.core.decoding`, :mod:`specrepro.core.sampling`).
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
import pandas as pd
import torch

from specrepro.core.decoding import default_eos_ids, generate
from specrepro.core.sampling import SamplingConfig
from specrepro.lab.papers import paper_table
from specrepro.measure.alpha import measure_alpha, target_probs_along
from specrepro.measure.harness import (
    draft_of_method,
    per_run_table,
    run_interleaved,
    speedup_table,
    timing_checkpoint_key,
)
from specrepro.stats import bootstrap_ci
from specrepro.theory import (
    expected_tokens,
    hardware_aware_speedup,
    operations_factor,
    speedup_decomposition,
    walltime_improvement,
)

__all__ = ["leviathan_table1", "leviathan_table3_paper", "alpha_table", "alpha_job_seed", "load_alpha_context", "alpha_int8_trajectory", "alpha_drafter_names", "alpha_summary", "speed_table", "SPEED_MODULES", "summarize_speed", "limit_table", "best_measured_drafts", "encode"]

#: The modules whose code decides what :func:`speed_table` times (with every package module they import): the chain
#: loop and the drafters notebook 04 passes it (the draft model, its int8 copy, the n-gram and prompt-lookup drafts)
SPEED_MODULES = ("specrepro.lab.leviathan", "specrepro.drafters.model", "specrepro.drafters.lookup",
                 "specrepro.drafters.compress")

#: Leviathan et al. 2023, Table 1: (alpha, gamma) -> (operations factor, speed), c = c_hat = 0.
LEVIATHAN_TABLE1 = {(float(r.alpha), int(r.gamma)): (float(r.operations), float(r.speed))
                    for r in paper_table("leviathan_table1").itertuples()}


def leviathan_table1() -> pd.DataFrame:
    """Leviathan Table 1 recomputed from Thm 3.8 and 3.11 (c = ĉ = 0), the paper's values beside."""
    rows = []
    for (a, g), (ops, speed) in LEVIATHAN_TABLE1.items():
        rows.append({"alpha": a, "gamma": g, "operations": operations_factor(a, g, 0.0),
                     "speed": walltime_improvement(a, g, 0.0), "paper_operations": ops, "paper_speed": speed})
    return pd.DataFrame(rows)


def leviathan_table3_paper(small_model: str | None = None) -> pd.DataFrame:
    """Leviathan et al. 2023, Table 3 (α at T = 0 and T = 1, ``data/papers/leviathan_table3.csv``) in the shape
    notebook 03 prints beside its own α: rows unigram, bigram and the small model; columns
    (``"paper GPT-like 97M"`` | ``"paper T5-XXL EnDe"`` | ``"paper T5-XXL CNNDM"``, temperature 0.0 | 1.0).

    Args:
        small_model: the name the small-model row takes (our draft's name, to join with our table); None drops the
            row (a run without a draft model).

    Returns:
        a DataFrame of floats (α; the paper prints two decimals).
    """
    t = paper_table("leviathan_table3")
    t = t[t["draft_kind"].isin(["unigram", "bigram", "small model"]) & t["task"].isin(["lm1b", "EnDe", "CNNDM"])]
    t = t.assign(column=[f"paper {target}" + ("" if task == "lm1b" else f" {task}")
                         for target, task in zip(t["target"], t["task"])], temperature=t["temperature"].astype(float))
    wide = t.pivot_table(index="draft_kind", columns=["column", "temperature"], values="alpha", sort=False)
    wide = wide.reindex(["unigram", "bigram", "small model"])
    wide.index.name, wide.columns.names = None, [None, None]
    return wide.rename(index={"small model": small_model}) if small_model else wide.drop(index="small model")


def encode(tokenizer, text: str) -> torch.Tensor:
    """Prompt text -> long [L] token ids (no special tokens added beyond the tokenizer's defaults)."""
    return tokenizer(text, return_tensors="pt").input_ids[0]


def alpha_job_seed(seed: int, workload: str, prompt_id: str, temperature: float) -> int:
    """The seed of one (workload, prompt, temperature) job of :func:`alpha_table`: ``seed`` mixed with a CRC-32 of
    the job's name, so a job draws the same continuation whichever other jobs run beside it (a shard of one workload
    and temperature gives the rows the full table gives)."""
    import zlib

    return (int(seed) * 1_000_003 + zlib.crc32(f"{workload}/{prompt_id}/{float(temperature):g}".encode())) % 2**63


def alpha_table(target, tokenizer, drafters: dict, workloads: dict, temperatures=(0.0, 1.0), max_new_tokens=64,
                seed: int = 0, trajectory_drafter=None, gamma: int = 3, progress: bool = True, checkpoint=None,
                checkpoint_key: dict | None = None) -> pd.DataFrame:
    """Leviathan Table 3 analogue: α of each drafter against ``target``, per workload and temperature.

    For every prompt and temperature the target generates a continuation (exact speculative sampling with
    ``trajectory_drafter`` if given, which only makes it faster, else AR); each drafter's α terms
    Σ_x min(p_t, q_t) are then measured teacher-forced along that continuation (:func:`~specrepro.measure.alpha.measure_alpha`).
    Each (workload, prompt, temperature) job draws from its own generator (:func:`alpha_job_seed`), so tables of
    parts (one workload, one temperature) concatenate to the table of the whole.

    Args:
        drafters: name -> drafter; workloads: name -> list of :class:`~specrepro.data.Prompt`.
        temperatures: the sampling temperatures (0 = greedy); seed: the seed the jobs' seeds derive from.
        gamma: the trajectory's draft length (it changes the speed only: the continuation follows the target).
        checkpoint: a JSON file where every finished job's rows are kept (:func:`specrepro.files.resumable_rows`), so
            an interrupted run resumes under the same jobs, settings and code of this module; None: no checkpoint.
            checkpoint_key: extra conditions a saved job must share (the models' names).

    Returns:
        one row per (workload, temperature, drafter, prompt): columns workload, temperature, drafter, prompt,
        positions, alpha.
    """
    from specrepro.files import code_fingerprint, resumable_rows

    jobs = [(w, p, float(t)) for w, prompts in workloads.items() for p in prompts for t in temperatures]
    eos = default_eos_ids(target, tokenizer)

    def job(i: int) -> dict:
        w, prompt, temp = jobs[i]
        g = torch.Generator(device=target.device).manual_seed(alpha_job_seed(seed, w, prompt.id, temp))
        sampling = SamplingConfig(temperature=temp)
        ids = encode(tokenizer, prompt.text)
        out = generate(target, ids, drafter=trajectory_drafter, gamma=gamma, max_new_tokens=max_new_tokens,
                       sampling=sampling, generator=g, eos_token_id=eos)
        full = torch.cat([ids, torch.tensor(out.tokens, dtype=torch.long)])
        p = target_probs_along(target, full, ids.numel(), sampling)  # one target forward for every drafter
        rows = []
        for name, drafter in drafters.items():
            terms = measure_alpha(target, drafter, full, ids.numel(), sampling, target_probs=p)
            rows.append({"workload": w, "temperature": temp, "drafter": name, "prompt": prompt.id,
                         "positions": len(terms), "alpha": float(np.mean(terms)) if terms else np.nan})
        return {"rows": rows}

    key = dict(checkpoint_key or {}, jobs=[[w, p.id, t] for w, p, t in jobs], tokens=int(max_new_tokens),
               seed=int(seed), gamma=int(gamma), drafters=list(drafters),
               code=code_fingerprint(("specrepro.lab.leviathan", "specrepro.drafters.lookup")))
    done, _ = resumable_rows(len(jobs), job, checkpoint=checkpoint, key=key, what="alpha checkpoint",
                             progress="alpha" if progress else None, index="job")
    cols = ["workload", "temperature", "drafter", "prompt", "positions", "alpha"]
    return pd.DataFrame([r for d in done for r in d["rows"]], columns=cols)


def load_alpha_context(target: str, draft: str | None, device: str = "cpu", dtype: str = "float32",
                       alpha_prompts: int = 36, workloads=("humaneval", "pydoc")) -> dict:
    """What notebook 03's α table needs, loaded: the target, its tokenizer, the drafts of Leviathan Table 3 (unigram
    and bigram models estimated on a corpus that excludes every evaluated prompt, prompt lookup, the draft model),
    the workloads' prompts and the trajectory drafter (the draft's int8 copy where its CPU kernels apply: q is the
    copy's own distribution, so the continuations still follow the target exactly, only faster).

    Returns:
        a dict: target, tokenizer, drafters (name -> drafter), workloads (name -> prompts), trajectory (a drafter or
        None), corpus_tokens (int).

    Raises:
        KeyError: unknown model or workload name (:func:`specrepro.models.load_model`, :func:`specrepro.data.load_workload`).
    """
    from specrepro.data import corpus_token_ids, load_workload
    from specrepro.drafters.compress import quantize_draft
    from specrepro.drafters.lookup import NGramDrafter, PromptLookupDrafter
    from specrepro.drafters.model import DraftModelDrafter
    from specrepro.models import load_model, load_pair

    if draft:
        tmodel, dmodel, tokenizer = load_pair(target, draft, device=device, dtype=dtype)
    else:
        (tmodel, tokenizer), dmodel = load_model(target, device=device, dtype=dtype), None
    vocab = tmodel.get_output_embeddings().weight.shape[0]
    loaded = {w: load_workload(w, alpha_prompts) for w in workloads}
    corpus = corpus_token_ids(tokenizer, exclude_ids={p.id for ps in loaded.values() for p in ps})
    drafters = {"unigram": NGramDrafter(corpus, vocab, n=1), "bigram": NGramDrafter(corpus, vocab, n=2),
                "prompt lookup": PromptLookupDrafter(max_ngram=3)}
    if dmodel is not None:
        drafters[draft] = DraftModelDrafter(dmodel, vocab)
    trajectory = (DraftModelDrafter(quantize_draft(dmodel), vocab) if alpha_int8_trajectory(draft, device, dtype)
                  else drafters.get(draft))
    return {"target": tmodel, "tokenizer": tokenizer, "drafters": drafters, "workloads": loaded,
            "trajectory": trajectory, "corpus_tokens": sum(map(len, corpus))}


def alpha_int8_trajectory(draft: str | None, device: str, dtype: str) -> bool:
    """Whether :func:`load_alpha_context` draws the continuations with the draft's int8 copy (a draft model, on the
    CPU, in float32)."""
    return bool(draft) and device == "cpu" and dtype == "float32"


def alpha_drafter_names(draft: str | None) -> list[str]:
    """The drafters' names of :func:`load_alpha_context`, in the table's order, without loading anything."""
    return ["unigram", "bigram", "prompt lookup", *([draft] if draft else [])]


def alpha_summary(runs: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Each cell of the Table 3 analogue with its size and 95% interval.

    Args:
        runs: :func:`alpha_table` output (one row per workload, temperature, drafter, prompt).
        seed: seed of the bootstrap resampling.

    Returns:
        one row per (drafter, workload, temperature), in ``runs``' order: prompts, positions (α terms summed over
        the prompts; for prompt lookup only where it proposed), alpha (mean over prompts of the per-prompt mean α,
        as the table shows it) and ci95_lo / ci95_hi (percentile bootstrap over prompts,
        :func:`specrepro.stats.bootstrap_ci`; NaN with one prompt).
    """
    rows = []
    for (drafter, workload, temp), g in runs.groupby(["drafter", "workload", "temperature"], sort=False):
        est, lo, hi = bootstrap_ci(g["alpha"], statistic=np.mean, seed=seed)
        rows.append({"drafter": drafter, "workload": workload, "temperature": temp,
                     "prompts": int(g["prompt"].nunique()), "positions": int(g["positions"].sum()),
                     "alpha": est, "ci95_lo": lo, "ci95_hi": hi})
    return pd.DataFrame(rows).set_index(["drafter", "workload", "temperature"])


def speed_table(target, tokenizer, methods: dict[str, tuple], prompts, max_new_tokens: int = 128,
                sampling: SamplingConfig = SamplingConfig(0.0), seed: int = 0, warmup: bool = True,
                repeats: int = 1, progress: bool = True, checkpoint=None,
                checkpoint_key: dict | None = None, prompt_offset: int = 0) -> pd.DataFrame:
    """Time chain methods side by side with the one harness (:func:`specrepro.measure.harness.run_interleaved`: interleaved
    prompt by prompt, method order rotated, warm-up, one seeding rule).

    Args:
        methods: name -> (drafter or None, gamma). None is the AR baseline (exactly one).
        prompts: list of :class:`~specrepro.data.Prompt`.
        repeats: timed passes over the prompts.
        checkpoint: a JSON file where every finished (pass, prompt) block is kept, so that an interrupted timing
            resumes at the next block; the caller deletes it once its table is saved. None: no checkpoint.
        checkpoint_key: what names the models and drafters (e.g. the target, the draft and whether it is the int8
            copy): saved blocks resume only under the same names, methods, sampling, prompts, machine, torch and
            code (:data:`SPEED_MODULES`; :func:`specrepro.measure.harness.timing_checkpoint_key`).
        prompt_offset: the workload index of ``prompts[0]`` when they are one slice of it (a shard; see
            :func:`specrepro.measure.harness.run_interleaved`): seeds, method order and ``prompt_index`` are the
            whole run's.

    Returns:
        one row per (repeat, prompt, method), :func:`specrepro.measure.harness.per_run_table` columns (tokens, seconds,
        tokens_per_s, ms_per_token, steps, tokens_per_step, alpha (NaN for AR), accepted, drafted, target_ms (mean
        target forward, ms), draft_ms (mean draft time per drafted token, ms), overhead_ms, ...) plus gamma and
        same_as_ar (greedy only: token-identical to the AR output on that prompt). ``attrs["resumed_blocks"]``: the
        (pass, prompt) blocks read from ``checkpoint``.

    Raises:
        ValueError: not exactly one AR method (drafter None).
    """
    ar = [name for name, (drafter, _) in methods.items() if drafter is None]
    if len(ar) != 1:
        raise ValueError(f"speed_table needs exactly one AR baseline (drafter None), got {ar}")
    eos = default_eos_ids(target, tokenizer)

    def runner(drafter, gamma, n):
        return lambda ids, g: generate(target, ids, drafter=drafter, gamma=max(gamma, 1), max_new_tokens=n,
                                       sampling=sampling, generator=g, eos_token_id=eos)

    runners = {name: runner(d, g, max_new_tokens) for name, (d, g) in methods.items()}
    warm = {name: runner(d, g, min(8, max_new_tokens)) for name, (d, g) in methods.items()} if warmup else None
    encoded = [(p.id, encode(tokenizer, p.text).to(target.device)) for p in prompts]
    key = None if checkpoint is None else timing_checkpoint_key(
        SPEED_MODULES, encoded, target.device, **(checkpoint_key or {}),
        methods={name: [type(d).__name__ if d is not None else None, g] for name, (d, g) in methods.items()},
        sampling=[sampling.temperature, sampling.top_p, sampling.top_k], max_new_tokens=max_new_tokens, seed=seed,
        warmup=warmup, prompt_offset=int(prompt_offset))
    runs = run_interleaved(runners, encoded, repeats=repeats, seed=seed, device=target.device, warmup=warm,
                           baseline=ar[0], greedy=sampling.greedy, progress=progress, desc="speed",
                           checkpoint=checkpoint, checkpoint_key=key, prompt_offset=int(prompt_offset))
    out = per_run_table(runs)
    out.insert(out.columns.get_loc("method") + 1, "gamma",
               [0 if methods[m][0] is None else methods[m][1] for m in out["method"]])
    out = out.rename(columns={"equal_to_baseline": "same_as_ar"})
    out.attrs["resumed_blocks"] = int(runs.attrs.get("resumed_blocks", 0))
    return out


def summarize_speed(runs: pd.DataFrame, t_target: Callable, t_draft: dict,
                    c_in_run: Mapping[str, float] | None = None) -> pd.DataFrame:
    """Per method: measured speedup over AR (the harness's paired per-prompt ratio, median over prompts, with its 95%
    bootstrap interval ``measured_speedup_lo``/``_hi``; :func:`specrepro.measure.harness.speedup_table`), α, c and the
    predicted speedups (Leviathan's constant-c model, Thm 3.8, and the hardware-aware model, which also counts each
    method's measured per-step overhead outside the forward passes). Predictions use the mean number of tokens
    actually drafted per step (γ for a draft model, fewer for prompt lookup, which proposes only where an n-gram
    matches).

    Args:
        runs: :func:`speed_table` output (must contain the AR method, gamma 0).
        t_target: target cost curve n -> ms (e.g. :class:`~specrepro.theory.CostCurve`).
        t_draft: method name -> draft cost curve n -> ms, or None for free drafts.
        c_in_run: optional draft label (:func:`~specrepro.measure.harness.draft_of_method` of the method) -> c measured in
            the timed runs (:func:`~specrepro.measure.harness.in_run_cost_coefficient`); adds ``c_in_run`` and
            ``predicted_speedup_constant_c_in_run`` (Thm 3.8 at that c; NaN for methods without one).

    Returns:
        one row per method: method, gamma, tokens, seconds, accepted, drafted, steps, overhead_ms (ms), alpha,
        n_prompts, repeats, tokens_per_s, tokens_per_step, measured_speedup (+ _lo/_hi), c (t_draft(1) / t_target(1)
        from the cost curves), drafted_per_step, expected_tokens_per_step, predicted_speedup_constant_c,
        predicted_speedup_hardware, and with ``c_in_run`` the two columns above.
    """
    agg = runs.groupby("method", sort=False).agg(gamma=("gamma", "first"), tokens=("tokens", "sum"),
                                                 seconds=("seconds", "sum"), accepted=("accepted", "sum"),
                                                 drafted=("drafted", "sum"), steps=("steps", "sum"),
                                                 overhead_ms=("overhead_ms", "median"))
    alpha_col = runs.groupby("method", sort=False)["alpha"].mean()
    agg["alpha"] = alpha_col
    ar = agg[agg["gamma"] == 0]
    if ar.empty:
        raise ValueError("speed runs need the AR baseline (a method with drafter None)")
    baseline = str(ar.index[0])
    speed = speedup_table(runs, baseline=baseline, methods=list(agg.index)).set_index("method")
    agg["n_prompts"] = speed["n_prompts"]
    agg["repeats"] = speed["repeats"]
    agg["tokens_per_s"] = speed["tokens_per_s"]
    agg["tokens_per_step"] = agg["tokens"] / agg["steps"]
    agg["measured_speedup"] = speed["speedup"]
    agg["measured_speedup_lo"] = speed["speedup_lo"]
    agg["measured_speedup_hi"] = speed["speedup_hi"]
    t1 = float(t_target(1))
    ar_overhead = float(ar["overhead_ms"].iloc[0])
    c, const_pred, hw_pred, exp_tok, c_run, const_pred_run = [], [], [], [], [], []
    for name, row in agg.iterrows():
        # mean tokens actually drafted per step: gamma for a draft model (less near max_new_tokens), fewer for
        # prompt lookup, which proposes only where an n-gram matches
        g = float(row["drafted"]) / max(1.0, float(row["steps"])) if row["gamma"] else 0
        a = float(row["alpha"]) if g else 0.0
        a = min(max(a if np.isfinite(a) else 0.0, 0.0), 1.0)
        td = t_draft.get(name)
        ci = float(td(1)) / t1 if (td is not None and g) else 0.0
        c.append(ci)
        exp_tok.append(float(expected_tokens(a, g)))
        const_pred.append(float(walltime_improvement(a, g, ci)) if row["gamma"] else 1.0)
        hw_pred.append(hardware_aware_speedup(a, g, t_target, td, overhead_ms=float(row["overhead_ms"]),
                                              ar_overhead_ms=ar_overhead) if row["gamma"] else 1.0)
        # the same Thm 3.8 at the c measured in the runs, for the methods that have one
        cr = float((c_in_run or {}).get(draft_of_method(name), np.nan)) if row["gamma"] else np.nan
        c_run.append(cr)
        const_pred_run.append(float(walltime_improvement(a, g, cr)) if np.isfinite(cr) else np.nan)
    agg["c"] = c
    agg["drafted_per_step"] = agg["drafted"] / agg["steps"]
    agg["expected_tokens_per_step"] = exp_tok
    agg["predicted_speedup_constant_c"] = const_pred
    agg["predicted_speedup_hardware"] = hw_pred
    if c_in_run is not None:
        agg["c_in_run"] = c_run
        agg["predicted_speedup_constant_c_in_run"] = const_pred_run
    return agg.reset_index()


def limit_table(summary: pd.DataFrame, t_target: Callable, t_draft: dict, min_gap: float = float(np.log(1.1))
) -> pd.DataFrame:
    """The limit drawn : beside each measured speedup, the ladder of predictions of
    :func:`~specrepro.theory.speedup_decomposition` at the method's measured α and mean drafted tokens per step, and
    the share of the gap between Leviathan's ideal and the measurement that each cost explains.

    The ladder, each rung a speedup over AR: ``tokens_per_step`` (Leviathan Eq. 1, the c = 0 ideal with a
    verification as cheap as one step) >= ``free_draft`` (the measured verification curve t_target(γ + 1), draft
    free: :func:`~specrepro.theory.free_draft_bound`) >= ``hardware_aware`` (+ γ · t_draft(1)) >= ``with_overhead``
    (+ the measured per-step loop overhead of the method and of AR; equals ``summarize_speed``'s
    ``predicted_speedup_hardware``). Each step down is a factor: ``verification_factor`` = free_draft /
    tokens_per_step, ``draft_factor`` = hardware_aware / free_draft, ``overhead_factor`` = with_overhead /
    hardware_aware, ``unexplained_factor`` = measured / with_overhead (above 1: we measure more than the model
    predicts); their product is measured / tokens_per_step. The shares split the gap log(tokens_per_step /
    measured) the same way (``verification_share`` = -log verification_factor / gap, ...; the four sum to 1); they
    are NaN where the gap is below ``min_gap`` (a measurement at or above Leviathan's ideal has no gap to split).

    Args:
        summary: :func:`summarize_speed` output, optionally several concatenated with a ``temperature`` column (each
            temperature must hold its AR row, gamma 0).
        t_target: target cost curve n -> ms (e.g. :class:`~specrepro.theory.CostCurve`).
        t_draft: method name -> draft cost curve n -> ms, or None (free draft: n-gram, prompt lookup).
        min_gap: the smallest log gap (default log 1.1) whose shares are reported.

    Returns:
        one row per speculative method (gamma > 0): temperature (if given), method, draft (the method name without
        its " γ=..." suffix), gamma, alpha, drafted_per_step, c, tokens_per_step, free_draft, hardware_aware,
        with_overhead, measured, measured_lo, measured_hi (95% interval), n_prompts, verification_factor,
        draft_factor, overhead_factor, unexplained_factor, verification_share, draft_share, overhead_share,
        unexplained_share.

    Raises:
        ValueError: a temperature without its AR row.
    """
    groups = summary.groupby("temperature", sort=False) if "temperature" in summary else [(None, summary)]
    rows = []
    for temp, d in groups:
        ar = d[d["gamma"] == 0]
        if ar.empty:
            raise ValueError(f"limit_table: no AR row (gamma 0) at temperature {temp}")
        ar_overhead = float(ar["overhead_ms"].iloc[0]) if np.isfinite(ar["overhead_ms"].iloc[0]) else 0.0
        for _, row in d[d["gamma"] > 0].iterrows():
            g = float(row["drafted_per_step"]) if np.isfinite(row["drafted_per_step"]) else float(row["gamma"])
            a = float(row["alpha"]) if np.isfinite(row["alpha"]) else 0.0
            a = min(max(a, 0.0), 1.0)
            over = float(row["overhead_ms"]) if np.isfinite(row["overhead_ms"]) else 0.0
            ladder = speedup_decomposition(a, g, t_target, t_draft.get(row["method"]), overhead_ms=over,
                                           ar_overhead_ms=ar_overhead)
            measured = float(row["measured_speedup"])
            levels = np.array([ladder["tokens_per_step"], ladder["free_draft"], ladder["hardware_aware"],
                               ladder["with_overhead"], measured])
            factors = levels[1:] / levels[:-1]  # each cost's factor; their product is measured / tokens_per_step
            total = float(np.log(levels[0] / measured))
            shares = -np.log(factors) / total if total >= min_gap else np.full(4, np.nan)
            rows.append({**({"temperature": temp} if temp is not None else {}), "method": row["method"],
                         "draft": str(row["method"]).rsplit(" γ=", 1)[0], "gamma": int(row["gamma"]), "alpha": a,
                         "drafted_per_step": g, "c": float(row.get("c", np.nan)), **ladder, "measured": measured,
                         "measured_lo": float(row.get("measured_speedup_lo", np.nan)),
                         "measured_hi": float(row.get("measured_speedup_hi", np.nan)),
                         "n_prompts": row.get("n_prompts", np.nan), "verification_factor": factors[0],
                         "draft_factor": factors[1], "overhead_factor": factors[2], "unexplained_factor": factors[3],
                         "verification_share": shares[0], "draft_share": shares[1], "overhead_share": shares[2],
                         "unexplained_share": shares[3]})
    return pd.DataFrame(rows)


def best_measured_drafts(summary, temperature: float = 0.0) -> pd.DataFrame:
    """Our measured (α, c) per draft model, to mark on Leviathan's computed figures (notebook 02): for each draft
    model of a :func:`summarize_speed` table (rows with c > 0: n-gram and prompt-lookup drafts, c = 0, are left out)
    at ``temperature``, the γ with the highest measured speedup (a best of the γ measured, with that γ's own
    interval).

    Args:
        summary: notebook 04's ``leviathan_table2_speedup`` table (or None); tables written before intervals were
            recorded give NaN bounds.
        temperature: the temperature whose rows are used (when the table has a ``temperature`` column).

    Returns:
        one row per draft: label ("<draft>, best of N γ: γ = g (c = ...)"), draft, alpha, c, best_gamma, n_gammas,
        speedup, speedup_lo, speedup_hi; empty (same columns) when the table is None or has no draft model.
    """
    cols = ["label", "draft", "alpha", "c", "best_gamma", "n_gammas", "speedup", "speedup_lo", "speedup_hi"]
    if summary is None or not len(summary) or "c" not in summary:
        return pd.DataFrame(columns=cols)
    d = summary
    if "temperature" in d:
        d = d[np.isclose(d["temperature"].astype(float), float(temperature))]
    d = d[(d["gamma"] > 0) & (d["c"] > 0)].assign(draft=lambda x: x["method"].astype(str).str.rsplit(" γ=", n=1).str[0])
    rows = []
    for name, g in d.groupby("draft", sort=False):
        best = g.loc[g["measured_speedup"].idxmax()]
        rows.append({"label": f"{name}, best of {len(g)} γ: γ = {int(best['gamma'])} (c = {best['c']:.2f})",
                     "draft": name, "alpha": float(best["alpha"]), "c": float(best["c"]),
                     "best_gamma": int(best["gamma"]), "n_gammas": len(g), "speedup": float(best["measured_speedup"]),
                     "speedup_lo": float(best.get("measured_speedup_lo", np.nan)),
                     "speedup_hi": float(best.get("measured_speedup_hi", np.nan))})
    return pd.DataFrame(rows, columns=cols)
