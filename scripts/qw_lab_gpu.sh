#!/usr/bin/env bash
# qw_lab_gpu.sh OUT: the wgmma candidate of the quantized expert kernel (issue 11, dev/cuda/qmoe_w.cuh) beside
# the backend's qr_kernel, in one GPU-machine call:
#   1. build; the lab (sm_90a) and the SASS opcode counts of qr_kernel<4,1,3,64> (DIET 1 and 0, with their stage loops'
#      counts per weight stage, scripts/qr_sass_loop.py) and qw_kernel<4,1,3,64> (sass.txt)
#   2. the lab in separate runs (a fault in one run cannot take the others' rows with it), LAB_RUNS (default
#      "3 20 22,23,24,25 21": the backend's version 3, version 20 alone, the others, 21 = LBO/SBO exchanged: its
#      check must fail), at LAB_MS rows per expert and LAB_TS gathered tokens -> lab.md, lab.jsonl
#   3. NCU=1: Nsight Compute on the gathered 256-token gate/up of version NCU_BASE (default 3) and of NCU_V (ncu.txt)
#   4. CEIL=1: dgemma bench --protocol ceiling (ceiling.md, ceiling.jsonl); TESTS=1: tests/test_cuda (tests.txt);
#      ATT=1: the attention lab (versions ATT_V, default 2,5) appended to lab.md; LAB_BITS: the lab's --bits (default 4); SASS=0: no sass.txt (at most 8 files come back); BENCH=1: the 26B checkpoint (mkrandom, in the background from the
#      start) and dgemma bench --protocol vllm --profile (bench.txt, bench.jsonl); BATCH=1 (with BENCH): then
#      --protocol batch --canvases BATCH_B (default 1,2,4,8), appended to bench.txt and bench.jsonl; BENCH_ALT and
#      CEIL_ALT: "V=X W=Y,Z=1" the vllm bench / ceiling protocol again under each space-separated item's settings
#      (commas between one item's), appended; BATCH_ALT=VAR=VALUE: the batch protocol again under that setting; BENCH_8K=1: vllm with an
#      8,192-token prompt, one run (its step time and the device memory it holds, appended); PDL=1: test_cuda
#      and the vllm bench once more with DGEMMA_PDL=0, programmatic dependent launch off (appended)
#   TEST_FILTERS="a b ...": with TESTS=1, only those tests of test_cuda (one process each, TESTS_T seconds each, default
#   300) instead of the whole file; TESTS_ALT="V=X,W=Y:test_a,test_b ...": after them, the named tests again under each
#   space-separated item's settings (appended to tests.txt); STEP_LAB="ARGS": the step-kernel lab
#   (dev/cuda/step_kernels.cu, e.g. "--vocab --reps 20") built and run after the tests (step_lab.md)
#   LAB_BIN=PATH: the lab binary built beforehand (e.g. on the CPU machine: `make CUDA=1 NVDEV= BUILD=build-gpu
#   build-gpu/libdgemma.a`, then lab_build's nvcc line against it), carried in an ignored folder: no lab build here
#   (and, without TESTS, BENCH, CEIL or ATT, no build at all). LAB_RUNS=none: no lab at all (build, runs, SASS).
#   BENCH_DEFS="QR_DIET_TILES=0x1fe QR_DIET_TILES=0x1fe,QR_MINB=5": with BENCH, one more build of dgemma per space-separated item with those
#   compile-time settings (-D, commas between one item's; the macros of src/cuda that are #ifndef-guarded) in build-defK/,
#   made in the background from the start, and the vllm bench with it (appended to bench.txt, bench.jsonl): a backend
#   choice fixed at compile time timed end to end in the same call as the default. DEFS_TESTS=1 (with BENCH_DEFS): each
#   build-defK also makes tests/test_cuda, run after its bench on TEST_FILTERS (default test_quant_experts
#   test_experts_dn_fuse), appended to bench.txt: the outputs under that setting on the GPU.
# Carry .devdeb (and .devdata for BENCH=1).
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/qw_lab_gpu.sh OUT}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv
. scripts/gpu_env.sh
if [ -n "${TESTS:-}${BENCH:-}" ]; then gpu_build /tmp/build.txt || exit 1
elif [ -n "${LAB_BIN:-}" ] && [ -z "${CEIL:-}${ATT:-}" ]; then mkdir -p build # the lab alone: nothing to build here
else make -j"$(nproc)" CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/libdgemma.a > /tmp/build.txt 2>&1 \
  || { tail -30 /tmp/build.txt; exit 1; }; fi
