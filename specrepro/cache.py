"""The user cache: where fetched, converted and trained artifacts live, and the one rule by which each is built.

What this file is: the rule every cache entry follows, whoever builds it and however many processes want it at once
(two pytest-xdist workers, a notebook kernel beside a shard, two ``make`` runs):

1. **Readers take only a verified entry.** :func:`check_entry` compares an entry with the manifest written when it was
   built (every file's size, the sha256 of its first and last 64 KiB, and its full sha256): the cheap part on every
   call, the full hash once per process and file (:data:`VERIFY_ENV` changes that).
2. **Builders build under a lock, first writer wins.** :func:`build_entry` takes a cross-process lock for the entry
   (``filelock``; released by the kernel if the process dies, ``kill -9`` included), checks the entry again, and only
   if it is still missing or damaged builds it in a temporary name beside it and renames it into place. A finished,
   valid entry is never removed or replaced, so a process that memory-maps its files (safetensors are read lazily)
   never sees them vanish; a second builder waits and reuses the first one's entry.
3. **A damaged entry is mended, nothing lost.** A missing manifest (an older layout, or a build killed between its
   file and its manifest), a truncated or altered file, or a temporary folder left by a killed build each gives one
   line on stderr and is rebuilt (or removed) under the lock, never a traceback.

Entries that train for minutes and resume from a checkpoint kept inside their folder (Medusa heads, the stdlib
self-distillation shards) use :func:`entry_lock` alone: the same lock and recheck, with their own marker-last writes.

Layout under :func:`cache_root` (``$SPECREPRO_CACHE``, default ``~/.cache/specrepro``; ``docs/cache.md`` lists sizes):
``gguf/`` assembled GGUF checkpoints, ``hf/`` their dequantized safetensors (and 16-bit copies), ``tiny-gguf/`` tiny
random GGUF files for the llama.cpp tests, ``distill/`` distilled drafts, ``medusa/`` trained heads and their data,
``fr_spec/`` token counts, ``wheels/`` the llama.cpp wheel built by the Makefile (``$SPECREPRO_WHEELS``).

What it is not: the downloader or the converter (:mod:`specrepro.models`), nor the lock of the committed record
(:func:`specrepro.files.hold_record_lock`).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Callable

from specrepro.files import atomic_write_text

__all__ = ["cache_root", "MANIFEST", "VERIFY_ENV", "check_entry", "build_entry", "entry_lock", "locked",
           "CacheEntryError", "entries", "entry_size", "configure_parser", "run_command"]

#: the manifest of a folder entry (inside it); a file entry's is ``<file>.entry.json`` beside it
MANIFEST = "SPECREPRO_ENTRY.json"
#: how often a full sha256 is checked: "once" (default: once per process and file), "cheap" (size and the first and
#: last 64 KiB only) or "always" (every call)
VERIFY_ENV = "SPECREPRO_CACHE_VERIFY"
_FORMAT = 1
_ENDS = 1 << 16
_TMP = ".tmp-"
# {file path: (inode, size, mtime_ns)} of files whose full sha256 this process has checked
_VERIFIED: dict[str, tuple] = {}


class CacheEntryError(RuntimeError):
    """A cache entry could not be built (the build raised, or produced nothing)."""


def cache_root() -> Path:
    """The user cache: ``$SPECREPRO_CACHE`` or ``~/.cache/specrepro`` (created)."""
    root = os.environ.get("SPECREPRO_CACHE")
    path = Path(root).expanduser() if root else Path.home() / ".cache" / "specrepro"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _say(msg: str) -> None:
    print(f"specrepro cache: {msg}", file=sys.stderr, flush=True)


def _manifest_path(final: Path) -> Path:
    return final / MANIFEST if final.is_dir() else final.with_name(final.name + ".entry.json")


def _ends_sha(path: Path, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(_ENDS))
        if size > 2 * _ENDS:
            f.seek(size - _ENDS)
        h.update(f.read(_ENDS))
    return h.hexdigest()


def _full_sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _describe(path: Path) -> dict:
    size = path.stat().st_size
    return {"size": size, "ends_sha256": _ends_sha(path, size), "sha256": _full_sha(path)}


def _files_of(final: Path) -> dict[str, Path]:
    if final.is_dir():
        return {p.relative_to(final).as_posix(): p for p in sorted(final.rglob("*"))
                if p.is_file() and p.name != MANIFEST}
    return {final.name: final}


def check_entry(final: str | os.PathLike, full: bool | None = None) -> str | None:
    """Why the cache entry ``final`` (a folder or a file) cannot be used, or None when it can.

    Args:
        final: the entry's path.
        full: also compare every file's full sha256 with the manifest. None: as :data:`VERIFY_ENV` says (default:
            once per process and file, remembered by inode, size and modification time).

    Returns:
        None for a verified entry; else one line: missing, no manifest (an older layout or a killed build), a file
        missing, of another size (truncated) or with other bytes (corrupted).
    """
    final = Path(final)
    if not final.exists():
        return "missing"
    man = _manifest_path(final)
    try:
        manifest = json.loads(man.read_text())
        files = manifest["files"]
        if manifest.get("format") != _FORMAT or not isinstance(files, dict) or not files:
            raise ValueError("unknown manifest format")
    except FileNotFoundError:
        return "no manifest (written by an older version of specrepro, or its build was interrupted)"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"unreadable manifest {man.name} ({err})"
    mode = os.environ.get(VERIFY_ENV, "once")
    base = final if final.is_dir() else final.parent
    on_disk = _files_of(final)
    extra = sorted(set(on_disk) - set(files))
    if extra and final.is_dir():
        return f"files not in its manifest: {', '.join(extra[:3])}"
    for rel, want in files.items():
        path = base / rel
        try:
            st = path.stat()
        except OSError:
            return f"{rel} is missing"
        if st.st_size != want["size"]:
            return f"{rel} is {st.st_size} bytes where {want['size']} were written (truncated or altered)"
        try:
            if _ends_sha(path, st.st_size) != want["ends_sha256"]:
                return f"{rel} has other bytes at its start or end than were written (corrupted)"
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            do_full = full if full is not None else (mode == "always" or (mode == "once"
                                                                           and _VERIFIED.get(str(path)) != stamp))
            if do_full:
                if _full_sha(path) != want["sha256"]:
                    return f"{rel}'s sha256 is not the one recorded when it was built (corrupted)"
                _VERIFIED[str(path)] = stamp
        except OSError as err:
            return f"{rel} cannot be read ({err})"
    return None


def _lock_path(final: Path) -> Path:
    return final.with_name(f".{final.name}.lock")


@contextlib.contextmanager
def entry_lock(final: str | os.PathLike, what: str | None = None, poll_message_after: float = 2.0):
    """Hold the cross-process lock of the cache entry ``final`` (``.<name>.lock`` beside it; ``filelock``, released by
    the kernel when the holder dies). A process that waits longer than ``poll_message_after`` seconds says once on
    stderr what it waits for. Reentrant within a process."""
    from filelock import FileLock, Timeout

    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(_lock_path(final)), is_singleton=True)  # one instance per path: reentrant in a process
    try:
        lock.acquire(timeout=poll_message_after)
    except Timeout:
        _say(f"waiting for another process to finish building {what or final.name} ({final})")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _stale_temporaries(final: Path) -> list[Path]:
    return sorted(final.parent.glob(f".{final.name}{_TMP}*"))


def build_entry(final: str | os.PathLike, build: Callable[[Path], None], what: str | None = None, *,
                kind: str = "dir") -> Path:
    """The cache entry ``final``, verified (:func:`check_entry`), built by ``build`` if it is missing or damaged.

    The rule (see the module's docstring): a verified entry is returned at once; otherwise the entry's lock is taken
    (:func:`entry_lock`), the entry checked again (another process may have built it meanwhile: it is reused), a
    damaged entry and any temporary left by a killed build are removed with one line on stderr each, then
    ``build(tmp)`` writes the entry under a temporary name beside ``final`` (for ``kind="dir"`` an empty folder it
    fills, for ``kind="file"`` a path it creates), its manifest is written (every file's size and sha256) and it is
    renamed into place.

    Args:
        final: the entry's path in the cache.
        build: ``f(tmp: Path) -> None``.
        what: a name for messages (default: the entry's name).
        kind: "dir" or "file".

    Returns:
        ``final``.

    Raises:
        ValueError: an unknown ``kind``. CacheEntryError: ``build`` produced nothing at ``tmp``. Whatever ``build``
        raises (the temporary is removed; nothing is left in the cache).
    """
    if kind not in ("dir", "file"):
        raise ValueError(f"kind must be 'dir' or 'file', got {kind!r}")
    final = Path(final)
    what = what or final.name
    if check_entry(final) is None:
        return final
    with entry_lock(final, what):
        why = check_entry(final)
        if why is None:
            return final
        for tmp in _stale_temporaries(final):
            _say(f"removing {tmp.name}, left by an interrupted build of {what}")
            _remove(tmp)
        side = final.with_name(final.name + ".entry.json")  # a file entry's manifest
        if why != "missing":
            _say(f"{what} at {final} is not usable: {why}; rebuilding it")
            _remove(final)
        side.unlink(missing_ok=True)
        tmp = final.with_name(f".{final.name}{_TMP}{os.getpid()}")
        try:
            if kind == "dir":
                tmp.mkdir()
            build(tmp)
            if not tmp.exists() or (kind == "dir" and not any(tmp.iterdir())):
                raise CacheEntryError(f"building {what} produced nothing at {tmp}")
            manifest = {"format": _FORMAT, "what": what,
                        "built": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                        "pid": os.getpid()}
            if kind == "dir":
                manifest["files"] = {rel: _describe(p) for rel, p in _files_of(tmp).items()}
                atomic_write_text(tmp / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
                os.replace(tmp, final)
            else:
                manifest["files"] = {final.name: _describe(tmp)}
                os.replace(tmp, final)  # the file first, its manifest last: a file without one is rebuilt
                atomic_write_text(side, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        finally:
            if tmp.exists():
                _remove(tmp)
        for path in _files_of(final).values():
            st = path.stat()
            _VERIFIED[str(path)] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return final


# ----------------------------------------------------------------------------------------------------------------
# What is in the cache: `python -m specrepro cache`
# ----------------------------------------------------------------------------------------------------------------

def entry_size(path: Path) -> int:
    """Bytes on disk under ``path`` (a file or a folder, symlinks not followed)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def entries(root: Path | None = None) -> list[dict]:
    """Every entry under the cache ``root`` (default :func:`cache_root`) that carries a manifest, and every other
    top-level item of its folders: ``{"path", "kind" (its folder: gguf, hf, ...), "bytes", "status"}``, status
    ``ok``, the reason from :func:`check_entry` (cheap check; ``full=True`` via ``verify``), ``no manifest`` or
    ``temporary``."""
    root = Path(root) if root is not None else cache_root()
    out = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        name = path.name
        if name.endswith(".lock") or name.endswith(".entry.json") or name == MANIFEST:
            continue
        if _TMP in name and name.startswith("."):
            out.append({"path": path, "kind": rel.parts[0], "bytes": entry_size(path), "status": "temporary"})
            continue
        if any(p.startswith(".") for p in rel.parts):
            continue
        man = _manifest_path(path)
        if man.exists():
            out.append({"path": path, "kind": rel.parts[0], "bytes": entry_size(path), "status": "manifest"})
    # drop what lies inside an entry already listed
    listed = [e["path"] for e in out]
    return [e for e in out if not any(p != e["path"] and p in e["path"].parents for p in listed)]


def configure_parser(p) -> None:
    p.add_argument("action", nargs="?", default="list", choices=("list", "verify", "clear"),
                   help="list: every entry with its size and a cheap check (default); verify: every file's full "
                        "sha256 against its manifest; clear: delete the cache folder (nothing else)")
    p.add_argument("--yes", action="store_true", help="clear without asking")


def run_command(args, parser) -> int:
    root = cache_root()
    if args.action == "clear":
        size = entry_size(root)
        if not args.yes and (not sys.stdin.isatty() or input(f"delete {root} ({size / 1e9:.2f} GB)? [y/N] ")
                             .strip().lower() != "y"):
            print("nothing deleted (pass --yes)")
            return 1
        shutil.rmtree(root, ignore_errors=True)
        print(f"deleted {root} ({size / 1e9:.2f} GB)")
        return 0
    rows = entries(root)
    total, bad, building = 0, 0, 0
    print(f"cache: {root}")
    for e in rows:
        status = e["status"]
        if status == "manifest":
            why = check_entry(e["path"], full=args.action == "verify")
            status = "ok" if why is None else why
            bad += status != "ok"
        else:
            building += 1
        total += e["bytes"]
        print(f"  {e['bytes'] / 1e6:10.1f} MB  {e['path'].relative_to(root)}  {status}")
    untracked = entry_size(root) - total
    print(f"{len(rows) - building} entries, {total / 1e9:.2f} GB; {untracked / 1e9:.2f} GB in other files (wheels, "
          f"trained heads' folders, locks); {bad} not ok (rebuilt on their next use)"
          + (f"; {building} temporary (a build under way, or left by a killed one and removed by the next build)"
             if building else ""))
    return 0 if bad == 0 else 1



def locked(final: str | os.PathLike | None, what: str | None = None):
    """:func:`entry_lock` of ``final``, or a context that does nothing when ``final`` is None (a computation asked
    not to use the cache): ``with locked(path if cache else None): <check, build, save>``."""
    return entry_lock(final, what) if final is not None else contextlib.nullcontext()
