// rootclad/optim.h — fused in-place optimizer updates over the whole parameter block, each
// following torch.optim's update order exactly (the rules: optim_rule.h).
#ifndef ROOTCLAD_OPTIM_H
#define ROOTCLAD_OPTIM_H

#include <cmath>

#include "optim_rule.h" // sibling-relative: macros include these headers by path

namespace rootclad {

// Updates p[0..n) from g; buf (SGD momentum) or m, v (Adam) are the matching slices of the
// optimizer state. step counts from 1. The element rules are optim_rule.h's.
template <typename T>
void optim_update(T* p, const T* g, T* m, T* v, long n, const OptimConfig& c, long step);

// Below this many parameters, waking a thread costs more than updating them.
constexpr long OPTIM_SPLIT_MIN = 65536;

// Updates p[0..n) from g with state m (SGD's momentum buffer, Adam's first moment) and v
// (Adam's second moment), each n long; large blocks in parallel over rootclad's thread pool.
template <typename T>
void optim_step_mv(T* p, const T* g, T* m, T* v, long n, const double* cfg_raw, long step);

// The whole parameter block: state holds 2N values, m then v (SGD uses the first N).
template <typename T>
void optim_step(T* p, const T* g, T* state, long N, const double* cfg_raw, long step);

} // namespace rootclad

#ifndef ROOTCLAD_DECLARATIONS_ONLY // the glue of a model declares; the runtime defines
#include "optim_impl.h"
#endif

#endif // ROOTCLAD_OPTIM_H