echo "== built $(el)"
[ -n "${BENCH:-}" ] && gpu_mkrandom_bg 8
defs_build() { # K DEFS: build-defK/dgemma with -D for each comma-separated item of DEFS (log /tmp/defs_K.txt); status 1
  # when the build fails (the binary removed first, so that a warm machine's build-defK/dgemma of an earlier call's DEFS
  # is never benched under this call's name)
  rm -f build-def$1/dgemma build-def$1/tests/test_cuda
  nice make -j"$(nproc)" CUDA=1 WERROR= BUILD=build-def$1 XCFLAGS="$XC $(echo "$2" | tr ',' '\n' | sed 's/^/-D/' | tr '\n' ' ')" \
    XLDFLAGS="$XL" build-def$1/dgemma ${DEFS_TESTS:+build-def$1/tests/test_cuda} > /tmp/defs_$1.txt 2>&1 \
    || { echo "build $2 failed"; tail -20 /tmp/defs_$1.txt; return 1; }
}
dpids=(); k=0
if [ -n "${BENCH:-}" ]; then for d in ${BENCH_DEFS:-}; do k=$((k + 1)); defs_build $k "$d" & dpids+=($!); done; fi
if [ -n "${LAB_BIN:-}" ]; then # a lab built elsewhere (same CUDA toolkit): its libraries from here
  rm -f build/moe_quant; cp "$LAB_BIN" build/moe_quant; chmod +x build/moe_quant; export LD_LIBRARY_PATH="$CUL${XL:+:/tmp/dgdeps/usr/lib/x86_64-linux-gnu}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  build/moe_quant --help > /dev/null 2>&1; [ $? -le 2 ] || { echo "LAB_BIN does not run here"; ldd build/moe_quant | grep "not found"; exit 1; }
elif [ "${LAB_RUNS:-}" != none ]; then lab_build > /tmp/lab_build.txt 2>&1 || { tail -30 /tmp/lab_build.txt; exit 1; }; fi
echo "== lab built $(el)"
[ "${LAB_RUNS:-}" = none ] && LAB_RUNS="" && SASS=0 # LAB_RUNS=none: no lab build, no lab run
sass() { # FUNCTION-PREFIX OBJECT: opcode counts of the first matching function, then its SASS
  cuobjdump -sass "$2" 2>&1 | awk -v f="$1" '/Function :/ {on = index($0, f) > 0 && !done; if (on) done = 1} on' > /tmp/s.txt
  echo "# $1 in $2: $(grep -cE '^\s+/\*[0-9a-f]{4}\*/' /tmp/s.txt) instructions; opcode counts (static)"
  grep -oE '^\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P[0-9T] )?[A-Z][A-Z0-9_.]+' /tmp/s.txt | awk '{print $NF}' | sed 's/\..*//' \
    | sort | uniq -c | sort -rn | head -32
}
[ "${SASS:-1}" = 1 ] && { # qr_kernel<4,1,3,64> with the SASS diet (DIET 1) and before it (DIET 0; the backend's runs DIET 1 at QR_DIET_TILES' tile counts, lab version 95 the other)
  cuobjdump -sass build/moe_quant > /tmp/lab.sass 2>&1 # the stage loops' counts per weight stage: scripts/qr_sass_loop.py
  for q in _Z9qr_kernelILi4ELi1ELi3ELi64ELi4ELi2ELi3ELi4ELi2ELin2ELi1ELi2ELi0ELi0ELi0ELi1EE \
           _Z9qr_kernelILi4ELi1ELi3ELi64ELi4ELi2ELi3ELi4ELi2ELin2ELi1ELi2ELi0ELi0ELi0ELi0EE; do
    sass $q build/moe_quant; python3 scripts/qr_sass_loop.py /tmp/lab.sass $q
  done; cp /tmp/s.txt /tmp/sass_qr.txt
  sass _Z9qw_kernelILi4ELi1ELi3ELi64ELi2ELi3ELi3ELi2ELi2ELi0EE build/moe_quant; cp /tmp/s.txt /tmp/sass_qw.txt
  echo; echo "# SASS of qw_kernel<4,1,3,64,2,3,3>"; cat /tmp/sass_qw.txt; echo; echo "# SASS of qr_kernel<4,1,3,64>"; cat /tmp/sass_qr.txt
} > "$OUT/sass.txt" && grep -E "^#|HGMMA|HMMA|FFMA|LOP3" "$OUT/sass.txt" | grep -E "^#|^ +[0-9]+ " | head -40
: > "$OUT/lab.md"; : > "$OUT/lab.jsonl"
for vv in ${LAB_RUNS-3 20 22,23,24,25 21}; do
  timeout 150 build/moe_quant --bits ${LAB_BITS:-4} --versions $vv --ms ${LAB_MS:-1,16} --ts ${LAB_TS:-256} --json /tmp/l.jsonl > /tmp/l.md 2>&1
  echo "lab versions $vv rc $? $(el)"; cat /tmp/l.md >> "$OUT/lab.md"; cat /tmp/l.jsonl >> "$OUT/lab.jsonl"
  grep -E "check|error|fail|\| 4 " /tmp/l.md | head -24
