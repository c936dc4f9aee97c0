"""The exactness battery as an audit of llama.cpp's own speculative samplers, run as black boxes.

What this file is: the goodness-of-fit test of specrepro (chi-square with pooled bins and a simulated null,
:func:`specrepro.stats.gof_test`; its power, :func:`specrepro.stats.min_detectable_tv`) applied to the two
speculative example programs of the llama.cpp that llama-cpp-python 0.3.36 vendors, built by
:mod:`specrepro.sim.llamacpp_build`:

* ``llama-speculative-simple``: a draft model proposes up to ``--spec-draft-n-max`` tokens; the target's sampler chain
  samples at every drafted position and a draft token is kept only while it equals the token the target sampled
  (``common_sampler_sample_and_accept_n``); exact by construction whatever the draft proposes.
* ``llama-speculative``: the draft model's top tokens form one chain (``-np 1``) or a tree (``-np`` > 1, branches
  split where the draft's next candidates have probability > ``--draft-p-split``), verified stochastically: a draft
  token x is accepted with probability min(1, p(x)/q(x)) (p, q: the target's and the draft's candidate
  probabilities after their sampler chains), else the residual max(0, p - q) is sampled (SpecInfer's Algorithm 2,
  branches visited in random order). Audited with one chain (``-np 1``): with ``-np 3`` this build aborts in a few
  runs in a hundred (``GGML_ASSERT(logits != nullptr)`` after "sequential split is not supported when there are
  coupled sequences"; the option that would avoid it, ``-kvu``, is not offered to this program), and dropping the
  runs that abort would bias the law, so the tree is not in the table.

Each program runs many times on the tiny llama pair of :mod:`specrepro.backends.tinygguf` (the target, seed 1, two
layers; the draft: its first layer under its head, an early-exit draft that is often right), from the fixed prompt
"bfnc" (token ids 5 9 17 6), one process per sample with its own ``--seed``, generating :data:`LENGTH` tokens. The
printed text is mapped back to token ids exactly (:func:`text_to_ids`: the tiny vocabulary's pieces are one character
or a ``<...>`` special, a prefix-free code), and the joint law of the first :data:`LENGTH` tokens (a sequence that
ends with EOS is absorbed there) is compared with the target's exact law, enumerated from llama.cpp's own logits
(:class:`specrepro.backends.llamacpp.LlamaCppLM`) through llama.cpp's sampler chain in its order
(:func:`llamacpp_probs`: top-k, then top-p, then min-p (off), then temperature, then softmax).

For llama-speculative with one chain, the table also compares the samples with the law its code implies
(:func:`predicted_speculative_law`: the draft token is the draft's most probable candidate, not a sample, yet it is
accepted with min(1, p/q) as if it had been drawn from q), to say why a row fails, not only that it does.

Beside each row: the acceptance rate llama.cpp reports (``n_accept / n_drafted`` summed over runs; note that
``llama-speculative`` counts draft *steps* in ``n_drafted``) and our rejection sampler's acceptance on the same pair
and settings (:func:`specrepro.core.blocklm.chain_generate`, same γ). Controls in the same table: our own
speculative sampler through the same llama.cpp logits (must pass) and an always-accept negative control (must fail:
it shows the test's power at the n used).

Tokenization: the tiny vocabulary has no "▁" piece nor byte pieces, so llama.cpp's SentencePiece tokenizer would
need a byte fallback for the space it prepends; every program runs with ``--override-kv
tokenizer.ggml.add_space_prefix=bool:false`` (it changes tokenization only, not the logits).

What it is not: a speed benchmark, or an audit of llama-server (not built here; its speculative path,
tools/server/server-context.cpp, calls the same ``common_sampler_sample_and_accept_n`` as
``llama-speculative-simple``).
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from specrepro.core.sampling import SamplingConfig

__all__ = ["LEVEL", "POWER", "LENGTH", "GAMMA", "PROMPT_TEXT", "PROMPT_IDS", "LSetting", "LSETTINGS", "Program",
           "PROGRAMS_AUDITED", "text_to_ids", "outcome", "llamacpp_probs", "exact_law", "run_program",
           "audit_llamacpp_table", "reproduction_script", "COLUMNS"]

LEVEL = 1e-3
POWER = 0.9
LENGTH = 3  # tokens per sample
GAMMA = 2  # --draft-max / our gamma
PROMPT_TEXT = "bfnc"
PROMPT_IDS = (5, 9, 17, 6)
EOS = 2
TARGET_SEED = 1
N_FULL, N_QUICK = 2000, 200
POWER_TRIALS_FULL, POWER_TRIALS_QUICK = 500, 100
N_OURS_ACCEPT = 400  # runs of our sampler for its acceptance rate
KV_OVERRIDE = "tokenizer.ggml.add_space_prefix=bool:false"


@dataclass(frozen=True)
class LSetting:
    """A sampling setting as llama.cpp's flags (--temp, --top-k (0: off), --top-p (1: off); --min-p always 0)."""

    name: str
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def flags(self) -> list[str]:
        return ["--temp", f"{self.temperature:g}", "--top-k", str(int(self.top_k)), "--top-p", f"{self.top_p:g}",
                "--min-p", "0"]

    @property
    def config(self) -> SamplingConfig:
        return SamplingConfig(float(self.temperature), top_k=int(self.top_k) or None, top_p=float(self.top_p))


