"""The method registry of the benchmark, the context a method's factory receives, and option validation.

What this file is: :class:`MethodSpec`, :data:`REGISTRY`, :func:`register_method` (how any module adds a method),
plugin loading, :func:`resolve_method` (``name``, ``name@γ``, ``name@spec``), :class:`BenchContext`, and
:func:`validate_options` (every option checked before a model is loaded).

What it is not: the built-in methods (:mod:`specrepro.bench.methods`), the run (:mod:`specrepro.bench.run`) or
the timing loop (:mod:`specrepro.measure.harness`).
"""

from __future__ import annotations

import fnmatch
import importlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from specrepro.bench.options import (
    BenchOptionError,
    check_typical_option,
    draft_kind_option,
    draft_stop_option,
    draft_vocab_option,
    hybrid_min_ngram_option,
    int4_group_size_option,
    int8_backend_option,
    lookup_gamma_option,
    lookup_max_ngram_option,
    tree_mode_option,
    target_format_option,
)
from specrepro.core.sampling import SamplingConfig

#: Methods run when none are named (draft-model methods are dropped when no draft is given).
DEFAULT_METHODS = ("ar", "sd-draft", "sd-lookup", "sd-bigram", "hf-ar", "hf-assisted", "hf-lookup")
#: Modules imported on first use of the registry; they may call :func:`register_method` at import time (the
#: built-in methods of :mod:`specrepro.bench.methods` are registered when the package is imported).
PLUGIN_MODULES: list[str] = []
#: module name -> "ExceptionType: message" for plugin modules that failed to import (missing modules are skipped).
PLUGIN_ERRORS: dict[str, str] = {}
_PLUGINS_LOADED: set[str] = set()


# ---------------------------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class MethodSpec:
    """A registered method.

    Attributes:
        name: the registry key (a trailing ``*`` makes it a family matched by prefix).
        factory: ``factory(ctx: BenchContext, name: str, gamma: int) -> runner``; called once per benchmark, after
            the models are loaded; ``runner(ids: LongTensor [L] on ctx.device, generator: torch.Generator) ->
            GenerationResult | RunOutput`` decodes one prompt (``ctx.max_new_tokens``, ``ctx.sampling``,
            ``ctx.eos_token_id``). A runner may carry an int attribute ``gamma``, which then replaces the reported γ
            (e.g. a tree depth known only once heads are loaded). The factory may raise :class:`BenchOptionError`.
        needs_draft: the factory uses ``ctx.draft`` (a draft model).
        uses_gamma: γ means something to this method (reported in the table; ``@γ`` allowed). For tree methods γ
            is the tree depth.
        family: who implements the decoding loop: 'specrepro' or 'transformers'.
        description: one line for ``--list-methods``.
        exact: the method's output follows the target's distribution (is distribution-preserving) under sampling;
            False e.g. for Medusa's typical acceptance. Shown in the table.
        prepare: optional ``prepare(at: str | None, gamma: int, options: dict) -> int``, called by
            :func:`validate_options` before any model is loaded: ``at`` is the text after ``@`` in the entry (the
            method parses it itself instead of reading it as γ), ``options`` the benchmark's options; returns the
            γ to report and raises ValueError (preferably :class:`BenchOptionError`) for nonsense. With a
            ``prepare`` hook the factory receives the full entry (``name@at``) as ``name``.
        options: the ``--opt`` keys the method reads besides the built-in ones of :data:`OPTION_KEYS` (a plugin's
            own settings; check their values in ``prepare``). :func:`validate_options` refuses any other key.
    """

    name: str
    factory: Callable
    needs_draft: bool = False
    uses_gamma: bool = True
    family: str = "specrepro"
    description: str = ""
    exact: bool = True
    prepare: Callable | None = None
    options: tuple[str, ...] = ()


#: name -> MethodSpec. Add entries with :func:`register_method`.
REGISTRY: dict[str, MethodSpec] = {}


