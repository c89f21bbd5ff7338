// rootclad/ops/activations.h — the math of every elementwise op, written once.
//
// Each op is a functor with its value f(x) and its input's adjoint grad(g, x, y) (g: the
// output's adjoint, x: the input, y = f(x)), as torch computes them; one with a parameter per
// channel (PReLU) has f(x, a), grad(g, x, y, a) and the parameter's share param_grad(g, x, y, a).
// Every backend runs these: the CPU kernels (unary_forward / unary_backward in ops/elementwise.h,
// which Clad differentiates or whose pullback it calls), and the device kernels
// (device/elementwise.h). A functor whose grad reads y alone (the op's registry entry says
// saves=("out",): Relu, Tanh, Sigmoid) may be fused into the op that produces its input on the
// GPU, and is then called with x = 0.
//
// Clad differentiates f itself in the build without custom pullbacks (pullbacks=False): keep f
// to expressions Clad knows (arithmetic, ?:, std:: math functions), one declaration per
// statement (see docs/design.md, "What Clad taught the emitter").
//
// Adding an elementwise op: its functor here, a line in rootclad/ir/ops/elementwise.py, its
// ONNX op in rootclad/frontends/onnx/ops.py, a case in tests/fixtures/op_cases.py.
#ifndef ROOTCLAD_OPS_ACTIVATIONS_H
#define ROOTCLAD_OPS_ACTIVATIONS_H

#include <cmath>
#include <cstdint>
#include <cstring>

#include "../hd.h"

