"""The exactness battery as an audit: transformers' own speculative samplers, run as black boxes.

What this file is: the goodness-of-fit battery of specrepro (chi-square with pooled bins and a simulated null,
:func:`gof_test`; its power, :func:`min_detectable_tv`) applied to the INSTALLED transformers'

* assisted generation with a draft model: ``target.generate(assistant_model=draft, do_sample=True, ...)`` (the
  assistant's ``num_assistant_tokens`` fixed at :data:`GAMMA`, schedule "constant", confidence threshold 0, so every
  step drafts min(GAMMA, tokens left - 1) tokens and verifies them by transformers' ``_speculative_sampling``);
* prompt lookup decoding: ``target.generate(prompt_lookup_num_tokens=GAMMA, do_sample=True, ...)`` (candidates copied
  from the prompt, verified by comparing them with the target's own samples),

on a tiny random target/draft pair (:func:`tiny_random_lm`, vocabulary 8) where the exact distribution of the
:data:`LENGTH` new tokens is enumerated from the target's logits (8^3 = 512 outcomes), in four settings: T = 1, top-k,
top-p and greedy (T = 0, where every output must equal the target's greedy continuation, over many prompts).

Every setting also runs, in the same table:

* controls that must pass: transformers' plain autoregressive sampling (the reference HF claims to reproduce) and
  our own samplers (:func:`specrepro.core.decoding.generate` with a :class:`DraftModelDrafter` and with the
  point-mass drafts of a :class:`PromptLookupDrafter`);
* negative controls that must fail (replayed published bugs from the registry of :mod:`specrepro.sim.controls`,
  injected into our loop): they show the test has power at the n used.

A row's verdict is "fail" when the chi-square p-value is below the battery's level :data:`LEVEL` (greedy: when any
output differs from the target's greedy continuation by more than a float near-tie). n is chosen so that every
sampling test detects a TV deviation of :data:`TARGET_TV` with probability >= :data:`POWER` (the measured
``min_detectable_tv_90`` column says what it actually detects, along a random-tilt direction).

What it is not: a speed benchmark, or a test of transformers with real checkpoints (the tiny models are enough: the
samplers' code paths do not depend on the model's size).

Entry points: :func:`audit_table` and :func:`reproduction_script`; the command ``python -m specrepro audit``
(:mod:`specrepro.record.audit`) writes the table into the record and the reproduction scripts beside it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from unittest import mock

import numpy as np
import torch

from specrepro.core.decoding import generate
from specrepro.core.sampling import SamplingConfig
from specrepro.drafters.lookup import PromptLookupDrafter
from specrepro.drafters.model import DraftModelDrafter
from specrepro.sim.controls import BUGS, draw_sequences
from specrepro.sim.exact import target_distribution
from specrepro.sim.toy import ToyLM, tiny_random_lm
from specrepro.stats import (
    empirical_distribution,
    gof_test,
    min_detectable_tv,
    total_variation,
)

__all__ = [
    "IMPLEMENTATIONS",
    "LEVEL",
    "POWER",
    "SETTINGS",
    "TARGET_TV",
    "Setting",
    "audit_table",
    "exact_distribution",
    "hf_exact_distribution",
    "reproduction_script",
]



# ----------------------------------------------------------------------------------------------------------------
# The experiment
# ----------------------------------------------------------------------------------------------------------------

#: the battery's significance level (every GofCase of the battery and every registry control uses 1e-3)
LEVEL = 1e-3
#: the power and the TV deviation each sampling test is sized for
POWER, TARGET_TV = 0.9, 0.1
VOCAB, TARGET_SEED, DRAFT_SEED = 8, 1, 2  # the battery's tiny pair: llama seed 1 (target), qwen2 seed 2 (draft)
#: the prompt of the sampling settings: it ends in a bigram seen earlier (1 6 -> 5 7), so prompt lookup proposes at
#: once; among 12 such prompts it gave the most powerful tests (min detectable TV ~0.09 at n = 1000 in all three)
PROMPT = (1, 6, 5, 7, 1, 6)
LENGTH = 3  # new tokens per sampled sequence: 8^3 = 512 outcomes; the first step drafts min(GAMMA, LENGTH - 1) = 2
#: a prompt whose lookup proposal (3, 3) the target often samples (P(first token = 3) ~0.48 at T = 1; best of 400
#: random (a, b, c, d, a, b) prompts by P(proposal); min detectable TV 0.065 at n = 1000 in the top-k setting)
LOOKUP_PROMPT = (3, 5, 3, 3, 3, 5)
GAMMA = 2  # num_assistant_tokens / prompt_lookup_num_tokens / our gamma
EARLY_EXIT_LAYER = 1  # assistant_early_exit: the draft is the target's first layer (of 2) + its final norm and head
GREEDY_LENGTH = 6  # new tokens per greedy run (several verification steps per run)
#: a greedy mismatch whose top-2 logit gap (at the first differing position, teacher-forced) is below this is a
#: float near-tie (batched verification and one-token decoding take different float paths), not a failure
TIE_BOUND = 1e-3
#: n per sampling test (full, quick) and greedy prompts (full, quick)
N_FULL, N_QUICK = 1000, 200
GREEDY_N_FULL, GREEDY_N_QUICK = 60, 6
POWER_TRIALS_FULL, POWER_TRIALS_QUICK = 1000, 200


@dataclass(frozen=True)
class Setting:
    """A sampling setting, as SamplingConfig (ours) and as transformers' generate kwargs (the same order there:
    temperature, then top-k, then top-p, then softmax)."""

    name: str
    temperature: float
    top_k: int | None = None
    top_p: float = 1.0
    prompt: tuple = PROMPT
    only: tuple | None = None  # the implementations that run in this setting (None: all that allow it)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def config(self):
        return SamplingConfig(self.temperature, top_k=self.top_k, top_p=self.top_p)

    def hf_kwargs(self) -> dict:
        if self.greedy:
            return {"do_sample": False}
        return {"do_sample": True, "temperature": float(self.temperature), "top_k": self.top_k or 0,
                "top_p": float(self.top_p)}


SETTINGS = {s.name: s for s in [
    Setting("T=1", 1.0),
    Setting("top-k", 0.8, top_k=4),
    Setting("top-p", 1.2, top_p=0.8),
    Setting("greedy", 0.0),
    # prompt lookup's accept path: on PROMPT the copied tokens are rarely what the target samples (~0.05 accepted per
    # call), so a bug after an acceptance would hide; on LOOKUP_PROMPT the first copied token (3) has probability ~0.5
    Setting("top-k-lookup", 0.8, top_k=4, prompt=LOOKUP_PROMPT,
            only=("hf_prompt_lookup", "hf_autoregressive", "specrepro_prompt_lookup", "neg_ratio_to_target_max")),
]}
QUICK_SETTINGS = ("T=1", "greedy")


@dataclass(frozen=True)
class Implementation:
    """One sampler of the table: ``role`` is 'audited' (transformers, must be exact), 'control' (must pass) or
    'negative control' (must fail); ``run(models, setting, prompt, n, length, seed) -> (sequences, drafted,
    accepted, steps)``; ``settings``: where it runs (None: every setting)."""

    name: str
    role: str
    description: str
    run: Callable
    settings: tuple | None = None
    quick: bool = True

    @property
    def expected(self) -> str:
        return "fail" if self.role == "negative control" else "pass"


# ----------------------------------------------------------------------------------------------------------------
# Models and exact distributions
# ----------------------------------------------------------------------------------------------------------------

def tiny_pair():
    """The battery's tiny target (llama, seed 1) and draft (qwen2, seed 2), vocabulary 8, no EOS; the draft's
    generation config fixes transformers' assisted schedule (GAMMA tokens, constant, no confidence stop)."""
    target = tiny_random_lm("llama", VOCAB, TARGET_SEED)
    draft = tiny_random_lm("qwen2", VOCAB, DRAFT_SEED)
    _fix_assistant(draft)
    return target, draft


