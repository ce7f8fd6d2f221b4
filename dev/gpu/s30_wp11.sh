#!/bin/bash
# Session 30's call for issues 11, 14 and 12 (helper wp11, session 29; docs/cuda.md "Session 29 (helper wp11)"): where
# the 4-bit expert kernels' warps wait (Nsight Compute) and lab versions 134-139 (version 50 with more warps per SM at
# 4-8 n-tiles; 138-139 with the 8-tile stage in a register-lean order). One command, carry `.devdeb`, default kind
# (H100); ~200-260 s on a warm machine, more than the usual 150 s (the lab's compile ~80-100 s: s28_lm14.sh's 71 s
# plus 134-139's instances; two lab runs ~15 s each; the ncu items ~15-25 s each, each guarded by the time left):
#   1. `make ... build/libdgemma.a` (s28_lm14.sh's line: after any default build it rebuilds nothing) beside the lab's
#      compile (-DLAB_ONLY_FG -DLAB_LM, sm_90a, -Xptxas -v: s28_lm14.sh's build, which holds 50, 119, 130-139);
#      ptxas.txt: registers and spills of qr_kernel's 4-bit g64 instances at 3, 4, 5, 8 n-tiles (version 50's and
#      134-137's: MINB 1, 3, 4; STAGES 3, 2), of qr_lean_kernel (138, 139) and of qr_fgp_kernel (119), then the stage
#      loops of the 8-tile instances and of qr_lean_kernel (scripts/qr_sass_loop.py: an LDL / STL there is a spill
#      inside the loop);
#   2. `moe_quant --bits 4 --versions 50,131,134,135,136,137,138,139 --ms 16,32,64,128 --ts 1024,2048 --reps 5`, twice
#      (lab.txt, lab2.txt): every 134-139 row checked against the CPU and word for word against version 50 ("ok, =
#      v50");
#   3. Nsight Compute, one profiled launch per item (`--kernel-name-base mangled -k regex:NAME -c 1`: the first launch
#      of that kernel instance, the check run; L2 flushed (ncu's default); `--clock-control none`: the SMs at the
#      clocks the lab's times are taken at, not ncu's locked base ~1.40 GHz of sessions 19-20), sections SpeedOfLight,
#      ComputeWorkloadAnalysis, SchedulerStats, WarpStateStats, Occupancy,
#      MemoryWorkloadAnalysis, LaunchStats, InstructionStats, SourceCounters; in this order (the first ones matter
#      most): u64gu = version 50's gate_up at uniform M 64 (qr_kernel<4, 1, 8>), f16 = version 119 at uniform M 16
#      (qr_fgp_kernel: gate_up and down in one launch), u64dn = 50's down at M 64 (qr_kernel<4, 0, 8>), u16gu / u16dn
#      = 50's gate_up / down at M 16 (qr_kernel<4, 1|0, 3>), then if time is left l64gu = 138's gate_up at M 64
#      (qr_lean_kernel<4, 1, 64, 3>), o64gu = 134's (qr_kernel<4, 1, 8, ..., MINB 3>) and f256 = 119 at gathered
#      T 256. Per item: the report (.ncu-rep), its
#      details, raw and source pages (--page details / raw --csv, --page source --csv --print-source sass), all in
#      ncu.tgz; ncu.txt: per item scripts/ncu_pick.py (the details' lines that decide, below, and the stall cycles
#      per issued instruction by reason from the raw page) and scripts/qr_src_counts.py --top 20 (stall samples by
#      reason and instruction class, the 20 SASS lines with the most samples and their reasons).
# Guards: the lab's compile at most 200 s; each lab run at most 45 s; each ncu item at most 60 s and only with >= 45 s
# left of the call (DG_CALL_S, scripts/gpu_env.sh); the optional items only with >= 60 s left and within 270 s of the
# start; every timeout capped at the call's limit.
#
# The prediction (written before any GPU run; the arithmetic in docs/cuda.md "Session 29 (helper wp11)"): lm14's
# 132 against 133 (16 against 8 warps per SM, the same words) was 1.118x on gate_up and 1.232x on down at uniform M 64
# (1.120 / 1.215 at M 128, 1.163 / 1.228 at T 1024, 1.160 / 1.198 at T 2048). Applied to version 50's loop, if its
# spills cost nothing: 16 warps (135) M 64 gate_up 297.5 -> ~266 us, down 169.9 -> ~138 us; 12 warps (134, 136, 138:
# the geometric half of the gain) ~281 / ~153 us; at M 32 (5 n-tiles; 133 / 132 1.171 and 1.319) 12 warps: gate_up
# 171.6 -> ~159, down 110.2 -> ~96. ptxas (session 29, this branch, nvcc 13 -O2 sm_90a): qr_kernel's 8-tile
# instances at <= 168 registers spill 616-652 bytes stored / 836-932 loaded, at <= 128 1,488-1,496 / 1,700-2,004
# (version 50's: 24-28 / 24-28); at 5 n-tiles <= 168: 88 / 100-104, <= 128: 580-588 / 836-972; at 4 n-tiles <= 168:
# 36-40 / 36-44. The lean 8-tile kernel (138) at <= 168: 128 / 496 (139 at 255: none). So expected: 134 and 136 lose
# at 8 n-tiles (the sums spill in the loop) and win 5-13 % at M 32 (5 n-tiles, little spill: ~159 / ~96 us); 135
# loses everywhere but perhaps M 32; 137 within 2 % of 50 (ring 2 at 8 warps); 139 within 3 % over 50 or 0-8 % under
# it (the lean order at 8 warps: its n-tiles' 4-mma chains are independent, and its loop is 386 instructions per
# weight stage against 50's 484.5, cpu-s29/wp11_sass_loops.txt); 138 the candidate: 3-6 % under 50 (and 139) on gate_up
# and 6-10 % on down at M 64 / 128 and T 1024 / 2048 (its loop: 505 per stage, 9.5 LDL of the copies' addresses, no
# STL; 134's 8-tile loop: 586 with 40.5 LDL and 23 STL, 135's 638 with 76.5 / 54.5).
#
# The rule (written before any GPU run):
#  (a) a 134-139 row that is not "ok, = v50", or any FAIL, is a bug to fix before any of its times counts. The M 16
#      rows of 134-139 and the M 32 rows of 138-139 run version 50's own kernels (3 and 5 n-tiles): a median more
#      than 1.5 % from 50's there says the run's drift is larger than the rule assumes; then (b) needs the other run
#      to agree. (138-139 are judged by (b) on the other rows only.)
#  (b) a version is the candidate for the backend (qr_launch_bits' cases 4, 5, 8 in src/cuda/qmoe_r.cuh: their MINB
#      and STAGES for 134-137, the 8-tile kernel replaced by the lean one for 138-139) only if, in both runs, at uniform M 64 and M 128 and gathered T 1024 and T 2048, for gate_up
#      and for down, its median is under version 50's with min-max ranges apart, and at uniform M 32 its median is at
#      most 2 % over 50's; of several, the one with the smallest sum of medians over those 8 rows. A version that
#      passes (b) only on one product is the candidate for that product alone (qr_launch_bits<4, GATEUP> per product).
#  (c) what the rows say: 138 more than 3 % under 139 at M 64 on both products in both runs (the same lean loop, 12
#      against 8 warps) confirms with 50's products what lm14's (c) found with 132's loop (latency-bound at 8 warps
#      per SM); within 2 % with LDL / STL in 138's loop (ptxas.txt's SASS listing) says the spills ate the warps'
#      gain, without them that the gain does not carry over. 139 against 50 is the lean order's own cost, 134
#      against 50 the same 12 warps with the sums spilled, 135 against 136 16 against 12 warps at the same ring, 137
#      against 50 the ring's depth alone.
#  (d) the ncu items (what each stall reason points at, docs/cuda.md "Session 29 (helper wp11)"): per item the
#      largest stall reasons per issued instruction (WarpStateStats), eligible warps and "no eligible" per scheduler
#      (SchedulerStats), tensor pipe and issue utilisation (ComputeWorkloadAnalysis), DRAM throughput
#      (MemoryWorkloadAnalysis) and the top-20 lines (SourceCounters). For u64gu / u64dn: "wait" (fixed-latency
#      dependency: the unpack -> mma -> fold chain) the largest with < 1 eligible warp per scheduler and the tensor
#      pipe < 60 % busy: latency of the warp's own chain -> more warps (134-138) or two stages' chains interleaved
#      in a warp; "long scoreboard" the largest: the weight loads' latency -> a deeper register stage (D 3) or
#      earlier prefetch; "barrier" the largest: the 4 warps out of step at the activation ring -> fewer barriers
#      (SUB 4) or a warp-specialised copy warp; "short scoreboard" / "MIO throttle": shared memory (the B fragments,
#      8.9 bytes per weight byte at 8 n-tiles) -> ldmatrix / fragments kept in registers across m-tiles; "math pipe
#      throttle" with the tensor pipe > 70 %: mma.sync's own rate -> wgmma (121's road). For f16 (119 at M 16): DRAM
#      throughput >= 85 % of peak means the 138 us roofline's 85 % needs fewer bytes, not a better schedule; below
#      75 % with the top lines in the stage loop ("barrier" at its branches, "long scoreboard" at the codes' first
#      use, as session 20 found for 50) says the stream is not kept full inside the loop, and with the top lines
#      outside it (the row table, the ticket, the epilogue) the item boundary F is where the time goes after all.
#      The decision is written from these numbers in the next session's docs/cuda.md, against this list.
# Files back (6 at most): log.txt, ptxas.txt, lab.txt, lab2.txt, ncu.txt, ncu.tgz.
# Usage: bash dev/gpu/s30_wp11.sh $OUT   (DG_CALL_S=N: the device call's limit, seconds)
O=${1:?usage: dev/gpu/s30_wp11.sh OUT}; mkdir -p "$O"
. scripts/gpu_env.sh
A="-gencode=arch=compute_90a,code=sm_90a"
V=50,131,134,135,136,137,138,139
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee -a "$O/log.txt"
git log -1 --format='%h %s' 2>/dev/null | cut -c1-100 >> "$O/log.txt"
command -v ncu > /dev/null && ncu --version | tail -1 >> "$O/log.txt"
mkdir -p build-wp
rm -f build-wp/moe_quant.o build-wp/moe_quant # never an earlier call's binary on a warm machine
timeout "$(call_cap 200)" nvcc -c -O2 -std=c++17 $A -DLAB_ONLY_FG -DLAB_LM -Xptxas -v -Iinclude -Isrc $XC dev/cuda/moe_quant.cu \
  -o build-wp/moe_quant.o > /tmp/wp_lab_build.txt 2>&1 &
