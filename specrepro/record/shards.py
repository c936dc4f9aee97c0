"""Notebooks 03's, 04's, 05's and 06's measurements as shards of the record: each one ``make`` target, one table and
its sidecar.

What this file is: ``python -m specrepro shard NAME --profile profiles/standard.yaml`` (the Makefile runs one
target per shard before the notebook), :class:`Table2Shards`, which notebook 04 uses to read its shards and to
run, in the same process, any that are missing (the quick profile in CI; a run by hand), notebook 03's α table
(:class:`AlphaShards`, one shard per workload and temperature), and notebook 05's shards
likewise: :class:`MSSShard` (naive sampling vs MSS, SpecInfer Table 3), :class:`TreeSpeedShards` (the tree
verification cost curves, and the tree-vs-chain timing in parts of a few prompts) and :class:`WidthShards`
(SpecInfer Table 2, tokens per step vs tree width, one shard per decoding and pass), and notebook 06's
:class:`MedusaShards` (Medusa's training, accuracy, timed runs, tree ablation and Medusa-2, measured by
:mod:`specrepro.lab.medusa_parts`). Notebook 04's shards are defined in :mod:`specrepro.lab.table2`.

Each shard's table is saved with :func:`specrepro.record.results.save_table`; its sidecar records the setting
(models, workload slice, sizes, methods), the sitting's wall time (``seconds``), the CPU (every provenance does), how
many of its (pass, prompt) blocks were timed while other processes or the hypervisor took the CPU
(``blocks_under_load``; :func:`specrepro.files.machine_state`), and the sha256 of the table. A shard that exists
under the same setting is read, not measured again; one under another setting is measured afresh.

While a shard is timed, every finished (pass, prompt) block is kept in a checkpoint: under ``data/checkpoints/`` for
the record (so that the partial blocks can be committed, and a later sitting on the same CPU model, code and setting
resumes them; on another CPU the checkpoint is set aside and the shard starts afresh, so a table never mixes
machines), under ``build/checkpoints/`` otherwise. It is deleted once the table is saved.

What it is not: the notebooks' summaries and figures, or the bench files' shards (``make``).
"""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path

import pandas as pd

from specrepro.files import checkpoint_file, hold_record_lock, repo_root
from specrepro.lab import table2
from specrepro.record.results import STANDARD, load_table, save_table, table_at, writes_record

__all__ = ["Table2Shards", "AlphaShards", "MSSShard", "TreeSpeedShards", "WidthShards", "MedusaShards",
           "read_or_measure", "shard_checkpoint", "configure_parser", "run_command"]


def shard_checkpoint(name: str, profile: str) -> Path:
    """Where a shard keeps its finished blocks while it is timed: ``data/checkpoints/<name>.<profile>.json`` when
    this run writes the record (committable), else :func:`specrepro.files.checkpoint_file`."""
    if writes_record(profile):
        hold_record_lock()  # before the hour of timing, not after: one job writes the record at a time
        return repo_root() / "data" / "checkpoints" / f"{name}.{profile}.json"
    return checkpoint_file(name, profile)


def read_or_measure(name: str, profile: str, device: str, settings: dict, measure) -> pd.DataFrame:
    """The shard ``name``: read when its table exists under ``settings``, else ``measure(checkpoint)`` now and saved
    with its sidecar (the settings, the run time, the machine's load before and after, and, for timed tables with an
    ``under_load`` column, how many (pass, prompt) blocks ran under load), its checkpoint deleted.

    The run time of a shard resumed over several sittings is their sum: a sitting that ends without its table (an
    exception, Ctrl-C or SIGTERM; not a kill -9) adds its seconds to ``<checkpoint>.sittings.json`` beside the checkpoint, and
    the sidecar records ``seconds`` (every sitting's), ``sittings`` and ``seconds_this_sitting``.

    Returns the table as a later reader gets it (the CSV's types); ``attrs["measured"]`` says which happened."""
    import json

    found = load_table(name, profile, **settings)
    if found is not None:
        return found
    from specrepro.files import atomic_write_text, machine_snapshot, machine_state

    t0, snap = time.monotonic(), machine_snapshot()
    ckpt = shard_checkpoint(name, profile)
    log = ckpt.with_name(ckpt.name + ".sittings.json")
    try:
        earlier = [float(x) for x in json.loads(log.read_text())] if ckpt.exists() and log.exists() else []
    except (OSError, ValueError, TypeError):
        earlier = []
    previous = _exit_on_sigterm()
    try:
        df = measure(ckpt)
    except BaseException:
        if ckpt.exists():  # blocks were kept: the next sitting resumes them, and adds this one's time
            atomic_write_text(log, json.dumps([*earlier, round(time.monotonic() - t0, 1)]) + "\n")
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    state = machine_state(snap, machine_snapshot())
    now = round(time.monotonic() - t0, 1)
    extra = {"seconds": round(now + sum(earlier), 1), "sittings": len(earlier) + 1, "seconds_this_sitting": now,
             "load_before": state["load_before"], "load_after": state["load_after"]}
    if "under_load" in df.columns:
        blocks = df.drop_duplicates(["repeat", "prompt_index"])
        extra.update(blocks=int(len(blocks)), blocks_under_load=int((blocks["under_load"] == True).sum()))  # noqa: E712
    else:
        extra.update(steal_pct=state["steal_pct"], other_cpu_pct=state["other_cpu_pct"])
    save_table(df, name, profile=profile, device=device, **settings, **extra)
    ckpt.unlink(missing_ok=True)
    log.unlink(missing_ok=True)
    out = load_table(name, profile, **settings)
    out.attrs["measured"] = True
    return out


