"""Medusa-1 heads for any target, trained offline on a CPU: teacher-forced self-distillation on the Python standard
library's sources.

What this file is: :func:`stdlib_distillation_data` (the target reads chunks of the stdlib's ``.py`` files, a code
corpus on every machine and disjoint from HumanEval; its last-layer hidden states and its own top-k next-token
distributions are recorded once and cached in resumable shards), and :func:`get_or_train_stdlib_heads` (heads trained
on them by KL to the backbone, Medusa Sec. 3.3.1's self-distillation, cached as safetensors keyed by the backbone's
fingerprint; an interrupted training run resumes from its checkpoint). The default heads share the backbone's LM head
restricted to the corpus's most frequent tokens (FR-Spec's vocabulary, :mod:`specrepro.drafters.compress`): all K heads
cost one product with a [V', H] matrix per step instead of K private [V, H] projections.

Teacher forcing instead of generation: Medusa's recipe generates the training text with the backbone itself; on a
2-core CPU a 1.5B model generates ~2 tokens/s but reads ~60 tokens/s, so we read real code and distil the backbone's
distribution at every position (the targets are the backbone's, whatever the text).

What it is not: the heads (:mod:`specrepro.core.medusa_heads`) or the training loop (:mod:`specrepro.train.medusa1`).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from specrepro.core.medusa_heads import (
    FORMAT_VERSION,
    MedusaHeads,
    base_fingerprint,
    base_name,
    cache_key,
)
from specrepro.train.medusa1 import (
    MedusaTrainConfig,
    SelfDistillationData,
    head_topk_accuracy,
    train_medusa_heads,
)

__all__ = ["stdlib_distillation_data", "stdlib_head_vocab", "get_or_train_stdlib_heads", "STDLIB_DATA_VERSION"]

STDLIB_DATA_VERSION = 1


def token_chunks(tokenizer, files, n_seq: int, chunk_tokens: int, seed: int):
    """One chunk of ``chunk_tokens`` tokens from each of ``n_seq`` files (seeded file order, seeded offset); files
    shorter than a chunk are skipped."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(files), generator=g).tolist()
    out = []
    for i in order:
        if len(out) >= n_seq:
            break
        try:
            text = Path(files[i]).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids[0]
        if ids.numel() < chunk_tokens:
            continue
        off = int(torch.randint(0, ids.numel() - chunk_tokens + 1, (1,), generator=g))
        out.append((str(Path(files[i]).name), ids[off: off + chunk_tokens].clone()))
    return out


