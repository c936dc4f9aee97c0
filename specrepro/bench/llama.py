"""Benchmark methods on llama.cpp's kernels: the target's and the draft's forwards run by llama.cpp, the decoding loop,
the drafters and the verifiers ours.

What this file is: the llama.cpp methods, each of which names its whole configuration (all exact: every emitted
token follows the target's processed distribution, Leviathan et al. 2023, Thm. 3.5; under greedy decoding every one
equals ``llama-ar``'s tokens). All run :func:`specrepro.core.decoding.generate`, the one chain decoding loop, with the
target :class:`specrepro.backends.llamacpp.LlamaCppLM`:

* ``llama-ar`` — autoregressive decoding of the target's GGUF file as shipped (quantized weights, llama.cpp's own
  kernels), without a drafter, one token per ``llama_decode`` call. The next token is the argmax of
  llama.cpp's logits under greedy decoding (llama.cpp's own greedy tokens: tests/test_llamacpp.py checks them against
  llama-cpp-python's ``Llama.generate`` at temperature 0), else a draw by our sampler
  (:func:`specrepro.core.sampling.logits_to_probs`, temperature / top-k / top-p) from the harness's
  ``torch.Generator`` of the (pass, prompt), as every other method draws.
* ``llama-sd@G`` — chain speculative sampling (Leviathan et al. 2023, Alg. 1; token verification,
  :func:`specrepro.core.sampling.verify_chain`) with γ = G, the draft's GGUF file proposing one ``llama_decode`` per
  token and the target verifying the block in one ``llama_decode`` (:func:`specrepro.core.blocklm.chain_generate`).
* ``llama-sd-block@G`` — the same with block verification (Sun et al. 2025, :func:`specrepro.core.sampling.verify_block`).
* ``llama-sd-adaptive@G`` — ``llama-sd`` with the block length chosen token by token, at most G (default
  :data:`ADAPTIVE_MAX_GAMMA`, 20): :class:`~specrepro.drafters.adaptive.AdaptiveLengthDrafter` over
  :class:`~specrepro.drafters.model.BlockLMDrafter` of the draft's GGUF file, the draft stopping where its calibrated
  confidence no longer pays for another token under the costs of these llama.cpp models (the target's t(n),
  n = 1..G+1, and the draft's time per token: :func:`specrepro.measure.cost.measure_chain_costs` on the llama.cpp
  target and draft, once per bench before any timed run), calibration carried over the bench's prompts in their fixed
  order; token verification (Leviathan Alg. 1). The PyTorch counterpart is ``sd-draft-adaptive``.
* ``llama-lookup@G`` — prompt lookup decoding (Saxena 2023: copy up to G tokens that followed the most recent earlier
  occurrence of the context's last n-gram, n = ``lookup_max_ngram`` (default 3) down to 1,
  :class:`~specrepro.drafters.lookup.PromptLookupDrafter`), no draft model: point-mass drafts that cost no forward
  pass, verified by the target in one ``llama_decode`` with Leviathan's rule (a copied token x is kept with
  probability p(x)). The PyTorch counterpart is ``sd-lookup``.
* ``llama-hybrid-adaptive@G`` — prompt lookup where an n-gram of n >= ``hybrid_min_ngram`` (default 2) matches (at
  most ``lookup_gamma`` tokens, default 10), else the adaptive llama.cpp draft of ``llama-sd-adaptive@G``
  (:class:`~specrepro.drafters.lookup.HybridDrafter`; the same costs); token verification. The PyTorch counterpart
  is ``sd-hybrid-adaptive``.

The GGUF files are the zoo's (:func:`specrepro.models.fetch_gguf`) of the bench's target and draft names (or, for a
name that is a path to a ``.gguf`` file, that file), opened once per bench run with ``n_threads`` =
``torch.get_num_threads()`` at build time, llama.cpp's default attention (flash attention "auto") and a float16 KV
cache of 4096 tokens at most; the methods take the bench's prompts as token ids (same tokenizer, chat template,
token budget, stop ids, seeds and interleaving as every other method). Which llama.cpp build ran, ``OMP_WAIT_POLICY``
and those settings go to the bench JSON's ``config["llamacpp"]``.

Threads: llama.cpp and torch share one OpenMP runtime in the bench's process (llama.cpp's libggml-cpu needs
``libgomp.so.1``, which resolves to the copy torch loaded first), so ``OMP_WAIT_POLICY`` reaches every method of a run,
ours included; the JSON records it. :class:`~specrepro.backends.llamacpp.LlamaCppLM` explains why it may be set to
PASSIVE (workers that spin while other threads need the cores). With the same thread count on both sides, on this
project's 2-core machine while another process took part of the CPU (2026-11-29, 150-token prefix, medians of 10-13
one-token forwards, two alternations per setting): PASSIVE made llama.cpp's 1.5B token 69-83 ms instead of 43-87 ms
and our float32 0.5B forward 189-197 ms instead of 120-254 ms; a setting for a run of record is best chosen by such
an A/B on the quiet machine.

What it is not: llama.cpp's own speculative example (``llama-speculative``), or its sampler chain.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specrepro.bench.options import (
    BenchOptionError,
    hybrid_min_ngram_option,
    lookup_gamma_option,
    lookup_max_ngram_option,
    target_format_option,
)
from specrepro.bench.methods import ADAPTIVE_MAX_GAMMA, prepare_max_gamma
from specrepro.bench.registry import BenchContext, register_method
from specrepro.models import sha256_file

__all__ = ["LLAMA_N_CTX", "ADAPTIVE_MAX_GAMMA", "COST_PREFIX_LEN", "gguf_path", "role_gguf", "llama_model",
           "llama_chain_costs", "FORMAT_OPTION"]

#: KV cache length (tokens) of the llama.cpp contexts the methods open, at most (less where the model was trained on
#: less); a HumanEval prompt plus its new tokens fits with room to spare.
LLAMA_N_CTX = 4096
#: the cached prefix (tokens) the adaptive methods' costs are timed after, as :func:`specrepro.bench.methods.
#: auto_gamma_costs` times the PyTorch models (less where a context is shorter)
COST_PREFIX_LEN = 200


def gguf_path(name: str | None) -> Path:
    """The GGUF file of a model named to the bench: the zoo's assembled file for a zoo name (fetched on first use), or
    ``name`` itself when it is a path to a ``.gguf`` file.

    Raises:
        BenchOptionError: no name, or a name that is neither a zoo model nor a GGUF file.
    """
    from specrepro.models import ZOO, fetch_gguf

    if name is not None and name in ZOO:
        return fetch_gguf(name)
    if name is not None and str(name).endswith(".gguf") and Path(name).is_file():
        return Path(name)
    raise BenchOptionError(f"the llama.cpp methods run the zoo's GGUF files ({', '.join(ZOO)}) or a .gguf path; "
                           f"got model {name!r}")



#: the ``--opt`` key every llama.cpp method reads: the weight format of the target's GGUF file
#: (:data:`specrepro.bench.formats.FORMATS`; default the shipped Q4_K_M mix). The draft keeps its shipped file.
FORMAT_OPTION = "target_format"


def role_gguf(ctx: BenchContext, role: str) -> Path:
    """The GGUF file the llama.cpp methods run for ``role`` ('target' or 'draft'): :func:`gguf_path` of the bench's
    model, except that a zoo target in another weight format (``--opt target_format=F16``) is the shipped file
    re-encoded by llama.cpp's quantizer (:func:`specrepro.bench.formats.format_gguf`, a cache entry).

    Raises:
        BenchOptionError: as :func:`gguf_path`, or an unknown format.
    """
    from specrepro.models import ZOO

    name = ctx.target_name if role == "target" else ctx.draft_name
    fmt = target_format_option(ctx.options) if role == "target" else "Q4_K_M"
    if fmt == "Q4_K_M":
        return gguf_path(name)
    if name not in ZOO:
        raise BenchOptionError(f"--opt {FORMAT_OPTION}={fmt} re-encodes a zoo model's file; the target is {name!r}")
    from specrepro.bench.formats import format_gguf

    return format_gguf(name, fmt)


def llama_model(ctx: BenchContext, role: str):
    """The :class:`~specrepro.backends.llamacpp.LlamaCppLM` of ``role`` ('target' or 'draft'), opened once per bench
    (``ctx.shared``; a model drafting for itself gets a second context, its own cache), and the bench's
    ``config_notes["llamacpp"]`` filled in.

    Raises:
        BenchOptionError: llama_cpp does not import, a model that is neither a zoo name nor a GGUF file, or a GGUF
            vocabulary of another size than the bench's target.
    """
    from specrepro.backends.llamacpp import LlamaCppLM, llama_cpp_available, llama_cpp_build

    ok, why = llama_cpp_available()
    if not ok:
        raise BenchOptionError(f"the llama.cpp methods need llama_cpp ({why}); install it with the command in "
                               f"requirements-llamacpp.txt")
    name = ctx.target_name if role == "target" else ctx.draft_name
    path = role_gguf(ctx, role)
    threads = torch.get_num_threads()

    def build():
        lm = LlamaCppLM(path, n_ctx=LLAMA_N_CTX, n_threads=threads)
        note = ctx.config_notes.setdefault("llamacpp", {
            **llama_cpp_build(), "n_threads": threads, "n_threads_from": "torch.get_num_threads()",
            "n_ctx": lm.n_ctx, "flash_attn": "llama.cpp default (auto)", "kv_cache_type": "f16",
            "loop": "specrepro.core.decoding.generate over specrepro.backends.llamacpp.LlamaCppLM "
                    "(llama-ar: one token per llama_decode; drafts: specrepro.drafters.model.BlockLMDrafter of the "
                    "draft's GGUF file, prompt lookup)"})
        note[f"{role}_gguf"] = {"model": name, "file": path.name, "sha256": sha256_file(path),
                                "vocab_size": lm.vocab_size}
        return lm

    lm = ctx.shared(f"llamacpp:{role}", build)
    if lm.vocab_size != ctx.vocab_size:
        raise BenchOptionError(f"the {role}'s GGUF file {path.name} has {lm.vocab_size} tokens, the bench's target "
                               f"{ctx.vocab_size}: its token ids would mean other strings")
    return lm


#: the former name of :func:`llama_model`
_model = llama_model


def _runner(ctx: BenchContext, gamma: int, verification: str | None):
    """``runner(ids, generator)`` of :func:`~specrepro.core.blocklm.chain_generate` on the llama.cpp target, with the
    llama.cpp draft at ``gamma`` (``verification`` 'token' or 'block'), or autoregressive (``verification`` None)."""
    from specrepro.core.blocklm import chain_generate

    target = llama_model(ctx, "target")
    draft = llama_model(ctx, "draft") if verification is not None else None

    def run(ids, generator):
        return chain_generate(target, ids.cpu(), draft=draft, gamma=gamma, max_new_tokens=ctx.max_new_tokens,
                              sampling=ctx.sampling, generator=generator, eos_token_id=ctx.eos_token_id,
                              verification=verification or "token")

    return run


@register_method("llama-ar", uses_gamma=False, family="llama.cpp", options=(FORMAT_OPTION,),
                 description="AR decoding of the target's GGUF file as shipped on llama.cpp (one token per "
                             "llama_decode; argmax = llama.cpp's greedy, else our sampler with the bench's generator)")
def _llama_ar(ctx, name, gamma):
    """llama-ar's runner: :func:`~specrepro.core.blocklm.chain_generate` without a draft on the llama.cpp target."""
    return _runner(ctx, 1, None)


