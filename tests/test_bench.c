/* test_bench.c: the accounting of `dgemma bench` (tools/bench.c,
 * tools/ceiling.c), not its speed: bytes and FLOPs of the ceiling shapes and
 * of batched decoder passes against hand counts, the MoE routing, the
 * grouping of a recorded batch into passes for the floor, the batch
 * protocol's outputs against B = 1 runs canvas by canvas on the bundled
 * model, the step protocol's rows and KV cache bytes, and the option errors of the CLI. No timing is asserted. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <cpuid.h>
#include <math.h>
#include <sys/wait.h>

#include "bench.h"
#include "cuda/backend.h"

static char g_dir[256];

/* Run build/dgemma ARGS; returns its exit status, stdout and stderr in *out / *err (malloc'd). */
static int run_cli(const char *args, char **out, char **err) { return dg_test_run_cli(g_dir, args, out, err); }

/* ---- ceiling shapes ------------------------------------------------------------------ */

/* Hand counts at the 26B model's MoE shapes: gate/up [1408, 2816], down [2816, 704].
 * bf16: 2 bytes per weight. Affine B bits, group 64: B/8 bytes per weight, plus a bf16 scale
 * and bias per group of 64 (2816 / 64 = 44 groups per gate/up row, 704 / 64 = 11 per down row). */
static void test_matmul_cost(void **state) {
  (void)state;
  bench_cost c = bench_matmul_cost(1408, 2816, 16, 64, 16);
  assert_true(c.weight_bytes == 7929856.0);       /* 1408 * 2816 * 2 */
  assert_true(c.flops == 126877696.0);            /* 2 * 16 * 1408 * 2816 */
  c = bench_matmul_cost(1408, 2816, 4, 64, 1);
  assert_true(c.weight_bytes == 2230272.0);       /* 1,982,464 codes + 2 * 1408 * 44 * 2 */
  assert_true(c.flops == 7929856.0);
  c = bench_matmul_cost(1408, 2816, 3, 64, 256);
  assert_true(c.weight_bytes == 1734656.0);       /* 1,486,848 + 247,808 */
  assert_true(c.flops == 2030043136.0);           /* 2 * 256 * 1408 * 2816 */
  c = bench_matmul_cost(2816, 704, 4, 64, 8);
  assert_true(c.weight_bytes == 1115136.0);       /* 991,232 + 2 * 2816 * 11 * 2 */
  assert_true(c.flops == 31719424.0);
  c = bench_matmul_cost(2816, 704, 2, 64, 1);
  assert_true(c.weight_bytes == 619520.0);        /* 495,616 + 123,904 */
  assert_true(c.kv_bytes == 0 && c.other_bytes == 0);
}

/* The gathered-MoE routing: every token picks top_k distinct experts; rows grouped by expert. */
static void test_route(void **state) {
  (void)state;
  int32_t start[129], start2[129], tok[2048];
  int hit = bench_route(256, 128, 8, 42, start, tok);
  assert_int_equal(start[0], 0);
  assert_int_equal(start[128], 2048);
  int nonempty = 0, per_token[256] = {0};
  for (int e = 0; e < 128; e++) {
    assert_true(start[e + 1] >= start[e]);
    nonempty += start[e + 1] > start[e];
    for (int32_t r = start[e]; r < start[e + 1]; r++) {
      assert_true(tok[r] >= 0 && tok[r] < 256);
      per_token[tok[r]]++;
      if (r > start[e]) assert_true(tok[r] > tok[r - 1]); /* a token at most once per expert: distinct experts */
    }
  }
  for (int t = 0; t < 256; t++) assert_int_equal(per_token[t], 8);
  assert_int_equal(hit, nonempty);
  /* 128 (1 - (120/128)^256) = 128 - 8e-6 experts expected: all of them */
  assert_int_equal(hit, 128);
  assert_int_equal(bench_route(256, 128, 8, 42, start2, NULL), hit); /* deterministic */
  assert_memory_equal(start, start2, sizeof start);
  /* 2 tokens x top-8 of 128: at most 16 experts, exactly 8 for 1 token */
  assert_int_equal(bench_route(1, 128, 8, 7, start, NULL), 8);
  hit = bench_route(2, 128, 8, 7, start, NULL);
  assert_true(hit >= 8 && hit <= 16);
}

/* ---- batched decoder passes (the bundled model) ---------------------------------------- */

static dg_model *load_small(int tokenizer) {
  dg_model_params mp = dg_model_default_params();
  mp.no_tokenizer = !tokenizer;
  mp.n_threads = 1;
  dg_model *m = NULL;
  assert_dg_ok(dg_model_load("models/dgemma-small", &mp, &m));
  return m;
}

/* Hand count on the bundled model (config.json: H 256, V 4096, I 512, IE 128, 8 experts top-2, 4 query
 * heads, 4 sliding layers of D 64 and 2 full of D 128, canvas 64; test_eval's test_bench_cost has the
 * per-token sums): per forwarded row 4,927,488 layer and 393,216 SC-MLP multiply-adds; attention
 * 4 * rows * 64 keys * 4 heads * (4 * 64 + 2 * 128); LM head + SC product 2 * head * 2 * 4096 * 256. */
static void test_decoder_batch_cost(void **state) {
  (void)state;
  dg_model *m = load_small(0);
  bench_pass_seq full = {64, 64, 0}, two[2] = {{64, 64, 0}, {64, 64, 0}}, part = {16, 8, 0};
  bench_cost c1 = bench_decoder_batch_cost(m, &full, 1), c0 = bench_decoder_cost(m, 0);
  assert_true(c1.flops == c0.flops && c1.weight_bytes == c0.weight_bytes && c1.kv_bytes == c0.kv_bytes &&
              c1.other_bytes == c0.other_bytes);
  assert_true(fabs(c1.flops - 983040000.0) < 1.0);
  /* two canvases in one pass: twice the FLOPs, K/V and logits; the weights once (the experts' expected
   * hit fraction goes from 1 - 0.75^64 to 1 - 0.75^128, a relative change below 1e-8) */
  bench_cost c2 = bench_decoder_batch_cost(m, two, 2);
  assert_true(c2.flops == 2 * c1.flops);
  assert_true(c2.kv_bytes == 2 * c1.kv_bytes && c2.other_bytes == 2 * c1.other_bytes);
  assert_true(fabs(c2.weight_bytes - c1.weight_bytes) <= 1e-8 * c1.weight_bytes);
  /* 16 forwarded rows, 8 through the LM head: 2*16*(4,927,488 + 393,216) + 4*16*64*4*512 + 2*8*2*4096*256 */
  bench_cost cp = bench_decoder_batch_cost(m, &part, 1);
  assert_true(fabs(cp.flops - 212205568.0) < 1.0);
  assert_true(cp.other_bytes == 8.0 * 4096 * 4);
  assert_true(cp.kv_bytes == c1.kv_bytes); /* every position attends to the whole canvas */
  /* experts: 6 layers x (1024 x 256 + 2048 x 128) bf16 = 9,437,184 bytes, hit fraction 1 - 0.75^T */
  double want = c1.weight_bytes - ((1 - pow(0.75, 64)) - (1 - pow(0.75, 16))) * 9437184.0;
  if (fabs(cp.weight_bytes - want) > 1e-6 * want) fail_msg("weight bytes %.1f, want %.1f", cp.weight_bytes, want);
  /* context adds attention and K/V, not weights */
  bench_pass_seq late = {16, 8, 100};
  bench_cost cl = bench_decoder_batch_cost(m, &late, 1);
  assert_true(cl.weight_bytes == cp.weight_bytes);
  assert_true(fabs((cl.flops - cp.flops) - 4.0 * 16 * 100 * 4 * 512) < 1.0);
  dg_model_free(m);
}

