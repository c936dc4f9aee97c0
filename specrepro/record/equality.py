"""``python -m specrepro greedy-equality``: greedy speculative decoding against greedy AR on a whole workload.

What this file is: the command behind the exactness battery's test at scale: for every prompt of a workload
(all 164 HumanEval problems by default), greedy AR and greedy chain speculative decoding with the draft model, every
divergence explained by a measured near-tie (the target's top-2 logit gap, teacher-forced on the AR prefix, below
``--tie-bound``) or counted as a failure (:func:`specrepro.sim.real.greedy_equality`). The table goes through
:func:`specrepro.record.results.save_table` (the committed record only under ``make reproduce``), with the wall time.

An interrupted run resumes: every finished prompt is kept in a checkpoint (:func:`checkpoint_path`) that a rerun
under the same conditions reads, so the hours of a whole workload can be spread over several sittings.

What it is not: a timing (the two runs are not interleaved for speed; use ``python -m specrepro bench``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specrepro.files import repo_root

__all__ = ["configure_parser", "run_command", "checkpoint_path"]


def checkpoint_path(name: str, profile: str) -> Path:
    """Where ``greedy-equality`` keeps the per-prompt checkpoint of the table ``name`` under ``profile``:
    ``build/checkpoints/<name>.<profile>.json`` (git-ignored), deleted once the table is saved. An interrupted run
    with the same models, settings, prompts, machine and code resumes at the first unfinished prompt."""
    return repo_root() / "build" / "checkpoints" / f"{name}.{profile}.json"


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Options of ``python -m specrepro greedy-equality`` (defaults shown by ``--help``)."""
    p.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    p.add_argument("--pair", default="qwen-coder", help="a named target/draft pair")
    p.add_argument("--workload", default="humaneval", help="humaneval, pydoc, or a .jsonl file of {\"prompt\": ...}")
    p.add_argument("--n-prompts", type=int, default=None, help="first N prompts (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--gamma", type=int, default=3, help="draft length γ of the speculative run")
    p.add_argument("--tie-bound", type=float, default=1e-3,
                   help="largest top-2 logit gap (logit units) accepted as a floating-point near-tie")
    p.add_argument("--profile", default="standard", help="profile the table is saved under (results directory)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--name", default="greedy_equality_humaneval", help="result table name")


def run_command(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    """Run the check and save the table; prints the counts. Exit status 0 when no divergence is a failure, 1 when
    some is (the table names them).

    Raises:
        ValueError: γ < 1, max_new_tokens < 1, tie_bound <= 0 (before any model loads); errors of model loading.
    """
    if args.gamma < 1 or args.max_new_tokens < 1 or not args.tie_bound > 0:
        raise ValueError(f"need gamma >= 1, max_new_tokens >= 1 and tie_bound > 0; got {args.gamma}, "
                         f"{args.max_new_tokens}, {args.tie_bound}")
    import torch

    from specrepro.core.decoding import default_eos_ids, generate
    from specrepro.files import code_fingerprint, cpu_description
    from specrepro.data import load_workload
    from specrepro.drafters.model import DraftModelDrafter
    from specrepro.models import PAIRS, load_pair
    from specrepro.record.results import check_clean_for_record, save_table
    from specrepro.sim.real import greedy_equality

    check_clean_for_record(args.profile)  # before hours of decoding, not after
    if args.pair not in PAIRS:
        raise KeyError(f"unknown pair {args.pair!r}; known pairs: {', '.join(PAIRS)}")
    target, draft = PAIRS[args.pair]
    tm, dm, tok = load_pair(target, draft, device=args.device, dtype=args.dtype)
    prompts = load_workload(args.workload, args.n_prompts)
    ids = [tok(p.text, return_tensors="pt").input_ids[0] for p in prompts]
    eos = default_eos_ids(tm, tok)
    drafter = DraftModelDrafter(dm, tm.get_output_embeddings().weight.shape[0])

    def speculative(x):
        return generate(tm, x, drafter=drafter, gamma=args.gamma, max_new_tokens=args.max_new_tokens,
                        eos_token_id=eos)

    ckpt = checkpoint_path(args.name, args.profile)
    key = {"target": target, "draft": draft, "workload": args.workload, "prompt_ids": [p.id for p in prompts],
           "max_new_tokens": args.max_new_tokens, "gamma": args.gamma, "tie_bound": args.tie_bound,
           "device": args.device, "dtype": str(tm.dtype), "cpu": cpu_description(), "torch": torch.__version__,
           "code": code_fingerprint()}
    table = greedy_equality(tm, ids, speculative, max_new_tokens=args.max_new_tokens, tie_bound=args.tie_bound,
                            eos_token_id=eos, progress=True, checkpoint=ckpt, checkpoint_key=key)
    table.insert(0, "prompt_id", [p.id for p in prompts])
    seconds = float(table.attrs.get("seconds", float("nan")))
    save_table(table, args.name, profile=args.profile, device=args.device, target=target, draft=draft,
               gamma=args.gamma, max_new_tokens=args.max_new_tokens, tie_bound=args.tie_bound,
               n_prompts=len(prompts), seconds=round(seconds, 1), resumed_prompts=int(table.attrs["resumed"]))
    ckpt.unlink(missing_ok=True)
    n, same = len(table), int(table["identical"].sum())
    explained, failures = int(table["explained"].sum()), int(table["failure"].sum())
    print(f"{target} + {draft}, {args.workload}: {n} prompts x {args.max_new_tokens} tokens, gamma {args.gamma}: "
          f"{same} identical, {explained} divergences explained by a near-tie (top-2 gap < {args.tie_bound:g}), "
          f"{failures} failures; {seconds / 60:.1f} min")
    return 1 if failures else 0