@register_method("llama-sd", needs_draft=True, family="llama.cpp", options=(FORMAT_OPTION,),
                 description="our chain speculative sampling (Leviathan Alg. 1, token verification) with the target's "
                             "and the draft's GGUF forwards on llama.cpp")
def _llama_sd(ctx, name, gamma):
    """llama-sd's runner: :func:`~specrepro.core.blocklm.chain_generate`, llama.cpp target and draft, γ = ``gamma``."""
    return _runner(ctx, gamma, "token")


@register_method("llama-sd-block", needs_draft=True, family="llama.cpp", options=(FORMAT_OPTION,),
                 description="llama-sd with block verification (Sun et al. 2025); exact")
def _llama_sd_block(ctx, name, gamma):
    """llama-sd-block's runner: as llama-sd's, ``verification="block"``."""
    return _runner(ctx, gamma, "block")


# ---------------------------------------------------------------------------------------------------------------
# Our drafters on llama.cpp: adaptive block lengths, prompt lookup, and their hybrid
# ---------------------------------------------------------------------------------------------------------------
def llama_chain_costs(ctx: BenchContext, max_gamma: int, prefix_len: int = COST_PREFIX_LEN, repeats: int = 3,
                      rounds: int = 3):
    """The fixed costs the adaptive llama.cpp methods choose their block lengths from, measured once per bench and
    ``max_gamma`` (``ctx.shared``) before any timed run, as :func:`specrepro.bench.methods.auto_gamma_costs` measures
    the PyTorch models': :func:`~specrepro.measure.cost.measure_chain_costs` of the llama.cpp target (``forward_block``
    of n = 1..max_gamma+1 tokens after a ``prefix_len``-token prefix, random ids from a generator seeded with
    ``ctx.seed``) and of a :class:`~specrepro.drafters.model.BlockLMDrafter` of the llama.cpp draft (its time per
    drafted token under the run's sampling, along the prompts' tokens ``ctx.cost_text``); warmed-up passes, the
    median of ``rounds``. The prefix is shortened where a model's context (``n_ctx``) has no room for it.

    Returns:
        ``(CostCurve, t_draft_ms)``, ms.
    """
    from specrepro.drafters.model import BlockLMDrafter
    from specrepro.measure.cost import measure_chain_costs

    target, draft = llama_model(ctx, "target"), llama_model(ctx, "draft")

    def build():
        room = min(int(getattr(m, "n_ctx", LLAMA_N_CTX)) for m in (target, draft)) - (int(max_gamma) + 1) - 16
        curve, t_draft = measure_chain_costs(target, {"draft": BlockLMDrafter(draft, name="llama.cpp draft")},
                                             ns=range(1, int(max_gamma) + 2), vocab=ctx.vocab_size,
                                             prefix_len=max(1, min(int(prefix_len), room)), repeats=repeats,
                                             rounds=rounds, generator=torch.Generator().manual_seed(int(ctx.seed)),
                                             sampling=ctx.sampling, text=ctx.cost_text)
        return curve, t_draft["draft"]

    return ctx.shared(f"llama_costs:{int(max_gamma)}", build)


