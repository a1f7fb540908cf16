# Thin wrapper over CMake. `make demo` runs the main job, `make test` the
# whole test suite (release build with -Werror, then ASan+UBSan, the Python
# binding's pytest suite, then a short libFuzzer run of every fuzz target).
BUILD     ?= build
BUILD_SAN ?= build-san
BUILD_FUZZ ?= build-fuzz
JOBS      ?= $(shell nproc)
FUZZ_SECONDS ?= 20

.PHONY: all deps build test test-release test-san test-fuzz test-python demo bench clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DFT_WERROR=ON >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

test: test-release test-san test-python test-fuzz

test-release: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-san: deps
	@cmake -S . -B $(BUILD_SAN) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DFT_WERROR=ON -DFT_SANITIZE=ON \
	  -DCMAKE_C_FLAGS_DEBUG="-O1 -g" >/dev/null
	@cmake --build $(BUILD_SAN) -j $(JOBS)
	cd $(BUILD_SAN) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS)

test-fuzz: deps
	@CC=clang cmake -S . -B $(BUILD_FUZZ) -G Ninja -DCMAKE_BUILD_TYPE=Release -DFT_FUZZ=ON -DFT_SANITIZE=ON >/dev/null
	@cmake --build $(BUILD_FUZZ) -j $(JOBS)
	@scripts/run-fuzzers.sh $(BUILD_FUZZ) $(FUZZ_SECONDS)

test-python: deps
	@scripts/test-python.sh

demo: build
	@scripts/demo.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(BUILD_SAN) $(BUILD_FUZZ) build-py python/build
