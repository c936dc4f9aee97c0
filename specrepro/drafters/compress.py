"""Cheaper draft models: int8 or 4-bit weights and a vocabulary-pruned LM head (FR-Spec).

What this file is: the compression of a draft model, so that each drafted token costs less while the draft stays an
ordinary proposal source whose q is exactly the distribution its tokens were sampled from.

* :func:`quantize_draft` returns a copy of a draft model whose ``nn.Linear`` layers run in int8 (a kept library
  does the quantization: torch's dynamic int8 linear layers, or torchao where it is installed). Wrapped in
  :class:`~specrepro.drafters.model.DraftModelDrafter`, its q is computed from the quantized logits, so verification stays
  exact whatever the quantization error does to α.
* :func:`quantize_draft_int4` returns a copy whose linear layers hold 4-bit weights (groupwise asymmetric,
  weight-only, :class:`Int4WeightOnlyLinear`): half the int8 draft's bytes per drafted token, run by torch's own CPU
  int4 kernel (``aten._weight_int4pack_mm_for_cpu``, the kernel torchao's ``Int4CPULayout`` calls). Same contract
  as the int8 copy: q comes from the 4-bit model's logits.
* :func:`token_frequencies` / :func:`frequent_token_ids` / :func:`pruned_head`: FR-Spec's frequency-ranked draft
  head (Zhao et al. 2025, "FR-Spec: Accelerating Large-Vocabulary Language Models via Frequency-Ranked Speculative
  Sampling"): the draft's LM head restricted to the N most frequent tokens of a corpus. Here the corpus is the Python
  standard library's own ``.py`` sources (on every machine, disjoint from the benchmark prompts), tokenized with the
  pair's tokenizer; the counts are cached per tokenizer and corpus. The drafter that uses the head is
  :class:`~specrepro.drafters.model.PrunedHeadDrafter`.
* :func:`measure_draft_step_ms`: the time of one drafted token of any drafter (for the per-step γ choice), and
  :func:`measure_chain_costs`: the target's cost curve with the drafters' token costs, warmed up and taken as the
  median of several rounds (the bench's predictions and ``sd-draft-auto`` both use it).

What it is not: a quantized *target* (the target's logits define p and stay in the model's own dtype), or a kernel
library: every int8 kernel comes from torch or torchao.
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
import sysconfig
from pathlib import Path
from typing import Iterable, Sequence

import torch

from specrepro.models import release_copied_memory

__all__ = ["FLOAT_DTYPES", "INT8_BACKENDS", "INT4_GROUP_SIZES", "check_int8_backend", "check_int4", "Int4WeightOnlyLinear",
           "int4_group_for", "quantize_draft_int4", "quantize_linear_int4", "quantize_draft", "quantize_linear", "stdlib_sources", "tokenizer_fingerprint", "token_frequencies", "frequent_token_ids", "pruned_head", "FullWidthHead", "with_output_head"]

#: The float dtypes a draft may come in for :func:`quantize_draft` and :func:`quantize_draft_int4`.
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

#: int8 backends of :func:`quantize_draft`:
#:
#: * ``torch``: ``torch.ao.quantization.quantize_dynamic`` with per-channel int8 weights (fbgemm/x86 packed weights,
#:   activations quantized per call). On this project's 2-core AVX2 CPU this path ran the qwen 0.5B draft's one-token
#:   step in 44 ms against 106 ms in fp32 (design notes). torch marks ``torch.ao.quantization`` deprecated in favour of
#:   torchao, but the pinned torch 2.13 ships and runs it; it needs nothing else.
#: * ``torch-per-tensor``: the same with one scale per weight matrix (torch's default qconfig).
#: * ``torchao-dynamic`` / ``torchao-weight-only``: torchao's ``quantize_`` with ``Int8DynamicActivationInt8WeightConfig``
#:   / ``Int8WeightOnlyConfig`` (per-row weights). torchao is optional (``pip install torchao==0.18.0``): in eager mode
#:   on the CPU its int8 linear is several small ops (activation quantization, ``torch._int_mm``, rescaling) and the
#:   weight-only path converts the int8 weight to float on every call; it is built for ``torch.compile``. Time it
#:   against ``torch`` before preferring it.
INT8_BACKENDS = ("torch", "torch-per-tensor", "torchao-dynamic", "torchao-weight-only")


def check_int8_backend(backend: str) -> str:
    """Return ``backend`` if :func:`quantize_draft` can use it here.

    Raises:
        ValueError: not one of :data:`INT8_BACKENDS`, or a torchao backend without torchao installed, or the
            ``torch`` backends without a quantized CPU engine in this torch build.
    """
    if backend not in INT8_BACKENDS:
        raise ValueError(f"int8 backend {backend!r}: expected one of {', '.join(INT8_BACKENDS)}")
    if backend.startswith("torchao"):
        import importlib.util

        if importlib.util.find_spec("torchao") is None:
            raise ValueError(f"int8 backend {backend!r} needs torchao (pip install torchao==0.18.0); the 'torch' "
                             f"backend needs nothing beyond torch")
    elif not {"x86", "fbgemm", "onednn", "qnnpack"} & set(torch.backends.quantized.supported_engines):
        raise ValueError(f"int8 backend {backend!r}: this torch build has no quantized CPU engine "
                         f"({torch.backends.quantized.supported_engines})")
    return backend


def plain_linear_layers(model: torch.nn.Module) -> None:
    """Turn the project's oneDNN-packed linear layers (:class:`specrepro.models.OneDNNLinear`, a subclass of
    ``nn.Linear`` with the same parameters) back into plain ``nn.Linear`` so the quantizers recognise them."""
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear) and type(mod) is not torch.nn.Linear and \
                type(mod).__module__ == "specrepro.models":
            mod.__class__ = torch.nn.Linear


def _quantize_in_place(module: torch.nn.Module, backend: str, skip: Sequence[str] = ()) -> torch.nn.Module:
    import warnings

    skip = set(skip)
    if backend.startswith("torch") and not backend.startswith("torchao"):
        from torch.ao.quantization import (
            default_dynamic_qconfig,
            per_channel_dynamic_qconfig,
            quantize_dynamic,
)

        qconfig = per_channel_dynamic_qconfig if backend == "torch" else default_dynamic_qconfig
        names = {n for n, m in module.named_modules() if type(m) is torch.nn.Linear and n not in skip}
        if type(module) is torch.nn.Linear:  # a bare layer: quantize_dynamic looks at children only
            holder = torch.nn.Sequential(module)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", (DeprecationWarning, UserWarning))
                quantize_dynamic(holder, {"0": qconfig}, dtype=torch.qint8, inplace=True)
            return holder[0]
        with warnings.catch_warnings():  # torch.ao.quantization's deprecation notices, printed on every call
            warnings.simplefilter("ignore", (DeprecationWarning, UserWarning))
            quantize_dynamic(module, {n: qconfig for n in names}, dtype=torch.qint8, inplace=True)
        return module
    from torchao.quantization import (
        Int8DynamicActivationInt8WeightConfig,
        Int8WeightOnlyConfig,
        quantize_,
)

    # set_inductor_config=False: leave torch.compile's global settings alone (eager inference here)
    config = Int8DynamicActivationInt8WeightConfig(set_inductor_config=False) if backend == "torchao-dynamic" \
        else Int8WeightOnlyConfig(set_inductor_config=False)
    names = {id(m) for n, m in module.named_modules() if type(m) is torch.nn.Linear and n not in skip}
    quantize_(module, config, filter_fn=lambda m, fqn: id(m) in names)
    return module


def _check_cpu_float_draft(model, caller: str, kernels: str) -> None:
    """Raise ValueError unless every parameter of ``model`` is on the CPU and in one of :data:`FLOAT_DTYPES`."""
    params = list(model.parameters())
    if any(p.device.type != "cpu" for p in params):
        raise ValueError(f"{caller}: the {kernels} kernels are CPU kernels; move the draft to the CPU first")
    bad = {p.dtype for p in params if p.is_floating_point()} - set(FLOAT_DTYPES)
    if bad:
        raise ValueError(f"{caller}: expected a float32, bfloat16 or float16 model, got parameters in "
                         f"{sorted(map(str, bad))}")


@torch.no_grad()
def quantize_draft(model, backend: str = "torch", skip_lm_head: bool = False):
    """A copy of a draft model with its linear layers quantized to int8 weights (the original is left unchanged).

    Every ``nn.Linear`` of the transformer blocks (attention projections, MLP) and, unless ``skip_lm_head``, the LM
    head become int8 (see :data:`INT8_BACKENDS`); embeddings and norms stay float. The int8 CPU kernels take float32
    activations only, so the copy of a bfloat16 or float16 draft is float32 before it is quantized (its embeddings,
    norms and KV cache are float32; a bfloat16 target verifies its tokens as with any draft). Use the copy
    as any draft (``DraftModelDrafter(quantize_draft(draft), V)``): q is the processed softmax of the *quantized*
    logits, the distribution the draft tokens are sampled from, so Leviathan's rule stays exact (Leviathan et al.
    2023, Thm. 3.5 holds for any q); quantization changes only α. The LM head of a model with tied embeddings is
    quantized as its own copy; the input embedding stays float.

    Args:
        model: a transformers causal LM on the CPU in float32, bfloat16 or float16 (as
            :func:`specrepro.models.load_model` returns it; its oneDNN-packed layers are converted back to
            ``nn.Linear`` in the copy first).
        backend: one of :data:`INT8_BACKENDS` (default ``torch``: per-channel dynamic int8, fbgemm/x86).
        skip_lm_head: keep the LM head in float (e.g. when :func:`pruned_head` replaces it anyway).

    Returns:
        the quantized copy, in eval mode without gradients; ``specrepro_name`` gets an ``+int8`` suffix and
        ``specrepro_int8_backend`` names the backend.

    Raises:
        ValueError: an unusable ``backend`` (:func:`check_int8_backend`), a model not on the CPU (the int8 kernels
            here are CPU kernels) or with parameters in another dtype.
    """
    check_int8_backend(backend)
    _check_cpu_float_draft(model, "quantize_draft", "int8")
    q = copy.deepcopy(model)
    plain_linear_layers(q)
    if q.dtype != torch.float32:
        q = q.float()
    skip = ()
    if skip_lm_head or getattr(model.config, "tie_word_embeddings", False):
        head = q.get_output_embeddings()
        head_name = next(n for n, m in q.named_modules() if m is head)
        if getattr(model.config, "tie_word_embeddings", False) and not skip_lm_head:
            # untie: the head gets its own weight tensor, so quantizing it leaves the input embedding float
            head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=False)
        else:
            skip = (head_name,)
    _quantize_in_place(q, backend, skip)
    q.eval().requires_grad_(False)
    q.specrepro_name = f"{getattr(model, 'specrepro_name', type(model).__name__)}+int8"
    q.specrepro_int8_backend = backend
    release_copied_memory(model)
    return q


@torch.no_grad()
def quantize_linear(layer: torch.nn.Linear, backend: str = "torch") -> torch.nn.Module:
    """An int8 copy of one float ``nn.Linear`` (e.g. a :func:`pruned_head`), same backends as :func:`quantize_draft`;
    a bfloat16 or float16 layer is made float32 first (the int8 CPU kernels take float32 activations).

    Returns:
        a module mapping float32 [..., in_features] to float32 [..., out_features].

    Raises:
        ValueError: an unusable backend; TypeError: not an ``nn.Linear``.
    """
    check_int8_backend(backend)
    if not isinstance(layer, torch.nn.Linear):
        raise TypeError(f"quantize_linear expects an nn.Linear, got {type(layer).__name__}")
    layer = copy.deepcopy(layer).float()
    layer.__class__ = torch.nn.Linear
    return _quantize_in_place(layer, backend).eval().requires_grad_(False)


# ---------------------------------------------------------------------------------------------------------------
# 4-bit weight-only drafts
# ---------------------------------------------------------------------------------------------------------------

#: the group sizes (input features sharing one scale and zero point) torch's CPU int4 kernel accepts
INT4_GROUP_SIZES = (32, 64, 128, 256)


def check_int4(group_size: int = 128) -> int:
    """Return ``group_size`` if this torch build can run :class:`Int4WeightOnlyLinear` with it.

    Raises:
        ValueError: ``group_size`` not in :data:`INT4_GROUP_SIZES`, or a torch without the CPU int4 kernels
            (``aten._convert_weight_to_int4pack_for_cpu`` / ``aten._weight_int4pack_mm_for_cpu``, torch >= 2.5).
    """
    if group_size not in INT4_GROUP_SIZES:
        raise ValueError(f"int4 group size {group_size}: expected one of {INT4_GROUP_SIZES}")
    ops = torch.ops.aten
    if not (hasattr(ops, "_convert_weight_to_int4pack_for_cpu") and hasattr(ops, "_weight_int4pack_mm_for_cpu")):
        raise ValueError(f"torch {torch.__version__} has no CPU int4 kernels (aten._weight_int4pack_mm_for_cpu); "
                         f"the int4 draft needs torch >= 2.5")
    return group_size


class Int4WeightOnlyLinear(torch.nn.Module):
    """A linear layer with 4-bit weights: y = x Ŵᵀ + b, Ŵ the dequantized weight, x rounded to bfloat16.

    Each row of W [N, K] is cut into groups of ``group_size`` input features; a group with minimum m and maximum M
    gets scale s = max(M - m, 1e-6) / 15 and codes c = clamp(round((w - m) / s), 0, 15), so Ŵ = (c - 8) s + z with
    z = m + 8 s (asymmetric, 16 levels: the layout of torch's CPU int4 kernel, which takes (s, z) per group and
    reads 0.5 byte per weight). Rows are padded with zeros to a multiple of 16 (the kernel packs 16 rows at a
    time) and the padding is dropped from the output. The kernel runs its fast path only with bfloat16 activations and
    scales, so x and (s, z) enter it in bfloat16; y leaves it in float32, gets the bias added in float32 and is returned
    in x's dtype (float32 in a float32 model, bfloat16 in a bfloat16 one). The rounding is part of the draft model,
    and q, computed from these logits, stays the distribution the tokens are drawn from.

    Args:
        linear: a float ``nn.Linear`` (its weight is read once; the module keeps only the packed codes, the scales
            and zero points, and the bias).
        group_size: one of :data:`INT4_GROUP_SIZES`; it must divide ``in_features``.

    Shapes: input float [..., K] (float32, bfloat16 or float16; rounded to bfloat16 for the kernel), output [..., N]
    in the input's dtype.

    Raises:
        ValueError: a group size the kernel does not take or that does not divide K (:func:`check_int4`).
    """

    def __init__(self, linear: torch.nn.Linear, group_size: int = 128):
        super().__init__()
        check_int4(group_size)
        w = linear.weight.detach().to(torch.float32)
        n, k = w.shape
        if k % group_size:
            raise ValueError(f"int4 group size {group_size} does not divide in_features {k}")
        self.in_features, self.out_features, self.group_size = k, n, group_size
        w = torch.cat([w, w.new_zeros((-n) % 16, k)]) if n % 16 else w
        groups = w.reshape(w.shape[0], k // group_size, group_size)
        lo, hi = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
        scale = (hi - lo).clamp(min=1e-6) / 15
        codes = ((groups - lo) / scale).round().clamp(0, 15).to(torch.int32).reshape(w.shape[0], k)
        zero = lo + 8 * scale
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.contiguous(), 8))
        # [K / group_size, N_padded, 2]: (scale, zero point) per group and row, as the kernel reads them
        self.register_buffer("scales_and_zeros",
                             torch.stack([scale.squeeze(-1), zero.squeeze(-1)], -1).transpose(0, 1).contiguous())
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().to(torch.float32).clone())
        # the kernel's fast path takes bfloat16 activations with bfloat16 scales; with float32 ones it runs a
        # reference loop (one 896 x 4864 layer, one token, one thread: 15 ms against 0.36 ms)
        self.register_buffer("scales_and_zeros_bf16", self.scales_and_zeros.to(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.packed, self.group_size, self.scales_and_zeros_bf16)
        y = y[:, :self.out_features].to(torch.float32)
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*lead, self.out_features)

    @torch.no_grad()
    def dequantized_weight(self) -> torch.Tensor:
        """Ŵ, float32 [N, K]: the weight this layer multiplies by (for tests and error reports), computed through
        the kernel itself from the identity, on its float32 (slow, unrounded) path."""
        eye = torch.eye(self.in_features, dtype=torch.float32)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, self.group_size, self.scales_and_zeros)
        return y[:, :self.out_features].T.contiguous()

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}, "
                f"bias={self.bias is not None}")


def int4_group_for(in_features: int, group_size: int = 128) -> int | None:
    """The largest group size of :data:`INT4_GROUP_SIZES` up to ``group_size`` that divides ``in_features``, or None.

    Raises:
        ValueError: ``group_size`` itself is not allowed (:func:`check_int4`).
    """
    check_int4(group_size)
    return next((g for g in reversed(INT4_GROUP_SIZES) if g <= group_size and in_features % g == 0), None)


@torch.no_grad()
def quantize_linear_int4(layer: torch.nn.Linear, group_size: int = 128) -> Int4WeightOnlyLinear:
    """A 4-bit copy of one float ``nn.Linear`` (e.g. a :func:`pruned_head`): :class:`Int4WeightOnlyLinear` with the
    largest allowed group size up to ``group_size`` that divides its ``in_features`` (:func:`int4_group_for`).

    Raises:
        TypeError: not an ``nn.Linear``; ValueError: a group size the kernel does not take, or no allowed group size
            divides ``in_features``.
    """
    if not isinstance(layer, torch.nn.Linear):
        raise TypeError(f"quantize_linear_int4 expects an nn.Linear, got {type(layer).__name__}")
    g = int4_group_for(layer.in_features, group_size)
    if g is None:
        raise ValueError(f"no int4 group size up to {group_size} divides in_features {layer.in_features}")
    return Int4WeightOnlyLinear(layer, g).eval().requires_grad_(False)


@torch.no_grad()
def quantize_draft_int4(model, group_size: int = 128, skip_lm_head: bool = False):
    """A copy of a draft model whose ``nn.Linear`` layers hold 4-bit weights (:class:`Int4WeightOnlyLinear`); the
    original is left unchanged.

    Every linear layer of the transformer blocks and, unless ``skip_lm_head``, the LM head (untied from the input
    embedding first, which stays float) become 4-bit; a layer whose ``in_features`` no allowed group size up to
    ``group_size`` divides stays float (named in ``specrepro_int4_float_layers``). As for :func:`quantize_draft`,
    wrap the copy in :class:`~specrepro.drafters.model.DraftModelDrafter`: q is the processed softmax of the 4-bit
    model's logits, the distribution its tokens are drawn from, so verification stays exact (Leviathan et al. 2023,
    Thm. 3.5 holds for any q); only α and the cost change. The bytes read per weight fall to 0.5 + 8 / group
    size (the codes plus a float32 scale and zero point per group: 0.5625 at the default 128, torchao's default),
    against about 1 for int8.

    Args:
        model: a transformers causal LM on the CPU in float32, bfloat16 or float16 (its oneDNN-packed layers are
            converted back to ``nn.Linear`` in the copy first); the copy keeps that dtype for its activations,
            embeddings and norms.
        group_size: the largest group size to use (:data:`INT4_GROUP_SIZES`); smaller allowed sizes are tried for a
            layer whose ``in_features`` it does not divide.
        skip_lm_head: keep the LM head in float (e.g. when :func:`pruned_head` replaces it anyway).

    Returns:
        the 4-bit copy, in eval mode without gradients; ``specrepro_name`` gets a ``+int4`` suffix.

    Raises:
        ValueError: no CPU int4 kernels or a bad group size (:func:`check_int4`), a model not on the CPU or with
            parameters in another dtype.
    """
    check_int4(group_size)
    _check_cpu_float_draft(model, "quantize_draft_int4", "int4")
    q = copy.deepcopy(model)
    plain_linear_layers(q)
    head = q.get_output_embeddings()
    skip = set()
    if skip_lm_head:
        skip.add(id(head))
    kept_float = []
    for parent_name, parent in list(q.named_modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear or id(child) in skip:
                continue
            g = int4_group_for(child.in_features, group_size)
            if g is None:
                kept_float.append(f"{parent_name}.{child_name}" if parent_name else child_name)
                continue
            setattr(parent, child_name, Int4WeightOnlyLinear(child, g).eval())
    q.eval().requires_grad_(False)
    q.specrepro_name = f"{getattr(model, 'specrepro_name', type(model).__name__)}+int4"
    q.specrepro_int4_group_size = group_size
    q.specrepro_int4_float_layers = kept_float
    release_copied_memory(model)
    return q


# ---------------------------------------------------------------------------------------------------------------
# FR-Spec: the frequency-ranked vocabulary of the draft head
# ---------------------------------------------------------------------------------------------------------------

_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


def stdlib_sources(root: str | Path | None = None) -> list[Path]:
    """The Python standard library's own ``.py`` files, sorted: the FR-Spec corpus.

    Third-party packages (``site-packages``, ``dist-packages``) and the stdlib's test suites (``test``, ``tests``,
    ``idle_test``) are left out. CPython 3.11's library gives about 800 files, 12.6 MB.

    Args:
        root: the library directory; default ``sysconfig.get_paths()["stdlib"]``.

    Raises:
        FileNotFoundError: no ``.py`` file there.
    """
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if not (_SKIP_DIRS & set(p.relative_to(root).parts[:-1])))
    if not files:
        raise FileNotFoundError(f"no Python sources under {root} for the FR-Spec token frequencies")
    return files


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of a tokenizer's class and vocabulary (token string -> id, added tokens included)."""
    vocab = sorted(tokenizer.get_vocab().items())
    h = hashlib.sha256(type(tokenizer).__name__.encode())
    h.update(json.dumps(vocab, ensure_ascii=False).encode())
    return h.hexdigest()[:16]


