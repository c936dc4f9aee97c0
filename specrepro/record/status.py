"""Where the record stands: every shard, executed notebook and figure, current, stale (and why) or missing.

What this file is: ``python -m specrepro status`` (``make status``). It compares what each artifact of the committed
record was made from with what the repository holds now, so that staleness is detected rather than remembered:

- a **shard** (one ``make`` target that measures and writes one table of the record outside the notebooks: the
  bench files, the whole-workload greedy equality and pass@1 runs, the audit, ...) is stale when its bytes differ
  from the sha256 its sidecar records, or, for a bench file, when the settings it recorded (methods, prompts, tokens,
  sampling, passes, dtype, options) differ from its ``make`` recipe today (``make -n``);
- an **executed notebook** (``notebooks/executed/standard/``) is stale when its code cells differ from its source's
  (:func:`specrepro.record.nbrun.code_drift`), or when a table it read or wrote (``metadata.specrepro.inputs``,
  :func:`specrepro.record.nbrun.stamp_inputs`) no longer has the bytes it had; one executed before inputs were
  recorded is stale until its next run ("inputs not recorded");
- a **figure** (``figures/*.provenance.json``) is stale when its files differ from its sidecar's sha256, or a table it
  was drawn from (the sidecar's ``inputs``, :func:`specrepro.record.results.save_figure`) has changed since.

Each row also gives the artifact's last measured run time (minutes, from the notebook's run stamp or the shard's
recorded seconds), the CPU it ran on, and an estimate for this machine: that time scaled by the ratio of the 1.5B
target's one-token forward cost here to its cost on that CPU (:func:`forward_costs` reads them from the record's cost
models; ``--measure`` times a random-weight model of the target's architecture on this machine when the record has
none for its CPU).

What it is not: a runner (``make reproduce`` and the shards' targets run things) or the scorecard.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from specrepro.files import cpu_description, repo_root, sha256_bytes
from specrepro.record.nbrun import code_drift, recorded_inputs, run_facts

__all__ = ["Shard", "SHARDS", "OTHER_SHARDS", "record_shards", "BENCH_PARTS", "STATES", "shard_status",
           "notebook_status", "figure_status", "input_changes", "forward_costs", "measure_forward_ms",
           "SHARD_BOUND_MIN", "expected_settings", "status_table", "configure_parser", "run_command"]

#: the states an artifact can be in
STATES = ("current", "stale", "missing")
#: a shard is sized to finish within this many minutes on the slowest CPU the record has met; a sitting that took
#: longer is noted (the shard resumes over sittings, but should be split)
SHARD_BOUND_MIN = 60


@dataclass(frozen=True)
class Shard:
    """One measurement of record outside the notebooks: its ``make`` target (the first output) and its outputs."""

    target: str
    outputs: tuple[str, ...]

    @property
    def name(self) -> str:
        return Path(self.target).stem


def _bench(name: str) -> Shard:
    return Shard(f"data/results/{name}.json", (f"data/results/{name}.json",))


def _csv(*names: str) -> Shard:
    return Shard(f"data/results/{names[0]}.csv", tuple(f"data/results/{n}.csv" for n in names))


#: bench files timed in parts (``bench --part I/K``, then ``--merge``): the number of parts of each; every part is a
#: shard of its own (a sitting), the merged file another
BENCH_PARTS = {"bench_qwen_drafts": 4, "bench_qwen_nucleus": 4, "bench_qwen_chat": 4, "bench_llamacpp_16bit_greedy": 2,
               "bench_llamacpp_16bit_t1": 2}

#: the shards of the record outside notebooks 03-06: each is one Makefile rule (tests/test_status.py checks that every
#: Makefile rule writing data/results outside a notebook is here or among :func:`record_shards`' notebook shards)
OTHER_SHARDS: tuple[Shard, ...] = (
    *(_bench(n) for n in ("bench_qwen_greedy", "bench_qwen_nucleus", "bench_qwen_t1_trees", "bench_qwen_t1_block",
                          "bench_qwen_dynamic_probe", "bench_qwen_medusa", "bench_qwen_verifiers_t1",
                          "bench_qwen_verifiers_nucleus", "bench_qwen_drafts", "bench_qwen_chat", "bench_qwen_bf16",
                          "bench_llamacpp_greedy", "bench_llamacpp_spec", "bench_llamacpp_vs_ours",
                          "bench_llamacpp_chat", "bench_llamacpp_t1", "bench_qwen_heldout_greedy",
                          "bench_qwen_heldout_chat", "bench_llamacpp_16bit_greedy",
                          "bench_llamacpp_16bit_t1", *(f"{n}.p{i}" for n, k in BENCH_PARTS.items() for i in range(k)))),
    _csv("greedy_equality_humaneval"),
    _csv("chen_quality_humaneval", "chen_quality_humaneval_completions"),
    *(_csv(f"divergences_{n}") for n in ("bench_qwen_bf16", "bench_llamacpp_greedy", "bench_llamacpp_spec",
                                         "bench_llamacpp_chat")),
    _csv("audit_transformers"),
    _csv("audit_llamacpp"),
    _csv("llamacpp_formats"),
    _csv("llamacpp_variants"),
    _csv("verdict_history"),
)


def _standard_groups(root: Path | None = None) -> dict:
    """:func:`specrepro.record.shards.shard_groups` of the standard profile (``profiles/standard.yaml``)."""
    import yaml

    from specrepro.record.shards import shard_groups

    return shard_groups(yaml.safe_load(((root or repo_root()) / "profiles/standard.yaml").read_text()))


def record_shards() -> tuple[Shard, ...]:
    """Every shard of the record: :data:`OTHER_SHARDS`, then notebooks 03-06's shards of the standard profile, as
    :func:`specrepro.record.shards.shard_groups` describes them (also ``SHARDS``)."""
    return OTHER_SHARDS + tuple(_csv(n) for n in _standard_groups())


def __getattr__(name: str):
    if name == "SHARDS":
        return record_shards()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def expected_settings(shard: Shard, root: Path | None = None) -> dict | None:
    """What a notebook-03, 04, 05 or 06 shard's sidecar must record to be the measurement the standard profile asks
    for today (the group's ``expected``: :class:`specrepro.record.shards.Table2Shards`' T = 1 parts' methods, which
    follow the greedy parts, are not compared; a tree-speed part's tree and chain, and a Medusa shard's tree from an
    accuracy table, are compared with the choice the recorded tables make); None for other shards."""
    root = root or repo_root()
    group = _standard_groups(root).get(shard.name)
    return None if group is None else group.expected(shard.name, root / "data" / "results")


def input_changes(inputs: dict[str, str], root: Path | None = None) -> list[str]:
    """The recorded inputs (``{path relative to the repository: sha256}``) whose bytes are not those recorded: one
    phrase each ("<path> changed", "<path> missing"); empty when all are as recorded."""
    root = root or repo_root()
    out = []
    for rel, digest in sorted(inputs.items()):
        path = Path(rel) if Path(rel).is_absolute() else root / rel
        if not path.is_file():
            out.append(f"{rel} missing")
        elif sha256_bytes(path.read_bytes()) != digest:
            out.append(f"{rel} changed")
    return out


# --- bench files: recorded settings against the make recipe -------------------------------------------------------

#: bench config key -> (bench CLI option dest, how to compare); the settings that decide what a bench file measures
_BENCH_SETTINGS = ("methods", "n_prompts", "prompt_offset", "part", "max_new_tokens", "temperature", "top_p", "top_k",
                   "seed", "repeats", "workload", "options", "chat_template", "dtype")


def make_recipe(target: str, root: Path | None = None) -> list[str]:
    """The command lines ``make`` would run for ``target`` today (``make -n -B``, dry run; nothing is executed),
    with make's own lines and the environment's set-up left out."""
    out = subprocess.run(["make", "--no-print-directory", "-n", "-B", target], cwd=root or repo_root(),
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise ValueError(f"make -n {target} failed: {out.stderr.strip()[:300]}")
    text = out.stdout.replace("\\\n", " ")  # a recipe line continued with a backslash is one command
    return [" ".join(ln.split()) for ln in text.splitlines() if "-m specrepro" in ln]


def _recipe_settings(line: str) -> dict:
    """The settings a ``python -m specrepro bench ...`` command line asks for, as the bench records them."""
    from specrepro.bench.cli import configure_parser as bench_parser

    words = shlex.split(line)
    words = words[words.index("bench") + 1:]
    p = argparse.ArgumentParser(add_help=False)
    bench_parser(p)
    args, _ = p.parse_known_args(words)
    methods = [m.strip() for m in (args.methods or "").split(",") if m.strip()]
    if methods and args.baseline not in methods:  # the bench runs its baseline first when it is not named
        methods.insert(0, args.baseline)
    options = dict(o.split("=", 1) for o in args.opt)
    from specrepro.bench.run import parse_part

    return {"methods": methods, "n_prompts": args.n_prompts, "prompt_offset": args.prompt_offset,
            "part": None if args.part is None else list(parse_part(args.part)),
            "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k, "seed": args.seed,
            "repeats": args.repeats, "workload": args.workload, "options": options, "chat_template": bool(args.chat),
            "dtype": None if args.dtype == "auto" else args.dtype}


def bench_setting_changes(config: dict, recipe: dict) -> list[str]:
    """Where a bench file's recorded ``config`` differs from what its ``make`` recipe asks for today (one phrase per
    setting; a dtype of ``auto`` in the recipe matches any; options are compared as the bench's ``--opt`` values, so
    an option the recipe does not set is not compared; methods by the names that are their whole configuration,
    :func:`specrepro.bench.registry.canonical_method`, so ``sd-draft-adaptive@20`` with ``--opt draft_kind=int8`` is
    ``sd-draft-adaptive-int8@20``)."""
    from specrepro.bench.registry import canonical_method

    out = []
    config = {**config, "methods": [canonical_method(m, config.get("options")) for m in config.get("methods") or []]}
    recipe = {**recipe, "methods": [canonical_method(m, recipe.get("options")) for m in recipe.get("methods") or []]}
    for key in _BENCH_SETTINGS:
        want, have = recipe.get(key), config.get(key)
        if key == "dtype" and want is None:
            continue
        if key == "prompt_offset":  # files written before the option existed start at the first prompt
            have = have or 0
        if key == "options":
            have = {k: str(v) for k, v in (have or {}).items() if k in (want or {})}
        if key in ("temperature", "top_p") and have is not None and want is not None:
            if math.isclose(float(have), float(want)):
                continue
        if json.loads(json.dumps(have, default=str)) != json.loads(json.dumps(want, default=str)):
            out.append(f"{key}: recorded {have!r}, the Makefile asks {want!r}")
    return out


def _merged_from_parts(row: dict, parts: list[dict], folder: Path) -> list[str]:
    """A table merged from parts: each part was its own sitting, so ``row``'s minutes are the longest part's; the
    reasons it is stale (a part missing, or changed since the merge)."""
    row["minutes"] = round(max(float(p.get("seconds") or 0.0) for p in parts) / 60, 1)
    row["note"] = f"merged from {len(parts)} parts (minutes: the longest part's sitting)"
    reasons = []
    for p in parts:
        f = folder / str(p.get("file"))
        if not f.is_file():
            reasons.append(f"its part {p.get('file')} is missing")
        elif sha256_bytes(f.read_bytes()) != p.get("sha256"):
            reasons.append(f"its part {p.get('file')} changed since the merge")
    return reasons


def _run_time(row: dict, meta: dict, folder: Path) -> list[str]:
    """``row``'s CPU and minutes from what a run recorded (``meta``: a bench file's config or a table's sidecar): the
    whole run's seconds, or the longest part's of a table merged from parts (then the reasons it is stale)."""
    row["cpu"] = meta.get("cpu") or ""
    if meta.get("parts"):  # merged from parts (bench, greedy-equality or pass-at-1 --merge)
        return _merged_from_parts(row, meta["parts"], folder)
    if meta.get("seconds") is not None:
        row["minutes"] = round(float(meta["seconds"]) / 60, 1)
    return []


def _add_note(row: dict, text: str) -> None:
    row["note"] = "; ".join(filter(None, [row.get("note"), text]))


def _hash_reasons(digests: dict | None, folder: Path) -> list[str]:
    """The files of a sidecar's ``sha256`` (``{file name: digest}``, under ``folder``) missing or not those bytes."""
    return [f"{name} differs from its sidecar's sha256" for name, digest in sorted((digests or {}).items())
            if not (folder / name).is_file() or sha256_bytes((folder / name).read_bytes()) != digest]


