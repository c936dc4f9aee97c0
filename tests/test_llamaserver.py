"""llama.cpp's own decoding through llama-server as bench methods (specrepro.bench.llamaserver), on the tiny random
GGUF checkpoints of tests/test_llamacpp.py (specrepro.backends.tinygguf; vocabulary 32, 2 layers, float32).

* greedy: the server's tokens (no speculation, draft-model speculation with a bad and a perfect draft, n-gram
  speculation) equal llama.cpp's greedy tokens under our loop (LlamaCppLM, one token per forward); the prompt is
  evaluated as given (no BOS added, no cache); the bench methods' runners agree with ``llama-ar``'s.
* sampling: the bench's settings reach the server (same seed, same tokens).
* processes: a server stops on close, at interpreter exit (atexit) and when its parent is killed; an idle server
  does not spin; its CPU time counts as the bench's own in the harness's machine state.

Skipped (with the reason) where llama-server is not built (specrepro.sim.llamacpp_build.build_llama_server; about
2-3 minutes on 2 cores once the examples are built) or llama_cpp does not import.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from specrepro.backends.llamacpp import LlamaCppLM, llama_cpp_available
from specrepro.backends.tinygguf import TinyShape, tiny_llama_gguf
from specrepro.core.blocklm import chain_generate
from specrepro.core.sampling import SamplingConfig
from specrepro.sim.llamacpp_build import llama_server_program

_OK, _WHY = llama_cpp_available()
_BIN = llama_server_program()
pytestmark = [
    pytest.mark.skipif(not _OK, reason=f"llama_cpp does not import ({_WHY})"),
    pytest.mark.skipif(_BIN is None, reason="llama-server is not built (python -c \"from specrepro.sim.llamacpp_build "
                                            "import build_llama_server as b; b()\", a few minutes)"),
    pytest.mark.usefixtures("one_thread"),
]

GREEDY = SamplingConfig(0.0)
PROMPTS = ([5, 9, 17, 6], [3, 4, 5, 6, 7, 8, 9, 10, 11, 3, 4, 5])
EOS = [2]
N_NEW = 40


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (float(fields[11]) + float(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture(autouse=True)
def server_logs(tmp_path, monkeypatch):
    """Server logs in the test's folder, not build/llama-server."""
    monkeypatch.setenv("SPECREPRO_LLAMA_SERVER_LOGS", str(tmp_path / "server-logs"))


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-gguf-server")
    return {"target": tiny_llama_gguf(1, TinyShape(), d), "draft": tiny_llama_gguf(2, TinyShape(), d)}


@pytest.fixture(scope="module")
def reference(paths):
    lm = LlamaCppLM(paths["target"], n_threads=1)
    return {tuple(p): chain_generate(lm, torch.tensor(p), max_new_tokens=N_NEW, sampling=GREEDY,
                                     eos_token_id=EOS).tokens for p in PROMPTS}


def _server(paths, flags=(), draft=None):
    from specrepro.bench import llamaserver as ls

    return ls.LlamaServer(ls.server_command(_BIN, paths["target"], draft, flags, 1))


@pytest.mark.parametrize("method,draft", [("llama-server-ar", None), ("llama-server-draft", "draft"),
                                          ("llama-server-draft-nmax7", "target"),
                                          ("llama-server-ngram-simple", None), ("llama-server-ngram-mod", None)])
def test_server_greedy_equals_llamacpp_greedy(paths, reference, method, draft):
    from specrepro.bench import llamaserver as ls

    srv = _server(paths, ls.SERVER_METHODS[method].flags, paths[draft] if draft else None)
    try:
        for p in PROMPTS:
            tokens, timings, _ = ls.completion(srv, p, max_new_tokens=N_NEW, sampling=GREEDY, eos_token_id=EOS)
            assert tokens == reference[tuple(p)]
            assert timings["prompt_n"] == len(p) and timings["cache_n"] == 0  # no BOS added, nothing cached
            if draft == "target":  # a perfect draft: every drafted token accepted
                assert timings["draft_n"] > 0 and timings["draft_n_accepted"] == timings["draft_n"]
            if draft == "draft":
                assert timings["draft_n"] > 0
            out = ls.run_output(tokens, timings, 0.1)
            assert sum(out.accepted) == timings.get("draft_n_accepted", 0)
            assert len(out.accepted) == len(tokens) - sum(out.accepted)
    finally:
        srv.close()
    assert not _alive(srv.pid)


