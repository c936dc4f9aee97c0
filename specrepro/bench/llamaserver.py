"""Benchmark methods that are llama.cpp's own decoding, speculation included, as CPU users run it: ``llama-server``.

What this file is: methods whose runner sends the bench's prompt to a ``llama-server`` process (the vendored
llama.cpp of the pinned llama-cpp-python, built by :func:`specrepro.sim.llamacpp_build.build_llama_server` with the
project's portable CPU flags) and reads back the generated token ids. Each name states the server's whole
configuration (:data:`SERVER_METHODS` holds the exact flags):

* ``llama-server-ar`` — no speculation: llama.cpp's own autoregressive decoding through its server.
* ``llama-server-draft`` — draft-model speculation (``--spec-type draft-simple``: the draft proposes greedily, a
  draft token is kept only when it equals the token the target's sampler picks) at the server's defaults, read from
  the vendored source (common/common.h, ``common_params_speculative_draft``): ``--spec-draft-n-max 3``,
  ``--spec-draft-n-min 0``, ``--spec-draft-p-min 0.0`` (``--spec-draft-p-split 0.10``). The vendored tree has
  renamed the flags ``--draft-max`` / ``--draft-min`` to ``--spec-draft-n-max`` / ``--spec-draft-n-min``
  (tools/server/README.md: "the argument has been removed"); the old names are refused. ``-md`` alone does not
  speculate in this version (the type stays ``none`` for a plain draft GGUF file: checked), hence the explicit
  ``--spec-type``.
* ``llama-server-draft-nmax7`` — the same at ``--spec-draft-n-max 7``, the setting llama.cpp's documentation shows
  for a target/draft pair (examples/speculative-simple/README.md: ``--spec-type draft-simple --spec-draft-n-max 7``
  for Qwen3-8B with Qwen3-0.6B); neither docs/speculative.md nor tools/server/README.md recommends other draft-model
  settings (their ``--fim-qwen-7b-spec`` preset for Qwen2.5-Coder 7B + 0.5B keeps the defaults above).
* ``llama-server-ngram-mod`` — n-gram speculation without a draft model, the configuration the vendored docs
  present as the default (docs/speculative.md, ``--spec-default`` in common/arg.cpp: "enables ngram-mod"):
  ``--spec-type ngram-mod --spec-ngram-mod-n-match 24 --spec-ngram-mod-n-min 48 --spec-ngram-mod-n-max 64``. Its
  hash pool is shared by all of a server's requests by llama.cpp's design (docs/speculative.md: "different
  requests can benefit from each other"; common/speculative.cpp resets it only when a quarter full or after a
  streak of low acceptance): within a bench run it holds the n-grams of the earlier calls (the warm-up, earlier
  prompts, earlier passes), so with ``--repeats`` > 1 a pass drafts from the previous passes' outputs. Time it with
  ``--repeats 1`` to keep calls independent; the JSON says so (``config["llama_server"]``).
* ``llama-server-ngram-simple`` — the simplest n-gram speculation (docs/speculative.md: "the simplest
  self-speculative approach with minimal overhead"), stateless across requests, at its defaults (common/common.h):
  ``--spec-type ngram-simple`` (lookup n-gram 12, draft m-gram 48, 1 hit).

Every server: ``-m`` the target's GGUF file (``-md`` the draft's for the draft methods; the zoo's files, as the
``llama-*`` methods of :mod:`specrepro.bench.llama`, via :func:`specrepro.bench.llama.gguf_path`), ``--threads``
``torch.get_num_threads()`` (prompt and draft threads follow it), ``-np 1`` (one slot), ``-c 4096``,
``--cache-ram 0`` (no host-memory prompt cache), ``--no-webui``, ``--poll 0``, on 127.0.0.1 at a free port, its log
in ``build/llama-server/``. One process per distinct command line, started once per bench run (lazily, when the
first method needing it is built) and waited for until ``/health`` answers; stopped at interpreter exit (atexit:
SIGTERM, then SIGKILL after 10 s) and, should the bench die without running atexit, by the kernel (the server gets
SIGTERM when the thread that started it ends: ``PR_SET_PDEATHSIG``).

Idle servers sleep: this build runs ggml's CPU work on OpenMP (libgomp), whose workers spin briefly after a graph
and then sleep on a futex (``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT`` of the bench's environment, which the server
inherits and the JSON records); ``--poll`` (ggml's own threadpool: 50 = busy-wait between graphs by default) only
acts in builds without OpenMP, and is set to 0 so that such a build's idle server sleeps too. Measured here after a
request: 0 % CPU for an idle server.

Each call: POST ``/completion`` with the prompt as token ids (the harness's ids, chat template included; a token
array gets no BOS from the server — tools/server/README.md: BOS only for a string prompt — and every call checks
``timings.prompt_n`` equals the prompt's length and ``timings.cache_n`` is 0), ``n_predict`` = the bench's token
budget, ``cache_prompt: false`` (every call prefills its whole prompt; nothing carries over but ngram-mod's pool),
``return_tokens: true``. Greedy decoding: ``temperature: 0`` in the server's default sampler chain, whose
temperature step keeps only the highest logit at a temperature <= 0 (src/llama-sampler.cpp): the argmax. Sampling:
``temperature``, ``top_k`` (0 = off), ``top_p`` with ``samplers: ["temperature", "top_k", "top_p"]`` (our order:
temperature, then top-k, then top-p; llama.cpp's other samplers, min-p 0.05 among them, left out) and a ``seed``
drawn from the harness's generator of the (pass, prompt) — the same law as every method's, not the same draws.
Stops: the bench's stop ids, as every method's. The server stops at its vocabulary's end-of-generation tokens
(the token included in the returned ids), a superset of the bench's here: Qwen2.5-Coder's GGUF files end generation
at ``<|endoftext|>`` (151643) and the FIM tokens 151662-151664 besides ``<|im_end|>`` (151645), the bench's one stop
id; where the server stops at a token that is not a bench stop id, a further request continues the same decoding
(see :func:`completion`: the extra HTTP round trip is in the call's time). The returned ids are cut after the first
bench stop id (a bench stop id that is not an end-of-generation token for the server would be decoded past and cut;
``config["llama_server"]["eos"]`` lists both sets and any such id).

What a call returns (a :class:`~specrepro.measure.harness.RunOutput`): the generated ids; ``times`` ``prefill`` and
``decode`` (the server's own ``timings.prompt_ms`` and ``predicted_ms``, seconds) and ``request`` (the HTTP call as
this process saw it); the harness's wall clock around the call is the time of record (HTTP included, as users pay
it). The server reports draft totals, not steps: ``drafted`` / ``accepted`` hold ``timings.draft_n`` /
``draft_n_accepted`` in their first entry and 0 in the others, and their length is the number of target forwards
that committed tokens, derived as in our loop's count (new tokens − accepted: the prefill's forward commits the
first token, each later one its accepted draft tokens and one more; exact unless a draft was cut by the token
budget or a stop id). So sums (acceptance rate, drafted per step) and step counts are right, per-step
distributions are not available; no α terms.

The server's CPU time counts as the method's own in the harness's machine state
(:func:`specrepro.measure.harness.register_helper_process`), not as another process's.

What it is not: our decoding loop over llama.cpp's kernels (:mod:`specrepro.bench.llama`), or llama.cpp's
speculative example programs (:mod:`specrepro.sim.llamacpp_build`, the llama.cpp audit).
"""

