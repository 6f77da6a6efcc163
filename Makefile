# `make demo` and `make test` create or reuse .venv and install what they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# CPU machines: the CPU build of torch from local disk. A GPU machine with its own torch: TORCH=
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: venv demo test clean

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

test: venv
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) build *.egg-info
