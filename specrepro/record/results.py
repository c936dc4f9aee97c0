"""Where results go, and how they are written: atomically, with provenance.

The notebooks' one way to save a result table (CSV) or a figure (PNG and PDF), each with a provenance sidecar
``<name>.provenance.json`` (commit, profile, device, date, library versions, sha256), and to skip work whose result
already exists (``make reproduce`` resumes). Only ``make reproduce`` writes the committed record (``data/results/``,
``figures/``: :func:`writes_record`); every other run (JupyterLab, the quick profile in CI) writes under
``build/<profile>/`` (git-ignored), and a reader of the standard profile's tables falls back to the committed record.
"""

from __future__ import annotations

import datetime
import io
import json
import os
from pathlib import Path

from specrepro.files import (atomic_write_files, cpu_description, device_description, git_commit, hold_record_lock,
                             note_read, read_noted, reads, repo_root, sha256_bytes)

__all__ = ["STANDARD", "RECORD_ENV", "writes_record", "record_dir", "results_dir", "figures_dir", "read_dirs",
           "provenance", "save_table", "load_table", "table_at", "add_footer", "save_figure", "DirtyTreeError",
           "check_clean_for_record", "RUN_KEYS", "write_with_provenance", "record_hash_mismatches", "read_json",
           "file_changes"]

STANDARD = "standard"
#: Set to "1" by ``make reproduce`` (and only there): the standard profile then writes the committed record.
RECORD_ENV = "SPECREPRO_RECORD"


def writes_record(profile: str = STANDARD) -> bool:
    """True only for the standard profile run by ``make reproduce`` (``SPECREPRO_RECORD=1`` in the environment)."""
    return profile == STANDARD and os.environ.get(RECORD_ENV) == "1"


def record_dir(kind: str = "results") -> Path:
    """The committed record: ``data/results/`` (kind "results") or ``figures/`` (kind "figures")."""
    if kind not in ("results", "figures"):
        raise ValueError(f"kind must be 'results' or 'figures', got {kind!r}")
    return repo_root() / ("data/results" if kind == "results" else "figures")


def _run_dir(kind: str, profile: str) -> Path:
    d = record_dir(kind) if writes_record(profile) else repo_root() / f"build/{profile}/{kind}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def results_dir(profile: str = STANDARD) -> Path:
    """Where this run writes (and resumes) result tables (created): the record's, or ``build/<profile>/results/``."""
    return _run_dir("results", profile)


def figures_dir(profile: str = STANDARD) -> Path:
    """Where this run writes figures (created): the record's ``figures/``, or ``build/<profile>/figures/``."""
    return _run_dir("figures", profile)


def read_dirs(profile: str = STANDARD) -> list[Path]:
    """Directories a reader of ``profile``'s tables searches, in order: this run's :func:`results_dir`, then, for the
    standard profile outside ``make reproduce``, the committed record."""
    dirs = [results_dir(profile)]
    if profile == STANDARD and dirs[0] != record_dir("results"):
        dirs.append(record_dir("results"))
    return dirs