def corpus_fingerprint(files: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.name}:{p.stat().st_size}\n".encode())
    return h.hexdigest()[:16]


def token_frequencies(tokenizer, files: Iterable[str | Path] | None = None, cache: bool = True,
                      batch_files: int = 32) -> torch.Tensor:
    """How often each token id occurs when ``files`` are tokenized with ``tokenizer`` (FR-Spec's frequency ranking).

    Each file is tokenized on its own, without special tokens. Counts are cached (safetensors) under
    ``<cache_dir>/fr_spec/`` keyed by :func:`tokenizer_fingerprint`, the Python version and the corpus files' names and
    sizes, so a second call takes milliseconds; the first tokenizes ~12 MB (tens of seconds on a busy 2-core CPU).

    Args:
        tokenizer: a transformers tokenizer (the target's: draft and target share it).
        files: the corpus; default :func:`stdlib_sources`.
        cache: read and write the cache.
        batch_files: files per tokenizer call.

    Returns:
        long [len(tokenizer)] counts.

    Raises:
        FileNotFoundError: no corpus files.
    """
    from specrepro.cache import locked
    from specrepro.files import atomic_save_safetensors
    from specrepro.models import cache_dir

    files = [Path(f) for f in (files if files is not None else stdlib_sources())]
    if not files:
        raise FileNotFoundError("token_frequencies: empty corpus")
    key = hashlib.sha256(f"{tokenizer_fingerprint(tokenizer)}|{sys.version_info[:2]}|{corpus_fingerprint(files)}"
                         .encode()).hexdigest()[:20]
    path = cache_dir() / "fr_spec" / f"{key}.safetensors"
    size = len(tokenizer)
    with locked(path if cache else None, "FR-Spec token counts"):  # one writer; a second reuses
        if cache and path.is_file():
            from safetensors.torch import load_file

            counts = load_file(path)["counts"]
            if counts.numel() == size:
                return counts
        from tqdm.auto import tqdm

        counts = torch.zeros(size, dtype=torch.long)
        for i in tqdm(range(0, len(files), batch_files), desc="FR-Spec token counts", unit="batch", delay=2,
                      disable=None):
            texts = [f.read_text(encoding="utf-8", errors="replace") for f in files[i:i + batch_files]]
            enc = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
            flat = [t for ids in enc for t in ids]
            if flat:
                counts += torch.bincount(torch.tensor(flat, dtype=torch.long), minlength=size)[:size]
        if cache:
            atomic_save_safetensors({"counts": counts}, path,
                                    metadata={"tokenizer": tokenizer_fingerprint(tokenizer), "n_files": str(len(files)),
                                              "python": ".".join(map(str, sys.version_info[:3]))})
        return counts


