# needle course companion. The two set-up commands are `make lab` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
# Tests never write into the tree (no __pycache__ from test runs).
export PYTHONDONTWRITEBYTECODE := 1
# Marker files: the environment is (re)installed when pyproject.toml changes,
# the compiled modules are rebuilt when a C++/CUDA source or CMakeLists.txt changes.
INSTALLED := $(VENV)/.needle-installed
BUILT     := $(VENV)/.needle-built
SOURCES   := CMakeLists.txt $(wildcard src/*.cc src/*.cu src/*.h src/*.cuh)
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9]*.ipynb))
NBVAL     := env -u MPLBACKEND $(PY) -m pytest --nbval --nbval-current-env \
             --nbval-sanitize-with notebooks/sanitize.cfg -p no:cacheprovider --color=no
NBEXEC    := jupyter nbconvert --to notebook --execute --inplace \
             --ExecutePreprocessor.record_timing=False --ExecutePreprocessor.timeout=1200

.PHONY: lab test test-unit test-notebooks build notebooks notebook figures bench profile check progress lecture-report data clean help

help:
	@echo "make lab        set up (.venv, install, compile) and open JupyterLab on notebooks/"
	@echo "make test       set up if needed, then run every test and every notebook (nbval)"
	@echo "make notebooks  regenerate each .ipynb from its .py and re-execute it"
	@echo "make figures    re-execute the notebooks, saving figures/*.png"
	@echo "make bench      benchmarks: needle beside numpy (and PyTorch when installed)"
	@echo "make profile    one training step per model split into kernel time and framework overhead"
	@echo "make check HW=path/to/hwN   check your own homework folder (course layout), question by question ([HWNUM=hwN] [ARGS=...])"
	@echo "make progress HW=path/to/hwN   passed/total per homework, changes, the next question"
	@echo "make lecture-report NEEDLE_IMPL=path/to/hwN/python   every notebook on your needle: a report card"
	@echo "make data       download MNIST, CIFAR-10 and Penn Treebank into data/"
	@echo "make typecheck  mypy on needle/ (strict on autograd and the NDArray layer)"
	@echo "make book       the lectures as a website in build/book/ (from the committed notebooks)"
	@echo "make clean      remove build products (keeps .venv and data/)"

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(INSTALLED): $(PY) pyproject.toml environment.yml
	$(PY) -m pip install --quiet "scikit-build-core>=0.10" "pybind11>=2.12" cmake ninja numpy
	flock .build.lock $(PY) -m pip install --quiet --no-build-isolation -e ".[dev,lectures]"
	@touch $(INSTALLED) $(BUILT)
	@echo "needle: environment ready in $(VENV)"

$(BUILT): $(INSTALLED) $(SOURCES)
	flock .build.lock $(PY) -m pip install --quiet --no-build-isolation --no-deps -e .
	@touch $(BUILT)
	@echo "needle: compiled modules rebuilt"

build: $(BUILT)

# Jupytext's notebook view is the default for .py files, so the lecture sources open as notebooks.
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json

$(LAB_OVERRIDES): $(INSTALLED)
	@mkdir -p $(dir $@)
	@echo '{"@jupyterlab/docmanager-extension:plugin": {"defaultViewers": {"python": "Jupytext Notebook"}}}' > $@

# User paths (HW, NB, NEEDLE_IMPL; set on the command line, so make exports them) are read by the
# shell as "$$HW" and resolved there or in Python, never by make, so spaces and quotes survive.
# ABSPATH prints its argument made absolute (~ expanded; blank stays blank).
ABSPATH := $(PY) -c 'import os, sys; a = sys.argv[1].strip(); print(a and os.path.abspath(os.path.expanduser(a)))'

# NEEDLE_IMPL=~/hw2/python make lab: the notebooks import that needle (made absolute here,
# because the kernels run in notebooks/).
lab: $(BUILT) $(LAB_OVERRIDES)
	@impl="$$($(ABSPATH) "$${NEEDLE_IMPL-}")"; if [ -n "$$impl" ]; then export NEEDLE_IMPL="$$impl"; fi; echo "Starting JupyterLab on notebooks/ (Ctrl-C to stop)$${impl:+, with NEEDLE_IMPL=$$impl}"; exec $(BIN)/jupyter lab --notebook-dir=notebooks --ip=127.0.0.1 $(if $(filter 0,$(shell id -u)),--allow-root,)

test: test-unit test-notebooks

# Tests marked both_backends (the autograd/op/nn/data suites) run a second time on the
# plain-numpy backend (NEEDLE_BACKEND=np).
test-unit: $(BUILT)
	$(PY) -m pytest tests -n 2 -q -p no:cacheprovider
	NEEDLE_BACKEND=np $(PY) -m pytest tests -n 2 -q -p no:cacheprovider -m both_backends

test-notebooks: $(BUILT)
	$(NBVAL) -q $(NOTEBOOKS)

notebooks: $(BUILT)
	@for py in notebooks/[0-9]*.py; do \
	  echo "== $$py"; \
	  $(BIN)/jupytext --to ipynb --update "$$py" -q || exit 1; \
	  env -u MPLBACKEND PATH="$$(pwd)/$(BIN):$$PATH" $(NBEXEC) "$${py%.py}.ipynb" || exit 1; \
	done

# One notebook: make notebook NB=notebooks/05_ndarray.py
notebook: $(BUILT)
	@test -n "$${NB-}" || { echo "usage: make notebook NB=notebooks/NN_topic.py"; exit 2; }
	$(BIN)/jupytext --to ipynb --update "$$NB" -q
	env -u MPLBACKEND PATH="$$(pwd)/$(BIN):$$PATH" $(NBEXEC) "$${NB%.py}.ipynb"

figures: $(BUILT)
	@mkdir -p figures
	@for nb in $(NOTEBOOKS); do \
	  echo "== $$nb"; \
	  out=$$(mktemp -d); \
	  env -u MPLBACKEND NEEDLE_WRITE_FIGURES=1 PATH="$$(pwd)/$(BIN):$$PATH" \
	    jupyter nbconvert --to notebook --execute --output-dir "$$out" "$$nb" >/dev/null || exit 1; \
	  rm -rf "$$out"; \
	done
	@ls figures

# With NEEDLE_IMPL=path/to/hwN/python, instead of the usual tables: that needle's kernels and a
# training step measured beside this project's and numpy's (benchmarks/student.py).
bench: $(BUILT)
	if [ -n "$$(echo $${NEEDLE_IMPL-})" ]; then $(PY) -m benchmarks.student; else $(PY) -m benchmarks; fi

profile: $(BUILT)
	if [ -n "$$(echo $${NEEDLE_IMPL-})" ]; then $(PY) -m benchmarks.student --step-only; else $(PY) -m benchmarks.step_profile; fi

# Student mode: build and check a homework folder in the course's layout, e.g. make check HW=~/hw2
# (HWNUM=hw2 when the folder's name does not say which homework; ARGS= passes other options)
check: $(INSTALLED)
	@test -n "$${HW-}" || { echo "usage: make check HW=path/to/hwN [Q=text] [HWNUM=hwN] [ARGS=...]"; exit 2; }
	$(PY) -m companion.check "$$HW" $(if $(Q),-k "$$Q",) $(if $(HWNUM),--hw "$$HWNUM",) $${ARGS-}

# Passed/total per homework in or beside HW (default: here), what changed, the next question.
progress: $(PY)
	$(PY) -m companion.check --progress "$${HW:-.}"

# Every notebook on NEEDLE_IMPL's needle: cells passed, failed, skipped (companion/report_card.py).
lecture-report: $(BUILT)
	@test -n "$$(echo $${NEEDLE_IMPL-})" || { echo "usage: make lecture-report NEEDLE_IMPL=path/to/hwN/python [NB=notebooks/NN_topic.py]"; exit 2; }
	env -u MPLBACKEND PATH="$$(pwd)/$(BIN):$$PATH" $(PY) -m companion.report_card $(if $(NB),"$$NB",)

data: $(INSTALLED)
	$(PY) -m companion.data.download --all --root data

# Static types (mypy, configured in pyproject.toml): needle/, with the autograd core and the
# NDArray layer in strict mode.
.PHONY: typecheck
typecheck: $(INSTALLED)
	$(PY) -m mypy

clean:
	rm -rf CMakeCache.txt CMakeFiles build.ninja .ninja_deps .ninja_log cmake_install.cmake
	rm -f needle/backend_ndarray/*.so companion/apps/*.so $(BUILT)
	find . -name __pycache__ -not -path "./$(VENV)/*" -prune -exec rm -rf {} +

# ---- the lectures as a website (book/, tests/book/) -----------------------------------------
# make book: Sphinx renders the committed, executed notebooks (never re-executed) into build/book/;
# serve it with `.venv/bin/python -m http.server -d build/book --bind 127.0.0.1`.
# The site's packages (the `book` extra) are installed here when missing, without rebuilding needle.
BOOK_DEPS := $(VENV)/.needle-book

$(BOOK_DEPS): $(PY) pyproject.toml
	$(PY) -m pip install --quiet $$($(PY) -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["book"]))')
	@touch $@

.PHONY: book
book: $(BOOK_DEPS)
	$(PY) -m book.build build/book
	@echo "the site: build/book/index.html"

# tests/book/ builds the site and opens it in Chromium: `make test` installs the extra first.
test-unit: $(BOOK_DEPS)

# ---- Colab, simulated (tests/build/colab_simulation.py) --------------------------------------
# A fresh Python 3.12 venv with Colab's preinstalled packages and no `make`; each notebook's set-up
# cell installs needle from a git clone of HEAD (commit first), then notebooks 01 and 02 run.
.PHONY: test-colab
test-colab: $(INSTALLED)
	$(PY) tests/build/colab_simulation.py $(if $(COLAB_PYTHON),--python "$(COLAB_PYTHON)",)
