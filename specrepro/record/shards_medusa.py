"""Notebook 06's measurements (Medusa, Cai et al. 2024) as shards of the record: :class:`MedusaShards`, measured by
:mod:`specrepro.lab.medusa_parts`, each read or measured as :func:`specrepro.record.shardkit.read_or_measure` says.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from specrepro import data
from specrepro.core.sampling import SamplingConfig
from specrepro.lab import medusa_parts as mp
from specrepro.record.results import table_at
from specrepro.record.shardkit import ShardGroup, checkpoint_key

__all__ = ["MedusaShards"]


class MedusaShards(ShardGroup):
    """Notebook 06's measurements as shards, in the order they can run: on ``medusa_target`` (SmolLM2-135M) the
    Medusa-1 heads' ``medusa_training_loss``, ``medusa_head_accuracy`` (held-out top-1..5 per head) and the distilled
    draft's ``medusa_draft_kl``, then, timed (``medusa_repeats`` passes × ``medusa_speed_prompts`` prompts ×
    ``medusa_tokens`` tokens), ``medusa_greedy_runs`` (Medusa Table 1's methods), ``medusa_tree_size_runs`` (the
    accuracy-driven tree of each size of ``medusa_tree_sizes``) and ``medusa_sampling_runs`` (T =
    ``stochastic_temperature``); on ``large_target`` ``medusa_large_head_accuracy`` (stdlib-trained heads) and
    ``medusa_large_tree_ablation`` (tokens per step of chain, dense and sparse trees); Medusa-2's ``medusa2_quality``
    (held-out NLL change of the fine-tuned backbone) and ``medusa2_runs`` (timed).

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

    def run(self, name: str) -> pd.DataFrame:
        """Shard ``name``'s table, read or measured (its accuracy table first, for a shard decoding with a tree from
        one). A ``text`` column (decoded outputs) reads back with empty strings, not NaN."""
        out = super().run(name)
        if "text" in out.columns:
            out["text"] = out["text"].fillna("")
        return out
