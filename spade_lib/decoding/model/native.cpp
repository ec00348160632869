// Decoding on the CPU, streamed at the machine's read bandwidth (spade_lib.decoding.native).
//
// linear:  Y[r] = s_r * (W u_r) + b + R[r] for each of k rows,
//          u_r = x_r (or g * x_r with a gain g), or u_r = silu(x_r[:K]) * x_r[K:] if gated (a gated MLP's input);
//          s_r = 1 / sqrt(mean(x_r^2) + eps) if eps >= 0 (an RMSNorm; mean over u_r when gated), else 1
// attend:  k new tokens' attention over a KV cache, rotary embedding and cache write included, under the
//          causal mask or a draft tree's ancestor mask, optionally within a sliding window and with each
//          query and key head RMS-normed first (QK-norm: x g / sqrt(mean(x^2) + eps))
//
// One summation order for every output, whatever k is: acc = sum over the L-float chunks of K, in order, of
// w[c] * u[c] (one FMA chain; L = 16 in a build for AVX-512, 8 for AVX2), then a fixed horizontal sum of its L
// lanes, then the K % L tail in order. A row's result is therefore the same bit for bit whether it is
// computed alone (an autoregressive step) or among k rows (a verification block, a tree level): verification
// sees exactly the logits the autoregressive loop would compute, so greedy speculative decoding reproduces
// greedy decoding exactly. The attention's scores follow the same rule (per key: one chain of L-float chunks, a
// fixed tree over its lanes, the tail; scores, below), its normaliser too (L-lane partial sums, then the tail).
//
// Narrow weights (a draft held in fewer bytes, spade_lib.zoo.narrow): W in bf16, or int8 with one fp32 scale per
// weight row (W[n] = scale[n] * W8[n]: Y[r][n] = s_r * (scale[n] * (W8[n] u_r)) + ...), row-major; each weight is
// widened to fp32 exactly and summed in the same canonical order.
// W is [N, K] fp32 and contiguous, row-major or packed (pack(): each group of four rows interleaved chunk by
// chunk, so a tile reads one sequential stream); each thread of torch's pool (at::parallel_for) reads one
// contiguous block of whole groups front to back.
// Each weight row is read from memory once for all k rows: a tile of NW weight rows x RB input rows keeps
// NW * RB accumulators in registers (one row: NW = 4, four independent chains; more rows: NW = 4 for up to
// RB_WIDE rows, else NW = NW_MANY with RB <= RB_MAX, as the build's registers allow), input rows beyond RB reuse
// the tile's weight rows from L1 in balanced tiles (AVX2, 7 rows: 4 + 3). A tile keeps either its weight chunks or
// its input chunks in registers beside the accumulators, whichever fits (AVX2's 16 registers hold 4 x 3
// accumulators with the three input chunks, not with the four weight chunks). Bandwidth-bound up to k ~ 6-10
// on two cores; compute-bound beyond (2 flops per weight and row), where AVX-512's wider FMAs help.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t PREFETCH = 2048;       // floats ahead in each row-major weight row's stream (into L1)
constexpr int64_t PREFETCH_PACKED = 8192;  // floats (32 KiB) ahead in a packed group's stream (into L2)
constexpr int64_t PREFETCH_ROWS = 3;        // input rows from which a packed tile prefetches
constexpr int64_t PREFETCH_NEAR = 2048;    // floats (8 KiB) ahead in a blocked group's stream (into L1): BLOCK_CHUNKS

inline float hsum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 sh = _mm_movehdup_ps(lo);
  __m128 s = _mm_add_ps(lo, sh);
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehl_ps(sh, s)));
}

// The canonical dot product (see the header): one chain over the 8-float chunks, hsum, scalar tail.
inline float dot(const float* w, const float* x, int64_t K) {
  __m256 a = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a);
  float r = hsum(a);
  for (; k < K; ++k) r += w[k] * x[k];
  return r;
}

// dot(k_i, x, K) for four vectors k_0..k_3 at once: four independent chains (a lone chain waits on the FMA
// latency), each in the canonical order, so each result equals dot(k_i, x, K) bit for bit.
inline void dot4(const float* k0, const float* k1, const float* k2, const float* k3, const float* x, int64_t K,
                 float* out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    const __m256 xv = _mm256_loadu_ps(x + k);
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(k0 + k), xv, a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(k1 + k), xv, a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(k2 + k), xv, a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(k3 + k), xv, a3);
  }
  float r0 = hsum(a0), r1 = hsum(a1), r2 = hsum(a2), r3 = hsum(a3);
  for (; k < K; ++k) {
    r0 += k0[k] * x[k];
    r1 += k1[k] * x[k];
    r2 += k2[k] * x[k];
    r3 += k3[k] * x[k];
  }
  out[0] = r0, out[1] = r1, out[2] = r2, out[3] = r3;
}

// exp(x) for 8 lanes (Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-5 polynomial for e^r, 2^n by the
// exponent bits; ~1 ulp on [-87, 88], 0 below). Each lane's result depends on that lane only, so the tail of
// a score row (padded) gets exactly the values a longer row would.
inline __m256 exp8(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-88.3762626647949f);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  __m256 fx = _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(0.693359375f)));
  x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(-2.12194440e-4f)));
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(y, z), x), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(underflow, y);
}

