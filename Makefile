# dgemma Makefile: small on purpose (pattern rules into build/, -MMD deps).
#
#   make            library + CLI (build/dgemma)
#   make test       setup check, build, run every test (normal + ASan/UBSan); the three builds and
#                   the test binaries run TEST_JOBS at a time (default: the cores)
#   make run        generate with the bundled model
#   make asan       sanitizer build of the CLI and tests in build-asan/
#   make fuzz       libFuzzer harnesses of every parser (fuzz/, clang, ASan+UBSan) in
#                   build-fuzz/, each run FUZZ_SECONDS (default 60); FUZZERS=... picks some
#   make clean
#
# CUDA is optional and detected; the CPU build never needs nvcc.
#   CUDA=1|0        force the CUDA backend on or off (default: on if nvcc is found)
#   NVCC=PATH       the nvcc to use (default: nvcc on the PATH, else /usr/local/cuda/bin/nvcc)
#   CUDA_LIBDIR=DIR where libcudart.so and libcublas.so are (default: asked of nvcc;
#                   without them the default is CUDA=0)
#   CUDA_ARCH=...   nvcc -gencode flags (default since session 25: sm_90a code + compute_90 PTX: a Hopper GPU
#                   runs the sm_90a SASS, where the wgmma kernels run (the passes' attention version 15,
#                   DGEMMA_WL=1); another GPU JIT-compiles the compute_90 PTX, where they are never selected
#                   (src/cuda/qmoe_wl.cu cuda_wg_available); the default before: compute_90,code=sm_90)
#   NVDEV=-G        extra nvcc flags (device code); `make test` on a machine without a GPU sets -G
#                   (TEST_NVDEV): every CUDA source is still compiled (cicc and ptxas: compile
#                   errors are caught), without device optimization, ~5x less nvcc time; the
#                   kernels cannot run there anyway. A change of nvcc flags rebuilds the CUDA objects.
#   XCFLAGS, XLDFLAGS  extra include/library flags (e.g. cjson/cmocka unpacked under a prefix)
#   WERROR=         warnings stay warnings (another compiler version on another machine)
# The sanitizer build of `make test` is CPU-only (CUDA=0): its CUDA tests skip.

CC      ?= cc
OPT     ?= -O2 -g
SAN     ?=
XCFLAGS ?=
XLDFLAGS ?=
WERROR  ?= -Werror
CFLAGS  := $(OPT) $(SAN) -std=c11 -D_GNU_SOURCE -Wall -Wextra $(WERROR) -Wno-unused-parameter \
           -fopenmp -Iinclude -Isrc -MMD -MP $(XCFLAGS)
LDLIBS  := $(XLDFLAGS) -lcjson -lm -fopenmp $(SAN)
BUILD   ?= build

# nvcc finds its headers and libraries from the path it was started by, so a
# symlink (/usr/local/bin/nvcc -> the toolkit's) is resolved first.
ifeq ($(origin NVCC),undefined)
NVCC      := $(shell n=$$(command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; }) && \
                test -n "$$n" && readlink -f "$$n")
endif
# Where the CUDA runtime and cuBLAS live: ask nvcc (its --dryrun prints the -L
# directories it links with), then the usual places. nvcc without libcudart.so
# and libcublas.so next to it builds the CPU-only library unless CUDA=1 says
# otherwise (a CI machine had nvcc at /usr/local/bin and no /usr/local/lib64).
CUDA_LIBDIRS := $(if $(NVCC),$(shell $(NVCC) --dryrun -x cu -o /dev/null /dev/null 2>&1 | \
                  sed -n 's/^#[$$] LIBRARIES=//p' | tr ' "' '\n\n' | sed -n 's/^-L//p' | grep -v '/stubs$$') \
                  $(patsubst %/bin/nvcc,%/lib64,$(NVCC)) /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu)