def frequent_token_ids(counts: torch.Tensor, n: int, vocab_size: int, always: Iterable[int] = ()) -> torch.Tensor:
    """FR-Spec's kept vocabulary: the ``always`` ids plus the most frequent others, ``min(n, vocab_size)`` in all.

    Ties in frequency are broken by the smaller id (deterministic).

    Args:
        counts: long [V'] token counts (:func:`token_frequencies`).
        n: the kept vocabulary size N >= 1.
        vocab_size: the target's logits width V; only ids < V are kept (and ids beyond ``counts`` count 0).
        always: ids kept whatever their count (e.g. the stop tokens, which a source corpus never contains).

    Returns:
        long [min(n, vocab_size)], sorted ascending, unique.

    Raises:
        ValueError: n < 1, or an ``always`` id outside [0, vocab_size).
    """
    if int(n) != n or n < 1:
        raise ValueError(f"the kept vocabulary size N must be an integer >= 1, got {n!r}")
    always = sorted({int(a) for a in always})
    if any(not 0 <= a < vocab_size for a in always):
        raise ValueError(f"ids to keep {always} must lie in [0, {vocab_size})")
    n = min(int(n), vocab_size)
    c = torch.zeros(vocab_size, dtype=torch.float64)
    m = min(vocab_size, counts.numel())
    c[:m] = counts[:m].double()
    # stable sort by decreasing count: equal counts keep increasing id order
    order = torch.sort(-c, stable=True).indices
    keep = list(always[:n])
    chosen = set(keep)
    for t in order.tolist():
        if len(keep) >= n:
            break
        if t not in chosen:
            keep.append(t)
            chosen.add(t)
    return torch.tensor(sorted(keep), dtype=torch.long)


