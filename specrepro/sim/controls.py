"""Published bugs, replayed: negative (and look-alike positive) controls for the exactness battery.

What this file is: a registry (:data:`BUGS`) of minimal reimplementations of mistakes that were reported in public
speculative-decoding implementations, each injected into OUR real decoding loop (:func:`specrepro.core.decoding.generate`:
a drafter that samples or reports the wrong distribution, a verification rule passed as ``verification=``, or the
target's logits processing replaced for the duration of the run), with the thread it comes from cited. Each
negative control must be caught by the battery at its stated level (chi-square goodness of fit of ``n`` sequences
against the target's exact distribution, :func:`specrepro.stats.gof_test`, or, for the seed bug, a
reproducibility check; several also by exact enumeration, :attr:`PublishedBug.rule`). Each positive control looks
like a bug but is exact, and must pass.

Every thread cited here was read (through the public issue/PR text) before being cited; a docstring says what the
thread reports and how the reimplementation reads it. These are minimal reimplementations of the *mistake*, not
copies of the projects' code.

What it is not: the correct algorithms (:mod:`specrepro.core.sampling`, :mod:`specrepro.core.decoding`) or the statistics
(:mod:`specrepro.sim`).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Callable
from unittest import mock

import torch

from specrepro.core.sampling import (
    SamplingConfig,
    acceptance_probability,
    logits_to_probs,
    residual_distribution,
    sample,
    verify_block,
    verify_chain,
)
from specrepro.drafters.base import Proposal
from specrepro.sim.exact import (
    RULES,
    Rule,
    chain_verify_outcomes,
    exact_chain_distribution,
    target_distribution,
)
from specrepro.sim.toy import ToyLM
from specrepro.stats import empirical_distribution, gof_test, total_variation

__all__ = ["PublishedBug", "BUGS", "NEGATIVE", "POSITIVE", "DrawDrafter", "draw_sequences", "check_bug", "bug_table",
           "tokenwise_block_terms"]

PROMPT = torch.tensor([1, 5, 2, 7])
#: an exact rule's enumerated TV is float64 rounding (< 1e-12); a mistake must move it above this
ENUMERATION_TV_LEVEL = 1e-6


# ----------------------------------------------------------------------------------------------------------------
# Injection points
# ----------------------------------------------------------------------------------------------------------------

class DrawDrafter:
    """A draft model drafter whose per-token draw is replaceable: ``draw(logits float [V], sampling, generator) ->
    (token long [], reported_row float [V] or None)``. The reported rows are what the verifier divides by (None for
    every row: a point-mass proposal). Runs the draft without a KV cache (one full forward per draft token), which is
    fine for the tiny models of the battery.

    Args:
        model: a transformers causal LM; vocab_size: the target's width V (the draft's logits are cut/padded to it).
    """

    def __init__(self, model, vocab_size: int, draw: Callable, name: str = "draw drafter"):
        self.model, self.vocab_size, self.draw, self.name = model, vocab_size, draw, name

    def reset(self) -> None:
        pass

    @torch.inference_mode()
    def propose(self, ids, gamma, sampling, generator):
        toks, rows = [], []
        ctx = ids.reshape(-1)
        for _ in range(gamma):
            logits = self.model(input_ids=ctx[None]).logits[0, -1].float()
            v = logits.shape[-1]
            if v > self.vocab_size:
                logits = logits[: self.vocab_size]
            elif v < self.vocab_size:
                logits = torch.cat([logits, logits.new_full((self.vocab_size - v,), float("-inf"))])
            x, row = self.draw(logits, sampling, generator)
            toks.append(x.reshape(()))
            rows.append(row)
            ctx = torch.cat([ctx, x.reshape(1)])
        tok = torch.stack(toks) if toks else torch.empty(0, dtype=torch.long)
        if any(r is None for r in rows) or not rows:
            return Proposal(tok, None)
        return Proposal(tok, torch.stack(rows))


def _correct_draw(logits, sampling, generator):
    q = logits_to_probs(logits, sampling)
    x = q.argmax() if sampling.greedy else sample(q, generator)
    return x, q


@contextlib.contextmanager
def _target_probs_as(fn):
    """Replace the target's logits processing inside :func:`specrepro.core.decoding.generate` (drafters keep theirs)."""
    with mock.patch("specrepro.core.decoding.logits_to_probs", fn):
        yield


