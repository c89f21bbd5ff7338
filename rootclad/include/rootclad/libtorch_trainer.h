// rootclad/libtorch_trainer.h — LibTorch training of an exported model, for ROOT sessions that
// should not parse the torch headers (15-25 s in Cling).
//
// The class is compiled once against LibTorch into a small library (libtorch_trainer.cpp;
// `python -m rootclad.torch.libtorch --trainer` builds it and prints its path). Inside, the
// model runs as rootclad::CompiledFunction on LibTorch tensors (torch_function.h): its forward
// and its Clad or pullback backward, the loss as torch computes it, LibTorch's autograd and a
// torch::optim optimizer. This header declares only plain C++ types, so a macro declares it in
// milliseconds:
//
//   gSystem->Load(path_of_the_trainer_library);
//   #include "rootclad/libtorch_trainer.h"
//   rootclad::Model m("build/gwnet");                       // weights and library, checked
//   rootclad::LibTorchTrainer t("build/gwnet.so", m.api().prefix.c_str(),
//                               m.parameters().data(), m.n_params(), "adam", 1e-3);
//   double loss = t.train_step(x.data(), y.data(), B);      // float inputs, (B, input) rows
//   std::vector<double> p(m.n_params()); t.parameters(p.data()); m.set_parameters(p);
//
// Errors (a wrong optimizer name, a library that does not load, bad shapes) throw
// std::runtime_error.
#ifndef ROOTCLAD_LIBTORCH_TRAINER_H
#define ROOTCLAD_LIBTORCH_TRAINER_H

namespace rootclad {

class LibTorchTrainer {
public:
  // library, prefix: the model (STEM.so and the prefix in STEM.root's metadata); params: its
  // n_params starting values; optimizer: "sgd", "adam" or "adamw" (torch::optim's) with rate lr.
  LibTorchTrainer(const char* library, const char* prefix, const double* params, long n_params,
                  const char* optimizer, double lr);
  ~LibTorchTrainer();
  LibTorchTrainer(const LibTorchTrainer&) = delete;
  LibTorchTrainer& operator=(const LibTorchTrainer&) = delete;

  // x: B * input_size floats, y: B * output_size targets (cross_entropy, nll: B class indices).
  // One optimizer step on the mean loss; returns the loss.
  double train_step(const float* x, const float* y, int B);
  // The mean loss without a step (eval mode).
  double loss(const float* x, const float* y, int B);
  // The model's output, out: B * output_size (eval mode).
  void predict(const float* x, float* out, int B);
  long n_params() const;
  void parameters(double* out) const; // n_params values

private:
  struct Impl;
  Impl* impl_;
};

} // namespace rootclad

#endif // ROOTCLAD_LIBTORCH_TRAINER_H