CUDA_LIBDIR  ?= $(firstword $(foreach d,$(CUDA_LIBDIRS),$(if $(and $(wildcard $(d)/libcudart.so),$(wildcard $(d)/libcublas.so)),$(realpath $(d)))))
CUDA      ?= $(if $(and $(NVCC),$(CUDA_LIBDIR)),1,0)
CUDA_ARCH ?= -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_90,code=compute_90
TEST_NVDEV ?= $(if $(wildcard /dev/nvidia0),,-G)
# make test's main build: NVDEV where given, else TEST_NVDEV; only its sub-make compiles with it (set as NVDEV in
# the top-level make too, it rewrote $(BUILD)/.nvflags there, and the next `make run` rebuilt every CUDA object)
TEST_NVDEV_USE := $(if $(filter undefined,$(origin NVDEV)),$(TEST_NVDEV),$(NVDEV))
NVDEV     ?=
NVFLAGS   := -O2 -g $(NVDEV) -std=c++17 $(CUDA_ARCH) -Iinclude -Isrc -MMD -MP -Xcompiler -Wall \
             -DDG_CUDA_ARCHS='"$(subst -gencode=arch=,,$(CUDA_ARCH))"' $(XCFLAGS)

# Per-ISA kernel files get their own flags; the code dispatches at run time.
ISA_avx2   := -mavx2 -mfma -mf16c
ISA_avx512 := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c
# -falign-functions=64: the avx512lp tiles each start on a 64-byte line, so that their hot loops sit where they sat
# whatever the size of the code before them: d2c7444 grew vnni_tiles by 0x117 bytes, which moved ttilep_4_8_4x4 and
# tprep_4_8 by 32 bytes within their lines, and gate/up [1408, 2816] M = 8 (code it does not touch) went from
# 0.194-0.205 to 0.272-0.286 ms in most processes (-t 1, 2-core Zen 5; docs/results/cpu-s27/m17_ab_m8_*).
ISA_avx512lp := $(ISA_avx512) -mavx512bf16 -mavx512vnni -falign-functions=64
ISA_avx2lp := $(ISA_avx2)

