/* qmoe_fg.cu: the 4-bit instantiation of gate/up and down in one launch (qmoe_fg.cuh qr_fg_kernel at 2 and 3
 * n-tiles, group 64; DGEMMA_EXPERTS_FG=1). */
#include "cuda/qmoe_fg.cuh"

template cudaError_t qr_fg_bits<4>(cudaStream_t, int, int, const qe_args &, const qe_args &, int *);
