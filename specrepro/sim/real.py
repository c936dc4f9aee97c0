"""The exactness checks on real models: greedy identity with near-tie explanations, and verification rules compared
on the same drafts.
"""

from __future__ import annotations

import torch

from specrepro.core.sampling import SamplingConfig

__all__ = ["greedy_divergence", "compare_verification", "greedy_equality", "logit_spacing", "explain_divergence"]


def _first_difference(a, b) -> int | None:
    """The first index where token lists ``a`` and ``b`` differ on their common length; None if they agree there."""
    return next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)


def greedy_divergence(model, prompt_ids: torch.Tensor, a: list[int], b: list[int]):
    """Where two greedy outputs for the same prompt first differ, and the target's top-2 logit gap there.

    Batched verification and single-token decoding take different floating-point paths, so a near-tie between the
    two most likely tokens can flip. Returns None if ``a`` and ``b`` agree on their common length, else
    ``(index, gap)`` with gap = logit(top-1) − logit(top-2) computed by one full forward pass over prompt + a[:index].
    """
    idx = _first_difference(a, b)
    if idx is None:
        return None
    ids = torch.cat([prompt_ids.reshape(-1), torch.tensor(a[:idx], dtype=torch.long)]).to(model.device)
    with torch.inference_mode():
        logits = model(input_ids=ids[None]).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    return idx, float(top[0] - top[1])


def logit_spacing(value: float, dtype: torch.dtype) -> float:
    """The gap between adjacent numbers of ``dtype`` at the magnitude of ``value`` (one unit in the last place):
    ``eps * 2**floor(log2 |value|)``, e.g. 0.125 for a bfloat16 logit of 20 and 2e-6 for a float32 one."""
    import math

    eps = torch.finfo(dtype).eps
    v = abs(float(value))
    return eps * 2.0 ** math.floor(math.log2(v)) if v > 0 and math.isfinite(v) else eps


