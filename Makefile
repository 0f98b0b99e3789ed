# attograd: the two set-up commands are `make demo` and `make test` (see README.md).
BUILD   ?= build
JOBS    ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test test-sanitize fuzz docs bench compare clean

all: build

deps:
	@scripts/install-deps.sh

# The CUDA backend: ATTOGRAD_CUDA=AUTO (CMake's default) builds it when nvcc is found AND an NVIDIA
# GPU is present; `make test` asks for NVCC (wherever nvcc is, GPU or not) so the kernels are always
# compiled there. A value set in CMAKE_FLAGS wins over both.
CUDA_FLAGS ?=
configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CUDA_FLAGS) $(CMAKE_FLAGS) > $(BUILD).configure.log 2>&1 || { cat $(BUILD).configure.log; exit 1; }

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# Builds only what it runs (the library for the CPU, or with CUDA where AUTO finds a GPU, and the
# vit app; through ccache when installed), then trains the vision transformer on Fashion-MNIST (a
# few minutes on 2 cores) and prints the test accuracy, where its plots went, and what comes next.
demo: configure
	@cmake --build $(BUILD) -j $(JOBS) --target vit
	@./$(BUILD)/vit --out runs/vit
	@echo "plots: runs/vit/curves.svg (loss, accuracy), runs/vit/attention.svg (where the class token looks)"
	@echo "next:  make build (the other apps, benchmarks and tests), then"
	@echo "       ./$(BUILD)/textclf (language identification on Debian's fortunes),"
	@echo "       ./$(BUILD)/gpt (a char-level GPT on the King James Bible); --help lists every option"

# The whole suite: every doctest case is one CTest entry. Builds everything, the CUDA kernels too
# wherever nvcc is (their cases skip visibly without a GPU).
test: CUDA_FLAGS = -DATTOGRAD_CUDA=NVCC
test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

# The whole suite again under AddressSanitizer (with LeakSanitizer) and UndefinedBehaviorSanitizer,
# in its own build directory; any report fails its case (options: CMakeLists.txt, ATTOGRAD_SANITIZE).
# Debug keeps assert() on; the sanitizers' -O1 comes after it. CPU only: nvcc's device code is not
# instrumented and the CUDA runtime needs ASan's shadow-gap protection off, so the GPU is tested by
# `make test` alone. Slower than `make test` (ASan's shadow memory, quarantine and leak check).
SAN_BUILD ?= build-sanitize
test-sanitize: deps
	@cmake -S . -B $(SAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DATTOGRAD_SANITIZE=ON -DATTOGRAD_CUDA=OFF -DATTOGRAD_BENCH=OFF $(CMAKE_FLAGS) > $(SAN_BUILD).configure.log 2>&1 || { cat $(SAN_BUILD).configure.log; exit 1; }
	@cmake --build $(SAN_BUILD) -j $(JOBS)
	@cd $(SAN_BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 1800

# libFuzzer targets of every file parser (tests/fuzz/, clang), each FUZZ_SECONDS on a copy of its
# seed corpus; FUZZ_SECONDS=600 for the campaigns of docs/reliability.md.
FUZZ_SECONDS ?= 20
fuzz:
	@scripts/install-deps.sh --fuzz
	@scripts/fuzz.sh $(FUZZ_SECONDS)

# Regenerates docs/ops.md from the spec comments of autograd/ops.h, the code docs/extending.md
# quotes from examples/extending and the kernels docs/math quotes, the exact pictures of docs/img/ (build/docpics: masks, positions,
# a tape and the schematics qkv, heads, online-softmax, kv-cache, linformer, compressed, axial and
# sparse; make test checks they are current), then the pictures that come from runs
# (scripts/docs-pictures.sh lists them): walkthrough's scaling.svg, the math pages' figures drawn
# from their committed results, and the apps' attention heatmaps after a default run of each (the
# four runs take minutes on 2 cores; DOCS_APPS=0 skips them).
DOCS_APPS ?= 1
docs: configure
	@cmake --build $(BUILD) -j $(JOBS) --target opsdoc snippets docpics walkthrough recipefigs bench_checkpoint \
	  bench_why_attention bench_decode $(if $(filter 1,$(DOCS_APPS)),vit textclf gpt imagetext)
	@./$(BUILD)/opsdoc && ./$(BUILD)/snippets docs/extending.md docs/math && ./$(BUILD)/docpics
	@scripts/docs-pictures.sh $(BUILD) $(if $(filter 1,$(DOCS_APPS)),,--no-apps)

bench: build
	@scripts/bench.sh $(BUILD)

# attograd beside PyTorch (pip's newest in a venv it creates, and Debian's python3-torch when
# installed): training steps, scaling, attention, generation; tables also in $(BUILD)/compare_pytorch.md.
compare: build
	@scripts/install-deps.sh --bench
	@bench/compare_pytorch --build $(BUILD) --markdown $(BUILD)/compare_pytorch.md

clean:
	rm -rf $(BUILD) $(BUILD).configure.log $(SAN_BUILD) $(SAN_BUILD).configure.log build-fuzz
