// Top-k selection and the centroid attention's softmax, fused (see clustering.cpp).
//
// The centroid attention is two BLAS products around a (B, H, C, N) matrix of
// scores. Between them, one pass over each row (N floats, in L1) scales and masks it,
// selects its top keys and turns it into softmax weights, in place; the backward
// turns the weights' gradient into the scores' gradient in one more pass. PyTorch
// would take six passes over the whole matrix for the same (mask, scale, softmax,
// topk, gather; and their backward with a dense scatter of the top-k gradient).

#include <torch/library.h>

#include <functional>
#include <limits>
#include <tuple>
#include <vector>

#include "common.h"

namespace fastasr_cpu {
namespace {

// Scratch of row_topk for one thread: room for every entry of a row as a candidate.
template <typename T>
struct TopkScratch {
  std::vector<T> value, pick;
  std::vector<int64_t> pos;
  explicit TopkScratch(int64_t n)
      : value(std::max<int64_t>(n, 1)), pick(std::max<int64_t>(n, 1)), pos(std::max<int64_t>(n, 1)) {}
};

// Indices of the k largest of row[0:L] into idx[0:k], in no particular order
// (1 <= k). With L <= k the positions 0, 1, ... k-1 (the valid ones first; the caller
// gives the others no weight). Cut the row into k groups: the smallest of the k group
// maxima is at most the k-th largest entry (the k maxima are k distinct entries at
// least as large), so every entry of the top k is >= it. One vectorised pass finds
// it, one branch-free pass collects the few entries above it (about 8 % of a row of
// 1024 random scores for k = 32), nth_element on their values gives the k-th largest
// value, and a last pass over the candidates keeps those above it (then ties).
template <typename T>
void row_topk(const T* __restrict__ row, int64_t L, int64_t k, TopkScratch<T>& scratch,
              int64_t* __restrict__ idx) {
  if (L <= k) {
    for (int64_t j = 0; j < k; ++j) idx[j] = j;
    return;
  }
  T thr = std::numeric_limits<T>::infinity();
  for (int64_t g = 0; g < k; ++g) {
    const int64_t lo = g * L / k, hi = (g + 1) * L / k;
    thr = std::min(thr, max_of(row + lo, hi - lo));
  }
  T* __restrict__ value = scratch.value.data();
  int64_t* __restrict__ pos = scratch.pos.data();
  int64_t nb = 0;
  for (int64_t j = 0; j < L; ++j) {
    value[nb] = row[j];
    pos[nb] = j;
    nb += row[j] >= thr;
  }
  T* pick = scratch.pick.data();
  std::copy(value, value + nb, pick);
  std::nth_element(pick, pick + (k - 1), pick + nb, std::greater<T>());
  const T kth = pick[k - 1];
  int64_t t = 0;
  for (int64_t c = 0; c < nb; ++c) {
    idx[t] = pos[c];
    t += value[c] > kth;
  }
  for (int64_t c = 0; c < nb && t < k; ++c) {
    if (value[c] == kth) idx[t++] = pos[c];
  }
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
    at::parallel_for(0, R, 16, [&](int64_t lo, int64_t hi) {
      TopkScratch<scalar_t> scratch(N);
      for (int64_t r = lo; r < hi; ++r)
        row_topk(sp + r * N, N, k, scratch, op + r * k);
    });
  });
  return out;
}

// One row of centroid scores, in place: logits = scale * raw over the valid keys
// [0, L) (every key when L = 0, as key_mask), the k largest logits' indices, then the
// softmax (0 at masked keys) and its values at those indices.
template <typename T>
void softmax_topk_row(T* __restrict__ row, int64_t N, int64_t L, T scale, int64_t k,
                      TopkScratch<T>& scratch, int64_t* __restrict__ idx, T* __restrict__ top_w) {
  const int64_t valid = L == 0 ? N : L;
  for (int64_t n = 0; n < valid; ++n) row[n] *= scale;
  if (k > 0) row_topk(row, valid, k, scratch, idx);
  const T m = max_of(row, valid);
  for (int64_t n = 0; n < valid; ++n) row[n] = exp_nonpositive(row[n] - m);
  const T inv = T(1) / dot_of<T>(row, nullptr, valid);
  for (int64_t n = 0; n < valid; ++n) row[n] *= inv;
  for (int64_t n = valid; n < N; ++n) row[n] = 0;
  for (int64_t t = 0; t < k; ++t) top_w[t] = row[idx[t]];
}

