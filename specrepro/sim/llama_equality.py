"""Greedy divergences on llama.cpp's kernels: whether two llama.cpp decodings of the same GGUF target that left each
other did so at a near-tie that the batch composition of llama.cpp's forwards can swap.

What this file is: :func:`explain_llama_divergence` replays, at the first position where two greedy outputs differ,
the target's logits along three ways of feeding the same tokens to llama.cpp (:data:`PATHS`), and classifies the
divergence by a rule fixed in advance (:func:`near_tie`); :func:`llama_bench_divergences` does it for every output of
a llama.cpp bench file (``python -m specrepro bench --json`` with ``llama-*`` methods) that differs from a reference
method's (:func:`specrepro.lab.equality.open_llama_bench_target` opens the target as that bench did).
``python -m specrepro greedy-equality --from-bench FILE`` calls it for a bench file whose ``config["llamacpp"]``
names the target's GGUF file.

Why llama.cpp's logits depend on the batch: one ``llama_decode`` of n tokens runs other kernels than n decodes of one
token (matrix-matrix products, repacked Q4_K tiles, vs matrix-vector ones, each with its own order of float
additions), flash attention's CPU kernel rounds the queries to float16, and every matrix product with quantized
weights first rounds its activations to 8 bits (Q8_K), so that a float difference of one unit in the last place can
move an activation by one 8-bit step. Two exact greedy decodings that feed the same tokens in different blocks
(llama-ar one at a time, llama-server-ar its prompt in one batch, a verification block 2-5 tokens at once) can then
take different tokens where the target's top two are nearly tied.

The rule (fixed before the llama.cpp bench file's logits were looked at, and the default of the command):

* the paths' *disagreement* d: for each of the two tokens (the reference's and the other output's), the largest
  minus the smallest of its logit over the replayed paths; d is the larger of the two;
* the bound: max(``tie_bound``, ``tie_disagreements`` x d), ``tie_disagreements`` = 4 by default. Why 4: on one path
  the gap between two logits moves by up to 2d when each logit moves by d (the two tokens' errors need not cancel),
  and the methods' own computations (verification blocks over a cache built block by block) are not among the
  replayed paths, so their deviation is allowed twice the replayed paths' spread: 2 x 2d. ``tie_bound`` (1e-3 by
  default) only matters where the paths agree to the last bit (d = 0);
* a divergence is a *near-tie* when the gap logit(reference token) - logit(other token) lies within the bound on
  every replayed path. A divergence whose paths order the two tokens differently is always one (then every |gap| is
  at most 2d): the replay itself shows the batch composition swapping them.

An absolute bound in logit units was not chosen: the effect of Q8_K activation rounding on a logit depends on the
model's activations and was not derived; a bound in units of the measured disagreement adapts to each position and
admits only close ties where the paths agree closely.

What it is not: the PyTorch analysis (:func:`specrepro.sim.real.explain_divergence`, bounds in spacings of the
dtype), or a replay of every method's own block sizes (a verification block's cache history is not replayed; the
rule's factor 2 stands for it).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

__all__ = ["PATHS", "path_logits", "near_tie", "explain_llama_divergence", "llama_bench_divergences",
           "is_llamacpp_bench", "llama_references", "DEFAULT_TIE_DISAGREEMENTS"]

#: the ways the replay feeds prompt + shared prefix to llama.cpp (a fresh cache each), and the logits after its last
#: token: ``one_token`` — every prompt token but the last in one ``llama_decode`` (no logits), then one token per
#: decode (llama-ar's path: :func:`specrepro.core.decoding.generate` without a drafter); ``batch`` — the whole prefix
#: in one decode, logits of its last row only (a server's prefill of that prefix; the largest block a verification
#: could decode there); ``server`` — the prompt in one decode, then the shared generated tokens one per decode
#: (llama-server-ar's path). Where no generated token is shared, ``server`` is ``batch``.
PATHS = ("one_token", "batch", "server")
#: the default multiple of the paths' disagreement that bounds a near-tie (see the module docstring)
DEFAULT_TIE_DISAGREEMENTS = 4.0


def _first_difference(a, b) -> int | None:
    return next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)


def path_logits(lm, prompt: Sequence[int], shared: Sequence[int], path: str) -> torch.Tensor:
    """The target's next-token logits (float32 [V]) after ``prompt`` + ``shared`` along ``path`` (:data:`PATHS`), on a
    fresh cache of ``lm`` (a :class:`~specrepro.backends.llamacpp.LlamaCppLM`, or any BlockLM). A prefix longer than
    ``lm.n_batch`` goes in several decodes of n_batch tokens (as llama.cpp itself splits it).

    Raises:
        ValueError: an unknown path or an empty prompt.
    """
    prompt, shared = [int(t) for t in prompt], [int(t) for t in shared]
    if not prompt:
        raise ValueError("the replay needs a prompt of at least one token")
    lm.reset()
    if path == "batch":
        return lm.forward_block(prompt + shared, logits_to_keep=1)[-1].clone()
    if path == "server":
        out = lm.forward_block(prompt, logits_to_keep=1)[-1]
        for t in shared:
            out = lm.forward_block([t], logits_to_keep=1)[-1]
        return out.clone()
    if path == "one_token":
        if len(prompt) > 1:
            lm.forward_block(prompt[:-1], logits_to_keep=0)
        for t in prompt[-1:] + shared:
            out = lm.forward_block([t], logits_to_keep=1)[-1]
        return out.clone()
    raise ValueError(f"unknown path {path!r}; known: {', '.join(PATHS)}")


def near_tie(logits: dict, *, tie_disagreements: float = DEFAULT_TIE_DISAGREEMENTS,
             tie_bound: float = 1e-3) -> dict:
    """The rule of the module docstring on the two tokens' logits per path.

    Args:
        logits: path -> (logit of the reference's token, logit of the other output's token).

    Returns:
        dict: disagreement (d), bound (max(tie_bound, tie_disagreements x d)), max_abs_gap (the largest |gap| over
        the paths), order_differs (the paths do not all put the two tokens in one order), explained (every path's
        |gap| <= bound).
    """
    ra = [float(a) for a, _ in logits.values()]
    rb = [float(b) for _, b in logits.values()]
    d = max(max(ra) - min(ra), max(rb) - min(rb))
    bound = max(float(tie_bound), float(tie_disagreements) * d)
    gaps = [a - b for a, b in zip(ra, rb)]
    signs = {math.copysign(1.0, g) for g in gaps if g != 0}
    worst = max(abs(g) for g in gaps)
    return {"disagreement": d, "bound": bound, "max_abs_gap": worst, "order_differs": len(signs) > 1,
            "explained": bool(worst <= bound)}


def explain_llama_divergence(lm, prompt_ids: Sequence[int], ref: Sequence[int], other: Sequence[int], *,
                             tie_disagreements: float = DEFAULT_TIE_DISAGREEMENTS, tie_bound: float = 1e-3,
                             memo: dict | None = None) -> dict | None:
    """Why a greedy output ``other`` left the reference ``ref`` (same prompt, same GGUF target): at the first
    differing index i, with a = ref[i] and b = other[i] and the shared prefix prompt + ref[:i], each path's
    (:data:`PATHS`) logits of a and b, its top two tokens and their gap, and the verdict of :func:`near_tie`.

    Args:
        lm: the target (:class:`~specrepro.backends.llamacpp.LlamaCppLM`); its cache is reset.
        memo: a dict to keep each (path, prefix)'s logits in across calls (many outputs share a divergence point).

    Returns:
        None when ``other`` agrees with ``ref`` on their common length; else a dict: diverged_at, prefix_len,
        ref_token, other_token, then per path p: logit_ref_p, logit_other_p, gap_p (logit_ref - logit_other),
        top1_p, top2_p, top2_gap_p; then :func:`near_tie`'s fields.
    """
    idx = _first_difference(ref, other)
    if idx is None:
        return None
    prompt = tuple(int(t) for t in prompt_ids)
    shared = tuple(int(t) for t in ref[:idx])
    a, b = int(ref[idx]), int(other[idx])
    memo = {} if memo is None else memo
    row = {"diverged_at": idx, "prefix_len": len(prompt) + len(shared), "ref_token": a, "other_token": b}
    pairs = {}
    for p in PATHS:
        key = (p, prompt, shared)
        if key not in memo:
            memo[key] = path_logits(lm, prompt, shared, p)
        z = memo[key]
        top = torch.topk(z, 2)
        la, lb = float(z[a]), float(z[b])
        pairs[p] = (la, lb)
        row.update({f"logit_ref_{p}": la, f"logit_other_{p}": lb, f"gap_{p}": la - lb,
                    f"top1_{p}": int(top.indices[0]), f"top2_{p}": int(top.indices[1]),
                    f"top2_gap_{p}": float(top.values[0] - top.values[1])})
    row.update(near_tie(pairs, tie_disagreements=tie_disagreements, tie_bound=tie_bound))
    return row


# ----------------------------------------------------------------------------------------------------------------
# A llama.cpp bench file
# ----------------------------------------------------------------------------------------------------------------

def is_llamacpp_bench(cfg: dict) -> bool:
    """Whether a bench file's config names the llama.cpp target it ran (``config["llamacpp"]["target_gguf"]``)."""
    return isinstance(cfg.get("llamacpp"), dict) and isinstance(cfg["llamacpp"].get("target_gguf"), dict)


