"""The benchmark: decoding methods side by side on one workload, and the ``python -m specrepro bench`` command.

What this file is: :func:`run_bench` times decoding *methods* (our KV-cached AR baseline, our chain speculative
decoding with a draft model / prompt lookup / a bigram draft, and Hugging Face transformers' own ``generate``: AR,
assisted generation, prompt lookup) on the same prompts, interleaved prompt by prompt so that drift of a shared
machine hits every method alike, and reports per method: median tokens/s, speedup over our AR and over HF assisted
generation (paired per prompt), α, mean tokens per step, per-position acceptance and, under greedy decoding, whether
the outputs equal our AR outputs token for token. It prints one pandas table and can write JSON.

The method registry: a *method* is a name mapped to a :class:`MethodSpec` whose factory builds a *runner* for one
benchmark (``factory(ctx, name, gamma) -> runner``; ``runner(ids, generator) -> GenerationResult | RunOutput``).
Other modules add methods without editing this file::

    from specrepro.bench import register_method

    @register_method("tree-specinfer", needs_draft=True, description="SpecInfer expansion tree <1,1,3,1>")
    def _tree(ctx, name, gamma):
        proposer = ...                                   # built once per benchmark
        return lambda ids, generator: tree_generate(ctx.target, ids, proposer, ...)

A name ending in ``*`` registers a family (``"medusa-*"`` serves ``medusa-top3``, ``medusa-mc63``, ...; the factory
receives the full name). The modules in :data:`PLUGIN_MODULES` (``specrepro.trees``, ``specrepro.medusa``) are
imported on first use of the registry, so their ``register_method`` calls take effect; an import failure is
recorded in :data:`PLUGIN_ERRORS` and shown when a method is not found. Any method name may carry ``@γ``
(``sd-draft@3``) to override the benchmark's γ for that entry, so one interleaved run can sweep γ.

Timing: the wall time of each runner call is measured from outside (the same clock for our loops and HF's), with
``torch.cuda.synchronize()`` and CUDA events around the call on a GPU and ``time.perf_counter`` on the CPU; one
untimed warm-up call per method comes first; method order is rotated from prompt to prompt.

Randomness: every (repeat, prompt) gets its own ``torch.Generator`` seeded from ``seed``; all methods on that
prompt start from the same seed. HF ``generate`` has no generator argument, so for the ``hf-*`` methods an integer
seed drawn from that generator seeds torch's global RNG inside ``torch.random.fork_rng`` (global state is restored).

What it is not: the algorithms (:mod:`specrepro.decoding`, :mod:`specrepro.drafters`, :mod:`specrepro.trees`), the
speed model (:mod:`specrepro.theory`) or quality evaluation (:mod:`specrepro.humaneval`).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import fnmatch
import importlib
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from .sampling import SamplingConfig

__all__ = [
    "BenchOptionError", "BenchContext", "RunOutput", "MethodSpec", "BenchResult", "REGISTRY", "PLUGIN_MODULES",
    "PLUGIN_ERRORS", "DEFAULT_METHODS", "register_method", "known_methods", "resolve_method", "validate_options",
    "run_bench", "configure_parser", "run_command",
]

#: Methods run when none are named (draft-model methods are dropped when no draft is given).
DEFAULT_METHODS = ("ar", "sd-draft", "sd-lookup", "sd-bigram", "hf-ar", "hf-assisted", "hf-lookup")
#: Modules imported on first use of the registry; they may call :func:`register_method` at import time.
PLUGIN_MODULES: list[str] = ["specrepro.trees", "specrepro.medusa"]
#: module name -> "ExceptionType: message" for plugin modules that failed to import (missing modules are skipped).
PLUGIN_ERRORS: dict[str, str] = {}
_PLUGINS_LOADED: set[str] = set()


class BenchOptionError(ValueError):
    """An impossible or unknown benchmark option (the message says which and what is allowed)."""


# ---------------------------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class RunOutput:
    """What a runner returns when it is not a :class:`~specrepro.decoding.GenerationResult`.

    Attributes:
        tokens: the new token ids (prompt excluded).
        drafted, accepted: per verification step, draft tokens proposed / accepted (empty when unknown, e.g. HF).
        alpha_terms: per verified draft position, Σ_x min(p, q) (empty when unknown).
        prefill_s: seconds spent on the prompt before the first step (NaN when unknown).
    """

    tokens: list[int]
    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    alpha_terms: list[float] = field(default_factory=list)
    prefill_s: float = float("nan")


@dataclass
class MethodSpec:
    """A registered method.

    Attributes:
        name: the registry key (a trailing ``*`` makes it a family matched by prefix).
        factory: ``factory(ctx: BenchContext, name: str, gamma: int) -> runner``; called once per benchmark, after
            the models are loaded; ``runner(ids: LongTensor [L] on ctx.device, generator: torch.Generator) ->
            GenerationResult | RunOutput`` decodes one prompt (``ctx.max_new_tokens``, ``ctx.sampling``,
            ``ctx.eos_token_id``).
        needs_draft: the factory uses ``ctx.draft`` (a draft model).
        uses_gamma: γ means something to this method (reported in the table; ``@γ`` allowed).
        family: who implements the decoding loop: 'specrepro' or 'transformers'.
        description: one line for ``--list-methods``.
    """

    name: str
    factory: Callable
    needs_draft: bool = False
    uses_gamma: bool = True
    family: str = "specrepro"
    description: str = ""


#: name -> MethodSpec. Add entries with :func:`register_method`.
REGISTRY: dict[str, MethodSpec] = {}


def register_method(name: str, *, needs_draft: bool = False, uses_gamma: bool = True, family: str = "specrepro",
                    description: str = "", replace: bool = False):
    """Decorator registering ``factory(ctx, name, gamma) -> runner`` under ``name`` (see :class:`MethodSpec`).

    Raises:
        ValueError: the name is already registered (pass ``replace=True`` to override), or contains '@' or ','.
    """
    if "@" in name or "," in name or not name.strip():
        raise ValueError(f"method names may not be empty or contain '@' or ',': {name!r}")

    def deco(factory):
        if name in REGISTRY and not replace and REGISTRY[name].factory is not factory:
            raise ValueError(f"method {name!r} is already registered (by {REGISTRY[name].factory.__module__})")
        REGISTRY[name] = MethodSpec(name, factory, needs_draft, uses_gamma, family,
                                    description or (factory.__doc__ or "").strip().split("\n")[0])
        return factory

    return deco


def _load_plugins() -> None:
    for mod in PLUGIN_MODULES:
        if mod in _PLUGINS_LOADED:
            continue
        _PLUGINS_LOADED.add(mod)
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:  # the module exists but one of its imports does not
                PLUGIN_ERRORS[mod] = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # a broken plugin must not break the benchmark of the other methods
            PLUGIN_ERRORS[mod] = f"{type(exc).__name__}: {exc}"


def known_methods() -> list[str]:
    """Registered method names (plugins loaded first), in registration order."""
    _load_plugins()
    return list(REGISTRY)


def resolve_method(entry: str) -> tuple[str, MethodSpec, int | None]:
    """Parse ``name`` or ``name@γ`` and look the name up (exact name first, then ``prefix*`` families).

    Returns:
        ``(name, spec, gamma_override or None)``.

    Raises:
        BenchOptionError: unknown name (lists the known ones and any plugin import errors) or a bad ``@γ``.
    """
    _load_plugins()
    name, _, g = entry.strip().partition("@")
    gamma = None
    if g:
        if not g.isdigit() or int(g) < 1:
            raise BenchOptionError(f"{entry!r}: the γ after '@' must be an integer >= 1")
        gamma = int(g)
    spec = REGISTRY.get(name)
    if spec is None:
        fams = [s for k, s in REGISTRY.items() if k.endswith("*") and fnmatch.fnmatchcase(name, k)]
        spec = max(fams, key=lambda s: len(s.name)) if fams else None
    if spec is None:
        extra = "".join(f"\n  (plugin {m} failed to import: {e})" for m, e in PLUGIN_ERRORS.items())
        raise BenchOptionError(f"unknown method {name!r}; known methods: {', '.join(REGISTRY)}{extra}")
    if gamma is not None and not spec.uses_gamma:
        raise BenchOptionError(f"method {name!r} has no draft length; '@{gamma}' makes no sense for it")
    return name, spec, gamma


# ---------------------------------------------------------------------------------------------------------------
# Context and built-in methods
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class BenchContext:
    """Everything a method factory may use; one per :func:`run_bench` call.

    Attributes:
        target, draft: transformers causal LMs (draft None when not given); tokenizer: the target's.
        prompts: list of :class:`~specrepro.data.Prompt`; sampling: the shared :class:`SamplingConfig`.
        gamma: the default draft length γ; max_new_tokens; eos_token_id: list of stop ids (target's generation
            config and tokenizer); vocab_size: the target's logits width V; seed; device.
        options: free-form extra settings for plugin methods (``--opt key=value`` on the command line).
    """

    target: Any
    tokenizer: Any
    draft: Any
    prompts: list
    sampling: SamplingConfig
    gamma: int
    max_new_tokens: int
    eos_token_id: list[int]
    vocab_size: int
    seed: int = 0
    device: str = "cpu"
    options: dict = field(default_factory=dict)
    _shared: dict = field(default_factory=dict)

    def shared(self, key: str, build: Callable[[], Any]):
        """A resource built once per benchmark and shared by methods (e.g. the bigram draft)."""
        if key not in self._shared:
            self._shared[key] = build()
        return self._shared[key]


def _our_runner(ctx: BenchContext, drafter, gamma: int):
    from .decoding import generate

    def run(ids, generator):
        return generate(ctx.target, ids, drafter=drafter, gamma=gamma, max_new_tokens=ctx.max_new_tokens,
                        sampling=ctx.sampling, generator=generator, eos_token_id=ctx.eos_token_id)

    return run


@register_method("ar", uses_gamma=False)
def _ar(ctx, name, gamma):
    """our KV-cached autoregressive baseline (specrepro.decoding.generate, no drafter)"""
    return _our_runner(ctx, None, 1)


@register_method("sd-draft", needs_draft=True)
def _sd_draft(ctx, name, gamma):
    """our chain speculative decoding with the draft model (Leviathan Alg. 1 / Chen Alg. 2)"""
    from .drafters import DraftModelDrafter

    return _our_runner(ctx, DraftModelDrafter(ctx.draft, ctx.vocab_size), gamma)


@register_method("sd-lookup")
def _sd_lookup(ctx, name, gamma):
    """our chain speculative decoding with prompt lookup (n-gram copy of the context, n = 3..1)"""
    from .drafters import PromptLookupDrafter

    return _our_runner(ctx, PromptLookupDrafter(max_ngram=int(ctx.options.get("lookup_max_ngram", 3))), gamma)


def bigram_corpus(tokenizer, exclude_ids=()) -> list[list[int]]:
    """Token ids of the corpus the ``sd-bigram`` draft is estimated from: every HumanEval prompt with its canonical
    solution and every pydoc topic prompt, minus the benchmark's own prompts (``exclude_ids``), so the draft has not
    seen the text it drafts for (Leviathan Table 3's bigram is likewise fitted on training text)."""
    from .data import corpus_token_ids

    return corpus_token_ids(tokenizer, workloads=("humaneval", "pydoc"), exclude_ids=set(exclude_ids))


@register_method("sd-bigram")
def _sd_bigram(ctx, name, gamma):
    """our chain speculative decoding with a bigram draft (HumanEval+pydoc corpus minus the benchmark prompts)"""
    from .drafters import NGramDrafter

    drafter = ctx.shared("bigram", lambda: NGramDrafter(
        bigram_corpus(ctx.tokenizer, [p.id for p in ctx.prompts]), ctx.vocab_size, n=2))
    return _our_runner(ctx, drafter, gamma)


def hf_generation_config(ctx: BenchContext, **extra):
    """A fresh ``GenerationConfig`` equivalent to ``ctx.sampling``: greedy -> ``do_sample=False``; sampling -> the same
    temperature, top_p and top_k (0 = off, overriding HF's default top_k=50); no repetition penalty; the same stop
    ids and length cap as our loops."""
    from transformers import GenerationConfig

    s = ctx.sampling
    kw = dict(max_new_tokens=ctx.max_new_tokens, min_new_tokens=0, num_beams=1, do_sample=not s.greedy,
              eos_token_id=list(ctx.eos_token_id), pad_token_id=_pad_id(ctx), repetition_penalty=1.0)
    if not s.greedy:
        kw.update(temperature=float(s.temperature), top_p=float(s.top_p), top_k=int(s.top_k or 0))
    kw.update(extra)
    return GenerationConfig(**kw)


def _pad_id(ctx):
    pad = getattr(ctx.tokenizer, "pad_token_id", None)
    return int(pad) if pad is not None else (ctx.eos_token_id[0] if ctx.eos_token_id else 0)


def _hf_runner(ctx: BenchContext, gen_config, assistant=None, assistant_config: dict | None = None):
    def run(ids, generator):
        seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device).item()) \
            if generator is not None else ctx.seed
        devices = [ids.device] if ids.device.type == "cuda" else []
        saved = None
        if assistant is not None and assistant_config:
            saved = assistant.generation_config
            assistant.generation_config = copy.deepcopy(saved)
            for k, v in assistant_config.items():
                setattr(assistant.generation_config, k, v)
        try:
            with torch.random.fork_rng(devices=devices), torch.inference_mode():
                torch.manual_seed(seed)
                kw = {"assistant_model": assistant} if assistant is not None else {}
                out = ctx.target.generate(input_ids=ids[None], attention_mask=torch.ones_like(ids)[None],
                                          generation_config=copy.deepcopy(gen_config), **kw)
        finally:
            if saved is not None:
                assistant.generation_config = saved
        return RunOutput(tokens=out[0, ids.numel():].tolist())

    return run


