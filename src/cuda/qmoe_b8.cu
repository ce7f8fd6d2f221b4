/* qmoe_b8.cu: the 8-bit instantiations of the quantized expert kernel (qmoe.cuh). */
#include "cuda/qmoe.cuh"

DG_QE_INSTANTIATE(8)