from __future__ import annotations

import atexit
import http.client
import json
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specrepro.bench.options import BenchOptionError
from specrepro.bench.registry import BenchContext, register_method

__all__ = ["SERVER_METHODS", "SERVER_N_CTX", "ServerMethod", "LlamaServer", "server_command", "live_servers",
           "stop_all_servers"]

#: KV cache of every server (``-c``), as the llama.cpp methods' contexts (:data:`specrepro.bench.llama.LLAMA_N_CTX`)
SERVER_N_CTX = 4096
#: flags every server gets besides models, port and threads
COMMON_FLAGS = ("-np", "1", "-c", str(SERVER_N_CTX), "--cache-ram", "0", "--no-webui", "--poll", "0")
#: seconds to wait for ``/health`` after start (loading a model on a loaded 2-core machine takes seconds)
START_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class ServerMethod:
    """A registered server configuration: ``flags`` (speculation only; models, port, threads and
    :data:`COMMON_FLAGS` are added), ``needs_draft`` (the server gets ``-md`` the draft's GGUF file), ``source`` (where
    the setting comes from), ``description`` (one line for ``--list-methods``), ``shared_state`` (the speculation
    keeps state across requests)."""

    flags: tuple[str, ...]
    needs_draft: bool
    source: str
    description: str
    shared_state: bool = False


