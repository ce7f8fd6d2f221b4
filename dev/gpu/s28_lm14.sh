#!/bin/bash
# Session 28's call for issues 14 and 12 (helper lm14): the 4-bit g64 expert products at 32-128 rows per expert, lab
# versions 130-133 (dev/cuda/qr_lm_lab.cuh) beside the backend's kernel (50) and the large-M wgmma kernel 121 (not
# word-equal: a reference only). One command, carry `.devdeb`, default kind (H100); under 150 s on a warm machine
# (the lab's compile ~40-80 s, each lab run ~20-40 s):
#   1. `make -j12 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/libdgemma.a`: s27_tl11.sh's make line (after any
#      default build this rebuilds nothing);
#   2. the lab with -DLAB_ONLY_FG -DLAB_LM (s27_tl11.sh's narrow build plus 120-124 and 130-133), sm_90a,
#      -Xptxas -v: ptxas.txt gets the registers and spills of qr_lm_kernel (130, 131), qr_lm8_kernel (132, 133) and
#      qr_kernel's 4-bit g64 instances at 4, 5 and 8 n-tiles (version 50 at these rows), then the stage loops of
#      qr_lm8_kernel and qr_lm_kernel (scripts/qr_sass_loop.py: instructions per weight stage; an LDL/STL there is
#      a spill inside a loop);
#   3. `moe_quant --bits 4 --versions 50,121,130,131,132,133 --ms 16,32,64,128 --ts 1024,2048 --reps 5`, twice if
#      the call's time allows (lab.txt, lab2.txt): every 130-133 row checked against the CPU and word for word against
#      version 50 ("ok, = v50").
# Guards: the lab's compile at most 200 s; each lab run at most 60 s, the second only with >= 70 s left of the call
# and >= 30 s left of 145 s since the start (then capped there); every timeout capped at the call's limit (DG_CALL_S,
# scripts/gpu_env.sh).
#
# The rule (written before any GPU run; docs/cuda.md "Session 28 (helper lm14)"):
#  (a) a 130-133 row that is not "ok, = v50" is a bug to fix before any of its times counts.
#  (b) a version is the candidate for the backend (a later session's change in src/, qr_launch_bits and the grid) only
#      if, in every run, at uniform M 64 and M 128 and gathered T 1024 and T 2048, for gate_up and for down, its median
#      is under version 50's with min-max ranges apart, and at uniform M 16 and M 32 its median is at most 2 % over
#      50's; of several, the one with the smallest sum of medians over the M 64, M 128, T 1024 and T 2048 rows.
#  (c) what the rows say about the diagnosis: 132 (16 warps per SM) more than 10 % under 133 (the same kernel and
#      words, registers for 8 warps per SM) at uniform M 64 (both products, both runs) confirms that the products at
#      these rows are latency-bound at 8 warps per SM (the lever: warps per SM); if not, the diagnosis is wrong and the
#      next call is Nsight Compute's stall reasons on version 50 at uniform M 64. 130 and
#      131 against 50 at gathered T 1024 / 2048 measure the fitted passes (expected: 10-25 % fewer cycles, by the
#      columns computed: 1.454 -> 1.073 and 1.237 -> 1.039 per real row), 130 against 131 the split blocks.
#  121 is not word-equal to 50 (the weights rounded to bf16): never a candidate here, a reference for the speed only.
# Files back (5 at most): log.txt, ptxas.txt, lab.txt, lab2.txt.
# Usage: bash dev/gpu/s28_lm14.sh $OUT
O=${1:?usage: dev/gpu/s28_lm14.sh OUT}; mkdir -p "$O"
. scripts/gpu_env.sh
A="-gencode=arch=compute_90a,code=sm_90a"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee -a "$O/log.txt"
git log -1 --format='%h %s' 2>/dev/null | cut -c1-100 >> "$O/log.txt"
mkdir -p build-lm
# LAB_PRE=1: the lead's combined call (dev/gpu/s28_final.sh) compiled the lab object already, with this command
if [ -n "$LAB_PRE" ] && [ -s build-lm/moe_quant.o ]; then lp=; rm -f build-lm/moe_quant; else
rm -f build-lm/moe_quant.o build-lm/moe_quant # never an earlier call's binary on a warm machine
timeout "$(call_cap 200)" nvcc -c -O2 -std=c++17 $A -DLAB_ONLY_FG -DLAB_LM -Xptxas -v -Iinclude -Isrc $XC dev/cuda/moe_quant.cu \
  -o build-lm/moe_quant.o > /tmp/lm_lab_build.txt 2>&1 &
