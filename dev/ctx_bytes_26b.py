#!/usr/bin/env python3
"""ctx_bytes_26b.py: the CUDA context's device block (one cudaMalloc) at the 26B-A4B shapes, by arithmetic.

Mirrors src/cuda/context.cu ctx_dims_of / ctx_layout at the defaults (encoder chunk 256, DGEMMA_BRANCH on: the
second cuBLAS workspace, 4 MiB since session 29; P in place over the logits but its first C / 8 rows, session 29;
rows = max(canvas, chunk) = 256) with the config of /work/shared/spec/diffusiongemma.md
(H 2816, V 262,144, I 2112, IE 704, 128 experts top-8, 16 query heads; 25 sliding layers of 8 KV heads x 256, 5 full
of 2 x 512 with K = V (no v_proj), window 1024, canvas 256). Each buffer rounded up to CARVE_ALIGN (256 bytes).
Written by hand, so it goes stale when ctx_layout changes: the GPU's numbers are `dgemma bench --protocol step`'s
device memory columns (docs/cuda.md, "Acceptance of issues 11 and 12"). Prints the totals for a few context sizes
(dg_context_params.max_context), and with an argument CAP the buffers of that size, largest first.
"""
import sys
C,H,V,I,IE,E,K,NH=256,2816,262144,2112,704,128,8,16
T=256; TK=T*K; W=max(H,2*I)
dmax=512; qkvmax=max(16*256+2*8*256, 16*512+2*512)  # sliding q+k+v, full q+k (K = V: no v_proj)
XQ=max(TK*IE,T*H)
def al(n): return (n+255)//256*256
def layout(cap, side=True, inplace=True, side_kib=4096):
    S=cap+C; ring=min(((1024-1+T)+63)//64*64, S)
    kv=[]
    for li in range(30):
        full = li%6==5
        n = (2 if full else 8)*(S if full else ring)*(512 if full else 256)*2
        kv += [al(n), al(n)]
    rows=[("KV cache (K and V, 30 layers)", sum(kv))]
    b=[("ids",T*4),("x",T*H*4),("f1",T*W*4),("dense",T*H*4),("a",T*H*2),("xe",T*H*2),("u",T*H*4),
       ("qkv",T*qkvmax*4),("q",T*NH*dmax*4),("att",T*NH*dmax*2),("att_ws.part (8 key splits)",8*C*NH*(dmax+2)*4),
       ("gu",T*2*I*4),("h",T*max(I,IE)*2),("rlog",T*E*4),("rws (16 router splits)",16*T*E*4),
       ("moe.topk_idx+topk_w+pairs+slot_row",4*TK*4),("moe.tiles",(TK+E)*2*4),("moe small (count,start,order,wl,fg,gsc,...)",None),
       ("moe.h",TK*IE*2),("moe.y",TK*H*4),("moe.xs",XQ//32*4),("moe.xp",XQ*2),("moe.hs",TK*IE//32*4),
       ("logits [C, V] fp32",C*V*4),
       (("P's head: rows [0, C/8) of P [C, V] bf16 (the rest over the logits, DGEMMA_SC_INPLACE)",(C//8)*V*2) if inplace
        else ("P [C, V] bf16",C*V*2)),("soft",C*H*4),("uni+stats+bad+vcnt",None),
       ("vws (vocab partials)",C*((V+8191)//8192)*48),("blas_ws (cuBLAS workspace)",32<<20)]
    if side: b.append(("side.ws (DGEMMA_BRANCH's second cuBLAS workspace, DGEMMA_BRANCH_WS_KIB)",side_kib<<10))
    small = sum(al(x) for x in [E*4,(E+1)*4,4,E*4,2*E*4,4,(3+E)*4,(32+256+16384)*4]) + sum(al(x) for x in [C*4,C*32,4,C*4])
    out=rows+[(n,(al(v) if v is not None else small)) for n,v in b]
    return out
for cap in (2048, 8448, 9216, 32768+256, 100000+256):
    L=layout(cap); tot=sum(v for _,v in L)
    O=layout(cap, inplace=False, side_kib=32768); old=sum(v for _,v in O)
    print(f"cap {cap}: total {tot/2**30:.3f} GiB = {tot:,} B; KV {L[0][1]/2**30:.3f} GiB; "
          f"work {(tot-L[0][1])/2**30:.3f} GiB (session 28's layout: {old/2**30:.3f} GiB = {old:,} B)")
if len(sys.argv)>1:
    for n,v in sorted(layout(int(sys.argv[1])), key=lambda x:-x[1]):
        print(f"| {n} | {v:,} | {v/2**20:.1f} |")