// The products' vectors: 16 floats where the build targets AVX-512 (native.py compiles with -mavx512f on a
// CPU that has it), else 8 (AVX2). One build uses one width for every product, so the canonical order of
// the header holds within it (chunks of L floats, one FMA chain, a fixed horizontal sum, the K % L tail);
// the two builds differ in summation order only (fp32 rounding, ~1e-7 relative).
#ifdef __AVX512F__
using vec = __m512;
constexpr int L = 16;
constexpr int REGS = 32;
constexpr int RB_MAX = 6;    // input rows a tile takes
constexpr int NW_MANY = 4;   // 32 registers: 4 weight rows x 6 input rows = 24 accumulators
// Rows for which four weight rows are tiled at once, in one pass over the weights: up to 9 on AVX-512, where the 28-36
// accumulators of 7-9 rows exceed the registers (the compiler keeps the input chunks as memory operands or spills),
// yet the one pass beats two blocked tiles (below): Qwen2.5-Coder-1.5B-shaped products (8 layers, 1.5 GB, row-major)
// on a 2-core Xeon (family 6 model 207), 7 rounds in turns, r(k) over the kernel's one row at 7 / 8 / 9 rows: 1.20 /
// 1.22 / 1.23 blocked, 1.12 / 1.15 / 1.18 in one pass (three weight rows a pass: 1.17 / 1.19 / 1.20).
constexpr int RB_WIDE = 9;
// Row-major weights with 10 to 18 rows (two or three tiles of up to six input rows): the tiles take turns over
// blocks of BLOCK_CHUNKS chunks, the first prefetching every weight row's stream (see the AVX2 build). The products
// of Qwen2.5-Coder-1.5B-shaped matrices (5.2 GB, row-major) on a 2-core Xeon (family 6 model 207, AVX-512), 3
// rounds in turns against whole passes: 0.95x the time at 7 rows, 0.96x at 9, 0.92x at 13, 0.91x at 17 (blocks of
// 8, 16 or 32 chunks within 3 % of each other); packed groups keep whole passes (not measured blocked here).
constexpr int BLOCK_CHUNKS = 8;
constexpr int BLOCK_TILES = 3;
constexpr bool BLOCK_PACKED = false;  // packed groups: whole passes
constexpr bool NEAR_EVERY_ROW = true;  // a row-major block's first tile prefetches all NW weight rows' streams
// A row-major tile of several input rows prefetches the next tile's weight rows (the same column, into L2) instead of
// its own rows' streams 2048 floats ahead into L1: the tile's block is one contiguous region, and with 1536-float
// rows "2048 ahead" lands in the tile's own next row. Qwen2.5-Coder-1.5B-shaped products (12 layers, 2.2 GB,
// row-major) on a 2-core Xeon (family 6 model 207), 5 rounds in turns, r(k) over one row at 2 / 3 / 5 / 6 rows:
// 1.05 / 1.10 / 1.15 / 1.20 before, 1.02 / 1.04 / 1.09 / 1.11 so (offsets of 0, 256, 1024 floats within 1 %;
// one row kept its own streams then: the next tile's cost it 2 %; see PREFETCH_OWN). The blocked groups (7 to 18 rows) likewise, their
// first tile of a block prefetching the next group's rows into L2 instead of its own 2048 floats ahead into L1, 3
// rounds: r = 1.31 / 1.34 / 1.47 / 1.62 at 7 / 9 / 13 / 17 rows before, 1.18 / 1.22 / 1.31 / 1.41 so (into L1: 1.20 /
// 1.22 / 1.31 / 1.41). Not measured on an AVX2 host, which keeps its rules.
constexpr bool PREFETCH_NEXT_TILE = true;
// Beside it, a row-major tile of one pass (one input row included, which then prefetches the next tile's rows too)
// prefetches its own weight rows PREFETCH_OWN floats ahead into L1, from the L2 the previous tile filled: the same
// 1.5 GB of products, 5 rounds in turns, time over the kernel's one row before at 1 / 5 / 6 / 7 / 9 rows: 0.94 / 0.99 /
// 1.00 / 1.03 / 1.12 against 1.00 / 1.08 / 1.09 / 1.13 / 1.16 (128 / 512 / 1024 floats ahead within 1-3 % of 256;
// into L2 instead: slower than before); the 1.5B's forward, two A/B pairs: 174 against 186 ms a row, 190 against 200
// at 5 rows, 212 / 215 at 7. The blocked groups (10 to 18 rows) keep their rule (with it: r(13) 1.36 -> 1.46).
constexpr int64_t PREFETCH_OWN = 256;
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
// L bf16 values widened to fp32 exactly (a bf16 is the high half of an fp32): zero-extend, shift left 16
inline vec vload_w(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
// L int8 values widened to fp32 exactly: sign-extend to int32, convert
inline vec vload_w(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline vec vadd(vec a, vec b) { return _mm512_add_ps(a, b); }
inline float vsum(vec v) {  // fixed order: the two 8-lane halves added, then hsum
  return hsum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}
#else
using vec = __m256;
constexpr int L = 8;
constexpr int REGS = 16;
// 16 registers: 4 weight rows x 3 input rows = 12 accumulators, the three input chunks and one weight chunk (in L1
// on a Zen 3 core such a tile ran at 81-90 GFLOP/s, two weight rows x six input rows, the rule before, at 62; the
// summation order is the same, so are the results)
constexpr int RB_MAX = 3;
constexpr int NW_MANY = 4;
constexpr int RB_WIDE = 3;
// Three tiles of a packed group (7 to 9 rows) take turns over blocks of BLOCK_CHUNKS chunks instead of one whole
// pass each, so the memory stream advances steadily while the later tiles compute from L1 (whole passes left the
// memory idle during them); the first tile of a block prefetches PREFETCH_NEAR ahead. Two tiles (4 to 6 rows) ran
// no faster blocked, six (17 rows) slower (the accumulators' loads and stores), so they take whole passes. Paired in
// turns against the rule before (two weight rows x six input rows, whole passes), the products of a SmolLM2-shaped
// forward on a 2-core Zen 3 EPYC (AVX2, 15 rounds, the host's noise about +-5 %): 0.94x the time at 5 rows, 0.85x
// at 7, 0.83x at 9, 0.93x at 17; 1.02x / 1.00x at 1 / 3 rows (the same tiles)
constexpr int BLOCK_CHUNKS = 12;
constexpr int BLOCK_TILES = 3;
constexpr bool BLOCK_PACKED = true;
constexpr bool NEAR_EVERY_ROW = false;  // as measured: the first weight row's stream only (row-major blocks)
constexpr bool PREFETCH_NEXT_TILE = false;  // the AVX-512 build's rule, not measured here
constexpr int64_t PREFETCH_OWN = 0;
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline vec vload_w(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
inline vec vload_w(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline vec vadd(vec a, vec b) { return _mm256_add_ps(a, b); }
inline float vsum(vec v) { return hsum(v); }
#endif

#ifdef __AVX512F__
// The sums of four keys' accumulators in one fixed tree over each one's 16 lanes (the same for every key: a
// missing key's zero accumulator never meets a real key's lanes): (l0 + l2) + (l1 + l3) within each 128-bit
// chunk c, then (c0 + c2) + (c1 + c3).
inline __m128 sum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  const __m512 u = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))),
                                 _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(u),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(u), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}
#endif

// The attention's scores q . k_i for m <= 8 keys at once, in the build's canonical order. AVX-512: one chain
// of 16-float chunks per key (eight independent chains for a full group), sum4 over its lanes, then the
// hd % 16 tail in order. AVX2: dot4 / dot (8-float chunks).
inline void scores(const float* const* ks, int m, const float* x, int64_t hd, float* out) {
#ifdef __AVX512F__
  __m512 a[8];
  for (int i = 0; i < 8; ++i) a[i] = _mm512_setzero_ps();
  int64_t d = 0;
  if (m == 8) {
    for (; d + 16 <= hd; d += 16) {
      const __m512 xv = _mm512_loadu_ps(x + d);
      for (int i = 0; i < 8; ++i) a[i] = _mm512_fmadd_ps(_mm512_loadu_ps(ks[i] + d), xv, a[i]);
    }
  } else {
    for (; d + 16 <= hd; d += 16) {
      const __m512 xv = _mm512_loadu_ps(x + d);
      for (int i = 0; i < m; ++i) a[i] = _mm512_fmadd_ps(_mm512_loadu_ps(ks[i] + d), xv, a[i]);
    }
  }
  float r[8];
  _mm_storeu_ps(r, sum4(a[0], a[1], a[2], a[3]));
  if (m > 4) _mm_storeu_ps(r + 4, sum4(a[4], a[5], a[6], a[7]));
  for (int i = 0; i < m; ++i) {
    float v = r[i];
    for (int64_t e = d; e < hd; ++e) v += ks[i][e] * x[e];
    out[i] = v;
  }
#else
  int i = 0;
  for (; i + 4 <= m; i += 4) dot4(ks[i], ks[i + 1], ks[i + 2], ks[i + 3], x, hd, out + i);
  for (; i < m; ++i) out[i] = dot(ks[i], x, hd);
#endif
}

// Where a tile's weights are: the chunk of L floats of weight row i at column c L is at w + i rs + c cs, its
// tail (the K % L columns from Kf = K - K % L) at tail + i ts. Row-major W: rs = K, cs = L, tail = w + Kf,
// ts = K. A group of GROUP rows packed (pack()): rs = L, cs = GROUP L, so a tile of the group's rows reads one
// sequential stream (on AMD EPYC Zen 4 one core read four interleaved row streams at ~14 GB/s, one stream at
// ~22-25 GB/s), and the order each output is summed in is the same.
struct Rows {
  const float* w;
  int64_t rs, cs;
  const float* tail;
  int64_t ts;
  bool packed;    // a packed group (one stream), else row-major rows (one stream each)
  bool prefetch;  // packed: whether the tile prefetches its stream (PREFETCH_ROWS input rows or more)
};

