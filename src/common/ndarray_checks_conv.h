// Argument checks of the convolution kernels (conv_fwd, conv_input_grad, conv_weight_grad),
// shared by the compiled CPU and CUDA modules; the numpy twin is fused_spec.py's conv checks.
//
// Every kernel takes the same geometry: an NHWC input (n, h, w, c_in), a (kh, kw, c_in, c_out)
// weight, a stride >= 1 and a zero padding >= 0, giving an output (n, h_out, w_out, c_out) with
// h_out = (h + 2·padding - kh) / stride + 1 (likewise w_out). A bad value throws
// std::invalid_argument (ValueError in Python) naming the function and the numbers.
#pragma once

#include <string>

#include "common/ndarray_checks.h"

namespace needle::checks {

// The sizes of one convolution, checked; rows() x depth() is its im2col matrix.
struct ConvGeometry {
  idx_t n, h, w, cin, kh, kw, cout, stride, padding, ho, wo;
  idx_t rows() const { return n * ho * wo; }
  idx_t depth() const { return kh * kw * cin; }
  idx_t in_size() const { return n * h * w * cin; }
  idx_t weight_size() const { return kh * kw * cin * cout; }
  idx_t out_size() const { return n * ho * wo * cout; }
};

inline ConvGeometry conv_geometry(const char* fn, idx_t n, idx_t h, idx_t w, idx_t cin, idx_t kh,
                                  idx_t kw, idx_t cout, idx_t stride, idx_t padding) {
  check_sizes(fn, {n, h, w, cin, kh, kw, cout});
  if (stride < 1) fail(fn, "stride must be >= 1, got " + std::to_string(stride));
  if (padding < 0) fail(fn, "padding must be >= 0, got " + std::to_string(padding));
  if (kh < 1 || kw < 1)
    fail(fn, "the kernel must be at least 1x1, got " + std::to_string(kh) + "x" +
                 std::to_string(kw));
  // every size below kMaxElements, so h + 2·padding cannot overflow
  if (padding > kMaxElements || h > kMaxElements || w > kMaxElements)
    fail(fn, "padding " + std::to_string(padding) + " or input size is too large");
  const idx_t hp = h + 2 * padding, wp = w + 2 * padding;
  if (hp < kh || wp < kw)
    fail(fn, "kernel " + std::to_string(kh) + "x" + std::to_string(kw) +
                 " is larger than the padded input " + std::to_string(hp) + "x" +
                 std::to_string(wp));
  ConvGeometry g{n, h, w, cin, kh, kw, cout, stride, padding, (hp - kh) / stride + 1,
                 (wp - kw) / stride + 1};
  // each array (and the im2col matrix) must fit kMaxElements: the index products stay in int64
  shape_size(fn, {n, h, w, cin});
  shape_size(fn, {kh, kw, cin, cout});
  shape_size(fn, {n, g.ho, g.wo, cout});
  shape_size(fn, {n, g.ho, g.wo, kh, kw, cin});
  return g;
}

// conv_fwd(x, weight, ..., out) and conv_weight_grad(x, grad, ..., out)
template <class A>
ConvGeometry check_conv_fwd(const char* fn, const A& x, const A& weight, idx_t n, idx_t h,
                            idx_t w, idx_t cin, idx_t kh, idx_t kw, idx_t cout, idx_t stride,
                            idx_t padding, const A& out) {
  const ConvGeometry g = conv_geometry(fn, n, h, w, cin, kh, kw, cout, stride, padding);
  check_size(fn, "x", x.size, g.in_size());
  check_size(fn, "weight", weight.size, g.weight_size());
  check_size(fn, "out", out.size, g.out_size());
  return g;
}

template <class A>
ConvGeometry check_conv_weight_grad(const char* fn, const A& x, const A& grad, idx_t n, idx_t h,
                                    idx_t w, idx_t cin, idx_t kh, idx_t kw, idx_t cout,
                                    idx_t stride, idx_t padding, const A& out) {
  const ConvGeometry g = conv_geometry(fn, n, h, w, cin, kh, kw, cout, stride, padding);
  check_size(fn, "x", x.size, g.in_size());
  check_size(fn, "grad", grad.size, g.out_size());
  check_size(fn, "out", out.size, g.weight_size());
  return g;
}

// conv_input_grad(grad, weight, kh, kw, c_in, c_out, n, h, w, stride, padding, out): the sizes
// in the order the weight gives them, then the input's (which the output adjoint cannot give).
template <class A>
ConvGeometry check_conv_input_grad(const char* fn, const A& grad, const A& weight, idx_t kh,
                                   idx_t kw, idx_t cin, idx_t cout, idx_t n, idx_t h, idx_t w,
                                   idx_t stride, idx_t padding, const A& out) {
  const ConvGeometry g = conv_geometry(fn, n, h, w, cin, kh, kw, cout, stride, padding);
  check_size(fn, "grad", grad.size, g.out_size());
  check_size(fn, "weight", weight.size, g.weight_size());
  check_size(fn, "out", out.size, g.in_size());
  return g;
}

}  // namespace needle::checks
