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
  LDLIBS    += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++
  CU_SRC    := $(wildcard kernels/cuda/*.cu)
endif

LIB_SRC  := $(wildcard kernels/cpu/*.c model/*.c tokenizer/*.c) $(filter-out host/main.c,$(wildcard host/*.c))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o) $(CU_SRC:%.cu=$(BUILD)/%.cu.o)
TEST_SRC := $(wildcard tests/c/test_*.c)
TEST_BIN := $(TEST_SRC:tests/c/%.c=$(BUILD)/tests/%)

.PHONY: all deps test tests run bench bench-cpu clean
all: deps $(BIN)

deps:
	@bash tools/install-deps.sh

$(BIN): $(BUILD)/host/main.o $(LIB_OBJ)
	$(CC) -o $@ $^ $(LDLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/tests/%: tests/c/%.c $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $(filter %.c %.o,$^) $(LDLIBS)

tests: $(TEST_BIN)
test: all $(TEST_BIN)
	@PYTHON=$(PYTHON) BUILD=$(BUILD) VARENT=$(abspath $(BIN)) bash tests/run.sh $(T)

# Default model: stories260K from tests/data until the real chat model lands.
run: all
	@bash tools/run-default.sh

bench: bench-cpu
bench-cpu: all
	@PYTHON=$(PYTHON) bash tools/bench-cpu.sh

clean:
	rm -rf $(BUILD) varent

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
