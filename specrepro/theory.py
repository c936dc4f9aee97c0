"""The analysis of speculative decoding (Leviathan et al. 2023, Sec. 3) and a hardware-aware cost model.

What this file is: closed forms for the acceptance rate α, the expected number of tokens per target call, the
walltime improvement and the arithmetic-operations factor, the optimal γ, plus a cost model that replaces
Leviathan's constant cost ratio c and flat verification cost with measured cost curves t_target(n) and t_draft(n)
(the time of one KV-cached forward pass over n new tokens). On a small CPU a 4-token verification can cost twice a
1-token step, which the constant-c model cannot see.

What it is not: a simulator of the sampler (see :mod:`specrepro.core.sampling` and the tests) or a timer (the measured
curves come from :func:`measure_cost_curve` or from the decoding loop's ``forward_sizes`` / ``target_times``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

__all__ = ["acceptance_alpha", "expected_tokens", "walltime_improvement", "operations_factor", "optimal_gamma", "CostCurve", "hardware_aware_speedup", "optimal_gamma_hardware", "free_draft_bound", "with_prefill", "speedup_decomposition", "step_costs_ms", "gamma_for_step",
           "alpha_from_acceptance_rate"]


def acceptance_alpha(p, q) -> float:
    """α = E[Σ_x min(p(x), q(x))] = 1 - E[D_TV(p, q)] (Leviathan Def. 3.1, Thm 3.8).

    Args:
        p, q: arrays/tensors [..., V] of target and draft distributions (rows are contexts); the mean over rows is
            returned.
    """
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    return float(np.minimum(p, q).sum(-1).mean())


def _check(alpha, gamma):
    alpha = np.asarray(alpha, dtype=np.float64)
    if np.any((alpha < 0) | (alpha > 1)):
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    if np.any(np.asarray(gamma) < 0):
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    return alpha


def expected_tokens(alpha, gamma):
    """E[tokens per target call] = (1 - α^(γ+1)) / (1 - α) (Leviathan Eq. 1); γ + 1 at α = 1. Broadcasts."""
    alpha = _check(alpha, gamma)
    gamma = np.asarray(gamma, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(alpha < 1, (1 - alpha ** (gamma + 1)) / np.where(alpha < 1, 1 - alpha, 1.0), gamma + 1)
    return out if out.ndim else float(out)


def walltime_improvement(alpha, gamma, c):
    """Expected walltime improvement (1 - α^(γ+1)) / ((1 - α)(γc + 1)) (Leviathan Thm 3.8); c = t_draft / t_target."""
    if np.any(np.asarray(c) < 0):
        raise ValueError(f"cost coefficient c must be >= 0, got {c}")
    out = np.asarray(expected_tokens(alpha, gamma)) / (np.asarray(gamma) * np.asarray(c) + 1)
    return out if out.ndim else float(out)


def operations_factor(alpha, gamma, c_hat=0.0):
    """Expected factor of arithmetic operations (1 - α)(γĉ + γ + 1) / (1 - α^(γ+1)) (Leviathan Thm 3.11)."""
    out = (np.asarray(gamma) * np.asarray(c_hat) + np.asarray(gamma) + 1) / np.asarray(expected_tokens(alpha, gamma))
    return out if out.ndim else float(out)


def optimal_gamma(alpha: float, c: float, max_gamma: int = 64) -> int:
    """The integer γ in [1, max_gamma] maximizing :func:`walltime_improvement` (Leviathan Sec. 3.5, numerically)."""
    gammas = np.arange(1, max_gamma + 1)
    return int(gammas[np.argmax(walltime_improvement(alpha, gammas, c))])


@dataclass
class CostCurve:
    """Measured time of one forward pass over n new tokens: points (n_i, ms_i), linearly interpolated (ms).

    Beyond the last point the curve is extrapolated with the last segment's slope, floored at 0: a forward over more
    tokens than were measured is never predicted cheaper than the last measured one (a noisy last segment that falls
    would otherwise predict negative costs a few tokens out).
    """

    n: Sequence[float]
    ms: Sequence[float]

    def __post_init__(self):
        order = np.argsort(self.n)
        self.n = np.asarray(self.n, dtype=np.float64)[order]
        self.ms = np.asarray(self.ms, dtype=np.float64)[order]
        if len(self.n) == 0:
            raise ValueError("a cost curve needs at least one measured point")

    def __call__(self, n):
        n = np.asarray(n, dtype=np.float64)
        out = np.interp(n, self.n, self.ms)
        if len(self.n) >= 2:
            slope = max(0.0, (self.ms[-1] - self.ms[-2]) / (self.n[-1] - self.n[-2]))
            out = np.where(n > self.n[-1], self.ms[-1] + slope * (n - self.n[-1]), out)
        return out if out.ndim else float(out)

    @classmethod
    def constant_ratio(cls, c: float, ms: float = 1.0) -> "CostCurve":
        """A flat curve (verification cost independent of n): Leviathan's model with t = ms."""
        return cls([1, 2], [ms * c, ms * c]) if c else cls([1, 2], [0.0, 0.0])


