// rootclad/optimizers.h — the optimizers of rootclad::Model's train_step (SGD, Adam, AdamW):
// hyperparameters, defaults and checks as torch.optim's; the update itself runs in the model's
// library (optim.h, optim_rule.h).
#ifndef ROOTCLAD_OPTIMIZERS_H
#define ROOTCLAD_OPTIMIZERS_H

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "optim_rule.h"

namespace rootclad {

class Model;

// An optimizer run inside the library's train_step; hyperparameters, defaults and update
// order as torch.optim's (rootclad/optim.h). Its state belongs to it, not to the model.
class Optimizer {
public:
  OptimConfig config{};
  long step = 0;
  std::vector<double> state_d; // 2 * n_params: momentum, or Adam's two moments
  std::vector<float> state_f;

  // The constructors' ranges, for a configuration read from a file (Model::load): a beta of 1
  // or a negative learning rate there would turn every parameter NaN at the next step.
  static void check_config(const OptimConfig& c) {
    if (c.kind == OPTIM_SGD) {
      check("learning rate", c.lr, 0);
      check("momentum", c.momentum, 0);
      check("dampening", c.dampening, -INFINITY);
      check("weight_decay", c.weight_decay, 0);
      check("nesterov", c.nesterov, 0, 1);
      if (c.nesterov != 0 && (c.momentum <= 0 || c.dampening != 0))
        throw std::invalid_argument("rootclad: Nesterov momentum requires a momentum and zero "
                                    "dampening");
    } else if (c.kind == OPTIM_ADAM || c.kind == OPTIM_ADAMW) {
      check("learning rate", c.lr, 0);
      check("weight_decay", c.weight_decay, 0);
      check("beta1", c.beta1, 0, 1, true);
      check("beta2", c.beta2, 0, 1, true);
      check("epsilon", c.eps, 0);
    } else {
      throw std::invalid_argument("rootclad: unknown optimizer kind " + std::to_string(c.kind));
    }
  }

protected:
  static double check(const char* what, double v, double low, double high = INFINITY,
                      bool high_open = false) {
    const bool ok = std::isfinite(v) && v >= low && (high_open ? v < high : v <= high);
    if (!ok)
      throw std::invalid_argument(std::string("rootclad: invalid ") + what + ": " +
                                  std::to_string(v));
    return v;
  }
};

class SGD : public Optimizer {
public:
  explicit SGD(const Model&, double lr = 1e-3, double momentum = 0, double dampening = 0,
               double weight_decay = 0, bool nesterov = false) {
    config = {OPTIM_SGD,
              check("learning rate", lr, 0),
              check("momentum", momentum, 0),
              check("dampening", dampening, -INFINITY),
              check("weight_decay", weight_decay, 0),
              double(nesterov),
              0,
              0,
              0};
    if (nesterov && (momentum <= 0 || dampening != 0))
      throw std::invalid_argument("rootclad: Nesterov momentum requires a momentum and zero "
                                  "dampening");
  }
};

class Adam : public Optimizer {
public:
  explicit Adam(const Model&, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999,
                double eps = 1e-8, double weight_decay = 0) {
    config = {OPTIM_ADAM,
              check("learning rate", lr, 0),
              0,
              0,
              check("weight_decay", weight_decay, 0),
              0,
              check("beta1", beta1, 0, 1, true),
              check("beta2", beta2, 0, 1, true),
              check("epsilon", eps, 0)};
  }
};

class AdamW : public Adam {
public:
  explicit AdamW(const Model& m, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999,
                 double eps = 1e-8, double weight_decay = 1e-2)
      : Adam(m, lr, beta1, beta2, eps, weight_decay) {
    config.kind = OPTIM_ADAMW;
  }
};

} // namespace rootclad

#endif // ROOTCLAD_OPTIMIZERS_H