def _unprocessed(logits, config):
    return torch.softmax(logits.float(), -1)


# ----------------------------------------------------------------------------------------------------------------
# The bugs
# ----------------------------------------------------------------------------------------------------------------

def _raw_q_draw(logits, sampling, generator):
    q = logits_to_probs(logits, sampling)
    return sample(q, generator), torch.softmax(logits, -1)


def _greedy_draft_softmax_q_draw(logits, sampling, generator):
    return logits.argmax(), logits_to_probs(logits, sampling)


def _argmax_draft_raw_softmax_draw(logits, sampling, generator):
    return logits.argmax(), torch.softmax(logits, -1)


def _bf16_draw(logits, sampling, generator):
    lb = logits.bfloat16()  # the draft model's native-dtype logits
    t = sampling.temperature
    q_native = torch.softmax(lb / t, -1).float()  # temperature and softmax in bfloat16
    q_native = q_native / q_native.sum()
    return sample(q_native, generator), logits_to_probs(lb.float(), sampling)


def _inplace_exponential_draw(logits, sampling, generator):
    q = logits_to_probs(logits, sampling)
    e = torch.empty_like(q).exponential_(1.0, generator=generator)
    q.div_(e)  # the exponential race x = argmax q / E is an exact draw from q ... but q is now overwritten
    return q.argmax(), q


def _point_mass_draw(logits, sampling, generator):
    q = logits_to_probs(logits, sampling)
    return (q.argmax() if sampling.greedy else sample(q, generator)), None


def _argmax_point_mass_draw(logits, sampling, generator):
    return logits.argmax(), None


def _always_accept(target_probs, draft_probs, draft_tokens, generator):
    return verify_chain(target_probs, draft_probs, draft_tokens, generator,
                        accept_fn=lambda p, q: torch.ones_like(p))


def _argmax_everywhere_chain(target_probs, draft_probs, draft_tokens, generator):
    """Greedy done as 'argmax of every sample' while the rule keeps the (T = 1) softmax ratios."""
    g = draft_tokens.shape[0]
    for i in range(g):
        x = int(draft_tokens[i])
        p, q = target_probs[i], draft_probs[i]
        u = torch.rand((), generator=generator, dtype=p.dtype)
        if not bool(u < acceptance_probability(p[x], q[x].to(p.dtype))):
            return i, int(residual_distribution(p, q.to(p.dtype), x).argmax())
    return g, int(target_probs[g].argmax())


def _ratio_to_target_max_verify(target_probs, draft_probs, draft_tokens, generator):
    g = draft_tokens.shape[0]
    for i in range(g):
        p = target_probs[i]
        x = int(draft_tokens[i])
        a = min(1.0, float(p[x]) / float(p.max()))
        if not float(torch.rand((), generator=generator)) < a:
            return i, int(sample(residual_distribution(p, None, x), generator))
    return g, int(sample(target_probs[g], generator))


def _global_rng_verify(target_probs, draft_probs, draft_tokens, generator):
    """The rule's uniforms and residual draws come from torch's global RNG instead of the request's generator."""
    return verify_chain(target_probs, draft_probs, draft_tokens, None)


def tokenwise_block_terms(target_probs, draft_probs, draft_tokens):
    """A block verifier that keeps the token-wise criterion: h_k = min(1, p_{k-1}(x_k) / q_{k-1}(x_k)) with the LAST
    passing position kept (a block-style scan), and the plain residual max(0, p_k - q_k) (no prefix weight)."""
    g = draft_tokens.shape[0]
    idx = torch.arange(g)
    q = draft_probs.to(target_probs.dtype)
    h = acceptance_probability(target_probs[idx, draft_tokens], q[idx, draft_tokens])
    return h, (target_probs[:g] - q).clamp_min(0.0)


def _tokenwise_block_verify(target_probs, draft_probs, draft_tokens, generator):
    return verify_block(target_probs, draft_probs, draft_tokens, generator, terms_fn=tokenwise_block_terms)