@torch.no_grad()
def pruned_head(model, kept_ids: torch.Tensor) -> torch.nn.Linear:
    """The draft's LM head restricted to ``kept_ids``: an ``nn.Linear(H, N)`` whose row j is the head's row
    ``kept_ids[j]`` (a copy; bias rows likewise). FR-Spec (Zhao et al. 2025, Sec. 3): the head's cost falls from
    V x H to N x H multiply-adds per drafted token (qwen2.5's V = 151936 rows of H = 896 are a fifth of the 0.5B
    draft's weights).

    Args:
        model: a transformers causal LM with a float ``nn.Linear`` output embedding (not an already quantized one:
            prune first, then :func:`quantize_linear`).
        kept_ids: long [N], unique ids of rows of the head.

    Returns:
        float ``nn.Linear`` (same dtype and device as the head) in eval mode without gradients.

    Raises:
        TypeError: the output embedding is not a float ``nn.Linear``; ValueError: ids out of range or repeated.
    """
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or not head.weight.is_floating_point():
        raise TypeError(f"pruned_head needs the model's float nn.Linear LM head, got {type(head).__name__}; prune "
                        f"the float model, then quantize the pruned head with quantize_linear")
    kept = kept_ids.to(torch.long).reshape(-1)
    if kept.numel() == 0 or int(kept.min()) < 0 or int(kept.max()) >= head.out_features:
        raise ValueError(f"kept ids must lie in [0, {head.out_features})")
    if kept.unique().numel() != kept.numel():
        raise ValueError("kept ids must be unique")
    kept = kept.to(head.weight.device)
    out = torch.nn.Linear(head.in_features, kept.numel(), bias=head.bias is not None, dtype=head.weight.dtype,
                          device=head.weight.device)
    out.weight.copy_(head.weight.index_select(0, kept))
    if head.bias is not None:
        out.bias.copy_(head.bias.index_select(0, kept))
    return out.eval().requires_grad_(False)


