// The element-wise op table shared by needle's compiled device modules (C++ CPU and CUDA).
//
// Each X-macro lists the ops in protocol order: the position of an op in its list is the op
// code that `ewise_binary`, `ewise_scalar`, `ewise_unary` and `reduce` take, and the modules
// export the names in the same order (`__binary_ops__`, `__unary_ops__`, `__reduce_ops__`) so
// Python maps names to codes. Adding an element-wise op is one line here (and one line in the
// numpy reference module, needle/backend_ndarray/ndarray_backend_numpy.py).
//
// Every expression is a plain float expression in `a` (and `b`), usable in host and device
// code; NEEDLE_HD marks the functors __host__ __device__ under nvcc. Semantics follow numpy's
// float32 (IEEE): comparisons with NaN are false (`ne` is true), maximum/minimum propagate NaN.
#pragma once

#include <cmath>

#ifdef __CUDACC__
#define NEEDLE_HD __host__ __device__ __forceinline__
#else
#define NEEDLE_HD inline
#endif

namespace needle::ops {

// X(name, expression in float a, b)
#define NEEDLE_BINARY_OPS(X)                                          \
  X(add, a + b)                                                       \
  X(sub, a - b)                                                       \
  X(mul, a * b)                                                       \
  X(div, a / b)                                                       \
  X(power, powf(a, b))                                                \
  X(maximum, (a != a || b != b) ? (a + b) : (a > b ? a : b))          \
  X(minimum, (a != a || b != b) ? (a + b) : (a < b ? a : b))          \
  X(eq, a == b ? 1.0f : 0.0f)                                         \
  X(ne, a != b ? 1.0f : 0.0f)                                         \
  X(lt, a < b ? 1.0f : 0.0f)                                          \
  X(le, a <= b ? 1.0f : 0.0f)                                         \
  X(gt, a > b ? 1.0f : 0.0f)                                          \
  X(ge, a >= b ? 1.0f : 0.0f)

// X(name, expression in float a)
#define NEEDLE_UNARY_OPS(X)                                           \
  X(neg, -a)                                                          \
  X(abs, fabsf(a))                                                    \
  X(sqrt, sqrtf(a))                                                   \
  X(exp, expf(a))                                                     \
  X(log, logf(a))                                                     \
  X(tanh, tanhf(a))                                                   \
  X(sigmoid, 1.0f / (1.0f + expf(-a)))                                \
  X(relu, a > 0.0f ? a : (a != a ? a : 0.0f))

// X(name, identity, combine(acc, a)); max's identity is unused (an empty max is an error).
#define NEEDLE_REDUCE_OPS(X)                                          \
  X(sum, 0.0f, acc + a)                                               \
  X(max, -INFINITY, (acc != acc || a != a) ? (acc + a) : (a > acc ? a : acc))

// Op codes: BinaryOp::add == 0, ...
#define NEEDLE_ENUM_ENTRY(name, ...) name,
enum class BinaryOp : int { NEEDLE_BINARY_OPS(NEEDLE_ENUM_ENTRY) count };
enum class UnaryOp : int { NEEDLE_UNARY_OPS(NEEDLE_ENUM_ENTRY) count };
enum class ReduceOp : int { NEEDLE_REDUCE_OPS(NEEDLE_ENUM_ENTRY) count };
#undef NEEDLE_ENUM_ENTRY

// Functors, one per op: Binary_add{}(a, b), Unary_exp{}(a), Reduce_sum::combine(acc, a).
#define NEEDLE_BINARY_FUNCTOR(name, expr) \
  struct Binary_##name {                  \
    NEEDLE_HD float operator()(float a, float b) const { return (expr); } \
  };
#define NEEDLE_UNARY_FUNCTOR(name, expr) \
  struct Unary_##name {                  \
    NEEDLE_HD float operator()(float a) const { return (expr); } \
  };
#define NEEDLE_REDUCE_FUNCTOR(name, ident, expr)                        \
  struct Reduce_##name {                                                \
    NEEDLE_HD static float identity() { return (ident); }               \
    NEEDLE_HD float operator()(float acc, float a) const { return (expr); } \
  };
NEEDLE_BINARY_OPS(NEEDLE_BINARY_FUNCTOR)
NEEDLE_UNARY_OPS(NEEDLE_UNARY_FUNCTOR)
NEEDLE_REDUCE_OPS(NEEDLE_REDUCE_FUNCTOR)
#undef NEEDLE_BINARY_FUNCTOR
#undef NEEDLE_UNARY_FUNCTOR
#undef NEEDLE_REDUCE_FUNCTOR

// The op names in code order, for the modules' __binary_ops__ / __unary_ops__ / __reduce_ops__.
#define NEEDLE_NAME_ENTRY(name, ...) #name,
constexpr const char* kBinaryOpNames[] = {NEEDLE_BINARY_OPS(NEEDLE_NAME_ENTRY)};
constexpr const char* kUnaryOpNames[] = {NEEDLE_UNARY_OPS(NEEDLE_NAME_ENTRY)};
constexpr const char* kReduceOpNames[] = {NEEDLE_REDUCE_OPS(NEEDLE_NAME_ENTRY)};
#undef NEEDLE_NAME_ENTRY

}  // namespace needle::ops