namespace rootclad {

// ---------------------------------------------------------------------------------------
// exp and tanh that a CPU loop vectorises: libm's are scalar calls (3.5 ns a value against
// torch's 0.19, docs/benchmarks/activations.md), which bounded an LSTM's step. exp(x) =
// 2^n (1 + expm1(r)), n = round(x / ln 2), |r| <= ln 2 / 2, expm1(r) by its Taylor series to
// below the type's rounding (r^8/8! for float, r^14/14! for double), 2^n written into the
// exponent bits; below exp(lo) (about 4 times the smallest normal number) 0, above the largest
// finite value inf, NaN stays NaN.
// tanh(|x|) = -e / (2 + e), e = expm1(-2|x|), accurate near 0 as expm1 is (no 1 - exp).
// The device (CUDA's own vector math) and Clad differentiating f itself (pullbacks=False,
// which must see std:: functions) use std::exp and std::tanh.
namespace vmath {
template <class T> struct Bits;
template <> struct Bits<float> {
  using I = std::int32_t;
  static constexpr int mant = 23, bias = 127, terms = 8;
  static constexpr float lo = -86.6f, hi = 88.72f; // 2^(n-1) normal; exp(hi) < FLT_MAX
};
template <> struct Bits<double> {
  using I = std::int64_t;
  static constexpr int mant = 52, bias = 1023, terms = 14;
  static constexpr double lo = -707.7, hi = 709.78;
};

// (expm1(r), n) with x = n ln2 + r; x already inside [lo, hi]
template <class T> inline T reduced_expm1(T x, T& n) {
  n = std::nearbyint(x * T(1.44269504088896340736));
  const T r = (x - n * T(0.693145751953125)) - n * T(1.42860682030941723212e-6);
  // Horner of (e^r - 1) / r = sum r^k / (k+1)!, by multiplications only
  constexpr double inv_fact[] = {1.0,
                                 1.0,
                                 1.0 / 2,
                                 1.0 / 6,
                                 1.0 / 24,
                                 1.0 / 120,
                                 1.0 / 720,
                                 1.0 / 5040,
                                 1.0 / 40320,
                                 1.0 / 362880,
                                 1.0 / 3628800,
                                 1.0 / 39916800,
                                 1.0 / 479001600,
                                 1.0 / 6227020800.0,
                                 1.0 / 87178291200.0};
  T p = T(inv_fact[Bits<T>::terms]);
  for (int k = Bits<T>::terms - 1; k >= 1; --k)
    p = T(inv_fact[k]) + r * p;
  return r * p;
}

template <class T> inline T pow2(T n) {
  using I = typename Bits<T>::I;
  const I bits = (I)((I)n + Bits<T>::bias) << Bits<T>::mant;
  T out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

template <class T> inline T exp(T x) {
  const T xc = x < Bits<T>::lo ? Bits<T>::lo : (x > Bits<T>::hi ? Bits<T>::hi : x);
  T n;
  const T q = reduced_expm1(xc, n);
  const T e = (T(1) + q) * pow2(n - T(1)) * T(2); // 2^(n-1): n reaches the top exponent + 1
  return x < Bits<T>::lo ? T(0) : (x > Bits<T>::hi ? T(HUGE_VAL) : e);
}

// expm1(x) for x <= 0 (tanh's argument): exact form near 0, 2^n (1 + q) - 1 elsewhere
template <class T> inline T expm1_neg(T x) {
  const T xc = x < Bits<T>::lo ? Bits<T>::lo : x;
  T n;
  const T q = reduced_expm1(xc, n);
  const T e = (T(1) + q) * pow2(n) - T(1);
  return x < Bits<T>::lo ? T(-1) : (n == T(0) ? q : e);
}

template <class T> inline T tanh(T x) {
  const T a = x < T(0) ? -x : x;
  const T e = expm1_neg(T(-2) * a);
  const T t = -e / (T(2) + e);
  return x < T(0) ? -t : t;
}
} // namespace vmath

#if defined(__CUDA_ARCH__) || defined(ROOTCLAD_NO_PULLBACKS)
template <class T> ROOTCLAD_HD inline T fast_exp(T x) {
  return std::exp(x);
}
template <class T> ROOTCLAD_HD inline T fast_tanh(T x) {
  return std::tanh(x);
}
#else
template <class T> ROOTCLAD_HD inline T fast_exp(T x) {
  return vmath::exp(x);
}
template <class T> ROOTCLAD_HD inline T fast_tanh(T x) {
  return vmath::tanh(x);
}
#endif

// |x|; the gradient sign(x) g, 0 at 0 (torch's).
struct Abs {
  template <class T> ROOTCLAD_HD T f(T x) const { return x < T(0) ? -x : x; }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const {
    return x > T(0) ? g : (x < T(0) ? -g : T(0));
  }
};

// Standalone math (torch.exp, log, log1p, erf, sqrt, rsqrt, sign), torch's values and gradients:
// log and sqrt of a negative number are NaN, of 0 -inf and 0, and their gradients there inf,
// as torch's; sign's gradient is 0 everywhere.
struct Exp {
  template <class T> ROOTCLAD_HD T f(T x) const { return std::exp(x); }
  template <class T> ROOTCLAD_HD T grad(T g, T, T y) const { return g * y; }
};

struct Log {
  template <class T> ROOTCLAD_HD T f(T x) const { return std::log(x); }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const { return g / x; }
};

struct Log1p {
  template <class T> ROOTCLAD_HD T f(T x) const { return std::log1p(x); }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const { return g / (T(1) + x); }
};

// Trigonometric and hyperbolic functions and their inverses (torch.sin, ..., torch.atanh; ONNX's
// Sin, ..., Atanh), torch's values and gradients: outside an inverse's domain (asin, acos, atanh
// beyond 1 in size, acosh below 1) the value is NaN, at its edge the gradient inf, as torch's.
struct Sin {
  template <class T> ROOTCLAD_HD T f(T x) const { return std::sin(x); }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const { return g * std::cos(x); }
};

struct Cos {
  template <class T> ROOTCLAD_HD T f(T x) const { return std::cos(x); }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const { return -g * std::sin(x); }
};

// tan  =>  dx = g (1 + tan(x)^2), the output recomputed (one fusable activation fewer for the
// device runtime to instantiate)
struct Tan {
  template <class T> ROOTCLAD_HD T f(T x) const { return std::tan(x); }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const {
    const T y = std::tan(x);
    return g * (T(1) + y * y);
  }
};

struct Asin {
  template <class T> ROOTCLAD_HD T f(T x) const { return std::asin(x); }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const { return g / std::sqrt(T(1) - x * x); }
};

struct Acos {
  template <class T> ROOTCLAD_HD T f(T x) const { return std::acos(x); }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const { return -g / std::sqrt(T(1) - x * x); }
};

struct Atan {
  template <class T> ROOTCLAD_HD T f(T x) const { return std::atan(x); }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const { return g / (T(1) + x * x); }
};

struct Sinh {
  template <class T> ROOTCLAD_HD T f(T x) const { return std::sinh(x); }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const { return g * std::cosh(x); }
};

struct Cosh {
  template <class T> ROOTCLAD_HD T f(T x) const { return std::cosh(x); }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const { return g * std::sinh(x); }
};

struct Asinh {
  template <class T> ROOTCLAD_HD T f(T x) const { return std::asinh(x); }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const { return g / std::sqrt(x * x + T(1)); }
};

struct Acosh {
  template <class T> ROOTCLAD_HD T f(T x) const { return std::acosh(x); }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const { return g / std::sqrt(x * x - T(1)); }
};

struct Atanh {
  template <class T> ROOTCLAD_HD T f(T x) const { return std::atanh(x); }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const { return g / (T(1) - x * x); }
};

// erf  =>  dx = g 2/sqrt(pi) exp(-x^2) (torch.erf, ONNX's Erf: the exact GELU's formula)
struct Erf {
  template <class T> ROOTCLAD_HD T f(T x) const { return std::erf(x); }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const {
    return g * T(1.1283791670955126) * std::exp(-x * x);
  }
};

// x^p for a number p (torch.pow(x, p)) =>  dx = g p x^(p-1); 0 for p = 0, as torch's
struct Power {
  double p;
  template <class T> ROOTCLAD_HD T f(T x) const { return std::pow(x, T(p)); }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const {
    return p == 0.0 ? T(0) : g * T(p) * std::pow(x, T(p - 1.0));
  }
};

struct Sqrt {
  template <class T> ROOTCLAD_HD T f(T x) const { return std::sqrt(x); }
  template <class T> ROOTCLAD_HD T grad(T g, T, T y) const { return g / (T(2) * y); }
};

struct Rsqrt {
  template <class T> ROOTCLAD_HD T f(T x) const { return T(1) / std::sqrt(x); }
  template <class T> ROOTCLAD_HD T grad(T g, T, T y) const { return T(-0.5) * g * y * y * y; }
};

// 1 / x  =>  dx = -g y^2 (torch.reciprocal, and a number divided by a tensor)
struct Reciprocal {
  template <class T> ROOTCLAD_HD T f(T x) const { return T(1) / x; }
  template <class T> ROOTCLAD_HD T grad(T g, T, T y) const { return -g * y * y; }
};

struct Sign {
  template <class T> ROOTCLAD_HD T f(T x) const {
    return x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0));
  }
  template <class T> ROOTCLAD_HD T grad(T, T, T) const { return T(0); }
};