def _fix_assistant(draft):
    gc = draft.generation_config
    gc.num_assistant_tokens = GAMMA
    gc.num_assistant_tokens_schedule = "constant"
    gc.assistant_confidence_threshold = 0.0
    gc.eos_token_id = None


def exact_distribution(target, setting: Setting, prompt=None, length: int = LENGTH) -> dict:
    """Exact distribution of ``length`` new tokens, AR from the target processed by OUR logits_to_probs (float64)."""
    prompt = setting.prompt if prompt is None else prompt
    return target_distribution(ToyLM.from_transformer(target, torch.tensor(prompt)), setting.config, length)


def _hf_processors(setting: Setting):
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
)

    procs = LogitsProcessorList()
    if setting.temperature != 1.0:
        procs.append(TemperatureLogitsWarper(setting.temperature))
    if setting.top_k:
        procs.append(TopKLogitsWarper(setting.top_k))
    if setting.top_p < 1.0:
        procs.append(TopPLogitsWarper(setting.top_p))
    return procs


@torch.inference_mode()
def hf_exact_distribution(target, setting: Setting, prompt=None, length: int = LENGTH) -> dict:
    """The same distribution through transformers' OWN warpers (TemperatureLogitsWarper, TopKLogitsWarper,
    TopPLogitsWarper, in generate's order, float32 as generate runs them, then softmax): what HF claims to sample."""
    prompt = setting.prompt if prompt is None else prompt
    procs = _hf_processors(setting)
    out: dict = {}

    def rec(seq, prob):
        if len(seq) == length:
            out[seq] = prob
            return
        ids = torch.tensor([list(prompt) + list(seq)])
        logits = target(input_ids=ids).logits[:, -1].float()
        p = torch.softmax(procs(ids, logits).double(), -1)[0]
        for x in torch.nonzero(p).flatten().tolist():
            rec(seq + (x,), prob * float(p[x]))

    rec((), 1.0)
    return out


