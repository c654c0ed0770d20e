// The per-query part of improved clustered attention, fused (see clustering.cpp).
//
// For query n of cluster a, over the valid top keys T of a (index < length):
//
//   out[n] = rest[a] + mass[a] * softmax_t(scale q_n . k_T[t]) V_T
//   mass[a] = sum_t top_w[a, t]      rest[a] = values[a] - sum_t top_w[a, t] v_T[t]
//
// (reference.improved_sparse). Each (batch, head) walks its queries cluster by cluster
// (a counting sort of the assignments, no argsort): the cluster's top keys and values
// are gathered once into small zero-padded tiles, and each member query is two small
// dense products against them, with its K scores kept in registers. The common sizes
// (E = Ev = 32 or 64, K <= 32 or 64, float32) are compiled with fixed sizes so the
// loops unroll; other sizes and float64 run the same code with run-time sizes.

#include <torch/library.h>

#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#include "common.h"

namespace fastasr_cpu {
namespace {

// Queries of one (batch, head) grouped by cluster: members of cluster c are
// order[start[c] : start[c + 1]] (valid queries only, in increasing position).
struct ClusterMembers {
  std::vector<int64_t> start, order, fill;
  void build(const int64_t* assign, int64_t L, int64_t C) {
    start.assign(C + 1, 0);
    order.resize(L);
    for (int64_t n = 0; n < L; ++n) start[assign[n] + 1] += 1;
    for (int64_t c = 0; c < C; ++c) start[c + 1] += start[c];
    fill.assign(start.begin(), start.end() - 1);
    for (int64_t n = 0; n < L; ++n) order[fill[assign[n]]++] = n;
  }
};

// Sizes of one call; the fixed ones (template arguments) override these when non-zero.
struct Sizes {
  int64_t B, H, N, E, Ev, C, K;
};

// Largest E, Ev and K the kernels take (per-query scratch lives on the stack).
constexpr int64_t kMaxDim = 256;
// Queries of a cluster processed together: their products are independent chains of
// FMAs (not one chain waiting on the last), and each tile row is loaded once for all.
constexpr int64_t kGroup = 4;

// One cluster's valid top keys (index < L): slot (position in the top list), row (key
// position) and centroid weight of each, and one zero-padded transposed tile of KB >=
// K slots: the keys (E x KB) for the forward scores, the values (Ev x KB) for the
// backward's. Key and value rows themselves are read in place (k + row * E).
template <typename T>
struct Tiles {
  int64_t nt = 0;
  std::vector<int64_t> slot, row;
  std::vector<T> w, t;
  Tiles(int64_t KB, int64_t D) : slot(KB), row(KB), w(KB), t(D * KB) {}
};

// Fills the tiles of one cluster; m (rows of D features) is transposed into the tile.
template <typename T, int FD, int FK>
void load_tiles(Tiles<T>& t, const int64_t* idx, const T* top_w, int64_t K, int64_t L,
                const T* m, int64_t D_) {
  const int64_t D = FD ? FD : D_, KB = FK ? FK : K;
  int64_t nt = 0;
  for (int64_t s = 0; s < K; ++s) {
    if (idx[s] < 0 || idx[s] >= L) continue;
    t.slot[nt] = s;
    t.row[nt] = idx[s];
    t.w[nt] = top_w[s];
    ++nt;
  }
  t.nt = nt;
  T* __restrict__ tile = t.t.data();
  for (int64_t j = 0; j < nt; ++j) {
    const T* __restrict__ r = m + t.row[j] * D;
    for (int64_t e = 0; e < D; ++e) tile[e * KB + j] = r[e];
  }
  for (int64_t j = nt; j < KB; ++j)  // padding slots: zero
    for (int64_t e = 0; e < D; ++e) tile[e * KB + j] = 0;
}

// Prefetches (into L1) the rows the next non-empty cluster after `cl` will read: its top
// keys' rows of each matrix in `ms` (D features each) and its members' rows of `mq`. A
// cluster reads rows scattered over the sequence, which the hardware cannot predict;
// fetching them while the current cluster computes hides that latency.
template <typename T>
void prefetch_next_cluster(const ClusterMembers& members, int64_t cl, int64_t C,
                           const int64_t* idx_bh, int64_t K, int64_t L,
                           std::initializer_list<std::pair<const T*, int64_t>> ms,
                           std::initializer_list<std::pair<const T*, int64_t>> mq) {
  int64_t nx = cl + 1;
  while (nx < C && members.start[nx] == members.start[nx + 1]) ++nx;
  if (nx >= C) return;
  const int64_t* idx = idx_bh + nx * K;
  for (int64_t t = 0; t < K; ++t) {
    if (idx[t] < 0 || idx[t] >= L) continue;
    for (const auto& [m, D] : ms) prefetch_range(m + idx[t] * D, D, 3);
  }
  for (int64_t i = members.start[nx]; i < members.start[nx + 1]; ++i)
    for (const auto& [m, D] : mq) prefetch_range(m + members.order[i] * D, D, 3);
}

struct ForwardPtrs {
  const void *q, *k, *v, *values, *top_w;
  const int64_t *idx, *assign, *lens;
  void *out, *p;
};

// Forward of one (batch, head). FE, FEV, FK: fixed E, Ev and slot count KB (0: run
// time); the per-query scores and outputs are local arrays the compiler can keep in
// registers when the sizes are fixed.
template <typename T, int FE, int FEV, int FK>
void forward_bh(const ForwardPtrs& a, const Sizes& z, int64_t bh, T sc, ClusterMembers& members,
                Tiles<T>& tiles) {
  const int64_t E = FE ? FE : z.E, Ev = FEV ? FEV : z.Ev, KB = FK ? FK : z.K;
  const int64_t N = z.N, C = z.C, K = z.K;
  const T* q = static_cast<const T*>(a.q) + bh * N * E;
  const T* k = static_cast<const T*>(a.k) + bh * N * E;
  const T* v = static_cast<const T*>(a.v) + bh * N * Ev;
  T* out = static_cast<T*>(a.out) + bh * N * Ev;
  T* p = static_cast<T*>(a.p) + bh * N * K;
  const int64_t L = length_of(a.lens, bh / z.H, N);
  // Sequential sweeps first: the zeroing also brings the outputs into the cache.
  std::fill(out, out + N * Ev, T(0));
  std::fill(p, p + N * K, T(0));
  if (L == 0) return;
  prefetch_range(q, L * E);
  prefetch_range(k, L * E);
  prefetch_range(v, L * Ev);
  members.build(a.assign + bh * N, L, C);
  T rest[FEV ? FEV : kMaxDim], s[kGroup][FK ? FK : kMaxDim], acc[kGroup][FEV ? FEV : kMaxDim];
  for (int64_t cl = 0; cl < C; ++cl) {
    const int64_t m0 = members.start[cl], m1 = members.start[cl + 1];
    if (m0 == m1) continue;
    const int64_t off = (bh * C + cl) * K;
    prefetch_next_cluster<T>(members, cl, C, a.idx + bh * C * K, K, L, {{k, E}, {v, Ev}}, {{q, E}});
    load_tiles<T, FE, FK>(tiles, a.idx + off, static_cast<const T*>(a.top_w) + off, K, L, k, E);
    const int64_t nt = tiles.nt;  // >= 1: a valid sequence's top keys include a valid one
    const T* __restrict__ keys_t = tiles.t.data();
    const T* val_c = static_cast<const T*>(a.values) + (bh * C + cl) * Ev;
    T mass = 0;
    for (int64_t e = 0; e < Ev; ++e) rest[e] = val_c[e];
    for (int64_t j = 0; j < nt; ++j) {
      const T wj = tiles.w[j];
      const T* __restrict__ vr = v + tiles.row[j] * Ev;
      mass += wj;
      for (int64_t e = 0; e < Ev; ++e) rest[e] -= wj * vr[e];
    }
    for (int64_t m = m0; m < m1; m += kGroup) {
      const int64_t count = std::min(kGroup, m1 - m);  // the tail repeats its last member
      const T* qg[kGroup];
      for (int64_t u = 0; u < kGroup; ++u) qg[u] = q + members.order[m + std::min(u, count - 1)] * E;
      for (int64_t u = 0; u < kGroup; ++u)
        for (int64_t j = 0; j < KB; ++j) s[u][j] = 0;
      for (int64_t e = 0; e < E; ++e) {
        const T* __restrict__ r = keys_t + e * KB;
        for (int64_t u = 0; u < kGroup; ++u) {
          const T qe = qg[u][e] * sc;
          for (int64_t j = 0; j < KB; ++j) s[u][j] += qe * r[j];
        }
      }
      for (int64_t u = 0; u < kGroup; ++u) {
        for (int64_t j = nt; j < KB; ++j) s[u][j] = -std::numeric_limits<T>::infinity();
        softmax_inplace(s[u], KB);
        for (int64_t e = 0; e < Ev; ++e) acc[u][e] = rest[e];
      }
      for (int64_t j = 0; j < nt; ++j) {
        const T* __restrict__ vr = v + tiles.row[j] * Ev;
        for (int64_t u = 0; u < kGroup; ++u) {
          const T pj = mass * s[u][j];
          for (int64_t e = 0; e < Ev; ++e) acc[u][e] += pj * vr[e];
        }
      }
      for (int64_t u = 0; u < count; ++u) {
        const int64_t n = members.order[m + u];
        T* __restrict__ on = out + n * Ev;
        for (int64_t e = 0; e < Ev; ++e) on[e] = acc[u][e];
        T* __restrict__ pn = p + n * K;
        for (int64_t j = 0; j < nt; ++j) pn[tiles.slot[j]] = s[u][j];
      }
    }
  }
}

struct BackwardPtrs {
  const void *g, *q, *k, *v, *top_w, *p;
  const int64_t *idx, *assign, *lens;
  void *dq, *dk, *dv, *dvalues, *dtop_w;
};

// Per-thread scratch of the backward: one cluster's key and value gradients.
template <typename T>
struct BackwardScratch {
  std::vector<T> dkt, dvt;
  BackwardScratch(int64_t KB, int64_t E, int64_t Ev) : dkt(KB * E), dvt(KB * Ev) {}
};

// Backward of one (batch, head); sizes as forward_bh.
template <typename T, int FE, int FEV, int FK>
void backward_bh(const BackwardPtrs& a, const Sizes& z, int64_t bh, T sc, ClusterMembers& members,
                 Tiles<T>& tiles, BackwardScratch<T>& w) {
  const int64_t E = FE ? FE : z.E, Ev = FEV ? FEV : z.Ev, KB = FK ? FK : z.K;
  const int64_t N = z.N, C = z.C, K = z.K;
  const T* g = static_cast<const T*>(a.g) + bh * N * Ev;
  const T* q = static_cast<const T*>(a.q) + bh * N * E;
  const T* k = static_cast<const T*>(a.k) + bh * N * E;
  const T* v = static_cast<const T*>(a.v) + bh * N * Ev;
  const T* p = static_cast<const T*>(a.p) + bh * N * K;
  T* dq = static_cast<T*>(a.dq) + bh * N * E;
  T* dk = static_cast<T*>(a.dk) + bh * N * E;
  T* dv = static_cast<T*>(a.dv) + bh * N * Ev;
  const int64_t L = length_of(a.lens, bh / z.H, N);
  // Sequential sweeps first: the zeroing also brings the gradients into the cache.
  std::fill(dq, dq + N * E, T(0));
  std::fill(dk, dk + N * E, T(0));
  std::fill(dv, dv + N * Ev, T(0));
  if (L == 0) return;
  prefetch_range(g, L * Ev);
  prefetch_range(q, L * E);
  prefetch_range(k, L * E);
  prefetch_range(v, L * Ev);
  prefetch_range(p, L * K);
  members.build(a.assign + bh * N, L, C);
  T gsum[FEV ? FEV : kMaxDim], pn[kGroup][FK ? FK : kMaxDim], dpt[kGroup][FK ? FK : kMaxDim],
      ds[kGroup][FK ? FK : kMaxDim], dqn[kGroup][FE ? FE : kMaxDim];
  T* __restrict__ dkt = w.dkt.data();
  T* __restrict__ dvt = w.dvt.data();
  for (int64_t cl = 0; cl < C; ++cl) {
    const int64_t m0 = members.start[cl], m1 = members.start[cl + 1];
    if (m0 == m1) continue;
    const int64_t off = (bh * C + cl) * K;
    prefetch_next_cluster<T>(members, cl, C, a.idx + bh * C * K, K, L, {{k, E}, {v, Ev}},
                             {{q, E}, {g, Ev}});
    load_tiles<T, FEV, FK>(tiles, a.idx + off, static_cast<const T*>(a.top_w) + off, K, L, v, Ev);
    const int64_t nt = tiles.nt;
    const bool all_slots = nt == K;
    const T* __restrict__ vals_t = tiles.t.data();
    T mass = 0;
    for (int64_t j = 0; j < nt; ++j) mass += tiles.w[j];
    for (int64_t i = 0; i < nt * E; ++i) dkt[i] = 0;
    for (int64_t i = 0; i < nt * Ev; ++i) dvt[i] = 0;
    for (int64_t e = 0; e < Ev; ++e) gsum[e] = 0;
    T dmass = 0;
    for (int64_t m = m0; m < m1; m += kGroup) {
      const int64_t count = std::min(kGroup, m1 - m);  // the tail repeats its last member ...
      const T *gg[kGroup], *qg[kGroup];
      for (int64_t u = 0; u < kGroup; ++u) {
        const int64_t n = members.order[m + std::min(u, count - 1)];
        gg[u] = g + n * Ev;
        qg[u] = q + n * E;
        const T* __restrict__ pr = p + n * K;
        if (u >= count) {  // ... with p = 0, so that it adds nothing
          for (int64_t j = 0; j < KB; ++j) pn[u][j] = 0;
        } else if (all_slots) {  // every top key valid: slot j is j
          for (int64_t j = 0; j < K; ++j) pn[u][j] = pr[j];
          for (int64_t j = K; j < KB; ++j) pn[u][j] = 0;
        } else {
          for (int64_t j = 0; j < KB; ++j) pn[u][j] = j < nt ? pr[tiles.slot[j]] : T(0);
        }
        for (int64_t j = 0; j < KB; ++j) dpt[u][j] = 0;  // dpt[u][j] = g_u . v_j
        for (int64_t e = 0; e < E; ++e) dqn[u][e] = 0;
      }
      for (int64_t u = 0; u < count; ++u)
        for (int64_t e = 0; e < Ev; ++e) gsum[e] += gg[u][e];
      for (int64_t e = 0; e < Ev; ++e) {
        const T* __restrict__ r = vals_t + e * KB;
        for (int64_t u = 0; u < kGroup; ++u) {
          const T ge = gg[u][e];
          for (int64_t j = 0; j < KB; ++j) dpt[u][j] += ge * r[j];
        }
      }
      for (int64_t u = 0; u < kGroup; ++u) {
        const T pd = dot_of<T>(pn[u], dpt[u], KB);
        dmass += pd;
        for (int64_t j = 0; j < KB; ++j) ds[u][j] = mass * pn[u][j] * (dpt[u][j] - pd) * sc;
      }
      // Slot j's key and value gradients gather the group's queries in local arrays
      // (registers, for the fixed sizes) and are stored once: accumulating in place
      // made every query wait on the previous one's store.
      for (int64_t j = 0; j < nt; ++j) {
        T* __restrict__ dvj = dvt + j * Ev;
        T* __restrict__ dkj = dkt + j * E;
        const T* __restrict__ kj = k + tiles.row[j] * E;
        T dva[FEV ? FEV : kMaxDim], dka[FE ? FE : kMaxDim];
        for (int64_t e = 0; e < Ev; ++e) dva[e] = dvj[e];
        for (int64_t e = 0; e < E; ++e) dka[e] = dkj[e];
#pragma GCC unroll 4
        for (int64_t u = 0; u < kGroup; ++u) {
          const T pj = mass * pn[u][j], dj = ds[u][j];
          const T* __restrict__ gu = gg[u];
          const T* __restrict__ qu = qg[u];
          for (int64_t e = 0; e < Ev; ++e) dva[e] += pj * gu[e];
          for (int64_t e = 0; e < E; ++e) dka[e] += dj * qu[e];
          for (int64_t e = 0; e < E; ++e) dqn[u][e] += dj * kj[e];
        }
        for (int64_t e = 0; e < Ev; ++e) dvj[e] = dva[e];
        for (int64_t e = 0; e < E; ++e) dkj[e] = dka[e];
      }
      for (int64_t u = 0; u < count; ++u) {
        T* __restrict__ dq_row = dq + members.order[m + u] * E;
        for (int64_t e = 0; e < E; ++e) dq_row[e] = dqn[u][e];
      }
    }
    // rest = values - sum_j w_j v_j and mass = sum_j w_j, so:
    T* __restrict__ dval_c = static_cast<T*>(a.dvalues) + (bh * C + cl) * Ev;
    for (int64_t e = 0; e < Ev; ++e) dval_c[e] = gsum[e];
    T* dw_c = static_cast<T*>(a.dtop_w) + off;
    for (int64_t j = 0; j < nt; ++j) {
      dw_c[tiles.slot[j]] = dmass - dot_of<T>(v + tiles.row[j] * Ev, gsum, Ev);
      const T wj = tiles.w[j];
      T* __restrict__ dvr = dv + tiles.row[j] * Ev;
      for (int64_t e = 0; e < Ev; ++e) dvr[e] += dvt[j * Ev + e] - wj * gsum[e];
      T* __restrict__ dkr = dk + tiles.row[j] * E;
      for (int64_t e = 0; e < E; ++e) dkr[e] += dkt[j * E + e];
    }
  }
}

// Calls body.template operator()<FE, FEV, FK>() with the fixed sizes matching z (float32
// only), else <0, 0, 0>.
template <typename T, typename Body>
void with_fixed_sizes(const Sizes& z, const Body& body) {
  if constexpr (std::is_same_v<T, float>) {
    if (z.E == 32 && z.Ev == 32 && z.K <= 32) return body.template operator()<32, 32, 32>();
    if (z.E == 64 && z.Ev == 64 && z.K <= 32) return body.template operator()<64, 64, 32>();
    if (z.E == 32 && z.Ev == 32 && z.K <= 64) return body.template operator()<32, 32, 64>();
    if (z.E == 64 && z.Ev == 64 && z.K <= 64) return body.template operator()<64, 64, 64>();
  }
  body.template operator()<0, 0, 0>();
}

inline int64_t slots(const Sizes& z) {
  return z.K <= 32 ? 32 : (z.K <= 64 ? 64 : z.K);  // at least the largest fixed KB
}

// Runs forward_bh over every (batch, head) on torch's threads, fixed sizes FE, FEV, FK.
template <typename T>
struct ForwardLaunch {
  const ForwardPtrs& ptrs;
  const Sizes& z;
  T scale;
  template <int FE, int FEV, int FK>
  void operator()() const {
    parallel_items(z.B * z.H, [&](const auto& take) {
      const int64_t KB = slots(z);
      ClusterMembers members;
      Tiles<T> tiles(KB, z.E);
      for (int64_t bh; take(bh);) forward_bh<T, FE, FEV, FK>(ptrs, z, bh, scale, members, tiles);
    });
  }
};

// Runs backward_bh over every (batch, head) on torch's threads, fixed sizes FE, FEV, FK.
template <typename T>
struct BackwardLaunch {
  const BackwardPtrs& ptrs;
  const Sizes& z;
  T scale;
  template <int FE, int FEV, int FK>
  void operator()() const {
    parallel_items(z.B * z.H, [&](const auto& take) {
      const int64_t KB = slots(z);
      ClusterMembers members;
      Tiles<T> tiles(KB, z.Ev);
      BackwardScratch<T> scratch(KB, z.E, z.Ev);
      for (int64_t bh; take(bh);)
        backward_bh<T, FE, FEV, FK>(ptrs, z, bh, scale, members, tiles, scratch);
    });
  }
};

void check_sparse(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& top_w, const at::Tensor& top_idx, const at::Tensor& assign) {
  for (const auto* t : {&q, &k, &v, &top_w, &top_idx, &assign})
    check_cpu(*t, "improved_sparse", "every input");
  TORCH_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.dim() == 4 &&
                  v.sizes().slice(0, 3) == q.sizes().slice(0, 3),
              "fastasr_cpu.improved_sparse: q, k (B, H, N, E), v (B, H, N, Ev); got ", q.sizes(),
              k.sizes(), v.sizes());
  TORCH_CHECK(top_idx.dim() == 4 && top_idx.sizes().slice(0, 2) == q.sizes().slice(0, 2) &&
                  top_w.sizes() == top_idx.sizes() && top_idx.scalar_type() == at::kLong,
              "fastasr_cpu.improved_sparse: top_idx int64 and top_w (B, H, C, K); got ",
              top_idx.sizes(), top_w.sizes());
  TORCH_CHECK(assign.sizes() == q.sizes().slice(0, 3) && assign.scalar_type() == at::kLong,
              "fastasr_cpu.improved_sparse: assignments int64 (B, H, N); got ", assign.sizes());
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type() &&
                  q.scalar_type() == top_w.scalar_type(),
              "fastasr_cpu.improved_sparse: q, k, v, top_w must share one dtype");
  TORCH_CHECK(q.size(3) <= kMaxDim && v.size(3) <= kMaxDim && top_idx.size(3) <= kMaxDim,
              "fastasr_cpu.improved_sparse: E, Ev and K must be <= ", kMaxDim, "; got ",
              q.size(3), ", ", v.size(3), ", ", top_idx.size(3));
}

