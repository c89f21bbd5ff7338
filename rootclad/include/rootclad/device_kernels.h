// rootclad/device_kernels.h — every op of the registry as device kernels (device.h), one
// header per family under device/.
//
// Each op is a function template over `On` (dev::Host or dev::Cuda) and T, written as one body
// per output element, with the CPU kernels' contract (kernels.h): <op>_forward writes its
// output, <op>_backward* add into the adjoints. Backward kernels are in gather form: the body
// for an element of an adjoint sums what flows into it, so no two indices write one place.
// The exceptions add with dev::add_to (an atomic on the GPU): the loss's sum, and the
// gradients that sum over the batch, whose sums are split into chunks (batch_chunks).
// Linear's products go to gemm (device_gemm.h: cuBLAS on the GPU) from GEMM_MIN_ROWS rows on.
//
// Fused activations: a producer (Linear, Conv2d, pooling, a binary op) may apply an activation
// whose derivative reads only its output (Relu, Tanh, Sigmoid) as it writes (`act`), so the
// pre-activation is never stored; its backward kernels then read the output adjoint through
// act_grad (dy * f'(y), element by element) wherever they read d_out. A backward kernel's
// `DY d_out` is a pointer or such an ActGrad.
#ifndef ROOTCLAD_DEVICE_KERNELS_H
#define ROOTCLAD_DEVICE_KERNELS_H

#include "device/binary.h"
#include "device/conv.h"
#include "device/core.h"
#include "device/dense.h"
#include "device/distance.h"
#include "device/elementwise.h"
#include "device/loss.h"
#include "device/norm.h"
#include "device/optim.h"
#include "device/pool.h"
#include "device/shape.h"
#include "device/volume.h"

#endif // ROOTCLAD_DEVICE_KERNELS_H
