// rootclad/model_api.h — a compiled rootclad model seen from C++, without the Python side.
//
// A compiled model is a shared library exporting a C API whose names all start with the
// model's prefix P (Python: cm._em.prefix). ModelApi holds that API as function pointers,
// plus the layout the library reports about itself (dtype, loss, per-sample input/output
// regions of the activation buffer, parameter names/offsets/shapes), so a host program needs
// nothing from the generated code at compile time:
//
//   rootclad::ModelApi api = rootclad::load_model("/path/model.so", "rc_1a2b..._bce_pp");
//
// or, for a library linked into the program (-l:model.so), at global scope:
//
//   ROOTCLAD_LINKED_MODEL(rc_1a2b..._bce_pp, double)   // defines rc_1a2b..._bce_pp_model_api()
//
// rootclad/torch_function.h builds the LibTorch autograd Function on top of this header.
#ifndef ROOTCLAD_MODEL_API_H
#define ROOTCLAD_MODEL_API_H

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace rootclad {

// The entry points that take or return the real type T (float or double).
template <typename T> struct ModelEntryPoints {
  // forward(params[n_params], act[act_size(B)], B, training, seed); input already in act
  void (*forward)(T* params, T* act, int B, int training, std::uint64_t seed) = nullptr;
  // the mean loss over the batch, after forward(); y holds B * output_size targets
  T (*loss_value)(T* act, const T* y, int B) = nullptr;
  // forward + loss + backward; fills d_params (and act's input region of d_act if need_dx);
  // w: per-sample loss weights (B values) or null (kernels.h: weighted_loss)
  T(*loss_and_grad)
  (T* params, T* act, const T* y, T* d_params, T* d_act, int B, int training, std::uint64_t seed,
   int need_dx, const T* w) = nullptr;
  // after forward(): d_params (and d_act's input region if need_dx) = J^T d_out
  void (*vjp)(T* params, T* act, T* d_params, T* d_act, const T* d_out, int B, int training,
              std::uint64_t seed, int need_dx) = nullptr;
  // loss_and_grad + an optimizer update (opt_cfg: rootclad::OptimConfig, step from 1).
  // tensor_steps: null (every parameter tensor at `step`), or one step count per parameter
  // tensor, 0 for a frozen one (left unchanged, as torch.optim skips a parameter without grad);
  // w: per-sample loss weights or null
  T(*train_step)
  (T* params, T* act, const T* y, T* d_params, T* d_act, T* opt_state, const double* opt_cfg,
   long step, int B, std::uint64_t seed, const long* tensor_steps, const T* w) = nullptr;
};

struct ParamInfo {
  std::string name; // as in the torch module's named_parameters()
  long offset = 0;  // into the flat parameter block
  long numel = 0;
  std::vector<long> shape;
};

struct ModelApi {
  std::string source; // the library path, or "linked:<prefix>"
  std::string prefix;
  std::string dtype;  // "float32" or "float64"
  std::string engine; // "pullback", "clad" or "clad-nopullbacks"
  std::string loss;   // "bce_with_logits", "mse", "huber", "cross_entropy" or "nll"
  long n_params = 0;
  // Per-sample offsets and sizes in elements of T; the regions of a batch of B start at
  // B * offset and are B * size long. Shapes exclude the batch dimension.
  long input_offset = 0, input_size = 0, output_offset = 0, output_size = 0;
  std::vector<long> input_shape, output_shape;
  std::vector<ParamInfo> params;
  long (*act_size)(int B) = nullptr;   // activation buffer length for batch B
  long (*d_act_size)(int B) = nullptr; // their adjoints' buffer (its own memory plan)
  ModelEntryPoints<float> f32;         // filled when dtype == "float32"
  ModelEntryPoints<double> f64;        // filled when dtype == "float64"

  bool is_double() const { return dtype == "float64"; }
  // cross_entropy and nll take one class index per sample; the other losses one target per
  // output element
  bool class_targets() const { return loss == "cross_entropy" || loss == "nll"; }
  int element_size() const { return is_double() ? 8 : 4; }

  // The real-typed entry points; throws if T is not the model's dtype.
  template <typename T> const ModelEntryPoints<T>& entry_points() const {
    constexpr bool want_double = sizeof(T) == sizeof(double);
    if (want_double != is_double())
      throw std::logic_error("rootclad model " + prefix + " (" + source + ") is " + dtype +
                             ", called with " + (want_double ? "double" : "float"));
    if constexpr (want_double)
      return f64;
    else
      return f32;
  }
};

namespace detail {

template <typename Fn> Fn to_fn(void* p) {
  static_assert(sizeof(Fn) == sizeof(void*), "function and data pointers differ in size");
  Fn f;
  std::memcpy(&f, &p, sizeof p);
  return f;
}

template <typename Fn> void* to_ptr(Fn f) {
  static_assert(sizeof(Fn) == sizeof(void*), "function and data pointers differ in size");
  void* p;
  std::memcpy(&p, &f, sizeof p);
  return p;
}

template <typename T, typename Need> ModelEntryPoints<T> entry_points(const Need& need) {
  ModelEntryPoints<T> e;
  e.forward = to_fn<decltype(e.forward)>(need("forward"));
  e.loss_value = to_fn<decltype(e.loss_value)>(need("loss_value"));
  e.loss_and_grad = to_fn<decltype(e.loss_and_grad)>(need("loss_and_grad"));
  e.vjp = to_fn<decltype(e.vjp)>(need("vjp"));
  e.train_step = to_fn<decltype(e.train_step)>(need("train_step"));
  return e;
}

inline std::vector<long> shape_of(const long* dims, int ndim) {
  return dims && ndim > 0 ? std::vector<long>(dims, dims + ndim) : std::vector<long>{};
}

} // namespace detail

// Fills a ModelApi from any symbol source (lookup: the full name -> its address, or nullptr
// when it is missing); throws std::runtime_error naming `source` and the first missing symbol,
// or a layout the library contradicts.
//
// The callables are template parameters, never converted to std::function: Cling cannot unload
// a std::function made from a lambda of a macro's header, and crashed when a macro including
// this header ran twice in one session (.x twice, .L twice, ProcessLine in a loop).
template <typename Lookup>
ModelApi make_model_api(const std::string& source, const std::string& prefix,
                        const Lookup& lookup) {
  auto need = [&](const char* suffix) -> void* {
    const std::string symbol = prefix + "_" + suffix;
    if (void* p = lookup(symbol))
      return p;
    std::string hint = std::strcmp(suffix, "n_params") == 0
                           ? "is the prefix right? (Python: cm._em.prefix)"
                           : "a library built by an older rootclad? recompile the model";
    throw std::runtime_error("rootclad: " + source + " has no symbol " + symbol + " (" + hint +
                             ")");
  };
  using Str = const char* (*)();
  using Long = long (*)();
  using Shape = const long* (*)(int*);
  ModelApi api;
  api.source = source;
  api.prefix = prefix;
  // libraries before the graph IR have no n_inputs: they all take one input
  if (void* n_inputs = lookup(prefix + "_n_inputs")) {
    const int n = detail::to_fn<int (*)()>(n_inputs)();
    if (n != 1)
      throw std::runtime_error("rootclad: " + source + " is a model with " + std::to_string(n) +
                               " inputs; the C++ hosts (rootclad::Model, TorchModel, RDataFrame) "
                               "take single-input models: call it from Python, cm(x, theta)");
  }
  if (void* n_buffers = lookup(prefix + "_n_buffers")) {
    if (detail::to_fn<long (*)()>(n_buffers)() != 0)
      throw std::runtime_error("rootclad: " + source +
                               " keeps running statistics (BatchNorm), "
                               "which the C++ hosts do not store yet: use it from Python");
  }
  api.n_params = detail::to_fn<Long>(need("n_params"))();
  api.act_size = detail::to_fn<long (*)(int)>(need("act_size"));
  api.d_act_size = detail::to_fn<long (*)(int)>(need("d_act_size"));
  api.dtype = detail::to_fn<Str>(need("dtype"))();
  api.engine = detail::to_fn<Str>(need("engine"))();
  api.loss = detail::to_fn<Str>(need("loss"))();
  api.input_offset = detail::to_fn<Long>(need("input_offset"))();
  api.input_size = detail::to_fn<Long>(need("input_size"))();
  api.output_offset = detail::to_fn<Long>(need("output_offset"))();
  api.output_size = detail::to_fn<Long>(need("output_size"))();
  int ndim = 0;
  const long* dims = detail::to_fn<Shape>(need("input_shape"))(&ndim);
  api.input_shape = detail::shape_of(dims, ndim);
  dims = detail::to_fn<Shape>(need("output_shape"))(&ndim);
  api.output_shape = detail::shape_of(dims, ndim);
  const int count = detail::to_fn<int (*)()>(need("param_count"))();
  auto name = detail::to_fn<const char* (*)(int)>(need("param_name"));
  auto offset = detail::to_fn<long (*)(int)>(need("param_offset"));
  auto numel = detail::to_fn<long (*)(int)>(need("param_numel"));
  auto shape = detail::to_fn<const long* (*)(int, int*)>(need("param_shape"));
  long total = 0;
  for (int i = 0; i < count; ++i) {
    ParamInfo p;
    p.name = name(i);
    p.offset = offset(i);
    p.numel = numel(i);
    dims = shape(i, &ndim);
    p.shape = detail::shape_of(dims, ndim);
    total += p.numel;
    api.params.push_back(std::move(p));
  }
  if (api.dtype == "float64")
    api.f64 = detail::entry_points<double>(need);
  else if (api.dtype == "float32")
    api.f32 = detail::entry_points<float>(need);
  else
    throw std::runtime_error("rootclad: " + source + " reports dtype '" + api.dtype +
                             "'; expected float32 or float64");
  if (total != api.n_params)
    throw std::runtime_error("rootclad: " + source + " lists parameters of " +
                             std::to_string(total) + " elements but holds " +
                             std::to_string(api.n_params));
  return api;
}

// Opens a compiled model's library with dlopen. The library stays loaded for the life of the
// process (the returned function pointers point into it).
inline ModelApi load_model(const std::string& library_path, const std::string& prefix) {
  void* handle = dlopen(library_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* err = dlerror();
    std::string why = err ? err : "unknown dlopen error";
    if (why.find("librootclad_rt") != std::string::npos)
      why += " (a model library links rootclad's runtime library, which the loader looks for "
             "beside it: copy the model with CompiledModel.self_contained_library(), which "
             "holds the runtime, or compile the model again with rootclad, which rebuilds "
             "both in its cache)";
    throw std::runtime_error("rootclad: cannot load model library " + library_path + ": " + why);
  }
  return make_model_api(library_path, prefix, [handle](const std::string& symbol) {
    return dlsym(handle, symbol.c_str());
  });
}

} // namespace rootclad

