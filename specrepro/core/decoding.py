"""KV-cached autoregressive and chain speculative decoding: one loop over any model backend.

What this file is: one loop, :func:`generate`, that runs the target with a KV cache and, given a drafter, verifies
drafted blocks in one target forward pass (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023, Algorithm 2 —
the same algorithm in two notations: Chen's "modified rejection sampling" with its bonus token is Leviathan's rule,
so both are served by this one code path). Without a drafter it is the autoregressive (AR) baseline, on the same
machinery, so timings compare like with like: AR is speculative decoding with gamma = 0.

The target is driven only through the :class:`specrepro.core.blocklm.BlockLM` interface (a block forward on the
cached prefix, cutting the cache back, the vocabulary width): a transformers causal LM is wrapped in
:class:`specrepro.backends.hf.HFCausalLM` (its ``DynamicCache``; logits stay on its device, in its dtype), a llama.cpp
GGUF model is :class:`specrepro.backends.llamacpp.LlamaCppLM`. The draft side is any :mod:`specrepro.drafters`
drafter, whatever runs it (a transformers draft model, prompt lookup, a llama.cpp draft through
:class:`specrepro.drafters.model.BlockLMDrafter`, adaptive lengths over either).

Cache convention: the target's cache holds every committed token but the last one; each step feeds
``[last committed token, x_1..x_g]`` (g + 1 tokens) and reads g + 1 rows of logits, row i being the target's
distribution before draft token i and row g the bonus position. After verification the cache is cut back to
the committed length minus one, which drops the rejected positions' KV entries.

What it is not: token-tree decoding (:mod:`specrepro.core.trees`) or a batched server; batch size is 1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specrepro.backends.hf import HFCausalLM
from specrepro.core.kvcache import new_cache
from specrepro.core.sampling import (
    GREEDY,
    SamplingConfig,
    greedy_token,
    logits_to_probs,
    verify_block,
    verify_chain,
)

__all__ = ["GenerationResult", "generate", "autoregressive", "speculative", "Stopwatch", "MODEL_EOS",
           "default_eos_ids", "resolve_eos", "prompt_ids", "make_generator", "as_block_lm"]


class Stopwatch:
    """Accumulates wall time per named phase, in seconds; synchronizes CUDA around each timed region."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.cuda = str(device).startswith("cuda")
        self.totals: dict[str, float] = {}

    def _sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def start(self) -> float:
        self._sync()
        return time.perf_counter()

    def stop(self, phase: str, t0: float) -> float:
        self._sync()
        t1 = time.perf_counter()
        self.totals[phase] = self.totals.get(phase, 0.0) + (t1 - t0)
        return t1


