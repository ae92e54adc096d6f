// node_partials on one target: the leaves of each node (leaf-inl.h), then the tree inside the
// node, the merges of a level N at a time on SoA arrays (even/odd children deinterleaved), the
// canon's special cases (poison, identities) selected by masks.
//
// Compiled once per SIMD target: simd_targets.cpp re-includes itself for every target through
// hwy/foreach_target.h, and this file with it (the guard below toggles per target). Never
// compiled with fast-math or FP contraction (-ffp-contract=off).

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/simd/simd_kernels.hpp"

#include "numerics/canon.hpp"

#if defined(DETLOGP_KERNELS_CPU_SIMD_TREE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef DETLOGP_KERNELS_CPU_SIMD_TREE_INL_H_
#undef DETLOGP_KERNELS_CPU_SIMD_TREE_INL_H_
#else
#define DETLOGP_KERNELS_CPU_SIMD_TREE_INL_H_
#endif

#include <hwy/highway.h>
#include "kernels/cpu/simd/exp-inl.h"
#include "kernels/cpu/simd/lanes-inl.h"
#include "kernels/cpu/simd/leaf-inl.h"
#include "kernels/cpu/simd/softcap-inl.h"

HWY_BEFORE_NAMESPACE();
namespace detlogp::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR

// ---------------------------------------------------------------------------------------------
// canon::merge on N pairs at once.

template <bool kEntropy>
HWY_INLINE void MergeVec(VF lm, VF ls, VF lu, VF rm, VF rs, VF ru, VF& om, VF& os, VF& ou) {
  const DF d;
  const VF zero = hn::Zero(d);
  const VF M = hn::IfThenElse(hn::Gt(lm, rm), lm, rm);
  const VF dl = hn::Sub(lm, M);
  const VF dr = hn::Sub(rm, M);
  // dl, dr <= 0 on every lane that keeps the general result.
  const VF el = DetExpNonPositive(dl);
  const VF er = DetExpNonPositive(dr);
  VF m = M;
  VF s = hn::Add(hn::Mul(ls, el), hn::Mul(rs, er));
  VF u = zero;
  if constexpr (kEntropy) {
    u = hn::Add(hn::Mul(el, hn::Add(lu, hn::Mul(dl, ls))),
                hn::Mul(er, hn::Add(ru, hn::Mul(dr, rs))));
  }
  // Special cases, lowest priority first: left identity, right identity, poison.
  const auto left_id = hn::Eq(ls, zero);
  m = hn::IfThenElse(left_id, rm, m);
  s = hn::IfThenElse(left_id, rs, s);
  u = hn::IfThenElse(left_id, ru, u);
  const auto right_id = hn::Eq(rs, zero);
  m = hn::IfThenElse(right_id, lm, m);
  s = hn::IfThenElse(right_id, ls, s);
  u = hn::IfThenElse(right_id, lu, u);
  const auto poison =
      hn::Or(hn::Or(hn::IsNaN(ls), hn::IsNaN(lu)), hn::Or(hn::IsNaN(rs), hn::IsNaN(ru)));
  const VF nan = hn::BitCast(d, hn::Set(DU(), canon::kCanonicalNanBits));
  om = hn::IfThenElse(poison, nan, m);
  os = hn::IfThenElse(poison, nan, s);
  ou = hn::IfThenElse(poison, nan, u);
}

// Partials of consecutive leaves in SoA form; reduced in place level by level.
struct LevelScratch {
  std::vector<float> m, s, u;
  void reserve(size_t n) {
    m.resize(n);
    s.resize(n);
    u.resize(n);
  }
};

