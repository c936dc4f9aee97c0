"""Measurement on real models: the one timing harness (harness), forward-pass cost curves (cost) and the acceptance
rate α teacher-forced along target samples (alpha)."""
