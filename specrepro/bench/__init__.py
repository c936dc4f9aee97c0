"""The benchmark: decoding methods side by side on one workload, and the ``python -m specrepro bench`` command.

What this package is (``registry`` - methods, context, validation; ``options`` - option parsers; ``methods`` - the
built-in methods; ``run`` - :func:`run_bench`; ``cli`` - the command line): :func:`run_bench` times decoding *methods* (our KV-cached AR baseline, our chain speculative
decoding with a draft model / prompt lookup / a bigram draft, our token-tree speculative decoding (SpecInfer
expansion trees from the draft model, merge-based trees of draft model + prompt lookup + bigram), Medusa heads, and
Hugging Face transformers' own ``generate``: AR, assisted generation, prompt lookup) on the same prompts, interleaved
prompt by prompt so that drift of a shared machine hits every method alike, and reports per method: median
tokens/s, speedup over our AR and over HF assisted generation (paired per prompt), α, mean tokens per step, draft
tokens (tree nodes) verified per step, per-position (per-depth) acceptance, whether the method is exact
(distribution-preserving) and, under greedy decoding, whether the outputs equal our AR outputs token for token. It
prints one pandas table and can write JSON.

A run too long for one sitting is timed in parts (``--part I/K``: consecutive slices of its prompts, each prompt
with the seed and method order it has in the whole run) and merged (``--merge PART.json ... --json OUT``,
:func:`merge_part_files`): the merged file holds the runs and summary the whole run would have, and its sidecar each
part's sitting.

Tree and Medusa methods (:data:`TREE_MODES`, :func:`parse_tree_spec`):

* ``sd-tree`` — SpecInfer (Miao et al. 2023) expansion tree ⟨k1,...,km⟩ from the draft model
  (:class:`~specrepro.core.trees.DraftTreeProposer`, one target forward per step with tree attention). The tree is
  ``sd-tree@2x2x1x1`` per entry, else ``--tree 2x2x1x1`` for every ``sd-tree`` entry, else ⟨2,1,...,1⟩ of depth γ
  (two chains of length γ). Children are the draft's top-k tokens under greedy decoding (greedy verification) and
  sampled i.i.d. from the draft (``--opt tree_mode=iid``, default; ``without_replacement`` = Sequoia;
  ``topk`` = point masses) with multi-step speculative sampling (MSS) under sampling: exact in both cases.
* ``sd-tree-merge`` — SpecInfer's merge-based tree of three chains of γ tokens: draft model, prompt lookup, bigram
  (:class:`~specrepro.core.trees.MergedTreeProposer`); greedy verification or MSS: exact.
* ``medusa`` — Medusa-1 heads (Cai et al. 2024) on the target, static sparse tree (``medusa@N``: N nodes by Medusa's
  accuracy-driven recipe on the paper's head accuracies; default :data:`specrepro.core.medusa.DEFAULT_CHOICES`, 16 nodes).
  Needs trained heads: ``--medusa-heads DIR`` (written by ``MedusaHeads.save`` / ``get_or_train_heads``) or
  ``--medusa-heads auto`` (the newest heads cached for this target by ``get_or_train_heads``, e.g. by notebook 06).
  Greedy acceptance under greedy decoding; under sampling exact MSS with children sampled from the heads
  (``--opt tree_mode``, default i.i.d.).
* ``llama-ar``, ``llama-sd@G``, ``llama-sd-block@G`` — the target's and the draft's GGUF files as shipped, their
  forwards run by llama.cpp (:mod:`specrepro.bench.llama`), our AR loop or our chain with token or block
  verification; the summary gives their speedups over ``llama-ar`` too (``speedup_vs_llama_ar``).
* ``medusa-typical`` — the same heads with Medusa's typical acceptance: NOT distribution-preserving under sampling
  (``exact`` is False in the table); at temperature 0 it reduces to greedy acceptance.

For tree methods "γ" in the table is the tree depth and the per-position acceptance is per depth:
P(a node at depth i accepted | the accepted path reached depth i - 1 and the tree has depth >= i).

The method registry: a *method* is a name mapped to a :class:`MethodSpec` whose factory builds a *runner* for one
benchmark (``factory(ctx, name, gamma) -> runner``; ``runner(ids, generator) -> GenerationResult | RunOutput``).
Other modules add methods without editing this file::

    from specrepro.bench import register_method

    @register_method("tree-specinfer", needs_draft=True, description="SpecInfer expansion tree <1,1,3,1>")
    def _tree(ctx, name, gamma):
        proposer = ...                                   # built once per benchmark
        return lambda ids, generator: tree_generate(ctx.target, ids, proposer, ...)

A name ending in ``*`` registers a family (``"toy-*"`` serves ``toy-wide``, ``toy-deep``, ...; the factory
receives the full name). The modules in :data:`PLUGIN_MODULES` are imported on first use of the registry, so their
``register_method`` calls take effect; an import failure is
recorded in :data:`PLUGIN_ERRORS` and shown when a method is not found. Any method name may carry ``@γ``
(``sd-draft@3``) to override the benchmark's γ for that entry, so one interleaved run can sweep γ; a method
registered with a ``prepare`` hook parses the text after ``@`` itself (``sd-tree@2x2x1``, ``medusa@32``).

Timing and randomness: :mod:`specrepro.measure.harness`, the repository's one timing loop (interleaved prompt by prompt,
method order rotated, one untimed warm-up call per method with an 8-token budget, one seeding rule, the same clock
for our loops and HF's, speedup = median over prompts of the paired per-prompt ratio with a 95% bootstrap
interval). HF ``generate`` has no generator argument, so for the ``hf-*`` methods an integer seed drawn from the
harness's generator seeds torch's global RNG inside ``torch.random.fork_rng`` (global state is restored).

What it is not: the algorithms (:mod:`specrepro.core.decoding`, :mod:`specrepro.drafters`, :mod:`specrepro.core.trees`), the
speed model (:mod:`specrepro.theory`) or quality evaluation (:mod:`specrepro.humaneval`).
"""