def provenance(profile: str, device: str = "cpu", **extra) -> dict:
    """Provenance record: commit, profile, device, cpu (:func:`cpu_description`), date (day only),
    torch/transformers versions, plus ``extra``."""
    import torch
    import transformers

    return {"commit": git_commit(), "profile": profile, "device": device_description(device), "cpu": cpu_description(),
            "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "transformers": transformers.__version__, **extra}


def read_json(path: Path):
    """The JSON content of ``path`` (a provenance sidecar, say), or None when it is missing or not JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


class DirtyTreeError(RuntimeError):
    """The committed record was about to be written by code that no commit holds."""


def check_clean_for_record(profile: str = STANDARD) -> None:
    """Refuse to write the committed record (:func:`writes_record`) from a tree whose code differs from its commit
    (DirtyTreeError) or while another job writes it (:class:`specrepro.files.RecordBusyError`; else this process
    holds the record's lock from then on)."""
    if writes_record(profile):
        hold_record_lock()
        commit = git_commit()
        if commit.endswith("-dirty"):
            raise DirtyTreeError(f"refusing to write the committed record from a dirty tree ({commit}): commit the "
                                 "code first (git status; outputs under data/results, figures, notebooks/executed and "
                                 "README.md do not count)")


#: Provenance keys that describe the run (who, where, when), not the result (see :func:`write_with_provenance`).
RUN_KEYS = frozenset({"commit", "date", "device", "cpu", "torch", "transformers"})


def write_with_provenance(files: dict, sidecar: Path, prov: dict) -> bool:
    """Write ``files`` (``{path: bytes}``) and their provenance ``sidecar`` (``prov`` with ``sha256``: {file name:
    sha256}) in one step, unless the files on disk already have those bytes and the sidecar the same settings (every
    key but :data:`RUN_KEYS`): then the sidecar keeps naming the run that made them. Returns whether it wrote."""
    prov = {**prov, "sha256": {Path(p).name: sha256_bytes(b) for p, b in files.items()}}
    old = read_json(sidecar)
    if (isinstance(old, dict) and all(Path(p).exists() and sha256_bytes(Path(p).read_bytes()) == h
                                      for p, h in zip(files, prov["sha256"].values()))
            and {k: v for k, v in old.items() if k not in RUN_KEYS}
            == json.loads(json.dumps({k: v for k, v in prov.items() if k not in RUN_KEYS}))):
        return False
    atomic_write_files({**files, sidecar: (json.dumps(prov, indent=1, sort_keys=True) + "\n").encode()})
    return True


def save_table(df, name: str, profile: str = STANDARD, device: str = "cpu", companions: dict | None = None,
               **extra) -> Path:
    """Write ``df`` as ``<results_dir>/<name>.csv``, with each ``companions`` file (``{file name: text}``) beside it,
    and their provenance (settings ``extra``; :func:`write_with_provenance`, :func:`check_clean_for_record`). Returns
    the path."""
    check_clean_for_record(profile)
    path = results_dir(profile) / f"{name}.csv"
    files = {path: df.to_csv(index=False, float_format="%.6g").encode()}
    files.update({path.parent / n: text.encode() for n, text in (companions or {}).items()})
    write_with_provenance(files, path.with_suffix(".provenance.json"), provenance(profile, device, **extra))
    note_read(path, files[path])  # what a figure drawn next from this table records it was drawn from
    return path


def record_hash_mismatches(dirs=None) -> list[str]:
    """Every file under ``dirs`` (default: the record's ``data/results``, ``figures`` and ``data/gpu``) whose bytes
    differ from the sha256 its provenance sidecar records, and every sidecar that records none: one line each."""
    out = []
    for d in dirs if dirs is not None else (record_dir("results"), record_dir("figures"), repo_root() / "data/gpu"):
        for side in sorted(Path(d).glob("*.provenance.json")):
            hashes = json.loads(side.read_text()).get("sha256")
            if not hashes:
                out.append(f"{side}: no sha256 recorded")
            out += [f"{side.parent / name}: missing (its provenance records it)" if state == "missing" else
                    f"{side.parent / name}: sha256 differs from {side.name}"
                    for name, state in file_changes(hashes or {}, side.parent).items()]
    return out


def file_changes(digests: dict, folder: Path) -> dict[str, str]:
    """The files of ``digests`` (``{path under folder, or absolute: sha256}``), in sorted order, that are "missing" or
    "changed" (other bytes than recorded): ``{path: state}``."""
    out = {}
    for name, digest in sorted(digests.items()):
        path = Path(folder) / name
        if not path.is_file():
            out[name] = "missing"
        elif sha256_bytes(path.read_bytes()) != digest:
            out[name] = "changed"
    return out


def load_table(name: str, profile: str = STANDARD, **settings):
    """``<results_dir>/<name>.csv`` as a DataFrame; None if it does not exist yet, or if its sidecar did not record
    the same value for each of ``settings`` (as passed to :func:`save_table`), so a resumed notebook recomputes it."""
    return table_at(results_dir(profile) / f"{name}.csv", **settings)


_MISSING = object()  # a setting the sidecar does not record (never equal to a recorded value, None included)


def table_at(path: Path, **settings):
    """:func:`load_table` for the table at ``path`` (e.g. one in the committed ``data/results/`` while this process
    writes elsewhere): the DataFrame, or None when it is missing or its sidecar records other ``settings``."""
    import pandas as pd

    path = Path(path)
    if not path.exists():
        return None
    recorded = read_json(path.with_suffix(".provenance.json")) or {}  # unreadable: every setting is missing
    if any(recorded.get(k, _MISSING) != v for k, v in json.loads(json.dumps(settings)).items()):
        return None
    return pd.read_csv(io.BytesIO(read_noted(path)))


def add_footer(fig, text: str):
    """Put ``text`` (small, grey, right-aligned) just below everything already drawn on ``fig`` (tick and axis labels,
    legends, captions), overlapping none of them. Returns the Text artist."""
    fig.canvas.draw()  # lay out (tight/constrained layout) so the extents below are final
    bb = fig.get_tightbbox(fig.canvas.get_renderer())  # inches, figure origin
    w, h = fig.get_figwidth(), fig.get_figheight()
    y = min(0.0, bb.y0 / h) - 0.06 / h  # a small gap (0.06 in) below the lowest artist
    return fig.text(max(bb.x1 / w, 0.5), y, text, ha="right", va="top", fontsize=6, color="0.5")


def save_figure(fig, name: str, profile: str = STANDARD, device: str = "cpu", **extra) -> Path:
    """Save ``fig`` as PNG and PDF under ``figures_dir(profile)`` with a footer naming the commit, profile and device,
    and a provenance sidecar that also records ``inputs``: ``{table path: sha256}`` of every table this process read
    or wrote (:func:`specrepro.files.reads`), so that ``status`` shows the figure stale once one changes. Returns the
    PNG path."""
    check_clean_for_record(profile)
    prov = provenance(profile, device, **extra)
    prov["inputs"] = reads()
    add_footer(fig, f"specrepro {prov['commit']} · profile {profile} · {prov['device']}")
    out = figures_dir(profile) / name
    meta = {"Title": name, "Subject": json.dumps(prov, sort_keys=True)}
    files = {}
    for ext in ("png", "pdf"):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, dpi=150, bbox_inches="tight",
                    metadata=meta if ext == "pdf" else {"Description": meta["Subject"]})
        files[out.with_suffix(f".{ext}")] = buf.getvalue()
    write_with_provenance(files, out.with_suffix(".provenance.json"), prov)
    return out.with_suffix(".png")
