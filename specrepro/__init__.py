"""specrepro: a reference replication of speculative decoding.

Modules, one concept each:

* :mod:`specrepro.models` — model zoo: named pinned checkpoints and any Hugging Face model; fetch, verify, cache, load.
* :mod:`specrepro.data` — workloads (HumanEval, Python docs, JSONL files, the papers' hub datasets).
* :mod:`specrepro.sampling` — logits processing and the speculative accept/reject rule (``verify_chain``).
* :mod:`specrepro.decoding` — the KV-cached AR and chain speculative decoding loop.
* :mod:`specrepro.drafters` — proposal sources: draft model, unigram/bigram, prompt lookup.
* :mod:`specrepro.kvcache` — cache rollback and path selection on top of transformers' caches.
* :mod:`specrepro.theory` — Leviathan's analysis (α, expected tokens, speedup, optimal γ) and a hardware-aware model.
* :mod:`specrepro.exactness` — exact enumeration and Monte Carlo goodness-of-fit (the exactness battery).
* :mod:`specrepro.experiments` — the loops behind the notebooks' tables.
* :mod:`specrepro.results`, :mod:`specrepro.plots`, :mod:`specrepro.nbclean` — result files with provenance, figure
  style, executed-notebook cleaning.

Submodules are imported on use (``from specrepro.decoding import generate``) so that ``import specrepro`` is cheap.
"""

__version__ = "0.1.0"
