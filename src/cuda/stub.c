/* stub.c: the CUDA backend's interface (backend.h) in a build without CUDA
 * (no nvcc found, CUDA=0, or the sanitizer build): every entry point returns
 * DG_ERR_BACKEND saying so, and the CPU path is unaffected. */
#include "cuda/backend.h"
#include "dg_error.h"

#define NO_CUDA                                                                                                 \
  dg_seterr(DG_ERR_BACKEND, "this dgemma was built without CUDA (no nvcc found at build time, or CUDA=0); "   \
                            "rebuild with nvcc on the PATH for --device cuda")

dg_status dg_cuda_info(int device, char *buf, size_t n) {
  (void)device;
  if (buf && n) buf[0] = 0;
  return NO_CUDA;
}
dg_status dg_cuda_model_new(const dg_cuda_model_desc *d, dg_cuda_model **out) {
  (void)d;
  *out = NULL;
  return NO_CUDA;
}
void dg_cuda_model_free(dg_cuda_model *m) { (void)m; }
size_t dg_cuda_model_bytes(const dg_cuda_model *m) { (void)m; return 0; }
dg_status dg_cuda_ctx_new(dg_cuda_model *m, int32_t cap, dg_cuda_ctx **out) {
  (void)m; (void)cap;
  *out = NULL;
  return NO_CUDA;
}
void dg_cuda_ctx_free(dg_cuda_ctx *c) { (void)c; }
dg_status dg_cuda_encode(dg_cuda_ctx *c, const int32_t *ids, int32_t n, int32_t pos0) {
  (void)c; (void)ids; (void)n; (void)pos0;
  return NO_CUDA;
}
dg_status dg_cuda_decode(dg_cuda_ctx *c, const int32_t *canvas, int32_t pos0, int sc, const float *sc_logits,
                         float *logits_out) {
  (void)c; (void)canvas; (void)pos0; (void)sc; (void)sc_logits; (void)logits_out;
  return NO_CUDA;
}
dg_status dg_cuda_step_stats(dg_cuda_ctx *c, float temperature, int mode, uint64_t seed, int32_t block, int32_t step,
                             const float *uni, void *out, int32_t *bad_pos) {
  (void)c; (void)temperature; (void)mode; (void)seed; (void)block; (void)step; (void)uni; (void)out; (void)bad_pos;
  return NO_CUDA;
}
dg_status dg_cuda_soft_from_z(dg_cuda_ctx *c) {
  (void)c;
  return NO_CUDA;
}
dg_status dg_cuda_decode_rows(dg_cuda_ctx *c, const int32_t *canvas, int32_t pos0, int sc, const float *soft,
                              const int32_t *rows, int32_t n, float *raw_out) {
  (void)c; (void)canvas; (void)pos0; (void)sc; (void)soft; (void)rows; (void)n; (void)raw_out;
  return NO_CUDA;
}
dg_status dg_cuda_compact(dg_cuda_ctx *c, const int32_t *tok, const int32_t *pos, int32_t n, int32_t pos0, int sc,
                          const float *soft, const int32_t *head, int32_t nh, float *raw_out) {
  (void)c; (void)tok; (void)pos; (void)n; (void)pos0; (void)sc; (void)soft; (void)head; (void)nh; (void)raw_out;
  return NO_CUDA;
}
dg_status dg_cuda_raw_rows(dg_cuda_ctx *c, int32_t n, float *raw_out) {
  (void)c; (void)n; (void)raw_out;
  return NO_CUDA;
}
dg_status dg_cuda_topk(dg_cuda_ctx *c, int32_t n, int32_t K, float *val, int32_t *idx, int32_t *bad_row,
                       int32_t *bad_col) {
  (void)c; (void)n; (void)K; (void)val; (void)idx; (void)bad_row; (void)bad_col;
  return NO_CUDA;
}
dg_status dg_cuda_turbo_sc(dg_cuda_ctx *c, int mode, int32_t n, const int32_t *rows, float cap, float T,
                           const float *p) {
  (void)c; (void)mode; (void)n; (void)rows; (void)cap; (void)T; (void)p;
  return NO_CUDA;
}
dg_status dg_cuda_put_raw_rows(dg_cuda_ctx *c, int32_t n, const float *raw) {
  (void)c; (void)n; (void)raw;
  return NO_CUDA;
}
dg_status dg_cuda_get_soft(dg_cuda_ctx *c, float *soft) {
  (void)c; (void)soft;
  return NO_CUDA;
}
dg_status dg_cuda_test_matmul(int device, const dg_cuda_mat *w, int64_t row0, int N, const uint16_t *x, int ldx,
                              int T, float *y, int ldy) {
  (void)device; (void)w; (void)row0; (void)N; (void)x; (void)ldx; (void)T; (void)y; (void)ldy;
  return NO_CUDA;
}
dg_status dg_cuda_test_embed(int device, const dg_cuda_mat *e, const int32_t *ids, int T, float scale, float *x) {
  (void)device; (void)e; (void)ids; (void)T; (void)scale; (void)x;
  return NO_CUDA;
}
dg_status dg_cuda_test_soft(int device, const dg_cuda_mat *e, const uint16_t *P, int C, float alpha, float *soft) {
  (void)device; (void)e; (void)P; (void)C; (void)alpha; (void)soft;
  return NO_CUDA;
}
dg_status dg_cuda_test_experts(int device, const dg_cuda_mat *gate_up, const dg_cuda_mat *down, const uint16_t *xe,
                               const int32_t *idx, int T, int H, int IE, int E, int K, uint16_t *h, float *y) {
  (void)device; (void)gate_up; (void)down; (void)xe; (void)idx; (void)T; (void)H; (void)IE; (void)E; (void)K;
  (void)h; (void)y;
  return NO_CUDA;
}
dg_status dg_cuda_test_route(int device, float *rlog, const float *pes, int T, int E, int K, int32_t *idx, float *w,
                             int32_t *start, int32_t *pairs) {
  (void)device; (void)rlog; (void)pes; (void)T; (void)E; (void)K; (void)idx; (void)w; (void)start; (void)pairs;
  return NO_CUDA;
}
const char *dg_cuda_stage_name(int i) {
  (void)i;
  return "?";
}
dg_status dg_cuda_profile(dg_cuda_ctx *c, int on) {
  (void)c; (void)on;
  return NO_CUDA;
}
dg_status dg_cuda_profile_read(dg_cuda_ctx *c, double *ms, int64_t *n_marks) {
  (void)c; (void)ms; (void)n_marks;
  return NO_CUDA;
}
dg_status dg_cuda_test_attention(int device, int version, const float *q, const uint16_t *kc, const uint16_t *vc, int S,
                                 int nq, int NH, int NKV, int D, int32_t pos0, int32_t kv_hi, int causal, int is_full,
                                 int window, uint16_t *out) {
  (void)device; (void)version; (void)q; (void)kc; (void)vc; (void)S; (void)nq; (void)NH; (void)NKV; (void)D;
  (void)pos0; (void)kv_hi; (void)causal; (void)is_full; (void)window; (void)out;
  return NO_CUDA;
}
dg_status dg_cuda_ceilings_measure(int device, int64_t read_bytes, int64_t copy_bytes, int gemm_n, int reps,
                                   dg_cuda_ceilings *out) {
  (void)device; (void)read_bytes; (void)copy_bytes; (void)gemm_n; (void)reps; (void)out;
  return NO_CUDA;
}
dg_status dg_cuda_bench_experts(int device, const dg_cuda_bench_experts_args *a, dg_cuda_bench_result *out) {
  (void)device; (void)a; (void)out;
  return NO_CUDA;
}
