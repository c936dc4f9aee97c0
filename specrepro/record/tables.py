"""The result tables a scorecard reads (:class:`Tables`: one profile's CSVs and bench JSONs with their provenance,
read lazily; written by :mod:`specrepro.record.results`) and the machine a table was measured on (:func:`hardware_of`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import pandas as pd

from specrepro.files import read_noted
from specrepro.record.results import STANDARD, read_dirs, read_json, table_at

__all__ = ["Tables"]


def read_record_table(directory: Path, name: str) -> pd.DataFrame | None:
    """``<name>.csv``, or the per-run rows of a bench JSON ``<name>.json`` (``python -m specrepro bench --json``:
    columns method, prompt, repeat, tokens_per_s, ...), or None."""
    if (df := table_at(directory / f"{name}.csv")) is not None or not (directory / f"{name}.json").exists():
        return df  # the CSV, or None without a bench JSON either
    runs = json.loads(read_noted(directory / f"{name}.json")).get("runs")
    return pd.DataFrame(runs) if runs else None


def hardware_of(prov: dict) -> str:
    """The machine a table was measured on, from its provenance: the device (``device_description``, else
    ``device``) and, on a CPU, the CPU model with its widest SIMD extension (every CPU of its rows, ``row_cpus``, for
    a table decoded over several sittings; "CPU model not recorded" before it was). Empty without a provenance."""
    device = str(prov.get("device_description") or prov.get("device") or "")
    if not device.startswith("cpu"):
        return device
    cpus = prov.get("row_cpus") or ([prov["cpu"]] if prov.get("cpu") else [])
    return f"{device}, {'; '.join(cpus)}" if cpus else f"{device}, CPU model not recorded"


class Tables:
    """The result tables and provenance records of one profile, read lazily and cached.

    Args:
        profile: whose tables are read, from :func:`specrepro.record.results.read_dirs`' directories.
        frames: optional ``{name: DataFrame}`` used instead of the files (tests); names absent from it are missing.
        provenances: optional ``{name: dict}`` to go with ``frames``.
        dirs: optional directories searched instead of :func:`specrepro.record.results.read_dirs`.
    """

    def __init__(self, profile: str = STANDARD, frames: dict | None = None, provenances: dict | None = None,
                 dirs: Sequence[Path] | None = None):
        self.profile = profile
        self._prov = dict(provenances or {})
        # with frames: those tables alone, no directory searched
        self._cache: dict[str, pd.DataFrame | None] = dict(frames) if frames is not None else {}
        self._dirs = [] if frames is not None else [Path(d) for d in dirs] if dirs is not None else None

    def dirs(self) -> list[Path]:
        """The directories searched, in order."""
        return self._dirs if self._dirs is not None else read_dirs(self.profile)

    def _first(self, file: str) -> Path | None:
        return next((p for p in (d / file for d in self.dirs()) if p.exists()), None)

    def get(self, name: str) -> pd.DataFrame | None:
        """The table ``name`` (a copy), or None if it has not been written."""
        if name not in self._cache:
            found = (read_record_table(d, name) for d in self.dirs())
            self._cache[name] = next((df for df in found if df is not None), None)
        df = self._cache[name]
        return None if df is None else df.copy()

    def provenance(self, name: str) -> dict:
        """Table ``name``'s provenance (its sidecar, or a bench JSON's config); {} if there is none."""
        if name not in self._prov:
            rec = None
            if (sidecar := self._first(f"{name}.provenance.json")) is not None:
                rec = read_json(sidecar)
            elif (bench := self._first(f"{name}.json")) is not None:
                rec = dict((read_json(bench) or {}).get("config") or {})
            self._prov[name] = rec or {}
        return self._prov[name]
