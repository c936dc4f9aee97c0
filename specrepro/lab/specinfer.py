"""Experiment runners behind notebook 05 (SpecInfer token trees): one function per table, tidy pandas DataFrames.

What this file is: the loops over prompts, tree widths and verification rules that reproduce SpecInfer's Tables 1-3
(Miao et al. 2023) on our models, the measured verification cost curve t_target(N) of one tree forward, and the
hardware-aware choice of tree size (Sequoia, Chen et al. 2024, Sec. 4: maximize expected tokens per step divided by
the measured time per step), plus the timing of AR, the best chain and the best tree through the one harness (:mod:`specrepro.measure.harness`).

What it is not: the algorithms (:mod:`specrepro.core.trees`, :mod:`specrepro.core.tree_attention`) or plotting.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import torch

from specrepro.core.decoding import default_eos_ids, generate
from specrepro.core.kvcache import crop_cache, new_cache
from specrepro.core.sampling import SamplingConfig
from specrepro.core.tree_attention import tree_forward
from specrepro.core.trees import (
    DraftTreeProposer,
    TokenTree,
    TreeTemplate,
    tree_generate,
)
from specrepro.drafters.model import DraftModelDrafter
from specrepro.lab.papers import paper_table
from specrepro.measure.harness import per_run_table, run_interleaved, timing_checkpoint_key

__all__ = ["SPECINFER_TABLE2", "SPECINFER_TABLE3", "TREE_SHAPES", "load_tree_models", "tree_draft_name",
           "expansion_widths", "topk_success_table", "tree_width_table", "tree_width_summary", "naive_vs_mss_table",
           "tree_cost_table", "choose_tree", "tree_vs_chain_speed", "TREE_SPEED_MODULES"]

#: SpecInfer Table 2, Alpaca, LLaMA-7B target / LLaMA-68M draft, depth 8: width -> (greedy, stochastic)
SPECINFER_TABLE2 = {int(r.width): (float(r.greedy), float(r.stochastic)) for r in paper_table("specinfer_table2").itertuples()}
#: SpecInfer Table 3, Alpaca, width 5: naive sampling -> MSS average verified tokens per step
SPECINFER_TABLE3 = dict(zip(*paper_table("specinfer_table3").to_dict("list").values()))


#: The modules whose code decides what :func:`tree_vs_chain_speed` times (with every package module they import; see
#: :func:`specrepro.files.code_fingerprint`): a checkpoint of its blocks resumes only under the same code of these.
TREE_SPEED_MODULES = ("specrepro.lab.specinfer",)


#: Table 2 tree shapes: "paper" = SpecInfer's ⟨1,1,k,1,...,1⟩ (Sec. 6.4: the branching at the third token),
#: "root" = ⟨k,1,...,1⟩ (k chains branching at the first token; the shape :func:`choose_tree` ranks)
TREE_SHAPES = ("paper", "root")


def expansion_widths(width: int, depth: int, shape: str = "paper") -> list[int]:
    """The expansion ⟨k1..km⟩ (:meth:`specrepro.core.trees.TreeTemplate.expansion`) of a Table 2 tree.

    Args:
        width: k >= 1, the branching factor. depth: m >= 1 levels.
        shape: "paper" = ⟨1,1,k,1,...,1⟩ (SpecInfer Sec. 6.4; the branch sits at level min(3, depth)),
            "root" = ⟨k,1,...,1⟩.

    Returns:
        list of ``depth`` ints, e.g. (3, 8, "paper") -> [1, 1, 3, 1, 1, 1, 1, 1] (2 + 3·6 = 20 nodes).

    Raises:
        ValueError: unknown shape, width or depth < 1.
    """
    if shape not in TREE_SHAPES:
        raise ValueError(f"unknown tree shape {shape!r}; expected one of {TREE_SHAPES}")
    if int(width) < 1 or int(depth) < 1:
        raise ValueError(f"width and depth must be >= 1, got {width}, {depth}")
    widths = [1] * int(depth)
    widths[min(2, int(depth) - 1) if shape == "paper" else 0] = int(width)
    return widths


def load_tree_models(target: str, draft: str | None, device: str = "cpu", dtype: str = "float32",
                     int8_draft: bool = False):
    """The models of notebook 05 and its shards: ``(target model, draft model, tokenizer, draft name)``.

    With a ``draft`` name: the pair (:func:`specrepro.models.load_pair`), the draft as its int8 copy when
    ``int8_draft`` (exact: q is the copy's own softmax; only α and the draft's cost change), named
    ``"<draft> (int8)"``. Without one (the quick profile): the target drafts for itself through a bfloat16 copy
    (real, if rare, disagreements; no extra weights), named ``"<target> (bf16 copy)"``.

    Raises:
        KeyError: an unknown model name (:mod:`specrepro.models`).
    """
    import copy

    from specrepro.drafters.compress import quantize_draft
    from specrepro.models import load_model, load_pair

    name = tree_draft_name(target, draft, int8_draft)
    if draft:
        tmodel, dmodel, tokenizer = load_pair(target, draft, device=device, dtype=dtype)
        return tmodel, quantize_draft(dmodel) if int8_draft else dmodel, tokenizer, name
    tmodel, tokenizer = load_model(target, device=device, dtype=dtype)
    return tmodel, copy.deepcopy(tmodel).to(torch.bfloat16), tokenizer, name


def tree_draft_name(target: str, draft: str | None, int8_draft: bool = False) -> str:
    """The draft's name in notebook 05's tables and its shards' settings (:func:`load_tree_models`'s last item):
    ``draft``, ``"<draft> (int8)"``, or ``"<target> (bf16 copy)"`` when there is no draft model."""
    if not draft:
        return f"{target} (bf16 copy)"
    return f"{draft} (int8)" if int8_draft else str(draft)


def _encode(tokenizer, text):
    return tokenizer(text, return_tensors="pt").input_ids[0]


def _gen(seed, device):
    return torch.Generator(device=device).manual_seed(seed)


@torch.inference_mode()
def topk_success_table(target, draft, tokenizer, prompts, ks=(1, 2, 3, 4, 5), max_new_tokens: int = 64,
                       seed: int = 0, progress: bool = True) -> pd.DataFrame:
    """SpecInfer Table 1 analogue: how often the target's token is among the draft's top-k tokens.

    For each prompt the target generates ``max_new_tokens`` tokens greedily ("greedy": the target's token is its
    argmax) and by sampling at T = 1 ("stochastic": the target's sampled token); both models then score the
    sequence teacher-forced in one forward each, and at every generated position we check whether the target's
    token is among the draft's k most likely tokens.

    Returns:
        one row per (decoding, k): decoding, k, success_rate, positions.
    """
    from tqdm.auto import tqdm

    vocab = target.get_output_embeddings().weight.shape[0]
    hits = {(m, k): 0 for m in ("greedy", "stochastic") for k in ks}
    count = {"greedy": 0, "stochastic": 0}
    g = _gen(seed, target.device)
    for prompt in tqdm(prompts, desc="top-k success", disable=not progress):
        ids = _encode(tokenizer, prompt.text)
        for mode, cfg in (("greedy", SamplingConfig(0.0)), ("stochastic", SamplingConfig(1.0))):
            out = generate(target, ids, drafter=DraftModelDrafter(draft, vocab), gamma=4,
                           max_new_tokens=max_new_tokens, sampling=cfg, generator=g,
                           eos_token_id=default_eos_ids(target, tokenizer))
            if not out.tokens:
                continue
            full = torch.cat([ids, torch.tensor(out.tokens, dtype=torch.long)]).to(draft.device)
            n = len(out.tokens)
            dl = draft(input_ids=full[None]).logits[0, -n - 1:-1, :vocab].float()
            top = torch.topk(dl, max(ks), dim=-1).indices.cpu()
            y = torch.tensor(out.tokens)
            for k in ks:
                hits[(mode, k)] += int((top[:, :k] == y[:, None]).any(-1).sum())
            count[mode] += n
    return pd.DataFrame([{"decoding": m, "k": k, "success_rate": hits[(m, k)] / max(1, count[m]),
                          "positions": count[m]} for m in ("greedy", "stochastic") for k in ks])


def _row(out, **kw):
    acc = np.asarray(out.accepted)
    return dict(kw, tokens=len(out.tokens), steps=out.n_steps, tokens_per_step=out.tokens_per_step,
                mean_accepted=float(acc.mean()) if acc.size else np.nan, nodes_per_step=float(np.mean(out.drafted)),
                seconds=out.times["total"], ms_per_token=1000 * out.times["total"] / max(1, len(out.tokens)),
                tokens_per_s=out.tokens_per_s,
                draft_ms_per_step=1000 * out.times.get("draft", 0.0) / max(1, out.n_steps),
                target_ms_per_step=1000 * out.times.get("target", 0.0) / max(1, out.n_steps),
                accepted=" ".join(map(str, acc.tolist())))


def tree_width_table(target, draft, tokenizer, prompts, widths=(1, 2, 3, 4, 5), depth: int = 8,
                     max_new_tokens: int = 32, seed: int = 0, decodings=("greedy", "stochastic"),
                     shape: str = "root", progress: bool = True, passes=(0,), checkpoint=None,
                     checkpoint_key: dict | None = None) -> pd.DataFrame:
    """SpecInfer Table 2 analogue: average verified tokens per step vs tree width at a given depth.

    A tree of width w is the expansion :func:`expansion_widths` ``(w, depth, shape)``: ``shape="paper"`` is
    SpecInfer's ⟨1,1,w,1,...,1⟩ (Sec. 6.4; N = 2 + w·(depth − 2) nodes at depth >= 3), ``shape="root"`` is
    ⟨w,1,...,1⟩ (w chains from the root, N = w·depth). Greedy decoding expands the draft's top-w tokens (point
    masses) and verifies with VerifyGreedy; stochastic decoding (T = 1) samples w i.i.d. children and verifies with
    MSS. Runs are sequential (not interleaved with AR): their times are indicative.

    Args:
        passes: the pass indices to run; pass r seeds every run with ``seed + r`` (pass 0 with ``seed``), so passes
            run apart (e.g. one shard each) give the rows one call with all of them gives. A greedy pass repeats
            pass 0 exactly (greedy tree decoding is deterministic): run greedy with ``passes=(0,)``.
        checkpoint: a JSON file where every finished (pass, prompt) block is kept
            (:func:`specrepro.files.resumable_rows`), so an interrupted run resumes under the same settings and code of
            this module; None: no checkpoint. checkpoint_key: extra conditions a saved block must share (the models'
            names, the CPU).

    Returns:
        one row per (pass, prompt, decoding, width) with repeat (the pass), shape, tree (e.g. "⟨1,1,3,1⟩"),
        tokens_per_step (= accepted path length + 1 per step, the paper's "verified tokens per step"),
        mean_accepted, nodes_per_step, timings (seconds, ms_per_token, draft_ms_per_step, target_ms_per_step),
        tokens_per_s and ``accepted`` (the per-step accepted path lengths, space-separated).

    Raises:
        ValueError: unknown shape, no passes or a negative pass.
    """
    from specrepro.files import code_fingerprint, resumable_rows

    passes, prompts = [int(r) for r in passes], list(prompts)
    if not passes or min(passes) < 0:
        raise ValueError(f"tree_width_table needs pass indices >= 0; got {passes}")
    expansions = {w: expansion_widths(w, depth, shape) for w in widths}
    vocab = target.get_output_embeddings().weight.shape[0]
    eos = default_eos_ids(target, tokenizer)

    def block(i: int) -> dict:
        r, j = passes[i // len(prompts)], i % len(prompts)
        ids, runs = _encode(tokenizer, prompts[j].text), []
        for dec in decodings:
            for w in widths:
                prop = DraftTreeProposer(draft, expansions[w], "topk" if dec == "greedy" else "iid", vocab)
                out = tree_generate(target, ids, prop, max_new_tokens=max_new_tokens,
                                    sampling=SamplingConfig(0.0 if dec == "greedy" else 1.0),
                                    generator=_gen(seed + r, target.device), eos_token_id=eos)
                row = _row(out, decoding=dec, width=w, depth=depth, prompt=prompts[j].id, shape=shape, repeat=r,
                           tree="⟨" + ",".join(map(str, expansions[w])) + "⟩")
                runs.append({k: v.item() if hasattr(v, "item") else v for k, v in row.items()})
        return {"runs": runs}

    key = dict(checkpoint_key or {}, widths=[int(w) for w in widths], depth=int(depth), shape=shape,
               tokens=int(max_new_tokens), seed=int(seed), decodings=list(decodings), passes=passes,
               prompts=[p.id for p in prompts], code=code_fingerprint(("specrepro.lab.specinfer",)))
    blocks, _ = resumable_rows(len(passes) * len(prompts), block, checkpoint=checkpoint, key=key,
                               what="tree-width checkpoint", progress="tree widths" if progress else None,
                               index="block")
    return pd.DataFrame([run for b in blocks for run in b["runs"]])


def tree_width_summary(runs: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Table 2 rows with 95% intervals over prompts, and SpecInfer's numbers beside the paper-shaped trees.

    Args:
        runs: :func:`tree_width_table` rows (one or both shapes; rows without a ``shape`` column count as "root").
        seed: seed of the bootstrap resampling.

    Returns:
        one row per (shape, decoding, width): tree, n_prompts, tokens_per_step / _lo / _hi (mean over prompts of
        each prompt's verified tokens per step, percentile-bootstrap interval, :func:`specrepro.stats.bootstrap_ci`),
        ms_per_token / _lo / _hi (median over prompts of each prompt's wall ms per generated token, draft and
        target included; runs are sequential, not interleaved, so drift between widths is not paired away),
        nodes_per_step, paper (SpecInfer Table 2, Alpaca, LLaMA-7B/68M: only for shape "paper" at depth 8 and widths
        1-5, else NaN).
    """
    from specrepro.stats import bootstrap_ci

    runs = runs if "shape" in runs.columns else runs.assign(shape="root")
    runs = runs.assign(ms_per_token=1000 * runs["seconds"] / runs["tokens"].clip(lower=1))
    rows = []
    for (shape, dec, w), d in runs.groupby(["shape", "decoding", "width"], sort=True):
        per_prompt = d.groupby("prompt", sort=False)
        tps = bootstrap_ci(per_prompt["tokens_per_step"].mean().to_numpy(), np.mean, seed=seed)
        ms = bootstrap_ci(per_prompt["ms_per_token"].median().to_numpy(), np.median, seed=seed)
        same_tree = shape == "paper" and ("depth" not in d or (d["depth"] == 8).all())  # SpecInfer: depth 8
        paper = SPECINFER_TABLE2.get(int(w), (np.nan, np.nan))[0 if dec == "greedy" else 1] if same_tree else np.nan
        rows.append({"shape": shape, "decoding": dec, "width": int(w),
                     "tree": d["tree"].iloc[0] if "tree" in d else "", "n_prompts": int(d["prompt"].nunique()),
                     "tokens_per_step": tps[0], "tokens_per_step_lo": tps[1], "tokens_per_step_hi": tps[2],
                     "ms_per_token": ms[0], "ms_per_token_lo": ms[1], "ms_per_token_hi": ms[2],
                     "nodes_per_step": float(d["nodes_per_step"].mean()), "paper": paper})
    return pd.DataFrame(rows)


def naive_vs_mss_table(target, draft, tokenizer, prompts, width: int = 5, depth: int = 8, max_new_tokens: int = 32,
                       seed: int = 0, mode: str = "iid", repeats: int = 1, checkpoint=None,
                       checkpoint_key: dict | None = None, progress: bool = True) -> pd.DataFrame:
    """SpecInfer Table 3 analogue (Miao et al. 2024, §6.6; its Algorithm 2 against naive sampling): naive sampling vs
    multi-step speculative sampling on the same stochastic trees (T = 1, ⟨width, 1, ..., 1⟩, children drawn
    ``mode``), untimed for the verdict (tokens per step), timed only as a by-product.

    Every pass r = 0 .. repeats - 1 decodes every prompt with both methods, each from a generator seeded
    ``seed + r`` (the pair shares its seed; the passes are independent draws). Each finished (pass, prompt) block is
    kept in ``checkpoint`` (:func:`specrepro.files.resumable_rows`), so an interrupted run resumes under the same
    settings and code of this module only.

    Args:
        target, draft: Hugging Face causal LMs sharing a vocabulary. prompts: workload prompts (``.id``, ``.text``).
        width: branches at the first token (>= 1). depth: tree depth (>= 1). max_new_tokens: tokens per run.
        repeats: passes (>= 1). checkpoint: a JSON file path or None. checkpoint_key: extra conditions a saved
            block must share (e.g. the models' names and the CPU).

    Returns:
        one row per (pass, prompt, method): method, width, depth, prompt, repeat, tokens, steps, tokens_per_step,
        mean_accepted, nodes_per_step, seconds, ms_per_token, tokens_per_s, draft_ms_per_step, target_ms_per_step,
        accepted (tokens accepted per step, space-separated).

    Raises:
        ValueError: repeats < 1.
    """
    from specrepro.files import code_fingerprint, resumable_rows

    if int(repeats) < 1:
        raise ValueError(f"naive_vs_mss_table needs repeats >= 1, got {repeats}")
    vocab = target.get_output_embeddings().weight.shape[0]
    eos = default_eos_ids(target, tokenizer)
    prompts = list(prompts)

    def block(i: int) -> dict:
        r, j = divmod(i, len(prompts))
        runs = []
        for method in ("naive", "mss"):
            prop = DraftTreeProposer(draft, [width] + [1] * (depth - 1), mode, vocab)
            out = tree_generate(target, _encode(tokenizer, prompts[j].text), prop, max_new_tokens=max_new_tokens,
                                sampling=SamplingConfig(1.0), generator=_gen(seed + r, target.device),
                                eos_token_id=eos, method=method)
            row = _row(out, method=method, width=width, depth=depth, prompt=prompts[j].id, repeat=r)
            runs.append({k: v.item() if hasattr(v, "item") else v for k, v in row.items()})
        return {"runs": runs}

    key = dict(checkpoint_key or {}, width=int(width), depth=int(depth), tokens=int(max_new_tokens), seed=int(seed),
               mode=mode, prompts=[p.id for p in prompts], code=code_fingerprint(("specrepro.lab.specinfer",)))
    blocks, _ = resumable_rows(int(repeats) * len(prompts), block, checkpoint=checkpoint, key=key,
                               what="naive-vs-MSS checkpoint", progress="naive vs MSS" if progress else None,
                               index="block")
    return pd.DataFrame([run for b in blocks for run in b["runs"]])


@torch.inference_mode()
def tree_cost_table(model, prefix_ids: torch.Tensor, sizes, repeats: int = 3, width: int = 4,
                    name: str = "target", warmup_rounds: int = 2) -> pd.DataFrame:
    """Measured time of one tree-attention forward of ``model`` over N + 1 fed tokens (root + N nodes) on top of a
    KV cache holding ``prefix_ids`` (the verification cost t(N); SpecInfer Sec. 6, Sequoia's t_target(n)).

    The tree for each N is the first N nodes of the expansion ⟨width, 1, 1, ...⟩ (the cost depends on N, hardly on
    the shape). The sizes are timed round-robin, as :func:`specrepro.measure.cost.measure_cost_curve` does (the first
    forwards after the prefill run slow on a CPU; timing size by size would charge that to the first sizes):
    ``warmup_rounds`` untimed rounds, then ``repeats`` timed rounds over every size; the cache is cropped back to the
    prefix after each call.

    Returns:
        one row per N: model, n_nodes, fed_tokens (N + 1), ms (median over the rounds), ms_min.

    Raises:
        ValueError: ``repeats`` < 1 or ``warmup_rounds`` < 0.
    """
    from tqdm.auto import tqdm

    if int(repeats) < 1 or int(warmup_rounds) < 0:
        raise ValueError(f"tree_cost_table needs repeats >= 1 and warmup_rounds >= 0; got {repeats}, {warmup_rounds}")
    ids = prefix_ids.reshape(-1).to(model.device)
    cache = new_cache(model)
    model(input_ids=ids[None, :-1], past_key_values=cache, use_cache=True, logits_to_keep=1)
    start = ids.numel() - 1
    sizes = [int(n) for n in sizes]
    calls = {}
    for n in sizes:
        tmpl = TreeTemplate.expansion([width] + [1] * max(1, n))
        tree = TokenTree(torch.tensor(tmpl.parents[:n]), ids[-1].repeat(n).cpu() if n else torch.empty(0).long())
        calls[n] = (torch.cat([ids[-1:], tree.tokens.to(model.device)]), tree.compile())
    times: dict[int, list[float]] = {n: [] for n in sizes}
    rounds = int(warmup_rounds) + int(repeats)
    for r in tqdm(range(rounds), desc=f"tree cost ({name})", unit="round", delay=2, disable=None):
        for n in sizes:
            feed, compiled = calls[n]
            crop_cache(cache, start)
            if model.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            if n:
                tree_forward(model, cache, feed, compiled, start)
            else:
                model(input_ids=feed[None], past_key_values=cache, use_cache=True)
            if model.device.type == "cuda":
                torch.cuda.synchronize()
            if r >= int(warmup_rounds):
                times[n].append(1000 * (time.perf_counter() - t0))
    crop_cache(cache, start)
    return pd.DataFrame([{"model": name, "n_nodes": n, "fed_tokens": n + 1, "ms": float(np.median(times[n])),
                          "ms_min": float(np.min(times[n]))} for n in sizes])


def choose_tree(width_runs: pd.DataFrame, target_cost: pd.DataFrame, draft_cost: pd.DataFrame,
                decoding: str = "stochastic", depths=range(1, 9)) -> pd.DataFrame:
    """Hardware-aware choice of tree size (Sequoia Sec. 4 in spirit): predicted tokens/s of every ⟨w, 1, ..., 1⟩
    tree of depth d <= the measured depth, from measured quantities only.

    Expected tokens per step at depth d come from the accepted path lengths measured at full depth: truncating a
    tree at depth d turns an accepted length a into min(a, d) (verification decides top-down, so the decisions up
    to depth d do not depend on deeper nodes). Time per step = d draft forwards over w nodes (draft cost curve at
    w fed tokens) + one target forward over w·d + 1 tokens (target cost curve), both interpolated from
    :func:`tree_cost_table` outputs. Width 1 is the chain (γ = d).

    Returns:
        one row per (width, depth): width, depth, nodes, tokens_per_step, step_ms, predicted_tokens_per_s;
        sorted best first.
    """
    def interp(cost, n):
        return float(np.interp(n, cost["fed_tokens"], cost["ms"]))

    if "shape" in width_runs.columns:  # the ranking is over ⟨w,1,...,1⟩ trees: w·d nodes at depth d
        width_runs = width_runs[width_runs["shape"] == "root"]
    runs = width_runs[width_runs["decoding"] == decoding]
    rows = []
    for w, grp in runs.groupby("width"):
        acc = np.concatenate([np.asarray(a, dtype=int) if not isinstance(a, str) else
                              np.asarray(a.split(), dtype=int) for a in grp["accepted"]])
        for d in depths:
            tps = float(np.mean(np.minimum(acc, d) + 1))
            step = d * interp(draft_cost, w) + interp(target_cost, w * d + 1)
            rows.append({"width": int(w), "depth": d, "nodes": int(w) * d, "tokens_per_step": tps, "step_ms": step,
                         "predicted_tokens_per_s": 1000 * tps / step})
    return pd.DataFrame(rows).sort_values("predicted_tokens_per_s", ascending=False).reset_index(drop=True)


def tree_vs_chain_speed(target, draft, tokenizer, prompts, tree: tuple[int, int], gamma: int,
                        sampling: SamplingConfig = SamplingConfig(1.0), max_new_tokens: int = 64, seed: int = 0,
                        mode: str = "iid", repeats: int = 1, progress: bool = True, checkpoint=None,
                        checkpoint_key: dict | None = None, equal_positions: bool = True,
                        prompt_offset: int = 0) -> pd.DataFrame:
    """Tokens/s of AR, the best chain (:func:`~specrepro.core.decoding.generate` with a
    :class:`~specrepro.drafters.model.DraftModelDrafter`, γ = ``gamma``), the chain that feeds the target as many
    positions per step as the tree (γ = w·d, labelled ``"chain γ=<w·d> (equal positions)"``) and the best tree
    (⟨w, 1, ..., 1⟩ of depth d, ``tree = (w, d)``: root + w·d nodes), timed by the one harness
    (:func:`specrepro.measure.harness.run_interleaved`).

    Args:
        gamma: the best chain's draft length (>= 1). When it equals w·d, one chain is timed, labelled as the
            equal-positions chain.
        equal_positions: also time the chain of γ = w·d (tree against chain at equal target positions per step,
            w·d + 1 each); False: AR, the best chain and the tree only.
        prompt_offset: the index of ``prompts[0]`` in the whole workload (a shard times a slice of the prompts;
            :func:`~specrepro.measure.harness.run_interleaved` seeds and orders each prompt as the whole run would).
        checkpoint: a JSON file where every finished (pass, prompt) block is kept, so that an interrupted timing
            resumes at the next block (:func:`~specrepro.measure.harness.run_interleaved`); the caller deletes it
            once the table is saved. None: no checkpoint.
        checkpoint_key: what names the models (e.g. ``{"target": ..., "draft": ...}``, the draft's dtype or int8
            copy included): saved blocks resume only under the same names, settings, prompts, machine, torch and
            tree-decoding code (:data:`TREE_SPEED_MODULES`), which this function adds to the key.

    Returns:
        one row per (repeat, prompt, method), :func:`specrepro.measure.harness.per_run_table` columns (method, tokens,
        seconds, tokens_per_s, tokens_per_step, ...); summarize with :func:`specrepro.measure.harness.speedup_table`
        (baseline "AR"). ``attrs["resumed_blocks"]``: the (pass, prompt) blocks read from ``checkpoint``.

    Raises:
        ValueError: ``gamma``, the tree's width or its depth < 1.
    """
    vocab = target.get_output_embeddings().weight.shape[0]
    w, d = (int(x) for x in tree)
    tree_mode = "topk" if sampling.greedy else mode
    eos = default_eos_ids(target, tokenizer)
    if int(gamma) < 1 or w < 1 or d < 1:
        raise ValueError(f"tree_vs_chain_speed needs gamma, width and depth >= 1; got {gamma}, {w}, {d}")
    chain_drafter = DraftModelDrafter(draft, vocab)
    proposer = DraftTreeProposer(draft, [w] + [1] * (d - 1), tree_mode, vocab)
    tree_name = f"tree <{w}{',1' * (d - 1)}> ({w * d} nodes)"
    chains = {f"chain γ={int(gamma)}": int(gamma)}  # label -> γ
    if equal_positions:
        chains = {k: g for k, g in chains.items() if g != w * d} | {f"chain γ={w * d} (equal positions)": w * d}

    def runner(method, n):
        if method == "AR":
            return lambda ids, g: generate(target, ids, max_new_tokens=n, sampling=sampling, generator=g,
                                           eos_token_id=eos)
        if method in chains:
            return lambda ids, g: generate(target, ids, drafter=chain_drafter, gamma=chains[method],
                                           max_new_tokens=n, sampling=sampling, generator=g, eos_token_id=eos)
        return lambda ids, g: tree_generate(target, ids, proposer, max_new_tokens=n, sampling=sampling, generator=g,
                                            eos_token_id=eos)

    methods = ["AR", *chains, tree_name]
    encoded = [(p.id, _encode(tokenizer, p.text).to(target.device)) for p in prompts]
    key = None if checkpoint is None else timing_checkpoint_key(
        TREE_SPEED_MODULES, encoded, target.device, **{
            **(checkpoint_key or {}), "methods": methods, "tree": [w, d], "gamma": int(gamma), "mode": mode,
            "sampling": [sampling.temperature, sampling.top_p, sampling.top_k], "max_new_tokens": max_new_tokens,
            "seed": seed, "prompt_offset": int(prompt_offset)})
    runs = run_interleaved({m: runner(m, max_new_tokens) for m in methods}, encoded, repeats=repeats, seed=seed,
                           device=target.device, warmup={m: runner(m, 4) for m in methods}, baseline="AR",
                           greedy=sampling.greedy, progress=progress, desc="tree vs chain", checkpoint=checkpoint,
                           checkpoint_key=key, prompt_offset=int(prompt_offset))
    table = per_run_table(runs)
    table.attrs["resumed_blocks"] = int(runs.attrs.get("resumed_blocks", 0))
    return table