@torch.inference_mode()
def greedy_reference(target, prompt, length: int) -> tuple[list[int], list[float]]:
    """The target's greedy continuation (one full forward per position) and its top-2 logit gap per position."""
    seq, gaps = list(prompt), []
    for _ in range(length):
        logits = target(input_ids=torch.tensor([seq])).logits[0, -1].float()
        top = torch.topk(logits, 2)
        gaps.append(float(top.values[0] - top.values[1]))
        seq.append(int(top.indices[0]))
    return seq[len(prompt):], gaps


@torch.inference_mode()
def _gap_at(target, prefix: list[int]) -> float:
    logits = target(input_ids=torch.tensor([prefix])).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def greedy_prompts(n: int, seed: int) -> list[tuple]:
    """n random prompts (a, b, c, d, a, b) over the vocabulary (a repeated bigram: lookup always has a match)."""
    rng = np.random.default_rng(seed + 777)
    out = []
    for _ in range(n):
        a, b, c, d = rng.integers(0, VOCAB, 4).tolist()
        out.append((a, b, c, d, a, b))
    return out


# ----------------------------------------------------------------------------------------------------------------
# Samplers
# ----------------------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _quiet_transformers():
    import transformers

    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(level)


@contextlib.contextmanager
def _count_candidates(stats: dict):
    """Count what transformers' candidate generator proposes (drafted tokens, steps) and keeps (n_matches), by
    wrapping the generator ``_get_candidate_generator`` returns; the sampling itself is untouched."""
    from transformers.generation.utils import GenerationMixin

    orig = GenerationMixin._get_candidate_generator

    def wrapped(self, *a, **k):
        cg = orig(self, *a, **k)
        get, upd = cg.get_candidates, cg.update_candidate_strategy

        def get_candidates(input_ids, **kw):
            cand, logits = get(input_ids, **kw)
            stats["drafted"] += int(cand.shape[1] - input_ids.shape[1])
            stats["steps"] += 1
            return cand, logits

        def update(input_ids, scores, num_matches):
            stats["accepted"] += int(num_matches)
            return upd(input_ids, scores, num_matches)

        cg.get_candidates, cg.update_candidate_strategy = get_candidates, update
        return cg

    with mock.patch.object(GenerationMixin, "_get_candidate_generator", wrapped):
        yield


@contextlib.contextmanager
def _fixed_schedule(model):
    """The assistant schedule of :func:`_fix_assistant` on ``model``'s own generation config, restored after."""
    gc = model.generation_config
    keys = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    saved = {k: getattr(gc, k, None) for k in keys}
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = GAMMA, "constant", 0.0
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(gc, k, v)


_DEFAULT_ASSISTANT: list = []


def _default_assistant():
    """The same draft with transformers' default assisted-generation settings (num_assistant_tokens 20, constant
    schedule, assistant_confidence_threshold 0.4: drafting stops after a token the draft gives probability < 0.4)."""
    if not _DEFAULT_ASSISTANT:
        _DEFAULT_ASSISTANT.append(tiny_random_lm("qwen2", VOCAB, DRAFT_SEED))
    return _DEFAULT_ASSISTANT[0]


