#!/usr/bin/env bash
# s31_win17.sh OUT: issue 17's four acceptance lines in ONE window on this machine (session 31, helper cpu17f), under
# the bench lock (taken once here) and `chrt -f 1` per benchmark process (SCHED_FIFO: the other helpers' processes on
# the 2 shared cores wait for the seconds of each run; the load average is logged before and after each).
#
#   A  ggml side by side, -t 2, five alternations: BENCH_LOCK_HELD=1 VARIANTS="main:MAIN" GGML_BUILDS="clang noamx"
#      ROWS=1,8,16,64,256 THREADS=2 chrt -f 1 dev/s27_sbs17.sh OUT/sbs_t2 5. Each alternation runs ggml and dgemma
#      (DGEMMA_KERNELS=avx512lp, active wait) in the same command: ggml d99724f built twice (scripts/ggml_side_by_side.sh,
#      GGML_BUILDS): `clang` = its AMX buffer type (gcc 12's build crashes there at M >= 2: ggml's stack tile config
#      and gcc 12's _tile_loadconfig, docs/results/cpu-s31/cpu17f_amx_crash.txt), `noamx` = ggml's CMake options with
#      AMX off (CPU_REPACK q4_K_8x8 / q4_0_8x8, VNNI). q4_K and q4_0, 128 experts walked, both paths.
#   B  the gathered MoE (256-token canvas, 4-bit, `bench --protocol ceiling --formats 4 --rows 1 --moe-tokens 256
#      --reps 5`) and the bundled model (`bench --protocol vllm`, -m models/dgemma-small for both builds: the same
#      weights), alternated ROUNDS (5) times: BASE (a build of 12717ea, session 27's baseline, `git archive` + `make
#      CUDA=0` in /tmp) -t 2; MAIN with its default kernels -t 2 and -t 1; MAIN with DGEMMA_KERNELS=avx512lp -t 2 and
#      -t 1 (OpenMP's default passive wait, as session 27).
#   C  the side by side at -t 1 (ggml too), ROUNDS_T1 (3) alternations: the scaling line (issue item 2).
#
# The rule, written before the run (medians over the alternations; "fastest q4_K" = the fastest q4_K column of the same
# run over both ggml builds and both paths, the summary's "vs ggml"):
#   line 1  gate/up [1408, 2816] M = 1: avx512lp GB/s >= the fastest q4_K's (ratio >= 1.00): met, else missed by the
#           ratio. Reported beside it: the ratio to the fastest 4.5-bit ggml path (q4_0, AMX or not).
#   line 2  gate/up M = 8, 16, 64, 256: ratio to the fastest q4_K >= 1.20 at EVERY M: met; any M below: missed there,
#           by how much. Beside it: each ggml column (q4_K@clang = AMX, q4_K@noamx = CPU_REPACK, q4_0@...), and the
#           down product [2816, 704] vs q4_0 (q4_K cannot hold K = 704).
#   line 3  the gathered MoE: median of the per-round ratios BASE ms / MAIN ms >= 2 (avx512lp and default, each said).
#   line 4  vllm -t 2: median of the per-round ratios MAIN tok/s / BASE tok/s >= 2 (default kernels: the line; avx512lp
#           beside it).
#   scaling the -t 1 / -t 2 time ratios of MoE, vllm and the side-by-side rows (2.0 = perfect on 2 cores).
# A round whose load before it was above 6 is kept and said (chrt holds the cores, the load counts the waiters).
# ~15-20 minutes. Needs: build-cpu/dgemma (make BUILD=build-cpu CUDA=0), BASE (default /tmp/cpu17f/base/build/dgemma),
# .ggml (scripts/ggml_side_by_side.sh builds it), chrt (util-linux) and the right to SCHED_FIFO (root here).
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: dev/s31_win17.sh OUT}
BASE=${BASE:-/tmp/cpu17f/base/build/dgemma}
MAIN=${MAIN:-$PWD/build-cpu/dgemma}
ROUNDS=${ROUNDS:-5}
ROUNDS_T1=${ROUNDS_T1:-3}
SKIP=${SKIP:-}  # e.g. SKIP=A,C to rerun part B alone
MODEL=$PWD/models/dgemma-small
mkdir -p "$OUT"
[ -x "$BASE" ] && [ -x "$MAIN" ] || { echo "s31_win17.sh: BASE=$BASE or MAIN=$MAIN missing" >&2; exit 2; }
exec 9>/work/BENCH_LOCK
flock 9
W=$OUT/window.txt
log() { echo "# $(date -u +%T) $* | load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$W"; }
log "lock taken; $(uname -n) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2); $(nproc) cpus; main $(git rev-parse --short HEAD) $(md5sum <"$MAIN" | cut -c1-12); base $(md5sum <"$BASE" | cut -c1-12)"
ps -eo pid,ni,rtprio,pcpu,etime,comm --sort=-pcpu | head -15 >"$OUT/ps_start.txt"
if [[ ,$SKIP, != *,A,* ]]; then
  log "A: side by side -t 2, $ROUNDS alternations"
  BENCH_LOCK_HELD=1 VARIANTS="main:$MAIN" GGML_BUILDS="clang noamx" ROWS=1,8,16,64,256 THREADS=2 \
    chrt -f 1 dev/s27_sbs17.sh "$OUT/sbs_t2" "$ROUNDS" >"$OUT/sbs_t2.log" 2>&1
  log "A done"