lp=$!
make -j12 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/libdgemma.a > /tmp/wp_build.txt 2>&1
echo "build rc $? $(el)" | tee -a "$O/log.txt"; tail -2 /tmp/wp_build.txt >> "$O/log.txt"
wait $lp; echo "lab compile rc $? $(el)" | tee -a "$O/log.txt"
grep -A3 -E "Compiling entry.*(qr_fgp_kernel|qr_lean_kernel|qr_kernelILi4ELi[01]ELi[3458]ELi64E)" /tmp/wp_lab_build.txt \
  | grep -E "Compiling|registers|spill" > "$O/ptxas.txt"
if command -v cuobjdump > /dev/null && [ -s build-wp/moe_quant.o ]; then
  cuobjdump -sass build-wp/moe_quant.o > /tmp/wp.sass 2> /dev/null
  # the 8-tile instances: 50 (MINB 1, STAGES 3), 134 (3, 3), 135 (4, 2), 136 (3, 2), 137 (1, 2); gate_up and down
  for g in 1 0; do for ms in 3ELi1 3ELi3 2ELi4 2ELi3 2ELi1; do # (the full name: a DQ instance shares MINB 3's prefix)
    k=_Z9qr_kernelILi4ELi${g}ELi8ELi64ELi4ELi2ELi${ms}ELi2ELin2ELi1ELi6ELi0ELi0ELi0ELi0EEv7qe_args
    { echo "## stage loops of $k"; timeout 20 python3 scripts/qr_sass_loop.py /tmp/wp.sass $k --d 2 2>&1 | head -30; } >> "$O/ptxas.txt"
  done; done
  for k in _Z14qr_lean_kernelILi4ELi1ELi64ELi3E _Z14qr_lean_kernelILi4ELi0ELi64ELi3E _Z14qr_lean_kernelILi4ELi1ELi64ELi1E; do
    { echo "## stage loops of $k"; timeout 20 python3 scripts/qr_sass_loop.py /tmp/wp.sass $k --d 2 2>&1 | head -30; } >> "$O/ptxas.txt"
  done
  echo "sass: $(grep -c 'LDL\|STL' "$O/ptxas.txt") lines naming LDL/STL in the loops' listings $(el)" | tee -a "$O/log.txt"
