"""The model cache under concurrency, kills and damage, and the record's one-job lock: each test runs the real code
paths (``specrepro.models.load_model`` on a zoo entry whose GGUF is a tiny llama written by the project, so that a
build takes a second instead of minutes) in separate processes where the question is about processes."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# a zoo entry whose "fetch" is a tiny llama GGUF (its path in $TINY_GGUF): load_model runs the real dequantize, save
# and cache rule on it
PRELUDE = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    import specrepro.models as m
    gguf = Path(os.environ["TINY_GGUF"])
    m.ZOO["tiny-race"] = m.ModelSpec(name="tiny-race", description="a tiny random llama", arch="llama",
                                     gguf_name=gguf.name, sha256=os.environ["TINY_SHA"], parts=(), licence="-",
                                     republisher="-", hf_origin="-")
    m.fetch_gguf = lambda name: gguf
""")


@pytest.fixture
def tiny_env(tmp_path):
    """The environment of a process using an empty cache under ``tmp_path/cache`` and the tiny GGUF (made outside
    that cache, so that only the zoo entry is built by the processes under test)."""
    from specrepro.backends.tinygguf import tiny_llama_gguf
    from specrepro.models import sha256_file

    gguf = tiny_llama_gguf(0, directory=tmp_path / "gguf")
    cache = tmp_path / "cache"
    cache.mkdir()
    return {**os.environ, "SPECREPRO_CACHE": str(cache), "TINY_GGUF": str(gguf), "TINY_SHA": sha256_file(gguf),
            "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}


def _python(code: str, env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _entry(env) -> Path:
    return Path(env["SPECREPRO_CACHE"]) / "hf" / f"tiny-race-{env['TINY_SHA'][:12]}"


def test_three_builders_and_a_reader_on_an_empty_cache_see_one_entry(tiny_env, tmp_path):
    """Three processes load the same zoo model at the same moment on an empty cache while a fourth keeps opening its
    weights: one builds, two wait and reuse (first writer wins), and the entry that appeared is never removed or
    replaced (one inode, no read that fails once it existed)."""
    go, stop = tmp_path / "go", tmp_path / "stop"
    entry = _entry(tiny_env)
    reader = _python(f"""
        go, stop, entry = Path({str(go)!r}), Path({str(stop)!r}), Path({str(entry)!r})
        inodes, reads, failures, seen = set(), 0, [], False
        while not stop.exists():
            try:
                ino = os.stat(entry).st_ino
                with open(entry / "model.safetensors", "rb") as f:
                    f.read(1 << 16)
                inodes.add(ino); reads += 1; seen = True
            except FileNotFoundError as err:
                if seen:
                    failures.append(str(err))
        print(json.dumps({{"inodes": len(inodes), "reads": reads, "failures": failures[:3], "n_fail": len(failures)}}))
    """, tiny_env)
    builders = [_python(f"""
        go = Path({str(go)!r})
        while not go.exists():
            time.sleep(0.005)
        model, _ = m.load_model("tiny-race")
        d = m.model_path("tiny-race")
        print(json.dumps({{"inode": os.stat(d).st_ino, "params": sum(p.numel() for p in model.parameters())}}))
    """, tiny_env) for _ in range(3)]
    time.sleep(8)  # every process has imported torch and transformers and waits at the barrier
    go.touch()
    outs = [b.communicate(timeout=300) for b in builders]
    time.sleep(1)
    stop.touch()
    r_out, r_err = reader.communicate(timeout=60)
    for b, (out, err) in zip(builders, outs):
        assert b.returncode == 0, err[-2000:]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    seen = json.loads(r_out.strip().splitlines()[-1])
    assert seen["n_fail"] == 0, seen["failures"]
    assert seen["reads"] > 0 and seen["inodes"] == 1
    assert len({r["inode"] for r in results}) == 1 and results[0]["inode"] == os.stat(entry).st_ino
    assert len({r["params"] for r in results}) == 1
    # exactly one process built it: the others waited for it or found it whole
    from specrepro.cache import check_entry

    assert check_entry(entry, full=True) is None
    built_by = json.loads((entry / "SPECREPRO_ENTRY.json").read_text())["pid"]
    assert built_by in {b.pid for b in builders}
    assert not [p for p in entry.parent.iterdir() if p.name.startswith(".") and not p.name.endswith(".lock")]


def test_a_build_killed_midway_is_cleaned_and_rebuilt_by_the_next(tiny_env, tmp_path):
    """``kill -9`` in the middle of writing the dequantized checkpoint: the next load says in one line that it removes
    the interrupted build's temporary, builds the entry and loads it; nothing of the killed build is left."""
    marker = tmp_path / "saving"
    victim = _python(f"""
        import transformers
        real = transformers.PreTrainedModel.save_pretrained
        def slow_save(self, d, **kw):
            real(self, d, **kw)
            Path({str(marker)!r}).touch()
            time.sleep(600)  # killed here: the weights are written, the entry is not finished
        transformers.PreTrainedModel.save_pretrained = slow_save
        m.load_model("tiny-race")
    """, tiny_env)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert victim.poll() is None, victim.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "the build never reached its save"
        time.sleep(0.05)
    os.kill(victim.pid, signal.SIGKILL)
    victim.communicate()
    entry = _entry(tiny_env)
    assert not entry.exists()
    left = [p for p in entry.parent.iterdir() if p.name.startswith(f".{entry.name}") and not p.name.endswith(".lock")]
    assert left, "the killed build left no temporary: the kill came too late to test anything"
    nxt = _python("""
        model, _ = m.load_model("tiny-race")
        print(sum(p.numel() for p in model.parameters()))
    """, tiny_env)
    out, err = nxt.communicate(timeout=300)
    assert nxt.returncode == 0, err[-2000:]
    lines = [ln for ln in err.splitlines() if ln.startswith("specrepro cache:")]
    assert len(lines) == 1 and "interrupted build" in lines[0], err[-2000:]
    assert "Traceback" not in err
    assert not [p for p in entry.parent.iterdir() if p.name.startswith(".") and not p.name.endswith(".lock")]
    from specrepro.cache import check_entry

    assert check_entry(entry, full=True) is None


def _load_in_process(env, monkeypatch):
    """load_model('tiny-race') in this process under ``env``'s cache and tiny GGUF (the full-hash memo cleared, as
    in a new process)."""
    import specrepro.cache as cache
    import specrepro.models as m

    monkeypatch.setenv("SPECREPRO_CACHE", env["SPECREPRO_CACHE"])
    gguf = Path(env["TINY_GGUF"])
    monkeypatch.setitem(m.ZOO, "tiny-race", m.ModelSpec(
        name="tiny-race", description="a tiny random llama", arch="llama", gguf_name=gguf.name,
        sha256=env["TINY_SHA"], parts=(), licence="-", republisher="-", hf_origin="-"))
    monkeypatch.setattr(m, "fetch_gguf", lambda name: gguf)
    cache._VERIFIED.clear()
    return m.load_model("tiny-race")[0]


def _cache_lines(capfd) -> list[str]:
    return [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("specrepro cache:")]


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "no manifest", "stale temporary"])
def test_a_damaged_entry_is_said_in_one_line_and_rebuilt(tiny_env, monkeypatch, capfd, damage):
    """A truncated weights file, one flipped byte in its middle (same size: found by the full hash, once per
    process), an entry without a manifest (an older layout) and a temporary folder left by a killed build: each gives
    one line on stderr, is rebuilt (or removed) and the model loads with the weights it had."""
    import torch

    first = _load_in_process(tiny_env, monkeypatch)
    ref = {k: v.clone() for k, v in first.state_dict().items()}
    entry = _entry(tiny_env)
    weights = entry / "model.safetensors"
    size = weights.stat().st_size
    _cache_lines(capfd)
    if damage == "truncated":
        os.truncate(weights, size // 2)
    elif damage == "flipped byte":
        with open(weights, "r+b") as f:
            f.seek(size // 2)
            b = f.read(1)
            f.seek(size // 2)
            f.write(bytes([b[0] ^ 0xFF]))
    elif damage == "no manifest":
        (entry / "SPECREPRO_ENTRY.json").unlink()
    else:
        stale = entry.with_name(f".{entry.name}.tmp-999999")
        stale.mkdir()
        (stale / "config.json").write_text("{}")
        (entry / "SPECREPRO_ENTRY.json").unlink()  # so that the next call builds, and meets the temporary
    again = _load_in_process(tiny_env, monkeypatch)
    lines = _cache_lines(capfd)
    expected = {"truncated": "truncated", "flipped byte": "corrupted", "no manifest": "no manifest",
                "stale temporary": "interrupted build"}[damage]
    assert any(expected in ln for ln in lines), lines
    assert len(lines) == (2 if damage == "stale temporary" else 1), lines  # the temporary, then the entry
    assert weights.stat().st_size == size
    assert all(torch.equal(ref[k], v) for k, v in again.state_dict().items())
    assert not [p for p in entry.parent.iterdir() if p.name.startswith(".") and not p.name.endswith(".lock")]
    # and now it is whole: a third load says nothing
    _load_in_process(tiny_env, monkeypatch)
    assert _cache_lines(capfd) == []


def test_a_damaged_gguf_file_entry_is_rebuilt(tmp_path, capfd):
    """A file entry (a tiny GGUF, as the zoo's assembled GGUF files) cut short on disk is noticed and written again,
    byte for byte as before."""
    from specrepro.backends.tinygguf import tiny_llama_gguf

    path = tiny_llama_gguf(3, directory=tmp_path)
    data = path.read_bytes()
    os.truncate(path, len(data) - 100)
    capfd.readouterr()
    assert tiny_llama_gguf(3, directory=tmp_path).read_bytes() == data
    lines = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("specrepro cache:")]
    assert len(lines) == 1 and "truncated" in lines[0]


def test_build_entry_rejects_what_it_cannot_do(tmp_path):
    from specrepro.cache import CacheEntryError, build_entry, check_entry

    with pytest.raises(ValueError, match="kind"):
        build_entry(tmp_path / "x", lambda tmp: None, kind="tarball")
    with pytest.raises(CacheEntryError, match="produced nothing"):
        build_entry(tmp_path / "x", lambda tmp: None)
    with pytest.raises(ZeroDivisionError):
        build_entry(tmp_path / "y", lambda tmp: (tmp / "a").write_text("a") and 1 / 0)
    assert check_entry(tmp_path / "x") == "missing" and check_entry(tmp_path / "y") == "missing"
    # a trainer that holds its entry's lock while it trains, then saves through build_entry (reentrant in a process)
    from specrepro.cache import entry_lock

    with entry_lock(tmp_path / "z"):
        build_entry(tmp_path / "z", lambda tmp: (tmp / "w.bin").write_bytes(b"w"))
    assert check_entry(tmp_path / "z", full=True) is None
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == ["z"]


# ------------------------------------------------------------------------------------------------------------------
# Two jobs on one checkout
# ------------------------------------------------------------------------------------------------------------------

LOCK_PRELUDE = textwrap.dedent("""
    import os, sys, time, subprocess
    from pathlib import Path
    import specrepro.files as files
    files.record_lock_path = lambda: Path(os.environ["LOCK_DIR"]) / "record.lock"
""")


def _lock_python(code: str, env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", LOCK_PRELUDE + textwrap.dedent(code)], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_a_second_job_refuses_to_write_the_record_and_names_the_first(tmp_path):
    """Job A holds the record lock (as a shard or notebook run of record does from its first write on); a process of
    A's job (a notebook kernel it started) shares it; job B refuses with one line naming A's pid; once A ends, B
    may write."""
    env = {**os.environ, "LOCK_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    ready = tmp_path / "ready"
    kernel = LOCK_PRELUDE + "files.hold_record_lock(); print('child shares the lock')"
    a = _lock_python(f"""
        files.hold_record_lock()
        child = subprocess.run([sys.executable, "-c", {kernel!r}], capture_output=True, text=True)
        print(child.stdout.strip() or child.stderr.strip()[-500:], flush=True)
        Path({str(ready)!r}).touch()
        time.sleep(600)
    """, env)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert a.poll() is None and time.monotonic() < deadline, a.communicate()[1][-2000:]
        time.sleep(0.05)
    b = _lock_python("""
        try:
            files.hold_record_lock()
            print("B took the lock")
        except files.RecordBusyError as err:
            print(f"refused: {err}")
    """, env)
    b_out, b_err = b.communicate(timeout=60)
    assert b_out.startswith("refused: ") and f"pid {a.pid} " in b_out, (b_out, b_err)
    a.kill()
    a_out, _ = a.communicate()
    assert a_out.splitlines()[0] == "child shares the lock"
    c = _lock_python("""
        files.hold_record_lock()
        print("C took the lock")
    """, env)
    assert c.communicate(timeout=60)[0].strip() == "C took the lock"


def test_make_reproduce_holds_the_record_lock_until_make_ends(tmp_path):
    """``make reproduce``'s first prerequisite (``python -m specrepro record-lock --job $PPID``) keeps the lock for the
    make process: every recipe of that make (its descendants) shares it, another job refuses, and the lock is free
    within seconds of make's end."""
    env = {**os.environ, "LOCK_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    share = LOCK_PRELUDE + "files.hold_record_lock(); print('recipe shares the lock')"
    # stands for make: its first recipe takes the lock for it (as `record-lock --job $$PPID` does), then a recipe runs
    holder = LOCK_PRELUDE + "sys.exit(files.hold_record_lock_for_job(int(sys.argv[1])))"
    make = _lock_python(f"""
        took = subprocess.run([sys.executable, "-c", {holder!r}, str(os.getpid())], capture_output=True, text=True)
        assert took.returncode == 0 and "held for make" in took.stdout, took
        sys.stdin.readline()
        out = subprocess.run([sys.executable, "-c", {share!r}], capture_output=True, text=True)
        print(out.stdout.strip() or out.stderr.strip()[-500:], flush=True)
        sys.stdin.readline()
    """, env, stdin=subprocess.PIPE)
    time.sleep(0.5)
    deadline = time.monotonic() + 60
    while (tmp_path / "record.lock.json").exists() is False:
        assert make.poll() is None and time.monotonic() < deadline, make.communicate()[1][-2000:]
        time.sleep(0.05)
    other = _lock_python("""
        try:
            files.hold_record_lock(); print("took it")
        except files.RecordBusyError as err:
            print(f"refused: {err}")
    """, env)
    o_out = other.communicate(timeout=60)[0]
    assert o_out.startswith("refused: ") and f"pid {make.pid} " in o_out, o_out
    make.stdin.write("\n")
    make.stdin.flush()
    time.sleep(0.1)
    make.stdin.write("\n")
    make.stdin.flush()
    m_out, m_err = make.communicate(timeout=60)
    assert "recipe shares the lock" in m_out, (m_out, m_err)
    for _ in range(100):  # the holder polls make once a second
        after = _lock_python("""
            try:
                files.hold_record_lock(); print("took it")
            except files.RecordBusyError:
                print("busy")
        """, env).communicate(timeout=60)[0].strip()
        if after == "took it":
            break
        time.sleep(0.2)
    assert after == "took it"


def test_the_makefile_takes_the_record_lock_first_and_locks_the_wheel_build():
    text = (REPO / "Makefile").read_text()
    reproduce = next(ln for ln in text.splitlines() if ln.startswith("reproduce:"))
    assert reproduce.split(":", 1)[1].split()[0] == "record-lock"
    assert "-m specrepro record-lock --job $$PPID" in text
    assert "flock 9" in text
    ci = (REPO / ".ci" / "run").read_text()
    assert "mktemp -d" in ci and "export SPECREPRO_CACHE" in ci


def test_two_processes_never_fill_one_checkpoint(tmp_path):
    """A resumable run's checkpoint (``files.resumable_rows``) is filled by one process: a second one started on
    the same checkpoint refuses at once, before any work, and resumes once the first has ended."""
    env = {**os.environ, "LOCK_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    ckpt = tmp_path / "rows.json"
    ready = tmp_path / "ready"
    first = _lock_python(f"""
        def slow(i):
            Path({str(ready)!r}).touch()
            time.sleep(600)
        files.resumable_rows(3, slow, checkpoint=Path({str(ckpt)!r}), key={{"k": 1}})
    """, env)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1][-2000:]
        time.sleep(0.05)
    second_code = f"""
        calls = []
        try:
            rows, resumed = files.resumable_rows(3, lambda i: calls.append(i) or {{"v": i}},
                                                 checkpoint=Path({str(ckpt)!r}), key={{"k": 1}})
            print("ran", len(calls), "resumed", resumed)
        except files.RecordBusyError as err:
            print(f"refused after {{len(calls)}} items: {{err}}")
    """
    out = _lock_python(second_code, env).communicate(timeout=60)[0]
    assert out.startswith("refused after 0 items: ") and "being filled by another process" in out, out
    first.kill()
    first.communicate()
    assert _lock_python(second_code, env).communicate(timeout=60)[0].strip() == "ran 3 resumed 0"


def test_the_cache_command_lists_checks_and_clears(tmp_path, monkeypatch, capsys):
    """``python -m specrepro cache``: each entry with its size and check; ``verify`` finds a same-size corruption
    that the quick check cannot; ``clear --yes`` deletes the folder."""
    from specrepro import cache
    from specrepro.backends.tinygguf import tiny_llama_gguf

    monkeypatch.setenv("SPECREPRO_CACHE", str(tmp_path / "c"))
    path = tiny_llama_gguf(1)
    parser = type("P", (), {})()
    args = type("A", (), {"action": "list", "yes": False})()
    assert cache.run_command(args, parser) == 0
    out = capsys.readouterr().out
    assert "ok" in out and f"tiny-gguf/{path.name}" in out and "1 entries" in out
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))
    args.action = "verify"
    assert cache.run_command(args, parser) == 1
    assert "corrupted" in capsys.readouterr().out
    args.action, args.yes = "clear", True
    assert cache.run_command(args, parser) == 0 and not (tmp_path / "c").exists()
