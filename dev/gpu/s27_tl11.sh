#!/bin/bash
# Session 27's call for issue 11 (helper tl11): where version 114's one launch (gate/up and down, work tickets, a wait
# per down block) spends its slots; two other ticket orders and persistent blocks. One command, carry `.devdeb
# .devdata/gemma3`, default kind (H100); < 300 s, so it can follow another call on a warm machine:
#   1. `make -j12 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/libdgemma.a`: s26_fgb.sh's make line and flags
#      with the one target the lab links (its build/dgemma and build/tests/test_cuda would rebuild
#      tests/support/cuda_entry.o, which includes the lab header this session changed: minutes of nvcc for nothing
#      the lab needs; on a warm machine after s26_fgb.sh or any default build this rebuilds nothing);
#   2. the lab with -DLAB_ONLY_FG (LAB_ONLY_SK narrowed to versions 1-3, 40, 50, 110 and the gate/up + down rows of
#      114, 116-119: 95, 112 and 113 not compiled), sm_90a, -Xptxas -v (ptxas.txt: qr_fgx_kernel's and
#      qr_tl_kernel's registers and spills; qr_fgp_kernel's too; then the 3-n-tile stage loops by
#      scripts/qr_sass_loop.py), linked with build/libdgemma.a (114 is the library's qr_fg_bits<4>);
#   3. `moe_quant --bits 4 --versions 50,110,114,116,117,118,119 --ms 16 --ts 256 --ss 256 --reps 5` twice (lab.txt,
#      lab2.txt): per case 50's and 110's rows per product (110's timelines), then the gate_up+down rows of 50 (two
#      launches, DGEMMA_DN_FUSE=1), 114 (one launch), 116 (114 + version 110's per-block stamps and the timeline of
#      the one launch: ticket, phases per product, down waits, per expert first down ticket against its last gate/up
#      count, gate/up's last round's slots, slots over time), 117 (the last partial round of gate/up items
#      interleaved 1 : 2 with down items of experts already placed), 118 (the last two rounds 1 : 1), 119 (114's order on
#      persistent blocks over the resident slots, each taking its next ticket during its item): each checked against
#      the CPU, word for word against 50 ("ok, = v50") and its counters.
#      fused.txt: the gate_up+down rows and their word / order lines of both runs; timeline.txt: every timeline.
# Guards: the lab's compile at most 230 s; each lab run at most 40 s, the second only with >= 45 s left; every timeout
# capped at the call's limit (DG_CALL_S, scripts/gpu_env.sh).
#
# The rule (written before any GPU run; docs/cuda.md "Session 27 (helper tl11)"):
#  (a) 116 is read as 114's timeline only if every 116 row reads "ok, = v50" with counters ok and its median is
#      within 2 us (or 1.5 %) of 114's in the same run; otherwise its timeline is read with that caveat.
#  (b) 117, 118 or 119 becomes the candidate for the backend's fused launch only if at uniform M 16 and gathered
#      T 256, in both runs, its median is more than 2 % under 114's and under version 50's gate_up+down median of the
#      same run, their min-max ranges do not overlap, and every row of it (the skewed one too) reads "ok, = v50" with
#      counters ok. A tie or a loss keeps 114's order; the timeline then names the next lever.
#  (c) a word difference, a FAIL or a counter line not ok is a bug to fix before any time counts.
# Files back (8 at most): log.txt, ptxas.txt, lab.txt, lab2.txt, fused.txt, timeline.txt.
# Usage: bash dev/gpu/s27_tl11.sh $OUT
O=${1:?usage: dev/gpu/s27_tl11.sh OUT}; mkdir -p "$O"
. scripts/gpu_env.sh
A="-gencode=arch=compute_90a,code=sm_90a"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee -a "$O/log.txt"
git log -1 --format='%h %s' 2>/dev/null | cut -c1-100 >> "$O/log.txt"
mkdir -p build-tl; rm -f build-tl/moe_quant.o build-tl/moe_quant # never an earlier call's binary on a warm machine
timeout "$(call_cap 230)" nvcc -c -O2 -std=c++17 $A -DLAB_ONLY_FG -Xptxas -v -Iinclude -Isrc $XC dev/cuda/moe_quant.cu \
  -o build-tl/moe_quant.o > /tmp/tl_lab_build.txt 2>&1 &