class FullWidthHead(torch.nn.Module):
    """A pruned LM head (N kept rows) that returns full-width logits: the N computed logits at the kept ids, the
    dtype's lowest finite value everywhere else (softmax 0, never the argmax).

    For code that needs an ordinary full-vocabulary causal LM, such as transformers' assisted generation, to draft
    with an FR-Spec pruned head (:func:`pruned_head`): its greedy draft is the argmax over the kept set and its
    temperature-1 confidence is the softmax over the kept set, exactly what
    :class:`~specrepro.drafters.model.PrunedHeadDrafter` computes. The head's cost is N x H per token; the scatter into
    the width-wide row is one memory write.

    Args:
        head: module mapping float [..., H] to float [..., N] (a pruned head, possibly int8 via
            :func:`quantize_linear`).
        kept_ids: long [N], unique ids in [0, width), the rows of ``head``'s output in order.
        width: the logits width (the model's own head rows).

    Raises:
        ValueError: ids out of range or repeated.
    """

    def __init__(self, head: torch.nn.Module, kept_ids: torch.Tensor, width: int):
        super().__init__()
        kept = torch.as_tensor(kept_ids, dtype=torch.long).reshape(-1)
        if kept.numel() == 0 or int(kept.min()) < 0 or int(kept.max()) >= int(width) or \
                kept.unique().numel() != kept.numel():
            raise ValueError(f"kept ids must be N >= 1 unique ids in [0, {width})")
        self.head, self.width = head, int(width)
        self.register_buffer("kept", kept, persistent=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        kept_logits = self.head(hidden)
        out = kept_logits.new_full((*kept_logits.shape[:-1], self.width), torch.finfo(kept_logits.dtype).min)
        return out.index_copy_(-1, self.kept.to(kept_logits.device), kept_logits)


def with_output_head(model, head: torch.nn.Module):
    """A shallow copy of a transformers causal LM whose output head is ``head``; every other weight, and the model
    passed in, are shared and left unchanged (no weight is copied; the copy's generation config is its own).

    Raises:
        TypeError: a model without ``set_output_embeddings``.
    """
    if not hasattr(model, "set_output_embeddings"):
        raise TypeError(f"{type(model).__name__} has no set_output_embeddings: not a transformers causal LM")
    out = copy.copy(model)
    out._modules = dict(model._modules)  # a new table of submodules: replacing the head leaves the original alone
    out.set_output_embeddings(head)
    if getattr(model, "generation_config", None) is not None:
        out.generation_config = copy.deepcopy(model.generation_config)
    return out
