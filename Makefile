# varent: one binary, ./varent. `make CUDA=0` builds CPU-only; otherwise the CUDA
# backend is compiled in whenever nvcc is found.
CC      ?= cc
PYTHON  ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || echo python3)
NVCC    ?= $(shell command -v nvcc 2>/dev/null || (test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc))
ARCH    ?= -march=native
OPT     ?= -O3
CFLAGS  += -std=gnu11 $(OPT) $(ARCH) -g -Wall -Wextra -Wno-unused-parameter -Wshadow -fopenmp -I. -MMD -MP
LDLIBS  += -lcjson -lpcre2-8 -lutf8proc -lmicrohttpd -lm -lpthread -fopenmp
BUILD   ?= build
BIN     ?= varent
VERSION := 0.1.0
CFLAGS  += -DVARENT_VERSION=\"$(VERSION)\"

ifeq ($(CUDA),0)
  NVCC :=
endif
ifneq ($(NVCC),)
  CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
  NVCCFLAGS ?= -O3 -std=c++17 -I. -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=compute_80 \
               -Xcompiler -fPIC -lineinfo
  CFLAGS    += -DVARENT_CUDA -I$(CUDA_HOME)/include
  LDLIBS    += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lnccl -lcudart -ldl -lstdc++
  CU_SRC    := $(wildcard kernels/cuda/*.cu)
endif

# A bare `make` builds varent: the config.mk rule below would otherwise be the first
# target and so the default.
.DEFAULT_GOAL := all

# libedit (line editing and history in `varent chat`, host/cli/repl.c) when libedit-dev
# is installed; without it the chat reads plain lines. Probed after install-deps into
# build/gen/config.mk on every make (rewritten only when the answer changes: make then
# restarts on it, and the flags below rebuild what it changes, e.g. after `make test`
# installed Open MPI on a tree `make run` built); `make LIBEDIT=0` builds without it.
ifeq ($(filter-out clean,$(MAKECMDGOALS))$(filter clean,$(MAKECMDGOALS)),clean)
  # `make clean` alone probes nothing and installs nothing
else
-include $(BUILD)/gen/config.mk
endif
$(BUILD)/gen/config.mk: FORCE | deps
	@mkdir -p $(dir $@)
	@{ if [ -e /usr/include/histedit.h ]; then echo 'HAVE_LIBEDIT := 1'; else echo 'HAVE_LIBEDIT := 0'; fi; \
	   if command -v mpicc >/dev/null 2>&1 && mpicc --showme:compile >/dev/null 2>&1; then \
	     echo 'HAVE_MPI := 1'; echo "MPI_CFLAGS := $$(mpicc --showme:compile)"; echo "MPI_LIBS := $$(mpicc --showme:link)"; \
	   else echo 'HAVE_MPI := 0'; fi; } >$@.new
	@if cmp -s $@.new $@; then rm -f $@.new; else mv -f $@.new $@; fi
ifeq ($(LIBEDIT),0)
  HAVE_LIBEDIT := 0
endif
ifeq ($(HAVE_LIBEDIT),1)
  CFLAGS += -DVARENT_LIBEDIT
  LDLIBS += -ledit
endif
# MPI (tensor parallelism and agents across processes, host/runtime/tp_mpi.c) when Open
# MPI's mpicc is installed (tools/install-deps.sh installs it); `make MPI=0` leaves it out.
ifeq ($(MPI),0)
  HAVE_MPI := 0
endif
ifeq ($(HAVE_MPI),1)
  CFLAGS += -DVARENT_MPI $(MPI_CFLAGS)
  LDLIBS += $(MPI_LIBS)
endif

# host/ by role (docs/architecture.md); every .c of these folders is in the library
# except the CLI's main.
HOST_DIRS := util formats report runtime decode agents serve eval cli
LIB_SRC  := $(wildcard kernels/cpu/*.c model/*.c model/cuda/*.c tokenizer/*.c) \
            $(filter-out host/cli/main.c,$(foreach d,$(HOST_DIRS),$(wildcard host/$(d)/*.c)))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o) $(CU_SRC:%.cu=$(BUILD)/%.cu.o) $(BUILD)/gen/web_index.o
TEST_SRC := $(wildcard tests/c/test_*.c)
TEST_BIN := $(TEST_SRC:tests/c/%.c=$(BUILD)/tests/%)
# The parsers the fuzz targets (tests/fuzz/) test, and what they call: `make fuzz` links
# each target against these alone, and so do the replay programs below, so a file they
# need and this list lacks fails `make test`'s build too, not only `make fuzz`.
FUZZ_LIB_SRC := $(wildcard host/formats/*.c host/util/*.c) \
                host/serve/request.c host/decode/profiles.c host/decode/entropix.c model/config.c \
                $(wildcard tokenizer/*.c)
# The fuzz targets built as plain programs that replay files (tests/sh/test_fuzz_replay.sh).
REPLAY_BIN := $(patsubst tests/fuzz/%.c,$(BUILD)/fuzz-replay/%,$(wildcard tests/fuzz/fuzz_*.c))
REPLAY_LIB := $(BUILD)/fuzz-replay/libparsers.a
# Extra compile and link flags for every object, e.g. sanitizers (make test-asan).
SAN      ?=
CFLAGS   += $(SAN)
LDLIBS   += $(SAN)

.PHONY: all deps test-deps test tests run bench bench-cpu clean test-asan fuzz fuzz-build fuzz-seeds emu test-emu \
        cli-docs trace-lib FORCE
all: deps $(BIN)

# The Debian packages (tools/install-deps.sh): DEPS_SET=build (the default) what the
# build needs, run what `make run` needs (the build without Open MPI), test what the
# tests use too (make test installs them: numpy, jinja2, chromium, selenium, clang,
# valgrind, tmux, ...).
ifneq ($(filter run,$(MAKECMDGOALS)),)
  DEPS_SET ?= run
endif
DEPS_SET ?= build
deps:
	@bash tools/install-deps.sh $(DEPS_SET)
test-deps:
	@bash tools/install-deps.sh test

# Order-only: under make -j the compilers wait for install-deps (the headers it installs).
$(BUILD)/host/cli/main.o $(LIB_OBJ) $(TEST_BIN): | deps

# The flags the objects were compiled with: when they change (CUDA=0 after a CUDA
# build, MPI installed since), every object and the binary are rebuilt, never mixed.
FLAGS_STAMP := $(BUILD)/gen/flags
$(FLAGS_STAMP): FORCE
	@mkdir -p $(dir $@)
	@echo '$(CC) $(CFLAGS) | $(NVCC) $(NVCCFLAGS) | $(LDLIBS)' >$@.new
	@if cmp -s $@.new $@; then rm -f $@.new; else mv -f $@.new $@; fi
$(BUILD)/host/cli/main.o $(LIB_OBJ): $(FLAGS_STAMP)
FORCE:

# A change of the probe (or of LIBEDIT) recompiles the reader.
$(BUILD)/host/cli/repl.o: $(BUILD)/gen/config.mk

$(BIN): $(BUILD)/host/cli/main.o $(LIB_OBJ)
	$(CC) -o $@ $^ $(LDLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# -MMD -MP: nvcc writes x.cu.d next to x.cu.o, included at the end with the C .d files,
# so a header change (kernels/cuda/common.cuh, kernels/ops_cuda.h) rebuilds the kernels.
$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

# SwiGLU's 16-lane vectors (kernels/cpu/elementwise.c) in a build without AVX-512: GCC
# notes that such vectors pass differently; its functions are static, so no caller sees it.
%/kernels/cpu/elementwise.o: CFLAGS += -Wno-psabi

# The entropix decision (kernels/entropix_core.h) runs on the host and on the device:
# neither side may contract its multiply-adds, so both make the same parameters.
%/host/decode/entropix.o: CFLAGS += -ffp-contract=off
%/host/decode/entropix.o: EMU_CFLAGS += -ffp-contract=off
%/kernels/cuda/entropix.cu.o: NVCCFLAGS += -fmad=false
%/kernels/cuda/entropix.cu.o: EMU_CXXFLAGS += -ffp-contract=off

# The server's web page (host/serve/web/index.html), built into the binary.
$(BUILD)/gen/web_index.c: host/serve/web/index.html tools/embed.py
	@mkdir -p $(dir $@)
	$(PYTHON) tools/embed.py $< web_index_html $@
$(BUILD)/gen/web_index.o: $(BUILD)/gen/web_index.c
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/tests/%: tests/c/%.c $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS)

tests: $(TEST_BIN) $(REPLAY_BIN)
test: test-deps all $(TEST_BIN) $(REPLAY_BIN)
	@PYTHON=$(PYTHON) BUILD=$(BUILD) VARENT=$(abspath $(BIN)) bash tests/run.sh $(T)

# The demo (tools/run-default.sh): the packages the build needs but Open MPI, a build on
# every core and, on a machine without a GPU, without the CUDA backend (its kernels take
# minutes to compile; `make` and `make test` build it whenever nvcc is found).
JOBS    ?= $(shell nproc 2>/dev/null || echo 2)
RUN_GPU  = $(shell ls /dev/nvidia[0-9]* >/dev/null 2>&1 && echo 1)
run:
	@if [ -n "$(NVCC)" ] && [ -z "$(RUN_GPU)" ]; then \
	   echo "make run: no GPU here: the CPU build (make builds the CUDA backend too)" >&2; fi
	@$(MAKE) --no-print-directory -j$(JOBS) DEPS_SET=run $(if $(RUN_GPU),,CUDA=0) $(BIN)
	@bash tools/run-default.sh

# docs/cli.md is generated from the commands' option tables (tests/py/test_cli_help.py
# checks that the committed page is current).
cli-docs: $(BIN)
	./$(BIN) help --markdown > docs/cli.md

bench: bench-cpu
bench-cpu: all
	@PYTHON=$(PYTHON) bash tools/bench-cpu.sh

$(REPLAY_LIB): $(FUZZ_LIB_SRC:%.c=$(BUILD)/%.o) Makefile
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $(filter %.o,$^)
$(BUILD)/fuzz-replay/%: tests/fuzz/%.c tests/fuzz/replay_main.c $(REPLAY_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< tests/fuzz/replay_main.c $(REPLAY_LIB) $(LDLIBS)

# ---- the emulated CUDA device (tests/cudaemu/, docs/cuda.md "The emulated device") ----
# The same kernel sources and CUDA host code, compiled as host C/C++ against the
# emulator's headers: build/emu/varent (its --device cuda is the emulated device) and
# every CUDA test program, built always and run by make test (make test-emu: only them).
EMU_BUILD   ?= $(BUILD)/emu
comma       := ,
CXX         ?= c++
EMU_CFLAGS  := $(filter-out -DVARENT_CUDA -I$(CUDA_HOME)/include,$(CFLAGS)) -DVARENT_CUDA -Itests/cudaemu/include
# The sanitizers of the emulated device's own code: the kernels and the emulator
# (make test-asan leaves ASan out there, see below).
EMU_DEV_SAN ?= $(SAN)
EMU_CXXFLAGS := -std=c++17 $(OPT) $(ARCH) -g -Wall -Wno-unknown-pragmas -Wno-unused-parameter -Wno-unused-function \
                -fopenmp -I. -Itests/cudaemu/include -MMD -MP $(EMU_DEV_SAN)
EMU_CU      := $(wildcard kernels/cuda/*.cu)
EMU_RT_SRC  := $(wildcard tests/cudaemu/*.cpp)
EMU_OBJ     := $(EMU_BUILD)/host/cli/main.o $(LIB_SRC:%.c=$(EMU_BUILD)/%.o) $(EMU_CU:%.cu=$(EMU_BUILD)/%.cu.o) \
               $(EMU_RT_SRC:%.cpp=$(EMU_BUILD)/%.o) $(BUILD)/gen/web_index.o
EMU_LIB_OBJ := $(filter-out $(EMU_BUILD)/host/cli/main.o,$(EMU_OBJ))
EMU_TESTS   := $(patsubst tests/c/%.c,$(EMU_BUILD)/tests/%,$(wildcard tests/c/test_cuda_*.c) tests/c/test_sample.c) \
               $(EMU_BUILD)/tests/test_cudaemu_checks $(EMU_BUILD)/tests/test_cudaemu_nccl
EMU_LDLIBS  := $(filter-out -lcublas -lnccl -lcudart -L$(CUDA_HOME)/lib64 -Wl$(comma)-rpath$(comma)$(CUDA_HOME)/lib64,$(LDLIBS)) -lstdc++

$(EMU_BUILD)/%.o: %.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(EMU_CFLAGS) -c $< -o $@
$(EMU_BUILD)/gen/%.cu.cpp: %.cu tests/cudaemu/rewrite.py
	@mkdir -p $(dir $@)
	$(PYTHON) tests/cudaemu/rewrite.py $< $@
$(EMU_BUILD)/%.cu.o: $(EMU_BUILD)/gen/%.cu.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@
$(EMU_BUILD)/tests/cudaemu/%.o: tests/cudaemu/%.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@
# The emulated CUPTI's functions are exported, so that an injection library
# (CUDA_INJECTION64_PATH, the tracer below) loaded into varent finds them.
$(EMU_BUILD)/varent: $(EMU_OBJ)
	$(CC) -o $@ $^ $(EMU_LDLIBS) -Wl,--export-dynamic-symbol='cupti*'
$(EMU_BUILD)/tests/%: tests/c/%.c $(EMU_LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(EMU_CFLAGS) -o $@ $(filter %.c %.o,$^) $(EMU_LDLIBS)

# The emulator's own checks: planted bugs it must catch (tests/cudaemu/test_cudaemu_checks.cu).
$(EMU_BUILD)/gen/tests/cudaemu/%.cu.cpp: tests/cudaemu/%.cu tests/cudaemu/rewrite.py
	@mkdir -p $(dir $@)
	$(PYTHON) tests/cudaemu/rewrite.py $< $@
$(EMU_BUILD)/tests/test_cudaemu_%: $(EMU_BUILD)/gen/tests/cudaemu/test_cudaemu_%.cu.cpp \
                                        $(EMU_RT_SRC:%.cpp=$(EMU_BUILD)/%.o)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -o $@ $(filter %.cpp %.o,$^) -lpthread

# The generated C++ is kept (make would delete it as an intermediate): messages and
# debuggers point into it through its #line directives.
.PRECIOUS: $(EMU_BUILD)/gen/%.cu.cpp

# The GPU window's tracer (tools/trace/cupti_trace.c, docs/cuda.md "A GPU window"): an
# injection library over CUPTI. `make trace-lib` builds it against NVIDIA's CUPTI (the
# bundle carries it with libcupti); the emulated device's build runs in make test.
TRACE_CFLAGS := -std=gnu11 -O2 -g -Wall -Wextra -fPIC -shared
$(EMU_BUILD)/tools/libvarent_trace.so: tools/trace/cupti_trace.c tests/cudaemu/include/cupti.h
	@mkdir -p $(dir $@)
	$(CC) $(TRACE_CFLAGS) -Itests/cudaemu/include -o $@ $< -lpthread
ifneq ($(NVCC),)
trace-lib: $(BUILD)/tools/libvarent_trace.so
$(BUILD)/tools/libvarent_trace.so: tools/trace/cupti_trace.c
	@mkdir -p $(dir $@)
	$(CC) $(TRACE_CFLAGS) -I$(CUDA_HOME)/include -o $@ $< -L$(CUDA_HOME)/lib64 -Wl,-rpath,'$$ORIGIN' -Wl,-rpath,$(CUDA_HOME)/lib64 -lcupti -lpthread
else
trace-lib:
	@echo "trace-lib: no nvcc: the CUPTI tracer needs the CUDA toolkit" >&2; exit 1
endif

emu: deps $(EMU_BUILD)/varent $(EMU_TESTS) $(EMU_BUILD)/tools/libvarent_trace.so
test: $(EMU_BUILD)/varent $(EMU_TESTS) $(EMU_BUILD)/tools/libvarent_trace.so
test-emu: emu
	@PYTHON=$(PYTHON) BUILD=$(BUILD) EMU_BUILD=$(EMU_BUILD) VARENT=$(abspath $(BIN)) bash tests/run.sh --emu-only $(T)

# The whole CPU suite under AddressSanitizer + UBSan, in its own build dir. Any report
# aborts the process, which the tests see as a crash (docs/robustness.md). The emulated
# device's kernels and emulator are built without sanitizers: device memory is the
# emulator's own guarded mappings, which ASan does not track (the emulator's memcheck
# covers them), and ASan there made the emulated programs 4x slower, UBSan alone 2x
# (CI took 89 of its 90 minutes).
ASAN_BUILD ?= $(BUILD)/asan
ASAN_SAN   := -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all -fno-omit-frame-pointer
ASAN_DEV_SAN := -fno-omit-frame-pointer
test-asan: deps test-deps
	ASAN_OPTIONS=abort_on_error=1:detect_leaks=1 LSAN_OPTIONS=suppressions=$(abspath tests/lsan.supp):print_suppressions=0 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 EMU_SCHEDULES=forward EMU_WHOLE_MODEL_ONLY=1 \
	$(MAKE) CUDA=0 BUILD=$(ASAN_BUILD) BIN=$(ASAN_BUILD)/varent OPT=-O1 SAN="$(ASAN_SAN)" EMU_DEV_SAN="$(ASAN_DEV_SAN)" test

# libFuzzer targets (tests/fuzz/): `make fuzz FUZZ_SECONDS=N` runs each for N seconds,
# FUZZ_TARGETS="gguf chat" picks some. Needs clang with compiler-rt (Debian: clang).
FUZZ_CC      ?= clang
FUZZ_BUILD   ?= $(BUILD)/fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_CFLAGS  := -std=gnu11 -O1 -g -I. -fno-omit-frame-pointer -Wall -Wno-unknown-pragmas \
                -DVARENT_VERSION=\"$(VERSION)\" -fsanitize=address,undefined -fno-sanitize-recover=undefined
# FUZZ_LIB_SRC (above) as an archive, so each target links only what it uses.
FUZZ_LIB_OBJ := $(FUZZ_LIB_SRC:%.c=$(FUZZ_BUILD)/obj/%.o)

$(FUZZ_BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@
$(FUZZ_BUILD)/libparsers.a: $(FUZZ_LIB_OBJ) Makefile
	rm -f $@ && ar rcs $@ $(filter %.o,$^)
$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_util.h $(FUZZ_BUILD)/libparsers.a
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_BUILD)/libparsers.a -lcjson -lpcre2-8 -lutf8proc -lm -lpthread

fuzz-build: deps $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/fuzz_%)
# make_seeds.py caches the converted stories260K in FUZZ_TMP (tests/tmp, as the suite
# does), which a fresh clone does not have yet.
FUZZ_TMP ?= tests/tmp
fuzz-seeds: $(BIN)
	@mkdir -p $(FUZZ_TMP)
	TESTTMP=$(abspath $(FUZZ_TMP)) VARENT=$(abspath $(BIN)) $(PYTHON) tests/fuzz/make_seeds.py $(FUZZ_BUILD)/seeds
fuzz: fuzz-build fuzz-seeds
	FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_TARGETS="$(FUZZ_TARGETS)" bash tests/fuzz/run.sh

clean:
	rm -rf $(BUILD) varent

-include $(shell find $(BUILD) $(filter-out $(BUILD)/%,$(FUZZ_BUILD)) -name '*.d' 2>/dev/null)
