"""Draft lengths chosen as decoding goes: γ per step from the cost model, and block lengths ended token by token.
"""

from __future__ import annotations

import torch

from specrepro.drafters.base import Proposal

__all__ = ["AutoGammaDrafter", "AdaptiveLengthDrafter"]


class AutoGammaDrafter:
    """Any drafter with its draft length chosen at every step by the hardware-aware cost model.

    Before each block the wrapper picks γ_t = argmax over γ in [min_gamma, gamma] of
    (1 - α̂^(γ+1)) / (1 - α̂) / (t_target(γ + 1) + γ · t_draft + o) (:func:`specrepro.theory.gamma_for_step`):
    Leviathan's expected tokens per step (Eq. 1) per millisecond of a step under measured costs, with α̂ the running
    acceptance rate of this sequence. ``gamma`` (the decoding loop's argument) is the largest draft length allowed.

    α̂ is estimated from the drafter's own past blocks: on each call the wrapper compares its previous block with the
    tokens that were committed after it (the first emitted token that differs from the draft is the rejection point:
    the residual never re-emits the rejected token), so n accepted out of n + 1 positions reached (n out of n when
    the whole block was accepted). With exponential forgetting ``decay`` and a prior of ``prior_weight`` positions
    at ``alpha_prior``: α̂ = (A + w α0) / (R + w), A and R the decayed accepted / reached counts. α̂ restarts at the
    prior with every sequence (:meth:`reset`), so outputs do not depend on the order sequences are decoded in.

    Exactness: γ_t depends only on values of past steps (committed tokens, past drafts) and on fixed cost curves,
    never on the current block's random draws, so each block is verified by Leviathan's rule against the q its tokens
    were drawn from, and Leviathan Thm. 3.5 holds step by step; under greedy decoding every emitted token is the
    target's argmax. The costs are fixed numbers (measured before decoding, e.g. with
    :func:`specrepro.measure.cost.measure_cost_curve` and :func:`specrepro.measure.cost.measure_draft_step_ms`), never
    timings of the running loop, so a seeded run is reproducible.

    Args:
        drafter: the wrapped drafter.
        t_target: callable n -> ms, the target's forward time over n new tokens (:class:`specrepro.theory.CostCurve`).
        t_draft: ms per drafted token (a number, or a callable n -> ms read at n = 1); 0 for a free draft.
        overhead_ms: per-step time outside the forward passes (ms).
        alpha_prior: α0 in [0, 1]; prior_weight: w >= 0 (positions); decay: forgetting factor in (0, 1] per step
            (1 = the plain running mean).
        min_gamma: the smallest draft length chosen (>= 1, so every step keeps measuring α).
        name: a label for tables (default: the wrapped drafter's name + ", auto γ").

    Attributes:
        gammas: the draft lengths chosen in this sequence (one per step).
        alpha_hat: the current estimate α̂.

    Raises:
        ValueError: an argument outside its range, or costs that are not positive and finite.
    """

    def __init__(self, drafter, t_target, t_draft, *, overhead_ms: float = 0.0, alpha_prior: float = 0.8,
                 prior_weight: float = 2.0, decay: float = 0.9, min_gamma: int = 1, name: str | None = None):
        from specrepro.theory import step_costs_ms

        if not 0.0 <= float(alpha_prior) <= 1.0:
            raise ValueError(f"alpha_prior must lie in [0, 1], got {alpha_prior!r}")
        if not float(prior_weight) >= 0.0:
            raise ValueError(f"prior_weight must be >= 0, got {prior_weight!r}")
        if not 0.0 < float(decay) <= 1.0:
            raise ValueError(f"decay must lie in (0, 1], got {decay!r}")
        if int(min_gamma) != min_gamma or min_gamma < 1:
            raise ValueError(f"min_gamma must be an integer >= 1, got {min_gamma!r}")
        self.drafter = drafter
        self.t_target, self.t_draft, self.overhead_ms = t_target, t_draft, float(overhead_ms)
        self.alpha_prior, self.prior_weight, self.decay = float(alpha_prior), float(prior_weight), float(decay)
        self.min_gamma = int(min_gamma)
        self.name = name or f"{getattr(drafter, 'name', 'draft')}, auto γ"
        self._costs = step_costs_ms(t_target, t_draft, 8, self.overhead_ms)  # checks the costs now
        self.reset()

    def prefill(self, ids) -> None:
        """The inner drafter's prompt prefill, where it has one (:class:`~specrepro.drafters.base.Drafter`)."""
        warm = getattr(self.drafter, "prefill", None)
        if warm is not None:
            warm(ids)

    def reset(self) -> None:
        self.drafter.reset()
        self._acc = 0.0
        self._reached = 0.0
        self._last: torch.Tensor | None = None  # the block drafted last, until its feedback arrives
        self.gammas: list[int] = []

    @property
    def alpha_hat(self) -> float:
        w = self.prior_weight
        if self._reached + w == 0:
            return self.alpha_prior
        return (self._acc + w * self.alpha_prior) / (self._reached + w)

    def feedback(self, n_drafted: int, n_accepted: int) -> None:
        """Verification kept ``n_accepted`` of the ``n_drafted`` tokens of the last block: n accepted out of n + 1
        positions reached (n out of n when the whole block was kept) update the decayed α estimate."""
        if self._last is None or n_drafted == 0:
            return
        self._last = None
        hook = getattr(self.drafter, "feedback", None)
        if hook is not None:
            hook(n_drafted, n_accepted)
        n, reached = int(n_accepted), int(n_accepted) + (1 if n_accepted < n_drafted else 0)
        self._acc = self.decay * self._acc + n
        self._reached = self.decay * self._reached + reached

    def propose(self, ids, gamma, sampling, generator):
        from specrepro.theory import gamma_for_step, step_costs_ms

        if gamma < 1:
            return Proposal(ids.new_empty(0), None)
        if len(self._costs) <= gamma:
            self._costs = step_costs_ms(self.t_target, self.t_draft, int(gamma), self.overhead_ms)
        g = gamma_for_step(self.alpha_hat, self._costs[: gamma + 1], min(self.min_gamma, gamma))
        self.gammas.append(g)
        prop = self.drafter.propose(ids, g, sampling, generator)
        self._last = prop.tokens.detach().cpu()
        return prop


