"""Notebook 06's measurements (Medusa, Cai et al. 2024, arXiv 2401.10774v3), one function per shard of the record.

What this file is: :class:`MedusaContext`, which loads or trains, once and only when first asked, what notebook 06
decodes with (the Medusa target and its tokenizer, the evaluation and training prompts, the self-distillation data,
the Medusa-1 heads, the distilled draft, the larger target's stdlib-trained heads, the Medusa-2 backbone and heads),
and what each shard measures from it:

* training (counted): :func:`training_losses` (the heads' per-step losses, Medusa-1's Σ_k 0.8^k CE_k),
  :func:`head_accuracy` (held-out top-1..5 accuracy per head), :func:`draft_kl_table` (the distilled draft's held-out
  KL before and after distillation);
* timed, interleaved prompt by prompt by the one harness (:func:`specrepro.lab.medusa.compare_methods`):
  :func:`greedy_methods` (Medusa Table 1's methods), :func:`tree_size_methods` (the accuracy-driven tree by size),
  :func:`sampling_methods` (typical acceptance vs exact stochastic Medusa) and :func:`medusa2_methods`, each run by
  :func:`timed_runs`;
* the larger target: :func:`large_head_accuracy` (its stdlib-trained heads) and :func:`large_tree_ablation` (chain,
  dense and sparse trees; Medusa §3.3.1, Figure 5);
* Medusa-2: :func:`medusa2_quality` (the fine-tuned backbone's held-out NLL change).

The trees the timed runs decode with come from the accuracy tables (:func:`accuracy_tree`), so the shards that time
them are fixed by those tables, as read from the record.

What it is not: the shards' bookkeeping (:class:`specrepro.record.shards.MedusaShards`: read or measured, sidecars,
checkpoints), a timing loop (:mod:`specrepro.measure.harness` is the only one), or the notebook's summaries and
figures.
"""

from __future__ import annotations

import pandas as pd
import torch

from specrepro.core.medusa import MedusaProposer, sparse_tree_from_accuracies
from specrepro.core.sampling import GREEDY, SamplingConfig
from specrepro.lab.medusa import compare_methods, make_runner

__all__ = ["MedusaContext", "TOPK_COLUMNS", "accuracies", "accuracy_tree", "training_losses", "head_accuracy",
           "draft_kl_table", "greedy_methods", "tree_size_methods", "sampling_methods", "timed_runs",
           "large_head_accuracy", "large_ablation_trees", "large_tree_ablation", "medusa2_quality",
           "medusa2_tree", "medusa2_methods"]

#: the accuracy tables' top-k columns, k = 1..5 (what the trees are built from)
TOPK_COLUMNS = [f"top{i}" for i in range(1, 6)]


def accuracies(acc: pd.DataFrame) -> list[list[float]]:
    """A head-accuracy table's top-1..5 accuracies, one list per head (head 1 first): what
    :func:`~specrepro.core.medusa.sparse_tree_from_accuracies` and Medusa's expected acceptance length take.

    Raises:
        KeyError: a top-k column is missing.
    """
    return acc.sort_values("head")[TOPK_COLUMNS].values.tolist() if "head" in acc else acc[TOPK_COLUMNS].values.tolist()


def accuracy_tree(acc: pd.DataFrame, n_nodes: int) -> list[list[int]]:
    """Medusa's sparse tree of ``n_nodes`` nodes built greedily from a head-accuracy table (Medusa §3.3.1)."""
    return sparse_tree_from_accuracies(accuracies(acc), int(n_nodes))


