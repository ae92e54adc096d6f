# detlogp: two commands do all setup on a fresh Debian 12 machine (as root):
#   make run    installs what is missing, builds, runs `detlogp run`
#   make test   installs what is missing, builds, runs every test (unit, MPI, Python, ASan+UBSan)
# `make bench` runs the benchmarks reported in docs/benchmarks.md.

JOBS        ?= 2
BUILD       ?= build
ASAN_BUILD  ?= build-asan
CMAKE_FLAGS ?=

.PHONY: all deps build build-asan run test test-unit test-asan bench format clean

all: build

deps:
	@bash scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# Unit tests only, with AddressSanitizer and UndefinedBehaviorSanitizer.
build-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDETLOGP_SANITIZE=ON \
	  -DDETLOGP_BUILD_TOOLS=OFF -DDETLOGP_BUILD_BENCH=OFF -DDETLOGP_WITH_MPI=OFF \
	  -DDETLOGP_BUILD_PYTHON=OFF $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

run: build
	@./$(BUILD)/bin/detlogp run

test: build build-asan
	@cd $(BUILD) && ctest --output-on-failure -j 1
	@cd $(ASAN_BUILD) && ctest --output-on-failure -j 1 -L unit

bench: build
	@bash bench/run.sh $(BUILD)

format:
	@git ls-files '*.cpp' '*.hpp' '*.h' '*.cc' | xargs clang-format -i

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
