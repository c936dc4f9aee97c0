"""Notebooks 03-06's measurements as shards of the record: each one ``make`` target, one table and its sidecar.

``python -m specrepro shard NAME --profile profiles/standard.yaml`` reads or measures shards (the Makefile runs one
target per shard before the notebook; a notebook measures in-process any that is missing); :func:`shard_groups` maps
every shard to the object that reads or measures it, the one list that the command, ``status`` and the expected
settings share. Here: notebook 03's :class:`AlphaShards` and notebook 04's :class:`Table2Shards`; notebook 05's
groups are in :mod:`specrepro.record.shards_trees`, notebook 06's in :mod:`specrepro.record.shards_medusa`.

A shard is read when it exists under the same setting, else measured afresh
(:func:`specrepro.record.shardkit.read_or_measure`), its finished blocks kept meanwhile in a checkpoint that resumes
only on the same CPU model, code and setting, so a table never mixes machines.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from specrepro.lab import table2
from specrepro.record.results import STANDARD
from specrepro.record.shardkit import ShardGroup, read_or_measure, shard_checkpoint  # noqa: F401 - re-exported
from specrepro.record.shards_medusa import MedusaShards
from specrepro.record.shards_trees import MSSShard, TreeSpeedShards, WidthShards

__all__ = ["Table2Shards", "AlphaShards", "MSSShard", "TreeSpeedShards", "WidthShards", "MedusaShards",
           "read_or_measure", "shard_checkpoint", "shard_groups", "configure_parser", "run_command"]


class AlphaShards(ShardGroup):
    """Notebook 03's α table (Leviathan Table 3 analogue, :func:`specrepro.lab.leviathan.alpha_table`) as shards,
    one per workload and temperature: ``leviathan_table3_runs_<workload>_t<0|1>``, each ``alpha_prompts`` prompts ×
    ``alpha_tokens`` teacher-forced positions for every draft (unigram, bigram, prompt lookup, the draft model).
    Each job seeds its own generator (:func:`specrepro.lab.leviathan.alpha_job_seed`), so the shards' rows are the
    rows of one call over every workload and temperature. α is counted, not timed. ``context``:
    :func:`specrepro.lab.leviathan.load_alpha_context`'s dict already loaded, else loaded when needed.
    """

    what = "an alpha shard"

    prefix = "leviathan_table3_runs_"
    workloads = ("humaneval", "pydoc")
    temperatures = (0.0, 1.0)
    gamma = 3  # the trajectory's draft length (speed only)

    def __init__(self, params: dict, profile: str = STANDARD, context: dict | None = None, progress: bool = True):
        super().__init__(params, profile, progress)
        self.context = context

    def names(self) -> list[str]:
        """The shards, workload by workload, T = 0 then T = 1."""
        return [f"{self.prefix}{w}_t{int(t)}" for w in self.workloads for t in self.temperatures]

    def settings(self, name: str) -> dict:
        """What shard ``name``'s sidecar records and a reader must find.

        Raises:
            KeyError: not one of :meth:`names`.
        """
        from specrepro.lab.leviathan import alpha_drafter_names, alpha_int8_trajectory

        self._require(name)
        p = self.params
        workload, t = name.removeprefix(self.prefix).rsplit("_t", 1)
        draft = p.get("draft") or None
        trajectory = (f"{draft} int8" if alpha_int8_trajectory(draft, p["device"], p["dtype"]) else draft) or "AR"
        return {"shard": name, "target": p["target"], "draft": draft or "", "dtype": p["dtype"],
                "workload": workload, "temperature": float(t), "prompts": int(p["alpha_prompts"]),
                "tokens": int(p["alpha_tokens"]), "seed": int(p["seed"]), "drafters": alpha_drafter_names(draft),
                "trajectory": trajectory, "gamma": self.gamma}

    def load(self) -> dict:
        """The models, drafts and prompts (:func:`specrepro.lab.leviathan.load_alpha_context`), loaded once."""
        if self.context is None:
            from specrepro.lab.leviathan import load_alpha_context

            p = self.params
            self.context = load_alpha_context(p["target"], p.get("draft") or None, device=p["device"],
                                              dtype=p["dtype"], alpha_prompts=int(p["alpha_prompts"]),
                                              workloads=self.workloads)
        return self.context

    def measure(self, name: str, s: dict, ckpt) -> pd.DataFrame:
        """Shard ``name``'s table (one row per prompt and draft)."""
        from specrepro.files import cpu_description
        from specrepro.lab.leviathan import alpha_table

        c = self.load()
        key = {k: s[k] for k in ("target", "draft", "dtype", "trajectory")} | {"cpu": cpu_description()}
        return alpha_table(c["target"], c["tokenizer"], c["drafters"], {s["workload"]: c["workloads"][s["workload"]]},
                           temperatures=(s["temperature"],), max_new_tokens=s["tokens"], seed=s["seed"],
                           trajectory_drafter=c["trajectory"], gamma=s["gamma"], progress=self.progress,
                           checkpoint=ckpt, checkpoint_key=key)