def test_bench_methods_match_llama_ar(paths):
    from specrepro.bench.llama import _runner
    from specrepro.bench.registry import REGISTRY, BenchContext, known_methods
    from specrepro.measure.harness import HELPER_PIDS, make_generator

    names = ["llama-server-ar", "llama-server-draft"]
    assert set(names) <= set(known_methods())
    ctx = BenchContext(target=None, tokenizer=None, draft=None, prompts=[], sampling=GREEDY, gamma=1,
                       max_new_tokens=24, eos_token_id=EOS, vocab_size=32, target_name=str(paths["target"]),
                       draft_name=str(paths["draft"]))
    runners = {n: REGISTRY[n].factory(ctx, n, 1) for n in names}
    again = REGISTRY["llama-server-ar"].factory(ctx, "llama-server-ar", 1)  # the same server, not a second one
    servers = [v for k, v in ctx._shared.items() if k.startswith("llama-server:")]
    try:
        assert len(servers) == 2 and {s.pid for s in servers} <= HELPER_PIDS
        ar = _runner(ctx, 1, None)
        for p in PROMPTS:
            ids = torch.tensor(p)
            ref = ar(ids, make_generator(0)).tokens
            for n in names:
                assert runners[n](ids, make_generator(0)).tokens == ref, n
            assert again(ids, make_generator(0)).tokens == ref
        note = ctx.config_notes["llama_server"]
        assert set(note["methods"]) == set(names)
        assert note["eos"]["bench_stop_ids_the_server_does_not_stop_at"] == []
        assert "--spec-type draft-simple" in note["methods"]["llama-server-draft"]["command"]
    finally:
        for s in servers:
            s.close()
    assert not any(_alive(s.pid) for s in servers) and not {s.pid for s in servers} & HELPER_PIDS


def test_sampling_settings_reach_the_server(paths):
    from specrepro.bench import llamaserver as ls

    cfg = SamplingConfig(1.0, top_k=8, top_p=0.9)
    srv = _server(paths)
    try:
        runs = [ls.completion(srv, PROMPTS[0], max_new_tokens=16, sampling=cfg,
                              generator=torch.Generator().manual_seed(s), eos_token_id=())[0] for s in (7, 7, 8)]
        assert ls.sampler_fields(cfg, torch.Generator().manual_seed(7))["samplers"] == ["temperature", "top_k",
                                                                                         "top_p"]
    finally:
        srv.close()
    assert runs[0] == runs[1] and len(runs[0]) == 16 and all(0 <= t < 32 for t in runs[0])


def test_idle_server_sleeps_and_counts_as_own_cpu(paths):
    from specrepro.bench import llamaserver as ls
    from specrepro.files import machine_snapshot
    from specrepro.measure import harness

    srv = _server(paths)
    try:
        assert srv.pid in harness.HELPER_PIDS
        ls.completion(srv, PROMPTS[1], max_new_tokens=N_NEW, sampling=GREEDY, eos_token_id=EOS)
        time.sleep(0.3)
        c0 = _cpu_s(srv.pid)
        time.sleep(1.0)
        assert _cpu_s(srv.pid) - c0 <= 0.05  # idle: no spinning threads
        # the helper's CPU time is this process's own in the harness's snapshot
        assert harness._snapshot()[5] - machine_snapshot()[5] == pytest.approx(harness._helper_cpu_s(), abs=0.02)
        assert harness._helper_cpu_s() > 0
    finally:
        srv.close()
    assert srv.pid not in harness.HELPER_PIDS and harness._helper_cpu_s() == 0.0


_CHILD = """
import sys, time
from specrepro.bench import llamaserver as ls
srv = ls.LlamaServer(ls.server_command(sys.argv[1], sys.argv[2], None, (), 1))
print(srv.pid, flush=True)
if sys.argv[3] == "hang":
    time.sleep(600)
"""


@pytest.mark.parametrize("how", ["exit", "killed"])
def test_no_orphan_server(paths, how):
    """A server ends with the bench: at interpreter exit (atexit), and when the bench is killed (SIGKILL skips atexit:
    the kernel's parent-death signal)."""
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(_BIN), str(paths["target"]),
                              "hang" if how == "killed" else "exit"], stdout=subprocess.PIPE, text=True)
    pid = int(child.stdout.readline())
    if how == "killed":
        assert _alive(pid)
        child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    deadline = time.monotonic() + 15
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


def test_decoding_goes_on_past_a_server_stop_that_is_no_bench_stop(paths):
    """The server ends generation at its vocabulary's EOS (id 2 here); with bench stop ids that exclude it, the
    decoding continues (a further request) and equals our loop's with the same stop ids, at every draft type."""
    from specrepro.bench import llamaserver as ls

    lm = LlamaCppLM(paths["target"], n_threads=1)
    cases = []
    for first in range(3, 32):
        p = [first, 9, 17, 6]
        ref = chain_generate(lm, torch.tensor(p), max_new_tokens=N_NEW, sampling=GREEDY, eos_token_id=[]).tokens
        if 2 in ref[:-1]:
            cases.append((p, ref))
    assert cases, "no prompt whose greedy continuation holds the server's EOS"
    for flags, draft in (((), None), (ls.SERVER_METHODS["llama-server-draft-nmax7"].flags, paths["target"])):
        srv = _server(paths, flags, draft)
        try:
            for p, ref in cases[:3]:
                tokens, timings, _ = ls.completion(srv, p, max_new_tokens=N_NEW, sampling=GREEDY, eos_token_id=[])
                assert tokens == ref and timings["requests"] >= 2
                # and with the server's EOS among the bench's stop ids: one request, cut after it
                tokens, timings, _ = ls.completion(srv, p, max_new_tokens=N_NEW, sampling=GREEDY, eos_token_id=[2])
                assert tokens == ref[:ref.index(2) + 1] and timings["requests"] == 1
        finally:
            srv.close()
