"""Leviathan et al. 2023, Table 2 analogue, cut into shards: the cost curves and the timed γ sweeps of notebook 04.

What this file is: what notebook 04 measures, as pieces that each fit in one sitting. A :class:`Table2Setting` (the
notebook's parameters) names the models, the workload slice and the sizes; :func:`shard_names` lists its shards:

- ``cost_curves``: one KV-cached forward of n new tokens on a 200-token prefix, target and draft models
  (:func:`measure_cost_curves`);
- ``leviathan_table2_runs_t0_p<k>``: the greedy γ sweep (AR, the draft model and its int8 copy at every γ, the
  bigram and prompt-lookup drafts) on prompts ``[k·s, (k+1)·s)`` of the workload, every pass (:func:`run_part`);
- ``leviathan_table2_runs_t1_p<k>``: the T = 1 runs (AR, the two free drafts, each draft model at its best greedy
  γ) on the same slices; which γ is best comes from the whole greedy sweep and the cost curves
  (:func:`t1_methods`), so these run after them.

A slice of prompts timed on its own gives the rows the whole run would have: the harness seeds, orders and numbers
each prompt by its index in the workload (``prompt_offset``), and every paired ratio compares methods timed side by
side within one (pass, prompt) block, so the parts concatenate into the notebook's table (:func:`combine_parts`).
Each part is sized (``shard_prompts``) to finish in under an hour on the slowest CPU the record has met.

What it is not: where the parts are saved or when they run (:mod:`specrepro.record.shards`), or the summaries
(:func:`specrepro.lab.leviathan.summarize_speed`, :func:`specrepro.lab.leviathan.limit_table`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import pandas as pd
import torch

from specrepro.core.sampling import SamplingConfig
from specrepro.lab.leviathan import best_measured_drafts, speed_table, summarize_speed
from specrepro.measure.harness import in_run_cost_coefficient
from specrepro.theory import CostCurve

__all__ = ["Table2Setting", "Table2Context", "shard_names", "part_slices", "load_context", "measure_cost_curves",
           "cost_curves_of", "greedy_methods", "t1_methods", "greedy_summary", "run_part", "combine_parts",
           "COST_NS", "DRAFT_COST_NS"]

#: the n of the target's cost curve, and of the draft models' (their forwards are one or two tokens)
COST_NS = (1, 2, 3, 4, 5, 6, 8)
DRAFT_COST_NS = (1, 2)


@dataclass(frozen=True)
class Table2Setting:
    """Notebook 04's parameters that decide what its shards measure (``profiles/*.yaml``; the notebook's
    ``parameters`` cell): models, workload, the sweep's sizes and seeds; ``shard_prompts`` prompts per part."""

    target: str
    draft: str | None
    dtype: str = "float32"
    device: str = "cpu"
    workload: str = "humaneval"
    prompts: int = 20
    tokens: int = 40
    repeats: int = 3
    gammas: tuple = (1, 2, 3, 4, 6)
    int8_draft: bool = True
    cost_repeats: int = 9
    seed: int = 0
    shard_prompts: int = 5
    sweep: tuple = field(init=False)

    def __post_init__(self):
        if self.prompts < 1 or self.tokens < 1 or self.repeats < 1 or self.shard_prompts < 1:
            raise ValueError(f"prompts, tokens, repeats and shard_prompts must be >= 1, got {self.prompts}, "
                             f"{self.tokens}, {self.repeats}, {self.shard_prompts}")
        object.__setattr__(self, "gammas", tuple(int(g) for g in self.gammas))
        object.__setattr__(self, "sweep", tuple(g for g in self.gammas if g >= 1))

    @classmethod
    def from_params(cls, p: dict) -> "Table2Setting":
        """From notebook 04's parameter names (``table2_prompts``, ``table2_tokens``, ...)."""
        return cls(target=p["target"], draft=p.get("draft") or None, dtype=p.get("dtype", "float32"),
                   device=p.get("device", "cpu"), workload=p.get("workload", "humaneval"),
                   prompts=int(p["table2_prompts"]), tokens=int(p["table2_tokens"]), repeats=int(p["table2_repeats"]),
                   gammas=tuple(p.get("gammas", (1, 2, 3, 4, 6))), int8_draft=bool(p.get("int8_draft", True)),
                   cost_repeats=int(p.get("cost_repeats", 9)), seed=int(p.get("seed", 0)),
                   shard_prompts=int(p.get("table2_shard_prompts", 5)))

    def settings(self) -> dict:
        """What a part's sidecar records and a resumed run must match (JSON-serialisable; the device is recorded by
        every provenance as ``device``)."""
        d = asdict(self)
        d.pop("sweep")
        d.pop("device")
        d["gammas"] = list(d["gammas"])
        return d

    @property
    def draft_labels(self) -> list[str]:
        """The draft models of the γ sweep: the draft in its own dtype, and its int8 copy where ``int8_draft``."""
        if not self.draft:
            return []
        return [str(self.draft)] + ([f"int8 {self.draft}"] if self.int8_draft else [])