def _hf_run(mode: str):
    """transformers' generate, ``mode`` 'ar' | 'assisted' | 'lookup'; randomness: torch's global RNG (all that HF
    uses), seeded once per run inside a forked RNG state so the caller's is untouched."""

    def run(models, setting, prompts, length, seed):
        target, draft = models
        extra = {"ar": {}, "assisted": {"assistant_model": draft}, "lookup": {"prompt_lookup_num_tokens": GAMMA},
                 "assisted_defaults": {"assistant_model": _default_assistant()},
                 "early_exit": {"assistant_early_exit": EARLY_EXIT_LAYER}}[mode]
        stats = {"drafted": 0, "accepted": 0, "steps": 0}
        seqs = []
        ctx = _count_candidates(stats) if mode != "ar" else contextlib.nullcontext()
        # early exit: the target is its own assistant, its generation config holds the assistant's schedule
        own = _fixed_schedule(target) if mode == "early_exit" else contextlib.nullcontext()
        with torch.random.fork_rng(), _quiet_transformers(), ctx, own, torch.inference_mode():
            torch.manual_seed(seed)
            for prompt in prompts:
                ids = torch.tensor([list(prompt)])
                out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=length,
                                      min_new_tokens=length, eos_token_id=None, pad_token_id=0,
                                      **setting.hf_kwargs(), **extra)
                seqs.append(tuple(out[0, ids.shape[1]:].tolist()))
        return seqs, stats["drafted"], stats["accepted"], stats["steps"]

    return run


def _ours_run(kind: str):
    def run(models, setting, prompts, length, seed):
        from specrepro.sim.memo import MemoizedLM

        target, draft = (MemoizedLM(m) for m in models)  # forward passes replayed bit for bit: the same samples
        drafter = DraftModelDrafter(draft, VOCAB) if kind == "draft" else PromptLookupDrafter(max_ngram=2, min_ngram=1)
        g = torch.Generator().manual_seed(seed)
        seqs, drafted, accepted, steps = [], 0, 0, 0
        for prompt in prompts:
            res = generate(target, torch.tensor(prompt), drafter=drafter, gamma=GAMMA, max_new_tokens=length,
                           sampling=setting.config, generator=g, eos_token_id=None)
            seqs.append(tuple(res.tokens))
            drafted += sum(res.drafted)
            accepted += sum(res.accepted)
            steps += res.n_steps
        return seqs, drafted, accepted, steps

    return run


def _bug_run(bug_name: str):
    """A registry control, injected into our loop, re-targeted at the row's setting and GAMMA."""

    def run(models, setting, prompts, length, seed):
        target, draft = models
        bug = dataclasses.replace(BUGS[bug_name], config=setting.config, gamma=GAMMA)
        if len(set(prompts)) == 1:  # sampling: all n draws in one call (one seeded generator)
            seqs = draw_sequences(bug, target, draft, len(prompts), seed, length, torch.tensor(prompts[0]))
        else:  # greedy: one call per prompt
            seqs = [draw_sequences(bug, target, draft, 1, seed + i, length, torch.tensor(p))[0]
                    for i, p in enumerate(prompts)]
        return seqs, float("nan"), float("nan"), float("nan")

    return run


IMPLEMENTATIONS = {i.name: i for i in [
    Implementation("hf_assisted", "audited",
                   f"transformers generate(assistant_model=draft), num_assistant_tokens={GAMMA} constant",
                   _hf_run("assisted")),
    Implementation("hf_assisted_defaults", "audited",
                   "transformers generate(assistant_model=draft) with the draft's default generation config "
                   "(num_assistant_tokens 20, assistant_confidence_threshold 0.4: data-dependent draft length)",
                   _hf_run("assisted_defaults"), settings=("T=1",), quick=False),
    Implementation("hf_early_exit", "audited",
                   f"transformers generate(assistant_early_exit={EARLY_EXIT_LAYER}): self-speculation, the target's first layer "
                   f"drafts (LayerSkip), num_assistant_tokens={GAMMA} constant", _hf_run("early_exit"), quick=False),
    Implementation("hf_prompt_lookup", "audited", f"transformers generate(prompt_lookup_num_tokens={GAMMA})",
                   _hf_run("lookup")),
    Implementation("hf_autoregressive", "control", "transformers generate() without assistant (the reference)",
                   _hf_run("ar"), quick=False),
    Implementation("specrepro_draft_model", "control", f"specrepro generate + DraftModelDrafter, gamma={GAMMA}",
                   _ours_run("draft")),
    Implementation("specrepro_prompt_lookup", "control",
                   f"specrepro generate + PromptLookupDrafter (point-mass drafts), gamma={GAMMA}", _ours_run("lookup")),
    Implementation("neg_always_accept", "negative control",
                   "registry bug 'always-accept' (vllm-project/vllm-ascend#13730) in specrepro generate",
                   _bug_run("always-accept"), settings=("T=1",)),
    Implementation("neg_raw_q", "negative control",
                   "registry bug 'raw-q' (huggingface/transformers#47932 replayed) in specrepro generate",
                   _bug_run("raw-q"), settings=("top-k",), quick=False),
    Implementation("neg_target_rows_unprocessed", "negative control",
                   "registry bug 'target-rows-unprocessed' (vllm-project/vllm#10198) in specrepro generate",
                   _bug_run("target-rows-unprocessed"), settings=("top-p",), quick=False),
    Implementation("neg_ratio_to_target_max", "negative control",
                   "registry bug 'ratio-to-target-max' (1bit-MONSTER#637): point-mass drafts accepted with "
                   "min(1, p(x)/max p) instead of p(x), in specrepro generate", _bug_run("ratio-to-target-max"),
                   settings=("top-k-lookup",), quick=False),
    Implementation("neg_argmax_sample_softmax_rule", "negative control",
                   "registry bug 'argmax-sample-softmax-rule' (jaymody/speculative-sampling#3) in specrepro generate",
                   _bug_run("argmax-sample-softmax-rule"), settings=("greedy",)),
]}