constexpr int GROUP = 4;  // rows per packed group (the widest tile); rows past the last whole group stay row-major
// One input row on row-major weights (held in place) with rows shorter than short_row floats (linear's argument;
// native.SHORT_ROW for the "native_rows" kernel, 0 for "native_rows_wide"): one weight row a tile, so a thread's
// block is read as one sequential stream, as a packed group is (four rows a tile read four short streams). Which
// is faster depends on the host, so the kernel plan times both (spade_lib.decoding.model.kernels). One row over the
// 120 matrices of a SmolLM2-shaped forward (0.42 GB, K = 576 / 1536), 2-core Zen 3 EPYC (AVX2): four rows a tile
// 16-21 % slower than packed, one row a tile within the host's noise of it; over Qwen2.5-Coder-1.5B-shaped matrices
// (K = 1536 / 8960) one row a tile was 7-10 % slower than four. Over the 97 matrices of Qwen2.5-Coder-0.5B with a
// 32 k-token head (1.55 GB, K = 896 / 4864) on a 2-core Xeon (family 6 model 207, AVX-512), 7 rounds in turns:
// 48.1 ms one row a tile, 45.4 ms four (32.2 and 34.1 GB/s). Each output is summed in the canonical order either
// way: the same results.

// Rows n .. of W [N, K] (packed or not); a tile of packed rows stays within one group (the callers' tiles start
// at multiples of their width, which divides GROUP).
inline Rows rows_at(const float* w, int64_t N, int64_t K, bool packed, int64_t n, bool prefetch) {
  const int64_t kf = K - K % L;
  if (!packed || n >= N - N % GROUP) return {w + n * K, K, L, w + n * K + kf, K, false, true};
  const float* g = w + (n / GROUP) * GROUP * K;
  const int64_t i = n % GROUP;
  return {g + i * L, L, GROUP * L, g + GROUP * kf + i * (K % L), K % L, true, prefetch};
}

// out[i * RB + j] = (weight row i) . xs[j] for NW weight rows and RB input rows, in the canonical order; the
// tile's weights are prefetched ahead: each row-major row's stream PREFETCH floats ahead into L1 (on an AVX-512
// build: the next tile's rows into L2, PREFETCH_NEXT_TILE, and its own PREFETCH_OWN ahead into L1), a packed group's
// one stream PREFETCH_PACKED floats (32 KiB) ahead into L2 when there are PREFETCH_ROWS input rows or more. The far
// L2 prefetch lets a tile that computes for a while on each chunk (several input rows) keep the memory busy; with
// one or two rows the hardware prefetcher alone streams faster. On a 2-core Zen 4 EPYC, the 121 products of a
// SmolLM2-shaped forward (538 MB) timed in 11 rounds in turns against the earlier rule (2048 floats ahead into L1,
// only where the rows take several passes): 0.99x / 0.99x the time at 1 / 2 rows, 0.94x at 3, 0.75x at 5, 0.70x
// at 9, 0.80x at 17 (prefetching at every row count: 1.15x / 1.08x at 1 / 2 rows; the L1 hint gained nothing);
// an embedded-target-shaped forward (49 MB, partly in the 32 MiB L3): 1.00x / 0.95x / 0.89x / 0.81x / 0.79x /
// 0.84x at 1 / 2 / 3 / 5 / 9 / 17 rows.
// One chunk (columns k .. k + L) of a tile: acc[i][j] += w_i[chunk] * x_j[chunk], one FMA per output. The chunks
// that stay in registers beside the accumulators: the weights' (NW) unless only the inputs' (RB) fit.
template <int NW, int RB>
inline void step(const float* w, int64_t rs, const float* const* xs, int64_t k, vec (&acc)[NW][RB]) {
  static_assert(NW * RB + std::min(NW, RB) + 1 <= REGS || (NW == 4 && RB <= RB_WIDE),
                "tile: accumulators and chunks exceed the registers (beyond the one-pass tiles measured, RB_WIDE)");
  if constexpr (NW * RB + NW + 1 > REGS) {
    vec xv[RB];
    for (int j = 0; j < RB; ++j) xv[j] = vload(xs[j] + k);
    for (int i = 0; i < NW; ++i) {
      const vec wv = vload(w + i * rs);
      for (int j = 0; j < RB; ++j) acc[i][j] = vfma(wv, xv[j], acc[i][j]);
    }
  } else {
    vec wv[NW];
    for (int i = 0; i < NW; ++i) wv[i] = vload(w + i * rs);
    for (int j = 0; j < RB; ++j) {
      const vec xv = vload(xs[j] + k);
      for (int i = 0; i < NW; ++i) acc[i][j] = vfma(wv[i], xv, acc[i][j]);
    }
  }
}

// out[i * RB + j]: the accumulators' lanes summed (vsum), then the K % L tail in order from column kf.
template <int NW, int RB>
inline void finish(const Rows& W, int64_t kf, int64_t K, const float* const* xs, const vec* acc, float* out) {
  for (int i = 0; i < NW; ++i)
    for (int j = 0; j < RB; ++j) {
      float r = vsum(acc[i * RB + j]);
      for (int64_t t = kf; t < K; ++t) r += W.tail[i * W.ts + (t - kf)] * xs[j][t];
      out[i * RB + j] = r;
    }
}

template <int NW, int RB>
inline void tile(const Rows& W, int64_t K, const float* const* xs, float* out) {
  vec acc[NW][RB];
  for (int i = 0; i < NW; ++i)
    for (int j = 0; j < RB; ++j) acc[i][j] = vzero();
  const float* w = W.w;
  int64_t k = 0;
  // one chunk an iteration (unrolling by two ran four weight rows x five input rows ~15 % slower on a Zen 4 EPYC)
  for (; k + L <= K; k += L, w += W.cs) {
    if (W.packed) {
      if (W.prefetch)
        for (int64_t h = 0; h < W.cs; h += 16)
          _mm_prefetch(reinterpret_cast<const char*>(w + h + PREFETCH_PACKED), _MM_HINT_T1);
    } else if (PREFETCH_NEXT_TILE && (RB > 1 || PREFETCH_OWN > 0)) {  // the next tile's rows into L2, its own into L1
      for (int i = 0; i < NW; ++i) _mm_prefetch(reinterpret_cast<const char*>(w + (i + NW) * W.rs), _MM_HINT_T1);
      if constexpr (PREFETCH_OWN > 0)
        for (int i = 0; i < NW; ++i) _mm_prefetch(reinterpret_cast<const char*>(w + i * W.rs + PREFETCH_OWN), _MM_HINT_T0);
    } else if (k % 16 == 0) {
      for (int i = 0; i < NW; ++i)
        _mm_prefetch(reinterpret_cast<const char*>(w + i * W.rs + PREFETCH), _MM_HINT_T0);
    }
    step<NW, RB>(w, W.rs, xs, k, acc);
  }
  finish<NW, RB>(W, k, K, xs, &acc[0][0], out);
}

