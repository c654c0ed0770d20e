// fastasr C++ CPU kernels of clustered and improved clustered attention.
//
// CPU twins of ops in fastasr/kernels/reference.py (read it for the rules; the tests
// check these against it), registered as torch.ops.fastasr_cpu.*:
//
//   clustering.cpp          hash_codes, hamming_kmeans: bit for bit the reference's;
//                           worker_threads (the threads parallel_items runs on)
//   centroid_attention.cpp  topk_indices; the centroid attention (scores, masking,
//                           softmax, top-k selection, values) and its backward, fused
//   improved_sparse.cpp     the per-query part of improved clustered attention, fused
//
// Every op is parallel over (batch, head) or rows on torch's threads (parallel_items in
// common.h), so torch.set_num_threads governs it; the library is built with -fopenmp,
// without which ATen's parallel_for (a header template) runs serially. float32 and float64.

#include <torch/library.h>

#include <atomic>
#include <chrono>
#include <tuple>
#include <vector>

#include "common.h"

namespace fastasr_cpu {
namespace {

// ------------------------------------------------------------------- hashing

// Codes of one row x (E features): bit b = x . w[:, b] + offset[b] > 0, with w (E x 64)
// row-major (bits beyond `bits` zero). The 64 projections are accumulated as E axpys
// over a row of 64, which vectorises; the order of the sums differs from a BLAS
// product, so a projection within rounding of 0 may get the other bit (random
// inputs practically never have one).
template <typename T>
inline uint64_t hash_row(const T* __restrict__ x, const T* __restrict__ w,
                         const T* __restrict__ offset, int64_t E, int64_t bits) {
  T acc[64];
  for (int b = 0; b < 64; ++b) acc[b] = offset[b];
  for (int64_t e = 0; e < E; ++e) {
    const T xe = x[e];
    for (int b = 0; b < 64; ++b) acc[b] += xe * w[e * 64 + b];
  }
  uint64_t code = 0;
  for (int64_t b = 0; b < bits; ++b) code |= static_cast<uint64_t>(acc[b] > 0) << b;
  return code;
}

at::Tensor hash_codes(const at::Tensor& x_, const at::Tensor& planes,
                      const std::optional<at::Tensor>& lengths) {
  check_cpu(x_, "hash_codes", "x");
  TORCH_CHECK(x_.dim() == 4, "fastasr_cpu.hash_codes: x must be (B, H, N, E), got ", x_.sizes());
  const int64_t B = x_.size(0), H = x_.size(1), N = x_.size(2), E = x_.size(3);
  TORCH_CHECK(planes.dim() == 2 && planes.size(0) == E + 1,
              "fastasr_cpu.hash_codes: planes must be (E+1, bits) = (", E + 1, ", bits), got ",
              planes.sizes());
  const int64_t bits = planes.size(1);
  // The caller checks bits against reference.MAX_BITS; this only guards the shifts.
  TORCH_CHECK(bits >= 1 && bits < 64, "fastasr_cpu.hash_codes: ", bits, " bits do not fit a code");
  const auto dtype = x_.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor x = x_.to(dtype).contiguous();
  // (E + 1) x 64: the planes, then the offsets; columns beyond `bits` are zero.
  const at::Tensor w = at::zeros({E + 1, 64}, x.options());
  w.narrow(1, 0, bits).copy_(planes);
  const at::Tensor lens = lengths_tensor(lengths, B);
  const int64_t* lp = lengths_ptr(lens);
  at::Tensor codes = at::zeros({B, H, N}, x.options().dtype(at::kLong));
  int64_t* out = codes.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "hash_codes", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* wp = w.data_ptr<scalar_t>();
    parallel_items(B * H, [&](const auto& take) {
      for (int64_t bh; take(bh);) {
        const int64_t L = length_of(lp, bh / H, N);
        for (int64_t n = 0; n < L; ++n)
          out[bh * N + n] =
              static_cast<int64_t>(hash_row(xp + (bh * N + n) * E, wp, wp + E * 64, E, bits));
      }
    });
  });
  return codes;
}

// -------------------------------------------------------------------- K-means

// Nearest centroid of x among cent[0:ce]: smallest popcount(x ^ c), ties to the lowest
// index. Distance and index are packed into one key so that a plain min finds both
// (and the compiler can vectorise the loop).
inline int32_t nearest_centroid(uint64_t x, const uint64_t* cent, int64_t ce) {
  uint64_t best = ~uint64_t(0);
  for (int64_t c = 0; c < ce; ++c) {
    const uint64_t key =
        (static_cast<uint64_t>(__builtin_popcountll(x ^ cent[c])) << 32) | static_cast<uint64_t>(c);
    best = key < best ? key : best;
  }
  return static_cast<int32_t>(best & 0xffffffffu);
}

// Adds the 64 bits of x to the counters ones[0:64].
inline void add_bits(uint64_t x, int32_t* ones) {
  const uint32_t lo = static_cast<uint32_t>(x), hi = static_cast<uint32_t>(x >> 32);
  for (int b = 0; b < 32; ++b) ones[b] += static_cast<int32_t>((lo >> b) & 1u);
  for (int b = 0; b < 32; ++b) ones[32 + b] += static_cast<int32_t>((hi >> b) & 1u);
}

