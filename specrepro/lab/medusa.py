"""The experiment harness behind notebook 06: Medusa beside other methods, timed by the one harness.

What this file is: :func:`make_runner` (one callable per decoding method: AR, chain, tree, Medusa),
:func:`compare_methods` (:func:`specrepro.measure.harness.run_interleaved` over them) and :func:`acceleration_table`
(Medusa Table 1 columns: acceleration rate, overhead, speedup with its interval; beside each Medusa row the paper's
MT-Bench speedup of the same kind, Medusa-1 or Medusa-2).

What it is not: a timing loop of its own (:mod:`specrepro.measure.harness` is the only one).
"""

from __future__ import annotations

import torch

from specrepro.core.decoding import MODEL_EOS
from specrepro.core.medusa import medusa_generate
from specrepro.core.sampling import GREEDY, SamplingConfig
from specrepro.lab.papers import paper_table

__all__ = ["PAPER_TABLE1", "paper_speedup", "make_runner", "compare_methods", "acceleration_table"]


#: Medusa (arXiv 2401.10774v3) wall-clock speedups over AR on MT-Bench, Vicuna-7B, as the paper's text and figures
#: state them: Medusa-1 (heads on a frozen backbone) and Medusa-2 (heads and backbone trained jointly); model -> speedup.
#: The paper's Table 1 acceleration rate and overhead are not carried: they were recalled, never checked against the
#: paper's text.
PAPER_TABLE1 = dict(zip(paper_table("medusa_table1")["model"], paper_table("medusa_table1")["mt_bench_speedup"]))


def paper_speedup(method: str) -> float:
    """The paper's MT-Bench speedup (Vicuna-7B) of the same kind as ``method``: Medusa-2's for a row named
    ``Medusa-2...``, Medusa-1's for any other ``Medusa...`` row (heads on the unchanged target), NaN otherwise."""
    if method.startswith("Medusa-2"):
        return float(PAPER_TABLE1["Medusa-2 Vicuna-7B"])
    if method.startswith("Medusa"):
        return float(PAPER_TABLE1["Medusa-1 Vicuna-7B"])
    return float("nan")


# ----------------------------------------------------------------------------------------------------------------
# Experiment helpers behind notebook 06 (tables of Medusa Table 1 kind, HumanEval pass@1)
# ----------------------------------------------------------------------------------------------------------------

def make_runner(target, kind: str, proposer=None, *, gamma: int = 4, acceptance: str = "greedy",
                eos_token_id=MODEL_EOS, max_new_tokens: int = 128):
    """A uniform callable ``run(ids long [L], sampling, generator, n=max_new_tokens) -> GenerationResult`` for one
    decoding method.

    Args:
        kind: "ar" (:func:`specrepro.core.decoding.generate` without drafter), "chain" (chain speculative decoding with the
            drafter ``proposer`` and ``gamma``), "tree" (:func:`specrepro.core.trees.tree_generate` with the tree proposer
            ``proposer``), "medusa" (:func:`medusa_generate` with the :class:`MedusaProposer` ``proposer`` and
            ``acceptance``).
        eos_token_id: stop ids; default :data:`specrepro.core.decoding.MODEL_EOS` (the target's generation config).

    Raises:
        ValueError: unknown kind.
    """
    from specrepro.core.decoding import generate
    from specrepro.core.trees import tree_generate

    if kind == "ar":
        def run(ids, s, g, n=max_new_tokens):
            return generate(target, ids, max_new_tokens=n, sampling=s, generator=g, eos_token_id=eos_token_id)
    elif kind == "chain":
        def run(ids, s, g, n=max_new_tokens):
            return generate(target, ids, drafter=proposer, gamma=gamma, max_new_tokens=n, sampling=s, generator=g,
                            eos_token_id=eos_token_id)
    elif kind == "tree":
        def run(ids, s, g, n=max_new_tokens):
            return tree_generate(target, ids, proposer, max_new_tokens=n, sampling=s, generator=g,
                                 eos_token_id=eos_token_id)
    elif kind == "medusa":
        def run(ids, s, g, n=max_new_tokens):
            return medusa_generate(target, ids, proposer, acceptance=acceptance, max_new_tokens=n, sampling=s,
                                   generator=g, eos_token_id=eos_token_id)
    else:
        raise ValueError(f"unknown method kind {kind!r}; expected 'ar', 'chain', 'tree' or 'medusa'")
    run.target = target  # the harness puts the prompts and generators on the target's device
    return run


