/* qmoe_b4.cu: the 4-bit instantiations of the quantized expert kernel (qmoe.cuh). */
#include "cuda/qmoe.cuh"

DG_QE_INSTANTIATE(4)