// K-means of one sequence's L codes (L >= 1) into min(C, L) used centroids.
void kmeans_sequence(const int64_t* codes, int64_t L, int64_t C, int64_t iterations, int64_t bits,
                     int64_t* assign_out, int64_t* counts_out) {
  const uint64_t mask = (uint64_t(1) << bits) - 1;
  const int64_t ce = std::min(C, L);
  std::vector<uint64_t> x(L), cent(ce);
  std::vector<int32_t> asg(L), cnt(ce), ones(ce * 64);
  for (int64_t n = 0; n < L; ++n) x[n] = static_cast<uint64_t>(codes[n]) & mask;
  for (int64_t c = 0; c < ce; ++c) cent[c] = x[(c * L) / ce];  // evenly spaced positions
  for (int64_t it = 0; it < iterations; ++it) {
    for (int64_t n = 0; n < L; ++n) asg[n] = nearest_centroid(x[n], cent.data(), ce);
    std::fill(cnt.begin(), cnt.end(), 0);
    std::fill(ones.begin(), ones.end(), 0);
    for (int64_t n = 0; n < L; ++n) {
      cnt[asg[n]] += 1;
      add_bits(x[n], ones.data() + 64 * asg[n]);
    }
    bool moved = false;
    for (int64_t c = 0; c < ce; ++c) {
      if (cnt[c] == 0) continue;  // an empty cluster keeps its centroid
      uint64_t code = 0;
      for (int64_t b = 0; b < bits; ++b)
        code |= static_cast<uint64_t>(2 * ones[64 * c + b] > cnt[c]) << b;  // strict majority
      moved |= code != cent[c];
      cent[c] = code;
    }
    // No centroid moved: every later iteration repeats this one exactly (the same
    // assignments, the same majorities), so stopping gives the reference's result.
    if (!moved) break;
  }
  for (int64_t n = 0; n < L; ++n) {
    const int32_t a = nearest_centroid(x[n], cent.data(), ce);
    assign_out[n] = a;
    counts_out[a] += 1;
  }
}

std::tuple<at::Tensor, at::Tensor> hamming_kmeans(const at::Tensor& codes,
                                                  const std::optional<at::Tensor>& lengths,
                                                  int64_t clusters, int64_t iterations,
                                                  int64_t bits) {
  check_cpu(codes, "hamming_kmeans", "codes");
  TORCH_CHECK(codes.dim() == 3 && codes.scalar_type() == at::kLong,
              "fastasr_cpu.hamming_kmeans: codes must be (B, H, N) int64, got ", codes.sizes(), " ",
              codes.scalar_type());
  TORCH_CHECK(clusters >= 1, "fastasr_cpu.hamming_kmeans: clusters=", clusters, "; expected >= 1");
  TORCH_CHECK(iterations >= 0, "fastasr_cpu.hamming_kmeans: iterations=", iterations,
              "; expected >= 0");
  TORCH_CHECK(bits >= 1 && bits < 64, "fastasr_cpu.hamming_kmeans: ", bits,
              " bits do not fit a code");
  const int64_t B = codes.size(0), H = codes.size(1), N = codes.size(2), C = clusters;
  const at::Tensor cc = codes.contiguous();
  const at::Tensor lens = lengths_tensor(lengths, B);
  const int64_t* lp = lengths_ptr(lens);
  at::Tensor assign = at::full({B, H, N}, -1, codes.options());
  at::Tensor counts = at::zeros({B, H, C}, codes.options());
  const int64_t* cp = cc.data_ptr<int64_t>();
  int64_t* ap = assign.data_ptr<int64_t>();
  int64_t* np = counts.data_ptr<int64_t>();
  parallel_items(B * H, [&](const auto& take) {
    for (int64_t bh; take(bh);) {
      const int64_t L = length_of(lp, bh / H, N);
      if (L > 0) kmeans_sequence(cp + bh * N, L, C, iterations, bits, ap + bh * N, np + bh * C);
    }
  });
  return {assign, counts};
}

// How many distinct threads parallel_items hands `items` items to (each item waits a
// moment, so that every thread of the region gets one): torch.get_num_threads() when the
// library's parallel regions work, 1 when they silently run serially.
int64_t worker_threads(int64_t items) {
  std::vector<std::atomic<int>> seen(std::max(at::get_num_threads(), 1));
  parallel_items(items, [&](const auto& take) {
    for (int64_t i; take(i);) {
      const int t = at::get_thread_num();
      if (t >= 0 && t < static_cast<int>(seen.size())) seen[t].store(1);
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
      while (std::chrono::steady_clock::now() < until) {
      }
    }
  });
  int64_t n = 0;
  for (const auto& s : seen) n += s.load();
  return n;
}

}  // namespace
}  // namespace fastasr_cpu

TORCH_LIBRARY(fastasr_cpu, m) {
  m.def("worker_threads(int items) -> int", &fastasr_cpu::worker_threads);
  m.def("hash_codes(Tensor x, Tensor planes, Tensor? lengths) -> Tensor",
        &fastasr_cpu::hash_codes);
  m.def("hamming_kmeans(Tensor codes, Tensor? lengths, int clusters, int iterations, int bits)"
        " -> (Tensor, Tensor)",
        &fastasr_cpu::hamming_kmeans);
}