def _sampler_match(target_probs, draft_probs, draft_tokens, generator):
    """Verification by agreement: sample y_i from the target row; accept x_i iff y_i == x_i, else emit y_i."""
    g = draft_tokens.shape[0]
    for i in range(g):
        y = int(sample(target_probs[i], generator))
        if y != int(draft_tokens[i]):
            return i, y
    return g, int(sample(target_probs[g], generator))


class _Bf16Draft(ToyLM):
    """A draft ToyLM that samples through bfloat16 temperature + softmax (``probs``) but reports the float32 processed
    distribution of the same bfloat16 logits (``raw``, used by ``Rule(q_for_rule='raw')``)."""

    def __init__(self, toy: ToyLM, config: SamplingConfig):
        super().__init__(toy.vocab, toy.logits_fn)
        self._config = config

    def probs(self, prefix, config):
        lb = self.logits_fn(prefix).to(torch.bfloat16)
        r = torch.softmax(lb / config.temperature, -1).double()
        return r / r.sum()

    def raw(self, prefix):
        return logits_to_probs(self.logits_fn(prefix).to(torch.bfloat16).double(), self._config)


# ----------------------------------------------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PublishedBug:
    """One control. ``negative``: must be caught (check 'gof': p-value < level; 'reproducibility': two runs with the
    same seed differ); positive: must pass (p-value > level).

    Attributes:
        name: registry key; thread: "owner/repo#N" (None: not tied to a thread); url; reported: what the thread
            reports, in our words; replay: how it is reimplemented here; config: the sampling setting it is tested
            at; draw: a :class:`DrawDrafter` draw function (None: the correct draft); verification: "token",
            "block" or a callable for ``generate(verification=...)``; target_probs: a replacement for the target's
            logits processing in the loop (None: the correct one); rule: an exact-enumeration
            :class:`~specrepro.sim.exact.Rule` of the same mistake, where one exists; enumerate_fn: ``f(target ToyLM,
            draft ToyLM, config, gamma, length) -> exact distribution`` of the mistake where it is not a Rule;
            check: "gof" (chi-square through the loop, p < level), "enumeration" (exact TV to the target > 1e-6, for a
            mistake too small for any feasible Monte Carlo; the GOF through the loop is still reported) or
            "reproducibility"; n, level: the Monte Carlo sample size and significance level.
    """

    name: str
    thread: str | None
    url: str
    reported: str
    replay: str
    config: SamplingConfig
    negative: bool = True
    draw: Callable | None = None
    verification: object = "token"
    target_probs: Callable | None = None
    rule: Rule | None = None
    enumerate_fn: Callable | None = None
    check: str = "gof"
    n: int = 1500
    level: float = 1e-3
    gamma: int = 3
    tags: tuple = field(default_factory=tuple)


_T1 = SamplingConfig(1.0)
class _ArgmaxDraft:
    """A toy draft that proposes its argmax (a point mass) wherever the wrapped one would sample."""

    def __init__(self, draft):
        self.draft = draft

    def probs(self, prefix, config):
        q = self.draft.probs(prefix, config)
        return torch.zeros_like(q).scatter_(0, q.argmax().reshape(1), 1.0)


def point_mass_chain_distribution(target, draft, config, gamma: int, length: int, argmax: bool = False) -> dict:
    """Exact law of chain decoding whose drafts are verified as point masses (accept x with p(x), residual p without
    x): drafts drawn from q (``point-mass-report``) or q's argmax (``greedy-draft-sampler-match``, whose token-equality
    check against a target sample has the same law), γ = min(gamma, tokens left - 1) per step as in ``generate``."""
    from specrepro.sim.verifiers import chain_step_distribution, multistep_distribution

    proposer = _ArgmaxDraft(draft) if argmax else draft

    def outcomes(ps, qs, drafted):
        if not drafted:
            return chain_verify_outcomes(ps, None, drafted, RULES["speculative"])
        onehot = torch.zeros(len(drafted), ps.shape[-1], dtype=ps.dtype)
        onehot[torch.arange(len(drafted)), torch.tensor(drafted)] = 1.0
        return chain_verify_outcomes(ps, onehot, drafted, RULES["speculative"])

    def step(ctx, remaining):
        return chain_step_distribution(target, proposer, config, min(gamma, remaining - 1), outcomes, ctx)

    return multistep_distribution(step, length)