// The chunks c0 .. c1 - 1 of a packed tile, its accumulators read from and written back to accm [NW * RB] (a blocked
// group: see BLOCK_CHUNKS); near: prefetch PREFETCH_NEAR floats ahead (the first tile of a block).
template <int NW, int RB>
inline void tile_span(const Rows& W, int64_t c0, int64_t c1, const float* const* xs, vec* accm, bool near) {
  vec acc[NW][RB];
  for (int i = 0; i < NW; ++i)
    for (int j = 0; j < RB; ++j) acc[i][j] = accm[i * RB + j];
  const float* w = W.w + c0 * W.cs;
  for (int64_t c = c0; c < c1; ++c, w += W.cs) {
    if (near && (W.packed || !NEAR_EVERY_ROW)) {
      for (int64_t h = 0; h < W.cs; h += 16) _mm_prefetch(reinterpret_cast<const char*>(w + h + PREFETCH_NEAR), _MM_HINT_T0);
    } else if (near && PREFETCH_NEXT_TILE) {  // the next group's rows, this column, into L2 (see the constant)
      for (int i = 0; i < NW; ++i) _mm_prefetch(reinterpret_cast<const char*>(w + (i + NW) * W.rs), _MM_HINT_T1);
    } else if (near) {
      for (int i = 0; i < NW; ++i) _mm_prefetch(reinterpret_cast<const char*>(w + i * W.rs + PREFETCH_NEAR), _MM_HINT_T0);
    }
    step<NW, RB>(w, W.rs, xs, c * L, acc);
  }
  for (int i = 0; i < NW; ++i)
    for (int j = 0; j < RB; ++j) accm[i * RB + j] = acc[i][j];
}

// tile_span / finish of NW_MANY weight rows for a run-time rb of 1 .. RB_MAX (3 on AVX2, 6 on AVX-512): CALL(R) is
// the call for R rows, so each function's switch is written once (a generic lambda in its place ran r(13) and r(17)
// 1.5x slower on the Xeon: not inlined into the blocked loop)
#ifdef __AVX512F__
#define FOR_RB(rb, CALL) \
  switch (rb) { case 1: CALL(1); break; case 2: CALL(2); break; case 3: CALL(3); break; case 4: CALL(4); break; \
                case 5: CALL(5); break; default: CALL(6); break; }
#else
#define FOR_RB(rb, CALL) switch (rb) { case 1: CALL(1); break; case 2: CALL(2); break; default: CALL(3); break; }
#endif
inline void span_rows(const Rows& W, int64_t c0, int64_t c1, const float* const* xs, int rb, vec* accm, bool near) {
#define SPAN(R) tile_span<NW_MANY, R>(W, c0, c1, xs, accm, near)
  FOR_RB(rb, SPAN)
#undef SPAN
}
inline void finish_rows(const Rows& W, int64_t kf, int64_t K, const float* const* xs, int rb, const vec* accm, float* out) {
#define FINISH(R) finish<NW_MANY, R>(W, kf, K, xs, accm, out)
  FOR_RB(rb, FINISH)
#undef FINISH
}

// tile<NW, rb> for a run-time rb of 1 .. RB_MAX (NW = 4: up to RB_WIDE rows).
template <int NW>
inline void tile_rows(const Rows& w, int64_t K, const float* const* xs, int rb, float* out) {
  constexpr int top = NW == 4 ? RB_WIDE : RB_MAX;
  switch (std::min(rb, top)) {
    case 1: tile<NW, 1>(w, K, xs, out); break;
    case 2: tile<NW, 2>(w, K, xs, out); break;
    case 3: tile<NW, 3>(w, K, xs, out); break;
    case 4: if constexpr (top >= 4) { tile<NW, 4>(w, K, xs, out); break; } [[fallthrough]];
    case 5: if constexpr (top >= 5) { tile<NW, 5>(w, K, xs, out); break; } [[fallthrough]];
    case 6: if constexpr (top >= 6) { tile<NW, 6>(w, K, xs, out); break; } [[fallthrough]];
    case 7: if constexpr (top >= 7) { tile<NW, 7>(w, K, xs, out); break; } [[fallthrough]];
    case 8: if constexpr (top >= 8) { tile<NW, 8>(w, K, xs, out); break; } [[fallthrough]];
    default: tile<NW, top>(w, K, xs, out); break;
  }
}

// tile_rows for nw = 1 .. NW_MANY weight rows (the end of a thread's block).
inline void tile_any(int nw, const Rows& w, int64_t K, const float* const* xs, int rb, float* out) {
  switch (nw) {
    case 1: tile_rows<1>(w, K, xs, rb, out); break;
    case 2: tile_rows<2>(w, K, xs, rb, out); break;
    case 3: if constexpr (NW_MANY >= 3) { tile_rows<3>(w, K, xs, rb, out); break; } [[fallthrough]];
    default: tile_rows<NW_MANY>(w, K, xs, rb, out); break;
  }
}

// Row-major weights with RB_WIDE < rows <= TWO_ROWS_MAX (a verification block of gamma = 3 .. 5 on an AVX2 build):
// tiles of two weight rows x every input row (2 x 6 accumulators, the two weight chunks and one input chunk fit the
// 16 registers) read the weights in one pass of two row streams, where tiles of four weight rows x three input
// rows take two passes over four streams (the second from the caches while the memory idles). In-place weights of
// a model far beyond the last-level cache (Qwen2.5-Coder-1.5B's 6.2 GB on a 2-core Zen 3, r(k) over one row in
// turns, 6 rounds): r = 1.15 / 1.16 / 1.21 at 4 / 5 / 6 rows, against 1.34 / 1.46 / 1.60 before. Tiles of one weight
// row x 7-12 input rows (one pass too) were slower than the blocked groups below (1.58 against 1.33 at 7 rows). The
// order each output is summed in is the canonical one, so the results are those of any other tile.
#ifdef __AVX512F__
constexpr int TWO_ROWS_MAX = 0;  // RB_WIDE = 6 covers these rows with four weight rows a tile
inline void tile_two(const Rows&, int64_t, const float* const*, int, float*) {}
#else
constexpr int TWO_ROWS_MAX = 6;
inline void tile_two(const Rows& w, int64_t K, const float* const* xs, int rb, float* out) {
  switch (rb) {
    case 4: tile<2, 4>(w, K, xs, out); break;
    case 5: tile<2, 5>(w, K, xs, out); break;
    default: tile<2, 6>(w, K, xs, out); break;
  }
}
#endif

