"""The acceptance rate α measured on real models, teacher-forced along a target-generated sequence.

What it is not: the closed forms in α (:mod:`specrepro.theory`).
"""

from __future__ import annotations

__all__ = ["target_probs_along", "measure_alpha"]


def target_probs_along(target, ids, prompt_len: int, sampling):
    """The target's processed next-token distributions along a sequence, teacher-forced in one forward pass.

    Args:
        target: causal LM; ids: long [L], prompt then generated tokens; prompt_len: prompt tokens (>= 1);
        sampling: the SamplingConfig applied (T = 0 gives one-hot argmax rows).

    Returns:
        float [L - prompt_len, V] on the CPU: row i is the distribution of token ``ids[prompt_len + i]``.
    """
    import torch

    from specrepro.core.sampling import logits_to_probs

    ids = ids.reshape(-1)
    with torch.inference_mode():
        logits = target(input_ids=ids[None].to(target.device)).logits[0, prompt_len - 1: -1]
        return logits_to_probs(logits, sampling).cpu()


def measure_alpha(target, drafter, ids, prompt_len: int, sampling, target_probs=None) -> list[float]:
    """Teacher-forced α terms along a given sequence: Σ_x min(p_t(x), q_t(x)) at every generated position t.

    Leviathan's α is an expectation over contexts drawn from the target; pass a sequence the target generated
    (AR or, equivalently, exact speculative sampling) at the same ``sampling`` settings. One target forward pass
    scores every position, so this is far cheaper than decoding once per drafter.

    Args:
        target: causal LM.
        drafter: a :mod:`specrepro.drafters` drafter. Draft models (int8 copies and pruned heads included) are
            scored with one forward pass; n-gram drafts from their tables; prompt lookup (point masses) gives
            p_t(x_t) where it proposes x_t and nothing where it proposes nothing; a hybrid drafter gives p_t(x_t)
            where its lookup proposes and its model's term elsewhere; an auto-γ drafter is scored as the drafter it
            wraps.
        ids: long [L], prompt followed by the generated tokens.
        prompt_len: number of prompt tokens; positions prompt_len..L-1 are scored.
        sampling: the SamplingConfig applied to both distributions (T = 0 gives argmax agreement).
        target_probs: optional float [L - prompt_len, V] on the CPU, the target's processed distributions at the
            scored positions (:func:`target_probs_along`), to score several drafters with one target forward.

    Returns:
        list of α terms (floats in [0, 1]), one per scored position.

    Raises:
        ValueError: ``target_probs`` of the wrong shape. TypeError: a drafter type it does not know.
    """
    import torch

    from specrepro.core.sampling import fit_width, logits_to_probs
    from specrepro.drafters.adaptive import AutoGammaDrafter
    from specrepro.drafters.lookup import (
        HybridDrafter,
        NGramDrafter,
        PromptLookupDrafter,
)
    from specrepro.drafters.model import DraftModelDrafter

    ids = ids.reshape(-1)
    if isinstance(drafter, AutoGammaDrafter):  # α does not depend on the draft length
        return measure_alpha(target, drafter.drafter, ids, prompt_len, sampling, target_probs)
    with torch.inference_mode():
        if target_probs is None:
            p = target_probs_along(target, ids, prompt_len, sampling)
        elif target_probs.shape[0] != ids.numel() - prompt_len:
            raise ValueError(f"measure_alpha: target_probs has {target_probs.shape[0]} rows for "
                             f"{ids.numel() - prompt_len} scored positions")
        else:
            p = target_probs
        width = p.shape[-1]
        if isinstance(drafter, HybridDrafter):  # p(x) where lookup proposes x, the model's term elsewhere
            model_terms = measure_alpha(target, drafter.model, ids, prompt_len, sampling, p)
            terms = []
            for i, t in enumerate(range(prompt_len, ids.numel())):
                prop = drafter.lookup.propose(ids[:t].cpu(), 1, sampling, None)
                terms.append(float(p[i, int(prop.tokens[0])]) if prop.tokens.numel() else model_terms[i])
            return terms
        if hasattr(drafter, "teacher_forced_probs"):  # e.g. PrunedHeadDrafter
            q = drafter.teacher_forced_probs(ids, prompt_len, sampling)
            return torch.minimum(p, q).sum(-1).clamp(max=1.0).tolist()  # rounding may pass 1 when q = p
        if isinstance(drafter, DraftModelDrafter):
            dl = drafter.model(input_ids=ids[None].to(drafter.model.device)).logits[0, prompt_len - 1: -1]
            q = logits_to_probs(fit_width(dl, width), sampling).cpu()
            return torch.minimum(p, q).sum(-1).clamp(max=1.0).tolist()  # rounding may pass 1 when q = p
        if isinstance(drafter, NGramDrafter):
            terms = []
            for i, t in enumerate(range(prompt_len, ids.numel())):
                q = logits_to_probs(fit_width(drafter.distribution(int(ids[t - 1])).log(), width), sampling)
                terms.append(min(1.0, float(torch.minimum(p[i], q).sum())))
            return terms
        if isinstance(drafter, PromptLookupDrafter):
            terms = []
            for i, t in enumerate(range(prompt_len, ids.numel())):
                prop = drafter.propose(ids[:t].cpu(), 1, sampling, None)
                if prop.tokens.numel():
                    terms.append(float(p[i, int(prop.tokens[0])]))
            return terms
    raise TypeError(f"measure_alpha does not know drafter type {type(drafter).__name__}")