/* bench --profile's per-stage floors: the stages of a decoder and an encoder pass add up to the whole
 * pass's cost (bench_decoder_cost, bench_encoder_cost) field by field; the hand counts of the bundled
 * model above for the attention (4 * 64 rows * 64 keys * 4 heads * 512) and the LM head (2 * 64 * 4096
 * * 256, its embedding once: 4096 * 256 bf16); the stages without weights have no weight, K/V or FLOP terms; the
 * activation bytes of norms, combine and sampler statistics (stage_acts, session 26) by hand for the bundled model
 * (H 256, V 4096, 6 layers, top-2, bf16 embedding rows of 512 bytes, 64 rows): norms 64 (512 + 4 * 256) for the
 * embedding, 8 * 64 * 256 for the decoder's norm of it, 6 * 64 * 256 for layer 0's input norm and 20 * 64 * 256 per
 * layer with a residual (6 decoder, 5 encoder); combine (12 + 4 * 2) * 64 * 256 + 12 * 64 * 2 per layer with a combine
 * plus 2 * 64 * 256 for each of 5 next-layer norms; statistics 64 * 4096 * 4 (decoder only); none in a pass's cost. */
static void test_stage_cost(void **state) {
  (void)state;
  dg_model *m = load_small(0);
  for (int causal = 0; causal <= 1; causal++) {
    bench_cost st[DG_PROFILE_STAGES], sum = {0, 0, 0, 0, 0};
    memset(st, 0, sizeof st);
    bench_stage_cost(m, 64, 100, causal, st);
    for (int i = 0; i < DG_PROFILE_STAGES; i++) {
      sum.weight_bytes += st[i].weight_bytes; sum.kv_bytes += st[i].kv_bytes;
      sum.other_bytes += st[i].other_bytes; sum.flops += st[i].flops;
    }
    bench_cost w = causal ? bench_encoder_cost(m, 64, 100) : bench_decoder_cost(m, 100);
    if (fabs(sum.weight_bytes - w.weight_bytes) > 1e-9 * w.weight_bytes || fabs(sum.kv_bytes - w.kv_bytes) > 1e-9 * w.kv_bytes ||
        sum.other_bytes != w.other_bytes || fabs(sum.flops - w.flops) > 1e-9 * w.flops)
      fail_msg("causal %d: stages sum to bytes %.1f/%.1f/%.1f flops %.1f, the pass %.1f/%.1f/%.1f flops %.1f", causal,
               sum.weight_bytes, sum.kv_bytes, sum.other_bytes, sum.flops, w.weight_bytes, w.kv_bytes, w.other_bytes,
               w.flops);
    const int zero[] = {0, 6, 8, 11, 12}; /* norms, grouping, combine, statistics, host: no weights */
    for (size_t i = 0; i < sizeof zero / sizeof zero[0]; i++)
      assert_true(st[zero[i]].weight_bytes == 0 && st[zero[i]].flops == 0 && st[zero[i]].kv_bytes == 0);
    const double lr = causal ? 5 : 6;
    assert_true(st[0].act_bytes == 64.0 * (512 + 4 * 256) + (causal ? 0 : 8.0 * 64 * 256) + 6.0 * 64 * 256 +
                                       lr * 20 * 64 * 256);
    assert_true(st[8].act_bytes == lr * ((12 + 4 * 2) * 64.0 * 256 + 12.0 * 64 * 2) + 5 * 2.0 * 64 * 256);
    assert_true(st[11].act_bytes == (causal ? 0 : 64.0 * 4096 * 4));
    for (int i = 0; i < DG_PROFILE_STAGES; i++)
      if (i != 0 && i != 8 && i != 11) assert_true(st[i].act_bytes == 0);
    assert_true(w.act_bytes == 0); /* the pass's floor stays the weights', K/V's and logits' */
    if (!causal) {
      assert_true(fabs(st[9].flops - 2.0 * 64 * 4096 * 256) < 1.0);
      assert_true(st[9].weight_bytes == 4096.0 * 256 * 2 && st[9].other_bytes == 64.0 * 4096 * 4);
    } else {
      assert_true(st[9].weight_bytes == 0 && st[10].weight_bytes == 0); /* no head, no self-conditioning */
    }
  }
  bench_cost st[DG_PROFILE_STAGES];
  memset(st, 0, sizeof st);
  bench_stage_cost(m, 64, 0, 0, st); /* decoder at position 0: 64 keys (the canvas) per row */
  assert_true(fabs(st[2].flops - 4.0 * 64 * 64 * 4 * 512) < 1.0);
  dg_model_free(m);
}

/* bench --protocol step --profile's floors of the prefill as the CUDA encoder runs it (bench_encoder_chunks_cost):
 * P = 150 in chunks of 64 is 3 encoder passes (64, 64, 22 rows after 0, 64, 128 positions): the products' FLOPs
 * (stages q/k/v, o-proj, dense MLP, router, experts) are those of one pass of 150 rows (linear in the rows: equal
 * to 1e-12), the dense weights are read 3 times, the experts' the expected hit fraction of each chunk (1 - (1 -
 * k / E)^T each, by hand); a chunk of >= P rows is the one pass field by field; P or chunk < 1 is 0 chunks. */
static void test_encoder_chunks_cost(void **state) {
  (void)state;
  dg_model *m = load_small(0);
  bench_cost ch[DG_PROFILE_STAGES], one[DG_PROFILE_STAGES], c1[DG_PROFILE_STAGES];
  memset(ch, 0, sizeof ch);
  memset(one, 0, sizeof one);
  memset(c1, 0, sizeof c1);
  assert_int_equal(bench_encoder_chunks_cost(m, 150, 64, ch), 3);
  bench_stage_cost(m, 150, 0, 1, one);
  assert_int_equal(bench_encoder_chunks_cost(m, 150, 256, c1), 1);
  for (int i = 0; i < DG_PROFILE_STAGES; i++)
    assert_true(c1[i].weight_bytes == one[i].weight_bytes && c1[i].kv_bytes == one[i].kv_bytes &&
                c1[i].other_bytes == one[i].other_bytes && c1[i].act_bytes == one[i].act_bytes &&
                c1[i].flops == one[i].flops);
  const int prod[] = {1, 3, 4, 5, 7};
  for (size_t i = 0; i < sizeof prod / sizeof prod[0]; i++) {
    const int s = prod[i];
    if (!(fabs(ch[s].flops - one[s].flops) <= 1e-12 * one[s].flops))
      fail_msg("stage %d: chunks' FLOPs %.1f, one pass's %.1f", s, ch[s].flops, one[s].flops);
    if (s != 7 && !(fabs(ch[s].weight_bytes - 3 * one[s].weight_bytes) <= 1e-12 * one[s].weight_bytes))
      fail_msg("stage %d: chunks' weight bytes %.1f, 3 x one pass's %.1f", s, ch[s].weight_bytes,
               3 * one[s].weight_bytes);
  }
  dg_model_info info;
  dg_model_get_info(m, &info);
  const double E = info.n_experts, k = info.top_k_experts; /* the bundled model: 8 experts, top-2 */
  assert_true(E == 8 && k == 2);
  const double h64 = 1 - pow(1 - k / E, 64), h22 = 1 - pow(1 - k / E, 22), h150 = 1 - pow(1 - k / E, 150);
  assert_true(one[7].weight_bytes > 0);
  const double want = one[7].weight_bytes / h150 * (2 * h64 + h22);
  if (!(fabs(ch[7].weight_bytes - want) <= 1e-12 * want))
    fail_msg("experts: chunks' weight bytes %.1f, want %.1f", ch[7].weight_bytes, want);
  assert_int_equal(bench_encoder_chunks_cost(m, 0, 64, ch), 0);
  assert_int_equal(bench_encoder_chunks_cost(m, 150, 0, ch), 0);
  dg_model_free(m);
}

