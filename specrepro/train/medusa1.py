"""Medusa-1 training by self-distillation: the data, the training loop, the cache, the heads' accuracy.

What this file is: the target's own generations with their last-layer hidden states (:func:`self_distillation_data`,
Medusa Sec. 3.3.1, cached as safetensors keyed by their inputs), Medusa-1 training with the backbone frozen
(:func:`train_medusa_heads`, loss Σ_k 0.8^k CE_k, Medusa Sec. 3.2.1), :func:`get_or_train_heads` (trained heads
cached under ``specrepro.models.cache_dir()``), and per-head top-k accuracy (:func:`head_topk_accuracy`).

What it is not: the heads' modules (:mod:`specrepro.core.medusa_heads`) or decoding (:mod:`specrepro.core.medusa`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from specrepro.core.decoding import resolve_eos
from specrepro.core.kvcache import new_cache
from specrepro.core.medusa_heads import (
    FORMAT_VERSION,
    MedusaHeads,
    base_fingerprint,
    base_name,
    cache_key,
)
from specrepro.core.sampling import GREEDY, SamplingConfig, logits_to_probs, sample
from specrepro.files import atomic_save_safetensors

__all__ = [
    "SelfDistillationData", "self_distillation_data", "MedusaTrainConfig", "train_medusa_heads",
    "get_or_train_heads", "head_topk_accuracy", "warmup_cosine",
]


# ----------------------------------------------------------------------------------------------------------------
# Self-distillation data
# ----------------------------------------------------------------------------------------------------------------

@dataclass
class SelfDistillationData:
    """The target's own generations and the hidden states that produced them.

    Attributes:
        prompts: list of long [P_i] prompt token ids (possibly truncated to their last ``max_prompt_tokens``).
        responses: list of long [R_i] generated token ids (EOS included if generated).
        hidden: list of float [R_i, H]: ``hidden[i][j]`` is the target's last-layer hidden state (after the final
            norm, ``hidden_states[-1]``) at the position whose next token is ``responses[i][j]``; the LM head on it
            gives the target's distribution of that token, head k on it predicts ``responses[i][j + k]``.
        meta: the generation settings (for cache keys and provenance).
        teacher_ids, teacher_probs: optional lists of long [R_i, k] / float [R_i, k]: the backbone's k most likely
            next tokens at each position and their probabilities (softmax of the LM head on ``hidden[i][j]``,
            descending), the soft targets of self-distillation by KL (Medusa Sec. 3.3.1); None for generated data,
            whose targets are the generated tokens.
    """

    prompts: list
    responses: list
    hidden: list
    meta: dict = field(default_factory=dict)
    teacher_ids: list | None = None
    teacher_probs: list | None = None

    @property
    def n_tokens(self) -> int:
        return int(sum(r.numel() for r in self.responses))

    def split(self, n_eval: int) -> tuple["SelfDistillationData", "SelfDistillationData"]:
        """(train, held-out) by sequence: the last ``n_eval`` sequences are held out."""
        n = len(self.responses) - n_eval
        if n < 1 or n_eval < 0:
            raise ValueError(f"cannot hold out {n_eval} of {len(self.responses)} sequences")
        cut = lambda a, b: SelfDistillationData(
            self.prompts[a:b], self.responses[a:b], self.hidden[a:b], self.meta,
            None if self.teacher_ids is None else self.teacher_ids[a:b],
            None if self.teacher_probs is None else self.teacher_probs[a:b])
        return cut(0, n), cut(n, len(self.responses))

    def save(self, path: Path) -> None:
        tensors = {}
        for i, (p, r, h) in enumerate(zip(self.prompts, self.responses, self.hidden)):
            tensors[f"prompt.{i}"], tensors[f"response.{i}"], tensors[f"hidden.{i}"] = p, r, h
        if self.teacher_ids is not None:
            for i, (ti, tp) in enumerate(zip(self.teacher_ids, self.teacher_probs)):
                tensors[f"teacher_ids.{i}"], tensors[f"teacher_probs.{i}"] = ti, tp
        atomic_save_safetensors(tensors, path, {"meta": json.dumps(self.meta, sort_keys=True),
                                                 "n": str(len(self.prompts))})

    @classmethod
    def load(cls, path: Path) -> "SelfDistillationData":
        from safetensors import safe_open

        with safe_open(str(path), "pt") as f:
            md = f.metadata()
            n = int(md["n"])
            get = f.get_tensor
            soft = n > 0 and "teacher_ids.0" in f.keys()
            return cls([get(f"prompt.{i}") for i in range(n)], [get(f"response.{i}") for i in range(n)],
                       [get(f"hidden.{i}") for i in range(n)], json.loads(md["meta"]),
                       [get(f"teacher_ids.{i}") for i in range(n)] if soft else None,
                       [get(f"teacher_probs.{i}") for i in range(n)] if soft else None)


@torch.inference_mode()
def _batched_generate(model, prompts: list, max_new_tokens: int, sampling: SamplingConfig,
                      generator: torch.Generator | None, eos: set, pad_id: int):
    """Left-padded batched KV-cached decoding of one batch; returns (responses, hiddens) per row.

    Positions ids count real tokens only (0 for pads), the 2D attention mask hides the pads, so each row is decoded
    as if alone (up to floating-point differences of batched matrix products).
    """
    device = model.device
    b = len(prompts)
    lens = torch.tensor([p.numel() for p in prompts])
    L = int(lens.max())
    ids = torch.full((b, L), pad_id, dtype=torch.long)
    mask = torch.zeros((b, L), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, L - p.numel():] = p
        mask[i, L - p.numel():] = 1
    ids, mask = ids.to(device), mask.to(device)
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    cache = new_cache(model)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True,
                output_hidden_states=True, logits_to_keep=1)
    next_pos = pos[:, -1:] + 1
    done = torch.zeros(b, dtype=torch.bool)
    toks, hids = [], []
    for _ in range(max_new_tokens):
        h = out.hidden_states[-1][:, -1].float().cpu()
        probs = logits_to_probs(out.logits[:, -1], sampling)
        x = probs.argmax(-1) if sampling.greedy else sample(probs, generator)
        toks.append(x.cpu())
        hids.append(h)
        done |= torch.tensor([int(t) in eos for t in x.tolist()])
        if bool(done.all()):
            break
        mask = torch.cat([mask, mask.new_ones(b, 1)], dim=1)
        out = model(input_ids=x[:, None].to(device), attention_mask=mask, position_ids=next_pos,
                    past_key_values=cache, use_cache=True, output_hidden_states=True)
        next_pos = next_pos + 1
    T = torch.stack(toks, 1)
    H = torch.stack(hids, 1)
    responses, hiddens = [], []
    for i in range(b):
        r = T[i]
        stop = next((j for j, t in enumerate(r.tolist()) if t in eos), None)
        n = r.numel() if stop is None else stop + 1
        responses.append(r[:n].clone())
        hiddens.append(H[i, :n].clone())
    return responses, hiddens


def self_distillation_data(target, tokenizer, prompts, *, max_new_tokens: int = 128, max_prompt_tokens: int = 192,
                           sampling: SamplingConfig = GREEDY, seed: int = 0, batch_size: int = 8,
                           cache: bool = True, progress: bool = True,
                           eos_token_id: int | list[int] | None = None) -> SelfDistillationData:
    """Generate the target's own continuations of ``prompts`` and record the hidden states (Medusa Sec. 3.3.1,
    self-distillation), cached as safetensors under ``cache_dir()/medusa/data`` keyed by the base model's
    fingerprint, the prompt texts and these settings.

    Args:
        target: a transformers causal LM.
        tokenizer: its tokenizer (prompts are encoded as raw text, like the experiments do); may be None when every
            prompt is already a token-id tensor (tiny test models).
        prompts: list of :class:`~specrepro.data.Prompt`, str, or long [P] tensors.
        max_new_tokens: generated tokens per prompt (fewer at EOS).
        max_prompt_tokens: prompts longer than this keep their last ``max_prompt_tokens`` tokens.
        sampling: greedy (default) or a sampling config; sampled data use ``torch.Generator().manual_seed(seed)``.
        batch_size: prompts decoded together (left padding).
        eos_token_id: stop token(s); default the tokenizer's EOS.

    Returns:
        :class:`SelfDistillationData` with hidden states as float32 on the CPU.

    Raises:
        ValueError: no prompts, max_new_tokens < 1.
    """
    from tqdm.auto import tqdm

    from specrepro.cache import locked
    from specrepro.models import cache_dir

    texts = [p if isinstance(p, (str, torch.Tensor)) else p.text for p in prompts]
    if not texts:
        raise ValueError("self_distillation_data needs at least one prompt")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if tokenizer is None and not all(isinstance(t, torch.Tensor) for t in texts):
        raise ValueError("text prompts need a tokenizer")
    if eos_token_id is None and tokenizer is not None:
        eos_token_id = tokenizer.eos_token_id
    eos = resolve_eos(eos_token_id)
    meta = {"base": base_fingerprint(target), "base_name": base_name(target), "max_new_tokens": max_new_tokens,
            "eos": sorted(eos), "max_prompt_tokens": max_prompt_tokens, "sampling": asdict(sampling), "seed": seed,
            "batch_size": batch_size, "n_prompts": len(texts),
            "prompts": cache_key([t.tolist() if isinstance(t, torch.Tensor) else t for t in texts])}
    path = cache_dir() / "medusa" / "data" / f"selfdistill-{cache_key(meta)}.safetensors"
    with locked(path if cache else None, "Medusa self-distillation data"):  # one writer; a second reuses
        if cache and path.exists():
            return SelfDistillationData.load(path)
        pad = getattr(tokenizer, "pad_token_id", None)
        pad = pad if pad is not None else (min(eos) if eos else 0)
        enc = [(t.reshape(-1).long() if isinstance(t, torch.Tensor) else tokenizer(t, return_tensors="pt").input_ids[0])
               [-max_prompt_tokens:] for t in texts]
        gen = None if sampling.greedy else torch.Generator(device=target.device).manual_seed(seed)
        # batch prompts of similar length together (less padding), keep the original order in the output
        order = sorted(range(len(enc)), key=lambda i: enc[i].numel())
        responses, hiddens = [None] * len(enc), [None] * len(enc)
        for s in tqdm(range(0, len(order), batch_size), desc="self-distillation data", disable=not progress):
            idx = order[s: s + batch_size]
            r, h = _batched_generate(target, [enc[i] for i in idx], max_new_tokens, sampling, gen, eos, pad)
            for i, ri, hi in zip(idx, r, h):
                responses[i], hiddens[i] = ri, hi
        data = SelfDistillationData(enc, responses, hiddens, meta)
        if cache:
            data.save(path)
        return data


def _head_examples(data: SelfDistillationData, n_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden float [T, H], labels long [T, K]) over every response position; label -100 past the sequence end.

    Head k's label at position j is token j + k of the response; with teacher distributions (teacher-forced data)
    it is the backbone's most likely token there instead (what greedy verification accepts)."""
    hs, ls = [], []
    tops = data.teacher_ids if data.teacher_ids is not None else [None] * len(data.responses)
    for r, h, t in zip(data.responses, data.hidden, tops):
        n = r.numel()
        src = r if t is None else t[:, 0]
        lab = torch.full((n, n_heads), -100, dtype=torch.long)
        for k in range(1, n_heads + 1):
            if n > k:
                lab[: n - k, k - 1] = src[k:]
        hs.append(h)
        ls.append(lab)
    return torch.cat(hs), torch.cat(ls)


