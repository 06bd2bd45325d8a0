# needle course companion. The two set-up commands are `make lab` and `make test`.
# Any Python 3.10-3.13; `make PYTHON=python3.13 VENV=.venv-3.13 test` keeps a second one apart.
PYTHON ?= $(shell command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
# Tests never write into the tree (no __pycache__ from test runs).
export PYTHONDONTWRITEBYTECODE := 1
# Marker files: the environment is (re)installed when pyproject.toml changes,
# the compiled modules are rebuilt when a C++/CUDA source or CMakeLists.txt changes.
VENV_READY := $(VENV)/.needle-venv
# The lock: every pip install below is held to locks/pyX.Y.txt of this venv's Python (`make lock`
# rewrites the files). UNLOCKED=1 installs the newest releases pyproject.toml's ranges allow
# instead; each mode has its own marker, so switching reinstalls.
PYVER      := $(shell p=$(PY); test -x "$$p" || p=$(PYTHON); "$$p" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
LOCK_FILE  := locks/py$(PYVER).txt
ifeq ($(UNLOCKED),)
INSTALLED  := $(VENV)/.needle-installed
OTHER_MODE := $(VENV)/.needle-installed-unlocked
PIP_LOCK   := PIP_CONSTRAINT=$(LOCK_FILE)
PIP_UP     :=
else
INSTALLED  := $(VENV)/.needle-installed-unlocked
OTHER_MODE := $(VENV)/.needle-installed
PIP_LOCK   := PIP_CONSTRAINT=
PIP_UP     := --upgrade --upgrade-strategy eager
LOCK_FILE  :=
endif
BUILT      := $(VENV)/.needle-built
SOURCES    := CMakeLists.txt $(wildcard src/*.cc src/*.cu src/*.h src/*.cuh src/*/*.cc src/*/*.cu src/*/*.h src/*/*.cuh)
# Every CMake output lives under build/ (one folder per venv); the compiled modules themselves
# land beside the Python sources (needle/backend_ndarray/, needle/apps/).
BUILD_DIR  := build/$(patsubst .%,%,$(notdir $(VENV)))
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9]*.ipynb))
NBVAL     := env -u MPLBACKEND $(PY) -m pytest --nbval --nbval-current-env \
             --nbval-sanitize-with notebooks/sanitize.cfg -p no:cacheprovider --color=no
NBEXEC    := jupyter nbconvert --to notebook --execute --inplace \
             --ExecutePreprocessor.record_timing=False --ExecutePreprocessor.timeout=1200

.PHONY: lab test test-unit test-notebooks build test-clang test-sanitize test-smoke notebooks notebook figures bench profile check progress lecture-report data clean help

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
	@echo "make lint       ruff (lint and format check), mypy and the line budget: the gates CI runs first"
	@echo "make typecheck  mypy on needle/ (strict on autograd and the NDArray layer)"
	@echo "make book       the lectures as a website in build/book/ (from the committed notebooks)"
	@echo "make test-clang     build with clang++ (warnings as errors), run the CPU-module suites on it"
	@echo "make test-sanitize  build the CPU module with ASan+UBSan, run the CPU-module suites on it"
	@echo "make test-colab     Colab, simulated: the set-up cell installs needle in a fresh Python 3.13 venv with the lock, every notebook runs"
	@echo "make clean      remove build products (keeps .venv and data/)"
	@echo "make lock       rewrite locks/pyX.Y.txt (pinned versions) for every supported Python found"
	@echo "                every install is held to the lock of its Python; UNLOCKED=1 takes the newest releases"
	@echo "                (check, progress, where, lecture-report, bench, profile: also python -m companion <name> NAME=value ...)"
	@echo "make notebook-drift  every notebook under nbval as a report that never fails (CI runs it with UNLOCKED=1)"

# LOCKED cmd...: run cmd holding build/.lock (fcntl, so it works on Linux and macOS alike), so
# two first-time `make`s never create the venv, install or compile at the same time.
LOCKED = $(PYTHON) -c 'import fcntl, os, subprocess, sys; os.makedirs("build", exist_ok=True); \
  lock = open("build/.lock", "w"); fcntl.flock(lock, fcntl.LOCK_EX); \
  sys.exit(subprocess.call(sys.argv[1:]))'
# CMake configure arguments for this venv's Python and pybind11 (also used by test-clang etc.).
# The paths are made absolute and quoted by the shell, never by make: the checkout's path may
# hold spaces or parentheses. (No single quote inside: the build recipe runs it in sh -c '...'.)
SH_ABSPATH = "$(if $(filter /%,$(1)),$(1),$$(pwd)/$(1))"
CMAKE_ARGS_PY = -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=$(call SH_ABSPATH,$(PY)) \
  -DCMAKE_MAKE_PROGRAM=$(call SH_ABSPATH,$(BIN)/ninja) \
  -Dpybind11_DIR="$$("$(PY)" -c "import pybind11; print(pybind11.get_cmake_dir())")"

# Each step re-checks its marker under the lock: the second of two concurrent runs finds the
# work done and does nothing.
$(VENV_READY):
	$(LOCKED) sh -c 'test -f $(VENV_READY) || { { test -x $(PY) || $(PYTHON) -m venv $(VENV); } && \
	  $(PY) -m pip install --quiet --upgrade pip && touch $(VENV_READY); }'

$(INSTALLED): $(VENV_READY) pyproject.toml environment.yml $(wildcard $(LOCK_FILE))
	@test -z "$(LOCK_FILE)" -o -f "$(LOCK_FILE)" || { echo "needle: no lock for Python $(PYVER) ($(LOCK_FILE)): run make lock, or make ... UNLOCKED=1 for the newest releases"; exit 2; }
	$(LOCKED) sh -c 'test $(INSTALLED) -nt pyproject.toml -a $(INSTALLED) -nt environment.yml $(if $(LOCK_FILE),-a $(INSTALLED) -nt $(LOCK_FILE)) || { \
	  rm -f $(OTHER_MODE) $(VENV)/.needle-book && export $(PIP_LOCK) && \
	  $(PY) -m pip install --quiet $(PIP_UP) "scikit-build-core>=0.10" "pybind11>=2.12" cmake ninja numpy && \
	  $(PY) -m pip install --quiet $(PIP_UP) --no-build-isolation -C wheel.cmake=false -e ".[dev]" && \
	  $(PY) -m companion.extras $(if $(UNLOCKED),--upgrade) && \
	  touch $(INSTALLED); }'
	@echo "needle: environment ready in $(VENV) ($(if $(UNLOCKED),newest releases,locked to $(LOCK_FILE)))"

# make lock: rewrite locks/pyX.Y.txt for every supported Python found (pyenv's or python3.X on
# PATH), each from a fresh venv in build/lock/ with the newest releases pyproject.toml allows.
.PHONY: lock
lock:
	$(PYTHON) locks/generate.py $(LOCK_PYTHONS)

# The editable install above only links the Python package; CMake compiles the modules here,
# incrementally, in $(BUILD_DIR).
$(BUILT): $(INSTALLED) $(SOURCES)
	$(LOCKED) sh -c '$(BIN)/cmake -S . -B $(BUILD_DIR) $(CMAKE_ARGS_PY) $(CMAKE_EXTRA) >/dev/null && \
	  $(BIN)/cmake --build $(BUILD_DIR)'
	@touch $(BUILT)
	@echo "needle: compiled modules built in $(BUILD_DIR)"

build: $(BUILT)

# ---- other compilers and sanitizers (tests/README.md) -------------------------------------
# The suites that exercise the compiled CPU module directly (found wherever tests/ groups them).
find_tests    = $(wildcard $(foreach t,$(1),tests/$(t) tests/*/$(t)))
MODULE_TESTS  = $(call find_tests,test_device_protocol.py test_device_protocol_attention.py \
                  test_cpu_module.py test_cpu_threads.py test_ndarray_fuzz.py \
                  test_ndarray_errors.py test_lstm_layer.py)
# Run pytest on MODULE_TESTS with the CPU module built in $(1) (tests/build/preload swaps it in,
# in every process), after checking that the swap took effect.
define run_module_tests
	@so=$$(ls $(1)/needle/backend_ndarray/ndarray_backend_cpu*.so) && \
	  export PYTHONPATH=$(CURDIR)/tests/build/preload NEEDLE_TEST_CPU_MODULE=$$so $(2) && \
	  $(PY) -c "import os, needle.backend_ndarray as nd; f = nd.ndarray_backend_cpu.__file__; \
	    assert os.path.samefile(f, os.environ['NEEDLE_TEST_CPU_MODULE']), f; print('testing', f)" && \
	  $(PY) -m pytest -q -p no:cacheprovider $(3) $(MODULE_TESTS)
endef

# make test-clang: every module built by clang++ (warnings as errors) into build/clang, then the
# module suites against its CPU module.
CLANG_DIR := build/clang
test-clang: $(INSTALLED)
	@command -v clang++ >/dev/null || { echo "test-clang: clang++ is not installed"; exit 2; }
	CXX=clang++ $(BIN)/cmake -S . -B $(CLANG_DIR) $(CMAKE_ARGS_PY) -DNEEDLE_WERROR=ON \
	  -DNEEDLE_OUTPUT_DIR=$(abspath $(CLANG_DIR)/out) >/dev/null
	$(BIN)/cmake --build $(CLANG_DIR)
	$(call run_module_tests,$(CLANG_DIR)/out,,-n 2)

# make test-smoke: a quick check of one environment (.ci/run uses it for the newest Python):
# the CPU-module suites and one notebook under nbval.
SMOKE_NOTEBOOK ?= notebooks/05_ndarray.ipynb
test-smoke: $(BUILT)
	$(PY) -m pytest -q -p no:cacheprovider -n 2 $(MODULE_TESTS)
	$(NBVAL) -q $(SMOKE_NOTEBOOK)

# make test-sanitize: the CPU module with AddressSanitizer and UndefinedBehaviorSanitizer (gcc)
# in build/sanitize. The Python interpreter is not instrumented: libasan is preloaded, and
# libstdc++ with it (ASan must find the real __cxa_throw when it starts, and python does not
# link libstdc++). Huge allocations return null (the module raises MemoryError) instead of
# stopping the run; leak checking is off (the interpreter keeps its objects at exit).
SAN_DIR := build/sanitize
SAN_CXX ?= c++
SAN_ENV  = LD_PRELOAD="$$($(SAN_CXX) -print-file-name=libasan.so) $$($(SAN_CXX) -print-file-name=libstdc++.so)" \
  ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1
test-sanitize: $(INSTALLED)
	CXX=$(SAN_CXX) $(BIN)/cmake -S . -B $(SAN_DIR) $(CMAKE_ARGS_PY) -DNEEDLE_SANITIZE=address,undefined \
	  -DNEEDLE_OUTPUT_DIR=$(abspath $(SAN_DIR)/out) >/dev/null
	$(BIN)/cmake --build $(SAN_DIR) --target ndarray_backend_cpu_placed
	$(call run_module_tests,$(SAN_DIR)/out,$(SAN_ENV),-n 2)

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

# make notebook-drift (.ci/run runs it with UNLOCKED=1): every notebook under nbval, as a report of
# the cells whose outputs differ in this environment (build/notebook-drift-X.Y.txt); never fails.
DRIFT_REPORT := build/notebook-drift-$(PYVER)$(if $(UNLOCKED),-newest).txt
.PHONY: notebook-drift
notebook-drift: $(BUILT)
	@$(NBVAL) -q -rf $(NOTEBOOKS) > $(DRIFT_REPORT) 2>&1; \
	  echo "notebook drift: with $$($(PY) -m pip freeze | grep -iE '^(numpy|matplotlib|scikit-learn|nbval|jupyter_client|ipykernel)==' | tr '\n' ' ')"; \
	  if grep -qE '^FAILED ' $(DRIFT_REPORT); then grep -E '^FAILED ' $(DRIFT_REPORT) | sed 's/^FAILED /notebook drift: /'; \
	  else echo "notebook drift: none (every notebook's outputs match here)"; fi; \
	  echo "notebook drift: full nbval output in $(DRIFT_REPORT)"

notebooks: $(BUILT)
	@for py in notebooks/[0-9]*.py; do \
	  echo "== $$py"; \
	  $(BIN)/jupytext --to ipynb --update "$$py" -q || exit 1; \
	  env -u MPLBACKEND PATH="$$(pwd)/$(BIN):$$PATH" $(NBEXEC) "$${py%.py}.ipynb" || exit 1; \
	done
	$(PY) -m companion.viz "$$(pwd)"

# One notebook: make notebook NB=notebooks/05_ndarray.py
notebook: $(BUILT)
	@test -n "$${NB-}" || { echo "usage: make notebook NB=notebooks/NN_topic.py"; exit 2; }
	$(BIN)/jupytext --to ipynb --update "$$NB" -q
	env -u MPLBACKEND PATH="$$(pwd)/$(BIN):$$PATH" $(NBEXEC) "$${NB%.py}.ipynb"
	$(PY) -m companion.viz "$$(pwd)"

# figures/ is written from the committed notebooks' own outputs (each `save_figure` output), so
# it holds exactly the images they show; `make notebook(s)` refreshes it after executing.
figures: $(INSTALLED)
	$(PY) -m companion.viz "$$(pwd)"

# These targets run `python -m companion <target>` with the same NAME=value arguments (one place
# for what they do; companion/__main__.py), so they work without make too.
# bench with NEEDLE_IMPL=path/to/hwN/python: that needle's kernels and a training step measured
# beside this project's and numpy's (benchmarks/student.py), instead of the usual tables.
bench: $(BUILT)
	$(PY) -m companion bench "NEEDLE_IMPL=$${NEEDLE_IMPL-}"

profile: $(BUILT)
	$(PY) -m companion profile "NEEDLE_IMPL=$${NEEDLE_IMPL-}"

# Student mode: build and check a homework folder in the course's layout, e.g. make check HW=~/hw2
# (HWNUM=hw2 when the folder's name does not say which homework; ARGS= passes other options)
check: $(INSTALLED)
	@test -n "$${HW-}" || { echo "usage: make check HW=path/to/hwN [Q=text] [HWNUM=hwN] [ARGS=...]"; exit 2; }
	$(PY) -m companion check "HW=$${HW-}" "Q=$${Q-}" "HWNUM=$${HWNUM-}" "ARGS=$${ARGS-}"

# Passed/total per homework in or beside HW (default: here), what changed, the next question.
progress: $(INSTALLED)
	$(PY) -m companion progress "HW=$${HW-}"

where: $(INSTALLED)
	$(PY) -m companion.where $(Q)

# Every notebook on NEEDLE_IMPL's needle: cells passed, failed, skipped (companion/report_card.py).
lecture-report: $(BUILT)
	@test -n "$$(echo $${NEEDLE_IMPL-})" || { echo "usage: make lecture-report NEEDLE_IMPL=path/to/hwN/python [NB=notebooks/NN_topic.py]"; exit 2; }
	$(PY) -m companion lecture-report "NEEDLE_IMPL=$${NEEDLE_IMPL-}" "NB=$${NB-}"

data: $(INSTALLED)
	$(PY) -m companion.data.download --all --root data

# Static types (mypy, configured in pyproject.toml): needle/, with the autograd core and the
# NDArray layer in strict mode.
.PHONY: typecheck lint
typecheck: $(INSTALLED)
	$(PY) -m mypy

# The gates that need no build: ruff's lint and format check (pyproject.toml) and mypy.
# `$(BIN)/ruff format .` rewrites what the check refuses.
lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(PY) -m mypy
	$(PY) tests/line_budget.py

clean:
	rm -rf build
	rm -f needle/backend_ndarray/*.so companion/apps/*.so $(BUILT)
	find . -name __pycache__ -not -path "./$(VENV)/*" -prune -exec rm -rf {} +

# ---- the lectures as a website (book/, tests/book/) -----------------------------------------
# make book: Sphinx renders the committed, executed notebooks (never re-executed) into build/book/;
# serve it with `.venv/bin/python -m http.server -d build/book --bind 127.0.0.1`.
# The site's packages (the `book` extra) are installed here when missing, without rebuilding needle.
BOOK_DEPS := $(VENV)/.needle-book

$(BOOK_DEPS): $(INSTALLED)
	$(PIP_LOCK) $(PY) -m pip install --quiet $(PIP_UP) $$($(PY) -c 'import sys; tomllib = __import__("tomllib" if sys.version_info >= (3, 11) else "tomli"); print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["book"]))')
	@touch $@

.PHONY: book
book: $(BOOK_DEPS)
	$(PY) -m book.build build/book
	@echo "the site: build/book/index.html"

# tests/book/ builds the site and opens it in Chromium: `make test` installs the extra first.
test-unit: $(BOOK_DEPS)

# ---- Colab, simulated (tests/build/colab_simulation.py) --------------------------------------
# A fresh Python 3.13 venv (Colab's Python) with Colab's preinstalled packages and no `make`; the
# set-up cell installs needle with the lock from a git clone of HEAD (commit first), then
# every notebook and the student commands run outside the checkout.
.PHONY: test-colab
test-colab: $(INSTALLED)
	$(PY) tests/build/colab_simulation.py $(if $(COLAB_PYTHON),--python "$(COLAB_PYTHON)",)