def shard_status(shard: Shard, root: Path | None = None, recipe: list[str] | None = None) -> dict:
    """One shard's state (:data:`STATES`), the reasons, and its last run (minutes, CPU) where recorded.

    Args:
        recipe: the shard's command lines (default: :func:`make_recipe`), for bench files.
    """
    root = root or repo_root()
    row = {"kind": "shard", "name": shard.target, "state": "current", "why": "", "minutes": math.nan, "cpu": "",
           "note": ""}
    missing = [o for o in shard.outputs if not (root / o).is_file()]
    if missing:
        return {**row, "state": "missing", "why": f"`make {shard.target}` writes it"}
    reasons = []
    path = root / shard.target
    if path.suffix == ".json":
        config = json.loads(path.read_text()).get("config", {})
        parts = config.get("parts") or []
        reasons += _run_time(row, config, path.parent)
        if not parts and config.get("seconds") is None:  # written before the bench recorded its run time: the
            # timed calls alone (loading and cost model not included, so a lower bound)
            timed = sum(float(r.get("seconds") or 0.0) for r in json.loads(path.read_text()).get("runs", []))
            row["minutes"] = round(timed / 60, 1) if timed else math.nan
            row["note"] = "run time of its timed calls alone (a lower bound)"
        lines = recipe if recipe is not None else make_recipe(shard.target, root)
        bench = [ln for ln in lines if " bench " in f" {ln} " and " --merge " not in f" {ln} "]
        if bench and not parts:
            reasons += bench_setting_changes(config, _recipe_settings(bench[0]))
        if config.get("blocks_under_load"):
            _add_note(row, f"{config['blocks_under_load']} of {config.get('blocks')} blocks timed under load")
        sidecar = path.with_suffix(".provenance.json")
        if sidecar.is_file():
            digest = (json.loads(sidecar.read_text()).get("sha256") or {}).get(path.name)
            if digest != sha256_bytes(path.read_bytes()):
                reasons.append(f"{path.name} differs from its sidecar's sha256")
        else:
            _add_note(row, "no sha256 sidecar (written before the bench wrote one)")
    else:
        sidecar = path.with_suffix(".provenance.json")
        if not sidecar.is_file():
            reasons.append("no provenance sidecar")
        else:
            prov = json.loads(sidecar.read_text())
            reasons += _run_time(row, prov, path.parent)
            reasons += _hash_reasons(prov.get("sha256"), sidecar.parent)
            want = expected_settings(shard, root)
            if want is not None:
                differ = sorted(k for k, v in json.loads(json.dumps(want)).items() if prov.get(k) != v)
                if differ:
                    reasons.append("measured under other settings than the profile's (" + ", ".join(differ)
                                   + "): `SPECREPRO_RECORD=1 python -m specrepro shard " + shard.name
                                   + " --profile profiles/standard.yaml` measures it afresh (make skips a file"
                                   " that exists)")
    if math.isfinite(row["minutes"]) and row["minutes"] > SHARD_BOUND_MIN:
        _add_note(row, f"one sitting took over {SHARD_BOUND_MIN} min")
    if reasons:
        return {**row, "state": "stale", "why": "; ".join(reasons)}
    return row