def _generate_runner(ctx: BenchContext, drafter, gamma: int):
    """``runner(ids, generator)`` of :func:`specrepro.core.decoding.generate` on the llama.cpp target with ``drafter``
    (token verification) at the largest draft length ``gamma``; ``run.gamma`` reports it."""
    from specrepro.core.decoding import generate

    target = llama_model(ctx, "target")

    def run(ids, generator):
        return generate(target, ids.cpu(), drafter=drafter, gamma=gamma, max_new_tokens=ctx.max_new_tokens,
                        sampling=ctx.sampling, generator=generator, eos_token_id=ctx.eos_token_id)

    run.gamma = int(gamma)
    return run


def _adaptive_drafter(ctx: BenchContext, gamma: int):
    """The adaptive llama.cpp draft of ``llama-sd-adaptive@gamma`` (a fresh drafter over the shared draft model) and
    its costs."""
    from specrepro.drafters.adaptive import AdaptiveLengthDrafter
    from specrepro.drafters.model import BlockLMDrafter

    curve, t_draft = llama_chain_costs(ctx, gamma)
    inner = BlockLMDrafter(llama_model(ctx, "draft"), name="llama.cpp draft")
    drafter = AdaptiveLengthDrafter(inner, curve, t_draft, keep_calibration=True,
                                    name=f"{inner.name}, adaptive length <= {gamma}")
    return drafter, curve, t_draft


