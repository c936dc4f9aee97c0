"""The one timing harness: decoding methods run side by side, and the one definition of speedup.

What this file is: every timed comparison in the repository (the ``bench`` command, notebooks 04-07 through
:mod:`specrepro.lab.leviathan`, :mod:`specrepro.lab.specinfer` and :mod:`specrepro.core.medusa`) goes through
:func:`run_interleaved` and is summarized by :func:`paired_speedup` / :func:`speedup_table`:

* **Interleaving.** Every method runs on prompt 1, then every method on prompt 2, ...; the method order is rotated
  by one from (repeat, prompt) to the next, so no method always runs first or last and drift of a shared machine
  hits all methods alike.
* **Warm-up.** Before timing, each method runs once untimed (its ``warmup`` runner, normally the same method with a
  small token budget, on the first prompt), so first-call costs (allocation, kernel choice, lazy imports) stay out.
* **Seeding.** One rule: the (repeat r, prompt i) pair gets the seed :func:`seed_for` ``(seed, r, i) = seed +
  1_000_003 r + i``, and every method on that prompt starts from a fresh ``torch.Generator`` with that seed, on the
  target's device.
* **Timing.** The wall time of each runner call is taken from outside (the same clock for every method):
  ``time.perf_counter`` on the CPU; CUDA events between two ``torch.cuda.synchronize()`` on a GPU.
* **Speedup.** The one definition: for each prompt, the paired ratio of the method's tokens/s to the baseline's
  tokens/s on the same prompt and repeat (equal to the baseline's time over the method's time when both emit the same
  number of tokens, as under greedy decoding), averaged geometrically over repeats; summarized by the **median over
  prompts** with a **95% percentile-bootstrap interval over prompts** (:func:`bootstrap_ci`, scipy.stats.bootstrap).
  A pooled ratio of totals or a mean of ratios is not used anywhere.

What it is not: the methods (:mod:`specrepro.core.decoding`, :mod:`specrepro.core.trees`, :mod:`specrepro.core.medusa`, the
method registry in :mod:`specrepro.bench`) or the cost model (:mod:`specrepro.theory`).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from specrepro.files import MachineSnapshot, machine_snapshot, machine_state
from specrepro.measure.memory import peak_rss_mb, reset_peak, rss_split_mb
from specrepro.stats import bootstrap_ci

__all__ = ["RunOutput", "register_helper_process", "unregister_helper_process", "seed_for", "make_generator", "timed_call", "as_run_output", "run_interleaved", "timing_checkpoint_key", "per_run_table", "paired_ratios", "paired_speedup", "speedup_table", "draft_of_method", "in_run_cost_coefficient"]


@dataclass
class RunOutput:
    """What one runner call produced, in the harness's terms.

    A runner may return a :class:`~specrepro.core.decoding.GenerationResult` (converted by :func:`as_run_output`) or this.

    Attributes:
        tokens: the new token ids (prompt excluded).
        drafted, accepted: per verification step, draft tokens (tree nodes) proposed / accepted; empty when unknown
            (e.g. transformers' own ``generate``).
        alpha_terms: per verified draft position, Σ_x min(p(x), q(x)) (Leviathan Def. 3.1); empty when unknown.
        depths: per verification step, the depth of the verified token tree (tree and Medusa decoding record it;
            empty for chains, whose depth is ``drafted``).
        times: seconds per phase as :attr:`GenerationResult.times` ('prefill', 'draft_prefill', 'draft', 'target',
            'verify', 'total'); empty when unknown.
    """

    tokens: list[int]
    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    alpha_terms: list[float] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)

    @property
    def prefill_s(self) -> float:
        """Seconds spent on the prompt before the first step (NaN when unknown)."""
        return float(self.times.get("prefill", float("nan")))


#: pids of processes that do a method's work for this one (e.g. a llama-server the method sends its prompts to):
#: their CPU time counts as this process's own in the machine state of a timed block, not as another process's.
HELPER_PIDS: set[int] = set()


def register_helper_process(pid: int) -> None:
    """Count the CPU time of process ``pid`` (a helper this process started and talks to) as this process's own in
    the machine state of every timed block (``other_cpu_pct``, ``under_load``), from now until
    :func:`unregister_helper_process`."""
    HELPER_PIDS.add(int(pid))


def unregister_helper_process(pid: int) -> None:
    """Stop counting ``pid`` as a helper (call it before the helper exits: once reaped, its time is the children's
    time that :func:`specrepro.files.machine_snapshot` already counts)."""
    HELPER_PIDS.discard(int(pid))


def _helper_cpu_s() -> float:
    """CPU seconds (user + system, its reaped children included) used so far by the live :data:`HELPER_PIDS`."""
    total = 0.0
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for pid in list(HELPER_PIDS):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(float(x) for x in fields[11:15]) / hz  # utime stime cutime cstime (fields 14-17)
        except (OSError, ValueError, IndexError):
            continue
    return total


def _snapshot() -> MachineSnapshot:
    """:func:`specrepro.files.machine_snapshot` with the helpers' CPU time added to this process's own."""
    snap = machine_snapshot()
    extra = _helper_cpu_s() if HELPER_PIDS else 0.0
    return MachineSnapshot((*snap[:5], snap[5] + extra)) if extra else snap


def seed_for(seed: int, repeat: int, prompt_index: int) -> int:
    """The harness's one seeding rule: the seed of (repeat, prompt) = ``seed + 1_000_003 * repeat + prompt_index``.

    Every method on that prompt and repeat starts from a generator with this seed (paired randomness; under greedy
    decoding the seed is unused). The untimed warm-up uses the first timed call's seed.
    """
    return int(seed) + 1_000_003 * int(repeat) + int(prompt_index)


def make_generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``seed``."""
    return torch.Generator(device=torch.device(device)).manual_seed(int(seed))


def timed_call(fn: Callable[[], Any], device: str | torch.device = "cpu") -> tuple[Any, float]:
    """Run ``fn()`` and return ``(result, seconds)``.

    CPU: ``time.perf_counter`` around the call. CUDA: synchronize, CUDA events around the call, synchronize.
    """
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        torch.cuda.synchronize()
        return out, start.elapsed_time(end) / 1000.0
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def as_run_output(res) -> RunOutput:
    """A :class:`RunOutput` from a runner's return value (a RunOutput, or anything with ``tokens`` and optionally
    ``drafted``, ``accepted``, ``alpha_terms``, ``depths``, ``times`` such as a GenerationResult)."""
    if isinstance(res, RunOutput):
        return res
    return RunOutput(tokens=[int(t) for t in res.tokens], drafted=list(getattr(res, "drafted", []) or []),
                     accepted=list(getattr(res, "accepted", []) or []),
                     alpha_terms=list(getattr(res, "alpha_terms", []) or []),
                     depths=list(getattr(res, "depths", []) or []), times=dict(getattr(res, "times", {}) or {}))


def run_interleaved(
    runners: Mapping[str, Callable[[torch.Tensor, torch.Generator], Any]],
    prompts: Sequence[tuple[str, torch.Tensor]],
    *,
    repeats: int = 1,
    seed: int = 0,
    device: str | torch.device = "cpu",
    warmup: Mapping[str, Callable[[torch.Tensor, torch.Generator], Any]] | None = None,
    baseline: str | None = None,
    greedy: bool = False,
    progress: bool = True,
    desc: str = "timing",
    checkpoint: str | os.PathLike | None = None,
    checkpoint_key: Mapping[str, Any] | None = None,
    prompt_offset: int = 0,
) -> pd.DataFrame:
    """Time every runner on every prompt, interleaved, and return one row per timed call.

    Args:
        runners: method label -> ``runner(ids, generator) -> GenerationResult | RunOutput``; ``ids`` is a long
            tensor [L] on ``device``. The dict order is the method order of the first prompt.
        prompts: (prompt id, token ids long [L]) pairs.
        repeats: timed passes over the prompts (>= 1).
        seed: base seed of :func:`seed_for`.
        device: where the generators live and how time is taken (CUDA events on ``cuda*``).
        warmup: label -> runner called once, untimed, on the first prompt before any timing (e.g. the same method
            with an 8-token budget); None: no warm-up.
        baseline: a label whose tokens the others are compared with under greedy decoding (``equal_to_baseline``).
        greedy: whether the runs are greedy (only then is ``equal_to_baseline`` filled; else None).
        progress: show a tqdm bar (terminal and JupyterLab) with the current method and an ETA.
        checkpoint: a JSON file rewritten atomically after every (repeat, prompt) block, so that an interrupted run
            resumes where it stopped: blocks found there are loaded, not timed again (a block is all methods on one
            prompt in one pass, so every paired ratio still compares calls made side by side). The caller deletes
            it once the results are saved. None: no checkpoint.
        checkpoint_key: JSON-serialisable settings the saved blocks must have been timed under (methods, prompts,
            sampling, machine, code; see :func:`specrepro.bench.run.run_bench`). A checkpoint with another key is
            not used: it is renamed ``<name>.stale-<time>`` (kept, never deleted) and the run starts afresh.
        prompt_offset: the index of ``prompts[0]`` in the whole workload, when the prompts are one slice of it (a
            shard): prompt i here is seeded, rotated and reported as prompt ``prompt_offset + i``, so that slices
            timed in separate runs give the rows the whole run would have (same seeds, same method orders).

    Returns:
        pandas DataFrame, one row per (repeat, prompt, method): repeat, prompt, prompt_index, method, position (the
        method's place in this prompt's rotated order), prompt_tokens, new_tokens, seconds (wall, prefill
        included), tokens_per_s, ms_per_token, steps (target forwards after the prefill; 0 when unknown), loop_ms
        (ms per step after the prefill; NaN when unknown), prefill_ms, target_ms (mean target forward per step,
        NaN when unknown), draft_ms (draft time per drafted token, the drafting steps alone where the drafter reads
        the prompt in its own ``draft_prefill`` phase; NaN when unknown), draft_prefill_ms (that phase, ms per call;
        NaN without it; inside ``loop_ms``), overhead_ms (per step, the loop's time outside the prefills and the
        target and draft forwards; NaN when unknown), token_ids, drafted,
        accepted,
        alpha_terms, depths (lists per step), peak_rss_mb (the process's resident high-water mark during this call,
        MiB; :mod:`specrepro.measure.memory`: the models' weights included), rss_anon_mb / rss_file_mb (resident
        anonymous and file-backed memory right after the call, MiB), equal_to_baseline, and the machine's state
        during the row's (repeat, prompt) block (:func:`specrepro.files.machine_state`): load_before, load_after,
        steal_pct, other_cpu_pct (the CPU time of :data:`HELPER_PIDS` counts as this process's own), under_load
        (True: another process or the hypervisor took at least
        :data:`specrepro.files.LOAD_FLAG_PCT` percent of the CPU while the block was timed). ``attrs["resumed_blocks"]``: the (repeat, prompt)
        blocks loaded from ``checkpoint`` rather than timed in this call.

    Raises:
        ValueError: no runners, no prompts, repeats < 1, an unknown baseline or warm-up label.
    """
    from tqdm.auto import tqdm

    labels = list(runners)
    if not labels:
        raise ValueError("run_interleaved needs at least one runner")
    if not prompts:
        raise ValueError("run_interleaved needs at least one prompt")
    if int(repeats) != repeats or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    if baseline is not None and baseline not in runners:
        raise ValueError(f"baseline {baseline!r} is not among the methods {labels}")
    unknown = set(warmup or {}) - set(labels)
    if unknown:
        raise ValueError(f"warm-up runners for unknown methods {sorted(unknown)}")
    dev = str(device)
    if warmup:
        ids0 = prompts[0][1]
        for label in labels:
            if label in warmup:
                warmup[label](ids0, make_generator(seed_for(seed, 0, 0), dev))

    rows: list[dict] = []
    done: set[tuple[int, int]] = set()
    key = None
    if checkpoint is not None:
        key = json.loads(json.dumps(dict(checkpoint_key or {}), default=str))
        rows, done = _load_checkpoint(Path(checkpoint), key, labels, [pid for pid, _ in prompts], int(repeats),
                                      int(prompt_offset))
    bar = tqdm(total=int(repeats) * len(prompts) * len(labels), desc=desc, disable=not progress,
               initial=len(done) * len(labels))
    for r in range(int(repeats)):
        for i, (pid, ids) in enumerate(prompts, start=int(prompt_offset)):
            if (r, i) in done:
                continue
            k = (i + r) % len(labels)
            order = labels[k:] + labels[:k]
            outs: dict[str, RunOutput] = {}
            first = len(rows)
            snap = _snapshot()
            for pos, label in enumerate(order):
                bar.set_postfix_str(f"{label} · {pid}", refresh=False)
                gen = make_generator(seed_for(seed, r, i), dev)
                reset_peak()
                res, seconds = timed_call(lambda: runners[label](ids, gen), dev)
                peak, now = peak_rss_mb(), rss_split_mb()
                out = as_run_output(res)
                outs[label] = out
                n, steps = len(out.tokens), len(out.accepted)
                pre = out.prefill_s
                loop_s = seconds - (pre if math.isfinite(pre) else 0.0)
                n_draft = sum(out.drafted)
                rows.append({
                    "repeat": r, "prompt": pid, "prompt_index": i, "method": label, "position": pos,
                    "prompt_tokens": int(ids.numel()), "new_tokens": n, "seconds": seconds,
                    "tokens_per_s": n / max(seconds, 1e-12), "ms_per_token": 1000 * seconds / max(1, n),
                    "steps": steps, "loop_ms": 1000 * loop_s / steps if steps else float("nan"),
                    "prefill_ms": 1000 * pre if math.isfinite(pre) else float("nan"),
                    "target_ms": 1000 * out.times["target"] / steps if (steps and "target" in out.times)
                    else float("nan"),
                    "draft_ms": 1000 * out.times["draft"] / n_draft if (n_draft and "draft" in out.times)
                    else float("nan"),
                    "draft_prefill_ms": 1000 * out.times["draft_prefill"] if "draft_prefill" in out.times
                    else float("nan"),
                    "overhead_ms": 1000 * (out.times["total"] - sum(out.times.get(k, 0.0) for k in
                                                                    ("target", "draft", "prefill",
                                                                     "draft_prefill"))) / steps
                    if (steps and "total" in out.times) else float("nan"),
                    "token_ids": list(out.tokens), "drafted": list(out.drafted), "accepted": list(out.accepted),
                    "alpha_terms": list(out.alpha_terms), "depths": list(out.depths),
                    "peak_rss_mb": peak, "rss_anon_mb": now["anon"], "rss_file_mb": now["file"],
                })
                bar.update(1)
            state = machine_state(snap, _snapshot())  # was the machine idle while this block was timed?
            for row in rows[first:]:
                row["equal_to_baseline"] = (outs[row["method"]].tokens == outs[baseline].tokens) \
                    if (greedy and baseline is not None) else None
                row.update(state)
            if checkpoint is not None:
                from specrepro.files import atomic_write_text

                saved = {"key": key, "rows": rows}
                atomic_write_text(Path(checkpoint), json.dumps(saved, default=_json_scalar) + "\n")
    bar.close()
    rows.sort(key=lambda row: (row["repeat"], row["prompt_index"], row["position"]))
    out = pd.DataFrame(rows)
    out.attrs["resumed_blocks"] = len(done)
    return out


def _json_scalar(value):
    """numpy / torch scalars in a checkpoint row as Python numbers."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _load_checkpoint(path: Path, key: dict, labels: list[str], prompt_ids: list[str],
                     repeats: int, offset: int = 0) -> tuple[list[dict], set[tuple[int, int]]]:
    """The complete (repeat, prompt) blocks of a :func:`run_interleaved` checkpoint timed under ``key``: (rows,
    {(repeat, prompt_index)}). A missing file gives nothing; an unreadable one or one with another key is renamed
    ``<name>.stale-<time>`` (with a warning) and gives nothing; blocks beyond ``repeats`` are dropped."""
    from specrepro.files import load_keyed_checkpoint

    saved = load_keyed_checkpoint(path, key, what="timing checkpoint")
    if saved is None:
        return [], set()
    blocks: dict[tuple[int, int], list[dict]] = {}
    for row in saved.get("rows", []):
        blocks.setdefault((int(row["repeat"]), int(row["prompt_index"])), []).append(row)
    rows, done = [], set()
    for (r, i), block in sorted(blocks.items()):
        if r < repeats and 0 <= i - offset < len(prompt_ids) and block[0]["prompt"] == prompt_ids[i - offset] \
                and sorted(row["method"] for row in block) == sorted(labels):
            rows.extend(block)
            done.add((r, i))
    return rows, done


def timing_checkpoint_key(modules: Sequence[str], prompts: Sequence[tuple[str, torch.Tensor]],
                          device: str | torch.device = "cpu", **settings) -> dict:
    """The ``checkpoint_key`` of a :func:`run_interleaved` call that timing functions build: the caller's
    ``settings`` (the models' names, methods, sampling, token budget, seed; JSON-serialisable), the prompts (ids and
    token counts), the machine (device, CPU, torch and its thread count) and the code that decides what is timed
    (:func:`specrepro.files.code_fingerprint` of ``modules`` and every package module they import). Blocks saved
    under another key are not resumed. Not the commit: results get committed while a long run waits to resume.

    Raises:
        ModuleNotFoundError: a name in ``modules`` that is not a module of the package.
    """
    from specrepro.files import code_fingerprint, cpu_description

    return dict(settings, prompts=[pid for pid, _ in prompts], prompt_tokens=[int(ids.numel()) for _, ids in prompts],
                device=str(device), cpu=cpu_description(), torch=torch.__version__, threads=torch.get_num_threads(),
                code=code_fingerprint(tuple(modules)))


def per_run_table(runs: pd.DataFrame) -> pd.DataFrame:
    """:func:`run_interleaved` rows with the per-step lists reduced to scalars, for CSV tables: ``tokens`` (=
    new_tokens), ``tokens_per_step``, ``accepted`` and ``drafted`` (sums over steps), ``alpha`` (mean of the α terms,
    NaN without draft tokens); the list columns (token_ids, alpha_terms, depths) are dropped."""
    out = runs.drop(columns=[c for c in ("token_ids", "alpha_terms", "depths", "drafted", "accepted")
                             if c in runs.columns])
    out.insert(out.columns.get_loc("new_tokens") + 1, "tokens", runs["new_tokens"])
    out["tokens_per_step"] = [n / s if s else float("nan") for n, s in zip(runs["new_tokens"], runs["steps"])]
    out["accepted"] = [int(sum(x)) for x in runs["accepted"]]
    out["drafted"] = [int(sum(x)) for x in runs["drafted"]]
    out["alpha"] = [float(np.mean(x)) if len(x) else float("nan") for x in runs["alpha_terms"]]
    return out


def paired_ratios(runs: pd.DataFrame, method: str, baseline: str = "ar", value: str = "tokens_per_s") -> pd.Series:
    """Per prompt: the method's ``value`` over the baseline's on the same prompt and repeat, averaged geometrically
    over repeats. Index: prompt id (prompts where either side is missing are dropped).

    Raises:
        KeyError: ``method`` or ``baseline`` has no runs.
    """
    for m in (method, baseline):
        if not (runs["method"] == m).any():
            raise KeyError(f"no runs of method {m!r}; methods: {sorted(set(runs['method']))}")
    if "repeat" not in runs.columns:  # tables written before repeats were recorded: one pass
        runs = runs.assign(repeat=0)
    key = ["repeat", "prompt"]
    a = runs[runs["method"] == method].set_index(key)[value]
    b = runs[runs["method"] == baseline].set_index(key)[value]
    ratio = (a / b.reindex(a.index)).dropna()
    ratio = ratio[ratio > 0]
    logs = np.log(ratio.astype(float)).groupby(level="prompt", sort=False).mean()
    return np.exp(logs)


def paired_speedup(runs: pd.DataFrame, method: str, baseline: str = "ar", seed: int = 0) -> dict:
    """The harness's speedup of ``method`` over ``baseline``: median over prompts of :func:`paired_ratios`, with its
    95% bootstrap interval over prompts.

    Returns:
        dict with speedup, speedup_lo, speedup_hi, n_prompts (prompts paired), repeats.
    """
    r = paired_ratios(runs, method, baseline)
    est, lo, hi = bootstrap_ci(r.to_numpy(), seed=seed)
    reps = int(runs.loc[runs["method"] == method, "repeat"].nunique()) if "repeat" in runs.columns else 1
    return {"speedup": est, "speedup_lo": lo, "speedup_hi": hi, "n_prompts": int(r.size), "repeats": reps}


def prefill_ms_total(runs: pd.DataFrame) -> pd.Series:
    """Per run, the ms spent on the prompt before decoding: ``prefill_ms`` plus ``draft_prefill_ms`` where the run
    records a draft's own prompt prefill; NaN where the run has no prefill time."""
    pre = pd.to_numeric(runs["prefill_ms"], errors="coerce") if "prefill_ms" in runs else pd.Series(
        float("nan"), index=runs.index)
    if "draft_prefill_ms" in runs:
        pre = pre + pd.to_numeric(runs["draft_prefill_ms"], errors="coerce").fillna(0.0)
    return pre


def decode_ms_per_token(runs: pd.DataFrame, method: str, seed: int = 0) -> tuple[float, float, float, int]:
    """A method's decode time per new token, the prompt's prefill left out (:func:`prefill_ms_total`; ms),
    the median over passes per prompt, then the median over prompts with its 95% bootstrap interval over prompts.
    Runs without a prefill time are dropped.

    Returns:
        ``(ms, low, high, n_prompts)``; NaNs and 0 when no run has a prefill time.
    """
    d = runs[runs["method"] == method]
    if d.empty or "prefill_ms" not in d:
        return float("nan"), float("nan"), float("nan"), 0
    ms = (1000.0 * d["seconds"].astype(float) - prefill_ms_total(d)) / d["new_tokens"].where(d["new_tokens"] > 0)
    per_prompt = ms.groupby(d["prompt"], sort=True).median().dropna()
    if per_prompt.empty:
        return float("nan"), float("nan"), float("nan"), 0
    est, lo, hi = bootstrap_ci(per_prompt.to_numpy(dtype=float), seed=seed)
    return est, lo, hi, int(per_prompt.size)


def decode_speedup(runs: pd.DataFrame, method: str, baseline: str, seed: int = 0) -> dict:
    """:func:`paired_speedup` in decode time alone: new tokens per second of wall time less :func:`prefill_ms_total`
    (both prefills left out; the end-to-end speedup pays them), paired per (prompt, pass), geometric mean over passes, median over prompts,
    95% percentile bootstrap over prompts.

    Returns:
        :func:`paired_speedup`'s dict plus each side's :func:`decode_ms_per_token` (``method_ms``, ``baseline_ms``,
        each with ``_lo`` / ``_hi``; ms).
    """
    dec = runs["seconds"] - prefill_ms_total(runs) / 1000.0
    runs = runs.assign(tokens_per_s=runs["new_tokens"] / dec.where(dec > 0))
    out = paired_speedup(runs, method, baseline, seed=seed)
    for key, m in (("method_ms", method), ("baseline_ms", baseline)):
        out[key], out[f"{key}_lo"], out[f"{key}_hi"], _ = decode_ms_per_token(runs, m, seed=seed)
    return out


def _total(x) -> float:
    return float(sum(x)) if isinstance(x, (list, tuple, np.ndarray)) else float(x)


def speedup_table(runs: pd.DataFrame, baseline: str = "ar", methods: Sequence[str] | None = None,
                  seed: int = 0) -> pd.DataFrame:
    """One row per method: :func:`paired_speedup` against ``baseline`` plus the median tokens/s, α (mean of the
    α terms, Leviathan Def. 3.1; of the per-run α for :func:`per_run_table` rows), tokens per step, drafted per step
    and the greedy equality count. ``runs``: :func:`run_interleaved` rows or :func:`per_run_table` rows.

    Returns:
        columns method, n_prompts, repeats, speedup, speedup_lo, speedup_hi, tokens_per_s (median over runs),
        tokens_per_s_lo / _hi (bootstrap interval of that median over prompts), alpha, tokens_per_step,
        drafted_per_step, equal_to_baseline ("k/n" under greedy, "" otherwise).
    """
    methods = list(dict.fromkeys(runs["method"])) if methods is None else list(methods)
    rows = []
    for m in methods:
        d = runs[runs["method"] == m]
        per_prompt = d.groupby("prompt", sort=False)["tokens_per_s"].median()
        tps, tps_lo, tps_hi = bootstrap_ci(per_prompt.to_numpy(), seed=seed)
        sp = paired_speedup(runs, m, baseline, seed=seed) if m != baseline else \
            {"speedup": 1.0, "speedup_lo": 1.0, "speedup_hi": 1.0, "n_prompts": int(per_prompt.size),
             "repeats": int(d["repeat"].nunique())}
        steps = int(d["steps"].sum())
        drafted = sum(_total(x) for x in d["drafted"]) if "drafted" in d else 0
        if "alpha_terms" in d:  # raw rows: pool the α terms of every verified position
            terms = [t for xs in d["alpha_terms"] for t in xs]
        else:  # per_run_table rows: the per-run α means
            terms = [a for a in d["alpha"] if np.isfinite(a)] if "alpha" in d else []
        eq = d["equal_to_baseline"].dropna() if "equal_to_baseline" in d else pd.Series(dtype=object)
        rows.append({"method": m, **sp, "tokens_per_s": tps, "tokens_per_s_lo": tps_lo, "tokens_per_s_hi": tps_hi,
                     "alpha": float(np.mean(terms)) if terms else float("nan"),
                     "tokens_per_step": float(d["new_tokens"].sum() / steps) if steps else float("nan"),
                     "drafted_per_step": float(drafted / steps) if steps else float("nan"),
                     "equal_to_baseline": f"{int(eq.astype(bool).sum())}/{len(eq)}" if len(eq) else ""})
    return pd.DataFrame(rows)


def draft_of_method(method: str) -> str:
    """The draft's label in a method label of the form ``"<draft> γ=<n>"`` (notebook 04's naming); the label itself
    when it has no ``γ=`` suffix."""
    head, sep, tail = str(method).rpartition(" γ=")
    return head if sep and tail.strip().isdigit() else str(method)


def in_run_cost_coefficient(runs: pd.DataFrame, baseline: str = "AR",
                            draft_of: Callable[[str], str] = draft_of_method, seed: int = 0) -> pd.DataFrame:
    """Leviathan et al.'s cost coefficient c (arXiv 2211.17192, §3: the time of one run of the draft model over the
    time of one run of the target), measured inside the timed runs rather than in a separate micro-benchmark, so that
    a prediction rests on the machine state of the runs it predicts.

    For each draft model and each pairing cell (temperature where the table has one, ``repeat``, ``prompt``): ``u``,
    the draft's time per drafted token, is the least-squares slope of its total draft time (``draft_ms`` ×
    ``drafted``, ms) against the number of tokens it drafted, over the draft model's methods in that cell (its γ
    sweep: the runs differ in tokens drafted, not in prompt); the intercept takes the draft's one-time prompt prefill
    and other per-run costs, which Leviathan's c leaves out. ``t`` is the baseline's mean target forward per step
    (``target_ms``) in the same cell. The cell's c is u / t; a prompt's c is the median over its cells (passes,
    temperatures); the table reports the median over prompts with its 95% percentile-bootstrap interval over prompts
    (:func:`bootstrap_ci`). Cells where the draft model ran fewer than two distinct drafted counts (a single γ, such
    as notebook 04's T = 1 runs) are skipped, so c comes from the γ sweep and applies to every temperature.

    Args:
        runs: :func:`per_run_table` rows with columns method, gamma, repeat, prompt, drafted (int, tokens drafted in
            the run), draft_ms (ms per drafted token) and target_ms (ms per step); optionally temperature.
        baseline: the method whose ``target_ms`` is the target's time per step (AR, gamma 0).
        draft_of: method label -> draft model label (default: the label without its ``" γ=<n>"`` suffix).
        seed: seed of the bootstrap resampling.

    Returns:
        One row per draft model with at least one usable cell: draft, c, c_lo, c_hi, n_prompts, cells,
        draft_ms_per_token (median u, ms), draft_fixed_ms (median intercept, ms per run), target_ms (median t, ms).

    Raises:
        KeyError: a needed column is missing, or ``baseline`` has no runs.
    """
    need = ["method", "gamma", "prompt", "drafted", "draft_ms", "target_ms"]
    missing = [c for c in need if c not in runs.columns]
    if missing:
        raise KeyError(f"in_run_cost_coefficient needs columns {missing} in the runs table")
    if not (runs["method"] == baseline).any():
        raise KeyError(f"no runs of the baseline {baseline!r}; methods: {sorted(set(runs['method']))}")
    runs = runs if "repeat" in runs.columns else runs.assign(repeat=0)
    key = [k for k in ("temperature", "repeat") if k in runs.columns] + ["prompt"]
    base = runs[runs["method"] == baseline].groupby(key)["target_ms"].median()
    d = runs[(runs["method"] != baseline) & (pd.to_numeric(runs["gamma"], errors="coerce") > 0)].copy()
    d["drafted"] = [_total(x) for x in d["drafted"]]
    d = d[np.isfinite(d["draft_ms"].astype(float)) & (d["drafted"] > 0)]
    d["draft"] = [draft_of(m) for m in d["method"]]
    d["draft_total_ms"] = d["draft_ms"].astype(float) * d["drafted"]
    cells = []
    for (draft, *cell), grp in d.groupby(["draft", *key], sort=False):
        t = base.get(tuple(cell) if len(cell) > 1 else cell[0], float("nan"))
        if grp["drafted"].nunique() < 2 or not np.isfinite(t) or t <= 0:
            continue
        u, fixed = np.polyfit(grp["drafted"].to_numpy(float), grp["draft_total_ms"].to_numpy(float), 1)
        cells.append({"draft": draft, "prompt": cell[-1], "u": u, "fixed": fixed, "t": t, "c": u / t})
    rows = []
    if cells:
        f = pd.DataFrame(cells)
        for draft, g in f.groupby("draft", sort=False):
            per_prompt = g.groupby("prompt", sort=False)["c"].median()
            est, lo, hi = bootstrap_ci(per_prompt.to_numpy(), seed=seed)
            rows.append({"draft": draft, "c": est, "c_lo": lo, "c_hi": hi, "n_prompts": int(per_prompt.size),
                         "cells": int(len(g)), "draft_ms_per_token": float(g["u"].median()),
                         "draft_fixed_ms": float(g["fixed"].median()), "target_ms": float(g["t"].median())})
    return pd.DataFrame(rows, columns=["draft", "c", "c_lo", "c_hi", "n_prompts", "cells", "draft_ms_per_token",
                                       "draft_fixed_ms", "target_ms"])
