"""Benchmark options: the error type and the parsers/checkers of the methods' ``--opt`` values and tree specs.

What this file is: :class:`BenchOptionError` and small functions that turn an option string into a checked value
(tree expansion specs, tree modes, typical-acceptance thresholds, prompt-lookup n-gram length, draft-stop threshold,
the cheap drafts' int8 backend, kept vocabulary, draft kind and hybrid match length),
shared by the method registry's validation and the methods themselves.

What it is not: the registry (:mod:`specrepro.bench.registry`) or the methods (:mod:`specrepro.bench.methods`).
"""

from __future__ import annotations


class BenchOptionError(ValueError):
    """An impossible or unknown benchmark option (the message says which and what is allowed)."""


def lookup_max_ngram_option(options: dict) -> int:
    v = str(options.get("lookup_max_ngram", 3)).strip()
    if not v.isdigit() or int(v) < 1:
        raise BenchOptionError(f"--opt lookup_max_ngram={options.get('lookup_max_ngram')}: must be an integer >= 1 "
                               f"(the longest n-gram prompt lookup matches)")
    return int(v)


#: the longest block sd-hybrid-adaptive copies when no ``--opt lookup_gamma`` is given (transformers' prompt lookup
#: copies at most 10 tokens, its ``prompt_lookup_num_tokens`` default)
DEFAULT_LOOKUP_GAMMA = 10


def lookup_gamma_option(options: dict) -> int:
    v = str(options.get("lookup_gamma", DEFAULT_LOOKUP_GAMMA)).strip()
    if not v.isdigit() or int(v) < 1:
        raise BenchOptionError(f"--opt lookup_gamma={options.get('lookup_gamma')}: must be an integer >= 1 (the "
                               f"longest block sd-hybrid-adaptive copies from the context)")
    return int(v)


def draft_stop_option(options: dict) -> float:
    v = options.get("draft_stop", 0.4)
    try:
        v = float(v)
    except (TypeError, ValueError):
        v = float("nan")
    if not (0.0 < v < 1.0):
        raise BenchOptionError(f"--opt draft_stop={options.get('draft_stop')}: must be a number in (0, 1)")
    return v



#: how sd-tree / medusa draw children under sampling (``--opt tree_mode=``); under greedy decoding they always take
#: the top-k tokens (sampling from a one-hot distribution would only repeat the argmax).
TREE_MODES = ("iid", "without_replacement", "topk")
#: the largest tree ``parse_tree_spec`` accepts (nodes, root excluded): larger trees cost more per target forward
#: than they can win on any hardware we target.
MAX_TREE_NODES = 1024


def parse_tree_spec(text) -> tuple[int, ...]:
    """SpecInfer's expansion ⟨k1,...,km⟩ (every node at depth d - 1 gets k_d children) from ``"2x2x1x1"``; also
    ``"2,2,1,1"``, ``"<2,2,1,1>"`` or a sequence of ints.

    Returns:
        the widths (k1, ..., km).

    Raises:
        BenchOptionError: empty, a width that is not an integer >= 1, or more than :data:`MAX_TREE_NODES` nodes.
    """
    if isinstance(text, (list, tuple)):
        parts = [str(k) for k in text]
    else:
        raw = str(text).strip().strip("<>⟨⟩ ")
        parts = [x.strip() for x in raw.replace(",", "x").replace("X", "x").split("x")]
    if not parts or any(not x.isdigit() or int(x) < 1 for x in parts):
        raise BenchOptionError(f"tree {text!r}: expected widths k1xk2x...xkm, each an integer >= 1 (the expansion "
                               f"⟨k1,...,km⟩ of SpecInfer: every node at depth d-1 gets k_d children), e.g. 2x2x1x1")
    widths = tuple(int(x) for x in parts)
    nodes, level = 0, 1
    for k in widths:
        level *= k
        nodes += level
        if nodes > MAX_TREE_NODES:
            raise BenchOptionError(f"tree {text!r} has more than {MAX_TREE_NODES} nodes; use a smaller expansion")
    return widths


def default_expansion(gamma: int) -> tuple[int, ...]:
    """sd-tree's tree when none is given: ⟨2,1,...,1⟩ of depth γ (two chains of length γ, 2γ nodes)."""
    return (2,) + (1,) * (int(gamma) - 1)


def tree_mode_option(options: dict) -> str:
    mode = str(options.get("tree_mode", "iid"))
    if mode not in TREE_MODES:
        raise BenchOptionError(f"--opt tree_mode={mode}: expected one of {', '.join(TREE_MODES)}")
    return mode


def typical_thresholds_option(options: dict) -> tuple[float, float]:
    out = []
    for key, default in (("typical_epsilon", 0.09), ("typical_delta", 0.3)):
        v = options.get(key, default)
        try:
            v = float(v)
        except (TypeError, ValueError):
            v = float("nan")
        if not (0.0 < v <= 1.0):
            raise BenchOptionError(f"--opt {key}={options.get(key)}: must be a number in (0, 1]")
        out.append(v)
    return out[0], out[1]


