"""Notebooks 03-06's measurements as shards of the record: each one ``make`` target, one table and its sidecar.

``python -m specrepro shard NAME --profile profiles/standard.yaml`` reads or measures shards (the Makefile runs one
target per shard before the notebook; a notebook measures in-process any that is missing). :func:`shard_groups` maps
every shard to the object that reads or measures it: the one list that the command, ``status`` and the expected
settings share. Notebook 03's :class:`AlphaShards`, notebook 04's :class:`Table2Shards`, notebook 05's (SpecInfer,
Miao et al. 2024) :class:`MSSShard`, :class:`TreeSpeedShards` and :class:`WidthShards`, notebook 06's (Medusa, Cai et
al. 2024) :class:`MedusaShards`. A shard is read when it exists under the same settings, else measured
(:func:`specrepro.record.shardkit.read_or_measure`), its finished blocks kept meanwhile in a checkpoint that resumes
only on the same CPU model, code and settings.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import yaml

from specrepro import data
from specrepro.core.sampling import SamplingConfig
from specrepro.lab import leviathan, specinfer, table2
from specrepro.lab import medusa_parts as mp
from specrepro.record.results import STANDARD, load_table, save_table, table_at
from specrepro.record.shardkit import ShardGroup, checkpoint_key, read_or_measure, shard_checkpoint

__all__ = ["Table2Shards", "AlphaShards", "MSSShard", "TreeSpeedShards", "WidthShards", "MedusaShards",
           "read_or_measure", "shard_checkpoint", "shard_groups", "configure_parser", "run_command"]


class AlphaShards(ShardGroup):
    """Notebook 03's α table (Leviathan Table 3 analogue, :func:`specrepro.lab.leviathan.alpha_table`) as shards,
    one per workload and temperature: ``leviathan_table3_runs_<workload>_t<0|1>``, each ``alpha_prompts`` prompts ×
    ``alpha_tokens`` teacher-forced positions for every draft (unigram, bigram, prompt lookup, the draft model).
    Each job seeds its own generator, so the shards' rows are those of one call over every workload and temperature.
    α is counted, not timed. ``context``: :func:`specrepro.lab.leviathan.load_alpha_context`'s dict, else loaded.
    """

    what = "an alpha shard"
    prefix = "leviathan_table3_runs_"
    workloads = ("humaneval", "pydoc")
    temperatures = (0.0, 1.0)
    gamma = 3  # the trajectory's draft length (speed only)

    def names(self) -> list[str]:
        """The shards, workload by workload, T = 0 then T = 1."""
        return [f"{self.prefix}{w}_t{int(t)}" for w in self.workloads for t in self.temperatures]

    def settings(self, name: str) -> dict:
        self._require(name)
        p = self.params
        workload, t = name.removeprefix(self.prefix).rsplit("_t", 1)
        draft = p.get("draft") or None
        int8 = leviathan.alpha_int8_trajectory(draft, p["device"], p["dtype"])
        trajectory = (f"{draft} int8" if int8 else draft) or "AR"
        return {"shard": name, "target": p["target"], "draft": draft or "", "dtype": p["dtype"],
                "workload": workload, "temperature": float(t),
                **self.ints(prompts="alpha_prompts", tokens="alpha_tokens", seed="seed"),
                "drafters": leviathan.alpha_drafter_names(draft), "trajectory": trajectory, "gamma": self.gamma}

    def load(self) -> dict:
        p = self.params
        return leviathan.load_alpha_context(p["target"], p.get("draft") or None, device=p["device"], dtype=p["dtype"],
                                            alpha_prompts=int(p["alpha_prompts"]), workloads=self.workloads)

    def measure(self, name: str, s: dict, ckpt) -> pd.DataFrame:
        """Shard ``name``'s table (one row per prompt and draft)."""
        c = self.ctx
        return leviathan.alpha_table(
            c["target"], c["tokenizer"], c["drafters"], {s["workload"]: c["workloads"][s["workload"]]},
            temperatures=(s["temperature"],), max_new_tokens=s["tokens"], seed=s["seed"],
            trajectory_drafter=c["trajectory"], gamma=s["gamma"], progress=self.progress, checkpoint=ckpt,
            checkpoint_key=checkpoint_key(s, "target", "draft", "dtype", "trajectory"))


