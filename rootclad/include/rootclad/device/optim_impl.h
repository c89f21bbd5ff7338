// rootclad/device/optim_impl.h — the definitions of the device kernels device/optim.h declares
// (its comments say what each computes), and the helpers they share.
#ifndef ROOTCLAD_DEVICE_OPTIM_IMPL_H
#define ROOTCLAD_DEVICE_OPTIM_IMPL_H

#include "optim.h"

namespace rootclad {
namespace dev {

template <class On, class T>
void optim_step(On on, T* param, const T* grad, T* m, T* v, long n, const OptimConfig& c,
                long step) {
  const OptimStep<T> s(c, step);
  if (s.kind == OPTIM_SGD)
    each_index(on, n, ROOTCLAD_BODY(long i) { sgd_element(param[i], grad[i], m[i], s); });
  else if (s.kind == OPTIM_ADAMW)
    each_index(
        on, n, ROOTCLAD_BODY(long i) { adam_element<true>(param[i], grad[i], m[i], v[i], s); });
  else
    each_index(
        on, n, ROOTCLAD_BODY(long i) { adam_element<false>(param[i], grad[i], m[i], v[i], s); });
}

template <class On, class T>
void optim_step_in_memory(On on, T* param, const T* grad, T* m, T* v, long n, const OptimConfig* c,
                          long* step, OptimStep<T>* s) {
  each_index(
      on, 1, ROOTCLAD_BODY(long) {
        *s = OptimStep<T>(*c, *step);
        *step += 1;
      });
  each_index(
      on, n, ROOTCLAD_BODY(long i) {
        if (s->kind == OPTIM_SGD)
          sgd_element(param[i], grad[i], m[i], *s);
        else if (s->kind == OPTIM_ADAMW)
          adam_element<true>(param[i], grad[i], m[i], v[i], *s);
        else
          adam_element<false>(param[i], grad[i], m[i], v[i], *s);
      });
}

} // namespace dev
} // namespace rootclad

#endif // ROOTCLAD_DEVICE_OPTIM_IMPL_H
