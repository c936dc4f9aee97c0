"""Where the record stands: every shard, executed notebook and figure, current, stale (and why) or missing.

``python -m specrepro status`` (``make status``) compares what each artifact of the committed record was made from
with what the repository holds now: a **shard** (a ``make`` target measuring one table outside the notebooks) is stale
when its bytes differ from its sidecar's sha256, or it recorded other settings than its ``make`` recipe (a bench file)
or the standard profile (notebooks 03-06's shards) asks today; an **executed notebook** when its code cells differ
from its source's (:func:`specrepro.record.nbrun.code_drift`) or a table it read or wrote changed; a **figure** when
its files differ from its sidecar's sha256 or a table it was drawn from changed. Each row also gives the last run time
(minutes), its CPU and an estimate for this machine (:func:`forward_costs`). Not a runner: ``make`` runs things.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

from specrepro.files import atomic_write_text, cpu_description, repo_root
from specrepro.record.nbrun import code_drift, recorded_inputs, run_facts
from specrepro.record.results import file_changes, read_json

__all__ = ["Shard", "SHARDS", "record_shards", "shard_status", "notebook_status", "figure_status", "input_changes",
           "forward_costs", "SHARD_BOUND_MIN", "expected_settings", "status_table",
           "configure_parser", "run_command"]

#: a shard is sized to finish within this many minutes on the slowest CPU the record has met; a sitting that took
#: longer is noted (the shard resumes over sittings, but should be split)
SHARD_BOUND_MIN = 60

#: make's listing of every data/results path in a variable of the Makefile (the record's targets, as make expands them)
_LIST_OUTPUTS = ("_record_outputs: ; @: $(info $(foreach v,$(filter-out MAKEFLAGS,$(.VARIABLES)),"
                 "$(if $(filter file,$(origin $(v))),$(filter data/results/%,$($(v))))))")


@dataclass(frozen=True)
class Shard:
    """One measurement of record: its ``make`` target (the first output) and its outputs."""

    target: str
    outputs: tuple[str, ...]

    @property
    def name(self) -> str:
        return Path(self.target).stem


def _make(root: Path | None, *args: str, stdin: str | None = None) -> str:
    """``make``'s standard output for ``args`` (standard profile), in ``root``, without the flags and overrides of a
    make that runs this (``make --trace status`` would print into the output read here); ValueError when it fails."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    out = subprocess.run(["make", "--no-print-directory", "PROFILE=standard", *args], cwd=root or repo_root(),
                         capture_output=True, text=True, timeout=60, input=stdin, env=env)
    if out.returncode != 0:
        raise ValueError(f"make {' '.join(args)} failed: {out.stderr.strip()[:300]}")
    return out.stdout


def _standard_groups(root: Path | None = None) -> dict:
    """:func:`specrepro.record.shards.shard_groups` of the standard profile (``profiles/standard.yaml``)."""
    from specrepro.record.shards import shard_groups

    return shard_groups(yaml.safe_load(((root or repo_root()) / "profiles/standard.yaml").read_text()))


def record_shards(root: Path | None = None) -> tuple[Shard, ...]:
    """Every shard of the record (also ``SHARDS``): what the Makefile's variables list under data/results (the targets
    of a grouped rule ``a b &:`` as one shard), sorted, then notebooks 03-06's shards of the standard profile in
    their order (:func:`specrepro.record.shards.shard_groups`)."""
    root = root or repo_root()
    groups = {g[0]: tuple(g) for g in map(str.split, re.findall(r"^((?:data/results/\S+ )+)&:",
                                                                 (root / "Makefile").read_text(), flags=re.M))}
    within = {o for g in groups.values() for o in g[1:]}
    notebook = _standard_groups(root)
    # the listing rule is read after the Makefile from standard input (``--eval`` needs GNU make 3.82)
    words = _make(root, "-s", "-f", "Makefile", "-f", "-", "_record_outputs", stdin=_LIST_OUTPUTS + "\n").split()
    listed = sorted({w for w in words if w.startswith("data/results/")} - within)
    return tuple([Shard(t, groups.get(t, (t,))) for t in listed if Path(t).stem not in notebook]
                 + [Shard(f"data/results/{n}.csv", (f"data/results/{n}.csv",)) for n in notebook])