class Table2Shards(ShardGroup):
    """Notebook 04's shards for one setting (:class:`specrepro.lab.table2.Table2Setting`): the ``cost_curves`` and
    the parts ``leviathan_table2_runs_t<0|1>_p<k>`` of the greedy and T = 1 sweeps, each method returning a shard's
    table (or several combined). The models load only when something must be measured."""

    what = "a shard of notebook 04"
    prefix = "leviathan_table2_runs_"

    def __init__(self, params: dict, profile: str = STANDARD, progress: bool = True):
        super().__init__(params, profile, progress=progress)
        self.setting = table2.Table2Setting.from_params(params)

    def load(self) -> table2.Table2Context:
        return table2.load_context(self.setting)

    def names(self) -> list[str]:
        return table2.shard_names(self.setting)

    def expected(self, name: str, folder: Path | None = None) -> dict:
        """The setting and, for a part, its temperature and prompts; a part's methods (a T = 1 part's follow the
        greedy parts) are recorded but not compared."""
        self._require(name)
        if name == "cost_curves":
            return {"shard": name, **self.setting.settings()}
        t, k = (int(x[1:]) for x in name.removeprefix(self.prefix).split("_"))
        return {"shard": name, **self.setting.settings(), "temperature": float(t),
                "part_prompts": list(table2.part_slices(self.setting)[k])}

    def run(self, name: str, best: pd.DataFrame | None = None) -> pd.DataFrame:
        """The shard ``name`` (KeyError: not one of :meth:`names`), read or measured. A T = 1 part times each draft
        model at its ``best`` γ (the greedy sweep's, :func:`specrepro.lab.table2.greedy_summary`; None: taken from the
        greedy parts and the cost curves, read or measured first)."""
        s = self.expected(name)
        if name == "cost_curves":
            return self._get(name, s, lambda ckpt: table2.measure_cost_curves(self.ctx))
        greedy, k = s["temperature"] == 0.0, int(name.rsplit("_p", 1)[1])
        if not greedy and best is None:
            best = table2.greedy_summary(self.greedy_runs(), self.cost_curves(), self.setting)[2]

        def methods(ctx):
            return table2.greedy_methods(ctx) if greedy else table2.t1_methods(ctx, best)

        s["methods"] = list(methods(self.setting if greedy else None))
        return self._get(name, s, lambda ckpt: table2.run_part(self.ctx, s["temperature"], k, methods(self.ctx),
                                                               checkpoint=ckpt, progress=self.progress))

    def cost_curves(self) -> pd.DataFrame:
        """The ``cost_curves`` shard (:func:`specrepro.lab.table2.measure_cost_curves`)."""
        return self.run("cost_curves")

    def part(self, temperature: float, k: int, best: pd.DataFrame | None = None) -> pd.DataFrame:
        """Part ``k`` of a sweep. T = 1 parts need ``best`` (the greedy sweep's best γ per draft model,
        :func:`specrepro.lab.table2.greedy_summary`)."""
        t = 0 if float(temperature) == 0.0 else 1
        if t == 1 and best is None:
            raise ValueError("the T = 1 parts need the greedy sweep's best γ per draft model (best=...)")
        return self.run(f"{self.prefix}t{t}_p{k}", best)

    def greedy_runs(self) -> pd.DataFrame:
        """Every greedy part, combined (:func:`specrepro.lab.table2.combine_parts`)."""
        return table2.combine_parts([self.part(0.0, k) for k in range(len(table2.part_slices(self.setting)))])

    def t1_runs(self, best: pd.DataFrame) -> pd.DataFrame:
        """Every T = 1 part, combined."""
        return table2.combine_parts([self.part(1.0, k, best) for k in range(len(table2.part_slices(self.setting)))])