// Narrow weights (bf16 as uint16_t, or int8; a draft's weights in fewer bytes, spade_lib.zoo.narrow):
// out[i * RB + j] = (weight row i, widened to fp32 exactly) . xs[j] for NW row-major weight rows, in the
// canonical order of the header (one FMA chain over the L-float chunks, vsum, the K % L tail), so a row's result
// does not depend on the rows beside it here either (an int8 row's scale is applied to the sum, by the caller).
constexpr int NARROW_NW = 4;
constexpr int NARROW_RB = REGS >= 32 ? 4 : 2;  // input rows a tile takes: 4 x 4 (AVX-512) or 4 x 2 (AVX2) accumulators
// bytes (16 KiB) ahead in each weight row's stream, into L1: the products of Qwen2.5-Coder-0.5B-shaped bf16
// matrices, one row, on a 2-core Xeon (family 6 model 207): 21.9 GB/s without, 28.6 / 29.5 / 30.3 / 29.8 GB/s at
// 4 / 8 / 16 / 32 KiB ahead
constexpr int64_t PREFETCH_NARROW = 16384;
// On an AVX-512 build that far prefetch goes into L2 and a near one, NARROW_NEAR bytes ahead, into L1 (as PREFETCH_OWN
// for fp32 tiles): the products of the 0.5B draft's matrices (24 layers and its 32 k-token head), one row, 7 rounds in
// turns, 2-core Xeon (family 6 model 207): int8 16.0-16.1 ms -> 14.2 ms (24.1 -> 27.3 GB/s; near 1 KiB or far 32 KiB
// within 2-4 %), bf16 33.1 -> 31.3 ms; an AVX2 build keeps the far prefetch into L1 (not measured there).
constexpr int64_t NARROW_NEAR = REGS >= 32 ? 2048 : 0;
inline float narrow_value(uint16_t b) {  // a bf16 is the high half of an fp32
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline float narrow_value(int8_t b) { return static_cast<float>(b); }

template <typename T, int NW, int RB>
inline void tile_narrow(const T* w, int64_t K, const float* const* xs, float* out) {
  constexpr int64_t ahead = PREFETCH_NARROW / sizeof(T), line = 64 / sizeof(T);
  vec acc[NW][RB];
  for (int i = 0; i < NW; ++i)
    for (int j = 0; j < RB; ++j) acc[i][j] = vzero();
  int64_t k = 0;
  for (; k + L <= K; k += L) {
    if (k % line < L)  // once a cache line of each row's stream
      for (int i = 0; i < NW; ++i) {
        const T* r = w + i * K + k;
        if constexpr (NARROW_NEAR > 0) {
          _mm_prefetch(reinterpret_cast<const char*>(r + ahead), _MM_HINT_T1);
          _mm_prefetch(reinterpret_cast<const char*>(r + NARROW_NEAR / sizeof(T)), _MM_HINT_T0);
        } else {
          _mm_prefetch(reinterpret_cast<const char*>(r + ahead), _MM_HINT_T0);
        }
      }
    vec wv[NW];
    for (int i = 0; i < NW; ++i) wv[i] = vload_w(w + i * K + k);
    for (int j = 0; j < RB; ++j) {
      const vec xv = vload(xs[j] + k);
      for (int i = 0; i < NW; ++i) acc[i][j] = vfma(wv[i], xv, acc[i][j]);
    }
  }
  for (int i = 0; i < NW; ++i)
    for (int j = 0; j < RB; ++j) {
      float r = vsum(acc[i][j]);
      for (int64_t t = k; t < K; ++t) r += narrow_value(w[i * K + t]) * xs[j][t];
      out[i * RB + j] = r;
    }
}

template <typename T, int NW>
inline void tile_narrow_any(int rb, const T* w, int64_t K, const float* const* xs, float* out) {
  switch (rb) {
    case 1: tile_narrow<T, NW, 1>(w, K, xs, out); break;
    case 2: tile_narrow<T, NW, 2>(w, K, xs, out); break;
    case 3: tile_narrow<T, NW, std::min(3, NARROW_RB)>(w, K, xs, out); break;
    default: tile_narrow<T, NW, NARROW_RB>(w, K, xs, out); break;
  }
}

// Each thread a block of weight rows, NARROW_NW at a time, the input rows NARROW_RB at a time; emit(n, r, sum).
template <typename T, typename Emit>
void narrow_product(const T* wb, int64_t N, int64_t K, int64_t rows, const std::vector<const float*>& xs,
                    int64_t grain, const Emit& emit) {
  at::parallel_for(0, N, std::max<int64_t>(1, grain), [&](int64_t n0, int64_t n1) {
    float out[NARROW_NW * NARROW_RB];
    for (int64_t r0 = 0; r0 < rows; r0 += NARROW_RB) {
      const int rb = static_cast<int>(std::min<int64_t>(NARROW_RB, rows - r0));
      int64_t n = n0;
      for (; n + NARROW_NW <= n1; n += NARROW_NW) {
        tile_narrow_any<T, NARROW_NW>(rb, wb + n * K, K, xs.data() + r0, out);
        for (int i = 0; i < NARROW_NW; ++i)
          for (int j = 0; j < rb; ++j) emit(n + i, r0 + j, out[i * rb + j]);
      }
      for (; n < n1; ++n) {
        tile_narrow_any<T, 1>(rb, wb + n * K, K, xs.data() + r0, out);
        for (int j = 0; j < rb; ++j) emit(n, r0 + j, out[j]);
      }
    }
  });
}

void check(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous(),
              name, ": must be a contiguous float32 CPU tensor");
}

}  // namespace