def __getattr__(name: str):
    if name == "SHARDS":
        return record_shards()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def expected_settings(shard: Shard, root: Path | None = None) -> dict | None:
    """What a notebook-03 to 06 shard's sidecar must record to be the measurement the standard profile asks for today
    (its group's ``expected``, :mod:`specrepro.record.shards`); None for other shards."""
    root = root or repo_root()
    group = _standard_groups(root).get(shard.name)
    return None if group is None else group.expected(shard.name, root / "data" / "results")


def input_changes(inputs: dict[str, str] | None, root: Path | None = None, made: str = "made") -> list[str]:
    """The recorded inputs (``{path relative to the repository: sha256}``) whose bytes are not those recorded: one
    phrase each ("<path> changed", "<path> missing"); empty when all are as recorded; for ``inputs`` None (the
    artifact was ``made`` before its inputs were recorded) "inputs not recorded (<made> before they were)"."""
    if inputs is None:
        return [f"inputs not recorded ({made} before they were)"]
    return [f"{rel} {state}" for rel, state in file_changes(inputs, root or repo_root()).items()]


def _row(kind: str, name: str, **more) -> dict:
    """A row of :func:`status_table`, current until a reason says otherwise (:func:`_judged`)."""
    return {"kind": kind, "name": name, "state": "current", "why": "", "minutes": math.nan, "cpu": "", **more}


def _judged(row: dict, reasons: list[str]) -> dict:
    return {**row, "state": "stale", "why": "; ".join(reasons)} if reasons else row


# --- bench files: recorded settings against the make recipe -------------------------------------------------------

def bench_setting_changes(config: dict, recipe: dict) -> list[str]:
    """Where a bench file's recorded ``config`` differs from what its ``make`` recipe asks for today
    (:func:`specrepro.bench.cli.command_settings`), one phrase per setting. A recipe's dtype ``auto`` matches any;
    only the options the recipe sets are compared; methods by their canonical names
    (:func:`specrepro.bench.registry.canonical_method`)."""
    from specrepro.bench.registry import canonical_method

    out = []
    config, recipe = ({**d, "methods": [canonical_method(m, d.get("options")) for m in d.get("methods") or []]}
                      for d in (config, recipe))
    for key, want in recipe.items():
        have = config.get(key)
        if key == "prompt_offset":  # files written before the option existed start at the first prompt
            have = have or 0
        if key == "options":
            have = {k: str(v) for k, v in (have or {}).items() if k in (want or {})}
        close = key in ("temperature", "top_p") and None not in (have, want) and math.isclose(float(have), float(want))
        if close or (key == "dtype" and want is None):
            continue
        if json.loads(json.dumps(have, default=str)) != json.loads(json.dumps(want, default=str)):
            out.append(f"{key}: recorded {have!r}, the Makefile asks {want!r}")
    return out


def _add_note(row: dict, text: str) -> None:
    row["note"] = "; ".join(filter(None, [row.get("note"), text]))


def _run_time(row: dict, meta: dict, folder: Path, runs: list | None = None) -> list[str]:
    """``row``'s CPU and minutes from what a run recorded (``meta``: a bench file's config or a table's sidecar; for a
    bench file written before it recorded its run time, the seconds of its timed ``runs``, a lower bound), and the
    reasons a table merged from parts is stale (a part missing or changed since); such a table's minutes are its
    longest part's, each part being its own sitting."""
    row["cpu"] = meta.get("cpu") or ""
    parts = meta.get("parts")
    if parts:
        row["minutes"] = round(max(float(p.get("seconds") or 0.0) for p in parts) / 60, 1)
        row["note"] = f"merged from {len(parts)} parts (minutes: the longest part's sitting)"
        changes = file_changes({str(p.get("file")): p.get("sha256") for p in parts}, folder)
        return [f"its part {name} is missing" if state == "missing" else f"its part {name} changed since the merge"
                for name, state in changes.items()]
    if meta.get("seconds") is not None:
        row["minutes"] = round(float(meta["seconds"]) / 60, 1)
    elif runs is not None:
        timed = sum(float(r.get("seconds") or 0.0) for r in runs)
        row["minutes"] = round(timed / 60, 1) if timed else math.nan
        row["note"] = "run time of its timed calls alone (a lower bound)"
    return []


def _hash_reasons(digests: dict | None, folder: Path) -> list[str]:
    """The files of a sidecar's ``sha256`` (``{file name: digest}``, under ``folder``) missing or not those bytes."""
    return [f"{name} differs from its sidecar's sha256" for name in file_changes(digests or {}, folder)]