def _soft_head_targets(data: SelfDistillationData, n_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids long [T, K, k], probs float [T, K, k]): head k's soft target at position j is the backbone's top-k
    distribution of token j + k (zero probability past the sequence end)."""
    ids_all, pr_all = [], []
    for ti, tp in zip(data.teacher_ids, data.teacher_probs):
        n, k = ti.shape
        ids = torch.zeros((n, n_heads, k), dtype=torch.long)
        pr = torch.zeros((n, n_heads, k), dtype=torch.float32)
        for h in range(1, n_heads + 1):
            if n > h:
                ids[: n - h, h - 1] = ti[h:]
                pr[: n - h, h - 1] = tp[h:].float()
        ids_all.append(ids)
        pr_all.append(pr)
    return torch.cat(ids_all), torch.cat(pr_all)


def _soft_loss(logits_r: torch.Tensor, ids: torch.Tensor, probs: torch.Tensor, full_to_r: torch.Tensor):
    """Per-head cross-entropy to the backbone's (renormalized) top-k distribution, over the heads' vocabulary.

    logits_r float [K, B, V'], ids long [B, K, k], probs float [B, K, k], full_to_r long [V] (-1: not in V').
    Returns float [K] (mean over positions with a target); equals KL(p || q) up to p's entropy."""
    col = full_to_r[ids]  # [B, K, k]
    p = probs * (col >= 0)
    z = p.sum(-1, keepdim=True)
    valid = z.squeeze(-1) > 0  # [B, K]
    p = p / z.clamp_min(1e-12)
    logq = torch.log_softmax(logits_r.float(), dim=-1).permute(1, 0, 2)  # [B, K, V']
    ce = -(p * logq.gather(-1, col.clamp_min(0))).sum(-1)  # [B, K]
    ce = torch.where(valid, ce, torch.zeros_like(ce))
    return ce.sum(0) / valid.sum(0).clamp_min(1)


