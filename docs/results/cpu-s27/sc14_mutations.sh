#!/bin/bash
# mutation checks for sc14: each applies one edit to src/cuda/turbo_host.cu, builds, runs the named test, reverts
cd /work/wt-sc14
run() { # name, python replace old, new, filter
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
run MB1 'w->f1 + (size_t)tab.row0[i] * d->hidden' 'w->f1 + (size_t)tab.row0[0] * d->hidden' test_turbo_batch_inv
run MB2 'tab.s[tab.B] = (dg_tk_seg){c->logits,' 'tab.s[tab.B] = (dg_tk_seg){cs[b0]->logits,' test_turbo_batch
run MB3 'tab.s[tab.B] = (dg_tb_seg){c->logits, c->P,' 'tab.s[tab.B] = (dg_tb_seg){c->logits, cs[b0]->P,' test_turbo_batch
nice make -j2 BUILD=build-emu EMU=1 CUDA=0 OPT="-O2 -g" build-emu/tests/test_cuda > /tmp/sc14_mut_build.log 2>&1
git diff --stat src/cuda/turbo_host.cu
echo mutations done
