/* ptxas -v / SASS of lab versions 105-106 (qr_dring_kernel) beside version 95's diet at 3 n-tiles (session 21) */
#include "cuda/qmoe_r.cuh"
#include "qr_diet_lab.cuh"
template cudaError_t qr_dring_launch<4, 1, 3, 64, 4, 4, 3, 4, 2, 2>(cudaStream_t, dim3, const qe_args &);
template cudaError_t qr_dring_launch<4, 0, 3, 64, 4, 4, 3, 4, 2, 2>(cudaStream_t, dim3, const qe_args &);
template cudaError_t qr_dring_launch<4, 1, 3, 64, 4, 6, 3, 4, 2, 2>(cudaStream_t, dim3, const qe_args &);
template cudaError_t qr_dring_launch<4, 0, 3, 64, 4, 6, 3, 4, 2, 2>(cudaStream_t, dim3, const qe_args &);
/* the diet with the backend's choices at 3 n-tiles (D 2, PF -2, 4 blocks, NTS 2) */
template cudaError_t qr_launch_g<4, 1, 3, 64, 4, 2, 3, 4, 2, -2, 1, 2, 0, 0, 0, 1>(cudaStream_t, dim3, const qe_args &);
template cudaError_t qr_launch_g<4, 0, 3, 64, 4, 2, 3, 4, 2, -2, 1, 2, 0, 0, 0, 1>(cudaStream_t, dim3, const qe_args &);
