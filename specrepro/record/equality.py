"""``python -m specrepro greedy-equality``: greedy chain speculative decoding against greedy AR on a whole workload
(all 164 HumanEval problems by default), every divergence explained by a near-tie (the target's top-2 logit gap,
teacher-forced on the AR prefix, below ``--tie-bound``) or counted as a failure
(:func:`specrepro.sim.real.greedy_equality`): the exactness battery's test at scale, not a timing.

Resumable from a checkpoint under the same models, settings, prompts, torch and :data:`DECODING_MODULES`, whatever the
commit or CPU (each row names its sitting's); ``--part``/``--merge`` as :mod:`specrepro.record.parts`. ``--from-bench
FILE`` instead explains a bench file's greedy divergences (:func:`specrepro.lab.equality.bench_divergences`; a
llama.cpp bench file by :mod:`specrepro.sim.llama_equality`). The shared machinery of whole-workload commands
(``pass-at-1`` too) lives here.
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace

from specrepro.files import checkpoint_file, code_fingerprint, cpu_description, git_commit, sha256_bytes
from specrepro.record.parts import merged_provenance, parse_part_name, part_name, part_span, read_parts
from specrepro.record.results import check_clean_for_record, save_table

__all__ = ["configure_parser", "run_command", "divergences_name", "DECODING_MODULES", "add_workload_options",
           "workload_run", "run_key", "save_run", "save_merged"]

#: The modules whose code (with every package module they import: :func:`specrepro.files.code_fingerprint`) decides a
#: row's tokens; a checkpoint resumes only under the same code of these.
DECODING_MODULES = ("specrepro.core.decoding", "specrepro.drafters.model", "specrepro.models", "specrepro.data",
                    "specrepro.sim.real")


def add_workload_options(p: argparse.ArgumentParser, *, workload_help: str, gamma: int) -> None:
    """The options every whole-workload record command (``greedy-equality``, ``pass-at-1``) shares."""
    p.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    p.add_argument("--pair", default="qwen-coder", help="a named target/draft pair")
    p.add_argument("--workload", default="humaneval", help=workload_help)
    p.add_argument("--n-prompts", type=int, default=None, help="first N prompts (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--gamma", type=int, default=gamma, help="draft length γ of the speculative run")
    p.add_argument("--profile", default="standard", help="profile the tables are saved under (results directory)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--part", metavar="I/K", default=None,
                   help="decode only the I-th of K consecutive slices of the prompts (0 <= I < K; each prompt as in "
                        "the whole run), saved as <name>.p<I>: a sitting of a K-th of the work")
    p.add_argument("--merge", metavar="PART_CSV", nargs="+", default=None,
                   help="instead: join the part tables <name>.p<I>.csv of one run (every part 0..K-1 once, same "
                        "settings and CPU, bytes as their sidecars record) into <name>")


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Options of ``python -m specrepro greedy-equality`` (defaults shown by ``--help``)."""
    add_workload_options(p, workload_help="humaneval, pydoc, or a .jsonl file of {\"prompt\": ...}", gamma=3)
    p.add_argument("--tie-bound", type=float, default=1e-3,
                   help="largest top-2 logit gap (logit units) accepted as a floating-point near-tie")
    p.add_argument("--name", default="greedy_equality_humaneval", help="result table name")
    p.add_argument("--from-bench", metavar="JSON", default=None,
                   help="instead: explain every greedy output of this bench file that differs from its AR run "
                        "(table divergences_<bench name>)")
    p.add_argument("--tie-spacings", type=float, default=2.0,
                   help="with --from-bench: the near-tie bound in spacings of the model's dtype at the logits "
                        "(the bound is the larger of this and --tie-bound)")
    p.add_argument("--tie-disagreements", type=float, default=4.0,
                   help="with --from-bench on a llama.cpp bench file: a divergence is a near-tie when "
                        "|logit(reference token) - logit(other token)| <= max(--tie-bound, this x d) on every "
                        "replayed path, d = the largest spread of either token's logit over the paths (the rule and "
                        "why 4: specrepro.sim.llama_equality)")


def divergences_name(bench_json: str | Path) -> str:
    """The table explaining a bench file's greedy divergences: ``divergences_<bench file stem>`` (not ``bench_*``)."""
    return f"divergences_{Path(bench_json).stem}"