@dataclass
class GenerationResult:
    """The output of one :func:`generate` call and its per-step metrics.

    Attributes:
        tokens: the new token ids (prompt excluded), at most ``max_new_tokens``, ending at the first EOS if any.
        drafted: per verification step, number of draft tokens proposed (g <= gamma).
        accepted: per verification step, number of draft tokens accepted.
        alpha_terms: per verified draft position up to and including the first rejection, sum_x min(p(x), q(x))
            (for point-mass drafts p(x_i)); their mean estimates Leviathan's alpha.
        times: seconds per phase: 'prefill', 'draft_prefill' (the draft's own prompt, drafters with a ``prefill``
            method), 'draft', 'target' (target forward passes), 'verify' (logits processing
            and the accept/reject rule); 'total' is the whole call.
        forward_sizes: per step, number of tokens fed to the target (g + 1), with ``target_times`` the time of that
            forward pass in seconds (a cost curve t_target(n)).
        depths: per step, the depth of the verified token tree after pruning to the budget (token-tree and Medusa
            decoding, :func:`specrepro.core.trees.tree_generate`; 0 for a step without a tree); empty for chains, whose
            depth is ``drafted``.
    """

    tokens: list[int]
    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    alpha_terms: list[float] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)
    forward_sizes: list[int] = field(default_factory=list)
    target_times: list[float] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    prompt_len: int = 0
    stopped_at_eos: bool = False

    @property
    def n_steps(self) -> int:
        """Target forward passes after the prefill (verification steps)."""
        return len(self.accepted)

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens committed per target forward pass (accepted + 1, EOS/limit truncation included)."""
        return len(self.tokens) / max(1, self.n_steps)

    @property
    def tokens_per_s(self) -> float:
        """New tokens per second of wall time, prefill included."""
        return len(self.tokens) / max(self.times.get("total", 0.0), 1e-12)

    @property
    def ms_per_token(self) -> float:
        return 1000.0 * self.times.get("total", 0.0) / max(1, len(self.tokens))

    @property
    def alpha(self) -> float:
        """Estimated acceptance rate alpha = E[sum_x min(p, q)] (Leviathan Def. 3.1); NaN without draft tokens."""
        return float(sum(self.alpha_terms) / len(self.alpha_terms)) if self.alpha_terms else float("nan")

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / drafted tokens (empirical, truncated by the first rejection)."""
        return sum(self.accepted) / max(1, sum(self.drafted))

    def per_position_acceptance(self, gamma: int) -> list[float]:
        """P(draft token i accepted | positions < i accepted), i = 0..gamma-1 (NaN where never reached)."""
        reached = [0] * gamma
        acc = [0] * gamma
        for g, n in zip(self.drafted, self.accepted):
            for i in range(min(g, n + 1, gamma)):
                reached[i] += 1
                acc[i] += i < n
        return [a / r if r else float("nan") for a, r in zip(acc, reached)]


class _ModelEOS:
    """The type of :data:`MODEL_EOS` (a sentinel: "the model's own stop tokens")."""

    def __repr__(self) -> str:
        return "MODEL_EOS"


#: Default of ``eos_token_id`` in the decoding loops: stop at the target's ``generation_config.eos_token_id``
#: (:func:`default_eos_ids`), as transformers' ``generate`` does. Pass None or ``()`` for no EOS stop.
MODEL_EOS = _ModelEOS()


def default_eos_ids(model, tokenizer=None) -> list[int]:
    """The stop token ids of ``model``: ``model.generation_config.eos_token_id`` (an int or a list, as transformers'
    ``generate`` reads it), plus ``tokenizer.eos_token_id`` when a tokenizer is given; duplicates removed, order kept.

    Returns:
        list of int (empty when neither names an EOS token).
    """
    ids: list[int] = []
    for src in (getattr(getattr(model, "generation_config", None), "eos_token_id", None),
                getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None):
        if src is None:
            continue
        for e in ([src] if isinstance(src, int) else list(src)):
            if int(e) not in ids:
                ids.append(int(e))
    return ids


def resolve_eos(eos_token_id, model=None) -> set[int]:
    """The set of stop ids of a decoding loop's ``eos_token_id`` argument: :data:`MODEL_EOS` -> the model's (a
    backend's own ``eos_token_ids`` attribute where it has one, e.g. :class:`~specrepro.backends.llamacpp.LlamaCppLM`;
    else :func:`default_eos_ids`; none without a model), None or ``()`` -> none, an int or ints -> those."""
    if isinstance(eos_token_id, _ModelEOS):
        if model is None:
            return set()
        own = getattr(model, "eos_token_ids", None)
        return {int(e) for e in own} if own is not None else set(default_eos_ids(model))
    if eos_token_id is None:
        return set()
    if isinstance(eos_token_id, int):
        return {eos_token_id}
    return {int(e) for e in eos_token_id}


