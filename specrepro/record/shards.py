"""Notebooks 03-06's measurements as shards of the record: each one ``make`` target, one table and its sidecar.

``python -m specrepro shard NAME --profile profiles/standard.yaml`` reads or measures shards (the Makefile runs one
target per shard before the notebook; a notebook measures in-process any that is missing). :func:`shard_groups` maps
every shard to the object that reads or measures it: the one list that the command, ``status`` and the expected
settings share. Here notebook 03's :class:`AlphaShards` and notebook 04's :class:`Table2Shards`; notebook 05's are in
:mod:`specrepro.record.shards_trees`, notebook 06's in :mod:`specrepro.record.shards_medusa`. A shard is read when it
exists under the same settings, else measured (:func:`specrepro.record.shardkit.read_or_measure`), its finished blocks
kept meanwhile in a checkpoint that resumes only on the same CPU model, code and settings.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from specrepro.lab import leviathan, table2
from specrepro.record.results import STANDARD
from specrepro.record.shardkit import ShardGroup, checkpoint_key, read_or_measure, shard_checkpoint  # noqa: F401
from specrepro.record.shards_medusa import MedusaShards
from specrepro.record.shards_trees import MSSShard, TreeSpeedShards, WidthShards

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
        """What shard ``name``'s sidecar records and a reader must find (KeyError: not one of :meth:`names`)."""
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

    @property
    def device(self) -> str:
        return self.setting.device

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
        model at its ``best`` γ (the greedy sweep's, :func:`specrepro.lab.table2.greedy_summary`; None: :meth:`best`,
        which reads or measures the greedy parts and the cost curves first)."""
        s = self.expected(name)
        if name == "cost_curves":
            return self._get(name, s, lambda ckpt: table2.measure_cost_curves(self.ctx))
        greedy, k = s["temperature"] == 0.0, int(name.rsplit("_p", 1)[1])
        if not greedy and best is None:
            best = self.best()

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

    def best(self) -> pd.DataFrame:
        """The greedy sweep's best γ per draft model, from the greedy parts and the cost curves."""
        return table2.greedy_summary(self.greedy_runs(), self.cost_curves(), self.setting)[2]


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
    import yaml

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