def notebook_status(source: Path, executed: Path, root: Path | None = None) -> dict:
    """One executed notebook's state against its source and the tables it read (see the module docstring)."""
    root = root or repo_root()
    name = str(executed.relative_to(root)) if executed.is_absolute() else str(executed)
    row = {"kind": "notebook", "name": name, "state": "current", "why": "", "minutes": math.nan, "cpu": ""}
    if not executed.is_file():
        return {**row, "state": "missing", "why": f"`make {name}` runs it"}
    facts = run_facts(executed) or {}
    row["minutes"] = float(facts.get("minutes", math.nan))
    row["cpu"] = facts.get("cpu", "")
    reasons = []
    drift = code_drift(source, executed)
    if drift:
        reasons.append("code cells " + ", ".join(map(str, drift)) + " changed since")
    inputs = recorded_inputs(executed)
    if inputs is None:
        reasons.append("inputs not recorded (executed before they were)")
    else:
        reasons += input_changes(inputs, root)
    return {**row, "state": "stale", "why": "; ".join(reasons)} if reasons else row


def figure_status(sidecar: Path, root: Path | None = None) -> dict:
    """One figure's state against its files' sha256 and the tables it was drawn from."""
    root = root or repo_root()
    prov = json.loads(sidecar.read_text())
    name = sidecar.name.removesuffix(".provenance.json")
    row = {"kind": "figure", "name": f"figures/{name}", "state": "current", "why": "", "minutes": math.nan,
           "cpu": prov.get("cpu", "")}
    reasons = []
    for fname, digest in sorted((prov.get("sha256") or {}).items()):
        f = sidecar.parent / fname
        if not f.is_file():
            return {**row, "state": "missing", "why": f"{fname} missing"}
        if sha256_bytes(f.read_bytes()) != digest:
            reasons.append(f"{fname} differs from its sidecar's sha256")
    if "inputs" not in prov:
        reasons.append("inputs not recorded (drawn before they were)")
    else:
        reasons += input_changes(prov["inputs"], root)
    return {**row, "state": "stale", "why": "; ".join(reasons)} if reasons else row


