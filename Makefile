# Downpour — one Makefile for everything.
#
#   make            build build/downpour-ps, build/downpour-worker, build/downpour
#   make run        a local cluster training on Fashion-MNIST (installs deps)
#   make test       unit + integration tests (installs deps); last line "N passed, N failed"
#   make bench      training throughput, side by side with PyTorch when present
#   make deps       install the Debian packages the build, tests and data need
#   make CUDA=0     CPU-only build (always works); CUDA is detected, never required
#
# Objects land under build/; each directory becomes one static library so a
# binary links only what it uses (the server never links CUDA).

BUILD   := build
CC      ?= gcc
PKGS    := libzmq libprotobuf-c openblas zlib libcjson libisal

DP_CFLAGS := -std=c11 -Wall -Wextra -O2 -g -MMD -MP -D_GNU_SOURCE -fopenmp -I. -I$(BUILD)/gen
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
ALL_CFLAGS  = $(DP_CFLAGS) $(PKG_CFLAGS) $(CFLAGS)
LDLIBS_ALL  = $(PKG_LIBS) -fopenmp -lm -lpthread $(LDFLAGS)

# ---- CUDA: detected, never required -------------------------------------
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard $(CUDA_HOME)/bin/nvcc))
CUDNN_H   := $(firstword $(wildcard $(CUDA_HOME)/include/cudnn.h /usr/include/cudnn.h /usr/include/x86_64-linux-gnu/cudnn.h))
ifeq ($(CUDA),0)
  HAVE_CUDA :=
  CUDA_WHY  := CUDA=0 given
else ifeq ($(NVCC),)
  HAVE_CUDA :=
  CUDA_WHY  := nvcc not found
else ifeq ($(CUDNN_H),)
  HAVE_CUDA :=
  CUDA_WHY  := cudnn.h not found
else
  HAVE_CUDA := 1
endif
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90
NVCC_FLAGS := -O3 -g -std=c++17 -I. -I$(CUDA_HOME)/include $(CUDA_ARCH) -Xcompiler -Wall,-fPIC
# cuDNN's libraries may sit in cuda/lib while cuBLAS is in cuda/lib64.
CUDA_LIBDIRS := $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib /usr/lib/x86_64-linux-gnu)
CUDA_LIBS := $(foreach d,$(CUDA_LIBDIRS),-L$(d) -Wl,-rpath,$(d)) -lcudnn -lcublas -lcudart -lstdc++
ifeq ($(HAVE_CUDA),1)
  DP_CFLAGS += -DDP_HAVE_CUDA -I$(CUDA_HOME)/include
endif