done
if [ -n "${ATT:-}" ]; then # issue 12: the attention lab (dev/cuda/attention.cu), versions ATT_V, appended to lab.md
  nvcc -O2 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Iinclude -Isrc $XC dev/cuda/attention.cu build/libdgemma.a \
    -L"$CUL" $NXL -lcublas -lcudart -o build/attention_lab > /tmp/att_build.txt 2>&1 || tail -20 /tmp/att_build.txt
  timeout 120 build/attention_lab --versions "${ATT_V:-2,5}" > /tmp/att.md 2>&1; echo "attention lab rc $? $(el)"
  grep -E "^\|" /tmp/att.md | head -30; { echo; echo "## attention lab (--versions ${ATT_V:-2,5})"; cat /tmp/att.md; } >> "$OUT/lab.md"
fi
if [ "${NCU:-0}" = 1 ]; then
  : > "$OUT/ncu.txt"
  for v in ${NCU_BASE:-3} ${NCU_V:-22}; do
    echo "#### version $v" >> "$OUT/ncu.txt"
    timeout 100 ncu --section SpeedOfLight --section WarpStateStats --section InstructionStats --section SchedulerStats \
      --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis -k regex:q[rws]_kernel -c 1 \
      build/moe_quant --bits 4 --versions $v --ms none --ts 256 --reps 1 >> "$OUT/ncu.txt" 2>&1
    echo "ncu $v rc $? $(el)"
  done
  grep -E "####|Duration|DRAM Throughput|Issue Slots|Warp Cycles Per Issued|Issued Instructions|Eligible|Registers Per|Achieved Occupancy" "$OUT/ncu.txt" | head -40
