"""Resident memory of this process, for the bench's per-run peak (Linux ``/proc``; NaN elsewhere).

What this file is: :func:`reset_peak` / :func:`peak_rss_mb` (the kernel's high-water mark of resident memory, reset
before each timed call so that each run gets its own peak) and :func:`rss_split_mb` (what is resident now, split into
anonymous memory — allocations such as packed weight copies, activations and the KV cache — and file-backed pages,
such as safetensors weights mapped from disk, which are clean and which the kernel can drop under memory pressure and
read back). Units: MiB (2^20 bytes).

What it is not: a profiler of where inside torch the memory goes (``torch.profiler(profile_memory=True)`` does that).
"""

from __future__ import annotations

import math
from pathlib import Path

__all__ = ["reset_peak", "peak_rss_mb", "rss_split_mb"]

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kb(*fields: str) -> dict:
    try:
        text = _STATUS.read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in fields:
            out[key] = int(value.split()[0])
    return out


def reset_peak() -> bool:
    """Reset the process's resident high-water mark (VmHWM) to its current resident size (Linux >= 4.0: writing 5 to
    ``/proc/self/clear_refs``). Returns False where that is not possible (the next :func:`peak_rss_mb` then reports
    the peak since the process started)."""
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    """The resident high-water mark (VmHWM) in MiB since the last :func:`reset_peak`; NaN without ``/proc``."""
    kb = _status_kb("VmHWM").get("VmHWM")
    return kb / 1024 if kb is not None else math.nan


def rss_split_mb() -> dict:
    """Resident memory now, MiB: ``{"rss": total, "anon": anonymous, "file": file-backed, "shmem": shared memory}``
    (NaN each without ``/proc``)."""
    kb = _status_kb("VmRSS", "RssAnon", "RssFile", "RssShmem")
    names = {"rss": "VmRSS", "anon": "RssAnon", "file": "RssFile", "shmem": "RssShmem"}
    return {k: kb[v] / 1024 if v in kb else math.nan for k, v in names.items()}