LSETTINGS = {s.name: s for s in [LSetting("T=1"), LSetting("top-k=5", top_k=5), LSetting("top-p=0.8", top_p=0.8)]}
QUICK_SETTINGS = ("T=1",)


@dataclass(frozen=True)
class Program:
    """One audited configuration of a llama.cpp program: ``binary`` is a :data:`PROGRAMS` target name,
    ``n_parallel`` its -np (draft branches of llama-speculative)."""

    name: str
    binary: str
    n_parallel: int = 1
    description: str = ""

    def flags(self) -> list[str]:
        out = ["--spec-draft-n-max", str(GAMMA), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]
        if self.binary == "llama-speculative":
            out += ["-np", str(self.n_parallel)]
        else:  # the speculator must be named (no default type): the draft model
            out += ["--spec-type", "draft-simple"]
        return out


PROGRAMS_AUDITED = {p.name: p for p in [
    Program("llama-speculative-simple", "llama-speculative-simple",
            description="draft model + target sampling; a draft token is kept when it equals the target's sample "
                        f"(common_sampler_sample_and_accept_n), --spec-draft-n-max {GAMMA}"),
    Program("llama-speculative", "llama-speculative", 1,
            description="stochastic verification min(1, p/q) + residual, one draft chain (-np 1), "
                        f"--spec-draft-n-max {GAMMA}"),
]}


# ----------------------------------------------------------------------------------------------------------------
# Printed text <-> token ids
# ----------------------------------------------------------------------------------------------------------------

def _check_prefix_free(pieces: dict[int, str]) -> None:
    items = sorted((s, i) for i, s in pieces.items())
    for (a, ia), (b, ib) in zip(items, items[1:]):
        if a == "" or b.startswith(a):
            raise ValueError(f"the pieces of tokens {ia} ({a!r}) and {ib} ({b!r}) are not prefix-free: printed text "
                             "could not be mapped back to ids exactly")


def text_to_ids(text: str, pieces: dict[int, str]) -> list[int]:
    """The token ids whose pieces, concatenated, are ``text``.

    Args:
        text: printed text.
        pieces: {token id: its printed piece}; must be a prefix-free code (no piece is empty or a prefix of
            another), which makes the answer unique; pieces of tokens that are never printed may be left out.

    Raises:
        ValueError: the pieces are not prefix-free, or ``text`` is not a concatenation of them.
    """
    _check_prefix_free(pieces)
    by_first: dict[str, list[tuple[str, int]]] = {}
    for i, s in pieces.items():
        by_first.setdefault(s[0], []).append((s, i))
    out, pos = [], 0
    while pos < len(text):
        for s, i in by_first.get(text[pos], ()):
            if text.startswith(s, pos):
                out.append(i)
                pos += len(s)
                break
        else:
            raise ValueError(f"no token piece matches the printed text at offset {pos}: {text[pos:pos + 20]!r}")
    return out


def outcome(ids, length: int = LENGTH, eos: int = EOS) -> tuple:
    """The outcome of a run whose generated ids are ``ids``: its first ``length`` tokens, cut after the first EOS
    (EOS absorbs). A run that printed fewer than ``length`` tokens and no EOS stopped at an EOS it did not print
    (llama-speculative-simple prints no end-of-generation token): EOS is appended."""
    ids = [int(t) for t in ids]
    if eos in ids[:length]:
        return tuple(ids[:ids.index(eos) + 1])
    if len(ids) < length:
        return tuple(ids) + (eos,)
    return tuple(ids[:length])


# ----------------------------------------------------------------------------------------------------------------
# The exact law
# ----------------------------------------------------------------------------------------------------------------

def llamacpp_probs(logits, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                   min_p: float = 0.0) -> np.ndarray:
    """The distribution llama.cpp's common sampler chain draws from (float64): top-k (k <= 0: off), then top-p
    (the smallest prefix of the tokens sorted by probability whose cumulative probability is >= top_p; 1: off), then
    min-p (tokens with p < min_p · max p dropped; 0: off), then temperature, then softmax (the ``dist`` sampler).
    Ties at a cut are broken by sort order (lower id first, as a stable sort would; the tiny models have none).

    Raises:
        ValueError: temperature <= 0 (greedy is not a distribution), top_p outside (0, 1].
    """
    x = np.asarray(logits, dtype=np.float64).copy()
    if not temperature > 0:
        raise ValueError("temperature must be > 0")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must lie in (0, 1], got {top_p}")
    keep = np.ones(len(x), dtype=bool)
    order = np.argsort(-x, kind="stable")
    if top_k and top_k > 0:
        keep[:] = False
        keep[order[:min(int(top_k), len(x))]] = True

    def softmax(mask):
        z = np.where(mask, x, -np.inf)
        e = np.exp(z - z[mask].max())
        return e / e.sum()

    if top_p < 1.0:
        p = softmax(keep)
        kept = [i for i in order if keep[i]]
        cum, last = 0.0, len(kept)
        for j, i in enumerate(kept):
            cum += p[i]
            if cum >= top_p:
                last = j + 1
                break
        keep[:] = False
        keep[kept[:last]] = True
    if min_p > 0:
        p = softmax(keep)
        keep &= p >= min_p * p[keep].max()
    x = x / float(temperature)
    return softmax(keep)


