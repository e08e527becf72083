// grid.cuh: the launch shape every elementwise kernel of ours shares
// (ops_gpu.cu, resnet_gpu.cu): blocks of kThreads threads, a grid-stride
// loop over n elements, and how many blocks such a loop gets. For the .cu
// files only.
#ifndef DP_CUDA_GRID_CUH
#define DP_CUDA_GRID_CUH

#include <stddef.h>

namespace dp_cuda {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements (the loops cover any rest).
inline unsigned blocks(size_t n)
{
    size_t b = (n + kThreads - 1) / kThreads;
    if (b < 1) b = 1;
    if (b > 65535u * 8u) b = 65535u * 8u;
    return (unsigned)b;
}

}  // namespace dp_cuda

// for (i over [0, n)) spread over the whole grid
#define DP_GRID_STRIDE(i, n)                                                   \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);   \
         i += (size_t)gridDim.x * blockDim.x)

#endif