def part_slices(setting: Table2Setting) -> list[tuple[int, int]]:
    """The prompt slices ``[start, stop)`` of the parts: ``shard_prompts`` each, the last one shorter."""
    s = setting.shard_prompts
    return [(k * s, min((k + 1) * s, setting.prompts)) for k in range(math.ceil(setting.prompts / s))]


def shard_names(setting: Table2Setting) -> list[str]:
    """Every shard of the setting, in the order they can run: the cost curves, the greedy parts, the T = 1 parts."""
    n = len(part_slices(setting))
    return ["cost_curves"] + [f"leviathan_table2_runs_t{t}_p{k}" for t in (0, 1) for k in range(n)]


@dataclass
class Table2Context:
    """The loaded models and drafters of a setting (:func:`load_context`)."""

    setting: Table2Setting
    target: object
    tokenizer: object
    prompts: list
    draft_models: dict  # label -> DraftModelDrafter
    bigram: object
    lookup: object


def load_context(setting: Table2Setting) -> Table2Context:
    """Load the target and draft (and the draft's int8 copy), the workload's first ``prompts`` prompts, and the
    bigram (fitted on the workload's other prompts) and prompt-lookup drafts.

    Raises:
        KeyError: an unknown model or workload (:func:`specrepro.models.load_model`, :func:`specrepro.data.load_workload`).
    """
    from specrepro.data import corpus_token_ids, load_workload
    from specrepro.drafters.compress import quantize_draft
    from specrepro.drafters.lookup import NGramDrafter, PromptLookupDrafter
    from specrepro.drafters.model import DraftModelDrafter
    from specrepro.models import load_model, load_pair

    if setting.draft:
        tmodel, dmodel, tokenizer = load_pair(setting.target, setting.draft, device=setting.device,
                                              dtype=setting.dtype)
    else:
        (tmodel, tokenizer), dmodel = load_model(setting.target, device=setting.device, dtype=setting.dtype), None
    vocab = tmodel.get_output_embeddings().weight.shape[0]
    prompts = load_workload(setting.workload, setting.prompts)
    corpus = corpus_token_ids(tokenizer, exclude_ids={p.id for p in prompts})
    drafts = {}
    if dmodel is not None:
        drafts[str(setting.draft)] = DraftModelDrafter(dmodel, vocab)
        if setting.int8_draft:
            drafts[f"int8 {setting.draft}"] = DraftModelDrafter(quantize_draft(dmodel), vocab, name="int8 draft model")
    return Table2Context(setting, tmodel, tokenizer, prompts, drafts, NGramDrafter(corpus, vocab, n=2),
                         PromptLookupDrafter(max_ngram=3))


def measure_cost_curves(ctx: Table2Context) -> pd.DataFrame:
    """The cost curves: per model (the target first, then each draft model) and n, the median over ``cost_repeats``
    round-robin rounds of one KV-cached forward of n new tokens on a 200-token prefix (ms), its 95% interval and the
    rounds (:func:`specrepro.measure.cost.measure_cost_table`; seeded by a torch.Generator from the setting's seed).

    Returns:
        columns model, n, ms, ms_low, ms_high, rounds.
    """
    from specrepro.measure.cost import measure_cost_table

    s = ctx.setting
    gen = torch.Generator().manual_seed(s.seed)
    tables = {s.target: measure_cost_table(ctx.target, COST_NS, prefix_len=200, repeats=s.cost_repeats,
                                           generator=gen)}
    tables.update({label: measure_cost_table(d.model, DRAFT_COST_NS, prefix_len=200, repeats=s.cost_repeats,
                                             generator=gen) for label, d in ctx.draft_models.items()})
    curves = pd.concat([t.assign(model=name) for name, t in tables.items()])
    return curves[["model", "n", "ms", "ms_low", "ms_high", "rounds"]].reset_index(drop=True)


def cost_curves_of(curves: pd.DataFrame, setting: Table2Setting) -> tuple[CostCurve, dict]:
    """(t_target, {method label: draft cost curve}) from the cost-curve table, for every greedy sweep method of the
    draft models (the free drafts have none)."""
    def curve(name):
        d = curves[curves["model"] == name]
        if d.empty:
            raise KeyError(f"the cost curves have no rows for {name!r}")
        return CostCurve(d["n"].tolist(), d["ms"].tolist())

    t_target = curve(setting.target)
    t_draft = {f"{label} γ={g}": curve(label) for label in setting.draft_labels for g in setting.sweep}
    return t_target, t_draft


