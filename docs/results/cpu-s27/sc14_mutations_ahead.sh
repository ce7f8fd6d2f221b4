#!/bin/bash
# mutation checks for sc14's SC rows made ahead (dg_cuda_topk_batch's pre): each edit of src/cuda/turbo_host.cu is
# built, the named test run, the edit reverted
cd /work/wt-sc14
run() { # name, old, new, filter
  cp src/cuda/turbo_host.cu /tmp/th.bak
  python3 -c "
import sys
p='src/cuda/turbo_host.cu'; s=open(p).read(); o=sys.argv[1]; n=sys.argv[2]
assert s.count(o)==1, 'pattern count %d' % s.count(o)
open(p,'w').write(s.replace(o,n))" "$2" "$3" || { echo "$1: pattern not found"; return; }
  nice make -j2 BUILD=build-emu EMU=1 CUDA=0 OPT="-O2 -g" build-emu/tests/test_cuda > /tmp/sc14_mut_build.log 2>&1 || echo "$1: build failed"
  DG_TEST_FILTER="$4" build-emu/tests/test_cuda > /tmp/sc14_mut_$1.log 2>&1
  echo "$1 ($4): $(grep -E 'PASSED|FAILED  \] [0-9]' /tmp/sc14_mut_$1.log | head -2 | tr '\n' ' ') $(grep -m1 -E 'ERROR|error:' /tmp/sc14_mut_$1.log | cut -c1-160)"
  cp /tmp/th.bak src/cuda/turbo_host.cu
}
run MA1 't->sc_pre_f1 = stacked ? w->f1 + (size_t)(off + tab.row0[i]) * d->hidden : c->f1;' 't->sc_pre_f1 = stacked ? w->f1 + (size_t)off * d->hidden : c->f1;' test_turbo_batch_inv
run MA2 't->sc_pre_f1 = stacked ? w->f1 + (size_t)(off + tab.row0[i]) * d->hidden : c->f1;' 't->sc_pre_f1 = stacked ? w->f1 + (size_t)(off + tab.row0[i]) * d->hidden : cs[L[*made]]->f1;' test_turbo_batch
run MA3 '  return t->sc_pre_n > 0 && t->sc_pre_n == n && !memcmp(&t->sc_pre_T, &T, sizeof T);' '  return t->sc_pre_n > 0;' test_turbo_batch
nice make -j2 BUILD=build-emu EMU=1 CUDA=0 OPT="-O2 -g" build-emu/tests/test_cuda > /tmp/sc14_mut_build.log 2>&1
git diff --stat src/cuda/turbo_host.cu
echo mutations done