_TK = SamplingConfig(0.8, top_k=4)

BUGS: dict[str, PublishedBug] = {b.name: b for b in [
    PublishedBug(
        "raw-q", "huggingface/transformers#47932", "https://github.com/huggingface/transformers/issues/47932",
        "candidate generators sample draft tokens from the processor-applied (top-k) logits but return the raw "
        "logits as q, so the acceptance ratio and the residual use a q the tokens were not drawn from",
        "draft sampled from the processed q, the raw softmax reported as q", _TK, draw=_raw_q_draw,
        rule=RULES["raw_q"], n=400),
    PublishedBug(
        "greedy-draft-softmax-q", "huggingface/transformers#32867",
        "https://github.com/huggingface/transformers/issues/32867",
        "the assistant model is always used greedily while the probability ratio uses the assistant's output "
        "probabilities (equivalent to drafting at temperature 0 but dividing by the temperature-1 distribution)",
        "draft = argmax of the draft logits at T > 0, its processed softmax reported as q", _T1,
        draw=_greedy_draft_softmax_q_draw, n=300),
    PublishedBug(
        "argmax-sample-softmax-rule", "jaymody/speculative-sampling#3",
        "https://github.com/jaymody/speculative-sampling/issues/3",
        "greedy decoding took the argmax of the draft (and of every sample) while the rejection rule used the "
        "softmax of the raw logits; the maintainer confirmed the rule only recovers the target if one samples from "
        "the draft distribution, and fixed greedy as temperature 0 (one-hot distributions)",
        "greedy mode: every 'sample' is an argmax, but the rule's p and q are the temperature-1 softmax",
        SamplingConfig(0.0), draw=_argmax_draft_raw_softmax_draw, verification=_argmax_everywhere_chain,
        target_probs=_unprocessed, n=200),
    PublishedBug(
        "target-rows-unprocessed", "vllm-project/vllm#10198", "https://github.com/vllm-project/vllm/pull/10198",
        "the scorer computed the target probabilities with default sampling parameters (temperature 1, top-p 1) "
        "while the draft probabilities were processed (fix for vllm-project/vllm#9834)",
        "every target row the rule sees is the plain softmax; the draft is processed", _TK,
        target_probs=_unprocessed, n=300),
    PublishedBug(
        "bf16-draft-sampling", "deepseek-ai/DeepSpec#31", "https://github.com/deepseek-ai/DeepSpec/issues/31",
        "draft tokens are sampled through the native-dtype (bfloat16) logits path while rejection and correction "
        "use the float32 distribution; fixed by casting to float32 before temperature scaling and softmax",
        "temperature and softmax of the draft's bfloat16 logits in bfloat16 for the draw, float32 for q",
        SamplingConfig(0.5), draw=_bf16_draw, check="enumeration", n=300,
        enumerate_fn=lambda target, draft, cfg, gamma, length: exact_chain_distribution(
            target, _Bf16Draft(draft, cfg), cfg, gamma, length, rule=Rule("bf16", q_for_rule="raw"))),
    PublishedBug(
        "always-accept", "vllm-project/vllm-ascend#13730", "https://github.com/vllm-project/vllm-ascend/issues/13730",
        "the NPU rejection kernel hard-codes the uniform u = 0, so every draft token is accepted under sampling "
        "(the same failure, every draft token accepted, was fixed in huggingface/transformers PR #28508: a faulty "
        "test of the number of matches)",
        "acceptance probability replaced by 1", _T1, verification=_always_accept,
        rule=Rule("always_accept", accept=lambda p, q: torch.ones_like(p)), n=600),
    PublishedBug(
        "inplace-draft-probs", "vllm-project/vllm#16952", "https://github.com/vllm-project/vllm/pull/16952",
        "draft probabilities were divided in place (probs.div_(q)) by the exponential noise of the sampling trick, "
        "although they are used later for rejection sampling",
        "draft drawn by the exponential race argmax q/E (an exact draw from q), but q overwritten by q/E and "
        "reported", _T1, draw=_inplace_exponential_draw, n=1000),
    PublishedBug(
        "block-verify-tokenwise", "vllm-project/vllm-ascend#7807",
        "https://github.com/vllm-project/vllm-ascend/issues/7807",
        "the block-verify rejection sampler used the token-wise acceptance criterion and did not adjust the "
        "residual distribution as in Sun et al. (fixed in PR #7808)",
        "block-style scan (the last passing position is kept) with token-wise h_k = min(1, p/q) and the plain "
        "residual max(0, p - q)", _T1, verification=_tokenwise_block_verify,
        # n = 1000 caught it at level 0.001 for 9 of 10 seeds (p up to 0.017), 2000 for 10 of 10
        rule=Rule("block_tokenwise", kind="block", block_terms=tokenwise_block_terms), n=2000),
    PublishedBug(
        "ratio-to-target-max", "1bit-MONSTER/1bit-MONSTER#637", "https://github.com/1bit-MONSTER/1bit-MONSTER/issues/637",
        "a DFlash acceptance computed min(1, p(x) / max_y p(y)) from the target's probabilities instead of the "
        "speculative ratio",
        "argmax (point-mass) draft accepted with min(1, p(x) / max p) instead of p(x); residual = p without x "
        "(the thread does not show the residual; this is the correct point-mass one)", _T1,
        draw=_argmax_point_mass_draw, verification=_ratio_to_target_max_verify, n=300),
    PublishedBug(
        "seed-ignored", "vllm-project/vllm#6034", "https://github.com/vllm-project/vllm/pull/6034",
        "the rejection sampler drew its uniforms with torch.rand, ignoring the per-request generator, so a seeded "
        "request was not reproducible (fixes vllm-project/vllm#6038)",
        "the rule's randomness from torch's global RNG instead of the passed generator", _T1,
        verification=_global_rng_verify, check="reproducibility", n=20),
    # positive controls: look like bugs, are exact
    PublishedBug(
        "point-mass-report", "vllm-project/vllm#40149", "https://github.com/vllm-project/vllm/issues/40149",
        "with a draft model, None is passed as draft_probs to the rejection sampler (the path meant for n-gram "
        "drafts), reported as deviating from the p/q rule",
        "draft sampled from q but reported as a point mass: accept with p(x), residual p without x - exact "
        "(Leviathan's proof holds for any proposal), only the acceptance rate drops", _T1, negative=False,
        draw=_point_mass_draw, n=500, enumerate_fn=point_mass_chain_distribution),
    PublishedBug(
        "greedy-draft-sampler-match", "z-lab/dflash#74", "https://github.com/z-lab/dflash/issues/74",
        "the draft is sampled greedily (temperature not passed) while the target samples, and acceptance is a "
        "token-equality check against the target's samples; reported as breaking the target distribution",
        "argmax draft, target sample y_i at each position, accept while y_i equals the draft token, else emit y_i: "
        "every emitted token is a fresh target sample, so this is exact (lower acceptance); the battery confirms",
        _T1, negative=False, draw=_argmax_point_mass_draw, verification=_sampler_match, n=500,
        enumerate_fn=functools.partial(point_mass_chain_distribution, argmax=True)),
]}
NEGATIVE = tuple(k for k, b in BUGS.items() if b.negative)
POSITIVE = tuple(k for k, b in BUGS.items() if not b.negative)