def llama_references(cfg: dict, methods) -> list[str]:
    """The outputs every other llama.cpp method's are compared with: the file's baseline when it is a llama.cpp
    method, then ``llama-ar`` (our one-token loop on llama.cpp), those present in ``methods``."""
    refs = [m for m in (cfg.get("baseline"), "llama-ar") if m and str(m).startswith("llama-") and m in methods]
    return list(dict.fromkeys(refs))


def llama_bench_divergences(data: dict, prompt_ids: dict, lm, *,
                            tie_disagreements: float = DEFAULT_TIE_DISAGREEMENTS, tie_bound: float = 1e-3,
                            progress: bool = False):
    """Every greedy output of a llama.cpp bench file that differs from a reference method's
    (:func:`llama_references`: the baseline, then llama-ar) on the same prompt and pass, explained or not by a near-tie
    (:func:`explain_llama_divergence`).

    Only ``llama-*`` methods are compared (a PyTorch method's float32 model is another model than the GGUF target).
    A pair of methods is compared once (llama-server-ar against llama-ar is the row of llama-ar against the
    baseline). Passes that diverge identically make one row, their count in ``passes``.

    Args:
        data: the bench file's JSON (config and runs).
        prompt_ids: prompt id -> the token ids the bench decoded from
            (:func:`specrepro.lab.equality.bench_prompt_ids`); checked against each run's ``prompt_tokens``.
        lm: the target (:func:`specrepro.lab.equality.open_llama_bench_target`).

    Returns:
        pandas.DataFrame: method, reference, prompt_id, passes (diverged / compared), then the fields of
        :func:`explain_llama_divergence`, and gap / gap_incremental (the batch and one-token paths' gaps, the names
        the PyTorch table uses; spacing NaN). Empty when every output equals its references' (or the file is not
        greedy).

    Raises:
        ValueError: a prompt whose rebuilt token ids are not as long as the bench's (or not rebuilt at all).
    """
    import pandas as pd

    cfg, runs = data["config"], data.get("runs") or []
    cols = ["method", "reference", "prompt_id", "passes"]
    if float(cfg.get("temperature") or 0) != 0 or not runs:
        return pd.DataFrame(columns=cols)
    for r in runs:  # the prompts as the bench decoded them, or nothing is replayed
        want, pid = r.get("prompt_tokens"), r["prompt"]
        if want is not None and (pid not in prompt_ids or int(want) != len(prompt_ids[pid])):
            got = f"{len(prompt_ids[pid])} tokens" if pid in prompt_ids else "nothing"
            raise ValueError(f"prompt {pid}: rebuilt as {got}, the bench decoded {want} tokens")
    methods = list(dict.fromkeys(r["method"] for r in runs))
    out = {(r["method"], int(r["repeat"]), int(r["prompt_index"])): r for r in runs}
    groups: dict = {}
    done = set()
    for ref in llama_references(cfg, methods):
        for m in methods:
            if m == ref or not m.startswith("llama-") or frozenset((m, ref)) in done:
                continue
            done.add(frozenset((m, ref)))
            for (mm, rep, idx), r in out.items():
                if mm != m or (ref, rep, idx) not in out:
                    continue
                mine, theirs = list(r["token_ids"]), list(out[ref, rep, idx]["token_ids"])
                g = groups.setdefault((m, ref, idx), {"n": 0, "diff": {}})
                g["n"] += 1
                if mine != theirs:
                    g["diff"].setdefault((tuple(mine), tuple(theirs)), []).append(r)
    rows, memo = [], {}
    todo = [(k, pair, rs) for k, g in groups.items() for pair, rs in g["diff"].items()]
    for i, ((m, ref, idx), (mine, theirs), rs) in enumerate(sorted(todo, key=lambda t: (t[0][2], t[0][1], t[0][0]))):
        pid = rs[0]["prompt"]
        ids = [int(t) for t in prompt_ids[pid]]
        if progress:
            print(f"  [{i + 1}/{len(todo)}] {m} vs {ref}, {pid}", flush=True)
        why = explain_llama_divergence(lm, ids, list(theirs), list(mine), tie_disagreements=tie_disagreements,
                                       tie_bound=tie_bound, memo=memo)
        if why is None:  # one output is a prefix of the other (an end-of-generation token on one side)
            why = {"diverged_at": min(len(mine), len(theirs)), "explained": False}
        else:
            # the PyTorch table's names (read by the bench block); no dtype spacing enters this rule
            why.update(gap=why["gap_batch"], gap_incremental=why["gap_one_token"], spacing=float("nan"))
        rows.append({"method": m, "reference": ref, "prompt_id": pid,
                     "passes": f"{len(rs)}/{groups[m, ref, idx]['n']}", **why})
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=cols)
