"""Logits processing and the accept/reject rule of speculative sampling.

What this file is: the exact, model-free core that the exactness battery exercises.

* :class:`SamplingConfig` and :func:`logits_to_probs` turn logits into the distribution that is actually sampled
  (temperature, top-k, top-p; temperature 0 is greedy, a one-hot argmax). Target and draft go through the SAME
  function, so the draft probabilities q used in the ratio p/q are the processed ones. (Using the raw draft softmax
  while sampling from the processed one breaks exactness; HF transformers had that bug, transformers#47932.)
* :func:`acceptance_probability` and :func:`residual_distribution` are the two pieces of Leviathan et al. (2023),
  Algorithm 1 / Chen et al. (2023), Algorithm 2: accept draft token x with probability min(1, p(x)/q(x)); after a
  rejection sample from norm(max(0, p - q)).
* :func:`verify_chain` runs one verification of a drafted block, token by token (Leviathan Alg. 1).
* :func:`verify_block` verifies the same drafted block jointly (block verification, Sun et al., "Block Verification
  Accelerates Speculative Decoding", ICLR 2025, arXiv:2403.10444, Algorithm 2): also exact, and never fewer
  expected tokens per step than :func:`verify_chain`. :func:`block_verification_terms` gives its building blocks, shared
  by the sampler and the exact enumeration of :mod:`specrepro.sim`.

What it is not: a decoding loop (see :mod:`specrepro.core.decoding`) or a tree verifier (see :mod:`specrepro.core.trees`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = [
    "SamplingConfig",
    "logits_to_probs",
    "greedy_token",
    "sample",
    "draw",
    "rng_device",
    "uniform",
    "acceptance_probability",
    "residual_distribution",
    "verify_chain",
    "block_verification_terms",
    "verify_block",
]


@dataclass(frozen=True)
class SamplingConfig:
    """How logits become a sampling distribution (applied identically to target and draft).

    Attributes:
        temperature: >= 0; 0 means greedy (argmax, one-hot distribution).
        top_k: keep the k most likely tokens (ties at the k-th value are kept); None or 0 disables.
        top_p: nucleus sampling: keep the smallest set of most likely tokens with mass >= top_p; in (0, 1].

    Raises:
        ValueError: temperature < 0 or not finite, top_k < 0, top_p outside (0, 1].
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0

    def __post_init__(self):
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if self.top_k is not None and (int(self.top_k) != self.top_k or self.top_k < 0):
            raise ValueError(f"top_k must be a non-negative integer or None, got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = SamplingConfig(temperature=0.0)


NAN_LOGITS = "NaN in logits: the model produced invalid scores (check dtype overflow or the weights)"


def greedy_token(logits: torch.Tensor) -> int:
    """The token greedy decoding picks from one row of logits [V] (any float dtype): its argmax, the token that the
    one-hot row of :func:`logits_to_probs` at temperature 0, and any draw from that row, give, without building that
    V-wide row or drawing from it (the AR loop's per-token work outside the forward, measured in a bench file's
    ``overhead_ms``).

    Raises:
        ValueError: the row contains NaN.
    """
    i = int(logits.argmax())
    if torch.isnan(logits[i]):  # argmax points at a NaN wherever the row holds one
        raise ValueError(NAN_LOGITS)
    return i


def logits_to_probs(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Processed sampling distribution(s) from logits.

    Order as in HF transformers: temperature, then top-k, then top-p, then softmax.

    Args:
        logits: float tensor [..., V] (any float dtype; computed in float32, or float64 if given float64).
        config: the sampling configuration.

    Returns:
        probs: float32 (or float64) tensor [..., V], rows summing to 1; one-hot argmax rows when
        ``config.temperature == 0``.

    Raises:
        ValueError: ``logits`` contains NaN, or a row is entirely -inf.
    """
    x = logits.double() if logits.dtype == torch.float64 else logits.float()
    if torch.isnan(x).any():
        raise ValueError(NAN_LOGITS)
    if config.greedy:
        idx = x.argmax(dim=-1, keepdim=True)
        return torch.zeros_like(x).scatter_(-1, idx, 1.0)
    x = x / config.temperature
    if config.top_k:
        k = min(int(config.top_k), x.shape[-1])
        kth = torch.topk(x, k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if config.top_p < 1.0:
        x = x.masked_fill(_top_p_drop(x, float(config.top_p)), float("-inf"))
    if (x == float("-inf")).all(dim=-1).any():
        raise ValueError("a row of logits is entirely -inf: no token can be sampled")
    return torch.softmax(x, dim=-1)


#: the first candidate-set size of the top-p filter (:func:`_top_p_drop`); grown 8x while it holds < top_p of the mass
TOP_P_FIRST_K = 256


def _top_p_drop(x: torch.Tensor, top_p: float) -> torch.Tensor:
    """The tokens nucleus filtering drops: bool [..., V], True where the probability mass of the strictly more likely
    tokens (in descending order) is already >= ``top_p`` (the most likely token is never dropped).

    Sorting a 150k-token vocabulary for every row costs more than the rest of the processing, and the nucleus is
    usually a few dozen tokens, so the ranking runs over the ``k`` largest logits only (``torch.topk``, sorted),
    k = :data:`TOP_P_FIRST_K` and 8x larger until those k hold at least ``top_p`` of every row's mass: then every
    token outside them has at least that much mass before it and is dropped, exactly as a full sort would drop it.
    Probabilities are exp(x - logsumexp(x)) over the whole row; they may differ from a softmax of the sorted row in
    the last float bit, which can move a token whose preceding mass equals ``top_p`` to within rounding across the
    boundary (a change of the filter's definition at rounding level, shared by draft, target and AR alike, so the
    speculative samplers stay exact). When k reaches a quarter of the vocabulary the whole row is sorted instead.
    Ties keep torch's order, as a full sort does.
    """
    vocab = x.shape[-1]
    k = min(TOP_P_FIRST_K, vocab)
    log_z = torch.logsumexp(x, dim=-1, keepdim=True) if 4 * k < vocab else None
    while 4 * k < vocab:
        top_x, order = torch.topk(x, k, dim=-1, sorted=True)
        top_p_sorted = torch.exp(top_x - log_z)
        if bool((top_p_sorted.sum(dim=-1) >= top_p).all()):
            mass_before = torch.cumsum(top_p_sorted, dim=-1) - top_p_sorted
            keep_sorted = mass_before < top_p  # the first token is always kept (mass_before = 0)
            keep = torch.zeros(x.shape, dtype=torch.bool, device=x.device).scatter_(-1, order, keep_sorted)
            return ~keep
        k *= 8
    # a sort of the whole row is as cheap as a large top-k: the textbook filter
    sorted_x, order = torch.sort(x, dim=-1, descending=True)
    sorted_p = torch.softmax(sorted_x, dim=-1)
    drop_sorted = torch.cumsum(sorted_p, dim=-1) - sorted_p >= top_p  # the first token is never dropped
    return torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)


def rng_device(generator: torch.Generator | None, fallback: torch.device | str) -> torch.device:
    """Where random draws with ``generator`` must be made: its own device (``fallback`` without a generator).

    torch draws only on the generator's device, so a CPU generator used with CUDA tensors (or the reverse) draws
    there and the result is moved; the draw itself, hence the distribution, is the same.
    """
    return generator.device if generator is not None else torch.device(fallback)


def uniform(shape, generator: torch.Generator | None, *, device: torch.device | str,
            dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """U(0, 1) draws of ``shape`` made with ``generator`` on its device, returned on ``device`` as ``dtype``."""
    u = torch.rand(shape, generator=generator, device=rng_device(generator, device), dtype=dtype)
    return u.to(device)


def draw(probs: torch.Tensor, n: int, generator: torch.Generator | None) -> torch.Tensor:
    """``n`` independent draws (with replacement) from each row of ``probs`` [..., V]; returns long [..., n] on
    ``probs``' device.

    ``torch.multinomial`` takes one sample by an exponential race over the whole row (V random numbers: 2.3 ms per
    row at V = 151,936 on a 2-core CPU) but two or more with replacement by a search of the row's cumulative
    distribution (0.09 ms). So at least two i.i.d. draws are made and the first ``n`` kept: each kept draw is an
    exact draw from its row. The draws are made on the generator's device (:func:`rng_device`): ``probs`` is moved
    there if it lives elsewhere.

    Raises:
        ValueError: n < 1.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    flat = probs.reshape(-1, probs.shape[-1])
    # the kept columns are copied out: the sampler's result can share storage with a V-wide buffer (about 0.6 MB
    # per call at V = 151,936 on CPU) that a returned view would keep alive
    out = torch.multinomial(flat.to(rng_device(generator, flat.device)), max(int(n), 2), replacement=True,
                            generator=generator)[:, :n].clone()
    return out.to(probs.device).reshape(*probs.shape[:-1], n)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token per row of ``probs`` [..., V] with ``generator``; returns long [...] on ``probs``' device
    (:func:`draw`, which says why it is not a one-sample ``torch.multinomial``).

    The draw is made on the generator's device (:func:`rng_device`): ``probs`` is moved there if it lives elsewhere.
    """
    return draw(probs, 1, generator)[..., 0]


def acceptance_probability(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """min(1, p(x) / q(x)) elementwise (Leviathan Alg. 1, Chen Alg. 2); q(x) = 0 gives 1 if p(x) > 0 else 0."""
    ratio = torch.where(q_x > 0, p_x / q_x.clamp_min(torch.finfo(q_x.dtype).tiny), (p_x > 0).to(p_x.dtype))
    return ratio.clamp(max=1.0)


def residual_distribution(p: torch.Tensor, q: torch.Tensor | None, token: int | torch.Tensor) -> torch.Tensor:
    """The residual distribution norm(max(0, p - q)) sampled after a rejection.

    Args:
        p: target distribution, float [V].
        q: draft distribution, float [V], or None for a point-mass draft of ``token`` (then max(0, p - q) is p with
           ``token`` zeroed).
        token: the rejected draft token (used for point masses).

    Returns:
        float [V] summing to 1. If max(0, p - q) has no mass (p == q up to rounding, where a rejection has
        probability 0), p itself is returned so the result is never NaN.
    """
    if q is None:
        r = p.clone()
        r[token] = 0.0
    else:
        r = (p - q).clamp_min(0.0)
    mass = r.sum()
    if not bool(mass > 0):
        return p
    return r / mass


def check_chain_shapes(draft_tokens, target_probs, draft_probs) -> int:
    """γ of a chain verification call; raises ValueError unless target_probs has γ + 1 rows and draft_probs γ."""
    gamma = draft_tokens.shape[0]
    if target_probs.shape[0] != gamma + 1:
        raise ValueError(f"target_probs has {target_probs.shape[0]} rows, expected gamma+1 = {gamma + 1}")
    if draft_probs is not None and draft_probs.shape[0] != gamma:
        raise ValueError(f"draft_probs has {draft_probs.shape[0]} rows, expected gamma = {gamma}")
    return gamma


def verify_chain(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    generator: torch.Generator | None,
    *,
    accept_fn=None,
    residual_fn=None,
) -> tuple[int, int]:
    """Verify one drafted block with the speculative sampling rule (Leviathan et al. 2023, Algorithm 1).

    Accept draft token i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection sample the next token
    from norm(max(0, p_i - q_i)); if all gamma tokens are accepted, sample the bonus token from p_gamma. The tokens
    produced are then distributed exactly as gamma+1 ... tokens sampled from the target (Leviathan Thm 3.5).

    Args:
        target_probs: float [gamma+1, V]; row i is the target distribution before draft token i, row gamma the
            distribution at the bonus position.
        draft_probs: float [gamma, V]; row i is the distribution draft token i was sampled from; None for point-mass
            drafts (n-gram / prompt lookup), where q_i(x_i) = 1.
        draft_tokens: long [gamma].
        generator: the torch.Generator all randomness is drawn from (draws are made on its device).
        accept_fn, residual_fn: replacements for :func:`acceptance_probability` and :func:`residual_distribution`;
            only for negative controls in the exactness battery (a wrong rule must fail the same tests).

    Returns:
        ``(n_accepted, next_token)``: the number of leading draft tokens accepted (0..gamma) and the correction token
        (after a rejection) or bonus token (if all were accepted), as Python ints.

    Raises:
        ValueError: shapes disagree.
    """
    gamma = check_chain_shapes(draft_tokens, target_probs, draft_probs)
    if gamma == 0:
        return 0, int(sample(target_probs[0], generator))
    idx = torch.arange(gamma, device=target_probs.device)
    p_x = target_probs[idx, draft_tokens]
    if draft_probs is None:
        q_x = torch.ones_like(p_x)
    else:
        q_x = draft_probs[idx, draft_tokens]
    u = uniform(gamma, generator, device=target_probs.device, dtype=p_x.dtype)
    accepted = u < (accept_fn or acceptance_probability)(p_x, q_x)
    rejected = (~accepted).nonzero()
    n = int(rejected[0, 0]) if rejected.numel() else gamma
    if n == gamma:
        return n, int(sample(target_probs[gamma], generator))
    q_row = None if draft_probs is None else draft_probs[n]
    residual = (residual_fn or residual_distribution)(target_probs[n], q_row, int(draft_tokens[n]))
    return n, int(sample(residual, generator))


def _draft_rows(draft_probs: torch.Tensor | None, draft_tokens: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Draft rows q [g, V] in ``like``'s dtype; one-hot rows on the drafted tokens for point-mass drafts (None)."""
    g, v = draft_tokens.shape[0], like.shape[-1]
    if draft_probs is None:
        q = torch.zeros(g, v, dtype=like.dtype, device=like.device)
        return q.scatter_(1, draft_tokens.reshape(-1, 1).to(like.device), 1.0)
    return draft_probs.to(device=like.device, dtype=like.dtype)


def block_verification_terms(target_probs: torch.Tensor, draft_probs: torch.Tensor | None,
                             draft_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The quantities of block verification (Sun et al. 2025, arXiv:2403.10444, Algorithm 2) for one drafted block.

    With p_k the target row after k draft tokens and q_k the draft row the (k+1)-th token was drawn from:

    * prefix weights w_0 = 1, w_k = min(1, w_{k-1} · p_{k-1}(x_k) / q_{k-1}(x_k)) for k = 1..g;
    * residual mass Z_k = Σ_x max(0, w_k p_k(x) − q_k(x)) for k = 0..g−1;
    * stopping probabilities h_k = Z_k / (Z_k + 1 − w_k) for k = 1..g−1 (0 where both terms vanish, which only
      happens where a later position stops with certainty) and h_g = w_g.

    The verifier draws η_1..η_g ~ U(0, 1) and keeps τ = the LAST k with η_k <= h_k (τ = 0 if none): the first τ draft
    tokens are accepted (a later position can rescue an earlier one that token verification would reject). The next
    token comes from the residual norm(max(0, w_τ p_τ − q_τ)) if τ < g, else from p_g (the bonus token).

    Args:
        target_probs: float [g+1, V] (row k = p_k); draft_probs: float [g, V] (row k = q_k) or None for point masses
            (one-hot q rows); draft_tokens: long [g].

    Returns:
        ``(h, residual_rows)``: h float [g] (h[k-1] = h_k for k = 1..g) and residual_rows float [g, V]
        (row k = max(0, w_k p_k − q_k), unnormalized), both in target_probs' dtype.
    """
    g = draft_tokens.shape[0]
    p = target_probs
    q = _draft_rows(draft_probs, draft_tokens, p)
    idx = torch.arange(g, device=p.device)
    toks = draft_tokens.to(p.device)
    ratio = torch.where(q[idx, toks] > 0, p[idx, toks] / q[idx, toks].clamp_min(torch.finfo(p.dtype).tiny),
                        (p[idx, toks] > 0).to(p.dtype) * float("inf"))
    w = [p.new_ones(())]
    for k in range(g):
        prev = w[-1]
        w.append(torch.where(prev > 0, torch.clamp(prev * ratio[k], max=1.0), prev))
    w = torch.stack(w)  # [g+1]
    residual_rows = (w[:g, None] * p[:g] - q).clamp_min(0.0)  # [g, V]
    z = residual_rows.sum(-1)  # [g]
    h = torch.empty(g, dtype=p.dtype, device=p.device)
    if g > 1:
        zk, wk = z[1:], w[1:g]
        denom = zk + 1.0 - wk
        h[:-1] = torch.where(denom > 0, zk / denom.clamp_min(torch.finfo(p.dtype).tiny), torch.zeros_like(zk))
    h[-1] = w[g]
    return h, residual_rows


def verify_block(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    generator: torch.Generator | None,
    *,
    terms_fn=None,
) -> tuple[int, int]:
    """Verify one drafted block with block verification (Sun et al. 2025, arXiv:2403.10444, Algorithm 2).

    Same contract as :func:`verify_chain` (drop-in: ``generate(..., verification="block")``). The output tokens are
    distributed exactly as target samples (the paper's Theorem 1; checked by exact enumeration and goodness of fit in
    the exactness battery), and the expected number of accepted tokens is at least token verification's (Theorem 2).
    See :func:`block_verification_terms` for the quantities; τ = the last k with η_k <= h_k.

    Args:
        target_probs: float [gamma+1, V]; draft_probs: float [gamma, V] or None (point masses); draft_tokens: long
            [gamma]; generator: the torch.Generator for all randomness.
        terms_fn: replacement for :func:`block_verification_terms`; only for negative controls in the exactness
            battery (a wrong rule must fail the same tests).

    Returns:
        ``(n_accepted, next_token)`` as Python ints.

    Raises:
        ValueError: shapes disagree.
    """
    gamma = check_chain_shapes(draft_tokens, target_probs, draft_probs)
    if gamma == 0:
        return 0, int(sample(target_probs[0], generator))
    h, residual_rows = (terms_fn or block_verification_terms)(target_probs, draft_probs, draft_tokens)
    eta = uniform(gamma, generator, device=target_probs.device, dtype=h.dtype)  # drawn on the generator's device
    passed = (eta <= h).nonzero()
    tau = int(passed[-1, 0]) + 1 if passed.numel() else 0
    if tau == gamma:
        return tau, int(sample(target_probs[gamma], generator))
    r = residual_rows[tau]
    mass = r.sum()
    row = r / mass if bool(mass > 0) else target_probs[tau]
    return tau, int(sample(row, generator))



def fit_width(logits: torch.Tensor, width: int | None) -> torch.Tensor:
    """Pad (with -inf) or cut logits [..., V'] to the target's width V, so q and p index the same tokens."""
    if width is None or logits.shape[-1] == width:
        return logits
    if logits.shape[-1] > width:
        return logits[..., :width]
    pad = logits.new_full((*logits.shape[:-1], width - logits.shape[-1]), float("-inf"))
    return torch.cat([logits, pad], dim=-1)