# ----------------------------------------------------------------------------------------------------------------
# Running and checking
# ----------------------------------------------------------------------------------------------------------------

def draw_sequences(bug: PublishedBug, target, draft, n: int | None = None, seed: int = 0, length: int = 3,
                   prompt: torch.Tensor = PROMPT, vocab_size: int | None = None) -> list[tuple]:
    """``n`` sequences of ``length`` new tokens from :func:`specrepro.core.decoding.generate` with ``bug`` injected
    (one torch.Generator seeded with ``seed`` for all of them). The models run behind
    :class:`~specrepro.sim.memo.MemoizedLM` (each distinct forward pass once, then replayed bit for bit: the same
    sequences as the bare models, faster)."""
    from specrepro.core.decoding import generate
    from specrepro.drafters.model import DraftModelDrafter
    from specrepro.sim.memo import MemoizedLM

    target = target if isinstance(target, MemoizedLM) else MemoizedLM(target)
    draft = draft if isinstance(draft, MemoizedLM) else MemoizedLM(draft)
    vocab = vocab_size or target.config.vocab_size
    n = n or bug.n
    drafter = DrawDrafter(draft, vocab, bug.draw, bug.name) if bug.draw else DraftModelDrafter(draft, vocab)
    ctx = _target_probs_as(bug.target_probs) if bug.target_probs else contextlib.nullcontext()
    g = torch.Generator().manual_seed(seed)
    out = []
    with ctx:
        for _ in range(n):
            res = generate(target, prompt, drafter=drafter, gamma=bug.gamma, max_new_tokens=length,
                           sampling=bug.config, generator=g, verification=bug.verification)
            out.append(tuple(res.tokens))
    return out


