"""Medusa heads (Cai et al. 2024, arXiv 2401.10774, Eq. 1): the modules, their identity and their files.

What this file is: :class:`ResBlock` and :class:`MedusaHeads` (K residual blocks + vocabulary projections on the
target's last hidden state; ``share_lm_head`` routes every head through the target's own LM head), saving and loading
as safetensors keyed by a fingerprint of the base model (:func:`base_fingerprint`; heads for another base raise
:class:`HeadMismatchError`), and :func:`random_heads` for the exactness battery.

What it is not: training (:mod:`specrepro.train.medusa1`) or decoding (:mod:`specrepro.core.medusa`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from torch import nn

from specrepro.files import atomic_save_safetensors

__all__ = [
    "HeadMismatchError", "base_fingerprint", "base_name", "cache_key", "ResBlock", "MedusaHeads", "random_heads",
    "FORMAT_VERSION",
]


FORMAT_VERSION = 1


class HeadMismatchError(ValueError):
    """Medusa heads (or a distilled draft) were trained for another base model than the one given."""


# ----------------------------------------------------------------------------------------------------------------
# Base model identity
# ----------------------------------------------------------------------------------------------------------------

def base_fingerprint(model) -> str:
    """A short hex fingerprint (16 chars) of a base model's config and weights.

    Hashes the architecture-defining config fields and, for every parameter, its name, shape and a strided subsample
    of its values (every 257th element, float32 bytes): a different checkpoint or a different architecture gives a
    different fingerprint, and computing it takes well under a second for a 135M-parameter model. Memoized on the
    model object.
    """
    cached = getattr(model, "_specrepro_fingerprint", None)
    if cached is not None:
        return cached
    h = hashlib.sha256()
    cfg = model.config.to_dict()
    keep = {k: cfg.get(k) for k in ("model_type", "vocab_size", "hidden_size", "intermediate_size",
                                    "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                    "rope_theta", "rope_parameters", "tie_word_embeddings", "rms_norm_eps")}
    h.update(json.dumps(keep, sort_keys=True, default=str).encode())
    with torch.no_grad():
        for name, p in sorted(model.state_dict().items()):
            h.update(f"{name}:{tuple(p.shape)}".encode())
            h.update(p.detach().reshape(-1)[::257].float().cpu().numpy().tobytes())
    fp = h.hexdigest()[:16]
    try:
        model._specrepro_fingerprint = fp
    except AttributeError:
        pass
    return fp


def base_name(model) -> str:
    return str(getattr(model, "specrepro_name", None) or getattr(model.config, "_name_or_path", "") or "unnamed")


def cache_key(obj) -> str:
    """A stable 16-hex-digit key of a JSON-serializable object (cache file names)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------------------------------------------
# Heads
# ----------------------------------------------------------------------------------------------------------------

class ResBlock(nn.Module):
    """h + SiLU(W1 h + b1), float [..., H] -> [..., H]; W1 and b1 zero-initialised, so the block starts as identity.

    (Medusa zero-initialises only W1 and leaves b1 at PyTorch's default; we zero b1 too so a fresh head equals the
    LM head exactly, which the tests check.)
    """

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.act(self.linear(h))


