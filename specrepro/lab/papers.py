"""The papers' numbers, read from ``data/papers/*.csv`` (one file per table the project prints beside its own).

What this file is: the one reader of those files, so that every figure of a paper lives in one place and is typed
once. What it is not: a claim or its verdict (``data/claims.csv`` and :mod:`specrepro.record.scorecard`).
"""

from __future__ import annotations

from functools import lru_cache

import pandas as pd

from specrepro.files import note_read, repo_root

__all__ = ["paper_table", "PAPER_TABLES"]

PAPER_TABLES = ("leviathan_table1", "leviathan_table2", "leviathan_table3", "chen_table1", "specinfer_table2", "specinfer_table3",
                "medusa_table1", "verifier_gains")


@lru_cache(maxsize=None)
def _read(name: str) -> pd.DataFrame:
    import io

    path = repo_root() / "data" / "papers" / f"{name}.csv"
    data = path.read_bytes()
    note_read(path, data)  # a figure or notebook that prints the paper's rows records the bytes they came from
    return pd.read_csv(io.BytesIO(data))


def paper_table(name: str) -> pd.DataFrame:
    """One of the papers' tables as printed (``data/papers/<name>.csv``; the README there names each source).

    Args:
        name: one of :data:`PAPER_TABLES`.

    Returns:
        a new DataFrame (a copy: callers may change it).

    Raises:
        KeyError: an unknown name. FileNotFoundError: the file is missing (a checkout without ``data/``).
    """
    if name not in PAPER_TABLES:
        raise KeyError(f"unknown paper table {name!r}; known: {', '.join(PAPER_TABLES)}")
    return _read(name).copy()