// Returns out (B, H, N, Ev) and the per-query softmax p (B, H, N, K), 0 at invalid slots.
std::tuple<at::Tensor, at::Tensor> improved_sparse_forward(
    const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_, const at::Tensor& values_,
    const at::Tensor& top_w_, const at::Tensor& top_idx_, const at::Tensor& assign_,
    const std::optional<at::Tensor>& lengths, double scale) {
  check_sparse(q_, k_, v_, top_w_, top_idx_, assign_);
  const at::Tensor q = q_.contiguous(), k = k_.contiguous(), v = v_.contiguous(),
                   values = values_.contiguous(), top_w = top_w_.contiguous(),
                   top_idx = top_idx_.contiguous(), assign = assign_.contiguous();
  const Sizes z{q.size(0), q.size(1), q.size(2), q.size(3), v.size(3), top_idx.size(2),
                top_idx.size(3)};
  TORCH_CHECK(values.sizes() == at::IntArrayRef({z.B, z.H, z.C, z.Ev}),
              "fastasr_cpu.improved_sparse: values must be (B, H, C, Ev); got ", values.sizes());
  const at::Tensor lens = lengths_tensor(lengths, z.B);
  at::Tensor out = at::empty({z.B, z.H, z.N, z.Ev}, q.options());
  at::Tensor p = at::empty({z.B, z.H, z.N, z.K}, q.options());
  const ForwardPtrs ptrs{q.data_ptr(),        k.data_ptr(),      v.data_ptr(),
                         values.data_ptr(),   top_w.data_ptr(),  top_idx.data_ptr<int64_t>(),
                         assign.data_ptr<int64_t>(), lengths_ptr(lens), out.data_ptr(),
                         p.data_ptr()};
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "improved_sparse_forward", [&] {
    with_fixed_sizes<scalar_t>(z, ForwardLaunch<scalar_t>{ptrs, z, static_cast<scalar_t>(scale)});
  });
  return {out, p};
}