def register_method(name: str, *, needs_draft: bool = False, uses_gamma: bool = True, family: str = "specrepro",
                    description: str = "", replace: bool = False, exact: bool = True,
                    prepare: Callable | None = None, options: tuple[str, ...] = ()):
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
                                    description or (factory.__doc__ or "").strip().split("\n")[0], exact=exact,
                                    prepare=prepare, options=tuple(options))
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


#: methods whose draft ``--opt draft_kind`` chooses, and that have a registered name per kind
#: (``<method>-<kind>``, e.g. ``sd-draft-adaptive-int8``): :func:`canonical_method` names the kind
KIND_NAMED = ("sd-draft-adaptive", "sd-hybrid-adaptive")


def canonical_method(method: str, options: dict | None = None) -> str:
    """The name that is a method's whole configuration: ``sd-draft-adaptive@20`` run with ``--opt draft_kind=int8``
    is ``sd-draft-adaptive-int8@20`` (a registered method that drafts with the int8 copy whatever the options say),
    so the same name run alone measures the same thing. Other methods, and the default float draft, keep their name.

    Args:
        method: a method entry as given to the bench (``name`` or ``name@arg``).
        options: the run's ``--opt`` values (``draft_kind`` is read).
    """
    base, sep, at = str(method).partition("@")
    kind = str((options or {}).get("draft_kind", "fp32"))
    if base in KIND_NAMED and kind != "fp32":
        return f"{base}-{kind}{sep}{at}"
    return str(method)


def canonical_bench(data: dict) -> dict:
    """A bench JSON (``config``, ``summary``, ``runs``) with every method under its :func:`canonical_method` name,
    read from the file's own ``config.options``: files written before the bench recorded canonical names show what
    ran. A shallow copy; the argument is not modified."""
    options = (data.get("config") or {}).get("options") or {}
    names = {m: canonical_method(m, options) for m in (data.get("config") or {}).get("methods") or []}
    if all(k == v for k, v in names.items()):
        return data

    def rename(rows):
        return [{**r, "method": names.get(r.get("method"), r.get("method"))} for r in rows or []]

    config = {**data.get("config", {}), "methods": [names[m] for m in data["config"]["methods"]]}
    return {**data, "config": config, "summary": rename(data.get("summary")), "runs": rename(data.get("runs"))}