class MedusaContext:
    """What notebook 06 decodes with, each piece loaded or trained on first use and kept (trained pieces are cached
    under :func:`specrepro.models.cache_dir`, keyed by their data and configuration, so a later process loads them).

    Args:
        params: notebook 06's parameters (the profile's names: ``medusa_target``, ``medusa_heads``, ``n_prompts``,
            ``medusa_speed_prompts``, ``large_target``, ``m2_train_seqs``, ...).
        progress: show progress bars while training and timing.
    """

    def __init__(self, params: dict, progress: bool = True):
        self.params, self.progress = dict(params), progress
        self._got: dict = {}

    def _once(self, key: str, make):
        if key not in self._got:
            self._got[key] = make()
        return self._got[key]

    @property
    def seed(self) -> int:
        return int(self.params["seed"])

    def _load(self, name: str):
        from specrepro.models import load_model

        torch.manual_seed(self.seed)  # only model construction inside transformers uses the global RNG
        return load_model(name, device=self.params["device"], dtype=self.params["dtype"])

    @property
    def model(self):
        """The Medusa target (``medusa_target``): the model whose heads and draft are trained."""
        return self._target()[0]

    @property
    def tokenizer(self):
        return self._target()[1]

    def _target(self):
        return self._once("model", lambda: self._load(self.params["medusa_target"]))

    @property
    def eos(self) -> list[int]:
        """The Medusa target's stop ids (its generation config's, as the bench)."""
        from specrepro.core.decoding import default_eos_ids

        return self._once("eos", lambda: default_eos_ids(self.model, self.tokenizer))

    @property
    def eval_prompts(self) -> list:
        """The evaluation prompts (``workload``; held out of every training set): enough for the timed runs."""
        from specrepro.data import load_workload

        p = self.params
        n = max(int(p["n_prompts"]), int(p["medusa_speed_prompts"]))
        return self._once("eval", lambda: load_workload(p["workload"], n=n))

    @property
    def speed_prompts(self) -> list:
        """The timed runs' prompts: the first ``medusa_speed_prompts`` evaluation prompts."""
        return self.eval_prompts[:int(self.params["medusa_speed_prompts"])]

    @property
    def train_prompts(self) -> list:
        """Every HumanEval prompt not evaluated, then every pydoc topic (the first ``n_train_prompts`` if set)."""
        from specrepro.data import load_workload

        def make():
            held = {p.id for p in self.eval_prompts}
            out = [p for p in load_workload("humaneval") if p.id not in held] + load_workload("pydoc")
            n = self.params.get("n_train_prompts")
            return out[:int(n)] if n else out

        return self._once("train_prompts", make)

    def _selfdistill(self, prompts, tokens: int):
        from specrepro.train.medusa1 import self_distillation_data

        return self_distillation_data(self.model, self.tokenizer, prompts, max_new_tokens=tokens,
                                      max_prompt_tokens=int(self.params["max_prompt_tokens"]), seed=self.seed,
                                      batch_size=8)

    @property
    def train_data(self):
        """The target's own generations on the training prompts (``sd_max_new_tokens`` each; cached)."""
        return self._once("train_data", lambda: self._selfdistill(self.train_prompts,
                                                                  int(self.params["sd_max_new_tokens"])))

    @property
    def heldout(self):
        """The target's own generations on the evaluation prompts (at most 64 tokens each; cached)."""
        return self._once("heldout", lambda: self._selfdistill(self.eval_prompts,
                                                               min(int(self.params["sd_max_new_tokens"]), 64)))

    def heads_config(self):
        """Medusa-1's training configuration (:class:`~specrepro.train.medusa1.MedusaTrainConfig`)."""
        from specrepro.train.medusa1 import MedusaTrainConfig

        p = self.params
        return MedusaTrainConfig(n_heads=int(p["medusa_heads"]), share_lm_head=bool(p["share_lm_head"]),
                                 epochs=int(p["medusa_epochs"]), batch_size=int(p["medusa_batch_size"]),
                                 max_steps=p.get("medusa_max_steps"), seed=self.seed)

    def distill_config(self):
        """The distilled draft's configuration (:class:`~specrepro.train.distill.DistillConfig`)."""
        from specrepro.train.distill import DistillConfig

        p = self.params
        return DistillConfig(epochs=int(p["distill_epochs"]), batch_size=4, max_steps=p.get("distill_max_steps"),
                             seed=self.seed)

    @property
    def trained_heads(self):
        """``(heads, losses, cached)`` of :func:`~specrepro.train.medusa1.get_or_train_heads`."""
        from specrepro.train.medusa1 import get_or_train_heads

        return self._once("heads", lambda: get_or_train_heads(self.model, self.train_data, self.heads_config(),
                                                              progress=self.progress))

    @property
    def heads(self):
        return self.trained_heads[0]

    @property
    def trained_draft(self):
        """``(draft, losses, cached)`` of :func:`~specrepro.train.distill.get_or_train_draft`."""
        from specrepro.train.distill import get_or_train_draft

        return self._once("draft", lambda: get_or_train_draft(self.model, self.train_data, self.distill_config(),
                                                              progress=self.progress))

    @property
    def draft(self):
        return self.trained_draft[0]

    def stdlib_heads(self, model, tokenizer) -> dict:
        """:func:`~specrepro.train.stdlib.get_or_train_stdlib_heads` for ``model`` under the profile's sizes."""
        from specrepro.train.stdlib import get_or_train_stdlib_heads

        p = self.params
        return get_or_train_stdlib_heads(model, tokenizer, n_heads=int(p["medusa_heads"]),
                                         head_vocab=p.get("large_head_vocab"), n_tokens=int(p["large_distill_tokens"]),
                                         epochs=int(p["large_epochs"]), seed=self.seed, progress=self.progress)

    @property
    def big(self):
        """``(model, tokenizer)`` of ``large_target`` (the Medusa target itself when they are the same)."""
        p = self.params

        def make():
            if p["large_target"] == p["medusa_target"]:
                return self.model, self.tokenizer
            return self._load(p["large_target"])

        return self._once("big", make)

    @property
    def big_run(self) -> dict:
        """The larger target's stdlib-trained heads (:meth:`stdlib_heads`)."""
        return self._once("big_run", lambda: self.stdlib_heads(*self.big))

    @property
    def m1(self) -> dict:
        """The Medusa target's stdlib-trained Medusa-1 heads, Medusa-2's starting point (:meth:`stdlib_heads`)."""
        p = self.params
        if p["large_target"] == p["medusa_target"]:
            return self.big_run
        return self._once("m1", lambda: self.stdlib_heads(self.model, self.tokenizer))

    @property
    def m2_data(self) -> dict:
        """Medusa-2's stdlib chunks (:func:`~specrepro.train.medusa2.medusa2_sequences`): ``train`` and ``eval``."""
        from specrepro.train.medusa2 import medusa2_sequences

        p = self.params
        return self._once("m2_data", lambda: medusa2_sequences(self.tokenizer, int(p["m2_train_seqs"]),
                                                               int(p["m2_eval_seqs"]),
                                                               chunk_tokens=int(p["m2_chunk_tokens"]),
                                                               seed=self.seed + 1))

    @property
    def m2(self) -> dict:
        """The Medusa-2 backbone and heads (:func:`~specrepro.train.medusa2.get_or_train_medusa2`)."""
        from specrepro.train.medusa2 import Medusa2Config, get_or_train_medusa2

        return self._once("m2", lambda: get_or_train_medusa2(
            self.model, self.m1["heads"], self.m2_data["train"],
            Medusa2Config(epochs=int(self.params["m2_epochs"]), seed=self.seed)))