// For a library linked into the program: declares its C API (T: float or double, matching
// the model's dtype) and defines `rootclad::ModelApi P_model_api()`. Use at global scope.
#define ROOTCLAD_LINKED_MODEL(P, T) ROOTCLAD_LINKED_MODEL_IMPL_(P, T)
#define ROOTCLAD_LINKED_MODEL_IMPL_(P, T)                                                          \
  extern "C" {                                                                                     \
  long P##_n_params();                                                                             \
  long P##_act_size(int);                                                                          \
  long P##_d_act_size(int);                                                                        \
  const char* P##_engine();                                                                        \
  const char* P##_dtype();                                                                         \
  const char* P##_loss();                                                                          \
  long P##_input_offset();                                                                         \
  long P##_input_size();                                                                           \
  const long* P##_input_shape(int*);                                                               \
  long P##_output_offset();                                                                        \
  long P##_output_size();                                                                          \
  const long* P##_output_shape(int*);                                                              \
  int P##_param_count();                                                                           \
  const char* P##_param_name(int);                                                                 \
  long P##_param_offset(int);                                                                      \
  long P##_param_numel(int);                                                                       \
  const long* P##_param_shape(int, int*);                                                          \
  void P##_forward(T*, T*, int, int, std::uint64_t);                                               \
  T P##_loss_value(T*, const T*, int);                                                             \
  T P##_loss_and_grad(T*, T*, const T*, T*, T*, int, int, std::uint64_t, int, const T*);           \
  void P##_vjp(T*, T*, T*, T*, const T*, int, int, std::uint64_t, int);                            \
  T P##_train_step(T*, T*, const T*, T*, T*, T*, const double*, long, int, std::uint64_t,          \
                   const long*, const T*);                                                         \
  }                                                                                                \
  inline ::rootclad::ModelApi P##_model_api() {                                                    \
    using ::rootclad::detail::to_ptr;                                                              \
    const std::pair<const char*, void*> table[] = {                                                \
        {#P "_n_params", to_ptr(&P##_n_params)},                                                   \
        {#P "_act_size", to_ptr(&P##_act_size)},                                                   \
        {#P "_d_act_size", to_ptr(&P##_d_act_size)},                                               \
        {#P "_engine", to_ptr(&P##_engine)},                                                       \
        {#P "_dtype", to_ptr(&P##_dtype)},                                                         \
        {#P "_loss", to_ptr(&P##_loss)},                                                           \
        {#P "_input_offset", to_ptr(&P##_input_offset)},                                           \
        {#P "_input_size", to_ptr(&P##_input_size)},                                               \
        {#P "_input_shape", to_ptr(&P##_input_shape)},                                             \
        {#P "_output_offset", to_ptr(&P##_output_offset)},                                         \
        {#P "_output_size", to_ptr(&P##_output_size)},                                             \
        {#P "_output_shape", to_ptr(&P##_output_shape)},                                           \
        {#P "_param_count", to_ptr(&P##_param_count)},                                             \
        {#P "_param_name", to_ptr(&P##_param_name)},                                               \
        {#P "_param_offset", to_ptr(&P##_param_offset)},                                           \
        {#P "_param_numel", to_ptr(&P##_param_numel)},                                             \
        {#P "_param_shape", to_ptr(&P##_param_shape)},                                             \
        {#P "_forward", to_ptr(&P##_forward)},                                                     \
        {#P "_loss_value", to_ptr(&P##_loss_value)},                                               \
        {#P "_loss_and_grad", to_ptr(&P##_loss_and_grad)},                                         \
        {#P "_vjp", to_ptr(&P##_vjp)},                                                             \
        {#P "_train_step", to_ptr(&P##_train_step)},                                               \
    };                                                                                             \
    ::rootclad::ModelApi api = ::rootclad::make_model_api(                                         \
        "linked:" #P, #P, [&table](const std::string& symbol) -> void* {                           \
          for (const auto& entry : table)                                                          \
            if (symbol == entry.first)                                                             \
              return entry.second;                                                                 \
          return nullptr;                                                                          \
        });                                                                                        \
    if (sizeof(T) != static_cast<std::size_t>(api.element_size()))                                 \
      throw std::logic_error("rootclad: ROOTCLAD_LINKED_MODEL(" #P ", " #T ") but the model is " + \
                             api.dtype);                                                           \
    return api;                                                                                    \
  }

#endif // ROOTCLAD_MODEL_API_H