@register_method("hf-ar", uses_gamma=False, family="transformers")
def _hf_ar(ctx, name, gamma):
    """transformers model.generate, autoregressive (greedy: do_sample=False)"""
    return _hf_runner(ctx, hf_generation_config(ctx))


@register_method("hf-assisted", needs_draft=True, uses_gamma=False, family="transformers")
def _hf_assisted(ctx, name, gamma):
    """transformers assisted generation, generate(assistant_model=draft), HF's defaults (20 tokens, confidence stop)"""
    return _hf_runner(ctx, hf_generation_config(ctx), assistant=ctx.draft)


@register_method("hf-assisted-gamma", needs_draft=True, family="transformers")
def _hf_assisted_gamma(ctx, name, gamma):
    """transformers assisted generation with exactly γ draft tokens per step (constant schedule, no confidence stop)"""
    return _hf_runner(ctx, hf_generation_config(ctx), assistant=ctx.draft,
                      assistant_config={"num_assistant_tokens": gamma, "num_assistant_tokens_schedule": "constant",
                                        "assistant_confidence_threshold": 0.0})


@register_method("hf-lookup", family="transformers")
def _hf_lookup(ctx, name, gamma):
    """transformers prompt lookup decoding, generate(prompt_lookup_num_tokens=γ, max_matching_ngram_size=3)"""
    return _hf_runner(ctx, hf_generation_config(
        ctx, prompt_lookup_num_tokens=gamma,
        max_matching_ngram_size=int(ctx.options.get("lookup_max_ngram", 3))))


