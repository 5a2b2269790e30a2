# The two commands a new user needs: `make run` and `make test`. Both set up .venv first if needed.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
# Wheels that pip is told to look for on this machine (PIP_FIND_LINKS) are uv's to find too.
UV_FIND_LINKS := $(foreach dir,$(PIP_FIND_LINKS),--find-links $(dir))
# Override for a CUDA build of torch, e.g. make install TORCH="torch==2.13.0 --index-url ..."
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install run test test-fast lint format bench results results-atari broker clean \
	cuda-build-check

# Always re-checks every step (each is quick when already done), so it is safe to run again.
# The packages go in with uv (from the package index, into the venv): 5-10x faster than pip at
# unpacking torch and the test dependencies. pip stays in the venv for the moolib build.
# --compile-bytecode: where PYTHONDONTWRITEBYTECODE is set (as on the machines we measure on)
# Python would otherwise compile torch's and sympy's sources again in every process: importing
# them took 8.6 s instead of 2.7-3.9, in each peer, broker and test process.
install:
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@test -x $(UV) || $(PY) -m pip install -q uv
# numpy first: torch warns at import without it, and the moolib build imports torch.
	$(UV) pip install -q --python $(PY) $(UV_FIND_LINKS) --compile-bytecode numpy $(TORCH)
	$(PY) scripts/build_moolib.py
	$(UV) pip install -q --python $(PY) $(UV_FIND_LINKS) --compile-bytecode -e '.[test]'
	$(PY) scripts/build_ops.py
	@touch $(STAMP)

$(STAMP): setup.py scripts/build_moolib.py scripts/build_ops.py \
		$(wildcard examples/vtrace/csrc/*.cpp) Makefile
	$(MAKE) install

run: $(STAMP)
	$(PY) examples/a2c.py

test: $(STAMP)
	$(PY) -m pytest tests --durations=15

# The unit tests and the quick end-to-end checks: no agent is trained for real.
test-fast: $(STAMP)
	$(PY) -m pytest tests -m "not slow"

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

bench: $(STAMP)
	$(UV) pip install -q --python $(PY) $(UV_FIND_LINKS) --compile-bytecode -e '.[test,bench]'
	$(PY) -m bench $(BENCH_ARGS)

# The MinAtar table and curves in docs/ (5 games x 5 seeds x 5M steps: 25 runs of 13-25 minutes,
# two at a time, on 2 cores); finished runs in /tmp/bench-minatar are reused. Not part of CI.
results: $(STAMP)
	$(PY) -m bench.minatar $(RESULTS_ARGS)

# The Atari table and curves in docs/ (Pong x 2 seeds, Breakout x 1, 10M frames each, one run at
# a time: about 2.5 hours on 2 idle cores); finished runs in /tmp/bench-atari are reused.
results-atari: $(STAMP)
	$(PY) -m bench.atari $(RESULTS_ARGS)

# Does moolib build with CUDA against torch 2.13.0 and 2.14.1 (CUDA builds of torch and NVIDIA's
# compiler from the package index, in throwaway venvs under /tmp/moolib-cuda-check)? No GPU
# needed; about 3 GB of downloads, 6-7 GB of disk and 30 minutes per version on 2 cores. Not
# part of CI. E.g. make cuda-build-check CUDA_CHECK_ARGS="--torch 2.14.1 --keep"
cuda-build-check:
	$(PYTHON) scripts/cuda_build_check.py $(CUDA_CHECK_ARGS)

broker: $(STAMP)
	$(PY) -m moolib.broker

clean:
	rm -rf $(VENV) build *.egg-info
