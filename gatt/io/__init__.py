"""The outside world: model folders and the one chat-model loader (the embedded model, SmolLM2 from PyPI, any
saved folder), configs that are the command line, files written whole, and the machine a timing came from."""
