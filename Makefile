# Quick start on a fresh machine: `make demo` and `make test` (both run `make setup` first).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
DEMO_OUT ?= out/demo

.PHONY: setup demo test test-fast lint fmt calibrate bench reproduce serve-demo clean help

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

setup: $(STAMP)  ## create .venv and install everything (idempotent)

# torch goes first, from the local CPU wheel, so that nothing later pulls a CUDA build.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: setup  ## the main job on the embedded simulated node
	$(PY) train.py --config demo --out $(DEMO_OUT) --overwrite

test: setup  ## the full test suite (what CI runs)
	$(PY) -m pytest -q

test-fast: setup  ## tests without the slow ones
	$(PY) -m pytest -q -m 'not slow'

lint: setup  ## ruff (style, docstrings) and mypy (types)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

fmt: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

calibrate: setup  ## the simulator's calibration report
	$(PY) evaluate.py calibrate --out out/calibration --overwrite

bench: setup  ## simulator and controller speed
	$(PY) evaluate.py bench --out out/bench --overwrite

REPRO_OUT ?= out/reproduce
reproduce: setup  ## the papers' experiments in simulation (README "Reproducing the papers"; a few minutes on 2 cores)
	$(PY) evaluate.py maxload --mixes 3 --mix-sizes 2,3,4,5,6 --controllers unmanaged,heracles,parties --out $(REPRO_OUT)/fig7 --overwrite
	$(PY) evaluate.py maxload --apps memcached,xapian,nginx --controllers unmanaged,parties,oracle --out $(REPRO_OUT)/fig8 --overwrite
	$(PY) evaluate.py timeline --scenario fig9-ramp --controllers unmanaged,heracles,parties --out $(REPRO_OUT)/fig9 --overwrite
	$(PY) evaluate.py compare --scenario mix6-const --controllers parties --seeds 3 --out $(REPRO_OUT)/fig10-6apps --overwrite
	$(PY) evaluate.py compare --scenario mix3-const --controllers parties,parties:code,parties:code-stats --seeds 5 --out $(REPRO_OUT)/fig10-3apps --overwrite
	$(PY) evaluate.py compare --scenario coco-fig2 --controllers coco,coco-rr,coco-nopart --seeds 3 --out $(REPRO_OUT)/coco-fig2 --overwrite
	$(PY) evaluate.py affordable --scenario coco-fig2 --controllers coco,coco-rr,coco-nopart,coco-cat,coco-conflict --seeds 3 --out $(REPRO_OUT)/coco-fig2-affordable --overwrite
	$(PY) evaluate.py compare --scenario qprm-sinusoid --controllers unmanaged,prm,prm-nocat,prm:exclusive-cat,qprm-step,qprm-prop,qprm-prop2,qprm-basic --seeds 3 --out $(REPRO_OUT)/qprm --overwrite

serve-demo: setup  ## rehearse serve.py on the simulated node (30 simulated s at 10x speed)
	$(PY) serve.py --config configs/serve/sim.yaml --sim --controller parties --duration-s 30 --speed 10 --out out/serve-demo

clean:
	rm -rf out runs .pytest_cache .ruff_cache
