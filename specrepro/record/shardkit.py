"""What every shard of the record shares: its checkpoint (:func:`shard_checkpoint`), how it is read or measured and
saved with its sidecar (:func:`read_or_measure`), and the base of a group of shards (:class:`ShardGroup`). The shards
themselves are :mod:`specrepro.record.shards`'.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from pathlib import Path

import pandas as pd

from specrepro.files import (atomic_write_text, checkpoint_file, cpu_description, hold_record_lock, machine_snapshot,
                             machine_state, repo_root)
from specrepro.record.results import STANDARD, load_table, read_json, save_table, writes_record

__all__ = ["shard_checkpoint", "read_or_measure", "ShardGroup", "checkpoint_key"]


def shard_checkpoint(name: str, profile: str) -> Path:
    """Where a shard keeps its finished blocks while it is timed: ``data/checkpoints/<name>.<profile>.json`` when
    this run writes the record (committable), else :func:`specrepro.files.checkpoint_file`."""
    if writes_record(profile):
        hold_record_lock()  # before the hour of timing, not after: one job writes the record at a time
        return repo_root() / "data" / "checkpoints" / f"{name}.{profile}.json"
    return checkpoint_file(name, profile)


def read_or_measure(name: str, profile: str, device: str, settings: dict, measure) -> pd.DataFrame:
    """The shard ``name``: read when its table exists under ``settings``, else ``measure(checkpoint)`` now and saved
    with its sidecar (the settings, the run time, the machine's load before and after, and, for timed tables with an
    ``under_load`` column, how many (pass, prompt) blocks ran under load), its checkpoint deleted. A sitting that ends
    without its table (an exception, Ctrl-C or SIGTERM; not a kill -9) adds its seconds to
    ``<checkpoint>.sittings.json``, so the sidecar's ``seconds`` is every sitting's (with ``sittings`` and
    ``seconds_this_sitting``). Returns the table as a later reader gets it; ``attrs["measured"]`` says which happened.
    """
    found = load_table(name, profile, **settings)
    if found is not None:
        return found
    t0, snap = time.monotonic(), machine_snapshot()
    ckpt = shard_checkpoint(name, profile)
    log = ckpt.with_name(ckpt.name + ".sittings.json")
    earlier = read_json(log) if ckpt.exists() else None  # the seconds of the sittings before, when resuming
    earlier = [float(x) for x in earlier] if isinstance(earlier, list) else []
    # SIGTERM ends the sitting as Ctrl-C does, its time logged (a handler can only be set in the main thread)
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum)) if main else None
    try:
        df = measure(ckpt)
    except BaseException:
        if ckpt.exists():  # blocks were kept: the next sitting resumes them, and adds this one's time
            atomic_write_text(log, json.dumps([*earlier, round(time.monotonic() - t0, 1)]) + "\n")
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    state = machine_state(snap, machine_snapshot())
    now = round(time.monotonic() - t0, 1)
    extra = {"seconds": round(now + sum(earlier), 1), "sittings": len(earlier) + 1, "seconds_this_sitting": now,
             "load_before": state["load_before"], "load_after": state["load_after"]}
    if "under_load" in df.columns:
        blocks = df.drop_duplicates(["repeat", "prompt_index"])
        extra.update(blocks=int(len(blocks)), blocks_under_load=int((blocks["under_load"] == True).sum()))  # noqa: E712
    else:
        extra.update(steal_pct=state["steal_pct"], other_cpu_pct=state["other_cpu_pct"])
    save_table(df, name, profile=profile, device=device, **settings, **extra)
    ckpt.unlink(missing_ok=True)
    log.unlink(missing_ok=True)
    out = load_table(name, profile, **settings)
    out.attrs["measured"] = True
    return out


class ShardGroup:
    """What a group of shards has in common: ``params`` (the notebook's, the profile's names), ``profile`` (where
    tables are read and written), ``progress`` (bars while timing), ``context`` (what measuring needs: models,
    prompts; given, else made by :meth:`load` on first use of :attr:`ctx`) and ``measured`` (the shards this object
    measured; the others were read). A subclass describes its shards by :meth:`names`, ``settings(name)`` (what a
    shard's sidecar records and a reader must find; KeyError for a name not of :meth:`names`) and
    ``measure(name, settings, checkpoint)`` (its table, measured now), which :meth:`run` and :meth:`table` use."""

    #: what a shard of the group is called in the error for a name that is not one
    what = "a shard of this group"

    def __init__(self, params: dict, profile: str = STANDARD, *, progress: bool = True, context=None):
        self.params, self.profile, self.progress, self.context = dict(params), profile, progress, context
        self.measured: list[str] = []

    @property
    def device(self) -> str:
        """``params["device"]``, "cpu" when not given (as :class:`specrepro.lab.table2.Table2Setting` reads it)."""
        return self.params.get("device", "cpu")

    @property
    def ctx(self):
        if self.context is None:
            self.context = self.load()
        return self.context

    def ints(self, **keys: str) -> dict:
        """``{setting: int(params[name])}`` for each ``setting=name``: how most settings are read from the profile."""
        return {key: int(self.params[name]) for key, name in keys.items()}

    def run(self, name: str) -> pd.DataFrame:
        """Shard ``name``'s table, read or measured (:func:`read_or_measure`). A ``text`` column (decoded outputs)
        reads back with empty strings, not NaN.

        Raises:
            KeyError: not one of :meth:`names`.
        """
        s = self.settings(name)
        return self._get(name, s, lambda ckpt: self.measure(name, s, ckpt))

    def _require(self, name: str) -> None:
        if name not in self.names():
            raise KeyError(f"{name!r} is not {self.what} under this profile; its shards: {self.names()}")

    def _get(self, name: str, settings: dict, measure) -> pd.DataFrame:
        out = read_or_measure(name, self.profile, self.device, settings, measure)
        if out.attrs.get("measured"):
            self.measured.append(name)
        if "text" in out.columns:
            out["text"] = out["text"].fillna("")
        return out

    def table(self) -> pd.DataFrame:
        """Every shard's rows, concatenated in :meth:`names`' order."""
        return pd.concat([self.run(name) for name in self.names()], ignore_index=True)

    def expected(self, name: str, folder: Path) -> dict:
        """What shard ``name``'s sidecar must record to be the measurement these parameters ask for, measuring
        nothing (a choice made from other tables is taken from those tables as recorded in ``folder``)."""
        return self.settings(name)


def checkpoint_key(settings: dict, *keys: str, **more) -> dict:
    """What a shard's saved blocks must have been measured under: ``settings`` (only ``keys`` when given), ``more``
    and this CPU (:func:`specrepro.files.cpu_description`), so that a checkpoint never mixes machines."""
    return {**({k: settings[k] for k in keys} if keys else settings), **more, "cpu": cpu_description()}
