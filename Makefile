# `make demo` and `make test` create or reuse .venv and install what they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# CPU machines: the CPU build of torch from local disk. A GPU machine with its own torch: TORCH=
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: venv browser demo test clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(if $(TORCH),$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH)")
	$(BIN)/python -m pip install -q -e ".[test]"
	@! $(BIN)/python -c "import fla" 2>/dev/null || (echo "fla-core is installed in $(VENV): transformers would route GDN to it and fail on CPU; pip uninstall fla-core" && false)
	touch $(STAMP)

demo: venv
	$(BIN)/hybridspec demo

# The report's browser test needs a headless Chromium: Debian's chromium-headless-shell, installed
# where apt-get can (root); elsewhere the test says how to get it and skips.
browser:
	@command -v chromium-headless-shell >/dev/null || command -v chromium >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    { DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium-headless-shell >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium-headless-shell >/dev/null 2>&1; }; } ; } || \
	  echo "make browser: could not install chromium-headless-shell; the report's browser test will skip"

# One pytest worker per core; a test file stays on one worker (its module fixtures are built once).
# The 15 slowest tests are listed at the end, so that a CI log shows where its minutes went.
test: venv browser
	$(BIN)/python -m pytest -n auto --dist loadfile --durations=15

clean:
	rm -rf $(VENV) build *.egg-info