def compare_methods(tokenizer, methods: dict, prompts, *, sampling: SamplingConfig = GREEDY, seed: int = 0,
                    baseline: str | None = None, warmup: bool = True, repeats: int = 1, progress: bool = True,
                    checkpoint=None, checkpoint_key: dict | None = None):
    """Run decoding methods side by side with the one harness (:func:`specrepro.measure.harness.run_interleaved`:
    interleaved prompt by prompt, method order rotated, warm-up, one seeding rule).

    Args:
        tokenizer: encodes the prompt texts (raw text, as :func:`specrepro.lab.leviathan.encode`).
        methods: name -> runner from :func:`make_runner`, or name -> (runner, SamplingConfig) to override
            ``sampling`` per method.
        prompts: list of :class:`~specrepro.data.Prompt` (or str).
        baseline: name of the method whose output the others are compared with under greedy (``same_as_baseline``).
        repeats: timed passes over the prompts.
        checkpoint, checkpoint_key: resume an interrupted run from its finished (pass, prompt) blocks (as
            :func:`~specrepro.measure.harness.run_interleaved`'s; the caller deletes the file once the table is saved).

    Returns:
        pandas DataFrame, one row per (repeat, prompt, method): :func:`specrepro.measure.harness.per_run_table` columns
        (prompt, method, tokens, seconds, tokens_per_s, steps, tokens_per_step, loop_ms (decoding time after the
        prefill per target forward, ms), target_ms, drafted, accepted, alpha, ...) plus temperature, ms_per_step (=
        loop_ms), same_as_baseline and text (decoded output).
    """
    from specrepro.data import Prompt
    from specrepro.lab.leviathan import encode
    from specrepro.measure.harness import per_run_table, run_interleaved

    norm = {k: (v if isinstance(v, tuple) else (v, sampling)) for k, v in methods.items()}
    prompts = [p if not isinstance(p, str) else Prompt(f"prompt/{i}", p) for i, p in enumerate(prompts)]
    first = next(iter(norm.values()))[0]
    device = getattr(getattr(first, "target", None), "device", torch.device("cpu"))
    encoded = [(p.id, encode(tokenizer, p.text).to(device)) for p in prompts]
    runners = {k: (lambda run, s: (lambda ids, g: run(ids, s, g)))(run, s) for k, (run, s) in norm.items()}
    warm = {k: (lambda run, s: (lambda ids, g: run(ids, s, g, 4)))(run, s) for k, (run, s) in norm.items()} \
        if warmup else None
    greedy = all(s.greedy for _, s in norm.values())
    runs = run_interleaved(runners, encoded, repeats=repeats, seed=seed, device=device, warmup=warm,
                           baseline=baseline, greedy=greedy and baseline is not None, progress=progress,
                           desc="methods", checkpoint=checkpoint, checkpoint_key=checkpoint_key)
    out = per_run_table(runs).rename(columns={"equal_to_baseline": "same_as_baseline"})
    out.insert(out.columns.get_loc("method") + 1, "temperature", [norm[m][1].temperature for m in out["method"]])
    out["ms_per_step"] = out["loop_ms"]
    out["text"] = [tokenizer.decode(t, skip_special_tokens=True) for t in runs["token_ids"]]
    return out


def acceleration_table(df, baseline: str):
    """Medusa Table 1 columns per method from a :func:`compare_methods` table: acceleration rate (tokens per step),
    overhead (ms per step / the baseline's ms per step), predicted speedup = rate / overhead, and the measured
    speedup (the harness's paired per-prompt tokens/s ratio, median over prompts, with its 95% bootstrap interval
    ``speedup_measured_lo``/``_hi``; :func:`specrepro.measure.harness.paired_speedup`), tokens/s (median over prompts of each
    prompt's median, with its 95% bootstrap interval ``tokens_per_s_lo``/``_hi``), and ``paper_speedup``: the paper's
    MT-Bench speedup of the same kind (:func:`paper_speedup`; Vicuna-7B on a GPU, so a reference, not a target).

    Raises:
        KeyError: ``baseline`` is not a method of ``df``.
    """
    import pandas as pd

    from specrepro.measure.harness import paired_speedup
    from specrepro.stats import bootstrap_ci

    if baseline not in set(df["method"]):
        raise KeyError(f"baseline {baseline!r} not among the methods {sorted(set(df['method']))}")
    base = df[df["method"] == baseline].set_index("prompt")
    rows = []
    for name, g in df.groupby("method", sort=False):
        g = g.set_index("prompt")
        rate = g["tokens"].sum() / max(1, g["steps"].sum())
        ms_step = (g["ms_per_step"] * g["steps"]).sum() / max(1, g["steps"].sum())
        base_ms = (base["ms_per_step"] * base["steps"]).sum() / max(1, base["steps"].sum())
        overhead = ms_step / base_ms
        tps = bootstrap_ci(g.groupby(level="prompt", sort=False)["tokens_per_s"].median().to_numpy())
        sp = paired_speedup(df, name, baseline) if name != baseline else \
            {"speedup": 1.0, "speedup_lo": 1.0, "speedup_hi": 1.0, "n_prompts": int(g.index.nunique())}
        rows.append({"method": name, "acceleration_rate": rate, "overhead": overhead,
                     "speedup_rate_over_overhead": rate / overhead, "speedup_measured": sp["speedup"],
                     "speedup_measured_lo": sp["speedup_lo"], "speedup_measured_hi": sp["speedup_hi"],
                     "n_prompts": sp["n_prompts"], "tokens_per_s": tps[0], "tokens_per_s_lo": tps[1],
                     "tokens_per_s_hi": tps[2],
                     "paper_speedup": paper_speedup(name)})
    return pd.DataFrame(rows)
