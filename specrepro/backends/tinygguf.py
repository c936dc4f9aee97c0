"""Tiny random llama-architecture GGUF checkpoints, written by the project with the ``gguf`` package.

What this file is: :func:`write_tiny_llama_gguf` writes a small decoder (a few dozen tokens, 1-2 layers, float32
tensors, random weights drawn from a ``torch.Generator``) with the SentencePiece-style tokenizer metadata llama.cpp
needs to load it; :func:`tiny_llama_gguf` caches one per (seed, shape) under ``$SPECREPRO_CACHE/tiny-gguf``. Two of
them with different seeds make a target/draft pair over a vocabulary small enough to enumerate, for the exactness
tests of the llama.cpp backend (:mod:`specrepro.backends.llamacpp`).

What it is not: a converter of real checkpoints (the zoo's GGUF files come from :func:`specrepro.models.fetch_gguf`),
nor a model transformers would give the same logits for (the tensors are written as llama.cpp reads them; no q/k
permutation is applied, since the reference here is llama.cpp itself).

Files are written atomically (temporary name in the same directory, then ``os.replace``) and are byte-for-byte
deterministic given the seed and shape.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specrepro.cache import build_entry
from specrepro.files import umask_mode
from specrepro.models import cache_dir

__all__ = ["TinyShape", "write_tiny_llama_gguf", "tiny_llama_gguf", "TINY_SPECIAL_TOKENS"]

#: the first token ids of every tiny vocabulary: unknown, BOS, EOS and the newline byte llama.cpp's SPM vocabulary
#: looks up when it loads (the rest are plain one-character pieces)
TINY_SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<0x0A>")
_PIECES = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


@dataclass(frozen=True)
class TinyShape:
    """The shape of a tiny llama checkpoint.

    Attributes:
        vocab: tokens V (>= 5: four special tokens, then one-character pieces; at most 66).
        n_layer: transformer blocks.
        n_embd: hidden size (a multiple of ``n_head``).
        n_head, n_head_kv: attention heads and key/value heads (``n_head`` a multiple of ``n_head_kv``).
        n_ff: feed-forward width.
        n_ctx: context length written into the file (llama.cpp's training context).
        sharpness: standard deviation of the logits (the output matrix is scaled so that each logit of the
            RMS-normalised last hidden state has about this spread): larger means more peaked next-token
            distributions, hence goodness-of-fit tests with more power on few outcomes.
    """

    vocab: int = 32
    n_layer: int = 2
    n_embd: int = 32
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 64
    n_ctx: int = 256
    sharpness: float = 3.0

    def check(self) -> None:
        """Raises ValueError for a shape llama.cpp (or the tokenizer written here) cannot take."""
        if not len(TINY_SPECIAL_TOKENS) < self.vocab <= len(TINY_SPECIAL_TOKENS) + len(_PIECES):
            raise ValueError(f"vocab must lie in ({len(TINY_SPECIAL_TOKENS)}, "
                             f"{len(TINY_SPECIAL_TOKENS) + len(_PIECES)}], got {self.vocab}")
        for name in ("n_layer", "n_embd", "n_head", "n_head_kv", "n_ff", "n_ctx"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head or self.n_head % self.n_head_kv or (self.n_embd // self.n_head) % 2:
            raise ValueError("n_embd must be a multiple of n_head with an even head size, and n_head a multiple of "
                             f"n_head_kv; got n_embd={self.n_embd}, n_head={self.n_head}, n_head_kv={self.n_head_kv}")
        if not (math.isfinite(self.sharpness) and self.sharpness > 0):
            raise ValueError(f"sharpness must be a finite number > 0, got {self.sharpness}")


def _random_tensors(shape: TinyShape, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors, float32, in llama.cpp's names; numpy/row-major shapes [out, in] (GGUF stores the
    reversed order, so llama.cpp sees ne = [in, out]). Drawn in a fixed order from ``generator``: embeddings, output
    matrix, then block 0, 1, ... (so the same seed with fewer layers gives this model's first layers and head)."""
    d, hd = shape.n_embd, shape.n_embd // shape.n_head
    kv = shape.n_head_kv * hd

    def randn(*dims, std):
        return torch.randn(*dims, generator=generator, dtype=torch.float32) * std

    # embeddings and head first, then the blocks in order: a model of the same seed with fewer layers is this one's
    # first layers under the same head (an early-exit draft)
    out = {"token_embd.weight": randn(shape.vocab, d, std=1.0),
           "output_norm.weight": torch.ones(d),
           "output.weight": randn(shape.vocab, d, std=shape.sharpness / math.sqrt(d))}
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        out[p + "attn_norm.weight"] = torch.ones(d)
        out[p + "attn_q.weight"] = randn(d, d, std=1.0 / math.sqrt(d))
        out[p + "attn_k.weight"] = randn(kv, d, std=1.0 / math.sqrt(d))
        out[p + "attn_v.weight"] = randn(kv, d, std=1.0 / math.sqrt(d))
        out[p + "attn_output.weight"] = randn(d, d, std=1.0 / math.sqrt(d))
        out[p + "ffn_norm.weight"] = torch.ones(d)
        out[p + "ffn_gate.weight"] = randn(shape.n_ff, d, std=1.0 / math.sqrt(d))
        out[p + "ffn_up.weight"] = randn(shape.n_ff, d, std=1.0 / math.sqrt(d))
        out[p + "ffn_down.weight"] = randn(d, shape.n_ff, std=1.0 / math.sqrt(shape.n_ff))
    return out


def write_tiny_llama_gguf(path: str | os.PathLike, generator: torch.Generator, shape: TinyShape = TinyShape(),
                          name: str = "specrepro-tiny-llama") -> Path:
    """Write a tiny random llama checkpoint as a GGUF file at ``path``, atomically.

    Weights: token embeddings N(0, 1); attention and feed-forward matrices N(0, 1/fan_in); RMS-norm weights 1; the
    output matrix N(0, sharpness² / n_embd), so that logits have standard deviation about ``shape.sharpness``. All
    float32 (GGML type F32), drawn from ``generator`` (a CPU ``torch.Generator``) in a fixed order: the same
    generator state and shape give the same bytes.

    Tokenizer: llama.cpp's SentencePiece ("llama") vocabulary of ``shape.vocab`` pieces, :data:`TINY_SPECIAL_TOKENS`
    (unknown 0, BOS 1, EOS 2, the newline byte 3) then one-character pieces; no BOS or EOS is added when tokenizing.

    Args:
        path: the file to write (its directory is created).
        generator: the only source of randomness.
        shape: the dimensions (:class:`TinyShape`).
        name: ``general.name`` in the file's metadata.

    Returns:
        ``Path(path)``.

    Raises:
        ValueError: an impossible shape (:meth:`TinyShape.check`).
    """
    import gguf

    shape.check()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = _random_tensors(shape, generator)
    pieces = list(TINY_SPECIAL_TOKENS) + list(_PIECES[: shape.vocab - len(TINY_SPECIAL_TOKENS)])
    types = ([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL, gguf.TokenType.BYTE]
             + [gguf.TokenType.NORMAL] * (shape.vocab - len(TINY_SPECIAL_TOKENS)))

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, arch="llama")
        w.add_name(name)
        w.add_context_length(shape.n_ctx)
        w.add_embedding_length(shape.n_embd)
        w.add_block_count(shape.n_layer)
        w.add_feed_forward_length(shape.n_ff)
        w.add_head_count(shape.n_head)
        w.add_head_count_kv(shape.n_head_kv)
        w.add_rope_dimension_count(shape.n_embd // shape.n_head)
        w.add_rope_freq_base(10000.0)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_vocab_size(shape.vocab)
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        w.add_tokenizer_model("llama")
        w.add_token_list(pieces)
        w.add_token_scores([0.0] * len(pieces))
        w.add_token_types([int(t) for t in types])
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(False)
        w.add_add_eos_token(False)
        for tname, t in tensors.items():
            w.add_tensor(tname, t.contiguous().numpy())
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.chmod(tmp, umask_mode())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def tiny_llama_gguf(seed: int, shape: TinyShape = TinyShape(), directory: str | os.PathLike | None = None) -> Path:
    """The tiny checkpoint of ``seed`` and ``shape``, written once (:func:`write_tiny_llama_gguf` with
    ``torch.Generator().manual_seed(seed)``) and cached under ``directory`` (default ``$SPECREPRO_CACHE/tiny-gguf``)
    by a name that spells out every input, so another seed or shape never reads a stale file; built under the
    rule of :func:`specrepro.cache.build_entry` (one writer, a damaged file rebuilt).

    Raises:
        ValueError: a seed that is not an integer, or an impossible shape.
    """
    if isinstance(seed, bool) or int(seed) != seed:
        raise ValueError(f"seed must be an integer, got {seed!r}")
    shape.check()
    key = "-".join(f"{k}{v}" for k, v in asdict(shape).items())
    root = Path(directory) if directory is not None else cache_dir() / "tiny-gguf"
    path = root / f"tiny-llama-seed{int(seed)}-{key}.gguf"
    return build_entry(path, lambda tmp: write_tiny_llama_gguf(tmp, torch.Generator().manual_seed(int(seed)), shape),
                       f"the tiny GGUF of seed {int(seed)}", kind="file")