def _next_logits(lm, prompt, memo: dict):
    """Next-token logits (float64 [V]) of ``lm`` after prompt + prefix, memoized, on a cache cut back to the
    longest shared prefix (one llama.cpp block per new suffix)."""

    def fn(prefix: tuple):
        if prefix not in memo:
            seq = list(prompt) + list(prefix)
            keep = 0
            while keep < min(len(lm.tokens), len(seq) - 1) and lm.tokens[keep] == seq[keep]:
                keep += 1
            lm.truncate(keep)
            memo[prefix] = lm.forward_block(seq[keep:], logits_to_keep=1)[-1].double().numpy()
        return memo[prefix]

    return fn


def exact_law(lm, setting: LSetting, length: int = LENGTH, prompt=PROMPT_IDS, eos: int = EOS) -> dict:
    """The target's exact law of :func:`outcome` at ``setting``: autoregressive sampling from
    :func:`llamacpp_probs` of ``lm``'s llama.cpp logits (``lm``: a LlamaCppLM), EOS absorbing."""
    logits = _next_logits(lm, prompt, {})
    out: dict = {}

    def rec(seq, prob):
        if len(seq) == length or (seq and seq[-1] == eos):
            out[seq] = out.get(seq, 0.0) + prob
            return
        p = llamacpp_probs(logits(seq), setting.temperature, setting.top_k, setting.top_p)
        for x in np.nonzero(p)[0].tolist():
            rec(seq + (x,), prob * float(p[x]))

    rec((), 1.0)
    return out


def _candidates(logits, setting: LSetting) -> list[tuple[int, float]]:
    """llama.cpp's candidate array after the sampler chain: (id, p) of the kept tokens."""
    p = llamacpp_probs(logits, setting.temperature, setting.top_k, setting.top_p)
    return [(int(i), float(p[i])) for i in np.nonzero(p)[0]]


def _one_step_law(p_logits, q_logits, setting: LSetting) -> dict[int, float]:
    """The law of one token of llama-speculative (-np 1) at a drafted position, as its code reads: the draft token
    is the draft's MOST probable candidate x* (``cur_p->data[0]`` after sorting; not a sample), accepted when
    r <= p(x*)/q(x*) (r uniform in [0, 1); p(x*) = 0 when x* is not among the target's candidates), else a token
    is drawn from the "residual": both candidate arrays sorted by id and subtracted index by index,
    max(0, p[i] - q[i]), normalised (the i-th target candidate pairs with the i-th draft candidate, the same token
    only when both arrays hold the same ids)."""
    tgt, dft = _candidates(p_logits, setting), _candidates(q_logits, setting)
    x_star, q_star = max(dft, key=lambda t: t[1])
    p_star = dict(tgt).get(x_star, 0.0)
    a = min(1.0, p_star / q_star)
    law = {x_star: a}
    if a < 1.0:
        res = [(i, max(0.0, pt - dft[j][1]) if j < len(dft) else pt) for j, (i, pt) in enumerate(tgt)]
        total = sum(v for _, v in res)
        for i, v in res:
            law[i] = law.get(i, 0.0) + (1.0 - a) * v / total
    return law


def predicted_speculative_law(target_lm, draft_lm, setting: LSetting, length: int = LENGTH, prompt=PROMPT_IDS,
                              eos: int = EOS) -> dict:
    """What llama-speculative with one draft chain (-np 1) samples, derived from its code (not run): the first
    token from the target (no draft exists yet), every later one by :func:`_one_step_law` at its prefix (a draft
    chain of argmax tokens is verified position by position; after a rejection the next step drafts afresh from
    the same kind of argmax chain, so each position sees the same one-step law). EOS absorbs. Used to explain a
    failing row: the observed law should fit this one."""
    p_fn, q_fn = _next_logits(target_lm, prompt, {}), _next_logits(draft_lm, prompt, {})
    out: dict = {}

    def rec(seq, prob):
        if len(seq) == length or (seq and seq[-1] == eos):
            out[seq] = out.get(seq, 0.0) + prob
            return
        if not seq:
            p = llamacpp_probs(p_fn(seq), setting.temperature, setting.top_k, setting.top_p)
            law = {int(i): float(p[i]) for i in np.nonzero(p)[0]}
        else:
            law = _one_step_law(p_fn(seq), q_fn(seq), setting)
        for x, px in law.items():
            if px > 0:
                rec(seq + (x,), prob * px)

    rec((), 1.0)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Running the programs
# ----------------------------------------------------------------------------------------------------------------

_STAT = re.compile(r"\b(n_drafted|n_accept|n_predict)\s*=\s*(\d+)")


