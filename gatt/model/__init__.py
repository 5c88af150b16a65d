"""The model wing: masked multi-head attention, the Llama-compatible causal LM built on it, its tokenizer, and
how it generates (the KV caches, the static decoding step, the numeric modes, split-softmax)."""
