"""Training: Medusa-1 heads by self-distillation (medusa1), heads trained on the Python standard library (stdlib),
Medusa-2 with LoRA on the backbone (medusa2), and a distilled draft model (distill)."""