.DEFAULT_GOAL := all
# The CUDA backend (src/cuda/*.cu and src/backend/device.c, its table: src/backend/backend.h) is a plugin,
# $(BUILD)/libdgemma_cuda.so, linked with cudart and cuBLAS (or, EMU=1, the CPU emulation) and
# opened with dlopen only when a CUDA device is asked for (src/backend/backend_select.c): the CLI and the
# tests link neither CUDA library, so a CPU run never maps them. Its objects are also in
# libdgemma.a for the kernel labs (dev/cuda), which link them directly.
SRC     := $(filter-out src/backend/device.c,$(wildcard src/*/*.c))
OBJ     := $(patsubst %.c,$(BUILD)/%.o,$(SRC))
CUDA_BACKEND := $(if $(filter 1,$(EMU) $(CUDA)),1,0)
PLUGIN  :=
ifeq ($(CUDA_BACKEND),1)
PLUGIN  := $(BUILD)/libdgemma_cuda.so
OBJ     += $(BUILD)/src/backend/device.o
$(BUILD)/src/backend/device.o: CFLAGS += -fPIC
$(BUILD)/src/backend/backend_select.o: CFLAGS += -DDG_HAVE_CUDA -DDG_CUDA_PLUGIN_DIR='"$(abspath $(BUILD))"'
LDLIBS  += -rdynamic -ldl
endif
# Whether $(BUILD) has the CUDA plugin, rewritten when it changes, so the objects that depend on it
# are rebuilt.
CUDASTAMP := $(BUILD)/.cuda_backend
ifneq ($(file <$(CUDASTAMP)),$(CUDA_BACKEND) plugin)
$(shell mkdir -p $(BUILD))
$(file >$(CUDASTAMP),$(CUDA_BACKEND) plugin)
endif
$(BUILD)/src/backend/backend_select.o $(BUILD)/src/backend/device.o: $(CUDASTAMP)
ifeq ($(EMU),1) # the CUDA sources on the CPU emulation of dev/cuda_emu (no GPU, no nvcc needed)
CUSRC   := $(wildcard src/cuda/*.cu)
CUOBJ   := $(patsubst %.cu,$(BUILD)/%.o,$(CUSRC)) $(BUILD)/dev/cuda_emu/emu.o
PLUGIN_LIBS :=
CUCOMPILE = $(CXX) -x c++ -std=c++17 $(OPT) -fPIC -fopenmp -Wall -Wno-unknown-pragmas -Idev/cuda_emu/include -Idev/cuda_emu \
            -include emu.h -Iinclude -Isrc -MMD -MP $(XCFLAGS)
$(CUOBJ): $(CUDASTAMP)
else ifeq ($(CUDA),1)
CUSRC   := $(wildcard src/cuda/*.cu)
CUOBJ   := $(patsubst %.cu,$(BUILD)/%.o,$(CUSRC))
ifeq ($(CUDA_LIBDIR),)
$(error CUDA=1 but libcudart.so and libcublas.so were not found (looked in: $(CUDA_LIBDIRS)); set CUDA_LIBDIR=DIR or CUDA=0)
endif
PLUGIN_LIBS := -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcublasLt -lcublas -lcudart
NVFLAGS += -Xcompiler -fPIC
CUCOMPILE = $(NVCC) $(NVFLAGS)
# The nvcc flags the CUDA objects of $(BUILD) were compiled with: rewritten when they change
# (e.g. NVDEV=-G of `make test` without a GPU, then a plain `make`), so the objects are rebuilt.
NVSTAMP := $(BUILD)/.nvflags
ifneq ($(file <$(NVSTAMP)),$(NVFLAGS))
$(shell mkdir -p $(BUILD))
$(file >$(NVSTAMP),$(NVFLAGS))
endif
$(CUOBJ): $(NVSTAMP)
endif
OBJ     += $(CUOBJ)
LIB     := $(BUILD)/libdgemma.a
CLI     := $(BUILD)/dgemma
TESTSRC := $(wildcard tests/test_*.c)
TESTS   := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TESTSRC))
TESTLIB := -lcmocka

.PHONY: all test run asan clean setup check-deps emu-test lab fuzz fuzz-build test-build test-build-main test-build-asan
all: $(CLI) $(PLUGIN)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(ISA_$(lastword $(subst _, ,$(basename $(notdir $<))))) -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(CUCOMPILE) -c $< -o $@

$(BUILD)/dev/cuda_emu/emu.o: dev/cuda_emu/emu.cpp
	@mkdir -p $(dir $@)
	$(CUCOMPILE) -c $< -o $@

$(LIB): $(OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

ifneq ($(PLUGIN),)
$(PLUGIN): $(CUOBJ) $(BUILD)/src/backend/device.o
	$(CXX) -shared -fopenmp -o $@ $^ $(PLUGIN_LIBS)
# the tests and the CLI open it at run time
$(TESTS) $(CLI): | $(PLUGIN)
# The test support library of the CUDA backend: its test-only entry points (tests/support/cuda_entry.cu,
# one kernel on host data each), linked against the plugin whose upload and kernel launchers they call,
# and opened by tests/test_cuda only (nothing of it is in the plugin or libdgemma.a).
TESTPLUGIN := $(BUILD)/libdgemma_cuda_test.so
TESTPLUGIN_OBJ := $(BUILD)/tests/support/cuda_entry.o
$(TESTPLUGIN_OBJ): $(if $(filter 1,$(EMU)),$(CUDASTAMP),$(NVSTAMP))
$(TESTPLUGIN): $(TESTPLUGIN_OBJ) $(PLUGIN)
	$(CXX) -shared -fopenmp -o $@ $< -L$(BUILD) -l:libdgemma_cuda.so -Wl,-rpath,'$$ORIGIN' $(PLUGIN_LIBS)
$(BUILD)/tests/test_cuda: private CFLAGS += -DDG_CUDA_TEST_LIB='"$(abspath $(TESTPLUGIN))"'
$(BUILD)/tests/test_cuda: | $(TESTPLUGIN)
endif

# `dgemma serve` needs libmicrohttpd (scripts/setup.sh installs libmicrohttpd-dev); without its
# header the command is built as a stub that says it is unavailable. tests/test_serve's HTTP tests
# also need libcurl (libcurl4-openssl-dev) and skip with a reason without it. MHD=0/CURL=0 force off.
HAVE_HDR = $(shell printf '\043include <$(1)>\n' | $(CC) $(XCFLAGS) -E -x c - >/dev/null 2>&1 && echo 1 || echo 0)
MHD     ?= $(call HAVE_HDR,microhttpd.h)
CURL    ?= $(call HAVE_HDR,curl/curl.h)
# (cliarg: the number parsing and quoting of the command line, used by serve.c and dgemma.c)
SERVEOBJ := $(patsubst %,$(BUILD)/tools/%.o,serve serve_req serve_page cliarg)
ifeq ($(MHD),1)
$(BUILD)/tools/serve.o: CFLAGS += -DDG_HAVE_MHD
LDLIBS  += -lmicrohttpd
endif

# The live canvas page, embedded as a C string (backslashes and quotes escaped, one literal per line).
$(BUILD)/tools/serve_page.c: tools/serve_page.html
	@mkdir -p $(dir $@)
	{ echo '/* generated from tools/serve_page.html by the Makefile */'; echo 'const char dg_serve_page_html[] ='; \
	  sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$$/\\n"/' $<; echo ';'; } > $@
$(BUILD)/tools/serve_page.o: $(BUILD)/tools/serve_page.c
	$(CC) $(CFLAGS) -c $< -o $@

CLIOBJ  := $(patsubst %,$(BUILD)/tools/%.o,dgemma eval gsm8k bench ceiling qreport outfile) $(SERVEOBJ)
# Line editing for `dgemma chat` from libedit (Debian libedit-dev, installed by scripts/setup.sh);
# without its header the chat reads plain lines. EDIT=0|1 forces it.
EDIT    ?= $(if $(wildcard /usr/include/editline/readline.h),1,0)
$(BUILD)/tools/dgemma.o: CFLAGS += $(if $(filter 1,$(EDIT)),-DDG_HAVE_LIBEDIT)
$(CLI): $(CLIOBJ) $(LIB)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS) $(if $(filter 1,$(EDIT)),-ledit)