torch::Tensor linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias,
                     c10::optional<torch::Tensor> residual, c10::optional<torch::Tensor> gain, double eps, bool gated,
                     int64_t grain, bool packed, c10::optional<torch::Tensor> scale, int64_t short_row) {
  check(x, "x");
  TORCH_CHECK(short_row >= 0, "short_row: must be >= 0 floats, got ", short_row);
  const bool bf16 = w.scalar_type() == torch::kBFloat16, int8 = w.scalar_type() == torch::kInt8;
  if (bf16 || int8) {
    TORCH_CHECK(w.device().is_cpu() && w.is_contiguous() && !packed,
                "w: ", bf16 ? "bfloat16" : "int8", " weights must be a contiguous row-major (not packed) CPU tensor");
  } else {
    check(w, "w");
  }
  TORCH_CHECK(int8 == scale.has_value(), "scale: int8 weights take one fp32 scale per weight row, other weights none");
  TORCH_CHECK(w.dim() == 2, "w: must be [N, K], got ", w.dim(), " dims");
  const int64_t N = w.size(0), K = w.size(1), width = gated ? 2 * K : K;
  TORCH_CHECK(x.numel() > 0 && x.numel() % width == 0, "x: must hold rows of ", width, " values, got ", x.numel(),
              " values");
  const int64_t rows = x.numel() / width;
  const float* bp = nullptr;
  const float* rp = nullptr;
  const float* gp = nullptr;
  const float* wsp = nullptr;
  if (int8) {
    check(*scale, "scale");
    TORCH_CHECK(scale->numel() == N, "scale: must hold ", N, " values (one per weight row), got ", scale->numel());
    wsp = scale->data_ptr<float>();
  }
  if (bias.has_value()) {
    check(*bias, "bias");
    TORCH_CHECK(bias->numel() == N, "bias: must hold ", N, " values, got ", bias->numel());
    bp = bias->data_ptr<float>();
  }
  if (residual.has_value()) {
    check(*residual, "residual");
    TORCH_CHECK(residual->numel() == rows * N, "residual: must hold ", rows, " x ", N, " values, got ",
                residual->numel());
    rp = residual->data_ptr<float>();
  }
  if (gain.has_value()) {
    check(*gain, "gain");
    TORCH_CHECK(!gated && gain->numel() == K, "gain: must hold ", K, " values (and the product not be gated)");
    gp = gain->data_ptr<float>();
  }
  const float* xp = x.data_ptr<float>();
  std::vector<float> u;
  if (gated || gp) {  // silu(g) * up with silu(g) = g / (1 + exp(-g)); or g * x
    u.resize(rows * K);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = xp + r * width;
      float* ur = u.data() + r * K;
      if (gated) {  // eight lanes at a time (exp8), the K % 8 tail with std::exp: the same per column whatever k is
        int64_t k = 0;
        const __m256 one = _mm256_set1_ps(1.0f);
        for (; k + 8 <= K; k += 8) {
          const __m256 g = _mm256_loadu_ps(xr + k);
          const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
          _mm256_storeu_ps(ur + k, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(xr + K + k)));
        }
        for (; k < K; ++k) ur[k] = xr[k] / (1.0f + std::exp(-xr[k])) * xr[K + k];
      } else {
        for (int64_t k = 0; k < K; ++k) ur[k] = xr[k] * gp[k];
      }
    }
  }
  const float* up = u.empty() ? xp : u.data();
  const float* sp = gated ? up : xp;  // the norm's statistic reads the product's input before any gain
  const int64_t sstride = gated ? K : width;
  std::vector<float> s(rows, 1.0f);
  if (eps >= 0) {  // the RMSNorm statistic in fp32, as torch's rms_norm computes it for fp32 inputs
    for (int64_t r = 0; r < rows; ++r) {
      float ss = 0.0f;
      const float* v = sp + r * sstride;
      for (int64_t k = 0; k < K; ++k) ss += v[k] * v[k];
      s[r] = 1.0f / std::sqrt(ss / static_cast<float>(K) + static_cast<float>(eps));
    }
  }
  std::vector<const float*> xs(rows);
  for (int64_t r = 0; r < rows; ++r) xs[r] = up + r * K;
  auto y = torch::empty({rows, N}, x.options());
  float* yp = y.data_ptr<float>();
  auto emit = [&](int64_t n, int64_t r, float d) {
    float v = d * s[r];
    if (bp) v += bp[n];
    if (rp) v += rp[r * N + n];
    yp[r * N + n] = v;
  };
  if (bf16) {
    narrow_product(reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()), N, K, rows, xs, grain, emit);
    return y;
  }
  if (int8) {
    narrow_product(w.data_ptr<int8_t>(), N, K, rows, xs, grain,
                   [&](int64_t n, int64_t r, float d) { emit(n, r, d * wsp[n]); });
    return y;
  }
  const float* wp = w.data_ptr<float>();
  const bool prefetch = rows >= PREFETCH_ROWS;
  // blocks of whole groups (GROUP rows), so every tile of a packed W lies within one group
  const int64_t groups = (N + GROUP - 1) / GROUP;
  at::parallel_for(0, groups, std::max<int64_t>(1, grain / GROUP), [&](int64_t g0, int64_t g1) {
    float out[std::max(NW_MANY * RB_MAX, 4 * RB_WIDE)];
    const int64_t begin = g0 * GROUP, end = std::min(N, g1 * GROUP);
    int64_t n = begin;
    if (rows == 1 && !packed && K < short_row) {
      for (; n < end; ++n) {
        tile<1, 1>(rows_at(wp, N, K, packed, n, prefetch), K, xs.data(), out);
        emit(n, 0, out[0]);
      }
      return;
    }
    if (rows == 1) {
      for (; n + 4 <= end; n += 4) {
        tile<4, 1>(rows_at(wp, N, K, packed, n, prefetch), K, xs.data(), out);
        for (int i = 0; i < 4; ++i) emit(n + i, 0, out[i]);
      }
      for (; n < end; ++n) {
        tile<1, 1>(rows_at(wp, N, K, packed, n, prefetch), K, xs.data(), out);
        emit(n, 0, out[0]);
      }
      return;
    }
    if (rows <= RB_WIDE) {  // four weight rows at once while their accumulators fit
      const int rb = static_cast<int>(rows);
      for (; n + 4 <= end; n += 4) {
        tile_rows<4>(rows_at(wp, N, K, packed, n, prefetch), K, xs.data(), rb, out);
        for (int i = 0; i < 4; ++i)
          for (int j = 0; j < rb; ++j) emit(n + i, j, out[i * rb + j]);
      }
    } else if (!packed && rows <= TWO_ROWS_MAX) {  // row-major weights: two weight rows x every input row, one pass
      const int rb = static_cast<int>(rows);
      for (; n + 2 <= end; n += 2) {
        tile_two(rows_at(wp, N, K, false, n, prefetch), K, xs.data(), rb, out);
        for (int i = 0; i < 2; ++i)
          for (int j = 0; j < rb; ++j) emit(n + i, j, out[i * rb + j]);
      }
    }
    // more rows: the fewest tiles of RB_MAX rows or fewer, balanced (7 = 4 + 3, not 6 + 1: a one-row tile has
    // NW FMA chains, latency-bound, and would cost nearly what the six-row one does)
    const int64_t n_tiles = (rows + RB_MAX - 1) / RB_MAX;
    // whole groups, blocked: a packed group's three tiles (AVX2: 7 to 9 rows), or row-major weights' two or three
    // (AVX2: 7 to 9 rows, AVX-512: 10 to 18; their later passes would re-read four row streams from the caches while
    // the memory idles)
    if (BLOCK_CHUNKS > 0 && (packed ? BLOCK_PACKED && n_tiles == BLOCK_TILES : n_tiles >= 2 && n_tiles <= BLOCK_TILES)) {
      static_assert(BLOCK_CHUNKS == 0 || (NW_MANY == GROUP && RB_MAX <= 6), "blocked groups: one tile per group");
      vec accm[NW_MANY * RB_MAX * (BLOCK_TILES > 0 ? BLOCK_TILES : 1)];
      int rbs[BLOCK_TILES > 0 ? BLOCK_TILES : 1];
      for (int64_t t = 0, r0 = 0; t < n_tiles; ++t) {
        rbs[t] = static_cast<int>((rows - r0 + n_tiles - t - 1) / (n_tiles - t));
        r0 += rbs[t];
      }
      const int64_t chunks = K / L, kf = chunks * L;
      for (; n + GROUP <= end && n + GROUP <= N - N % GROUP; n += GROUP) {
        const Rows at = rows_at(wp, N, K, packed, n, false);
        for (int64_t a = 0; a < NW_MANY * rows; ++a) accm[a] = vzero();
        for (int64_t c0 = 0; c0 < chunks; c0 += BLOCK_CHUNKS) {
          const int64_t c1 = std::min<int64_t>(chunks, c0 + BLOCK_CHUNKS);
          for (int64_t t = 0, r0 = 0; t < n_tiles; r0 += rbs[t], ++t)
            span_rows(at, c0, c1, xs.data() + r0, rbs[t], accm + NW_MANY * r0, t == 0);
        }
        for (int64_t t = 0, r0 = 0; t < n_tiles; r0 += rbs[t], ++t) {
          finish_rows(at, kf, K, xs.data() + r0, rbs[t], accm + NW_MANY * r0, out);
          for (int i = 0; i < NW_MANY; ++i)
            for (int j = 0; j < rbs[t]; ++j) emit(n + i, r0 + j, out[i * rbs[t] + j]);
        }
      }
    }
    for (; n < end; n += NW_MANY) {
      const int nw = static_cast<int>(std::min<int64_t>(NW_MANY, end - n));
      const Rows at = rows_at(wp, N, K, packed, n, prefetch);
      for (int64_t t = 0, r0 = 0; t < n_tiles; ++t) {
        const int rb = static_cast<int>((rows - r0 + n_tiles - t - 1) / (n_tiles - t));
        tile_any(nw, at, K, xs.data() + r0, rb, out);
        for (int i = 0; i < nw; ++i)
          for (int j = 0; j < rb; ++j) emit(n + i, r0 + j, out[i * rb + j]);
        r0 += rb;
      }
    }
  });
  return y;
}

