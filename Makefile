# Thin wrapper over CMake. `make demo` runs the main job, `make test` the
# whole test suite (release build with -Werror, then ASan+UBSan, the Python
# binding's pytest suite, then a short libFuzzer run of every fuzz target,
# then the CUDA backend's tests over its CPU emulation, then the aarch64
# cross build's codec and agent tests under qemu-user). On a machine with an
# NVIDIA GPU, `make gpu-check` verifies the CUDA backend (docs/cuda.md).
# `make install PREFIX=DIR` installs the headers, libraries, pkg-config
# files, CMake package and the program (docs/architecture.md).
BUILD     ?= build
BUILD_SAN ?= build-san
BUILD_FUZZ ?= build-fuzz
BUILD_FAKE ?= build-cuda-fake
BUILD_A64 ?= build-aarch64
JOBS      ?= $(shell nproc)
FUZZ_SECONDS ?= 20
PREFIX    ?= /usr/local

.PHONY: all deps build install test test-release test-san test-fuzz test-python test-cuda-fake test-aarch64 gpu-check demo finetune-demo bench clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DFT_WERROR=ON >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

test: test-release test-san test-python test-fuzz test-cuda-fake test-aarch64

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
CUDA_TESTS = flextier_cli flextier-cuda test_cuda_hostmath test_cuda_cli test_cuda_plugin test_cuda_codec test_cuda_forward test_cuda_kernels
test-cuda-fake: deps
	@cmake -S . -B $(BUILD_FAKE) -G Ninja -DCMAKE_BUILD_TYPE=Release -DFT_WERROR=ON -DFT_CUDA=FAKE >/dev/null
	@cmake --build $(BUILD_FAKE) -j $(JOBS) --target $(CUDA_TESTS)
	cd $(BUILD_FAKE) && ctest --output-on-failure -j $(JOBS) -R cuda

# AArch64 (a BlueField DPU's Arm cores): cross-built with Debian's
# gcc-aarch64-linux-gnu and :arm64 libraries (cmake/aarch64-linux-gnu.cmake);
# the tests labelled aarch64 (codec with its NEON kernels, core, the agent)
# run under qemu-user.
A64_TARGETS = flextier_cli test_core test_codec test_quant test_byteplane test_agent replay_frame replay_agent_msg
test-aarch64: deps
	@cmake -S . -B $(BUILD_A64) -G Ninja -DCMAKE_BUILD_TYPE=Release -DFT_WERROR=ON -DFT_CUDA=OFF \
	  -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake >/dev/null
	@cmake --build $(BUILD_A64) -j $(JOBS) --target $(A64_TARGETS)
	cd $(BUILD_A64) && ctest --output-on-failure -j $(JOBS) -L aarch64

gpu-check:
	@scripts/gpu-check.sh

demo: build
	@scripts/demo.sh $(BUILD)

# LoRA fine-tuning of the demo model on public-domain modern English (the
# World English Bible), its perplexity on held-out books before and after
# (docs/training.md; a few minutes on 2 cores)
finetune-demo: build
	@scripts/finetune-demo.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(BUILD_SAN) $(BUILD_FUZZ) $(BUILD_FAKE) $(BUILD_A64) build-py python/build
