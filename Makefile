# Downpour — one Makefile for everything.
#
#   make            build build/downpour-ps, build/downpour-worker, build/downpour
#   make run        a local cluster training on Fashion-MNIST (installs deps)
#   make test       unit + integration tests (installs deps); last line "N passed, N failed"
#   make bench      training throughput, side by side with PyTorch when present
#   make bench-scale  pushes/s the servers sustain as workers, shards and the model grow (plots)
#   make deps       install the Debian packages the build, tests and data need
#   make install    the binaries, man pages, units, library (installs help2man)
#   make deb        the same as a Debian package (installs dpkg-dev)
#   make CUDA=0     CPU-only build (always works); CUDA is detected, never required
#   make test SANITIZE=1   the same tests built with ASan + UBSan (under build-san/)
#   make fuzz       the fuzzers (wire, safetensors, model, record, tfconfig, libsvm) under
#                   libFuzzer + ASan, FUZZ_SECONDS (60) each; FUZZ_TARGETS="wire
#                   tfconfig" runs those only
#
# Objects land under build/; each directory becomes one static library so a
# binary links only what it uses (the server never links CUDA).

# SANITIZE=1: AddressSanitizer + UndefinedBehaviorSanitizer on every object,
# in a build folder of its own so sanitized and plain objects never mix; the
# CUDA runtime does not run under ASan, so such a build is CPU-only.
ifeq ($(SANITIZE),1)
  BUILD   ?= build-san
  CUDA    := 0
  SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
  # Sanitized code runs 2-5x slower: the test runner scales its timeouts.
  export DP_TEST_TIMEOUT_SCALE ?= 4
else
  BUILD   ?= build
endif
CC      ?= gcc
PKGS    := libzmq libprotobuf-c openblas zlib libcjson libisal

DP_CFLAGS := -std=c11 -Wall -Wextra -O2 -g -MMD -MP -D_GNU_SOURCE -fopenmp -I. -I$(BUILD)/gen
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
# openblas: its header only. The kernels dlopen libopenblas.so.0 in main, with
# its core pinned per ISA path (kernels/cpu/blas.h): linked, it would pick its
# kernels from the CPU model before main.
PKG_LIBS   := $(shell pkg-config --libs $(filter-out openblas,$(PKGS)) 2>/dev/null)
ALL_CFLAGS  = $(DP_CFLAGS) $(SAN_FLAGS) $(PKG_CFLAGS) $(CFLAGS)
LDLIBS_ALL  = $(SAN_FLAGS) $(PKG_LIBS) -fopenmp -lm -lpthread $(LDFLAGS)

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
SERVER_SRC  := $(filter-out server/main.c,$(wildcard server/*.c server/loop/*.c server/core/*.c server/crew/*.c))
WORKER_SRC  := $(filter-out worker/main.c,$(wildcard worker/*.c worker/client/*.c worker/exec/*.c worker/train/*.c))
# The environments (worker/exec/env) are a library of their own: the workers act
# in them, and the servers bound an actor-critic push's account by them.
ENV_SRC     := $(wildcard worker/exec/env/*.c)
# deploy/'s rooms: launcher/ (the downpour command and its children), bench/,
# lab/ (engine, sim, replay) and lab/sweep/.
DEPLOY_SRC  := $(filter-out deploy/launcher/downpour.c,$(wildcard deploy/*/*.c deploy/*/*/*.c))

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
LIB_COMMON  := $(BUILD)/lib/libdpcommon.a
LIB_PROTO   := $(BUILD)/lib/libdpproto.a
LIB_KERNELS := $(BUILD)/lib/libdpkernels.a
LIB_CUDA    := $(BUILD)/lib/libdpcuda.a
LIB_SERVER  := $(BUILD)/lib/libdpserver.a
LIB_WORKER  := $(BUILD)/lib/libdpworker.a
LIB_ENV     := $(BUILD)/lib/libdpenv.a
LIB_DEPLOY  := $(BUILD)/lib/libdpdeploy.a

# The daemons' kernels. Under SANITIZE=1 they are built a second time
# without ASan for the three binaries: instrumented, the SIMD convolution
# runs ten times slower (a `downpour local` run's final evaluation took 40 s
# instead of 4), which made the sanitized integration tests most of CI's
# time. The kernels still run under ASan + UBSan in their own unit tests
# (test_kernels, test_net, test_backend_cpu: awkward shapes against the
# reference), and everything else in the daemons stays instrumented.
ifeq ($(SANITIZE),1)
  LIB_KERNELS_RUN := $(BUILD)/lib/libdpkernels-plain.a
else
  LIB_KERNELS_RUN := $(LIB_KERNELS)
endif

