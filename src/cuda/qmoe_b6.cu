/* qmoe_b6.cu: the 6-bit instantiations of the quantized expert kernel (qmoe.cuh). */
#include "cuda/qmoe.cuh"

DG_QE_INSTANTIATE(6)