class AdaptiveLengthDrafter:
    """A draft model's block length chosen token by token from its calibrated confidence and the measured costs.

    After each drafted token x_i the wrapper decides whether the block goes on. It keeps π_i, the estimated
    probability that x_1..x_i are all accepted (the product of â(c_j), the acceptance rate this sequence has shown so
    far for tokens drafted with a confidence like c_j, c_j the draft's temperature-1 probability of its own token as
    in transformers' assisted generation). Drafting x_{i+1} adds π_i ᾱ expected tokens (ᾱ the running acceptance
    rate of all tokens) and cost[i + 1] - cost[i] ms, with cost[γ] = t_target(γ + 1) + γ t_draft + o
    (:func:`specrepro.theory.step_costs_ms`, the target's curve made non-decreasing so that a noisy measurement
    cannot make a token look free). The block goes on while π_i ᾱ > λ (cost[i + 1] - cost[i]), λ the long-run
    tokens per ms: a step maximizes E[tokens] - λ E[ms] when the ratio of the whole run is to be maximal (the
    renewal-reward argument behind Dinkelbach's method for ratio objectives). λ is estimated from the steps so far:
    the tokens they emitted over their modelled costs, exponentially forgotten like the calibration, starting from the
    best fixed γ under Leviathan Eq. 1 at ``alpha_prior``. (The rule of the first version compared the next token's
    rate with the block's own E_i / cost[i]; a confident block then set itself a higher bar than the run's rate and
    stopped early.) So a confident run of tokens is drafted long and a block stops early where the draft hesitates -
    the idea of transformers' fixed threshold (stop below 0.4) and of SpecDec++'s learned stopping head (Huang et al.
    2024), with the threshold derived from the costs and calibrated online instead of fixed or trained.

    Calibration: ``bins`` equal-width confidence bins, each with exponentially forgotten (``decay`` per step) counts of
    drafted tokens that were reached by verification and of those accepted, and a prior of ``prior_weight`` tokens at a
    pooled calibration curve (:meth:`acceptance`: a logistic fit in logit(c) over all bins, Platt scaling; before any
    verification the identity, a calibrated draft). After each block the wrapper compares it with the tokens
    committed after it (the first emitted token that differs from the draft is the rejection point, as in
    :class:`AutoGammaDrafter`). State restarts with each sequence (:meth:`reset`) unless ``keep_calibration``.

    Exactness: whether the block continues after x_i depends only on values of past steps and on the draft's own
    values up to x_i, never on x_{i+1} or the target, so given the emitted prefix the next token is either verified
    against the q it was drawn from (Leviathan's rule) or sampled from the target as the bonus token: Leviathan
    Thm. 3.5 holds position by position, as for :class:`DraftModelDrafter`'s ``stop_below``; under greedy decoding
    every emitted token is the target's argmax. The costs are fixed numbers measured before decoding, so a seeded
    run is reproducible.

    Args:
        drafter: a :class:`DraftModelDrafter`, :class:`PrunedHeadDrafter` or :class:`BlockLMDrafter` (a llama.cpp
            draft; :mod:`specrepro.drafters.model`); its ``stop_below`` is ignored while the wrapper proposes.
        t_target: callable n -> ms (:class:`specrepro.theory.CostCurve`); t_draft: ms per drafted token (a number
            or a callable read at n = 1).
        overhead_ms: per-step time outside the forward passes (ms).
        bins: confidence bins (>= 1); prior_weight: w > 0 (pseudo-tokens per bin for the calibration, pseudo-steps
            for λ); decay: in (0, 1] per step.
        alpha_prior: ᾱ before any verification and the α of λ's prior, in [0, 1].
        keep_calibration: carry the calibration and λ from one sequence to the next (:meth:`reset` keeps them).
            Each output stays an exact sample, but under sampling which sample a seed gives then depends on the
            sequences decoded before (the default restarts the calibration with every sequence, as
            :class:`AutoGammaDrafter` does).
        name: a label for tables (default: the wrapped drafter's name + ", adaptive length").

    Attributes:
        gammas: the block lengths drafted in this sequence (one per step).

    Raises:
        ValueError: a drafter without a dynamic draft length, an argument outside its range, or costs that are not
            positive and finite.
    """

    def __init__(self, drafter, t_target, t_draft, *, overhead_ms: float = 0.0, bins: int = 10,
                 prior_weight: float = 4.0, decay: float = 0.98, alpha_prior: float = 0.8,
                 keep_calibration: bool = False, name: str | None = None):
        if not hasattr(drafter, "stop_after"):
            raise ValueError(f"{type(drafter).__name__} has no dynamic draft length (use DraftModelDrafter, "
                             "PrunedHeadDrafter or BlockLMDrafter)")
        if int(bins) != bins or bins < 1:
            raise ValueError(f"bins must be an integer >= 1, got {bins!r}")
        if not float(prior_weight) > 0.0:
            raise ValueError(f"prior_weight must be > 0, got {prior_weight!r}")
        if not 0.0 < float(decay) <= 1.0:
            raise ValueError(f"decay must lie in (0, 1], got {decay!r}")
        if not 0.0 <= float(alpha_prior) <= 1.0:
            raise ValueError(f"alpha_prior must lie in [0, 1], got {alpha_prior!r}")
        self.drafter = drafter
        self.t_target, self.t_draft, self.overhead_ms = t_target, t_draft, float(overhead_ms)
        self.bins, self.prior_weight, self.decay = int(bins), float(prior_weight), float(decay)
        self.alpha_prior = float(alpha_prior)
        self.keep_calibration = bool(keep_calibration)
        self.name = name or f"{getattr(drafter, 'name', 'draft')}, adaptive length"
        self._set_costs(8)  # checks the costs now
        self._centres = (torch.arange(self.bins, dtype=torch.float64) + 0.5).numpy() / self.bins  # float64 [bins]
        self._acc = torch.zeros(self.bins, dtype=torch.float64)
        self._reached = torch.zeros(self.bins, dtype=torch.float64)
        self._platt = (0.0, 1.0)  # (a, b): pooled acceptance sigmoid(a + b logit(c)); identity before any data
        self._tokens = 0.0  # decayed tokens emitted by the observed steps
        self._ms = 0.0  # decayed modelled cost of those steps (ms)
        self._refresh_table()
        self.reset()

    def _set_costs(self, max_gamma: int) -> None:
        """cost[γ] for γ = 0..max_gamma (the target's part made non-decreasing) and λ's prior, the best fixed γ's
        expected tokens per ms under Leviathan Eq. 1 at ``alpha_prior``: computed when the largest γ grows, not per
        step."""
        import numpy as np

        from specrepro.theory import expected_tokens, step_costs_ms

        costs = step_costs_ms(self.t_target, self.t_draft, int(max_gamma), self.overhead_ms)
        t = np.array([float(self.t_target(g + 1)) for g in range(len(costs))])
        self._costs = costs - t + np.maximum.accumulate(t)
        self._rate_prior = max(float(expected_tokens(self.alpha_prior, g)) / float(self._costs[g])
                               for g in range(len(self._costs)))

    def prefill(self, ids) -> None:
        """The inner drafter's prompt prefill, where it has one (:class:`~specrepro.drafters.base.Drafter`)."""
        warm = getattr(self.drafter, "prefill", None)
        if warm is not None:
            warm(ids)

    def reset(self) -> None:
        """A new sequence: the draft's cache and the block lengths restart; the calibration and the rate λ too
        unless ``keep_calibration``."""
        self.drafter.reset()
        if not self.keep_calibration:
            self._acc = torch.zeros(self.bins, dtype=torch.float64)
            self._reached = torch.zeros(self.bins, dtype=torch.float64)
            self._platt = (0.0, 1.0)
            self._tokens = self._ms = 0.0
            self._refresh_table()
        self._last: tuple[torch.Tensor, list[int], list[float]] | None = None  # (block, bins, confidences)
        self.gammas: list[int] = []

    def _bin(self, c: float) -> int:
        return min(max(int(c * self.bins), 0), self.bins - 1)

    def _pooled(self, c):
        import numpy as np
        from scipy.special import expit

        a, b = self._platt
        c = np.clip(np.asarray(c, dtype=np.float64), 1e-4, 1 - 1e-4)
        return expit(a + b * np.log(c / (1 - c)))

    def _fit_platt(self) -> None:
        """Refit the pooled curve: logistic regression of acceptance on logit(bin centre) over the bins' counts, with
        ``prior_weight`` pseudo-tokens per bin at the identity (a calibrated draft) so that sparse data bend it only
        as far as they show; Newton steps from the last fit."""
        import numpy as np
        from scipy.special import expit

        c = self._centres
        x = np.log(c / (1 - c))
        w0 = self.prior_weight
        n = self._reached.numpy() + w0
        y = (self._acc.numpy() + w0 * c) / n
        X = np.stack([np.ones_like(x), x], 1)

        def loglik(beta):
            z = X @ beta
            return float(np.sum(n * (y * z - np.logaddexp(0.0, z))))

        beta = np.array(self._platt, dtype=np.float64)
        for _ in range(20):  # Newton's method with backtracking (the log-likelihood is concave)
            p = expit(X @ beta)
            g = X.T @ (n * (y - p))
            H = (X * (n * p * (1 - p))[:, None]).T @ X + 1e-9 * np.eye(2)
            step, now = np.linalg.solve(H, g), loglik(beta)
            while loglik(beta + step) < now and float(np.abs(step).max()) > 1e-9:
                step = step / 2
            beta = beta + step
            if float(np.abs(step).max()) < 1e-7:
                break
        self._platt = (float(beta[0]), float(beta[1]))

    def _refresh_table(self) -> None:
        """â per bin (float64 [bins]), recomputed once per observed step so that the stop rule's per-token work
        is a lookup."""
        w = self.prior_weight
        prior = torch.from_numpy(self._pooled(self._centres))
        self._table = ((self._acc + w * prior) / (self._reached + w)).tolist()

    def acceptance(self, confidence: float) -> float:
        """â(c): the calibrated acceptance rate of a token drafted with confidence c in [0, 1]: the bin's own counts,
        shrunk (``prior_weight`` tokens) toward the pooled calibration curve sigmoid(a + b logit(c)) fitted over
        all bins (:meth:`_fit_platt`; the identity before any verification), so bins with few tokens borrow what
        the others show."""
        return self._table[self._bin(confidence)]

    @property
    def alpha_hat(self) -> float:
        """ᾱ: the running acceptance rate over all reached draft tokens (prior ``alpha_prior``, weight
        ``prior_weight``)."""
        w = self.prior_weight
        return float((self._acc.sum() + w * self.alpha_prior) / (self._reached.sum() + w))

    @property
    def rate(self) -> float:
        """λ: the long-run expected tokens per ms the stop rule compares a token's marginal gain with: the observed
        steps' emitted tokens over their modelled costs (decayed), with ``prior_weight`` pseudo-steps at the best
        fixed γ under Leviathan Eq. 1 at ``alpha_prior``."""
        w, c1 = self.prior_weight, float(self._costs[1])
        return (self._tokens + w * self._rate_prior * c1) / (self._ms + w * c1)

    def feedback(self, n_drafted: int, n_accepted: int) -> None:
        """Verification kept ``n_accepted`` of the ``n_drafted`` tokens of the last block: each reached token's
        confidence bin counts one trial (a success if it was kept), the step's tokens and modelled cost update λ."""
        if self._last is None or n_drafted == 0:
            return
        bins, k = self._last[1], int(self._last[0].numel())
        self._last = None
        hook = getattr(self.drafter, "feedback", None)
        if hook is not None:
            hook(n_drafted, n_accepted)
        n, reached = int(n_accepted), int(n_accepted) + (1 if n_accepted < n_drafted else 0)
        self._acc *= self.decay
        self._reached *= self.decay
        self._tokens *= self.decay
        self._ms *= self.decay
        for i in range(reached):
            self._acc[bins[i]] += 1.0 if i < n else 0.0
            self._reached[bins[i]] += 1.0
        self._tokens += n + 1.0
        self._ms += float(self._costs[min(k, len(self._costs) - 1)])
        self._fit_platt()
        self._refresh_table()

    def propose(self, ids, gamma, sampling, generator):
        if gamma < 1:
            return Proposal(ids.new_empty(0), None)
        if len(self._costs) <= gamma:
            self._set_costs(int(gamma))
        costs, abar, lam = self._costs, self.alpha_hat, self.rate
        state = {"pi": 1.0}
        bins: list[int] = []
        confs: list[float] = []

        def stop(i: int, c: float) -> bool:  # after the i-th drafted token, confidence c
            bins.append(self._bin(c))
            confs.append(float(c))
            if i >= gamma:
                return True
            state["pi"] *= self.acceptance(c)
            return state["pi"] * abar <= lam * float(costs[i + 1] - costs[i])

        self.drafter.stop_rule = stop
        try:
            prop = self.drafter.propose(ids, gamma, sampling, generator)
        finally:
            self.drafter.stop_rule = None
        self.gammas.append(int(prop.tokens.numel()))
        k = prop.tokens.numel()
        self._last = (prop.tokens.detach().cpu(), bins[:k], confs[:k])
        return prop