class _TreeShards(ShardGroup):
    """A group of notebook 05's shards (``params``: the notebook's). ``models``: ``(target, draft, tokenizer, draft
    name)`` already loaded (the notebook's), else loaded when needed (:func:`specrepro.lab.specinfer.load_tree_models`).
    """

    def __init__(self, params: dict, profile: str = STANDARD, models=None, progress: bool = True):
        super().__init__(params, profile, progress=progress, context=models)

    def _draft_name(self) -> str:
        if self.context is not None:
            return self.context[3]
        p = self.params
        return specinfer.tree_draft_name(p["target"], p.get("draft"), bool(p.get("tree_int8_draft")))

    def load(self):
        p = self.params
        return specinfer.load_tree_models(p["target"], p.get("draft"), device=p["device"], dtype=p["dtype"],
                                          int8_draft=bool(p.get("tree_int8_draft")))

    def _prompts(self, n: int):
        return data.load_workload(self.params["workload"], n)

    def _models_settings(self, name: str, **ints: str) -> dict:
        """Every notebook-05 shard's first settings (its name, the models, dtype and workload), then :meth:`ints`'."""
        p = self.params
        return {"shard": name, "target": p["target"], "draft": self._draft_name(), "dtype": p["dtype"],
                "workload": p["workload"], **self.ints(**ints)}


class MSSShard(_TreeShards):
    """Notebook 05's naive-vs-MSS table (SpecInfer Table 3, :func:`specrepro.lab.specinfer.naive_vs_mss_table`) as
    the shard ``specinfer_table3_runs``: ``mss_prompts`` HumanEval prompts × ``mss_repeats`` passes ×
    ``mss_tokens`` tokens, trees ⟨w, 1, ..., 1⟩ with w the largest of ``widths`` and depth ``tree_depth``, T = 1;
    :meth:`table` gives one row per pass, prompt and method."""

    name = "specinfer_table3_runs"
    what = "the MSS shard"

    def names(self) -> list[str]:
        return [self.name]

    def settings(self, name: str | None = None) -> dict:
        """What the sidecar records and a reader must find: models, dtype, workload, sizes, tree and seed."""
        if name is not None:
            self._require(name)
        return {**self._models_settings(self.name, prompts="mss_prompts", tokens="mss_tokens", repeats="mss_repeats"),
                "width": int(max(self.params["widths"])), **self.ints(depth="tree_depth", seed="seed"),
                "temperature": 1.0}

    def measure(self, name: str, s: dict, ckpt) -> pd.DataFrame:
        tmodel, dmodel, tokenizer, _ = self.ctx
        return specinfer.naive_vs_mss_table(
            tmodel, dmodel, tokenizer, self._prompts(s["prompts"]), width=s["width"], depth=s["depth"],
            max_new_tokens=s["tokens"], seed=s["seed"], repeats=s["repeats"], checkpoint=ckpt,
            checkpoint_key=checkpoint_key(s), progress=self.progress)