def shard_status(shard: Shard, root: Path | None = None, recipe: list[str] | None = None) -> dict:
    """One shard's state ("current", "stale" or "missing"), why, its last run (minutes, CPU) and notes.

    Args:
        recipe: the shard's command lines, for bench files (default: the ``python -m specrepro`` lines that
            ``make -n -B`` prints for it today, executing nothing).
    """
    root = root or repo_root()
    row = _row("shard", shard.target, note="")
    if any(not (root / o).is_file() for o in shard.outputs):
        return {**row, "state": "missing", "why": f"`make {shard.target}` writes it"}
    path = root / shard.target
    prov = read_json(path.with_suffix(".provenance.json"))
    if path.suffix == ".json":  # a bench file: its settings against its recipe's
        data = json.loads(path.read_text())
        config = data.get("config", {})
        reasons = _run_time(row, config, path.parent, data.get("runs", []))
        if recipe is None:  # a line continued with a backslash is one command
            text = _make(root, "-n", "-B", shard.target).replace("\\\n", " ")
            recipe = [" ".join(ln.split()) for ln in text.splitlines() if "-m specrepro" in ln]
        bench = [ln for ln in recipe if " bench " in f" {ln} " and " --merge " not in f" {ln} "]
        if bench and not config.get("parts"):
            from specrepro.bench.cli import command_settings

            reasons += bench_setting_changes(config, command_settings(bench[0]))
        if config.get("blocks_under_load"):
            _add_note(row, f"{config['blocks_under_load']} of {config.get('blocks')} blocks timed under load")
        if prov is None:
            _add_note(row, "no sha256 sidecar (written before the bench wrote one)")
        else:
            reasons += _hash_reasons({path.name: (prov.get("sha256") or {}).get(path.name)}, path.parent)
    elif prov is None:
        reasons = ["no provenance sidecar"]
    else:
        reasons = _run_time(row, prov, path.parent) + _hash_reasons(prov.get("sha256"), path.parent)
        want = expected_settings(shard, root)
        differ = sorted(k for k, v in json.loads(json.dumps(want or {})).items() if prov.get(k) != v)
        if differ:
            reasons.append("measured under other settings than the profile's (" + ", ".join(differ)
                           + "): `SPECREPRO_RECORD=1 python -m specrepro shard " + shard.name
                           + " --profile profiles/standard.yaml` measures it afresh (make skips a file that exists)")
    if math.isfinite(row["minutes"]) and row["minutes"] > SHARD_BOUND_MIN:
        _add_note(row, f"one sitting took over {SHARD_BOUND_MIN} min")
    return _judged(row, reasons)


def notebook_status(source: Path, executed: Path, root: Path | None = None) -> dict:
    """One executed notebook's state against its source and the tables it read (see the module docstring)."""
    root = root or repo_root()
    name = str(executed.relative_to(root)) if executed.is_absolute() else str(executed)
    if not executed.is_file():
        return _row("notebook", name, state="missing", why=f"`make {name}` runs it")
    facts = run_facts(executed) or {}
    row = _row("notebook", name, minutes=float(facts.get("minutes", math.nan)), cpu=facts.get("cpu", ""))
    drift = code_drift(source, executed)
    return _judged(row, (["code cells " + ", ".join(map(str, drift)) + " changed since"] if drift else [])
                   + input_changes(recorded_inputs(executed), root, "executed"))


def figure_status(sidecar: Path, root: Path | None = None) -> dict:
    """One figure's state against its files' sha256 and the tables it was drawn from."""
    prov = json.loads(sidecar.read_text())
    row = _row("figure", f"figures/{sidecar.name.removesuffix('.provenance.json')}", cpu=prov.get("cpu", ""))
    changes = file_changes(prov.get("sha256") or {}, sidecar.parent)
    gone = [name for name, state in changes.items() if state == "missing"]
    if gone:
        return {**row, "state": "missing", "why": f"{gone[0]} missing"}
    return _judged(row, [f"{name} differs from its sidecar's sha256" for name in changes]
                   + input_changes(prov.get("inputs"), root or repo_root(), "drawn"))


# --- run-time estimates -----------------------------------------------------------------------------------------