/* want[0] += the pass's floor, want[1] += its bytes term, want[2] += its FLOPs term. */
static void add_floor(const bench_cost *c, double bw, double rate, double *want) {
  want[0] += bench_floor_s(c, bw, rate, NULL);
  want[1] += (c->weight_bytes + c->kv_bytes + c->other_bytes) / bw;
  want[2] += c->flops / rate;
}

/* The floor of a recorded batch: passes grouped by the canvas order rule, repairs and commits per canvas. */
static void test_batch_floor(void **state) {
  (void)state;
  dg_model *m = load_small(0);
  const double bw = 20e9, rate = 50e9;
  /* canvas 0: 2 blocks, canvas 1: 1 block; block 0 of both takes 2 steps in the same passes,
   * block 1 of canvas 0 takes 1 step alone; every block has a repair forward (n_steps = steps + 1) */
  bench_step_rec steps[] = {{0, 0, 64, 64}, {1, 0, 64, 64}, {0, 0, 20, 10}, {1, 0, 30, 12}, {0, 1, 64, 64}};
  bench_block_rec blocks[] = {{1, 0, 3}, {0, 0, 3}, {0, 1, 2}};
  bench_trace tr = {steps, 5, 5, blocks, 3, 3, 0};
  size_t P[2] = {10, 20};
  int mb;
  int32_t passes = 0;
  double bs = 0, fs = 0;
  double f = bench_batch_floor(m, 2, P, &tr, bw, rate, &mb, &passes, &bs, &fs);
  assert_int_equal(passes, 3);
  double want[3] = {0, 0, 0};
  bench_cost c;
  c = bench_encoder_cost(m, 10, 0); add_floor(&c, bw, rate, want);
  c = bench_encoder_cost(m, 20, 0); add_floor(&c, bw, rate, want);
  bench_pass_seq p1[2] = {{64, 64, 10}, {64, 64, 20}}, p2[2] = {{20, 10, 10}, {30, 12, 20}}, p3 = {64, 64, 74};
  c = bench_decoder_batch_cost(m, p1, 2); add_floor(&c, bw, rate, want);
  c = bench_decoder_batch_cost(m, p2, 2); add_floor(&c, bw, rate, want);
  c = bench_decoder_batch_cost(m, &p3, 1); add_floor(&c, bw, rate, want);
  bench_pass_seq r0 = {64, 64, 10}, r1 = {64, 64, 20}, r2 = {64, 64, 74}; /* repairs */
  c = bench_decoder_batch_cost(m, &r0, 1); add_floor(&c, bw, rate, want);
  c = bench_decoder_batch_cost(m, &r1, 1); add_floor(&c, bw, rate, want);
  c = bench_decoder_batch_cost(m, &r2, 1); add_floor(&c, bw, rate, want);
  c = bench_encoder_cost(m, 64, 10); add_floor(&c, bw, rate, want); /* commit of canvas 0's block 0 */
  if (fabs(f - want[0]) > 1e-12 * want[0]) fail_msg("floor %.9g s, want %.9g s", f, want[0]);
  if (fabs(bs - want[1]) > 1e-12 * want[1] || fabs(fs - want[2]) > 1e-12 * want[2])
    fail_msg("terms %.9g / %.9g s, want %.9g / %.9g s", bs, fs, want[1], want[2]);
  assert_true(f <= bs + fs && f >= fmax(bs, fs) * (1 - 1e-12)); /* a sum of maxima */
  /* the same steps as one canvas each (B = 1 rows): every step is a pass of its own */
  bench_step_rec solo[] = {{0, 0, 64, 64}, {0, 0, 20, 10}, {0, 1, 64, 64}};
  bench_block_rec sb[] = {{0, 0, 3}, {0, 1, 2}};
  bench_trace t1 = {solo, 3, 3, sb, 2, 2, 0};
  bench_batch_floor(m, 1, P, &t1, bw, rate, &mb, &passes, NULL, NULL);
  assert_int_equal(passes, 3);
  dg_model_free(m);
}

/* bench --profile --protocol batch's per-stage floors of a stacked pass: the stages add up to
 * bench_decoder_batch_cost of the same pass field by field (relative 1e-9 for the sums of doubles, exact for
 * the logits' bytes); one canvas of C rows and C head rows is bench_stage_cost's decoder pass stage by stage;
 * the layers' weights are those of one pass at the rows' sum (20 + 30 rows: stage 7's expert bytes at the hit
 * fraction 1 - 0.75^50 of the bundled model's 9,437,184 expert bytes, test_decoder_batch_cost's count), the
 * LM head's FLOPs count the head rows only (2 x (10 + 12) x 4096 x 256) and the attention is each canvas's at
 * its own context. */
