"""Statistics, as small pure functions: bootstrap and ratio-of-sums intervals, Spearman's ρ with its interval,
and the chi-square goodness-of-fit test with its power.

What this file is: the one place every interval and test in the project comes from. What it is not: timing
(:mod:`specrepro.measure.harness`) or the claims' rules (:mod:`specrepro.record.rules`).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import pandas as pd

__all__ = ["CONFIDENCE", "bootstrap_ci", "bca_ci", "median_interval", "stat_ci", "ratio_of_sums_ci", "empirical_distribution", "total_variation", "pooled_groups", "NULL_DRAWS", "gof_counts", "gof_test", "rejection_rate", "min_detectable_tv"]

#: Confidence level of every interval the harness reports.
CONFIDENCE = 0.95


def bootstrap_ci(values, statistic: Callable = np.median, confidence: float = CONFIDENCE,
                 n_resamples: int = 9999, seed: int = 0) -> tuple[float, float, float]:
    """Point estimate and percentile-bootstrap interval of ``statistic`` over the sample ``values``.

    Args:
        values: 1-D array-like of floats (NaNs are dropped), e.g. one paired speedup per prompt.
        statistic: a function of a 1-D array with an ``axis`` keyword (np.median, np.mean).
        confidence: the interval's level (default 0.95).
        n_resamples: bootstrap resamples (scipy.stats.bootstrap).
        seed: seed of the resampling (numpy Generator), so intervals are reproducible.

    Returns:
        (estimate, low, high). With one value the interval is (NaN, NaN); when every value is equal it is the
        point itself (the bootstrap distribution is degenerate). The values are sorted before resampling, so the
        interval depends on the sample, not on the order of the rows it came from.
    """
    from scipy import stats

    x = np.asarray(values, dtype=float)
    x = np.sort(x[np.isfinite(x)])
    if x.size == 0:
        return float("nan"), float("nan"), float("nan")
    est = float(statistic(x))
    if x.size == 1:
        return est, float("nan"), float("nan")
    if np.all(x == x[0]):
        return est, est, est
    res = stats.bootstrap((x,), statistic, confidence_level=confidence, n_resamples=n_resamples,
                          method="percentile", vectorized=True, rng=np.random.default_rng(seed))
    return est, float(res.confidence_interval.low), float(res.confidence_interval.high)


def median_interval(values, confidence: float = CONFIDENCE) -> tuple[float, float, float, int]:
    """The median of repeated measurements and its distribution-free interval: two order statistics of the sample
    chosen from the binomial law of how many values fall below the median (the sign-test interval,
    ``scipy.stats.quantile_test(...).confidence_interval``). It assumes only independent draws from one continuous
    distribution, which suits a handful of repeated timings (a bootstrap of 5 values covers far less than it says).

    Args:
        values: 1-D array-like of floats (NaNs are dropped), e.g. the ms of one forward pass over repeated rounds.
        confidence: the interval's level (default 0.95).

    Returns:
        (median, low, high, n). The interval is (NaN, NaN) when no pair of order statistics reaches ``confidence``
        (at 95%: fewer than 6 values), never a narrower interval that would claim more than the sample holds.
    """
    from scipy import stats

    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return float("nan"), float("nan"), float("nan"), 0
    est = float(np.median(x))
    ci = stats.quantile_test(x, q=est, p=0.5).confidence_interval(confidence_level=confidence)
    lo, hi = float(ci.low), float(ci.high)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        lo = hi = float("nan")
    return est, lo, hi, int(x.size)


def ratio_of_sums_ci(numerators, denominators, confidence: float = CONFIDENCE, n_resamples: int = 9999,
                     seed: int = 0) -> tuple[float, float, float]:
    """A pooled rate sum(numerators) / sum(denominators) and its percentile-bootstrap interval over clusters.

    Each position is one cluster (one prompt): the bootstrap resamples prompts with their numerator and denominator
    together (scipy.stats.bootstrap, ``paired=True``), so the interval accounts for prompts differing, as the paired
    speedups' intervals do. The point estimate is the pooled rate a summary table already prints, e.g. tokens per
    target step (new tokens / steps per prompt) or α (sum of the acceptance terms / their count per prompt).

    Args:
        numerators, denominators: 1-D array-likes of floats, one entry per cluster (prompt); clusters with a
            non-finite entry or a zero denominator are dropped.
        confidence, n_resamples, seed: as :func:`bootstrap_ci`.

    Returns:
        (estimate, low, high). NaNs when nothing is left; a NaN interval with one cluster; the point itself when
        every cluster has the same rate.

    Raises:
        ValueError: the two sequences differ in length.
    """
    from scipy import stats

    num, den = np.asarray(numerators, dtype=float), np.asarray(denominators, dtype=float)
    if num.shape != den.shape:
        raise ValueError(f"numerators and denominators differ in length ({num.size} vs {den.size})")
    keep = np.isfinite(num) & np.isfinite(den) & (den != 0)
    num, den = num[keep], den[keep]
    if num.size == 0:
        return float("nan"), float("nan"), float("nan")
    est = float(num.sum() / den.sum())
    if num.size == 1:
        return est, float("nan"), float("nan")
    if np.allclose(num / den, est, rtol=0, atol=1e-12):
        return est, est, est
    res = stats.bootstrap((num, den), lambda a, b, axis=-1: a.sum(axis=axis) / b.sum(axis=axis), paired=True,
                          confidence_level=confidence, n_resamples=n_resamples, method="percentile",
                          vectorized=True, rng=np.random.default_rng(seed))
    return est, float(res.confidence_interval.low), float(res.confidence_interval.high)


def empirical_distribution(samples: list) -> dict:
    counts: dict = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    n = len(samples)
    return {k: v / n for k, v in counts.items()}


def total_variation(p: dict, q: dict) -> float:
    """D_TV(p, q) = ½ Σ |p(x) − q(x)| over the union of supports."""
    keys = set(p) | set(q)
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in keys)


def pooled_groups(probs, n: int, min_expected: float = 5.0) -> list[np.ndarray]:
    """Bins for a chi-square test of ``n`` draws from ``probs`` (float [K]) in which EVERY bin has expected count
    >= ``min_expected`` (Cochran's rule; the pooled "rest" bin included).

    Outcomes with expected count >= min_expected keep a bin each; the others are pooled into one rest bin, which is
    then merged with the smallest kept bins until its own expected count reaches min_expected.

    Returns:
        list of index arrays (into ``probs``), one per bin; a single bin when no test is possible (n too small).
    """
    probs = np.asarray(probs, dtype=float)
    order = np.argsort(-probs, kind="stable")
    exp = probs[order] * n
    big = int(np.sum(exp >= min_expected))
    rest = list(order[big:])
    kept = list(order[:big])
    rest_exp = float(np.sum(probs[rest])) * n
    if rest and rest_exp < min_expected:
        while kept and rest_exp < min_expected:  # merge the smallest kept bins into the rest bin
            i = kept.pop()
            rest.append(i)
            rest_exp += probs[i] * n
    groups = [np.array([i]) for i in kept]
    if rest:
        if rest_exp < min_expected and groups:  # cannot happen (kept would be empty); kept for clarity
            groups[-1] = np.concatenate([groups[-1], rest])
        else:
            groups.append(np.array(rest))
    return groups


#: draws of the null distribution behind every goodness-of-fit p-value (Monte Carlo calibration)
NULL_DRAWS = 100_000
_NULL_CACHE: dict = {}


def _pearson(counts: np.ndarray, exp_counts: np.ndarray, block: int = 4096) -> np.ndarray:
    """Pearson's statistic sum((counts - e)^2 / e) of each row of counts [T, B] against e [B], float [T]; computed
    in blocks of rows (the same arithmetic per row, hence the same bits, as one expression over all T rows, without
    its T x B float temporaries: ~10x faster for the 100,000-row null)."""
    counts = np.asarray(counts)
    out = np.empty(counts.shape[0])
    for s in range(0, counts.shape[0], block):
        d = counts[s:s + block] - exp_counts
        d **= 2
        d /= exp_counts
        out[s:s + block] = d.sum(axis=-1)
    return out


def _chi2_pvalues(counts: np.ndarray, exp_counts: np.ndarray, null_draws: int = NULL_DRAWS, seed: int = 0) -> np.ndarray:
    """P-values of Pearson's chi-square statistic for count rows [T, B] against expected counts [B].

    The statistic's null distribution is simulated (``null_draws`` multinomial experiments of the same n from the
    pooled expected probabilities, fixed ``seed``; p = (1 + #{null >= observed}) / (1 + null_draws)), as R's
    ``chisq.test(simulate.p.value=TRUE)``: the asymptotic chi-square tail (scipy.stats.chi2) is off by tens of
    percent at level 1e-3 with many sparse bins, the simulated one is not (measured by :func:`rejection_rate`).
    """
    b = exp_counts.shape[-1]
    if b < 2:
        return np.ones(counts.shape[0])
    n = float(exp_counts.sum())
    stat = _pearson(counts, exp_counts)
    key = (np.round(exp_counts, 9).tobytes(), null_draws, seed)
    if key not in _NULL_CACHE:
        rng = np.random.default_rng(seed)
        ref = rng.multinomial(int(round(n)), exp_counts / n, size=null_draws)
        _NULL_CACHE.clear() if len(_NULL_CACHE) > 64 else None
        _NULL_CACHE[key] = np.sort(_pearson(ref, exp_counts))
    ref = _NULL_CACHE[key]
    above = ref.size - np.searchsorted(ref, stat - 1e-9 * np.maximum(1.0, np.abs(stat)), side="left")
    return (1.0 + above) / (1.0 + ref.size)


def gof_counts(counts, probs, min_expected: float = 5.0) -> np.ndarray:
    """Chi-square goodness-of-fit p-values of outcome counts against probabilities, bins by :func:`pooled_groups`.

    The vectorized core of :func:`gof_test` (the same statistic, bins and p-value, for many count vectors at once).

    Args:
        counts: int [K] or [T, K] (T independent experiments with the same total n).
        probs: float [K], the exact distribution (sums to 1).

    Returns:
        p-values, float [T] (or a float for one count vector). A count on an outcome of probability 0 gives 0.0.
    """
    counts = np.asarray(counts)
    single = counts.ndim == 1
    counts = np.atleast_2d(counts)
    probs = np.asarray(probs, dtype=float)
    n = int(counts[0].sum())
    groups = pooled_groups(probs, n, min_expected)
    pooled = np.stack([counts[:, g].sum(axis=1) for g in groups], axis=1).astype(float)
    exp = np.array([probs[g].sum() for g in groups]) * n
    exp = exp * (n / exp.sum())
    pv = _chi2_pvalues(pooled, exp)
    impossible = (counts[:, probs <= 0] > 0).any(axis=1)
    pv = np.where(impossible, 0.0, pv)
    return float(pv[0]) if single else pv


def gof_test(samples: list, expected: dict, min_expected: float = 5.0) -> tuple[float, float]:
    """Chi-square goodness-of-fit of ``samples`` against the exact distribution ``expected`` (statistic:
    scipy.stats.chisquare; p-value: the statistic's simulated null distribution, :func:`_chi2_pvalues`).

    Bins: every outcome with expected count >= ``min_expected`` is its own bin; the rarer ones are pooled into one
    bin, merged with the smallest other bins until its expected count is >= ``min_expected`` too
    (:func:`pooled_groups`), so that the chi-square approximation holds in every bin and the false-alarm rate stays
    at the nominal level (measured by :func:`rejection_rate`). A sample outside the support of ``expected`` cannot
    happen under the null hypothesis: the result is then (inf, 0.0).

    Returns:
        (statistic, p-value).
    """
    from scipy.stats import chisquare

    n = len(samples)
    obs_counts: dict = {}
    for s in samples:
        obs_counts[s] = obs_counts.get(s, 0) + 1
    if any(expected.get(k, 0.0) <= 0 for k in obs_counts):
        return float("inf"), 0.0
    keys = list(expected)
    probs = np.array([expected[k] for k in keys], dtype=float)
    counts = np.array([obs_counts.get(k, 0) for k in keys])
    groups = pooled_groups(probs, n, min_expected)
    if len(groups) < 2:
        return 0.0, 1.0
    f_obs = np.array([counts[g].sum() for g in groups], dtype=float)
    f_exp = np.array([probs[g].sum() for g in groups]) * n
    f_exp = f_exp * (n / f_exp.sum())
    stat, _ = chisquare(f_obs, f_exp)
    return float(stat), float(_chi2_pvalues(f_obs[None], f_exp)[0])


# ----------------------------------------------------------------------------------------------------------------
# Power and false alarms of the goodness-of-fit tests
# ----------------------------------------------------------------------------------------------------------------

def _as_arrays(expected: dict, alternative: dict | None):
    keys = list(expected)
    p0 = np.array([expected[k] for k in keys], dtype=float)
    p0 = p0 / p0.sum()
    if alternative is None:
        return p0, p0, 0.0
    p1 = np.array([alternative.get(k, 0.0) for k in keys], dtype=float)
    outside = max(0.0, 1.0 - float(p1.sum()))
    return p0, p1, outside


def rejection_rate(expected: dict, n: int, level: float, trials: int, seed: int = 0, alternative: dict | None = None,
                   min_expected: float = 5.0) -> float:
    """Fraction of ``trials`` experiments of ``n`` draws that :func:`gof_test` rejects at ``level``.

    Draws come from ``alternative`` (default: ``expected`` itself, giving the false-alarm rate of an exact sampler)
    with numpy's multinomial; the bins do not depend on the draws, so the test is applied to the binned counts
    directly (identical to :func:`gof_test` on the samples). Mass of ``alternative`` outside the support of
    ``expected`` always rejects, as in :func:`gof_test`.

    Returns:
        the rejection rate in [0, 1].
    """
    rng = np.random.default_rng(seed)
    p0, p1, outside = _as_arrays(expected, alternative)
    groups = pooled_groups(p0, n, min_expected)
    e = np.array([p0[g].sum() for g in groups]) * n
    a = np.array([p1[g].sum() for g in groups] + [outside])
    a = np.clip(a, 0, None)
    counts = rng.multinomial(n, a / a.sum(), size=trials)
    pv = _chi2_pvalues(counts[:, :-1].astype(float), e)
    return float(np.mean((pv < level) | (counts[:, -1] > 0)))


def _tilted(expected: dict, seed: int, scale: float = 1.0) -> dict:
    """A fixed generic direction: r(x) ∝ p(x) exp(scale * z_x), z ~ N(0, 1) per outcome (same support as p)."""
    rng = np.random.default_rng(seed)
    keys = list(expected)
    p = np.array([expected[k] for k in keys])
    r = p * np.exp(scale * rng.standard_normal(len(keys)))
    r = r / r.sum()
    return dict(zip(keys, r))


def min_detectable_tv(expected: dict, n: int, level: float, power: float = 0.9, trials: int = 1000, seed: int = 0,
                      direction: dict | None = None, iters: int = 14) -> float:
    """The smallest total-variation deviation from ``expected`` that :func:`gof_test` at ``level`` with ``n`` samples
    detects with probability >= ``power``, along one direction: alternatives (1 - ε) p + ε r for r = ``direction``
    (default: a random tilt of p, :func:`_tilted`, keeping p's support), so TV = ε · TV(p, r). Found by bisection
    on ε with :func:`rejection_rate` (``trials`` experiments per point, common seed).

    Returns:
        the TV at the smallest detected ε, or NaN if even ε = 1 is detected with less than ``power``.
    """
    r = direction if direction is not None else _tilted(expected, seed + 1)
    keys = set(expected) | set(r)
    base_tv = total_variation(expected, r)

    def mix(eps):
        return {k: (1 - eps) * expected.get(k, 0.0) + eps * r.get(k, 0.0) for k in keys}

    if rejection_rate(expected, n, level, trials, seed, mix(1.0)) < power:
        return float("nan")
    lo, hi = 0.0, 1.0
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if rejection_rate(expected, n, level, trials, seed, mix(mid)) >= power:
            hi = mid
        else:
            lo = mid
    return hi * base_tv


def spearman(x, y) -> tuple[float, float]:
    """Spearman's ρ and its two-sided p-value (scipy.stats.spearmanr); (NaN, NaN) for fewer than 3 points or a
    constant series."""
    from scipy import stats

    s = pd.DataFrame({"x": np.asarray(x, dtype=float), "y": np.asarray(y, dtype=float)}).dropna()
    if len(s) < 3 or s["x"].nunique() < 2 or s["y"].nunique() < 2:
        return float("nan"), float("nan")
    res = stats.spearmanr(s["x"], s["y"])
    return float(res.statistic), float(res.pvalue)


def spearman_interval(rho: float, n: int) -> tuple[float, float]:
    """Approximate 95% interval of Spearman's ρ from n points: Fisher's z with the Fieller-Hartley-Pearson standard
    error √(1.06 / (n − 3)); (NaN, NaN) for n < 4 or NaN ρ."""
    from scipy import stats

    if n < 4 or math.isnan(rho):
        return float("nan"), float("nan")
    z, half = math.atanh(max(min(rho, 0.999999), -0.999999)), stats.norm.ppf(0.975) * math.sqrt(1.06 / (n - 3))
    return math.tanh(z - half), math.tanh(z + half)


def bca_ci(values, statistic: Callable = np.mean, confidence: float = CONFIDENCE, n_resamples: int = 9999,
           seed: int = 0) -> tuple[float, float, float]:
    """Point estimate and bias-corrected and accelerated (BCa) bootstrap interval of ``statistic`` over ``values``
    (Efron 1987; scipy.stats.bootstrap, ``method="BCa"``): second-order accurate, so it keeps its coverage at the
    small samples (10-40 prompts) where a percentile bootstrap of a skewed statistic falls short.

    Args and returns as :func:`bootstrap_ci` (values sorted before resampling; NaN interval with one value, the
    point itself when every value is equal, to within 1e-12). Where the jackknife that gives the acceleration is degenerate (scipy
    returns NaN), the interval is NaN: no interval, never a narrower one of another method.
    """
    import warnings

    from scipy import stats

    x = np.asarray(values, dtype=float)
    x = np.sort(x[np.isfinite(x)])
    if x.size == 0:
        return float("nan"), float("nan"), float("nan")
    est = float(statistic(x))
    if x.size == 1:
        return est, float("nan"), float("nan")
    if np.allclose(x, x[0], rtol=0, atol=1e-12):  # constant up to rounding: a degenerate bootstrap distribution
        return est, est, est
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns where it returns NaN (a degenerate jackknife)
        res = stats.bootstrap((x,), statistic, confidence_level=confidence, n_resamples=n_resamples,
                              method="BCa", vectorized=True, rng=np.random.default_rng(seed))
    return est, float(res.confidence_interval.low), float(res.confidence_interval.high)


def stat_ci(values, statistic=np.median) -> tuple[float, float, float, int]:
    """(estimate, low, high, n) of ``statistic`` over ``values`` (1-D floats, non-finite dropped) with a 95% interval
    that covers at the sample sizes the scorecard judges (10-164 prompts or problems): for ``np.median`` the sign test's distribution-free interval (:func:`median_interval`; exact for independent
    prompts from any continuous law, NaN below 6 values), for ``np.mean`` the BCa bootstrap (:func:`bca_ci`).

    Raises:
        ValueError: a statistic other than ``np.median`` or ``np.mean``.
    """
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if statistic is np.median:
        if x.size > 1 and np.allclose(x, x[0], rtol=0, atol=1e-12):
            return float(x[0]), float(x[0]), float(x[0]), int(x.size)
        est, lo, hi, n = median_interval(x)
        return est, lo, hi, n
    if statistic is np.mean:
        est, lo, hi = bca_ci(x, statistic=np.mean)
        return est, lo, hi, int(x.size)
    raise ValueError(f"stat_ci computes intervals of np.median and np.mean, not {statistic!r}")
