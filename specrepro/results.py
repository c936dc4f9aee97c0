"""Where results go, and how they are written: atomically, with provenance.

What this file is: the notebooks' one way to save a result table (CSV under ``data/results/``) or a figure (PNG and
PDF under ``figures/``), each with a provenance sidecar ``<name>.provenance.json`` (git commit, profile, device,
date, library versions), and to skip work whose result already exists (``make reproduce`` resumes).

Layout by profile, and who writes the record: only ``make reproduce`` writes the committed record. It runs the
standard profile with the environment variable ``SPECREPRO_RECORD=1`` (:data:`RECORD_ENV`), and only then do tables
go to ``data/results/`` and figures to ``figures/`` (and notebook 08 rewrite README.md). Every other run - a notebook
opened in JupyterLab and run top to bottom, papermill without the Makefile, the quick profile in CI - writes to
``build/<profile>/results/`` and ``build/<profile>/figures/`` (git-ignored), whatever its parameters say, so it can
never overwrite what the repository reports. Reading follows the same rule, with one fallback: :class:`Tables`-style
readers (the scorecard) that find no table of the standard profile under ``build/standard/`` read the committed
record (:func:`read_dirs`), so an interactive notebook 08 scores the record without rewriting it.

What it is not: plotting style (:mod:`specrepro.plots`).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import tempfile
from pathlib import Path

__all__ = ["repo_root", "results_dir", "figures_dir", "record_dir", "read_dirs", "writes_record", "provenance",
           "save_table", "load_table", "save_figure", "add_footer", "atomic_write_text", "atomic_save_safetensors",
           "device_description", "git_commit", "RECORD_ENV"]

STANDARD = "standard"
#: Set to "1" by ``make reproduce`` (and only there): the standard profile then writes the committed record.
RECORD_ENV = "SPECREPRO_RECORD"


def repo_root() -> Path:
    """The repository root (the directory holding pyproject.toml), found from this file; falls back to the cwd."""
    here = Path(__file__).resolve().parent.parent
    return here if (here / "pyproject.toml").exists() else Path.cwd()


def writes_record(profile: str = STANDARD) -> bool:
    """True only for the standard profile run by ``make reproduce`` (``SPECREPRO_RECORD=1`` in the environment):
    then results go to the committed ``data/results/`` and ``figures/``; otherwise under ``build/<profile>/``."""
    return profile == STANDARD and os.environ.get(RECORD_ENV) == "1"


def record_dir(kind: str = "results") -> Path:
    """The committed record: ``data/results/`` (kind "results") or ``figures/`` (kind "figures")."""
    if kind not in ("results", "figures"):
        raise ValueError(f"kind must be 'results' or 'figures', got {kind!r}")
    return repo_root() / ("data/results" if kind == "results" else "figures")


def results_dir(profile: str = STANDARD) -> Path:
    """Where this run writes (and resumes) result tables: the record when :func:`writes_record`, else
    ``build/<profile>/results/`` (created)."""
    d = record_dir("results") if writes_record(profile) else repo_root() / f"build/{profile}/results"
    d.mkdir(parents=True, exist_ok=True)
    return d


def figures_dir(profile: str = STANDARD) -> Path:
    """Where this run writes figures: the record's ``figures/`` when :func:`writes_record`, else
    ``build/<profile>/figures/`` (created)."""
    d = record_dir("figures") if writes_record(profile) else repo_root() / f"build/{profile}/figures"
    d.mkdir(parents=True, exist_ok=True)
    return d


def read_dirs(profile: str = STANDARD) -> list[Path]:
    """Directories a reader of ``profile``'s tables searches, in order: this run's :func:`results_dir`, then, for the
    standard profile outside ``make reproduce``, the committed record."""
    dirs = [results_dir(profile)]
    if profile == STANDARD and dirs[0] != record_dir("results"):
        dirs.append(record_dir("results"))
    return dirs


# paths a run writes (never inputs to a measurement): excluded from the "-dirty" check of the provenance commit
_OUTPUT_PATHS = ("data/results", "figures", "notebooks/executed", "build", "README.md")


def git_commit() -> str:
    """The checked-out commit (12 hex digits), with '-dirty' when code (not outputs) differs from it; 'unknown'
    outside git."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=repo_root(), capture_output=True,
                             text=True, timeout=10)
        # "-dirty" means the code differs from the commit; the outputs themselves (result tables, figures, executed
        # notebooks, the README's generated blocks) change during every run and do not count
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                *(f":(exclude){p}" for p in _OUTPUT_PATHS)], cwd=repo_root(),
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (out.stdout.strip() or "unknown") + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def code_fingerprint() -> str:
    """A hash (16 hex digits) of the ``specrepro`` package's Python sources as they are on disk: what a resumed
    timing run checks, so that blocks timed by other code are not mixed with its own (unlike :func:`git_commit`, it
    does not change when only results, notebooks or docs are committed)."""
    import hashlib

    pkg = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for f in sorted(pkg.rglob("*.py")):
        h.update(str(f.relative_to(pkg)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def device_description(device: str = "cpu") -> str:
    """A short human description of the compute device, e.g. 'cpu (2 cores)' or 'cuda: NVIDIA H100 80GB HBM3'."""
    import torch

    if str(device).startswith("cuda") and torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(torch.device(device))}"
    return f"cpu ({os.cpu_count()} cores, {platform.machine()})"


def cpu_description(cpuinfo: str | None = None) -> str:
    """The CPU model and its widest SIMD extension, e.g. 'AMD EPYC (family 25, model 1), avx2'. Timings move with the
    machine (issue 18: verifying 5 tokens with the 1.5B target cost about 0.8x a 1-token forward on the machine of
    the bench of record and about 1.5x on an AVX2-only EPYC), so every timed record names the CPU it ran on.

    Args:
        cpuinfo: the text of ``/proc/cpuinfo`` (read on Linux when None); elsewhere ``platform.processor()``.

    Returns:
        a one-line description; ``platform.processor()`` (or 'unknown') without a readable cpuinfo.
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return platform.processor() or "unknown"
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    flags = set(fields.get("flags", "").split())
    simd = next((f for f in ("amx_tile", "avx512f", "avx2", "avx", "sse4_2") if f in flags), "")
    name = fields.get("model name") or platform.processor() or "unknown"
    family = (f" (family {fields['cpu family']}, model {fields['model']})"
              if "cpu family" in fields and "model" in fields else "")
    return name + family + (f", {simd}" if simd else "")


def provenance(profile: str, device: str = "cpu", **extra) -> dict:
    """Provenance record: commit, profile, device, cpu (:func:`cpu_description`), date (day only),
    torch/transformers versions, plus ``extra``."""
    import torch
    import transformers

    rec = {
        "commit": git_commit(),
        "profile": profile,
        "device": device_description(device),
        "cpu": cpu_description(),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    rec.update(extra)
    return rec


def _umask_mode() -> int:
    """The mode ``open()`` would give a new file (0o666 less the umask); ``mkstemp`` files are 0o600 otherwise."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, _umask_mode())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_save_safetensors(tensors: dict, path: Path, metadata: dict | None = None) -> None:
    """Write ``{name: tensor}`` as a safetensors file at ``path`` through a temporary file and ``os.replace`` (cached
    hidden states, trained heads); ``metadata``: str -> str, stored in the file's header."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata=metadata)
        os.chmod(tmp, _umask_mode())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def save_table(df, name: str, profile: str = STANDARD, device: str = "cpu", **extra) -> Path:
    """Write ``df`` as ``<results_dir>/<name>.csv`` (atomically) and its provenance sidecar; returns the CSV path."""
    path = results_dir(profile) / f"{name}.csv"
    atomic_write_text(path, df.to_csv(index=False, float_format="%.6g"))
    atomic_write_text(path.with_suffix(".provenance.json"),
                      json.dumps(provenance(profile, device, **extra), indent=1, sort_keys=True) + "\n")
    return path


def load_table(name: str, profile: str = STANDARD, **settings):
    """Read ``<results_dir>/<name>.csv`` back as a DataFrame; None if it does not exist yet.

    With ``settings`` (keyword arguments that were also passed to :func:`save_table`, e.g. ``prompts=2,
    tokens=24``), the table is returned only if its provenance sidecar recorded the same value for every one of
    them; a table written under other settings (or before the setting was recorded) is stale and gives None, so a
    resumed notebook recomputes it instead of reusing numbers measured for a different experiment. Values are
    compared after a JSON round trip (tuples and lists are equal).
    """
    import pandas as pd

    path = results_dir(profile) / f"{name}.csv"
    if not path.exists():
        return None
    if settings:
        sidecar = path.with_suffix(".provenance.json")
        try:
            recorded = json.loads(sidecar.read_text())
        except (OSError, ValueError):
            return None
        wanted = json.loads(json.dumps(settings))
        if any(recorded.get(k, _MISSING) != v for k, v in wanted.items()):
            return None
    return pd.read_csv(path)


_MISSING = object()


def add_footer(fig, text: str):
    """Put ``text`` (small, grey, right-aligned) just below everything already drawn on ``fig`` - tick labels, axis
    labels, legends and captions placed under the axes - so it overlaps none of them (a fixed position such as
    y = -0.02 collides with x labels of some layouts). Returns the Text artist."""
    fig.canvas.draw()  # lay out (tight/constrained layout) so the extents below are final
    bb = fig.get_tightbbox(fig.canvas.get_renderer())  # inches, figure origin
    w, h = fig.get_figwidth(), fig.get_figheight()
    y = min(0.0, bb.y0 / h) - 0.06 / h  # a small gap (0.06 in) below the lowest artist
    return fig.text(max(bb.x1 / w, 0.5), y, text, ha="right", va="top", fontsize=6, color="0.5")


def save_figure(fig, name: str, profile: str = STANDARD, device: str = "cpu", **extra) -> Path:
    """Save ``fig`` as PNG and PDF under ``figures_dir(profile)`` with a provenance footer and sidecar.

    The footer names the commit, profile and device so a figure carries where it came from. Returns the PNG path.
    """
    prov = provenance(profile, device, **extra)
    add_footer(fig, f"specrepro {prov['commit']} · profile {profile} · {prov['device']}")
    out = figures_dir(profile) / name
    meta = {"Title": name, "Subject": json.dumps(prov, sort_keys=True)}
    for ext in ("png", "pdf"):
        path = out.with_suffix(f".{ext}")
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".{ext}")
        os.close(fd)
        try:
            fig.savefig(tmp, format=ext, dpi=150, bbox_inches="tight",
                        metadata=meta if ext == "pdf" else {"Description": meta["Subject"]})
            os.chmod(tmp, _umask_mode())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    atomic_write_text(out.with_suffix(".provenance.json"), json.dumps(prov, indent=1, sort_keys=True) + "\n")
    return out.with_suffix(".png")