def workload_run(args: argparse.Namespace) -> SimpleNamespace:
    """What a whole-workload command decodes: the pair's ``target`` and ``draft``, ``prompts`` (under ``--part`` a
    slice, from ``start`` of ``n_whole``), the table's ``name`` and ``part`` settings, its ``ckpt`` file and the
    sitting's ``row_info`` (commit, CPU), then the loaded ``tm``, ``dm``, ``tok``, ``eos`` and ``drafter``.

    Raises:
        KeyError: an unknown pair. ValueError: a part without prompts, a dirty tree under ``make reproduce`` (both
            before the models load).
    """
    from specrepro.models import PAIRS, load_pair

    if args.pair not in PAIRS:
        raise KeyError(f"unknown pair {args.pair!r}; known pairs: {', '.join(PAIRS)}")
    check_clean_for_record(args.profile)  # before hours of decoding, not after
    from specrepro.core.decoding import default_eos_ids
    from specrepro.data import load_workload
    from specrepro.drafters.model import DraftModelDrafter

    r = SimpleNamespace(target=PAIRS[args.pair][0], draft=PAIRS[args.pair][1], name=args.name, part={}, start=0)
    r.prompts = load_workload(args.workload, args.n_prompts)
    r.n_whole = len(r.prompts)
    if args.part is not None:  # before the models load
        i, k, r.start, stop = part_span(r.n_whole, args.part)
        r.prompts, r.name = r.prompts[r.start:stop], part_name(args.name, (i, k))
        r.part = {"part": [i, k], "part_prompts": [r.start, stop]}
    r.ckpt = checkpoint_file(r.name, args.profile)  # deleted once the table is saved
    r.row_info = {"commit": git_commit(), "cpu": cpu_description()}
    r.tm, r.dm, r.tok = load_pair(r.target, r.draft, device=args.device, dtype=args.dtype)
    r.eos = default_eos_ids(r.tm, r.tok)
    r.drafter = DraftModelDrafter(r.dm, r.tm.get_output_embeddings().weight.shape[0])
    return r


def run_key(r: SimpleNamespace, args: argparse.Namespace, **settings) -> dict:
    """A :func:`workload_run`'s checkpoint key: models, prompts, sizes, ``settings``, device, dtype, torch and the
    decoding code (:data:`DECODING_MODULES`), not the commit or machine."""
    import torch

    return {"target": r.target, "draft": r.draft, "workload": args.workload, "prompt_ids": [p.id for p in r.prompts],
            "max_new_tokens": args.max_new_tokens, "gamma": args.gamma, **settings, "device": args.device,
            "dtype": str(r.tm.dtype), "torch": torch.__version__, "decoding_code": code_fingerprint(DECODING_MODULES)}


def save_run(r: SimpleNamespace, args: argparse.Namespace, tables: dict, rows, seconds: float, key: dict,
             **settings) -> None:
    """Save a :func:`workload_run`'s ``tables`` (``{name: DataFrame}``, in order), each with the sidecar's settings:
    the pair, sizes, ``settings``, workload, part, sittings and their rows (``rows``, per prompt); then delete the
    run's checkpoint."""
    prov = dict(target=r.target, draft=r.draft, gamma=args.gamma, max_new_tokens=args.max_new_tokens, **settings,
                workload=args.workload, n_prompts=r.n_whole, **r.part, seconds=round(seconds, 1),
                resumed_prompts=int(rows.attrs["resumed"]), decoding_code=key["decoding_code"],
                row_commits=sorted(set(rows["commit"])), row_cpus=sorted(set(rows["cpu"])))
    for name, table in tables.items():
        save_table(table, name, profile=args.profile, device=args.device, **prov)
    r.ckpt.unlink(missing_ok=True)


def save_merged(table, parts: list, args: argparse.Namespace) -> tuple[str, dict]:
    """Save ``table``, joined from ``parts`` (:func:`specrepro.record.parts.read_parts`'), as their whole table with
    the merged sidecar (:func:`specrepro.record.parts.merged_provenance`); returns ``(name, sidecar)``."""
    name, prov = parse_part_name(parts[0][0])[0], merged_provenance(parts)
    save_table(table, name, profile=parts[0][1].get("profile", args.profile), device=args.device, **prov)
    return name, prov


