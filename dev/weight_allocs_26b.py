#!/usr/bin/env python3
"""weight_allocs_26b.py: the 26B-A4B weights' device allocations (src/cuda/upload.cu, one cudaMalloc per matrix before
session 28) and what rounding each allocation of 2 MiB or more up to whole 2 MiB pages costs, by arithmetic.

Mirrors upload_globals / upload_layer at the spec's shapes (/work/shared/spec/diffusiongemma.md: H 2816, V 262,144,
I 2112 (dense MLP and the self-conditioning MLP), IE 704, 128 experts, 16 query heads; 25 sliding layers of 8 KV heads
x 256, 5 full of 2 x 512 with K = V (no v_proj)) for the step protocol's checkpoints: `mkrandom` (bf16, 4-bit g64
experts) and `--recipe all=bf16,experts=3` (3-bit g64 experts). An expert stack in lane records (qr_tile_bytes) is
taken as its packed codes plus bf16 (scale, bias) pairs. The 2 MiB page is cudaMalloc's granularity for large
allocations on current GPUs (an assumption this script cannot check: the GPU call's DGEMMA_CUDA_MEMLOG lines do,
docs/cuda.md "Session 28 (helper mem12)"); allocations under 2 MiB are counted apart (the allocator packs those).
"""
H, V, I, IE, E, NH = 2816, 262144, 2112, 704, 128, 16
MiB = 1 << 20
PAGE = 2 * MiB


def allocs(bits, g=64):
    a = [("embed", V * H * 2), ("final_norm", H * 4), ("sc_pre_norm", H * 4),
         ("sc gate/up", 2 * I * H * 2), ("sc down", H * I * 2), ("rope sliding", 128 * 4), ("rope full", 256 * 4)]
    for li in range(30):
        full = li % 6 == 5
        D, nkv = (512, 2) if full else (256, 8)
        qkv = NH * D * H + nkv * D * H * (1 if full else 2)
        a += [("wqkv", qkv * 2), ("wo", NH * D * H * 2), ("q_norm", D * 4), ("k_norm", D * 4)]
        a += [("norm", H * 4)] * 7
        a += [("mlp gate/up", 2 * I * H * 2), ("mlp down", I * H * 2), ("router", E * H * 4),
              ("router_scale", H * 4), ("per_expert_scale", E * 4)]
        per = bits / 8 + 2 * 2 / g
        a += [("experts gate/up", int(E * 2 * IE * H * per)), ("experts down", int(E * H * IE * per))]
    return a


for bits, name in ((4, "4-bit g64 experts (mkrandom)"), (3, "3-bit g64 experts (all=bf16,experts=3)")):
    a = allocs(bits)
    big = [b for _, b in a if b >= PAGE]
    small = [b for _, b in a if b < PAGE]
    tot = sum(b for _, b in a)
    waste = sum((b + PAGE - 1) // PAGE * PAGE - b for b in big)
    print(f"{name}: {len(a)} allocations, {tot:,} B = {tot / 2**30:.3f} GiB; {len(big)} of >= 2 MiB lose "
          f"{waste:,} B = {waste / MiB:.1f} MiB = {waste / 2**30:.3f} GiB to 2 MiB pages; {len(small)} under 2 MiB "
          f"({sum(small) / MiB:.2f} MiB together)")