$(BUILD)/tests/test_serve: tests/test_serve.c $(SERVEOBJ) $(LIB) tests/testutil.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(if $(filter 1,$(CURL)),-DDG_HAVE_CURL) -Itests -Itools -o $@ $< $(SERVEOBJ) $(LIB) $(TESTLIB) \
	  $(LDLIBS) $(if $(filter 1,$(CURL)),-lcurl)

# test_eval and test_bench also link the CLI's GSM8K harness and bench code.
TOOLOBJ := $(patsubst %,$(BUILD)/tools/%.o,gsm8k bench ceiling outfile)
$(BUILD)/tests/test_eval $(BUILD)/tests/test_bench: $(BUILD)/tests/%: tests/%.c $(TOOLOBJ) $(LIB) tests/testutil.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -Itools -o $@ $< $(TOOLOBJ) $(LIB) $(TESTLIB) $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(LIB) tests/testutil.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(LIB) $(TESTLIB) $(LDLIBS)

setup:
	@scripts/setup.sh

# The README's test command. Runs setup (dependencies, tokenizer fetch) first, then the three
# builds (normal, ASan/UBSan, fuzz harnesses) side by side under one job server of TEST_JOBS
# (or the -j given to make), then every test binary, TEST_JOBS at a time (scripts/run_tests.sh;
# the output in the same order as one at a time). Without a GPU (no /dev/nvidia0) the CUDA sources
# are compiled with TEST_NVDEV (-G, see NVDEV): checked by the compiler, never run there.
TEST_JOBS  ?= $(shell nproc 2>/dev/null || echo 2)
# -j only when make was not given one (a sub-make of `make -jN test` shares its job server)
TEST_J      = $(if $(findstring jobserver,$(MAKEFLAGS))$(filter -j%,$(MAKEFLAGS)),,-j$(TEST_JOBS))
# With -G the main build of the tests goes to build-test/, so that `make test` and `make` / `make run`
# never rebuild each other's CUDA objects (build/ keeps the optimized kernels).
TEST_BUILD  = $(if $(and $(filter 1,$(CUDA)),$(strip $(TEST_NVDEV_USE))),build-test,$(BUILD))
test: setup
	@$(MAKE) --no-print-directory $(TEST_J) NVDEV="$(TEST_NVDEV_USE)" BUILD=$(TEST_BUILD) test-build
	@FUZZ_BUILD=build-fuzz FUZZ_TEST_SECONDS=$(FUZZ_TEST_SECONDS) TEST_JOBS=$(TEST_JOBS) FUZZ_JOBS=$(TEST_JOBS) \
	  scripts/run_tests.sh $(TEST_BUILD) build-asan

