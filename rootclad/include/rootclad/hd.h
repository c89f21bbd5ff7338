// rootclad/hd.h — ROOTCLAD_HD marks a function that runs on the host and, compiled by nvcc, on
// the device too (the elementwise functors, the optimizer's rule).
#ifndef ROOTCLAD_HD_H
#define ROOTCLAD_HD_H

#if defined(__CUDACC__)
#define ROOTCLAD_HD __host__ __device__
#else
#define ROOTCLAD_HD
#endif

#endif // ROOTCLAD_HD_H
