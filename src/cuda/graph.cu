/* graph.cu: CUDA graphs for the decoder passes (issue 12 item 4). A pass's
 * device work (every kernel and cuBLAS product between its uploads and its
 * copy back) is captured from the context's stream once per key and
 * replayed with one cudaGraphLaunch after, instead of ~540 launches per 26B
 * forward. On by default since session 13 (H200: every test of test_cuda
 * passes with it; the bundled model's vllm protocol 4,842 -> 7,024 tok/s,
 * medians of 3 runs, one pair of runs; the 26B within noise,
 * docs/measurements.md); DGEMMA_GRAPHS=0 in the environment
 * when a context is made turns it off; DGEMMA_GRAPHS_MAX=N
 * (1..1024, default 32) caps the graphs a context keeps.
 *
 * Keys and signatures. A key (dg_graph_key: pass kind, self-conditioning
 * source, rows forwarded, LM-head rows) fixes the sequence of launches up to
 * the canvas position pos0 (the context length), which the attention's key
 * range, its split count and the rope positions depend on and which changes
 * every block. The pass's graph is kept per key with the signature it was
 * captured at (pos0): the same signature replays it; another one captures
 * the pass again and rewrites the instantiated graph in place
 * (cudaGraphExecUpdate: no new instantiation while the launches keep their
 * topology; a new split count that adds or drops a kernel instantiates
 * afresh). So a block of 16 steps captures about twice (its first,
 * self-conditioning-free step and its second) and replays the rest.
 * Everything else a pass reads that varies within a key lives in device
 * buffers whose addresses do not change for the context's life (the ids,
 * the positions of a compacted pass, the LM-head rows, the soft embedding),
 * uploaded by the caller on the stream before graph_run.
 *
 * A key's first use runs plain: it loads the kernels' modules and makes the
 * launchers' one-time calls (cudaFuncSetAttribute, occupancy queries) that
 * must not happen during a capture; its second use captures. The cache holds
 * at most `cap` graphs; the least recently used one goes first.
 *
 * Failure: any error of the capture, the instantiation or the update ends
 * graphs for the context for good (the reason is kept for
 * dg_cuda_graph_stats_get, reported once by `dgemma bench`), and the pass runs
 * again plainly: a capture executes nothing, so nothing ran twice. Profiling
 * (dg_cuda_profile: its events must be real) and DGEMMA_CUDA_SYNC=1 (a
 * synchronisation per launch) run plain.
 *
 * Under the CPU emulation (DG_CUDA_EMU, dev/cuda_emu) there are no graphs:
 * every pass runs its launches directly, whatever DGEMMA_GRAPHS says. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/switches.h"
#include "cuda/host.cuh"

typedef struct graph_ent {
  dg_graph_key key;
  int64_t sig;           /* the signature exec was captured at */
  int64_t used;          /* tick of the last use (LRU) */
  int have;              /* the key has run once (plainly) */
#ifndef DG_CUDA_EMU
  cudaGraphExec_t exec;  /* NULL until the second use */
#endif
} graph_ent;

struct dg_cuda_graphs {
  int on;                /* capturing and replaying now */
  int asked;             /* not DGEMMA_GRAPHS=0 when the context was made */
  int cap, n;            /* entries at most, in use */
  int64_t tick;
  graph_ent *e;          /* [cap] */
  dg_cuda_graph_stats st;
};

/* on unless DGEMMA_GRAPHS=0; DGEMMA_GRAPHS_MAX entries at most, 1..1024, 32 when unset (backend/switches.c) */
static int graphs_asked_from_env(void) { return dg_sw_get(DG_SW_GRAPHS) != 0; }
static int graphs_cap_from_env(void) { return (int)dg_sw_get(DG_SW_GRAPHS_MAX); }

dg_status graph_init(dg_cuda_ctx *c) {
  dg_cuda_graphs *g = (dg_cuda_graphs *)calloc(1, sizeof *g);
  if (!g) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory");
  g->asked = graphs_asked_from_env();
  g->cap = graphs_cap_from_env();
#ifdef DG_CUDA_EMU
  g->on = 0; /* the emulation has no graphs: launches run directly */
#else
  g->on = g->asked;
#endif
  if (g->on) {
    g->e = (graph_ent *)calloc((size_t)g->cap, sizeof *g->e);
    if (!g->e) {
      free(g);
      return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory");
    }
  }
  c->graphs = g;
  return DG_OK;
}

static void ent_clear(graph_ent *e) {
#ifndef DG_CUDA_EMU
  if (e->exec) cudaGraphExecDestroy(e->exec);
  e->exec = NULL;
#endif
  e->have = 0;
}

void graph_free(dg_cuda_ctx *c) {
  dg_cuda_graphs *g = c->graphs;
  if (!g) return;
  for (int i = 0; i < g->n; i++) ent_clear(&g->e[i]);
  free(g->e);
  free(g);
  c->graphs = NULL;
}