def hardware_aware_speedup(alpha, gamma: int, t_target: Callable, t_draft: Callable | None, overhead_ms: float = 0.0,
                           ar_overhead_ms: float = 0.0):
    """Predicted speedup over AR with measured cost curves.

    speedup = E[tokens](α, γ) · (t_target(1) + o_AR) / (γ · t_draft(1) + t_target(γ + 1) + o_SD)

    With t_target flat and t_draft = c · t_target this is exactly Leviathan's walltime improvement.

    Args:
        alpha: acceptance rate α in [0, 1].
        gamma: draft length γ >= 0 (0 = AR).
        t_target, t_draft: callables n -> ms (e.g. :class:`CostCurve`); t_draft None for free drafts (n-gram).
        overhead_ms: per-step time outside the forward passes (sampling, verification, cache cropping), o_SD.
        ar_overhead_ms: the same for an AR step, o_AR.
    """
    draft = 0.0 if (t_draft is None or gamma == 0) else gamma * float(t_draft(1))
    step = draft + float(t_target(gamma + 1)) + overhead_ms
    return float(expected_tokens(alpha, gamma)) * (float(t_target(1)) + ar_overhead_ms) / step


def optimal_gamma_hardware(alpha: float, t_target: Callable, t_draft: Callable | None, max_gamma: int = 16,
                           overhead_ms: float = 0.0) -> int:
    """The γ in [1, max_gamma] maximizing :func:`hardware_aware_speedup`."""
    best = max(range(1, max_gamma + 1),
               key=lambda g: hardware_aware_speedup(alpha, g, t_target, t_draft, overhead_ms))
    return int(best)


def free_draft_bound(alpha, gamma: int, t_target: Callable, overhead_ms: float = 0.0,
                     ar_overhead_ms: float = 0.0) -> float:
    """The speedup over AR a draft that costs nothing would give: same α, same verification curve, t_draft = 0.

    bound = E[tokens](α, γ) · (t_target(1) + o_AR) / (t_target(γ + 1) + o_SD)

    This is :func:`hardware_aware_speedup` with ``t_draft=None``: the ceiling any cheaper draft of the same acceptance
    rate can reach at this γ on this hardware. Between it and the hardware-aware prediction lies the draft's cost;
    between it and E[tokens] (Leviathan's c = 0 limit, a flat verification cost) lies the cost of verifying γ + 1
    tokens instead of one.

    Args:
        alpha: acceptance rate α in [0, 1] (Leviathan Def. 3.1).
        gamma: draft length γ >= 0 (0 gives 1 with no overheads).
        t_target: callable n -> ms, the target's forward time over n new tokens (e.g. :class:`CostCurve`).
        overhead_ms, ar_overhead_ms: per-step time outside the forward passes of a speculative / AR step, ms.

    Returns:
        the predicted speedup (float, dimensionless).

    Raises:
        ValueError: α outside [0, 1] or γ < 0.
    """
    return hardware_aware_speedup(alpha, gamma, t_target, None, overhead_ms, ar_overhead_ms)


