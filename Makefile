# Thin wrapper over CMake. `make demo` runs the main job, `make test` the
# whole test suite (release build with -Werror, then ASan+UBSan, the Python
# binding's pytest suite, then a short libFuzzer run of every fuzz target,
# then the CUDA backend's tests over its CPU emulation). On a machine with an
# NVIDIA GPU, `make gpu-check` verifies the CUDA backend (docs/cuda.md).
BUILD     ?= build
BUILD_SAN ?= build-san
BUILD_FUZZ ?= build-fuzz
BUILD_FAKE ?= build-cuda-fake
JOBS      ?= $(shell nproc)
FUZZ_SECONDS ?= 20

.PHONY: all deps build test test-release test-san test-fuzz test-python test-cuda-fake gpu-check demo bench clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DFT_WERROR=ON >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

test: test-release test-san test-python test-fuzz test-cuda-fake

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

# The CUDA backend's host code and GPU tests over a CPU emulation of CUDA
# (-DFT_CUDA=FAKE, tests/cuda/fake): no GPU needed, nothing runs on one.
CUDA_TESTS = flextier_cli test_cuda_hostmath test_cuda_cli test_cuda_codec test_cuda_forward test_cuda_kernels
test-cuda-fake: deps
	@cmake -S . -B $(BUILD_FAKE) -G Ninja -DCMAKE_BUILD_TYPE=Release -DFT_WERROR=ON -DFT_CUDA=FAKE >/dev/null
	@cmake --build $(BUILD_FAKE) -j $(JOBS) --target $(CUDA_TESTS)
	cd $(BUILD_FAKE) && ctest --output-on-failure -j $(JOBS) -R cuda

gpu-check:
	@scripts/gpu-check.sh

demo: build
	@scripts/demo.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(BUILD_SAN) $(BUILD_FUZZ) $(BUILD_FAKE) build-py python/build
