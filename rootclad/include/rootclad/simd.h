// rootclad/simd.h — short vectors for the hand-blocked kernels (conv1d_s1.h).
//
// GCC/Clang vector extensions: one source compiles to AVX-512, AVX2 or SSE/NEON code,
// whatever -march allows, with no intrinsics. A vector is as wide as the widest registers
// (64 bytes with AVX-512), and the kernels size their register blocks by REGS.
#ifndef ROOTCLAD_SIMD_H
#define ROOTCLAD_SIMD_H

#include <cstring>

#if defined(__AVX512F__)
#define ROOTCLAD_VEC_BYTES 64
#define ROOTCLAD_VEC_REGS 32
#elif defined(__AVX__)
#define ROOTCLAD_VEC_BYTES 32
#define ROOTCLAD_VEC_REGS 16
#else
#define ROOTCLAD_VEC_BYTES 16
#define ROOTCLAD_VEC_REGS 16
#endif

#if defined(__GNUC__) || defined(__clang__)
#define ROOTCLAD_UNROLL _Pragma("GCC unroll 16")
#else
#define ROOTCLAD_UNROLL
#endif

namespace rootclad {
namespace simd {

template <typename T> struct vec;
template <> struct vec<float> {
  typedef float type __attribute__((vector_size(ROOTCLAD_VEC_BYTES)));
};
template <> struct vec<double> {
  typedef double type __attribute__((vector_size(ROOTCLAD_VEC_BYTES)));
};
template <typename T> using V = typename vec<T>::type;
// Same-size integer vectors, for masks.
template <typename T> struct ivec;
template <> struct ivec<float> {
  typedef int type __attribute__((vector_size(ROOTCLAD_VEC_BYTES)));
};
template <> struct ivec<double> {
  typedef long long type __attribute__((vector_size(ROOTCLAD_VEC_BYTES)));
};

// Elements per vector.
template <typename T> constexpr int lanes() {
  return ROOTCLAD_VEC_BYTES / (int)sizeof(T);
}

template <typename T> inline V<T> load(const T* p) {
  V<T> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename T> inline void store(T* p, const V<T>& v) {
  std::memcpy(p, &v, sizeof v);
}
template <typename T> inline V<T> splat(T x) {
  return V<T>{} + x;
}
// v with lanes [0, skip) set to exactly zero (bitwise, so a NaN or inf there goes too).
template <typename T> inline V<T> zero_head(const V<T>& v, int skip) {
  typedef typename ivec<T>::type VI;
  constexpr int N = lanes<T>();
  VI idx;
  for (int i = 0; i < N; ++i)
    idx[i] = i;
  const VI keep = idx >= (VI{} + skip); // all ones where kept
  return (V<T>)((VI)v & keep);
}

// Keeps v in a register: stops the compiler from folding the load of a vector that is used
// several times into each of its uses (which multiplies the loads a loop issues).
template <typename T> inline void in_register(V<T>& v) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  asm("" : "+v"(v));
#else
  (void)v;
#endif
}
// The sum of v's lanes: halves added until 16 bytes are left (vextract + add, rather
// than one extract per lane).
template <typename T, int BYTES> struct halves {
  typedef T H __attribute__((vector_size(BYTES / 2)));
  template <typename W> static T sum(const W& v) {
    H lo, hi;
    std::memcpy(&lo, &v, sizeof lo);
    std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
    return halves<T, BYTES / 2>::sum(lo + hi);
  }
};
template <typename T> struct halves<T, 16> {
  template <typename W> static T sum(const W& v) {
    T s = 0;
    for (int i = 0; i < 16 / (int)sizeof(T); ++i)
      s += v[i];
    return s;
  }
};
template <typename T> inline T hsum(const V<T>& v) {
  return halves<T, ROOTCLAD_VEC_BYTES>::sum(v);
}

} // namespace simd
} // namespace rootclad

#endif // ROOTCLAD_SIMD_H