def forward_costs(root: Path | None = None) -> dict[str, float]:
    """The 1.5B target's one-token forward cost (ms) per CPU (:func:`specrepro.files.cpu_description`) as the record
    measured it: the median over the float32 bench files' cost models (``config.cost_model.target_ms["1"]``) and
    notebook 04's cost curve (n = 1) on that CPU."""
    from specrepro.bench.run import bench_files

    root = root or repo_root()
    seen: dict[str, list[float]] = {}
    for path in bench_files(root / "data/results"):
        config = json.loads(path.read_text()).get("config", {})
        cost = (config.get("cost_model") or {}).get("target_ms", {}).get("1")
        if cost and config.get("cpu") and config.get("target") == "qwen2.5-coder-1.5b" \
                and config.get("dtype") == "float32":
            seen.setdefault(config["cpu"], []).append(float(cost))
    curves = root / "data/results/cost_curves.csv"
    if curves.is_file():
        prov = json.loads(curves.with_suffix(".provenance.json").read_text())
        first = pd.read_csv(curves).query("n == 1").head(1)  # the target comes first in the table
        if len(first) and prov.get("cpu"):
            seen.setdefault(prov["cpu"], []).append(float(first["ms"].iloc[0]))
    return {cpu: float(pd.Series(v).median()) for cpu, v in sorted(seen.items())}


def status_table(root: Path | None = None, here_ms: float | None = None, profile: str = "standard") -> pd.DataFrame:
    """Every shard, executed notebook of ``profile`` and figure of the record: kind, name, state, why, minutes (last
    run), cpu (where it ran), note (shards: blocks timed under load, a sitting over :data:`SHARD_BOUND_MIN`, or one
    that would take longer than that on the slowest CPU the record has met), estimate_min (for this machine) and
    slowest_min (for the slowest CPU of :func:`forward_costs`); NaN where a forward cost is unknown.

    Args:
        here_ms: this machine's one-token forward cost of the 1.5B target (ms); default: the record's for this CPU.
    """
    root = root or repo_root()
    costs = forward_costs(root)
    here_ms = costs.get(cpu_description()) if here_ms is None else here_ms
    slowest = max(costs.values(), default=None)
    rows = [shard_status(s, root) for s in record_shards(root)]
    rows += [notebook_status(src, root / "notebooks/executed" / profile / src.name, root)
             for src in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))]
    rows += [figure_status(sidecar, root) for sidecar in sorted((root / "figures").glob("*.provenance.json"))]
    for row in rows:
        m, c = row["minutes"], row["cpu"]
        for col, ms in (("estimate_min", here_ms), ("slowest_min", slowest)):
            row[col] = round(m * ms / costs[c], 1) if math.isfinite(m) and ms and c in costs else math.nan
        if row["kind"] == "shard" and row["slowest_min"] > SHARD_BOUND_MIN >= m:
            _add_note(row, f"about {row['slowest_min']:g} min on the slowest CPU the record has met ({slowest:.0f} ms "
                           f"per forward): over {SHARD_BOUND_MIN}, to be split")
    return pd.DataFrame(rows)


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--measure", action="store_true",
                   help="time this machine's forward cost (random weights, the 1.5B target's architecture; about a "
                        "minute) for the estimates, instead of the record's figure for this CPU")
    p.add_argument("--check", action="store_true", help="exit with status 1 when anything is stale or missing")
    p.add_argument("--json", dest="json_path", metavar="OUT", help="also write the table as JSON")


def run_command(args, parser=None) -> int:
    from specrepro.measure.cost import measure_forward_ms

    here = measure_forward_ms() if args.measure else None
    df = status_table(here_ms=here)
    cpu = cpu_description()
    here_ms = here if here is not None else forward_costs().get(cpu)
    print(f"this machine: {cpu}; 1.5B forward {'%.0f ms' % here_ms if here_ms else 'not measured here'}"
          f"{' (measured now)' if here is not None else ' (the record)' if here_ms else ' (make status MEASURE=1)'}")
    print(df.groupby(["kind", "state"]).size().unstack(fill_value=0).to_string())
    print()
    width = int(df["name"].str.len().max())
    for row in df.itertuples():
        took = "" if not math.isfinite(row.minutes) else f"last run {row.minutes:g} min"
        if took and math.isfinite(row.estimate_min):
            took += f", about {row.estimate_min:g} min here"
        extra = "; ".join(x for x in (row.why, getattr(row, "note", "") or "") if isinstance(x, str) and x)
        print(f"{row.kind:<9}{row.state:<8} {row.name:<{width}}  {took}" + (f"  | {extra}" if extra else ""))
    if args.json_path:
        atomic_write_text(Path(args.json_path), df.to_json(orient="records", indent=1) + "\n")
    return 1 if args.check and (df["state"] != "current").any() else 0
