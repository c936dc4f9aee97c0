"""Files: atomic writes, the repository root, and what a record says about the code and machine that made it.

What this file is: the lowest layer every writer uses. What it is not: the rule of who may write the committed
record (:mod:`specrepro.record.results`).
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["repo_root", "checkpoint_file", "git_commit", "code_fingerprint", "device_description", "cpu_description", "cpu_bf16", "atomic_write_text", "atomic_save_safetensors",
           "atomic_directory",            "load_keyed_checkpoint", "resumable_rows", "READS_ENV", "note_read", "read_noted",
           "reads", "clear_reads", "MachineSnapshot", "machine_snapshot", "machine_state", "LOAD_FLAG_PCT",
           "RecordBusyError", "record_lock_path", "hold_record_lock", "hold_record_lock_for", "record_lock_owner",
           "hold_record_lock_for_job"]


def repo_root() -> Path:
    """The repository root (the directory holding pyproject.toml), found from this file; falls back to the cwd."""
    here = Path(__file__).resolve().parent.parent
    return here if (here / "pyproject.toml").exists() else Path.cwd()


# paths a run writes (never inputs to a measurement): excluded from the "-dirty" check of the provenance commit
_OUTPUT_PATHS = ("data/results", "data/checkpoints", "figures", "notebooks/executed", "build", "README.md", "docs")


def checkpoint_file(name: str, profile: str) -> Path:
    """Where a long computation of the table ``name`` under ``profile`` keeps its finished pieces until the table is
    saved: ``build/checkpoints/<name>.<profile>.json`` (git-ignored; the caller deletes it after saving). What it may
    resume is decided by the key saved inside it, not by this name."""
    return repo_root() / "build" / "checkpoints" / f"{name}.{profile}.json"


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


def code_fingerprint(modules: tuple[str, ...] | list[str] | None = None) -> str:
    """A hash (16 hex digits) of the ``specrepro`` package's Python sources as they are on disk: what a resumed
    timing run checks, so that blocks timed by other code are not mixed with its own (unlike :func:`git_commit`, it
    does not change when only results, notebooks or docs are committed).

    Args:
        modules: dotted names of ``specrepro`` modules (e.g. ``("specrepro.core.decoding",)``): hash only their
            sources and those of every ``specrepro`` module they import, directly or not (read from the source, not
            by importing it), so that a change elsewhere in the package (the record, the notebooks' helpers) leaves
            the hash as it is. None: every source file of the package.

    Raises:
        ModuleNotFoundError: a name in ``modules`` that is not a module of the package.
    """
    import hashlib

    pkg = Path(__file__).resolve().parent
    files = sorted(pkg.rglob("*.py")) if modules is None else _import_closure(pkg, modules)
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(pkg)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _import_closure(pkg: Path, modules) -> list[Path]:
    """The source files of ``modules``, of their parent packages' ``__init__.py`` and of every module of the package
    they import, transitively (sorted)."""
    import ast

    root = pkg.name

    def source(name: str) -> Path | None:
        parts = name.split(".")[1:]
        for cand in (pkg.joinpath(*parts).with_suffix(".py") if parts else None, pkg.joinpath(*parts, "__init__.py")):
            if cand is not None and cand.exists():
                return cand
        return None

    seen: dict[str, Path] = {}
    todo = list(modules)
    for name in todo:
        if name.split(".")[0] != root or source(name) is None:
            raise ModuleNotFoundError(f"{name!r} is not a module of the {root} package")
    while todo:
        name = todo.pop()
        path = None if name in seen else source(name)
        if path is None:  # seen, or an attribute imported from a module (``from specrepro.x import f``)
            continue
        seen[name] = path
        todo += [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]  # parent packages
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == root:
                todo += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.split(".")[0] == root]
    return sorted(set(seen.values()))


def device_description(device: str = "cpu") -> str:
    """A short human description of the compute device, e.g. 'cpu (2 cores)' or 'cuda: NVIDIA H100 80GB HBM3'."""
    import torch

    if str(device).startswith("cuda") and torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(torch.device(device))}"
    return f"cpu ({os.cpu_count()} cores, {platform.machine()})"


def cpu_description(cpuinfo: str | None = None) -> str:
    """The CPU model and its widest SIMD extension, e.g. 'AMD EPYC (family 25, model 1), avx2'. Timings move with the
    machine (verifying 5 tokens with the 1.5B target cost about 0.8x a 1-token forward on the machine of
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


def cpu_bf16(cpuinfo: str | None = None) -> bool | None:
    """Whether the CPU has bfloat16 instructions (``avx512_bf16`` or ``amx_bf16`` among ``/proc/cpuinfo``'s flags).
    Without them torch runs bfloat16 emulated: weights are stored in half the bytes, but each product is converted to
    float32 first, so a bfloat16 forward on such a CPU can cost more than a float32 one.

    Args:
        cpuinfo: the text of ``/proc/cpuinfo`` (read on Linux when None).

    Returns:
        True or False; None where no cpuinfo with a ``flags`` line is readable (other systems).
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    line = next((ln for ln in cpuinfo.splitlines() if ln.partition(":")[0].strip() == "flags"), None)
    if line is None:
        return None
    flags = set(line.partition(":")[2].split())
    return bool(flags & {"avx512_bf16", "amx_bf16"})


#: Set by :func:`specrepro.record.nbrun.run_notebook` to a file path: every :func:`note_read` of the notebook's kernel
#: is appended there as one JSON line, so that the executed notebook can record the tables it read.
READS_ENV = "SPECREPRO_READS"

_READS: dict[str, str] = {}


def _rel(path: Path) -> str:
    """``path`` relative to the repository root when it lies inside it (POSIX form), else absolute."""
    path = Path(path).resolve()
    try:
        return path.relative_to(repo_root().resolve()).as_posix()
    except ValueError:
        return str(path)


def note_read(path: str | os.PathLike, data: bytes | None = None) -> str | None:
    """Record that this process read (or wrote) the table ``path``, with the sha256 of its bytes now (or of
    ``data``, the bytes just read or written): the ledger from which figures and executed notebooks record what they
    were drawn from, so that a later change to one of those tables shows them stale (``python -m specrepro status``).

    The ledger is this process's (:func:`reads`); when the environment names a file under :data:`READS_ENV`, the
    entry is also appended there as one JSON line (the notebook runner reads it back). A path that does not exist is
    not recorded.

    Returns:
        the sha256 recorded, or None when there was nothing to read.
    """
    import json

    path = Path(path)
    if data is None:
        try:
            data = path.read_bytes()
        except OSError:
            return None
    digest = sha256_bytes(data)
    rel = _rel(path)
    _READS[rel] = digest
    log = os.environ.get(READS_ENV)
    if log:
        with open(log, "a") as f:  # one short line per call: appends of this size do not interleave
            f.write(json.dumps({"path": rel, "sha256": digest}) + "\n")
    return digest


def read_noted(path: str | os.PathLike) -> bytes:
    """The bytes of ``path``, recorded in the ledger (:func:`note_read`): how a reader of the record's tables reads
    them, so that what it draws can name what it was drawn from.

    Raises:
        OSError: the file cannot be read.
    """
    data = Path(path).read_bytes()
    note_read(path, data)
    return data


def reads() -> dict[str, str]:
    """The tables this process has read or written so far (:func:`note_read`): ``{path relative to the repository:
    sha256}``, the latest bytes of each, sorted by path."""
    return dict(sorted(_READS.items()))


def clear_reads() -> None:
    """Forget the ledger of :func:`reads` (tests; a long-lived process starting a new artifact)."""
    _READS.clear()


#: A timed block is flagged as timed under load when other processes used at least this share of the machine's CPU
#: time during it, or the hypervisor stole at least this share (percent; fixed before any timing was read).
LOAD_FLAG_PCT = 10.0


class MachineSnapshot(tuple):
    """(wall seconds, load average over 1 minute, /proc/stat jiffies: total, idle + iowait, steal; this process's
    CPU seconds) at one moment; :func:`machine_state` compares two. Fields are NaN where the system does not say."""

    __slots__ = ()


def machine_snapshot() -> MachineSnapshot:
    """The machine's state now, for :func:`machine_state`: load average, the kernel's CPU time counters (Linux
    ``/proc/stat``: all, idle + iowait, steal) and this process's own CPU time (``os.times``: user + system,
    children included)."""
    import math
    import time

    try:
        load1 = os.getloadavg()[0]
    except (OSError, AttributeError):
        load1 = math.nan
    total = idle = steal = math.nan
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
        total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest time is inside user)
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
        steal = fields[7] if len(fields) > 7 else 0.0
    except (OSError, ValueError, IndexError):
        pass
    t = os.times()
    own = t.user + t.system + t.children_user + t.children_system
    return MachineSnapshot((time.monotonic(), load1, total, idle, steal, own))


def machine_state(before: MachineSnapshot, after: MachineSnapshot) -> dict:
    """What the machine did between two :func:`machine_snapshot` calls around a timed block.

    Returns:
        ``load_before``, ``load_after`` (1-minute load averages; they include this process), ``steal_pct`` (CPU
        time the hypervisor gave to other guests, percent of the machine's CPU time in the block),
        ``other_cpu_pct`` (CPU time used by processes other than this one and its children, percent of the
        machine's CPU time: 50 means one of two cores busy elsewhere), ``under_load`` (True when either share
        reaches :data:`LOAD_FLAG_PCT`; None where ``/proc/stat`` is unreadable). Jiffies are 1/100 s, so a block
        shorter than about a second reads coarsely.
    """
    import math

    _, load0, tot0, idle0, steal0, own0 = before
    _, load1, tot1, idle1, steal1, own1 = after
    d_total = tot1 - tot0
    if not (math.isfinite(d_total) and d_total > 0):
        return {"load_before": load0, "load_after": load1, "steal_pct": math.nan, "other_cpu_pct": math.nan,
                "under_load": None}
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    busy = d_total - (idle1 - idle0) - (steal1 - steal0)
    other = max(0.0, busy - (own1 - own0) * hz)
    steal_pct = 100.0 * (steal1 - steal0) / d_total
    other_pct = 100.0 * other / d_total
    return {"load_before": round(load0, 2), "load_after": round(load1, 2), "steal_pct": round(steal_pct, 1),
            "other_cpu_pct": round(other_pct, 1),
            "under_load": bool(steal_pct >= LOAD_FLAG_PCT or other_pct >= LOAD_FLAG_PCT)}


def umask_mode() -> int:
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
        os.chmod(tmp, umask_mode())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def sha256_bytes(data: bytes) -> str:
    """The sha256 of ``data`` (64 hex digits): what a provenance sidecar records of each file it describes."""
    import hashlib

    return hashlib.sha256(data).hexdigest()


def atomic_write_files(contents: dict) -> None:
    """Write several files as one step: every ``{path: bytes}`` goes to a temporary file in its directory first, and
    only when all are written are they renamed into place (in the order given, the provenance sidecar last). An
    interruption before the renames leaves every old file as it was; one between renames leaves a file whose hash
    differs from its sidecar, which the record's hash check reports.
    """
    tmps = []
    try:
        for path, data in contents.items():
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, umask_mode())
            tmps.append((tmp, path))
        for tmp, path in tmps:
            os.replace(tmp, path)
    finally:
        for tmp, _ in tmps:
            if os.path.exists(tmp):
                os.unlink(tmp)


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
        os.chmod(tmp, umask_mode())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_directory(final: str | os.PathLike):
    """Build a directory that appears complete or not at all: yields a fresh temporary directory beside ``final``
    (same file system); when the block ends without an exception it replaces ``final`` (an old one is removed first),
    and the temporary directory is removed in every case. For checkpoint directories (converted models, trained
    drafts), where a reader checks for ``config.json`` and would take a half-written one for a whole one.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}-"))
    try:
        yield tmp
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def load_keyed_checkpoint(path: str | os.PathLike, key: dict, *, what: str = "checkpoint") -> dict | None:
    """The saved JSON object ``{"key": ..., ...}`` at ``path`` when it was written under ``key``, else None.

    A missing file gives None. An unreadable one, or one saved under another key (other settings, machine or code),
    is renamed ``<name>.stale-<time>`` with a warning and gives None, so that no result computed under other
    conditions is resumed and none is deleted. ``key`` is compared after a JSON round trip (tuples read as lists).
    """
    import json
    import time
    import warnings

    path = Path(path)
    if not path.exists():
        return None
    key = json.loads(json.dumps(dict(key), default=str))
    try:
        saved = json.loads(path.read_text())
        ok = saved.get("key") == key
        why = "its settings differ from this run's"
    except (OSError, ValueError, AttributeError) as err:
        ok, why = False, f"it cannot be read ({err})"
    if not ok:
        stale = path.with_name(f"{path.name}.stale-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(path, stale)
        warnings.warn(f"{what} {path} not resumed: {why}; kept as {stale.name}, starting afresh", stacklevel=3)
        return None
    return saved


def resumable_rows(n_items: int, run_one, *, checkpoint=None, key: dict | None = None, what: str = "checkpoint",
                   row_info: dict | None = None, progress: str | None = None,
                   index: str = "item") -> tuple[list[dict], int]:
    """One row per item ``0 .. n_items - 1``, kept in a checkpoint so that hours of work spread over sittings.

    ``run_one(i)`` returns item i's row (a JSON-serialisable dict); the row gets ``index: i`` (first) and the ``row_info``
    columns of this sitting (e.g. its commit and CPU). After every item, the rows so far are written atomically to
    ``checkpoint`` under ``key``; a later call with the same key skips the items already there (their rows keep the
    sitting that made them), and a checkpoint saved under another key is set aside
    (:func:`load_keyed_checkpoint`), never deleted. Rows of items at or beyond ``n_items`` are dropped. The caller
    deletes the checkpoint once its table is saved.

    Args:
        n_items: how many items (>= 0); run_one: ``f(i) -> dict``.
        checkpoint: a JSON file path, or None (no checkpoint: every item runs).
        key: the JSON-serialisable conditions a saved row must share with this run (models, settings, code).
        what: the checkpoint's name in the warning when one is set aside.
        row_info: columns added to the rows this call makes.
        progress: a tqdm description, or None for no progress bar.
        index: the name of the item-number column (e.g. "prompt").

    Returns:
        ``(rows, resumed)``: the rows sorted by item, and how many were read from the checkpoint.

    Two processes never work on one checkpoint at once: the second refuses at the start (a checkpoint of the record,
    under ``data/checkpoints``, also takes the record's lock, :func:`hold_record_lock_for`).

    Raises:
        ValueError: n_items < 0. KeyError: a checkpoint row without the ``index`` column.
        RecordBusyError: another process is filling the same checkpoint, or writing the record.
    """
    import json

    if n_items < 0:
        raise ValueError(f"n_items must be >= 0, got {n_items}")
    if checkpoint is not None:
        hold_record_lock_for(checkpoint)
        _hold_checkpoint(Path(checkpoint))
    key = json.loads(json.dumps(dict(key or {}), default=str))
    saved = None if checkpoint is None else load_keyed_checkpoint(checkpoint, key, what=what)
    rows = [r for r in (saved or {}).get("rows", []) if int(r[index]) < n_items]
    done = {int(r[index]) for r in rows}
    todo = [i for i in range(n_items) if i not in done]
    it = todo
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(todo, desc=progress, initial=len(done), total=n_items)
    for i in it:
        rows.append({index: i, **run_one(i), **(row_info or {})})
        if checkpoint is not None:
            atomic_write_text(Path(checkpoint), json.dumps({"key": key, "rows": rows}) + "\n")
    return sorted(rows, key=lambda r: int(r[index])), len(done)


# ----------------------------------------------------------------------------------------------------------------
# One writer of the committed record at a time
# ----------------------------------------------------------------------------------------------------------------

class RecordBusyError(RuntimeError):
    """Another job is writing this checkout's record (data/results, figures, the README's blocks)."""


_RECORD_LOCKS: dict = {}  # lock path -> the open file whose flock this process holds (until the process ends)


def record_lock_path() -> Path:
    """The checkout's record lock, ``build/record.lock`` (its holder is described in ``build/record.lock.json``)."""
    return repo_root() / "build" / "record.lock"


def record_lock_owner() -> dict | None:
    """What ``build/record.lock.json`` says of the job that last took the record lock (``pid``, ``job``: the process
    whose descendants share the lock, ``command``, ``since``), or None."""
    import json

    try:
        return json.loads(record_lock_path().with_suffix(".lock.json").read_text())
    except (OSError, ValueError):
        return None


def _ancestors(pid: int | None = None) -> list[int]:
    """This process and its ancestors' pids (Linux ``/proc``; elsewhere this process only)."""
    out, pid = [], os.getpid() if pid is None else pid
    while pid > 1 and pid not in out:
        out.append(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return " ".join(__import__("sys").argv)


def hold_record_lock(job: int | None = None) -> None:
    """Take the checkout's record lock for the rest of this process: a second job that would write the record at
    the same time (another ``make reproduce``, a shard, a notebook run with ``SPECREPRO_RECORD=1``) refuses with one
    line naming the first, instead of interleaving writes. Processes of the job that holds it (a notebook kernel
    under ``make reproduce``, a shard under the Makefile's lock) go on: the holder names its job's pid, and a
    process whose ancestors include it shares the lock. Idempotent; the kernel releases the lock when the holder
    dies, ``kill -9`` included.

    Args:
        job: the pid whose descendants share the lock (default: this process).

    Raises:
        RecordBusyError: another job holds it (the message names its pid, command and start).
    """
    import datetime
    import json

    path = record_lock_path()
    if str(path) in _RECORD_LOCKS:
        return
    fd = _flock_or_none(path)
    if fd is None:
        owner = record_lock_owner() or {}
        if int(owner.get("job", -1)) in _ancestors():
            return  # our own job holds it
        raise RecordBusyError(
            f"the record of {repo_root()} is being written by another job: pid {owner.get('pid', '?')} "
            f"({owner.get('command', 'unknown command')}), since {owner.get('since', '?')}; wait for it to finish "
            f"or stop it, then run this again") from None
    me = os.getpid()
    atomic_write_text(path.with_suffix(".lock.json"), json.dumps(
        {"pid": int(job or me), "job": int(job or me), "command": _command_line(int(job or me)),
         "since": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}) + "\n")
    _RECORD_LOCKS[str(path)] = fd


def _flock_or_none(path: Path) -> int | None:
    """An open file descriptor of ``path`` (created) holding its exclusive flock(2), or None when another process
    holds it. flock itself, not filelock: the lock belongs to the open file, so the background holder of
    :func:`hold_record_lock_for_job` keeps it across fork, and the kernel releases it when the last holder dies."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


_RECORD_PARTS = ("data/results", "data/checkpoints", "figures", "notebooks/executed/standard",
                 "notebooks/executed/humaneval164", "README.md", "docs")


def hold_record_lock_for(path: str | os.PathLike) -> None:
    """:func:`hold_record_lock` when ``path`` lies in the committed record (data/results, data/checkpoints,
    figures, the executed notebooks of record, README.md, docs/); nothing otherwise."""
    rel = _rel(Path(path))
    if any(rel == p or rel.startswith(p + "/") for p in _RECORD_PARTS):
        hold_record_lock()


def hold_record_lock_for_job(job: int) -> int:
    """Take the record lock for the job ``job`` (a ``make`` process: ``make reproduce``'s first prerequisite) and
    keep it in a background process until ``job`` ends, so that every recipe of that make shares it and no other
    job writes between two of them. Returns 0 (held, or already held by this job) or 1 (another job holds it: the
    line on stderr names it)."""
    import sys
    import time

    try:
        hold_record_lock(job=job)
    except RecordBusyError as err:
        print(f"specrepro: {err}", file=sys.stderr)
        return 1
    if str(record_lock_path()) not in _RECORD_LOCKS:
        return 0
    if os.fork() != 0:
        print(f"specrepro: the record lock is held for make (pid {job}) until it ends")
        os._exit(0)  # the child keeps the lock's open file, and with it the lock
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    while True:
        try:
            os.kill(job, 0)
        except ProcessLookupError:
            os._exit(0)
        except PermissionError:
            pass
        time.sleep(1.0)


_CHECKPOINT_LOCKS: dict = {}  # checkpoint path -> the open file whose flock this process holds


def _hold_checkpoint(path: Path) -> None:
    """Hold ``<checkpoint>.lock`` for the rest of this process (flock; released when it ends), or refuse.

    Raises:
        RecordBusyError: another process holds it.
    """
    key = str(path.resolve())
    if key in _CHECKPOINT_LOCKS:
        return
    fd = _flock_or_none(path.with_name(path.name + ".lock"))
    if fd is None:
        raise RecordBusyError(f"the checkpoint {path} is being filled by another process; let it finish (or stop "
                              f"it), then run this again to resume from it") from None
    _CHECKPOINT_LOCKS[key] = fd
