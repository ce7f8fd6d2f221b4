/* qmoe_b2.cu: the 2-bit instantiations of the quantized expert kernel (qmoe.cuh). */
#include "cuda/qmoe.cuh"

DG_QE_INSTANTIATE(2)