lp=$!
make -j12 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/libdgemma.a > /tmp/tl_build.txt 2>&1
echo "build rc $? $(el)" | tee -a "$O/log.txt"; tail -2 /tmp/tl_build.txt >> "$O/log.txt"
wait $lp; echo "lab compile rc $? $(el)" | tee -a "$O/log.txt"
grep -A3 -E "Compiling entry.*(qr_fgx_kernel|qr_fgp_kernel|qr_tl_kernel)" /tmp/tl_lab_build.txt | grep -E "Compiling|registers|spill" \
  > "$O/ptxas.txt"
# the stage loops of the 3-n-tile instances (scripts/qr_sass_loop.py: instructions per weight stage and opcodes; an
# LDL or STL there would be a spill inside a loop)
if command -v cuobjdump > /dev/null && [ -s build-tl/moe_quant.o ]; then
  cuobjdump -sass build-tl/moe_quant.o > /tmp/tl.sass 2> /dev/null
  for k in _Z13qr_fgx_kernelILi4ELi3ELi64ELi4ELi2ELi3ELi4ELi2ELin2ELi2ELi0EE \
           _Z13qr_fgx_kernelILi4ELi3ELi64ELi4ELi2ELi3ELi4ELi2ELin2ELi2ELi1EE _Z13qr_fgp_kernelILi4ELi3E; do
    { echo "## stage loops of $k"; timeout 20 python3 scripts/qr_sass_loop.py /tmp/tl.sass $k --d 2 2>&1 | head -40; } >> "$O/ptxas.txt"
  done
  echo "sass: $(grep -c 'LDL\|STL' "$O/ptxas.txt") lines naming LDL/STL in the loops' listings $(el)" | tee -a "$O/log.txt"
fi
nvcc $A build-tl/moe_quant.o build/libdgemma.a -L"$CUL" $NXL -lcublas -lcudart -lcjson -lgomp -o build-tl/moe_quant \
  >> /tmp/tl_lab_build.txt 2>&1
echo "lab link rc $? $(el)" | tee -a "$O/log.txt"
[ -x build-tl/moe_quant ] || { grep -v "^ptxas info\|^    " /tmp/tl_lab_build.txt | tail -30 >> "$O/log.txt"; exit 1; }
export LD_LIBRARY_PATH="$CUL:/tmp/dgdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
n=0
for f in lab.txt lab2.txt; do
  n=$((n + 1))
  [ "$(call_left)" -ge 45 ] || { echo "lab run $n skipped: $(call_left) s left of the call $(el)" | tee -a "$O/log.txt"; break; }
  timeout "$(call_cap 40)" build-tl/moe_quant --bits 4 --versions 50,110,114,116,117,118,119 --ms 16 --ts 256 --ss 256 --reps 5 \
    > "$O/$f" 2>&1
  echo "lab run $n rc $? $(el): $(grep -c 'gate_up+down .*ok, = v50' "$O/$f") rows ok = v50, $(grep -c 'counters ok' "$O/$f") with counters ok, $(grep -c FAIL "$O/$f") FAIL" | tee -a "$O/log.txt"
  { echo "## run $n"; grep -E 'gate_up\+down|vs 50 \(DGEMMA|ticket order|counters after' "$O/$f"; } >> "$O/fused.txt"
  { echo "## run $n"; grep -E '^\| 4 \| (gate_up|down|gate_up\+down) \| .* \| (110|116) \||^  timeline|^   ' "$O/$f"; } >> "$O/timeline.txt"
done
echo "done $(el)" | tee -a "$O/log.txt"