def _exit_on_sigterm():
    """While a shard measures: SIGTERM (``kill``, a job scheduler's stop) raises SystemExit in the main thread, so the
    sitting's time is logged as for Ctrl-C. Returns the handler it replaced (None off the main thread)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, stop)


def _draft_name(shard) -> str:
    """A notebook-05 shard's draft name: its loaded models' (the notebook's), else
    :func:`specrepro.lab.specinfer.tree_draft_name` of its parameters."""
    from specrepro.lab.specinfer import tree_draft_name

    if shard.models is not None:
        return shard.models[3]
    p = shard.params
    return tree_draft_name(p["target"], p.get("draft"), bool(p.get("tree_int8_draft")))


def _tree_models(shard):
    """A notebook-05 shard's ``(target, draft, tokenizer, draft name)``: the ones it was given, else loaded once from
    its parameters (:func:`specrepro.lab.specinfer.load_tree_models`) and kept on it."""
    if shard.models is None:
        from specrepro.lab.specinfer import load_tree_models

        p = shard.params
        shard.models = load_tree_models(p["target"], p.get("draft"), device=p["device"], dtype=p["dtype"],
                                        int8_draft=bool(p.get("tree_int8_draft")))
    return shard.models


class _ShardGroup:
    """What a group of shards sharing models has in common: ``profile``, ``device`` and ``measured`` (the shards
    this object measured; the others were read), :meth:`_get` (one shard read or measured, noted in ``measured``)
    and :meth:`table` (every shard of :meth:`names`, concatenated)."""

    profile: str
    measured: list[str]
    #: what a shard of the group is called in the error for a name that is not one
    what = "a shard of this group"

    @property
    def device(self) -> str:
        return self.params["device"]

    def names(self) -> list[str]:
        raise NotImplementedError

    def run(self, name: str) -> pd.DataFrame:
        raise NotImplementedError

    def _require(self, name: str) -> None:
        """Raises KeyError (naming the group's shards) unless ``name`` is one of :meth:`names`."""
        if name not in self.names():
            raise KeyError(f"{name!r} is not {self.what} under this profile; its shards: {self.names()}")

    def _get(self, name: str, settings: dict, measure) -> pd.DataFrame:
        out = read_or_measure(name, self.profile, self.device, settings, measure)
        if out.attrs.get("measured"):
            self.measured.append(name)
        return out

    def table(self) -> pd.DataFrame:
        """Every shard's rows, concatenated in :meth:`names`' order."""
        return pd.concat([self.run(name) for name in self.names()], ignore_index=True)


class MSSShard:
    """Notebook 05's naive-vs-MSS table (SpecInfer Table 3, :func:`specrepro.lab.specinfer.naive_vs_mss_table`) as
    the shard ``specinfer_table3_runs``: ``mss_prompts`` HumanEval prompts × ``mss_repeats`` passes ×
    ``mss_tokens`` tokens, trees ⟨w, 1, ..., 1⟩ with w the largest of ``widths`` and depth ``tree_depth``, T = 1.
    Read when it exists under the same setting, else measured (the models load only then) and saved.

    Args:
        params: notebook 05's parameters (the profile's names). profile: where it is read and written.
        models: ``(target, draft, tokenizer, draft name)`` already loaded (the notebook's), else loaded when needed
            (:func:`specrepro.lab.specinfer.load_tree_models`).
    """

    name = "specinfer_table3_runs"

    def __init__(self, params: dict, profile: str = STANDARD, models=None, progress: bool = True):
        self.params, self.profile, self.models, self.progress = dict(params), profile, models, progress

    def settings(self) -> dict:
        """What the sidecar records and a reader must find: models, dtype, workload, sizes, tree and seed."""
        p = self.params
        return {"shard": self.name, "target": p["target"], "draft": _draft_name(self), "dtype": p["dtype"],
                "workload": p["workload"], "prompts": int(p["mss_prompts"]), "tokens": int(p["mss_tokens"]),
                "repeats": int(p["mss_repeats"]), "width": int(max(p["widths"])), "depth": int(p["tree_depth"]),
                "seed": int(p["seed"]), "temperature": 1.0}

    def table(self) -> pd.DataFrame:
        """The shard's table (one row per pass, prompt and method)."""
        s = self.settings()

        def measure(ckpt):
            from specrepro.data import load_workload
            from specrepro.files import cpu_description
            from specrepro.lab.specinfer import naive_vs_mss_table

            tmodel, dmodel, tokenizer, _ = _tree_models(self)
            return naive_vs_mss_table(tmodel, dmodel, tokenizer, load_workload(s["workload"], s["prompts"]),
                                      width=s["width"], depth=s["depth"], max_new_tokens=s["tokens"],
                                      seed=s["seed"], repeats=s["repeats"], checkpoint=ckpt,
                                      checkpoint_key=dict(s, cpu=cpu_description()), progress=self.progress)

        return read_or_measure(self.name, self.profile, self.params["device"], s, measure)


class TreeSpeedShards(_ShardGroup):
    """Notebook 05's hardware-aware tree choice and its tree-vs-chain timing as shards.

    * ``specinfer_tree_costs``: the verification cost curves (:func:`specrepro.lab.specinfer.tree_cost_table`): one
      target forward over root + N nodes for N in ``cost_sizes``, and one draft forward over w tokens for every width,
      on the first prompt's KV cache, ``tree_cost_repeats`` timed rounds (ms, median over the rounds).
    * ``specinfer_tree_speed_p<k>``: AR, the best chain, the chain of equal target positions (γ = w·d) and the best
      tree ⟨w, 1, ..., 1⟩ of depth d, timed interleaved at T = 1 (:func:`specrepro.lab.specinfer.tree_vs_chain_speed`),
      ``speed_repeats`` passes × ``speed_tokens`` tokens over prompts ``[k·s, (k+1)·s)`` of ``tree_prompts`` (s =
      ``speed_shard_prompts``); each part seeds and orders its prompts as one whole run would.

    The tree and the best chain are :func:`specrepro.lab.specinfer.choose_tree`'s, from the cost curves and the
    stochastic ⟨w, 1, ..., 1⟩ runs of Table 2 (``specinfer_tree_costs`` and ``specinfer_table2_root_runs``, read, or
    measured when missing): a part is fixed by that choice, which its sidecar records (``tree``, ``gamma``), so new
    cost curves that change the choice make the parts stale.

    Args:
        params: notebook 05's parameters (the profile's names). profile: where tables are read and written.
        models: ``(target, draft, tokenizer, draft name)`` already loaded (the notebook's), else loaded when needed.
        root_runs: the ⟨w, 1, ..., 1⟩ runs of Table 2 when the caller has them (the notebook), else read or measured.
    """

    what = "a tree-speed shard"

    cost_name = "specinfer_tree_costs"
    part_prefix = "specinfer_tree_speed_p"

    def __init__(self, params: dict, profile: str = STANDARD, models=None, root_runs: pd.DataFrame | None = None,
                 progress: bool = True):
        self.params, self.profile, self.models, self.progress = dict(params), profile, models, progress
        self._root_runs, self.measured = root_runs, []

    def _prompts(self, n: int):
        from specrepro.data import load_workload

        return load_workload(self.params["workload"], n)

    def slices(self) -> list[tuple[int, int]]:
        """The prompt slices ``[start, stop)`` of the timing parts: ``speed_shard_prompts`` each (default: all)."""
        import math

        n = int(self.params["tree_prompts"])
        size = int(self.params.get("speed_shard_prompts") or n)
        if n < 1 or size < 1:
            raise ValueError(f"tree_prompts and speed_shard_prompts must be >= 1; got {n}, {size}")
        return [(k * size, min((k + 1) * size, n)) for k in range(math.ceil(n / size))]

    def names(self) -> list[str]:
        """The shards, in the order they can run: the cost curves, then the timing parts."""
        return [self.cost_name] + [f"{self.part_prefix}{k}" for k in range(len(self.slices()))]

    def cost_settings(self) -> dict:
        p = self.params
        return {"shard": self.cost_name, "target": p["target"], "draft": _draft_name(self), "dtype": p["dtype"],
                "workload": p["workload"], "cost_sizes": [int(n) for n in p["cost_sizes"]],
                "draft_widths": list(range(1, int(max(p["widths"])) + 1)),
                "repeats": int(p["tree_cost_repeats"])}

    def costs(self) -> pd.DataFrame:
        """The cost curves' shard: one row per (model, N): model, n_nodes, fed_tokens, ms, ms_min."""
        s = self.cost_settings()

        def measure(ckpt):
            from specrepro.lab.specinfer import tree_cost_table

            tmodel, dmodel, tokenizer, draft_name = _tree_models(self)
            prefix = tokenizer(self._prompts(1)[0].text, return_tensors="pt").input_ids[0]
            target_cost = tree_cost_table(tmodel, prefix, s["cost_sizes"], repeats=s["repeats"], name=s["target"])
            draft_cost = tree_cost_table(dmodel, prefix, [w - 1 for w in s["draft_widths"]], repeats=s["repeats"],
                                         name=draft_name)
            return pd.concat([target_cost, draft_cost], ignore_index=True)

        return self._get(self.cost_name, s, measure)

    def root_settings(self) -> dict:
        """The settings notebook 05 saves Table 2's ⟨w, 1, ..., 1⟩ runs under (``specinfer_table2_root_runs``)."""
        p = self.params
        return dict(shape="root", target=p["target"], draft=_draft_name(self), prompts=int(p["tree_prompts"]),
                    tokens=int(p["tree_tokens"]), depth=int(p["tree_depth"]), widths=[int(w) for w in p["widths"]],
                    seed=int(p["seed"]))

    def root_runs(self) -> pd.DataFrame:
        """Table 2's ⟨w, 1, ..., 1⟩ runs (``specinfer_table2_root_runs``, notebook 05's settings): given, read, or
        measured now and saved as the notebook saves them."""
        if self._root_runs is None:
            from specrepro.lab.specinfer import tree_width_table

            s = self.root_settings()
            found = load_table("specinfer_table2_root_runs", self.profile, **s)
            if found is None:
                tmodel, dmodel, tokenizer, _ = _tree_models(self)
                found = tree_width_table(tmodel, dmodel, tokenizer, self._prompts(s["prompts"]), widths=s["widths"],
                                         depth=s["depth"], max_new_tokens=s["tokens"], seed=s["seed"], shape="root")
                save_table(found, "specinfer_table2_root_runs", profile=self.profile, device=self.params["device"],
                           **s)
            self._root_runs = found
        return self._root_runs

    def _rank(self, costs: pd.DataFrame, roots: pd.DataFrame) -> pd.DataFrame:
        from specrepro.lab.specinfer import choose_tree

        target = self.params["target"]
        return choose_tree(roots, costs[costs["model"] == target], costs[costs["model"] != target],
                           decoding="stochastic", depths=range(1, int(self.params["tree_depth"]) + 1))

    def choice(self) -> pd.DataFrame:
        """:func:`specrepro.lab.specinfer.choose_tree`'s ranking (stochastic decoding, depths 1..``tree_depth``) from
        the cost curves and the root runs; best first."""
        return self._rank(self.costs(), self.root_runs())

    def picks(self) -> dict:
        """``{"tree": [w, d], "gamma": γ}``: the best tree (width > 1) and the best chain of :meth:`choice`."""
        return _picks(self.choice())

    def recorded_picks(self, folder: Path) -> dict | None:
        """:meth:`picks` from the cost curves and root runs as recorded in ``folder`` (e.g. ``data/results``),
        measuring nothing: None when either table is missing or was measured under other settings."""
        costs = table_at(folder / f"{self.cost_name}.csv", **self.cost_settings())
        roots = table_at(folder / "specinfer_table2_root_runs.csv", **self.root_settings())
        return None if costs is None or roots is None else _picks(self._rank(costs, roots))

    def part_settings(self, k: int, picks: dict | None = None) -> dict:
        """What part ``k``'s sidecar records and a reader must find: models, workload slice, sizes, seed and the
        choice (``picks``: :meth:`picks` when None; ``{}`` leaves the choice out)."""
        p = self.params
        start, stop = self.slices()[k]
        return {"shard": f"{self.part_prefix}{k}", "target": p["target"], "draft": _draft_name(self),
                "dtype": p["dtype"], "workload": p["workload"], "prompts": int(p["tree_prompts"]),
                "part_prompts": [start, stop], "tokens": int(p["speed_tokens"]), "repeats": int(p["speed_repeats"]),
                "seed": int(p["seed"]), "temperature": 1.0, **(self.picks() if picks is None else picks)}

    def part(self, k: int) -> pd.DataFrame:
        """Timing part ``k``: one row per (pass, prompt, method) (:func:`~specrepro.lab.specinfer.tree_vs_chain_speed`)."""
        s = self.part_settings(k)

        def measure(ckpt):
            from specrepro.files import cpu_description
            from specrepro.lab.specinfer import tree_vs_chain_speed

            tmodel, dmodel, tokenizer, _ = _tree_models(self)
            start, stop = s["part_prompts"]
            return tree_vs_chain_speed(tmodel, dmodel, tokenizer, self._prompts(stop)[start:stop],
                                       tree=tuple(s["tree"]), gamma=s["gamma"], max_new_tokens=s["tokens"],
                                       seed=s["seed"], repeats=s["repeats"], progress=self.progress,
                                       checkpoint=ckpt, prompt_offset=start, checkpoint_key={
                                           **{k: v for k, v in s.items() if k != "prompts"},
                                           "n_prompts": s["prompts"], "cpu": cpu_description()})

        return self._get(s["shard"], s, measure)

    def table(self) -> pd.DataFrame:
        """Every timing part, concatenated (the whole tree-vs-chain timing)."""
        return pd.concat([self.part(k) for k in range(len(self.slices()))], ignore_index=True)

    def run(self, name: str) -> pd.DataFrame:
        """The shard ``name`` (one of :meth:`names`), read or measured.

        Raises:
            KeyError: not a shard of this setting.
        """
        self._require(name)
        return self.costs() if name == self.cost_name else self.part(int(name.removeprefix(self.part_prefix)))


class WidthShards(_ShardGroup):
    """SpecInfer Table 2 (verified tokens per step vs tree width) at the size a verdict needs, as shards:
    ``width_prompts`` HumanEval prompts × ``width_tokens`` tokens on SpecInfer's trees ⟨1,1,w,1,...,1⟩ of depth
    ``tree_depth`` for every width of ``widths`` (:func:`specrepro.lab.specinfer.tree_width_table`, shape "paper").

    * ``specinfer_table2_width_greedy``: greedy decoding (VerifyGreedy), one pass (greedy tree decoding is
      deterministic: a second pass repeats the first token for token);
    * ``specinfer_table2_width_t1_r<k>``: T = 1 (MSS on i.i.d. children), pass k of ``width_passes``, seeded
      ``seed + k``.

    Tokens per step are counted, not timed. Each shard is read when it exists under the same setting, else measured
    (resumable over sittings from its checkpoint) and saved with its sidecar.

    Args:
        params: notebook 05's parameters (the profile's names). profile: where tables are read and written.
        models: ``(target, draft, tokenizer, draft name)`` already loaded, else loaded when needed.
    """

    what = "a tree-width shard"

    prefix = "specinfer_table2_width_"

    def __init__(self, params: dict, profile: str = STANDARD, models=None, progress: bool = True):
        self.params, self.profile, self.models, self.progress = dict(params), profile, models, progress
        self.measured: list[str] = []

    def names(self) -> list[str]:
        """The shards: the greedy pass, then the T = 1 passes."""
        n = int(self.params["width_passes"])
        if n < 1:
            raise ValueError(f"width_passes must be >= 1, got {n}")
        return [self.prefix + "greedy"] + [f"{self.prefix}t1_r{k}" for k in range(n)]

    def settings(self, name: str) -> dict:
        """What shard ``name``'s sidecar records and a reader must find.

        Raises:
            KeyError: not one of :meth:`names`.
        """
        self._require(name)
        p = self.params
        greedy = name.endswith("greedy")
        return {"shard": name, "target": p["target"],
                "draft": _draft_name(self), "dtype": p["dtype"],
                "workload": p["workload"], "prompts": int(p["width_prompts"]), "tokens": int(p["width_tokens"]),
                "depth": int(p["tree_depth"]), "widths": [int(w) for w in p["widths"]], "shape": "paper",
                "seed": int(p["seed"]), "decoding": "greedy" if greedy else "stochastic",
                "pass": 0 if greedy else int(name.rsplit("_r", 1)[1])}

    def run(self, name: str) -> pd.DataFrame:
        """Shard ``name``'s table (one row per prompt and width), read or measured."""
        s = self.settings(name)

        def measure(ckpt):
            from specrepro.data import load_workload
            from specrepro.files import cpu_description
            from specrepro.lab.specinfer import tree_width_table

            tmodel, dmodel, tokenizer, _ = _tree_models(self)
            return tree_width_table(tmodel, dmodel, tokenizer, load_workload(s["workload"], s["prompts"]),
                                    widths=s["widths"], depth=s["depth"], max_new_tokens=s["tokens"], seed=s["seed"],
                                    decodings=(s["decoding"],), shape=s["shape"], progress=self.progress,
                                    passes=(s["pass"],), checkpoint=ckpt,
                                    checkpoint_key={"target": s["target"], "draft": s["draft"], "dtype": s["dtype"],
                                                    "cpu": cpu_description()})

        return self._get(name, s, measure)


class AlphaShards(_ShardGroup):
    """Notebook 03's α table (Leviathan Table 3 analogue, :func:`specrepro.lab.leviathan.alpha_table`) as shards,
    one per workload and temperature: ``leviathan_table3_runs_<workload>_t<0|1>``, each ``alpha_prompts`` prompts ×
    ``alpha_tokens`` teacher-forced positions for every draft (unigram, bigram, prompt lookup, the draft model).
    Each job seeds its own generator (:func:`specrepro.lab.leviathan.alpha_job_seed`), so the shards' rows are the
    rows of one call over every workload and temperature. α is counted, not timed. Each shard is read when it exists
    under the same setting, else measured (resumable over sittings from its checkpoint) and saved with its sidecar.

    Args:
        params: notebook 03's parameters (the profile's names: ``target``, ``draft``, ``alpha_prompts``, ...).
        profile: where tables are read and written.
        context: :func:`specrepro.lab.leviathan.load_alpha_context`'s dict already loaded, else loaded when needed.
    """

    what = "an alpha shard"

    prefix = "leviathan_table3_runs_"
    workloads = ("humaneval", "pydoc")
    temperatures = (0.0, 1.0)
    gamma = 3  # the trajectory's draft length (speed only)

    def __init__(self, params: dict, profile: str = STANDARD, context: dict | None = None, progress: bool = True):
        self.params, self.profile, self.context, self.progress = dict(params), profile, context, progress
        self.measured: list[str] = []

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

    def run(self, name: str) -> pd.DataFrame:
        """Shard ``name``'s table (one row per prompt and draft), read or measured."""
        s = self.settings(name)

        def measure(ckpt):
            from specrepro.files import cpu_description
            from specrepro.lab.leviathan import alpha_table

            c = self.load()
            return alpha_table(c["target"], c["tokenizer"], c["drafters"], {s["workload"]: c["workloads"][s["workload"]]},
                               temperatures=(s["temperature"],), max_new_tokens=s["tokens"], seed=s["seed"],
                               trajectory_drafter=c["trajectory"], gamma=s["gamma"], progress=self.progress,
                               checkpoint=ckpt, checkpoint_key={k: s[k] for k in ("target", "draft", "dtype",
                                                                                  "trajectory")}
                               | {"cpu": cpu_description()})

        return self._get(name, s, measure)


class MedusaShards(_ShardGroup):
    """Notebook 06's measurements (Medusa, Cai et al. 2024) as shards, in the order they can run
    (:mod:`specrepro.lab.medusa_parts` measures each):

    * on ``medusa_target`` (SmolLM2-135M): ``medusa_training_loss`` (the Medusa-1 heads' per-step losses; trains them
      when not cached), ``medusa_head_accuracy`` (held-out top-1..5 per head), ``medusa_draft_kl`` (the distilled
      draft's held-out KL before and after), then, timed by the one harness with ``medusa_repeats`` passes ×
      ``medusa_speed_prompts`` prompts × ``medusa_tokens`` tokens, ``medusa_greedy_runs`` (Medusa Table 1's methods),
      ``medusa_tree_size_runs`` (the accuracy-driven tree of each size of ``medusa_tree_sizes``) and
      ``medusa_sampling_runs`` (T = ``stochastic_temperature``: typical acceptance beside exact stochastic Medusa);
    * on ``large_target``: ``medusa_large_head_accuracy`` (its stdlib-trained heads) and
      ``medusa_large_tree_ablation`` (chain, dense and sparse trees, tokens per step counted);
    * Medusa-2: ``medusa2_quality`` (held-out NLL change of the fine-tuned backbone) and ``medusa2_runs`` (timed).

    The SmolLM2 timed shards and the ablation decode with trees built from the accuracy shards' tables as the record
    holds them, and record those trees in their settings: new accuracies make them stale. ``medusa2_runs`` decodes
    with the tree of its own Medusa-1 heads' held-out accuracy, which its training settings fix. Each shard is read
    when it exists under the same setting, else measured (the models load and the heads train only then; trained
    pieces are cached) and saved with its sidecar; the timed ones resume from their checkpoint (blocks of one pass
    over one prompt, every method).

    Args:
        params: notebook 06's parameters (the profile's names). profile: where tables are read and written.
        context: a :class:`specrepro.lab.medusa_parts.MedusaContext` already holding the models, else made when
            something must be measured.
    """

    what = "a shard of notebook 06"

    accuracy_name = "medusa_head_accuracy"
    large_accuracy_name = "medusa_large_head_accuracy"
    #: the shards decoding with a tree from the Medusa target's accuracy table, and their tree's name in the settings
    _tree_shards = ("medusa_greedy_runs", "medusa_tree_size_runs", "medusa_sampling_runs")

    def __init__(self, params: dict, profile: str = STANDARD, context=None, progress: bool = True):
        self.params, self.profile, self.context, self.progress = dict(params), profile, context, progress
        self.measured: list[str] = []

    def names(self) -> list[str]:
        return ["medusa_training_loss", self.accuracy_name, "medusa_draft_kl", *self._tree_shards,
                self.large_accuracy_name, "medusa_large_tree_ablation", "medusa2_quality", "medusa2_runs"]

    def ctx(self):
        """The :class:`~specrepro.lab.medusa_parts.MedusaContext` (made on first use)."""
        if self.context is None:
            from specrepro.lab.medusa_parts import MedusaContext

            self.context = MedusaContext(self.params, progress=self.progress)
        return self.context

    def _data(self) -> dict:
        p = self.params
        return {"target": p["medusa_target"], "dtype": p["dtype"], "seed": int(p["seed"]), "workload": p["workload"],
                "eval_prompts": max(int(p["n_prompts"]), int(p["medusa_speed_prompts"])),
                "train_prompts": int(p["n_train_prompts"]) if p.get("n_train_prompts") else "all",
                "sd_tokens": int(p["sd_max_new_tokens"]), "max_prompt_tokens": int(p["max_prompt_tokens"])}

    def _heads(self) -> dict:
        p = self.params
        return {"heads": int(p["medusa_heads"]), "share_lm_head": bool(p["share_lm_head"]),
                "epochs": int(p["medusa_epochs"]), "batch_size": int(p["medusa_batch_size"]),
                "max_steps": p.get("medusa_max_steps")}

    def _draft(self) -> dict:
        p = self.params
        return {"distill_epochs": int(p["distill_epochs"]), "distill_max_steps": p.get("distill_max_steps")}

    def _timing(self, prompts_key: str = "medusa_speed_prompts") -> dict:
        p = self.params
        return {"prompts": int(p[prompts_key]), "tokens": int(p["medusa_tokens"]), "repeats": int(p["medusa_repeats"])}

    def _stdlib(self, target: str) -> dict:
        p = self.params
        return {"target": target, "dtype": p["dtype"], "seed": int(p["seed"]), "heads": int(p["medusa_heads"]),
                "head_vocab": p.get("large_head_vocab"), "distill_tokens": int(p["large_distill_tokens"]),
                "epochs": int(p["large_epochs"])}

    def trees(self, name: str, acc: pd.DataFrame) -> dict:
        """The trees shard ``name`` decodes with, built from the accuracy table ``acc`` (the Medusa target's for the
        timed shards, the larger target's for the ablation): ``{"tree": choices}``, ``{"trees": {size: choices}}``
        or ``{"trees": {name: choices}}``; ``{}`` for a shard without one."""
        from specrepro.lab.medusa_parts import accuracy_tree, large_ablation_trees

        p = self.params
        if name in ("medusa_greedy_runs", "medusa_sampling_runs"):
            return {"tree": accuracy_tree(acc, int(p["tree_nodes"]))}
        if name == "medusa_tree_size_runs":
            return {"trees": {str(int(n)): accuracy_tree(acc, int(n)) for n in p["medusa_tree_sizes"]}}
        if name == "medusa_large_tree_ablation":
            return {"trees": large_ablation_trees(acc, int(p["medusa_heads"]), p["large_dense_topk"],
                                                  p["large_sparse_sizes"])}
        return {}

    def _accuracy_for(self, name: str) -> str | None:
        if name in self._tree_shards:
            return self.accuracy_name
        return self.large_accuracy_name if name == "medusa_large_tree_ablation" else None

    def settings(self, name: str, trees: dict | None = None) -> dict:
        """What shard ``name``'s sidecar records and a reader must find: models, data, training configuration, sizes
        and, for the shards decoding with a tree from an accuracy table, ``trees`` (:meth:`trees`; None: built from
        that table, read or measured).

        Raises:
            KeyError: not one of :meth:`names`.
        """
        self._require(name)
        p = self.params
        if name in ("medusa_training_loss", self.accuracy_name):
            s = {**self._data(), **self._heads()}
        elif name == "medusa_draft_kl":
            s = {**self._data(), **self._draft()}
        elif name in self._tree_shards:
            s = {**self._data(), **self._heads(), **self._draft(), **self._timing(),
                 "temperature": float(p["stochastic_temperature"]) if name == "medusa_sampling_runs" else 0.0}
            if name == "medusa_tree_size_runs":
                s["sizes"] = [int(n) for n in p["medusa_tree_sizes"]]
        elif name == self.large_accuracy_name:
            s = self._stdlib(p["large_target"])
        elif name == "medusa_large_tree_ablation":
            s = {**self._stdlib(p["large_target"]), "workload": p["workload"],
                 "prompts": int(p["large_ablation_prompts"]), "tokens": int(p["large_ablation_tokens"])}
        else:  # Medusa-2: the Medusa target's stdlib heads (Medusa-1), then joint training
            s = {**self._stdlib(p["medusa_target"]), "train_seqs": int(p["m2_train_seqs"]),
                 "eval_seqs": int(p["m2_eval_seqs"]), "chunk_tokens": int(p["m2_chunk_tokens"]),
                 "m2_epochs": int(p["m2_epochs"])}
            if name == "medusa2_runs":
                s.update(workload=p["workload"], tree_nodes=int(p["tree_nodes"]), **self._timing("m2_speed_prompts"))
        source = self._accuracy_for(name)
        if source is not None:
            s.update(self.trees(name, self.run(source)) if trees is None else trees)
        return {"shard": name, **s}

    def recorded_trees(self, name: str, folder: Path) -> dict | None:
        """:meth:`trees` of shard ``name`` from the accuracy table as recorded in ``folder`` (e.g. ``data/results``),
        measuring nothing: None when that table is missing or was measured under other settings; ``{}`` for a shard
        without a tree."""
        source = self._accuracy_for(name)
        if source is None:
            return {}
        acc = table_at(folder / f"{source}.csv", **self.settings(source))
        return None if acc is None else self.trees(name, acc)

    def run(self, name: str) -> pd.DataFrame:
        """Shard ``name``'s table, read or measured (its accuracy table first, for a shard decoding with a tree from
        one). A ``text`` column (decoded outputs) reads back with empty strings, not NaN."""
        from specrepro.lab import medusa_parts as mp

        s = self.settings(name)

        def measure(ckpt):
            from specrepro.core.sampling import GREEDY, SamplingConfig
            from specrepro.files import cpu_description

            c = self.ctx()
            key = {**s, "cpu": cpu_description()}
            if name == "medusa_training_loss":
                return mp.training_losses(c)
            if name == self.accuracy_name:
                return mp.head_accuracy(c)
            if name == "medusa_draft_kl":
                return mp.draft_kl_table(c)
            if name == "medusa_greedy_runs":
                return mp.timed_runs(c, mp.greedy_methods(c, s["tree"]), c.speed_prompts, checkpoint=ckpt,
                                     checkpoint_key=key)
            if name == "medusa_tree_size_runs":  # the trees its settings record, in the order of their sizes
                return mp.timed_runs(c, mp.tree_size_methods(c, s["trees"]), c.speed_prompts, checkpoint=ckpt,
                                     checkpoint_key=key)
            if name == "medusa_sampling_runs":
                return mp.timed_runs(c, mp.sampling_methods(c, s["tree"]), c.speed_prompts,
                                     sampling=SamplingConfig(temperature=s["temperature"]), baseline=None,
                                     checkpoint=ckpt, checkpoint_key=key)
            if name == self.large_accuracy_name:
                return mp.large_head_accuracy(c)
            if name == "medusa_large_tree_ablation":
                return mp.large_tree_ablation(c, s["trees"], self.run(self.large_accuracy_name))
            if name == "medusa2_quality":
                return mp.medusa2_quality(c)
            from specrepro.data import load_workload

            return mp.timed_runs(c, mp.medusa2_methods(c), load_workload(s["workload"], n=s["prompts"]),
                                 sampling=GREEDY, checkpoint=ckpt, checkpoint_key=key)

        out = self._get(name, s, measure)
        if "text" in out.columns:
            out["text"] = out["text"].fillna("")
        return out


def _picks(choice: pd.DataFrame) -> dict:
    """The best tree (width > 1) and the best chain of a :func:`~specrepro.lab.specinfer.choose_tree` ranking."""
    tree, chain = choice[choice["width"] > 1].iloc[0], choice[choice["width"] == 1].iloc[0]
    return {"tree": [int(tree.width), int(tree.depth)], "gamma": int(chain.depth)}


class Table2Shards(_ShardGroup):
    """Notebook 04's shards for one setting (:class:`specrepro.lab.table2.Table2Setting`): each method returns a
    shard's table, read from the record (or ``build/<profile>/``) when it exists under the same setting, else
    measured now and saved. The models load only when something must be measured.

    Args:
        params: notebook 04's parameters (the profile's names: ``target``, ``table2_prompts``, ...).
        profile: where tables are read and written (:func:`specrepro.record.results.results_dir`).
        progress: show progress bars while timing.
    """

    what = "a shard of notebook 04"

    def __init__(self, params: dict, profile: str = STANDARD, progress: bool = True):
        self.setting = table2.Table2Setting.from_params(params)
        self.profile = profile
        self.progress = progress
        self._ctx = None
        self.measured: list[str] = []  # the shards this object measured (the others were read)

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
        name = f"leviathan_table2_runs_t{t}_p{k}"
        if t == 0:
            labels = list(table2.greedy_methods(_Labels(self.setting)))
        else:
            if best is None:
                raise ValueError("the T = 1 parts need the greedy sweep's best γ per draft model (best=...)")
            labels = list(table2.t1_methods(None, best))
        start, stop = table2.part_slices(self.setting)[k]
        settings = {"shard": name, **self.setting.settings(), "temperature": float(temperature),
                    "part_prompts": [start, stop], "methods": labels}

        def measure(ckpt):
            methods = table2.greedy_methods(self.ctx) if t == 0 else table2.t1_methods(self.ctx, best)
            return table2.run_part(self.ctx, float(temperature), k, methods, checkpoint=ckpt,
                                   progress=self.progress)

        return self._get(name, settings, measure)

    def greedy_runs(self) -> pd.DataFrame:
        """Every greedy part, combined (:func:`specrepro.lab.table2.combine_parts`)."""
        return table2.combine_parts([self.part(0.0, k) for k in range(len(table2.part_slices(self.setting)))])

    def t1_runs(self, best: pd.DataFrame) -> pd.DataFrame:
        """Every T = 1 part, combined."""
        return table2.combine_parts([self.part(1.0, k, best) for k in range(len(table2.part_slices(self.setting)))])

    def best(self) -> pd.DataFrame:
        """The greedy sweep's best γ per draft model, from the greedy parts and the cost curves."""
        return table2.greedy_summary(self.greedy_runs(), self.cost_curves(), self.setting)[2]

    def run(self, name: str) -> pd.DataFrame:
        """The shard ``name`` (one of :meth:`names`), read or measured; a T = 1 part first reads (or measures) the
        greedy parts and the cost curves it depends on.

        Raises:
            KeyError: not a shard of this setting.
        """
        self._require(name)
        if name == "cost_curves":
            return self.cost_curves()
        t, k = (int(x[1:]) for x in name.removeprefix("leviathan_table2_runs_").split("_"))
        return self.part(0.0, k) if t == 0 else self.part(1.0, k, self.best())


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


def run_command(args, parser=None) -> int:
    import yaml

    path = Path(args.profile)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such profile")
    params = yaml.safe_load(path.read_text()) or {}
    shards = Table2Shards(params, profile=path.stem)
    mss = MSSShard(params, profile=path.stem)
    groups = {name: g for g in (AlphaShards(params, profile=path.stem), TreeSpeedShards(params, profile=path.stem),
                                WidthShards(params, profile=path.stem), MedusaShards(params, profile=path.stem))
              for name in g.names()}  # notebook 03's, 05's and 06's other shards -> the object that runs them
    if args.list:
        print("\n".join([*shards.names(), mss.name, *groups]))
        return 0
    for name in args.names or [*shards.names(), mss.name, *groups]:
        if name == mss.name:
            measured = bool(mss.table().attrs.get("measured"))
        elif name in groups:
            groups[name].run(name)
            measured = name in groups[name].measured
        else:
            shards.run(name)
            measured = name in shards.measured
        print(f"{name}: {'measured' if measured else 'read (already measured under this setting)'}")
    return 0