# The CUDA backend is a module of its own (kernels/backend.h says why and
# where it is looked for): the programs link none of NVIDIA's libraries and
# export their symbols (-rdynamic) for the few dp_ helpers the module
# calls; -Bsymbolic keeps the module's own calls inside it. Only the GPU
# tests (tests/gpu), which call its kernels directly, link it in whole.
CUDA_MODULE := $(if $(HAVE_CUDA),$(BUILD)/lib/downpour-cuda.so)
COMPUTE_LIBS := $(LIB_KERNELS)
COMPUTE_LDLIBS := $(if $(HAVE_CUDA),-rdynamic)
# Link order: users before what they use (the worker uses server/core/rows: a
# standalone table, and a model file's rows read back).
ALL_LIBS := $(LIB_DEPLOY) $(LIB_WORKER) $(LIB_SERVER) $(LIB_ENV) $(LIB_PROTO) $(COMPUTE_LIBS) $(LIB_COMMON)
GPU_LIBS := $(LIB_DEPLOY) $(LIB_WORKER) $(LIB_SERVER) $(LIB_ENV) $(LIB_PROTO) $(LIB_KERNELS) $(LIB_CUDA) $(LIB_COMMON)

BINS := $(BUILD)/downpour-ps $(BUILD)/downpour-worker $(BUILD)/downpour
TEST_SRC  := $(wildcard tests/unit/test_*.c)
TEST_BINS := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(TEST_SRC))
FUZZ_SRC  := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS := $(patsubst tests/fuzz/%.c,$(BUILD)/tests/%,$(FUZZ_SRC))
BENCH_SRC := $(wildcard tests/bench/bench_*.c)
BENCH_BINS := $(patsubst tests/bench/%.c,$(BUILD)/tests/%,$(BENCH_SRC))
GPU_SRC   := $(wildcard tests/gpu/test_*.c)
GPU_BINS  := $(if $(HAVE_CUDA),$(patsubst tests/gpu/%.c,$(BUILD)/tests/%,$(GPU_SRC)))

.PHONY: all cuda-status deps deps-list deps-test deps-bench deps-install deps-deb run test tests bench bench-scale \
        fuzz clean
all: cuda-status $(BINS) $(CUDA_MODULE)

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
$(BUILD)/obj/kernels/optim.o $(BUILD)/obj/plain/kernels/optim.o: DP_CFLAGS += -O3 -fno-math-errno