// qkv [k, (H + 2 KV) * hd] (the fused projection of the k new tokens, queries pre-scaled by 1/sqrt(hd)), kv
// [2, KV, cap, hd] (keys, values), cos/sin [k, hd] (the rotation of each new token's position). Rotates the
// query and key heads (x cos + rotate_half(x) sin, rotate_half(x) = [-x2, x1]), writes new token i's key and
// value at cache slot start + i, and returns [k, H * hd]: per query head h of group j = h / (H / KV),
// softmax_t(q_h . K_j[t]) V_j[t] over the slots t that row i sees: t <= start + i (causal), or, with
// ancestors [k, M] (bool, M = start + k - tree_from), t < tree_from and tree_from + m for ancestors[i, m].
// window > 0 (a sliding-window layer): row i at position p_i (start + i, or tree_from - 1 + its depth) sees
// only the cached slots t > p_i - window (its own tree rows are nearer than the window: checked by the caller).
// q_gain, k_gain [hd] (QK-norm): every query and key head x becomes x g / sqrt(mean(x^2) + eps) before rotation.
// q_scale: each rotated query head is multiplied by it (1: the queries come scaled).
torch::Tensor attend(torch::Tensor qkv, torch::Tensor kv, int64_t start, torch::Tensor cos, torch::Tensor sin,
                     int64_t n_heads, int64_t tree_from, c10::optional<torch::Tensor> ancestors, int64_t window,
                     c10::optional<torch::Tensor> q_gain, c10::optional<torch::Tensor> k_gain, double eps,
                     double q_scale) {
  check(qkv, "qkv");
  check(kv, "kv");
  check(cos, "cos");
  check(sin, "sin");
  TORCH_CHECK(kv.dim() == 4 && kv.size(0) == 2, "kv: must be [2, KV, capacity, head_dim]");
  const int64_t KV = kv.size(1), cap = kv.size(2), hd = kv.size(3), H = n_heads, half = hd / 2;
  TORCH_CHECK(hd % 2 == 0 && H > 0 && H % KV == 0, "n_heads: must be a multiple of the KV heads, head_dim even");
  const int64_t width = (H + 2 * KV) * hd;
  TORCH_CHECK(qkv.numel() > 0 && qkv.numel() % width == 0, "qkv: must hold rows of (H + 2 KV) * head_dim = ",
              width, " values, got ", qkv.numel());
  const int64_t k = qkv.numel() / width, end = start + k;
  TORCH_CHECK(cos.numel() == k * hd && sin.numel() == k * hd, "cos, sin: must hold ", k, " x head_dim values");
  TORCH_CHECK(start >= 0 && end <= cap, "start: ", start, " + ", k, " new tokens must fit the capacity ", cap);
  const bool* anc = nullptr;
  int64_t M = 0;
  if (ancestors.has_value()) {
    TORCH_CHECK(ancestors->device().is_cpu() && ancestors->scalar_type() == torch::kBool && ancestors->is_contiguous()
                && ancestors->dim() == 2 && ancestors->size(0) == k, "ancestors: must be a contiguous bool [k, M] tensor");
    M = ancestors->size(1);
    TORCH_CHECK(tree_from >= 0 && tree_from + M == end, "tree_from: the tree's ", M, " rows must end at slot ", end,
                ", got tree_from ", tree_from);
    anc = ancestors->data_ptr<bool>();
  }
  TORCH_CHECK(q_gain.has_value() == k_gain.has_value(), "q_gain, k_gain: give both (QK-norm) or neither");
  const float* qg = nullptr;
  const float* kg = nullptr;
  if (q_gain.has_value()) {
    check(*q_gain, "q_gain");
    check(*k_gain, "k_gain");
    TORCH_CHECK(q_gain->numel() == hd && k_gain->numel() == hd, "q_gain, k_gain: must hold head_dim = ", hd, " values");
    qg = q_gain->data_ptr<float>();
    kg = k_gain->data_ptr<float>();
  }
  const float* q = qkv.data_ptr<float>();
  const float* c = cos.data_ptr<float>();
  const float* sn = sin.data_ptr<float>();
  float* keys = kv.data_ptr<float>();
  float* vals = keys + KV * cap * hd;
  // x (one head) QK-normed with gain g into tmp (nothing done without a gain), then rotated into out
  auto rope = [&](const float* x, const float* g, int64_t i, float* tmp, float* out) {
    if (g != nullptr) {
      float ss = 0.0f;
      for (int64_t d = 0; d < hd; ++d) ss += x[d] * x[d];
      const float s = 1.0f / std::sqrt(ss / static_cast<float>(hd) + static_cast<float>(eps));
      for (int64_t d = 0; d < hd; ++d) tmp[d] = x[d] * s * g[d];
      x = tmp;
    }
    const float* ci = c + i * hd;
    const float* si = sn + i * hd;
    for (int64_t d = 0; d < half; ++d) out[d] = x[d] * ci[d] - x[d + half] * si[d];
    for (int64_t d = half; d < hd; ++d) out[d] = x[d] * ci[d] + x[d - half] * si[d];
  };
  std::vector<float> normed(hd);
  for (int64_t i = 0; i < k; ++i) {
    const float* qi = q + i * width;
    for (int64_t j = 0; j < KV; ++j) {
      rope(qi + (H + j) * hd, kg, i, normed.data(), keys + (j * cap + start + i) * hd);
      std::copy(qi + (H + KV + j) * hd, qi + (H + KV + j + 1) * hd, vals + (j * cap + start + i) * hd);
    }
  }
  const int64_t g = H / KV;
  auto out = torch::empty({k, H * hd}, qkv.options());
  float* op = out.data_ptr<float>();
  at::parallel_for(0, H * k, 1, [&](int64_t b, int64_t e) {
    std::vector<float> qr(hd), tmp(hd), p(end + 8);
    std::vector<int64_t> seen(end);
    for (int64_t task = b; task < e; ++task) {
      const int64_t i = task / H, h = task % H, j = h / g;
      int64_t n = 0;  // the slots row i sees, in increasing order
      if (anc == nullptr) {
        const int64_t lo = window > 0 ? std::max<int64_t>(0, start + i - window + 1) : 0;
        for (int64_t t = lo; t <= start + i; ++t) seen[n++] = t;
      } else {
        int64_t depth = 0;
        for (int64_t m = 0; m < M; ++m) depth += anc[i * M + m] ? 1 : 0;
        const int64_t lo = window > 0 ? std::max<int64_t>(0, tree_from + depth - window) : 0;
        for (int64_t t = lo; t < tree_from; ++t) seen[n++] = t;
        for (int64_t m = 0; m < M; ++m)
          if (anc[i * M + m]) seen[n++] = tree_from + m;
      }
      rope(q + i * width + h * hd, qg, i, tmp.data(), qr.data());
      if (q_scale != 1.0)
        for (int64_t d = 0; d < hd; ++d) qr[d] *= static_cast<float>(q_scale);
      const float* Kj = keys + j * cap * hd;
      const float* Vj = vals + j * cap * hd;
      int64_t t = 0;  // the scores, eight keys at a time (each in the canonical order of the build)
      for (; t < n; t += 8) {
        const int m = static_cast<int>(std::min<int64_t>(8, n - t));
        const float* ks[8] = {Kj, Kj, Kj, Kj, Kj, Kj, Kj, Kj};
        for (int r = 0; r < m; ++r) ks[r] = Kj + seen[t + r] * hd;
        scores(ks, m, qr.data(), hd, p.data() + t);
      }
      float mx = -INFINITY;  // exact in any order
      for (t = 0; t < n; ++t) mx = std::max(mx, p[t]);
      const __m256 mv = _mm256_set1_ps(mx);
      for (t = 0; t < n; t += 8) {  // p is padded to a multiple of 8: the tail lanes are computed and ignored
        _mm256_storeu_ps(p.data() + t, exp8(_mm256_sub_ps(_mm256_loadu_ps(p.data() + t), mv)));
      }
      vec zv = vzero();  // z = sum_t p_t: L-lane partial sums over the whole chunks, vsum, then the tail in order
      for (t = 0; t + L <= n; t += L) zv = vadd(zv, vload(p.data() + t));
      float z = vsum(zv);
      for (; t < n; ++t) z += p[t];
      const float inv = 1.0f / z;
      float* o = op + i * H * hd + h * hd;
      for (int64_t d0 = 0; d0 < hd; d0 += 64) {  // o[d] = sum_t (p_t / z) V_t[d], in order of t, 8 registers at a time
        const int64_t w = std::min<int64_t>(64, hd - d0);
        if (w == 64) {
#ifdef __AVX512F__
          __m512 acc[2][4];  // two chains, over the even and the odd t in order, added at the end
          for (int r = 0; r < 4; ++r) acc[0][r] = acc[1][r] = _mm512_setzero_ps();
          for (t = 0; t + 2 <= n; t += 2) {
            const __m512 a0 = _mm512_set1_ps(p[t] * inv), a1 = _mm512_set1_ps(p[t + 1] * inv);
            const float* v0 = Vj + seen[t] * hd + d0;
            const float* v1 = Vj + seen[t + 1] * hd + d0;
            for (int r = 0; r < 4; ++r) {
              acc[0][r] = _mm512_fmadd_ps(a0, _mm512_loadu_ps(v0 + 16 * r), acc[0][r]);
              acc[1][r] = _mm512_fmadd_ps(a1, _mm512_loadu_ps(v1 + 16 * r), acc[1][r]);
            }
          }
          if (t < n) {
            const __m512 a0 = _mm512_set1_ps(p[t] * inv);
            const float* v0 = Vj + seen[t] * hd + d0;
            for (int r = 0; r < 4; ++r) acc[0][r] = _mm512_fmadd_ps(a0, _mm512_loadu_ps(v0 + 16 * r), acc[0][r]);
          }
          for (int r = 0; r < 4; ++r) _mm512_storeu_ps(o + d0 + 16 * r, _mm512_add_ps(acc[0][r], acc[1][r]));
#else
          __m256 acc[8];
          for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
          for (t = 0; t < n; ++t) {
            const __m256 a = _mm256_set1_ps(p[t] * inv);
            const float* v = Vj + seen[t] * hd + d0;
            for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(a, _mm256_loadu_ps(v + 8 * r), acc[r]);
          }
          for (int r = 0; r < 8; ++r) _mm256_storeu_ps(o + d0 + 8 * r, acc[r]);
#endif
        } else {
          std::fill(o + d0, o + d0 + w, 0.0f);
          for (t = 0; t < n; ++t) {
            const float a = p[t] * inv;
            const float* v = Vj + seen[t] * hd + d0;
            for (int64_t d = 0; d < w; ++d) o[d0 + d] = std::fma(a, v[d], o[d0 + d]);
          }
        }
      }
    }
  });
  return out;
}

