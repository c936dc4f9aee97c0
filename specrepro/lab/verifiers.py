"""Experiment runners behind notebook 09 (the exact verifiers after the four papers, on the same drafts).

What this file is: the verifier table read from the bench of record's verifier files (tokens per step and tokens/s
of every exact verification rule over the same int8 draft, with paired 95% intervals over prompts and each paper's
reported gain beside ours), and the count-only sweep of tokens per step against the node budget (chains of γ = N
nodes; trees of K unmerged paths, ⟨K,1,...,1⟩, of depth N / K).

What it is not: the verification rules (:mod:`specrepro.core.verifiers`, :mod:`specrepro.core.sampling`,
:mod:`specrepro.core.trees`) or their exactness proofs (``tests/test_verifiers.py``, :mod:`specrepro.sim.verifiers`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from specrepro.core.decoding import default_eos_ids, generate
from specrepro.core.sampling import SamplingConfig
from specrepro.core.trees import DraftTreeProposer, tree_generate
from specrepro.drafters.model import DraftModelDrafter
from specrepro.files import note_read
from specrepro.lab.papers import paper_table
from specrepro.measure.harness import paired_speedup
from specrepro.stats import ratio_of_sums_ci

__all__ = ["VERIFIERS", "verifier_rows", "verifier_table", "node_budget_runs", "node_budget_summary"]

#: verifier key -> (label, structure, bench method base name, the rule its paper compares with). "mss" is the
#: project's tree rule: children drawn without replacement (Sequoia) + multi-step speculative sampling (SpecInfer),
#: which is recursive rejection sampling without replacement (Jeon et al. 2024, arXiv:2402.14160).
VERIFIERS = {
    "token": ("token verification (Leviathan / Chen)", "chain", "sd-draft-int8", None),
    "block": ("block verification (Sun et al. 2025)", "chain", "sd-draft-int8-block", "token"),
    "mss": ("RRS without replacement + MSS (SpecInfer / Jeon et al. 2024)", "tree", "sd-tree-int8", "token"),
    "traversal": ("traversal verification (Weng et al. 2025)", "tree", "sd-tree-int8-traversal", "mss"),
    "gbv": ("greedy multi-path block verification (Thomas & Pal 2026)", "tree", "sd-tree-int8-gbv", "block"),
    "spectr": ("SpecTr K-SEQ (Sun et al. 2023)", "tree", "sd-tree-int8-spectr", "token"),
}
_BY_METHOD = {base: key for key, (_, _, base, _) in VERIFIERS.items()}


def _nodes(method: str) -> int:
    """Drafted nodes per step of a bench label: sd-draft-int8@4 -> 4, sd-tree-int8@2x1x1x1 -> 2+2+2+2 = 8."""
    spec = method.partition("@")[2]
    if not spec:
        raise ValueError(f"{method!r}: the verifier table needs the draft length or tree in the label (name@spec)")
    if "x" not in spec:
        return int(spec)
    widths, total, level = [int(w) for w in spec.split("x")], 0, 1
    for w in widths:
        level *= w
        total += level
    return total


def verifier_rows(bench: dict, setting: str, seed: int = 0) -> pd.DataFrame:
    """The verifier rows of one bench JSON (``python -m specrepro bench --json``).

    For every method of the file whose base name is a verifier of :data:`VERIFIERS`: tokens per step (pooled new
    tokens / target steps, 95% bootstrap interval over prompts, :func:`specrepro.stats.ratio_of_sums_ci`), the median
    tokens/s, the paired speedup over AR and the paired ratios against the rule its paper compares with (tokens per
    step: ratio of the two pooled rates, prompts resampled in pairs; tokens/s:
    :func:`specrepro.measure.harness.paired_speedup`, the median over prompts of the per-prompt ratio), and that
    paper's reported gain (``data/papers/verifier_gains.csv``).

    Args:
        bench: the parsed JSON (keys config, summary, runs); setting: a label for its sampling (e.g. "T = 1").

    Returns:
        one row per verifier: setting, verifier, label, structure, method, nodes (drafted per step), n_prompts,
        repeats, tokens_per_step / _lo / _hi, tokens_per_s (median over runs; tokens/s), speedup_vs_ar / _lo / _hi,
        compared_with, tps_ratio / _lo / _hi (tokens per step over the compared rule's), speed_ratio / _lo / _hi,
        paper_metric, paper_low, paper_high (NaN where the paper states no upper end or the rule has no paper gain).

    Raises:
        ValueError: a verifier method without its ``@`` draft length or tree.
    """
    runs = pd.DataFrame(bench["runs"])
    gains = paper_table("verifier_gains").set_index("verifier")
    labels = list(dict.fromkeys(runs["method"]))
    present = {_BY_METHOD[m.partition("@")[0]]: m for m in labels if m.partition("@")[0] in _BY_METHOD}
    rows = []
    for key, method in present.items():
        label, structure, _, versus = VERIFIERS[key]
        d = runs[runs["method"] == method]
        per = d.groupby("prompt", sort=False)[["new_tokens", "steps"]].sum()
        tps, tps_lo, tps_hi = ratio_of_sums_ci(per["new_tokens"], per["steps"], seed=seed)
        vs_ar = paired_speedup(runs, method, "ar", seed=seed) if "ar" in labels else {}
        row = {"setting": setting, "verifier": key, "label": label, "structure": structure, "method": method,
               "nodes": _nodes(method), "n_prompts": int(per.shape[0]), "repeats": int(d["repeat"].nunique()),
               "tokens_per_step": tps, "tokens_per_step_lo": tps_lo, "tokens_per_step_hi": tps_hi,
               "tokens_per_s": float(d["tokens_per_s"].median()),
               "speedup_vs_ar": vs_ar.get("speedup", np.nan), "speedup_vs_ar_lo": vs_ar.get("speedup_lo", np.nan),
               "speedup_vs_ar_hi": vs_ar.get("speedup_hi", np.nan), "compared_with": versus or ""}
        base = present.get(versus) if versus else None
        if base is not None:
            b = runs[runs["method"] == base].groupby("prompt", sort=False)[["new_tokens", "steps"]].sum()
            both = per.merge(b, left_index=True, right_index=True, suffixes=("", "_b"))
            row.update(zip(("tps_ratio", "tps_ratio_lo", "tps_ratio_hi"),
                           ratio_of_sums_ci(both["new_tokens"] / both["steps"], both["new_tokens_b"] / both["steps_b"],
                                            seed=seed)))
            sp = paired_speedup(runs, method, base, seed=seed)
            row.update(speed_ratio=sp["speedup"], speed_ratio_lo=sp["speedup_lo"], speed_ratio_hi=sp["speedup_hi"])
        if key in gains.index:
            g = gains.loc[key]
            row.update(paper_metric=g["metric"], paper_versus=g["compared_with"], paper_low=float(g["low"]),
                       paper_high=float(g["high"]) if pd.notna(g["high"]) else np.nan)
        rows.append(row)
    return pd.DataFrame(rows)


def verifier_table(files: dict, seed: int = 0) -> pd.DataFrame:
    """:func:`verifier_rows` of several bench JSON files, ``{setting label: path}``, one after the other.

    Raises:
        FileNotFoundError: a file is missing (its ``make`` rule in the Makefile writes it).
    """
    frames = []
    for setting, path in files.items():
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such bench file; `make {path}` writes it")
        data = path.read_bytes()
        note_read(path, data)  # the notebook that tabulates it records the bytes it read
        frames.append(verifier_rows(json.loads(data), setting, seed=seed))
    return pd.concat(frames, ignore_index=True)


def _tree_rules():
    from specrepro.core import verifiers as v

    rules = {"mss": (None, "without_replacement"), "traversal": (v.verify_tree_traversal, "without_replacement"),
             "spectr": (v.verify_tree_spectr, "iid")}
    if hasattr(v, "verify_tree_gbv"):  # GBV on a tree of K unmerged i.i.d. paths (the tree contract)
        rules["gbv"] = (v.verify_tree_gbv, "iid")
    return rules


@torch.inference_mode()
def node_budget_runs(target, draft, tokenizer, prompts, budgets=(2, 4, 8), paths: int = 2, *,
                     verifiers=("token", "block", "mss", "traversal", "spectr", "gbv"), max_new_tokens: int = 32,
                     sampling: SamplingConfig = SamplingConfig(1.0), seed: int = 0,
                     progress: bool = True) -> pd.DataFrame:
    """Tokens per step of each exact verifier against the node budget N (drafted tokens per step), counts only.

    Chains (token, block verification) draft γ = N tokens; trees (mss, traversal, spectr, and gbv where
    :mod:`specrepro.core.verifiers` has it) draft ``paths`` unmerged paths ⟨paths,1,...,1⟩ of depth N / paths (N must
    be a multiple of ``paths``). Every (prompt, verifier, budget) run starts from the same seed
    (``torch.Generator().manual_seed(seed + prompt index)``) and the same draft model; the draws differ because the
    rules consume randomness differently. No timing: the tokens/s of the same rules is the bench's.

    Args:
        target, draft: transformers causal LMs sharing a vocabulary; tokenizer: the target's; prompts: objects with
            ``.id`` and ``.text`` (:func:`specrepro.data.load_workload`).
        budgets: node budgets N (ints >= 1); verifiers: keys of :data:`VERIFIERS` (an unavailable one is skipped).

    Returns:
        one row per (verifier, budget, prompt): verifier, structure, budget, shape (e.g. "γ=4" or "⟨2,1⟩"), prompt,
        tokens, steps, tokens_per_step.

    Raises:
        ValueError: a budget below 1, a tree budget not a multiple of ``paths``, an unknown verifier.
    """
    from tqdm.auto import tqdm

    unknown = [v for v in verifiers if v not in VERIFIERS]
    if unknown:
        raise ValueError(f"unknown verifier(s) {unknown}; known: {', '.join(VERIFIERS)}")
    if any(int(b) < 1 for b in budgets):
        raise ValueError(f"node budgets must be >= 1, got {list(budgets)}")
    tree_rules = _tree_rules()
    vocab = target.get_output_embeddings().weight.shape[0]
    eos = default_eos_ids(target, tokenizer)
    jobs = []
    for b in map(int, budgets):
        for key in verifiers:
            structure = VERIFIERS[key][1]
            if structure == "tree" and key not in tree_rules:
                continue
            if structure == "tree" and b % paths:
                raise ValueError(f"tree budget {b} is not a multiple of paths = {paths}")
            jobs += [(b, key, i, p) for i, p in enumerate(prompts)]
    rows = []
    drafter = DraftModelDrafter(draft, vocab)
    for b, key, i, prompt in tqdm(jobs, desc="node budgets", disable=not progress):
        ids = tokenizer(prompt.text, return_tensors="pt").input_ids[0]
        g = torch.Generator(device=target.device).manual_seed(seed + i)
        if VERIFIERS[key][1] == "chain":
            shape = f"γ={b}"
            out = generate(target, ids, drafter=drafter, gamma=b, max_new_tokens=max_new_tokens, sampling=sampling,
                           generator=g, eos_token_id=eos, verification=key)
        else:
            verify, mode = tree_rules[key]
            widths = [paths] + [1] * (b // paths - 1)
            shape = "⟨" + ",".join(map(str, widths)) + "⟩"
            prop = DraftTreeProposer(draft, widths, "topk" if sampling.greedy else mode, vocab)
            out = tree_generate(target, ids, prop, max_new_tokens=max_new_tokens, sampling=sampling, generator=g,
                                eos_token_id=eos, verify=None if sampling.greedy else verify)
        rows.append({"verifier": key, "structure": VERIFIERS[key][1], "budget": b, "shape": shape,
                     "prompt": prompt.id, "tokens": len(out.tokens), "steps": out.n_steps,
                     "tokens_per_step": out.tokens_per_step})
    return pd.DataFrame(rows)


def node_budget_summary(runs: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """:func:`node_budget_runs` rows per (verifier, budget): n_prompts, shape, tokens_per_step / _lo / _hi (pooled
    tokens / steps with its 95% bootstrap interval over prompts, :func:`specrepro.stats.ratio_of_sums_ci`)."""
    rows = []
    for (key, b), d in runs.groupby(["verifier", "budget"], sort=False):
        per = d.groupby("prompt", sort=False)[["tokens", "steps"]].sum()
        est, lo, hi = ratio_of_sums_ci(per["tokens"], per["steps"], seed=seed)
        rows.append({"verifier": key, "label": VERIFIERS[key][0], "structure": VERIFIERS[key][1], "budget": int(b),
                     "shape": d["shape"].iloc[0], "n_prompts": int(per.shape[0]), "tokens_per_step": est,
                     "tokens_per_step_lo": lo, "tokens_per_step_hi": hi})
    return pd.DataFrame(rows)

