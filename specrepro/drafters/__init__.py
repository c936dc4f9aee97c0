"""Drafters: the proposal sources of chain speculative decoding.

* :mod:`.base` — the protocol (``propose``, ``reset``, and ``feedback``: how many drafted tokens verification kept).
* :mod:`.model` — a draft model (any causal LM, its int8 copy, a vocabulary-pruned head).
* :mod:`.lookup` — n-gram tables, prompt lookup, and the hybrid of lookup and a draft model.
* :mod:`.adaptive` — draft lengths chosen per step (cost model) or token by token.
* :mod:`.compress` — cheaper draft models: int8 weights and the FR-Spec pruned vocabulary head.
"""