# ----------------------------------------------------------------------------------------------------------------
# Training (counted, not timed)
# ----------------------------------------------------------------------------------------------------------------

def training_losses(ctx: MedusaContext) -> pd.DataFrame:
    """The Medusa-1 heads' training losses, one row per optimizer step: ``step``, ``loss_head<k>`` (cross-entropy,
    nats) for k = 1..K and the weighted total the optimizer minimised. Trains the heads when they are not cached."""
    return ctx.trained_heads[1].reset_index(drop=True)


def head_accuracy(ctx: MedusaContext) -> pd.DataFrame:
    """Each head's top-1..5 accuracy on the held-out generations (:func:`~specrepro.train.medusa1.head_topk_accuracy`;
    columns head, positions, top1..top5)."""
    from specrepro.train.medusa1 import head_topk_accuracy

    return head_topk_accuracy(ctx.heads, ctx.heldout, topk=5)


def draft_kl_table(ctx: MedusaContext) -> pd.DataFrame:
    """The distilled draft (layers of the target, forward KL on the same generations), one row: ``layers``,
    ``steps`` (optimizer steps), ``heldout_positions``, ``kl_init`` and ``kl_after`` (held-out KL(target ‖ draft),
    nats per position, at initialisation from the target's layers and after distillation)."""
    from specrepro.train.distill import draft_kl, init_draft_from_target

    cfg = ctx.distill_config()
    draft, losses, _ = ctx.trained_draft
    kl_init, _ = draft_kl(ctx.model, init_draft_from_target(ctx.model, cfg.layers), ctx.heldout)
    kl_after, _ = draft_kl(ctx.model, draft, ctx.heldout)
    return pd.DataFrame([{"layers": " ".join(str(x) for x in cfg.layers), "steps": len(losses),
                          "heldout_positions": int(ctx.heldout.n_tokens), "kl_init": float(kl_init),
                          "kl_after": float(kl_after)}])


