// Argument checks shared by the bindings of needle's compiled device modules (C++ CPU and
// CUDA). Kernels trust their arguments; every binding calls these first.
//
// Error policy (the same in every layer of needle): a wrong value — a view that leaves its
// buffer, sizes that disagree, an unknown op code — throws std::invalid_argument, which
// pybind11 raises as ValueError; the message names the function and the numbers involved.
// (TypeError is for a wrong kind of value and pybind11 raises it itself for wrong argument
// types; IndexError is for subscripts only and is raised by NDArray.__getitem__ in Python.)
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace needle_checks {

using idx_t = int64_t;
// Largest element count any buffer or view may have (keeps every index product in int64).
constexpr idx_t kMaxElements = idx_t(1) << 50;

inline std::string tuple_str(const std::vector<idx_t>& v) {
  std::ostringstream s;
  s << "(";
  for (size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
  if (v.size() == 1) s << ",";
  s << ")";
  return s.str();
}

[[noreturn]] inline void fail(const std::string& fn, const std::string& msg) {
  throw std::invalid_argument(fn + ": " + msg);
}

// Number of elements of `shape`; throws for a negative dimension or more than kMaxElements.
inline idx_t shape_size(const std::string& fn, const std::vector<idx_t>& shape) {
  __int128 size = 1;
  for (idx_t d : shape) {
    if (d < 0) fail(fn, "negative dimension in shape " + tuple_str(shape));
    size *= d;
    if (size > kMaxElements) fail(fn, "shape " + tuple_str(shape) + " has too many elements");
  }
  return idx_t(size);
}

// Checks that the strided view (shape, strides, offset) lies inside a buffer of `buf_size`
// elements (strides may be zero or negative) and returns its number of elements.
inline idx_t check_view(const std::string& fn, const std::vector<idx_t>& shape,
                        const std::vector<idx_t>& strides, idx_t offset, idx_t buf_size) {
  if (shape.size() != strides.size())
    fail(fn, "shape " + tuple_str(shape) + " and strides " + tuple_str(strides) +
                 " differ in length");
  idx_t size = shape_size(fn, shape);
  if (size == 0) return 0;
  __int128 lo = offset, hi = offset;
  for (size_t d = 0; d < shape.size(); ++d) {
    __int128 ext = __int128(shape[d] - 1) * strides[d];
    (ext < 0 ? lo : hi) += ext;
  }
  if (lo < 0 || hi >= buf_size) {
    std::ostringstream s;
    s << "view with shape " << tuple_str(shape) << ", strides " << tuple_str(strides)
      << " and offset " << offset << " reaches elements [" << int64_t(lo) << ", " << int64_t(hi)
      << "], outside the buffer of " << buf_size << " elements";
    fail(fn, s.str());
  }
  return size;
}

// Checks that a buffer named `what` holds exactly `expected` elements.
inline void check_size(const std::string& fn, const char* what, idx_t got, idx_t expected) {
  if (got != expected) {
    std::ostringstream s;
    s << what << " has " << got << " elements, expected " << expected;
    fail(fn, s.str());
  }
}

// Checks that a buffer named `what` holds at least `needed` elements.
inline void check_at_least(const std::string& fn, const char* what, idx_t got, idx_t needed) {
  if (got < needed) {
    std::ostringstream s;
    s << what << " has " << got << " elements, needs at least " << needed;
    fail(fn, s.str());
  }
}

// Checks an op code against the size of its table.
inline void check_op(const std::string& fn, int op, int count) {
  if (op < 0 || op >= count)
    fail(fn, "unknown op code " + std::to_string(op) + " (valid: 0.." + std::to_string(count - 1) +
                 ")");
}

// Checks that every size is non-negative (m, n, p of a matmul, rows/cols of a fused kernel).
inline void check_sizes(const std::string& fn, std::initializer_list<idx_t> sizes) {
  for (idx_t s : sizes)
    if (s < 0) fail(fn, "negative size " + std::to_string(s));
}

}  // namespace needle_checks