# --- run-time estimates -----------------------------------------------------------------------------------------

def forward_costs(root: Path | None = None) -> dict[str, float]:
    """The 1.5B target's one-token forward cost (ms) per CPU, as the record measured it: the median over the
    bench files' cost models (``config.cost_model.target_ms["1"]``) and notebook 04's cost curve (n = 1) on each
    CPU (:func:`specrepro.files.cpu_description`)."""
    root = root or repo_root()
    seen: dict[str, list[float]] = {}
    from specrepro.record.report import bench_files

    for path in bench_files(root / "data/results"):
        config = json.loads(path.read_text()).get("config", {})
        cost = (config.get("cost_model") or {}).get("target_ms", {}).get("1")
        if cost and config.get("cpu") and config.get("target") == "qwen2.5-coder-1.5b" \
                and config.get("dtype") == "float32":
            seen.setdefault(config["cpu"], []).append(float(cost))
    curves = root / "data/results/cost_curves.csv"
    if curves.is_file():
        prov = json.loads(curves.with_suffix(".provenance.json").read_text())
        df = pd.read_csv(curves)
        first = df[df["n"] == 1].head(1)  # the target comes first in the table
        if len(first) and prov.get("cpu"):
            seen.setdefault(prov["cpu"], []).append(float(first["ms"].iloc[0]))
    return {cpu: float(pd.Series(v).median()) for cpu, v in sorted(seen.items())}


