"""``python -m specrepro bench``: the command line of the benchmark.

What this file is: :func:`configure_parser` (every option with its default; the help lists the methods) and
:func:`run_command` (option errors exit with status 2 and one line); :func:`command_settings`, what a command line
asks for as a bench file's ``config`` records it.

What it is not: the run itself (:mod:`specrepro.bench.run`).
"""

from __future__ import annotations

import argparse
import shlex
import sys

import torch

from specrepro.bench.registry import (
    DEFAULT_METHODS,
    PLUGIN_ERRORS,
    REGISTRY,
    known_methods,
)
from specrepro.bench.run import parse_part, run_bench

# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------

_EPILOG = """\
methods (--list-methods for one line each; not exact = not distribution-preserving under sampling):
{methods}

examples:
  python -m specrepro bench --pair qwen-coder --methods ar,sd-draft@4,sd-tree@2x2x1x1,sd-tree-merge,hf-assisted
  python -m specrepro bench --pair qwen-coder --methods sd-tree --tree 1x1x3x1x1 --temperature 1 --opt tree_mode=iid
  python -m specrepro bench --target smollm2-135m --methods ar,medusa,medusa@32,medusa-typical --medusa-heads auto
"""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The epilog as written (method list, examples) and every option's default in its help line (none shown for
    options without one: None, False or an empty list)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or action.default == [] or "(default" in (action.help
                                                                                                       or ""):
            return action.help
        return super()._get_help_string(action)


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Add the ``bench`` options to ``p`` (used by ``python -m specrepro bench``); the help lists every method and
    every option's default."""
    names = known_methods()
    p.formatter_class = _HelpFormatter
    p.epilog = _EPILOG.format(methods="\n".join(
        f"  {n:18s} {'' if REGISTRY[n].exact else '[not exact] '}{REGISTRY[n].description}" for n in names))
    p.add_argument("--pair", help="a named target/draft pair (e.g. qwen-coder); default when no --target is given")
    p.add_argument("--target", help="target model: zoo name, hub id or local path")
    p.add_argument("--draft", help="draft model for sd-draft/sd-tree/hf-assisted (zoo name, hub id, path; may "
                                   "equal --target)")
    p.add_argument("--methods", default=None,
                   help=f"comma-separated, each NAME, NAME@GAMMA, sd-tree@K1xK2x..., or medusa@NODES; known: "
                        f"{', '.join(names)} (default: {','.join(DEFAULT_METHODS)}; ar is always run)")
    p.add_argument("--tree", default=None, metavar="K1xK2x...",
                   help="expansion tree <k1,...,km> for sd-tree entries without @ (e.g. 2x2x1x1; default 2x1x...x1 "
                        "of depth gamma)")
    p.add_argument("--medusa-heads", default=None, metavar="DIR|auto|stdlib",
                   help="trained Medusa heads for medusa/medusa-typical: a directory from MedusaHeads.save or "
                        "get_or_train_heads (notebook 06), 'auto' = the newest cached heads of the target, or "
                        "'stdlib' = heads trained on the Python standard library's sources for this target "
                        "(get_or_train_stdlib_heads: cached; the first run trains them, ~30 min for a 1.5B model "
                        "on 2 cores)")
    p.add_argument("--list-methods", action="store_true", help="list the registered methods and exit")
    p.add_argument("--gamma", type=int, default=3, help="draft length γ")
    p.add_argument("--workload", default="humaneval", help="humaneval, pydoc, chat (six Spec-Bench-like categories, offline; with --chat-template), or a .jsonl file of {\"prompt\": ...}")
    p.add_argument("--n-prompts", type=int, default=10, help="use the first N prompts of the workload")
    p.add_argument("--prompt-offset", type=int, default=0, metavar="K",
                   help="skip the workload's first K prompts (held-out prompts: N prompts from K on)")
    p.add_argument("--part", default=None, metavar="I/K",
                   help="time only part I of K (0 <= I < K) of the prompts, each with the seed and method order it "
                        "has in the whole run (a shard of a run too long for one sitting; --merge joins the parts)")
    p.add_argument("--merge", nargs="+", default=None, metavar="PART",
                   help="merge the part files of one run (written with --part I/K, every I once) into --json OUT: "
                        "the runs and summary the whole run would have; nothing is timed")
    p.add_argument("--max-new-tokens", type=int, default=128, help="cap on new tokens per prompt")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass; 1 = off")
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--baseline", default="ar",
                   help="the method whose greedy tokens the others are compared with, run first if not named "
                        "(default ar; llama-server-ar for a run of llama.cpp methods alone)")
    p.add_argument("--seed", type=int, default=0, help="seeds one torch.Generator per (repeat, prompt)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="auto", help="float32, bfloat16, float16 or auto (fp32 on CPU, bf16 on CUDA)")
    p.add_argument("--repeats", type=int, default=1, help="timed passes over the prompts")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template (default: raw prompts)")
    p.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE",
                   help="extra method option, checked before any model loads: lookup_max_ngram=3 (sd-lookup, "
                        "hf-lookup, sd-tree-merge), draft_stop=0.4 (sd-draft-dynamic), tree_mode=iid|"
                        "without_replacement|topk (children under sampling, sd-tree/medusa), typical_epsilon=0.09, "
                        "typical_delta=0.3 (medusa-typical); a key none of the chosen methods reads is refused")
    p.add_argument("--json", dest="json_path", metavar="OUT", help="write the results as JSON")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up call per method")
    p.add_argument("--no-predict", action="store_true",
                   help="skip the cost measurements before and after timing (target forward time for n = 1..γ+1 "
                        "tokens, each fixed-γ chain's draft ms per token) and the hardware-aware prediction beside "
                        "each chain")


