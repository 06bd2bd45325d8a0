// What attention needs from both compiled modules, shared by them: the batch dimensions of a
// strided matrix product and the checks of the masked softmax kernels.
//
// matmul_strided's batch: `batch` is one int or a tuple of batch dimensions, and each operand
// has one stride per batch dimension, then its row and column strides. Per-head attention
// operands, e.g. (B, H, T, D) viewed from (B, T, H, D), have two batch dimensions that no single
// stride walks; the engines read them in place as a two-level batch.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/ndarray_checks.h"

namespace needle::batch {

using idx_t = int64_t;

// One batch dimension: its extent and each operand's stride along it.
struct Dim {
  idx_t size, a, b;
};

// A group of batch items the engines run in one call: items k < outer * inner of it start at
// a + (k / inner) * outer_a + (k % inner) * inner_a in A (likewise B), and the group's results
// are items first, first + 1, ... of the compact output.
struct Group {
  idx_t a, b, first;
  Dim outer, inner;
};

// Checks the batch dimensions (non-negative) and that each operand has one stride per batch
// dimension, then row and column (ValueError otherwise).
inline void check(const char* fn, const std::vector<idx_t>& batch,
                  const std::vector<idx_t>& a_strides, const std::vector<idx_t>& b_strides) {
  for (idx_t s : batch) needle::checks::check_sizes(fn, {s});
  for (const auto& [what, strides] : {std::pair{"a", &a_strides}, std::pair{"b", &b_strides}})
    if (strides->size() != batch.size() + 2)
      needle::checks::fail(fn, std::string(what) + "_strides must hold " +
                                   std::to_string(batch.size() + 2) +
                                   " strides (one per batch dimension, then row and column), "
                                   "got " +
                                   needle::checks::tuple_str(*strides));
}

// The batch dimensions with extent-1 ones dropped and neighbours merged where both operands
// walk them as one (outer stride = inner stride * inner extent); at least one dimension. The
// caller has checked both views, so no product here overflows.
inline std::vector<Dim> collapse(const std::vector<idx_t>& shape, const std::vector<idx_t>& as,
                                 const std::vector<idx_t>& bs) {
  std::vector<Dim> dims;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    const Dim d{shape[i], as[i], bs[i]};
    if (!dims.empty() && dims.back().a == d.a * d.size && dims.back().b == d.b * d.size) {
      dims.back() = Dim{dims.back().size * d.size, d.a, d.b};
      continue;
    }
    dims.push_back(d);
  }
  if (dims.empty()) dims.push_back(Dim{1, 0, 0});
  return dims;
}

// Calls run(group) for each two-level group of the collapsed batch `dims`: the last two
// dimensions form the group, any before them are looped over (one group in the common cases:
// one batch dimension, or the two of per-head attention).
template <class F>
void for_each_group(const std::vector<Dim>& dims, F run) {
  const size_t nd = dims.size();
  const Dim inner = dims[nd - 1];
  const Dim outer = nd >= 2 ? dims[nd - 2] : Dim{1, 0, 0};
  const size_t lead = nd >= 2 ? nd - 2 : 0;
  idx_t count = 1;
  for (size_t i = 0; i < lead; ++i) count *= dims[i].size;
  for (idx_t k = 0; k < count; ++k) {
    idx_t rest = k, a = 0, b = 0;
    for (size_t i = lead; i-- > 0;) {
      const idx_t at = rest % dims[i].size;
      rest /= dims[i].size;
      a += at * dims[i].a;
      b += at * dims[i].b;
    }
    run(Group{a, b, k * outer.size * inner.size, outer, inner});
  }
}

}  // namespace needle::batch

namespace needle::checks {

// softmax_fwd: x, y (rows, cols); queries >= 0 (0: no mask), and a causal mask needs whole
// blocks of `queries` rows.
template <class A>
void check_softmax_fwd(const char* fn, const A& x, idx_t rows, idx_t cols, idx_t queries,
                       const A& y) {
  const idx_t n = shape_size(fn, {rows, cols});
  if (queries < 0) fail(fn, "queries must be >= 0 (0: no mask), got " + std::to_string(queries));
  if (queries > 0 && rows % queries)
    fail(fn, "rows=" + std::to_string(rows) + " is not a whole number of blocks of queries=" +
                 std::to_string(queries));
  check_size(fn, "x", x.size, n);
  check_size(fn, "y", y.size, n);
}

// softmax_bwd: y, dy, dx (rows, cols).
template <class A>
void check_softmax_bwd(const char* fn, const A& y, const A& dy, idx_t rows, idx_t cols,
                       const A& dx) {
  const idx_t n = shape_size(fn, {rows, cols});
  check_size(fn, "y", y.size, n);
  check_size(fn, "dy", dy.size, n);
  check_size(fn, "dx", dx.size, n);
}

// attention_fwd / attention_bwd: q (heads, queries, dim), k and v (heads, keys, dim), out and
// the adjoints of q, k, v shaped as their operands, probs (heads, queries, keys); causal is 0 or
// 1.
struct AttentionSizes {
  idx_t q, kv, probs;
};

inline AttentionSizes attention_sizes(const char* fn, idx_t heads, idx_t queries, idx_t dim,
                                      idx_t keys, idx_t causal) {
  if (causal != 0 && causal != 1) fail(fn, "causal must be 0 or 1, got " + std::to_string(causal));
  return {shape_size(fn, {heads, queries, dim}), shape_size(fn, {heads, keys, dim}),
          shape_size(fn, {heads, queries, keys})};
}

template <class A>
void check_attention_fwd(const char* fn, const A& q, const A& k, const A& v, idx_t heads,
                         idx_t queries, idx_t dim, idx_t keys, idx_t causal, const A& out,
                         const A& probs) {
  const AttentionSizes n = attention_sizes(fn, heads, queries, dim, keys, causal);
  check_size(fn, "q", q.size, n.q);
  check_size(fn, "k", k.size, n.kv);
  check_size(fn, "v", v.size, n.kv);
  check_size(fn, "out", out.size, n.q);
  check_size(fn, "probs", probs.size, n.probs);
}

template <class A>
void check_attention_bwd(const char* fn, const A& d_out, const A& d_probs, const A& probs,
                         const A& q, const A& k, const A& v, idx_t heads, idx_t queries,
                         idx_t dim, idx_t keys, const A& dq, const A& dk, const A& dv) {
  const AttentionSizes n = attention_sizes(fn, heads, queries, dim, keys, 0);
  check_size(fn, "d_out", d_out.size, n.q);
  check_size(fn, "d_probs", d_probs.size, n.probs);
  check_size(fn, "probs", probs.size, n.probs);
  check_size(fn, "q", q.size, n.q);
  check_size(fn, "k", k.size, n.kv);
  check_size(fn, "v", v.size, n.kv);
  check_size(fn, "dq", dq.size, n.q);
  check_size(fn, "dk", dk.size, n.kv);
  check_size(fn, "dv", dv.size, n.kv);
}

// The keys row r of a masked softmax may attend to: all `cols` without a mask; with a causal
// mask over blocks of `queries` rows, query i = r % queries sees keys j <= i + cols - queries
// (0 when it sees none: such a row is uniform, as the course's finite mask makes it).
#ifdef __CUDACC__
__host__ __device__
#endif
inline idx_t softmax_visible(idx_t r, idx_t cols, idx_t queries) {
  if (queries == 0) return cols;
  const idx_t last = r % queries + cols - queries;
  return last < 0 ? 0 : (last + 1 < cols ? last + 1 : cols);
}

}  // namespace needle::checks