static void test_stage_cost_batch(void **state) {
  (void)state;
  dg_model *m = load_small(0);
  dg_model_info mi;
  dg_model_get_info(m, &mi);
  const int32_t C = mi.canvas_length;
  bench_pass_seq two[2] = {{20, 10, 10}, {30, 12, 100}}, one = {C, C, 100};
  bench_cost st[DG_PROFILE_STAGES], sum = {0, 0, 0, 0, 0};
  memset(st, 0, sizeof st);
  bench_stage_cost_batch(m, two, 2, st);
  for (int i = 0; i < DG_PROFILE_STAGES; i++) {
    sum.weight_bytes += st[i].weight_bytes; sum.kv_bytes += st[i].kv_bytes;
    sum.other_bytes += st[i].other_bytes; sum.flops += st[i].flops;
  }
  bench_cost w = bench_decoder_batch_cost(m, two, 2);
  if (fabs(sum.weight_bytes - w.weight_bytes) > 1e-9 * w.weight_bytes || fabs(sum.kv_bytes - w.kv_bytes) > 1e-9 * w.kv_bytes ||
      sum.other_bytes != w.other_bytes || fabs(sum.flops - w.flops) > 1e-9 * w.flops)
    fail_msg("stages sum to bytes %.1f/%.1f/%.1f flops %.1f, the pass %.1f/%.1f/%.1f flops %.1f", sum.weight_bytes,
             sum.kv_bytes, sum.other_bytes, sum.flops, w.weight_bytes, w.kv_bytes, w.other_bytes, w.flops);
  const double want7 = (1 - pow(0.75, 50)) * 9437184.0;
  if (fabs(st[7].weight_bytes - want7) > 1e-9 * want7) fail_msg("experts' bytes %.1f, want %.1f", st[7].weight_bytes, want7);
  assert_true(fabs(st[9].flops - 2.0 * 22 * 4096 * 256) < 1.0);
  assert_true(st[9].other_bytes == 22.0 * 4096 * 4);
  bench_cost a[DG_PROFILE_STAGES], b[DG_PROFILE_STAGES];
  memset(a, 0, sizeof a);
  memset(b, 0, sizeof b);
  bench_stage_cost(m, 20, 10, 0, a); /* attention of canvas 0 alone, then canvas 1's */
  bench_stage_cost(m, 30, 100, 0, b);
  if (fabs(st[2].flops - (a[2].flops + b[2].flops)) > 1e-9 * st[2].flops ||
      fabs(st[2].kv_bytes - (a[2].kv_bytes + b[2].kv_bytes)) > 1e-9 * st[2].kv_bytes)
    fail_msg("attention %.1f flops %.1f bytes, the canvases' own %.1f, %.1f", st[2].flops, st[2].kv_bytes,
             a[2].flops + b[2].flops, a[2].kv_bytes + b[2].kv_bytes);
  memset(st, 0, sizeof st);
  memset(a, 0, sizeof a);
  bench_stage_cost_batch(m, &one, 1, st);
  bench_stage_cost(m, C, 100, 0, a);
  for (int i = 0; i < DG_PROFILE_STAGES; i++)
    if (fabs(st[i].weight_bytes - a[i].weight_bytes) > 1e-9 * a[i].weight_bytes || st[i].kv_bytes != a[i].kv_bytes ||
        st[i].other_bytes != a[i].other_bytes || fabs(st[i].flops - a[i].flops) > 1e-9 * a[i].flops ||
        st[i].act_bytes != a[i].act_bytes)
      fail_msg("stage %d: one canvas's stacked pass differs from its own pass", i);
  dg_model_free(m);
}

/* The batched passes of a trace (the records of test_batch_floor): three passes of 64 + 64, 20 + 30 and 64
 * rows carrying 2, 2 and 1 canvases; a record of a canvas outside [0, B) is skipped; a cap below the count
 * fills cap entries and still returns every pass; B = 1 makes every record a pass of its own. */
static void test_batch_passes(void **state) {
  (void)state;
  bench_step_rec steps[] = {{0, 0, 64, 64}, {1, 0, 64, 64}, {0, 0, 20, 10}, {5, 0, 7, 7}, {1, 0, 30, 12}, {0, 1, 64, 64}};
  bench_trace tr = {steps, 6, 6, NULL, 0, 0, 0};
  int32_t rows[4] = {-1, -1, -1, -1}, canv[4] = {-1, -1, -1, -1};
  assert_int_equal(bench_batch_passes(&tr, 2, rows, canv, 4), 3);
  assert_int_equal(rows[0], 128); assert_int_equal(rows[1], 50); assert_int_equal(rows[2], 64);
  assert_int_equal(canv[0], 2); assert_int_equal(canv[1], 2); assert_int_equal(canv[2], 1);
  assert_int_equal(rows[3], -1);
  int32_t r1[1] = {-1};
  assert_int_equal(bench_batch_passes(&tr, 2, r1, NULL, 1), 3);
  assert_int_equal(r1[0], 128);
  assert_int_equal(bench_batch_passes(&tr, 1, NULL, NULL, 0), 3); /* canvas 0's records only: 64, 20, 64 */
  bench_trace empty = {NULL, 0, 0, NULL, 0, 0, 0};
  assert_int_equal(bench_batch_passes(&empty, 4, rows, canv, 4), 0);
}

/* ---- the batch protocol on the bundled model --------------------------------------------- */

static void test_batch_params(void **state) {
  (void)state;
  dg_model *m = load_small(1);
  dg_gen_params gp;
  assert_dg_ok(bench_batch_params(m, NULL, 0, 7, &gp));
  assert_true(gp.turbo.enabled && gp.turbo.repair);
  assert_int_equal(gp.turbo.accept, DG_TURBO_ACCEPT_CONFIDENCE);
  assert_true(gp.turbo.threshold_hi == 0.95f && gp.turbo.threshold_lo == 0.80f && gp.turbo.threshold_k0 == 8);
  assert_true(gp.turbo.compact); /* issue 14: the compacted decoder, each canvas forwards its live positions */
  assert_int_equal(gp.turbo.repeat_guard, 0);
  assert_int_equal(gp.n_stop_ids, 0);
  assert_int_equal(gp.max_new_tokens, 4 * 64);
  assert_true(gp.seed == 7);
  assert_dg_ok(bench_batch_params(m, "{\"turbo_compact\": false, \"max_new_tokens\": 128}", 0, 0, &gp));
  assert_true(!gp.turbo.compact && gp.turbo.repair); /* --gen-kwargs over the protocol's setting */
  assert_int_equal(gp.max_new_tokens, 128);
  assert_dg_ok(bench_batch_params(m, "{\"max_new_tokens\": 128}", 192, 0, &gp)); /* -n wins */
  assert_int_equal(gp.max_new_tokens, 192);
  assert_int_equal(bench_batch_params(m, "{\"diffusion_turbo\": false}", 0, 0, &gp), DG_ERR_INVALID_ARG);
  assert_non_null(strstr(dg_last_error(), "needs diffusion_turbo"));
  assert_int_equal(bench_batch_params(m, "{\"turbo_nope\": 1}", 0, 0, &gp), DG_ERR_INVALID_ARG);
  dg_model_free(m);
}

/* Canvases generated together equal the B = 1 runs of the same prompts and seeds, token for token
 * (float weights: dg_generate_batch is exact there, include/dgemma.h), and the recorded trace accounts
 * for every forward: step records + one repair per block = the forwards each result reports. */
