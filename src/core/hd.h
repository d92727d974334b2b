// OCTET_HD marks a function that host and device code both call: __host__ __device__ under nvcc,
// a plain inline function for the host compiler.
#pragma once

#if defined(__CUDACC__)
#define OCTET_HD __host__ __device__ __forceinline__
#else
#define OCTET_HD inline
#endif
