"""llama.cpp's speculative example programs and its server, built from the source the installed llama-cpp-python was
built from.

What this file is: :func:`build_speculative_programs` downloads llama-cpp-python's source distribution at the pinned
version (``pip download --no-binary :all:``, the release requirements-llamacpp.txt pins), unpacks its vendored
llama.cpp under ``build/llama.cpp/src`` and builds only the two speculative examples, ``llama-speculative-simple``
(a draft model proposes, the target's own sampler decides: a draft token is kept only when it equals the token the
target samples) and ``llama-speculative`` (drafts a tree from a draft model and verifies it stochastically), with
CMake. Where the installed llama-cpp-python is the Makefile's all-variants build (requirements-llamacpp.txt), the
programs are built as loaders without a CPU backend of their own (:data:`CMAKE_FLAGS_DL`) and the package's CPU variant
modules are linked beside them (:func:`link_cpu_variants`), so llama.cpp's programs run the same kernels, chosen the
same way, as our loops; else with the former portable flags (AVX2, no AVX-512, no AMX: :data:`CMAKE_FLAGS`). :func:`speculative_programs` finds them once built. They are the black boxes of the
llama.cpp audit (:mod:`specrepro.sim.llamacpp_audit`). :func:`build_llama_server` builds ``llama-server`` (its
tools/server, the HTTP server whose own speculation the bench's ``llama-server-*`` methods time,
:mod:`specrepro.bench.llamaserver`) the same way, in the same CMake build folder and with the same flags;
:func:`llama_server_program` finds it. :func:`build_llama_programs` builds any list of the tree's CMake targets.

What it is not: part of the project's set-up (``make setup`` builds only the Python package; the continuous
integration does not build these programs, and the tests that need them skip without them).

Build time: minutes on 2 cores for the examples (the ggml CPU backend, libllama and common are compiled; the other
examples, tools and tests are not). ``llama-server`` on top of them: 76 more build steps (the server, its HTTP
library, the multimodal library mtmd it links, an empty web-UI table), 138 s with ``-j 2`` on this project's shared
2-core machine under load (2026-11-29, the examples already built). Each build's seconds are appended to
``build/llama.cpp/build-times.jsonl``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

__all__ = ["LLAMA_CPP_PYTHON_VERSION", "PROGRAMS", "SERVER_PROGRAMS", "CMAKE_FLAGS", "CMAKE_FLAGS_DL", "cmake_flags",
           "link_cpu_variants", "program_cpu_variant", "BuildError", "default_root",
           "speculative_programs", "build_speculative_programs", "build_llama_programs", "build_llama_server",
           "llama_server_program", "exit_wait_library"]

#: the llama-cpp-python release whose vendored llama.cpp is built (requirements-llamacpp.txt pins the same)
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
#: the CMake targets built, as named in the vendored tree (examples/speculative*/CMakeLists.txt)
PROGRAMS = ("llama-speculative-simple", "llama-speculative")
#: the server's CMake target (tools/server/CMakeLists.txt)
SERVER_PROGRAMS = ("llama-server",)
#: portable CPU flags (as requirements-llamacpp.txt); the examples and tools (so that the server is a target) are
#: configured, no tests, no app; the server's web UI is neither built (npm) nor downloaded (an empty asset table).
#: Only the targets asked for are compiled (``cmake --build --target``).
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=OFF", "-DGGML_SSE42=ON", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_BMI2=ON", "-DGGML_FMA=ON",
    "-DGGML_F16C=ON", "-DGGML_AVX_VNNI=OFF", "-DGGML_AVX512=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_BF16=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
)
#: with an all-variants llama-cpp-python (the Makefile's GGML_BACKEND_DL/GGML_CPU_ALL_VARIANTS build): the programs
#: are built as loaders (shared libraries, no CPU backend of their own) and run the CPU variants the package built
#: (:func:`link_cpu_variants`: the same source and compiler), so llama.cpp's programs and our loops run the same kernels
CMAKE_FLAGS_DL = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_BACKEND_DL=ON", "-DGGML_CPU=OFF",
    "-DGGML_NATIVE=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
)


def cmake_flags() -> tuple[str, ...]:
    """:data:`CMAKE_FLAGS_DL` where the installed llama-cpp-python holds CPU variants, else :data:`CMAKE_FLAGS`."""
    try:
        from specrepro.backends.llamacpp import cpu_variants

        return CMAKE_FLAGS_DL if cpu_variants() else CMAKE_FLAGS
    except ImportError:
        return CMAKE_FLAGS


def link_cpu_variants(bindir: str | os.PathLike) -> list[str]:
    """Link the installed package's CPU variant modules into the programs' folder ``bindir`` (where llama.cpp's
    ``ggml_backend_load_all`` looks first, beside the executable), leaving out the AMX variants where this machine
    does not grant AMX (:func:`specrepro.backends.llamacpp.amx_granted`); earlier links are replaced. Returns the
    variants linked (e.g. ``["haswell", ..., "zen4"]``); llama.cpp picks the best of them at each start."""
    from specrepro.backends.llamacpp import AMX_VARIANTS, amx_granted, cpu_variants

    bindir = Path(bindir)
    for old in bindir.glob("libggml-cpu-*.so"):
        if old.is_symlink():
            old.unlink()
    skip = () if amx_granted() else tuple(f"libggml-cpu-{a}.so" for a in AMX_VARIANTS)
    out = []
    for mod in cpu_variants():
        if mod.name in skip:
            continue
        (bindir / mod.name).symlink_to(mod)
        out.append(mod.name[len("libggml-cpu-"):-len(".so")])
    return out


def program_cpu_variant(log_text: str) -> str:
    """The CPU variant a llama.cpp program reports loading in its log (``load_backend: loaded CPU backend from
    .../libggml-cpu-<variant>.so``); ``"static"`` when it reports none (a build with its CPU backend linked in)."""
    import re

    found = re.findall(r"loaded CPU backend from \S*libggml-cpu-([A-Za-z0-9_.]+)\.so", log_text)
    return found[-1] if found else "static"


class BuildError(RuntimeError):
    """The programs could not be built: a missing tool (cmake, a C/C++ compiler, pip) or a failed step (its log)."""


def default_root() -> Path:
    """``build/llama.cpp`` of the repository (the folder holding ``specrepro``), or ``$SPECREPRO_LLAMACPP_BUILD``."""
    env = os.environ.get("SPECREPRO_LLAMACPP_BUILD")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "build" / "llama.cpp"


def speculative_programs(root: str | os.PathLike | None = None) -> dict[str, Path] | None:
    """The built programs ({target name: path}) under ``root`` (default :func:`default_root`), or None when any of
    :data:`PROGRAMS` is missing or not executable."""
    return _programs(root, PROGRAMS)


def _programs(root, names) -> dict[str, Path] | None:
    bindir = Path(root if root is not None else default_root()) / "cmake-build" / "bin"
    out = {name: bindir / name for name in names}
    if all(p.is_file() and os.access(p, os.X_OK) for p in out.values()):
        return out
    return None


def llama_server_program(root: str | os.PathLike | None = None) -> Path | None:
    """The built ``llama-server`` under ``root`` (default :func:`default_root`), or None when it is not built."""
    found = _programs(root, SERVER_PROGRAMS)
    return None if found is None else found["llama-server"]


def _missing_tools() -> list[str]:
    missing = [] if shutil.which("cmake") else ["cmake"]
    if not (os.environ.get("CXX") and shutil.which(os.environ["CXX"])) and not any(
            shutil.which(c) for c in ("c++", "g++", "clang++")):
        missing.append("a C++ compiler (c++, g++ or clang++)")
    if not (os.environ.get("CC") and shutil.which(os.environ["CC"])) and not any(
            shutil.which(c) for c in ("cc", "gcc", "clang")):
        missing.append("a C compiler (cc, gcc or clang)")
    return missing


def _run(cmd: list[str], log: Path, cwd: Path | None = None) -> None:
    with open(log, "a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        rc = subprocess.run(cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise BuildError(f"{cmd[0]} failed (exit {rc}); the end of {log}:\n{tail}")


def _source(root: Path, version: str, log: Path) -> Path:
    """The vendored llama.cpp tree of the sdist, unpacked once into ``root/src``."""
    src = root / "src"
    if (src / "CMakeLists.txt").is_file() and (src / "examples" / "speculative").is_dir():
        return src
    sdist_dir = root / "sdist"
    sdist_dir.mkdir(parents=True, exist_ok=True)
    name = f"llama_cpp_python-{version}.tar.gz"
    if not (sdist_dir / name).is_file():
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
              f"llama-cpp-python=={version}", "-d", str(sdist_dir)], log)
    tmp = root / "src.partial"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
    with tarfile.open(sdist_dir / name) as tar:
        members = []
        for m in tar.getmembers():
            if m.name.startswith(prefix) and len(m.name) > len(prefix):
                m.name = m.name[len(prefix):]
                members.append(m)
        if not members:
            raise BuildError(f"{name} holds no vendor/llama.cpp tree")
        tar.extractall(tmp, members=members, filter="data")
    if src.exists():
        shutil.rmtree(src)
    tmp.rename(src)
    return src


def _cache_mismatch(cache: Path, flags) -> list[str]:
    """The ``-DKEY=VALUE`` flags whose value CMake's cache does not hold (all of them when there is no cache)."""
    try:
        text = cache.read_text(errors="replace")
    except OSError:
        return list(flags)
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith(("//", "#")):
            values[key.split(":")[0]] = value
    out = []
    for flag in flags:
        key, _, value = flag[2:].partition("=")
        if values.get(key) != value:
            out.append(flag)
    return out