# ----------------------------------------------------------------------------------------------------------------
# Medusa-1 training
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MedusaTrainConfig:
    """Hyper-parameters of Medusa-1 training (frozen backbone).

    Attributes:
        n_heads: K.
        share_lm_head: see :class:`MedusaHeads` (cheaper; Medusa trains one projection per head).
        lr: AdamW peak learning rate (Medusa-1 uses 1e-3), linear warm-up then cosine decay to 0.
        epochs: passes over the training positions.
        batch_size: positions per optimizer step (positions are i.i.d. given the cached hidden states).
        weight_decay: AdamW weight decay.
        decay: λ_k = decay^k in the loss Σ_k λ_k CE_k (Medusa: 0.8).
        warmup: fraction of steps spent warming up.
        max_steps: optional cap on optimizer steps (the quick profile).
        seed: seeds the torch.Generator that shuffles positions.
    """

    n_heads: int = 4
    share_lm_head: bool = False
    lr: float = 1e-3
    epochs: int = 2
    batch_size: int = 64
    weight_decay: float = 0.0
    decay: float = 0.8
    warmup: float = 0.05
    max_steps: int | None = None
    seed: int = 0

    def __post_init__(self):
        if self.n_heads < 1 or self.epochs < 1 or self.batch_size < 1 or not self.lr > 0:
            raise ValueError(f"impossible Medusa training config {self}")
        if not 0 < self.decay <= 1:
            raise ValueError(f"decay must lie in (0, 1], got {self.decay}")


