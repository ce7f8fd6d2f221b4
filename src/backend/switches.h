/* switches.h: the library's environment switches (DGEMMA_*), one table (switches.c) parsed by base/envsw.c.
 *
 * Each switch is read where it always was (once when the library or the CUDA plugin loads, when a context is made,
 * or at each call: the comment at each reader says which) through dg_sw_get / dg_sw_get2, which give the switch's
 * value, or its default when the variable holds a value the switch refuses. Such a value never runs: dg_model_load
 * and dg_context_new call dg_switches_check first, which refuses it with DG_ERR_INVALID_ARG and one line naming the
 * variable, the value and what is allowed (envsw.h). README.md's "Environment switches" table documents each one.
 *
 * Not in the table, each with a parser and a refusal of its own: DGEMMA_KERNELS (cpu/dispatch.c dg_kernels_pick: a
 * name of no kernel set is refused by dg_switches_check, a set this CPU lacks runs the best exact set with a warning,
 * dg_cpu_kernels), DGEMMA_CPU_PACK
 * (cpu/pack.c, refused by the CPU backend's model), DGEMMA_CUDA_MEM_LIMIT (cuda/upload.cu mem_info: a byte count up
 * to 2^64, refused when a CUDA model is made); and the strings DGEMMA_CUDA_LIB (a path), DGEMMA_MODEL and
 * DGEMMA_API_KEY (the CLI's). */
#ifndef DG_SWITCHES_H
#define DG_SWITCHES_H

#include "base/envsw.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Ids of the table's switches: the host's first (every model and context checks them), then the CUDA backend's
 * (only a CUDA model and its contexts check them). */
typedef enum dg_sw_id {
  DG_SW_THP,          /* DGEMMA_THP */
  DG_SW_CPU_AMX,      /* DGEMMA_CPU_AMX */
  DG_SW_TURBO_BATCH,  /* DGEMMA_TURBO_BATCH */
  DG_SW_CUDA_FIRST,
  DG_SW_ATTN = DG_SW_CUDA_FIRST, /* DGEMMA_ATTN */
  DG_SW_BRANCH,        /* DGEMMA_BRANCH */
  DG_SW_BRANCH_HANDLE, /* DGEMMA_BRANCH_HANDLE */
  DG_SW_BRANCH_WS_KIB, /* DGEMMA_BRANCH_WS_KIB */
  DG_SW_COMBINE,       /* DGEMMA_COMBINE */
  DG_SW_CUBLAS_POOL,   /* DGEMMA_CUBLAS_POOL */
  DG_SW_CUDA_LIMITS,   /* DGEMMA_CUDA_LIMITS */
  DG_SW_CUDA_MEMLOG,   /* DGEMMA_CUDA_MEMLOG */
  DG_SW_CUDA_SYNC,     /* DGEMMA_CUDA_SYNC */
  DG_SW_DN_FUSE,       /* DGEMMA_DN_FUSE */
  DG_SW_ENC_CHUNK,     /* DGEMMA_ENC_CHUNK */
  DG_SW_EXPERTS_FG,    /* DGEMMA_EXPERTS_FG */
  DG_SW_GEMM_PIN,      /* DGEMMA_GEMM_PIN */
  DG_SW_GRAPHS,        /* DGEMMA_GRAPHS */
  DG_SW_GRAPHS_MAX,    /* DGEMMA_GRAPHS_MAX */
  DG_SW_GSP,           /* DGEMMA_GSP */
  DG_SW_INITCHECK,     /* DGEMMA_INITCHECK */
  DG_SW_PDL,           /* DGEMMA_PDL */
  DG_SW_QE_NT,         /* DGEMMA_QE_NT */
  DG_SW_QR_DQ,         /* DGEMMA_QR_DQ */
  DG_SW_QR_LAUNCH,     /* DGEMMA_QR_LAUNCH */
  DG_SW_ROUTE,         /* DGEMMA_ROUTE */
  DG_SW_ROUTE_COOP,    /* DGEMMA_ROUTE_COOP */
  DG_SW_SC_INPLACE,    /* DGEMMA_SC_INPLACE */
  DG_SW_SC_PROBS,      /* DGEMMA_SC_PROBS */
  DG_SW_SEG_STREAMS,   /* DGEMMA_SEG_STREAMS */
  DG_SW_STACK_DENSE,   /* DGEMMA_STACK_DENSE */
  DG_SW_VOCAB,         /* DGEMMA_VOCAB */
  DG_SW_WEIGHT_BLOCK,  /* DGEMMA_WEIGHT_BLOCK */
  DG_SW_WL,            /* DGEMMA_WL */
  DG_SW_COUNT
} dg_sw_id;

/* The table's entry of switch id (what it accepts, its default and message: envsw.h); NULL for an id out of range. */
const dg_sw *dg_sw_of(dg_sw_id id);

/* The value of switch id in the environment now (getenv at each call): the accepted value, or the switch's default
 * when the variable is unset, empty or holds a value it refuses (dg_switches_check refuses that one before any model
 * or context is made). Never writes dg_last_error(). dg_sw_get2: both values of DG_SW_WORD2 (DGEMMA_ATTN's N,M; N, N
 * for "N"); dg_sw_get is v[0]. */
long dg_sw_get(dg_sw_id id);
void dg_sw_get2(dg_sw_id id, long v[2]);

#ifdef __cplusplus
}
#endif

#endif
