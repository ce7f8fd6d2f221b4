/* qmoe_r16.cu: the bf16 instantiations of the register-streamed expert kernel (qmoe_r.cuh, BITS 16: the lane
 * records hold the bf16 weights themselves, no pairs and no fold). */
#include "cuda/qmoe_r.cuh"

DG_QR_INSTANTIATE(16)
