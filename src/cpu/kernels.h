/* kernels.h: the CPU kernel interface. One forward pass (forward.c) calls
 * these; a scalar fp32 reference (cpu/ref.c) is the oracle every other
 * implementation (AVX2, AVX-512) is tested against (tests/test_kernels.c).
 *
 * Weights stay in the checkpoint's dtype (f32, bf16 or f16) inside the mmap;
 * kernels widen them to fp32 on the fly and accumulate in fp32. */
#ifndef DG_KERNELS_H
#define DG_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "base/weight.h" /* dg_weight (and dtype.h: dg_dtype, the bf16/f16 conversions) */
#include "base/envsw.h" /* dg_env_quote */

typedef struct dg_kernels {
  const char *name;
  /* y[t*ldy + n] = sum_k x[t*ldx + k] * W[row0 + n, k]
   * for t in [0, T), n in [0, N), k in [0, W.cols). fp32 accumulation.
   * Parallel over n with n_threads OpenMP threads.
   * Quantized weights (w->bits != 0) are dequantized on the fly exactly as
   * dg_quant_dequant_row does, so results differ from the float path on the
   * dequantized matrix only by summation order. */
  void (*matmul)(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t T, const dg_weight *w,
                 int64_t row0, int64_t N, int n_threads);
  /* The gathered MoE product: activation rows are grouped by expert; rows
   * [start[e], start[e+1]) of x go through expert e:
   *   y[i*ldy + n] = sum_k x[i*ldx + k] * W[e*rows_per_expert + row_off + n, k]
   * for e in [0, E), n in [0, N). One parallel region over (expert, block of
   * 4 output rows) pairs instead of one per expert. Each element is summed in
   * the same order as `matmul` computes it, so the result equals E calls of
   * matmul bit for bit. */
  void (*matmul_grouped)(float *y, int64_t ldy, const float *x, int64_t ldx, const int32_t *start, int E,
                         const dg_weight *w, int64_t rows_per_expert, int64_t row_off, int64_t N, int n_threads);
  /* The product over W's rows (the self-conditioning soft embedding, spec 5:
   * probabilities [T, V] times the tied embedding [V, H]):
   *   y[t*ldy + j] = sum_v x[t*ldx + v] * W[v, j]
   * for t in [0, T), j in [0, W.cols), v in [0, W.rows); y is overwritten.
   * Every element is summed exactly as the scalar loop
   *   s = +0; for v in increasing order: s = fl(s + fl(x[v] * W[v, j]))
   * computes it (a product rounded to fp32, then a sum: never a fused
   * multiply-add; quantized weights dequantized as dg_quant_dequant_row
   * does), so every implementation gives the oracle's bits: the tiles only
   * change which (t, j) pairs share a weight load, never the order over v.
   * Terms with x[v] = 0 may be skipped or added: fl(0 * w) = +-0 and s is
   * never -0 (it starts at +0 and an IEEE round-to-nearest sum is -0 only
   * when both terms are), so adding them changes no bit, provided W is
   * finite (0 * inf would be NaN). Parallel over column blocks with
   * n_threads OpenMP threads. */
  void (*matmul_rows)(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t T, const dg_weight *w,
                      int n_threads);
  /* Optional (NULL: forward.c's scalar loop). The attention of nq <= 16 queries sharing one KV
   * head (head dimension D, a multiple of 16, <= DG_ATTN_DMAX of context.h): query i (qv[i], D
   * floats) attends over cache rows [lo[i], lo[i] + n1[i]) of kc / vc (row stride D), then the
   * n2 chunk rows of ck / cv (row stride cks); softmax in fp32, the result in ov[i]. Bit-identical
   * to the scalar loop (same operations in the same order per query); one thread; scratch holds
   * DG_SCORE_FLOATS(cache rows spanned, n2) floats. */
  void (*attn_block)(int nq, const float *const *qv, float *const *ov, const int32_t *lo, const int32_t *n1,
                     const float *kc, const float *vc, const float *ck, const float *cv, int64_t cks, int n2, int D,
                     float *scratch);
} dg_kernels;

void dg_attn_block_avx512(int nq, const float *const *qv, float *const *ov, const int32_t *lo, const int32_t *n1,
                          const float *kc, const float *vc, const float *ck, const float *cv, int64_t cks, int n2,
                          int D, float *scratch);

/* The scalar oracle: plain loops, k summed in increasing order. */
const dg_kernels *dg_kernels_ref(void);
/* Best implementation for this CPU (cpuid): AVX-512, AVX2+FMA or the oracle.
 * DGEMMA_KERNELS=ref|avx2|avx512|avx512lp|avx2lp in the environment overrides
 * the choice (avx512lp and avx2lp are never chosen by default). */
const dg_kernels *dg_kernels_best(void);