@torch.inference_mode()
def explain_divergence(model, prompt_ids: torch.Tensor, ar: list[int], other: list[int], *,
                       tie_bound: float = 1e-3, tie_spacings: float = 2.0) -> dict | None:
    """Why a greedy output ``other`` left greedy AR's ``ar`` for the same prompt: the two tokens' logits where they
    first differ, by two exact paths, against a near-tie bound fixed in advance.

    At the first differing index i, with a = ar[i] (AR's token) and b = other[i]:

    - ``gap``: logit(a) - logit(b) from one full forward over prompt + ar[:i] (a batched path, as verification);
    - ``gap_incremental``: the same from AR's own path (the prompt's KV cache, then one token per forward, as
      :func:`specrepro.core.decoding.generate` decodes), which chose a, so it is >= 0;
    - the bound: max(``tie_bound``, ``tie_spacings`` x the spacing of the model's dtype at the larger of the two
      logits, :func:`logit_spacing`). In float32 the absolute bound rules; in bfloat16 (8 significant bits) a logit
      near 20 is only known to 0.125, so two paths that round differently can swap two tokens a spacing or two apart.

    A divergence is *explained* (a near-tie) when |gap| is within the bound; otherwise it is a failure to look at.

    Args:
        model: a transformers causal LM; prompt_ids: long [L]; ar, other: greedy continuations (token ids).
        tie_bound: absolute bound (logit units); tie_spacings: bound in spacings of the model's dtype.

    Returns:
        None when ``other`` agrees with ``ar`` on their common length, else a dict: diverged_at, ar_token,
        other_token, logit_ar_token, logit_other_token, gap, gap_incremental, spacing, bound, explained.
    """
    from specrepro.core.decoding import prefill

    idx = _first_difference(ar, other)
    if idx is None:
        return None
    dev = model.device
    prompt = prompt_ids.reshape(-1).to(dev)
    prefix = torch.cat([prompt, torch.tensor(ar[:idx], dtype=torch.long, device=dev)])
    a, b = int(ar[idx]), int(other[idx])
    full = model(input_ids=prefix[None]).logits[0, -1]
    cache = prefill(model, prompt)
    for t in prefix[prompt.numel() - 1:]:
        inc = model(input_ids=t.view(1, 1), past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
    la, lb = float(full[a]), float(full[b])
    spacing = logit_spacing(max(abs(la), abs(lb)), full.dtype)
    bound = max(float(tie_bound), float(tie_spacings) * spacing)
    gap = la - lb
    return {"diverged_at": idx, "ar_token": a, "other_token": b, "logit_ar_token": la, "logit_other_token": lb,
            "gap": gap, "gap_incremental": float(inc[a]) - float(inc[b]), "spacing": spacing, "bound": bound,
            "explained": bool(abs(gap) <= bound)}


def compare_verification(target, drafter, prompts, *, gamma: int = 4, max_new_tokens: int = 64,
                         sampling: SamplingConfig = SamplingConfig(1.0), seed: int = 0, eos_token_id=None,
                         rules=("token", "block")):
    """Measured tokens per step of token vs block verification through :func:`specrepro.core.decoding.generate`.

    Every (prompt, rule) pair starts from the same seed (``torch.Generator().manual_seed(seed + prompt index)``),
    so the two rules see the same draft model and prompts; the draws differ (each rule consumes randomness
    differently). Only counts are measured (no timing).

    Args:
        target: a transformers causal LM; drafter: a :mod:`specrepro.drafters` drafter (e.g.
            ``DraftModelDrafter(draft, vocab)``); prompts: long [L] tensors.

    Returns:
        pandas.DataFrame, one row per (rule, prompt): rule, prompt, tokens, steps, tokens_per_step, alpha,
        accepted_per_step.
    """
    import pandas as pd

    from specrepro.core.decoding import generate

    rows = []
    for rule in rules:
        for i, ids in enumerate(prompts):
            g = torch.Generator(device=getattr(target, "device", "cpu")).manual_seed(seed + i)
            out = generate(target, ids, drafter=drafter, gamma=gamma, max_new_tokens=max_new_tokens,
                           sampling=sampling, generator=g, eos_token_id=eos_token_id, verification=rule)
            rows.append({"rule": rule, "prompt": i, "tokens": len(out.tokens), "steps": out.n_steps,
                         "tokens_per_step": out.tokens_per_step, "alpha": out.alpha,
                         "accepted_per_step": sum(out.accepted) / max(1, out.n_steps)})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------------------------
# Greedy equality at scale
# ----------------------------------------------------------------------------------------------------------------

def greedy_equality(target, prompts, run_speculative, *, max_new_tokens: int = 128, tie_bound: float = 1e-3,
                    eos_token_id=None, progress: bool = False, checkpoint=None, checkpoint_key=None,
                    row_info: dict | None = None):
    """Speculative vs autoregressive greedy decoding over many prompts, every divergence explained or counted.

    For each prompt: AR greedy (:func:`specrepro.core.decoding.generate` without a drafter) and ``run_speculative(ids)``
    (any greedy speculative runner returning a GenerationResult or a token list). Equal outputs pass. At the first
    differing position, :func:`greedy_divergence` measures the target's top-2 logit gap teacher-forced on the AR
    prefix (one full forward pass); a gap below ``tie_bound`` is an *explained* near-tie (batched verification and
    one-token decoding take different floating-point paths, which can flip a near-tie), anything else a *failure*.

    Args:
        target: a transformers causal LM; prompts: long [L] tensors; run_speculative: ``f(ids) -> result``.
        tie_bound: the largest top-2 logit gap (logit units) accepted as a float near-tie.
        checkpoint: a JSON file rewritten atomically after every prompt, so that an interrupted run (hours for a
            whole workload on a CPU) resumes at the first prompt it had not finished; None: no checkpoint. The
            caller deletes it once the table is saved.
        checkpoint_key: JSON-serialisable conditions the saved rows must share with this run (models, settings,
            machine, code): a checkpoint saved under another key is set aside
            (:func:`specrepro.files.load_keyed_checkpoint`) and the run starts afresh.
        row_info: JSON-serialisable columns added to every row this run decodes (e.g. the commit and CPU of this
            sitting, when a checkpoint spreads the prompts over several): rows resumed from the checkpoint keep
            those of the sitting that decoded them.

    Returns:
        pandas.DataFrame, one row per prompt: prompt, ar_tokens, spec_tokens, identical, diverged_at, top2_gap,
        explained (a near-tie below tie_bound), failure, seconds (that prompt's wall time, s), then the
        ``row_info`` columns; ``df.attrs`` holds
        tie_bound, seconds (the sum over prompts, resumed ones included) and resumed (prompts read from the
        checkpoint).
    """
    import time

    import pandas as pd

    from specrepro.core.decoding import generate
    from specrepro.files import resumable_rows

    def one(i):
        ids = prompts[i]
        t0 = time.perf_counter()
        ar = generate(target, ids, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id).tokens
        out = run_speculative(ids)
        spec = list(out.tokens if hasattr(out, "tokens") else out)
        div = greedy_divergence(target, ids, ar, spec)
        identical = div is None and len(ar) == len(spec)
        at, gap = (None, float("nan")) if div is None else div
        explained = div is not None and gap < tie_bound
        return {"ar_tokens": len(ar), "spec_tokens": len(spec), "identical": bool(identical), "diverged_at": at,
                "top2_gap": float(gap), "explained": bool(explained), "failure": bool(not identical and not explained),
                "seconds": time.perf_counter() - t0}

    rows, resumed = resumable_rows(len(prompts), one, checkpoint=checkpoint, key=checkpoint_key,
                                   what="greedy-equality checkpoint", row_info=row_info,
                                   progress="greedy equality" if progress else None, index="prompt")
    df = pd.DataFrame(rows)
    df.attrs["tie_bound"] = tie_bound
    df.attrs["seconds"] = float(df["seconds"].sum()) if len(df) else 0.0
    df.attrs["resumed"] = resumed
    return df