static void test_batch_equals_single(void **state) {
  (void)state;
  dg_model *m = load_small(1);
  enum { B = 3 };
  dg_gen_params gp;
  assert_dg_ok(bench_batch_params(m, "{\"max_denoising_steps\": 6}", 128, 11, &gp));
  int32_t *ids[B];
  size_t n[B];
  dg_context *ctx[B];
  for (int b = 0; b < B; b++) {
    const char *label = NULL;
    assert_dg_ok(bench_batch_prompt(m, b, &ids[b], &n[b], &label));
    assert_non_null(label);
    dg_context_params cp = dg_context_default_params();
    cp.max_context = (int32_t)n[b] + 128;
    assert_dg_ok(dg_context_new(m, &cp, &ctx[b]));
  }
  for (int b = 1; b < B; b++) /* different prompts */
    assert_true(n[b] != n[0] || memcmp(ids[b], ids[0], n[0] * sizeof(int32_t)));
  dg_gen_result one[B], all[B];
  double sec = 0;
  for (int b = 0; b < B; b++) { /* B = 1 runs: prompt b with seed 11 + b */
    dg_gen_params g1 = gp;
    g1.seed = gp.seed + (uint64_t)b;
    assert_dg_ok(bench_batch_run(&ctx[b], 1, &ids[b], &n[b], &g1, &one[b], &sec, NULL));
  }
  bench_trace tr = {0};
  assert_dg_ok(bench_batch_run(ctx, B, ids, n, &gp, all, &sec, &tr));
  assert_true(sec > 0);
  int32_t steps = 0, blocks = 0;
  for (int b = 0; b < B; b++) {
    assert_int_equal(all[b].n_tokens, 128); /* stop ids and repeat guard off: both canvases generated */
    assert_int_equal(all[b].n_valid, 128);
    assert_int_equal(all[b].n_tokens, one[b].n_tokens);
    assert_memory_equal(all[b].tokens, one[b].tokens, (size_t)one[b].n_tokens * sizeof(int32_t));
    assert_int_equal(all[b].n_steps, one[b].n_steps);
    steps += all[b].n_steps;
    blocks += all[b].n_blocks;
  }
  assert_false(tr.oom);
  assert_int_equal(tr.n_blocks, blocks);
  assert_int_equal(tr.n_steps + blocks, steps); /* one repair forward per block */
  int32_t passes = 0;
  int mb;
  double f = bench_batch_floor(m, B, n, &tr, 20e9, 50e9, &mb, &passes, NULL, NULL);
  assert_true(f > 0);
  /* the canvases advance together: a pass per step of the slowest canvas in each block */
  int32_t want = 0;
  for (int blk = 0; blk < 2; blk++) {
    int32_t mx = 0;
    for (int b = 0; b < B; b++) {
      int32_t k = 0;
      for (int32_t i = 0; i < tr.n_steps; i++) k += tr.steps[i].canvas == b && tr.steps[i].block == blk;
      mx = k > mx ? k : mx;
    }
    want += mx;
  }
  assert_true(passes >= want && passes <= tr.n_steps);
  bench_trace_free(&tr);
  for (int b = 0; b < B; b++) {
    dg_gen_result_free(&one[b]);
    dg_gen_result_free(&all[b]);
    dg_context_free(ctx[b]);
    dg_free(ids[b]);
  }
  dg_model_free(m);
}

/* ---- options ------------------------------------------------------------------------------ */

static void test_parse_lists(void **state) {
  (void)state;
  int v[8];
  char err[256];
  assert_int_equal(bench_parse_list("1,2,4,8", "--canvases", 1, 64, v, 8, err, sizeof err), 4);
  assert_true(v[0] == 1 && v[1] == 2 && v[2] == 4 && v[3] == 8);
  assert_int_equal(bench_parse_list("0", "--canvases", 1, 64, v, 8, err, sizeof err), -1);
  assert_string_equal(err, "--canvases: 0 is not in [1, 64]");
  assert_int_equal(bench_parse_list("2,x", "--rows", 1, 4096, v, 8, err, sizeof err), -1);
  assert_string_equal(err, "--rows: \"x\" is not an integer");
  assert_int_equal(bench_parse_list("2,", "--rows", 1, 4096, v, 8, err, sizeof err), -1);
  assert_non_null(strstr(err, "empty item"));
  assert_int_equal(bench_parse_list("1,2,3", "--rows", 1, 4096, v, 2, err, sizeof err), -1);
  assert_string_equal(err, "--rows: more than 2 values");
  assert_int_equal(bench_parse_formats("bf16,4,3", v, 8, err, sizeof err), 3);
  assert_true(v[0] == 16 && v[1] == 4 && v[2] == 3);
  assert_int_equal(bench_parse_formats("4,fp8", v, 8, err, sizeof err), -1);
  assert_non_null(strstr(err, "\"fp8\" is not a format"));
  bench_opts o = {0};
  o.protocol = "batch";
  assert_int_equal(bench_check_opts(&o, err, sizeof err), 0);
  o.protocol = "speed";
  assert_int_equal(bench_check_opts(&o, err, sizeof err), -1);
  assert_string_equal(err, "unknown --protocol \"speed\" (vllm, p512, batch, step, ceiling, all)");
  /* --profile: batch rows split too, on CUDA only; never the ceiling protocol */
  o.protocol = "batch";
  o.profile = 1;
  assert_int_equal(bench_check_opts(&o, err, sizeof err), -1);
  assert_string_equal(err, "--profile times the CUDA backend's stages: add --device cuda");
  o.device = DG_DEVICE_CUDA;
  assert_int_equal(bench_check_opts(&o, err, sizeof err), 0);
  o.protocol = "ceiling";
  assert_int_equal(bench_check_opts(&o, err, sizeof err), -1);
  assert_string_equal(err, "--profile splits the vllm, p512, batch and step rows into stages, not --protocol ceiling");
  o.protocol = "step"; /* session 28: the first P's prefill split into stages, on CUDA only */
  assert_int_equal(bench_check_opts(&o, err, sizeof err), 0);
  o.device = DG_DEVICE_CPU;
  assert_int_equal(bench_check_opts(&o, err, sizeof err), -1);
  assert_string_equal(err, "--profile times the CUDA backend's stages: add --device cuda");
  o.device = DG_DEVICE_CUDA;
  o.profile = 0;
  o.contexts = "1024,8192,32768,100000";
  assert_int_equal(bench_check_opts(&o, err, sizeof err), 0);
  o.protocol = "batch";
  assert_int_equal(bench_check_opts(&o, err, sizeof err), -1);
  assert_string_equal(err, "--contexts sets the prompts of --protocol step, not of --protocol batch");
}