class Table2Shards(ShardGroup):
    """Notebook 04's shards for one setting (:class:`specrepro.lab.table2.Table2Setting`): the cost curves and the
    parts of the greedy and T = 1 sweeps, each method returning a shard's table (or several combined). The models
    load only when something must be measured."""

    what = "a shard of notebook 04"
    prefix = "leviathan_table2_runs_"

    def __init__(self, params: dict, profile: str = STANDARD, progress: bool = True):
        super().__init__(params, profile, progress)
        self.setting = table2.Table2Setting.from_params(params)
        self._ctx = None

    @property
    def ctx(self) -> table2.Table2Context:
        if self._ctx is None:
            self._ctx = table2.load_context(self.setting)
        return self._ctx

    def names(self) -> list[str]:
        return table2.shard_names(self.setting)

    @property
    def device(self) -> str:
        return self.setting.device

    def cost_curves(self) -> pd.DataFrame:
        """The ``cost_curves`` shard (:func:`specrepro.lab.table2.measure_cost_curves`)."""
        settings = {"shard": "cost_curves", **self.setting.settings()}
        return self._get("cost_curves", settings, lambda ckpt: table2.measure_cost_curves(self.ctx))

    def part(self, temperature: float, k: int, best: pd.DataFrame | None = None) -> pd.DataFrame:
        """One part of a sweep: ``leviathan_table2_runs_t<0|1>_p<k>``. T = 1 parts need ``best`` (the greedy
        sweep's best γ per draft model, :func:`specrepro.lab.table2.greedy_summary`)."""
        t = 0 if float(temperature) == 0.0 else 1
        if t == 1 and best is None:
            raise ValueError("the T = 1 parts need the greedy sweep's best γ per draft model (best=...)")
        labels = table2.greedy_methods(_Labels(self.setting)) if t == 0 else table2.t1_methods(None, best)
        name = f"{self.prefix}t{t}_p{k}"
        settings = {**self._part_settings(name), "methods": list(labels)}

        def measure(ckpt):
            methods = table2.greedy_methods(self.ctx) if t == 0 else table2.t1_methods(self.ctx, best)
            return table2.run_part(self.ctx, float(temperature), k, methods, checkpoint=ckpt,
                                   progress=self.progress)

        return self._get(name, settings, measure)

    def _sweep(self, temperature: float, best: pd.DataFrame | None = None) -> pd.DataFrame:
        n = len(table2.part_slices(self.setting))
        return table2.combine_parts([self.part(temperature, k, best) for k in range(n)])

    def greedy_runs(self) -> pd.DataFrame:
        """Every greedy part, combined (:func:`specrepro.lab.table2.combine_parts`)."""
        return self._sweep(0.0)

    def t1_runs(self, best: pd.DataFrame) -> pd.DataFrame:
        """Every T = 1 part, combined."""
        return self._sweep(1.0, best)

    def best(self) -> pd.DataFrame:
        """The greedy sweep's best γ per draft model, from the greedy parts and the cost curves."""
        return table2.greedy_summary(self.greedy_runs(), self.cost_curves(), self.setting)[2]

    def _part_of(self, name: str) -> tuple[int, int]:
        """``(t, k)`` of part ``leviathan_table2_runs_t<t>_p<k>``."""
        t, k = (int(x[1:]) for x in name.removeprefix(self.prefix).split("_"))
        return t, k

    def _part_settings(self, name: str) -> dict:
        """A part's setting, temperature and prompts (its methods aside)."""
        t, k = self._part_of(name)
        return {"shard": name, **self.setting.settings(), "temperature": float(t),
                "part_prompts": list(table2.part_slices(self.setting)[k])}

    def run(self, name: str) -> pd.DataFrame:
        """The shard ``name`` (one of :meth:`names`), read or measured; a T = 1 part first reads (or measures) the
        greedy parts and the cost curves it depends on.

        Raises:
            KeyError: not a shard of this setting.
        """
        self._require(name)
        if name == "cost_curves":
            return self.cost_curves()
        t, k = self._part_of(name)
        return self.part(0.0, k) if t == 0 else self.part(1.0, k, self.best())

    def expected(self, name: str, folder: Path) -> dict:
        """The setting and, for a part, its temperature and prompts (a T = 1 part's methods follow the greedy parts
        and are not compared)."""
        self._require(name)
        return {"shard": name, **self.setting.settings()} if name == "cost_curves" else self._part_settings(name)


class _Labels:
    """A stand-in context whose drafters are None: :func:`specrepro.lab.table2.greedy_methods`'s labels without
    loading a model."""

    def __init__(self, setting):
        self.setting = setting
        self.draft_models = {label: None for label in setting.draft_labels}
        self.bigram = self.lookup = None


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