// scores (B, H, C, N) raw centroid . key products -> (in place) the centroid attention
// softmax(scale * scores) over the valid keys; returns the k top keys of each row
// (B, H, C, k) and the attention at them. k = 0: no selection (empty outputs).
std::tuple<at::Tensor, at::Tensor> softmax_topk_(at::Tensor& scores,
                                                 const std::optional<at::Tensor>& lengths,
                                                 double scale, int64_t k) {
  check_cpu(scores, "softmax_topk_", "scores");
  TORCH_CHECK(scores.dim() == 4 && scores.is_contiguous(),
              "fastasr_cpu.softmax_topk_: scores must be contiguous (B, H, C, N), got ",
              scores.sizes());
  const int64_t B = scores.size(0), H = scores.size(1), C = scores.size(2), N = scores.size(3);
  TORCH_CHECK(k >= 0 && k <= N, "fastasr_cpu.softmax_topk_: k=", k, "; expected 0..", N);
  const at::Tensor lens = lengths_tensor(lengths, B);
  const int64_t* lp = lengths_ptr(lens);
  at::Tensor top_idx = at::empty({B, H, C, k}, scores.options().dtype(at::kLong));
  at::Tensor top_w = at::empty({B, H, C, k}, scores.options());
  if (N == 0) return {top_idx, top_w};
  AT_DISPATCH_FLOATING_TYPES(scores.scalar_type(), "softmax_topk_", [&] {
    scalar_t* sp = scores.data_ptr<scalar_t>();
    int64_t* ip = top_idx.data_ptr<int64_t>();
    scalar_t* wp = top_w.data_ptr<scalar_t>();
    const scalar_t sc = static_cast<scalar_t>(scale);
    at::parallel_for(0, B * H * C, 16, [&](int64_t lo, int64_t hi) {
      TopkScratch<scalar_t> scratch(N);
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t L = length_of(lp, r / (H * C), N);
        softmax_topk_row(sp + r * N, N, L, sc, k, scratch, ip + r * k, wp + r * k);
      }
    });
  });
  return {top_idx, top_w};
}

// grad (B, H, C, N), the gradient of the softmax weights (B, H, C, N), becomes (in place)
// the gradient of the raw scores: first the gradient of the top weights top_grad
// (B, H, C, k) is added at top_idx, then d raw = scale * w * (g - <w, g>).
void softmax_backward_(at::Tensor& grad, const at::Tensor& weights, const at::Tensor& top_idx,
                       const std::optional<at::Tensor>& top_grad, double scale) {
  check_cpu(grad, "softmax_backward_", "grad");
  TORCH_CHECK(grad.dim() == 4 && grad.is_contiguous() && weights.is_contiguous() &&
                  grad.sizes() == weights.sizes() && grad.scalar_type() == weights.scalar_type(),
              "fastasr_cpu.softmax_backward_: grad and weights must be contiguous (B, H, C, N) "
              "of one dtype");
  const int64_t N = grad.size(3);
  if (N == 0 || grad.numel() == 0) return;
  const int64_t R = grad.numel() / N, k = top_idx.size(-1);
  const bool has_top = top_grad.has_value() && top_grad->defined() && k > 0;
  const at::Tensor ti = top_idx.contiguous();
  const at::Tensor tg = has_top ? top_grad->to(grad.scalar_type()).contiguous() : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "softmax_backward_", [&] {
    scalar_t* gp = grad.data_ptr<scalar_t>();
    const scalar_t* wp = weights.data_ptr<scalar_t>();
    const int64_t* ip = has_top ? ti.data_ptr<int64_t>() : nullptr;
    const scalar_t* tp = has_top ? tg.data_ptr<scalar_t>() : nullptr;
    const scalar_t sc = static_cast<scalar_t>(scale);
    at::parallel_for(0, R, 16, [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        scalar_t* __restrict__ g = gp + r * N;
        const scalar_t* __restrict__ w = wp + r * N;
        if (has_top)
          for (int64_t t = 0; t < k; ++t) g[ip[r * k + t]] += tp[r * k + t];
        const scalar_t dot = dot_of(w, static_cast<const scalar_t*>(g), N);
        for (int64_t n = 0; n < N; ++n) g[n] = sc * w[n] * (g[n] - dot);
      }
    });
  });
}

}  // namespace
}  // namespace fastasr_cpu

TORCH_LIBRARY_FRAGMENT(fastasr_cpu, m) {
  m.def("topk_indices(Tensor scores, int k) -> Tensor", &fastasr_cpu::topk_indices);
  m.def("softmax_topk_(Tensor(a!) scores, Tensor? lengths, float scale, int k)"
        " -> (Tensor, Tensor)",
        &fastasr_cpu::softmax_topk_);
  m.def("softmax_backward_(Tensor(a!) grad, Tensor weights, Tensor top_idx, Tensor? top_grad,"
        " float scale) -> ()",
        &fastasr_cpu::softmax_backward_);
}
