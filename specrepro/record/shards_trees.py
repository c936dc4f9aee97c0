"""Notebook 05's measurements (SpecInfer, Miao et al. 2024) as shards of the record: :class:`MSSShard` (naive
sampling vs MSS, SpecInfer Table 3), :class:`TreeSpeedShards` (the tree verification cost curves, and the tree-vs-chain
timing in parts of a few prompts) and :class:`WidthShards` (SpecInfer Table 2, tokens per step vs tree width, one
shard per decoding and pass), each read or measured as :func:`specrepro.record.shardkit.read_or_measure` says.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from specrepro import data
from specrepro.lab import specinfer
from specrepro.record.results import STANDARD, load_table, save_table, table_at
from specrepro.record.shardkit import ShardGroup, checkpoint_key

__all__ = ["MSSShard", "TreeSpeedShards", "WidthShards"]


class _TreeShards(ShardGroup):
    """A group of notebook 05's shards (``params``: the notebook's). ``models``: ``(target, draft, tokenizer, draft
    name)`` already loaded (the notebook's), else loaded when needed (:func:`specrepro.lab.specinfer.load_tree_models`).
    """

    def __init__(self, params: dict, profile: str = STANDARD, models=None, progress: bool = True):
        super().__init__(params, profile, progress=progress, context=models)

    def _draft_name(self) -> str:
        """The loaded models' draft name, else :func:`specrepro.lab.specinfer.tree_draft_name` of the parameters."""
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
    ``mss_tokens`` tokens, trees ⟨w, 1, ..., 1⟩ with w the largest of ``widths`` and depth ``tree_depth``, T = 1."""

    name = "specinfer_table3_runs"
    what = "the MSS shard"

    def names(self) -> list[str]:
        return [self.name]

    def table(self) -> pd.DataFrame:
        """The shard's table (one row per pass, prompt and method)."""
        return self.run(self.name)

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
        """What shard ``name``'s sidecar records and a reader must find (KeyError: not one of :meth:`names`)."""
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
