// Helpers shared by the fastasr C++ CPU kernels (see clustering.cpp for the overview).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>

namespace fastasr_cpu {

// Runs worker(take) on each of torch's threads; `take(i)` hands out the items 0..n-1 one
// at a time (false when none is left). A worker sets up its scratch once and loops
// `for (int64_t i; take(i);)`. Handing items out dynamically, rather than splitting the
// range in equal halves up front, keeps one thread the OS preempts (a shared machine)
// from holding the other waiting at the end of the region.
template <typename Worker>
void parallel_items(int64_t n, const Worker& worker) {
  if (n <= 0) return;
  std::atomic<int64_t> next{0};
  const auto take = [&](int64_t& i) {
    i = next.fetch_add(1, std::memory_order_relaxed);
    return i < n;
  };
  const int64_t threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(n, threads));
  at::parallel_for(0, workers, 1, [&](int64_t lo, int64_t hi) {
    // Autograd state is thread-local and OpenMP's threads start with it on: the ATen
    // calls inside a kernel (at::mm_out on views of inputs that require grad) must
    // dispatch below autograd, as they do on the calling thread inside a Function.
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    for (int64_t w = lo; w < hi; ++w) worker(take);
  });
}

// Valid length of sequence b (n if no lengths were given), clamped to [0, n].
inline int64_t length_of(const int64_t* lens, int64_t b, int64_t n) {
  if (lens == nullptr) return n;
  return std::min(std::max<int64_t>(lens[b], 0), n);
}

// lengths as a contiguous int64 tensor (undefined if not given), checked against the batch.
inline at::Tensor lengths_tensor(const std::optional<at::Tensor>& lengths, int64_t batch) {
  if (!lengths.has_value()) return at::Tensor();
  TORCH_CHECK(lengths->dim() == 1 && lengths->size(0) == batch,
              "fastasr_cpu: lengths must be (", batch, ",), got ", lengths->sizes());
  return lengths->to(at::kLong).contiguous();
}

inline const int64_t* lengths_ptr(const at::Tensor& lens) {
  return lens.defined() ? lens.data_ptr<int64_t>() : nullptr;
}

inline void check_cpu(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "fastasr_cpu.", op, ": ", name, " must be a CPU tensor, got ",
              t.device());
}

// exp(x) for x <= 0 without calls or unpredictable branches, so loops over it
// vectorise: 2^n * p(r) with |r| <= ln2/2 and a degree-6 polynomial, relative error
// below 3e-7; exactly 0 below -87 (and for -inf).
inline float exp_nonpositive(float x) {
  const bool tiny = x < -87.0f;
  x = std::max(x, -87.0f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.3888889e-3f;
  p = p * r + 8.3333333e-3f;
  p = p * r + 4.1666667e-2f;
  p = p * r + 1.6666667e-1f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return tiny ? 0.0f : p * scale;
}
inline double exp_nonpositive(double x) { return std::exp(x); }

// Lanes of the partial reductions below: one AVX-512 register of float32. Written as
// independent lanes so the compiler vectorises them without reassociation flags.
constexpr int64_t kLanes = 16;

// max of x[0:n] (n >= 1).
template <typename T>
inline T max_of(const T* __restrict__ x, int64_t n) {
  if (n < kLanes) {
    T m = x[0];
    for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
    return m;
  }
  T lane[kLanes];
  for (int64_t u = 0; u < kLanes; ++u) lane[u] = x[u];
  int64_t i = kLanes;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t u = 0; u < kLanes; ++u) lane[u] = std::max(lane[u], x[i + u]);
  T m = lane[0];
  for (int64_t u = 1; u < kLanes; ++u) m = std::max(m, lane[u]);
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

// sum of x[0:n] * y[0:n] (y = nullptr: sum of x), in kLanes partial sums.
template <typename T>
inline T dot_of(const T* __restrict__ x, const T* __restrict__ y, int64_t n) {
  T lane[kLanes] = {};
  int64_t i = 0;
  if (y == nullptr) {
    for (; i + kLanes <= n; i += kLanes)
      for (int64_t u = 0; u < kLanes; ++u) lane[u] += x[i + u];
  } else {
    for (; i + kLanes <= n; i += kLanes)
      for (int64_t u = 0; u < kLanes; ++u) lane[u] += x[i + u] * y[i + u];
  }
  T s = 0;
  for (int64_t u = 0; u < kLanes; ++u) s += lane[u];
  for (; i < n; ++i) s += y == nullptr ? x[i] : x[i] * y[i];
  return s;
}

// In-place softmax of s[0:n] (n >= 1, at least one finite entry).
template <typename T>
inline void softmax_inplace(T* __restrict__ s, int64_t n) {
  const T m = max_of(s, n);
  for (int64_t j = 0; j < n; ++j) s[j] = exp_nonpositive(s[j] - m);
  const T inv = T(1) / dot_of<T>(s, nullptr, n);
  for (int64_t j = 0; j < n; ++j) s[j] *= inv;
}

// Brings x[0:n] into the cache with one sequential sweep of prefetches, before a
// kernel reads its rows in a data-dependent order (which defeats the hardware
// prefetcher: every line would be a separate trip to memory).
// Locality: 2 keeps the lines in L2 (a whole matrix), 3 in L1 (the next few rows).
template <typename T>
inline void prefetch_range(const T* x, int64_t n, int locality = 2) {
  const char* p = reinterpret_cast<const char*>(x);
  const int64_t bytes = n * static_cast<int64_t>(sizeof(T));
  if (locality == 3) {
    for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i, 0, 3);
  } else {
    for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i, 0, 2);
  }
}

// Sets rows [L, N) of x (N x D, row-major) to zero.
template <typename T>
inline void zero_rows(T* x, int64_t L, int64_t N, int64_t D) {
  std::fill(x + L * D, x + N * D, T(0));
}

}  // namespace fastasr_cpu
