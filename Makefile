# The two commands a newcomer runs: `make run` (set up + the default experiment) and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml setup.py | cksum | cut -d' ' -f1)

.PHONY: setup run test test-fast lint bench docs docs-site clean

$(STAMP): pyproject.toml setup.py  # setup.py maps actors/ and configs/ into the (editable) install
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU wheel of torch first: a looser requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test,tensorboard,serve,docs,wandb,mlflow,optuna,mujoco,box2d,gguf]"
	rm -f $(VENV)/.installed-* && touch $@

setup: $(STAMP)

run: setup  ## the default experiment (GRPO on a tiny model) on a local Ray instance; ARGS="a.b=c ..." to override
	$(BIN)/python -m toolbox.run $(ARGS)

lint: setup
	$(BIN)/ruff check toolbox actors tests
	$(BIN)/mypy toolbox actors  # actors/ is checked as a top-level package (relative imports)

test: lint  ## the whole suite: unit, integration (local Ray), e2e (ray job submit), slow; 2 workers: Ray tests in one
	$(BIN)/python -m pytest -q -ra --durations=25 -n 2

test-fast: setup  ## unit tests only (no Ray), seconds
	$(BIN)/python -m pytest -q tests/unit

bench: setup
	$(BIN)/python -m toolbox.bench weight_sync
	$(BIN)/python -m toolbox.bench grpo
	$(BIN)/python -m toolbox.bench sft
	$(BIN)/python -m toolbox.bench dpo
	$(BIN)/python -m toolbox.bench ppo_cartpole

docs: setup  ## regenerate the configuration reference and component catalog
	$(BIN)/python -m toolbox.commands.cli docs

docs-site: setup  ## build the documentation site into site/ (MkDocs, strict: a broken link or a page left out fails)
	$(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) runs site .pytest_cache .mypy_cache .ruff_cache