SERVER_METHODS: dict[str, ServerMethod] = {
    "llama-server-ar": ServerMethod(
        (), False, "llama-server without speculation",
        "llama.cpp's own AR decoding through llama-server (no speculation; greedy = llama.cpp's argmax)"),
    "llama-server-draft": ServerMethod(
        ("--spec-type", "draft-simple"), True,
        "server defaults, common/common.h: n_max 3, n_min 0, p_min 0.0, p_split 0.10",
        "llama-server's draft-model speculation at its defaults (--spec-type draft-simple: draft max 3, min 0, "
        "p-min 0.0)"),
    "llama-server-draft-nmax7": ServerMethod(
        ("--spec-type", "draft-simple", "--spec-draft-n-max", "7"), True,
        "examples/speculative-simple/README.md (--spec-type draft-simple --spec-draft-n-max 7)",
        "llama-server's draft-model speculation at the documented pair setting (draft-simple, draft max 7, min 0, "
        "p-min 0.0)"),
    "llama-server-draft-nmax16": ServerMethod(
        ("--spec-type", "draft-simple", "--spec-draft-n-max", "16"), True,
        "swept: draft max 16, for files whose forward over a block costs little more than over one token (our "
        "adaptive methods draft up to 20)",
        "llama-server's draft-model speculation with long blocks (draft-simple, draft max 16, min 0, p-min 0.0)"),
    "llama-server-ngram-mod": ServerMethod(
        ("--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "24", "--spec-ngram-mod-n-min", "48",
         "--spec-ngram-mod-n-max", "64"), False,
        "--spec-default (common/arg.cpp, docs/speculative.md): ngram-mod, n-match 24, n-min 48, n-max 64",
        "llama-server's default n-gram speculation (--spec-default = ngram-mod 24/48/64); its pool is shared "
        "across requests (use --repeats 1)", shared_state=True),
    "llama-server-ngram-simple": ServerMethod(
        ("--spec-type", "ngram-simple"), False,
        "ngram-simple at its defaults (common/common.h: size-n 12, size-m 48, min-hits 1)",
        "llama-server's simplest n-gram speculation (--spec-type ngram-simple: lookup 12, draft 48, 1 hit)"),
}


# ---------------------------------------------------------------------------------------------------------------
# The server process
# ---------------------------------------------------------------------------------------------------------------

_LIVE: dict[int, "LlamaServer"] = {}
_LIVE_LOCK = threading.Lock()


def live_servers() -> list["LlamaServer"]:
    """The servers this process started and has not stopped."""
    with _LIVE_LOCK:
        return list(_LIVE.values())


def stop_all_servers() -> None:
    """Stop every live server (registered with atexit)."""
    for srv in live_servers():
        srv.close()


atexit.register(stop_all_servers)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _prctl():
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except Exception:
        return None


_PRCTL = _prctl()


