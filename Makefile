# llmd - one Makefile.
#
#   make            optimized build: build/release/{libllmd.a,libllmd.so,llmd}
#   make debug      asserts on (-O1 -g): build/debug
#   make test       installs what is missing, then runs the suite on the debug
#                   build and again under ASan+UBSan (build/asan), checks the
#                   layering (tests/layers.sh), then the bounded fuzz runs
#   make run        installs what is missing, builds, runs `llmd generate`
#                   (MODEL=path.gguf, PROMPT="...", N=tokens)
#   make bench      builds and runs the benchmark programs (not tests)
#   make bench-llamacpp  llmd next to llama.cpp on the same GGUF files
#   make cuda       builds everything plus the CUDA backend and kernels (nvcc)
#   make SANITIZE=address|undefined|thread   a sanitized build in build/<san>
#   make format     clang-format -i on the sources

MODE     ?= release
SANITIZE ?=
ifneq ($(SANITIZE),)
BUILD    ?= build/$(SANITIZE)
else
BUILD    ?= build/$(MODE)
endif

CC       ?= cc
NPROC    := $(shell nproc 2>/dev/null || echo 2)
CUDA_HOME ?= /usr/local/cuda
NVCC     ?= $(CUDA_HOME)/bin/nvcc
PKGS     := libpcre2-8 libcrypto libxxhash hwloc liburing jansson libmicrohttpd libzmq msgpack
WERROR   ?= -Werror
comma    := ,

CPPFLAGS := -D_GNU_SOURCE -I. -Iinclude $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
CFLAGS   := -std=c17 -Wall -Wextra -Wshadow $(WERROR) -pthread -fPIC -MMD -MP
# libunistring (NFC for the qwen2 tokenizer) ships no pkg-config file
LDLIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lunistring -ldl -lm -pthread

ifeq ($(MODE),release)
CFLAGS   += -O2 -g -DNDEBUG
else ifeq ($(MODE),asan)
CFLAGS   += -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
LDFLAGS  += -fsanitize=address,undefined
else
CFLAGS   += -O1 -g
endif
ifneq ($(SANITIZE),)
CFLAGS   += -fsanitize=$(SANITIZE) -fno-sanitize-recover=all -fno-omit-frame-pointer
LDFLAGS  += -fsanitize=$(SANITIZE)
endif