def with_prefill(speedup: float, prefill_ms: float, new_tokens: float, ar_step_ms: float) -> float:
    """A per-step speedup turned into the speedup of a whole request, whose prompt prefill both methods pay alike.

    A request is one prefill forward over the prompt (``prefill_ms``, the same for AR and speculative decoding) and
    then ``new_tokens`` decoded tokens. AR spends ``new_tokens · ar_step_ms`` on them; a method ``speedup`` times
    faster per token spends that divided by ``speedup`` (Amdahl's law with the prefill as the serial part):

        request speedup = (P + N · t_AR) / (P + N · t_AR / S)

    :func:`hardware_aware_speedup` predicts S for the decoding loop alone; the bench measures whole requests (the
    timer starts before the prefill), so the prediction a measurement is compared with is this one. It lies between
    1 and S, nearer 1 the longer the prompt is against the generation.

    Args:
        speedup: S, the per-token speedup of the decoding loop (> 0).
        prefill_ms: P, the prompt's prefill forward, ms (>= 0).
        new_tokens: N, generated tokens (> 0).
        ar_step_ms: t_AR, one AR decoding step, ms (> 0), e.g. t_target(1) of the measured cost curve.

    Returns:
        the whole-request speedup (float, dimensionless).

    Raises:
        ValueError: a non-positive ``speedup``, ``new_tokens`` or ``ar_step_ms``, or a negative ``prefill_ms``.
    """
    s, p, n, t = float(speedup), float(prefill_ms), float(new_tokens), float(ar_step_ms)
    if not (s > 0 and n > 0 and t > 0 and p >= 0):
        raise ValueError(f"with_prefill needs speedup > 0, new_tokens > 0, ar_step_ms > 0 and prefill_ms >= 0; got "
                         f"{speedup}, {new_tokens}, {ar_step_ms}, {prefill_ms}")
    decode = n * t
    return (p + decode) / (p + decode / s)


def speedup_decomposition(alpha, gamma: int, t_target: Callable, t_draft: Callable | None, overhead_ms: float = 0.0,
                          ar_overhead_ms: float = 0.0) -> dict:
    """The ladder from Leviathan's ideal to the hardware-aware prediction, one cost at a time.

    Returns:
        dict of speedups over AR (floats):

        * ``tokens_per_step``: E[tokens](α, γ) (Leviathan Eq. 1): free draft and a verification as cheap as one step;
        * ``free_draft``: :func:`free_draft_bound`, the measured verification curve t_target(γ + 1), no overheads;
        * ``hardware_aware``: :func:`hardware_aware_speedup` with the draft's cost γ · t_draft(1), no overheads;
        * ``with_overhead``: the same with the per-step overheads (``overhead_ms``, ``ar_overhead_ms``, ms).

        The drops between consecutive entries are the shares of the gap due to verification, the draft and the
        loop's overhead; a measured speedup below ``with_overhead`` is unexplained by the model.
    """
    return {
        "tokens_per_step": float(expected_tokens(alpha, gamma)),
        "free_draft": free_draft_bound(alpha, gamma, t_target),
        "hardware_aware": hardware_aware_speedup(alpha, gamma, t_target, t_draft),
        "with_overhead": hardware_aware_speedup(alpha, gamma, t_target, t_draft, overhead_ms, ar_overhead_ms),
    }