def resolve_method(entry: str) -> tuple[str, MethodSpec, int | None]:
    """Parse ``name`` or ``name@γ`` and look the name up (exact name first, then ``prefix*`` families).

    For a method with a ``prepare`` hook (see :class:`MethodSpec`) the text after ``@`` is not read as γ: it is
    left to the hook (:func:`validate_options` calls it), and the override returned here is None.

    Returns:
        ``(name, spec, gamma_override or None)``.

    Raises:
        BenchOptionError: unknown name (lists the known ones and any plugin import errors) or a bad ``@γ``.
    """
    _load_plugins()
    name, _, g = entry.strip().partition("@")
    gamma = None
    spec = REGISTRY.get(name)
    if spec is None:
        fams = [s for k, s in REGISTRY.items() if k.endswith("*") and fnmatch.fnmatchcase(name, k)]
        spec = max(fams, key=lambda s: len(s.name)) if fams else None
    if spec is None:
        extra = "".join(f"\n  (plugin {m} failed to import: {e})" for m, e in PLUGIN_ERRORS.items())
        raise BenchOptionError(f"unknown method {name!r}; known methods: {', '.join(REGISTRY)}{extra}")
    if spec.prepare is not None:
        return name, spec, None
    if g:
        if not g.isdigit() or int(g) < 1:
            raise BenchOptionError(f"{entry!r}: the γ after '@' must be an integer >= 1")
        gamma = int(g)
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
        target, draft: transformers causal LMs (draft None when not given, and set to None once every method is
            built: a factory reads it while it builds, a runner keeps its own reference); tokenizer: the target's.
        prompts: list of :class:`~specrepro.data.Prompt`; sampling: the shared :class:`SamplingConfig`.
        gamma: the default draft length γ; max_new_tokens; eos_token_id: list of stop ids (target's generation
            config and tokenizer); vocab_size: the target's logits width V; seed; device.
        options: extra settings for methods (``--opt key=value`` on the command line; all values may be strings):
            ``lookup_max_ngram`` (prompt lookup, default 3), ``tree`` (``--tree``: sd-tree's expansion),
            ``tree_mode`` (children under sampling for sd-tree and medusa: iid, without_replacement, topk),
            ``medusa_heads`` (``--medusa-heads``: a directory, 'auto' or 'stdlib'), ``typical_epsilon`` / ``typical_delta``
            (medusa-typical thresholds, Medusa's defaults 0.09 / 0.3), ``draft_stop`` (sd-draft-dynamic's draft
            confidence threshold, default 0.4); the cheap drafts': ``int8_backend`` (int8 draft copies, one of
            :data:`specrepro.drafters.compress.INT8_BACKENDS`, default ``torch``), ``draft_vocab`` (tokens the FR-Spec
            pruned draft head keeps, default 32768), ``draft_kind`` (the draft of sd-hybrid, sd-draft-auto,
            sd-draft-dynamic and sd-draft-adaptive: fp32, int8, pruned, int8-pruned, int4 or int4-pruned; default
            fp32, which means the draft as loaded, in ``--dtype``), ``int4_group_size`` (4-bit draft copies' group
            size, default 32), ``hybrid_min_ngram`` (sd-hybrid's shortest prompt-lookup match, default 2), ``lookup_gamma``
            (sd-hybrid-adaptive's longest copied block, default 10).
        cost_text: the prompts' token ids end to end (long tensor [L]; None = random ids), the text the cost model
            times the drafters along (:func:`specrepro.measure.cost.measure_draft_step_ms`).
        target_name, draft_name: the models as named to the bench (zoo names, hub ids or paths; None when unknown,
            e.g. models passed in already loaded): the llama.cpp methods open the zoo's GGUF files of these names
            (:mod:`specrepro.bench.llama`).
        config_notes: key -> JSON-serialisable value that factories add to the bench JSON's ``config`` (e.g. which
            llama.cpp build ran); shared with the warm-up context.
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
    cost_text: Any = None
    target_name: str | None = None
    draft_name: str | None = None
    config_notes: dict = field(default_factory=dict)
    _shared: dict = field(default_factory=dict)

    def shared(self, key: str, build: Callable[[], Any]):
        """A resource built once per benchmark and shared by methods (e.g. the bigram draft)."""
        if key not in self._shared:
            self._shared[key] = build()
        return self._shared[key]


# ---------------------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------------------

#: The built-in ``--opt`` keys (see :class:`BenchContext`): key -> (the methods that read it, a check of its value
#: that raises :class:`BenchOptionError`, or None where the methods' ``prepare`` hooks check it). A method
#: registered elsewhere declares its own keys with ``register_method(..., options=...)``.
OPTION_KEYS: dict[str, tuple[tuple[str, ...], Callable | None]] = {
    "lookup_max_ngram": (("sd-lookup", "hf-lookup", "sd-tree-merge", "sd-hybrid", "sd-hybrid-adaptive", "sd-hybrid-adaptive-int8", "sd-hybrid-adaptive-pruned", "sd-hybrid-adaptive-int8-pruned", "sd-hybrid-adaptive-int4", "sd-hybrid-adaptive-int4-pruned"),
                         lookup_max_ngram_option),
    "draft_stop": (("sd-draft-dynamic",), draft_stop_option),
    "tree": (("sd-tree", "sd-tree-int8", "sd-tree-int8-traversal", "sd-tree-int8-spectr", "sd-tree-int8-gbv"), None),
    "tree_mode": (("sd-tree", "sd-tree-int8", "sd-tree-int8-traversal", "medusa"), tree_mode_option),
    "medusa_heads": (("medusa", "medusa-typical"), None),
    "typical_epsilon": (("medusa-typical",), check_typical_option("typical_epsilon")),
    "typical_delta": (("medusa-typical",), check_typical_option("typical_delta")),
    "int8_backend": (("sd-draft-int8", "sd-draft-int8-pruned", "sd-hybrid", "sd-hybrid-adaptive", "sd-hybrid-adaptive-int8", "sd-hybrid-adaptive-pruned", "sd-hybrid-adaptive-int8-pruned", "sd-hybrid-adaptive-int4", "sd-hybrid-adaptive-int4-pruned", "sd-draft-auto", "sd-draft-dynamic",
                      "sd-draft-adaptive", "sd-draft-adaptive-int8", "sd-draft-adaptive-int8-pruned", "sd-tree-int8",
                      "sd-tree-int8-traversal", "sd-tree-int8-spectr", "sd-tree-int8-gbv", "sd-draft-int8-block",
                      "hf-assisted-int8", "hf-assisted-int8-gamma",
                      "hf-assisted-int8-pruned"),
                     int8_backend_option),
    "int4_group_size": (("sd-draft-int4", "sd-draft-int4-pruned", "sd-hybrid", "sd-hybrid-adaptive", "sd-hybrid-adaptive-int8", "sd-hybrid-adaptive-pruned", "sd-hybrid-adaptive-int8-pruned", "sd-hybrid-adaptive-int4", "sd-hybrid-adaptive-int4-pruned", "sd-draft-auto", "sd-draft-dynamic",
                         "sd-draft-adaptive", "sd-draft-adaptive-int4", "sd-draft-adaptive-int4-pruned",
                         "hf-assisted-int4"), int4_group_size_option),
    "draft_vocab": (("sd-draft-pruned", "sd-draft-int8-pruned", "sd-draft-int4-pruned", "sd-hybrid", "sd-hybrid-adaptive", "sd-hybrid-adaptive-int8", "sd-hybrid-adaptive-pruned", "sd-hybrid-adaptive-int8-pruned", "sd-hybrid-adaptive-int4", "sd-hybrid-adaptive-int4-pruned",
                     "sd-draft-auto",
                     "sd-draft-dynamic", "sd-draft-adaptive", "sd-draft-adaptive-pruned",
                     "sd-draft-adaptive-int8-pruned", "sd-draft-adaptive-int4-pruned", "hf-assisted-int8-pruned"),
                    draft_vocab_option),
    "draft_kind": (("sd-hybrid", "sd-hybrid-adaptive", "sd-draft-auto", "sd-draft-dynamic", "sd-draft-adaptive"),
                   draft_kind_option),
    "hybrid_min_ngram": (("sd-hybrid", "sd-hybrid-adaptive", "sd-hybrid-adaptive-int8", "sd-hybrid-adaptive-pruned", "sd-hybrid-adaptive-int8-pruned", "sd-hybrid-adaptive-int4", "sd-hybrid-adaptive-int4-pruned"), hybrid_min_ngram_option),
    "target_format": ((), target_format_option),  # the llama.cpp methods declare it (specrepro.bench.llama)
    "lookup_gamma": (("sd-hybrid-adaptive", "sd-hybrid-adaptive-int8", "sd-hybrid-adaptive-pruned", "sd-hybrid-adaptive-int8-pruned", "sd-hybrid-adaptive-int4", "sd-hybrid-adaptive-int4-pruned",), lookup_gamma_option),
}
#: options that have their own command-line flag (named in error messages instead of ``--opt KEY``)
_OPTION_FLAGS = {"tree": "--tree", "medusa_heads": "--medusa-heads"}


def _check_option_keys(options: dict, resolved) -> None:
    """Refuse ``--opt`` keys that none of the chosen methods reads, then check the values of the others."""
    chosen = {spec.name for _, spec, _ in resolved}
    users: dict[str, list[str]] = {k: list(methods) for k, (methods, _) in OPTION_KEYS.items()}
    for name, spec in REGISTRY.items():
        for k in spec.options:
            users.setdefault(k, []).append(name)
    accepted = sorted(k for k, ms in users.items() if chosen & set(ms))
    for key, value in options.items():
        if value is None:
            continue
        flag = _OPTION_FLAGS.get(key, f"--opt {key}")
        if key not in users:
            raise BenchOptionError(
                f"{flag}: unknown option; the chosen methods ({', '.join(sorted(chosen))}) take "
                f"{', '.join(accepted) if accepted else 'no --opt options'} (all options: {', '.join(sorted(users))})")
        if not chosen & set(users[key]):
            if key in _OPTION_FLAGS and value == "":
                continue
            raise BenchOptionError(f"{flag} (option {key!r}) is only used by {', '.join(users[key])}; add one to "
                                   f"--methods or drop it (the chosen methods take "
                                   f"{', '.join(accepted) if accepted else 'no --opt options'})")
        check = OPTION_KEYS.get(key, (None, None))[1]
        if check is not None:
            check(options)



def validate_options(*, methods, gamma: int, n_prompts: int | None, max_new_tokens: int, temperature: float,
                     top_p: float, top_k: int | None, repeats: int, device: str, has_draft: bool | None = None,
                     dtype: str | None = None, options: dict | None = None) -> list[tuple[str, MethodSpec, int]]:
    """Check benchmark options before any model is loaded.

    Args:
        options: the methods' extra settings (see :class:`BenchContext`), passed to each method's ``prepare`` hook.

    Returns:
        the resolved method list: ``(label, spec, gamma)`` per entry, label being ``name``, ``name@γ`` or (methods
        with a ``prepare`` hook) ``name@at``; gamma is the γ to report (for tree methods the tree depth).

    Raises:
        BenchOptionError (a ValueError): γ < 1, n_prompts < 1, max_new_tokens < 1, repeats < 1, temperature < 0 or
            not finite, top_p outside (0, 1], top_k < 0, an unknown method (the message lists the known ones),
            duplicate methods, a draft-model method without a draft (``has_draft=False``), a CUDA device on a
            machine without CUDA, an unknown dtype; whatever a method's ``prepare`` refuses (a malformed tree
            ``sd-tree@2xx1``, a medusa method without ``medusa_heads`` or with a directory holding no heads, an
            unknown ``tree_mode``); an option key that none of the chosen methods reads (the message lists the
            keys they take) or a bad value (``tree_mode=foo``, ``typical_epsilon=abc``, ``lookup_max_ngram=0``,
            ``draft_stop=2``), including ``tree`` or ``medusa_heads`` without a method that uses them.
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
        from specrepro.models import resolve_dtype

        try:
            resolve_dtype(dtype, dev)
        except ValueError as exc:
            raise BenchOptionError(str(exc)) from None
    if isinstance(methods, str):
        methods = [m for m in methods.split(",") if m.strip()]
    if not methods:
        bad("no methods given")
    options = dict(options or {})
    resolved, seen = [], set()
    for entry in methods:
        name, spec, g = resolve_method(entry)
        if spec.prepare is not None:
            at = entry.strip().partition("@")[2] or None
            label = f"{name}@{at}" if at else name
        else:
            label = f"{name}@{g}" if g is not None else name
        if label in seen:
            bad(f"method {label!r} given twice")
        seen.add(label)
        if spec.needs_draft and has_draft is False:
            bad(f"method {name!r} needs a draft model: pass --draft (or --pair), or drop it from --methods")
        if spec.prepare is not None:
            try:
                g = int(spec.prepare(at, gamma, options))
            except BenchOptionError:
                raise
            except ValueError as exc:
                raise BenchOptionError(f"{label}: {exc}") from None
        resolved.append((label, spec, g if g is not None else gamma))
    _check_option_keys(options, resolved)
    return resolved