// x == c (negate: x != c) as 1 or 0: a mask from token ids (ids == PAD) or from values; no
// gradient, as torch's comparisons give none.
struct Equal {
  double c;
  int negate;
  template <class T> ROOTCLAD_HD T f(T x) const {
    return (x == T(c)) != (negate != 0) ? T(1) : T(0);
  }
  template <class T> ROOTCLAD_HD T grad(T, T, T) const { return T(0); }
};

// x compared with c as a mask of 1s and 0s (op: 0 <, 1 <=, 2 >, 3 >=, as torch.lt, le, gt, ge
// with a number); NaN compares false, as in torch. No gradient.
struct Compare {
  double c;
  int op;
  template <class T> ROOTCLAD_HD T f(T x) const {
    const bool r = op == 0 ? x < T(c) : op == 1 ? x <= T(c) : op == 2 ? x > T(c) : x >= T(c);
    return r ? T(1) : T(0);
  }
  template <class T> ROOTCLAD_HD T grad(T, T, T) const { return T(0); }
};

// ReLU, written "x <= 0 ? 0 : x": a NaN input stays NaN, as in torch (the other form made it 0,
// so a NaN input gave a finite loss while the parameters turned NaN). The gradient passes where
// the output is not <= 0 (0 at 0), as torch's.
struct Relu {
  template <class T> ROOTCLAD_HD T f(T x) const { return x <= T(0) ? T(0) : x; }
  template <class T> ROOTCLAD_HD T grad(T g, T, T y) const { return y <= T(0) ? T(0) : g; }
};

struct LeakyRelu {
  double slope;
  template <class T> ROOTCLAD_HD T f(T x) const { return x > T(0) ? x : T(slope) * x; }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const { return x > T(0) ? g : T(slope) * g; }
};

// y = tanh(x)  =>  dx = g (1 - y^2)
struct Tanh {
  template <class T> ROOTCLAD_HD T f(T x) const { return fast_tanh(x); }
  template <class T> ROOTCLAD_HD T grad(T g, T, T y) const { return g * (T(1) - y * y); }
};