def measure_forward_ms(repeats: int = 5, prefix_len: int = 128, seed: int = 0) -> float:
    """Time one KV-cached one-token forward of a random-weight model with the architecture of the zoo's 1.5B target
    (Qwen2.5-Coder-1.5B: 28 layers, hidden 1536, MLP 8960, 12 heads, 2 KV heads, vocabulary 151936) on a
    ``prefix_len``-token prefix, float32, on this CPU: the median of ``repeats`` calls, in ms. The arithmetic is the
    real model's; only the weights are random (it loads in seconds and needs no download).

    Raises:
        ValueError: repeats < 1 or prefix_len < 1.
    """
    import statistics
    import time

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if repeats < 1 or prefix_len < 1:
        raise ValueError(f"repeats and prefix_len must be >= 1, got {repeats}, {prefix_len}")
    gen = torch.Generator().manual_seed(seed)
    cfg = Qwen2Config(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                      num_key_value_heads=2, vocab_size=151936, max_position_embeddings=4096, tie_word_embeddings=True)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(cfg)
    model = model.to_empty(device="cpu").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02, generator=gen)
        ids = torch.randint(0, cfg.vocab_size, (1, prefix_len + 1), generator=gen)
        times = []
        for _ in range(repeats + 1):  # the first call warms up
            out = model(ids[:, :prefix_len], use_cache=True)
            t0 = time.perf_counter()
            model(ids[:, prefix_len:], past_key_values=out.past_key_values, use_cache=True)
            times.append(1000 * (time.perf_counter() - t0))
    return float(statistics.median(times[1:]))