@register_method("llama-sd-adaptive", needs_draft=True, family="llama.cpp", options=(FORMAT_OPTION,),
                 prepare=prepare_max_gamma("llama-sd-adaptive", ADAPTIVE_MAX_GAMMA, check=None),
                 description="llama-sd with the block length <= @G (default 20) chosen token by token from the "
                             "llama.cpp draft's calibrated confidence and the llama.cpp models' measured costs "
                             "(AdaptiveLengthDrafter over BlockLMDrafter; token verification, Leviathan Alg. 1); exact")
def _llama_sd_adaptive(ctx, name, gamma):
    """llama-sd-adaptive's runner: :func:`~specrepro.core.decoding.generate` on the llama.cpp target with
    :class:`~specrepro.drafters.adaptive.AdaptiveLengthDrafter` over the llama.cpp draft, block length <= ``gamma``;
    ``run.cost_curve`` / ``run.t_draft_ms`` are the costs its choices were made from."""
    drafter, curve, t_draft = _adaptive_drafter(ctx, gamma)
    run = _generate_runner(ctx, drafter, gamma)
    run.cost_curve, run.t_draft_ms = curve, t_draft
    return run


@register_method("llama-lookup", family="llama.cpp", options=("lookup_max_ngram", FORMAT_OPTION),
                 description="prompt lookup on the llama.cpp target (copy up to γ tokens after the last earlier "
                             "match of the context's final n-gram, n = 3..1; point masses, no draft model), "
                             "Leviathan Alg. 1 verification; exact")