def _pdeathsig():  # runs in the child between fork and exec: no imports, no allocation beyond the call
    if _PRCTL is not None:
        _PRCTL(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG: SIGTERM when the starting thread ends


def default_log_dir() -> Path:
    """``build/llama-server`` of the repository (server logs), or ``$SPECREPRO_LLAMA_SERVER_LOGS``."""
    env = os.environ.get("SPECREPRO_LLAMA_SERVER_LOGS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "build" / "llama-server"


def server_command(binary, target: Path, draft: Path | None, flags, threads: int) -> list[str]:
    """The server's command line without host and port (the key of one server per bench run)."""
    cmd = [str(binary), "-m", str(target)]
    if draft is not None:
        cmd += ["-md", str(draft)]
    cmd += ["--threads", str(int(threads)), *COMMON_FLAGS, *flags]
    return cmd


class LlamaServer:
    """One ``llama-server`` process on 127.0.0.1 at a free port: started by the constructor and waited for until
    ``/health`` answers 200; :meth:`post` sends a JSON request over one kept-alive connection; :meth:`close` stops
    it (SIGTERM, SIGKILL after ``grace_s``) and reaps it.

    Raises:
        RuntimeError: the server exited or did not answer within ``timeout_s`` (with the end of its log).
    """

    def __init__(self, command: list[str], *, log_dir: Path | None = None, timeout_s: float = START_TIMEOUT_S,
                 env: dict | None = None, tries: int = 3):
        from specrepro.measure.harness import register_helper_process

        self.command = list(command)
        log_dir = Path(log_dir) if log_dir is not None else default_log_dir()
        log_dir.mkdir(parents=True, exist_ok=True)
        last = None
        for _ in range(max(1, int(tries))):
            self.port = _free_port()
            self.log_path = log_dir / f"llama-server-{os.getpid()}-{self.port}.log"
            self._log = open(self.log_path, "ab")
            self.argv = [*self.command, "--host", "127.0.0.1", "--port", str(self.port)]
            self._log.write(("$ " + " ".join(self.argv) + "\n").encode())
            self._log.flush()
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                         stderr=subprocess.STDOUT, env=env, preexec_fn=_pdeathsig)
            self.pid = self.proc.pid
            with _LIVE_LOCK:
                _LIVE[self.pid] = self
            register_helper_process(self.pid)
            self._conn = None
            try:
                self._wait_healthy(timeout_s)
                return
            except RuntimeError as exc:
                last = exc
                self.close()
                if "bind" not in str(exc).lower():  # only a lost race for the port is worth another try
                    break
        raise last

    def _tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode} while starting; the end of "
                                   f"{self.log_path}:\n{self._tail()}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                resp = conn.getresponse()
                resp.read()
                conn.close()
                if resp.status == 200:
                    return
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"llama-server did not answer /health within {timeout_s:.0f} s; the end of "
                           f"{self.log_path}:\n{self._tail()}")

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def post(self, path: str, payload: dict) -> dict:
        """POST ``payload`` as JSON to ``path`` and return the decoded JSON answer (one reconnect on a dropped
        connection).

        Raises:
            RuntimeError: the server died, or answered with an HTTP error (its message).
        """
        body = json.dumps(payload).encode()
        for attempt in (0, 1):
            if not self.alive:
                raise RuntimeError(f"llama-server (pid {self.pid}) is not running; the end of {self.log_path}:\n"
                                   f"{self._tail()}")
            if self._conn is None:
                self._conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=None)
            try:
                self._conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
                resp = self._conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException):
                self._conn.close()
                self._conn = None
                if attempt:
                    raise
                continue
            if resp.status != 200:
                raise RuntimeError(f"llama-server answered {resp.status} to {path}: {data[:2000]!r}")
            return json.loads(data)
        raise AssertionError("unreachable")

    def close(self, grace_s: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``grace_s``), reap it and stop counting it as a helper.
        Idempotent."""
        from specrepro.measure.harness import unregister_helper_process

        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None
        if self.proc.poll() is None:
            try:
                self.proc.terminate()
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            except ProcessLookupError:
                pass
        else:
            self.proc.wait()
        unregister_helper_process(self.pid)
        with _LIVE_LOCK:
            _LIVE.pop(self.pid, None)
        try:
            self._log.close()
        except Exception:
            pass


# ---------------------------------------------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------------------------------------------

def sampler_fields(sampling, generator: torch.Generator | None) -> dict:
    """The ``/completion`` fields of the bench's sampling: greedy is ``temperature: 0`` (llama.cpp's argmax);
    otherwise temperature, top-k (0 = off), top-p in our order, llama.cpp's other samplers left out, and a seed drawn
    from ``generator``."""
    if sampling.greedy:
        return {"temperature": 0.0}
    seed = int(torch.randint(0, 2 ** 31 - 1, (1,), generator=generator).item()) if generator is not None else 0
    return {"temperature": float(sampling.temperature), "top_k": int(sampling.top_k or 0),
            "top_p": float(sampling.top_p), "min_p": 0.0, "typical_p": 1.0,
            "samplers": ["temperature", "top_k", "top_p"], "seed": seed}


def completion(server: LlamaServer, prompt: list[int], *, max_new_tokens: int, sampling, generator=None,
               eos_token_id=()) -> tuple[list[int], dict, float]:
    """One decoding of ``prompt`` through ``/completion``: (generated ids, ending after the first of
    ``eos_token_id``, the server's ``timings`` summed over its requests, seconds of the HTTP calls).

    The server stops at every end-of-generation token of its vocabulary; where it stops at one that is not a bench
    stop id (Qwen2.5's ``<|endoftext|>`` when the bench stops at ``<|im_end|>`` only), the decoding goes on as every
    other method's does: a further request continues from the prompt and the tokens so far, reusing the slot's
    cache of this same decoding (``cache_prompt: true`` for that request only; the first always re-prefills), for
    the tokens left of the budget. Its prompt work counts as decoding (``timings['prompt_ms']`` is the first
    request's). The returned ``timings`` carry ``requests`` (how many were sent).

    Raises:
        RuntimeError: the server evaluated another number of prompt tokens than given (a BOS added, a cache reused)
            or returned no token ids.
    """
    prompt = [int(t) for t in prompt]
    stops = {int(e) for e in (eos_token_id or ())}
    tokens: list[int] = []
    total = {"prompt_n": 0, "cache_n": 0, "prompt_ms": 0.0, "predicted_ms": 0.0, "draft_n": 0,
             "draft_n_accepted": 0, "requests": 0}
    seconds = 0.0
    while True:
        first = not tokens
        payload = {"prompt": prompt + tokens, "n_predict": int(max_new_tokens) - len(tokens),
                   "cache_prompt": not first, "return_tokens": True, "stream": False,
                   **sampler_fields(sampling, generator)}
        t0 = time.perf_counter()
        r = server.post("/completion", payload)
        seconds += time.perf_counter() - t0
        t = r.get("timings") or {}
        n_eval, n_cached = int(t.get("prompt_n", -1)), int(t.get("cache_n", 0))
        if first and (n_eval != len(prompt) or n_cached != 0):
            raise RuntimeError(f"llama-server evaluated {n_eval} prompt tokens ({n_cached} from its cache) for a "
                               f"prompt of {len(prompt)}: a BOS was added or a cache reused")
        if not first and n_eval + n_cached != len(prompt) + len(tokens):
            raise RuntimeError(f"llama-server continued from {n_eval} + {n_cached} cached tokens, not the "
                               f"{len(prompt) + len(tokens)} sent")
        new = r.get("tokens")
        if new is None or (not new and int(r.get("tokens_predicted", 0)) > 0):
            raise RuntimeError("llama-server returned no token ids (return_tokens)")
        total["requests"] += 1
        total["prompt_n"] += n_eval
        total["cache_n"] += n_cached
        total["prompt_ms" if first else "predicted_ms"] += float(t.get("prompt_ms", 0.0))
        total["predicted_ms"] += float(t.get("predicted_ms", 0.0))
        total["draft_n"] += int(t.get("draft_n", 0))
        total["draft_n_accepted"] += int(t.get("draft_n_accepted", 0))
        tokens += [int(x) for x in new]
        cut = next((i for i, x in enumerate(tokens) if x in stops), None)
        if cut is not None:
            return tokens[:cut + 1], total, seconds
        if len(tokens) >= int(max_new_tokens):
            return tokens[:int(max_new_tokens)], total, seconds
        if r.get("stop_type") != "eos" or not new:
            return tokens, total, seconds


def run_output(tokens: list[int], timings: dict, seconds: float):
    """The harness's :class:`~specrepro.measure.harness.RunOutput` of one call (see the module's docstring)."""
    from specrepro.measure.harness import RunOutput

    drafted, accepted = int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))
    steps = max(0, len(tokens) - accepted)
    d = [drafted] + [0] * (steps - 1) if steps else []
    a = [accepted] + [0] * (steps - 1) if steps else []
    times = {"prefill": float(timings.get("prompt_ms", float("nan"))) / 1000.0,
             "decode": float(timings.get("predicted_ms", float("nan"))) / 1000.0, "request": float(seconds)}
    return RunOutput(tokens=list(tokens), drafted=d, accepted=a, times=times)


# ---------------------------------------------------------------------------------------------------------------
# Bench methods
# ---------------------------------------------------------------------------------------------------------------

def _vocab(path: Path) -> tuple[int, list[int]] | None:
    """(vocabulary size, end-of-generation token ids) of a GGUF file as llama.cpp reads them (None without
    llama_cpp)."""
    try:
        import llama_cpp
        from llama_cpp import Llama
    except Exception:
        return None
    try:
        lm = Llama(model_path=str(path), vocab_only=True, verbose=False)
        vocab = llama_cpp.llama_model_get_vocab(lm.model)
        n = int(llama_cpp.llama_vocab_n_tokens(vocab))
        out = [i for i in range(n) if llama_cpp.llama_vocab_is_eog(vocab, i)]
        lm.close()
        return n, out
    except Exception:
        return None


def _server(ctx: BenchContext, name: str) -> LlamaServer:
    from specrepro.bench.llama import role_gguf
    from specrepro.sim.llamacpp_build import llama_server_program

    spec = SERVER_METHODS[name]
    binary = llama_server_program()
    if binary is None:
        raise BenchOptionError("the llama-server methods need llama.cpp's llama-server, built from the pinned "
                               "llama-cpp-python's source: python -c \"from specrepro.sim.llamacpp_build import "
                               "build_llama_server as b; b()\"")
    target = role_gguf(ctx, "target")
    draft = role_gguf(ctx, "draft") if spec.needs_draft else None
    threads = torch.get_num_threads()
    cmd = server_command(binary, target, draft, spec.flags, threads)

    def build():
        note = ctx.config_notes.setdefault("llama_server", {
            "binary": str(binary), "threads": threads, "threads_from": "torch.get_num_threads()",
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"), "GOMP_SPINCOUNT": os.environ.get("GOMP_SPINCOUNT"),
            "common_flags": list(COMMON_FLAGS), "request": {"cache_prompt": False, "return_tokens": True,
                                                           "prompt": "token ids (no BOS added)"},
            "methods": {}})
        if "eos" not in note:
            voc = _vocab(target)
            if voc is not None and ctx.vocab_size is not None and voc[0] > int(ctx.vocab_size):
                raise BenchOptionError(f"the target's GGUF file {target.name} has {voc[0]} tokens, the bench's "
                                       f"target {ctx.vocab_size}: its token ids would mean other strings")
            eog = None if voc is None else voc[1]
            bench_eos = sorted(int(e) for e in (ctx.eos_token_id or ()))
            note["eos"] = {"bench": bench_eos, "server_eog": eog,
                           "bench_stop_ids_the_server_does_not_stop_at":
                               None if eog is None else sorted(set(bench_eos) - set(eog))}
        srv = LlamaServer(cmd)
        if "cpu_variant" not in note:  # the CPU variant the server loaded (all-variants build): its memory map
            from specrepro.backends.llamacpp import process_cpu_variant

            note["cpu_variant"] = process_cpu_variant(srv.pid) or "static"
        note["methods"][name] = {"command": " ".join(srv.argv), "setting_from": spec.source,
                                 "state_shared_across_requests": spec.shared_state, "log": str(srv.log_path)}
        return srv

    srv = ctx.shared("llama-server:" + "\0".join(cmd), build)
    note = ctx.config_notes.get("llama_server", {})
    note.setdefault("methods", {}).setdefault(name, {"command": " ".join(srv.argv), "setting_from": spec.source,
                                                     "state_shared_across_requests": spec.shared_state,
                                                     "log": str(srv.log_path)})
    return srv


def _factory(ctx: BenchContext, name: str, gamma: int):
    srv = _server(ctx, name)

    def run(ids, generator):
        tokens, timings, seconds = completion(srv, ids.cpu().tolist(), max_new_tokens=ctx.max_new_tokens,
                                              sampling=ctx.sampling, generator=generator,
                                              eos_token_id=ctx.eos_token_id)
        return run_output(tokens, timings, seconds)

    return run


def _register(name: str, spec: ServerMethod) -> None:
    def factory(ctx, _name, gamma):
        return _factory(ctx, name, gamma)

    factory.__doc__ = f"{name}: {spec.description}"
    from specrepro.bench.llama import FORMAT_OPTION

    register_method(name, needs_draft=spec.needs_draft, uses_gamma=False, family="llama.cpp",
                    options=(FORMAT_OPTION,), description=spec.description)(factory)


for _name, _spec in SERVER_METHODS.items():
    _register(_name, _spec)