class TreeSpeedShards(_TreeShards):
    """Notebook 05's hardware-aware tree choice and its tree-vs-chain timing as shards: ``specinfer_tree_costs``, the
    verification cost curves (:func:`specrepro.lab.specinfer.tree_cost_table`: target forwards over root + N nodes
    for N in ``cost_sizes``, draft forwards over w tokens for every width, ``tree_cost_repeats`` rounds), then
    ``specinfer_tree_speed_p<k>``: AR, the best chain, the chain of equal target positions (γ = w·d) and the best tree
    ⟨w, 1, ..., 1⟩, timed interleaved at T = 1 (:func:`specrepro.lab.specinfer.tree_vs_chain_speed`, ``speed_repeats``
    passes × ``speed_tokens`` tokens) over the k-th slice of ``speed_shard_prompts`` of the ``tree_prompts`` prompts,
    seeded and ordered as one whole run. The tree and the chain are :meth:`picks`, from the cost curves and Table 2's
    ⟨w, 1, ..., 1⟩ runs (:meth:`root_runs`; ``root_runs``: given by the caller); a part's sidecar records them, so new
    cost curves that change the choice make the parts stale.
    """

    what = "a tree-speed shard"
    cost_name = "specinfer_tree_costs"
    part_prefix = "specinfer_tree_speed_p"
    root_name = "specinfer_table2_root_runs"

    def __init__(self, params: dict, profile: str = STANDARD, models=None, root_runs: pd.DataFrame | None = None,
                 progress: bool = True):
        super().__init__(params, profile, models, progress)
        self._root_runs = root_runs

    def slices(self) -> list[tuple[int, int]]:
        """The prompt slices ``[start, stop)`` of the timing parts: ``speed_shard_prompts`` each (default: all)."""
        n = int(self.params["tree_prompts"])
        size = int(self.params.get("speed_shard_prompts") or n)
        if n < 1 or size < 1:
            raise ValueError(f"tree_prompts and speed_shard_prompts must be >= 1; got {n}, {size}")
        return [(start, min(start + size, n)) for start in range(0, n, size)]

    def names(self) -> list[str]:
        """The shards, in the order they can run: the cost curves, then the timing parts."""
        return [self.cost_name] + [f"{self.part_prefix}{k}" for k in range(len(self.slices()))]

    def settings(self, name: str, picks: dict | None = None) -> dict:
        """What shard ``name``'s sidecar records and a reader must find (KeyError: not one of :meth:`names`); a part's
        include the choice (``picks``: :meth:`picks` when None; ``{}`` leaves it out)."""
        self._require(name)
        p = self.params
        if name == self.cost_name:
            return {**self._models_settings(name), "cost_sizes": [int(n) for n in p["cost_sizes"]],
                    "draft_widths": list(range(1, int(max(p["widths"])) + 1)), **self.ints(repeats="tree_cost_repeats")}
        k = int(name.removeprefix(self.part_prefix))
        return {**self._models_settings(name, prompts="tree_prompts"), "part_prompts": list(self.slices()[k]),
                **self.ints(tokens="speed_tokens", repeats="speed_repeats", seed="seed"), "temperature": 1.0,
                **(self.picks() if picks is None else picks)}

    def measure(self, name: str, s: dict, ckpt) -> pd.DataFrame:
        tmodel, dmodel, tokenizer, draft_name = self.ctx
        if name == self.cost_name:
            prefix = tokenizer(self._prompts(1)[0].text, return_tensors="pt").input_ids[0]
            target_cost = specinfer.tree_cost_table(tmodel, prefix, s["cost_sizes"], repeats=s["repeats"],
                                                    name=s["target"])
            draft_cost = specinfer.tree_cost_table(dmodel, prefix, [w - 1 for w in s["draft_widths"]],
                                                   repeats=s["repeats"], name=draft_name)
            return pd.concat([target_cost, draft_cost], ignore_index=True)
        start, stop = s["part_prompts"]
        key = checkpoint_key({k: v for k, v in s.items() if k != "prompts"}, n_prompts=s["prompts"])
        return specinfer.tree_vs_chain_speed(
            tmodel, dmodel, tokenizer, self._prompts(stop)[start:stop], tree=tuple(s["tree"]), gamma=s["gamma"],
            max_new_tokens=s["tokens"], seed=s["seed"], repeats=s["repeats"], progress=self.progress,
            checkpoint=ckpt, prompt_offset=start, checkpoint_key=key)

    def costs(self) -> pd.DataFrame:
        """The cost curves' shard: one row per (model, N): model, n_nodes, fed_tokens, ms, ms_min."""
        return self.run(self.cost_name)

    def table(self) -> pd.DataFrame:
        """Every timing part, concatenated (the whole tree-vs-chain timing): one row per (pass, prompt, method)."""
        return pd.concat([self.run(name) for name in self.names()[1:]], ignore_index=True)

    def root_settings(self) -> dict:
        """The settings notebook 05 saves Table 2's ⟨w, 1, ..., 1⟩ runs under (``specinfer_table2_root_runs``)."""
        p = self.params
        return dict(shape="root", target=p["target"], draft=self._draft_name(),
                    **self.ints(prompts="tree_prompts", tokens="tree_tokens", depth="tree_depth"),
                    widths=[int(w) for w in p["widths"]], seed=int(p["seed"]))

    def root_runs(self) -> pd.DataFrame:
        """Table 2's ⟨w, 1, ..., 1⟩ runs: given, read, or measured now and saved as notebook 05 saves them."""
        if self._root_runs is None:
            s = self.root_settings()
            found = load_table(self.root_name, self.profile, **s)
            if found is None:
                tmodel, dmodel, tokenizer, _ = self.ctx
                found = specinfer.tree_width_table(tmodel, dmodel, tokenizer, self._prompts(s["prompts"]),
                                                   widths=s["widths"], depth=s["depth"], max_new_tokens=s["tokens"],
                                                   seed=s["seed"], shape="root")
                save_table(found, self.root_name, profile=self.profile, device=self.device, **s)
            self._root_runs = found
        return self._root_runs

    def choice(self, costs: pd.DataFrame | None = None, roots: pd.DataFrame | None = None) -> pd.DataFrame:
        """:func:`specrepro.lab.specinfer.choose_tree`'s ranking (stochastic decoding, depths 1..``tree_depth``) from
        the cost curves and the root runs (default: :meth:`costs`, :meth:`root_runs`); best first."""
        costs = self.costs() if costs is None else costs
        roots = self.root_runs() if roots is None else roots
        target = self.params["target"]
        return specinfer.choose_tree(roots, costs[costs["model"] == target], costs[costs["model"] != target],
                                     decoding="stochastic", depths=range(1, int(self.params["tree_depth"]) + 1))

    def picks(self, costs: pd.DataFrame | None = None, roots: pd.DataFrame | None = None) -> dict:
        """``{"tree": [w, d], "gamma": γ}``: the best tree (width > 1) and the best chain of :meth:`choice`."""
        choice = self.choice(costs, roots)
        tree, chain = choice[choice["width"] > 1].iloc[0], choice[choice["width"] == 1].iloc[0]
        return {"tree": [int(tree.width), int(tree.depth)], "gamma": int(chain.depth)}

    def recorded_picks(self, folder: Path) -> dict | None:
        """:meth:`picks` from the cost curves and root runs as recorded in ``folder`` (e.g. ``data/results``),
        measuring nothing: None when either table is missing or was measured under other settings."""
        costs = table_at(folder / f"{self.cost_name}.csv", **self.settings(self.cost_name))
        roots = table_at(folder / f"{self.root_name}.csv", **self.root_settings())
        return None if costs is None or roots is None else self.picks(costs, roots)

    def expected(self, name: str, folder: Path) -> dict:
        """A timing part's tree and chain are the choice that the cost curves and root runs recorded in ``folder``
        make (left out when either is missing)."""
        return self.settings(name, None if name == self.cost_name else self.recorded_picks(folder) or {})


