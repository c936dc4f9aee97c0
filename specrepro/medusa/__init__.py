"""Medusa heads: modules, self-distillation data, Medusa-1 training, static sparse trees, proposers and decoding.

What this package is (Cai et al. 2024, "Medusa", arXiv 2401.10774):

* :class:`MedusaHeads` — K extra decoding heads on the target's last hidden state h_t. Head k (k = 1..K) is a
  residual block followed by a vocabulary projection, ``logits_k = W2_k (h + SiLU(W1_k h + b1_k))`` (Medusa Eq. 1),
  and predicts token t+k+1 (the target's own LM head on h_t gives token t+1). W1 is zero-initialised and W2 copied
  from the target's LM head, so at initialisation every head outputs the LM head's logits. Option
  ``share_lm_head=True`` uses the target's (frozen) LM head as every head's W2: far fewer trainable parameters
  (K * H^2 instead of K * (H^2 + H * V)) and no weight gradient of the vocabulary projections, hence cheaper to train;
  Medusa itself trains one projection per head. Saved as safetensors plus a JSON config naming the base model and a
  fingerprint of its weights and config; loading heads for another base model raises :class:`HeadMismatchError`.
* Self-distillation data (Medusa Sec. 3.3.1): the target's own generations for prompts from the project's offline
  workloads, produced by a batched KV-cached loop that records the last-layer hidden state h_t of every generated
  position on the way (:func:`self_distillation_data`), cached as safetensors keyed by its inputs.
* Medusa-1 training (:func:`train_medusa_heads`): backbone frozen, loss sum_k λ_k CE_k with λ_k = 0.8^k
  (Medusa Sec. 3.2.1), on cached hidden states; :func:`get_or_train_heads` caches trained heads under
  ``specrepro.models.cache_dir()`` keyed by the base model, the data and the hyper-parameters, so ``make reproduce``
  does not retrain.
* Heads for any target, trained offline on a CPU (:mod:`specrepro.medusa.stdlib`): the target reads the Python
  standard library's sources (teacher forcing, ~20x faster than generating), heads fitted to its own top-k
  distributions by KL, optionally over a restricted vocabulary (``vocab_ids``: frequent tokens only, q = 0 elsewhere,
  still exact) through the shared LM head in one batched product (:func:`get_or_train_stdlib_heads`);
  the chain / dense / sparse tree ablation (:func:`tree_ablation`).
* Medusa-2 (:mod:`specrepro.medusa.medusa2`): heads and LoRA adapters on the backbone trained jointly (peft), the
  backbone distilled towards the original model; its quality cost (:func:`quality_cost`). Medusa-2 changes the
  target: decoding is exact with respect to the fine-tuned backbone only.
* Trees: per-head top-i accuracies (:func:`head_topk_accuracy`), Medusa's accuracy-driven sparse tree built greedily
  from them (:func:`sparse_tree_from_accuracies`, Medusa Sec. 3.3.3) and a default tree built the same way from the
  paper's Vicuna-7B accuracies (the recipe behind Medusa's ``mc_sim_7b_63``), sized for a small CPU model.
* :class:`MedusaProposer` — a :class:`specrepro.trees.TreeProposer` (``needs_hidden = True``): head k's top-s
  candidates at tree depth k (point masses), or children *sampled* from each head's softmax for exact stochastic
  verification (multi-step speculative sampling, which Medusa itself does not offer).
* Experiment helpers behind notebook 06: :func:`make_runner`, :func:`compare_methods` (methods interleaved prompt by
  prompt), :func:`acceleration_table` (Medusa Table 1 columns). HumanEval pass@1 is :mod:`specrepro.humaneval`'s.
* Acceptance: greedy (exact), typical acceptance (:func:`typical_acceptance_verify`, Medusa Sec. 3.3.1; NOT
  distribution-preserving) and exact MSS through :func:`specrepro.trees.verify_tree`; :func:`medusa_generate` is the
  decoding loop that takes any of them (tree attention and cache bookkeeping from :mod:`specrepro.tree_attention`).

What it is not: a tree implementation (:mod:`specrepro.trees`) or a
distilled draft model (:mod:`specrepro.distill`).
"""

from __future__ import annotations

from .ablation import chain_choices, dense_choices, tree_ablation, tree_kind
from .decode import (ACCEPTANCE_METHODS, DEFAULT_CHOICES, PAPER_HEAD_ACCURACY, MedusaProposer,
                     expected_acceptance_length, medusa_generate, medusa_step_samples, sparse_tree_from_accuracies,
                     typical_acceptance_verify)
from .experiments import PAPER_TABLE1, acceleration_table, compare_methods, make_runner
from .heads import FORMAT_VERSION, HeadMismatchError, MedusaHeads, ResBlock, base_fingerprint, random_heads
from .medusa2 import Medusa2Config, get_or_train_medusa2, load_medusa2, medusa2_sequences, quality_cost, train_medusa2
from .stdlib import get_or_train_stdlib_heads, stdlib_distillation_data, stdlib_head_vocab
from .train import (MedusaTrainConfig, SelfDistillationData, get_or_train_heads, head_topk_accuracy,
                    self_distillation_data, train_medusa_heads)

__all__ = [
    "PAPER_HEAD_ACCURACY", "PAPER_TABLE1", "HeadMismatchError", "base_fingerprint", "ResBlock", "MedusaHeads",
    "SelfDistillationData", "self_distillation_data", "MedusaTrainConfig", "train_medusa_heads",
    "get_or_train_heads", "head_topk_accuracy", "sparse_tree_from_accuracies", "DEFAULT_CHOICES",
    "expected_acceptance_length", "MedusaProposer", "typical_acceptance_verify", "ACCEPTANCE_METHODS",
    "medusa_generate", "make_runner", "compare_methods", "acceleration_table", "random_heads",
    "medusa_step_samples", "FORMAT_VERSION", "stdlib_distillation_data", "stdlib_head_vocab",
    "get_or_train_stdlib_heads", "chain_choices", "dense_choices", "tree_ablation", "tree_kind", "Medusa2Config",
    "train_medusa2", "get_or_train_medusa2", "load_medusa2", "quality_cost", "medusa2_sequences",
]
