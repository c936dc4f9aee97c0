"""The built-in benchmark methods: our AR and chain speculative decoding, token trees, Medusa, and transformers'
own generation (AR, assisted generation, prompt lookup), each registered with :func:`register_method`.

What this file is: one factory per method, ``factory(ctx, name, gamma) -> runner(ids, generator)``.

What it is not: the algorithms (:mod:`specrepro.core.decoding`, :mod:`specrepro.core.trees`, :mod:`specrepro.core.medusa`) or the
timing (:mod:`specrepro.measure.harness`).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Callable

import torch

from specrepro.bench.options import (
    MAX_TREE_NODES,
    BenchOptionError,
    default_expansion,
    draft_kind_option,
    draft_stop_option,
    draft_vocab_option,
    hybrid_min_ngram_option,
    int4_group_size_option,
    int8_backend_option,
    lookup_max_ngram_option,
    parse_tree_spec,
    tree_mode_option,
    typical_thresholds_option,
)
from specrepro.bench.registry import BenchContext, register_method
from specrepro.measure.harness import RunOutput


def _our_runner(ctx: BenchContext, drafter, gamma: int, predict: bool = True):
    """A runner of :func:`specrepro.core.decoding.generate` with ``drafter`` (None: AR) at a fixed ``gamma``.

    ``predict``: the method drafts exactly γ tokens per step with token verification, so Leviathan's model with the
    measured cost curves (:func:`specrepro.theory.hardware_aware_speedup`) predicts its speedup; the bench then
    measures ``drafter``'s cost per token (``run.cost_drafter``) before timing. False for dynamic or mixed drafters
    and block verification, whose tokens per step the i.i.d. formula does not give.
    """
    from specrepro.core.decoding import generate

    def run(ids, generator):
        return generate(ctx.target, ids, drafter=drafter, gamma=gamma, max_new_tokens=ctx.max_new_tokens,
                        sampling=ctx.sampling, generator=generator, eos_token_id=ctx.eos_token_id)

    run.cost_drafter = drafter if (predict and drafter is not None) else None
    return run


@register_method("ar", uses_gamma=False)
def _ar(ctx, name, gamma):
    """our KV-cached autoregressive baseline (specrepro.core.decoding.generate, no drafter)"""
    return _our_runner(ctx, None, 1)


@register_method("sd-draft", needs_draft=True)
def _sd_draft(ctx, name, gamma):
    """our chain speculative decoding with the draft model (Leviathan Alg. 1 / Chen Alg. 2)"""
    from specrepro.drafters.model import DraftModelDrafter

    return _our_runner(ctx, DraftModelDrafter(ctx.draft, ctx.vocab_size), gamma)


@register_method("sd-draft-block", needs_draft=True)
def _sd_draft_block(ctx, name, gamma):
    """our chain speculative decoding with the draft model, block verification (Sun et al. 2025); exact"""
    from specrepro.core.decoding import generate
    from specrepro.drafters.model import DraftModelDrafter

    drafter = DraftModelDrafter(ctx.draft, ctx.vocab_size)

    def run(ids, generator):
        return generate(ctx.target, ids, drafter=drafter, gamma=gamma, max_new_tokens=ctx.max_new_tokens,
                        sampling=ctx.sampling, generator=generator, eos_token_id=ctx.eos_token_id,
                        verification="block")

    return run


def _prepare_sd_draft_dynamic(at, gamma, options):
    draft_stop_option(options)
    draft_kind_option(options)
    if at is None:
        return max(int(gamma), 8)
    if not at.isdigit() or int(at) < 1:
        raise BenchOptionError(f"sd-draft-dynamic@{at}: the text after @ is the maximum draft length, an integer >= 1")
    return int(at)


@register_method("sd-draft-dynamic", needs_draft=True, prepare=_prepare_sd_draft_dynamic)
def _sd_draft_dynamic(ctx, name, gamma):
    """our chain speculative decoding, dynamic draft length: up to γ (default 8) draft tokens, stopping after one the
    draft gives temperature-1 probability < draft_stop (--opt, default 0.4; as transformers'
    assistant_confidence_threshold); --opt draft_kind: fp32 (default), int8, pruned, int8-pruned"""
    drafter = cheap_drafter(ctx, draft_kind_option(ctx.options), stop_below=draft_stop_option(ctx.options))
    return _our_runner(ctx, drafter, gamma, predict=False)


@register_method("sd-lookup")
def _sd_lookup(ctx, name, gamma):
    """our chain speculative decoding with prompt lookup (n-gram copy of the context, n = 3..1)"""
    from specrepro.drafters.lookup import PromptLookupDrafter

    return _our_runner(ctx, PromptLookupDrafter(max_ngram=lookup_max_ngram_option(ctx.options)), gamma)


def bigram_corpus(tokenizer, exclude_ids=()) -> list[list[int]]:
    """Token ids of the corpus the ``sd-bigram`` draft is estimated from: every HumanEval prompt with its canonical
    solution and every pydoc topic prompt, minus the benchmark's own prompts (``exclude_ids``), so the draft has not
    seen the text it drafts for (Leviathan Table 3's bigram is likewise fitted on training text)."""
    from specrepro.data import corpus_token_ids

    return corpus_token_ids(tokenizer, workloads=("humaneval", "pydoc"), exclude_ids=set(exclude_ids))


def _bigram_drafter(ctx: BenchContext):
    """The bigram :class:`~specrepro.drafters.lookup.NGramDrafter` of ``sd-bigram`` / ``sd-tree-merge``, built once."""
    from specrepro.drafters.lookup import NGramDrafter

    return ctx.shared("bigram", lambda: NGramDrafter(
        bigram_corpus(ctx.tokenizer, [p.id for p in ctx.prompts]), ctx.vocab_size, n=2))


@register_method("sd-bigram")
def _sd_bigram(ctx, name, gamma):
    """our chain speculative decoding with a bigram draft (HumanEval+pydoc corpus minus the benchmark prompts)"""
    return _our_runner(ctx, _bigram_drafter(ctx), gamma)


# ---------------------------------------------------------------------------------------------------------------
# Cheap drafts : int8 draft, FR-Spec pruned head, hybrid lookup/model drafter, per-step γ
# ---------------------------------------------------------------------------------------------------------------
def _int8_draft(ctx: BenchContext):
    """The int8 copy of ``ctx.draft`` (:func:`~specrepro.drafters.compress.quantize_draft`), built once per benchmark and
    shared by every method that uses it. Raises BenchOptionError: a draft the CPU int8 kernels cannot take."""
    from specrepro.drafters.compress import quantize_draft

    backend = int8_backend_option(ctx.options)

    def build():
        try:
            return quantize_draft(ctx.draft, backend)
        except ValueError as exc:
            raise BenchOptionError(f"int8 draft: {exc} (the int8 methods need --device cpu)") from None

    return ctx.shared(f"draft_int8:{backend}", build)


def _int4_draft(ctx: BenchContext):
    """The 4-bit weight-only copy of ``ctx.draft`` (:func:`~specrepro.drafters.compress.quantize_draft_int4`, group
    size ``--opt int4_group_size``), built once per benchmark. Raises BenchOptionError: a draft the CPU int4 kernels
    cannot take."""
    from specrepro.drafters.compress import quantize_draft_int4

    group = int4_group_size_option(ctx.options)

    def build():
        try:
            return quantize_draft_int4(ctx.draft, group)
        except ValueError as exc:
            raise BenchOptionError(f"int4 draft: {exc} (the int4 methods need --device cpu)") from None

    return ctx.shared(f"draft_int4:{group}", build)


def _int4_pruned_head(ctx: BenchContext, kept):
    """The 4-bit FR-Spec pruned head over ``kept``, built once per benchmark."""
    from specrepro.drafters.compress import pruned_head, quantize_linear_int4

    group = int4_group_size_option(ctx.options)
    return ctx.shared(f"fr_spec_head_int4:{kept.numel()}:{group}",
                      lambda: quantize_linear_int4(pruned_head(ctx.draft, kept), group))


def _kept_ids(ctx: BenchContext):
    """FR-Spec's kept vocabulary: the target's stop ids plus the ``draft_vocab`` most frequent tokens of the Python
    standard library's sources under the pair's tokenizer (counts cached per tokenizer), ids below both the target's
    width and the draft head's rows."""
    from specrepro.drafters.compress import frequent_token_ids, token_frequencies

    n = draft_vocab_option(ctx.options)

    def build():
        rows = ctx.draft.get_output_embeddings().weight.shape[0]
        width = min(ctx.vocab_size, rows)
        stops = [e for e in ctx.eos_token_id if 0 <= e < width]
        return frequent_token_ids(token_frequencies(ctx.tokenizer), n, width, always=stops)

    return ctx.shared(f"fr_spec_kept:{n}", build)


def _int8_pruned_head(ctx: BenchContext, kept):
    """The int8 FR-Spec pruned head over ``kept`` (:func:`~specrepro.drafters.compress.pruned_head` of the draft, then
    :func:`~specrepro.drafters.compress.quantize_linear`), built once per benchmark."""
    from specrepro.drafters.compress import pruned_head, quantize_linear

    backend = int8_backend_option(ctx.options)
    return ctx.shared(f"fr_spec_head_int8:{kept.numel()}:{backend}",
                      lambda: quantize_linear(pruned_head(ctx.draft, kept), backend))


def cheap_drafter(ctx: BenchContext, kind: str, stop_below: float = 0.0):
    """The drafter of a draft kind (:data:`~specrepro.bench.options.DRAFT_KINDS`): ``fp32`` the draft model as given,
    ``int8`` its int8 copy, ``pruned`` its FR-Spec pruned head, ``int8-pruned`` the int8 backbone with an int8
    pruned head, ``int4`` / ``int4-pruned`` the same with 4-bit weights. Models and kept vocabularies are built once per benchmark (``ctx.shared``); each call returns a
    fresh drafter (its own KV cache). ``stop_below`` > 0: dynamic draft length (the drafter stops after a token its
    temperature-1 confidence puts below it; :class:`~specrepro.drafters.model.DraftModelDrafter`)."""
    from specrepro.drafters.compress import pruned_head
    from specrepro.drafters.model import DraftModelDrafter, PrunedHeadDrafter

    if kind == "fp32":
        return DraftModelDrafter(ctx.draft, ctx.vocab_size, stop_below=stop_below)
    if kind == "int8":
        return DraftModelDrafter(_int8_draft(ctx), ctx.vocab_size, name="int8 draft model", stop_below=stop_below)
    if kind == "int4":
        return DraftModelDrafter(_int4_draft(ctx), ctx.vocab_size, name="int4 draft model", stop_below=stop_below)
    kept = _kept_ids(ctx)
    n = kept.numel()
    if kind == "pruned":
        head = ctx.shared(f"fr_spec_head:{n}", lambda: pruned_head(ctx.draft, kept))
        return PrunedHeadDrafter(ctx.draft, kept, ctx.vocab_size, head=head, name=f"draft, head of {n} tokens",
                                 stop_below=stop_below)
    if kind == "int8-pruned":
        return PrunedHeadDrafter(_int8_draft(ctx), kept, ctx.vocab_size, head=_int8_pruned_head(ctx, kept),
                                 name=f"int8 draft, head of {n} tokens",
                                 stop_below=stop_below)
    if kind == "int4-pruned":
        return PrunedHeadDrafter(_int4_draft(ctx), kept, ctx.vocab_size, head=_int4_pruned_head(ctx, kept),
                                 name=f"int4 draft, head of {n} tokens", stop_below=stop_below)
    raise BenchOptionError(f"unknown draft kind {kind!r}")


@register_method("sd-draft-int8", needs_draft=True)
def _sd_draft_int8(ctx, name, gamma):
    """our chain speculative decoding with an int8 copy of the draft (torch dynamic int8 linear layers; --opt
    int8_backend), q from the int8 logits"""
    return _our_runner(ctx, cheap_drafter(ctx, "int8"), gamma)


@register_method("sd-draft-pruned", needs_draft=True)
def _sd_draft_pruned(ctx, name, gamma):
    """our chain speculative decoding, draft head pruned to the draft_vocab (--opt, default 32768) most frequent
    tokens of the Python stdlib's sources (FR-Spec), q = 0 elsewhere"""
    return _our_runner(ctx, cheap_drafter(ctx, "pruned"), gamma)


@register_method("sd-draft-int8-pruned", needs_draft=True)
def _sd_draft_int8_pruned(ctx, name, gamma):
    """our chain speculative decoding with the int8 draft and an int8 FR-Spec pruned head (draft_vocab tokens)"""
    return _our_runner(ctx, cheap_drafter(ctx, "int8-pruned"), gamma)


@register_method("sd-draft-int4", needs_draft=True)
def _sd_draft_int4(ctx, name, gamma):
    """our chain speculative decoding with a 4-bit weight-only copy of the draft (torch's CPU int4 kernel, --opt
    int4_group_size), q from the 4-bit logits"""
    return _our_runner(ctx, cheap_drafter(ctx, "int4"), gamma)


@register_method("sd-draft-int4-pruned", needs_draft=True)
def _sd_draft_int4_pruned(ctx, name, gamma):
    """our chain speculative decoding with the 4-bit draft and a 4-bit FR-Spec pruned head (draft_vocab tokens)"""
    return _our_runner(ctx, cheap_drafter(ctx, "int4-pruned"), gamma)


@register_method("sd-hybrid", needs_draft=True)
def _sd_hybrid(ctx, name, gamma):
    """our chain speculative decoding: prompt lookup where an n-gram (n >= hybrid_min_ngram, default 2) matches,
    else the draft model (--opt draft_kind: fp32, int8, pruned, int8-pruned, int4, int4-pruned)"""
    from specrepro.drafters.lookup import HybridDrafter, PromptLookupDrafter

    lookup = PromptLookupDrafter(max_ngram=lookup_max_ngram_option(ctx.options),
                                 min_ngram=hybrid_min_ngram_option(ctx.options))
    return _our_runner(ctx, HybridDrafter(lookup, cheap_drafter(ctx, draft_kind_option(ctx.options))), gamma,
                       predict=False)


#: the largest draft length of sd-draft-auto when no ``@γ`` is given
AUTO_MAX_GAMMA = 8
#: the largest block length of sd-draft-adaptive when no ``@γ`` is given: transformers' assisted generation's default
#: ``num_assistant_tokens`` (20). A cap of 8 cut long confident runs into several steps, each paying a target forward:
#: on 10 HumanEval prompts x 128 tokens (greedy, int8 draft, one pass, 2-core CPU) the cap of 20 ran 1.06x
#: [0.98, 1.12] the cap of 8 (paired per prompt, 95% bootstrap interval), keeping 6.3 tokens per step instead of 5.2.
ADAPTIVE_MAX_GAMMA = 20


def prepare_max_gamma(method: str, default: int = AUTO_MAX_GAMMA, check=draft_kind_option):
    """The ``prepare`` hook of a method whose @γ is the largest draft length (default max(γ, ``default``)).

    ``check(options)`` validates the method's options first (default: its ``--opt draft_kind``; None: nothing, for
    methods without a draft kind, e.g. the llama.cpp ones). Raises BenchOptionError on an ``@`` that is not an
    integer >= 1."""

    def prepare(at, gamma, options):
        if check is not None:
            check(options)
        if at is None:
            return max(int(gamma), int(default))
        if not at.isdigit() or int(at) < 1:
            raise BenchOptionError(f"{method}@{at}: the text after @ is the largest draft length, an integer >= 1")
        return int(at)

    return prepare


def auto_gamma_costs(ctx: BenchContext, drafter, max_gamma: int, prefix_len: int = 200, repeats: int = 3,
                     rounds: int = 3):
    """The fixed costs sd-draft-auto chooses γ from (and sd-draft-adaptive its block lengths), measured once per
    benchmark before any timed run: the target's forward time over n = 1..max_gamma+1 new tokens on a
    ``prefix_len``-token prefix and ``drafter``'s time per drafted token under the run's sampling
    (:func:`~specrepro.measure.cost.measure_chain_costs`: warmed-up passes, then the median of ``rounds``), ms; the
    target on random ids from a generator seeded with ``ctx.seed``, the drafter along the prompts' tokens
    (``ctx.cost_text``). Returns ``(CostCurve, t_draft_ms)``."""
    from specrepro.measure.cost import measure_chain_costs

    curve, t_draft = measure_chain_costs(ctx.target, {"draft": drafter}, ns=range(1, max_gamma + 2),
                                         vocab=ctx.vocab_size, prefix_len=prefix_len, repeats=repeats, rounds=rounds,
                                         generator=torch.Generator().manual_seed(int(ctx.seed)),
                                         sampling=ctx.sampling, text=ctx.cost_text)
    return curve, t_draft["draft"]


@register_method("sd-draft-auto", needs_draft=True, prepare=prepare_max_gamma("sd-draft-auto"))
def _sd_draft_auto(ctx, name, gamma):
    """our chain speculative decoding, γ <= @γ (default 8) chosen per step from measured cost curves and the running α
    (hardware-aware cost model; --opt draft_kind: fp32, int8, pruned, int8-pruned, int4, int4-pruned)"""
    from specrepro.drafters.adaptive import AutoGammaDrafter

    kind = draft_kind_option(ctx.options)
    inner = cheap_drafter(ctx, kind)
    curve, t_draft = ctx.shared(f"auto_costs:{kind}:{gamma}", lambda: auto_gamma_costs(ctx, inner, gamma))
    drafter = AutoGammaDrafter(inner, curve, t_draft, name=f"{inner.name}, auto γ <= {gamma}")
    run = _our_runner(ctx, drafter, gamma, predict=False)
    run.gamma = gamma
    run.cost_curve, run.t_draft_ms = curve, t_draft  # for the notebook: the costs the choice was made from
    return run


@register_method("sd-draft-adaptive", needs_draft=True,
                 prepare=prepare_max_gamma("sd-draft-adaptive", ADAPTIVE_MAX_GAMMA))
def _sd_draft_adaptive(ctx, name, gamma):
    """our chain speculative decoding, block length <= @γ (default 20) chosen token by token: the draft stops where its
    calibrated confidence no longer pays for another drafted token under the measured costs (AdaptiveLengthDrafter,
    calibration carried over the bench's prompts in their fixed order; --opt draft_kind: fp32, int8, pruned,
    int8-pruned; sd-draft-adaptive-<kind> fixes the kind, so one run can hold two)"""
    from specrepro.drafters.adaptive import AdaptiveLengthDrafter

    base = str(name).split("@", 1)[0]
    fixed = base.removeprefix("sd-draft-adaptive-") if base.startswith("sd-draft-adaptive-") else None
    kind = fixed or draft_kind_option(ctx.options)
    inner = cheap_drafter(ctx, kind)
    curve, t_draft = ctx.shared(f"auto_costs:{kind}:{gamma}", lambda: auto_gamma_costs(ctx, inner, gamma))
    drafter = AdaptiveLengthDrafter(inner, curve, t_draft, keep_calibration=True,
                                    name=f"{inner.name}, adaptive length <= {gamma}")
    run = _our_runner(ctx, drafter, gamma, predict=False)
    run.gamma = gamma
    run.cost_curve, run.t_draft_ms = curve, t_draft
    return run


@register_method("sd-hybrid-adaptive", needs_draft=True,
                 prepare=prepare_max_gamma("sd-hybrid-adaptive", ADAPTIVE_MAX_GAMMA))
def _sd_hybrid_adaptive(ctx, name, gamma):
    """our chain speculative decoding: prompt lookup where an n-gram (n >= hybrid_min_ngram, default 2) matches (at
    most lookup_gamma tokens, default 10), else the draft model with its block length <= @γ (default 20) chosen token
    by token as in sd-draft-adaptive (--opt draft_kind: fp32, int8, pruned, int8-pruned, int4, int4-pruned)"""
    from specrepro.bench.options import lookup_gamma_option
    from specrepro.drafters.adaptive import AdaptiveLengthDrafter
    from specrepro.drafters.lookup import HybridDrafter, PromptLookupDrafter

    base = str(name).split("@", 1)[0]
    fixed = base.removeprefix("sd-hybrid-adaptive-") if base.startswith("sd-hybrid-adaptive-") else None
    kind = fixed or draft_kind_option(ctx.options)
    inner = cheap_drafter(ctx, kind)
    curve, t_draft = ctx.shared(f"auto_costs:{kind}:{gamma}", lambda: auto_gamma_costs(ctx, inner, gamma))
    adaptive = AdaptiveLengthDrafter(inner, curve, t_draft, keep_calibration=True,
                                     name=f"{inner.name}, adaptive length <= {gamma}")
    lookup = PromptLookupDrafter(max_ngram=lookup_max_ngram_option(ctx.options),
                                 min_ngram=hybrid_min_ngram_option(ctx.options))
    run = _our_runner(ctx, HybridDrafter(lookup, adaptive, lookup_max_gamma=lookup_gamma_option(ctx.options)), gamma,
                      predict=False)
    run.gamma = gamma
    run.cost_curve, run.t_draft_ms = curve, t_draft
    return run


#: sd-draft-adaptive with the draft kind in its name instead of --opt draft_kind (e.g. sd-draft-adaptive-int8@20)
ADAPTIVE_KIND_METHODS = tuple(f"sd-draft-adaptive-{k}" for k in ("int8", "pruned", "int8-pruned", "int4",
                                                                  "int4-pruned"))
for _name in ADAPTIVE_KIND_METHODS:
    register_method(_name, needs_draft=True, prepare=prepare_max_gamma(_name, ADAPTIVE_MAX_GAMMA),
                    description=f"sd-draft-adaptive with the {_name.removeprefix('sd-draft-adaptive-')} draft, "
                                "whatever --opt draft_kind says")(_sd_draft_adaptive)
#: sd-hybrid-adaptive with the draft kind in its name (e.g. sd-hybrid-adaptive-int8@20): the name is the whole
#: configuration, as the bench records it (:func:`specrepro.bench.registry.canonical_method`)
HYBRID_ADAPTIVE_KIND_METHODS = tuple(f"sd-hybrid-adaptive-{k}" for k in ("int8", "pruned", "int8-pruned", "int4",
                                                                          "int4-pruned"))
for _name in HYBRID_ADAPTIVE_KIND_METHODS:
    register_method(_name, needs_draft=True, prepare=prepare_max_gamma(_name, ADAPTIVE_MAX_GAMMA),
                    description=f"sd-hybrid-adaptive with the {_name.removeprefix('sd-hybrid-adaptive-')} draft, "
                                "whatever --opt draft_kind says")(_sd_hybrid_adaptive)


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


@register_method("hf-assisted-int8", needs_draft=True, uses_gamma=False, family="transformers")
def _hf_assisted_int8(ctx, name, gamma):
    """transformers assisted generation with our int8 draft copy as assistant_model, HF's defaults (--opt int8_backend)"""
    return _hf_runner(ctx, hf_generation_config(ctx), assistant=_int8_draft(ctx))


@register_method("hf-assisted-int4", needs_draft=True, uses_gamma=False, family="transformers")
def _hf_assisted_int4(ctx, name, gamma):
    """transformers assisted generation with our 4-bit draft copy as assistant_model, HF's defaults (--opt
    int4_group_size)"""
    return _hf_runner(ctx, hf_generation_config(ctx), assistant=_int4_draft(ctx))


@register_method("hf-assisted-int8-gamma", needs_draft=True, family="transformers")
def _hf_assisted_int8_gamma(ctx, name, gamma):
    """transformers assisted generation with our int8 draft copy, exactly γ draft tokens per step (no confidence stop)"""
    return _hf_runner(ctx, hf_generation_config(ctx), assistant=_int8_draft(ctx),
                      assistant_config={"num_assistant_tokens": gamma, "num_assistant_tokens_schedule": "constant",
                                        "assistant_confidence_threshold": 0.0})


@register_method("hf-assisted-int8-pruned", needs_draft=True, uses_gamma=False, family="transformers")
def _hf_assisted_int8_pruned(ctx, name, gamma):
    """transformers assisted generation with our cheapest draft, the int8 copy with the int8 FR-Spec pruned head
    (draft_vocab tokens; full-width logits, the lowest value outside the kept set), HF's defaults"""
    from specrepro.drafters.compress import FullWidthHead, with_output_head

    kept = _kept_ids(ctx)
    rows = ctx.draft.get_output_embeddings().weight.shape[0]
    assistant = ctx.shared(f"hf_assistant_int8_pruned:{kept.numel()}:{int8_backend_option(ctx.options)}",
                           lambda: with_output_head(_int8_draft(ctx),
                                                    FullWidthHead(_int8_pruned_head(ctx, kept), kept, rows)))
    return _hf_runner(ctx, hf_generation_config(ctx), assistant=assistant)


@register_method("hf-lookup", family="transformers")
def _hf_lookup(ctx, name, gamma):
    """transformers prompt lookup decoding, generate(prompt_lookup_num_tokens=γ, max_matching_ngram_size=3)"""
    return _hf_runner(ctx, hf_generation_config(
        ctx, prompt_lookup_num_tokens=gamma,
        max_matching_ngram_size=lookup_max_ngram_option(ctx.options)))


# ---------------------------------------------------------------------------------------------------------------
# Token-tree and Medusa methods
# ---------------------------------------------------------------------------------------------------------------
def _check_tree_attention(ctx_model, name: str, which: str) -> None:
    from specrepro.core.tree_attention import check_tree_attention

    try:
        check_tree_attention(ctx_model)
    except ValueError as exc:
        raise BenchOptionError(f"method {name!r} needs tree attention in the {which} model: {exc}") from None


def _tree_runner(ctx: BenchContext, proposer, loop: Callable):
    """A runner around ``loop(ids, proposer, generator) -> GenerationResult`` (tree and Medusa decoding record the
    verified tree's depth per step themselves, ``GenerationResult.depths``)."""

    def run(ids, generator):
        return loop(ids, proposer, generator)

    return run


def _prepare_sd_tree(at, gamma, options):
    tree_mode_option(options)
    spec = at or options.get("tree")
    return len(parse_tree_spec(spec)) if spec else int(gamma)


@register_method("sd-tree", needs_draft=True, prepare=_prepare_sd_tree)
def _sd_tree(ctx, name, gamma):
    """our token-tree speculative decoding, SpecInfer expansion tree from the draft model (sd-tree@2x2x1x1 or --tree)"""
    return _draft_tree_runner(ctx, name, gamma, ctx.draft, "draft")


def _draft_tree_runner(ctx: BenchContext, name: str, gamma: int, model, which: str, verify=None, mode=None):
    """The runner of an expansion tree (``name@K1xK2x...``, --tree, or ⟨2,1,...,1⟩ of depth ``gamma``) drafted by
    ``model`` and verified by the target with tree attention (SpecInfer); ``which`` names the model in errors;
    ``verify`` replaces multi-step speculative sampling (a rule of :mod:`specrepro.core.verifiers`), ``mode`` the
    children's sampling mode (default: --opt tree_mode; top-k under greedy)."""
    from specrepro.core.trees import DraftTreeProposer, tree_generate

    at = name.partition("@")[2] or ctx.options.get("tree")
    widths = parse_tree_spec(at) if at else default_expansion(gamma)
    _check_tree_attention(ctx.target, name, "target")
    _check_tree_attention(model, name, which)
    mode = "topk" if ctx.sampling.greedy else (mode or tree_mode_option(ctx.options))
    proposer = DraftTreeProposer(model, list(widths), mode, ctx.vocab_size)
    verify = None if ctx.sampling.greedy else verify  # greedy: the target's argmax path, whatever the rule

    def loop(ids, prop, generator):
        return tree_generate(ctx.target, ids, prop, max_new_tokens=ctx.max_new_tokens, sampling=ctx.sampling,
                             generator=generator, eos_token_id=ctx.eos_token_id, verify=verify)

    run = _tree_runner(ctx, proposer, loop)
    run.gamma = len(widths)
    return run


@register_method("sd-tree-int8", needs_draft=True, prepare=_prepare_sd_tree)
def _sd_tree_int8(ctx, name, gamma):
    """our token-tree speculative decoding with the int8 copy of the draft (as sd-draft-int8) expanding the tree
    (sd-tree-int8@2x1x1x1 or --tree); the tree's q come from the int8 logits, so multi-step speculative sampling
    stays exact"""
    return _draft_tree_runner(ctx, name, gamma, _int8_draft(ctx), "int8 draft")


@register_method("sd-tree-int8-traversal", needs_draft=True, prepare=_prepare_sd_tree)
def _sd_tree_int8_traversal(ctx, name, gamma):
    """sd-tree-int8's trees verified by traversal verification (Weng et al. 2025, arXiv:2505.12398: leaf to root,
    sequence-level acceptance; on a tree of K unmerged paths, ⟨K,1,...,1⟩, multi-path block verification); exact"""
    from specrepro.core.verifiers import verify_tree_traversal

    return _draft_tree_runner(ctx, name, gamma, _int8_draft(ctx), "int8 draft", verify=verify_tree_traversal)


@register_method("sd-tree-int8-spectr", needs_draft=True, prepare=_prepare_sd_tree)
def _sd_tree_int8_spectr(ctx, name, gamma):
    """sd-tree-int8's trees with i.i.d. children (whatever --opt tree_mode says) verified by SpecTr's K-SEQ draft
    selection (Sun et al. 2023, arXiv:2310.15141); exact"""
    from specrepro.core.verifiers import verify_tree_spectr

    return _draft_tree_runner(ctx, name, gamma, _int8_draft(ctx), "int8 draft", verify=verify_tree_spectr,
                              mode="iid")


def _prepare_sd_tree_paths(at, gamma, options):
    """:func:`_prepare_sd_tree` for rules that verify K unbranched paths: the tree must be ⟨K,1,...,1⟩."""
    spec = at or options.get("tree")
    widths = parse_tree_spec(spec) if spec else default_expansion(gamma)
    if any(w != 1 for w in widths[1:]):
        raise BenchOptionError(f"tree {spec!r}: GBV verifies K i.i.d. unbranched paths, a tree <K,1,...,1> "
                               f"(e.g. 3x1x1x1), not {'x'.join(map(str, widths))}")
    return len(widths)


@register_method("sd-tree-int8-gbv", needs_draft=True, prepare=_prepare_sd_tree_paths)
def _sd_tree_int8_gbv(ctx, name, gamma):
    """sd-tree-int8's trees of K unmerged i.i.d. paths, ⟨K,1,...,1⟩ (children i.i.d. whatever --opt tree_mode says),
    verified by greedy multi-path block verification (Thomas & Pal 2026, arXiv:2602.16961: the best path under a
    p/q order, block-verified against the law of that pick); exact"""
    from specrepro.core.verifiers import verify_tree_gbv

    return _draft_tree_runner(ctx, name, gamma, _int8_draft(ctx), "int8 draft", verify=verify_tree_gbv, mode="iid")


@register_method("sd-draft-int8-block", needs_draft=True)
def _sd_draft_int8_block(ctx, name, gamma):
    """sd-draft-int8's chains verified by block verification (Sun et al. 2025, arXiv:2403.10444); exact"""
    from specrepro.core.decoding import generate

    drafter = cheap_drafter(ctx, "int8")

    def run(ids, generator):
        return generate(ctx.target, ids, drafter=drafter, gamma=gamma, max_new_tokens=ctx.max_new_tokens,
                        sampling=ctx.sampling, generator=generator, eos_token_id=ctx.eos_token_id,
                        verification="block")

    return run


@register_method("sd-tree-merge", needs_draft=True)
def _sd_tree_merge(ctx, name, gamma):
    """our merge-based token tree (SpecInfer): γ-token chains of draft model, prompt lookup and bigram merged"""
    from specrepro.core.trees import MergedTreeProposer, tree_generate
    from specrepro.drafters.lookup import PromptLookupDrafter
    from specrepro.drafters.model import DraftModelDrafter

    _check_tree_attention(ctx.target, name, "target")
    drafters = [DraftModelDrafter(ctx.draft, ctx.vocab_size),
                PromptLookupDrafter(max_ngram=lookup_max_ngram_option(ctx.options)), _bigram_drafter(ctx)]
    proposer = MergedTreeProposer(drafters, gamma, ctx.vocab_size, name="draft + lookup + bigram")

    def loop(ids, prop, generator):
        return tree_generate(ctx.target, ids, prop, max_new_tokens=ctx.max_new_tokens, sampling=ctx.sampling,
                             generator=generator, eos_token_id=ctx.eos_token_id)

    return _tree_runner(ctx, proposer, loop)


_HOW_TO_TRAIN_HEADS = (
    "train heads with notebook 06 (notebooks/06_medusa.ipynb, which caches them) or in Python: "
    "data = specrepro.train.medusa1.self_distillation_data(model, tokenizer, prompts); "
    "heads, _, _ = specrepro.train.medusa1.get_or_train_heads(model, data)  (cached under <cache>/medusa/heads/<key>/) "
    "or heads.save(DIR); then pass --medusa-heads DIR, or --medusa-heads auto for the newest cached heads of the "
    "target, or --medusa-heads stdlib to train (once, then cached) heads on the Python standard library's sources "
    "with specrepro.train.stdlib.get_or_train_stdlib_heads")


def _heads_cache_root() -> Path:
    from specrepro.models import cache_dir

    return cache_dir() / "medusa" / "heads"


def _read_heads_config(directory) -> dict:
    """config.json of saved Medusa heads. Raises BenchOptionError: missing files or not Medusa heads."""
    d = Path(directory).expanduser()
    if not (d / "config.json").is_file() or not (d / "heads.safetensors").is_file():
        raise BenchOptionError(f"--medusa-heads {directory}: no Medusa heads there (expected config.json and "
                               f"heads.safetensors written by MedusaHeads.save); {_HOW_TO_TRAIN_HEADS}")
    try:
        cfg = json.loads((d / "config.json").read_text())
    except json.JSONDecodeError as exc:
        raise BenchOptionError(f"--medusa-heads {directory}: unreadable config.json ({exc})") from None
    if cfg.get("kind") != "medusa_heads" or int(cfg.get("n_heads", 0)) < 1:
        raise BenchOptionError(f"--medusa-heads {directory}: config.json does not describe Medusa heads "
                               f"(kind {cfg.get('kind')!r})")
    return cfg


def _medusa_choices(at: str | None, n_heads: int, accuracies=None):
    """The static tree for K = ``n_heads`` heads. With the heads' own measured top-i accuracies (``accuracies``,
    [K][I], from the accuracy.csv that :func:`~specrepro.train.stdlib.get_or_train_stdlib_heads` saves beside them):
    Medusa's accuracy-driven sparse tree of N (default 16) nodes on them. Without: :data:`~specrepro.core.medusa.
    DEFAULT_CHOICES` when it fits (depth <= K) and no ``@N`` is given, else the sparse tree of N nodes on the prior
    :data:`~specrepro.core.medusa.PRIOR_HEAD_ACCURACY`, restricted to the first K heads."""
    from specrepro.core.medusa import (
        DEFAULT_CHOICES,
        PRIOR_HEAD_ACCURACY,
        sparse_tree_from_accuracies,
)

    n_nodes = int(at) if at else 16
    if accuracies is not None:
        return sparse_tree_from_accuracies(accuracies, n_nodes)
    if not at and max(len(c) for c in DEFAULT_CHOICES) <= n_heads:
        return DEFAULT_CHOICES
    return sparse_tree_from_accuracies(PRIOR_HEAD_ACCURACY[:min(n_heads, len(PRIOR_HEAD_ACCURACY))], n_nodes)


def _heads_accuracies(directory) -> list | None:
    """The measured cumulative top-i accuracies [K][I] saved beside heads (accuracy.csv), or None."""
    f = Path(directory) / "accuracy.csv"
    if not f.is_file():
        return None
    import pandas as pd

    acc = pd.read_csv(f).sort_values("head")
    return acc[[c for c in acc.columns if c.startswith("top")]].values.tolist()


def _prepare_medusa(at, gamma, options):
    if at is not None and (not at.isdigit() or not 1 <= int(at) <= MAX_TREE_NODES):
        raise BenchOptionError(f"medusa@{at}: the text after '@' is the number of tree nodes N, an integer in "
                               f"1..{MAX_TREE_NODES} (Medusa's sparse tree of N nodes)")
    tree_mode_option(options)
    typical_thresholds_option(options)
    heads = options.get("medusa_heads")
    if not heads:
        raise BenchOptionError(f"the medusa methods need trained Medusa heads for the target: pass --medusa-heads "
                               f"DIR or --medusa-heads auto; {_HOW_TO_TRAIN_HEADS}")
    if str(heads) == "stdlib":
        k = 4
    elif str(heads) == "auto":
        root = _heads_cache_root()
        if not any(root.glob("*/config.json")):
            raise BenchOptionError(f"--medusa-heads auto: no cached Medusa heads under {root}; "
                                   f"{_HOW_TO_TRAIN_HEADS}")
        k = 4
    else:
        k = int(_read_heads_config(heads)["n_heads"])
    return max(len(c) for c in _medusa_choices(at, k))


def _load_medusa_heads(ctx: BenchContext):
    """The heads named by ``ctx.options['medusa_heads']`` for ``ctx.target`` (loaded once per benchmark).

    Raises:
        BenchOptionError: no heads there, heads trained for another base model (HeadMismatchError), or 'auto' and
            no cached heads match the target's fingerprint.
    """
    from specrepro.core.medusa_heads import (
        HeadMismatchError,
        MedusaHeads,
        base_fingerprint,
)

    where = str(ctx.options.get("medusa_heads"))

    def load():
        if where == "stdlib":
            from specrepro.train.stdlib import get_or_train_stdlib_heads

            return get_or_train_stdlib_heads(ctx.target, ctx.tokenizer)["heads"]
        if where == "auto":
            fp = base_fingerprint(ctx.target)
            root = _heads_cache_root()
            found = []
            for cfg_path in root.glob("*/config.json"):
                try:
                    cfg = json.loads(cfg_path.read_text())
                except (OSError, json.JSONDecodeError):
                    continue
                if cfg.get("kind") == "medusa_heads" and cfg.get("base_fingerprint") == fp and \
                        (cfg_path.parent / "heads.safetensors").is_file():
                    found.append(cfg_path.parent)
            if not found:
                raise BenchOptionError(f"--medusa-heads auto: none of the heads cached under {root} was trained for "
                                       f"this target (fingerprint {fp}); {_HOW_TO_TRAIN_HEADS}")
            directory = max(found, key=lambda d: (d / "heads.safetensors").stat().st_mtime)
        else:
            _read_heads_config(where)
            directory = Path(where).expanduser()
        try:
            return MedusaHeads.load(directory, ctx.target)
        except (HeadMismatchError, FileNotFoundError) as exc:
            raise BenchOptionError(f"--medusa-heads {where}: {exc}") from None

    return ctx.shared(f"medusa_heads:{where}", load)


def _medusa_factory(ctx, name, acceptance_under_sampling: str, proposal_under_sampling: str | None):
    from specrepro.core.medusa import MedusaProposer, medusa_generate

    _check_tree_attention(ctx.target, name, "target")
    heads = _load_medusa_heads(ctx)
    choices = _medusa_choices(name.partition("@")[2] or None, heads.n_heads,
                              _heads_accuracies(heads.source_dir) if getattr(heads, "source_dir", None) else None)
    greedy = ctx.sampling.greedy
    # typical acceptance at temperature 0 accepts only the argmax: it is greedy acceptance (Medusa Sec. 3.3.1)
    acceptance = "typical" if acceptance_under_sampling == "typical" else ("greedy" if greedy else "mss")
    mode = "topk" if greedy else (proposal_under_sampling or tree_mode_option(ctx.options))
    proposer = MedusaProposer(heads, choices, mode)
    eps, delta = typical_thresholds_option(ctx.options)

    def loop(ids, prop, generator):
        return medusa_generate(ctx.target, ids, prop, acceptance=acceptance, max_new_tokens=ctx.max_new_tokens,
                               sampling=ctx.sampling, generator=generator, eos_token_id=ctx.eos_token_id,
                               epsilon=eps, delta=delta)

    run = _tree_runner(ctx, proposer, loop)
    run.gamma = max(len(c) for c in choices)
    return run


@register_method("medusa", prepare=_prepare_medusa)
def _medusa(ctx, name, gamma):
    """Medusa-1 heads, static sparse tree (medusa@N nodes); greedy acceptance, or exact MSS with sampled children"""
    return _medusa_factory(ctx, name, "mss", None)


@register_method("medusa-typical", prepare=_prepare_medusa, exact=False)
def _medusa_typical(ctx, name, gamma):
    """Medusa-1 heads with Medusa's typical acceptance: NOT distribution-preserving under sampling (top-k tree)"""
    return _medusa_factory(ctx, name, "typical", "topk")
