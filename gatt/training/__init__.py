"""The training wing: the Accelerate training loop (GAtt and SFT), representation distillation, GRPO after GAtt,
and the plumbing of multi-process jobs."""