# ----------------------------------------------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------------------------------------------

COLUMNS = ["setting", "implementation", "temperature", "top_k", "top_p", "n", "tv", "p_value",
           "min_detectable_tv_90", "verdict", "transformers_version"]
EXTRA_COLUMNS = ["role", "expected", "as_expected", "level", "prompt", "tv_null_mean", "drafted_per_call", "accepted_per_call",
                 "steps_per_call", "hf_vs_specrepro_processing_tv", "seconds", "description"]


def _greedy_row(models, impl, setting, n, seed):
    target = models[0]
    prompts = greedy_prompts(n, seed)
    seqs, drafted, accepted, steps = impl.run(models, setting, prompts, GREEDY_LENGTH, seed)
    mismatches, unexplained = 0, 0
    for prompt, got in zip(prompts, seqs):
        ref, _ = greedy_reference(target, prompt, GREEDY_LENGTH)
        if list(got) != ref:
            mismatches += 1
            k = next((i for i in range(min(len(got), len(ref))) if got[i] != ref[i]), min(len(got), len(ref)))
            if _gap_at(target, list(prompt) + ref[:k]) >= TIE_BOUND:
                unexplained += 1
    # an exact greedy sampler never differs (beyond float near-ties): P(any mismatch | exact) = 0
    return {"n": n, "tv": mismatches / n, "p_value": 0.0 if unexplained else 1.0,
            # the per-prompt mismatch rate found (>= 1 mismatch in n prompts) with probability POWER
            "min_detectable_tv_90": 1.0 - (1.0 - POWER) ** (1.0 / n),
            "drafted": drafted, "accepted": accepted, "steps": steps, "unexplained": unexplained}


def _tv_null_mean(exact: dict, n: int, seed: int, trials: int = 500) -> float:
    """E[TV(empirical, exact)] for an EXACT sampler at this n (simulated): the sampling noise floor of the tv column
    (with hundreds of outcomes it is far from 0; a sampler's tv is judged against it, and by the p-value)."""
    p = np.array(list(exact.values()))
    p = p / p.sum()
    counts = np.random.default_rng(seed + 99).multinomial(n, p, size=trials)
    return float(np.mean(0.5 * np.abs(counts / n - p).sum(axis=1)))


