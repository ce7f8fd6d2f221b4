#!/usr/bin/env python3
"""ctx_bytes_26b.py: the CUDA context's device block (one cudaMalloc) at the 26B-A4B shapes, by arithmetic.

Mirrors src/cuda/context.cu ctx_dims_of / ctx_layout at the defaults (DGEMMA_BRANCH on: the second cuBLAS
workspace, 4 MiB since session 29; P in place over the logits but its first C / 8 rows, session 29; the decoder's
rows T = max(canvas, min(chunk, 256)) = 256; since session 29's mm12 the encoder chunk's rows beyond them, chunk
1024 by default, lie over P's head and the logits (the union; --chunk N for another chunk; --old for the layout
before mm12, where every work buffer and the rings grew with the chunk)) with the config of /work/shared/spec/diffusiongemma.md
(H 2816, V 262,144, I 2112, IE 704, 128 experts top-8, 16 query heads; 25 sliding layers of 8 KV heads x 256, 5 full
of 2 x 512 with K = V (no v_proj), window 1024, canvas 256). Each buffer rounded up to CARVE_ALIGN (256 bytes).
Written by hand, so it goes stale when ctx_layout changes: the GPU's numbers are `dgemma bench --protocol step`'s
device memory columns (docs/cuda.md, "Acceptance of issues 11 and 12"). Prints the totals for a few context sizes
(dg_context_params.max_context), and with an argument CAP the buffers of that size, largest first.
"""
import sys
C,H,V,I,IE,E,K,NH=256,2816,262144,2112,704,128,8,16
W=max(H,2*I)
dmax=512; qkvmax=max(16*256+2*8*256, 16*512+2*512)  # sliding q+k+v, full q+k (K = V: no v_proj)
def al(n): return (n+255)//256*256
def rows_bufs(T):
    TK=T*K; XQ=max(TK*IE,T*H)
    return [("ids",T*4),("x",T*H*4),("f1",T*W*4),("dense",T*H*4),("a",T*H*2),("xe",T*H*2),("u",T*H*4),
       ("qkv",T*qkvmax*4),("q",T*NH*dmax*4),("att",T*NH*dmax*2),
       ("gu",T*2*I*4),("h",T*max(I,IE)*2),("rlog",T*E*4),("rws (16 router splits)",16*T*E*4),
       ("moe.topk_idx+topk_w+pairs+slot_row",4*TK*4),("moe.tiles",(TK+E)*2*4),
       ("moe.h",TK*IE*2),("moe.y",TK*H*4),("moe.xs",XQ//32*4),("moe.xp",XQ*2),("moe.hs",TK*IE//32*4)]
def layout(cap, side=True, inplace=True, side_kib=4096, chunk=1024, old=False):
    """(name, bytes) rows of the block; old: every work buffer and the rings at max(C, chunk) rows (before mm12)."""
    S=cap+C
    Tr = max(C, chunk) if old else max(C, min(chunk, 256))
    T = Tr; Te = max(T, chunk)
    ring=min(((1024-1+Tr)+63)//64*64, S)
    kv=[]
    for li in range(30):
        full = li%6==5
        n = (2 if full else 8)*(S if full else ring)*(512 if full else 256)*2
        kv += [al(n), al(n)]
    rows=[("KV cache (K and V, 30 layers)", sum(kv))]
    small = sum(al(x) for x in [E*4,(E+1)*4,4,E*4,2*E*4,4,(3+E)*4,(32+256+16384)*4]) + sum(al(x) for x in [C*4,C*32,4,C*4])
    b=[("att_ws.part (8 key splits)",8*C*NH*(dmax+2)*4),("moe small (count,start,order,wl,fg,gsc,...) + uni+stats+bad",None)]
    if not inplace: b.append(("P [C, V] bf16",C*V*2))
    b += [("soft",C*H*4),("vws (vocab partials)",C*((V+8191)//8192)*48),("blas_ws (cuBLAS workspace)",32<<20)]
    if side: b.append(("side.ws (DGEMMA_BRANCH's second cuBLAS workspace, DGEMMA_BRANCH_WS_KIB)",side_kib<<10))
    dec = [(n, al(v)) for n, v in rows_bufs(T)]
    if inplace: dec.append(("P's head: rows [0, C/8) of P [C, V] bf16 (the rest over the logits, DGEMMA_SC_INPLACE)",al((C//8)*V*2)))
    dec.append(("logits [C, V] fp32",al(C*V*4)))
    out=rows+[(n,(al(v) if v is not None else small)) for n,v in b]+dec
    enc = sum(al(v) for _, v in rows_bufs(Te))
    over = max(0, enc - sum(v for _, v in dec)) if Te > T else 0
    if over: out.append((f"the encoder's view beyond the decoder's union ({Te} rows)", over))
    return out, enc, sum(v for _, v in dec)
import argparse
ap=argparse.ArgumentParser()
ap.add_argument("cap", nargs="?", type=int)
ap.add_argument("--chunk", type=int, default=1024)
ap.add_argument("--old", action="store_true")
a=ap.parse_args()
for cap in (2048, 8448, 9216, 32768+256, 100000+256):
    L,enc,dec=layout(cap, chunk=a.chunk, old=a.old); tot=sum(v for _,v in L)
    O,_,_=layout(cap, inplace=False, side_kib=32768, chunk=256, old=True); o=sum(v for _,v in O)
    print(f"cap {cap} chunk {a.chunk}{' (before mm12)' if a.old else ''}: total {tot/2**30:.3f} GiB = {tot:,} B; "
          f"KV {L[0][1]/2**30:.3f} GiB; work {(tot-L[0][1])/2**30:.3f} GiB; union: decoder's view {dec:,} B, "
          f"encoder's {enc:,} B (session 28's layout at chunk 256: {o/2**30:.3f} GiB = {o:,} B)")
if a.cap:
    for n,v in sorted(layout(a.cap, chunk=a.chunk, old=a.old)[0], key=lambda x:-x[1]):
        print(f"| {n} | {v:,} | {v/2**20:.1f} |")