# ----------------------------------------------------------------------------------------------------------------
# Timed runs (the one harness)
# ----------------------------------------------------------------------------------------------------------------

def _runner(ctx: MedusaContext, model, kind, proposer=None, **kw):
    """:func:`~specrepro.lab.medusa.make_runner` with the Medusa target's stop ids and ``medusa_tokens`` new tokens."""
    return make_runner(model, kind, proposer, eos_token_id=ctx.eos, max_new_tokens=int(ctx.params["medusa_tokens"]),
                       **kw)


def greedy_methods(ctx: MedusaContext, acc_choices) -> dict:
    """Medusa Table 1's methods (greedy): AR, Medusa with the default tree (the paper's accuracies) and with
    ``acc_choices`` (from ours), the distilled draft as a chain (γ = 4) and a tree ⟨2, 2, 1, 1⟩, prompt lookup."""
    from specrepro.core.medusa import DEFAULT_CHOICES
    from specrepro.core.trees import DraftTreeProposer
    from specrepro.drafters.lookup import PromptLookupDrafter
    from specrepro.drafters.model import DraftModelDrafter

    m, V = ctx.model, ctx.model.config.vocab_size
    return {
        "AR": _runner(ctx, m, "ar"),
        "Medusa (default tree)": _runner(ctx, m, "medusa", MedusaProposer(ctx.heads, DEFAULT_CHOICES)),
        "Medusa (accuracy tree)": _runner(ctx, m, "medusa", MedusaProposer(ctx.heads, acc_choices)),
        "distilled draft, chain (γ=4)": _runner(ctx, m, "chain", DraftModelDrafter(ctx.draft, V), gamma=4),
        "distilled draft, tree ⟨2,2,1,1⟩": _runner(ctx, m, "tree",
                                                   DraftTreeProposer(ctx.draft, [2, 2, 1, 1], "topk", V)),
        "prompt lookup (γ=4)": _runner(ctx, m, "chain", PromptLookupDrafter(3, 1), gamma=4),
    }


def tree_size_methods(ctx: MedusaContext, trees: dict) -> dict:
    """AR and Medusa with each tree of ``trees`` (size -> choices, e.g. the accuracy-driven sparse tree of each size,
    :func:`accuracy_tree`), greedy."""
    out = {"AR": _runner(ctx, ctx.model, "ar")}
    for n, choices in trees.items():
        out[f"Medusa {int(n)} nodes"] = _runner(ctx, ctx.model, "medusa", MedusaProposer(ctx.heads, choices))
    return out