test-build: test-build-main test-build-asan fuzz-build
test-build-main:
	@$(MAKE) --no-print-directory all $(TESTS)
test-build-asan:
	@$(MAKE) --no-print-directory BUILD=build-asan CUDA=0 OPT="-O1 -g" \
	  SAN="-fsanitize=address,undefined,float-cast-overflow -fno-omit-frame-pointer -fno-sanitize-recover=undefined,float-cast-overflow" \
	  build-asan/dgemma $(patsubst $(BUILD)/%,build-asan/%,$(TESTS))

# ---- fuzzing (fuzz/README.md) ----------------------------------------------
# The parsers' sources built with clang's coverage instrumentation and ASan +
# UBSan into build-fuzz/ (no OpenMP: the parsers do not use it), one binary per
# fuzz/fuzz_*.c, and the seed corpora and dictionaries of fuzz/seeds.py under
# build-fuzz/seeds/. `make test` runs each harness FUZZ_TEST_SECONDS over its
# seeds and fuzz/regress/; `make fuzz` FUZZ_SECONDS each, growing
# build-fuzz/corpus/<name>, logs in build-fuzz/logs/, crashes in build-fuzz/crash/.
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_TEST_SECONDS ?= 3
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_CFLAGS  := -O1 -g $(FUZZ_SAN) -std=c11 -D_GNU_SOURCE -Wall -Wextra $(WERROR) -Wno-unused-parameter \
                -Iinclude -Isrc -MMD -MP $(XCFLAGS)
FUZZ_LIBSRC  := src/base/dtype.c src/base/dg_error.c src/base/dg_io.c src/base/dg_json.c src/io/safetensors.c src/io/config.c \
                src/io/tokenizer.c src/io/chat.c src/io/quant.c
FUZZ_LIBOBJ  := $(patsubst %.c,build-fuzz/%.o,$(FUZZ_LIBSRC))
FUZZ_ALL     := $(patsubst fuzz/%.c,%,$(wildcard fuzz/fuzz_*.c))
FUZZERS      ?= $(FUZZ_ALL)
FUZZ_BINS    := $(patsubst %,build-fuzz/%,$(FUZZ_ALL))

build-fuzz/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

build-fuzz/fuzz_%: fuzz/fuzz_%.c fuzz/fuzz.h $(FUZZ_LIBOBJ)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -Itools -fsanitize=fuzzer -o $@ $< $(filter build-fuzz/tools/%.o,$^) $(FUZZ_LIBOBJ) \
	  $(XLDFLAGS) -lcjson -lm