def _env() -> dict:
    from specrepro.sim.llamacpp_build import exit_wait_library

    env = dict(os.environ)
    env.update(OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="1")
    lib = exit_wait_library()
    if lib is not None:
        env["LD_PRELOAD"] = str(lib)
    return env


def program_command(binary: Path, program: Program, setting: LSetting, target: Path, draft: Path, seed: int,
                    length: int = LENGTH) -> list[str]:
    """The command line of one run (one thread; the build is CPU-only, so no -ngl is needed)."""
    return [str(binary), "-m", str(target), "-md", str(draft), "-p", PROMPT_TEXT, "-n", str(length),
            "--seed", str(int(seed)), *setting.flags(), *program.flags(), "-c", "256",
            "-t", "1", "-tb", "1", "-td", "1", "-tbd", "1", "--override-kv", KV_OVERRIDE]


def parse_run(stdout: str, stderr: str, pieces: dict[int, str], prompt_text: str = PROMPT_TEXT,
              eos_printed: bool = True):
    """(generated ids, n_drafted, n_accept) of one complete run from its output.

    stdout is "\\n\\n" + the prompt's pieces + the generated pieces + "\\n\\n" + "\\n\\n" (the programs' LOG
    lines; every other line goes to stderr, with the counters n_predict, n_drafted, n_accept). n_predict generated
    tokens are printed (``eos_printed``: llama-speculative prints an EOS as "</s>"; llama-speculative-simple stops
    printing at an EOS, while n_predict still counts the tokens verified with it), so the first n_predict pieces
    are the generated ones and both "\\n\\n" frames must follow (llama.cpp's logger may lose the tail of the
    output, the last frame included: such a run is refused here and repeated by :func:`run_program`).

    Raises:
        ValueError: output that is cut (no counters in stderr, fewer pieces than n_predict where EOS is printed,
            or a tail that is not the frame) or not made of the vocabulary's pieces.
    """
    head = "\n\n" + prompt_text
    stats = {k: int(v) for k, v in _STAT.findall(stderr)}
    if not stdout.startswith(head) or not {"n_predict", "n_drafted", "n_accept"} <= set(stats):
        raise ValueError(f"cut or unexpected output of a llama.cpp program: {stdout[:60]!r}, counters {stats}")
    n_pred = stats["n_predict"]
    body = stdout[len(head):]
    if body.endswith("\n\n\n\n"):
        ids = text_to_ids(body[:-4], pieces)
        # every generated token printed; or fewer, after an EOS that llama-speculative-simple does not print
        if len(ids) == n_pred or (len(ids) < n_pred and not eos_printed):
            return ids, stats["n_drafted"], stats["n_accept"]
    raise ValueError(f"{n_pred} tokens generated but the printed text is {body!r}")


def run_program(binary: Path, program: Program, setting: LSetting, target: Path, draft: Path, seed: int,
                pieces: dict[int, str], length: int = LENGTH, timeout: float = 120.0, attempts: int = 40):
    """One run: (outcome, n_drafted, n_accept).

    llama.cpp's logger (common/log.cpp) writes from its own thread and is deliberately never flushed at exit
    ("this design may cause logs to be lost"): on a loaded machine many runs (half, with two at a time on two busy
    cores) exit with status 0 and a cut stdout and stderr. The programs run with
    :func:`specrepro.sim.llamacpp_build.exit_wait_library` preloaded (an exit handler that waits 30 ms; 100 of 100
    runs complete with it), and a run still cut is repeated with the same seed (up to ``attempts`` times): one
    thread and a fixed seed make a run deterministic (checked: repeated seeds print the same text, up to the cut),
    so the repeat yields the sample the lost run drew and the retries cannot bias the law. A run that printed fewer tokens than n_predict
    (llama-speculative-simple after an EOS, which it does not print; rare) is accepted only when two runs of its
    seed print the same text (a run cut just before its last frame, after two generated newlines, would look the
    same once: the residual risk is two identical such cuts of a run that generated two newlines).

    Raises:
        RuntimeError: the program failed (its exit status and the end of its stderr), or printed no complete
            output in ``attempts`` tries.
    """
    cmd = program_command(binary, program, setting, target, draft, seed, length)
    eos_printed = program.binary != "llama-speculative-simple"
    err, seen_short = None, None
    for _ in range(attempts):
        res = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=timeout, errors="replace")
        if res.returncode != 0:
            raise RuntimeError(f"{program.binary} exited {res.returncode}: {' '.join(cmd)}\n{res.stderr[-2000:]}")
        try:
            ids, drafted, accepted = parse_run(res.stdout, res.stderr, pieces, eos_printed=eos_printed)
        except ValueError as e:
            err = e
            continue
        n_pred = {k: int(v) for k, v in _STAT.findall(res.stderr)}["n_predict"]
        if len(ids) < n_pred and res.stdout != seen_short:  # the EOS case: wait for a second identical run
            seen_short = res.stdout
            continue
        return outcome(ids, length), drafted, accepted
    raise RuntimeError(f"{program.binary} gave no complete output in {attempts} runs of: {' '.join(cmd)} ({err})")