def sampling_methods(ctx: MedusaContext, acc_choices) -> dict:
    """The stochastic comparison: AR, Medusa with typical acceptance (not distribution-preserving), exact stochastic
    Medusa (children i.i.d. or without replacement from the heads' softmax, verified by multi-step speculative
    sampling) and the distilled draft's chain (γ = 4)."""
    from specrepro.drafters.model import DraftModelDrafter

    m, h = ctx.model, ctx.heads
    return {
        "AR": _runner(ctx, m, "ar"),
        "Medusa typical": _runner(ctx, m, "medusa", MedusaProposer(h, acc_choices), acceptance="typical"),
        "Medusa exact (iid, MSS)": _runner(ctx, m, "medusa", MedusaProposer(h, acc_choices, mode="iid"),
                                           acceptance="mss"),
        "Medusa exact (w/o repl., MSS)": _runner(ctx, m, "medusa",
                                                 MedusaProposer(h, acc_choices, mode="without_replacement"),
                                                 acceptance="mss"),
        "distilled draft, chain (γ=4)": _runner(ctx, m, "chain", DraftModelDrafter(ctx.draft, m.config.vocab_size),
                                                gamma=4),
    }


def timed_runs(ctx: MedusaContext, methods: dict, prompts, *, sampling: SamplingConfig = GREEDY,
               baseline: str | None = "AR", checkpoint=None, checkpoint_key=None) -> pd.DataFrame:
    """``methods`` timed side by side on ``prompts``, ``medusa_repeats`` passes interleaved within each prompt
    (:func:`specrepro.lab.medusa.compare_methods`), one row per (pass, prompt, method) with the decoded ``text``;
    ``checkpoint``/``checkpoint_key`` as :func:`specrepro.measure.harness.run_interleaved`'s."""
    return compare_methods(ctx.tokenizer, methods, prompts, sampling=sampling, seed=ctx.seed, baseline=baseline,
                           repeats=int(ctx.params["medusa_repeats"]), progress=ctx.progress, checkpoint=checkpoint,
                           checkpoint_key=checkpoint_key)


# ----------------------------------------------------------------------------------------------------------------
# The larger target
# ----------------------------------------------------------------------------------------------------------------

def large_head_accuracy(ctx: MedusaContext) -> pd.DataFrame:
    """The larger target's stdlib-trained heads: held-out top-1..5 accuracy per head (against the backbone's own most
    likely token), with ``target``, ``n_vocab`` (V' of the heads), ``n_heads``, ``vocab_size``,
    ``train_positions``, ``eval_positions`` and ``train_s`` (training wall time, s, on the machine that trained
    them)."""
    run = ctx.big_run
    h = run["heads"]
    return run["accuracy"].assign(target=ctx.params["large_target"], n_vocab=h.n_vocab, n_heads=h.n_heads,
                                  vocab_size=h.vocab_size, train_positions=int(run["n_train_positions"]),
                                  eval_positions=int(run["n_eval_positions"]), train_s=float(run["train_s"]))


def large_ablation_trees(acc: pd.DataFrame, n_heads: int, dense_topk, sparse_sizes) -> dict:
    """The ablation's trees (Medusa §3.3.1, Figure 5): the heads as a chain, each dense tree of ``dense_topk`` beside
    a sparse tree of as many nodes (from ``acc``), and sparse trees of ``sparse_sizes`` nodes; name -> choices."""
    from specrepro.lab.medusa_ablation import chain_choices, dense_choices

    trees = {f"heads as a chain ({int(n_heads)} nodes)": chain_choices(int(n_heads))}
    for topk in dense_topk:
        dense = dense_choices(topk)
        trees[f"dense tree, top-{'x'.join(map(str, topk))} ({len(dense)} nodes)"] = dense
        trees[f"sparse tree ({len(dense)} nodes)"] = accuracy_tree(acc, len(dense))
    for n in sparse_sizes:
        trees[f"sparse tree ({int(n)} nodes)"] = accuracy_tree(acc, int(n))
    return trees


