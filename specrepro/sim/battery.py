"""Proofs by simulation: exact enumeration and Monte Carlo goodness-of-fit for speculative samplers.

What this file is: the machinery of the exactness battery (tests/) and of notebook 01.

* A *toy language model* (:class:`ToyLM`) gives a target and a draft distribution for every prefix of a small
  vocabulary, either from random tables or from tiny transformers, processed by
  :func:`~specrepro.core.sampling.logits_to_probs`.
* :func:`exact_chain_distribution` computes, by enumerating every draft block and every accept/reject outcome, the
  exact probability of each length-K output sequence of chain speculative sampling, using the same building blocks
  :func:`~specrepro.core.sampling.verify_chain` uses (or deliberately wrong ones: :data:`NEGATIVE_CONTROLS`).
* :func:`sample_chain_sequences` draws sequences with the real :func:`~specrepro.core.sampling.verify_chain`.
* :func:`gof_test` is a chi-square goodness-of-fit test (``scipy.stats.chisquare``) with sparse bins pooled, and
  :func:`total_variation` the TV distance between empirical and exact distributions.

What it is not: a decoding loop for real models (that is :mod:`specrepro.core.decoding`; the battery drives it too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from specrepro.core.sampling import SamplingConfig
from specrepro.sim.exact import target_distribution
from specrepro.sim.toy import ToyLM, tiny_random_lm
from specrepro.stats import min_detectable_tv, pooled_groups, rejection_rate

__all__ = ["GofCase", "battery_gof_cases", "power_table"]


@dataclass
class GofCase:
    """One goodness-of-fit test of the battery: its exact distribution (built lazily), sample size and level."""

    name: str
    build: Callable[[], dict]
    n: int
    level: float = 1e-3
    where: str = ""


def _tiny_pair_dist(cfg: SamplingConfig, length: int, vocab: int = 8, seed: int = 1, prompt=(1, 5, 2, 7)):
    def build():
        with torch.inference_mode():
            model = tiny_random_lm("llama", vocab, seed)
            return target_distribution(ToyLM.from_transformer(model, torch.tensor(prompt)), cfg, length)
    return build


def _marginal(build, a: int, b: int):
    def inner():
        out: dict = {}
        for seq, pr in build().items():
            out[seq[a:b]] = out.get(seq[a:b], 0.0) + pr
        return out
    return inner


def _toy_mc_dist():
    g = torch.Generator().manual_seed(11)
    target = ToyLM.random(4, g)
    return target_distribution(target, SamplingConfig(0.9, top_k=3, top_p=0.9), 3)


def battery_gof_cases() -> list[GofCase]:
    """The goodness-of-fit tests of the exactness battery (tests/), with their exact distributions, n and level."""
    t1, tk, tp = SamplingConfig(1.0), SamplingConfig(0.8, top_k=4), SamplingConfig(1.2, top_p=0.8)
    return [
        GofCase("chain, verify_chain (toy V=4, 3 tokens)", _toy_mc_dist, 3000, 1e-3, "tests/test_sampling.py"),
        GofCase("chain, generate T=1 (tiny V=8, 3 tokens)", _tiny_pair_dist(t1, 3), 1500, 1e-3,
                "tests/test_decoding.py"),
        GofCase("chain, generate T=0.8 top-k 4", _tiny_pair_dist(tk, 3), 1500, 1e-3, "tests/test_decoding.py"),
        GofCase("chain, generate T=1.2 top-p 0.8", _tiny_pair_dist(tp, 3), 1500, 1e-3, "tests/test_decoding.py"),
        GofCase("tree_generate, depth 1 (tiny V=8, 2 tokens)", _tiny_pair_dist(t1, 2), 1000, 1e-3,
                "tests/test_trees.py"),
        GofCase("tree_generate, depth 3 (tiny V=4, 4 tokens)", _tiny_pair_dist(t1, 4, vocab=4, prompt=(1, 3, 2, 0)), 1500,
                1e-3,
                "tests/test_trees.py"),
        GofCase("Medusa MSS step (tiny V=8, 3 tokens)", _tiny_pair_dist(t1, 3), 2000, 1e-3, "tests/test_medusa.py"),
        GofCase("Medusa end to end (tiny V=8, tokens 2-3 of 4)", _marginal(_tiny_pair_dist(t1, 4), 1, 3), 600, 1e-3,
                "tests/test_medusa.py"),
        GofCase("cheap drafts, generate T=1 (tiny V=8, 3 tokens)", _tiny_pair_dist(t1, 3), 2000, 1e-3,
                "tests/test_cheap_drafts.py"),
        GofCase("cheap drafts, generate T=0.9 top-p 0.95", _tiny_pair_dist(SamplingConfig(0.9, top_p=0.95), 3), 2000,
                1e-3, "tests/test_cheap_drafts.py"),
        GofCase("cheap drafts, generate T=0.8 top-k 4", _tiny_pair_dist(tk, 3), 2000, 1e-3,
                "tests/test_cheap_drafts.py"),
        GofCase("hybrid lookup/model drafter, T=1 (prompt ending in a repeated bigram)",
                _tiny_pair_dist(t1, 3, prompt=(1, 5, 2, 7, 1, 5)), 3000, 1e-3, "tests/test_cheap_drafts.py"),
        GofCase("verifiers after the papers, tree_generate / generate T=1 (tiny V=8, 3 tokens)", _tiny_pair_dist(t1, 3),
                1500, 1e-3, "tests/test_verifiers.py"),
    ] + _bug_cases()


def _bug_cases() -> list[GofCase]:
    from specrepro.sim.controls import (
        BUGS,  # the registry's chi-square tests, one per control (its sampling setting and n)
)

    return [GofCase(f"bug registry: {b.name} (tiny V=8, 3 tokens)", _tiny_pair_dist(b.config, 3), b.n, b.level,
                    "tests/test_exactness.py") for b in BUGS.values() if b.check == "gof"]


def power_table(cases: list[GofCase] | None = None, null_trials: int = 20000, power_trials: int = 1000,
                power: float = 0.9, seed: int = 0):
    """False alarms and power of each goodness-of-fit test of the battery.

    For each :class:`GofCase`: the empirical false-alarm rate of an exact sampler (``null_trials`` multinomial
    experiments of the test's n from the exact distribution, :func:`rejection_rate`), its binomial standard error,
    the bound level + 3 standard errors, and the smallest TV deviation detected with probability ``power``
    (:func:`min_detectable_tv`, a random-tilt direction).

    Returns:
        pandas.DataFrame, one row per test: test, where, n, level, bins, false_alarm, false_alarm_se,
        within_level (false_alarm <= level + 3 se), min_tv_detected_90.
    """
    import pandas as pd

    rows = []
    for c in cases if cases is not None else battery_gof_cases():
        exp = c.build()
        fa = rejection_rate(exp, c.n, c.level, null_trials, seed)
        se = math.sqrt(c.level * (1 - c.level) / null_trials)
        rows.append({"test": c.name, "where": c.where, "n": c.n, "level": c.level,
                     "bins": len(pooled_groups(np.array(list(exp.values())), c.n)), "outcomes": len(exp),
                     "false_alarm": fa, "false_alarm_se": se, "within_level": fa <= c.level + 3 * se,
                     f"min_tv_detected_{int(power * 100)}": min_detectable_tv(exp, c.n, c.level, power,
                                                                              power_trials, seed)})
    return pd.DataFrame(rows)