fi
if [ -n "${CEIL:-}" ]; then
  timeout 120 build/dgemma bench --device cuda --protocol ceiling --reps 20 -o "$OUT/ceiling.jsonl" > "$OUT/ceiling.md" 2>&1
  echo "ceiling rc $? $(el)"; grep -E "experts_all|moe_gathered" "$OUT/ceiling.md" | grep -E "4-bit|3-bit|2-bit|bf16" | head -30
  for alt in ${CEIL_ALT:-}; do # the ceiling protocol again under other settings (as BENCH_ALT; appended)
    env ${alt//,/ } timeout 120 build/dgemma bench --device cuda --protocol ceiling --reps 20 -o /tmp/ceil_alt.jsonl \
      > /tmp/ceil_alt.md 2>&1; echo "ceiling $alt rc $? $(el)"
    grep -E "experts_all|moe_gathered" /tmp/ceil_alt.md | grep -E "4-bit|3-bit|2-bit|bf16" | head -30
    { echo; echo "## $alt"; cat /tmp/ceil_alt.md; } >> "$OUT/ceiling.md"; cat /tmp/ceil_alt.jsonl >> "$OUT/ceiling.jsonl"
  done
fi
if [ -n "${TESTS:-}" ]; then
  if [ -n "${TEST_FILTERS:-}" ]; then
    : > "$OUT/tests.txt"
    for t in $TEST_FILTERS; do
      DG_TEST_FILTER=$t timeout ${TESTS_T:-300} build/tests/test_cuda >> "$OUT/tests.txt" 2>&1; echo "test_cuda $t rc $? $(el)"
    done
  else
    timeout ${TESTS_T:-300} build/tests/test_cuda > "$OUT/tests.txt" 2>&1; echo "test_cuda rc $? $(el)"
  fi
  for alt in ${TESTS_ALT:-}; do # "V=X,W=Y:test_a,test_b": those tests under those settings (appended)
    for t in $(echo "${alt#*:}" | tr ',' ' '); do
      { echo; echo "## ${alt%%:*} $t"; env $(echo "${alt%%:*}" | tr ',' ' ') DG_TEST_FILTER=$t timeout ${TESTS_T:-300} \
        build/tests/test_cuda 2>&1; } >> "$OUT/tests.txt"; echo "test_cuda ${alt%%:*} $t rc $? $(el)"
    done
  done
  if [ -n "${PDL:-}" ]; then
    { echo; echo "## DGEMMA_PDL=0"; DGEMMA_PDL=0 timeout 200 build/tests/test_cuda 2>&1; } >> "$OUT/tests.txt"; echo "test_cuda DGEMMA_PDL=0 rc $? $(el)"
  fi
  grep -E "^\[  (FAILED|PASSED|  ERROR) |FAIL|largest|^# vocabulary chain|^# down input" "$OUT/tests.txt" | head -40
fi
if [ -n "${STEP_LAB:-}" ]; then # issue 12: the step-kernel lab (e.g. the vocabulary chain's versions, --vocab)
  nvcc -O2 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Iinclude -Isrc $XC dev/cuda/step_kernels.cu build/libdgemma.a \
    -L"$CUL" $NXL -lcublas -lcudart -lcjson -lgomp -o build/step_kernels_lab > /tmp/step_build.txt 2>&1 || tail -20 /tmp/step_build.txt
  timeout ${STEP_LAB_T:-120} build/step_kernels_lab $STEP_LAB > "$OUT/step_lab.md" 2>&1; echo "step lab rc $? $(el)"
  grep -E "vocab chain|^\| (kernel|---)" "$OUT/step_lab.md" | head -30
fi
if [ -n "${BENCH:-}" ]; then
  wait $mk; tail -1 /tmp/mkrandom.log
  timeout 150 build/dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --reps 2 --profile -o "$OUT/bench.jsonl" \
    > "$OUT/bench.txt" 2>&1; echo "bench rc $? $(el)"; tail -24 "$OUT/bench.txt"
  if [ -n "${PDL:-}" ]; then # the same bench without programmatic dependent launch (appended)
    DGEMMA_PDL=0 timeout 150 build/dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --reps 2 --profile \
      -o /tmp/bench_pdl.jsonl > /tmp/bench_pdl.txt 2>&1; echo "bench DGEMMA_PDL=0 rc $? $(el)"; tail -24 /tmp/bench_pdl.txt
    { echo; echo "## DGEMMA_PDL=0"; cat /tmp/bench_pdl.txt; } >> "$OUT/bench.txt"; cat /tmp/bench_pdl.jsonl >> "$OUT/bench.jsonl"
  fi
  if [ -n "${BENCH_8K:-}" ]; then # issue 12: an 8K prompt (the step after 8K, and the device memory it holds)
    timeout 150 build/dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --prompt-tokens 8192 --reps 1 \
      -o /tmp/bench_8k.jsonl > /tmp/bench_8k.txt 2>&1; echo "bench 8K rc $? $(el)"; grep -E "^\| vllm|device memory" /tmp/bench_8k.txt
    { echo; echo "## --prompt-tokens 8192"; cat /tmp/bench_8k.txt; } >> "$OUT/bench.txt"; cat /tmp/bench_8k.jsonl >> "$OUT/bench.jsonl"
  fi
  for alt in ${BENCH_ALT:-}; do # the same bench under other settings (appended): items apart by spaces, each item's
    # settings by commas, e.g. BENCH_ALT="DGEMMA_ROUTE=fused DGEMMA_ATTN=0,DGEMMA_GRAPHS=0"
    env ${alt//,/ } timeout 150 build/dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --reps 2 --profile \
      -o /tmp/bench_alt.jsonl > /tmp/bench_alt.txt 2>&1; echo "bench $alt rc $? $(el)"; tail -24 /tmp/bench_alt.txt
    { echo; echo "## $alt"; cat /tmp/bench_alt.txt; } >> "$OUT/bench.txt"; cat /tmp/bench_alt.jsonl >> "$OUT/bench.jsonl"
  done
  k=0
  for d in ${BENCH_DEFS:-}; do # the vllm bench with each compile-time variant's build (appended)
    k=$((k + 1)); wait "${dpids[$((k - 1))]}" && [ -x build-def$k/dgemma ] || { echo "bench $d: no build $(el)"; continue; }
    echo "built $d $(el)"
    timeout 150 build-def$k/dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --reps 2 --profile \
      -o /tmp/bench_def.jsonl > /tmp/bench_def.txt 2>&1; echo "bench -D $d rc $? $(el)"; tail -24 /tmp/bench_def.txt
    { echo; echo "## -D $d (build-def$k)"; cat /tmp/bench_def.txt; } >> "$OUT/bench.txt"; cat /tmp/bench_def.jsonl >> "$OUT/bench.jsonl"
    [ -n "${DEFS_TESTS:-}" ] && for t in ${TEST_FILTERS:-test_quant_experts test_experts_dn_fuse}; do
      { echo; echo "## -D $d test_cuda $t"; DG_TEST_FILTER=$t timeout ${TESTS_T:-300} build-def$k/tests/test_cuda 2>&1; } \
        > /tmp/defs_test.txt; echo "test_cuda -D $d $t rc $? $(el)"; grep -E "^\[  (PASSED|FAILED) " /tmp/defs_test.txt
      cat /tmp/defs_test.txt >> "$OUT/bench.txt"
    done
  done
  if [ -n "${BATCH:-}" ]; then # issue 14: the stacked pass of B canvases (appended to bench.txt / bench.jsonl)
    timeout "${BATCH_T:-200}" build/dgemma bench -m /tmp/dg26b --device cuda --protocol batch --canvases "${BATCH_B:-1,2,4,8}" \
      --reps "${BATCH_REPS:-2}" -o /tmp/batch.jsonl > /tmp/batch.txt 2>&1; echo "batch rc $? $(el)"
    tail -16 /tmp/batch.txt; cat /tmp/batch.txt >> "$OUT/bench.txt"; cat /tmp/batch.jsonl >> "$OUT/bench.jsonl"
    if [ -n "${BATCH_ALT:-}" ]; then # e.g. BATCH_ALT=DGEMMA_STACK_DENSE=1 (the dense products over the whole stack)
      env "$BATCH_ALT" timeout "${BATCH_T:-200}" build/dgemma bench -m /tmp/dg26b --device cuda --protocol batch \
        --canvases "${BATCH_B:-1,2,4,8}" --reps "${BATCH_REPS:-2}" -o /tmp/batch_alt.jsonl > /tmp/batch_alt.txt 2>&1
      echo "batch $BATCH_ALT rc $? $(el)"; tail -16 /tmp/batch_alt.txt
      { echo; echo "## $BATCH_ALT"; cat /tmp/batch_alt.txt; } >> "$OUT/bench.txt"; cat /tmp/batch_alt.jsonl >> "$OUT/bench.jsonl"
    fi
  fi
fi
echo "== done $(el)"
