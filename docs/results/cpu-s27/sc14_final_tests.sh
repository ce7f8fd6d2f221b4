#!/bin/bash
# sc14's emulation checks of the top-K sort and the SC rows made at the scatter (run under the bench lock)
cd /work/wt-sc14
B() { nice make -j2 BUILD=build-emu EMU=1 CUDA=0 OPT="-O2 -g" build-emu/tests/test_cuda > /tmp/sc14_fb.log 2>&1 || echo "build failed"; }
T() { local t=$1; shift; env "$@" DG_TEST_FILTER=$t nice build-emu/tests/test_cuda > /tmp/sc14_ft_$t.log 2>&1; echo "$t $* rc $? $(grep -c '^\[       OK \]' /tmp/sc14_ft_$t.log) ok $(grep -m3 -E 'INSTR|ERROR' /tmp/sc14_ft_$t.log | sort | uniq -c | tr '\n' ' ')"; }
date -u
cp src/cuda/turbo_host.cu /tmp/th_keep2.cu
python3 - <<'PY'
p='/work/wt-sc14/src/cuda/turbo_host.cu'
s=open(p).read()
s=s.replace('''    if (!st && nu > 0) st = sc_exact_make(w, cs, q, U, nu, cap, &made);''','''    if (!st && nu > 0) st = sc_exact_make(w, cs, q, U, nu, cap, &made);
    if (nu > 0) fprintf(stderr, "INSTR: at scatter made %d of %d\\n", made, nu);''')
open(p,'w').write(s)
PY
B; cp /tmp/th_keep2.cu src/cuda/turbo_host.cu
T test_turbo_topk
T test_turbo_batch9 DGEMMA_ENC_CHUNK=64
B
T test_turbo_batch
T test_turbo_batch_inv
T test_turbo_generate
T test_profile_batch
T test_turbo_continuous
T test_turbo_sc_probs
T test_turbo_compact
date -u
echo finished