/* The set DGEMMA_KERNELS = env asks for (env NULL or "": the default, the best
 * exact set AVX-512 > AVX2 > ref; "avx512lp" and "avx2lp" only on request). A
 * set this CPU lacks gives the best exact set and a one-line reason in why[n]
 * (naming the variable, the value and the set taken); a name that is none of
 * ref, avx2, avx512, avx512lp, avx2lp also gives the best exact set, with
 * dg_kernels_refusal's line in why (dg_switches_check refuses such a name
 * before any model loads). why[0] = 0 when env was honoured. why may be NULL. */
const dg_kernels *dg_kernels_pick(const char *env, char *why, size_t n);

/* 1 when env is NULL, "" or the name of a kernel set (whether or not this CPU
 * has it), else 0. */
int dg_kernels_known(const char *env);

/* The one-line refusal of a DGEMMA_KERNELS = env that names no set, in why[n]
 * (the variable, the value quoted as envsw.h quotes it, what is allowed). */
void dg_kernels_refusal(const char *env, char *why, size_t n);
const dg_kernels *dg_kernels_avx2(void);   /* NULL if the CPU lacks AVX2+FMA+F16C */
const dg_kernels *dg_kernels_avx512(void); /* NULL if the CPU lacks AVX-512 F/BW/VL/DQ */
/* Opt-in, lossy (DGEMMA_KERNELS=avx512lp): bf16 weights through vdpbf16ps with
 * the activations rounded to bf16, MLX affine 2/4/8-bit weights through
 * vpdpbusd with the activations quantized to int8 per row and weight group;
 * other weights, and matmul_rows, as dg_kernels_avx512. The rounding and its
 * bound are derived in cpu/matmul_avx512lp.c and tested in test_kernels.c.
 * NULL if the CPU lacks AVX-512 BF16 or VNNI. */
const dg_kernels *dg_kernels_avx512lp(void);
/* Whether avx512lp's AMX tiles (DGEMMA_CPU_AMX=1; matmul_avx512lp.c) can run here: the CPU has AMX-TILE and AMX-INT8
 * and Linux granted this process the tile data (arch_prctl ARCH_REQ_XCOMP_PERM, asked once). Call only where
 * dg_kernels_avx512lp() is not NULL. */
int dg_cpu_amx_usable(void);
/* Opt-in, lossy (DGEMMA_KERNELS=avx2lp): MLX affine 2/3/4/6/8-bit weights (groups
 * 32/64/128) through AVX2 vpmaddubsw + vpmaddwd with the activations quantized
 * to int8 per row and weight group (to [-127, 127], or [-64, 64] for 8-bit
 * weights so that vpmaddubsw's s16 pair sums cannot saturate); other weights,
 * and matmul_rows, as dg_kernels_avx2 (exact). Same entry points and contracts
 * as dg_kernels (the grouped entry equals per-expert plain calls bit for bit)
 * except the rounding of the activations, derived in cpu/matmul_avx2lp.c and
 * tested in test_kernels.c. NULL if the CPU lacks AVX2 or FMA. */
const dg_kernels *dg_kernels_avx2lp(void);

/* A copy of a quantized weight in the order avx512lp's tiles read it, 4 rows interleaved
 * (layout and cost: cpu/pack.c). dg_cpu_pack_applies: 2-, 4- and 8-bit, any group size and
 * shape. dg_cpu_pack_build returns the copy (dg_big_alloc'd, base/dg_mem.h: 2 MiB-aligned and
 * madvise(MADV_HUGEPAGE)'d with DGEMMA_THP=1; the caller free()s it and stores it in
 * w->cpu_pack), or NULL when it does not apply or out of memory; avx512lp gives the same
 * bits with it as without and, with it, reads nothing of the MLX layout's codes, scales and
 * biases (but for the exact kernels' fallback when a product's scratch cannot be allocated). */
int dg_cpu_pack_applies(const dg_weight *w);
/* Which matrices a model run by avx512lp packs (the CPU backend, tools/ceiling.c): DGEMMA_CPU_PACK "0"
 * DG_CPU_PACK_NONE, "1" DG_CPU_PACK_ALL (every matrix dg_cpu_pack_applies to), "nat" DG_CPU_PACK_NAT (only those
 * dg_cpu_pack_nat holds for), "il" DG_CPU_PACK_IL (those, in the interleaved layout), "seq1" DG_CPU_PACK_SEQ1 (no
 * pack, as 0, and avx512lp's products of 1-3 activation rows on the MLX layout run the 4-row tiles (NTILE_SEQ,
 * VTILE1) instead of the one run of rows a thread (MV1, matmul_avx512lp.c): the same bits, kept for the A/B), unset
 * DG_CPU_PACK_DEFAULT; any other value -1, with the one-line reason that both
 * callers refuse it with in why[n] (the value quoted by dg_env_quote; why[0] = 0 otherwise; why may be NULL). */
