"""Medusa's tree ablation (Cai et al. 2024, arXiv 2401.10774v3, §3.3.1 and Figure 5: dense vs sparse trees): the same
heads verified as a chain, as a dense (Cartesian) tree and as sparse trees chosen from the heads' accuracies.

What this file is: tree builders (:func:`chain_choices`, :func:`dense_choices`), and :func:`tree_ablation`, which
decodes greedily with each tree and reports tokens per step per prompt with a 95% bootstrap interval over prompts,
beside the tokens per step predicted from the heads' held-out accuracies and, given the target's measured cost curve,
the predicted speedup (tokens per step x t(1) / (t(n + 1) + the heads' cost)).

What it is not: a timing loop (tokens per step are counts, not times; speed comparisons go through
:mod:`specrepro.measure.harness`, e.g. the bench).
"""

from __future__ import annotations

import itertools
from typing import Callable, Sequence

import torch

from specrepro.core.medusa import (
    MedusaProposer,
    expected_acceptance_length,
    medusa_generate,
)

__all__ = ["chain_choices", "dense_choices", "tree_kind", "tree_ablation"]


def chain_choices(depth: int) -> list[list[int]]:
    """Every head's top-1 candidate in a chain: [[0], [0, 0], ...] (``depth`` nodes).

    Raises:
        ValueError: depth < 1.
    """
    if depth < 1:
        raise ValueError(f"a chain needs depth >= 1, got {depth}")
    return [[0] * d for d in range(1, depth + 1)]


def dense_choices(topk: Sequence[int]) -> list[list[int]]:
    """Medusa's dense tree: the Cartesian product of head k's top ``topk[k-1]`` candidates at depth k
    (Σ_d Π_{k<=d} topk[k-1] nodes; e.g. (2, 2, 2) gives 2 + 4 + 8 = 14).

    Raises:
        ValueError: empty ``topk`` or an entry < 1.
    """
    if not topk or any(int(k) < 1 for k in topk):
        raise ValueError(f"dense tree needs top-k >= 1 per depth, got {list(topk)}")
    out = []
    for d in range(1, len(topk) + 1):
        out += [list(c) for c in itertools.product(*[range(int(k)) for k in topk[:d]])]
    return out


def tree_kind(choices) -> str:
    """What a Medusa tree is: "chain" (every head's top-1, :func:`chain_choices`), "dense" (a Cartesian product of
    per-depth top-k, :func:`dense_choices`) or "sparse" (anything else, e.g.
    :func:`~specrepro.core.medusa.sparse_tree_from_accuracies`).

    Raises:
        ValueError: empty ``choices``.
    """
    paths = {tuple(int(r) for r in c) for c in choices}
    if not paths:
        raise ValueError("a tree needs at least one node")
    depth = max(len(c) for c in paths)
    if paths == {tuple(c) for c in chain_choices(depth)}:
        return "chain"
    topk = [1 + max(c[d] for c in paths if len(c) > d) for d in range(depth)]
    return "dense" if paths == {tuple(c) for c in dense_choices(topk)} else "sparse"


@torch.no_grad()
def tree_ablation(target, tokenizer, heads, prompts, trees: dict, *, max_new_tokens: int = 64, accuracies=None,
                  cost_ms: Callable[[int], float] | None = None, head_ms: float = 0.0, progress: bool = True):
    """Greedy Medusa decoding of every prompt with every tree; tokens per step per prompt
    (:attr:`~specrepro.core.decoding.GenerationResult.tokens_per_step`: new tokens / verification forward passes).

    Args:
        target: the backbone (a transformers causal LM); heads: its :class:`~specrepro.core.medusa_heads.MedusaHeads`.
        tokenizer: encodes prompt texts (raw text, as the experiments do).
        prompts: :class:`~specrepro.data.Prompt` or str.
        trees: name -> Medusa choices (rank paths; see :func:`chain_choices`, :func:`dense_choices`,
            :func:`~specrepro.core.medusa.sparse_tree_from_accuracies`).
        accuracies: the heads' cumulative top-i accuracies [K][I] (e.g. from :func:`~specrepro.core.medusa.
            head_topk_accuracy`); gives ``predicted_tokens_per_step`` = 1 + expected accepted tokens (Medusa's
            estimate, independence across heads assumed).
        cost_ms: t(n), the target's forward time in ms for n fed tokens (a measured cost curve); with it,
            ``predicted_speedup`` = tokens_per_step x t(1) / (t(nodes + 1) + head_ms).
        head_ms: the heads' own time per step (ms).

    Returns:
        (runs, summary): runs has one row per (tree, prompt): tree, nodes, prompt, tokens, steps, tokens_per_step;
        summary one row per tree: tree, kind (:func:`tree_kind`), nodes, tokens_per_step (mean over prompts),
        tokens_per_step_lo/_hi (95% percentile bootstrap over prompts, :func:`specrepro.stats.bootstrap_ci`),
        n_prompts,
        predicted_tokens_per_step, predicted_speedup (NaN where not computable).

    Raises:
        ValueError: no prompts or no trees; a tree deeper than the heads (from :class:`MedusaProposer`).
    """
    import numpy as np
    import pandas as pd
    from tqdm.auto import tqdm

    from specrepro.data import Prompt
    from specrepro.lab.leviathan import encode
    from specrepro.stats import bootstrap_ci

    if not prompts or not trees:
        raise ValueError("tree_ablation needs at least one prompt and one tree")
    prompts = [p if not isinstance(p, str) else Prompt(f"prompt/{i}", p) for i, p in enumerate(prompts)]
    device = next(target.parameters()).device
    rows = []
    bar = tqdm(total=len(trees) * len(prompts), desc="Medusa tree ablation", disable=not progress)
    for name, choices in trees.items():
        prop = MedusaProposer(heads, choices, name=name)
        for p in prompts:
            bar.set_postfix(tree=name)
            out = medusa_generate(target, encode(tokenizer, p.text).to(device), prop, max_new_tokens=max_new_tokens)
            rows.append({"tree": name, "nodes": len(choices), "prompt": p.id, "tokens": len(out.tokens),
                         "steps": out.n_steps, "tokens_per_step": out.tokens_per_step})
            bar.update(1)
    bar.close()
    runs = pd.DataFrame(rows)
    summary = []
    for name, choices in trees.items():
        g = runs[runs["tree"] == name]
        est, lo, hi = bootstrap_ci(g["tokens_per_step"].to_numpy(), statistic=np.mean)
        pred = 1.0 + expected_acceptance_length(choices, accuracies) if accuracies is not None else float("nan")
        speed = est * cost_ms(1) / (cost_ms(len(choices) + 1) + head_ms) if cost_ms is not None else float("nan")
        summary.append({"tree": name, "kind": tree_kind(choices), "nodes": len(choices), "tokens_per_step": est,
                        "tokens_per_step_lo": lo, "tokens_per_step_hi": hi, "n_prompts": int(g["prompt"].nunique()),
                        "predicted_tokens_per_step": pred, "predicted_speedup": speed})
    return runs, pd.DataFrame(summary)