def audit_table(quick: bool = False, seed: int = 0, *, progress: bool = False, settings=None, implementations=None):
    """Run every (setting, implementation) of the audit and return the table.

    Args:
        quick: small n (N_QUICK sequences, GREEDY_N_QUICK greedy prompts), only the T=1 and greedy settings and the
            quick implementations (< 60 s on 2 CPU cores); full: N_FULL sequences (min detectable TV <= 0.1 at
            90 % power in every sampling setting), every setting.
        seed: seeds every run (torch's global RNG for transformers, a torch.Generator for ours) and the greedy
            prompts; the same seed gives the same table.
        progress: print one line per row to stderr.
        settings, implementations: restrict to these names (default: all of the mode).

    Returns:
        pandas.DataFrame with columns :data:`COLUMNS` + :data:`EXTRA_COLUMNS`; ``attrs`` holds level, power,
        prompt, length, gamma, seed, quick and total seconds.
    """
    import pandas as pd
    import transformers

    t_all = time.perf_counter()
    n_seq = N_QUICK if quick else N_FULL
    n_greedy = GREEDY_N_QUICK if quick else GREEDY_N_FULL
    trials = POWER_TRIALS_QUICK if quick else POWER_TRIALS_FULL
    names = settings or (QUICK_SETTINGS if quick else tuple(SETTINGS))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows = []
    try:
        models = tiny_pair()
        for sname in names:
            setting = SETTINGS[sname]
            if not setting.greedy:
                exact = exact_distribution(models[0], setting)
                proc_tv = total_variation(exact, hf_exact_distribution(models[0], setting))
                mdt = min_detectable_tv(exact, n_seq, LEVEL, POWER, trials, seed)
                tv_null = _tv_null_mean(exact, n_seq, seed)
            for impl in IMPLEMENTATIONS.values():
                if implementations is not None and impl.name not in implementations:
                    continue
                if impl.settings is not None and sname not in impl.settings:
                    continue
                if setting.only is not None and impl.name not in setting.only:
                    continue
                if quick and not impl.quick:
                    continue
                t0 = time.perf_counter()
                if setting.greedy:
                    r = _greedy_row(models, impl, setting, n_greedy, seed)
                    r["proc_tv"] = float("nan")
                    r["tv_null"] = 0.0
                else:
                    seqs, drafted, accepted, steps = impl.run(models, setting, [setting.prompt] * n_seq, LENGTH, seed)
                    if any(len(s) != LENGTH for s in seqs):
                        raise RuntimeError(f"{impl.name}: a sequence without exactly {LENGTH} new tokens")
                    _, pv = gof_test(seqs, exact)
                    r = {"n": n_seq, "tv": total_variation(empirical_distribution(seqs), exact), "p_value": pv,
                         "min_detectable_tv_90": mdt, "drafted": drafted, "accepted": accepted, "steps": steps,
                         "proc_tv": proc_tv, "tv_null": tv_null}
                verdict = "fail" if r["p_value"] < LEVEL else "pass"
                calls = r["n"]
                row = {"setting": sname, "implementation": impl.name, "temperature": setting.temperature,
                       "top_k": setting.top_k or 0, "top_p": setting.top_p, "n": r["n"], "tv": r["tv"],
                       "p_value": r["p_value"], "min_detectable_tv_90": r["min_detectable_tv_90"], "verdict": verdict,
                       "transformers_version": transformers.__version__, "role": impl.role,
                       "expected": impl.expected, "as_expected": verdict == impl.expected, "level": LEVEL,
                       "tv_null_mean": r["tv_null"],
                       "prompt": "random (a b c d a b)" if setting.greedy else " ".join(map(str, setting.prompt)),
                       "drafted_per_call": r["drafted"] / calls, "accepted_per_call": r["accepted"] / calls,
                       "steps_per_call": r["steps"] / calls, "hf_vs_specrepro_processing_tv": r["proc_tv"],
                       "seconds": time.perf_counter() - t0, "description": impl.description}
                rows.append(row)
                if progress:
                    print(f"[audit] {sname:7s} {impl.name:32s} n={r['n']:5d} tv={r['tv']:.4f} p={r['p_value']:.3g} "
                          f"-> {verdict} ({row['seconds']:.1f} s)", file=sys.stderr, flush=True)
    finally:
        torch.set_num_threads(threads)
    df = pd.DataFrame(rows, columns=COLUMNS + EXTRA_COLUMNS)
    df.attrs.update(level=LEVEL, power=POWER, target_tv=TARGET_TV, prompt=PROMPT, lookup_prompt=LOOKUP_PROMPT,
                    length=LENGTH, gamma=GAMMA,
                    seed=seed, quick=quick, seconds=time.perf_counter() - t_all)
    return df


# ----------------------------------------------------------------------------------------------------------------
# Standalone reproduction for a transformers maintainer
# ----------------------------------------------------------------------------------------------------------------