def check_typical_option(key: str):
    return lambda options: typical_thresholds_option({key: options[key]})


# --- cheap drafts : sd-draft-int8, sd-draft-pruned, sd-draft-int8-pruned, sd-hybrid, sd-draft-auto -------

#: which draft sd-hybrid and sd-draft-auto run (``--opt draft_kind=``): the float draft, its int8 or 4-bit copy, its
#: FR-Spec pruned head, or a quantized copy with a quantized pruned head.
DRAFT_KINDS = ("fp32", "int8", "pruned", "int8-pruned", "int4", "int4-pruned")
#: FR-Spec's kept vocabulary size when ``--opt draft_vocab`` is not given (Zhao et al. 2025 keep 16k-64k tokens of
#: Llama-3's 128k; qwen2.5's vocabulary is 152k).
DEFAULT_DRAFT_VOCAB = 32768


def int8_backend_option(options: dict) -> str:
    from specrepro.drafters.compress import check_int8_backend

    backend = str(options.get("int8_backend", "torch"))
    try:
        return check_int8_backend(backend)
    except ValueError as exc:
        raise BenchOptionError(f"--opt int8_backend={backend}: {exc}") from None


#: the bench's 4-bit group size when ``--opt int4_group_size`` is not given. 32, not torchao's 128: on one 64-position
#: text (a decision measurement, 2 threads, this project's 2-core AVX-512 machine) the qwen 0.5B draft's 4-bit copy
#: kept α = 0.79 against the 1.5B target at T = 1 with groups of 32 and 0.74 with 128 (fp32 draft 0.82, int8 0.73), for
#: 49 vs 46 ms per one-token step (int8 61 ms).
DEFAULT_INT4_GROUP_SIZE = 32


def int4_group_size_option(options: dict) -> int:
    """``--opt int4_group_size`` (4-bit draft copies: the input features sharing one scale and zero point; one of
    :data:`specrepro.drafters.compress.INT4_GROUP_SIZES`, default :data:`DEFAULT_INT4_GROUP_SIZE`)."""
    from specrepro.drafters.compress import check_int4

    v = str(options.get("int4_group_size", DEFAULT_INT4_GROUP_SIZE)).strip()
    try:
        return check_int4(int(v))
    except ValueError as exc:
        raise BenchOptionError(f"--opt int4_group_size={v}: {exc}") from None


def draft_vocab_option(options: dict) -> int:
    v = str(options.get("draft_vocab", DEFAULT_DRAFT_VOCAB)).strip()
    if not v.isdigit() or int(v) < 1:
        raise BenchOptionError(f"--opt draft_vocab={options.get('draft_vocab')}: must be an integer >= 1 (the number "
                               f"of most frequent tokens the pruned draft head keeps, FR-Spec)")
    return int(v)


def draft_kind_option(options: dict) -> str:
    kind = str(options.get("draft_kind", "fp32"))
    if kind not in DRAFT_KINDS:
        raise BenchOptionError(f"--opt draft_kind={kind}: expected one of {', '.join(DRAFT_KINDS)}")
    return kind


def hybrid_min_ngram_option(options: dict) -> int:
    longest = lookup_max_ngram_option(options)
    if options.get("hybrid_min_ngram") is None:
        return min(2, longest)
    v = str(options["hybrid_min_ngram"]).strip()
    if not v.isdigit() or not 1 <= int(v) <= longest:
        raise BenchOptionError(f"--opt hybrid_min_ngram={options.get('hybrid_min_ngram')}: must be an integer in "
                               f"1..lookup_max_ngram ({longest}): the shortest n-gram match for which sd-hybrid "
                               f"copies instead of running the draft model")
    return int(v)


def target_format_option(options: dict) -> str:
    """``--opt target_format``: the weight format of the target's GGUF file for the llama.cpp methods, one of
    :data:`specrepro.bench.formats.FORMATS` (default ``Q4_K_M``, the shipped file), or ``16bit``: BF16 where the CPU
    has AVX-512 BF16 (:func:`specrepro.files.cpu_bf16`), F16 elsewhere (llama.cpp runs BF16 without it on a slower
    path). Returns the format.

    Raises:
        BenchOptionError: a format llama.cpp does not make here.
    """
    from specrepro.bench.formats import FORMATS
    from specrepro.files import cpu_bf16

    fmt = str(options.get("target_format") or "Q4_K_M")
    if fmt == "16bit":
        return "BF16" if cpu_bf16() else "F16"
    if fmt not in FORMATS:
        raise BenchOptionError(f"--opt target_format={fmt}: unknown weight format; known: {', '.join(FORMATS)}, "
                               f"16bit")
    return fmt
