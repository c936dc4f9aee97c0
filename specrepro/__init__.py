"""specrepro: a reference replication of speculative decoding.

The package is built in layers; each imports only from the layers below it (``pyproject.toml``'s import-linter
contract, checked by ``tests/test_layers.py``):

* :mod:`specrepro.record` — the committed record: result files and who may write them, claims, rules, scorecard,
  README blocks, figures, executed-notebook cleaning; the ``scorecard`` and ``greedy-equality`` commands.
* :mod:`specrepro.lab` — the experiments behind each paper's notebooks; the papers' numbers (``data/papers``).
* :mod:`specrepro.bench` — the benchmark: methods registry, runs, targets; the ``bench`` command.
* :mod:`specrepro.measure` (timing harness, cost curves, α), :mod:`specrepro.sim` (toy models, exact enumeration,
  negative controls and published bugs, the battery), :mod:`specrepro.train` (Medusa-1/-2 heads, distilled draft).
* :mod:`specrepro.drafters` — proposal sources: draft models (fp32, int8, pruned head), lookup, n-gram, hybrid,
  adaptive lengths.
* :mod:`specrepro.core` — the algorithms as the papers state them: sampling and verification rules, the chain and
  tree decoding loops, KV-cache operations, tree attention, Medusa heads and decoding.
* :mod:`specrepro.theory` (closed forms, cost model), :mod:`specrepro.stats` (intervals, goodness of fit),
  :mod:`specrepro.data` (workloads), :mod:`specrepro.models` (model zoo), :mod:`specrepro.humaneval`.
* :mod:`specrepro.files` — below them all: atomic writes (files and whole directories), provenance facts.

Submodules are imported on use (``from specrepro.core.decoding import generate``) so that ``import specrepro`` is
cheap.
"""

__version__ = "0.1.0"
