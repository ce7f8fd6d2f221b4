# dgemma Makefile: small on purpose (pattern rules into build/, -MMD deps).
#
#   make            library + CLI (build/dgemma)
#   make test       setup check, build, run every test (normal + ASan/UBSan)
#   make run        generate with the bundled model
#   make asan       sanitizer build of the CLI and tests in build-asan/
#   make clean
#
# CUDA is optional and detected; the CPU build never needs nvcc.

CC      ?= cc
OPT     ?= -O2 -g
SAN     ?=
CFLAGS  := $(OPT) $(SAN) -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wno-unused-parameter \
           -fopenmp -Iinclude -Isrc -MMD -MP
LDLIBS  := -lcjson -lm -fopenmp $(SAN)
BUILD   ?= build

# Per-ISA kernel files get their own flags; the code dispatches at run time.
ISA_avx2   := -mavx2 -mfma -mf16c
ISA_avx512 := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c

SRC     := $(wildcard src/*.c) $(wildcard src/cpu/*.c)
OBJ     := $(patsubst %.c,$(BUILD)/%.o,$(SRC))
LIB     := $(BUILD)/libdgemma.a
CLI     := $(BUILD)/dgemma
TESTSRC := $(wildcard tests/test_*.c)
TESTS   := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TESTSRC))
TESTLIB := -lcmocka

.PHONY: all test run asan clean setup check-deps
all: $(CLI)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(ISA_$(lastword $(subst _, ,$(basename $(notdir $<))))) -c $< -o $@

$(LIB): $(OBJ)
	@mkdir -p $(dir $@)
	ar rcs $@ $^

CLIOBJ  := $(patsubst %,$(BUILD)/tools/%.o,dgemma eval gsm8k bench qreport)
$(CLI): $(CLIOBJ) $(LIB)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# test_eval also links the CLI's model-independent GSM8K harness and bench helpers.
$(BUILD)/tests/test_eval: tests/test_eval.c $(BUILD)/tools/gsm8k.o $(BUILD)/tools/bench.o $(LIB) tests/testutil.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -Itools -o $@ $< $(BUILD)/tools/gsm8k.o $(BUILD)/tools/bench.o $(LIB) $(TESTLIB) $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(LIB) tests/testutil.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(LIB) $(TESTLIB) $(LDLIBS)

setup:
	@scripts/setup.sh

# The README's test command. Runs setup (dependencies, tokenizer fetch) first.
test: setup
	@$(MAKE) --no-print-directory all $(TESTS)
	@$(MAKE) --no-print-directory BUILD=build-asan OPT="-O1 -g" \
	  SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	  build-asan/dgemma $(patsubst $(BUILD)/%,build-asan/%,$(TESTS))
	@scripts/run_tests.sh $(BUILD) build-asan

# The main job: generation with the bundled model (needs only the Debian packages).
# PROMPT reaches the program through the environment, so any text is safe.
PROMPT ?= Sam has 23 apples. He buys 14 more apples. How many apples does Sam have now?
export PROMPT
run:
	@scripts/setup.sh --deps-only
	@$(MAKE) --no-print-directory all
	$(CLI) run -p "$$PROMPT"

clean:
	rm -rf build build-asan

-include $(OBJ:.o=.d) $(CLIOBJ:.o=.d)
