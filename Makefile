# detlogp: two commands do all setup on a fresh Debian 12 machine (docs/install.md):
#   make run        checks the packages, builds the library and the command line, runs
#                   `detlogp run`
#   make test       checks the packages, builds everything, runs the tests of the daily loop:
#                   every ctest entry but those labelled long (unit, exhaustive, MPI, CLI,
#                   Python, install, a fuzz smoke run, GPU)
#   make test-long  the long tier, after make test (.ci/run runs both): the entries labelled
#                   long (minutes of fuzzing, the install tests that compile the library again,
#                   the exhaustive check of the CUDA exp), then the unit tests built and run
#                   under ASan+UBSan
# Missing Debian packages are installed when run as root; otherwise scripts/install-deps.sh
# lists them and stops. make test, make test-long and make bench run Python (the package's
# tests, the command line's tests, the PyTorch comparisons) in the venv of
# python/requirements/test.txt (torch from PyPI): scripts/python-env.sh creates it on first use
# in ~/.cache/detlogp and reuses it after that, fresh clones included. make run needs no Python.
# `make bench` runs the benchmarks reported in docs/benchmarks.md.

JOBS        ?= 2
BUILD       ?= build
ASAN_BUILD  ?= build-asan
CMAKE_FLAGS ?=

# What `detlogp run` needs: the core library and the command line, nothing else.
RUN_OPTIONS  = -DDETLOGP_BUILD_TOOLS=ON -DDETLOGP_BUILD_TESTS=OFF -DDETLOGP_BUILD_BENCH=OFF \
               -DDETLOGP_BUILD_PYTHON=OFF -DDETLOGP_WITH_MPI=OFF -DDETLOGP_WITH_CUDA=OFF
# What the tests need: tools, tests, MPI, Python, and CUDA when a CUDA compiler is found. The
# benchmarks are left out (no test runs them); `make bench` adds them to the same tree.
FULL_OPTIONS = -DDETLOGP_BUILD_TOOLS=ON -DDETLOGP_BUILD_TESTS=ON -DDETLOGP_BUILD_BENCH=OFF \
               -DDETLOGP_BUILD_PYTHON=ON -DDETLOGP_WITH_MPI=ON -DDETLOGP_WITH_CUDA=AUTO

# The test venv's python (printed by scripts/python-env.sh, which creates the venv when needed)
# is the interpreter the extension is built for, the one ctest's pytest entries run, and the
# source of pybind11's CMake files (Debian's pybind11 2.10 cannot read NumPy 2's arrays).
# DETLOGP_PYTHON_INSTALL_DIR is unset so that CMake derives it again from that interpreter.
PYTHON_ENV   = bash scripts/python-env.sh
define configure_full
py=$$($(PYTHON_ENV)) && pybind11_dir=$$("$$py" -m pybind11 --cmakedir) && \
cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(FULL_OPTIONS) $(1) \
  -DDETLOGP_PYTHON_EXECUTABLE="$$py" -DDETLOGP_CLI_TEST_PYTHON="$$py" \
  -Dpybind11_DIR="$$pybind11_dir" -UDETLOGP_PYTHON_INSTALL_DIR $(CMAKE_FLAGS) >/dev/null
endef

.PHONY: all deps deps-run python-env build build-cli build-asan run test test-long bench format \
        clean

all: build

deps:
	@bash scripts/install-deps.sh all

deps-run:
	@bash scripts/install-deps.sh run

# Creates or checks the test venv alone; prints its python.
python-env: deps
	@$(PYTHON_ENV)

# The full build of make test.
build: deps
	@$(call configure_full)
	@cmake --build $(BUILD) -j $(JOBS)

# The command line alone. A build tree that already exists keeps its options (after
# `make test` it has everything, and the command line is already built).
build-cli: deps-run
	@if [ ! -f $(BUILD)/CMakeCache.txt ]; then \
	  cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(RUN_OPTIONS) $(CMAKE_FLAGS) >/dev/null; \
	fi
	@cmake --build $(BUILD) -j $(JOBS) --target detlogp_cli

# Unit tests only, with AddressSanitizer and UndefinedBehaviorSanitizer.
build-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDETLOGP_SANITIZE=ON \
	  -DDETLOGP_BUILD_TESTS=ON -DDETLOGP_BUILD_TOOLS=OFF -DDETLOGP_BUILD_BENCH=OFF \
	  -DDETLOGP_WITH_MPI=OFF -DDETLOGP_BUILD_PYTHON=OFF -DDETLOGP_WITH_CUDA=OFF \
	  $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

run: build-cli
	@./$(BUILD)/bin/detlogp run

test: build
	@cd $(BUILD) && ctest --output-on-failure -j 1 -LE long

# Reuses build/ (only what changed is compiled again) and the install tests' trees kept in it.
test-long: build build-asan
	@cd $(BUILD) && ctest --output-on-failure -j 1 -L long
	@cd $(ASAN_BUILD) && ctest --output-on-failure -j 1 -L unit

bench: deps
	@$(call configure_full,-DDETLOGP_BUILD_BENCH=ON)
	@cmake --build $(BUILD) -j $(JOBS)
	@DETLOGP_BENCH_PYTHON="$$($(PYTHON_ENV))" bash bench/run.sh $(BUILD)

format:
	@git ls-files '*.cpp' '*.hpp' '*.h' '*.cc' | xargs clang-format -i

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) build-pip
