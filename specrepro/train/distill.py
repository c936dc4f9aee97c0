"""A distilled draft model (DistillSpec-style): a few-layer copy of the target trained by KL distillation.

What this file is: the recipe of Zhou et al. 2024 ("DistillSpec", arXiv 2310.08461) at CPU scale. The draft shares
the target's tokenizer and architecture with fewer layers: :func:`init_draft_from_target` copies the target's
embeddings, final norm, LM head and a chosen subset of its decoder layers (default: the first three and the last)
into a new model of the same class. :func:`train_distilled_draft` then minimises the forward KL divergence
KL(p_target || q_draft) on the target's own generations (the same self-distillation data as the Medusa heads,
:func:`specrepro.train.medusa1.self_distillation_data`; DistillSpec's "on-policy"-like data from the target), where the
target's distributions come from its cached last-layer hidden states through its LM head (no second target pass).
Since the acceptance rate is α = 1 − E[TV(p, q)] (Leviathan Def. 3.1), any divergence that pulls q towards p raises
α; DistillSpec finds forward KL a solid default. :func:`get_or_train_draft` caches the trained draft under
``specrepro.models.cache_dir()/distill/<key>/`` (safetensors, keyed by base model, data and hyper-parameters).

The result is a plain transformers causal LM: use it as :class:`specrepro.drafters.model.DraftModelDrafter` (chain) or
:class:`specrepro.core.trees.DraftTreeProposer` (token trees).

What it is not: Medusa heads (:mod:`specrepro.core.medusa`) or a general distillation library (no sequence-level or
mixed-policy data, one divergence).
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specrepro.core.medusa_heads import (
    HeadMismatchError,
    base_fingerprint,
    base_name,
    cache_key,
)
from specrepro.train.medusa1 import SelfDistillationData, warmup_cosine

__all__ = ["DistillConfig", "init_draft_from_target", "train_distilled_draft", "get_or_train_draft", "load_draft",
           "draft_kl"]

FORMAT_VERSION = 1


@dataclass(frozen=True)
class DistillConfig:
    """Hyper-parameters of the distilled draft.

    Attributes:
        layers: indices of the target's decoder layers copied into the draft, in order (negative = from the end).
        lr: AdamW peak learning rate; linear warm-up then cosine decay.
        epochs: passes over the sequences.
        batch_size: sequences per optimizer step (right-padded).
        temperature: distillation temperature applied to both target and draft logits (1 = the plain distributions).
        train_embeddings: also train the (tied) embeddings / LM head; off by default: cheaper, and the draft keeps
            the target's output space.
        max_steps: optional cap on optimizer steps (the quick profile).
        warmup: fraction of steps warming up.
        seed: seeds the torch.Generator that shuffles sequences.
    """

    layers: tuple = (0, 1, 2, -1)
    lr: float = 5e-4
    epochs: int = 2
    batch_size: int = 4
    temperature: float = 1.0
    train_embeddings: bool = False
    max_steps: int | None = None
    warmup: float = 0.05
    seed: int = 0

    def __post_init__(self):
        if not self.layers or self.epochs < 1 or self.batch_size < 1 or not self.lr > 0 or not self.temperature > 0:
            raise ValueError(f"impossible distillation config {self}")


def init_draft_from_target(target, layers=(0, 1, 2, -1)):
    """A new causal LM of the target's class with ``len(layers)`` decoder layers copied from the target, plus its
    embeddings, final norm and LM head (so the draft shares the target's tokenizer and output space).

    Args:
        target: a transformers decoder-only causal LM with ``model.layers`` (llama, qwen2, ...).
        layers: target layer indices (negative counts from the end), e.g. (0, 1, 2, -1).

    Returns:
        the draft model (eval mode, float like the target, on the target's device), with attribute
        ``specrepro_name`` = "<target name>-draft<n>".

    Raises:
        ValueError: a layer index out of range or a duplicate.
    """
    from transformers import AutoModelForCausalLM

    n_t = target.config.num_hidden_layers
    idx = [i % n_t if -n_t <= i < n_t else None for i in layers]
    if None in idx or len(set(idx)) != len(idx):
        raise ValueError(f"layers {layers} must be distinct indices of the target's {n_t} layers")
    cfg = copy.deepcopy(target.config)
    cfg.num_hidden_layers = len(idx)
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = [cfg.layer_types[i] for i in idx]
    with torch.random.fork_rng():  # the random init is overwritten; keep the global RNG untouched
        draft = AutoModelForCausalLM.from_config(cfg, dtype=target.dtype)
    src = target.state_dict()
    state = {}
    for name in draft.state_dict():
        if ".layers." in name:
            pre, rest = name.split(".layers.", 1)
            j, tail = rest.split(".", 1)
            state[name] = src[f"{pre}.layers.{idx[int(j)]}.{tail}"]
        else:
            state[name] = src[name]
    draft.load_state_dict(state)
    draft.to(target.device).eval()
    draft.specrepro_name = f"{base_name(target)}-draft{len(idx)}"
    return draft


def _sequences(data: SelfDistillationData):
    """Per sequence: (tokens long [P + R], first predicting position P - 1, hidden float [R, H])."""
    for p, r, h in zip(data.prompts, data.responses, data.hidden):
        if r.numel():
            yield torch.cat([p, r]), p.numel() - 1, h


def draft_kl(target, draft, data: SelfDistillationData, temperature: float = 1.0, grad: bool = False,
             batch=None) -> tuple[torch.Tensor, int]:
    """Mean forward KL(p_target || q_draft) over the response positions of ``data`` (or of ``batch``, a list of
    :func:`_sequences` items); returns (mean KL in nats as a 0-dim tensor, number of positions).

    Also used for evaluation: with ``grad=False`` no graph is built.
    """
    items = batch if batch is not None else list(_sequences(data))
    dev = draft.device
    L = max(t.numel() for t, _, _ in items)
    ids = torch.zeros(len(items), L, dtype=torch.long)
    mask = torch.zeros(len(items), L, dtype=torch.long)
    for i, (t, _, _) in enumerate(items):
        ids[i, : t.numel()] = t
        mask[i, : t.numel()] = 1
    with torch.set_grad_enabled(grad):
        out = draft(input_ids=ids.to(dev), attention_mask=mask.to(dev))
        total, count = out.logits.new_zeros(()), 0
        lm_head = target.get_output_embeddings()
        for i, (t, start, h) in enumerate(items):
            r = h.shape[0]
            q_log = torch.log_softmax(out.logits[i, start: start + r].float() / temperature, -1)
            with torch.no_grad():
                p_log = torch.log_softmax(lm_head(h.to(dev, lm_head.weight.dtype)).float() / temperature, -1)
            total = total + (p_log.exp() * (p_log - q_log)).sum()
            count += r
    return total / max(1, count), count


def train_distilled_draft(target, data: SelfDistillationData, config: DistillConfig = DistillConfig(),
                          progress: bool = True):
    """Distil ``target`` into a few-layer draft by minimising KL(p_target || q_draft) on the target's generations.

    Args:
        target: the target causal LM (frozen, not modified).
        data: :class:`~specrepro.train.medusa1.SelfDistillationData` of the target.
        config: :class:`DistillConfig`.

    Returns:
        (draft model in eval mode with gradients off, losses: pandas DataFrame with columns step, kl (nats), lr).

    Raises:
        ValueError: no response tokens in ``data``.
    """
    import pandas as pd
    from tqdm.auto import tqdm

    items = list(_sequences(data))
    if not items:
        raise ValueError("no response tokens to distil on")
    draft = init_draft_from_target(target, config.layers)
    draft.train()
    for name, p in draft.named_parameters():
        p.requires_grad_(config.train_embeddings or not ("embed_tokens" in name or "lm_head" in name))
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(config.seed)
    per_epoch = math.ceil(len(items) / config.batch_size)
    total = per_epoch * config.epochs if config.max_steps is None else min(per_epoch * config.epochs, config.max_steps)
    warm = max(1, int(config.warmup * total))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, warm, total))
    rows, step = [], 0
    bar = tqdm(total=total, desc="distil draft", disable=not progress)
    while step < total:
        perm = torch.randperm(len(items), generator=gen).tolist()
        for s in range(0, len(perm), config.batch_size):
            if step >= total:
                break
            batch = [items[i] for i in perm[s: s + config.batch_size]]
            loss, _ = draft_kl(target, draft, data, config.temperature, grad=True, batch=batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            rows.append({"step": step, "kl": loss.item(), "lr": float(sched.get_last_lr()[0])})
            step += 1
            bar.update(1)
            bar.set_postfix(kl=f"{loss.item():.3f}")
    bar.close()
    draft.eval().requires_grad_(False)
    return draft, pd.DataFrame(rows)


def _meta(target, config: DistillConfig, data: SelfDistillationData) -> dict:
    return {"format_version": FORMAT_VERSION, "kind": "distilled_draft", "base_model": base_name(target),
            "base_fingerprint": base_fingerprint(target), "config": asdict(config), "data": data.meta,
            "n_tokens": data.n_tokens, "n_seq": len(data.responses)}


def load_draft(directory: str | Path, target=None):
    """Load a draft saved by :func:`get_or_train_draft`; with ``target``, check it was distilled from it.

    Raises:
        FileNotFoundError: nothing saved there.
        HeadMismatchError: the draft was distilled from another base model.
    """
    from transformers import AutoModelForCausalLM

    d = Path(directory)
    if not (d / "specrepro_draft.json").exists():
        raise FileNotFoundError(f"no distilled draft in {d}")
    meta = json.loads((d / "specrepro_draft.json").read_text())
    if target is not None and base_fingerprint(target) != meta["base_fingerprint"]:
        raise HeadMismatchError(f"this draft was distilled from {meta['base_model']!r} (fingerprint "
                                f"{meta['base_fingerprint']}), not from {base_name(target)!r} "
                                f"(fingerprint {base_fingerprint(target)})")
    kw = {} if target is None else {"dtype": target.dtype}
    draft = AutoModelForCausalLM.from_pretrained(d, **kw)
    if target is not None:
        draft.to(target.device)
    draft.eval().requires_grad_(False)
    draft.specrepro_name = f"{meta['base_model']}-draft{len(meta['config']['layers'])}"
    return draft


def get_or_train_draft(target, data: SelfDistillationData, config: DistillConfig = DistillConfig(),
                       progress: bool = True, cache: bool = True):
    """The distilled draft for ``target`` from the cache, or distil and cache it.

    Returns:
        (draft model, losses DataFrame, cached: bool — True when loaded rather than trained).
    """
    import pandas as pd

    from specrepro.cache import build_entry, check_entry, entry_lock
    from specrepro.files import atomic_write_text
    from specrepro.models import cache_dir

    meta = _meta(target, config, data)
    d = cache_dir() / "distill" / cache_key(meta)
    if not cache:
        return (*train_distilled_draft(target, data, config, progress=progress), False)
    with entry_lock(d, "a distilled draft"):  # one trainer at a time; a second waits and loads the first one's
        if check_entry(d) is None:
            return load_draft(d, target), pd.read_csv(d / "losses.csv"), True
        draft, losses = train_distilled_draft(target, data, config, progress=progress)

        def save(tmp):
            draft.save_pretrained(tmp, safe_serialization=True)
            atomic_write_text(tmp / "specrepro_draft.json", json.dumps(meta, indent=1, sort_keys=True,
                                                                       default=str) + "\n")
            atomic_write_text(tmp / "losses.csv", losses.to_csv(index=False))

        build_entry(d, save, "a distilled draft")
    return draft, losses, False