# ---------------------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------------------

def validate_options(*, methods, gamma: int, n_prompts: int | None, max_new_tokens: int, temperature: float,
                     top_p: float, top_k: int | None, repeats: int, device: str, has_draft: bool | None = None,
                     dtype: str | None = None) -> list[tuple[str, MethodSpec, int]]:
    """Check benchmark options before any model is loaded.

    Returns:
        the resolved method list: ``(label, spec, gamma)`` per entry, label being ``name`` or ``name@γ``.

    Raises:
        BenchOptionError (a ValueError): γ < 1, n_prompts < 1, max_new_tokens < 1, repeats < 1, temperature < 0 or
            not finite, top_p outside (0, 1], top_k < 0, an unknown method (the message lists the known ones),
            duplicate methods, a draft-model method without a draft (``has_draft=False``), a CUDA device on a
            machine without CUDA, an unknown dtype.
    """
    def bad(msg):
        raise BenchOptionError(msg)

    def is_int(x):
        return isinstance(x, int) and not isinstance(x, bool)

    if not is_int(gamma) or gamma < 1:
        bad(f"gamma (draft length γ) must be an integer >= 1, got {gamma!r}")
    if n_prompts is not None and (not is_int(n_prompts) or n_prompts < 1):
        bad(f"n-prompts must be an integer >= 1, got {n_prompts!r}")
    if not is_int(max_new_tokens) or max_new_tokens < 1:
        bad(f"max-new-tokens must be an integer >= 1, got {max_new_tokens!r}")
    if not is_int(repeats) or repeats < 1:
        bad(f"repeats must be an integer >= 1, got {repeats!r}")
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature < 0:
        bad(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if not isinstance(top_p, (int, float)) or not (0.0 < top_p <= 1.0):
        bad(f"top-p must lie in (0, 1], got {top_p!r}")
    if top_k is not None and (not is_int(top_k) or top_k < 0):
        bad(f"top-k must be an integer >= 0 (0 = off), got {top_k!r}")
    dev = str(device)
    if dev.startswith("cuda") and not torch.cuda.is_available():
        bad(f"device {dev!r} requested but CUDA is not available on this machine (torch {torch.__version__}); "
            f"use --device cpu")
    if not (dev == "cpu" or dev.startswith("cuda") or dev == "mps"):
        bad(f"device must be 'cpu', 'cuda', 'cuda:N' or 'mps', got {dev!r}")
    if dtype is not None:
        from .models import resolve_dtype

        try:
            resolve_dtype(dtype, dev)
        except ValueError as exc:
            raise BenchOptionError(str(exc)) from None
    if isinstance(methods, str):
        methods = [m for m in methods.split(",") if m.strip()]
    if not methods:
        bad("no methods given")
    resolved, seen = [], set()
    for entry in methods:
        name, spec, g = resolve_method(entry)
        label = f"{name}@{g}" if g is not None else name
        if label in seen:
            bad(f"method {label!r} given twice")
        seen.add(label)
        if spec.needs_draft and has_draft is False:
            bad(f"method {name!r} needs a draft model: pass --draft (or --pair), or drop it from --methods")
        resolved.append((label, spec, g if g is not None else gamma))
    return resolved


# ---------------------------------------------------------------------------------------------------------------
# Timing and aggregation
# ---------------------------------------------------------------------------------------------------------------

def _timed(fn, device: str):
    """Run ``fn()``; returns (result, seconds). CUDA: synchronize, CUDA events around the call, synchronize."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        torch.cuda.synchronize()
        return out, start.elapsed_time(end) / 1000.0
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _as_run_output(res) -> RunOutput:
    if isinstance(res, RunOutput):
        return res
    times = getattr(res, "times", {}) or {}
    return RunOutput(tokens=list(res.tokens), drafted=list(getattr(res, "drafted", []) or []),
                     accepted=list(getattr(res, "accepted", []) or []),
                     alpha_terms=list(getattr(res, "alpha_terms", []) or []),
                     prefill_s=float(times.get("prefill", float("nan"))))


def _per_position(drafted, accepted, gamma):
    reached, acc = [0] * gamma, [0] * gamma
    for g, n in zip(drafted, accepted):
        for i in range(min(g, n + 1, gamma)):
            reached[i] += 1
            acc[i] += i < n
    return reached, acc


@dataclass
class BenchResult:
    """:func:`run_bench` output: ``summary`` (one row per method), ``runs`` (one row per timed call), ``config``."""

    summary: Any
    runs: Any
    config: dict

    def to_json(self) -> dict:
        import numpy as np

        def clean(v):
            if isinstance(v, float) and not math.isfinite(v):
                return None
            if isinstance(v, (np.floating,)):
                return clean(float(v))
            if isinstance(v, (np.integer,)):
                return int(v)
            if isinstance(v, (np.bool_,)):
                return bool(v)
            if isinstance(v, (list, tuple)):
                return [clean(x) for x in v]
            return v

        rows = lambda df: [{k: clean(v) for k, v in r.items()} for r in df.to_dict(orient="records")]  # noqa: E731
        return {"config": self.config, "summary": rows(self.summary), "runs": rows(self.runs)}

    def table(self):
        """The summary formatted for printing (rounded; per-position acceptance as a short string)."""
        df = self.summary.copy()
        df["per_position_acceptance"] = df["per_position_acceptance"].map(
            lambda xs: " ".join("-" if (x is None or not math.isfinite(x)) else f"{x:.2f}" for x in xs) if xs else "")
        cols = ["method", "gamma", "tokens_per_s", "ms_per_token", "speedup_vs_ar", "speedup_vs_hf_assisted",
                "alpha", "tokens_per_step", "per_position_acceptance", "greedy_equal_to_ar"]
        return df[[c for c in cols if c in df.columns]].set_index("method").round(3)


def _gamma_label(spec: MethodSpec, gamma: int):
    """γ as reported: the method's γ; 0 for AR methods (Chen's K = 0); None where the method chooses it itself."""
    if spec.uses_gamma:
        return gamma
    return None if spec.needs_draft else 0


def _summarize(runs, resolved, greedy: bool):
    import numpy as np
    import pandas as pd

    key = ["repeat", "prompt"]
    ar = runs[runs["method"] == "ar"].set_index(key)["tokens_per_s"] if (runs["method"] == "ar").any() else None
    hfa = runs[runs["method"] == "hf-assisted"].set_index(key)["tokens_per_s"] \
        if (runs["method"] == "hf-assisted").any() else None
    rows = []
    for label, spec, gamma in resolved:
        d = runs[runs["method"] == label]
        idx = d.set_index(key)["tokens_per_s"]
        drafted = [x for xs in d["drafted"] for x in xs]
        accepted = [x for xs in d["accepted"] for x in xs]
        alpha_terms = [x for xs in d["alpha_terms"] for x in xs]
        steps = int(d["steps"].sum())
        has_steps = steps > 0
        g = gamma if spec.uses_gamma else 0
        reached, acc = _per_position(drafted, accepted, g) if (g and drafted) else ([], [])
        eq = d["equal_to_ar"].dropna()
        rows.append({
            "method": label, "family": spec.family, "gamma": _gamma_label(spec, gamma), "runs": len(d),
            "new_tokens": float(d["new_tokens"].mean()),
            "tokens_per_s": float(d["tokens_per_s"].median()),
            "ms_per_token": float(d["ms_per_token"].median()),
            "speedup_vs_ar": float((idx / ar).median()) if ar is not None else float("nan"),
            "speedup_vs_hf_assisted": float((idx / hfa).median()) if hfa is not None else float("nan"),
            "alpha": float(np.mean(alpha_terms)) if alpha_terms else float("nan"),
            "tokens_per_step": float(d["new_tokens"].sum() / steps) if has_steps else float("nan"),
            "accepted_per_step": float(sum(accepted) / steps) if has_steps and drafted else
            (0.0 if has_steps else float("nan")),
            "loop_ms": float(d["loop_ms"].median()) if has_steps else float("nan"),
            "per_position_acceptance": [a / r if r else float("nan") for a, r in zip(acc, reached)],
            "greedy_equal_to_ar": (bool(eq.all()) if len(eq) else None) if greedy else None,
            "equal_to_ar_runs": f"{int(eq.sum())}/{len(eq)}" if (greedy and len(eq)) else "",
        })
    return pd.DataFrame(rows)


def _resolve_models(pair, target, draft, device, dtype, models):
    """-> (target_model, draft_model | None, tokenizer, target_name, draft_name)."""
    from .models import PAIRS, load_model, load_pair

    if models is not None:
        tm, dm, tok = models
        return tm, dm, tok, getattr(tm, "specrepro_name", "target"), getattr(dm, "specrepro_name", None)
    if pair is not None:
        if target is not None:
            raise BenchOptionError("give either --pair or --target/--draft, not both")
        if pair not in PAIRS:
            raise BenchOptionError(f"unknown pair {pair!r}; known pairs: {', '.join(PAIRS)}")
        target, draft = PAIRS[pair]
    if target is None:
        raise BenchOptionError("no target: pass --pair NAME or --target NAME")
    if draft is None:
        tm, tok = load_model(target, device=device, dtype=dtype)
        return tm, None, tok, target, None
    if draft == target:  # a model as its own draft (a sanity check: alpha = 1)
        tm, tok = load_model(target, device=device, dtype=dtype)
        return tm, tm, tok, target, draft
    tm, dm, tok = load_pair(target, draft, device=device, dtype=dtype)
    return tm, dm, tok, target, draft


def _eos_ids(model, tokenizer) -> list[int]:
    ids = []
    for src in (getattr(getattr(model, "generation_config", None), "eos_token_id", None),
                getattr(tokenizer, "eos_token_id", None)):
        if src is None:
            continue
        for e in ([src] if isinstance(src, int) else list(src)):
            if int(e) not in ids:
                ids.append(int(e))
    return ids


def run_bench(
    target: str | None = None,
    draft: str | None = None,
    *,
    pair: str | None = None,
    methods=None,
    gamma: int = 3,
    workload: str = "humaneval",
    n_prompts: int | None = 10,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int | None = 0,
    seed: int = 0,
    device: str = "cpu",
    dtype: str = "auto",
    repeats: int = 1,
    json_path: str | Path | None = None,
    models: tuple | None = None,
    prompts: list | None = None,
    chat: bool = False,
    warmup: bool = True,
    options: dict | None = None,
    progress: bool = True,
    print_table: bool = False,
) -> BenchResult:
    """Benchmark decoding methods on one workload, interleaved prompt by prompt.

    Args:
        target, draft: zoo names, hub ids or local paths (``draft`` may equal ``target``: the model drafts for
            itself); or ``pair``: a :data:`~specrepro.models.PAIRS` name; or ``models``: an already loaded
            ``(target_model, draft_model | None, tokenizer)``.
        methods: method names (list or comma-separated string), each optionally ``name@γ``; default
            :data:`DEFAULT_METHODS` (draft-model methods dropped when there is no draft). ``ar`` is always run (added
            first if missing): it is the reference for speedups and greedy equality.
        gamma: draft length γ >= 1 for methods without ``@γ``.
        workload, n_prompts: prompts from :func:`specrepro.data.load_workload` (the first ``n_prompts``), or
            ``prompts``: a list of :class:`~specrepro.data.Prompt` or strings. Tokenised raw with the target's
            tokenizer (no chat template unless ``chat=True``), as in Chen et al.'s HumanEval runs.
        max_new_tokens: cap on new tokens per prompt (EOS stops earlier, identically for every method).
        temperature, top_p, top_k: sampling (temperature 0 = greedy; HF runs get ``do_sample=False`` then).
        seed: seeds one ``torch.Generator`` per (repeat, prompt), shared by all methods on it.
        device, dtype: where and in what precision to load the models ('cuda' + 'bfloat16' on a GPU).
        repeats: timed passes over the prompts.
        json_path: write :meth:`BenchResult.to_json` there.
        warmup: one untimed call per method (on the first prompt, up to 8 tokens) before timing.
        options: extra settings for plugin methods (see :class:`BenchContext`).
        print_table: print :meth:`BenchResult.table` to stdout.

    Returns:
        :class:`BenchResult`: ``runs`` has one row per timed call (repeat, prompt, method, gamma, new_tokens,
        seconds, tokens_per_s, ms_per_token, steps, loop_ms (ms per target step after the prefill), token_ids,
        drafted, accepted, alpha_terms, equal_to_ar); ``summary`` one row per method: tokens_per_s (median),
        ms_per_token (median), speedup_vs_ar and speedup_vs_hf_assisted (median over prompts of the paired
        tokens/s ratio), alpha (mean Σ min(p, q) over verified positions, Leviathan Def. 3.1), tokens_per_step,
        accepted_per_step, loop_ms, per_position_acceptance (P(accept position i | positions < i accepted)),
        greedy_equal_to_ar (greedy only; None under sampling).

    Raises:
        BenchOptionError: see :func:`validate_options`; also an unknown pair or both ``pair`` and ``target``.
    """
    import pandas as pd
    from tqdm import tqdm

    from .data import Prompt, load_workload

    if methods is None:
        methods = list(DEFAULT_METHODS)
        if draft is None and pair is None and (models is None or models[1] is None):
            methods = [m for m in methods if not resolve_method(m)[1].needs_draft]
    elif isinstance(methods, str):
        methods = [m.strip() for m in methods.split(",") if m.strip()]
    methods = list(methods)
    if "ar" not in [m.strip() for m in methods]:
        methods.insert(0, "ar")
    has_draft = (models[1] is not None) if models is not None else (draft is not None or pair is not None)
    resolved = validate_options(methods=methods, gamma=gamma, n_prompts=n_prompts, max_new_tokens=max_new_tokens,
                                temperature=temperature, top_p=top_p, top_k=top_k, repeats=repeats, device=device,
                                has_draft=has_draft, dtype=dtype)
    sampling = SamplingConfig(temperature=float(temperature), top_k=int(top_k or 0) or None, top_p=float(top_p))
    if prompts is None:
        prompts = load_workload(workload, n_prompts)
    else:
        prompts = [p if isinstance(p, Prompt) else Prompt(f"prompt/{i}", str(p)) for i, p in enumerate(prompts)]
        prompts = prompts[:n_prompts] if n_prompts else prompts
        workload = "custom"

    tm, dm, tok, tname, dname = _resolve_models(pair, target, draft, device, dtype, models)
    dev = str(tm.device)
    from .data import format_prompt

    encoded = [tok(format_prompt(p, tok, chat=chat), return_tensors="pt").input_ids[0].to(tm.device)
               for p in prompts]
    vocab = tm.get_output_embeddings().weight.shape[0]
    ctx = BenchContext(target=tm, tokenizer=tok, draft=dm, prompts=prompts, sampling=sampling, gamma=gamma,
                       max_new_tokens=max_new_tokens, eos_token_id=_eos_ids(tm, tok), vocab_size=vocab, seed=seed,
                       device=dev, options=dict(options or {}))
    runners = {label: spec.factory(ctx, label.partition("@")[0], g) for label, spec, g in resolved}

    def gen_for(r, i):
        return torch.Generator(device=tm.device).manual_seed(seed + 1_000_003 * r + i)

    if warmup:  # untimed: first-call costs (allocations, kernel selection, lazy imports) stay out of the timings
        wctx = dataclasses.replace(ctx, max_new_tokens=min(8, max_new_tokens))  # shares ctx's built resources
        for label, spec, g in resolved:
            spec.factory(wctx, label.partition("@")[0], g)(encoded[0], gen_for(-1, 0))

    rows = []
    labels = [label for label, _, _ in resolved]
    gammas = {label: _gamma_label(spec, g) for label, spec, g in resolved}
    total = repeats * len(prompts) * len(labels)
    bar = tqdm(total=total, desc="bench", disable=not progress, leave=False)
    for r in range(repeats):
        for i, (prompt, ids) in enumerate(zip(prompts, encoded)):
            k = (i + r) % len(labels)
            order = labels[k:] + labels[:k]  # rotate so no method always runs first/last
            outs = {}
            for label in order:
                gen = gen_for(r, i)  # the same seed for every method on this prompt
                res, seconds = _timed(lambda: runners[label](ids, gen), dev)
                out = _as_run_output(res)
                outs[label] = out
                steps = len(out.accepted)
                loop_s = seconds - (out.prefill_s if math.isfinite(out.prefill_s) else 0.0)
                n = len(out.tokens)
                rows.append({
                    "repeat": r, "prompt": prompt.id, "method": label, "gamma": gammas[label],
                    "prompt_tokens": int(ids.numel()), "new_tokens": n, "seconds": seconds,
                    "tokens_per_s": n / max(seconds, 1e-12), "ms_per_token": 1000 * seconds / max(1, n),
                    "steps": steps, "loop_ms": 1000 * loop_s / steps if steps else float("nan"),
                    "token_ids": list(out.tokens), "drafted": list(out.drafted), "accepted": list(out.accepted),
                    "alpha_terms": list(out.alpha_terms),
                })
                bar.update(1)
            for row in rows[-len(order):]:
                row["equal_to_ar"] = (outs[row["method"]].tokens == outs["ar"].tokens) if sampling.greedy else None
    bar.close()
    runs = pd.DataFrame(rows)
    summary = _summarize(runs, resolved, sampling.greedy)
    from .results import device_description

    config = {
        "target": tname, "draft": dname, "pair": pair, "methods": labels, "gamma": gamma, "workload": workload,
        "n_prompts": len(prompts), "prompt_ids": [p.id for p in prompts], "max_new_tokens": max_new_tokens,
        "temperature": temperature, "top_p": top_p, "top_k": top_k, "seed": seed, "device": dev,
        "device_description": device_description(dev), "dtype": str(tm.dtype).replace("torch.", ""),
        "repeats": repeats, "chat_template": chat, "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__, "transformers": __import__("transformers").__version__,
        "eos_token_id": ctx.eos_token_id, "options": ctx.options,
        "timing": "CUDA events + synchronize" if dev.startswith("cuda") else "time.perf_counter",
    }
    result = BenchResult(summary=summary, runs=runs, config=config)
    if json_path is not None:
        from .results import atomic_write_text

        atomic_write_text(Path(json_path), json.dumps(result.to_json(), indent=1) + "\n")
    if print_table:
        with pd.option_context("display.width", 200, "display.max_columns", 20):
            print(f"{tname} + {dname or 'no draft'} | {workload}, {len(prompts)} prompts x {repeats}, "
                  f"{max_new_tokens} new tokens | T={temperature} top_p={top_p} top_k={top_k} | γ={gamma} | "
                  f"{config['device_description']}, {config['dtype']}, {config['torch_threads']} threads")
            print(result.table().to_string())
    return result


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------

def configure_parser(p: argparse.ArgumentParser) -> None:
    """Add the ``bench`` options to ``p`` (used by ``python -m specrepro bench``)."""
    p.add_argument("--pair", help="a named target/draft pair (e.g. qwen-coder); default when no --target is given")
    p.add_argument("--target", help="target model: zoo name, hub id or local path")
    p.add_argument("--draft", help="draft model for sd-draft/hf-assisted (zoo name, hub id, path; may equal --target)")
    p.add_argument("--methods", default=None,
                   help=f"comma-separated, each NAME or NAME@GAMMA (default: {','.join(DEFAULT_METHODS)})")
    p.add_argument("--list-methods", action="store_true", help="list the registered methods and exit")
    p.add_argument("--gamma", type=int, default=3, help="draft length γ (default 3)")
    p.add_argument("--workload", default="humaneval", help="humaneval, pydoc, or a .jsonl file of {\"prompt\": ...}")
    p.add_argument("--n-prompts", type=int, default=10, help="use the first N prompts of the workload (default 10)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="auto", help="float32, bfloat16, float16 or auto (fp32 on CPU, bf16 on CUDA)")
    p.add_argument("--repeats", type=int, default=1, help="timed passes over the prompts")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template (default: raw prompts)")
    p.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE", help="extra option for plugin methods")
    p.add_argument("--json", dest="json_path", metavar="OUT", help="write the results as JSON")
    p.add_argument("--no-warmup", action="store_true")


def run_command(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    """Run the ``bench`` subcommand; option errors go to ``parser.error`` (exit status 2)."""
    if args.list_methods:
        for name in known_methods():
            s = REGISTRY[name]
            print(f"{name:20s} {s.family:12s} {'draft ' if s.needs_draft else '      '}{s.description}")
        for m, e in PLUGIN_ERRORS.items():
            print(f"(plugin {m} not loaded: {e})")
        return 0
    die = parser.error if parser else _die
    pair = args.pair
    if pair is not None and (args.target is not None or args.draft is not None):
        die("give either --pair or --target/--draft, not both")
    if pair is None and args.target is None:
        if args.draft is not None:
            die("--draft needs --target")
        pair = "qwen-coder"
    opts = {}
    for kv in args.opt:
        k, sep, v = kv.partition("=")
        if not sep:
            die(f"--opt expects KEY=VALUE, got {kv!r}")
        opts[k] = v
    if args.threads is not None:
        if args.threads < 1:
            die(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    try:
        run_bench(args.target, args.draft, pair=pair, methods=args.methods, gamma=args.gamma, workload=args.workload,
                  n_prompts=args.n_prompts, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                  top_p=args.top_p, top_k=args.top_k, seed=args.seed, device=args.device, dtype=args.dtype,
                  repeats=args.repeats, json_path=args.json_path, chat=args.chat, warmup=not args.no_warmup,
                  options=opts, print_table=True)
    except (BenchOptionError, KeyError, FileNotFoundError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        die(str(msg))
    if args.json_path:
        print(f"wrote {args.json_path}")
    return 0


def _die(msg: str):
    print(f"specrepro bench: error: {msg}", file=sys.stderr)
    raise SystemExit(2)