# harnesses of the CLI's own readers also link their tools/ source
build-fuzz/fuzz_gsm8k: build-fuzz/tools/gsm8k.o
build-fuzz/fuzz_serve_req: build-fuzz/tools/serve_req.o

build-fuzz/seeds/.done: fuzz/seeds.py $(wildcard tests/fixtures/golden/*/*.json tests/fixtures/gsm8k/*.jsonl models/dgemma-small/*.json) \
                        tests/fixtures/tokenizer/small_golden.json
	@rm -rf build-fuzz/seeds && mkdir -p build-fuzz/seeds
	python3 fuzz/seeds.py build-fuzz/seeds
	@touch $@

.SECONDARY: $(FUZZ_LIBOBJ) build-fuzz/tools/gsm8k.o build-fuzz/tools/serve_req.o
fuzz-build: $(FUZZ_BINS) build-fuzz/seeds/.done

fuzz: fuzz-build
	scripts/fuzz.sh build-fuzz $(FUZZ_SECONDS) grow $(FUZZERS)

# The main job: generation with the bundled model (needs only the Debian packages).
# PROMPT reaches the program through the environment, so any text is safe: make would expand a PROMPT
# given on its command line when exporting it ($5 gone, $(shell ...) run), so the override keeps its
# text as typed ($(value ...): unexpanded; := : never expanded again; tests/python/test_make_prompt.py).
PROMPT ?= Sam has 23 apples. He buys 14 more apples. How many apples does Sam have now?
override PROMPT := $(value PROMPT)
export PROMPT
# dgemma itself makes OMP_WAIT_POLICY=passive the default (idle OpenMP threads
# sleep instead of spinning, which made a generation 15-20x slower on a shared
# machine: docs/eval.md). THREADS=N passes -t N.
run:
	@scripts/setup.sh --deps-only
	@$(MAKE) --no-print-directory $(TEST_J) all
	@echo "note: the bundled model (models/dgemma-small, 9.9 M parameters) is a test and demo model of the"
	@echo "      DiffusionGemma architecture: it solves the generated arithmetic word problems it was trained on"
	@echo "      (about 99% of held-out 1-2 step problems, 83% of 3-4 step: docs/small-model.md) and knows"
	@echo "      nothing else. dgemma run -m DIR uses a real checkpoint."
	$(CLI) run $(if $(THREADS),-t $(THREADS)) -p "$$PROMPT"

# The CUDA backend's kernels on the CPU emulation (dev/cuda_emu): correctness of
# indexing, masks and reductions against the CPU path, without a GPU. Slow.
# The kernel lab of the quantized MoE (dev/cuda/moe_quant.cu; runs on a GPU: scripts/moe_lab_gpu.sh).
lab: $(LIB)
	$(if $(filter 1,$(CUDA)),,$(error make lab needs the CUDA build (nvcc and libcudart/libcublas)))
	$(NVCC) -O2 -std=c++17 $(CUDA_ARCH) -Iinclude -Isrc $(XCFLAGS) dev/cuda/moe_quant.cu $(LIB) -L$(CUDA_LIBDIR) \
	  -lcublas -lcudart -lcjson -lgomp -o $(BUILD)/moe_quant

emu-test:
	@$(MAKE) --no-print-directory BUILD=build-emu EMU=1 CUDA=0 OPT="-O2 -g" build-emu/dgemma build-emu/tests/test_cuda
	build-emu/tests/test_cuda

clean:
	rm -rf build build-test build-asan build-emu build-fuzz

-include $(OBJ:.o=.d) $(TESTPLUGIN_OBJ:.o=.d) $(CLIOBJ:.o=.d) $(FUZZ_LIBOBJ:.o=.d) $(FUZZ_BINS:=.d) build-fuzz/tools/gsm8k.d build-fuzz/tools/serve_req.d
