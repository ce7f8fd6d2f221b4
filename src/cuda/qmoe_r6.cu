/* qmoe_r6.cu: the 6-bit instantiations of the register-streamed quantized expert kernel (qmoe_r.cuh). */
#include "cuda/qmoe_r.cuh"

DG_QR_INSTANTIATE(6)
