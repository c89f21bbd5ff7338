// rootclad/optim_rule.h — the optimizers' update of one parameter element, shared by the CPU
// loop (optim.h) and the device kernel (device_kernels.h), so both follow torch.optim's
// update order exactly (float64 runs track torch to rounding):
//   SGD:   g += wd*p;  buf = g (first step) | momentum*buf + (1-dampening)*g;
//          g = nesterov ? g + momentum*buf : buf;  p -= lr*g
//   Adam:  g += wd*p;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2;
//          p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
//   AdamW: p *= 1 - lr*wd, then Adam without the L2 term.
#pragma once

#include <cmath>

#include "hd.h"

namespace rootclad {

enum OptimKind { OPTIM_SGD = 0, OPTIM_ADAM = 1, OPTIM_ADAMW = 2 };

// Hyperparameters, laid out as the double array the Python side passes (see optim.py).
struct OptimConfig {
  double kind, lr, momentum, dampening, weight_decay, nesterov, beta1, beta2, eps;
};

// The constants of one step (step counts from 1), in the parameters' type.
template <typename T> struct OptimStep {
  int kind;
  bool first, nesterov;
  T lr, wd, momentum, dampening, b1, b2, eps, step_size, bc2_sqrt;

  OptimStep() = default;
  ROOTCLAD_HD OptimStep(const OptimConfig& c, long step)
      : kind((int)c.kind), first(step == 1), nesterov(c.nesterov != 0), lr((T)c.lr),
        wd((T)c.weight_decay), momentum((T)c.momentum), dampening((T)c.dampening), b1((T)c.beta1),
        b2((T)c.beta2), eps((T)c.eps),
        step_size((T)c.lr / (T(1) - (T)std::pow(c.beta1, (double)step))),
        bc2_sqrt((T)std::sqrt(1.0 - std::pow(c.beta2, (double)step))) {}
};

// SGD on one element; buf is its momentum buffer.
template <typename T>
ROOTCLAD_HD inline void sgd_element(T& p, T g, T& buf, const OptimStep<T>& s) {
  T gi = g + s.wd * p;
  if (s.momentum != T(0)) {
    buf = s.first ? gi : s.momentum * buf + (T(1) - s.dampening) * gi;
    gi = s.nesterov ? gi + s.momentum * buf : buf;
  }
  p -= s.lr * gi;
}

// Adam (DECOUPLED: AdamW) on one element with its moments m and v.
template <bool DECOUPLED, typename T>
ROOTCLAD_HD inline void adam_element(T& p, T g, T& m, T& v, const OptimStep<T>& s) {
  if (DECOUPLED)
    p *= T(1) - s.lr * s.wd;
  else
    g += s.wd * p;
  m = s.b1 * m + (T(1) - s.b1) * g;
  v = s.b2 * v + (T(1) - s.b2) * g * g;
  p -= s.step_size * m / (std::sqrt(v) / s.bc2_sqrt + s.eps);
}

} // namespace rootclad