def run_seeds(n: int, seed: int = 0) -> list[int]:
    """n distinct --seed values spread over [1, 2^31 - 2] (numpy's generator seeded with ``seed``).

    Not 0, 1, 2, ...: llama-speculative draws its acceptance uniforms and its residual samples from
    ``std::default_random_engine`` (minstd_rand0 in libstdc++), whose first output is 16807 · seed mod (2^31 - 1):
    consecutive small seeds give nearly equal first draws, hence strongly dependent runs (seeds 0..3 printed the
    same three tokens). Spread seeds make the runs' draws independent for the purpose of the test."""
    rng = np.random.default_rng(seed + 20_250_707)
    out: list[int] = []
    seen: set[int] = set()
    while len(out) < n:
        for v in rng.integers(1, 2**31 - 1, size=n).tolist():
            if v not in seen and len(out) < n:
                seen.add(v)
                out.append(int(v))
    return out


def run_many(binary, program, setting, target, draft, seeds, pieces, workers: int = 2, length: int = LENGTH):
    """Runs with the given seeds, ``workers`` processes at a time (one thread each): (outcomes, drafted, accepted)."""
    fn = functools.partial(run_program, binary, program, setting, target, draft, pieces=pieces, length=length)
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as ex:
        res = list(ex.map(fn, seeds))
    return [r[0] for r in res], sum(r[1] for r in res), sum(r[2] for r in res)


def tiny_pair(directory=None):
    """The audit's GGUF files: the target (tiny llama, seed 1, two layers) and its early-exit draft (its first
    layer under its head)."""
    from specrepro.backends.tinygguf import TinyShape, tiny_llama_gguf

    return tiny_llama_gguf(TARGET_SEED, TinyShape(), directory), tiny_llama_gguf(TARGET_SEED, TinyShape(n_layer=1),
                                                                                 directory)


def vocabulary_pieces(lm) -> dict[int, str]:
    """{id: printed piece} of every token llama.cpp prints (its detokenizer, special tokens as text)."""
    return {i: lm.detokenize([i]) for i in range(lm.vocab_size)}


# ----------------------------------------------------------------------------------------------------------------
# Our sampler on the same pair (acceptance, and the controls)
# ----------------------------------------------------------------------------------------------------------------

def _ours(target_lm, draft_lm, setting: LSetting, n: int, seed: int, verification="token"):
    from specrepro.core.blocklm import chain_generate

    g = torch.Generator().manual_seed(seed)
    seqs, drafted, accepted = [], 0, 0
    for _ in range(n):
        r = chain_generate(target_lm, list(PROMPT_IDS), draft=draft_lm, gamma=GAMMA, max_new_tokens=LENGTH,
                           sampling=setting.config, generator=g, eos_token_id=EOS, verification=verification)
        seqs.append(outcome(r.tokens))
        drafted += sum(r.drafted)
        accepted += sum(r.accepted)
    return seqs, drafted, accepted


def _always_accept(*args, **kwargs):
    from specrepro.core.sampling import verify_chain

    return verify_chain(*args, accept_fn=lambda p, q: torch.ones_like(p), **kwargs)


# ----------------------------------------------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------------------------------------------

COLUMNS = ["setting", "implementation", "temperature", "top_k", "top_p", "n", "tv", "p_value", "g_test_p",
           "min_detectable_tv_90", "verdict", "llamacpp_accept_rate", "specrepro_accept_rate", "llama_cpp_python"]
EXTRA_COLUMNS = ["role", "expected", "as_expected", "level", "prompt", "length", "gamma", "n_parallel",
                 "tv_null_mean", "code_law_tv_to_exact", "p_value_vs_code_law", "seconds", "description"]


def _g_test(samples, exact: dict) -> float:
    """The G-test (scipy.stats.power_divergence, log-likelihood ratio) on the same pooled bins as gof_test, with
    its asymptotic chi-square p-value (0 when a sample lies outside the exact law's support)."""
    from scipy.stats import power_divergence

    from specrepro.stats import pooled_groups

    n = len(samples)
    counts: dict = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    if any(exact.get(k, 0.0) <= 0 for k in counts):
        return 0.0
    keys = list(exact)
    probs = np.array([exact[k] for k in keys])
    obs = np.array([counts.get(k, 0) for k in keys], dtype=float)
    groups = pooled_groups(probs, n)
    if len(groups) < 2:
        return 1.0
    f_obs = np.array([obs[g].sum() for g in groups])
    f_exp = np.array([probs[g].sum() for g in groups]) * n
    f_exp *= n / f_exp.sum()
    return float(power_divergence(f_obs, f_exp, lambda_="log-likelihood").pvalue)


def _tv_null_mean(exact: dict, n: int, seed: int, trials: int = 300) -> float:
    p = np.array(list(exact.values()))
    p = p / p.sum()
    counts = np.random.default_rng(seed + 99).multinomial(n, p, size=trials)
    return float(np.mean(0.5 * np.abs(counts / n - p).sum(axis=1)))