// y = 1 / (1 + exp(-x))  =>  dx = g y (1 - y)
struct Sigmoid {
  template <class T> ROOTCLAD_HD T f(T x) const { return T(1) / (T(1) + fast_exp(-x)); }
  template <class T> ROOTCLAD_HD T grad(T g, T, T y) const { return g * y * (T(1) - y); }
};

// SiLU: x sigmoid(x);  d/dx = s (1 + x (1 - s))
struct Silu {
  template <class T> ROOTCLAD_HD T f(T x) const { return x / (T(1) + fast_exp(-x)); }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const {
    const T s = T(1) / (T(1) + fast_exp(-x));
    return g * s * (T(1) + x * (T(1) - s));
  }
};

// ELU: x > 0 ? x : alpha (exp(x) - 1)
struct Elu {
  double alpha;
  template <class T> ROOTCLAD_HD T f(T x) const {
    return x > T(0) ? x : T(alpha) * (std::exp(x) - T(1));
  }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const {
    return x > T(0) ? g : g * T(alpha) * std::exp(x);
  }
};

// Softplus: log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (as torch).
struct Softplus {
  double beta, threshold;
  template <class T> ROOTCLAD_HD T f(T x) const {
    return T(beta) * x > T(threshold) ? x : std::log1p(std::exp(T(beta) * x)) / T(beta);
  }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const {
    return T(beta) * x > T(threshold) ? g : g / (T(1) + std::exp(-T(beta) * x));
  }
};

// GELU, exact (erf) form unless tanh_form: torch's approximate='none' / 'tanh'.
//   exact:  d/dx [x Phi(x)] = Phi(x) + x phi(x)
//   tanh:   d/dx [x/2 (1 + tanh u)] = (1 + tanh u)/2 + x/2 (1 - tanh^2 u) u',
//           u = sqrt(2/pi)(x + 0.044715 x^3), u' = sqrt(2/pi)(1 + 3*0.044715 x^2)
struct Gelu {
  int tanh_form;
  template <class T> ROOTCLAD_HD T f(T x) const {
    const T inv_sqrt2 = T(0.70710678118654752440);
    const T sqrt_2_over_pi = T(0.79788456080286535588);
    if (tanh_form)
      return T(0.5) * x * (T(1) + std::tanh(sqrt_2_over_pi * (x + T(0.044715) * x * x * x)));
    return T(0.5) * x * (T(1) + std::erf(x * inv_sqrt2));
  }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const {
    const T inv_sqrt2 = T(0.70710678118654752440);
    const T inv_sqrt_2pi = T(0.39894228040143267794);
    const T sqrt_2_over_pi = T(0.79788456080286535588);
    if (tanh_form) {
      const T u = sqrt_2_over_pi * (x + T(0.044715) * x * x * x);
      const T t = std::tanh(u);
      const T du = sqrt_2_over_pi * (T(1) + T(3) * T(0.044715) * x * x);
      return g * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du);
    }
    return g * (T(0.5) * (T(1) + std::erf(x * inv_sqrt2)) +
                x * inv_sqrt_2pi * std::exp(T(-0.5) * x * x));
  }
};

// x * scale + shift with constant numbers (x + 1, 2 * x, x / 4, 1 - x, -x)
struct Affine {
  double scale, shift;
  template <class T> ROOTCLAD_HD T f(T x) const { return T(scale) * x + T(shift); }
  template <class T> ROOTCLAD_HD T grad(T g, T, T) const { return T(scale) * g; }
};

// Hardtanh: x clamped to [lo, hi] (ReLU6: [0, 6]); the gradient passes strictly inside, as
// torch's hardtanh_backward. f takes the bound at the bound itself, so that Clad differentiating
// f (pullbacks=False) gives 0 there too. A NaN input stays NaN.
struct Hardtanh {
  double lo, hi;
  template <class T> ROOTCLAD_HD T f(T x) const {
    return x <= T(lo) ? T(lo) : (x >= T(hi) ? T(hi) : x);
  }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const {
    return x <= T(lo) || x >= T(hi) ? T(0) : g;
  }
};