def prompt_ids(input_ids: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """The prompt as long [L] on ``device``, from long [L] or [1, L] (batch size 1).

    Raises:
        ValueError: a batch [B, L] with B > 1 (the loops decode one sequence), more than 2 dimensions, or L = 0.
    """
    if input_ids.dim() > 2 or (input_ids.dim() == 2 and input_ids.shape[0] != 1):
        raise ValueError(f"input_ids must be one prompt, long [L] or [1, L]; got shape {tuple(input_ids.shape)} "
                         f"(batches are not supported: decode the prompts one at a time)")
    ids = input_ids.reshape(-1).to(device)
    if ids.numel() == 0:
        raise ValueError("empty prompt: input_ids needs at least one token")
    return ids


def make_generator(generator: torch.Generator | None, seed: int | None,
                   device: torch.device | str) -> torch.Generator | None:
    """``generator``, or a new ``torch.Generator`` on ``device`` seeded with ``seed`` (None if neither is given).

    Raises:
        ValueError: both ``generator`` and ``seed`` given, or a seed that is not an integer.
    """
    if seed is None:
        return generator
    if generator is not None:
        raise ValueError("pass either generator= or seed=, not both")
    if isinstance(seed, bool) or int(seed) != seed:
        raise ValueError(f"seed must be an integer, got {seed!r}")
    return torch.Generator(device=device).manual_seed(int(seed))


def _check_args(gamma: int, max_new_tokens: int):
    if int(gamma) != gamma or gamma < 0:
        raise ValueError(f"gamma (draft length) must be an integer >= 1 for speculative decoding, got {gamma!r}")
    if int(max_new_tokens) != max_new_tokens or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")


@torch.inference_mode()
def prefill(target, ids: torch.Tensor):
    """A fresh KV cache of the transformers model ``target`` holding every prompt token but the last (long [L],
    L >= 1): the cache convention of :func:`specrepro.core.trees.tree_generate` and
    :func:`specrepro.core.medusa.medusa_generate` (and of :func:`generate`, which fills its target's cache the same way
    through :meth:`~specrepro.backends.hf.HFCausalLM.forward_block`), whose every step feeds [last committed token] +
    draft tokens."""
    cache = new_cache(target)
    if ids.numel() > 1:
        target(input_ids=ids[None, :-1], past_key_values=cache, use_cache=True, logits_to_keep=1)
    return cache


def commit_step(step: list[int], budget: int, eos: set[int], res: "GenerationResult") -> list[int]:
    """The tokens one step commits: ``step`` (accepted drafts + the correction/bonus token) cut to the remaining
    ``budget`` and just after the first EOS (which sets ``res.stopped_at_eos``), so that no token lies past either."""
    step = step[:budget]
    for i, tok in enumerate(step):
        if tok in eos:
            res.stopped_at_eos = True
            return step[: i + 1]
    return step


def as_block_lm(target):
    """``target`` as a :class:`~specrepro.core.blocklm.BlockLM`: itself when it has ``forward_block`` (a backend such
    as :class:`~specrepro.backends.llamacpp.LlamaCppLM`, or an :class:`~specrepro.backends.hf.HFCausalLM` already),
    else a transformers causal LM wrapped in a new :class:`~specrepro.backends.hf.HFCausalLM`."""
    return target if hasattr(target, "forward_block") else HFCausalLM(target)


def generate(
    target,
    input_ids: torch.Tensor,
    *,
    drafter=None,
    gamma: int = 4,
    max_new_tokens: int = 128,
    sampling: SamplingConfig = GREEDY,
    generator: torch.Generator | None = None,
    eos_token_id: int | list[int] | None = MODEL_EOS,
    seed: int | None = None,
    verification="token",
) -> GenerationResult:
    """Decode from ``target``, autoregressively (``drafter=None``) or with chain speculative decoding.

    Each step: the drafter proposes x_1..x_g (g <= min(gamma, tokens left - 1)) with the distributions q it drew
    them from (None for point masses); the target runs ``[last committed token, x_1..x_g]`` in one ``forward_block``
    (g + 1 rows of logits), processed by :func:`~specrepro.core.sampling.logits_to_probs` into p; ``verification``
    accepts a prefix of the block and draws the correction or bonus token; the drafter hears how many of its tokens
    were kept (``feedback``); the target's cache is cut back to the committed length minus one. A greedy step with
    no draft token (AR, or a block's last token) takes the argmax (:func:`~specrepro.core.sampling.greedy_token`):
    the token p's one-hot row and the verification's draw from it give, without building that V-wide row.

    Args:
        target: a transformers causal LM (``AutoModelForCausalLM``) on any device, wrapped in
            :class:`~specrepro.backends.hf.HFCausalLM` (a new KV cache per call), or any
            :class:`~specrepro.core.blocklm.BlockLM` (e.g. :class:`~specrepro.backends.llamacpp.LlamaCppLM`; reset
            first). Its device (``device`` attribute; the CPU for a backend without one) is where the committed
            ids, the draws and the verification live.
        input_ids: long [L] or [1, L], the prompt (L >= 1); one sequence (batch size 1). A BlockLM target also
            takes a sequence of L ints.
        drafter: a :mod:`specrepro.drafters` drafter, or None for the AR baseline. Its model may live on another
            device than the target: draft tokens and distributions are moved to the target's device to be verified.
        gamma: draft length γ >= 1 (ignored for AR). Fewer are drafted near ``max_new_tokens``.
        max_new_tokens: the exact cap on new tokens.
        sampling: temperature / top-k / top-p, applied identically to target and draft (temperature 0 = greedy).
        generator: torch.Generator, the only source of randomness; best on the target's device (a generator on
            another device, e.g. a CPU generator with a CUDA target, works: each draw is made on the generator's
            device and moved back).
        eos_token_id: stop after this token (or any of these); it is included in the output, nothing after it.
            Default :data:`MODEL_EOS`: a transformers target's ``generation_config.eos_token_id``
            (:func:`default_eos_ids`), as transformers' ``generate``; a backend's ``eos_token_ids`` attribute (none
            if it has none). None (or ``()``) never stops early.
        seed: instead of ``generator``: a new ``torch.Generator`` on the target's device seeded with ``seed``.
        verification: the chain rule: "token" (:func:`~specrepro.core.sampling.verify_chain`, Leviathan Alg. 1) or "block"
            (:func:`~specrepro.core.sampling.verify_block`, Sun et al. 2025 block verification); both exact. A callable
            with verify_chain's signature replaces the rule (negative controls of the exactness battery).

    Returns:
        :class:`GenerationResult`. The token sequence is distributed exactly as AR sampling from the processed
        target distribution (Leviathan Thm. 3.5); under greedy it equals AR greedy up to floating-point ties.

    Raises:
        ValueError: gamma < 1 with a drafter, max_new_tokens < 1, an empty prompt or a batch [B > 1, L], sampling
            without a generator or seed, both generator and seed, NaN logits, unknown verification, target logits
            of another shape than [g + 1, V], draft distributions of another width than the target's logits.
    """
    if not callable(verification) and verification not in ("token", "block"):
        raise ValueError(f"unknown verification {verification!r}; expected 'token' or 'block'")
    if drafter is not None and gamma < 1:
        raise ValueError(f"gamma (draft length) must be >= 1, got {gamma!r}")
    _check_args(gamma, max_new_tokens)
    lm = as_block_lm(target)
    takes_tensors = isinstance(lm, HFCausalLM)  # other backends take lists of ints
    device = getattr(lm, "device", "cpu")
    if not isinstance(input_ids, torch.Tensor):
        input_ids = torch.as_tensor([int(t) for t in input_ids], dtype=torch.long)
    ids = prompt_ids(input_ids, device)
    generator = make_generator(generator, seed, device)
    if generator is None and not sampling.greedy:
        raise ValueError("sampling needs an explicit torch.Generator (pass generator=torch.Generator().manual_seed(s) "
                         "or seed=s)")
    eos = resolve_eos(eos_token_id, lm.model if takes_tensors else lm)
    vocab = int(lm.vocab_size)
    clock = Stopwatch(device)
    res = GenerationResult(tokens=[], prompt_len=int(ids.numel()))
    if drafter is not None:
        drafter.reset()
    feedback = getattr(drafter, "feedback", None)
    verify = verification if callable(verification) else (verify_chain if verification == "token" else verify_block)

    t_start = clock.start()
    lm.reset()
    if ids.numel() > 1:  # the cache convention: every prompt token but the last
        lm.forward_block(ids[:-1] if takes_tensors else ids[:-1].tolist(), logits_to_keep=0)
    t = clock.stop("prefill", t_start)
    warm = getattr(drafter, "prefill", None)
    if warm is not None and ids.numel() > 1:  # the draft's own prompt, timed apart from its drafting steps
        warm(ids)
        t = clock.stop("draft_prefill", t)

    new: list[int] = []
    while len(new) < max_new_tokens:
        budget = max_new_tokens - len(new)
        g = min(gamma, budget - 1) if drafter is not None else 0
        if g > 0:
            prop = drafter.propose(ids, g, sampling, generator)
            draft_tokens = prop.tokens.to(device)
            draft_probs = prop.probs.to(device) if prop.probs is not None else None  # the draft may live elsewhere
            t = clock.stop("draft", t)
        else:
            draft_tokens, draft_probs = ids.new_empty(0), None
        g = int(draft_tokens.numel())
        feed = torch.cat([ids[-1:], draft_tokens])
        logits = lm.forward_block(feed if takes_tensors else feed.tolist(), logits_to_keep=g + 1)
        t_new = clock.stop("target", t)
        res.forward_sizes.append(g + 1)
        res.target_times.append(t_new - t)
        t = t_new
        if logits.dim() != 2 or logits.shape[0] != g + 1 or logits.shape[1] != vocab:
            raise ValueError(f"the target returned logits of shape {tuple(logits.shape)} for a block of {g + 1} "
                             f"tokens over {vocab}")
        if g == 0 and sampling.greedy:  # a greedy step with nothing to verify: the argmax, no V-wide row
            n, nxt = 0, greedy_token(logits[0])
        else:
            p = logits_to_probs(logits, sampling)
            if draft_probs is not None and draft_probs.shape[-1] != p.shape[-1]:
                raise ValueError(f"draft distributions have width {draft_probs.shape[-1]}, target logits "
                                 f"{p.shape[-1]}")
            n, nxt = verify(p, draft_probs, draft_tokens, generator)
        if g:
            q_rows = draft_probs[: min(n + 1, g)] if draft_probs is not None else None
            rows = p[: min(n + 1, g)]
            if q_rows is not None:
                # a probability: a float32 sum over the vocabulary may pass 1 by rounding when q = p
                res.alpha_terms.extend(torch.minimum(rows, q_rows).sum(-1).clamp(max=1.0).tolist())
            else:
                res.alpha_terms.extend(rows.gather(1, draft_tokens[: rows.shape[0], None]).squeeze(1).tolist())
        step = commit_step(draft_tokens[:n].tolist() + [nxt], budget, eos, res)
        res.drafted.append(g)
        res.accepted.append(n)
        if g and feedback is not None:
            feedback(g, n)  # the drafter hears how many of its tokens were kept
        new.extend(step)
        ids = torch.cat([ids, torch.tensor(step, dtype=ids.dtype, device=device)])
        lm.truncate(ids.numel() - 1)
        t = clock.stop("verify", t)
        if res.stopped_at_eos:
            break
    clock.stop("total", t_start)
    res.tokens = new
    res.times = dict(clock.totals)
    return res


def autoregressive(target, input_ids, **kwargs) -> GenerationResult:
    """The AR baseline: :func:`generate` without a drafter."""
    kwargs.pop("drafter", None)
    return generate(target, input_ids, drafter=None, **kwargs)


def speculative(target, drafter, input_ids, **kwargs) -> GenerationResult:
    """Chain speculative decoding: :func:`generate` with a drafter (Leviathan Alg. 1 / Chen Alg. 2)."""
    return generate(target, input_ids, drafter=drafter, **kwargs)



def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the longest common prefix of two long [L] token sequences (to reuse a draft model's KV cache)."""
    n = min(a.shape[0], b.shape[0])
    if n == 0:
        return 0
    diff = (a[:n] != b[:n]).nonzero()
    return int(diff[0, 0]) if diff.numel() else n
