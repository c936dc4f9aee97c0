"""Forward times of a :class:`specrepro.core.blocklm.BlockLM` (llama.cpp's models in the bench), with intervals.

What this file is: :func:`measure_block_costs`, the cost model of a run whose target and draft are BlockLMs
(:class:`specrepro.backends.llamacpp.LlamaCppLM`): t(n), the target's time to decode n new tokens after a cached
prefix (``forward_block`` of n tokens keeping n logits rows, as a verification of γ = n - 1 draft tokens does, then
``truncate`` back to the prefix), for each n asked; the draft's one-token time t_draft(1); its two-token time
t_draft(2) keeping one logits row (the first forward of a block after a fully accepted one, which feeds the last
draft token and the bonus token); and c = t_draft(1) / t_target(1) (Leviathan et al.'s cost coefficient), each a
median with its 95% interval.

What the intervals are over: the timed calls. Each of ``rounds`` passes times, after one untimed call per point,
``repeats`` calls of every n (the sizes in a fresh random order per round) and ``repeats`` alternating pairs of one
target token and one draft token; a point's median and its distribution-free interval
(:func:`specrepro.stats.median_interval`) are over its ``rounds × repeats`` calls, and c's over the per-pair ratios
(each a draft call over the target call just before it, so a slow phase of the machine shifts both sides of a
pair). The interval treats calls as independent draws: a drift of the machine's speed between the start and the end
of a bench run is seen only in the measurements before and after its timed passes, which the bench keeps side by
side.

What it is not: the PyTorch cost model (:mod:`specrepro.measure.cost`), or a model of the prefill.
"""

from __future__ import annotations

import random
import time
from typing import Sequence

__all__ = ["measure_block_costs", "block_costs_json"]


def _prefix(text: Sequence[int] | None, prefix_len: int, vocab: int, rng: random.Random) -> list[int]:
    if text is not None and len(text) >= prefix_len:
        return [int(t) for t in list(text)[:prefix_len]]
    return [rng.randrange(vocab) for _ in range(prefix_len)]


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return 1000.0 * (time.perf_counter() - t0)


