# Every user-facing command. Each target calls the fastverify CLI or one script.
#   make apply-patches [SGLANG_DIR=/path]   patch the SGLang in the active Python (or the folder given)
#   make test                               CPU test environments for every pinned SGLang + the tests
VERSION ?= $(lastword $(shell awk '!/^\#/ && NF {print $$1}' pins.txt))
# The Python of every target: PYTHON=... if given; else python3 when it has SGLang (an activated venv,
# a GPU box); else the environment `make demo`/`make setup` built (.venv-$(VERSION), else any .venv-*);
# else python3 (the patch targets need only the standard library).
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell python3 -c 'import importlib.util as u, sys; sys.exit(u.find_spec("sglang") is None)' \
            2>/dev/null && echo python3)
PYTHON := $(or $(PYTHON),$(wildcard $(CURDIR)/.venv-$(VERSION)/bin/python),\
            $(lastword $(wildcard $(CURDIR)/.venv-*/bin/python)),python3)
endif
FV = PYTHONPATH=$(CURDIR)/python$(if $(PYTHONPATH),:$(PYTHONPATH)) $(PYTHON) -m fastverify
DIRARG = $(if $(SGLANG_DIR),--sglang-dir $(SGLANG_DIR))

.PHONY: apply-patches revert-patches check-patches status-patches test setup demo versions \
        bench-allreduce bench-kernels replay sim advise gpu-bundle gpu-repatch gpu-dryrun serving-bench \
        which-python bench-gate lint

versions:          ## the supported SGLang releases (pins.txt)
	@awk '!/^#/ && NF {print $$1}' pins.txt

apply-patches:     ## apply the series matching the installed SGLang (all or nothing, idempotent)
	$(FV) patches apply $(DIRARG)

revert-patches:    ## restore upstream SGLang byte for byte
	$(FV) patches revert $(DIRARG)

check-patches:     ## dry run: would the series apply (or is it applied) without drift?
	$(FV) patches check $(DIRARG)

status-patches:    ## per patch: applied / not applied / drifted, and RECORD hash check of the rest
	$(FV) patches status $(DIRARG)

setup:             ## CPU environment with the pinned SGLang $(VERSION) in .venv-$(VERSION)
	bash scripts/setup_test_env.sh $(VERSION)

demo: setup        ## fresh machine: install SGLang $(VERSION), patch it, show status and the new flags
	bash scripts/demo.sh $(VERSION)

test:              ## the test command (README): every pinned SGLang, patched, then pytest
	bash scripts/run_tests.sh

lint:              ## ruff check (rules, line length 100: pyproject.toml); .ci/run installs ruff==0.17.6
	@$(PYTHON) -m ruff --version >/dev/null 2>&1 || { echo "make lint: ruff is not installed for $(PYTHON); install it: $(PYTHON) -m pip install ruff==0.17.6 (or: make lint PYTHON=a-python-with-ruff)" >&2; exit 2; }; $(PYTHON) -m ruff check .

bench-allreduce:   ## GPU: all-reduce backends against the compute of a verify pass (BENCH_ARGS=..., 2+ GPUs)
	$(FV) bench allreduce $(BENCH_ARGS)

bench-kernels:     ## GPU: per-kernel benchmarks (median of 3 runs), then the regression gate against the H200 baseline
	$(FV) bench kernels --runs 3 --json benchmark/results/local/kernels.json $(BENCH_ARGS)
	$(FV) bench compare benchmark/results/h200/kernels.json benchmark/results/local/kernels.json

bench-gate:        ## GPU: benchmark + compare 5 times, one verdict each (GATE_ARGS=--rehearse on a CPU)
	$(FV) bench gate benchmark/results/h200/kernels.json --times 5 --out-dir benchmark/results/local/gate $(GATE_ARGS)

replay:            ## CPU: will n-gram speculation pay on a trace? (TRACE=file.jsonl; default: the embedded trace)
	$(FV) replay $(TRACE) $(REPLAY_ARGS)

sim:               ## CPU: the auto controller in simulation against fixed modes
	$(FV) sim $(SIM_ARGS)

advise:            ## CPU: will speculation pay on this box, and how? (ADVISE_ARGS=...)
	$(FV) advise $(ADVISE_ARGS)

which-python:      ## the Python the targets use (PYTHON=... to choose another)
	@echo $(PYTHON)

gpu-bundle:        ## host: build the offline GPU bundle of SGLang 0.5.16 + this series (docs/gpu-staging.md)
	bash scripts/gpu/build_bundle.sh

gpu-repatch:       ## host: re-apply the series and re-pack the small overlay after a change to patches/ or python/
	bash scripts/gpu/build_bundle.sh --repatch

gpu-dryrun:        ## host: rehearse the GPU-machine side against a stand-in server
	bash scripts/gpu/dryrun.sh

serving-bench:     ## any SGLang/OpenAI server: SERVING_ARGS="--base-url http://127.0.0.1:30000 --concurrency 1,8 ..."
	$(PYTHON) benchmark/serving.py run $(SERVING_ARGS)