def greedy_methods(ctx: Table2Context | Table2Setting) -> dict:
    """The greedy sweep's methods: label -> (drafter or None, γ): AR, each draft model at every γ, the bigram draft at
    γ = 3 and prompt lookup at γ = 4. Given a :class:`Table2Setting` instead of a context, the drafters are None
    placeholders (the labels alone, for a part's recorded settings, no model loaded)."""
    labels_only = isinstance(ctx, Table2Setting)
    setting = ctx if labels_only else ctx.setting
    models = dict.fromkeys(setting.draft_labels) if labels_only else ctx.draft_models
    methods = {"AR": (None, 0)}
    methods.update({f"{label} γ={g}": (d, g) for label, d in models.items() for g in setting.sweep})
    methods.update({"bigram γ=3": (None if labels_only else ctx.bigram, 3),
                    "prompt lookup γ=4": (None if labels_only else ctx.lookup, 4)})
    return methods


def greedy_summary(runs0: pd.DataFrame, curves: pd.DataFrame, setting: Table2Setting):
    """The greedy sweep summarised: ``(summary0, c_runs, best)`` — :func:`summarize_speed` at T = 0 (with c measured
    in the runs, :func:`in_run_cost_coefficient`), the in-run c table, and per draft model the γ with the highest
    measured greedy speedup (:func:`best_measured_drafts`), which the T = 1 runs use."""
    t_target, t_draft = cost_curves_of(curves, setting)
    c_runs = in_run_cost_coefficient(runs0)
    c_in_run = dict(zip(c_runs["draft"], c_runs["c"]))
    summary0 = summarize_speed(runs0, t_target, t_draft, c_in_run).assign(temperature=0.0)
    return summary0, c_runs, best_measured_drafts(summary0)


def t1_methods(ctx: Table2Context | None, best: pd.DataFrame) -> dict:
    """The T = 1 runs' methods: AR, the bigram and prompt-lookup drafts, and each draft model at its best greedy γ
    (``best``: :func:`greedy_summary`'s third item). With ``ctx`` None the drafters are None placeholders (the
    labels alone, for a part's recorded settings)."""
    get = (lambda name: getattr(ctx, name)) if ctx is not None else (lambda name: None)
    methods = {"AR": (None, 0), "bigram γ=3": (get("bigram"), 3), "prompt lookup γ=4": (get("lookup"), 4)}
    for r in best.itertuples():
        d = ctx.draft_models[r.draft] if ctx is not None else None
        methods[f"{r.draft} γ={int(r.best_gamma)}"] = (d, int(r.best_gamma))
    return methods


def run_part(ctx: Table2Context, temperature: float, part: int, methods: dict, checkpoint=None,
             progress: bool = True) -> pd.DataFrame:
    """Time ``methods`` on the part's prompt slice (:func:`part_slices`), every pass, interleaved
    (:func:`specrepro.lab.leviathan.speed_table` with the slice's ``prompt_offset``).

    Args:
        temperature: 0 (greedy) or the sampling temperature (T = 1 in the paper's Table 2).
        part: the slice's number k.
        checkpoint: a JSON file keeping every finished (pass, prompt) block, so that an interrupted part resumes
            (under the same models, methods, machine and code only).

    Returns:
        :func:`speed_table` rows plus ``temperature``.

    Raises:
        IndexError: no such part.
    """
    s = ctx.setting
    start, stop = part_slices(s)[part]
    key = dict(target=s.target, draft=s.draft, dtype=s.dtype, int8_draft=s.int8_draft)
    runs = speed_table(ctx.target, ctx.tokenizer, methods, ctx.prompts[start:stop], max_new_tokens=s.tokens,
                       sampling=SamplingConfig(float(temperature)), seed=s.seed, repeats=s.repeats,
                       progress=progress, checkpoint=checkpoint, checkpoint_key=key, prompt_offset=start)
    return runs.assign(temperature=float(temperature))


def combine_parts(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """The parts of one sweep as the one table the whole run would have written, ordered by (repeat, prompt index,
    position).

    Raises:
        ValueError: no parts, or two parts holding the same (repeat, prompt) block.
    """
    if not parts:
        raise ValueError("combine_parts needs at least one part")
    runs = pd.concat(parts, ignore_index=True)
    dup = runs.duplicated(["repeat", "prompt_index", "method"])
    if dup.any():
        raise ValueError(f"{int(dup.sum())} runs appear in two parts")
    return runs.sort_values(["repeat", "prompt_index", "position"], kind="stable").reset_index(drop=True)