def build_llama_programs(programs=PROGRAMS, root: str | os.PathLike | None = None, *,
                         version: str = LLAMA_CPP_PYTHON_VERSION, jobs: int = 2) -> dict[str, Path]:
    """Build the CMake targets ``programs`` of the vendored llama.cpp under ``root`` (default :func:`default_root`,
    i.e. ``build/llama.cpp``) and return {target name: path of the binary}. Incremental: an existing source tree and
    CMake build are reused (a second call returns at once); the build folder is configured again only when its cache
    lacks one of :data:`CMAKE_FLAGS` (e.g. a folder configured before the server was a target).

    Layout: ``root/sdist`` (the downloaded source distribution), ``root/src`` (its vendor/llama.cpp),
    ``root/cmake-build`` (CMake's build folder, binaries in ``bin/``), ``root/build.log`` (every command's output),
    ``root/build-times.jsonl`` (one line per call: the targets, ``jobs``, seconds configuring and building).

    Raises:
        BuildError: cmake or a C/C++ compiler is missing (the message names them), or a step failed (with the end
            of its log).
    """
    import json

    programs = tuple(programs)
    root = Path(root if root is not None else default_root())
    missing = _missing_tools()
    if missing:
        raise BuildError(f"cannot build llama.cpp's {', '.join(programs)}: missing " + ", ".join(missing)
                         + " (install them, e.g. apt-get install cmake g++, and call this again)")
    root.mkdir(parents=True, exist_ok=True)
    log = root / "build.log"
    src = _source(root, version, log)
    bld = root / "cmake-build"
    t0 = time.monotonic()
    flags = cmake_flags()
    if _cache_mismatch(bld / "CMakeCache.txt", flags):
        gen = ["-G", "Ninja"] if shutil.which("ninja") and not (bld / "CMakeCache.txt").is_file() else []
        _run(["cmake", "-S", str(src), "-B", str(bld), *gen, *flags], log)
    t1 = time.monotonic()
    _run(["cmake", "--build", str(bld), "-j", str(int(jobs)), "--target", *programs], log)
    t2 = time.monotonic()
    if flags is CMAKE_FLAGS_DL:
        link_cpu_variants(bld / "bin")
    with open(root / "build-times.jsonl", "a") as fh:
        fh.write(json.dumps({"targets": list(programs), "jobs": int(jobs), "configure_s": round(t1 - t0, 1),
                             "build_s": round(t2 - t1, 1), "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                           time.gmtime())}) + "\n")
    found = _programs(root, programs)
    if found is None:
        raise BuildError(f"the build finished but {', '.join(programs)} are not all in {bld / 'bin'}; see {log}")
    return found


def build_speculative_programs(root: str | os.PathLike | None = None, *, version: str = LLAMA_CPP_PYTHON_VERSION,
                               jobs: int = 2) -> dict[str, Path]:
    """Build :data:`PROGRAMS` (:func:`build_llama_programs`) and return {target name: path of the binary}."""
    return build_llama_programs(PROGRAMS, root, version=version, jobs=jobs)


def build_llama_server(root: str | os.PathLike | None = None, *, version: str = LLAMA_CPP_PYTHON_VERSION,
                       jobs: int = 2) -> Path:
    """Build ``llama-server`` (:data:`SERVER_PROGRAMS`, :func:`build_llama_programs`: same source, build folder and
    CPU flags as the examples) and return the path of the binary."""
    return build_llama_programs(SERVER_PROGRAMS, root, version=version, jobs=jobs)["llama-server"]


_EXIT_WAIT_C = """\
/* specrepro: preloaded into llama.cpp's example programs (LD_PRELOAD). Their logger writes from its own thread and
   is never flushed at exit (common/log.cpp leaks it on purpose), so on a loaded machine a run often exits before its
   output is written. This registers an exit handler that sleeps 30 ms, giving that thread time to write; nothing
   else of the program changes. */
#include <stdlib.h>
#include <time.h>
static void specrepro_exit_wait(void) { struct timespec t = {0, 30000000}; nanosleep(&t, NULL); }
__attribute__((constructor)) static void specrepro_exit_wait_init(void) { atexit(specrepro_exit_wait); }
"""


def exit_wait_library(root: str | os.PathLike | None = None) -> Path | None:
    """A tiny shared library (compiled once into ``root``) to preload into the programs: an exit handler that waits
    30 ms so that llama.cpp's asynchronous logger writes the run's output before the process ends. None where no C
    compiler is found (the audit then relies on repeating cut runs alone)."""
    root = Path(root if root is not None else default_root())
    lib = root / "specrepro-exit-wait.so"
    if lib.is_file():
        return lib
    cc = next((c for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)), None)
    if cc is None:
        return None
    root.mkdir(parents=True, exist_ok=True)
    src = root / "specrepro-exit-wait.c"
    if not src.is_file() or src.read_text() != _EXIT_WAIT_C:
        tmp_src = root / f"specrepro-exit-wait.c.{os.getpid()}.{threading.get_ident()}.partial"
        tmp_src.write_text(_EXIT_WAIT_C)
        os.replace(tmp_src, src)
    tmp = root / f"specrepro-exit-wait.so.{os.getpid()}.{threading.get_ident()}.partial"
    rc = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(src)], capture_output=True).returncode
    if rc != 0:
        tmp.unlink(missing_ok=True)
        return None
    os.replace(tmp, lib)  # atomic: concurrent callers each install a complete copy
    return lib


if __name__ == "__main__":  # python -m specrepro.sim.llamacpp_build [TARGET ...] (default: the speculative examples)
    for k, v in build_llama_programs(tuple(sys.argv[1:]) or PROGRAMS).items():
        print(k, v)