def run_command(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    """Run the check and save the table; prints the counts. Exit status 1 when some divergence is a failure, else 0.

    Raises:
        ValueError: γ < 1, max_new_tokens < 1, tie_bound <= 0 (before any model loads); errors of model loading.
    """
    if args.from_bench:
        return _run_from_bench(args)
    if args.merge:
        import pandas as pd

        parts = read_parts(args.merge)
        table = pd.concat([pd.read_csv(p) for p, _ in parts], ignore_index=True)
        name, prov = save_merged(table, parts, args)
        return _report(table, f"{name}: {prov.get('target')} + {prov.get('draft')}, merged from {len(parts)} parts",
                       prov, float(prov["seconds"]))
    if args.gamma < 1 or args.max_new_tokens < 1 or not args.tie_bound > 0:
        raise ValueError(f"need gamma >= 1, max_new_tokens >= 1 and tie_bound > 0; got {args.gamma}, "
                         f"{args.max_new_tokens}, {args.tie_bound}")
    from specrepro.core.decoding import generate
    from specrepro.sim.real import greedy_equality

    r = workload_run(args)
    ids = [r.tok(p.text, return_tensors="pt").input_ids[0] for p in r.prompts]
    speculative = partial(generate, r.tm, drafter=r.drafter, gamma=args.gamma, max_new_tokens=args.max_new_tokens,
                          eos_token_id=r.eos)
    key = run_key(r, args, tie_bound=args.tie_bound)
    table = greedy_equality(r.tm, ids, speculative, max_new_tokens=args.max_new_tokens, tie_bound=args.tie_bound,
                            eos_token_id=r.eos, progress=True, checkpoint=r.ckpt, checkpoint_key=key,
                            row_info=r.row_info)
    table.insert(0, "prompt_id", [p.id for p in r.prompts])
    table["prompt"] += r.start  # the prompt's index in the whole workload
    seconds = float(table.attrs.get("seconds", float("nan")))
    save_run(r, args, {r.name: table}, table, seconds, key, tie_bound=args.tie_bound)
    return _report(table, f"{r.name}: {r.target} + {r.draft}, {args.workload}", vars(args), seconds)


def _report(table, what: str, settings: dict, seconds: float) -> int:
    """Print a greedy-equality table's counts (``settings``: its max_new_tokens, gamma and tie_bound); exit status 1
    when a divergence is a failure."""
    n, same = len(table), int(table["identical"].sum())
    explained, failures = int(table["explained"].sum()), int(table["failure"].sum())
    print(f"{what}: {n} prompts x {settings['max_new_tokens']} tokens, gamma {settings['gamma']}: "
          f"{same} identical, {explained} divergences explained by a near-tie (top-2 gap < {settings['tie_bound']:g}), "
          f"{failures} failures; {seconds / 60:.1f} min")
    return 1 if failures else 0


def _run_from_bench(args: argparse.Namespace) -> int:
    """``--from-bench FILE``: :func:`specrepro.lab.equality.bench_divergences` (a llama.cpp bench file:
    :func:`specrepro.sim.llama_equality.llama_bench_divergences` on the prompts and target the bench ran) saved as
    :func:`divergences_name`; exit status 1 unless all are near-ties."""
    from specrepro.lab.equality import bench_divergences, bench_prompt_ids, open_llama_bench_target
    from specrepro.models import load_tokenizer
    from specrepro.sim.llama_equality import PATHS, is_llamacpp_bench, llama_bench_divergences, llama_references

    if not args.tie_bound > 0 or not args.tie_spacings >= 0:
        raise ValueError(f"need tie_bound > 0 and tie_spacings >= 0; got {args.tie_bound}, {args.tie_spacings}")
    path = Path(args.from_bench)
    if not path.exists():
        raise FileNotFoundError(f"no bench file {path}")
    check_clean_for_record(args.profile)
    raw = path.read_bytes()
    data = json.loads(raw)
    cfg = data["config"]
    if is_llamacpp_bench(cfg):
        if not args.tie_disagreements >= 0:
            raise ValueError(f"need tie_disagreements >= 0; got {args.tie_disagreements}")
        t0 = time.perf_counter()
        ids = bench_prompt_ids(cfg, load_tokenizer(cfg["target"]))
        lm = open_llama_bench_target(cfg)
        table = llama_bench_divergences(data, ids, lm, tie_disagreements=args.tie_disagreements,
                                        tie_bound=args.tie_bound, progress=True)
        seconds = time.perf_counter() - t0
        gguf = cfg["llamacpp"]["target_gguf"]
        methods = list(dict.fromkeys(r["method"] for r in data.get("runs") or []))
        settings = dict(tie_disagreements=args.tie_disagreements,
                        rule="near-tie: |logit(reference token) - logit(other token)| <= max(tie_bound, "
                             "tie_disagreements x d) on every path, d = the largest spread of either token's logit "
                             "over the paths",
                        paths=list(PATHS), references=llama_references(cfg, methods), target_gguf=gguf.get("file"),
                        target_sha256=gguf.get("sha256"), n_threads=lm.n_threads, seconds=round(seconds, 1))
        what = "(method, reference, prompt) divergences among llama.cpp outputs"
        rule = f"|gap| <= max({args.tie_bound:g}, {args.tie_disagreements:g} x the paths' disagreement) on every path"
        gaps = table.reindex(columns=["max_abs_gap"])["max_abs_gap"]  # NaN where no path was replayed
        ties = gaps[table["explained"].astype(bool)] if len(table) else gaps
        largest, largest_tie = (f"{g.max():.4g}" if g.notna().any() else "-" for g in (gaps, ties))
        tail = f"; largest |gap| {largest} (among near-ties {largest_tie}); {seconds / 60:.1f} min"
    else:
        table = bench_divergences(path, tie_bound=args.tie_bound, tie_spacings=args.tie_spacings)
        settings, tail = {"tie_spacings": args.tie_spacings}, ""
        what = "(method, prompt) divergences from greedy AR"
        rule = f"|gap| <= max({args.tie_bound:g}, {args.tie_spacings:g} spacings)"
    save_table(table, divergences_name(path), profile=args.profile, bench_file=path.name,
               bench_sha256=sha256_bytes(raw), tie_bound=args.tie_bound, **settings)
    n_bad = int((~table["explained"].astype(bool)).sum()) if len(table) else 0
    print(f"{path.name}: {len(table)} {what}, {len(table) - n_bad} near-ties ({rule}), {n_bad} not explained{tail}")
    return 1 if n_bad else 0