/* The CLI rejects bad options with exit status 2 before loading a model (none exists at -m here). */
static void test_cli_errors(void **state) {
  (void)state;
  static const char *cases[][2] = {
      {"bench --canvases 0 -m /nonexistent/model", "dgemma bench: --canvases: 0 is not in [1, 64]"},
      {"bench --canvases 1,2,65 -m /nonexistent/model", "--canvases: 65 is not in [1, 64]"},
      {"bench --protocol speed -m /nonexistent/model", "unknown --protocol \"speed\" (vllm, p512, batch, step, ceiling, all)"},
      {"bench --protocol step --contexts 0 -m /nonexistent/model", "--contexts: 0 is not in [1, 1048576]"},
      {"bench --protocol vllm --contexts 64 -m /nonexistent/model",
       "--contexts sets the prompts of --protocol step, not of --protocol vllm"},
      {"bench --protocol step --prompt-tokens 64 -m /nonexistent/model",
       "--prompt-tokens sets the prompt of --protocol vllm (and of the vllm row of all), not of --protocol step"},
      {"bench --protocol step --profile -m /nonexistent/model",
       "--profile times the CUDA backend's stages: add --device cuda"},
      {"bench --protocol ceiling --rows 0", "--rows: 0 is not in [1, 4096]"},
      {"bench --protocol ceiling --formats bf16,5", "--formats: \"5\" is not a format"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *o, *e;
    int rc = run_cli(cases[i][0], &o, &e);
    if (rc != 2 || !strstr(e, cases[i][1])) fail_msg("%s: exit %d, stderr \"%s\"", cases[i][0], rc, e);
    free(o);
    free(e);
  }
  char *o, *e;
  assert_int_equal(run_cli("bench --protocol batch -m /nonexistent/model", &o, &e), 1);
  assert_non_null(strstr(e, "cannot load model /nonexistent/model"));
  free(o);
  free(e);
  assert_int_equal(run_cli("bench --protocol batch -t 1 --gen-kwargs '{\"diffusion_turbo\": false}'", &o, &e), 2);
  assert_non_null(strstr(e, "needs diffusion_turbo"));
  free(o);
  free(e);
  /* DGEMMA_CPU_PACK none of 0, 1, nat and il: the CPU ceiling sweep refuses it with the CPU backend's message (the one
   * cpu/pack.c writes for both; test_quant's test_pack_model checks the backend's), before measuring anything */
  const char *ps = getenv("DGEMMA_CPU_PACK");
  char *psv = ps ? strdup(ps) : NULL;
  setenv("DGEMMA_CPU_PACK", "yes\"", 1);
  const int rc = run_cli("bench --protocol ceiling -t 1 --rows 1 --formats 4 --moe-tokens 0", &o, &e);
  if (psv) setenv("DGEMMA_CPU_PACK", psv, 1); else unsetenv("DGEMMA_CPU_PACK");
  free(psv);
  const char *want = "dgemma bench: DGEMMA_CPU_PACK=\"yes\\x22\" is none of 0 (no pack), 1 (every matrix), nat "
                     "(gate/up-shaped ones), il (those interleaved) and seq1 (no pack, 4-row tiles)\n";
  if (rc != 2 || strcmp(e, want) || o[0]) fail_msg("DGEMMA_CPU_PACK=yes\": exit %d, stdout \"%s\", stderr \"%s\"", rc, o, e);
  free(o);
  free(e);
}

/* One small run of each new protocol through the CLI: rows written, accounting consistent. */
static void test_cli_rows(void **state) {
  (void)state;
  char args[1024], path[600], *o, *e;
  snprintf(path, sizeof path, "%s/batch.jsonl", g_dir);
  snprintf(args, sizeof args,
           "bench --protocol batch -t 1 --canvases 1,2 --reps 1 --warmup 0 -n 64 "
           "--gen-kwargs '{\"max_denoising_steps\": 4}' -o %s", path);
  if (run_cli(args, &o, &e) != 0) fail_msg("%s: %s", args, e);
  assert_non_null(strstr(o, "| B | in | out | passes |"));
  free(o);
  free(e);
  char *j = dg_test_read_file(path, NULL);
  assert_non_null(j);
  assert_non_null(strstr(j, "\"protocol\":\"batch\""));
  assert_non_null(strstr(j, "\"device\":\"cpu\""));
  assert_non_null(strstr(j, "\"B\":2,"));
  assert_non_null(strstr(j, "\"generated_tokens\":128,"));  /* 2 canvases x 64 */
  assert_non_null(strstr(j, "\"same_tokens_checked\":1,\"same_tokens_equal\":1")); /* canvas 0 of B = 2 = B = 1 */
  free(j);
  snprintf(path, sizeof path, "%s/ceiling.jsonl", g_dir);
  snprintf(args, sizeof args,
           "bench --protocol ceiling -t 1 --rows 1 --formats 2 --moe-tokens 0 --reps 1 --warmup 0 -o %s", path);
  if (run_cli(args, &o, &e) != 0) fail_msg("%s: %s", args, e);
  free(o);
  free(e);
  j = dg_test_read_file(path, NULL);
  assert_non_null(j);
  /* two rows (gate/up and down at M = 1), 2-bit weight bytes as in test_matmul_cost */
  assert_non_null(strstr(j, "\"shape\":\"expert_gate_up\""));
  assert_non_null(strstr(j, "\"weight_bytes\":1239040,"));  /* 991,232 codes + 247,808 */
  assert_non_null(strstr(j, "\"shape\":\"expert_down\""));
  assert_non_null(strstr(j, "\"weight_bytes\":619520,"));
  assert_non_null(strstr(j, "\"device\":\"cpu\""));
  /* a quantized row's roofline uses the fastest int8 dot-product rate the CPU has (VNNI vpdpbusd, else AVX2
   * vpmaddubsw) where it beats the FMA */
  assert_true(strstr(j, "\"compute_rate\":\"int8 vpdpbusd\"") || strstr(j, "\"compute_rate\":\"int8 vpmaddubsw\"") ||
              strstr(j, "\"compute_rate\":\"fp32 FMA\""));
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512vnni")) assert_null(strstr(j, "\"compute_rate\":\"int8 vpdpbusd\""));
  if (!__builtin_cpu_supports("avx2")) assert_non_null(strstr(j, "\"compute_rate\":\"fp32 FMA\""));
  /* AMX is reported from CPUID leaf 7 (EDX bit 24, AMX-TILE) and never in the roofline */
  unsigned a = 0, b = 0, c = 0, d = 0;
  const int amx = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 1u);
  assert_non_null(strstr(j, amx ? "\"amx\":\"present (AMX-TILE" : "\"amx\":\"absent\""));
  assert_null(strstr(j, "\"compute_rate\":\"amx"));
  free(j);
}


/* ---- -o written whole or not at all ---------------------------------------------------------- */

/* Entries of g_dir whose name holds ".tmp-" (bench's temporary files). */
static int count_tmp(void) {
  DIR *d = opendir(g_dir);
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += strstr(e->d_name, ".tmp-") != NULL;
  closedir(d);
  return n;
}

/* `bench -o FILE` writes its rows to a temporary file renamed to FILE when
 * the command succeeds: a failure after the start (the CUDA ceiling protocol
 * where there is no GPU) and SIGTERM/SIGINT in the middle of the measurement
 * leave the previous FILE byte for byte, and no temporary file (before, FILE
 * was truncated at the start). A missing directory is an error naming it. */
static void test_cli_out_atomic(void **state) {
  (void)state;
  char path[512], args[1400], *o = NULL, *e = NULL;
  snprintf(path, sizeof path, "%s/rows.jsonl", g_dir);
  const char *previous = "{\"previous\": \"rows\"}\n";
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(previous, f);
  fclose(f);
  snprintf(args, sizeof args,
           "bench --protocol ceiling --device cuda --rows 1 --formats 4 --moe-tokens 0 --reps 2 --warmup 1 -o %s", path);
  int rc = run_cli(args, &o, &e);
  char *now = dg_test_read_file(path, NULL);
  assert_non_null(now);
  if (rc != 0) {
    assert_string_equal(now, previous);
    assert_non_null(strstr(e, "dgemma bench: --protocol ceiling --device cuda"));
  } else {
    assert_non_null(strstr(now, "\"protocol\":\"ceiling\"")); /* a GPU machine: the whole new file */
  }
  free(now);
  free(o);
  free(e);
  assert_int_equal(count_tmp(), 0);

  /* interrupted: the CPU ceiling protocol runs for seconds; the signal comes at 0.5 s and 1.5 s */
  char exe[1024];
  ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  assert_true(k > 0);
  exe[k] = 0;
  *strrchr(exe, '/') = 0;
  const char *sigs[2] = {"TERM", "INT"};
  const char *delays[2] = {"0.5", "1.5"};
  for (int i = 0; i < 2; i++) {
    char cmd[2400];
    snprintf(cmd, sizeof cmd,
             "timeout --preserve-status -s %s %s %s/../dgemma bench --protocol ceiling -t 1 --rows 1 --formats 2,3,4 "
             "--moe-tokens 0 --reps 20 --warmup 0 -o %s >/dev/null 2>&1",
             sigs[i], delays[i], exe, path);
    int st = system(cmd);
    assert_true(WIFEXITED(st));
    const int code = WEXITSTATUS(st), want = i == 0 ? 143 : 130;
    printf("# bench -o interrupted by SIG%s after %s s: exit %d\n", sigs[i], delays[i], code);
    now = dg_test_read_file(path, NULL);
    assert_non_null(now);
    if (code == 0) { /* finished first (a fast machine): the whole new file */
      assert_non_null(strstr(now, "\"shape\":\"expert_down\""));
      f = fopen(path, "w");
      fputs(previous, f);
      fclose(f);
    } else {
      assert_int_equal(code, want);
      assert_string_equal(now, previous);
    }
    free(now);
    assert_int_equal(count_tmp(), 0);
  }

  snprintf(args, sizeof args, "bench --protocol ceiling -t 1 --rows 1 --formats 2 --moe-tokens 0 --reps 1 --warmup 0 "
           "-o %s/no/such/dir/rows.jsonl", g_dir);
  assert_int_equal(run_cli(args, &o, &e), 1);
  assert_non_null(strstr(e, "dgemma bench: cannot write"));
  assert_non_null(strstr(e, "/no/such/dir/rows.jsonl"));
  free(o);
  free(e);
}

