#!/usr/bin/env python3
"""torch_anchors.py: the PyTorch anchors of `dgemma bench --protocol ceiling --device cuda`.

The same expert MLP at the same shapes as dgemma's GPU ceiling rows (DiffusionGemma 26B's MoE:
hidden H = 2816, expert intermediate IE = 704, 128 experts, top-8), timed the same way, so that
scripts/plots.sh can draw dgemma beside PyTorch's kernels:

  experts_all   all 128 experts, exactly M rows each (M = 1, 2, 4, ..., 256)
  moe_gathered  a canvas of T tokens routed top-8 of 128 uniformly at random with the routing of
                dgemma's rows (bench_route_ids in tools/bench.c: splitmix64 + partial Fisher-Yates,
                seed 42), so every expert gets the same row count as in dgemma's row

Per expert: h = gelu_tanh(x G^T) * (x U^T), y = h D^T (gate/up [1408, 2816] as one matrix, down
[2816, 704]). Implementations ("impl" in the JSON rows):

  torch_int4pack    torch._weight_int4pack_mm (tinygemm, int4 with bf16 scale and zero per group of
                    64): it has no grouped form, so the timed region loops over the experts (two
                    products and the GeGLU per expert); with --graph (the default) the loop is
                    captured once into a CUDA graph and the graph is replayed, so launch overhead
                    is not counted ("cuda_graph" says which was timed)
  torch_grouped_mm  torch._grouped_mm (bf16) over the 128 experts with offsets: one call for
                    gate/up, the GeGLU, one call for down

Timing: torch.cuda.Event around each call, `--reps` (50) after `--warmup` (5), each preceded by a
write of 256 MiB to a scratch tensor (the H200's L2 is 60 MB); median, min, max.

Roofline: max(weight bytes / read bandwidth, FLOPs / bf16 rate) with the GPU ceilings taken from
dgemma's rows (--ceilings FILE: the first JSON line with gpu_read_gb_s and gpu_bf16_tflop_s) or, without
it, measured here with PyTorch (a sum over 4 GiB of random int32, a GEMM 8192^3 bf16; the rows say
"ceilings_from"). Weight bytes as dgemma's 4-bit g64 and bf16 rows: int4 codes + two bf16 per group
of 64; bf16: 2 per weight.

Prints a markdown table; -o FILE writes JSON lines with the fields of dgemma's ceiling rows plus
"impl". Needs PyTorch with CUDA (written for PyTorch 2.11, CUDA 13); an op that is missing or
refuses the shapes is reported and its rows skipped, the others still run.

  python3 scripts/torch_anchors.py -o docs/results/torch_anchors.jsonl --ceilings docs/results/ceiling_cuda.jsonl
"""
import argparse
import json
import math
import statistics
import sys

H, IE, E, TOPK, G = 2816, 704, 128, 8, 64
MASK64 = (1 << 64) - 1


def splitmix64(state):
    """One step of splitmix64 as tools/bench.c: returns (new state, output)."""
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def route_ids(T, n_experts=E, top_k=TOPK, seed=42):
    """bench_route_ids (tools/bench.c): token t's top_k distinct experts."""
    st, ids = seed, []
    for _ in range(T):
        perm = list(range(n_experts))
        for j in range(top_k):
            st, r = splitmix64(st)
            r = j + r % (n_experts - j)
            perm[j], perm[r] = perm[r], perm[j]
            ids.append(perm[j])
    return ids


def counts_even(M):
    return [M] * E


def counts_random(T):
    c = [0] * E
    for e in route_ids(T):
        c[e] += 1
    return c


def weight_bytes(bits, n_experts):
    n = 3 * IE * H  # gate/up + down weights of one expert
    if bits >= 16:
        return n_experts * n * 2.0
    return n_experts * (n * bits / 8.0 + 2.0 * (n / G) * 2.0)


def flops(rows):
    return 2.0 * rows * 3.0 * IE * H