def audit_llamacpp_table(quick: bool = False, seed: int = 0, *, n: int | None = None, settings=None,
                         programs=None, progress: bool = False, workers: int = 2, root=None):
    """Run every (setting, program) of the llama.cpp audit, with the controls, and return the table.

    Args:
        quick: N_QUICK runs and the T=1 setting only; full: N_FULL runs per row, every setting.
        seed: the runs' --seed values are :func:`run_seeds` (n, seed) (distinct, spread); our sampler's generator
            is seeded with ``seed``.
        n: runs per row (overrides quick/full).
        settings, programs: restrict to these names.
        workers: processes at a time (each with one thread).
        root: the llama.cpp build folder (default :func:`specrepro.sim.llamacpp_build.default_root`).

    Returns:
        pandas.DataFrame with :data:`COLUMNS` + :data:`EXTRA_COLUMNS`.

    Raises:
        FileNotFoundError: the programs are not built (build them with
            :func:`specrepro.sim.llamacpp_build.build_speculative_programs`).
    """
    import pandas as pd

    from specrepro.backends.llamacpp import LlamaCppLM
    from specrepro.sim.llamacpp_build import LLAMA_CPP_PYTHON_VERSION, speculative_programs
    from specrepro.stats import empirical_distribution, gof_test, min_detectable_tv, total_variation

    bins = speculative_programs(root)
    if bins is None:
        raise FileNotFoundError("llama.cpp's speculative programs are not built: run `python -m "
                                "specrepro.sim.llamacpp_build` (cmake and a C++ compiler; minutes)")
    n_runs = int(n) if n is not None else (N_QUICK if quick else N_FULL)
    trials = POWER_TRIALS_QUICK if quick else POWER_TRIALS_FULL
    names = settings or (QUICK_SETTINGS if quick else tuple(LSETTINGS))
    progs = [PROGRAMS_AUDITED[p] for p in (programs or PROGRAMS_AUDITED)]
    target_path, draft_path = tiny_pair()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    target_lm, draft_lm = LlamaCppLM(target_path, n_threads=1), LlamaCppLM(draft_path, n_threads=1)
    pieces = {i: s for i, s in vocabulary_pieces(target_lm).items() if s}
    t_all = time.perf_counter()
    rows = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for sname in names:
            setting = LSETTINGS[sname]
            exact = exact_law(target_lm, setting)
            mdt = min_detectable_tv(exact, n_runs, LEVEL, POWER, trials, seed)
            tv_null = _tv_null_mean(exact, n_runs, seed)
            t0 = time.perf_counter()
            ours, o_d, o_a = _ours(target_lm, draft_lm, setting, max(n_runs, N_OURS_ACCEPT), seed)
            ours_rate = o_a / o_d if o_d else float("nan")
            ours = ours[:n_runs]
            cases = [("specrepro_chain", "control", ours, float("nan"), time.perf_counter() - t0, 1,
                      f"specrepro chain_generate (Leviathan Alg. 1) through LlamaCppLM, gamma={GAMMA}")]
            t0 = time.perf_counter()
            neg, _, _ = _ours(target_lm, draft_lm, setting, n_runs, seed, verification=_always_accept)
            cases.append(("neg_always_accept", "negative control", neg, float("nan"), time.perf_counter() - t0, 1,
                          "every draft token accepted (verify_chain with acceptance 1), same pair and gamma"))
            for prog in progs:
                t0 = time.perf_counter()
                seeds = run_seeds(n_runs, seed)
                seqs, d, a = run_many(bins[prog.binary], prog, setting, target_path, draft_path, seeds, pieces,
                                      workers=workers)
                cases.append((prog.name, "audited", seqs, a / d if d else float("nan"), time.perf_counter() - t0,
                              prog.n_parallel, prog.description))
            code_law = predicted_speculative_law(target_lm, draft_lm, setting)
            for name, role, seqs, lrate, secs, npar, desc in cases:
                _, pv = gof_test(seqs, exact)
                by_code = name == "llama-speculative"  # -np 1: the law its code implies (predicted_speculative_law)
                verdict = "fail" if pv < LEVEL else "pass"
                expected = "fail" if role == "negative control" else "pass"
                row = {"setting": sname, "implementation": name, "temperature": setting.temperature,
                       "top_k": setting.top_k, "top_p": setting.top_p, "n": len(seqs),
                       "tv": total_variation(empirical_distribution(seqs), exact), "p_value": pv,
                       "g_test_p": _g_test(seqs, exact), "min_detectable_tv_90": mdt, "verdict": verdict,
                       "llamacpp_accept_rate": lrate, "specrepro_accept_rate": ours_rate,
                       "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION, "role": role, "expected": expected,
                       "as_expected": verdict == expected, "level": LEVEL, "prompt": PROMPT_TEXT,
                       "length": LENGTH, "gamma": GAMMA, "n_parallel": npar, "tv_null_mean": tv_null,
                       "code_law_tv_to_exact": total_variation(code_law, exact) if by_code else float("nan"),
                       "p_value_vs_code_law": gof_test(seqs, code_law)[1] if by_code else float("nan"),
                       "seconds": secs, "description": desc}
                rows.append(row)
                if progress:
                    print(f"[audit llama.cpp] {sname:9s} {name:26s} n={len(seqs):5d} tv={row['tv']:.4f} "
                          f"p={pv:.3g} -> {verdict} ({secs:.1f} s)", file=sys.stderr, flush=True)
    finally:
        torch.set_num_threads(threads)
        target_lm.close()
        draft_lm.close()
    df = pd.DataFrame(rows, columns=COLUMNS + EXTRA_COLUMNS)
    df.attrs.update(level=LEVEL, power=POWER, prompt=PROMPT_TEXT, length=LENGTH, gamma=GAMMA, seed=seed,
                    quick=quick, seconds=time.perf_counter() - t_all)
    return df


