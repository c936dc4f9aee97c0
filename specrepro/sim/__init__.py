"""Proofs by simulation: toy models (toy), exact enumeration of chains and trees (exact, trees, medusa), the negative
controls and replayed published bugs in one registry (controls), the battery of goodness-of-fit cases (battery), and
the same checks on real models (real)."""