class MedusaHeads(nn.Module):
    """K Medusa heads on the target's last-layer hidden state (Medusa Eq. 1).

    Args:
        hidden_size: H.
        vocab_size: V.
        n_heads: K >= 1 (Medusa uses 4 or 5; default 4).
        share_lm_head: if True every head projects with the target's frozen LM head (set with
            :meth:`attach_lm_head`; not saved), all K heads in ONE batched product (the LM head's weight is read
            once per step, which is what a memory-bound CPU step pays for); otherwise each head has its own
            trainable projection W2_k (float [V', H]) initialised from the LM head.
        base_name, base_fingerprint: identity of the base model (see :func:`base_fingerprint`).
        vocab_ids: optional long [V'] sorted unique token ids < V, the heads' vocabulary (FR-Spec-style
            restriction to frequent tokens, :func:`specrepro.drafters.compress.frequent_token_ids`): the heads only
            score these tokens and every other token gets logit -inf, i.e. probability 0 under any temperature.
            A proposal with q = 0 outside V' stays exact under multi-step speculative sampling (the verifier sees
            the q the children were drawn from), and greedy decoding still equals AR (the target decides). Saved
            with the heads. Default: the full vocabulary.

    Heads returned by :meth:`load` (or trained by :func:`~specrepro.train.stdlib.get_or_train_stdlib_heads`) carry
    ``source_dir``, the directory they live in (an ``accuracy.csv`` there gives the bench its tree).

    Forward: ``h`` float [..., H] -> logits float [K, ..., V]; row k-1 predicts token t+k+1 (with ``vocab_ids``,
    -inf outside them). :meth:`forward_restricted` returns the [K, ..., V'] logits over ``vocab_ids`` only.

    Raises:
        ValueError: n_heads < 1, non-positive sizes, or ``vocab_ids`` not sorted unique ids in [0, V).
    """

    def __init__(self, hidden_size: int, vocab_size: int, n_heads: int = 4, share_lm_head: bool = False,
                 base_name: str = "", base_fingerprint: str = "", vocab_ids: torch.Tensor | None = None):
        super().__init__()
        if n_heads < 1 or hidden_size < 1 or vocab_size < 1:
            raise ValueError(f"need n_heads, hidden_size, vocab_size >= 1, got {n_heads}, {hidden_size}, {vocab_size}")
        self.hidden_size, self.vocab_size, self.n_heads = int(hidden_size), int(vocab_size), int(n_heads)
        self.share_lm_head = bool(share_lm_head)
        self.base_name, self.base_fingerprint = base_name, base_fingerprint
        if vocab_ids is not None:
            vocab_ids = torch.as_tensor(vocab_ids, dtype=torch.long).reshape(-1).cpu()
            if vocab_ids.numel() < 1 or bool((vocab_ids < 0).any()) or bool((vocab_ids >= vocab_size).any()) or \
                    (vocab_ids.numel() > 1 and not bool((vocab_ids[1:] > vocab_ids[:-1]).all())):
                raise ValueError(f"vocab_ids must be sorted unique token ids in [0, {vocab_size}), got "
                                 f"{vocab_ids.numel()} ids")
            if vocab_ids.numel() == vocab_size:
                vocab_ids = None  # the whole vocabulary: no restriction
        # a buffer so it moves with .to(device) and is saved in the state dict
        self.register_buffer("vocab_ids", vocab_ids, persistent=vocab_ids is not None)
        n_out = self.vocab_size if vocab_ids is None else int(vocab_ids.numel())
        self.blocks = nn.ModuleList(ResBlock(hidden_size) for _ in range(n_heads))
        if share_lm_head:
            self.projections = None
            self._shared = None  # a frozen [V', H] weight (the LM head's rows), attached with attach_lm_head
        else:
            self.projections = nn.ModuleList(nn.Linear(hidden_size, n_out, bias=False) for _ in range(n_heads))

    @property
    def n_vocab(self) -> int:
        """V': the number of tokens the heads score (V without ``vocab_ids``)."""
        return self.vocab_size if self.vocab_ids is None else int(self.vocab_ids.numel())

    @classmethod
    def from_base(cls, model, n_heads: int = 4, share_lm_head: bool = False,
                  vocab_ids: torch.Tensor | None = None) -> "MedusaHeads":
        """Fresh heads for ``model`` (a transformers causal LM): zero-initialised residual blocks, projections copied
        from (or, with ``share_lm_head``, shared with) the model's LM head (its ``vocab_ids`` rows when given)."""
        w = model.get_output_embeddings().weight
        heads = cls(w.shape[1], w.shape[0], n_heads, share_lm_head, base_name(model), base_fingerprint(model),
                    vocab_ids=vocab_ids)
        heads.to(device=w.device, dtype=w.dtype)
        if share_lm_head:
            heads.attach_lm_head(model)
        else:
            rows = w if heads.vocab_ids is None else w[heads.vocab_ids.to(w.device)]
            with torch.no_grad():
                for proj in heads.projections:
                    proj.weight.copy_(rows)
        return heads

    def attach_lm_head(self, model) -> None:
        """Use ``model``'s LM head weight (float [V, H], frozen) as the shared projection: the weight itself (not
        copied) for the full vocabulary, a contiguous copy of its ``vocab_ids`` rows (float [V', H]) otherwise."""
        w = model.get_output_embeddings().weight
        if tuple(w.shape) != (self.vocab_size, self.hidden_size):
            raise HeadMismatchError(f"LM head of shape {tuple(w.shape)} does not fit heads of H={self.hidden_size}, "
                                    f"V={self.vocab_size}")
        w = w.detach()
        self._shared = w if self.vocab_ids is None else w[self.vocab_ids.to(w.device)].contiguous()

    def _apply(self, fn, *args, **kwargs):
        # keep the attached (unregistered) shared projection on the heads' device and dtype
        out = super()._apply(fn, *args, **kwargs)
        if getattr(self, "_shared", None) is not None:
            self._shared = fn(self._shared)
        return out

    def forward_restricted(self, h: torch.Tensor) -> torch.Tensor:
        """Head logits over the heads' vocabulary only: float [..., H] -> float [K, ..., V'] (column j scores token
        ``vocab_ids[j]``; V' = V and column j = token j without ``vocab_ids``).

        Raises:
            RuntimeError: shared-LM-head heads used before :meth:`attach_lm_head`.
        """
        z = torch.stack([self.blocks[k](h) for k in range(self.n_heads)])  # [K, ..., H]
        if self.projections is not None:
            return torch.stack([self.projections[k](z[k]) for k in range(self.n_heads)])
        if self._shared is None:
            raise RuntimeError("shared-LM-head Medusa heads need attach_lm_head(model) before use")
        return z @ self._shared.T  # one product for all K heads: the weight is read once

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        logits = self.forward_restricted(h)
        if self.vocab_ids is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        full[..., self.vocab_ids.to(logits.device)] = logits
        return full

    def config(self) -> dict:
        """The JSON config saved beside the weights."""
        return {"format_version": FORMAT_VERSION, "kind": "medusa_heads", "hidden_size": self.hidden_size,
                "vocab_size": self.vocab_size, "n_heads": self.n_heads, "share_lm_head": self.share_lm_head,
                "base_model": self.base_name, "base_fingerprint": self.base_fingerprint,
                "n_vocab": self.n_vocab}

    def save(self, directory: str | Path) -> Path:
        """Write ``heads.safetensors`` and ``config.json`` into ``directory`` (atomically); returns the directory."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu() for k, v in self.state_dict().items()}
        atomic_save_safetensors(state, d / "heads.safetensors", {"base_fingerprint": self.base_fingerprint})
        from specrepro.files import atomic_write_text

        atomic_write_text(d / "config.json", json.dumps(self.config(), indent=1, sort_keys=True) + "\n")
        return d

    @classmethod
    def load(cls, directory: str | Path, model=None) -> "MedusaHeads":
        """Load heads saved by :meth:`save`; with ``model`` check that they were trained for it and put them on its
        device/dtype (and attach its LM head for shared heads).

        Raises:
            FileNotFoundError: no saved heads in ``directory``.
            HeadMismatchError: ``model``'s fingerprint differs from the one the heads were trained for (the message
                names both base models).
        """
        from safetensors.torch import load_file

        d = Path(directory)
        if not (d / "config.json").exists() or not (d / "heads.safetensors").exists():
            raise FileNotFoundError(f"no Medusa heads (config.json + heads.safetensors) in {d}")
        cfg = json.loads((d / "config.json").read_text())
        if cfg.get("kind") != "medusa_heads":
            raise ValueError(f"{d} does not hold Medusa heads (kind {cfg.get('kind')!r})")
        if model is not None:
            fp = base_fingerprint(model)
            if fp != cfg["base_fingerprint"]:
                raise HeadMismatchError(
                    f"these Medusa heads were trained for base model {cfg['base_model']!r} (fingerprint "
                    f"{cfg['base_fingerprint']}), not for {base_name(model)!r} (fingerprint {fp}); train heads for "
                    f"this model instead")
        state = load_file(str(d / "heads.safetensors"))
        heads = cls(cfg["hidden_size"], cfg["vocab_size"], cfg["n_heads"], cfg["share_lm_head"], cfg["base_model"],
                    cfg["base_fingerprint"], vocab_ids=state.get("vocab_ids"))
        heads.load_state_dict(state)
        if model is not None:
            w = model.get_output_embeddings().weight
            heads.to(device=w.device, dtype=w.dtype)
            if heads.share_lm_head:
                heads.attach_lm_head(model)
        heads.source_dir = d  # where they came from (accuracy.csv may lie beside them)
        return heads.eval()



def random_heads(model, n_heads: int = 3, *, scale: float = 0.6, seed: int = 0) -> MedusaHeads:
    """Untrained Medusa heads with random ResBlock weights W1 ~ N(0, scale²) (float32), so that each head's
    distribution differs from the LM head's: proposals for simulations with tiny random models, not for decoding.

    Raises:
        ValueError: as :meth:`MedusaHeads.from_base`.
    """
    heads = MedusaHeads.from_base(model, n_heads)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for b in heads.blocks:
            b.linear.weight.copy_(scale * torch.randn(b.linear.weight.shape, generator=g))
    return heads.eval().requires_grad_(False)