# ----------------------------------------------------------------------------------------------------------------
# Standalone reproduction
# ----------------------------------------------------------------------------------------------------------------

_REPRO = '''\"\"\"Standalone reproduction: is llama.cpp's {program} exact at {setting_doc}?

Generated by specrepro's llama.cpp audit (llama-cpp-python {version}'s vendored llama.cpp). Needs numpy, scipy and
llama-cpp-python (for the target's exact next-token probabilities), the built program and the two tiny GGUF files
below (written by specrepro.backends.tinygguf: a random 2-layer llama, vocabulary 32, and its first layer as the
draft). Usage: python {{this file}} [N] [first seed]

It runs the program N times from the prompt "{prompt}" (one process per run, N distinct seeds drawn with SEED),
reads the first two generated tokens from the printed text (every piece of the tiny vocabulary is one character or
a <...> special token: a prefix-free code), and compares their joint frequencies with the target's exact law
(llama.cpp's own logits through its sampler chain: top-k, then top-p, then softmax; an EOS first token ends the
sequence) by a chi-square test (outcomes with expected count >= 5 get a bin each, the rest are pooled).
\"\"\"
import collections
import os
import subprocess
import sys

import numpy as np
from scipy.stats import chisquare

BINARY = {binary!r}
TARGET = {target!r}
DRAFT = {draft!r}
EXIT_WAIT = {exit_wait!r}
ARGS = {args!r}
PROMPT = {prompt!r}
TOP_K, TOP_P = {top_k!r}, {top_p!r}
EOS = 2
N = int(sys.argv[1]) if len(sys.argv) > 1 else {n}
SEED = int(sys.argv[2]) if len(sys.argv) > 2 else 0
LEVEL = {level!r}


def chain(x):
    \"\"\"llama.cpp's sampler chain at temperature 1: top-k, then top-p, then softmax (float64).\"\"\"
    order = np.argsort(-x, kind="stable")
    keep = np.zeros(len(x), bool)
    keep[order[:TOP_K] if TOP_K > 0 else order] = True
    if TOP_P < 1:
        p = np.exp(x - x.max()) * keep
        p /= p.sum()
        cum, kept = 0.0, []
        for i in order:
            if keep[i]:
                kept.append(i)
                cum += p[i]
                if cum >= TOP_P:
                    break
        keep[:] = False
        keep[kept] = True
    p = np.exp(x - x.max()) * keep
    return p / p.sum()


import llama_cpp  # noqa: E402


def load_cpu_backend():
    """An all-variants llama.cpp build (GGML_BACKEND_DL) loads its best CPU variant itself only in its own programs:
    load it here, leaving out the AMX variant where the kernel does not grant AMX (its kernels would die with SIGILL)."""
    import ctypes
    import platform
    import tempfile
    lib = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    found = [f for f in os.listdir(lib) if f.startswith("libggml-cpu-") and f.endswith(".so")]
    if not found:
        return
    search = lib
    if platform.machine() == "x86_64" and ctypes.CDLL(None).syscall(158, 0x1023, 18) != 0:  # arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) refused
        search = tempfile.mkdtemp()
        for f in found:
            if f != "libggml-cpu-sapphirerapids.so":
                os.symlink(os.path.join(lib, f), os.path.join(search, f))
    # libggml.so.0, the soname libllama linked: the wheel's other copies (libggml.so) would be registries of their own
    ctypes.CDLL(os.path.join(lib, "libggml.so.0")).ggml_backend_load_all_from_path(search.encode())


load_cpu_backend()
llm = llama_cpp.Llama(TARGET, n_ctx=256, n_threads=1, logits_all=True, verbose=False,
                      kv_overrides={{"tokenizer.ggml.add_space_prefix": False}})
V = llm.n_vocab()
pieces = {{i: llm.detokenize([i], special=True).decode() for i in range(V)}}
prompt_ids = llm.tokenize(PROMPT.encode(), add_bos=False, special=True)


def logits(seq):
    llm.reset()
    llm.eval(list(seq))
    return np.array(llm.scores[len(seq) - 1], dtype=np.float64)


exact = {{}}
p1 = chain(logits(prompt_ids))
for a in np.nonzero(p1)[0]:
    if a == EOS:
        exact[(EOS,)] = p1[a]
        continue
    p2 = chain(logits(prompt_ids + [int(a)]))
    for b in np.nonzero(p2)[0]:
        exact[(int(a), int(b))] = p1[a] * p2[b]


def read(text):
    ids, pos = [], 0
    while pos < len(text) and len(ids) < 2:
        i = next(i for i, s in pieces.items() if s and text.startswith(s, pos))
        ids.append(i)
        pos += len(pieces[i])
        if i == EOS:
            break
    if len(ids) < 2 and (not ids or ids[-1] != EOS):
        ids.append(EOS)  # stopped at an EOS it did not print
    return tuple(ids[:ids.index(EOS) + 1]) if EOS in ids else tuple(ids)


# llama.cpp's logger thread is never flushed at exit, so a loaded machine often cuts a run's output: preload an exit
# handler that waits 30 ms (built by specrepro beside the programs; optional) and repeat a cut run with its seed
# (deterministic: one thread, fixed seed)
env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="1")
if os.path.isfile(EXIT_WAIT):
    env["LD_PRELOAD"] = EXIT_WAIT
head = "\\n\\n" + PROMPT
# spread seeds: llama-speculative's std::default_random_engine (minstd_rand0) makes runs with seeds 0, 1, 2, ...
# nearly identical
seeds = np.random.default_rng(SEED).choice(2**31 - 2, size=N, replace=False) + 1
samples = []
for s in seeds:
    for attempt in range(40):
        r = subprocess.run([BINARY, "-m", TARGET, "-md", DRAFT, "-p", PROMPT, "--seed", str(s), *ARGS],
                           capture_output=True, text=True, env=env, check=True)
        n_pred = [int(line.split("=")[1]) for line in r.stderr.splitlines() if "n_predict =" in line]
        if r.stdout.startswith(head) and r.stdout.endswith("\\n\\n\\n\\n") and n_pred:
            break
    else:
        sys.exit(f"no complete output for seed {{s}}")
    samples.append(read(r.stdout[len(head):-4]))
counts = collections.Counter(samples)
keys = sorted(exact, key=lambda k: -exact[k])
probs = np.array([exact[k] for k in keys])
outside = sum(c for k, c in counts.items() if exact.get(k, 0) <= 0)
big = [[i] for i in range(len(keys)) if probs[i] * N >= 5]
rest = [i for i in range(len(keys)) if probs[i] * N < 5]
while rest and probs[rest].sum() * N < 5 and big:
    rest = big.pop() + rest
groups = big + ([rest] if rest else [])
f_obs = np.array([sum(counts.get(keys[i], 0) for i in g) for g in groups], float)
f_exp = np.array([probs[g].sum() for g in groups]) * N
pv = 0.0 if outside else chisquare(f_obs, f_exp * f_obs.sum() / f_exp.sum()).pvalue
tv = 0.5 * sum(abs(counts.get(k, 0) / N - exact.get(k, 0.0)) for k in set(exact) | set(counts))
print(f"{{N}} runs of {{os.path.basename(BINARY)}} {{' '.join(ARGS)}}")
print(f"first two tokens: TV(empirical, exact) = {{tv:.4f}}, chi-square p = {{pv:.3g}} ({{outside}} samples outside "
      f"the target's support) -> {{'FAIL' if pv < LEVEL else 'pass'}} at level {{LEVEL:g}}")
worst = sorted(set(exact) | set(counts), key=lambda k: -abs(counts.get(k, 0) / N - exact.get(k, 0.0)))[:8]
for k in worst:
    print(f"  {{k}} {{''.join(pieces[i] for i in k)!r:8}} observed {{counts.get(k, 0) / N:.4f}} "
          f"exact {{exact.get(k, 0.0):.4f}}")
sys.exit(1 if pv < LEVEL else 0)
'''