from __future__ import annotations

from specrepro.bench import methods as _builtin_methods  # noqa: F401  (registers the built-in methods)
# after the built-in methods: --list-methods and error messages list the built-in ones first
from specrepro.bench import llama as _llama_methods  # noqa: F401  (registers llama-ar, llama-sd, llama-sd-block)
from specrepro.bench import llamaserver as _llamaserver_methods  # noqa: F401  (registers the llama-server-* methods)
from specrepro.bench.cli import configure_parser, run_command
from specrepro.bench.methods import bigram_corpus, hf_generation_config
from specrepro.bench.options import (
                                      MAX_TREE_NODES,
                                      TREE_MODES,
                                      BenchOptionError,
                                      parse_tree_spec,
)
from specrepro.bench.registry import (
                                      DEFAULT_METHODS,
                                      OPTION_KEYS,
                                      PLUGIN_ERRORS,
                                      PLUGIN_MODULES,
                                      REGISTRY,
                                      BenchContext,
                                      MethodSpec,
                                      known_methods,
                                      register_method,
                                      resolve_method,
                                      validate_options,
)
from specrepro.bench.run import BenchResult, checkpoint_path, merge_part_files, merge_parts, part_bounds, run_bench
from specrepro.measure.harness import RunOutput

__all__ = [
    "BenchOptionError", "BenchContext", "RunOutput", "MethodSpec", "BenchResult", "REGISTRY", "PLUGIN_MODULES",
    "PLUGIN_ERRORS", "DEFAULT_METHODS", "TREE_MODES", "MAX_TREE_NODES", "OPTION_KEYS", "register_method",
    "known_methods", "resolve_method", "validate_options", "parse_tree_spec", "run_bench", "checkpoint_path", "part_bounds", "merge_parts", "merge_part_files",
    "configure_parser", "run_command", "bigram_corpus", "hf_generation_config",
]
