// rootclad/kernels.h — the layers and losses rootclad compiles models into, for the CPU: one
// header per family under ops/ (core.h says how every op is written; activations.h holds the
// math of each elementwise op, which the device kernels share).
#ifndef ROOTCLAD_KERNELS_H
#define ROOTCLAD_KERNELS_H

#include "ops/binary.h"
#include "ops/conv1d.h"
#include "ops/conv2d.h"
#include "ops/core.h"
#include "ops/dense.h"
#include "ops/distance.h"
#include "ops/elementwise.h"
#include "ops/loss.h"
#include "ops/norm.h"
#include "ops/pool.h"
#include "ops/shape.h"
#include "ops/volume.h"

// Linear's fused backward and optimizer update, and Linear's Clad pullback, which may call it
#include "linear_update.h"

#endif // ROOTCLAD_KERNELS_H