def _llama_lookup(ctx, name, gamma):
    """llama-lookup's runner: :func:`~specrepro.core.decoding.generate` on the llama.cpp target with
    :class:`~specrepro.drafters.lookup.PromptLookupDrafter` (n-grams of ``lookup_max_ngram`` (default 3) down to 1),
    γ = ``gamma``."""
    from specrepro.drafters.lookup import PromptLookupDrafter

    return _generate_runner(ctx, PromptLookupDrafter(max_ngram=lookup_max_ngram_option(ctx.options)), gamma)


@register_method("llama-hybrid-adaptive", needs_draft=True, family="llama.cpp",
                 prepare=prepare_max_gamma("llama-hybrid-adaptive", ADAPTIVE_MAX_GAMMA, check=None),
                 options=("lookup_max_ngram", "hybrid_min_ngram", "lookup_gamma", FORMAT_OPTION),
                 description="prompt lookup where an n-gram (n >= 2) matches (<= 10 tokens), else the adaptive "
                             "llama.cpp draft of llama-sd-adaptive@G (HybridDrafter; token verification); exact")
def _llama_hybrid_adaptive(ctx, name, gamma):
    """llama-hybrid-adaptive's runner: :func:`~specrepro.core.decoding.generate` on the llama.cpp target with
    :class:`~specrepro.drafters.lookup.HybridDrafter` (prompt lookup, n >= ``hybrid_min_ngram``, at most
    ``lookup_gamma`` copied tokens; else the adaptive llama.cpp draft of ``llama-sd-adaptive``), block length <=
    ``gamma``."""
    from specrepro.drafters.lookup import HybridDrafter, PromptLookupDrafter

    adaptive, curve, t_draft = _adaptive_drafter(ctx, gamma)
    lookup = PromptLookupDrafter(max_ngram=lookup_max_ngram_option(ctx.options),
                                 min_ngram=hybrid_min_ngram_option(ctx.options))
    drafter = HybridDrafter(lookup, adaptive, lookup_max_gamma=lookup_gamma_option(ctx.options))
    run = _generate_runner(ctx, drafter, gamma)
    run.cost_curve, run.t_draft_ms = curve, t_draft
    return run