def fail(msg):
    print(f"torch_anchors: {msg}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1,2,4,8,16,32,64,128,256", help="M values (rows per expert)")
    ap.add_argument("--moe-tokens", default="256,512,1024", help="canvas tokens of the gathered rows ('0': none)")
    ap.add_argument("--impl", default="torch_int4pack,torch_grouped_mm")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--flush-mib", type=int, default=256)
    ap.add_argument("--no-graph", action="store_true", help="time the int4 expert loop eagerly (launches included)")
    ap.add_argument("--ceilings", help="dgemma JSON lines with gpu_read_gb_s / gpu_bf16_tflop_s")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("-o", "--out", help="JSON lines output")
    a = ap.parse_args()

    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        fail(f"PyTorch is not installed ({e})")
        return 1
    if not torch.cuda.is_available():
        fail("torch.cuda.is_available() is False: no GPU or a CPU-only PyTorch")
        return 1
    dev = torch.device(a.device)
    torch.cuda.set_device(dev)
    gpu = torch.cuda.get_device_name(dev)
    Ms = [int(x) for x in a.rows.split(",") if x]
    Ts = [int(x) for x in a.moe_tokens.split(",") if x and int(x) > 0]
    impls = [x for x in a.impl.split(",") if x]
    gen = torch.Generator(device=dev)
    gen.manual_seed(1234)

    flush = torch.empty(a.flush_mib << 18, dtype=torch.int32, device=dev)

    def time_fn(fn):
        """median, min, max seconds of fn() over reps, L2 flushed before each."""
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ts = []
        for r in range(a.warmup + a.reps):
            flush.fill_(r)
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            if r >= a.warmup:
                ts.append(e0.elapsed_time(e1) * 1e-3)
        return statistics.median(ts), min(ts), max(ts)

    # ---- ceilings
    read_bps = bf16_flops = None
    src = "pytorch"
    if a.ceilings:
        try:
            with open(a.ceilings, encoding="utf-8") as f:
                for line in f:
                    r = json.loads(line) if line.strip() else {}
                    if "gpu_read_gb_s" in r and "gpu_bf16_tflop_s" in r:
                        read_bps = float(r.get("roofline_read_gb_s", r["gpu_read_gb_s"])) * 1e9
                        bf16_flops = float(r.get("roofline_bf16_tflop_s", r["gpu_bf16_tflop_s"])) * 1e12
                        src = f"dgemma ({a.ceilings})"
                        break
        except (OSError, ValueError) as e:
            fail(f"--ceilings {a.ceilings}: {e}; measuring them with PyTorch instead")
        if read_bps is None:
            fail(f"--ceilings {a.ceilings}: no row with gpu_read_gb_s and gpu_bf16_tflop_s; measuring with PyTorch")
    if read_bps is None:
        buf = torch.randint(1, 2**31 - 1, (1 << 30,), dtype=torch.int32, device=dev, generator=gen)  # 4 GiB
        med, lo, hi = time_fn(lambda: buf.sum(dtype=torch.int64))
        read_bps = buf.numel() * 4 / lo
        del buf
        A = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16, generator=gen)
        B = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16, generator=gen)
        med, lo, hi = time_fn(lambda: torch.mm(A, B))
        bf16_flops = 2.0 * 8192**3 / lo
        del A, B
    print(f"GPU {gpu}, PyTorch {torch.__version__} (CUDA {torch.version.cuda}); ceilings from {src}: read "
          f"{read_bps / 1e9:.1f} GB/s, bf16 {bf16_flops / 1e12:.1f} TFLOP/s; median of {a.reps} after {a.warmup} "
          f"warm-up, L2 flushed ({a.flush_mib} MiB written) before each\n")

    # ---- weights: bf16 stacks [E, N, K] (grouped_mm) and tinygemm packs (int4pack)
    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, device=dev, dtype=torch.float32, generator=gen) * scale).to(torch.bfloat16)

    rows_out = []
    out = open(a.out, "w", encoding="utf-8") if a.out else None
    print("| impl | shape | tokens | M | weight MB | GFLOP | median ms | spread ms | GB/s | TFLOP/s | roofline ms | "
          "bound | of roofline | note |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")

    def emit(impl, kernel, shape, bits, counts, tokens, t, note, graph):
        hit = sum(1 for c in counts if c > 0)
        rows = sum(counts)
        wb, fl = weight_bytes(bits, hit), flops(rows)
        med, lo, hi = t
        tb, tf = wb / read_bps, fl / bf16_flops
        roof = max(tb, tf)
        M = rows / hit if hit else 0
        fmt = "bf16" if bits >= 16 else f"{bits}-bit g{G}"
        print(f"| {impl} | {shape} | {tokens} | {M:g} | {wb / 1e6:.2f} | {fl / 1e9:.3f} | {med * 1e3:.4f} | "
              f"{lo * 1e3:.4f}–{hi * 1e3:.4f} | {wb / med / 1e9:.1f} | {fl / med / 1e12:.2f} | {roof * 1e3:.4f} | "
              f"{'memory' if tb >= tf else 'compute'} | {100 * roof / med:.1f}% | {note} |", flush=True)
        r = {"protocol": "ceiling", "device": "cuda", "impl": impl, "kernel": kernel, "shape": shape, "N": IE, "K": H,
             "experts": hit, "tokens": tokens, "format": fmt, "bits": bits, "group_size": 0 if bits >= 16 else G,
             "M": M, "calls_per_run": 1, "reps": a.reps, "warmup": a.warmup, "l2_flush_bytes": a.flush_mib << 20,
             "weight_bytes": wb, "flops": fl, "median_s": med, "min_s": lo, "max_s": hi, "gb_s": wb / med / 1e9,
             "gflop_s": fl / med / 1e9, "tflop_s": fl / med / 1e12, "roofline_s": roof,
             "roofline_gb_s": wb / roof / 1e9, "bound": "memory" if tb >= tf else "compute", "fraction": roof / med,
             "gpu": gpu, "gpu_read_gb_s": read_bps / 1e9, "gpu_bf16_tflop_s": bf16_flops / 1e12,
             "ceilings_from": src, "cuda_graph": graph, "torch": torch.__version__, "note": note}
        rows_out.append(r)
        if out:
            out.write(json.dumps(r) + "\n")
            out.flush()

    cases = [("experts_all", 16 * M, counts_even(M)) for M in Ms] + [("moe_gathered", T, counts_random(T)) for T in Ts]
    max_rows = max(sum(c) for _, _, c in cases)
    x_all = rnd(max_rows, H).abs_().add_(0.5)  # non-zero activations in [0.5, ...)

    def geglu(gu):
        g, u = gu[:, :IE], gu[:, IE:]
        return F.gelu(g, approximate="tanh") * u

    # ---- torch._grouped_mm (bf16)
    if "torch_grouped_mm" in impls:
        if not hasattr(torch, "_grouped_mm"):
            fail("torch._grouped_mm is missing in this PyTorch: torch_grouped_mm rows skipped")
        else:
            w_gu = rnd(E, 2 * IE, H, scale=0.02)  # [E, N, K]; passed as [E, K, N] (column-major B)
            w_dn = rnd(E, H, IE, scale=0.02)
            for shape, tokens, counts in cases:
                rows = sum(counts)
                x = x_all[:rows]
                offs = torch.tensor(counts, device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)

                def run():
                    h = geglu(torch._grouped_mm(x, w_gu.transpose(-2, -1), offs=offs))
                    return torch._grouped_mm(h, w_dn.transpose(-2, -1), offs=offs)

                try:
                    run()
                    torch.cuda.synchronize()
                    t = time_fn(run)
                except (RuntimeError, TypeError) as e:
                    fail(f"torch._grouped_mm refused {shape} tokens {tokens}: {str(e).splitlines()[0]}")
                    continue
                emit("torch_grouped_mm", "torch._grouped_mm", shape, 16, counts, tokens, t,
                     "one call for gate/up, GeGLU, one for down", False)
            del w_gu, w_dn

    # ---- torch._weight_int4pack_mm (tinygemm int4 g64), a loop over the experts
    if "torch_int4pack" in impls:
        if not (hasattr(torch, "_weight_int4pack_mm") and hasattr(torch, "_convert_weight_to_int4pack")):
            fail("torch._weight_int4pack_mm / torch._convert_weight_to_int4pack missing: torch_int4pack rows skipped")
        else:
            def pack(N, K):
                """Random int4 codes [N, K] packed for tinygemm, and scales/zeros [K / G, N, 2] bf16."""
                q = torch.randint(0, 16, (N, K), device=dev, dtype=torch.int32, generator=gen)
                q8 = ((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8)  # [N, K / 2]: the uint8 form of PyTorch >= 2.5
                inner = next(t for t in (8, 4, 2) if K % (16 * t) == 0)
                wp = torch._convert_weight_to_int4pack(q8, inner)
                sz = torch.stack([rnd(K // G, N, scale=1e-3), rnd(K // G, N, scale=1e-3)], dim=2).contiguous()
                return wp, sz

            try:
                packs = [(pack(2 * IE, H), pack(H, IE)) for _ in range(E)]
                (wp, sz), _ = packs[0]
                torch._weight_int4pack_mm(x_all[:1], wp, G, sz)
                torch.cuda.synchronize()
            except (RuntimeError, TypeError, StopIteration) as e:
                fail(f"tinygemm int4 packing or product failed: {str(e).splitlines()[0]}; torch_int4pack rows skipped")
                packs = None
            for shape, tokens, counts in cases if packs else []:
                starts = [0]
                for c in counts:
                    starts.append(starts[-1] + c)
                xs = [x_all[starts[e]:starts[e + 1]] for e in range(E)]

                def run():
                    for e in range(E):
                        if counts[e] == 0:
                            continue
                        (gp, gs), (dp, ds) = packs[e]
                        h = geglu(torch._weight_int4pack_mm(xs[e], gp, G, gs))
                        torch._weight_int4pack_mm(h, dp, G, ds)

                graph, fn = False, run
                try:
                    run()
                    torch.cuda.synchronize()
                    if not a.no_graph:
                        try:
                            s = torch.cuda.Stream()
                            s.wait_stream(torch.cuda.current_stream())
                            with torch.cuda.stream(s):
                                run()
                            torch.cuda.current_stream().wait_stream(s)
                            gr = torch.cuda.CUDAGraph()
                            with torch.cuda.graph(gr):
                                run()
                            fn, graph = gr.replay, True
                        except RuntimeError as e:
                            fail(f"CUDA graph capture failed ({str(e).splitlines()[0]}): timing the loop eagerly")
                    t = time_fn(fn)
                except RuntimeError as e:
                    fail(f"torch._weight_int4pack_mm refused {shape} tokens {tokens}: {str(e).splitlines()[0]}")
                    continue
                emit("torch_int4pack", "torch._weight_int4pack_mm", shape, 4, counts, tokens, t,
                     f"loop over the {sum(1 for c in counts if c)} experts hit" + (" (CUDA graph)" if graph else
                                                                                  " (eager, launches included)"),
                     graph)
    if out:
        out.close()
    print(f"\nweight MB: the experts' weights read once (hit experts only; int4: codes + bf16 scale and zero per "
          f"group of {G}); GB/s = weight bytes / median; of roofline = roofline / median")
    return 0 if rows_out else 1


if __name__ == "__main__":
    sys.exit(main())