// Reduces n >= 1 partials (the leaves of one node, in order) by `levels` tree levels in place;
// the result is at index 0. Partials beyond n are identities.
template <bool kEntropy>
HWY_INLINE canon::Partial ReduceLevels(LevelScratch& sc, int64_t n, int levels) {
  const DF d;
  float* M = sc.m.data();
  float* S = sc.s.data();
  float* U = sc.u.data();
  int done = 0;
  while (n > 1) {
    const int64_t n_out = (n + 1) / 2;
    const int64_t n_out_padded = (n_out + static_cast<int64_t>(kN) - 1) / kN * kN;
    for (int64_t i = n; i < 2 * n_out_padded; ++i) {
      M[i] = -canon::kInf;
      S[i] = 0.0f;
      U[i] = 0.0f;
    }
    for (int64_t i = 0; i < n_out_padded; i += kN) {
      const int64_t a = 2 * i;
      const VF m0 = hn::LoadU(d, M + a), m1 = hn::LoadU(d, M + a + kN);
      const VF s0 = hn::LoadU(d, S + a), s1 = hn::LoadU(d, S + a + kN);
      const VF u0 = hn::LoadU(d, U + a), u1 = hn::LoadU(d, U + a + kN);
      VF om, os, ou;
      MergeVec<kEntropy>(hn::ConcatEven(d, m1, m0), hn::ConcatEven(d, s1, s0),
                         hn::ConcatEven(d, u1, u0), hn::ConcatOdd(d, m1, m0),
                         hn::ConcatOdd(d, s1, s0), hn::ConcatOdd(d, u1, u0), om, os, ou);
      hn::StoreU(om, d, M + i);
      hn::StoreU(os, d, S + i);
      hn::StoreU(ou, d, U + i);
    }
    n = n_out;
    ++done;
  }
  canon::Partial p{M[0], S[0], U[0]};
  // The remaining levels merge with identity subtrees: the canon's merge(p, identity).
  if (done < levels) p = canon::merge<kEntropy>(p, canon::identity_partial());
  return p;
}

// ---------------------------------------------------------------------------------------------
// node_partials for rows [row_begin, row_end).

template <DType kDT, bool kEntropy, bool kScaled>
void NodePartialsRowsT(const NodePartialsJob& job, int64_t row_begin, int64_t row_end) {
  using T = typename Storage<kDT>::T;
  const int64_t W = job.geometry.tile_width;
  const int64_t R = job.geometry.real_vocab;
  const int64_t real_tiles = job.geometry.num_real_tiles();
  int64_t max_leaves = 0;
  for (int64_t j = 0; j < job.num_nodes; ++j) {
    const TreeNode& node = job.nodes[j];
    const int64_t n = std::min(node.end_tile(), real_tiles) - node.first_tile();
    max_leaves = std::max(max_leaves, n);
  }
  LevelScratch level;
  level.reserve(static_cast<size_t>(max_leaves + 2 * static_cast<int64_t>(kN)));
  LeafScratch leaf;
  // With a softcap, the leaf's first pass writes each tile's z (capped, tempered) here, whole
  // lane groups, and its second pass reads them back: the canon's leaf of the canon's z.
  const bool capped = job.softcap != 0.0f;
  std::vector<float> capped_z(capped ? static_cast<size_t>(W + canon::kLanes) : 0);
  const T* base = static_cast<const T*>(job.data);
  for (int64_t row = row_begin; row < row_end; ++row) {
    for (int64_t j = 0; j < job.num_nodes; ++j) {
      const TreeNode& node = job.nodes[j];
      const int64_t first = node.first_tile();
      const int64_t n = std::min(node.end_tile(), real_tiles) - first;
      canon::Partial p = canon::identity_partial();
      if (n > 0) {  // (a node of padding tiles only may come with an empty shard: no data)
        const T* row_ptr = base + row * job.row_stride;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t col = (first + i) * W;
          const int64_t count = std::min(W, R - col);
          canon::Partial leaf_p;
          if (capped) {
            leaf_p = CappedLeafTile<kDT, kEntropy, kScaled>(row_ptr + (col - job.vocab_start),
                                                            count, job.softcap, job.temperature,
                                                            capped_z.data());
          } else {
            leaf_p = LeafTile<kDT, kEntropy, kScaled>(row_ptr + (col - job.vocab_start), count,
                                                      job.temperature, leaf);
          }
          level.m[static_cast<size_t>(i)] = leaf_p.m;
          level.s[static_cast<size_t>(i)] = leaf_p.s;
          level.u[static_cast<size_t>(i)] = leaf_p.u;
        }
        p = ReduceLevels<kEntropy>(level, n, node.level);
      }
      job.out[row * job.num_nodes + j] = p;
    }
  }
}

void NodePartialsRows(const NodePartialsJob& job, int64_t row_begin, int64_t row_end) {
  WithStaticFlags(job.dtype, job.with_entropy, job.temperature != 1.0f,
                  [&]<DType kDT, bool kEntropy, bool kScaled>() {
                    NodePartialsRowsT<kDT, kEntropy, kScaled>(job, row_begin, row_end);
                  });
}

#endif  // HWY_TARGET != HWY_SCALAR

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace detlogp::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