// Returns dq, dk, dv, dvalues (B, H, C, Ev) and dtop_w (B, H, C, K) (0 at invalid slots).
std::vector<at::Tensor> improved_sparse_backward(
    const at::Tensor& grad_, const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_,
    const at::Tensor& top_w_, const at::Tensor& top_idx_, const at::Tensor& assign_,
    const std::optional<at::Tensor>& lengths, const at::Tensor& p_, double scale) {
  check_sparse(q_, k_, v_, top_w_, top_idx_, assign_);
  const at::Tensor g = grad_.contiguous(), q = q_.contiguous(), k = k_.contiguous(),
                   v = v_.contiguous(), top_w = top_w_.contiguous(),
                   top_idx = top_idx_.contiguous(), assign = assign_.contiguous(),
                   p = p_.contiguous();
  const Sizes z{q.size(0), q.size(1), q.size(2), q.size(3), v.size(3), top_idx.size(2),
                top_idx.size(3)};
  TORCH_CHECK(g.sizes() == v.sizes() && p.sizes() == at::IntArrayRef({z.B, z.H, z.N, z.K}),
              "fastasr_cpu.improved_sparse_backward: grad (B, H, N, Ev), p (B, H, N, K)");
  const at::Tensor lens = lengths_tensor(lengths, z.B);
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  at::Tensor dvalues = at::zeros({z.B, z.H, z.C, z.Ev}, q.options());
  at::Tensor dtop_w = at::zeros({z.B, z.H, z.C, z.K}, q.options());
  const BackwardPtrs ptrs{g.data_ptr(),      q.data_ptr(),         k.data_ptr(),
                          v.data_ptr(),      top_w.data_ptr(),     p.data_ptr(),
                          top_idx.data_ptr<int64_t>(), assign.data_ptr<int64_t>(),
                          lengths_ptr(lens), dq.data_ptr(),        dk.data_ptr(),
                          dv.data_ptr(),     dvalues.data_ptr(),   dtop_w.data_ptr()};
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "improved_sparse_backward", [&] {
    with_fixed_sizes<scalar_t>(z, BackwardLaunch<scalar_t>{ptrs, z, static_cast<scalar_t>(scale)});
  });
  return {dq, dk, dv, dvalues, dtop_w};
}

}  // namespace
}  // namespace fastasr_cpu

TORCH_LIBRARY_FRAGMENT(fastasr_cpu, m) {
  m.def("improved_sparse_forward(Tensor q, Tensor k, Tensor v, Tensor values, Tensor top_w,"
        " Tensor top_idx, Tensor assignments, Tensor? lengths, float scale) -> (Tensor, Tensor)",
        &fastasr_cpu::improved_sparse_forward);
  m.def("improved_sparse_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor top_w,"
        " Tensor top_idx, Tensor assignments, Tensor? lengths, Tensor p, float scale) -> Tensor[]",
        &fastasr_cpu::improved_sparse_backward);
}