_REPRO = '''"""Standalone reproduction: is transformers' {mode_doc} exact?

Setting: {setting_doc}. Generated by specrepro's audit (transformers {version} when written).
Needs only torch, numpy and transformers. Usage: python {{this file}} [N] [seed]

It builds a tiny random target (and draft) from a config with a fixed seed (vocabulary {vocab}, no EOS), runs
generate N times, and compares the frequencies of the outputs with the EXACT distribution of the target, enumerated
from the target's logits through transformers' own warpers ({proc_doc}), i.e. what plain
autoregressive sampling draws. Plain `generate(do_sample=...)` without an assistant runs too, as the reference.
Chi-square goodness of fit: outcomes with expected count >= 5 get a bin each, the rest are pooled; p-value from
20,000 simulated multinomial experiments. Level {level:g}.
"""
import collections
import sys

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

N = int(sys.argv[1]) if len(sys.argv) > 1 else {n}
SEED = int(sys.argv[2]) if len(sys.argv) > 2 else {seed}
LEVEL = {level!r}
GREEDY = {greedy!r}
PROMPT = {prompt!r}
L = {length}  # new tokens per sequence
GAMMA = {gamma}  # num_assistant_tokens / prompt_lookup_num_tokens
SAMPLING = {hf_kwargs!r}
MODE = {mode!r}  # "assisted" / "assisted_defaults" (draft model), "early_exit" (self-speculation), "lookup"
torch.set_num_threads(1)


def tiny(cls, config_cls, seed, vocab={vocab}, sharpness=8.0):
    kw = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = cls(config_cls(**kw))
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)  # sharper distributions: a wrong sampler shows with fewer samples
    model.generation_config.eos_token_id = None
    return model.eval().requires_grad_(False)


target = tiny(LlamaForCausalLM, LlamaConfig, {target_seed})
draft = tiny(Qwen2ForCausalLM, Qwen2Config, {draft_seed})
# a fixed schedule; "assisted_defaults" keeps transformers' defaults (20 tokens, threshold 0.4). In early-exit mode the
# target is its own assistant: its generation config holds the schedule
for m in ([draft] if MODE == "assisted" else [target] if MODE == "early_exit" else []):
    m.generation_config.num_assistant_tokens = GAMMA
    m.generation_config.num_assistant_tokens_schedule = "constant"
    m.generation_config.assistant_confidence_threshold = 0.0
transformers.logging.set_verbosity_error()


def run(prompt, mode):
    ids = torch.tensor([list(prompt)])
    extra = {{"ar": {{}}, "assisted": {{"assistant_model": draft}}, "assisted_defaults": {{"assistant_model": draft}},
             "lookup": {{"prompt_lookup_num_tokens": GAMMA}}, "early_exit": {{"assistant_early_exit": {early_exit}}}}}[mode]
    with torch.inference_mode():
        out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=L, min_new_tokens=L,
                              eos_token_id=None, pad_token_id=0, **SAMPLING, **extra)
    return tuple(out[0, ids.shape[1]:].tolist())


@torch.inference_mode()
def next_logits(seq):
    return target(input_ids=torch.tensor([list(seq)])).logits[:, -1].float()


def exact_distribution(prompt):
    procs = LogitsProcessorList()
    if SAMPLING["temperature"] != 1.0:
        procs.append(TemperatureLogitsWarper(SAMPLING["temperature"]))
    if SAMPLING["top_k"]:
        procs.append(TopKLogitsWarper(SAMPLING["top_k"]))
    if SAMPLING["top_p"] < 1.0:
        procs.append(TopPLogitsWarper(SAMPLING["top_p"]))
    out = {{}}

    def rec(seq, prob):
        if len(seq) == L:
            out[seq] = prob
            return
        ids = torch.tensor([list(prompt) + list(seq)])
        p = torch.softmax(procs(ids, next_logits(prompt + seq)).double(), -1)[0]
        for x in torch.nonzero(p).flatten().tolist():
            rec(seq + (x,), prob * float(p[x]))

    rec((), 1.0)
    return out


def chi_square(samples, exact, rng):
    keys = sorted(exact, key=lambda k: -exact[k])
    n = len(samples)
    counts = collections.Counter(samples)
    if any(k not in exact for k in counts):
        return 0.0
    probs = np.array([exact[k] for k in keys])
    obs = np.array([counts.get(k, 0) for k in keys], dtype=float)
    big = int(np.sum(probs * n >= 5))
    groups = [[i] for i in range(big)]
    rest = list(range(big, len(keys)))
    while rest and probs[rest].sum() * n < 5 and groups:
        rest = groups.pop()[:] + rest
    if rest:
        groups.append(rest)
    p = np.array([probs[g].sum() for g in groups])
    o = np.array([obs[g].sum() for g in groups])
    e = p / p.sum() * n
    stat = np.sum((o - e) ** 2 / e)
    null = rng.multinomial(n, p / p.sum(), size=20000)
    null_stat = np.sum((null - e) ** 2 / e, axis=1)
    return (1 + np.sum(null_stat >= stat - 1e-9)) / (1 + len(null_stat))


def greedy_reference(prompt):
    seq = tuple(prompt)
    for _ in range(L):
        seq += (int(next_logits(seq)[0].argmax()),)
    return seq[len(prompt):]


print("transformers", transformers.__version__, "torch", torch.__version__, "| mode", MODE, "| sampling", SAMPLING)
if GREEDY:
    rng = np.random.default_rng(SEED + 777)  # the audit's greedy prompts (audit.greedy_prompts)
    bad = 0
    for i in range(N):
        a, b, c, d = rng.integers(0, {vocab}, 4).tolist()
        prompt = (a, b, c, d, a, b)
        ref, got = greedy_reference(prompt), run(prompt, MODE)
        if got != ref:
            bad += 1
            print("prompt", prompt, "target greedy", ref, "generate", got)
    print(f"{{bad}} of {{N}} greedy outputs differ from the target's greedy continuation")
    sys.exit(1 if bad else 0)

exact = exact_distribution(PROMPT)
failed = False
for mode in ("ar", MODE):
    torch.manual_seed(SEED)
    samples = [run(PROMPT, mode) for _ in range(N)]
    counts = collections.Counter(samples)
    tv = 0.5 * sum(abs(counts.get(k, 0) / N - exact.get(k, 0.0)) for k in set(exact) | set(counts))
    pv = chi_square(samples, exact, np.random.default_rng(0))
    print(f"{{mode:9s}} N={{N}} TV(empirical, exact)={{tv:.4f}} chi-square p={{pv:.3g}} -> {{'FAIL' if pv < LEVEL else 'pass'}}")
    worst = sorted(set(exact) | set(counts), key=lambda k: -abs(counts.get(k, 0) / N - exact.get(k, 0.0)))[:5]
    for k in worst:
        print(f"    {{k}}: observed {{counts.get(k, 0) / N:.4f}} exact {{exact.get(k, 0.0):.4f}}")
    failed |= mode != "ar" and pv < LEVEL
sys.exit(1 if failed else 0)
'''


