# Every target depends on the install stamp, so `make train` or `make test` works as the first command.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# DeepSpeed compiles its ops on first use (60-70 s each); build the CPU ones at install instead.
DS_BUILD := DS_ACCELERATOR=cpu DS_BUILD_OPS=0 DS_BUILD_CPU_ADAM=1 DS_BUILD_FUSED_ADAM=1 DS_BUILD_SHM_COMM=1
SWEEP ?=

.PHONY: install train test sweep report bench estimate-t4 sweep-t4 wandb-sync clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q torch==2.13.0
	$(DS_BUILD) $(PY) -m pip install -q --no-build-isolation deepspeed==0.19.8
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

train: $(STAMP)
	$(PY) train.py $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf outputs multirun/*/ .pytest_cache