extern "C" dg_status dg_cuda_graph_stats_get(const dg_cuda_ctx *c, dg_cuda_graph_stats *out) {
  if (!c || !out) return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_graph_stats_get: NULL argument");
  memset(out, 0, sizeof *out);
  const dg_cuda_graphs *g = c->graphs;
  if (!g) return DG_OK;
  *out = g->st;
  out->on = g->on;
  out->asked = g->asked;
  out->cap = g->cap;
  out->cached = g->n;
  return DG_OK;
}

static int key_eq(const dg_graph_key *a, const dg_graph_key *b) {
  return a->kind == b->kind && a->sc == b->sc && a->n == b->n && a->nh == b->nh;
}

/* The entry of key: found, or a free one, or the least recently used one cleared. */
static graph_ent *ent_of(dg_cuda_graphs *g, const dg_graph_key *key) {
  for (int i = 0; i < g->n; i++)
    if (key_eq(&g->e[i].key, key)) return &g->e[i];
  graph_ent *e;
  if (g->n < g->cap) {
    e = &g->e[g->n++];
  } else {
    e = &g->e[0];
    for (int i = 1; i < g->n; i++)
      if (g->e[i].used < e->used) e = &g->e[i];
    ent_clear(e);
    g->st.evictions++;
  }
  memset(e, 0, sizeof *e);
  e->key = *key;
  return e;
}

#ifndef DG_CUDA_EMU
/* End graphs for c, keeping the first reason; what ran is left to the caller's plain rerun. */
static void graphs_off(dg_cuda_ctx *c, const char *what, const char *why) {
  dg_cuda_graphs *g = c->graphs;
  (void)cudaGetLastError(); /* a capture's error is not sticky: clear it for the plain launches */
  g->on = 0;
  g->st.fallbacks++;
  if (!g->st.why[0]) snprintf(g->st.why, sizeof g->st.why, "%s: %s", what, why);
  for (int i = 0; i < g->n; i++) ent_clear(&g->e[i]);
  g->n = 0;
}
#endif

dg_status graph_run(dg_cuda_ctx *c, const dg_graph_key *key, int64_t sig, dg_pass_body body, const void *arg) {
  dg_cuda_graphs *g = c->graphs;
  if (!g || !g->on || c->prof || c->debug_sync) {
    if (g) g->st.plain++;
    return body(c, arg);
  }
#ifdef DG_CUDA_EMU
  return body(c, arg); /* not reached: g->on is 0 under the emulation */
#else
  graph_ent *e = ent_of(g, key);
  e->used = ++g->tick;
  if (!e->have) { /* first use: plain (module loading, the launchers' one-time calls) */
    e->have = 1;
    g->st.plain++;
    return body(c, arg);
  }
  if (e->exec && e->sig == sig) {
    CK(cudaGraphLaunch(e->exec, c->stream));
    g->st.replays++;
    return DG_OK;
  }
  /* capture the pass at this signature */
  cudaGraph_t gr = NULL;
  cudaError_t ce = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
  if (ce != cudaSuccess) {
    graphs_off(c, "cudaStreamBeginCapture", cudaGetErrorString(ce));
    return body(c, arg);
  }
  dg_status bs = body(c, arg);
  char why[200] = "";
  if (bs) snprintf(why, sizeof why, "%s", dg_last_error());
  ce = cudaStreamEndCapture(c->stream, &gr);
  if (bs || ce != cudaSuccess || !gr) {
    if (gr) cudaGraphDestroy(gr);
    graphs_off(c, "capturing a pass", bs ? why : cudaGetErrorString(ce));
    return body(c, arg);
  }
  g->st.captures++;
  int ok = 0;
  if (e->exec) { /* the same key at another signature: rewrite the instantiated graph's parameters in place */
    cudaGraphExecUpdateResultInfo info;
    if (cudaGraphExecUpdate(e->exec, gr, &info) == cudaSuccess) {
      ok = 1;
      g->st.updates++;
    } else {
      (void)cudaGetLastError();
      cudaGraphExecDestroy(e->exec);
      e->exec = NULL;
    }
  }
  if (!ok) {
    ce = cudaGraphInstantiate(&e->exec, gr, 0);
    if (ce != cudaSuccess) {
      e->exec = NULL;
      cudaGraphDestroy(gr);
      graphs_off(c, "cudaGraphInstantiate", cudaGetErrorString(ce));
      return body(c, arg);
    }
    g->st.instantiations++;
  }
  cudaGraphDestroy(gr);
  e->sig = sig;
  ce = cudaGraphLaunch(e->exec, c->stream);
  if (ce != cudaSuccess) { /* nothing of the pass was queued: run it plainly */
    graphs_off(c, "cudaGraphLaunch", cudaGetErrorString(ce));
    return body(c, arg);
  }
  return DG_OK;
#endif
}