def reproduction_script(setting: str | Setting, implementation: str = "hf_assisted", n: int | None = None,
                        seed: int = 0) -> str:
    """A standalone script (needs only torch, numpy and transformers) that reproduces one audited row: it builds
    the tiny models from their configs with the audit's seeds, runs transformers' generate N times
    (``implementation`` 'hf_assisted', 'hf_assisted_defaults', 'hf_early_exit' or 'hf_prompt_lookup'; AR generate as
    the reference),
    and compares the frequencies with the exact distribution enumerated through transformers' own warpers (greedy:
    compares each output with the target's greedy continuation over N random prompts). Exit status 1 when the
    audited mode fails.

    Raises:
        ValueError: unknown setting or an implementation that is not one of transformers' speculative modes.
    """
    import transformers

    s = SETTINGS[setting] if isinstance(setting, str) else setting
    modes = {"hf_assisted": "assisted", "hf_assisted_defaults": "assisted_defaults", "hf_early_exit": "early_exit",
             "hf_prompt_lookup": "lookup"}
    if implementation not in modes:
        raise ValueError(f"reproduction scripts are for transformers' modes ({', '.join(modes)}), "
                         f"not {implementation!r}")
    mode = modes[implementation]
    hf_kwargs = s.hf_kwargs()
    mode_doc = {"assisted": f"assisted generation (generate(assistant_model=draft), num_assistant_tokens={GAMMA}, "
                            f"constant schedule, no confidence stop)",
                "assisted_defaults": "assisted generation (generate(assistant_model=draft)) with the draft's default "
                                     "generation config (num_assistant_tokens 20, assistant_confidence_threshold 0.4)",
                "early_exit": f"self-speculative decoding (generate(assistant_early_exit={EARLY_EXIT_LAYER}), "
                              f"num_assistant_tokens={GAMMA}, constant schedule)",
                "lookup": f"prompt lookup decoding (prompt_lookup_num_tokens={GAMMA})"}[mode]
    setting_doc = ("greedy (do_sample=False): every output must equal the target's greedy continuation" if s.greedy
                   else f"do_sample=True, temperature={s.temperature:g}, top_k={s.top_k or 0}, top_p={s.top_p:g}")
    return _REPRO.format(
        mode_doc=mode_doc, setting_doc=setting_doc, version=transformers.__version__, vocab=VOCAB,
        proc_doc="TemperatureLogitsWarper -> TopKLogitsWarper -> TopPLogitsWarper -> softmax, generate's order",
        level=LEVEL, n=n or (GREEDY_N_FULL if s.greedy else N_FULL), seed=seed, greedy=s.greedy,
        prompt=s.prompt, length=GREEDY_LENGTH if s.greedy else LENGTH, gamma=GAMMA, hf_kwargs=hf_kwargs, mode=mode,
        target_seed=TARGET_SEED, draft_seed=DRAFT_SEED, early_exit=EARLY_EXIT_LAYER)


# ----------------------------------------------------------------------------------------------------------------
# Command line: python -m specrepro audit
# ----------------------------------------------------------------------------------------------------------------
