"""Multi-LoRA serving: per-adapter application against a fused batched form."""