def reproduction_script(setting: str, program: str, n: int = 1000, root=None) -> str:
    """A standalone script reproducing one audited row on the joint law of the first two tokens (numpy, scipy,
    llama-cpp-python, the built program and the tiny GGUF files; exit status 1 when that law is rejected). Two
    tokens: llama-speculative samples its first token from the target directly (no draft yet); drafts are verified
    from the second token on."""
    from specrepro.sim.llamacpp_build import LLAMA_CPP_PYTHON_VERSION, default_root

    s, prog = LSETTINGS[setting], PROGRAMS_AUDITED[program]
    target, draft = tiny_pair()
    binary = Path(root if root is not None else default_root()) / "cmake-build" / "bin" / prog.binary
    full = program_command(binary, prog, s, target, draft, 0)
    # everything after "-p PROMPT -n L --seed S" but the seed, kept as the program's arguments
    args = full[full.index("-n"):full.index("--seed")] + full[full.index("--seed") + 2:]
    return _REPRO.format(program=prog.binary + (f" (-np {prog.n_parallel})" if prog.binary == "llama-speculative"
                                                else ""),
                         setting_doc=f"temp {s.temperature:g}, top-k {s.top_k}, top-p {s.top_p:g}",
                         version=LLAMA_CPP_PYTHON_VERSION, prompt=PROMPT_TEXT, binary=str(binary),
                         target=str(target), draft=str(draft), args=args,
                         exit_wait=str(Path(root if root is not None else default_root()) / "specrepro-exit-wait.so"),
                         top_k=int(s.top_k), top_p=float(s.top_p),
                         n=int(n), level=LEVEL)