@torch.inference_mode()
def stdlib_distillation_data(target, tokenizer, *, n_tokens: int = 24576, chunk_tokens: int = 512,
                             teacher_topk: int = 32, seed: int = 0, files=None, shard_size: int = 4,
                             cache: bool = True, progress: bool = True) -> SelfDistillationData:
    """Teacher-forced self-distillation data: the target reads stdlib source chunks; per position its last-layer
    hidden state and its top-``teacher_topk`` next-token distribution are kept.

    Sequence i is one chunk of ``chunk_tokens`` tokens x_0..x_{L-1} from one file (one chunk per file, so a split by
    sequence is a split by file): ``responses[i]`` = x_1..x_{L-1}, ``hidden[i][j]`` = the state after reading x_0..x_j
    (float32 [L-1, H]), ``teacher_ids[i][j]`` / ``teacher_probs[i][j]`` = the target's ``teacher_topk`` most likely next
    tokens there (long / float32 [L-1, k], descending; softmax at temperature 1 over the full vocabulary).

    Cached under ``cache_dir()/medusa/data/stdlib-<key>/`` in shards of ``shard_size`` sequences, each written
    atomically: an interrupted run keeps the finished shards and computes only the rest.

    Args:
        target: a transformers causal LM (any device; states are moved to the CPU).
        tokenizer: its tokenizer.
        n_tokens: about how many positions to record (ceil(n_tokens / (chunk_tokens - 1)) sequences).
        chunk_tokens: tokens per sequence (>= 2).
        teacher_topk: soft-target width k (>= 1).
        seed: file order and chunk offsets.
        files: the corpus (default :func:`specrepro.drafters.compress.stdlib_sources`).

    Returns:
        :class:`SelfDistillationData` with ``teacher_ids``/``teacher_probs``.

    Raises:
        ValueError: impossible sizes, or fewer long-enough files than sequences asked for.
    """
    from tqdm.auto import tqdm

    from specrepro.drafters.compress import (
        corpus_fingerprint,
        stdlib_sources,
        tokenizer_fingerprint,
)
    from specrepro.cache import locked
    from specrepro.files import atomic_write_text
    from specrepro.models import cache_dir

    if n_tokens < 1 or chunk_tokens < 2 or teacher_topk < 1 or shard_size < 1:
        raise ValueError(f"impossible sizes: n_tokens={n_tokens}, chunk_tokens={chunk_tokens}, "
                         f"teacher_topk={teacher_topk}, shard_size={shard_size}")
    files = sorted(str(f) for f in (files if files is not None else stdlib_sources()))
    n_seq = -(-int(n_tokens) // (chunk_tokens - 1))
    meta = {"kind": "stdlib-teacher-forced", "v": STDLIB_DATA_VERSION, "base": base_fingerprint(target),
            "base_name": base_name(target), "tokenizer": tokenizer_fingerprint(tokenizer),
            "corpus": corpus_fingerprint([Path(f) for f in files]), "n_seq": n_seq, "chunk_tokens": chunk_tokens,
            "teacher_topk": teacher_topk, "seed": seed}
    root = cache_dir() / "medusa" / "data" / f"stdlib-{cache_key(meta)}"
    chunks = token_chunks(tokenizer, files, n_seq, chunk_tokens, seed)
    if len(chunks) < n_seq:
        raise ValueError(f"only {len(chunks)} corpus files have >= {chunk_tokens} tokens; {n_seq} asked for")
    with locked(root if cache else None, "stdlib self-distillation data"):  # shards written once, by one process
        if cache:
            root.mkdir(parents=True, exist_ok=True)
            atomic_write_text(root / "meta.json", json.dumps(meta, indent=1, sort_keys=True) + "\n")
        device = next(target.parameters()).device
        head = target.get_output_embeddings()
        n_shards = -(-n_seq // shard_size)
        parts = []
        bar = tqdm(total=n_seq * (chunk_tokens - 1), desc="stdlib self-distillation (positions)", unit="tok",
                   disable=not progress)
        for s in range(n_shards):
            path = root / f"shard-{s:04d}.safetensors"
            if cache and path.exists():
                part = SelfDistillationData.load(path)
            else:
                rows = chunks[s * shard_size: (s + 1) * shard_size]
                x = torch.stack([c for _, c in rows]).to(device)  # [b, L]
                h = target.model(input_ids=x).last_hidden_state[:, :-1]  # [b, L-1, H], after the final norm
                probs = torch.softmax(head(h).float(), dim=-1)
                tp, ti = probs.topk(teacher_topk, dim=-1)
                part = SelfDistillationData(
                    [torch.zeros(0, dtype=torch.long) for _ in rows], [c[1:].clone() for _, c in rows],
                    [h[i].float().cpu().clone() for i in range(len(rows))], {**meta, "files": [f for f, _ in rows]},
                    [ti[i].cpu().clone() for i in range(len(rows))], [tp[i].cpu().clone() for i in range(len(rows))])
                if cache:
                    part.save(path)
                del h, probs
            parts.append(part)
            bar.update(sum(r.numel() for r in part.responses))
        bar.close()
    cat = lambda name: [t for p in parts for t in getattr(p, name)]
    meta = {**meta, "files": [f for p in parts for f in p.meta.get("files", [])]}
    return SelfDistillationData(cat("prompts"), cat("responses"), cat("hidden"), meta, cat("teacher_ids"),
                                cat("teacher_probs"))


def stdlib_head_vocab(target, tokenizer, n: int | None, always=()) -> torch.Tensor | None:
    """The heads' vocabulary: the ``n`` most frequent tokens of the stdlib corpus (FR-Spec ranking,
    :func:`specrepro.drafters.compress.frequent_token_ids`) plus ``always`` (the stop tokens); None for n = None or n >= V.

    Returns:
        long [min(n, V)] sorted ids, or None.
    """
    from specrepro.drafters.compress import frequent_token_ids, token_frequencies

    V = target.get_output_embeddings().weight.shape[0]
    if n is None or n >= V:
        return None
    return frequent_token_ids(token_frequencies(tokenizer), n, V, always=always)


def get_or_train_stdlib_heads(target, tokenizer, *, n_heads: int = 4, head_vocab: int | None = 32768,
                              share_lm_head: bool = True, n_tokens: int = 32768, chunk_tokens: int = 512,
                              n_eval_seq: int = 4, epochs: int = 2, batch_size: int = 64, lr: float = 1e-3,
                              seed: int = 0, max_steps: int | None = None, progress: bool = True, cache: bool = True):
    """Medusa-1 heads for ``target`` trained on :func:`stdlib_distillation_data`, from the cache or trained now.

    The last ``n_eval_seq`` sequences (files) are held out for :func:`~specrepro.train.medusa1.head_topk_accuracy`
    (accuracy against the backbone's own most likely token, what greedy verification accepts). Trained heads are
    cached under ``cache_dir()/medusa/heads/<key>/`` (heads.safetensors, config.json, losses.csv, accuracy.csv,
    train.json with the wall-clock seconds); the key hashes the base fingerprint, the data settings, the heads'
    vocabulary and the training config. An interrupted training run resumes from ``checkpoint.pt`` there.

    Args:
        n_heads: K. head_vocab: V' (None: the full vocabulary). share_lm_head: heads through the backbone's LM head
            (rows ``vocab_ids``) in one product (default) or private projections (Medusa's own design).
        n_tokens, chunk_tokens: data size (see :func:`stdlib_distillation_data`).
        epochs, batch_size, lr, seed, max_steps: :class:`~specrepro.train.medusa1.MedusaTrainConfig`.

    Returns:
        dict with ``heads`` (:class:`MedusaHeads`, eval mode, on the target's device), ``losses`` and ``accuracy``
        (pandas DataFrames), ``train_s`` (training wall-clock seconds, measured when trained), ``data_s``,
        ``cached`` (bool), ``directory`` (Path), ``n_train_positions``, ``n_eval_positions``.

    Raises:
        ValueError: impossible sizes (from the data or the config).
    """
    import pandas as pd

    from specrepro.core.decoding import default_eos_ids
    from specrepro.files import atomic_write_text
    from specrepro.cache import locked
    from specrepro.models import cache_dir

    config = MedusaTrainConfig(n_heads=n_heads, share_lm_head=share_lm_head, lr=lr, epochs=epochs,
                               batch_size=batch_size, max_steps=max_steps, seed=seed)
    t0 = time.perf_counter()
    data = stdlib_distillation_data(target, tokenizer, n_tokens=n_tokens + n_eval_seq * (chunk_tokens - 1),
                                    chunk_tokens=chunk_tokens, seed=seed, cache=cache, progress=progress)
    data_s = time.perf_counter() - t0
    train, held = data.split(n_eval_seq)
    vocab_ids = stdlib_head_vocab(target, tokenizer, head_vocab, always=sorted(default_eos_ids(target, tokenizer)))
    key = cache_key({"base": base_fingerprint(target), "data": {k: v for k, v in data.meta.items() if k != "files"},
                     "n_eval_seq": n_eval_seq, "config": asdict(config), "v": FORMAT_VERSION,
                     "vocab": None if vocab_ids is None else cache_key(vocab_ids.tolist())})
    d = cache_dir() / "medusa" / "heads" / key
    with locked(d if cache else None, "stdlib Medusa heads"):  # one trainer; a second waits and loads
        if cache and (d / "accuracy.csv").exists():
            info = json.loads((d / "train.json").read_text())
            return {"heads": MedusaHeads.load(d, target), "losses": pd.read_csv(d / "losses.csv"),
                    "accuracy": pd.read_csv(d / "accuracy.csv"), "train_s": info["train_s"], "data_s": data_s,
                    "cached": True, "directory": d, "n_train_positions": train.n_tokens,
                    "n_eval_positions": held.n_tokens}
        t0 = time.perf_counter()
        heads, losses = train_medusa_heads(target, train, config, progress=progress, vocab_ids=vocab_ids,
                                           checkpoint=d if cache else None)
        heads.source_dir = d if cache else None
        train_s = time.perf_counter() - t0
        acc = head_topk_accuracy(heads, held)
        if cache:
            heads.save(d)
            atomic_write_text(d / "losses.csv", losses.to_csv(index=False))
            atomic_write_text(d / "train.json", json.dumps({"train_s": train_s, "n_train_positions": train.n_tokens,
                                                            "n_eval_positions": held.n_tokens}) + "\n")
            atomic_write_text(d / "accuracy.csv", acc.to_csv(index=False))
            (d / "checkpoint.pt").unlink(missing_ok=True)
        return {"heads": heads, "losses": losses, "accuracy": acc, "train_s": train_s, "data_s": data_s,
                "cached": False, "directory": d, "n_train_positions": train.n_tokens, "n_eval_positions": held.n_tokens}