def large_tree_ablation(ctx: MedusaContext, trees: dict, acc: pd.DataFrame) -> pd.DataFrame:
    """Greedy tokens per step of the larger target's heads with each tree of ``trees``
    (:func:`specrepro.lab.medusa_ablation.tree_ablation`, ``large_ablation_prompts`` prompts ×
    ``large_ablation_tokens`` tokens), beside the prediction from ``acc`` and the speedup predicted from this
    machine's forward cost t(n) of the target (:func:`specrepro.measure.cost.measure_cost_curve`) and the heads' own
    time per step; adds ``target``, ``step_ms`` (t(nodes + 1) + heads, ms), ``t1_ms`` and ``head_ms``."""
    from specrepro.data import load_workload
    from specrepro.lab.medusa_ablation import tree_ablation
    from specrepro.measure.cost import measure_call_ms, measure_cost_curve

    p = ctx.params
    big, tok = ctx.big
    heads = ctx.big_run["heads"]
    curve = measure_cost_curve(big, ns=sorted({1} | {len(c) + 1 for c in trees.values()}),
                               generator=torch.Generator().manual_seed(ctx.seed))
    probe = torch.randn(big.config.hidden_size, generator=torch.Generator().manual_seed(ctx.seed)).to(big.device,
                                                                                                     big.dtype)
    head_ms = measure_call_ms(lambda: heads(probe), repeats=5, warmup=1, device=p["device"])
    prompts = load_workload(p["workload"], n=int(p["large_ablation_prompts"]))
    _, abl = tree_ablation(big, tok, heads, prompts, trees, max_new_tokens=int(p["large_ablation_tokens"]),
                           accuracies=accuracies(acc), cost_ms=curve, head_ms=head_ms)
    return abl.assign(target=p["large_target"], step_ms=[curve(n + 1) + head_ms for n in abl["nodes"]],
                      t1_ms=curve(1), head_ms=head_ms)


# ----------------------------------------------------------------------------------------------------------------
# Medusa-2
# ----------------------------------------------------------------------------------------------------------------

def medusa2_quality(ctx: MedusaContext) -> pd.DataFrame:
    """Medusa-2's quality cost, one row: the fine-tuned backbone's held-out NLL against the original's, paired by
    sequence with its 95% interval (:func:`~specrepro.train.medusa2.quality_cost`), with ``target``,
    ``train_sequences`` and ``train_s`` (training wall time, s). Trains Medusa-1 and Medusa-2 when not cached."""
    from specrepro.train.medusa2 import quality_cost

    _, q = quality_cost(ctx.model, ctx.m2["tuned"], ctx.m2_data["eval"])
    return pd.DataFrame([{**q, "target": ctx.params["medusa_target"], "train_sequences": len(ctx.m2_data["train"]),
                          "train_s": ctx.m2["train_s"]}])


def medusa2_tree(ctx: MedusaContext) -> list[list[int]]:
    """The sparse tree of ``tree_nodes`` nodes from the stdlib Medusa-1 heads' held-out accuracy, which Medusa-1 and
    Medusa-2 both decode with."""
    return accuracy_tree(ctx.m1["accuracy"], int(ctx.params["tree_nodes"]))


def medusa2_methods(ctx: MedusaContext) -> dict:
    """AR and Medusa-1 on the original backbone, AR and Medusa-2 on the fine-tuned one, one tree
    (:func:`medusa2_tree`)."""
    tree, m2 = medusa2_tree(ctx), ctx.m2
    return {
        "AR": _runner(ctx, ctx.model, "ar"),
        "Medusa-1": _runner(ctx, ctx.model, "medusa", MedusaProposer(ctx.m1["heads"], tree)),
        "AR (Medusa-2 backbone)": _runner(ctx, m2["tuned"], "ar"),
        "Medusa-2": _runner(ctx, m2["tuned"], "medusa", MedusaProposer(m2["heads"], tree)),
    }
