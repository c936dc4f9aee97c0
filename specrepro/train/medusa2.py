"""Medusa-2 (Cai et al. 2024, arXiv 2401.10774v3, §2.2.2): Medusa heads trained jointly with the backbone, the backbone
through LoRA adapters (peft), at CPU scale.

What this file is: :func:`train_medusa2` (joint training with the combined loss of §2.2.2: the backbone's next-token
loss plus λ0 Σ_k λ^k times the heads' losses, the backbone kept close to the ORIGINAL model by distilling its
distribution, §2.3.3's self-distillation with a KL loss, heads warm-started from Medusa-1 heads (§2.2.2's "training
recipe": heads first, then jointly) and a larger learning rate for the heads than for the adapters), its cache
(:func:`get_or_train_medusa2`: LoRA adapter and heads as safetensors keyed by the base's fingerprint, the data and the
config), and the quality cost (:func:`quality_cost`: per-sequence held-out NLL of the original vs the fine-tuned
backbone, paired, with a 95% bootstrap interval of the difference).

**Medusa-2 changes the target.** The fine-tuned backbone (LoRA merged) is a different model: Medusa-2 decoding is
exact with respect to *it* (greedy Medusa-2 equals greedy AR of the fine-tuned backbone), not with respect to the
original backbone. What it costs in quality is what :func:`quality_cost` measures.

What it is not: Medusa-1 (:mod:`specrepro.train.medusa1`, frozen backbone) or decoding (:mod:`specrepro.core.medusa`,
used unchanged with the fine-tuned backbone as the target).
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specrepro.core.medusa_heads import (
    HeadMismatchError,
    MedusaHeads,
    base_fingerprint,
    base_name,
    cache_key,
)
from specrepro.train.medusa1 import warmup_cosine

__all__ = ["Medusa2Config", "train_medusa2", "get_or_train_medusa2", "load_medusa2", "quality_cost",
           "medusa2_sequences"]

FORMAT_VERSION = 1


@dataclass(frozen=True)
class Medusa2Config:
    """Hyper-parameters of Medusa-2 joint training.

    Attributes:
        lora_r, lora_alpha, lora_dropout, target_modules: the LoRA adapters (peft ``LoraConfig``) on the backbone's
            attention and MLP projections.
        lr_lora: AdamW peak learning rate of the adapters; lr_heads: of the heads (Medusa-2 uses a larger one for the
            heads, which start far from their optimum while the backbone starts at it).
        lambda0: weight λ0 of the heads' losses in the combined loss (the paper's λ0, 0.2 in its recipe).
        decay: λ_k = decay^k within the heads' losses (Medusa: 0.8).
        epochs: passes over the training sequences; max_steps: optional cap (sequences = optimizer steps).
        warmup: fraction of steps warming up (linear), then cosine decay.
        seed: shuffling of the sequences (a torch.Generator).
    """

    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    target_modules: tuple = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    lr_lora: float = 2e-4
    lr_heads: float = 1e-3
    lambda0: float = 0.2
    decay: float = 0.8
    epochs: int = 1
    max_steps: int | None = None
    warmup: float = 0.05
    seed: int = 0

    def __post_init__(self):
        if self.lora_r < 1 or self.epochs < 1 or not self.lr_lora > 0 or not self.lr_heads > 0 or self.lambda0 < 0:
            raise ValueError(f"impossible Medusa-2 config {self}")
        if not 0 < self.decay <= 1:
            raise ValueError(f"decay must lie in (0, 1], got {self.decay}")


def medusa2_sequences(tokenizer, n_train: int, n_eval: int, chunk_tokens: int = 256, seed: int = 0, files=None):
    """Training and held-out token sequences for Medusa-2: chunks of the Python standard library's sources (one per
    file, seeded order and offsets; disjoint from HumanEval), the first ``n_train`` for training and the next
    ``n_eval`` files held out.

    Returns:
        dict: ``train`` (list of ``n_train`` long [chunk_tokens] tensors), ``eval`` (list of ``n_eval`` long
        [chunk_tokens] tensors, from other files), ``files`` (the source file name of each chunk, train first).

    Raises:
        ValueError: too few long-enough files.
    """
    from specrepro.drafters.compress import stdlib_sources
    from specrepro.train.stdlib import token_chunks

    files = sorted(str(f) for f in (files if files is not None else stdlib_sources()))
    chunks = token_chunks(tokenizer, files, n_train + n_eval, chunk_tokens, seed)
    if len(chunks) < n_train + n_eval:
        raise ValueError(f"only {len(chunks)} corpus files have >= {chunk_tokens} tokens; {n_train + n_eval} needed")
    ids = [c for _, c in chunks]
    return {"train": ids[:n_train], "eval": ids[n_train:], "files": [f for f, _ in chunks]}


def _peft_model(base, config: Medusa2Config):
    from peft import LoraConfig, get_peft_model

    present = {name.rsplit(".", 1)[-1] for name, _ in base.named_modules()}
    modules = [m for m in config.target_modules if m in present]
    if not modules:
        raise ValueError(f"none of the LoRA target modules {config.target_modules} exist in {base_name(base)}")
    lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=modules, bias="none", task_type="CAUSAL_LM")
    return get_peft_model(base, lora)


def _plain_copy(base):
    """A deep copy of ``base`` whose linear layers are plain ``nn.Linear`` (peft wraps those)."""
    from specrepro.drafters.compress import plain_linear_layers

    model = copy.deepcopy(base)
    plain_linear_layers(model)
    return model


def train_medusa2(base, heads: MedusaHeads, train_seqs, config: Medusa2Config = Medusa2Config(),
                  progress: bool = True):
    """Joint training of Medusa heads and LoRA adapters on ``base`` (Medusa-2, §2.2.2), on a copy: ``base`` is not
    modified.

    Per sequence x (long [L]) the loss is
    ``KL(p_orig(·|x_<=t) || p_tuned(·|x_<=t))`` averaged over positions t (the backbone's own next-token loss, against
    the original model's distribution: self-distillation, which keeps the backbone's outputs where they were)
    ``+ λ0 Σ_k decay^k CE(p_orig(·|x_<=t+k), head_k(h_t))`` (head k at t learns the original model's distribution of
    token t + k + 1, as in Medusa-1's KL self-distillation), with h_t the fine-tuned backbone's last hidden state;
    gradients reach the adapters through both terms (that is what makes it Medusa-2).

    Args:
        base: a transformers causal LM (the original backbone).
        heads: warm-start heads for ``base`` (Medusa-1 heads; copied, not modified).
        train_seqs: list of long [L] token-id tensors.
        config: :class:`Medusa2Config`.

    Returns:
        (tuned backbone: a plain transformers model with the LoRA weights merged, in eval mode; heads for it;
        losses: pandas DataFrame step, loss, loss_lm, loss_head1..K, lr_lora; adapter_state: dict of the LoRA
        tensors (float32, CPU), the part that is saved).

    Raises:
        ValueError: no sequences, or no LoRA target module in ``base``.
    """
    import pandas as pd
    from peft import get_peft_model_state_dict
    from tqdm.auto import tqdm

    if not train_seqs:
        raise ValueError("Medusa-2 training needs at least one sequence")
    model = _peft_model(_plain_copy(base), config)
    heads = copy.deepcopy(heads)
    if heads.share_lm_head:
        heads.attach_lm_head(base)
    for p in heads.parameters():
        p.requires_grad_(True)
    device = next(base.parameters()).device
    lora_params = [p for p in model.parameters() if p.requires_grad]
    head_params = [p for p in heads.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": lora_params, "lr": config.lr_lora},
                             {"params": head_params, "lr": config.lr_heads}], weight_decay=0.0)
    total = len(train_seqs) * config.epochs
    if config.max_steps is not None:
        total = min(total, int(config.max_steps))
    warm = max(1, int(config.warmup * total))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, warm, total))
    lam = torch.tensor([config.decay ** k for k in range(1, heads.n_heads + 1)], device=device)
    if heads.vocab_ids is None:
        cols = None
    else:
        cols = heads.vocab_ids.to(device)
    gen = torch.Generator().manual_seed(config.seed)
    rows, step = [], 0
    model.train()
    heads.train()
    bar = tqdm(total=total, desc="Medusa-2 training", disable=not progress)
    while step < total:
        for i in torch.randperm(len(train_seqs), generator=gen).tolist():
            if step >= total:
                break
            x = train_seqs[i].reshape(1, -1).to(device)
            with torch.no_grad(), model.disable_adapter():
                p_orig = torch.log_softmax(model(input_ids=x).logits[0].float(), dim=-1)  # [L, V]
            out = model(input_ids=x, output_hidden_states=True)
            logq = torch.log_softmax(out.logits[0].float(), dim=-1)
            loss_lm = torch.nn.functional.kl_div(logq, p_orig, log_target=True, reduction="batchmean")
            h = out.hidden_states[-1][0]  # [L, H], after the final norm
            head_logits = heads.forward_restricted(h)  # [K, L, V']
            L = x.shape[1]
            ce = []
            for k in range(1, heads.n_heads + 1):
                if L - k <= 0:
                    ce.append(head_logits.new_zeros(()))
                    continue
                target = p_orig[k:].exp()  # original distribution of token t + k + 1, rows t = 0 .. L-k-1
                if cols is not None:
                    target = target[:, cols]
                    target = target / target.sum(-1, keepdim=True).clamp_min(1e-12)
                logp = torch.log_softmax(head_logits[k - 1, : L - k].float(), dim=-1)
                ce.append(-(target * logp).sum(-1).mean())
            ce = torch.stack(ce)
            loss = loss_lm + config.lambda0 * (lam * ce).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            rows.append({"step": step, "loss": loss.item(), "loss_lm": loss_lm.item(),
                         "lr_lora": float(sched.get_last_lr()[0]),
                         **{f"loss_head{k + 1}": ce[k].item() for k in range(heads.n_heads)}})
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}", kl=f"{loss_lm.item():.4f}")
    bar.close()
    adapter = {k: v.detach().float().cpu().clone() for k, v in get_peft_model_state_dict(model).items()}
    tuned = model.merge_and_unload().eval()
    for p in tuned.parameters():
        p.requires_grad_(False)
    heads = _rebase_heads(heads, tuned)
    return tuned, heads, pd.DataFrame(rows), adapter


def _rebase_heads(heads: MedusaHeads, tuned) -> MedusaHeads:
    """The trained heads, identified with (and, if shared, projecting through) the fine-tuned backbone; the backbone's
    linear layers take the same CPU path as every loaded model (:func:`specrepro.models.use_onednn_linear`), so its
    timings compare with the original backbone's."""
    from specrepro.models import use_onednn_linear

    use_onednn_linear(tuned)
    heads.eval()
    for p in heads.parameters():
        p.requires_grad_(False)
    tuned.specrepro_name = f"{base_name(tuned)} + Medusa-2 LoRA"
    tuned.__dict__.pop("_specrepro_fingerprint", None)
    heads.base_name, heads.base_fingerprint = base_name(tuned), base_fingerprint(tuned)
    if heads.share_lm_head:
        heads.attach_lm_head(tuned)
    return heads


def load_medusa2(directory: str | Path, base):
    """The fine-tuned backbone and heads saved by :func:`get_or_train_medusa2` for ``base``.

    Returns:
        (tuned backbone with the LoRA weights merged, heads).

    Raises:
        FileNotFoundError: nothing saved there. HeadMismatchError: saved for another base model.
    """
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    d = Path(directory)
    if not (d / "medusa2.json").exists():
        raise FileNotFoundError(f"no Medusa-2 model (medusa2.json, adapter.safetensors, heads/) in {d}")
    meta = json.loads((d / "medusa2.json").read_text())
    if meta["base_fingerprint"] != base_fingerprint(base):
        raise HeadMismatchError(f"this Medusa-2 adapter was trained on base model {meta['base_name']!r} (fingerprint "
                                f"{meta['base_fingerprint']}), not on {base_name(base)!r} "
                                f"(fingerprint {base_fingerprint(base)})")
    config = Medusa2Config(**{**meta["config"], "target_modules": tuple(meta["config"]["target_modules"])})
    model = _peft_model(_plain_copy(base), config)
    set_peft_model_state_dict(model, load_file(str(d / "adapter.safetensors")))
    tuned = model.merge_and_unload().eval()
    for p in tuned.parameters():
        p.requires_grad_(False)
    tuned.specrepro_name = f"{base_name(base)} + Medusa-2 LoRA"
    heads = MedusaHeads.load(d / "heads")
    w = tuned.get_output_embeddings().weight
    heads.to(device=w.device, dtype=w.dtype)
    return tuned, _rebase_heads(heads, tuned)


def get_or_train_medusa2(base, heads: MedusaHeads, train_seqs, config: Medusa2Config = Medusa2Config(),
                         progress: bool = True, cache: bool = True):
    """Medusa-2 for ``base`` from the cache, or trained now (:func:`train_medusa2`) and cached under
    ``cache_dir()/medusa/medusa2/<key>/`` (adapter.safetensors, heads/, losses.csv, medusa2.json with the training
    wall-clock), key = base fingerprint, warm-start heads, data and config. Files are written atomically and
    medusa2.json last, so an interrupted run leaves no entry that looks complete.

    Returns:
        dict: tuned (backbone), heads, losses (DataFrame), train_s, cached (bool), directory.
    """
    import pandas as pd

    from specrepro.cache import locked
    from specrepro.files import atomic_save_safetensors, atomic_write_text
    from specrepro.models import cache_dir

    data_key = cache_key([t.tolist() for t in train_seqs])
    head_key = cache_key({k: float(v.float().sum()) for k, v in heads.state_dict().items()})
    key = cache_key({"base": base_fingerprint(base), "heads": head_key, "data": data_key,
                     "config": asdict(config), "v": FORMAT_VERSION})
    d = cache_dir() / "medusa" / "medusa2" / key
    with locked(d if cache else None, "Medusa-2 adapter and heads"):  # one trainer; a second waits and loads
        if cache and (d / "medusa2.json").exists():
            tuned, h = load_medusa2(d, base)
            meta = json.loads((d / "medusa2.json").read_text())
            return {"tuned": tuned, "heads": h, "losses": pd.read_csv(d / "losses.csv"), "train_s": meta["train_s"],
                    "cached": True, "directory": d}
        t0 = time.perf_counter()
        tuned, h, losses, adapter = train_medusa2(base, heads, train_seqs, config, progress=progress)
        train_s = time.perf_counter() - t0
        if cache:
            d.mkdir(parents=True, exist_ok=True)
            atomic_save_safetensors(adapter, d / "adapter.safetensors", {"base_fingerprint": base_fingerprint(base)})
            h.save(d / "heads")
            atomic_write_text(d / "losses.csv", losses.to_csv(index=False))
            atomic_write_text(d / "medusa2.json", json.dumps(
                {"format_version": FORMAT_VERSION, "base_name": base_name(base),
                 "base_fingerprint": base_fingerprint(base),
                 "config": asdict(config), "train_s": train_s, "n_train_sequences": len(train_seqs)},
                indent=1, sort_keys=True) + "\n")
        return {"tuned": tuned, "heads": h, "losses": losses, "train_s": train_s, "cached": False, "directory": d}


@torch.no_grad()
def quality_cost(original, tuned, eval_seqs, seed: int = 0):
    """How much the fine-tuning changed the backbone's next-token quality on held-out text: per sequence, the mean
    negative log-likelihood (nats/token) of its actual next tokens under each model, paired by sequence.

    Returns:
        (per_sequence: pandas DataFrame sequence, tokens, nll_original, nll_tuned, delta; summary: dict with n
        (sequences), tokens, nll_original, nll_tuned, delta_nll (mean tuned - original) and its 95% percentile
        bootstrap interval delta_lo/delta_hi over sequences (:func:`specrepro.stats.bootstrap_ci`), and
        ppl_ratio = exp(delta_nll) with ppl_ratio_lo/_hi).

    Raises:
        ValueError: no held-out sequence of at least 2 tokens.
    """
    import numpy as np
    import pandas as pd

    from specrepro.stats import bootstrap_ci

    rows = []
    device = next(original.parameters()).device
    for i, x in enumerate(eval_seqs):
        x = x.reshape(1, -1).to(device)
        if x.shape[1] < 2:
            continue
        nll = []
        for m in (original, tuned):
            logp = torch.log_softmax(m(input_ids=x).logits[0, :-1].float(), dim=-1)
            nll.append(float(-logp.gather(-1, x[0, 1:, None]).mean()))
        rows.append({"sequence": i, "tokens": int(x.shape[1] - 1), "nll_original": nll[0], "nll_tuned": nll[1],
                     "delta": nll[1] - nll[0]})
    if not rows:
        raise ValueError("quality_cost needs at least one held-out sequence of >= 2 tokens")
    df = pd.DataFrame(rows)
    est, lo, hi = bootstrap_ci(df["delta"].to_numpy(), statistic=np.mean, seed=seed)
    summary = {"n": len(df), "tokens": int(df["tokens"].sum()), "nll_original": float(df["nll_original"].mean()),
               "nll_tuned": float(df["nll_tuned"].mean()), "delta_nll": est, "delta_lo": lo, "delta_hi": hi,
               "ppl_ratio": math.exp(est), "ppl_ratio_lo": math.exp(lo) if np.isfinite(lo) else float("nan"),
               "ppl_ratio_hi": math.exp(hi) if np.isfinite(hi) else float("nan")}
    return df, summary