// W [N, K] row-major -> the same values with each whole group of GROUP rows packed (see Rows): chunk c of the
// group's row i at c GROUP L + i L, then the group's K % L tails row after row; rows past the last group as they are.
torch::Tensor pack(torch::Tensor w) {
  check(w, "w");
  TORCH_CHECK(w.dim() == 2, "w: must be [N, K], got ", w.dim(), " dims");
  const int64_t N = w.size(0), K = w.size(1), kf = K - K % L, kt = K % L;
  auto p = torch::empty_like(w);
  const float* src = w.data_ptr<float>();
  float* dst = p.data_ptr<float>();
  const int64_t whole = N - N % GROUP;
  at::parallel_for(0, whole / GROUP, 64, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const float* s = src + g * GROUP * K;
      float* d = dst + g * GROUP * K;
      for (int64_t c = 0; c < kf / L; ++c)
        for (int i = 0; i < GROUP; ++i) std::copy(s + i * K + c * L, s + i * K + c * L + L, d + (c * GROUP + i) * L);
      for (int i = 0; i < GROUP; ++i) std::copy(s + i * K + kf, s + i * K + K, d + GROUP * kf + i * kt);
    }
  });
  std::copy(src + whole * K, src + N * K, dst + whole * K);
  return p;
}

// The arithmetic of a k-row product beside its weight stream, without its operand traffic (benchmarks/bench_rows.py):
// w (fp32, contiguous) read front to back, each thread one contiguous block, every L-float chunk v multiplied into
// `fmas` register accumulators (acc += v * v), prefetched `ahead` floats ahead into L1 (0: none). Returns sum over the
// elements of fmas * w^2 (so nothing is optimised away). A k-row product executes at least k FMAs per weight chunk
// (one per input row), so t(k) / t(1) of this loop is what streaming with that arithmetic beside it costs on the host,
// whatever the tile: the overlap the roofline assumes. Every accumulator is its own chain: with fewer than
// STREAM_CHAINS FMAs a chunk, consecutive chunks take turns over STREAM_CHAINS of them (as the kernel's one-row tile
// keeps four chains), so a small k is not held back by one FMA's latency a chunk (a single chain read SmolLM2's
// weights 8-11 % slower than 2-17 FMAs a chunk); with more FMAs than STREAM_ACCS registers, chains are shared.
constexpr int STREAM_MAX = 32;
constexpr int STREAM_ACCS = REGS - 4;
constexpr int STREAM_CHAINS = 4;

template <int F>
float stream_block(const float* w, int64_t n, int64_t ahead) {
  constexpr int U = F >= STREAM_CHAINS ? 1 : (STREAM_CHAINS + F - 1) / F;  // chunks an iteration
  constexpr int A = U * F < STREAM_ACCS ? U * F : STREAM_ACCS;
  vec acc[A];
#pragma GCC unroll 32
  for (int j = 0; j < A; ++j) acc[j] = vzero();
  int64_t i = 0;
  for (; i + U * L <= n; i += U * L) {
#pragma GCC unroll 32
    for (int u = 0; u < U; ++u) {
      if (ahead > 0 && (i + u * L) % 16 == 0)
        _mm_prefetch(reinterpret_cast<const char*>(w + i + u * L + ahead), _MM_HINT_T0);
      const vec v = vload(w + i + u * L);
#pragma GCC unroll 32
      for (int j = 0; j < F; ++j) acc[(u * F + j) % A] = vfma(v, v, acc[(u * F + j) % A]);  // unrolled: in registers
    }
  }
  for (; i + L <= n; i += L) {  // the last chunks short of an iteration
    const vec v = vload(w + i);
    for (int j = 0; j < F; ++j) acc[j % A] = vfma(v, v, acc[j % A]);
  }
  float r = 0.0f;
  for (int j = 0; j < A; ++j) r += vsum(acc[j]);
  for (; i < n; ++i) r += F * w[i] * w[i];
  return r;
}

template <int F>
float stream_any(int f, const float* w, int64_t n, int64_t ahead) {
  if (f == F) return stream_block<F>(w, n, ahead);
  if constexpr (F < STREAM_MAX) return stream_any<F + 1>(f, w, n, ahead);
  return 0.0f;
}

double stream_fma(torch::Tensor w, int64_t fmas, int64_t ahead) {
  check(w, "w");
  TORCH_CHECK(fmas >= 1 && fmas <= STREAM_MAX, "fmas: must be 1 .. ", STREAM_MAX, ", got ", fmas);
  TORCH_CHECK(ahead >= 0, "ahead: must be >= 0 floats, got ", ahead);
  const float* wp = w.data_ptr<float>();
  const int64_t n = w.numel(), chunks = (n + L - 1) / L;
  std::vector<double> part(at::get_num_threads(), 0.0);
  at::parallel_for(0, chunks, 4096, [&](int64_t c0, int64_t c1) {
    const int64_t b = c0 * L, e = std::min(n, c1 * L);
    part[at::get_thread_num()] += stream_any<1>(static_cast<int>(fmas), wp + b, e - b, ahead);
  });
  double total = 0.0;
  for (double v : part) total += v;
  return total;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("stream_fma", &stream_fma, "sum of fmas * w^2, streamed with fmas register FMAs a chunk (see its comment)");
  m.def("linear", &linear, "Y = s (W u) + b + R for k rows (see the file's header)");
  m.def("pack", &pack, "W with each group of four rows packed for linear(..., packed=true)");
  m.def("attend", &attend, "k new tokens' attention over a KV cache, causal or tree mask (see the file's header)");
}