// Clamp: torch.clamp / clip, the same value as Hardtanh, but the gradient passes on the bounds
// too (lo <= x <= hi), as torch's clamp_backward; f keeps x there for Clad's sake.
struct Clamp {
  double lo, hi;
  template <class T> ROOTCLAD_HD T f(T x) const {
    return x < T(lo) ? T(lo) : (x > T(hi) ? T(hi) : x);
  }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const {
    return x < T(lo) || x > T(hi) ? T(0) : g;
  }
};

// Hardsigmoid: alpha x + beta clamped to [0, 1] (torch's alpha = 1/6, beta = 1/2, the only
// values the registry gives today); the gradient alpha g where the value is strictly inside.
struct Hardsigmoid {
  double alpha, beta;
  template <class T> ROOTCLAD_HD T f(T x) const {
    const T v = T(alpha) * x + T(beta);
    return v <= T(0) ? T(0) : (v >= T(1) ? T(1) : v);
  }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const {
    const T v = T(alpha) * x + T(beta);
    return v <= T(0) || v >= T(1) ? T(0) : T(alpha) * g;
  }
};

// Hardswish: x relu6(x + 3) / 6;  d/dx = x / 3 + 1/2 on (-3, 3), 0 below, 1 above (torch's)
struct Hardswish {
  template <class T> ROOTCLAD_HD T f(T x) const {
    const T r = x + T(3) <= T(0) ? T(0) : (x + T(3) >= T(6) ? T(6) : x + T(3));
    return x * r / T(6);
  }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const {
    return x <= T(-3) ? T(0) : (x < T(3) ? g * (x / T(3) + T(0.5)) : g);
  }
};

// Mish: x tanh(softplus(x));  d/dx = t + x s (1 - t^2), t = tanh(softplus(x)), s = sigmoid(x)
struct Mish {
  template <class T> ROOTCLAD_HD T f(T x) const { return x * std::tanh(std::log1p(std::exp(x))); }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const {
    const T t = std::tanh(std::log1p(std::exp(x)));
    const T s = T(1) / (T(1) + std::exp(-x));
    return g * (t + x * s * (T(1) - t * t));
  }
};

// SELU: scale (x > 0 ? x : alpha (exp(x) - 1)) (torch's alpha and scale; ONNX's Selu with others
// is refused)
struct Selu {
  double alpha, scale;
  template <class T> ROOTCLAD_HD T f(T x) const {
    return x > T(0) ? T(scale) * x : T(scale) * T(alpha) * (std::exp(x) - T(1));
  }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T) const {
    return x > T(0) ? T(scale) * g : g * T(scale) * T(alpha) * std::exp(x);
  }
};

// Elementwise ops with a parameter per channel, a (parametric_forward in kernels.h): f(x, a),
// the input's adjoint grad(g, x, y, a) and the parameter's share param_grad(g, x, y, a).

// PReLU: x > 0 ? x : a x (a: one slope per channel, or one for all)
struct PRelu {
  template <class T> ROOTCLAD_HD T f(T x, T a) const { return x > T(0) ? x : a * x; }
  template <class T> ROOTCLAD_HD T grad(T g, T x, T, T a) const { return x > T(0) ? g : a * g; }
  template <class T> ROOTCLAD_HD T param_grad(T g, T x, T, T) const {
    return x > T(0) ? T(0) : g * x;
  }
};

} // namespace rootclad

// Every functor, for the runtime library's instantiations of the elementwise kernels
// (runtime.cpp); tests/codegen/test_runtime.py checks it against the op registry.
// clang-format off
#define ROOTCLAD_UNARY_FUNCTORS(X)                                                                 \
  X(Abs) X(Equal) X(Relu) X(LeakyRelu) X(Tanh) X(Sigmoid) X(Silu) X(Elu) X(Softplus) X(Gelu)       \
  X(Affine) X(Hardtanh) X(Clamp) X(Hardsigmoid) X(Hardswish) X(Mish) X(Selu) X(Exp) X(Log)       \
  X(Log1p) X(Erf) X(Power) X(Sqrt) X(Rsqrt) X(Reciprocal) X(Sign) X(Compare) X(Sin) X(Cos)     \
  X(Tan) X(Asin) X(Acos) X(Atan) X(Sinh) X(Cosh) X(Asinh) X(Acosh) X(Atanh)
// clang-format on
#define ROOTCLAD_PARAMETRIC_FUNCTORS(X) X(PRelu)

#endif // ROOTCLAD_OPS_ACTIVATIONS_H