fi
if [[ ,$SKIP, != *,B,* ]]; then
  B=$OUT/acc34
  mkdir -p "$B"
  for r in $(seq "$ROUNDS"); do
    log "B round $r"
    for p in "base:$BASE::2" "main:$MAIN::2" "main-lp:$MAIN:avx512lp:2" "main:$MAIN::1" "main-lp:$MAIN:avx512lp:1"; do
      IFS=: read -r n b k t <<<"$p"
      env ${k:+DGEMMA_KERNELS=$k} chrt -f 1 "$b" bench --protocol ceiling --formats 4 --rows 1 --moe-tokens 256 -t "$t" \
        --reps 5 -o "$B/moe_${n}_t${t}_r$r.jsonl" >"$B/moe_${n}_t${t}_r$r.txt" 2>&1
      log "  moe $n -t $t rc $?"
    done
    for p in "base:$BASE::2" "main:$MAIN::2" "main-lp:$MAIN:avx512lp:2" "main:$MAIN::1"; do
      IFS=: read -r n b k t <<<"$p"
      env ${k:+DGEMMA_KERNELS=$k} chrt -f 1 "$b" bench --protocol vllm -m "$MODEL" -t "$t" \
        -o "$B/vllm_${n}_t${t}_r$r.jsonl" >"$B/vllm_${n}_t${t}_r$r.txt" 2>&1
      log "  vllm $n -t $t rc $?"
    done
  done
  python3 - "$B" <<'PY' | tee "$B/summary.txt"
import glob, json, os, re, statistics as st, sys
b = sys.argv[1]
def rows(kind):
    d = {}
    for fn in glob.glob(f"{b}/{kind}_*.jsonl"):
        m = re.match(rf"{kind}_(.+)_t(\d)_r(\d+)\.jsonl$", os.path.basename(fn))
        for line in open(fn):
            j = json.loads(line)
            if kind == "moe" and j.get("shape") == "moe_gathered": d[(m.group(1), int(m.group(2)), int(m.group(3)))] = j["median_s"] * 1e3
            if kind == "vllm" and j.get("protocol") == "vllm": d[(m.group(1), int(m.group(2)), int(m.group(3)))] = j["tok_per_s"]
    return d
fmt = lambda v: f"{st.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]" if v else "-"
for kind, unit in (("moe", "ms per call"), ("vllm", "tok/s")):
    d = rows(kind)
    rounds = sorted({k[2] for k in d})
    print(f"{kind} ({unit}), rounds {rounds}:")
    for n, t in sorted({k[:2] for k in d}):
        v = [d[(n, t, r)] for r in rounds if (n, t, r) in d]
        print(f"  {n:8s} -t {t}: {fmt(v)}  each {[round(x, 2) for x in v]}")
    for n in ("main", "main-lp"):
        rr = [(d[("base", 2, r)] / d[(n, 2, r)]) if kind == "moe" else (d[(n, 2, r)] / d[("base", 2, r)])
              for r in rounds if ("base", 2, r) in d and (n, 2, r) in d]
        print(f"  {n} / base (-t 2, per round, {'time ratio base/main' if kind == 'moe' else 'tok/s ratio'}): {fmt(rr)}x  each {[round(x, 2) for x in rr]}")
        sc = [(d[(n, 1, r)] / d[(n, 2, r)]) if kind == "moe" else (d[(n, 2, r)] / d[(n, 1, r)])
              for r in rounds if (n, 1, r) in d and (n, 2, r) in d]
        if sc: print(f"  {n} scaling -t 2 vs -t 1 (speed-up): {fmt(sc)}x  each {[round(x, 2) for x in sc]}")
PY
  log "B done"
fi
if [[ ,$SKIP, != *,C,* ]]; then
  log "C: side by side -t 1, $ROUNDS_T1 alternations"
  BENCH_LOCK_HELD=1 VARIANTS="main:$MAIN" GGML_BUILDS="clang noamx" ROWS=1,8,16,64,256 THREADS=1 \
    chrt -f 1 dev/s27_sbs17.sh "$OUT/sbs_t1" "$ROUNDS_T1" >"$OUT/sbs_t1.log" 2>&1
  log "C done"
fi
ps -eo pid,ni,rtprio,pcpu,etime,comm --sort=-pcpu | head -15 >"$OUT/ps_end.txt"
log "window end"