fi
nvcc $A build-wp/moe_quant.o build/libdgemma.a -L"$CUL" $NXL -lcublas -lcudart -lcjson -lgomp -o build-wp/moe_quant \
  >> /tmp/wp_lab_build.txt 2>&1
echo "lab link rc $? $(el)" | tee -a "$O/log.txt"
[ -x build-wp/moe_quant ] || { grep -v "^ptxas info\|^    " /tmp/wp_lab_build.txt | tail -30 >> "$O/log.txt"; exit 1; }
export LD_LIBRARY_PATH="$CUL:/tmp/dgdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
n=0
for f in lab.txt lab2.txt; do
  n=$((n + 1))
  [ "$(call_left)" -ge 55 ] || { echo "lab run $n skipped: $(call_left) s left of the call $(el)" | tee -a "$O/log.txt"; break; }
  timeout "$(call_cap 45)" build-wp/moe_quant --bits 4 --versions $V --ms 16,32,64,128 --ts 1024,2048 --reps 5 > "$O/$f" 2>&1
  echo "lab run $n rc $? $(el): $(grep -cE '\| 13[4-9] \|.*ok, = v50' "$O/$f") rows of 134-139 ok = v50 (of 72), $(grep -c FAIL "$O/$f") FAIL" | tee -a "$O/log.txt"