def measure_block_costs(target, draft=None, *, ns: Sequence[int] = range(1, 22), prefix_len: int = 200,
                        repeats: int = 3, rounds: int = 3, text: Sequence[int] | None = None, seed: int = 0) -> dict:
    """Time a BlockLM target's forward over n new tokens after a prefix, and a BlockLM draft's one-token forward.

    Args:
        target: a BlockLM (``forward_block(ids, logits_to_keep)``, ``truncate(n)``, ``reset()``, ``vocab_size``).
        draft: a BlockLM or None (then no draft time and no c).
        ns: the block sizes n >= 1 to time (default 1..21: verifications of γ = 0..20 draft tokens).
        prefix_len: tokens decoded first (untimed) into each model's cache; every timed block follows it and is cut
            off again.
        repeats: timed calls per point per round (and target/draft pairs per round); rounds: passes over all points.
        text: the prefix and block tokens (e.g. the prompts' own ids; random ids from ``seed`` where it is shorter
            than ``prefix_len + max(ns)``: a dense forward's cost does not depend on the ids).
        seed: orders the sizes within each round and draws random ids.

    Returns:
        dict (ms): ``target_ms`` {n: median}, ``target_ms_lo`` / ``target_ms_hi`` {n: 95% interval},
        ``target_calls`` (timed calls per n), ``draft_ms`` / ``draft_ms_lo`` / ``draft_ms_hi`` / ``draft_calls``
        (t_draft(1), None without a draft), ``draft2_ms`` / ``draft2_ms_lo`` / ``draft2_ms_hi`` (t_draft(2), one
        logits row kept, ``repeats`` calls per round after the pairs; None without a draft), ``c`` / ``c_lo`` / ``c_hi`` / ``c_pairs`` (median of the paired ratios
        draft / target one-token call, None without a draft), ``prefix_len``, ``repeats``, ``rounds``,
        ``interval`` (what the intervals are over). Interval ends are None where fewer than 6 calls were timed.

    Raises:
        ValueError: an n < 1, repeats or rounds < 1, or a prefix plus block longer than a model's context.
    """
    from specrepro.stats import median_interval

    ns = sorted({int(n) for n in ns})
    if not ns or ns[0] < 1 or repeats < 1 or rounds < 1:
        raise ValueError(f"measure_block_costs needs sizes n >= 1 and repeats, rounds >= 1; got {ns}, {repeats}, "
                         f"{rounds}")
    rng = random.Random(seed)
    vocab = int(target.vocab_size)
    ids = _prefix(text, prefix_len + ns[-1], vocab, rng)
    if max(ids) >= vocab:
        ids = [t % vocab for t in ids]
    prefix, block = ids[:prefix_len], ids[prefix_len:prefix_len + ns[-1]]
    models = [target] + ([draft] if draft is not None else [])
    for m in models:
        if prefix_len + ns[-1] > int(getattr(m, "n_ctx", prefix_len + ns[-1])):
            raise ValueError(f"a prefix of {prefix_len} plus {ns[-1]} tokens exceeds the context of {m!r}")
        m.reset()
        if prefix_len:
            m.forward_block(prefix, logits_to_keep=0)

    def step(m, n, keep=None):
        m.forward_block(block[:n], logits_to_keep=n if keep is None else keep)
        m.truncate(prefix_len)

    samples = {n: [] for n in ns}
    draft_samples, draft2_samples, ratios = [], [], []
    for _ in range(rounds):
        order = list(ns)
        rng.shuffle(order)
        for n in order:
            step(target, n)  # untimed: the first call at a size
            samples[n] += [_time(lambda: step(target, n)) for _ in range(repeats)]
        if draft is not None:
            step(draft, 1)
            for _ in range(repeats):
                t = _time(lambda: step(target, 1))
                d = _time(lambda: step(draft, 1))
                if 1 in samples:
                    samples[1].append(t)
                draft_samples.append(d)
                ratios.append(d / t)
            step(draft, 2, 1)
            draft2_samples += [_time(lambda: step(draft, 2, 1)) for _ in range(repeats)]
    for m in models:
        m.reset()

    def none(v):
        return None if v != v else float(v)

    out = {"target_ms": {}, "target_ms_lo": {}, "target_ms_hi": {}, "target_calls": {}}
    for n in ns:
        est, lo, hi, k = median_interval(samples[n])
        out["target_ms"][n], out["target_ms_lo"][n], out["target_ms_hi"][n] = est, none(lo), none(hi)
        out["target_calls"][n] = k
    for key, values in (("draft_ms", draft_samples), ("draft2_ms", draft2_samples), ("c", ratios)):
        if draft is None:
            out.update({key: None, f"{key}_lo": None, f"{key}_hi": None})
            continue
        est, lo, hi, k = median_interval(values)
        out.update({key: est, f"{key}_lo": none(lo), f"{key}_hi": none(hi)})
    out["draft_calls"] = len(draft_samples) if draft is not None else 0
    out["c_pairs"] = len(ratios)
    out.update(prefix_len=int(prefix_len), repeats=int(repeats), rounds=int(rounds),
               interval=("95%, distribution-free (sign-test) interval of the median over the timed calls: rounds × "
                         "repeats per block size (n = 1 also gets the target calls of the target/draft pairs), c over "
                         "the per-pair ratios draft / target of alternating one-token calls"))
    return out


def block_costs_json(costs: dict) -> dict:
    """A :func:`measure_block_costs` dict as JSON keys: sizes n written as strings (as ``config.cost_model``)."""
    return {k: ({str(n): v for n, v in val.items()} if isinstance(val, dict) else val) for k, val in costs.items()}