/* ---- GPU ceilings and the CUDA ceiling protocol (host logic) ------------------------------ */

#define assert_near(a, b, tol)                                                                  \
  do {                                                                                          \
    const double an_a_ = (a), an_b_ = (b);                                                      \
    if (!(fabs(an_a_ - an_b_) <= (tol))) fail_msg("%s = %.17g, expected %.17g", #a, an_a_, an_b_); \
  } while (0)

/* The KV cache bytes of the step protocol's memory column (bench_kv_cache_bytes), by hand on the bundled model
 * (6 layers: 4 sliding of 2 KV heads x D 64, window 512; 2 full of 1 KV head x D 128; canvas 64): cap 1000 -> S 1064;
 * a full layer 2 (K, V) x 1 x 1064 x 128 x 2 bytes = 544,768; a sliding layer in a CUDA ring of
 * round_up(511 + max(64, 256), 64) = 768 slots 2 x 2 x 768 x 64 x 2 = 393,216, with every position 544,768; an encoder
 * chunk of 512 or 1,024 leaves the ring at 768 slots (since session 29: the ring holds max(canvas, min(chunk, 256))
 * rows after the window), one of 64 makes it round_up(511 + 64, 64) = 576 (294,912 bytes); a cap below the ring
 * (S 164) the same both ways. */
static void test_kv_cache_bytes(void **state) {
  (void)state;
  dg_model *m = load_small(0);
  assert_true(bench_kv_cache_bytes(m, 1000, 1, 256) == 2 * 544768.0 + 4 * 393216.0);
  assert_true(bench_kv_cache_bytes(m, 1000, 0, 256) == 6 * 544768.0);
  /* a chunk beyond 256 grows no ring (its sliding layers attend in calls of 256 rows, since session 29) */
  assert_true(bench_kv_cache_bytes(m, 1000, 1, 512) == 2 * 544768.0 + 4 * 393216.0);
  assert_true(bench_kv_cache_bytes(m, 1000, 1, 1024) == 2 * 544768.0 + 4 * 393216.0);
  assert_true(bench_kv_cache_bytes(m, 1000, 1, 64) == 2 * 544768.0 + 4 * 294912.0);
  const double S = 164;
  assert_true(bench_kv_cache_bytes(m, 100, 1, 256) == 2 * (2 * 1 * S * 128 * 2) + 4 * (2 * 2 * S * 64 * 2));
  assert_true(bench_kv_cache_bytes(m, 100, 0, 256) == bench_kv_cache_bytes(m, 100, 1, 256));
  dg_model_free(m);
}

/* One small run of the step protocol through the CLI on the bundled model (CPU): a row per --contexts value, in
 * order, each with 15 timed steps per run (16 fixed steps, so 15 intervals), its medians inside their spreads, the
 * first row's step ratio exactly 1, and no device memory (the CPU has none to report). */
static void test_cli_step(void **state) {
  (void)state;
  char args[1024], path[600], *o, *e;
  snprintf(path, sizeof path, "%s/step.jsonl", g_dir);
  snprintf(args, sizeof args, "bench --protocol step -t 1 --contexts 8,40 --reps 2 --warmup 0 -o %s", path);
  if (run_cli(args, &o, &e) != 0) fail_msg("%s: %s", args, e);
  assert_non_null(strstr(o, "| P | prefill median ms |"));
  free(o);
  free(e);
  char *j = dg_test_read_file(path, NULL);
  assert_non_null(j);
  const int want_p[2] = {8, 40};
  char *line = j;
  for (int r = 0; r < 2; r++) {
    char *nl = strchr(line, '\n');
    assert_non_null(nl);
    *nl = 0;
    cJSON *row = cJSON_Parse(line);
    assert_non_null(row);
    assert_string_equal(cJSON_GetObjectItem(row, "protocol")->valuestring, "step");
    assert_int_equal(cJSON_GetObjectItem(row, "prompt_tokens")->valueint, want_p[r]);
    assert_int_equal(cJSON_GetObjectItem(row, "steps_timed")->valueint, 2 * 15);
    const double pmin = cJSON_GetObjectItem(row, "prefill_min_s")->valuedouble,
                 pmed = cJSON_GetObjectItem(row, "prefill_median_s")->valuedouble,
                 pmax = cJSON_GetObjectItem(row, "prefill_max_s")->valuedouble,
                 smin = cJSON_GetObjectItem(row, "step_min_s")->valuedouble,
                 smed = cJSON_GetObjectItem(row, "step_median_s")->valuedouble,
                 smax = cJSON_GetObjectItem(row, "step_max_s")->valuedouble;
    assert_true(pmin > 0 && pmin <= pmed && pmed <= pmax);
    assert_true(smin > 0 && smin <= smed && smed <= smax);
    assert_true(cJSON_GetObjectItem(row, "step_floor_s")->valuedouble > 0);
    if (r == 0) assert_true(cJSON_GetObjectItem(row, "step_over_first")->valuedouble == 1.0);
    assert_null(cJSON_GetObjectItem(row, "device_used_bytes"));
    assert_string_equal(cJSON_GetObjectItem(row, "device")->valuestring, "cpu");
    cJSON_Delete(row);
    line = nl + 1;
  }
  assert_int_equal(*line, 0); /* two rows, no more */
  free(j);
  /* a prompt whose canvas would pass max_position_embeddings (131,072) is refused before anything runs */
  snprintf(args, sizeof args, "bench --protocol step -t 1 --contexts 64,131009 --reps 1 --warmup 0");
  assert_int_equal(run_cli(args, &o, &e), 2);
  assert_non_null(strstr(e, "--contexts 131009: the step row needs 131073 positions"));
  free(o);
  free(e);
}


/* The even routing of the CUDA ceiling rows: every expert exactly M rows, K distinct experts per
 * token; the random routing's ids give bench_route's counts. */
static void test_route_even(void **state) {
  (void)state;
  static int32_t ids[128 * 256];
  const int Ms[4] = {1, 3, 16, 256};
  for (int i = 0; i < 4; i++) {
    const int32_t T = bench_route_even(Ms[i], 128, 8, ids);
    assert_int_equal(T, 16 * Ms[i]);
    int cnt[128] = {0};
    for (int32_t t = 0; t < T; t++)
      for (int k = 0; k < 8; k++) {
        cnt[ids[t * 8 + k]]++;
        for (int j = 0; j < k; j++) assert_int_not_equal(ids[t * 8 + j], ids[t * 8 + k]);
      }
    for (int e = 0; e < 128; e++) assert_int_equal(cnt[e], Ms[i]);
  }
  assert_int_equal(bench_route_even(1, 10, 4, ids), -1); /* 4 does not divide 10 */
  assert_int_equal(bench_route_even(0, 128, 8, ids), -1);
  int32_t start[129];
  const int hit = bench_route(256, 128, 8, 42, start, NULL);
  assert_int_equal(bench_route_ids(256, 128, 8, 42, ids), 0);
  int cnt[128] = {0}, hit2 = 0;
  for (int i = 0; i < 256 * 8; i++) cnt[ids[i]]++;
  for (int e = 0; e < 128; e++) {
    assert_int_equal(cnt[e], start[e + 1] - start[e]);
    hit2 += cnt[e] > 0;
  }
  assert_int_equal(hit, hit2);
}

/* Bytes and FLOPs of the expert MLP (the CUDA rows) by hand, and the floor with given GPU ceilings:
 * all 128 experts at 4-bit g64: per expert gate/up 1,982,464 code bytes + 1408 x 44 x 2 x 2 = 247,808
 * scale/bias bytes, down 991,232 + 2816 x 11 x 4 = 123,904: 3,345,408 bytes, x 128 = 428,212,224
 * (the ~428 MB of issue 11); FLOPs 2 x rows x 3 x 704 x 2816. */
static void test_gpu_floor(void **state) {
  (void)state;
  bench_cost c = bench_experts_cost(4, 64, 2816, 704, 128, 128 * 16);
  assert_near(c.weight_bytes, 428212224.0, 0);
  assert_near(c.flops, 2.0 * 2048 * 3 * 704 * 2816, 0);
  bench_cost b = bench_experts_cost(16, 64, 2816, 704, 100, 7);
  assert_near(b.weight_bytes, 100.0 * 3 * 704 * 2816 * 2, 0);
  dg_cuda_ceilings g0, g1;
  memset(&g0, 0, sizeof g0);
  memset(&g1, 0, sizeof g1);
  snprintf(g0.name, sizeof g0.name, "test GPU");
  g0.read_bps = 4.0e12;
  g0.bf16_flops = 6.0e14;
  g1.read_bps = 3.9e12;
  g1.bf16_flops = 7.0e14;
  double bw = 0, rate = 0;
  assert_string_equal(bench_gpu_rates(&g0, &g1, &bw, &rate), "test GPU");
  assert_near(bw, 4.0e12, 0); /* the best of both */
  assert_near(rate, 7.0e14, 0);
  int mb = -1;
  assert_near(bench_floor_s(&c, bw, rate, &mb), 428212224.0 / 4.0e12, 1e-15);
  assert_int_equal(mb, 1);
  bench_cost big = bench_experts_cost(4, 64, 2816, 704, 128, 128 * 256); /* M = 256: compute-bound */
  assert_near(bench_floor_s(&big, bw, rate, &mb), big.flops / 7.0e14, 1e-15);
  assert_int_equal(mb, 0);
  /* a generation's floor with those ceilings: the sum of its passes, by hand */
  dg_model *m = load_small(0);
  dg_model_info mi;
  dg_model_get_info(m, &mi);
  const int32_t C = mi.canvas_length, P = 100, steps[3] = {16, 16, 5};
  double by = 0, fl = 0, want = 0, wby = 0, wfl = 0;
  int mem = -1;
  const double f = bench_gen_floor(m, P, steps, 3, bw, rate, &mem, &by, &fl);
  bench_cost e = bench_encoder_cost(m, P, 0);
  want += bench_floor_s(&e, bw, rate, NULL);
  wby += e.weight_bytes + e.kv_bytes + e.other_bytes;
  wfl += e.flops;
  for (int k = 0; k < 3; k++) {
    if (k) {
      e = bench_encoder_cost(m, C, P + (k - 1) * C);
      want += bench_floor_s(&e, bw, rate, NULL);
      wby += e.weight_bytes + e.kv_bytes + e.other_bytes;
      wfl += e.flops;
    }
    bench_cost d = bench_decoder_cost(m, P + k * C);
    want += steps[k] * bench_floor_s(&d, bw, rate, NULL);
    wby += steps[k] * (d.weight_bytes + d.kv_bytes + d.other_bytes);
    wfl += steps[k] * d.flops;
  }
  assert_near(f, want, want * 1e-12);
  assert_near(by, wby, wby * 1e-12);
  assert_near(fl, wfl, wfl * 1e-12);
  assert_int_equal(mem, 1); /* the bundled model at batch 1: memory-bound on any such GPU */
  dg_model_free(m);
}

/* --protocol ceiling --device cuda: without a usable GPU a clear error and exit status 1 (not a
 * crash, not the CPU sweep); with one, a tiny sweep whose rows carry the GPU ceilings. */
static void test_cli_ceiling_cuda(void **state) {
  (void)state;
  char args[1024], path[600], *o, *e, info[512];
  snprintf(path, sizeof path, "%s/ceiling_cuda.jsonl", g_dir);
  snprintf(args, sizeof args,
           "bench --protocol ceiling --device cuda --rows 1 --formats 4 --moe-tokens 0 --reps 2 --warmup 1 -o %s", path);
  const int gpu = dg_device_info(DG_DEVICE_CUDA, 0, info, sizeof info) == DG_OK;
  const int rc = run_cli(args, &o, &e);
  if (!gpu) {
    if (rc != 1 || !strstr(e, "dgemma bench: --protocol ceiling --device cuda: GPU ceilings on cuda:0: backend error: "))
      fail_msg("%s: exit %d, stderr \"%s\"", args, rc, e);
    assert_null(strstr(o, "| shape |")); /* no CPU sweep instead */
    printf("# no GPU: %s", e);
  } else {
    if (rc != 0) fail_msg("%s: exit %d, stderr \"%s\"", args, rc, e);
    char *j = dg_test_read_file(path, NULL);
    assert_non_null(j);
    assert_non_null(strstr(j, "\"device\":\"cuda\""));
    assert_non_null(strstr(j, "\"shape\":\"experts_all\""));
    assert_non_null(strstr(j, "\"weight_bytes\":428212224,"));
    assert_non_null(strstr(j, "\"gpu_read_gb_s\":"));
    assert_non_null(strstr(j, "\"gpu_bf16_tflop_s\":"));
    printf("# GPU (%s):\n%s", info, o);
    free(j);
  }
  free(o);
  free(e);
}

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/dgemma_test_bench_XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  dg_test_rm_dir(g_dir);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matmul_cost),       cmocka_unit_test(test_route),
      cmocka_unit_test(test_decoder_batch_cost), cmocka_unit_test(test_stage_cost), cmocka_unit_test(test_encoder_chunks_cost), cmocka_unit_test(test_batch_floor), cmocka_unit_test(test_stage_cost_batch), cmocka_unit_test(test_batch_passes),
      cmocka_unit_test(test_batch_params),      cmocka_unit_test(test_batch_equals_single),
      cmocka_unit_test(test_parse_lists),       cmocka_unit_test(test_cli_errors),
      cmocka_unit_test(test_cli_rows),          cmocka_unit_test(test_cli_out_atomic),
      cmocka_unit_test(test_route_even),        cmocka_unit_test(test_gpu_floor),
      cmocka_unit_test(test_cli_ceiling_cuda),   cmocka_unit_test(test_kv_cache_bytes),
      cmocka_unit_test(test_cli_step),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
