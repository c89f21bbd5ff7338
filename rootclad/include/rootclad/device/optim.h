// rootclad/device/optim.h — the optimizers as device kernels (device_kernels.h says how they are
// written).
#ifndef ROOTCLAD_DEVICE_OPTIM_H
#define ROOTCLAD_DEVICE_OPTIM_H

#include "core.h"

namespace rootclad {
namespace dev {

// -- optimizers: SGD, Adam, AdamW as torch.optim's (optim_rule.h), over n parameters; m holds
// SGD's momentum buffer or Adam's first moment, v Adam's second moment (as on the CPU).
template <class On, class T>
void optim_step(On on, T* param, const T* grad, T* m, T* v, long n, const OptimConfig& c,
                long step);

// The same step with its configuration and count in memory (on the GPU, device memory): a
// first launch forms the step's constants into `s` and advances *step by one, the second
// updates the parameters. Nothing of the step is then a launch argument, so a captured CUDA
// graph replays it step after step (DeviceModel.cuda_graphs).
template <class On, class T>
void optim_step_in_memory(On on, T* param, const T* grad, T* m, T* v, long n, const OptimConfig* c,
                          long* step, OptimStep<T>* s);

} // namespace dev
} // namespace rootclad

#ifndef ROOTCLAD_DECLARATIONS_ONLY // a device program declares; the device runtime defines
#include "optim_impl.h"
#endif

#endif // ROOTCLAD_DEVICE_OPTIM_H