class WidthShards(_TreeShards):
    """SpecInfer Table 2 (verified tokens per step vs tree width) at the size a verdict needs, as shards:
    ``width_prompts`` HumanEval prompts × ``width_tokens`` tokens on SpecInfer's trees ⟨1,1,w,1,...,1⟩ of depth
    ``tree_depth`` for every width of ``widths`` (:func:`specrepro.lab.specinfer.tree_width_table`, shape "paper"):
    ``specinfer_table2_width_greedy`` (greedy decoding, VerifyGreedy, one pass: a second would repeat it token for
    token) and ``specinfer_table2_width_t1_r<k>`` (T = 1, MSS on i.i.d. children, pass k of ``width_passes``, seeded
    ``seed + k``). Tokens per step are counted, not timed.
    """

    what = "a tree-width shard"
    prefix = "specinfer_table2_width_"

    def names(self) -> list[str]:
        """The shards: the greedy pass, then the T = 1 passes."""
        n = int(self.params["width_passes"])
        if n < 1:
            raise ValueError(f"width_passes must be >= 1, got {n}")
        return [self.prefix + "greedy"] + [f"{self.prefix}t1_r{k}" for k in range(n)]

    def settings(self, name: str) -> dict:
        self._require(name)
        greedy = name.endswith("greedy")
        return {**self._models_settings(name, prompts="width_prompts", tokens="width_tokens", depth="tree_depth"),
                "widths": [int(w) for w in self.params["widths"]], "shape": "paper", **self.ints(seed="seed"),
                "decoding": "greedy" if greedy else "stochastic", "pass": 0 if greedy else int(name.rsplit("_r", 1)[1])}

    def measure(self, name: str, s: dict, ckpt) -> pd.DataFrame:
        tmodel, dmodel, tokenizer, _ = self.ctx
        return specinfer.tree_width_table(
            tmodel, dmodel, tokenizer, self._prompts(s["prompts"]), widths=s["widths"], depth=s["depth"],
            max_new_tokens=s["tokens"], seed=s["seed"], decodings=(s["decoding"],), shape=s["shape"],
            progress=self.progress, passes=(s["pass"],), checkpoint=ckpt,
            checkpoint_key=checkpoint_key(s, "target", "draft", "dtype"))


