"""Whole-workload record tables measured in parts, then merged (``greedy-equality`` and ``pass-at-1`` with
``--part I/K``, then ``--merge``), so that a table of hours is made in sittings of at most an hour each. Part I of K
decodes the I-th of K consecutive slices of the prompts (:func:`specrepro.bench.run.part_bounds`), each as in the
whole run, saved as the table ``<name>.p<I>`` with its own sidecar; :func:`read_parts` checks the parts before a
merge, :func:`merged_provenance` is the merged table's sidecar (the bench's: :func:`specrepro.bench.run.merge_parts`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

__all__ = ["PER_PART", "part_name", "companion_name", "part_span", "parse_part_name", "read_parts",
           "merged_provenance"]

#: sidecar keys that differ from part to part by design (the sitting and the slice), not settings
PER_PART = frozenset({"part", "part_prompts", "prompt_ids", "seconds", "resumed_prompts", "row_commits", "row_cpus",
                      "commit", "date", "sha256"})

_PART_STEM = re.compile(r"^(?P<name>.+)\.p(?P<i>\d+)$")


def part_name(name: str, part: tuple[int, int]) -> str:
    """The table name of part ``(i, k)`` of the table ``name``: ``<name>.p<i>``."""
    return f"{name}.p{int(part[0])}"


def companion_name(name: str, suffix: str) -> str:
    """The table written beside ``name`` under ``suffix``: ``<name><suffix>``, and beside part ``<base>.p<i>``
    ``<base><suffix>.p<i>`` (each table's parts share its name's stem), e.g. ``pass-at-1``'s completions."""
    m = _PART_STEM.match(name)
    return f"{m['name']}{suffix}.p{m['i']}" if m else f"{name}{suffix}"


def parse_part_name(path: str | Path) -> tuple[str, int]:
    """``data/results/greedy_equality_humaneval.p3.csv`` -> ``("greedy_equality_humaneval", 3)``; ValueError when the
    file name is not ``<name>.p<i>.csv``."""
    m = re.fullmatch(r"(?P<name>.+)\.p(?P<i>\d+)\.csv", Path(path).name)
    if not m:
        raise ValueError(f"{path}: not a part table (<name>.p<i>.csv, written with --part I/K)")
    return m["name"], int(m["i"])


def part_span(n_prompts: int, part) -> tuple[int, int, int, int]:
    """``(i, k, start, stop)`` of part ``part`` (``"i/k"`` or ``(i, k)``) of a run over ``n_prompts`` prompts: the
    prompts ``[start, stop)`` (:func:`specrepro.bench.run.part_bounds`; its BenchOptionError, a ValueError, when not
    I/K with 0 <= I < K <= n_prompts)."""
    from specrepro.bench.run import parse_part, part_bounds

    i, k = parse_part(part)
    return (i, k, *part_bounds(n_prompts, i, k))


def read_parts(paths) -> list[tuple[Path, dict]]:
    """The part tables at ``paths`` (the ``<name>.p<i>.csv`` files of one run, in any order), checked, as ``(path,
    sidecar)`` in part order.

    Raises:
        FileNotFoundError: a part or its sidecar is missing.
        ValueError: a file whose bytes differ from its sidecar's sha256; parts of different tables; and as
            :func:`specrepro.bench.run.check_part_set` (not the parts 0..K-1 each once, spans not consecutive from 0
            to the whole run's prompts, parts that differ in a setting or in the CPU they ran on).
    """
    from specrepro.bench.run import check_part_set
    from specrepro.files import sha256_bytes

    found, names = [], set()
    for p in map(Path, paths):
        names.add(parse_part_name(p)[0])
        side = p.with_suffix(".provenance.json")
        for f in (p, side):
            if not f.is_file():
                raise FileNotFoundError(f"{f}: missing (each part is a table and its sidecar, written with --part I/K)")
        prov = json.loads(side.read_text())
        if (prov.get("sha256") or {}).get(p.name) != sha256_bytes(p.read_bytes()):
            raise ValueError(f"{p}: its bytes differ from the sha256 in {side.name}")
        found.append((p, prov))
    if not found:
        raise ValueError("no parts to merge")
    if any(not prov.get("part") for _, prov in found):
        raise ValueError("a table without a part in its sidecar was given (parts are written with --part I/K)")
    if len(names) > 1:
        raise ValueError(f"parts of different tables: {', '.join(sorted(names))}")
    order = check_part_set([prov for _, prov in found], PER_PART, [p.name for p, _ in found])
    return [found[j] for j in order]


def merged_provenance(parts: list[tuple[Path, dict]]) -> dict:
    """The merged table's sidecar settings from :func:`read_parts`' parts: every common setting (the CPU included; the
    merging process's commit, date and versions are left to :func:`specrepro.record.results.provenance`), ``parts``
    (per part: file, sha256, part, part_prompts, commit, seconds), ``seconds`` and ``resumed_prompts`` summed, and the
    union of the rows' commits and CPUs."""
    first = parts[0][1]
    out = {key: v for key, v in first.items() if key not in PER_PART | {"profile", "device", "torch", "transformers"}}
    out["parts"] = [{"file": p.name, "sha256": prov["sha256"][p.name], "part": prov["part"],
                     "part_prompts": prov["part_prompts"], "commit": prov.get("commit"),
                     "seconds": prov.get("seconds")} for p, prov in parts]
    out["seconds"] = round(sum(float(prov.get("seconds") or 0.0) for _, prov in parts), 1)
    out["resumed_prompts"] = sum(int(prov.get("resumed_prompts") or 0) for _, prov in parts)
    for key in ("row_commits", "row_cpus"):
        out[key] = sorted({v for _, prov in parts for v in prov.get(key) or []})
    return out