def step_costs_ms(t_target: Callable, t_draft, max_gamma: int, overhead_ms: float = 0.0) -> np.ndarray:
    """The time of one speculative step for each draft length: cost[γ] = t_target(γ + 1) + γ · t_draft(1) + o (ms).

    Args:
        t_target: callable n -> ms; t_draft: callable n -> ms, a number (ms per drafted token) or None (free draft).
        max_gamma: the largest γ (>= 0); overhead_ms: per-step time outside the forward passes.

    Returns:
        float64 [max_gamma + 1], entry γ for γ = 0..max_gamma (entry 0 is an AR step).

    Raises:
        ValueError: max_gamma < 0, or a cost that is not positive and finite.
    """
    if int(max_gamma) != max_gamma or max_gamma < 0:
        raise ValueError(f"max_gamma must be an integer >= 0, got {max_gamma!r}")
    per_token = 0.0 if t_draft is None else float(t_draft(1) if callable(t_draft) else t_draft)
    gammas = np.arange(int(max_gamma) + 1)
    costs = np.array([float(t_target(int(g) + 1)) for g in gammas]) + gammas * per_token + float(overhead_ms)
    if not np.all(np.isfinite(costs)) or np.any(costs <= 0) or per_token < 0:
        raise ValueError(f"step costs must be positive and finite (ms), got {costs.tolist()} "
                         f"(draft {per_token} ms per token)")
    return costs


def gamma_for_step(alpha: float, costs_ms, min_gamma: int = 1) -> int:
    """The draft length of the next step that maximizes expected tokens per unit time (a per-step γ choice).

    γ* = argmax over γ in [min_gamma, len(costs_ms) - 1] of E[tokens](α, γ) / cost[γ], with E[tokens] =
    (1 - α^(γ+1)) / (1 - α) (Leviathan Eq. 1) and cost[γ] = t_target(γ + 1) + γ t_draft(1) (+ overhead) from
    :func:`step_costs_ms`: :func:`optimal_gamma_hardware`'s criterion, evaluated with the running estimate of α at
    each step. Ties go to the smaller γ.

    Args:
        alpha: the current estimate of α in [0, 1].
        costs_ms: float [G + 1], cost of a step with γ draft tokens (ms), γ = 0..G.
        min_gamma: the smallest γ allowed (>= 0, <= G).

    Returns:
        int γ*.

    Raises:
        ValueError: α outside [0, 1], or min_gamma outside [0, G].
    """
    costs = np.asarray(costs_ms, dtype=np.float64)
    if not 0 <= min_gamma <= len(costs) - 1:
        raise ValueError(f"min_gamma {min_gamma} outside [0, {len(costs) - 1}]")
    gammas = np.arange(min_gamma, len(costs))
    rate = np.asarray(expected_tokens(alpha, gammas)) / costs[gammas]
    return int(gammas[int(np.argmax(rate))])


def alpha_from_acceptance_rate(rate: float, gamma: float, tol: float = 1e-10) -> float:
    """The i.i.d. acceptance rate α that makes a chain of γ drafted tokens keep the fraction ``rate`` of them.

    Under Leviathan's i.i.d. model a step with γ draft tokens accepts E[accepted] = α (1 - α^γ) / (1 - α) of them
    (E[tokens](α, γ) - 1, Eq. 1), so the fraction accepted is r(α) = α (1 - α^γ) / ((1 - α) γ), increasing from 0
    at α = 0 to 1 at α = 1; this inverts it by bisection. It turns a decoder's reported drafted / accepted counts
    (llama.cpp's server reports only those) into the α the model's predictions take. γ may be a mean (drafted
    tokens per step), where the step's length varies.

    Args:
        rate: accepted / drafted in [0, 1]; gamma: draft tokens per step (> 0); tol: the bisection's tolerance on α.

    Returns:
        α in [0, 1] (float); 1.0 for rate 1 and 0.0 for rate 0; γ <= 1 gives α = rate.

    Raises:
        ValueError: rate outside [0, 1] or γ <= 0.
    """
    r, g = float(rate), float(gamma)
    if not 0 <= r <= 1 or not g > 0:
        raise ValueError(f"alpha_from_acceptance_rate needs rate in [0, 1] and gamma > 0; got {rate}, {gamma}")
    if r in (0.0, 1.0) or g <= 1:
        return r

    def frac(a):
        return (float(expected_tokens(a, g)) - 1) / g

    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if frac(mid) < r else (lo, mid)
    return (lo + hi) / 2
