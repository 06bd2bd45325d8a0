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

.PHONY: lab test test-unit test-notebooks build notebooks notebook figures bench profile check data clean help

help:
	@echo "make lab        set up (.venv, install, compile) and open JupyterLab on notebooks/"
	@echo "make test       set up if needed, then run every test and every notebook (nbval)"
	@echo "make notebooks  regenerate each .ipynb from its .py and re-execute it"
	@echo "make figures    re-execute the notebooks, saving figures/*.png"
	@echo "make bench      benchmarks: needle beside numpy (and PyTorch when installed)"
	@echo "make profile    one training step per model split into kernel time and framework overhead"
	@echo "make check HW=path/to/hwN   check your own homework folder (course layout), question by question"
	@echo "make data       download MNIST, CIFAR-10 and Penn Treebank into data/"
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

# NEEDLE_IMPL=~/hw2/python make lab: the notebooks import that needle (made absolute here,
# because the kernels run in notebooks/).
lab: $(BUILT) $(LAB_OVERRIDES)
	@echo "Starting JupyterLab on notebooks/ (Ctrl-C to stop)$(if $(NEEDLE_IMPL), with NEEDLE_IMPL=$(abspath $(NEEDLE_IMPL)),)"
	$(if $(NEEDLE_IMPL),NEEDLE_IMPL=$(abspath $(NEEDLE_IMPL)) ,)$(BIN)/jupyter lab --notebook-dir=notebooks --ip=127.0.0.1 $(if $(filter 0,$(shell id -u)),--allow-root,)

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
	  $(BIN)/jupytext --to ipynb --update $$py -q || exit 1; \
	  env -u MPLBACKEND PATH=$(CURDIR)/$(BIN):$$PATH $(NBEXEC) $${py%.py}.ipynb || exit 1; \
	done

# One notebook: make notebook NB=notebooks/05_ndarray.py
notebook: $(BUILT)
	$(BIN)/jupytext --to ipynb --update $(NB) -q
	env -u MPLBACKEND PATH=$(CURDIR)/$(BIN):$$PATH $(NBEXEC) $(basename $(NB)).ipynb

figures: $(BUILT)
	@mkdir -p figures
	@for nb in $(NOTEBOOKS); do \
	  echo "== $$nb"; \
	  out=$$(mktemp -d); \
	  env -u MPLBACKEND NEEDLE_WRITE_FIGURES=1 PATH=$(CURDIR)/$(BIN):$$PATH \
	    jupyter nbconvert --to notebook --execute --output-dir $$out $$nb >/dev/null || exit 1; \
	  rm -rf $$out; \
	done
	@ls figures

bench: $(BUILT)
	$(PY) -m benchmarks

profile: $(BUILT)
	$(PY) -m benchmarks.step_profile

# Student mode: build and check a homework folder in the course's layout, e.g. make check HW=~/hw2
check: $(INSTALLED)
	@test -n "$(HW)" || { echo "usage: make check HW=path/to/hwN [Q=text]"; exit 2; }
	$(PY) -m companion.check "$(HW)" $(if $(Q),-k $(Q),)

data: $(INSTALLED)
	$(PY) -m companion.data.download --all --root data

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