class MedusaShards(ShardGroup):
    """Notebook 06's measurements as shards, in the order they can run: on ``medusa_target`` (SmolLM2-135M) the
    Medusa-1 heads' ``medusa_training_loss``, ``medusa_head_accuracy`` (held-out top-1..5 per head) and the distilled
    draft's ``medusa_draft_kl``, then, timed (``medusa_repeats`` passes × ``medusa_speed_prompts`` prompts ×
    ``medusa_tokens`` tokens), ``medusa_greedy_runs`` (Medusa Table 1's methods), ``medusa_tree_size_runs`` (the
    accuracy-driven tree of each size of ``medusa_tree_sizes``) and ``medusa_sampling_runs`` (T =
    ``stochastic_temperature``); on ``large_target`` ``medusa_large_head_accuracy`` (stdlib-trained heads) and
    ``medusa_large_tree_ablation`` (tokens per step of chain, dense and sparse trees); Medusa-2's ``medusa2_quality``
    (held-out NLL change of the fine-tuned backbone) and ``medusa2_runs`` (timed). Measured by
    :mod:`specrepro.lab.medusa_parts`.

    The timed SmolLM2 shards and the ablation decode with, and record, trees built from the accuracy tables as the
    record holds them: new accuracies make them stale. The models load and the heads train only when something must
    be measured (``context``: a :class:`~specrepro.lab.medusa_parts.MedusaContext` already holding them).
    """

    what = "a shard of notebook 06"
    accuracy_name = "medusa_head_accuracy"
    large_accuracy_name = "medusa_large_head_accuracy"
    #: each shard, in the order they can run -> the blocks of settings its sidecar records (:meth:`settings`) and the
    #: accuracy table its trees are built from (None: it decodes with no tree from a table)
    shard_blocks = {"medusa_training_loss": ("data heads", None), accuracy_name: ("data heads", None),
                    "medusa_draft_kl": ("data draft", None),
                    "medusa_greedy_runs": ("data heads draft timing", accuracy_name),
                    "medusa_tree_size_runs": ("data heads draft timing sizes", accuracy_name),
                    "medusa_sampling_runs": ("data heads draft timing", accuracy_name),
                    large_accuracy_name: ("large", None),
                    "medusa_large_tree_ablation": ("large ablation", large_accuracy_name),
                    "medusa2_quality": ("medusa2", None), "medusa2_runs": ("medusa2 medusa2_timing", None)}

    def names(self) -> list[str]:
        return list(self.shard_blocks)

    def load(self):
        return mp.MedusaContext(self.params, progress=self.progress)

    def trees(self, name: str, acc: pd.DataFrame) -> dict:
        """The trees shard ``name`` decodes with, built from the accuracy table ``acc`` (the Medusa target's for the
        timed shards, the larger target's for the ablation): ``{"tree": choices}``, ``{"trees": {size: choices}}``
        or ``{"trees": {name: choices}}``; ``{}`` for a shard without one."""
        p = self.params
        if name in ("medusa_greedy_runs", "medusa_sampling_runs"):
            return {"tree": mp.accuracy_tree(acc, int(p["tree_nodes"]))}
        if name == "medusa_tree_size_runs":
            return {"trees": {str(int(n)): mp.accuracy_tree(acc, int(n)) for n in p["medusa_tree_sizes"]}}
        if name == "medusa_large_tree_ablation":
            return {"trees": mp.large_ablation_trees(acc, int(p["medusa_heads"]), p["large_dense_topk"],
                                                     p["large_sparse_sizes"])}
        return {}

    def settings(self, name: str, trees: dict | None = None) -> dict:
        """What shard ``name``'s sidecar records and a reader must find: models, data, training configuration, sizes
        (its blocks of :attr:`shard_blocks`) and, for a shard decoding with a tree from an accuracy table, ``trees``
        (:meth:`trees`; None: built from that table, read or measured).

        Raises:
            KeyError: not one of :meth:`names`.
        """
        self._require(name)
        p = self.params

        def stdlib(target: str) -> dict:  # stdlib-trained heads (the larger target's, and Medusa-2's first stage)
            return {"target": target, "dtype": p["dtype"], **self.ints(seed="seed", heads="medusa_heads"),
                    "head_vocab": p.get("large_head_vocab"),
                    **self.ints(distill_tokens="large_distill_tokens", epochs="large_epochs")}

        blocks = {
            "data": lambda: {"target": p["medusa_target"], "dtype": p["dtype"], "seed": int(p["seed"]),
                             "workload": p["workload"],
                             "eval_prompts": max(int(p["n_prompts"]), int(p["medusa_speed_prompts"])),
                             "train_prompts": int(p["n_train_prompts"]) if p.get("n_train_prompts") else "all",
                             **self.ints(sd_tokens="sd_max_new_tokens", max_prompt_tokens="max_prompt_tokens")},
            "heads": lambda: {"heads": int(p["medusa_heads"]), "share_lm_head": bool(p["share_lm_head"]),
                              **self.ints(epochs="medusa_epochs", batch_size="medusa_batch_size"),
                              "max_steps": p.get("medusa_max_steps")},
            "draft": lambda: {"distill_epochs": int(p["distill_epochs"]),
                              "distill_max_steps": p.get("distill_max_steps")},
            "timing": lambda: {**self.ints(prompts="medusa_speed_prompts", tokens="medusa_tokens",
                                           repeats="medusa_repeats"),
                               "temperature": float(p["stochastic_temperature"] if "sampling" in name else 0.0)},
            "sizes": lambda: {"sizes": [int(n) for n in p["medusa_tree_sizes"]]},
            "large": lambda: stdlib(p["large_target"]),
            "ablation": lambda: {"workload": p["workload"],
                                 **self.ints(prompts="large_ablation_prompts", tokens="large_ablation_tokens")},
            "medusa2": lambda: {**stdlib(p["medusa_target"]),
                                **self.ints(train_seqs="m2_train_seqs", eval_seqs="m2_eval_seqs",
                                            chunk_tokens="m2_chunk_tokens", m2_epochs="m2_epochs")},
            "medusa2_timing": lambda: {"workload": p["workload"],
                                       **self.ints(tree_nodes="tree_nodes", prompts="m2_speed_prompts",
                                                   tokens="medusa_tokens", repeats="medusa_repeats")},
        }
        kinds, source = self.shard_blocks[name]
        s = {"shard": name, **{k: v for kind in kinds.split() for k, v in blocks[kind]().items()}}
        if source is not None:
            s.update(self.trees(name, self.run(source)) if trees is None else trees)
        return s

    def recorded_trees(self, name: str, folder: Path) -> dict | None:
        """:meth:`trees` of shard ``name`` from the accuracy table as recorded in ``folder`` (e.g. ``data/results``),
        measuring nothing: None when that table is missing or was measured under other settings; ``{}`` for a shard
        without a tree."""
        source = self.shard_blocks[name][1]
        if source is None:
            return {}
        acc = table_at(folder / f"{source}.csv", **self.settings(source))
        return None if acc is None else self.trees(name, acc)

    def expected(self, name: str, folder: Path) -> dict:
        """A tree from an accuracy table is compared only when that table is recorded in ``folder`` under its own
        settings."""
        return self.settings(name, self.recorded_trees(name, folder) or {})

    def measure(self, name: str, s: dict, ckpt) -> pd.DataFrame:
        """Shard ``name``'s table, measured by :mod:`specrepro.lab.medusa_parts` (the timed ones resume from
        ``ckpt``: blocks of one pass over one prompt, every method)."""
        c = self.ctx

        def timed(methods, prompts=None, **kw):
            return mp.timed_runs(c, methods, c.speed_prompts if prompts is None else prompts, checkpoint=ckpt,
                                 checkpoint_key=checkpoint_key(s), **kw)

        shards = {
            "medusa_training_loss": lambda: mp.training_losses(c),
            self.accuracy_name: lambda: mp.head_accuracy(c),
            "medusa_draft_kl": lambda: mp.draft_kl_table(c),
            "medusa_greedy_runs": lambda: timed(mp.greedy_methods(c, s["tree"])),
            # the trees its settings record, in the order of their sizes
            "medusa_tree_size_runs": lambda: timed(mp.tree_size_methods(c, s["trees"])),
            "medusa_sampling_runs": lambda: timed(mp.sampling_methods(c, s["tree"]), baseline=None,
                                                  sampling=SamplingConfig(temperature=s["temperature"])),
            self.large_accuracy_name: lambda: mp.large_head_accuracy(c),
            "medusa_large_tree_ablation": lambda: mp.large_tree_ablation(c, s["trees"],
                                                                         self.run(self.large_accuracy_name)),
            "medusa2_quality": lambda: mp.medusa2_quality(c),
            "medusa2_runs": lambda: timed(mp.medusa2_methods(c), data.load_workload(s["workload"], n=s["prompts"])),
        }
        return shards[name]()


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="*", metavar="NAME", help="shards to read or measure (default: all, in order)")
    p.add_argument("--profile", default="profiles/standard.yaml", help="the profile YAML (its notebook 04 sizes)")
    p.add_argument("--list", action="store_true", help="print the shards' names and exit")


def shard_groups(params: dict, profile: str = STANDARD) -> dict[str, ShardGroup]:
    """Every shard of notebooks 03-06, in notebook order (each group's in the order they can run) -> the object that
    reads or measures it: the one description of the shards that ``python -m specrepro shard``, ``status`` and the
    sidecars' expected settings share."""
    groups = (AlphaShards(params, profile), Table2Shards(params, profile), MSSShard(params, profile),
              TreeSpeedShards(params, profile), WidthShards(params, profile), MedusaShards(params, profile))
    return {name: g for g in groups for name in g.names()}


def run_command(args, parser=None) -> int:
    path = Path(args.profile)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such profile")
    groups = shard_groups(yaml.safe_load(path.read_text()) or {}, profile=path.stem)
    if args.list:
        print("\n".join(groups))
        return 0
    for name in args.names or list(groups):
        group = groups.get(name, groups["cost_curves"])  # an unknown name: notebook 04's shards name themselves
        group.run(name)
        print(f"{name}: {'measured' if name in group.measured else 'read (already measured under this setting)'}")
    return 0