def command_settings(line: str) -> dict:
    """The settings a ``python -m specrepro bench ...`` command line asks for, as the bench records them in a file's
    ``config``: those that decide what a bench file measures (the baseline first among the methods when the line does
    not name it, as the bench runs it; dtype None for ``auto``)."""
    words = shlex.split(line)
    p = argparse.ArgumentParser(add_help=False)
    configure_parser(p)
    args, _ = p.parse_known_args(words[words.index("bench") + 1:])
    methods = [m.strip() for m in (args.methods or "").split(",") if m.strip()]
    if methods and args.baseline not in methods:
        methods.insert(0, args.baseline)
    return {"methods": methods, "n_prompts": args.n_prompts, "prompt_offset": args.prompt_offset,
            "part": None if args.part is None else list(parse_part(args.part)),
            "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k, "seed": args.seed,
            "repeats": args.repeats, "workload": args.workload, "options": dict(o.split("=", 1) for o in args.opt),
            "chat_template": bool(args.chat), "dtype": None if args.dtype == "auto" else args.dtype}


def run_command(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    """Run the ``bench`` subcommand. Malformed command lines go to ``parser.error`` (exit status 2); library errors
    (:class:`BenchOptionError`, an unknown model, a failed fetch, ...) propagate to :func:`specrepro.__main__.main`,
    which prints them as one line and exits with status 2."""
    if args.list_methods:
        for name in known_methods():
            s = REGISTRY[name]
            print(f"{name:20s} {s.family:12s} {'draft ' if s.needs_draft else '      '}"
                  f"{'' if s.exact else '[not exact] '}{s.description}")
        for m, e in PLUGIN_ERRORS.items():
            print(f"(plugin {m} not loaded: {e})")
        return 0
    die = parser.error if parser else _die
    if args.json_path:  # a file of the record: take its lock before the hours of timing, not after
        from specrepro.files import hold_record_lock_for

        hold_record_lock_for(args.json_path)
    if args.merge:
        if not args.json_path:
            die("--merge needs --json OUT (where the merged run is written)")
        from specrepro.bench.run import merge_part_files

        result = merge_part_files(args.merge, args.json_path)
        with _pd_options():
            print(result.table().to_string())
        print(f"wrote {args.json_path} ({len(args.merge)} parts)")
        return 0
    pair = args.pair
    if pair is not None and (args.target is not None or args.draft is not None):
        die("give either --pair or --target/--draft, not both")
    if pair is None and args.target is None:
        if args.draft is not None:
            die("--draft needs --target")
        pair = "qwen-coder"
    opts = {}
    for kv in args.opt:
        k, sep, v = kv.partition("=")
        if not sep:
            die(f"--opt expects KEY=VALUE, got {kv!r}")
        opts[k] = v
    if args.threads is not None:
        if args.threads < 1:
            die(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    run_bench(args.target, args.draft, pair=pair, methods=args.methods, baseline=args.baseline,
              gamma=args.gamma, workload=args.workload,
              n_prompts=args.n_prompts, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
              top_p=args.top_p, top_k=args.top_k, seed=args.seed, device=args.device, dtype=args.dtype,
              repeats=args.repeats, json_path=args.json_path, chat=args.chat, warmup=not args.no_warmup,
              options=opts, tree=args.tree, medusa_heads=args.medusa_heads, print_table=True,
              predict=not args.no_predict, prompt_offset=args.prompt_offset, part=args.part)
    if args.json_path:
        print(f"wrote {args.json_path}")
    return 0


def _pd_options():
    import pandas as pd

    return pd.option_context("display.width", 200, "display.max_columns", 20)


def _die(msg: str):
    print(f"specrepro bench: error: {msg}", file=sys.stderr)
    raise SystemExit(2)
