#!/bin/bash
# mutation checks for sc14's top-K rewrite (src/cuda/turbo.cu topk_row, tk_sort): each edit built, test_turbo_topk run, reverted
cd /work/wt-sc14
run() { # name, old, new
  cp src/cuda/turbo.cu /tmp/tu.bak
  python3 -c "
import sys
p='src/cuda/turbo.cu'; s=open(p).read(); o=sys.argv[1]; n=sys.argv[2]
assert s.count(o)==1, 'pattern count %d' % s.count(o)
open(p,'w').write(s.replace(o,n))" "$2" "$3" || { echo "$1: pattern not found"; cp /tmp/tu.bak src/cuda/turbo.cu; return; }
  nice make -j2 BUILD=build-emu EMU=1 CUDA=0 OPT="-O2 -g" build-emu/tests/test_cuda > /tmp/sc14_mut_build.log 2>&1 || echo "$1: build failed"
  DG_TEST_FILTER=test_turbo_topk build-emu/tests/test_cuda > /tmp/sc14_mut_$1.log 2>&1
  echo "$1: $(grep -E 'PASSED|FAILED  \] [0-9]' /tmp/sc14_mut_$1.log | head -2 | tr '\n' ' ') $(grep -m1 -E 'ERROR|error:' /tmp/sc14_mut_$1.log | cut -c1-160)"
  cp /tmp/tu.bak src/cuda/turbo.cu
}
run MT1 'if ((i & k) == 0 ? tk_before(b, ib, a, ia) : tk_before(a, ia, b, ib)) {' 'if ((i & k) == 0 ? tk_before(a, ia, b, ib) : tk_before(b, ib, a, ia)) {'
run MT2 'const int v = ssi[e / TB_CHUNK] / TB_CHUNK * TB_CHUNK + e % TB_CHUNK;' 'const int v = ssi[e / TB_CHUNK + 1] / TB_CHUNK * TB_CHUNK + e % TB_CHUNK;'
run MT3 'if (v1 < V && f[2 * u + 1] > bv) { bv = f[2 * u + 1]; bi = v1; }' 'if (v1 < V && f[2 * u + 1] >= bv) { bv = f[2 * u + 1]; bi = v1; }'
run MT4 'f[2 * u + 1] = v1 < V ? x[v1] : -INFINITY;' 'f[2 * u + 1] = v1 < V ? x[v0] : -INFINITY;'
nice make -j2 BUILD=build-emu EMU=1 CUDA=0 OPT="-O2 -g" build-emu/tests/test_cuda > /tmp/sc14_mut_build.log 2>&1
git diff --stat src/cuda/turbo.cu
echo mutations done
