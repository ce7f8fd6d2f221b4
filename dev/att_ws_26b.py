#!/usr/bin/env python3
"""att_ws_26b.py: the attention key-split workspace (att_ws) that a CUDA context's calls want at the 26B-A4B shapes.

Mirrors fa_splits / fa_choose_splits (src/cuda/attention.cuh) for version 15 (attention_wq.cuh, the H100/H200
default): D 512 (full layers, 2 KV heads, BK 32, 64 rows a block), D 256 (sliding, 8 KV heads, BK 64, 128 rows a
block), 1 block per SM (193 KiB of shared memory each), 132 SMs (H100). Prints, per context size, the largest
ns x nq x NH x (D + 2) floats over every call a pass can make (nq 1..256: canvas, compacted turbo rows, encoder
chunks; causal and not), after the cap of the 8-split workspace (64.2 MiB); a need equal to the cap means the cap
binds, so any smaller workspace changes some call's split count (docs/cuda.md, session 28, helper m3b12).
Written by hand: it goes stale when the split rule or the tile shapes change.
"""
# The att_ws a context of cap positions needs at the 26B shapes on an H100 (132 SMs, 1 block per SM for version 15's
# D 256 and D 512 instantiations: 193 KiB of shared memory each), by fa_splits / fa_choose_splits (attention.cuh):
# the largest ns * nq * NH * (D + 2) floats over every call a pass can make: nq 1..256 rows (canvas, compacted
# turbo rows, encoder chunks), non-causal (kv_hi = pos0 + C, pos0 up to cap - C) and causal (hi = pos0 + nq).
import sys
SLOTS=132; NH=16; C=256; W=1024
def splits(blocks,tiles,slots):
    best=1; tb=((blocks+slots-1)//slots)*tiles
    for ns in range(2,17):
        if ns>tiles//2: break
        t=((blocks*ns+slots-1)//slots)*((tiles+ns-1)//ns)+0.5*ns
        if t<tb: tb=t; best=ns
    return best
CAP=8*C*NH*(512+2)  # the workspace's floats (dmax 512)
def need(cap):
    worst=(0,None)
    for D,BK,BM,NKV,full in ((512,32,64,2,1),(256,64,128,8,0)):
        G=NH//NKV
        for nq in range(1,C+1):
            bx=(nq*G+BM-1)//BM; blocks=bx*NKV; NR=nq*NH
            his=set()
            for pos0 in range(0,cap-nq+1,32):   # every 32 positions: tiles change per BK
                for causal in (0,1):
                    if causal: hi=pos0+nq; lo=0 if full else max(0,pos0+1-W)
                    else: hi=min(pos0+C,cap); lo=0 if full else max(0,pos0-(W-1))
                    tiles=(hi-lo+BK-1)//BK
                    if (tiles,) in his: continue
                    his.add((tiles,))
                    ns=splits(blocks,tiles,SLOTS)
                    while ns>1 and ns*NR*(D+2)>CAP: ns-=1
                    f=ns*NR*(D+2)
                    if f>worst[0]: worst=(f,(D,nq,tiles,ns,causal))
    return worst
for cap in [int(x) for x in sys.argv[1:]] or [2048,8448]:
    f,w=need(cap); print(f"cap {cap}: att_ws needs {f*4:,} B = {f*4/2**20:.1f} MiB (the workspace {CAP*4/2**20:.1f} MiB); worst call D {w[0]} nq {w[1]} tiles {w[2]} ns {w[3]} causal {w[4]}")