# ---- sources ------------------------------------------------------------
PROTO_GEN   := $(BUILD)/gen/proto/downpour.pb-c.c
COMMON_SRC  := $(wildcard common/*.c)
PROTO_SRC   := $(wildcard proto/*.c)
KERNELS_SRC := $(wildcard kernels/*.c kernels/cpu/*.c)
CUDA_SRC    := $(wildcard kernels/cuda/*.cu)
CUDA_CSRC   := $(wildcard kernels/cuda/*.c)
SERVER_SRC  := $(filter-out server/main.c,$(wildcard server/*.c))
WORKER_SRC  := $(filter-out worker/main.c,$(wildcard worker/*.c))
DEPLOY_SRC  := $(filter-out deploy/downpour.c,$(wildcard deploy/*.c))

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
LIB_COMMON  := $(BUILD)/lib/libdpcommon.a
LIB_PROTO   := $(BUILD)/lib/libdpproto.a
LIB_KERNELS := $(BUILD)/lib/libdpkernels.a
LIB_CUDA    := $(BUILD)/lib/libdpcuda.a
LIB_SERVER  := $(BUILD)/lib/libdpserver.a
LIB_WORKER  := $(BUILD)/lib/libdpworker.a
LIB_DEPLOY  := $(BUILD)/lib/libdpdeploy.a

ifeq ($(HAVE_CUDA),1)
  COMPUTE_LIBS := $(LIB_KERNELS) $(LIB_CUDA)
  COMPUTE_LDLIBS := $(CUDA_LIBS)
else
  COMPUTE_LIBS := $(LIB_KERNELS)
  COMPUTE_LDLIBS :=
endif
# Link order: users before what they use.
ALL_LIBS := $(LIB_DEPLOY) $(LIB_SERVER) $(LIB_WORKER) $(LIB_PROTO) $(COMPUTE_LIBS) $(LIB_COMMON)

BINS := $(BUILD)/downpour-ps $(BUILD)/downpour-worker $(BUILD)/downpour
TEST_SRC  := $(wildcard tests/unit/test_*.c)
TEST_BINS := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(TEST_SRC))
FUZZ_SRC  := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS := $(patsubst tests/fuzz/%.c,$(BUILD)/tests/%,$(FUZZ_SRC))
BENCH_SRC := $(wildcard tests/bench/bench_*.c)
BENCH_BINS := $(patsubst tests/bench/%.c,$(BUILD)/tests/%,$(BENCH_SRC))
GPU_SRC   := $(wildcard tests/gpu/test_*.c)
GPU_BINS  := $(if $(HAVE_CUDA),$(patsubst tests/gpu/%.c,$(BUILD)/tests/%,$(GPU_SRC)))

.PHONY: all cuda-status deps deps-test run test tests bench clean
all: cuda-status $(BINS)

cuda-status:
	@if [ "$(HAVE_CUDA)" = 1 ]; then echo "CUDA: found ($(NVCC), $(CUDNN_H)): building the cuda backend"; \
	else echo "CUDA: not found ($(CUDA_WHY)): CPU-only build"; fi

# ---- protobuf-c codecs, generated at build time -------------------------
# proto/downpour.proto (the wire) and common/tb_event.proto (TensorBoard's
# Event) land under build/gen with their source paths.
$(BUILD)/gen/%.pb-c.c $(BUILD)/gen/%.pb-c.h: %.proto
	@mkdir -p $(BUILD)/gen
	protoc-c --c_out=$(BUILD)/gen $<
.PRECIOUS: $(BUILD)/gen/%.pb-c.c $(BUILD)/gen/%.pb-c.h

# Everything may include the generated headers; make them first.
$(BUILD)/obj/%.o: %.c | $(BUILD)/gen/proto/downpour.pb-c.h $(BUILD)/gen/common/tb_event.pb-c.h
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

# The optimizer sweep over every parameter (the server runs it per push):
# -O3 vectorizes it, and -fno-math-errno lets sqrtf vectorize (errno is never
# read). Element-wise, so the bits stay those of -O2: Adam over 1.66 M floats
# took 1.4 ms instead of 5.0 on one core here.
$(BUILD)/obj/kernels/optim.o: DP_CFLAGS += -O3 -fno-math-errno

$(BUILD)/obj/gen/%.o: $(BUILD)/gen/%.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -MMD -MP -c $< -o $@

$(LIB_COMMON):  $(call obj,$(COMMON_SRC)) $(BUILD)/obj/gen/common/tb_event.pb-c.o
$(LIB_PROTO):   $(call obj,$(PROTO_SRC)) $(BUILD)/obj/gen/proto/downpour.pb-c.o
$(LIB_KERNELS): $(call obj,$(KERNELS_SRC))
$(LIB_CUDA):    $(patsubst %.cu,$(BUILD)/obj/%.o,$(CUDA_SRC)) $(call obj,$(CUDA_CSRC))
$(LIB_SERVER):  $(call obj,$(SERVER_SRC))
$(LIB_WORKER):  $(call obj,$(WORKER_SRC))
$(LIB_DEPLOY):  $(call obj,$(DEPLOY_SRC))
$(BUILD)/lib/%.a:
	@mkdir -p $(dir $@)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/downpour-ps: $(call obj,server/main.c) $(LIB_SERVER) $(LIB_PROTO) $(LIB_KERNELS) $(LIB_COMMON)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

$(BUILD)/downpour-worker: $(call obj,worker/main.c) $(LIB_WORKER) $(LIB_PROTO) $(COMPUTE_LIBS) $(LIB_COMMON)
	$(CC) -o $@ $^ $(COMPUTE_LDLIBS) $(LDLIBS_ALL)

$(BUILD)/downpour: $(call obj,deploy/downpour.c) $(ALL_LIBS)
	$(CC) -o $@ $^ $(COMPUTE_LDLIBS) $(LDLIBS_ALL)

$(BUILD)/tests/%: $(BUILD)/obj/tests/unit/%.o $(ALL_LIBS)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $^ $(COMPUTE_LDLIBS) $(LDLIBS_ALL)
$(BUILD)/tests/fuzz_%: $(BUILD)/obj/tests/fuzz/fuzz_%.o $(ALL_LIBS)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $^ $(COMPUTE_LDLIBS) $(LDLIBS_ALL)
$(BUILD)/tests/bench_%: $(BUILD)/obj/tests/bench/bench_%.o $(ALL_LIBS)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $^ $(COMPUTE_LDLIBS) $(LDLIBS_ALL)
$(BUILD)/tests/test_gpu_%: $(BUILD)/obj/tests/gpu/test_gpu_%.o $(ALL_LIBS)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $^ $(COMPUTE_LDLIBS) $(LDLIBS_ALL)

tests: all $(TEST_BINS) $(FUZZ_BINS) $(BENCH_BINS) $(GPU_BINS)

# ---- installing what the build, the tests and `make run` need ----------
DEB_BUILD := gcc make pkg-config libzmq3-dev libprotobuf-c-dev protobuf-c-compiler \
             libopenblas-dev zlib1g-dev libcjson-dev libisal-dev dataset-fashion-mnist
# Only the tests: PyTorch checks that our checkpoints load into torch; protoc
# decodes our TensorBoard events independently.
DEB_TEST  := python3 python3-torch python3-numpy protobuf-compiler
define install_missing
	@missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | \
	    grep -q 'install ok installed' || echo $$p; done | tr '\n' ' '); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then \
	    echo "deps: installing $$missing"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) >$(BUILD)/deps.log 2>&1 \
	      || { echo "deps: apt-get failed, see $(BUILD)/deps.log"; tail -5 $(BUILD)/deps.log; exit 1; }; \
	else \
	    echo "deps: missing packages; run: sudo apt-get install $$missing"; exit 1; \
	fi
endef
deps:
	@mkdir -p $(BUILD)
	$(call install_missing,$(DEB_BUILD))
deps-test: deps
	$(call install_missing,$(DEB_TEST))

run: deps
	@$(MAKE) --no-print-directory all
	ARGS="$(ARGS)" ./deploy/run.sh

test: deps-test
	@$(MAKE) --no-print-directory tests
	./tests/run.sh

bench: deps-test
	@$(MAKE) --no-print-directory tests
	./tests/bench/run.sh

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
