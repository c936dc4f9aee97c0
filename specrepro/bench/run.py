"""One benchmark run: methods resolved, models loaded, prompts timed by the one harness, results summarized.

What this file is: :func:`run_bench` and :class:`BenchResult` (per-run rows, a per-method summary with paired
speedups and their 95% intervals, JSON).

What it is not: the timing loop (:mod:`specrepro.measure.harness`) or the command line (:mod:`specrepro.bench.cli`).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import platform
import re
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specrepro.bench.options import BenchOptionError
from specrepro.bench.registry import (
    DEFAULT_METHODS,
    OPTION_KEYS,
    BenchContext,
    MethodSpec,
    canonical_bench,
    canonical_method,
    resolve_method,
    validate_options,
)
from specrepro.core.sampling import SamplingConfig
from specrepro.measure.harness import paired_speedup, run_interleaved
from specrepro.stats import ratio_of_sums_ci

# ---------------------------------------------------------------------------------------------------------------
# Timing and aggregation
# ---------------------------------------------------------------------------------------------------------------

def _per_position(drafted, accepted, gamma):
    reached, acc = [0] * gamma, [0] * gamma
    for g, n in zip(drafted, accepted):
        for i in range(min(g, n + 1, gamma)):
            reached[i] += 1
            acc[i] += i < n
    return reached, acc


@dataclass
class BenchResult:
    """:func:`run_bench` output: ``summary`` (one row per method), ``runs`` (one row per timed call), ``config``."""

    summary: Any
    runs: Any
    config: dict

    def to_json(self) -> dict:
        import numpy as np

        def clean(v):
            if isinstance(v, float) and not math.isfinite(v):
                return None
            if isinstance(v, (np.floating,)):
                return clean(float(v))
            if isinstance(v, (np.integer,)):
                return int(v)
            if isinstance(v, (np.bool_,)):
                return bool(v)
            if isinstance(v, (list, tuple)):
                return [clean(x) for x in v]
            return v

        rows = lambda df: [{k: clean(v) for k, v in r.items()} for r in df.to_dict(orient="records")]  # noqa: E731
        return {"config": self.config, "summary": rows(self.summary), "runs": rows(self.runs)}

    def table(self):
        """The summary formatted for printing (rounded; per-position acceptance as a short string)."""
        df = self.summary.copy()
        df["per_position_acceptance"] = df["per_position_acceptance"].map(
            lambda xs: " ".join("-" if (x is None or not math.isfinite(x)) else f"{x:.2f}" for x in xs) if xs else "")
        for col in ("speedup_vs_ar", "speedup_vs_hf_assisted", "speedup_vs_hf_ar", "speedup_vs_hf_assisted_int8",
                    "speedup_vs_hf_assisted_int8_pruned", "speedup_vs_hf_assisted_int4", "speedup_vs_llama_ar",
                    "speedup_vs_llama_server_ar"):
            if f"{col}_lo" in df:  # the 95% interval beside the median, as printed text
                df[f"{col}_95ci"] = [f"[{lo:.2f}, {hi:.2f}]" if math.isfinite(lo) and math.isfinite(hi) else ""
                                     for lo, hi in zip(df[f"{col}_lo"], df[f"{col}_hi"])]
        cols = ["method", "gamma", "exact", "n_prompts", "tokens_per_s", "ms_per_token", "speedup_vs_ar",
                "speedup_vs_ar_95ci", "speedup_vs_hf_assisted", "speedup_vs_hf_assisted_95ci", "speedup_vs_hf_ar",
                "speedup_vs_hf_ar_95ci", "speedup_vs_hf_assisted_int8", "speedup_vs_hf_assisted_int8_95ci",
                "speedup_vs_hf_assisted_int8_pruned", "speedup_vs_hf_assisted_int8_pruned_95ci",
                "speedup_vs_hf_assisted_int4", "speedup_vs_hf_assisted_int4_95ci", "speedup_vs_llama_ar",
                "speedup_vs_llama_ar_95ci", "speedup_vs_llama_server_ar", "speedup_vs_llama_server_ar_95ci", "alpha",
                "tokens_per_step", "drafted_per_step", "per_position_acceptance", "greedy_equal_to_ar",
                "greedy_equal_to_llama_ar", "greedy_equal_to_llama_server_ar", "predicted_speedup",
                "predicted_speedup_with_prefill", "free_draft_bound", "measured_over_predicted"]
        return df[[c for c in cols if c in df.columns]].set_index("method").round(3)


def _gamma_label(spec: MethodSpec, gamma: int):
    """γ as reported: the method's γ; 0 for AR methods (Chen's K = 0); None where the method chooses it itself."""
    if spec.uses_gamma:
        return gamma
    return None if spec.needs_draft else 0


#: transformers' methods that, when run, get a paired-ratio column of their own beside ``speedup_vs_ar`` and
#: ``speedup_vs_hf_assisted`` (``speedup_vs_hf_ar``: is our AR as fast as transformers' own greedy ``generate``?;
#: ``speedup_vs_hf_assisted_int8`` / ``_int8_pruned``: our loop against transformers' with the same int8 draft, or
#: the same int8 draft with the FR-Spec pruned head; ``speedup_vs_hf_assisted_int4``: the same 4-bit draft;
#: ``speedup_vs_llama_ar``: against our loop's AR decoding of the same GGUF file on llama.cpp's kernels,
#: :mod:`specrepro.bench.llama`; ``speedup_vs_llama_server_ar``: against llama.cpp's own AR, its server without
#: speculation, :mod:`specrepro.bench.llamaserver`)
OTHER_BASELINES = ("hf-ar", "hf-assisted-int8", "hf-assisted-int8-pruned", "hf-assisted-int4", "llama-ar",
                   "llama-server-ar")

#: prompts :func:`run_bench` takes from a workload when ``n_prompts`` is not given (explicit ``prompts`` are all run)
DEFAULT_N_PROMPTS = 10


def rate_intervals(d, seed: int = 0) -> dict:
    """95% intervals of one method's pooled tokens per target step and α, bootstrapped over prompts.

    The pooled rates are those of the summary (new tokens / steps, the mean of every step's acceptance term); each
    prompt's runs (all its repeats) form one cluster (:func:`specrepro.stats.ratio_of_sums_ci`).

    Args:
        d: one method's runs (a DataFrame with ``prompt``, ``new_tokens``, ``steps`` and ``alpha_terms``, a list
            of floats per run), as in a bench JSON's ``runs``.
        seed: the bootstrap's seed.

    Returns:
        ``tokens_per_step_lo``, ``tokens_per_step_hi``, ``alpha_lo``, ``alpha_hi`` (NaN where the method takes no
        steps or has no acceptance terms, or with one prompt).
    """
    nan = float("nan")
    out = dict.fromkeys(("tokens_per_step_lo", "tokens_per_step_hi", "alpha_lo", "alpha_hi"), nan)
    if not len(d) or "prompt" not in d:
        return out
    by = d.groupby("prompt", sort=False)
    if "steps" in d and d["steps"].notna().any():
        _, out["tokens_per_step_lo"], out["tokens_per_step_hi"] = ratio_of_sums_ci(
            by["new_tokens"].sum().to_numpy(float), by["steps"].sum().to_numpy(float), seed=seed)
    if "alpha_terms" in d:
        terms = by["alpha_terms"].agg(lambda xs: [x for run in xs for x in (run or [])])
        if terms.map(len).sum():
            _, out["alpha_lo"], out["alpha_hi"] = ratio_of_sums_ci(
                terms.map(sum).to_numpy(float), terms.map(len).to_numpy(float), seed=seed)
    return out


def greedy_equality(runs, label: str, base: str) -> dict:
    """Under greedy decoding: whether method ``label``'s tokens equal method ``base``'s on every (pass, prompt) both
    ran, from a per-run table of :func:`specrepro.measure.harness.run_interleaved` (columns repeat, prompt, method,
    token_ids).

    Returns:
        ``greedy_equal_to_<base>`` (bool; None when they share no (pass, prompt)) and ``equal_to_<base>_runs``
        ("k/n" runs equal), ``<base>`` with '-' written '_'; an empty dict when the table has no token ids.
    """
    key = base.replace("-", "_")
    cols = ["repeat", "prompt", "token_ids"]
    if "token_ids" not in runs:
        return {}
    mine = runs.loc[runs["method"] == label, cols]
    theirs = runs.loc[runs["method"] == base, cols]
    both = mine.merge(theirs, on=["repeat", "prompt"], suffixes=("", "_base"))
    same = [list(a) == list(b) for a, b in zip(both["token_ids"], both["token_ids_base"])]
    return {f"greedy_equal_to_{key}": bool(all(same)) if same else None,
            f"equal_to_{key}_runs": f"{sum(same)}/{len(same)}" if same else ""}


def _summarize(runs, resolved, greedy: bool, seed: int = 0):
    import numpy as np
    import pandas as pd

    methods = set(runs["method"])
    rows = []
    for label, spec, gamma in resolved:
        d = runs[runs["method"] == label]
        drafted = [x for xs in d["drafted"] for x in xs]
        accepted = [x for xs in d["accepted"] for x in xs]
        # the depth reachable at each step: the tree depth for trees, the number of draft tokens for chains
        reach = [x for ds, xs in zip(d["depths"], d["drafted"]) for x in (ds if len(ds) else xs)]
        alpha_terms = [x for xs in d["alpha_terms"] for x in xs]
        steps = int(d["steps"].sum())
        has_steps = steps > 0
        g = gamma if spec.uses_gamma else 0
        reached, acc = _per_position(reach, accepted, g) if (g and drafted) else ([], [])
        eq = d["equal_to_baseline"].dropna()
        vs_ar = paired_speedup(runs, label, "ar", seed=seed) if "ar" in methods else {}
        vs_hf = paired_speedup(runs, label, "hf-assisted", seed=seed) if "hf-assisted" in methods else {}
        vs_other = {base: paired_speedup(runs, label, base, seed=seed) for base in OTHER_BASELINES if base in methods}
        nan = float("nan")
        rows.append({
            "method": label, "family": spec.family, "gamma": _gamma_label(spec, gamma), "exact": spec.exact,
            "runs": len(d), "n_prompts": int(d["prompt"].nunique()),
            "new_tokens": float(d["new_tokens"].mean()),
            "tokens_per_s": float(d["tokens_per_s"].median()),
            "ms_per_token": float(d["ms_per_token"].median()),
            "speedup_vs_ar": vs_ar.get("speedup", nan),
            "speedup_vs_ar_lo": vs_ar.get("speedup_lo", nan), "speedup_vs_ar_hi": vs_ar.get("speedup_hi", nan),
            "speedup_vs_hf_assisted": vs_hf.get("speedup", nan),
            "speedup_vs_hf_assisted_lo": vs_hf.get("speedup_lo", nan),
            "speedup_vs_hf_assisted_hi": vs_hf.get("speedup_hi", nan),
            **{f"speedup_vs_{base.replace('-', '_')}{end}": vs.get(f"speedup{end}", nan)
               for base, vs in vs_other.items() for end in ("", "_lo", "_hi")},
            "alpha": float(np.mean(alpha_terms)) if alpha_terms else nan,
            "tokens_per_step": float(d["new_tokens"].sum() / steps) if has_steps else nan,
            **(rate_intervals(d, seed=seed) if has_steps else {}),
            "accepted_per_step": float(sum(accepted) / steps) if has_steps and drafted else
            (0.0 if has_steps else nan),
            "drafted_per_step": float(sum(drafted) / steps) if has_steps and drafted else
            (0.0 if has_steps else nan),
            "loop_ms": float(d["loop_ms"].median()) if has_steps else nan,
            "peak_rss_mb": float(d["peak_rss_mb"].max()) if "peak_rss_mb" in d and d["peak_rss_mb"].notna().any()
            else nan,
            "per_position_acceptance": [a / r if r else nan for a, r in zip(acc, reached)],
            "greedy_equal_to_ar": (bool(eq.all()) if len(eq) else None) if greedy else None,
            "equal_to_ar_runs": f"{int(eq.sum())}/{len(eq)}" if (greedy and len(eq)) else "",
            **(greedy_equality(runs, label, "llama-ar") if greedy and "llama-ar" in methods else {}),
            **(greedy_equality(runs, label, "llama-server-ar") if greedy and "llama-server-ar" in methods else {}),
        })
    return pd.DataFrame(rows)


def _resolve_models(pair, target, draft, device, dtype, models):
    """-> (target_model, draft_model | None, tokenizer, target_name, draft_name)."""
    from specrepro.models import PAIRS, load_model, load_pair

    if models is not None:
        tm, dm, tok = models
        return tm, dm, tok, getattr(tm, "specrepro_name", "target"), getattr(dm, "specrepro_name", None)
    if pair is not None:
        if target is not None:
            raise BenchOptionError("give either --pair or --target/--draft, not both")
        if pair not in PAIRS:
            raise BenchOptionError(f"unknown pair {pair!r}; known pairs: {', '.join(PAIRS)}")
        target, draft = PAIRS[pair]
    if target is None:
        raise BenchOptionError("no target: pass --pair NAME or --target NAME")
    if draft is None:
        tm, tok = load_model(target, device=device, dtype=dtype)
        return tm, None, tok, target, None
    if draft == target:  # a model as its own draft (a sanity check: alpha = 1)
        tm, tok = load_model(target, device=device, dtype=dtype)
        return tm, tm, tok, target, draft
    tm, dm, tok = load_pair(target, draft, device=device, dtype=dtype)
    return tm, dm, tok, target, draft


def _eos_ids(model, tokenizer) -> list[int]:
    """The bench's stop ids: the decoding loops' default (:func:`specrepro.core.decoding.default_eos_ids`)."""
    from specrepro.core.decoding import default_eos_ids

    return default_eos_ids(model, tokenizer)


def run_bench(
    target: str | None = None,
    draft: str | None = None,
    *,
    pair: str | None = None,
    methods=None,
    gamma: int = 3,
    workload: str = "humaneval",
    n_prompts: int | None = None,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int | None = 0,
    seed: int = 0,
    device: str = "cpu",
    dtype: str = "auto",
    repeats: int = 1,
    json_path: str | Path | None = None,
    models: tuple | None = None,
    prompts: list | None = None,
    chat: bool = False,
    warmup: bool = True,
    options: dict | None = None,
    tree: str | None = None,
    medusa_heads: str | Path | None = None,
    progress: bool = True,
    print_table: bool = False,
    predict: bool = True,
    baseline: str = "ar",
    prompt_offset: int = 0,
    part: tuple[int, int] | str | None = None,
) -> BenchResult:
    """Benchmark decoding methods on one workload, interleaved prompt by prompt.

    Args:
        target, draft: zoo names, hub ids or local paths (``draft`` may equal ``target``: the model drafts for
            itself); or ``pair``: a :data:`~specrepro.models.PAIRS` name; or ``models``: an already loaded
            ``(target_model, draft_model | None, tokenizer)``.
        methods: method names (list or comma-separated string), each optionally ``name@γ``; default
            :data:`DEFAULT_METHODS` (draft-model methods dropped when there is no draft). ``baseline`` is always run
            (added first if missing): it is the reference for greedy equality (``equal_to_baseline``).
        gamma: draft length γ >= 1 for methods without ``@γ``.
        workload, n_prompts: prompts from :func:`specrepro.data.load_workload` (the first ``n_prompts``; default
            :data:`DEFAULT_N_PROMPTS` = 10), or ``prompts``: a list of :class:`~specrepro.data.Prompt` or strings,
            all of them unless ``n_prompts`` is given (then the first ``n_prompts``). Tokenised raw with the target's
            tokenizer (no chat template unless ``chat=True``), as in Chen et al.'s HumanEval runs.
        prompt_offset: skip the workload's first ``prompt_offset`` prompts (>= 0): ``n_prompts`` from there on, e.g.
            prompts held out from the ones a method was chosen on (recorded as ``config.prompt_offset``).
        part: ``(i, k)`` or ``"i/k"``: time only part i of k (0 <= i < k) of those prompts, split by
            :func:`part_bounds`, as a shard of a run too long for one sitting; each prompt keeps the seed and method
            order it has in the whole run (the harness's ``prompt_offset``), so :func:`merge_parts` of the k part
            files gives the runs the whole run would have timed. ``config`` records ``part`` ([i, k]) and
            ``part_prompts`` ([start, stop) within the run's prompts); ``n_prompts`` stays the whole run's.
        max_new_tokens: cap on new tokens per prompt (EOS stops earlier, identically for every method).
        temperature, top_p, top_k: sampling (temperature 0 = greedy; HF runs get ``do_sample=False`` then).
        seed: seeds one ``torch.Generator`` per (repeat, prompt), shared by all methods on it.
        device, dtype: where and in what precision to load the models ('cuda' + 'bfloat16' on a GPU).
        repeats: timed passes over the prompts.
        json_path: write :meth:`BenchResult.to_json` there (atomically). While timing, every finished (pass,
            prompt) block is also saved to :func:`checkpoint_path` (``.<name>.checkpoint`` beside it): rerun after an
            interruption with the same settings, machine and ``specrepro`` code, the run times only the blocks
            still missing (a larger ``repeats`` also reuses the passes already done). The cost model is measured
            again on resume.
        warmup: one untimed call per method (on the first prompt, up to 8 tokens) before timing.
        options: extra settings for methods (see :class:`BenchContext`).
        tree: the expansion ⟨k1,...,km⟩ of ``sd-tree`` entries without ``@``, e.g. ``"2x2x1x1"``
            (:func:`parse_tree_spec`; default ⟨2,1,...,1⟩ of depth ``gamma``). Same as ``options["tree"]``.
        medusa_heads: for ``medusa`` / ``medusa-typical``: a directory of heads saved by
            :meth:`specrepro.core.medusa_heads.MedusaHeads.save` (or cached by :func:`specrepro.train.medusa1.get_or_train_heads`), or
            ``"auto"`` for the newest cached heads trained for the target. Same as ``options["medusa_heads"]``.
        print_table: print :meth:`BenchResult.table` to stdout.
        predict: before and again after timing, measure the target's forward time over n = 1..γmax + 1 new tokens
            and each fixed-γ chain method's draft time per token (:func:`measure_costs`; the prediction uses the
            means, :func:`mean_costs`, and ``config.cost_model`` keeps both), and give each such method its
            hardware-aware predicted speedup, free-draft bound and Eq. (1) ideal at its measured α
            (:func:`add_predictions`); with a llama.cpp method in the run (``llama-*``), also the llama.cpp target's
            t(n), n = 1..21, the llama.cpp draft's t(1) and c, with 95% intervals over the timed calls, before and
            after timing (:func:`measure_llama_costs`, ``config.llama_cost_model``; the limit ladder of each
            llama.cpp method is computed from it on reading, :func:`specrepro.bench.ladder.llama_ladder`).
        baseline: the method every other method's greedy tokens are compared with (``equal_to_baseline``), run
            first if not named; default ``ar``, our AR, whose ``speedup_vs_ar`` columns exist only when it runs (a
            run of llama.cpp methods alone names ``llama-server-ar``, llama.cpp's own AR).

    Returns:
        :class:`BenchResult`: ``runs`` has one row per timed call, the columns of
        :func:`specrepro.measure.harness.run_interleaved` (repeat, prompt, method, new_tokens, seconds, tokens_per_s, steps,
        loop_ms, token_ids, drafted, accepted, alpha_terms, depths, equal_to_baseline against ``baseline``, ...) plus
        gamma; ``summary`` one row per method: exact (distribution-preserving), n_prompts, tokens_per_s
        (median), ms_per_token (median), speedup_vs_ar and speedup_vs_hf_assisted with their 95% intervals
        (``_lo``/``_hi``; :func:`specrepro.measure.harness.paired_speedup`: median over prompts of the paired tokens/s
        ratio, percentile bootstrap over prompts), alpha (mean Σ min(p, q) over verified positions, Leviathan
        Def. 3.1), tokens_per_step (new tokens over target steps, pooled), alpha and tokens_per_step with their 95%
        intervals over prompts (``_lo``/``_hi``, :func:`rate_intervals`), accepted_per_step, drafted_per_step,
        loop_ms, peak_rss_mb (the largest resident high-water mark of the method's calls, MiB, the process's models
        included: the memory a machine needs to run it; :mod:`specrepro.measure.memory`),
        per_position_acceptance (P(accept position i | positions < i accepted); per depth for trees), greedy_equal_to_ar (greedy only; None
        under sampling); with ``llama-ar`` among the methods, speedup_vs_llama_ar (and its interval) and, under
        greedy decoding, greedy_equal_to_llama_ar (:func:`greedy_equality`); with ``predict``, for fixed-γ chain methods also predicted_tokens_per_step (Leviathan
        Eq. 1), free_draft_bound, predicted_speedup (hardware-aware) and measured_over_predicted. ``config`` also
        records what methods noted while built (``llamacpp``, with a llama.cpp method: llama_cpp's version, its
        ``llama_print_system_info()`` string, ``OMP_WAIT_POLICY``, the threads and the GGUF files with their sha256;
        :mod:`specrepro.bench.llama`), ``seconds`` (this call's wall time, s), ``blocks`` and ``blocks_under_load`` (the (pass, prompt)
        blocks timed while another process or the hypervisor took at least
        :data:`specrepro.files.LOAD_FLAG_PCT` percent of the CPU; the runs' ``under_load`` column says which).

    Raises:
        BenchOptionError: see :func:`validate_options`; also an unknown pair or both ``pair`` and ``target``, a
            method whose model cannot take tree attention, Medusa heads trained for another base model; a
            ``json_path`` in data/results (the record) from a tree whose code differs from its commit.
    """
    import time

    import pandas as pd

    from specrepro.data import Prompt, load_workload

    t_start = time.monotonic()
    if methods is None:
        methods = list(DEFAULT_METHODS)
        if draft is None and pair is None and (models is None or models[1] is None):
            methods = [m for m in methods if not resolve_method(m)[1].needs_draft]
    elif isinstance(methods, str):
        methods = [m.strip() for m in methods.split(",") if m.strip()]
    methods = list(methods)
    if baseline not in [m.strip() for m in methods]:
        methods.insert(0, baseline)
    has_draft = (models[1] is not None) if models is not None else (draft is not None or pair is not None)
    options = dict(options or {})
    if tree is not None:
        options["tree"] = tree if isinstance(tree, str) else "x".join(str(k) for k in tree)
    if medusa_heads is not None:
        options["medusa_heads"] = str(medusa_heads)
    # every method under the name that is its whole configuration (sd-draft-adaptive@20 with --opt draft_kind=int8
    # runs, and is recorded, as sd-draft-adaptive-int8@20); a draft_kind that no method reads any more is dropped
    methods = [canonical_method(m, options) for m in methods]
    if "draft_kind" in options and not any(str(m).split("@", 1)[0] in OPTION_KEYS["draft_kind"][0] for m in methods):
        options.pop("draft_kind")
    resolved = validate_options(methods=methods, gamma=gamma, n_prompts=n_prompts, max_new_tokens=max_new_tokens,
                                temperature=temperature, top_p=top_p, top_k=top_k, repeats=repeats, device=device,
                                has_draft=has_draft, dtype=dtype, options=options)
    sampling = SamplingConfig(temperature=float(temperature), top_k=int(top_k or 0) or None, top_p=float(top_p))
    if int(prompt_offset) < 0:
        raise BenchOptionError(f"prompt_offset must be >= 0, got {prompt_offset}")
    part = parse_part(part) if part is not None else None
    from specrepro.files import git_commit, repo_root

    commit = git_commit()  # the code that runs, read before anything is loaded or timed
    if json_path is not None and commit.endswith("-dirty") and (
            Path(json_path).resolve().parent == (repo_root() / "data" / "results").resolve()):
        raise BenchOptionError(f"refusing to time {json_path} for the record from a dirty tree ({commit}): commit "
                               f"the code first")
    if prompts is None:
        n = DEFAULT_N_PROMPTS if n_prompts is None else n_prompts
        prompts = load_workload(workload, int(prompt_offset) + n)[int(prompt_offset):]
        if int(prompt_offset) and len(prompts) < n:
            raise BenchOptionError(f"workload {workload!r} has {len(prompts) + int(prompt_offset)} prompts: "
                                   f"{n} from prompt {int(prompt_offset)} on are not there")
    else:  # every prompt given, unless n_prompts says otherwise (never the workload default)
        prompts = [p if isinstance(p, Prompt) else Prompt(f"prompt/{i}", str(p)) for i, p in enumerate(prompts)]
        prompts = prompts[:n_prompts] if n_prompts is not None else prompts
        workload = "custom"
    n_whole, start = len(prompts), 0
    if part is not None:  # one part of the run: its prompts, each seeded and rotated as in the whole run
        start, stop = part_bounds(n_whole, *part)
        prompts = prompts[start:stop]

    tm, dm, tok, tname, dname = _resolve_models(pair, target, draft, device, dtype, models)
    dev = str(tm.device)
    from specrepro.data import format_prompt

    encoded = [tok(format_prompt(p, tok, chat=chat), return_tensors="pt").input_ids[0].to(tm.device)
               for p in prompts]
    vocab = tm.get_output_embeddings().weight.shape[0]
    ctx = BenchContext(target=tm, tokenizer=tok, draft=dm, prompts=prompts, sampling=sampling, gamma=gamma,
                       max_new_tokens=max_new_tokens, eos_token_id=_eos_ids(tm, tok), vocab_size=vocab, seed=seed,
                       device=dev, options=options, cost_text=torch.cat([e.cpu() for e in encoded]),
                       target_name=tname, draft_name=dname)
    runners = {label: spec.factory(ctx, _factory_name(label, spec), g) for label, spec, g in resolved}
    resolved = [(label, spec, int(getattr(runners[label], "gamma", g))) for label, spec, g in resolved]

    labels = [label for label, _, _ in resolved]
    method_gammas = {label: g for label, _, g in resolved}
    costs = measure_costs(ctx, runners, method_gammas, encoded) if predict else None
    llama_costs = measure_llama_costs(ctx, labels, encoded) if predict else None
    warm = None
    if warmup:  # untimed: first-call costs (allocations, kernel selection, lazy imports) stay out of the timings
        wctx = dataclasses.replace(ctx, max_new_tokens=min(8, max_new_tokens))  # shares ctx's built resources
        warm = {label: spec.factory(wctx, _factory_name(label, spec), g) for label, spec, g in resolved}
    # The draft as loaded is dropped once every method is built: factories read ctx.draft only while they build, and
    # a runner that drafts with it (sd-draft, hf-assisted, ...) holds its own reference. When every method uses only
    # copies built from it (int8, 4-bit, pruned heads; ctx.shared), the float model and its oneDNN-packed weights are
    # freed before the timed passes (about 2 GB for qwen 0.5B in float32), so the peak resident memory reported is
    # what those methods need. float_draft_kept (config) says which happened (None: no draft).
    draft_ref = None if dm is None else weakref.ref(dm)
    for c in (ctx, wctx) if warmup else (ctx,):
        c.draft = None
    del dm
    gc.collect()
    float_draft_kept = None if draft_ref is None else draft_ref() is not None
    from specrepro.files import (
        code_fingerprint,
        cpu_bf16,
        cpu_description,
        device_description,
)

    config = {  # all but resumed_blocks and the cost model's second measurement is known before timing (the commit:
        # the code that runs, read at the start)
        "commit": commit,
        "target": tname, "draft": dname, "pair": pair, "methods": labels, "baseline": baseline, "gamma": gamma,
        "workload": workload,
        "n_prompts": n_whole, "prompt_offset": int(prompt_offset), "prompt_ids": [p.id for p in prompts],
        "part": None if part is None else list(part),
        "part_prompts": None if part is None else [start, start + len(prompts)],
        "max_new_tokens": max_new_tokens,
        "temperature": temperature, "top_p": top_p, "top_k": top_k, "seed": seed, "device": dev,
        "device_description": device_description(dev), "cpu": cpu_description(),
        "cpu_bf16": cpu_bf16() if dev == "cpu" else None,
        "dtype": str(tm.dtype).replace("torch.", ""),
        "repeats": repeats, "resumed_blocks": 0, "chat_template": chat,
        "torch_threads": torch.get_num_threads(),
        "cpu_linear": getattr(tm, "specrepro_cpu_linear", None),
        "python": platform.python_version(), "torch": torch.__version__, "transformers": __import__("transformers").__version__,
        "eos_token_id": ctx.eos_token_id, "options": ctx.options, "float_draft_kept": float_draft_kept,
        "timing": "CUDA events + synchronize" if dev.startswith("cuda") else "time.perf_counter",
        "cost_model": None if costs is None else _cost_model_json(costs),
        **({} if llama_costs is None else {"llama_cost_model": llama_cost_model_json(llama_costs)}),
        **ctx.config_notes,  # what methods recorded while they were built (e.g. "llamacpp": which build ran)
    }
    ckpt_key = checkpoint_key(config)
    ckpt_key.update(gammas=method_gammas, code=code_fingerprint(),
                    prompt_tokens=[int(ids.numel()) for ids in encoded])
    ckpt = checkpoint_path(json_path) if json_path is not None else None
    runs = run_interleaved(runners, [(p.id, ids) for p, ids in zip(prompts, encoded)], repeats=repeats, seed=seed,
                           device=dev, warmup=warm, baseline=baseline, greedy=sampling.greedy, progress=progress,
                           desc="bench", checkpoint=ckpt, checkpoint_key=ckpt_key, prompt_offset=start)
    config["resumed_blocks"] = int(runs.attrs.get("resumed_blocks", 0))
    if costs is not None:  # measured again after timing: the prediction uses both, the config keeps each
        costs = mean_costs(costs, measure_costs(ctx, runners, method_gammas, encoded))
        config["cost_model"] = _cost_model_json(costs)
    if llama_costs is not None:  # the llama.cpp target's and draft's costs, measured again after timing likewise
        llama_costs = {"before": llama_costs, "after": measure_llama_costs(ctx, labels, encoded)}
        config["llama_cost_model"] = llama_cost_model_json(llama_costs)
    gammas = {label: _gamma_label(spec, g) for label, spec, g in resolved}
    runs.insert(runs.columns.get_loc("method") + 1, "gamma", runs["method"].map(gammas))
    summary = _summarize(runs, resolved, sampling.greedy, seed=seed)
    if costs is not None:
        summary = add_predictions(summary, costs, runs)
    # the sitting's own run time (loading, cost model and the blocks it timed; resumed blocks took earlier sittings)
    # and how many of its (pass, prompt) blocks were timed while other processes or the hypervisor took the CPU
    config["seconds"] = round(time.monotonic() - t_start, 1)
    if "under_load" in runs.columns:
        blocks = runs.drop_duplicates(["repeat", "prompt_index"])
        config["blocks"] = int(len(blocks))
        config["blocks_under_load"] = int((blocks["under_load"] == True).sum())  # noqa: E712 (None: not measured)
    result = BenchResult(summary=summary, runs=runs, config=config)
    if json_path is not None:
        write_bench_json(result, json_path)
        ckpt.unlink(missing_ok=True)
    if print_table:
        with pd.option_context("display.width", 200, "display.max_columns", 20):
            print(f"{tname} + {dname or 'no draft'} | {workload}, {len(prompts)} prompts x {repeats}, "
                  f"{max_new_tokens} new tokens | T={temperature} top_p={top_p} top_k={top_k} | γ={gamma} | "
                  f"{config['device_description']}, {config['dtype']}, {config['torch_threads']} threads")
            print(result.table().to_string())
            if "llama_cost_model" in config:  # llama.cpp's cost model and each llama.cpp method's limit ladder
                from specrepro.bench.ladder import ladder_markdown

                print(ladder_markdown(result.to_json()))
            for label, spec, _ in resolved:
                if not spec.exact:
                    print(f"note: {label} is not distribution-preserving (exact = False): under sampling its "
                          f"outputs do not follow the target's distribution")
    return result


def write_bench_json(result: BenchResult, json_path: str | Path) -> Path:
    """Write ``result`` (:meth:`BenchResult.to_json`) and its provenance sidecar in one atomic step, as every table
    of the record: the sidecar (``<name>.provenance.json``) names the run (commit, CPU, date, run time, blocks under
    load; a merged file also its parts) and holds the sha256 of the file's bytes. Returns the path written."""
    from specrepro.files import atomic_write_files, hold_record_lock_for, sha256_bytes

    path, config = Path(json_path), result.config
    hold_record_lock_for(path)
    body = (json.dumps(result.to_json(), indent=1) + "\n").encode()
    side = {k: config.get(k) for k in ("commit", "cpu", "device_description", "dtype", "torch", "transformers",
                                        "seconds", "blocks", "blocks_under_load")}
    if config.get("parts"):
        side["parts"] = config["parts"]
    side.update(date=__import__("datetime").date.today().isoformat(), sha256={path.name: sha256_bytes(body)})
    atomic_write_files({path: body, path.with_suffix(".provenance.json"):
                        (json.dumps(side, indent=1, sort_keys=True) + "\n").encode()})
    return path


def parse_part(part: tuple[int, int] | list | str) -> tuple[int, int]:
    """``"i/k"`` or ``(i, k)`` -> ``(i, k)``: part i of k, 0 <= i < k.

    Raises:
        BenchOptionError: not of that form, k < 1, or i outside [0, k).
    """
    try:
        i, k = (int(x) for x in (part.split("/") if isinstance(part, str) else part))
    except (TypeError, ValueError):
        raise BenchOptionError(f"part must be I/K (part I of K, 0 <= I < K), got {part!r}") from None
    if k < 1 or not 0 <= i < k:
        raise BenchOptionError(f"part must be I/K with K >= 1 and 0 <= I < K, got {i}/{k}")
    return i, k


def part_bounds(n: int, i: int, k: int) -> tuple[int, int]:
    """Prompts ``[start, stop)`` of part i of k of a run over ``n`` prompts: consecutive slices whose sizes differ by
    at most one, the larger first (as ``numpy.array_split``).

    Raises:
        BenchOptionError: more parts than prompts, or i outside [0, k).
    """
    i, k = parse_part((i, k))
    if k > n:
        raise BenchOptionError(f"{k} parts of {n} prompts: a part needs at least one prompt")
    size, extra = divmod(n, k)
    start = i * size + min(i, extra)
    return start, start + size + (i < extra)


#: config keys that differ between the parts of one run (each part's own sitting); every other key must agree
PART_KEYS = ("commit", "prompt_ids", "part", "part_prompts", "seconds", "blocks", "blocks_under_load",
             "resumed_blocks", "cost_model", "float_draft_kept")


def check_part_set(records: list[dict], per_part, names: list[str]) -> list[int]:
    """Check that ``records`` (each part's settings: ``part`` [i, k], ``part_prompts`` [start, stop), ``n_prompts``
    the whole run's) are the parts of one run, and return their order by part index: the parts 0..k-1 each once,
    their spans consecutive from the first prompt to the last, and every key but ``per_part`` equal (the machine
    included: a table never mixes machines). ``names`` name the records in the errors. Shared by the bench's parts
    (:func:`merge_parts`) and the record's tables in parts (:func:`specrepro.record.parts.read_parts`).

    Raises:
        ValueError: any of these does not hold.
    """
    order = sorted(range(len(records)), key=lambda j: records[j]["part"][0])
    k = records[order[0]]["part"][1]
    got = [tuple(records[j]["part"]) for j in order]
    if got != [(i, k) for i in range(k)]:
        raise ValueError(f"the parts of one run are 0..{k - 1} of {k}, each once; got "
                         f"{', '.join(f'{i}/{kk}' for i, kk in got)}")
    first = records[order[0]]
    common = {key: v for key, v in first.items() if key not in per_part}
    for j in order[1:]:
        other = {key: v for key, v in records[j].items() if key not in per_part}
        differ = sorted(key for key in set(common) | set(other) if common.get(key) != other.get(key))
        if differ:
            raise ValueError(f"{names[j]} differs from {names[order[0]]} in {', '.join(differ)}: the parts of one "
                             "run share every setting and the machine")
    spans = [records[j].get("part_prompts") for j in order]
    if [a for a, _ in spans] != [0, *(b for _, b in spans[:-1])] or spans[-1][1] != first.get("n_prompts"):
        raise ValueError(f"the parts' prompts are not consecutive from 0 to the whole run's {first.get('n_prompts')}: "
                         f"{spans}")
    return order


def merge_parts(parts: list[dict]) -> BenchResult:
    """One bench result from the k part files of a run (:func:`run_bench` with ``part``), as the whole run would
    have given it: the runs concatenated in prompt order (each part timed its prompts with the whole run's seeds and
    method orders), the summary computed afresh from them (paired speedups and their 95% intervals over all
    prompts), and the predictions from the parts' cost models averaged point by point (each part measured its own
    before and after timing, :func:`mean_costs`).

    ``config`` is the parts' common config with ``prompt_ids`` of every part, ``part`` None, ``seconds`` None (no
    one sitting made it) and ``parts``: per part its ``part``, ``part_prompts``, ``commit``, ``seconds``,
    ``blocks``, ``blocks_under_load`` and ``resumed_blocks``; ``blocks`` and ``blocks_under_load`` are the parts'
    sums, and ``cost_model`` keeps each part's under ``parts``; so does ``llama_cost_model`` (llama.cpp's cost model:
    the parts' means, :func:`_mean_llama_cost_models`) and ``llama_server`` (the first part's, every part's under
    ``parts``).

    Args:
        parts: the part files as loaded (``config``, ``summary``, ``runs``), in any order.

    Raises:
        ValueError: not the parts 0..k-1 of one run, each once; parts that differ in a setting or machine (any
            config key but :data:`PART_KEYS`: a table never mixes machines); parts timed with a llama.cpp cost model
            (not merged).
    """
    import pandas as pd

    if not parts:
        raise ValueError("no parts to merge")
    configs = [p.get("config") or {} for p in parts]
    if any(not c.get("part") for c in configs):
        raise ValueError("merge_parts takes part files (run_bench with part=I/K); a file without config.part was "
                         "given")
    if len({"llama_cost_model" in c for c in configs}) > 1:
        raise ValueError("some parts have a llama.cpp cost model and some not")
    configs = [{**c, "llama_server": _server_settings(c["llama_server"])} if c.get("llama_server") else c
               for c in configs]  # each part ran its own servers (ports, logs): their settings must agree
    order = check_part_set(configs, PART_KEYS + ("llama_cost_model",),
                           [f"part {c['part'][0]}/{c['part'][1]}" for c in configs])
    servers = [(p.get("config") or {}).get("llama_server") for p in parts]
    parts, configs = [parts[j] for j in order], [configs[j] for j in order]
    common = {key: v for key, v in configs[0].items() if key not in PART_KEYS}
    runs = pd.concat([pd.DataFrame(p.get("runs") or []) for p in parts], ignore_index=True)
    config = {**common, "commit": configs[-1].get("commit"), "part": None, "part_prompts": None, "seconds": None,
              "prompt_ids": [pid for c in configs for pid in c.get("prompt_ids") or []],
              "resumed_blocks": sum(int(c.get("resumed_blocks") or 0) for c in configs),
              "float_draft_kept": configs[0].get("float_draft_kept"),
              "parts": [{key: c.get(key) for key in ("part", "part_prompts", "commit", "seconds", "blocks",
                                                     "blocks_under_load", "resumed_blocks")} for c in configs]}
    if all(c.get("blocks") is not None for c in configs):
        config["blocks"] = sum(int(c["blocks"]) for c in configs)
        config["blocks_under_load"] = sum(int(c.get("blocks_under_load") or 0) for c in configs)
    sampling_greedy = float(common.get("temperature") or 0.0) == 0.0
    resolved = validate_options(methods=common["methods"], gamma=int(common.get("gamma") or 1), n_prompts=None,
                                max_new_tokens=int(common["max_new_tokens"]),
                                temperature=float(common.get("temperature") or 0.0),
                                top_p=float(common.get("top_p") or 1.0), top_k=common.get("top_k"),
                                repeats=int(common.get("repeats") or 1), device="cpu",
                                options=dict(common.get("options") or {}))
    # each method's γ as its runner reported it (a runner may fix its own, e.g. a tree's depth): the runs' gamma
    recorded = {} if "gamma" not in runs else {
        m: int(g) for m, g in runs.drop_duplicates("method").set_index("method")["gamma"].items() if pd.notna(g)}
    resolved = [(label, spec, recorded.get(label, g) if spec.uses_gamma else g) for label, spec, g in resolved]
    summary = _summarize(runs, resolved, sampling_greedy, seed=int(common.get("seed") or 0))
    models = [c.get("cost_model") for c in configs]
    if all(models):
        costs = _mean_cost_models(models, {label: g for label, _, g in resolved})
        config["cost_model"] = {**_cost_model_json(costs), "measured": "the mean of the parts' cost models "
                                "(each the mean of its measurements before and after its timed passes)",
                                "parts": models}
        summary = add_predictions(summary, costs, runs)
    else:
        config["cost_model"] = None
    if "llama_cost_model" in configs[0]:
        config["llama_cost_model"] = _mean_llama_cost_models([c["llama_cost_model"] for c in configs])
    if any(servers):
        config["llama_server"] = {**servers[order[0]], "parts": [servers[j] for j in order]}
    return BenchResult(summary=summary, runs=runs, config=config)


def checkpoint_key(config: dict) -> dict:
    """What saved blocks must share with a run to be resumed (its ``config`` as built before timing): the settings
    and machine, not the commit (results get committed during long runs), the number of passes (it may grow), the
    cost models (transformers' and llama.cpp's, measured again by every run) or the ports and logs of the llama.cpp
    servers it started (new ones each run; their settings must agree)."""
    key = {k: v for k, v in config.items()
           if k not in ("commit", "repeats", "resumed_blocks", "cost_model", "llama_cost_model")}
    if key.get("llama_server"):
        key["llama_server"] = _server_settings(key["llama_server"])
    return key


def _server_settings(server: dict) -> dict:
    """A part's ``config.llama_server`` without what each run of a server differs in (its port and log file)."""
    import re

    methods = {m: {k: (re.sub(r" --port \d+", "", v) if k == "command" else v) for k, v in d.items() if k != "log"}
               for m, d in (server.get("methods") or {}).items()}
    return {**server, "methods": methods}


def _mean_llama_cost_models(models: list[dict]) -> dict:
    """The parts' ``config.llama_cost_model`` as one: ``target_ms``, ``draft_ms``, ``c`` (and ``draft2_ms`` where every
    part has it) the means of the parts' (each the mean of its measurements before and after its timed passes),
    ``c_lo`` / ``c_hi`` the widest of the
    parts' measurements' intervals, ``prefix_len`` the mean of the parts' prefixes (each a prefix of its own prompts'
    tokens), and every part's model whole under ``parts``.

    Raises:
        ValueError: cost models of different sizes n."""
    sizes = [sorted(m.get("target_ms") or {}, key=int) for m in models]
    if any(s != sizes[0] for s in sizes):
        raise ValueError("the parts measured their llama.cpp cost models over different sizes n")

    def mean(xs):
        xs = [float(x) for x in xs if x is not None]
        return sum(xs) / len(xs) if xs else None

    ends = {e: [float(v) for m in models for blk in (m, m.get("before") or {}, m.get("after") or {})
                if (v := blk.get(f"c_{e}")) is not None] for e in ("lo", "hi")}
    return {"prefix_len": round(mean([m.get("prefix_len") for m in models])), "repeats": models[0].get("repeats"),
            "rounds": models[0].get("rounds"), "timed_on": models[0].get("timed_on"),
            "interval": models[0].get("interval"),
            "target_ms": {n: mean([m["target_ms"][n] for m in models]) for n in sizes[0]},
            "draft_ms": mean([m.get("draft_ms") for m in models]), "c": mean([m.get("c") for m in models]),
            **({"draft2_ms": mean([m.get("draft2_ms") for m in models])}
               if all(m.get("draft2_ms") is not None for m in models) else {}),
            "c_lo": min(ends["lo"]) if ends["lo"] else None, "c_hi": max(ends["hi"]) if ends["hi"] else None,
            "parts": models,
            "measured": f"the mean of {len(models)} parts' cost models, each measured before and after its own "
                        "timed passes (each part's whole under parts)"}


def _mean_cost_models(models: list[dict], gammas: dict) -> dict:
    """The parts' ``config.cost_model`` JSON averaged point by point, as a :func:`measure_costs` dict (``gammas``:
    label -> γ of the methods, as the run resolved them).

    Raises:
        ValueError: cost models of different sizes n or methods."""
    from specrepro.theory import CostCurve

    sizes = [sorted(int(n) for n in m["target_ms"]) for m in models]
    methods = [sorted(m["draft_ms_per_token"]) for m in models]
    if any(s != sizes[0] for s in sizes) or any(m != methods[0] for m in methods):
        raise ValueError("the parts measured their cost models over different sizes n or methods")
    ns = sizes[0]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    out = {"prefix_len": models[0]["prefix_len"], "repeats": models[0]["repeats"], "rounds": models[0]["rounds"],
           "target": CostCurve(ns, [mean([float(_at(m["target_ms"], n)) for m in models]) for n in ns]),
           "draft_ms": {k: mean([float(m["draft_ms_per_token"][k]) for m in models]) for k in methods[0]},
           "gammas": {k: int(gammas[k]) for k in methods[0]}}
    if "draft_timed_on" in models[0]:
        out["draft_timed_on"] = models[0]["draft_timed_on"]
    return out


def _at(curve: dict, n: int):
    """A cost curve's entry at n, whether its keys are ints (in memory) or strings (read from JSON)."""
    return curve[n] if n in curve else curve[str(n)]


def merge_part_files(paths: list[str | Path], json_path: str | Path) -> BenchResult:
    """:func:`merge_parts` of the part files at ``paths``, written to ``json_path`` with its sidecar
    (:func:`write_bench_json`); each part's sha256 (its sidecar's, checked against its bytes) is recorded in
    ``config.parts``.

    Raises:
        FileNotFoundError: a part is missing. ValueError: a part's bytes differ from its sidecar's sha256, or
            :func:`merge_parts` refuses the parts.
    """
    from specrepro.files import sha256_bytes

    datas, digests = [], []
    for p in map(Path, paths):
        if not p.is_file():
            raise FileNotFoundError(f"{p}: no such bench part (python -m specrepro bench ... --part I/K --json {p})")
        body = p.read_bytes()
        side = p.with_suffix(".provenance.json")
        if side.is_file():
            want = (json.loads(side.read_text()).get("sha256") or {}).get(p.name)
            if want is not None and want != sha256_bytes(body):
                raise ValueError(f"{p}: its bytes differ from the sha256 in {side.name}")
        datas.append(json.loads(body))
        digests.append((p.name, sha256_bytes(body), datas[-1]["config"].get("part")))
    result = merge_parts(datas)
    by_part = {tuple(part): (name, digest) for name, digest, part in digests}
    for row in result.config["parts"]:
        row["file"], row["sha256"] = by_part[tuple(row["part"])]
    write_bench_json(result, json_path)
    return result


def checkpoint_path(json_path: str | Path) -> Path:
    """Where :func:`run_bench` keeps the timing checkpoint of a run that writes ``json_path``: the hidden file
    ``.<name>.checkpoint`` beside it, deleted once the JSON is written. An interrupted bench run with the same
    settings on the same machine and code resumes from it (:func:`specrepro.measure.harness.run_interleaved`)."""
    path = Path(json_path)
    return path.with_name(f".{path.name}.checkpoint")


def bench_files(directory: Path) -> list[Path]:
    """The bench JSON files of a results directory (``bench_*.json``), sorted, without their provenance sidecars
    (``bench_*.provenance.json``) and without the parts of a run timed in parts (``bench_*.p<k>.json``, ``bench
    --part``): the file merged from them (``bench --merge``) stands for the run."""
    return sorted(p for p in Path(directory).glob("bench_*.json")
                  if not p.name.endswith(".provenance.json") and not re.search(r"\.p\d+\.json$", p.name))


#: timed forward passes per point and round of the bench's cost measurement (after warm-up rounds), and rounds
COST_REPEATS = 3
COST_ROUNDS = 3


def measure_costs(ctx: BenchContext, runners: dict, gammas: dict, encoded,
                  repeats: int = COST_REPEATS, rounds: int = COST_ROUNDS) -> dict | None:
    """The costs the bench's predictions use, measured in the benchmark's own process (:func:`run_bench` measures
    them before and again after the timed passes and uses the means, :func:`mean_costs`).

    The target's KV-cached forward time over n = 1..γmax + 1 new tokens (:func:`specrepro.measure.cost.measure_cost_curve`)
    and, for each runner with a ``cost_drafter`` (fixed-γ chains, see ``_our_runner``), that drafter's time per
    drafted token under the run's sampling (its logits processing included), both after a prefix as long as the
    median prompt plus half the new tokens (the mean context of a run), medians in ms
    (:func:`specrepro.measure.cost.measure_chain_costs`: warmed-up passes, then the median of ``rounds``). The target
    is timed on random ids from a generator seeded with ``ctx.seed`` (the cost of a dense forward does not depend on
    the ids); the drafters along the prompts' own tokens (``ctx.cost_text``), because their top-p processing does
    (a random prefix gives a flat draft distribution whose nucleus needs a sort of the whole vocabulary).

    Args:
        ctx: the bench's context; runners: label -> runner; gammas: label -> the method's γ; encoded: the prompts'
            token ids (long tensors [L]); repeats: timed calls per point after one warm-up; rounds: passes over
            every point (each pass warmed up), their median reported.

    Returns:
        None when no runner has a ``cost_drafter`` (nothing to predict), else a dict: ``target`` (a
        :class:`~specrepro.theory.CostCurve`, ms), ``draft_ms`` (label -> ms per drafted token), ``prefix_len``,
        ``repeats``, ``rounds``, ``gammas`` (label -> γ), ``draft_timed_on`` (what the drafters were timed along).
    """
    import numpy as np

    from specrepro.measure.cost import measure_chain_costs

    chains = {label: run for label, run in runners.items() if getattr(run, "cost_drafter", None) is not None}
    if not chains:
        return None
    gammas = {label: int(gammas[label]) for label in chains}
    prefix_len = int(np.median([int(e.numel()) for e in encoded])) + ctx.max_new_tokens // 2
    target, draft_ms = measure_chain_costs(
        ctx.target, {label: run.cost_drafter for label, run in chains.items()},
        ns=range(1, max(gammas.values()) + 2), vocab=ctx.vocab_size, prefix_len=prefix_len, repeats=repeats,
        rounds=rounds, generator=torch.Generator().manual_seed(int(ctx.seed)), sampling=ctx.sampling,
        text=ctx.cost_text)
    return {"target": target, "draft_ms": draft_ms, "prefix_len": prefix_len, "repeats": repeats, "rounds": rounds,
            "gammas": gammas, "draft_timed_on": "random ids" if ctx.cost_text is None else "the prompts' tokens"}


#: block sizes n of the llama.cpp target's cost curve (verifications of γ = 0..20 draft tokens: the adaptive methods'
#: γ cap) and the timed calls per point and round, and rounds, of :func:`measure_llama_costs`
LLAMA_COST_NS = tuple(range(1, 22))
LLAMA_COST_REPEATS = 5
LLAMA_COST_ROUNDS = 3


def _has_llama(labels) -> bool:
    return any(str(m).startswith("llama-") for m in labels)


def measure_llama_costs(ctx: BenchContext, labels, encoded, ns=LLAMA_COST_NS, repeats: int = LLAMA_COST_REPEATS,
                        rounds: int = LLAMA_COST_ROUNDS) -> dict | None:
    """The llama.cpp target's cost curve t(n), n = 1..21, the llama.cpp draft's t(1) and c = t_draft(1) / t_target(1),
    with 95% intervals over the timed calls (:func:`specrepro.measure.blockcost.measure_block_costs`), when the run
    holds a llama.cpp method (``llama-*``, llama.cpp's own server included: the same GGUF files on the same kernels).

    The models are the bench's own llama.cpp contexts (:func:`specrepro.bench.llama.llama_model`, opened once per run and
    shared with the methods; each loop resets them first), the prefix as long as the PyTorch cost model's (the median
    prompt plus half the new tokens: the mean context of a run, about 200 tokens on HumanEval at 128 new tokens),
    along the prompts' own tokens. Without a draft in the run, no draft time and no c.

    Returns:
        None without a llama.cpp method in ``labels``, else :func:`~specrepro.measure.blockcost.measure_block_costs`'s
        dict plus ``prefix_len`` and ``timed_on``.
    """
    import numpy as np

    from specrepro.bench.llama import llama_model as _model
    from specrepro.measure.blockcost import measure_block_costs

    from specrepro.backends.llamacpp import llama_cpp_available

    if not _has_llama(labels) or not llama_cpp_available()[0]:  # llama.cpp's server alone runs without the package
        return None
    target = _model(ctx, "target")
    draft = _model(ctx, "draft") if ctx.draft_name is not None else None
    prefix_len = int(np.median([int(e.numel()) for e in encoded])) + ctx.max_new_tokens // 2
    prefix_len = min(prefix_len, int(getattr(target, "n_ctx", 4096)) - max(ns))
    text = None if ctx.cost_text is None else [int(t) for t in ctx.cost_text.tolist()]
    out = measure_block_costs(target, draft, ns=ns, prefix_len=prefix_len, repeats=repeats, rounds=rounds,
                              text=text, seed=int(ctx.seed))
    out["timed_on"] = "random ids" if text is None or len(text) < prefix_len + max(ns) else "the prompts' tokens"
    return out


def llama_cost_model_json(costs: dict) -> dict:
    """``config.llama_cost_model`` of a bench JSON (ms; sizes n as strings): the measurement's keys
    (:func:`specrepro.measure.blockcost.measure_block_costs`: ``target_ms`` with ``_lo``/``_hi``, ``draft_ms``, ``c``,
    each with its 95% interval over the timed calls) for one measurement, or, given ``{"before": ..., "after": ...}``,
    ``target_ms`` / ``draft_ms`` / ``c`` the means of the two (what the predictions use) with each measurement kept
    whole under ``before`` and ``after``."""
    from specrepro.measure.blockcost import block_costs_json

    if "before" not in costs:
        return block_costs_json(costs)
    b, a = block_costs_json(costs["before"]), block_costs_json(costs["after"])

    def mean(x, y):
        return None if x is None or y is None else (float(x) + float(y)) / 2

    out = {"prefix_len": b.get("prefix_len"), "repeats": b.get("repeats"), "rounds": b.get("rounds"),
           "timed_on": b.get("timed_on"), "interval": b.get("interval"),
           "target_ms": {n: mean(v, a["target_ms"].get(n)) for n, v in b["target_ms"].items()},
           "draft_ms": mean(b.get("draft_ms"), a.get("draft_ms")), "c": mean(b.get("c"), a.get("c")),
           **({"draft2_ms": mean(b["draft2_ms"], a.get("draft2_ms"))} if b.get("draft2_ms") is not None else {}),
           "before": b, "after": a,
           "measured": "before and after the timed passes; target_ms, draft_ms, c (and draft2_ms, t_draft(2), where "
                       "measured) are their means, each measurement with its intervals under before / after"}
    return out


def _curve_ms(curve) -> dict:
    return dict(zip((int(n) for n in curve.n), (float(m) for m in curve.ms)))


def _cost_model_json(costs: dict) -> dict:
    """``config.cost_model`` of a bench JSON: the costs the predictions use (ms) and, once measured after timing
    too, each measurement (``before`` and ``after`` the timed passes)."""
    out = {"prefix_len": costs["prefix_len"], "repeats": costs["repeats"], "rounds": costs["rounds"],
           "target_ms": _curve_ms(costs["target"]), "draft_ms_per_token": dict(costs["draft_ms"])}
    if "draft_timed_on" in costs:
        out["draft_timed_on"] = costs["draft_timed_on"]
    for when in ("before", "after"):
        if when in costs:
            out[when] = {"target_ms": _curve_ms(costs[when]["target"]),
                         "draft_ms_per_token": dict(costs[when]["draft_ms"])}
    if "before" in costs:
        out["measured"] = "before and after the timed passes; target_ms and draft_ms_per_token are their means"
    return out


def mean_costs(before: dict, after: dict) -> dict:
    """The costs measured before and after the timed passes, averaged point by point (ms).

    Why twice: on this project's shared 2-core CPU the machine's speed drifted during a long run (greedy bench of
    record, 2026-11-25: AR's median 142 ms per token in the first of 3 passes, 103-106 in the next two; the one-token
    forward measured before timing read 142 ms), so costs taken only before timing described the first pass, not the
    run. The mean of a measurement at each end is the cheapest estimate of the whole run's costs; both stay in the
    JSON (``before``, ``after``) so a reader sees the drift.

    Args:
        before, after: :func:`measure_costs` dicts with the same sizes n, methods and γ.

    Returns:
        a :func:`measure_costs` dict of the means, plus ``before`` and ``after`` (each ``target`` and ``draft_ms``).

    Raises:
        ValueError: the two measured different sizes n or different methods.
    """
    from specrepro.theory import CostCurve

    t0, t1 = before["target"], after["target"]
    if list(t0.n) != list(t1.n) or set(before["draft_ms"]) != set(after["draft_ms"]):
        raise ValueError(f"mean_costs needs two measurements of the same sizes and methods; got n = {list(t0.n)} "
                         f"vs {list(t1.n)}, methods {sorted(before['draft_ms'])} vs {sorted(after['draft_ms'])}")
    return {**before, "target": CostCurve(list(t0.n), [(a + b) / 2 for a, b in zip(t0.ms, t1.ms)]),
            "draft_ms": {k: (float(v) + float(after["draft_ms"][k])) / 2 for k, v in before["draft_ms"].items()},
            "before": {"target": t0, "draft_ms": dict(before["draft_ms"])},
            "after": {"target": t1, "draft_ms": dict(after["draft_ms"])}}


def add_predictions(summary, costs: dict, runs=None):
    """Leviathan's model with measured costs beside each fixed-γ chain method's measured speedup.

    For each method in ``costs["draft_ms"]``, at its measured α and γ: ``predicted_tokens_per_step`` = E[tokens]
    (Leviathan Eq. 1), ``free_draft_bound`` (:func:`specrepro.theory.free_draft_bound`: the same α and verification
    curve with a draft that costs nothing), ``predicted_speedup`` (:func:`specrepro.theory.hardware_aware_speedup`:
    E[tokens] · t_target(1) / (γ · t_draft + t_target(γ + 1)), the decoding loop alone, no loop overheads) and
    ``measured_over_predicted`` (the median paired speedup over AR divided by the prediction: 1 = the model explains
    the measurement; below 1 = loop overheads or a slower machine during the run). Other methods get NaN.

    Given ``runs``, the prediction is also stated for whole requests, as the bench times them:
    ``predicted_speedup_with_prefill`` (:func:`specrepro.theory.with_prefill` with AR's median prefill and new tokens
    from the runs, ms) and ``measured_over_predicted`` then compares the measurement with it (like with like; see
    :func:`refresh_predictions` for files written without it), and the same model with the costs the runs
    themselves recorded (``predicted_speedup_in_run``, ``measured_over_predicted_in_run``:
    :func:`with_in_run_predictions`).

    Args:
        summary: the bench summary (one row per method, with ``alpha``, ``gamma``, ``speedup_vs_ar``).
        costs: :func:`measure_costs`'s dict.
        runs: the bench's per-run table (``method``, ``prefill_ms``, ``new_tokens``), or None.

    Returns:
        a copy of ``summary`` with those columns and ``draft_ms_per_token``.
    """
    from specrepro.theory import (
        expected_tokens,
        free_draft_bound,
        hardware_aware_speedup,
        with_prefill,
)

    out = summary.copy()
    nan = float("nan")
    prefill, n_new = _ar_prefill(runs) if runs is not None else (nan, nan)
    whole = math.isfinite(prefill) and math.isfinite(n_new) and n_new > 0
    cols = {k: [] for k in ("draft_ms_per_token", "predicted_tokens_per_step", "free_draft_bound",
                            "predicted_speedup", "predicted_speedup_with_prefill", "measured_over_predicted")}
    for _, row in out.iterrows():
        label, alpha = row["method"], row.get("alpha", nan)
        t_draft = costs["draft_ms"].get(label)
        if t_draft is None or not math.isfinite(alpha):
            for k in cols:
                cols[k].append(nan if k != "draft_ms_per_token" or t_draft is None else t_draft)
            continue
        g = int(costs["gammas"][label])
        pred = hardware_aware_speedup(alpha, g, costs["target"], lambda n, t=t_draft: t * n)
        pred_whole = with_prefill(pred, prefill, n_new, costs["target"](1)) if whole else nan
        cols["draft_ms_per_token"].append(float(t_draft))
        cols["predicted_tokens_per_step"].append(float(expected_tokens(alpha, g)))
        cols["free_draft_bound"].append(free_draft_bound(alpha, g, costs["target"]))
        cols["predicted_speedup"].append(pred)
        cols["predicted_speedup_with_prefill"].append(pred_whole)
        cols["measured_over_predicted"].append(float(row["speedup_vs_ar"]) / (pred_whole if whole else pred))
    if not whole:
        del cols["predicted_speedup_with_prefill"]
    for k, v in cols.items():
        out[k] = v
    if runs is not None:
        rows = with_in_run_predictions(out.to_dict("records"), runs)
        for k in ("predicted_speedup_in_run", "measured_over_predicted_in_run"):
            if any(k in r for r in rows):
                out[k] = [r.get(k, nan) for r in rows]
    return out


def with_in_run_predictions(summary: list[dict], runs) -> list[dict]:
    """Leviathan's model with the costs the timed runs themselves recorded, beside each predicted chain.

    Why: on this project's shared 2-core VM the speed of a forward switches between states that last minutes
    (2026-11-25/26, nothing else running: qwen2.5-coder-1.5b's one-token forward measured 94 ms, then 144 ms after the
    process sat idle 45 s; in other processes 115 then 140-149 ms, or 136-144 ms throughout, an AR loop alike), and the
    bench's cost model, measured before and after the timed passes, caught such states (nucleus run of record: t(1) =
    140 ms, while AR's own forwards in the timed runs took 95-104). A prediction from costs measured outside the runs
    then tests the machine's state, not the model. This one uses the same runs' records
    (:func:`specrepro.measure.harness.run_interleaved`): t(1) = AR's median target forward per step, t(γ + 1) = the chain's
    median target forward per step, t_draft = the chain's median draft time per drafted token, all ms, so measured /
    predicted is left with what the model leaves out (tokens per step vs Eq. 1 at the run's α, loop overheads, the
    prefill's weight as :func:`specrepro.theory.with_prefill` states it, the spread of per-prompt ratios).

    Args:
        summary: bench summary rows (dicts); rows with a finite ``predicted_speedup``, ``alpha`` and ``gamma`` get
            the two new keys.
        runs: the per-run table (list of dicts or DataFrame) with ``method``, ``target_ms``, ``draft_ms`` and, for
            the whole-request form, ``prefill_ms`` and ``new_tokens``.

    Returns:
        new rows: ``predicted_speedup_in_run`` (whole requests where the runs have prefill times, else the decoding
        loop) and ``measured_over_predicted_in_run`` (``speedup_vs_ar`` over it); rows unchanged where the runs
        lack the records.
    """
    import pandas as pd

    from specrepro.theory import expected_tokens, with_prefill

    runs = pd.DataFrame(runs)
    rows = [dict(r) for r in summary]
    if runs.empty or not {"method", "target_ms", "draft_ms"} <= set(runs.columns):
        return rows

    def median(method, column):
        return run_median(runs, method, column)

    t1 = median("ar", "target_ms")
    prefill, n_new = _ar_prefill(runs)
    for r in rows:
        pred, alpha, g = r.get("predicted_speedup"), r.get("alpha"), r.get("gamma")
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (pred, alpha, g, t1)):
            continue
        g = int(g)
        tv, td = median(r["method"], "target_ms"), median(r["method"], "draft_ms")
        if not (math.isfinite(tv) and math.isfinite(td) and tv > 0 and td >= 0):
            continue
        loop = float(expected_tokens(alpha, g)) * t1 / (tv + g * td)
        whole = with_prefill(loop, prefill, n_new, t1) if math.isfinite(prefill) and n_new > 0 else loop
        r["predicted_speedup_in_run"] = whole
        r["measured_over_predicted_in_run"] = float(r["speedup_vs_ar"]) / whole
    return rows


def run_median(runs, method: str, column: str) -> float:
    """The median of one method's ``column`` over a bench's per-run table (a DataFrame); NaN where absent."""
    import pandas as pd

    if runs.empty or column not in runs:
        return float("nan")
    v = pd.to_numeric(runs.loc[runs["method"] == method, column], errors="coerce").dropna()
    return float(v.median()) if len(v) else float("nan")


def _ar_prefill(runs) -> tuple[float, float]:
    """AR's median prefill (ms) and median new tokens over the runs; NaN where the runs do not record them."""
    import pandas as pd

    nan = float("nan")
    runs = pd.DataFrame(runs)
    if runs.empty or not {"method", "prefill_ms", "new_tokens"} <= set(runs.columns):
        return nan, nan
    ar = runs[runs["method"] == "ar"]
    p = pd.to_numeric(ar["prefill_ms"], errors="coerce").dropna()
    n = pd.to_numeric(ar["new_tokens"], errors="coerce").dropna()
    return (float(p.median()), float(n.median())) if len(p) and len(n) else (nan, nan)


def refresh_predictions(data: dict) -> dict:
    """A bench JSON's predictions stated for whole requests, also for files written before they were.

    Files written before :func:`add_predictions` took the runs compare each measured whole-request speedup with the
    decoding loop's prediction alone; this adds ``predicted_speedup_with_prefill`` from the file's own runs (AR's
    median ``prefill_ms`` and new tokens) and cost model (``target_ms``'s t(1)) and sets ``measured_over_predicted``
    against it, as :func:`add_predictions` now does (files that have it, or that lack a cost model or prefill times,
    keep theirs); and adds the prediction from the runs' own costs (:func:`with_in_run_predictions`) where the file
    lacks it.

    Args:
        data: a bench JSON as loaded (``config``, ``summary``, ``runs``).

    Every method is shown under the name that is its whole configuration
    (:func:`specrepro.bench.registry.canonical_bench`).

    Returns:
        ``data`` with its summary rows updated (a shallow copy; the argument is not modified).
    """
    data = _refresh_with_prefill(_refresh_intervals(canonical_bench(data)))
    if any("predicted_speedup_in_run" in r for r in data.get("summary") or []):
        return data
    rows = with_in_run_predictions(data.get("summary") or [], data.get("runs") or [])
    return data if rows == list(data.get("summary") or []) else {**data, "summary": rows}


def _refresh_intervals(data: dict) -> dict:
    """Files written before the summary carried them: tokens per step's and α's intervals from the runs
    (:func:`rate_intervals`, the run's seed)."""
    import pandas as pd

    summary, runs = data.get("summary") or [], data.get("runs") or []
    if not summary or not runs or all("tokens_per_step_lo" in r for r in summary):
        return data
    todo = [i for i, r in enumerate(summary) if "tokens_per_step_lo" not in r and r.get("tokens_per_step") is not None]
    df = pd.DataFrame(runs)
    if not todo or "method" not in df or "prompt" not in df:
        return data
    seed = int((data.get("config") or {}).get("seed") or 0)
    rows = list(summary)
    for i in todo:
        rows[i] = {**rows[i], **rate_intervals(df[df["method"] == rows[i]["method"]], seed=seed)}
    return {**data, "summary": rows}


def _refresh_with_prefill(data: dict) -> dict:
    from specrepro.theory import with_prefill

    summary = data.get("summary") or []
    target_ms = ((data.get("config") or {}).get("cost_model") or {}).get("target_ms") or {}
    t1 = target_ms.get("1", target_ms.get(1))
    if (not summary or t1 is None or any("predicted_speedup_with_prefill" in r for r in summary)
            or not any(r.get("predicted_speedup") is not None for r in summary)):
        return data
    prefill, n_new = _ar_prefill(data.get("runs") or [])
    if not (math.isfinite(prefill) and math.isfinite(n_new) and n_new > 0):
        return data
    rows = []
    for r in summary:
        r, pred = dict(r), r.get("predicted_speedup")
        r["predicted_speedup_with_prefill"] = None
        if pred is not None and math.isfinite(pred) and pred > 0:
            r["predicted_speedup_with_prefill"] = with_prefill(pred, prefill, n_new, float(t1))
            r["measured_over_predicted"] = float(r["speedup_vs_ar"]) / r["predicted_speedup_with_prefill"]
        rows.append(r)
    return {**data, "summary": rows}


def _factory_name(label: str, spec: MethodSpec) -> str:
    """What a factory receives as ``name``: the full label for methods with a ``prepare`` hook, else the name."""
    return label if spec.prepare is not None else label.partition("@")[0]


def group_speedups(runs, baseline: str = "ar", group=lambda prompt_id: prompt_id.split("/")[1],
                   seed: int = 0):
    """The bench's paired speedups per group of prompts, e.g. per category of the ``chat`` workload (prompt ids
    ``chat/<category>/...``, the default ``group``).

    Args:
        runs: per-run rows of a bench JSON (``data["runs"]`` as a DataFrame: method, prompt, repeat, tokens_per_s, ...).
        baseline: the method every other is paired with; group: prompt id -> group name.

    Returns:
        pandas.DataFrame, one row per (group, method other than the baseline): group, method, n_prompts, repeats,
        tokens_per_s (median over runs), speedup / speedup_lo / speedup_hi (:func:`specrepro.measure.harness.
        paired_speedup` within the group: median over its prompts of the paired ratio, 95% bootstrap interval), and
        tokens_per_step (pooled new tokens / target steps; NaN without steps).

    Raises:
        KeyError: the baseline has no runs.
    """
    import pandas as pd

    from specrepro.measure.harness import paired_speedup

    runs = pd.DataFrame(runs)
    if not (runs["method"] == baseline).any():
        raise KeyError(f"no runs of the baseline {baseline!r}; methods: {sorted(set(runs['method']))}")
    runs = runs.assign(group=runs["prompt"].map(group))
    rows = []
    for g, d in runs.groupby("group", sort=False):
        for m in dict.fromkeys(d["method"]):
            if m == baseline:
                continue
            sp = paired_speedup(d, m, baseline, seed=seed)
            dm = d[d["method"] == m]
            steps = float(dm["steps"].sum()) if "steps" in dm else 0.0
            rows.append({"group": g, "method": m, "n_prompts": sp["n_prompts"], "repeats": sp["repeats"],
                         "tokens_per_s": float(dm["tokens_per_s"].median()), "speedup": sp["speedup"],
                         "speedup_lo": sp["speedup_lo"], "speedup_hi": sp["speedup_hi"],
                         "tokens_per_step": float(dm["new_tokens"].sum()) / steps if steps else math.nan})
    return pd.DataFrame(rows)


def ar_cost_table(results_dir: str | Path) -> pd.DataFrame:
    """Our AR baseline's cost in every bench file of ``results_dir`` (:func:`bench_files`) beside what the same file
    measured of the machine: a row per file with its CPU, dtype, threads, n prompts, AR's ms per token and target
    forward per step (ms; median over prompts of the median over passes, 95% bootstrap interval over prompts), the
    cost model's t(1) before and after the timed passes (ms; NaN without one) and the (pass, prompt) blocks run under
    load, where recorded."""
    import pandas as pd

    from specrepro.files import read_noted
    from specrepro.stats import bootstrap_ci

    rows = []
    for path in bench_files(results_dir):
        data = json.loads(read_noted(path))
        cfg, runs = data.get("config") or {}, pd.DataFrame(data.get("runs") or [])
        if runs.empty or "method" not in runs or not (runs["method"] == "ar").any():
            continue
        per_prompt = runs[runs["method"] == "ar"].groupby("prompt")[["ms_per_token", "target_ms"]].median()
        ms, ms_lo, ms_hi = bootstrap_ci(per_prompt["ms_per_token"].to_numpy(float))
        fwd, fwd_lo, fwd_hi = bootstrap_ci(per_prompt["target_ms"].to_numpy(float))
        t1 = {k: ((cfg.get("cost_model") or {}).get(k) or {}).get("target_ms") or {} for k in ("before", "after")}
        rows.append({"file": path.name, "cpu": cfg.get("cpu") or "not recorded", "dtype": cfg.get("dtype", ""),
                     "threads": cfg.get("torch_threads"), "n_prompts": int(len(per_prompt)),
                     "ar_ms_per_token": ms, "ar_ms_lo": ms_lo, "ar_ms_hi": ms_hi,
                     "ar_forward_ms": fwd, "ar_forward_lo": fwd_lo, "ar_forward_hi": fwd_hi,
                     **{f"t1_{k}_ms": float(v["1"]) if v.get("1") is not None else math.nan for k, v in t1.items()},
                     "blocks_under_load": cfg.get("blocks_under_load"), "blocks": cfg.get("blocks")})
    return pd.DataFrame(rows)