def _estimate(minutes: float, cpu: str, costs: dict[str, float], here_ms: float | None) -> float:
    if not (math.isfinite(minutes) and here_ms and cpu in costs):
        return math.nan
    return round(minutes * here_ms / costs[cpu], 1)


def status_table(root: Path | None = None, here_ms: float | None = None, profile: str = "standard",
                 recipes: dict | None = None) -> pd.DataFrame:
    """Every shard, standard executed notebook and figure of the record: kind, name, state, why, minutes (last
    measured run), cpu (where it ran), note (shards: blocks timed under load, a sitting over
    :data:`SHARD_BOUND_MIN`, or one that would take longer than that on the slowest CPU the record has met),
    estimate_min (for this machine; NaN when a forward cost is unknown here or there), slowest_min (the same for the
    slowest CPU of :func:`forward_costs`).

    Args:
        here_ms: this machine's one-token forward cost of the 1.5B target (ms); default: the record's for this CPU
            (:func:`forward_costs`), or unknown.
        recipes: ``{shard target: command lines}`` to use instead of asking ``make`` (tests).
    """
    root = root or repo_root()
    costs = forward_costs(root)
    if here_ms is None:
        here_ms = costs.get(cpu_description())
    rows = [shard_status(s, root, None if recipes is None else recipes.get(s.target, [])) for s in record_shards()]
    for source in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        rows.append(notebook_status(source, root / "notebooks/executed" / profile / source.name, root))
    for sidecar in sorted((root / "figures").glob("*.provenance.json")):
        rows.append(figure_status(sidecar, root))
    df = pd.DataFrame(rows)
    df["estimate_min"] = [_estimate(m, c, costs, here_ms) for m, c in zip(df["minutes"], df["cpu"])]
    slowest = max(costs.values(), default=None)
    df["slowest_min"] = [_estimate(m, c, costs, slowest) for m, c in zip(df["minutes"], df["cpu"])]
    over = (df["kind"] == "shard") & (df["slowest_min"] > SHARD_BOUND_MIN) & (df["minutes"] <= SHARD_BOUND_MIN)
    df.loc[over, "note"] = [
        "; ".join(filter(None, [note if isinstance(note, str) else "",
                                f"about {m:g} min on the slowest CPU the record has met ({slowest:.0f} ms per "
                                f"forward): over {SHARD_BOUND_MIN}, to be split"]))
        for note, m in zip(df.loc[over, "note"], df.loc[over, "slowest_min"])]
    return df


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--measure", action="store_true",
                   help="time this machine's forward cost (random weights, the 1.5B target's architecture; about a "
                        "minute) for the estimates, instead of the record's figure for this CPU")
    p.add_argument("--check", action="store_true", help="exit with status 1 when anything is stale or missing")
    p.add_argument("--json", dest="json_path", metavar="OUT", help="also write the table as JSON")


def run_command(args, parser=None) -> int:
    here = measure_forward_ms() if args.measure else None
    df = status_table(here_ms=here)
    costs = forward_costs()
    cpu = cpu_description()
    here_ms = here if here is not None else costs.get(cpu)
    print(f"this machine: {cpu}; 1.5B forward {'%.0f ms' % here_ms if here_ms else 'not measured here'}"
          f"{' (measured now)' if here is not None else ' (the record)' if here_ms else ' (make status MEASURE=1)'}")
    counts = df.groupby(["kind", "state"]).size().unstack(fill_value=0)
    print(counts.to_string())
    print()
    width = int(df["name"].str.len().max())
    for row in df.itertuples():
        took = "" if not math.isfinite(row.minutes) else f"last run {row.minutes:g} min"
        if took and math.isfinite(row.estimate_min):
            took += f", about {row.estimate_min:g} min here"
        extra = "; ".join(x for x in (row.why, getattr(row, "note", "") or "") if isinstance(x, str) and x)
        print(f"{row.kind:<9}{row.state:<8} {row.name:<{width}}  {took}" + (f"  | {extra}" if extra else ""))
    if args.json_path:
        from specrepro.files import atomic_write_text

        atomic_write_text(Path(args.json_path), df.to_json(orient="records", indent=1) + "\n")
    return 1 if args.check and (df["state"] != "current").any() else 0
