// rootclad/optim_rule.h — the optimizers' update of one parameter element, shared by the CPU
// loop (optim.h) and the device kernel (device_kernels.h), so both follow torch.optim's
// update order exactly (float64 runs track torch to rounding):
//   SGD:   g += wd*p;  buf = g (first step) | momentum*buf + (1-dampening)*g;
//          g = nesterov ? g + momentum*buf : buf;  p -= lr*g
//   Adam:  g += wd*p;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2;
//          p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
//   AdamW: p *= 1 - lr*wd, then Adam without the L2 term.
#ifndef ROOTCLAD_OPTIM_RULE_H
#define ROOTCLAD_OPTIM_RULE_H

#include <cmath>

#include "hd.h"

namespace rootclad {

enum OptimKind { OPTIM_SGD = 0, OPTIM_ADAM = 1, OPTIM_ADAMW = 2 };

// Hyperparameters, laid out as the double array the Python side passes (see optim.py).
struct OptimConfig {
  double kind, lr, momentum, dampening, weight_decay, nesterov, beta1, beta2, eps;
};

// The constants of one step (step counts from 1), in the parameters' type. Each is computed
// as torch.optim computes it, in double and rounded once to T: 1 - beta2 computed in float
// from 0.999f is 0.00099998713, 1.3e-5 short of torch's 0.001f, and that bias alone moved the
// GW MLP's float32 loss 2e-3 away from torch's within 100 Adam steps (torch's own float32 run
// stays within 1e-7 of its float64 one; tests/cuda/test_device_model.py).
template <typename T> struct OptimStep {
  int kind;
  bool first, nesterov;
  T lr, wd, momentum, one_minus_dampening, b2, one_minus_b1, one_minus_b2, eps, step_size, bc2_sqrt,
      decay;

  OptimStep() = default;
  ROOTCLAD_HD OptimStep(const OptimConfig& c, long step)
      : kind((int)c.kind), first(step == 1), nesterov(c.nesterov != 0), lr((T)c.lr),
        wd((T)c.weight_decay), momentum((T)c.momentum), one_minus_dampening((T)(1.0 - c.dampening)),
        b2((T)c.beta2), one_minus_b1((T)(1.0 - c.beta1)), one_minus_b2((T)(1.0 - c.beta2)),
        eps((T)c.eps), step_size((T)(c.lr / (1.0 - std::pow(c.beta1, (double)step)))),
        bc2_sqrt((T)std::sqrt(1.0 - std::pow(c.beta2, (double)step))),
        decay((T)(1.0 - c.lr * c.weight_decay)) {}
};

// SGD on one element; buf is its momentum buffer.
template <typename T>
ROOTCLAD_HD inline void sgd_element(T& p, T g, T& buf, const OptimStep<T>& s) {
  T gi = g + s.wd * p;
  if (s.momentum != T(0)) {
    buf = s.first ? gi : s.momentum * buf + s.one_minus_dampening * gi;
    gi = s.nesterov ? gi + s.momentum * buf : buf;
  }
  p -= s.lr * gi;
}

// Adam (DECOUPLED: AdamW) on one element with its moments m and v; m moves towards g as
// torch's lerp does (from the nearer end), v as its mul_ and addcmul_.
template <bool DECOUPLED, typename T>
ROOTCLAD_HD inline void adam_element(T& p, T g, T& m, T& v, const OptimStep<T>& s) {
  if (DECOUPLED)
    p *= s.decay;
  else
    g += s.wd * p;
  const T d = g - m;
  m = s.one_minus_b1 < T(0.5) ? m + s.one_minus_b1 * d : g - d * (T(1) - s.one_minus_b1);
  v = s.b2 * v + s.one_minus_b2 * g * g;
  p -= s.step_size * m / (std::sqrt(v) / s.bc2_sqrt + s.eps);
}

} // namespace rootclad

#endif // ROOTCLAD_OPTIM_RULE_H
