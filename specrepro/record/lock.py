"""``python -m specrepro record-lock --job PID``: ``make reproduce`` runs it first with make's pid, so that the
checkout's record lock is held for the whole job (:func:`specrepro.files.hold_record_lock_for_job`, in a background
process until make ends) and no other job writes the record between two of its recipes (a second stops at once,
naming the first). Every writer of the record also takes the lock on its own.
"""

from __future__ import annotations

__all__ = ["configure_parser", "run_command"]


def configure_parser(p) -> None:
    p.add_argument("--job", type=int, required=True,
                   help="the pid of the make process whose recipes share the lock (in a recipe: $$PPID)")


def run_command(args, parser=None) -> int:
    from specrepro.files import hold_record_lock_for_job

    return hold_record_lock_for_job(args.job)