# `make cuda` sets WITH_CUDA=1: the real CUDA backend replaces the stub.
WITH_CUDA ?= 0
LIB_SRC  := $(wildcard include/*.c vmm/*.c offload/*.c engine/*/*.c kernels/cpu/*.c)
ifeq ($(WITH_CUDA),1)
CPPFLAGS += -I$(CUDA_HOME)/include -DLLMD_WITH_CUDA=1
LIB_SRC  := $(filter-out vmm/vmm_cuda_stub.c engine/model/model_cuda_stub.c,$(LIB_SRC)) \
            $(wildcard vmm/cuda/*.c engine/model/cuda/*.c)
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcudart -lcublas -lstdc++
CU_SRC   := $(wildcard kernels/cuda/*.cu)
else
CU_SRC   :=
CUDA_LIBS :=
endif
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o) $(CU_SRC:%.cu=$(BUILD)/%.cu.o)
# jemalloc is not in PKGS: libllmd.a carries a private copy for the host tier
# whose symbols are hidden (tools/jemalloc_private.sh says why), linked into
# ofl_host.o's archive member, so a static link that uses the tier gets it
# (ofl_host.c's references to it are weak, which alone would pull nothing).
# libllmd.so goes without: the copy's initial-exec TLS would make every late
# dlopen of libllmd.so fail; there the tier dlopens libjemalloc.so.2.
JE_OBJ   := $(BUILD)/jemalloc_private.o
OFL_HOST_OBJ := $(BUILD)/offload/ofl_host.o
LIB_A_OBJ := $(filter-out $(OFL_HOST_OBJ),$(LIB_OBJ)) $(BUILD)/offload/ofl_host_je.o
BIN_SRC  := $(wildcard tools/llmd_*.c)
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_SRC := $(wildcard tests/bench/bench_*.c)
BENCH_BIN := $(BENCH_SRC:tests/bench/%.c=$(BUILD)/bench/%)
TOOL_SRC := $(filter-out $(BIN_SRC),$(wildcard tools/*.c))
TOOL_BIN := $(TOOL_SRC:tools/%.c=$(BUILD)/%)

.SECONDARY:
.PHONY: all debug test test-one check-layers run bench bench-llamacpp cuda format format-check deps-test deps-run clean fuzz-ci
all: $(BUILD)/libllmd.a $(BUILD)/libllmd.so $(BUILD)/llmd $(TOOL_BIN)

debug:
	$(MAKE) MODE=debug

$(BUILD)/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) -O2 -std=c++17 -arch=sm_90 -Werror all-warnings -Xcompiler -fPIC,-Wall,-Wextra,-Wshadow$(if $(WERROR),$(comma)$(WERROR)) $(CPPFLAGS) -c $< -o $@

$(JE_OBJ): tools/jemalloc_private.sh
	@mkdir -p $(@D)
	tools/jemalloc_private.sh $@

$(BUILD)/offload/ofl_host_je.o: $(OFL_HOST_OBJ) $(JE_OBJ)
	$(LD) -r -o $@ $^

$(BUILD)/libllmd.a: $(LIB_A_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libllmd.so: $(LIB_OBJ)
	$(CC) -shared $(LDFLAGS) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)

$(BUILD)/llmd: $(BIN_SRC:%.c=$(BUILD)/%.o) $(BUILD)/libllmd.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)

$(BUILD)/%: $(BUILD)/tools/%.o $(BUILD)/libllmd.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/libllmd.a
	$(CC) $(LDFLAGS) -o $@ $^ -lcriterion -ljansson $(LDLIBS) $(CUDA_LIBS)

$(BUILD)/bench/%: $(BUILD)/tests/bench/%.o $(BUILD)/libllmd.a
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)

# The suite: debug build, then ASan+UBSan, then the bounded fuzz runs.
# The closing line sums both builds' tests (the fuzz run fails make on a crash).
test: deps-test
	@rm -f build/test-counts; mkdir -p build
	$(MAKE) -j$(NPROC) MODE=debug test-one LLMD_TEST_COUNTS=$(CURDIR)/build/test-counts
	$(MAKE) -j$(NPROC) MODE=asan test-one LLMD_TEST_COUNTS=$(CURDIR)/build/test-counts
	$(MAKE) -j$(NPROC) MODE=debug check-layers
	$(MAKE) fuzz-ci
	@awk '{p += $$1; f += $$2} END {print "make test: fuzzing clean; debug and asan suites:"; \
	    print p " passed, " f " failed"}' build/test-counts

test-one: $(TEST_BIN) $(BUILD)/llmd $(BUILD)/libllmd.so $(TOOL_BIN)
	LLMD_BUILD=$(BUILD) LLMD_TEST_COUNTS=$(LLMD_TEST_COUNTS) tests/run.sh $(TEST_BIN)

# docs/architecture.md's layer table: who may include whom, and no two files
# that call each other (over the objects of the library and the tools).
check-layers: $(LIB_OBJ) $(BIN_SRC:%.c=$(BUILD)/%.o) $(TOOL_SRC:%.c=$(BUILD)/%.o)
	tests/layers.sh $^

FUZZ_SECONDS ?= 60
fuzz-ci:
	PKGS="$(PKGS)" tests/fuzz/run.sh $(FUZZ_SECONDS)

MODEL  ?=
PROMPT ?= Once upon a time
N      ?= 64
run: deps-run
	$(MAKE) -j$(NPROC) MODE=release all
	tools/run_main.sh build/release/llmd "$(MODEL)" "$(PROMPT)" "$(N)"

bench: $(BENCH_BIN)
	@for b in $(BENCH_BIN); do echo "== $$b"; $$b || exit 1; done

# llmd next to llama.cpp on the same GGUF files, one interleaved run; the
# script says how llama.cpp is found or built (LLAMACPP_BIN, LLAMACPP_SRC)
bench-llamacpp:
	tests/bench/vs_llamacpp.sh

# (-j$(NPROC) unless the caller gave a -j of its own)
cuda:
	$(MAKE) $(if $(filter -j%,$(MAKEFLAGS)),,-j$(NPROC)) WITH_CUDA=1 BUILD=build/cuda all

deps-test:
	@tools/deps.sh test
deps-run:
	@tools/deps.sh run

format:
	clang-format -i $(shell git ls-files '*.c' '*.h' '*.cu')

# CI: every tracked C/CUDA file is formatted (clang-format 14, .clang-format)
format-check:
	@bad=$$(for f in $$(git ls-files '*.c' '*.h' '*.cu'); do \
	    clang-format --dry-run --Werror $$f >/dev/null 2>&1 || echo $$f; done); \
	if [ -n "$$bad" ]; then echo "not formatted (run make format):" $$bad; exit 1; fi

clean:
	rm -rf build

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