def warmup_cosine(step: int, warm: int, total: int) -> float:
    """Learning-rate factor: linear warm-up over ``warm`` steps, then cosine decay to 0 at ``total``."""
    if step < warm:
        return (step + 1) / warm
    return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))


def train_medusa_heads(target, data: SelfDistillationData, config: MedusaTrainConfig = MedusaTrainConfig(),
                       heads: MedusaHeads | None = None, progress: bool = True, *,
                       vocab_ids: torch.Tensor | None = None, checkpoint: str | Path | None = None,
                       checkpoint_every: int = 100):
    """Medusa-1 training on cached hidden states: the backbone is frozen, loss = Σ_k 0.8^k L_k (Medusa Sec. 3.2.1).

    L_k is head k's cross-entropy to the generated token (generated self-distillation data) or, when ``data``
    carries the backbone's own distributions (``teacher_ids``/``teacher_probs``, teacher-forced data), to the
    backbone's renormalized top-k distribution of that token (self-distillation by KL, Medusa Sec. 3.3.1), over the
    heads' vocabulary.

    Args:
        target: the base model (for the LM-head initialisation and the fingerprint); not modified.
        data: :class:`SelfDistillationData` (its hidden states are the heads' inputs).
        config: :class:`MedusaTrainConfig`.
        heads: continue training these heads (default: fresh :meth:`MedusaHeads.from_base`).
        vocab_ids: the fresh heads' vocabulary (see :class:`MedusaHeads`); default the full vocabulary.
        checkpoint: a directory for resumable training: every ``checkpoint_every`` optimizer steps the heads, the
            optimizer and the loss rows are written there atomically, and a call with the same directory resumes from
            the last one (positions are shuffled by the seeded generator, replayed on resume, so a resumed run takes
            the same batches as an uninterrupted one).

    Returns:
        (heads in eval mode, losses: pandas DataFrame with columns step, loss (the weighted sum), loss_head1..K,
        lr).

    Raises:
        ValueError: no training positions.
    """
    import pandas as pd
    from tqdm.auto import tqdm

    heads = heads or MedusaHeads.from_base(target, config.n_heads, config.share_lm_head, vocab_ids=vocab_ids)
    X, Y = _head_examples(data, heads.n_heads)
    if X.shape[0] == 0:
        raise ValueError("no training positions in the self-distillation data")
    soft = data.teacher_ids is not None
    p0 = next(iter(heads.blocks.parameters()))
    dev = p0.device
    X = X.to(dev, p0.dtype)
    if soft:
        TI, TP = _soft_head_targets(data, heads.n_heads)
        full_to_r = torch.full((heads.vocab_size,), -1, dtype=torch.long)
        if heads.vocab_ids is None:
            full_to_r = torch.arange(heads.vocab_size)
        else:
            full_to_r[heads.vocab_ids.cpu()] = torch.arange(heads.n_vocab)
        full_to_r = full_to_r.to(dev)
    steps_per_epoch = math.ceil(X.shape[0] / config.batch_size)
    total = steps_per_epoch * config.epochs
    if config.max_steps is not None:
        total = min(total, int(config.max_steps))
    params = [p for p in heads.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    warm = max(1, int(config.warmup * total))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, warm, total))
    lam = torch.tensor([config.decay ** k for k in range(1, heads.n_heads + 1)], device=dev)
    rows, step = [], 0
    ckpt = Path(checkpoint) / "checkpoint.pt" if checkpoint is not None else None
    if ckpt is not None and ckpt.exists():
        state = torch.load(ckpt, map_location=dev, weights_only=False)
        heads.load_state_dict(state["heads"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        rows, step = state["rows"], int(state["step"])
    heads.train()
    gen = torch.Generator().manual_seed(config.seed)
    epoch = 0
    perm = torch.randperm(X.shape[0], generator=gen)
    while (epoch + 1) * steps_per_epoch <= step:  # replay the shuffles of the epochs already done
        perm = torch.randperm(X.shape[0], generator=gen)
        epoch += 1
    bar = tqdm(total=total, initial=step, desc="Medusa-1 training", disable=not progress)
    while step < total:
        s = (step - epoch * steps_per_epoch) * config.batch_size
        if s >= X.shape[0]:
            perm = torch.randperm(X.shape[0], generator=gen)
            epoch += 1
            continue
        idx = perm[s: s + config.batch_size]
        x = X[idx]
        if soft:
            ce = _soft_loss(heads.forward_restricted(x), TI[idx].to(dev), TP[idx].to(dev), full_to_r)
        else:
            y = Y[idx].to(dev)
            logits = heads(x)  # [K, B, V]
            ce = torch.stack([nn.functional.cross_entropy(logits[k].float(), y[:, k], ignore_index=-100)
                              if bool((y[:, k] >= 0).any()) else logits.new_zeros(()) for k in range(heads.n_heads)])
        loss = (lam * ce).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        rows.append({"step": step, "loss": loss.item(), "lr": float(sched.get_last_lr()[0]),
                     **{f"loss_head{k + 1}": ce[k].item() for k in range(heads.n_heads)}})
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if ckpt is not None and (step % checkpoint_every == 0 or step == total):
            _atomic_torch_save({"heads": heads.state_dict(), "optimizer": opt.state_dict(),
                                "scheduler": sched.state_dict(), "rows": rows, "step": step}, ckpt)
    bar.close()
    heads.eval()
    for p in heads.parameters():
        p.requires_grad_(False)
    return heads, pd.DataFrame(rows)


def _atomic_torch_save(obj, path: Path) -> None:
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def get_or_train_heads(target, data: SelfDistillationData, config: MedusaTrainConfig = MedusaTrainConfig(),
                       progress: bool = True, cache: bool = True):
    """Trained Medusa heads for ``target`` from the cache, or train and cache them.

    Cached under ``cache_dir()/medusa/heads/<key>/`` (heads.safetensors, config.json, losses.csv) where key hashes the
    base model's fingerprint, the data's settings and size, and ``config``.

    Returns:
        (heads, losses DataFrame, cached: bool — True when loaded rather than trained).
    """
    import pandas as pd

    from specrepro.cache import locked
    from specrepro.models import cache_dir

    key = cache_key({"base": base_fingerprint(target), "data": data.meta, "n_tokens": data.n_tokens,
                "n_seq": len(data.responses), "config": asdict(config), "v": FORMAT_VERSION})
    d = cache_dir() / "medusa" / "heads" / key
    with locked(d if cache else None, "Medusa heads"):  # one trainer; a second waits and loads
        if cache and (d / "losses.csv").exists():
            return MedusaHeads.load(d, target), pd.read_csv(d / "losses.csv"), True
        heads, losses = train_medusa_heads(target, data, config, progress=progress)
        if cache:
            heads.save(d)
            from specrepro.files import atomic_write_text

            atomic_write_text(d / "losses.csv", losses.to_csv(index=False))
        return heads, losses, False


# ----------------------------------------------------------------------------------------------------------------
# Accuracy and trees
# ----------------------------------------------------------------------------------------------------------------

@torch.no_grad()
def head_topk_accuracy(heads: MedusaHeads, data: SelfDistillationData, topk: int = 5, batch_size: int = 256):
    """Per-head top-i accuracy on ``data`` (Medusa's accuracy figure): for head k and i = 1..topk, the fraction of
    positions whose true token t+k+1 is among the head's i most likely tokens.

    Returns:
        pandas DataFrame, one row per head: head (1..K), positions, top1..top<topk> (cumulative accuracies in [0, 1]).
    """
    import pandas as pd

    X, Y = _head_examples(data, heads.n_heads)
    dev = next(iter(heads.blocks.parameters())).device
    dt = next(iter(heads.blocks.parameters())).dtype
    hits = torch.zeros(heads.n_heads, topk)
    count = torch.zeros(heads.n_heads)
    for s in range(0, X.shape[0], batch_size):
        logits = heads(X[s: s + batch_size].to(dev, dt))
        top = logits.topk(topk, dim=-1).indices.cpu()  # [K, B, topk]
        y = Y[s: s + batch_size].T  # [K, B]
        valid = y >= 0
        match = (top == y[..., None]) & valid[..., None]
        hits += match.cumsum(-1).clamp_max(1).sum(1).float()
        count += valid.sum(1).float()
    acc = hits / count.clamp_min(1)[:, None]
    return pd.DataFrame([{"head": k + 1, "positions": int(count[k]),
                          **{f"top{i + 1}": float(acc[k, i]) for i in range(topk)}} for k in range(heads.n_heads)])
