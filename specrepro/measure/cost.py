"""Timing of forward passes: the target's cost curve t(n) and each draft's per-step cost, in ms.

What this file is: the measurements the cost model of :mod:`specrepro.theory` takes as input, for a transformers
target or any :class:`specrepro.core.blocklm.BlockLM` target (llama.cpp's :class:`~specrepro.backends.llamacpp.
LlamaCppLM`, timed through ``forward_block`` and ``truncate``), and for any drafter. What it is not: the arithmetic
(``theory``) or the interleaved timing of decoding methods (``measure.harness``).
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import torch

from specrepro.theory import CostCurve

__all__ = ["measure_cost_table", "measure_cost_curve", "measure_cost_table_static", "measure_cost_curve_static",
           "measure_draft_step_ms", "measure_chain_costs", "measure_forward_ms"]


def measure_cost_table(model, ns: Sequence[int] = (1, 2, 3, 4, 5, 6, 8), prefix_len: int = 200, repeats: int = 9,
                       generator=None, warmup_rounds: int = 2):
    """Time one KV-cached forward pass of ``n`` new tokens on a ``prefix_len``-token prefix, for each n: the median
    over ``repeats`` timed rounds and its 95% interval (ms).

    The sizes are timed round-robin: after the prefill, ``warmup_rounds`` untimed rounds over every n, then
    ``repeats`` timed rounds, each timing every n once (the cache is cropped back to the prefix after each call).
    Why not n by n: on this project's 2-core CPU the first 10-20 forwards after a long prefill ran up to 40% slower
    than later ones (qwen2.5-coder-1.5b, one call timing n = 1..5 in that order: 327, 336, 243, 223, 217 ms; in the
    order 5..1: t(1) = 224 ms), so timing one size after another charged that transient to whichever sizes came first
    and made a one-token forward look slower than a four-token one. Round-robin spreads any transient or drift over
    every size alike.

    The interval is the distribution-free one of the median (:func:`specrepro.stats.median_interval`): it needs at
    least 6 rounds at 95%, and is NaN below that. It describes the spread of repeated calls in one run on one
    machine, not the spread between machines or runs.

    Random token ids (drawn with ``generator``) are used: the cost of a dense transformer forward does not depend on
    the ids. CUDA is synchronized around each timed call.

    A :class:`~specrepro.core.blocklm.BlockLM` ``model`` (anything with ``forward_block``, e.g. llama.cpp's
    :class:`~specrepro.backends.llamacpp.LlamaCppLM`) is timed the same way through its own interface: ``reset``, a
    prefill of ``prefix_len`` tokens with no logits, then per call ``forward_block`` of n tokens keeping n rows (as a
    verification of n - 1 draft tokens does) and ``truncate`` back to the prefix; its ids are drawn from
    [0, ``vocab_size``), and it is reset afterwards.

    Args:
        model: a transformers causal LM or a BlockLM; ns: the new-token counts n (each >= 1); prefix_len: cached
        prefix tokens; repeats: timed rounds (>= 1); generator: seeds the random ids; warmup_rounds: untimed rounds
        (>= 0).

    Returns:
        pandas DataFrame, one row per n in ascending order: n (int), ms (median, float), ms_low, ms_high (95%
        interval of the median, NaN under 6 rounds), rounds (int, the timed rounds).

    Raises:
        ValueError: ``repeats`` < 1, ``warmup_rounds`` < 0, or an n < 1.
    """
    from specrepro.core.kvcache import crop_cache, new_cache

    ns = sorted({int(n) for n in ns})
    if int(repeats) < 1 or int(warmup_rounds) < 0 or not ns or min(ns) < 1:
        raise ValueError(f"measure_cost_table needs repeats >= 1, warmup_rounds >= 0 and every n >= 1; got "
                         f"{repeats}, {warmup_rounds}, {ns}")
    if hasattr(model, "forward_block"):
        return _block_cost_frame(model, ns, prefix_len, int(repeats), generator, int(warmup_rounds))
    device = model.device
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = torch.randint(0, vocab, (1, prefix_len + max(ns)), generator=generator).to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times: dict[int, list[float]] = {n: [] for n in ns}
    with torch.inference_mode():
        cache = new_cache(model)
        model(input_ids=ids[:, :prefix_len], past_key_values=cache, use_cache=True, logits_to_keep=1)
        for r in range(int(warmup_rounds) + int(repeats)):
            for n in ns:
                sync()
                t0 = time.perf_counter()
                model(input_ids=ids[:, prefix_len:prefix_len + n], past_key_values=cache, use_cache=True,
                      logits_to_keep=n)
                sync()
                if r >= int(warmup_rounds):
                    times[n].append(1000 * (time.perf_counter() - t0))
                crop_cache(cache, prefix_len)
    return _cost_frame(times)


def _block_cost_frame(lm, ns: list[int], prefix_len: int, repeats: int, generator, warmup_rounds: int):
    """:func:`measure_cost_table` of a BlockLM ``lm``: the same round-robin over ``ns`` (sorted, >= 1) through
    ``forward_block`` / ``truncate``, on random ids in [0, ``lm.vocab_size``)."""
    device = torch.device(getattr(lm, "device", "cpu"))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    ids = torch.randint(0, int(lm.vocab_size), (prefix_len + max(ns),), generator=generator).tolist()
    times: dict[int, list[float]] = {n: [] for n in ns}
    lm.reset()
    try:
        if prefix_len:
            lm.forward_block(ids[:prefix_len], logits_to_keep=0)
        for r in range(warmup_rounds + repeats):
            for n in ns:
                sync()
                t0 = time.perf_counter()
                lm.forward_block(ids[prefix_len:prefix_len + n], logits_to_keep=n)
                sync()
                if r >= warmup_rounds:
                    times[n].append(1000 * (time.perf_counter() - t0))
                lm.truncate(prefix_len)
    finally:
        lm.reset()
    return _cost_frame(times)


def _cost_frame(times: dict[int, list[float]]):
    """One row per n (ascending): n, ms (median of the timed rounds), ms_low, ms_high (its 95% interval,
    :func:`specrepro.stats.median_interval`), rounds."""
    import pandas as pd

    from specrepro.stats import median_interval

    rows = []
    for n in sorted(times):
        ms, lo, hi, k = median_interval(times[n])
        rows.append({"n": int(n), "ms": ms, "ms_low": lo, "ms_high": hi, "rounds": k})
    return pd.DataFrame(rows)


def measure_cost_curve(model, ns: Sequence[int] = (1, 2, 3, 4, 5, 6, 8), prefix_len: int = 200, repeats: int = 5,
                       generator=None, warmup_rounds: int = 2) -> CostCurve:
    """The cost curve t(n) of :func:`measure_cost_table` (the medians, ms) as a :class:`CostCurve`.

    Args:
        as :func:`measure_cost_table`.

    Returns:
        :class:`CostCurve` over ``ns`` in ms.

    Raises:
        ValueError: ``repeats`` < 1, ``warmup_rounds`` < 0, or an n < 1.
    """
    table = measure_cost_table(model, ns, prefix_len=prefix_len, repeats=repeats, generator=generator,
                               warmup_rounds=warmup_rounds)
    return CostCurve(list(table["n"]), list(table["ms"]))


def measure_cost_curve_static(model, ns: Sequence[int] = (1, 2, 3, 4, 5, 6, 8), prefix_len: int = 200,
                              repeats: int = 5, generator=None, warmup_rounds: int = 2,
                              cuda_graphs: bool = False) -> tuple[CostCurve, float | None]:
    """The medians of :func:`measure_cost_table_static` as a :class:`CostCurve`, with its logit difference.

    Args, Raises: as :func:`measure_cost_table_static`.

    Returns:
        ``(CostCurve over ns in ms, max |logits(graph) - logits(eager)|)``; the second item is None without graphs.
    """
    table, max_diff = measure_cost_table_static(model, ns, prefix_len=prefix_len, repeats=repeats,
                                                generator=generator, warmup_rounds=warmup_rounds,
                                                cuda_graphs=cuda_graphs)
    return CostCurve(list(table["n"]), list(table["ms"])), max_diff


def measure_cost_table_static(model, ns: Sequence[int] = (1, 2, 3, 4, 5, 6, 8), prefix_len: int = 200,
                              repeats: int = 9, generator=None, warmup_rounds: int = 2, cuda_graphs: bool = False):
    """:func:`measure_cost_table` with transformers' ``StaticCache`` (preallocated K/V of ``prefix_len + max(ns)``
    positions) and, with ``cuda_graphs``, each forward captured once per n as a CUDA graph and timed by replaying it.

    A decoding step of a small model at batch 1 on a GPU is bound by kernel launches, not by reading weights (the
    eager curve of :func:`measure_cost_curve` on an H100: qwen2.5-coder-1.5b's 28 layers cost about as much as the
    0.5B draft's 24). A graph replays every kernel of the step with one launch, so the graphed curve is what a
    decoding loop built on static caches and graphs (as serving engines do) would pay; the static cache without graphs
    separates the cache's own effect. Leviathan et al.'s c and the hardware-aware prediction
    (:func:`specrepro.theory.hardware_aware_speedup`) take either curve.

    Each timed call first rewinds the cache's fill level to the prefix (:func:`_rewind_static_cache`, inside the
    graph when there is one), so the forward of n tokens writes the same cache slots ``prefix_len .. prefix_len + n -
    1`` every time; sizes are timed round-robin, as in :func:`measure_cost_curve`. With ``cuda_graphs`` the first replay's logits are compared with an eager forward of
    the same inputs on the same cache; the largest absolute difference is returned (0.0 when the graph replays the
    eager kernels bit for bit).

    Args:
        model: a transformers causal LM whose architecture supports ``StaticCache``; ns: new-token counts (>= 1);
        prefix_len: cached prefix tokens; repeats: timed rounds (>= 1); generator: seeds the random ids;
        warmup_rounds: untimed rounds (>= 0; with graphs, the warm-up before capture is 3 eager calls per n, on a
        side stream, as CUDA graph capture requires).
        cuda_graphs: capture and replay CUDA graphs (needs the model on a CUDA device).

    Returns:
        ``(table, max |logits(graph) - logits(eager)|)``: the table as :func:`measure_cost_table`'s (n, ms, ms_low,
        ms_high, rounds; ms); the second item is None without graphs.

    Raises:
        ValueError: ``repeats`` < 1, ``warmup_rounds`` < 0, an n < 1, or ``cuda_graphs`` with a model not on CUDA.
    """
    from transformers import StaticCache

    ns = sorted({int(n) for n in ns})
    if int(repeats) < 1 or int(warmup_rounds) < 0 or not ns or min(ns) < 1:
        raise ValueError(f"measure_cost_table_static needs repeats >= 1, warmup_rounds >= 0 and every n >= 1; got "
                         f"{repeats}, {warmup_rounds}, {ns}")
    device = model.device
    if cuda_graphs and device.type != "cuda":
        raise ValueError(f"cuda_graphs needs the model on a CUDA device; it is on {device}")
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = torch.randint(0, vocab, (1, prefix_len + max(ns)), generator=generator).to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with torch.inference_mode():
        cache = StaticCache(config=model.config, max_cache_len=prefix_len + max(ns))
        model(input_ids=ids[:, :prefix_len], past_key_values=cache, use_cache=True, logits_to_keep=1,
              cache_position=torch.arange(prefix_len, device=device))

        def step(n):  # rewind the cache to the prefix, then one forward of n tokens at positions prefix_len + i
            _rewind_static_cache(cache, prefix_len)
            pos = positions[n]
            return model(input_ids=new_ids[n], past_key_values=cache, use_cache=True, logits_to_keep=n,
                         position_ids=pos.unsqueeze(0), cache_position=pos).logits

        new_ids = {n: ids[:, prefix_len:prefix_len + n].clone() for n in ns}
        positions = {n: torch.arange(prefix_len, prefix_len + n, device=device) for n in ns}
        calls, max_diff = {}, None
        if cuda_graphs:
            max_diff = 0.0
            for n in ns:
                side = torch.cuda.Stream(device)
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side):
                    for _ in range(3):
                        eager = step(n).float()
                torch.cuda.current_stream(device).wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out = step(n)
                graph.replay()
                sync()
                max_diff = max(max_diff, float((out.float() - eager).abs().max()))
                calls[n] = graph.replay
        else:
            for n in ns:
                calls[n] = (lambda k: (lambda: step(k)))(n)
        times: dict[int, list[float]] = {n: [] for n in ns}
        for r in range(int(warmup_rounds) + int(repeats)):
            for n in ns:
                sync()
                t0 = time.perf_counter()
                calls[n]()
                sync()
                if r >= int(warmup_rounds):
                    times[n].append(1000 * (time.perf_counter() - t0))
    return _cost_frame(times), max_diff



def _rewind_static_cache(cache, length: int) -> None:
    """Set every layer of a transformers ``StaticCache`` back to ``length`` filled positions. Recent transformers
    keep the fill level as a device tensor (``cumulative_length``, advanced in place by each update; rewound in place
    here, so a CUDA graph can capture the rewind); older ones write at the ``cache_position`` the forward is given and
    need no rewind."""
    for layer in getattr(cache, "layers", ()):
        level = getattr(layer, "cumulative_length", None)
        if isinstance(level, torch.Tensor):
            level.fill_(length)
        elif level is not None:
            layer.cumulative_length = length


@torch.inference_mode()
def measure_draft_step_ms(drafter, vocab: int, prefix_len: int = 200, repeats: int = 5,
                          generator: torch.Generator | None = None, sampling=None, warmup: int = 10,
                          text: torch.Tensor | None = None) -> float:
    """Median time of one drafted token of ``drafter`` (ms): ``propose(ids, 1)`` after a ``prefix_len``-token prefix
    whose draft KV cache is already filled, so each timed call is one forward of the draft over one new token plus
    its head, its logits processing under ``sampling`` and its draw (t_draft(1) of the cost model,
    :mod:`specrepro.theory`).

    Under top-p the processing's cost depends on the distribution: :func:`specrepro.core.sampling.logits_to_probs` ranks
    only the few hundred likeliest tokens when they hold ``top_p`` of the mass (real text) and sorts the whole
    vocabulary when they do not, as after many random prefixes, where the draft's distribution is flat (int8 Qwen2.5
    0.5B draft, T = 0.8, top-p 0.95, 2-core AVX-512 CPU: 34 ms per token after one random prefix, 20-21 ms after
    another and along HumanEval prompts). Pass the workload's own token ids as ``text`` to time what a run pays: each
    call then moves one token further along the text (the cache holds the tokens before it), so the timed calls see
    real, different positions.

    Args:
        drafter: a :mod:`specrepro.drafters` drafter with a KV-cached model (draft model, pruned head, int8, or a
            :class:`~specrepro.drafters.model.BlockLMDrafter` of a llama.cpp draft).
        vocab: ids are drawn from [0, vocab).
        prefix_len: length of the random prefix (tokens); repeats: timed calls after ``warmup`` untimed ones (the
            first forwards after the prefill run slow on a CPU: see :func:`specrepro.measure.cost.measure_cost_curve`).
        generator: draws the random prefix (when no ``text``) and, under sampling, the drafted tokens.
        sampling: the :class:`~specrepro.core.sampling.SamplingConfig` the run drafts under (a top-p run ranks tokens for
            every drafted token, which a greedy measurement would leave out); None = greedy.
        text: token ids (long tensor [L]) of real text, repeated end to end when shorter than
            ``prefix_len + warmup + repeats + 1``; None = random ids in [0, vocab) (and the same position each call).

    Returns:
        milliseconds (float).
    """
    from specrepro.core.sampling import GREEDY

    sampling = GREEDY if sampling is None else sampling
    calls = int(warmup) + int(repeats)
    if text is None:  # one random prefix; each call re-drafts its last position (the cache is cropped back)
        ids = torch.randint(0, vocab, (prefix_len + 1,), generator=generator)
        prefixes = [ids] * (calls + 1)
    else:  # real text: each call drafts the next position (the cache already holds the tokens before it)
        text = torch.as_tensor(text, dtype=torch.long).reshape(-1).cpu()
        if text.numel() == 0:
            raise ValueError("measure_draft_step_ms: text is empty")
        need = prefix_len + calls + 1
        ids = text.repeat(-(-need // text.numel()))[:need]
        prefixes = [ids[:prefix_len + 1 + i] for i in range(calls + 1)]
    drafter.reset()
    drafter.propose(prefixes[0], 1, sampling, generator)  # fills the cache with the prefix
    for i in range(int(warmup)):
        drafter.propose(prefixes[1 + i], 1, sampling, generator)
    times = []
    for i in range(int(warmup), calls):
        t0 = time.perf_counter()
        drafter.propose(prefixes[1 + i], 1, sampling, generator)  # one new token through the draft each time
        times.append(1000.0 * (time.perf_counter() - t0))
    drafter.reset()
    times.sort()
    return float(times[len(times) // 2])


def measure_chain_costs(target, drafters: dict, ns: Sequence[int], vocab: int, prefix_len: int = 200,
                        repeats: int = 3, rounds: int = 3, generator: torch.Generator | None = None, sampling=None,
                        text: torch.Tensor | None = None):
    """The costs of Leviathan's model with measured curves, robust to a machine whose speed drifts.

    The target's KV-cached forward time over each n in ``ns`` new tokens (:func:`specrepro.measure.cost.measure_cost_curve`)
    and each drafter's time per drafted token (:func:`measure_draft_step_ms` under ``sampling``, along ``text`` when
    given), on ``prefix_len``-token prefixes: ``rounds`` passes over every point and every drafter (each pass warms
    up before it times: the first forwards after loading and after a prefill run slow), and the median over the
    rounds (a drift during the measurement then hits every point alike instead of bending the curve).

    Any backend: ``target`` may be a transformers causal LM or a :class:`~specrepro.core.blocklm.BlockLM` (e.g.
    llama.cpp's :class:`~specrepro.backends.llamacpp.LlamaCppLM`, timed through ``forward_block`` and ``truncate``,
    :func:`measure_cost_table`), and a drafter anything with ``propose``/``reset`` (e.g.
    :class:`~specrepro.drafters.model.BlockLMDrafter` of a llama.cpp draft).

    Args:
        target: a transformers causal LM or a BlockLM; drafters: label -> drafter; ns: token counts of the target
        curve; vocab: random ids are drawn from [0, vocab) (the drafters'; a BlockLM target draws from its own
        ``vocab_size``); repeats: timed calls per point and round (after a warm-up);
        generator: seeds the random ids (the cost of a dense forward does not depend on them) and draws.
        text: real token ids (long tensor [L]) the drafters are timed along (their top-p processing costs depend
            on the distribution, see :func:`measure_draft_step_ms`); None = random ids.

    Returns:
        ``(CostCurve, {label: ms per drafted token})``, times in ms.

    Raises:
        ValueError: ``rounds`` or ``repeats`` < 1, or ``ns`` empty.
    """
    import numpy as np

    from specrepro.theory import CostCurve

    if int(rounds) < 1 or int(repeats) < 1 or not len(ns):
        raise ValueError(f"measure_chain_costs needs rounds >= 1, repeats >= 1 and some ns; got {rounds}, {repeats}, "
                         f"{list(ns)}")
    ns = tuple(int(n) for n in ns)
    curves, drafts = [], {label: [] for label in drafters}
    for _ in range(int(rounds)):
        curves.append(measure_cost_curve(target, ns=ns, prefix_len=prefix_len, repeats=int(repeats),
                                         generator=generator).ms)
        for label, drafter in drafters.items():
            drafts[label].append(measure_draft_step_ms(drafter, vocab, prefix_len=prefix_len, repeats=int(repeats),
                                                       generator=generator, sampling=sampling, text=text))
    curve = CostCurve(list(ns), list(np.median(np.stack(curves), axis=0)))
    return curve, {label: float(np.median(v)) for label, v in drafts.items()}


def measure_call_ms(fn, repeats: int = 5, warmup: int = 1, device: str | torch.device = "cpu") -> float:
    """The median wall time of ``fn()`` in ms over ``repeats`` timed calls after ``warmup`` untimed ones, each timed
    by the harness's :func:`specrepro.measure.harness.timed_call` (CUDA synchronized) under ``torch.inference_mode``.
    Used for a module's cost per decoding step (e.g. Medusa heads on one hidden state).

    Raises:
        ValueError: ``repeats`` < 1 or ``warmup`` < 0.
    """
    from specrepro.measure.harness import timed_call

    if int(repeats) < 1 or int(warmup) < 0:
        raise ValueError(f"measure_call_ms needs repeats >= 1 and warmup >= 0; got {repeats}, {warmup}")
    times = []
    with torch.inference_mode():
        for i in range(int(warmup) + int(repeats)):
            _, seconds = timed_call(fn, device)
            if i >= int(warmup):
                times.append(1000.0 * seconds)
    return float(np.median(times))


def measure_forward_ms(repeats: int = 5, prefix_len: int = 128, seed: int = 0) -> float:
    """The median (ms) over ``repeats`` calls of one KV-cached one-token forward, after a ``prefix_len``-token prefix,
    float32 on this CPU, of a random-weight model with the architecture of the zoo's 1.5B target
    (Qwen2.5-Coder-1.5B): the real model's arithmetic, loaded in seconds without a download.

    Raises:
        ValueError: repeats < 1 or prefix_len < 1.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if repeats < 1 or prefix_len < 1:
        raise ValueError(f"repeats and prefix_len must be >= 1, got {repeats}, {prefix_len}")
    gen = torch.Generator().manual_seed(seed)
    cfg = Qwen2Config(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                      num_key_value_heads=2, vocab_size=151936, max_position_embeddings=4096, tie_word_embeddings=True)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(cfg)
    model = model.to_empty(device="cpu").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02, generator=gen)
        ids = torch.randint(0, cfg.vocab_size, (1, prefix_len + 1), generator=gen)
        times = []
        for _ in range(repeats + 1):  # the first call warms up
            out = model(ids[:, :prefix_len], use_cache=True)
            t0 = time.perf_counter()
            model(ids[:, prefix_len:], past_key_values=out.past_key_values, use_cache=True)
            times.append(1000 * (time.perf_counter() - t0))
    return float(np.median(times[1:]))
