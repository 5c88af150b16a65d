"""The training wing: the Accelerate training loop (GAtt and SFT), its config and building blocks, representation
distillation, and GRPO after GAtt."""
