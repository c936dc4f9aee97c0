"""``python -m specrepro record-lock --job PID``: the record lock for a whole ``make reproduce``.

What this file is: the command ``make reproduce`` runs first (its ``record-lock`` prerequisite), with the make
process's pid: it takes the checkout's record lock (:func:`specrepro.files.hold_record_lock`) for that job and keeps
it in a background process until make ends, so that every recipe of the job writes the record and no other job
writes between two of them. A second ``make reproduce`` (or a shard, or a notebook run of record) started meanwhile
stops at once with one line naming the first.

What it is not: the lock itself (:mod:`specrepro.files`), which every writer of the record also takes on its own.
"""

from __future__ import annotations

__all__ = ["configure_parser", "run_command"]


def configure_parser(p) -> None:
    p.add_argument("--job", type=int, required=True,
                   help="the pid of the make process whose recipes share the lock (in a recipe: $$PPID)")


def run_command(args, parser=None) -> int:
    from specrepro.files import hold_record_lock_for_job

    return hold_record_lock_for_job(args.job)