done
# Nsight Compute: NAME : kernel regex (mangled) : the lab's arguments (commas for spaces) : optional (1: only with time)
S="--section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
--section Occupancy --section MemoryWorkloadAnalysis --section LaunchStats --section InstructionStats --section SourceCounters"
mkdir -p /tmp/wp_ncu; rm -f /tmp/wp_ncu/*
if command -v ncu > /dev/null; then
for c in "u64gu:^_Z9qr_kernelILi4ELi1ELi8ELi64ELi4ELi2ELi3ELi1ELi2ELin2ELi1ELi6ELi0ELi0ELi0ELi0E:50,--ms,64,--ts,none:0" \
         "f16:^_Z13qr_fgp_kernel:119,--ms,16,--ts,none:0" \
         "u64dn:^_Z9qr_kernelILi4ELi0ELi8ELi64ELi4ELi2ELi3ELi1ELi2ELin2ELi1ELi6ELi0ELi0ELi0ELi0E:50,--ms,64,--ts,none:0" \
         "u16gu:^_Z9qr_kernelILi4ELi1ELi3ELi64ELi4ELi2ELi3ELi4ELi2ELin2ELi1ELi2ELi0ELi0ELi0ELi0E:50,--ms,16,--ts,none:0" \
         "u16dn:^_Z9qr_kernelILi4ELi0ELi3ELi64ELi4ELi2ELi3ELi4ELi2ELin2ELi1ELi2ELi0ELi0ELi0ELi0E:50,--ms,16,--ts,none:0" \
         "l64gu:^_Z14qr_lean_kernelILi4ELi1ELi64ELi3E:138,--ms,64,--ts,none:1" \
         "o64gu:^_Z9qr_kernelILi4ELi1ELi8ELi64ELi4ELi2ELi3ELi3ELi2ELin2ELi1ELi6ELi0ELi0ELi0ELi0E:134,--ms,64,--ts,none:1" \
         "f256:^_Z13qr_fgp_kernel:119,--ms,none,--ts,256:1"; do
  IFS=: read -r name re args opt <<< "$c"
  need=45; [ "$opt" = 1 ] && need=60
  if [ "$(call_left)" -lt "$need" ] || { [ "$opt" = 1 ] && [ $(( $(date +%s) - t0 )) -gt 270 ]; }; then
    echo "ncu $name skipped: $(call_left) s left of the call $(el)" | tee -a "$O/log.txt"; continue
  fi
  timeout "$(call_cap 60)" ncu $S --clock-control none --import-source no --kernel-name-base mangled -k "regex:$re" -c 1 -f -o /tmp/wp_ncu/$name \
    build-wp/moe_quant --bits 4 --versions $(echo "$args" | tr , ' ') --reps 1 > /tmp/wp_ncu/$name.log 2>&1
  echo "ncu $name rc $? $(el): $(tail -1 /tmp/wp_ncu/$name.log | cut -c1-120)" | tee -a "$O/log.txt"
  [ -s /tmp/wp_ncu/$name.ncu-rep ] || { grep -E "==PROF==|==ERROR==|==WARNING==" /tmp/wp_ncu/$name.log | head -5 >> "$O/log.txt"; continue; }
  ncu -i /tmp/wp_ncu/$name.ncu-rep --page details --csv > /tmp/wp_ncu/${name}_details.csv 2>&1
  ncu -i /tmp/wp_ncu/$name.ncu-rep --page source --csv --print-source sass > /tmp/wp_ncu/${name}_src.csv 2>&1
  ncu -i /tmp/wp_ncu/$name.ncu-rep --page raw --csv > /tmp/wp_ncu/${name}_raw.csv 2>&1
  { echo "## $name: build-wp/moe_quant --bits 4 --versions $(echo "$args" | tr , ' ') --reps 1, kernel regex $re"
    python3 scripts/ncu_pick.py /tmp/wp_ncu/${name}_details.csv /tmp/wp_ncu/${name}_raw.csv 2>&1 | head -60
    python3 scripts/qr_src_counts.py /tmp/wp_ncu/${name}_src.csv --top 20 2>&1 | head -40
    echo; } >> "$O/ncu.txt"
done
# ncu.tgz at most 15 MiB (files back: 16 MiB each): the pages and logs first, then the reports in the items' order
# while they fit (a report left out is named in the log)
( cd /tmp/wp_ncu && keep=$(ls ./*.csv ./*.log 2> /dev/null)
  for name in u64gu f16 u64dn u16gu u16dn l64gu o64gu f256; do
    [ -s ./$name.ncu-rep ] || continue
    tar czf /tmp/wp_try.tgz $keep ./$name.ncu-rep 2> /dev/null
    if [ "$(stat -c %s /tmp/wp_try.tgz)" -le 15728640 ]; then keep="$keep ./$name.ncu-rep"
    else echo "ncu.tgz: $name.ncu-rep left out (over 15 MiB with it)" >> "$O/log.txt"; fi
  done
  tar czf "$O/ncu.tgz" $keep 2> /dev/null; rm -f /tmp/wp_try.tgz )
ls -la /tmp/wp_ncu | tail -n +2 | awk '{print $5, $9}' >> "$O/log.txt"
else
  echo "ncu not found: the ncu items skipped $(el)" | tee -a "$O/log.txt"
fi
echo "done $(el)" | tee -a "$O/log.txt"
