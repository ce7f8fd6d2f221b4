/* qmoe_b3.cu: the 3-bit instantiations of the quantized expert kernel (qmoe.cuh). */
#include "cuda/qmoe.cuh"

DG_QE_INSTANTIATE(3)