enum { DG_CPU_PACK_NONE = 0, DG_CPU_PACK_ALL = 1, DG_CPU_PACK_NAT = 2, DG_CPU_PACK_IL = 3, DG_CPU_PACK_SEQ1 = 4 };
/* Still no pack by default. Session 19 (idle side-by-side on a 2-core EPYC with a ~105 GFLOP/s FMA ceiling,
 * docs/results/cpu-s19/): with the scales' prefetch the pack was no slower at M = 8-256 and faster at M = 1 on gate/up
 * [1408, 2816] (4-bit g64, natural-order one-row tiles: 1.09x and 1.29x), but the down product [2816, 704] (11 groups a
 * row: by-step tiles) at M = 1 ran either as fast as without it or 1.4-2.4x slower, by process and window. Session 20
 * made "nat" (those gate/up-shaped matrices only, chosen by format and row length) and measured it as the default on
 * a 2-core Zen 5 EPYC (family 26, FMA ceiling ~165 GFLOP/s, docs/results/cpu-s20/): there the pack is slower at M = 1
 * in every run, gate/up 0.46x (median of five alternations; 0.134-0.143 ms a call vs 0.056-0.070 without) and down
 * with DGEMMA_CPU_PACK=1 0.27x (0.100 vs 0.027 ms), so which layout a matvec wants depends on the CPU. Session 21,
 * the same Zen 5 (idle side-by-side, two sets of five alternations, docs/measurements.md): "il" (the same matrices
 * interleaved 8 rows a unit, every line prefetched) gate/up M = 1 1.26x and 1.80x no pack (all ten 1.11-2.36), no
 * other row slower, but 0.93x [0.81-1.16] and 0.89x [0.82-1.34] ggml q4_K's GB/s in the same runs (above q4_K only
 * in processes with the fast copy ceiling): the M = 1 bullet's condition for a default is not met, so "il" stays
 * opt-in. */
#define DG_CPU_PACK_DEFAULT DG_CPU_PACK_NONE
int dg_cpu_pack_wanted(char *why, size_t n);
/* The layout avx512lp quantizes a product's activations in for a B-bit, group-G weight of K columns, which picks
 * its tiles (cpu/matmul_avx512lp.c, qx_buf): n = G B / 32 dwords of packed codes a group when n <= 8 and the row's
 * last block of 16 groups is at most 1/8 empty (the "transposed" layout; with n = 8, calls of < 4 activation rows
 * run the natural-order one-row tiles, NTILE), else 0 (the "by step" layout: e.g. 4-bit g128, 8-bit g64, or fewer
 * than 14 groups a row, as the 26B's down product's 11). */
static inline int dg_lp_tr_n(int64_t K, int B, int G) {
  const int64_t ng = K / G, nblk = (ng + 15) / 16, n = (int64_t)G * B / 32;
  return n <= 8 && (nblk * 16 - ng) * 8 <= nblk * 16 ? (int)n : 0;
}
/* Whether DGEMMA_CPU_PACK=nat (DG_CPU_PACK_NAT) packs w: dg_cpu_pack_applies and dg_lp_tr_n(cols, bits, group) = 8,
 * i.e. 2-bit g128, 4-bit g64 or 8-bit g32 with at least 14 groups a row (the last block of 16 at most 1/8 empty):
 * the matrices whose matrix-vector products run the natural-order tiles (NTILE) and larger ones the transposed
 * tiles on prepared rows. The 26B's experts' gate/up [1408, 2816] at 4-bit g64 (44 groups) are such; its down
 * [2816, 704] (11 groups) is not, nor is any by-step or n = 2 / 4 matrix (not measured with the pack at M = 1). */
int dg_cpu_pack_nat(const dg_weight *w);
/* Whether mode (a dg_cpu_pack_wanted value >= 0) packs w: NONE and SEQ1 never, ALL dg_cpu_pack_applies, NAT and IL
 * dg_cpu_pack_nat. */
int dg_cpu_pack_takes(const dg_weight *w, int mode);
void *dg_cpu_pack_build(const dg_weight *w);
/* The interleaved layout of R = 4 or 8 rows (DGEMMA_CPU_PACK=il: R = DG_CPU_IL_ROWS; layout and cost: cpu/pack.c) of a
 * weight dg_cpu_pack_nat takes (its one-row products run NTILE): each R-row unit one contiguous run of bytes in the
 * order avx512lp's matrix-vector tile reads them (codes, scales, biases). dg_big_alloc'd (the caller free()s it,
 * stores it in w->cpu_pack and R in w->cpu_pack_il); NULL when dg_cpu_pack_nat does not hold, R is neither 4 nor 8,
 * or out of memory. avx512lp gives the same bits with it as without (tests/test_kernels.c). */
