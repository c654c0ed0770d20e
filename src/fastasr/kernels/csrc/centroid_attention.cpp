// The centroid attention, fused per (batch, head), and top-k selection (see clustering.cpp).
//
// Each centroid attends to every key: scores S = centroids K^T (C x N), softmax over
// the valid keys, values W V, and (improved clustered) the top keys of each row. The
// products are BLAS calls per (batch, head) into a (C x N) buffer that stays in the
// cache and is reused across heads, so the (B, H, C, N) matrix never exists: at
// 16384 tokens it would be a 39 MB allocation per pass, and first-touching its pages
// cost more than the products (measured: 23 ms for a batched product that takes 8 ms
// into a reused buffer). Between the products, one pass over each row scales, masks,
// selects its top keys and exponentiates. The backward recomputes S (one more
// product) from the saved log-sum-exp of each row instead of keeping W.

#include <torch/library.h>

#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "common.h"

namespace fastasr_cpu {
namespace {

// An integer key of x ordered as x is (-0 just below +0): float32 -> int32, float64 -> int64.
template <typename T>
using OrderedKey = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;

template <typename T>
inline OrderedKey<T> ordered_key(T x) {
  using I = OrderedKey<T>;
  I i;
  std::memcpy(&i, &x, sizeof(T));
  return i ^ ((i >> (8 * sizeof(T) - 1)) & std::numeric_limits<I>::max());
}

// Scratch of row_topk for one thread: room for every entry of a row as a candidate.
// (16 more: the vectorised collection stores whole registers.)
template <typename T>
struct TopkScratch {
  std::vector<OrderedKey<T>> key;
  std::vector<int32_t> pos;
  explicit TopkScratch(int64_t n) : key(std::max<int64_t>(n, 1) + 16), pos(std::max<int64_t>(n, 1) + 16) {}
};

// Collects the entries of row[0:L] at or above thr as ordered keys and positions; returns
// how many. Branch-free; with AVX-512 and float32, 16 entries a step (a block without
// candidates, most of them, costs one comparison; compressing into a register and
// storing it whole avoids the compressing store, which is slow on some CPUs).
template <typename T>
int64_t collect_candidates(const T* __restrict__ row, int64_t L, T thr, OrderedKey<T>* __restrict__ key,
                           int32_t* __restrict__ pos) {
  int64_t nb = 0, j = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    const __m512 vthr = _mm512_set1_ps(thr);
    const __m512i sixteen = _mm512_set1_epi32(16), magnitude = _mm512_set1_epi32(0x7fffffff);
    __m512i vpos = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (; j + 16 <= L; j += 16, vpos = _mm512_add_epi32(vpos, sixteen)) {
      const __m512 x = _mm512_loadu_ps(row + j);
      const __mmask16 m = _mm512_cmp_ps_mask(x, vthr, _CMP_GE_OQ);
      if (m == 0) continue;
      const __m512i xi = _mm512_castps_si512(x);
      const __m512i kx = _mm512_xor_si512(xi, _mm512_and_si512(_mm512_srai_epi32(xi, 31), magnitude));
      _mm512_storeu_si512(key + nb, _mm512_maskz_compress_epi32(m, kx));
      _mm512_storeu_si512(pos + nb, _mm512_maskz_compress_epi32(m, vpos));
      nb += __builtin_popcount(static_cast<unsigned>(m));
    }
  }
#endif
  for (; j < L; ++j) {
    key[nb] = ordered_key(row[j]);
    pos[nb] = static_cast<int32_t>(j);
    nb += row[j] >= thr;
  }
  return nb;
}

// Indices of the k largest of row[0:L] into idx[0:k], in no particular order
// (1 <= k); returns the row's maximum. With L <= k the positions 0, 1, ... k-1 (the
// valid ones first; the caller gives the others no weight). Cut the row into k groups:
// the smallest of the k group maxima is at most the k-th largest entry (the k maxima
// are k distinct entries at least as large), so every entry of the top k is >= it.
// One vectorised pass finds it, one branch-free pass collects the few entries above it
// (about 15 % of a row of 800 centroid scores for k = 32) as ordered integer keys, a
// bisection over the keys finds the k-th largest (a count over the candidates per step,
// at most 32 steps for float32), and a last pass keeps the candidates above it, then
// ties in position order.
template <typename T>
T row_topk(const T* __restrict__ row, int64_t L, int64_t k, TopkScratch<T>& scratch,
           int64_t* __restrict__ idx) {
  using I = OrderedKey<T>;
  if (L <= k) {
    for (int64_t j = 0; j < k; ++j) idx[j] = j;
    return max_of(row, std::max<int64_t>(L, 1));
  }
  T thr = std::numeric_limits<T>::infinity(), top = -std::numeric_limits<T>::infinity();
  for (int64_t g = 0; g < k; ++g) {
    const int64_t lo = g * L / k, hi = (g + 1) * L / k;
    const T gm = max_of(row + lo, hi - lo);
    thr = std::min(thr, gm);
    top = std::max(top, gm);
  }
  I* __restrict__ key = scratch.key.data();
  int32_t* __restrict__ pos = scratch.pos.data();
  const int64_t nb = collect_candidates(row, L, thr, key, pos);
  // count(key >= lo) >= k > count(key >= hi); the k-th largest key is the last such lo.
  // (Differences in uint64: float64 keys can span more than int64's range.)
  I lo = ordered_key(thr);
  const I top_key = ordered_key(top);
  uint64_t span = static_cast<uint64_t>(top_key) - static_cast<uint64_t>(lo) + 1;  // hi - lo
  while (span > 1) {
    const I mid = static_cast<I>(static_cast<uint64_t>(lo) + span / 2);
    int64_t above = 0;
    for (int64_t c = 0; c < nb; ++c) above += key[c] >= mid;
    if (above >= k) {
      lo = mid;
      span -= span / 2;
    } else {
      span = span / 2;
    }
  }
  const I kth = lo;
  int64_t t = 0;
  for (int64_t c = 0; c < nb; ++c) {
    idx[t] = pos[c];
    t += key[c] > kth;
  }
  for (int64_t c = 0; c < nb && t < k; ++c) {
    if (key[c] == kth) idx[t++] = pos[c];
  }
  // A row holding NaN (a diverged step: NaN is never >= the threshold) can leave fewer than
  // k candidates: the rest of idx takes the first positions not chosen, so that every index
  // lies in the row (its weights are NaN anyway, and the non-finite guard skips the update).
  for (int64_t j = 0; t < k && j < L; ++j) {
    bool taken = false;
    for (int64_t u = 0; u < t; ++u) taken |= idx[u] == j;
    if (!taken) idx[t++] = j;
  }
  return top;
}

// Indices (..., k) of the k largest entries of every row of scores (..., N), unordered.
at::Tensor topk_indices(const at::Tensor& scores, int64_t k) {
  check_cpu(scores, "topk_indices", "scores");
  TORCH_CHECK(scores.dim() >= 1, "fastasr_cpu.topk_indices: scores must have a last dimension");
  const int64_t N = scores.size(-1);
  TORCH_CHECK(k >= 1 && k <= N, "fastasr_cpu.topk_indices: k=", k, "; expected 1..", N);
  const at::Tensor s = scores.contiguous();
  const int64_t R = s.numel() / N;
  auto sizes = s.sizes().vec();
  sizes.back() = k;
  at::Tensor out = at::empty(sizes, s.options().dtype(at::kLong));
  int64_t* op = out.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES(s.scalar_type(), "topk_indices", [&] {
    const scalar_t* sp = s.data_ptr<scalar_t>();
    parallel_items(R, [&](const auto& take) {
      TopkScratch<scalar_t> scratch(N);
      for (int64_t r; take(r);) row_topk(sp + r * N, N, k, scratch, op + r * k);
    });
  });
  return out;
}

// One row of centroid scores, in place: logits = scale * raw over the valid keys
// [0, L) (every key when L = 0, as key_mask), the k largest logits' indices, then the
// softmax (0 at masked keys), its values at those indices, and the row's log-sum-exp.
template <typename T>
T softmax_topk_row(T* __restrict__ row, int64_t N, int64_t L, T scale, int64_t k,
                   TopkScratch<T>& scratch, int64_t* __restrict__ idx, T* __restrict__ top_w) {
  const int64_t valid = L == 0 ? N : L;
  for (int64_t n = 0; n < valid; ++n) row[n] *= scale;
  const T m = k > 0 ? row_topk(row, valid, k, scratch, idx) : max_of(row, valid);
  for (int64_t n = 0; n < valid; ++n) row[n] = exp_nonpositive(row[n] - m);
  const T z = dot_of<T>(row, nullptr, valid);
  const T inv = T(1) / z;
  for (int64_t n = 0; n < valid; ++n) row[n] *= inv;
  for (int64_t n = valid; n < N; ++n) row[n] = 0;
  for (int64_t t = 0; t < k; ++t) top_w[t] = row[idx[t]];
  return m + std::log(z);
}

void check_centroid(const at::Tensor& cent, const at::Tensor& k, const at::Tensor& v) {
  for (const auto* t : {&cent, &k, &v}) check_cpu(*t, "centroid_attention", "every input");
  TORCH_CHECK(cent.dim() == 4 && k.dim() == 4 && v.dim() == 4 &&
                  cent.sizes().slice(0, 2) == k.sizes().slice(0, 2) &&
                  v.sizes().slice(0, 3) == k.sizes().slice(0, 3) && cent.size(3) == k.size(3),
              "fastasr_cpu.centroid_attention: centroids (B, H, C, E), k (B, H, N, E), "
              "v (B, H, N, Ev); got ", cent.sizes(), k.sizes(), v.sizes());
  TORCH_CHECK(cent.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(),
              "fastasr_cpu.centroid_attention: centroids, k, v must share one dtype");
}

// (C x N) matrix view of a thread's buffer.
inline at::Tensor buffer_view(std::vector<char>& storage, int64_t C, int64_t N,
                              const at::TensorOptions& opts) {
  return at::from_blob(storage.data(), {C, N}, opts);
}

// Each centroid's attention over the keys of its (batch, head):
// returns values (B, H, C, Ev) = softmax(scale centroids k^T) v over the valid keys,
// the top-k keys of every centroid (B, H, C, k) and the attention at them, and the
// log-sum-exp of every row (B, H, C) that the backward recomputes the softmax from.
std::vector<at::Tensor> centroid_attention_forward(const at::Tensor& cent_, const at::Tensor& k_,
                                                   const at::Tensor& v_,
                                                   const std::optional<at::Tensor>& lengths,
                                                   double scale, int64_t topk) {
  check_centroid(cent_, k_, v_);
  const int64_t B = k_.size(0), H = k_.size(1), N = k_.size(2), E = k_.size(3), Ev = v_.size(3);
  const int64_t C = cent_.size(2), BH = B * H;
  TORCH_CHECK(topk >= 0 && topk <= N, "fastasr_cpu.centroid_attention: topk=", topk,
              "; expected 0..", N);
  const at::Tensor cent = cent_.reshape({BH, C, E}), k = k_.reshape({BH, N, E}),
                   v = v_.reshape({BH, N, Ev});
  const at::Tensor lens = lengths_tensor(lengths, B);
  const int64_t* lp = lengths_ptr(lens);
  const auto opts = cent.options();
  at::Tensor values = at::empty({BH, C, Ev}, opts);
  at::Tensor top_idx = at::empty({BH, C, topk}, opts.dtype(at::kLong));
  at::Tensor top_w = at::empty({BH, C, topk}, opts);
  at::Tensor lse = at::empty({BH, C}, opts);
  if (N > 0 && BH > 0) {
    AT_DISPATCH_FLOATING_TYPES(cent.scalar_type(), "centroid_attention_forward", [&] {
      using T = scalar_t;
      parallel_items(BH, [&](const auto& take) {
        std::vector<char> storage(C * N * sizeof(T));
        at::Tensor S = buffer_view(storage, C, N, opts);
        TopkScratch<T> scratch(N);
        for (int64_t bh; take(bh);) {
          const int64_t L = length_of(lp, bh / H, N);
          at::mm_out(S, cent[bh], k[bh].t());
          T* sp = S.data_ptr<T>();
          for (int64_t c = 0; c < C; ++c) {
            const int64_t r = bh * C + c;
            lse.data_ptr<T>()[r] = softmax_topk_row(sp + c * N, N, L, static_cast<T>(scale), topk,
                                                    scratch, top_idx.data_ptr<int64_t>() + r * topk,
                                                    top_w.data_ptr<T>() + r * topk);
          }
          at::Tensor out = values[bh];
          at::mm_out(out, S, v[bh]);
        }
      });
    });
  } else {
    values.zero_();
  }
  return {values.view({B, H, C, Ev}), top_w.view({B, H, C, topk}), top_idx.view({B, H, C, topk}),
          lse.view({B, H, C})};
}

// Gradients of centroid_attention_forward: d centroids, d k, d v from the gradients of
// values and of the top weights (may be undefined), recomputing the softmax per
// (batch, head) from the saved log-sum-exp.
std::vector<at::Tensor> centroid_attention_backward(
    const at::Tensor& d_values_, const std::optional<at::Tensor>& d_top_w_,
    const at::Tensor& cent_, const at::Tensor& k_, const at::Tensor& v_,
    const std::optional<at::Tensor>& lengths, double scale, const at::Tensor& top_idx_,
    const at::Tensor& lse_) {
  check_centroid(cent_, k_, v_);
  const int64_t B = k_.size(0), H = k_.size(1), N = k_.size(2), E = k_.size(3), Ev = v_.size(3);
  const int64_t C = cent_.size(2), BH = B * H, topk = top_idx_.size(-1);
  const at::Tensor cent = cent_.reshape({BH, C, E}), k = k_.reshape({BH, N, E}),
                   v = v_.reshape({BH, N, Ev}), d_values = d_values_.reshape({BH, C, Ev}),
                   lse = lse_.reshape({BH, C}).contiguous(),
                   top_idx = top_idx_.reshape({BH, C, topk}).contiguous();
  const bool has_top = d_top_w_.has_value() && d_top_w_->defined() && topk > 0;
  const at::Tensor d_top_w =
      has_top ? d_top_w_->reshape({BH, C, topk}).to(cent.scalar_type()).contiguous() : at::Tensor();
  const at::Tensor lens = lengths_tensor(lengths, B);
  const int64_t* lp = lengths_ptr(lens);
  const auto opts = cent.options();
  const bool empty = N == 0 || BH == 0;
  at::Tensor d_cent = empty ? at::zeros({BH, C, E}, opts) : at::empty({BH, C, E}, opts);
  at::Tensor d_k = at::empty({BH, N, E}, opts), d_v = at::empty({BH, N, Ev}, opts);
  if (!empty) {
    AT_DISPATCH_FLOATING_TYPES(cent.scalar_type(), "centroid_attention_backward", [&] {
      using T = scalar_t;
      const T sc = static_cast<T>(scale);
      parallel_items(BH, [&](const auto& take) {
        std::vector<char> w_storage(C * N * sizeof(T)), g_storage(C * N * sizeof(T));
        at::Tensor W = buffer_view(w_storage, C, N, opts), G = buffer_view(g_storage, C, N, opts);
        for (int64_t bh; take(bh);) {
          const int64_t L = length_of(lp, bh / H, N);
          const int64_t valid = L == 0 ? N : L;
          at::mm_out(W, cent[bh], k[bh].t());
          at::mm_out(G, d_values[bh], v[bh].t());
          T* wp = W.data_ptr<T>();
          T* gp = G.data_ptr<T>();
          const T* lp_bh = lse.data_ptr<T>() + bh * C;
          for (int64_t c = 0; c < C; ++c) {
            T* __restrict__ w = wp + c * N;
            T* __restrict__ g = gp + c * N;
            const T l = lp_bh[c];
            for (int64_t n = 0; n < valid; ++n) w[n] = exp_nonpositive(std::min(w[n] * sc - l, T(0)));
            for (int64_t n = valid; n < N; ++n) w[n] = 0;
            if (has_top) {
              const int64_t* ti = top_idx.data_ptr<int64_t>() + (bh * C + c) * topk;
              const T* tg = d_top_w.data_ptr<T>() + (bh * C + c) * topk;
              for (int64_t t = 0; t < topk; ++t) g[ti[t]] += tg[t];
            }
            const T dot = dot_of<T>(w, g, N);
            for (int64_t n = 0; n < N; ++n) g[n] = sc * w[n] * (g[n] - dot);
          }
          at::Tensor dc = d_cent[bh], dk = d_k[bh], dv = d_v[bh];
          at::mm_out(dc, G, k[bh]);
          at::mm_out(dk, G.t(), cent[bh]);
          at::mm_out(dv, W.t(), d_values[bh]);
        }
      });
    });
  }
  return {d_cent.view({B, H, C, E}), d_k.view({B, H, N, E}), d_v.view({B, H, N, Ev})};
}

}  // namespace
}  // namespace fastasr_cpu

TORCH_LIBRARY_FRAGMENT(fastasr_cpu, m) {
  m.def("topk_indices(Tensor scores, int k) -> Tensor", &fastasr_cpu::topk_indices);
  m.def("centroid_attention_forward(Tensor centroids, Tensor k, Tensor v, Tensor? lengths,"
        " float scale, int topk) -> Tensor[]",
        &fastasr_cpu::centroid_attention_forward);
  m.def("centroid_attention_backward(Tensor d_values, Tensor? d_top_w, Tensor centroids,"
        " Tensor k, Tensor v, Tensor? lengths, float scale, Tensor top_idx, Tensor lse)"
        " -> Tensor[]",
        &fastasr_cpu::centroid_attention_backward);
}
