/* qmoe_r3.cu: the 3-bit instantiations of the register-streamed quantized expert kernel (qmoe_r.cuh). */
#include "cuda/qmoe_r.cuh"

DG_QR_INSTANTIATE(3)