def check_bug(bug: PublishedBug | str, target, draft, seed: int = 0, length: int = 3, n: int | None = None,
              prompt: torch.Tensor = PROMPT) -> dict:
    """Run one control through the battery.

    Returns:
        dict: name, thread, negative, check, config, n, level, p_value (gof through the loop) or differing
        (reproducibility: fraction of seeded re-runs that differ), tv_empirical (TV of the empirical to the exact
        distribution; sampling noise for an exact sampler), tv_enumeration (exact TV of the mistake to the target by
        enumeration on the same tiny models, where the mistake has an enumeration; NaN otherwise), detected (the
        battery flags it), as_expected (detected for negative controls, not detected for positive ones).
    """
    bug = BUGS[bug] if isinstance(bug, str) else bug
    row = {"name": bug.name, "thread": bug.thread or "(not tied to a thread)", "negative": bug.negative,
           "check": bug.check, "config": _cfg_name(bug.config), "n": n or bug.n, "level": bug.level}
    if bug.check == "reproducibility":
        k = n or bug.n
        with torch.random.fork_rng():  # the global RNG moves between the two passes, as it does in a server
            torch.manual_seed(seed + 12345)
            runs = [draw_sequences(bug, target, draft, 1, seed + i, length, prompt) for i in range(k)]
            torch.manual_seed(seed + 54321)
            again = [draw_sequences(bug, target, draft, 1, seed + i, length, prompt) for i in range(k)]
        differing = sum(x != y for x, y in zip(runs, again)) / k
        row.update(p_value=float("nan"), differing=differing, tv_empirical=float("nan"))
        row["detected"] = differing > 0
    else:
        samples = draw_sequences(bug, target, draft, n, seed, length, prompt)
        exact = target_distribution(ToyLM.from_transformer(target, prompt), bug.config, length)
        _, pval = gof_test(samples, exact)
        row.update(p_value=pval, differing=float("nan"),
                   tv_empirical=total_variation(empirical_distribution(samples), exact))
        row["detected"] = pval < bug.level
    row["tv_enumeration"] = float("nan")
    if bug.rule is not None or bug.enumerate_fn is not None:
        t_toy, d_toy = ToyLM.from_transformer(target, prompt), ToyLM.from_transformer(draft, prompt)
        exact = target_distribution(t_toy, bug.config, length)
        if bug.enumerate_fn is not None:
            got = bug.enumerate_fn(t_toy, d_toy, bug.config, bug.gamma, length)
        else:
            got = exact_chain_distribution(t_toy, d_toy, bug.config, bug.gamma, length, rule=bug.rule)
        row["tv_enumeration"] = total_variation(got, exact)
        if bug.check == "enumeration":
            row["detected"] = row["tv_enumeration"] > ENUMERATION_TV_LEVEL
    row["as_expected"] = row["detected"] == bug.negative
    return row


def _cfg_name(c: SamplingConfig) -> str:
    if c.greedy:
        return "greedy"
    s = f"T={c.temperature:g}"
    if c.top_k:
        s += f", top-k {c.top_k}"
    if c.top_p < 1:
        s += f", top-p {c.top_p:g}"
    return s


def bug_table(target, draft, names=None, seed: int = 0):
    """:func:`check_bug` for every registry entry (or ``names``): a pandas.DataFrame, one row per control."""
    import pandas as pd

    return pd.DataFrame([check_bug(BUGS[k], target, draft, seed) for k in (names or BUGS)])