# LIB_KERNELS_RUN's objects under SANITIZE=1: no sanitizer flags.
$(BUILD)/obj/plain/%.o: %.c | $(BUILD)/gen/proto/downpour.pb-c.h $(BUILD)/gen/common/tb_event.pb-c.h
	@mkdir -p $(dir $@)
	$(CC) $(DP_CFLAGS) $(PKG_CFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/gen/%.o: $(BUILD)/gen/%.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -MMD -MP -c $< -o $@
# The shard step device's kernels aim at the CPU step's bits: no multiply
# and add contracted into an FMA the CPU does not make (optim_dev.cu).
$(BUILD)/obj/kernels/cuda/optim_dev.o: NVCC_FLAGS += -fmad=false

$(LIB_COMMON):  $(call obj,$(COMMON_SRC)) $(BUILD)/obj/gen/common/tb_event.pb-c.o
$(LIB_PROTO):   $(call obj,$(PROTO_SRC)) $(BUILD)/obj/gen/proto/downpour.pb-c.o
$(LIB_KERNELS): $(call obj,$(KERNELS_SRC))
$(BUILD)/lib/libdpkernels-plain.a: $(patsubst %.c,$(BUILD)/obj/plain/%.o,$(KERNELS_SRC))
CUDA_OBJS := $(patsubst %.cu,$(BUILD)/obj/%.o,$(CUDA_SRC)) $(patsubst %.c,$(BUILD)/obj/pic/%.o,$(CUDA_CSRC))
$(LIB_CUDA):    $(CUDA_OBJS)
$(LIB_SERVER):  $(call obj,$(SERVER_SRC))
$(LIB_WORKER):  $(call obj,$(WORKER_SRC))
$(LIB_ENV):     $(call obj,$(ENV_SRC))
$(LIB_DEPLOY):  $(call obj,$(DEPLOY_SRC))
$(BUILD)/lib/%.a:
	@mkdir -p $(dir $@)
	@rm -f $@
	ar rcs $@ $^

# ---- linking: one recipe for every program --------------------------------
# A program links its prerequisites ($^: its main object, then the archives,
# users before what they use), then LINK_LIBS (-rdynamic for the programs
# that may load the CUDA module, the CUDA libraries for the GPU tests), then
# what every program needs.
LINK_LIBS = $(COMPUTE_LDLIBS)
define link
@mkdir -p $(dir $@)
$(CC) -o $@ $^ $(LINK_LIBS) $(LDLIBS_ALL)
endef

RUN_LIBS = $(subst $(LIB_KERNELS),$(LIB_KERNELS_RUN),$(1))
# The server links no CUDA; it loads the module only for --device cuda:N
# (a shard on the GPU, kernels/optim_dev.h), which resolves the dp_
# helpers it calls from the program (-rdynamic).
$(BUILD)/downpour-ps: LINK_LIBS := $(COMPUTE_LDLIBS)
$(BUILD)/downpour-ps: $(call obj,server/main.c) $(LIB_SERVER) $(LIB_ENV) $(LIB_PROTO) $(LIB_KERNELS_RUN) $(LIB_COMMON)
# The worker links the server's library for its row table (server/core/rows.h): a
# model with an embedding keeps its rows in-process when it trains standalone.
$(BUILD)/downpour-worker: $(call obj,worker/main.c) $(LIB_WORKER) $(LIB_SERVER) $(LIB_ENV) $(LIB_PROTO) $(call RUN_LIBS,$(COMPUTE_LIBS)) $(LIB_COMMON)
$(BUILD)/downpour: $(call obj,deploy/launcher/downpour.c) $(call RUN_LIBS,$(ALL_LIBS))

# The test programs: tests/DIR/NAME.c (unit, fuzz, bench, gpu) becomes
# $(BUILD)/tests/NAME, its object linked with every library (a fuzz
# target with its own sources only: see FUZZ_SRCS_NAME below).
TEST_PROG_SRC := $(TEST_SRC) $(FUZZ_SRC) $(BENCH_SRC) $(GPU_SRC)
TEST_PROGS    := $(patsubst %.c,$(BUILD)/tests/%,$(notdir $(TEST_PROG_SRC)))
$(foreach s,$(filter-out $(GPU_SRC) $(FUZZ_SRC),$(TEST_PROG_SRC)),$(eval $(BUILD)/tests/$(basename $(notdir $(s))): $(call obj,$(s)) $(ALL_LIBS)))
$(foreach s,$(GPU_SRC),$(eval $(BUILD)/tests/$(basename $(notdir $(s))): $(call obj,$(s)) $(if $(HAVE_CUDA),$(GPU_LIBS),$(ALL_LIBS))))
$(GPU_BINS): LINK_LIBS = -rdynamic $(CUDA_LIBS)

$(CUDA_MODULE): $(CUDA_OBJS)
	@mkdir -p $(dir $@)
	$(CC) -shared -fPIC -Wl,-Bsymbolic -o $@ $^ $(CUDA_LIBS)

# tests/netns' slow-link helper (a netfilter-queue delay, for kernels
# without tc netem): built when Debian's libnetfilter-queue-dev is there.
NFQ_LIBS := $(shell pkg-config --libs libnetfilter_queue 2>/dev/null)
NFQ_BIN  := $(if $(NFQ_LIBS),$(BUILD)/tests/nfq_delay)
$(BUILD)/tests/nfq_delay: LINK_LIBS = $(NFQ_LIBS)
$(BUILD)/tests/nfq_delay: $(BUILD)/obj/tests/netns/nfq_delay.o $(LIB_COMMON)

$(BINS) $(TEST_PROGS) $(BUILD)/tests/nfq_delay:
	$(link)

# ---- libdownpour.so, downpour.h and the Python package `downpour` ----------
# The client library (worker/lib/downpour.h) is the C worker's own client:
# the same sources (ps_client, ps_pull, ps_push, ps_rows, ps_exchange, ps_socket,
# ps_beat, proto/, the parts of common/ they use) built a second time as position-independent code under
# $(BUILD)/obj/pic, linked with a soname and exporting downpour_* only
# (worker/lib/downpour.map). Never with the sanitizers: a Python process
# cannot load an ASan-instrumented library, and the same code runs under
# ASan in the daemons. `make` also leaves the Python package (python/) in
# $(BUILD)/python/downpour with a copy of the library beside it, so that
# PYTHONPATH=$(BUILD)/python python3 uses this build's library.
DPLIB_API     := 1
DPLIB_VERSION := 1.0.0
DPLIB_SONAME  := libdownpour.so.$(DPLIB_API)
DPLIB_SO      := $(BUILD)/lib/libdownpour.so.$(DPLIB_VERSION)
DPLIB_SRC := worker/lib/downpour.c worker/client/ps_client.c worker/client/ps_exchange.c worker/client/ps_pull.c worker/client/ps_push.c worker/client/ps_rows.c worker/client/ps_socket.c worker/client/ps_beat.c worker/client/ps_devregion.c \
             $(PROTO_SRC) common/model.c common/util.c common/rng.c common/cluster.c common/opts.c \
             common/checksum.c common/staleness.c common/dylu.c
DPLIB_OBJS := $(patsubst %.c,$(BUILD)/obj/pic/%.o,$(DPLIB_SRC)) $(BUILD)/obj/pic/gen/proto/downpour.pb-c.o
DPLIB_LIBS := $(shell pkg-config --libs libzmq libprotobuf-c libcjson libisal 2>/dev/null) -lm -lpthread
PY_SRC     := $(wildcard python/downpour/*.py)
PY_BUILT   := $(patsubst python/%,$(BUILD)/python/%,$(PY_SRC)) $(BUILD)/python/downpour/$(DPLIB_SONAME)
DPLIB_ALL  := $(DPLIB_SO) $(BUILD)/lib/$(DPLIB_SONAME) $(BUILD)/lib/libdownpour.so $(PY_BUILT)
all: $(DPLIB_ALL)

$(BUILD)/obj/pic/gen/%.o: $(BUILD)/gen/%.c
	@mkdir -p $(dir $@)
	$(CC) $(DP_CFLAGS) $(PKG_CFLAGS) $(CFLAGS) -fPIC -c $< -o $@
$(BUILD)/obj/pic/%.o: %.c | $(BUILD)/gen/proto/downpour.pb-c.h $(BUILD)/gen/common/tb_event.pb-c.h
	@mkdir -p $(dir $@)
	$(CC) $(DP_CFLAGS) $(PKG_CFLAGS) $(CFLAGS) -fPIC -c $< -o $@
$(DPLIB_SO): $(DPLIB_OBJS) worker/lib/downpour.map
	@mkdir -p $(dir $@)
	$(CC) -shared -fPIC -Wl,-soname,$(DPLIB_SONAME) -Wl,--version-script=worker/lib/downpour.map \
	    -Wl,--no-undefined -Wl,--as-needed -o $@ $(DPLIB_OBJS) $(DPLIB_LIBS) $(LDFLAGS)
$(BUILD)/lib/$(DPLIB_SONAME) $(BUILD)/lib/libdownpour.so: $(DPLIB_SO)
	ln -sf $(notdir $<) $@
$(BUILD)/python/downpour/%.py: python/downpour/%.py
	@mkdir -p $(dir $@)
	cp $< $@
$(BUILD)/python/downpour/$(DPLIB_SONAME): $(DPLIB_SO)
	@mkdir -p $(dir $@)
	cp $< $@

tests: all $(TEST_BINS) $(FUZZ_BINS) $(BENCH_BINS) $(GPU_BINS) $(NFQ_BIN)

# ---- installing what the build, the tests and `make run` need ----------
# Each package list once; a target installs its own (install_missing).
DEB_BUILD := gcc make pkg-config libzmq3-dev libprotobuf-c-dev protobuf-c-compiler \
             libopenblas-dev zlib1g-dev libcjson-dev libisal-dev dataset-fashion-mnist
# make install: help2man writes a man page for each binary from its --help.
DEB_INSTALL := help2man
# make deb, beyond make install: dpkg-dev's dpkg-shlibdeps finds Depends
# (and dpkg-architecture the multiarch directory); binutils' strip.
DEB_DEB := dpkg-dev binutils
# Only the benchmarks: gnuplot draws make bench-scale's PNGs.
DEB_BENCH := gnuplot-nox
# Only the tests:
#  - PyTorch checks that our checkpoints load into torch; protoc decodes our
#    TensorBoard events independently;
#  - clang builds the libFuzzer targets (make fuzz); libFuzzer and the
#    sanitizers' runtimes are libclang-rt-dev, only a Recommends of clang;
#  - a live SLURM (tests/integration/test_slurm.sh) and hosts in network
#    namespaces with a slow, lossy link (test_netns.sh: iptables, the nfq
#    helper; test_k8s.sh: the pods' namespaces), iproute2 for both;
#  - test_deb and test_systemd run make install and make deb; test_systemd
#    verifies the units with systemd's systemd-analyze (nothing is started);
#    test_k8s reads the manifests with python3-yaml; pgrep is procps';
#  - gnuplot draws `downpour sweep`'s plots (test_sweep checks them).
DEB_TEST  := python3 python3-torch python3-numpy protobuf-compiler clang libclang-rt-dev \
             slurmctld slurmd slurm-client munge iproute2 util-linux iptables libnetfilter-queue-dev \
             $(DEB_INSTALL) $(DEB_DEB) systemd python3-yaml procps $(DEB_BENCH)
# $(1): the Debian packages a target needs. Those missing are installed as
# root (apt-get, logged to $(BUILD)/deps.log); for anyone else the target
# stops and prints the apt-get line to run.
define install_missing
	@mkdir -p $(BUILD)
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
	$(call install_missing,$(DEB_BUILD))
# Every package the lists above name, one line (test_commands checks the
# test scripts' commands against them).
deps-list:
	@echo $(sort $(DEB_BUILD) $(DEB_TEST) $(DEB_BENCH))
deps-test: deps
	$(call install_missing,$(DEB_TEST))
deps-bench: deps-test
	$(call install_missing,$(DEB_BENCH))
deps-install:
	$(call install_missing,$(DEB_INSTALL))
deps-deb: deps-install
	$(call install_missing,$(DEB_DEB))

run: deps
	@$(MAKE) --no-print-directory all
	ARGS="$(ARGS)" ./deploy/run.sh

test: deps-test
	@$(MAKE) --no-print-directory tests
	BUILD=$(BUILD) DP_SANITIZED=$(if $(filter 1,$(SANITIZE)),1,0) ./tests/run.sh

# ---- the fuzzers under libFuzzer -----------------------------------------
# One target per parser of untrusted bytes, tests/fuzz/fuzz_NAME.c:
#   wire         the envelope decoder and validator (proto/wire.c)
#   safetensors  the safetensors / checkpoint reader (common/safetensors.c)
#   model        the model spec parser (common/model.c)
#   record       the record loader `downpour replay` uses (server/core/record.c)
#   tfconfig     TF_CONFIG merged with the cluster flags (common/cluster.c)
#   libsvm       the svmlight / libsvm reader, plain and gzip (common/libsvm.c)
# clang instruments each target's parser and what it calls (FUZZ_SRCS_NAME:
# the real sources, compiled under $(FUZZ_DIR)/obj) for coverage and ASan +
# UBSan. `make fuzz` runs every target in FUZZ_TARGETS one after the other,
# each for FUZZ_SECONDS (per target: 60 s x 6 targets by default), from its
# committed seed corpus tests/fuzz/corpus/NAME/ (wire's seeds are written by
# the gcc-built fuzz_wire) plus what earlier runs found ($(FUZZ_DIR)/NAME/
# corpus), with tests/fuzz/NAME.dict when there is one. Findings (crash-*,
# leak-*, timeout-*, oom-*) land in $(FUZZ_DIR)/NAME/ and fail the target;
# the other targets still run. Reproduce one with
# `$(FUZZ_DIR)/fuzz_NAME_lf FILE`.
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= wire safetensors model record tfconfig libsvm
FUZZ_DIR     := $(BUILD)/fuzz
FUZZ_CFLAGS  := -std=c11 -g -O1 -D_GNU_SOURCE -DDP_LIBFUZZER -fsanitize=fuzzer-no-link,address,undefined \
                -fno-sanitize-recover=undefined -fno-omit-frame-pointer -MMD -MP -I. -I$(BUILD)/gen $(PKG_CFLAGS)
fuzz_obj = $(patsubst %.c,$(FUZZ_DIR)/obj/%.o,$(patsubst $(BUILD)/%,%,$(1)))
FUZZ_SRCS_wire        := proto/wire.c $(PROTO_GEN) common/util.c common/checksum.c common/rng.c
FUZZ_SRCS_safetensors := common/safetensors.c common/model.c common/util.c common/rng.c
FUZZ_SRCS_model       := common/model.c common/util.c common/rng.c
FUZZ_SRCS_record      := server/core/record.c server/core/policy.c server/core/shard.c server/core/shard_early.c server/core/shard_dc.c server/core/pool.c \
                           server/core/rows.c kernels/row_optim.c kernels/optim.c common/staleness.c common/opts.c common/model.c common/util.c \
                           common/rng.c common/checksum.c proto/wire.c $(PROTO_GEN)
FUZZ_SRCS_tfconfig    := common/cluster.c common/util.c
FUZZ_SRCS_libsvm      := common/libsvm.c common/util.c
FUZZ_MAXLEN_wire := 4096
FUZZ_MAXLEN_safetensors := 16384
FUZZ_MAXLEN_model := 1030
FUZZ_MAXLEN_record := 16384
FUZZ_MAXLEN_tfconfig := 4096
FUZZ_MAXLEN_libsvm := 4096

$(FUZZ_DIR)/obj/%.o: %.c | $(BUILD)/gen/proto/downpour.pb-c.h $(BUILD)/gen/common/tb_event.pb-c.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@
$(FUZZ_DIR)/obj/gen/%.o: $(BUILD)/gen/%.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@
FUZZ_KNOWN := $(patsubst tests/fuzz/fuzz_%.c,%,$(FUZZ_SRC))
$(foreach t,$(FUZZ_KNOWN),$(eval $(FUZZ_DIR)/fuzz_$(t)_lf: $(FUZZ_DIR)/obj/tests/fuzz/fuzz_$(t).o $(call fuzz_obj,$(FUZZ_SRCS_$(t)))))
# The gcc-built twin ($(BUILD)/tests/fuzz_NAME, run on the corpora by make
# test) links the same sources and nothing more, so a target whose list
# misses a source fails `make tests` already, not only `make fuzz`; plus
# what its own driver uses: common/rng.c for the mutations (tests/fuzz/fuzz.h)
# and FUZZ_DRIVER_SRCS_NAME for --write-seeds.
FUZZ_DRIVER_SRCS_record := server/crew/members.c
$(foreach t,$(FUZZ_KNOWN),$(eval $(BUILD)/tests/fuzz_$(t): $(call obj,tests/fuzz/fuzz_$(t).c common/rng.c \
    $(FUZZ_DRIVER_SRCS_$(t)) $(patsubst $(BUILD)/%,%,$(FUZZ_SRCS_$(t))))))
$(FUZZ_DIR)/fuzz_%_lf:
	$(FUZZ_CC) -fsanitize=fuzzer,address,undefined $^ -o $@ $(PKG_LIBS) -lm -lpthread

# One target's run, as shell text: $(1) = NAME. It never stops the loop, so
# every target runs; a finding is remembered in $$found.
define fuzz_run
d=$(FUZZ_DIR)/$(1); rm -rf $$d/seeds $$d/crash-* $$d/leak-* $$d/timeout-* $$d/oom-*; \
mkdir -p $$d/corpus $$d/seeds || exit 1; \
$(if $(filter wire,$(1)),$(BUILD)/tests/fuzz_wire --write-seeds $$d/seeds,cp tests/fuzz/corpus/$(1)/* $$d/seeds/) || exit 1; \
echo "fuzz: $(1) for $(FUZZ_SECONDS) s"; \
$(FUZZ_DIR)/fuzz_$(1)_lf -max_total_time=$(FUZZ_SECONDS) -max_len=$(or $(FUZZ_MAXLEN_$(1)),4096) -timeout=10 \
    $(if $(wildcard tests/fuzz/$(1).dict),-dict=tests/fuzz/$(1).dict) -artifact_prefix=$$d/ \
    -print_final_stats=1 $$d/corpus $$d/seeds >$$d/fuzz.log 2>&1; rc=$$?; \
grep -E 'Done [0-9]+ runs|stat::number_of_executed_units|stat::new_units|ERROR|SUMMARY|invariant' $$d/fuzz.log; \
if [ $$rc != 0 ] || ls -A $$d | grep -qE '^(crash|leak|timeout|oom)-'; then \
    echo "fuzz: $(1): findings (exit status $$rc) in $$d (log: $$d/fuzz.log)"; found="$$found $(1)"; fi;
endef
fuzz: deps-test
	$(if $(filter-out $(FUZZ_KNOWN),$(FUZZ_TARGETS)),@echo "fuzz: no target $(filter-out $(FUZZ_KNOWN),$(FUZZ_TARGETS)) (known: $(FUZZ_KNOWN))"; exit 1)
	@$(MAKE) --no-print-directory $(patsubst %,$(FUZZ_DIR)/fuzz_%_lf,$(FUZZ_TARGETS)) \
	    $(if $(filter wire,$(FUZZ_TARGETS)),$(BUILD)/tests/fuzz_wire)
	@found=; $(foreach t,$(FUZZ_TARGETS),$(call fuzz_run,$(t))) \
	if [ -n "$$found" ]; then echo "fuzz: findings in:$$found"; exit 1; fi

bench: deps-bench
	@$(MAKE) --no-print-directory tests
	./tests/bench/run.sh

# About 12 minutes: tests/bench/scale.sh (knobs and outputs: its header).
bench-scale: deps-bench
	@$(MAKE) --no-print-directory tests
	BUILD=$(BUILD) ./tests/bench/scale.sh

# ---- make install, make deb ---------------------------------------------
# install: the three binaries, a man page for each made from its --help
# (Debian's help2man), the systemd units with ExecStart pointed at $(BINDIR),
# and the documentation. PREFIX and DESTDIR as usual:
#   make install PREFIX=/opt/downpour DESTDIR=/tmp/stage
# deb: the same under /usr, stripped, packed by dpkg-deb (the control file,
# changelog and copyright are deploy/debian/'s templates); Depends is what
# dpkg-shlibdeps finds the binaries link (a CUDA build's CUDA libraries come
# from NVIDIA, not Debian: they are left out of Depends, and the machine or
# image must have them, as deploy/k8s/Dockerfile's gpu target does).
# DEB_DLOPEN: what the binaries dlopen, which dpkg-shlibdeps cannot see
# (OpenBLAS: kernels/cpu/blas.h).
DEB_DLOPEN := libopenblas0
PREFIX  ?= /usr/local
BINDIR  ?= $(PREFIX)/bin
MANDIR  ?= $(PREFIX)/share/man
DOCDIR  ?= $(PREFIX)/share/doc/downpour
UNITDIR ?= $(PREFIX)/lib/systemd/system
# The client library, its header and pkg-config file, and the Python package
# where Debian's python3 looks (/usr/lib/python3/dist-packages under /usr,
# PREFIX/lib/python3.X/dist-packages elsewhere: /usr/local's is on its path).
LIBDIR  ?= $(PREFIX)/lib
# The CUDA backend module (kernels/backend.h): found from BINDIR as ../lib/downpour.
MODULEDIR ?= $(PREFIX)/lib/downpour
INCDIR  ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
PY3_VER := $(shell /usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
PYDIR   ?= $(if $(filter /usr,$(PREFIX)),/usr/lib/python3/dist-packages,$(PREFIX)/lib/python$(or $(PY3_VER),3)/dist-packages)
DEB_MULTIARCH := $(or $(shell dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null),$(shell $(CC) -print-multiarch 2>/dev/null))
# 0.1+git<commit time>.<hash>: later commits sort later (dpkg --compare-versions).
ifeq ($(origin DP_VERSION),undefined)
  DP_VERSION := 0.1$(shell git log -1 --format=+git%cd.%h --date=format-local:%Y%m%d.%H%M%S 2>/dev/null)
endif
DEB_MAINTAINER ?= Downpour maintainers <downpour@localhost>
DEB_ARCH := $(shell dpkg --print-architecture 2>/dev/null)
DEB_DIR  := $(BUILD)/deb
DEB_FILE := $(BUILD)/downpour_$(DP_VERSION)_$(DEB_ARCH).deb
DEB_CUDA_NOTE := $() This build has the CUDA backend: it needs the CUDA runtime, cuBLAS and cuDNN from NVIDIA.
MAN_PAGES := $(patsubst $(BUILD)/%,$(BUILD)/man/%.1.gz,$(BINS))

man_name_downpour-ps     := Downpour parameter-server shard
man_name_downpour-worker := Downpour worker: trains against the parameter servers, or alone
# The launcher's NAME line comes from its command table (downpour --summary),
# as its usage does, so the man page names every command.
# install and deb install their own tools (deps-install, deps-deb) as run does.
$(BUILD)/man/%.1.gz: $(BUILD)/% | deps-install
	@mkdir -p $(dir $@)
	help2man -N --no-discard-stderr --version-string=$(DP_VERSION) -n "$(or $(man_name_$*),$$($< --summary))" -o $@.tmp $< \
	    && gzip -9n <$@.tmp >$@.gz.tmp && mv $@.gz.tmp $@ && rm -f $@.tmp

.PHONY: install deb
install: all $(MAN_PAGES)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(UNITDIR) $(DESTDIR)$(DOCDIR)/examples
	install -m 755 $(BINS) $(DESTDIR)$(BINDIR)/
	install -m 644 $(MAN_PAGES) $(DESTDIR)$(MANDIR)/man1/
	for u in downpour-ps@.service downpour-worker@.service; do \
	    sed -e 's|/usr/local/bin/|$(BINDIR)/|g' -e 's|/usr/local/share/doc/downpour/|$(DOCDIR)/|g' \
	        deploy/systemd/$$u >$(DESTDIR)$(UNITDIR)/$$u && chmod 644 $(DESTDIR)$(UNITDIR)/$$u || exit 1; done
	install -m 644 README.md ARCHITECTURE.md BENCHMARKS.md $(DESTDIR)$(DOCDIR)/
	install -d $(DESTDIR)$(DOCDIR)/docs
	install -m 644 docs/OPERATIONS.md docs/LAB.md docs/SECURITY.md docs/STREAMS.md docs/NETWORK.md $(DESTDIR)$(DOCDIR)/docs/
	install -m 644 deploy/README.md $(DESTDIR)$(DOCDIR)/README.deploy.md
	install -m 644 deploy/systemd/cluster.env.example deploy/systemd/curve-ps.conf.example \
	    deploy/systemd/curve-worker.conf.example $(DESTDIR)$(DOCDIR)/examples/
	@# libdownpour.so, downpour.h, downpour.pc, the Python package (which
	@# finds the library through the LIBDIR its _install.py records)
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCDIR) $(DESTDIR)$(PKGCONFIGDIR) $(DESTDIR)$(PYDIR)/downpour
	install -m 644 $(DPLIB_SO) $(DESTDIR)$(LIBDIR)/
	ln -sf $(notdir $(DPLIB_SO)) $(DESTDIR)$(LIBDIR)/$(DPLIB_SONAME)
	ln -sf $(DPLIB_SONAME) $(DESTDIR)$(LIBDIR)/libdownpour.so
	install -m 644 worker/lib/downpour.h $(DESTDIR)$(INCDIR)/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' -e 's|@INCDIR@|$(INCDIR)|' \
	    -e 's|@VERSION@|$(DPLIB_VERSION)|' worker/lib/downpour.pc.in >$(DESTDIR)$(PKGCONFIGDIR)/downpour.pc
	install -m 644 $(PY_SRC) $(DESTDIR)$(PYDIR)/downpour/
	echo 'LIBDIR = "$(LIBDIR)"  # written by make install' >$(DESTDIR)$(PYDIR)/downpour/_install.py
	install -m 644 docs/LIBRARY.md $(DESTDIR)$(DOCDIR)/docs/
	install -m 644 examples/torch_fashion_mnist.py $(DESTDIR)$(DOCDIR)/examples/
	@# the CUDA backend, where the programs look for it: BINDIR/../lib/downpour
	$(if $(CUDA_MODULE),install -d $(DESTDIR)$(MODULEDIR) && install -m 644 $(CUDA_MODULE) $(DESTDIR)$(MODULEDIR)/)

deb: all | deps-deb
	rm -rf $(DEB_DIR) $(BUILD)/downpour_*.deb && mkdir -p $(DEB_DIR)/root/DEBIAN $(DEB_DIR)/debian
	$(MAKE) --no-print-directory install DESTDIR=$(abspath $(DEB_DIR)/root) PREFIX=/usr UNITDIR=/lib/systemd/system \
	    LIBDIR=/usr/lib/$(DEB_MULTIARCH)
	strip --strip-unneeded --remove-section=.comment --remove-section=.note $(DEB_DIR)/root/usr/bin/* \
	    $(DEB_DIR)/root/usr/lib/$(DEB_MULTIARCH)/$(notdir $(DPLIB_SO)) \
	    $(if $(CUDA_MODULE),$(DEB_DIR)/root/usr/lib/downpour/$(notdir $(CUDA_MODULE)))
	@# the library's soname for dpkg-shlibdeps of other packages, and ldconfig run on install
	echo 'libdownpour $(DPLIB_API) downpour (>= $(DP_VERSION))' >$(DEB_DIR)/root/DEBIAN/shlibs
	echo 'activate-noawait ldconfig' >$(DEB_DIR)/root/DEBIAN/triggers
	sed -e 's|@VERSION@|$(DP_VERSION)|' -e 's|@MAINTAINER@|$(DEB_MAINTAINER)|' -e "s|@DATE@|$$(date -R)|" \
	    -e "s|@SOURCE@|$$(git describe --always --dirty 2>/dev/null || echo a source tree)|" \
	    deploy/debian/changelog.in | gzip -9n >$(DEB_DIR)/root/usr/share/doc/downpour/changelog.gz
	cp deploy/debian/copyright $(DEB_DIR)/root/usr/share/doc/downpour/copyright
	printf 'Source: downpour\n\nPackage: downpour\nArchitecture: any\n' >$(DEB_DIR)/debian/control
	cd $(DEB_DIR) && dpkg-shlibdeps $(if $(HAVE_CUDA),--ignore-missing-info) -O root/usr/bin/* \
	    root/usr/lib/$(DEB_MULTIARCH)/$(notdir $(DPLIB_SO)) \
	    $(if $(CUDA_MODULE),root/usr/lib/downpour/$(notdir $(CUDA_MODULE))) \
	    | sed -n 's/^shlibs:Depends=\(.*\)/\1, $(DEB_DLOPEN)/p' | tr ',' '\n' | sed 's/^ *//' \
	    | grep -Ev '^(libcudnn|libcublas|libcudart|cuda-|libnvidia|nvidia)' | paste -sd, | sed 's/,/, /g' >depends
	@test -s $(DEB_DIR)/depends || { echo "deb: dpkg-shlibdeps found no dependencies"; exit 1; }
	{ sed -e 's|@VERSION@|$(DP_VERSION)|' -e 's|@ARCH@|$(DEB_ARCH)|' -e 's|@MAINTAINER@|$(DEB_MAINTAINER)|' \
	      -e "s|@INSTALLED_SIZE@|$$(du -sk --exclude=DEBIAN $(DEB_DIR)/root | cut -f1)|" \
	      -e "s|@DEPENDS@|$$(cat $(DEB_DIR)/depends)|" deploy/debian/control.in; \
	  $(if $(HAVE_CUDA),echo '$(DEB_CUDA_NOTE)';) \
	} >$(DEB_DIR)/root/DEBIAN/control
	dpkg-deb --root-owner-group -Zxz --build $(DEB_DIR)/root $(DEB_FILE)

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj $(FUZZ_DIR)/obj -name '*.d' 2>/dev/null)
