/* softrow.h: the exact self-conditioning row on the host (spec 5, 4.9),
 * shared by the CPU soft embedding (forward.c) and the turbo engine's host
 * rows (turbo.c). */
#ifndef DG_SOFTROW_H
#define DG_SOFTROW_H

#include "cpu/kernels.h"
#include "model/model.h"

/* P = cast(softmax(cast(z))) of one row (spec 4.9): zr [V] processed logits -> p [V]. */
void dg_soft_probs(const dg_model *m, const float *zr, float *p);

/* The kernels of the soft embedding's product P E: the model's, or the
 * oracle's when a (test) kernel table has no matmul_rows. */
const dg_kernels *dg_soft_kernels(const dg_model *m);

/* One row of the exact self-conditioning signal: zr [V] processed logits,
 * p [V] scratch (left holding the cast probabilities), s [H] = scale *
 * sum_v p_v E[v], summed in increasing v (kernels.h: matmul_rows), so that
 * it equals the row of the block product of dg_soft_embedding bit for bit. */
void dg_soft_row(const dg_model *m, const float *zr, float *p, float *s);

#endif
