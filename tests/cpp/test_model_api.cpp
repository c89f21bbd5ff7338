// rootclad/model_api.h without LibTorch: a compiled model loaded with dlopen and, when built
// with -DLINKED_PREFIX=<prefix> and the library on the link line, through
// ROOTCLAD_LINKED_MODEL. Driven by tests/libtorch/test_model_api.py.
//
//   test_model_api <model.so> <prefix> <B> <x.bin> <params.bin> <out.bin>
//
// Prints the layout, runs forward (eval) on x with params and writes the output.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "rootclad/model_api.h"

#ifdef LINKED_PREFIX
ROOTCLAD_LINKED_MODEL(LINKED_PREFIX, double)
#define CONCAT_(a, b) a##b
#define CONCAT(a, b) CONCAT_(a, b)
#endif

namespace {

template <typename T> std::vector<T> read_raw(const std::string& path, long n) {
  std::vector<T> v(n);
  std::ifstream in(path, std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(T))))
    throw std::runtime_error("cannot read " + std::to_string(n) + " values from " + path);
  return v;
}

template <typename T>
void run(const rootclad::ModelApi& api, int B, const std::string& x_path,
         const std::string& params_path, const std::string& out_path) {
  auto params = read_raw<T>(params_path, api.n_params);
  auto x = read_raw<T>(x_path, B * api.input_size);
  std::vector<T> act(api.act_size(B));
  std::copy(x.begin(), x.end(), act.begin() + B * api.input_offset);
  api.entry_points<T>().forward(params.data(), act.data(), B, /*training=*/0, /*seed=*/0);
  std::ofstream out(out_path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(act.data() + B * api.output_offset),
            static_cast<std::streamsize>(B * api.output_size * sizeof(T)));
}

void print_layout(const rootclad::ModelApi& api) {
  auto dims = [](const std::vector<long>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i)
      out += (i ? "," : "") + std::to_string(s[i]);
    return out + "]";
  };
  std::cout << "dtype " << api.dtype << "\nengine " << api.engine << "\nloss " << api.loss
            << "\nn_params " << api.n_params << "\ninput " << api.input_offset << " "
            << api.input_size << " " << dims(api.input_shape) << "\noutput " << api.output_offset
            << " " << api.output_size << " " << dims(api.output_shape) << "\n";
  for (const auto& p : api.params)
    std::cout << "param " << p.name << " " << p.offset << " " << p.numel << " " << dims(p.shape)
              << "\n";
}

#ifdef LINKED_PREFIX
bool same_layout(const rootclad::ModelApi& a, const rootclad::ModelApi& b) {
  bool same = a.prefix == b.prefix && a.dtype == b.dtype && a.engine == b.engine &&
              a.loss == b.loss && a.n_params == b.n_params && a.input_offset == b.input_offset &&
              a.input_size == b.input_size && a.output_offset == b.output_offset &&
              a.output_size == b.output_size && a.input_shape == b.input_shape &&
              a.output_shape == b.output_shape && a.params.size() == b.params.size() &&
              a.act_size(3) == b.act_size(3);
  for (size_t i = 0; same && i < a.params.size(); ++i)
    same = a.params[i].name == b.params[i].name && a.params[i].offset == b.params[i].offset &&
           a.params[i].shape == b.params[i].shape;
  return same;
}
#endif

} // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::cerr << "usage: " << argv[0] << " <model.so> <prefix> <B> <x.bin> <params.bin> <out>\n";
    return 2;
  }
  const std::string lib = argv[1], prefix = argv[2];
  const int B = std::stoi(argv[3]);
  // a model library copied away from the runtime library it links names what it lacks (first:
  // once the runtime is loaded, the loader finds it by its soname whatever the directory)
  if (const char* lone = std::getenv("LONE_LIBRARY")) {
    try {
      rootclad::load_model(lone, prefix);
      std::cout << "lone load: not refused\n";
    } catch (const std::runtime_error& e) {
      std::cout << "lone load: " << e.what() << "\n";
    }
  }
  const rootclad::ModelApi api = rootclad::load_model(lib, prefix);
  print_layout(api);
  if (api.is_double())
    run<double>(api, B, argv[4], argv[5], argv[6]);
  else
    run<float>(api, B, argv[4], argv[5], argv[6]);

  // Calling with the other real type is refused, not reinterpreted.
  try {
    if (api.is_double())
      api.entry_points<float>();
    else
      api.entry_points<double>();
    std::cout << "wrong-type call: not refused\n";
  } catch (const std::logic_error& e) {
    std::cout << "wrong-type call: " << e.what() << "\n";
  }
  for (const auto& [path, pre] : {std::pair<std::string, std::string>{lib, prefix + "_nope"},
                                  {lib + ".missing.so", prefix}}) {
    try {
      rootclad::load_model(path, pre);
      std::cout << "bad load: not refused\n";
    } catch (const std::runtime_error& e) {
      std::cout << "bad load: " << e.what() << "\n";
    }
  }
#ifdef LINKED_PREFIX
  const rootclad::ModelApi linked = CONCAT(LINKED_PREFIX, _model_api)();
  std::cout << "linked source " << linked.source << "\n";
  std::cout << "linked layout " << (same_layout(api, linked) ? "same" : "DIFFERENT") << "\n";
  run<double>(linked, B, argv[4], argv[5], std::string(argv[6]) + ".linked");
#endif
  return 0;
}