void *dg_cpu_pack_build_il(const dg_weight *w, int R);
#ifndef DG_CPU_IL_ROWS
#define DG_CPU_IL_ROWS 8
#endif
#if DG_CPU_IL_ROWS != 4 && DG_CPU_IL_ROWS != 8
#error "DG_CPU_IL_ROWS (-DDG_CPU_IL_ROWS=...) is 4 or 8: another value builds, then every il load fails as out of memory"
#endif
#define DG_CPU_IL_STR_(x) #x
#define DG_CPU_IL_STR(x) DG_CPU_IL_STR_(x)
#define DG_CPU_IL_ROWS_STR DG_CPU_IL_STR(DG_CPU_IL_ROWS)
/* Builds the pack that mode (a dg_cpu_pack_wanted value >= 0) wants for w, if it takes w (dg_cpu_pack_takes), and
 * sets w->cpu_pack (and w->cpu_pack_il: 0, or DG_CPU_IL_ROWS for IL). Returns 1 when mode does not take w (w
 * untouched), 0 when built, -1 out of memory (w untouched). The CPU backend and tools/ceiling.c call it. */
int dg_cpu_pack_set(dg_weight *w, int mode);
/* Where a quantized weight's rows are, for the tiles (once per call, not per row): pack = the
 * weight's pack or NULL; rb = a row's packed bytes, tl = rb % 64 (the partial last step's bytes),
 * sbrow = a row's scale (or bias) bytes, P = a pack's 4-row block's bytes (cpu/pack.c). */
typedef struct dg_cpu_pack_geom {
  const char *pack;
  int64_t rb, tl, sbrow, P;
  /* The interleaved layout (w->cpu_pack_il = R != 0; pack is then NULL): il = the pack; an R-row unit's bytes U; a
   * whole block of 16 groups' bytes BF (R 512 codes, R 16 scales); the biases' offset in a unit boff; esz, the bytes
   * of a scale; ng groups a row; the last block's 64-byte steps ns_last and groups n_last (cpu/pack.c). */
  const char *il;
  int R, ns_last, n_last;
  int64_t U, BF, boff, esz, ng;
} dg_cpu_pack_geom;
dg_cpu_pack_geom dg_cpu_pack_geom_of(const dg_weight *w);
/* Row r of a pack (g->pack != NULL, r < rows): byte o (a multiple of 64 below rb - tl) of its
 * codes at *codes + 4 o, the tl bytes of the partial last step at *tail, its scales and biases
 * (contiguous) at *sc and *bi. The one definition of the layout: cpu/pack.c writes through it. */
static inline void dg_cpu_pack_row(const dg_cpu_pack_geom *g, int64_t r, const uint8_t **codes, const uint8_t **tail,
                                   const char **sc, const char **bi) {
  const char *b = g->pack + (size_t)(r >> 2) * (size_t)g->P;
  const int64_t j = r & 3, c4 = 4 * g->rb; /* the block's codes: 4 rows' whole steps, then their tails */
  *codes = (const uint8_t *)b + 64 * j;
  *tail = (const uint8_t *)b + c4 - 4 * g->tl + j * g->tl;
  *sc = b + c4 + j * g->sbrow;
  *bi = b + c4 + (4 + j) * g->sbrow;
}
/* Unit u of an interleaved pack (g->il != NULL): block blk's bytes at the return value (its sub-pass p's step m of
 * row 4 p + i at + (p ns + m) 256 + 64 i, ns = 8 or g->ns_last for the last block; then the R rows' scales of the
 * block's n groups, row r at + 64 R ns + r n esz); the unit's biases at g->il + u U + boff (row r at + r ng esz).
 * The one definition of the layout: cpu/pack.c writes through it. */
static inline const char *dg_cpu_il_block(const dg_cpu_pack_geom *g, int64_t u, int64_t blk) {
  return g->il + (size_t)u * (size_t)g->U + (size_t)blk * (size_t)g->BF;
}
/* The R rows of unit u of an interleaved pack copied out in the MLX layout, reading the unit forward: row j's codes
 * (rb bytes, then zeros to a multiple of 64) at dst + j stride, its ng scales 64-byte aligned after them (at
 * + rs, rs = rb rounded up to 64), its biases at + rs + ss (ss = ng esz rounded up to 64); stride >= rs + 2 ss.
 * The tiles of 4 or more activation rows read these where a call takes a 4-row part of a unit in part
 * (cpu/matmul_avx512lp.c, il_unit). */
void dg_cpu_il_unit_rows(const dg_cpu_pack_geom *g, int64_t u, char *dst, int64_t stride);

#endif