lp=$!; fi
make -j12 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/libdgemma.a > /tmp/lm_build.txt 2>&1
echo "build rc $? $(el)" | tee -a "$O/log.txt"; tail -2 /tmp/lm_build.txt >> "$O/log.txt"
{ [ -z "$lp" ] || wait $lp; }; echo "lab compile rc $? $(el)" | tee -a "$O/log.txt"
grep -A3 -E "Compiling entry.*(qr_lm_kernel|qr_lm8_kernel|qr_kernelILi4ELi[01]ELi[458]ELi64E)" /tmp/lm_lab_build.txt \
  | grep -E "Compiling|registers|spill" > "$O/ptxas.txt"
if command -v cuobjdump > /dev/null && [ -s build-lm/moe_quant.o ]; then
  cuobjdump -sass build-lm/moe_quant.o > /tmp/lm.sass 2> /dev/null
  for k in _Z13qr_lm8_kernelILi4ELi1ELi64ELi2EE _Z13qr_lm8_kernelILi4ELi0ELi64ELi2EE _Z12qr_lm_kernelILi4ELi1ELi64ELi1EE \
           _Z13qr_lm8_kernelILi4ELi1ELi64ELi1EE _Z9qr_kernelILi4ELi1ELi8ELi64E; do
    { echo "## stage loops of $k"; timeout 20 python3 scripts/qr_sass_loop.py /tmp/lm.sass $k --d 2 2>&1 | head -40; } >> "$O/ptxas.txt"
  done
  echo "sass: $(grep -c 'LDL\|STL' "$O/ptxas.txt") lines naming LDL/STL in the loops' listings $(el)" | tee -a "$O/log.txt"
fi
nvcc $A build-lm/moe_quant.o build/libdgemma.a -L"$CUL" $NXL -lcublas -lcudart -lcjson -lgomp -o build-lm/moe_quant \
  >> /tmp/lm_lab_build.txt 2>&1
echo "lab link rc $? $(el)" | tee -a "$O/log.txt"
[ -x build-lm/moe_quant ] || { grep -v "^ptxas info\|^    " /tmp/lm_lab_build.txt | tail -30 >> "$O/log.txt"; exit 1; }
export LD_LIBRARY_PATH="$CUL:/tmp/dgdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
n=0
for f in lab.txt lab2.txt; do
  n=$((n + 1))
  [ "$(call_left)" -ge 70 ] || { echo "lab run $n skipped: $(call_left) s left of the call $(el)" | tee -a "$O/log.txt"; break; }
  b=$(( 145 - ($(date +%s) - t0) )); [ "$b" -gt 60 ] && b=60 # the call's 150 s: the second run only in what is left
  [ "$n" -eq 1 ] || [ "$b" -ge 30 ] || { echo "lab run $n skipped: the 150 s budget $(el)" | tee -a "$O/log.txt"; break; }
  [ "$n" -eq 1 ] && b=60
  timeout "$(call_cap "$b")" build-lm/moe_quant --bits 4 --versions 50,121,130,131,132,133 --ms 16,32,64,128 --ts 1024,2048 \
    --reps 5 > "$O/$f" 2>&1
  echo "lab run $n rc $? $(el): $(grep -cE '\| 13[0-3] \|.*ok, = v50' "$O/$f") rows of 130-133 ok = v50 (of 48), $(grep -c FAIL "$O/$f") FAIL" | tee -a "$O/log.txt"
done
echo "done $(el)" | tee -a "$O/log.txt"
