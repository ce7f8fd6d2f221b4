/* qmoe_r2.cu: the 2-bit instantiations of the register-streamed quantized expert kernel (qmoe_r.cuh). */
#include "cuda/qmoe_r.cuh"

DG_QR_INSTANTIATE(2)
