// jaxpace's compiled kernels for the simulator's step loop and `adaptive`'s kept-order window.
//
// A plain C ABI loaded with ctypes (jaxpace/native/kernels.py); no JAX, no Python headers.
// Each function does exactly the float64 arithmetic of the NumPy code it replaces, operation
// for operation and in the same order (built with -ffp-contract=off: no fused multiply-add),
// so a run gives the same bits with or without this library. tests/test_kernels.py checks
// that against the NumPy paths, which stay in place as the fallback.
//
// Python twins (the NumPy code each kernel stands in for):
//   jaxpace_run_buckets, jaxpace_node_coupled   jaxpace/sim/_cluster.py `_run_buckets`,
//                                               `_node_coupled_compute`
//   jaxpace_order_insert_i8                     jaxpace/policy/_window_order.py `insert`
//   jaxpace_order_pick_i8                       jaxpace/policy/_window_order.py `_order_quantile`
//   jaxpace_window_step_i8                      jaxpace/policy/_adaptive_fast.py `_insert_estimate`
//   jaxpace_paced_delays (paced_row)            jaxpace/policy/_adaptive_fast.py `_delays_all`,
//                                               `_budgeted_delays`; the algorithm itself is
//                                               jaxpace/policy/adaptive.py `budgeted_delays`
// Sanitizer build and test run: benchmarks/sanitize.sh.

#include <cmath>
#include <cstdint>
#include <cstring>

// The window kernels are compiled twice, for AVX2 and for the baseline, and the loader picks
// the one the CPU runs (GCC/Clang function multiversioning). They are integer and comparison
// work only, so both give the same bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define JP_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define JP_CLONES
#endif

namespace {

// Numbers Python must agree with: `jaxpace_kernels_constant` returns them, and
// jaxpace/native/kernels.py (`CONSTANTS`) refuses a library whose values differ.
constexpr int kAbiVersion = 5;
constexpr int64_t kOrderMaxWindow = 127;          // the int8 order's largest window
constexpr int64_t kInsertScratchPerRank = 4;      // bytes of `jaxpace_order_insert_i8` scratch
constexpr int64_t kPickScratchPerRank = 2;        // bytes of `jaxpace_order_pick_i8` scratch
constexpr int64_t kWindowStepScratchPerRank = 4;  // bytes of `jaxpace_window_step_i8` scratch
constexpr int64_t kCoupledScratchPerGpu = 2;      // doubles of `jaxpace_node_coupled` scratch

// np.maximum / np.minimum: the first operand when it wins, ties included, or is NaN.
// Written as a chain of one-compare selects, which loops of them vectorize into.
inline double np_max(double a, double b) {
  double m = a < b ? b : a;
  m = b != b ? b : m;
  return a != a ? a : m;
}
inline double np_min(double a, double b) {
  double m = b < a ? b : a;
  m = b != b ? b : m;
  return a != a ? a : m;
}

// `row.max()` as the kernels always took it: NaN if there is one, else the largest entry
// (the first of equal ones). Four running maxima break the compare chain; a row with NaN
// (never, for the engine's finite times) takes the plain loop.
inline double row_top(const double* row, int64_t R) {
  double m[4] = {row[0], row[0], row[0], row[0]};
  int64_t nan = 0, r = 0;
  for (; r + 4 <= R; r += 4) {
    for (int k = 0; k < 4; ++k) {
      const double v = row[r + k];
      m[k] = v > m[k] ? v : m[k];
      nan += v != v;
    }
  }
  for (; r < R; ++r) {
    m[0] = row[r] > m[0] ? row[r] : m[0];
    nan += row[r] != row[r];
  }
  if (nan) {
    double top = row[0];
    for (int64_t i = 0; i < R; ++i) {
      if (row[i] > top || std::isnan(row[i])) top = row[i];
    }
    return top;
  }
  double top = m[0];
  for (int k = 1; k < 4; ++k) top = m[k] > top ? m[k] : top;
  return top;
}

// `_advance_loop`: rank with compute clock `t`, `w` seconds of work left, from interval `p`.
// `u(m)` is the rank's interval m start, `v(m)` its end; returns the new clock, updates `p`.
template <class U, class V>
inline double advance_loop(double t, double w, int64_t& p, int64_t nk, double slow, U u, V v) {
  for (;;) {
    double start = np_max(t, u(p));
    double gap = start - t;
    double cap = np_max(v(p) - start, 0.0) / slow;
    if (w <= gap) return t + w;
    if (w - gap <= cap) return start + (w - gap) * slow;
    t = np_max(v(p), start);
    w = w - gap - cap;
    p += 1;
    if (p >= nk) return t + w;
  }
}

// `jaxpace_window_step_i8`'s passes, restrict-qualified so that their loops vectorize.

// rank[r]: how many of the window's entries are <= xs[r], less one (the new entry itself):
// the new entry's rank. Blocks of ranks keep their counts in registers across the window.
constexpr int64_t kRankBlock = 32;
__attribute__((always_inline)) inline void count_le(const double* __restrict hs,
                                                    const double* __restrict xs,
                                                    int8_t* __restrict rank, int64_t W,
                                                    int64_t R) {
  int64_t r = 0;
  for (; r + kRankBlock <= R; r += kRankBlock) {
    int64_t c[kRankBlock];
    for (int64_t k = 0; k < kRankBlock; ++k) c[k] = -1;
    for (int64_t w = 0; w < W; ++w) {
      const double* hw = hs + w * R + r;
      for (int64_t k = 0; k < kRankBlock; ++k) c[k] += hw[k] <= xs[r + k];
    }
    for (int64_t k = 0; k < kRankBlock; ++k) rank[r + k] = static_cast<int8_t>(c[k]);
  }
  for (; r < R; ++r) {
    int64_t c = -1;
    for (int64_t w = 0; w < W; ++w) c += hs[w * R + r] <= xs[r];
    rank[r] = static_cast<int8_t>(c);
  }
}

// Slot r0 gets the new entry; its old rank (`leaving`) is kept for the reorder.
__attribute__((always_inline)) inline void begin_site(double* __restrict hrow,
                                                      const int8_t* __restrict orow,
                                                      const double* __restrict xs,
                                                      int8_t* __restrict leaving,
                                                      uint8_t* __restrict s0,
                                                      uint8_t* __restrict s1, int64_t R) {
  for (int64_t r = 0; r < R; ++r) {
    leaving[r] = orow[r];
    s0[r] = 0;
    s1[r] = 0;
    hrow[r] = xs[r];
  }
}

// One window row: entries above the leaving one move down one, then entries at or above the
// new one's rank move up one (in a sorted window those are exactly the entries > x, which
// `_window_order.insert` moves up); the slots now ranked q0 and q1 are summed into s0 and s1.
__attribute__((always_inline)) inline void reorder_row(int8_t* __restrict ow,
                                                       const int8_t* __restrict leaving,
                                                       const int8_t* __restrict rank,
                                                       uint8_t* __restrict s0,
                                                       uint8_t* __restrict s1, int8_t q0,
                                                       int8_t q1, uint8_t wu, int64_t R) {
  for (int64_t r = 0; r < R; ++r) {
    int8_t v = ow[r];
    v = static_cast<int8_t>(v - (v > leaving[r]));
    v = static_cast<int8_t>(v + (v >= rank[r]));
    ow[r] = v;
    s0[r] = static_cast<uint8_t>(s0[r] + ((v == q0) ? wu : 0));
    s1[r] = static_cast<uint8_t>(s1[r] + ((v == q1) ? wu : 0));
  }
}

// Slot r0 went through `reorder_row` with its old rank; it takes the new entry's, and the
// slot sums are corrected for it.
__attribute__((always_inline)) inline void fix_slot(int8_t* __restrict orow,
                                                    const int8_t* __restrict leaving,
                                                    const int8_t* __restrict rank,
                                                    uint8_t* __restrict s0,
                                                    uint8_t* __restrict s1, int8_t q0,
                                                    int8_t q1, uint8_t ru, int64_t R) {
  for (int64_t r = 0; r < R; ++r) {
    const int8_t nv = rank[r];
    const int8_t was = static_cast<int8_t>(leaving[r] + (leaving[r] >= nv));
    orow[r] = nv;
    s0[r] = static_cast<uint8_t>(s0[r] - (was == q0 ? ru : 0) + (nv == q0 ? ru : 0));
    s1[r] = static_cast<uint8_t>(s1[r] - (was == q1 ? ru : 0) + (nv == q1 ? ru : 0));
  }
}

// NumPy's float64 `add.reduce` over a contiguous axis of `n` entries: its identity 0.0 plus
// the pairwise sum of its inner loop (sequential under 8 entries, 8 running sums up to 128,
// halves above), so a sum here has the bits of `m.sum(axis=-1)`.
inline double np_pairwise_sum(const double* a, int64_t n) {
  if (n < 8) {
    double res = 0.0;
    for (int64_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int k = 0; k < 8; ++k) r[k] = a[k];
    int64_t i = 8;
    for (; i < n - (n % 8); i += 8) {
      for (int k = 0; k < 8; ++k) r[k] += a[i + k];
    }
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return np_pairwise_sum(a, n2) + np_pairwise_sum(a + n2, n - n2);
}

inline double np_sum(const double* a, int64_t n) { return 0.0 + np_pairwise_sum(a, n); }

// One site of `jaxpace_paced_delays` (restrict-qualified, and built with -fno-trapping-math,
// so that the loop vectorizes: the selects then need no branches).
inline bool paced_row(const double* __restrict expected, const double* __restrict e,
                      double* __restrict cell, double* __restrict slept,
                      double* __restrict out, double gain, double max_delay, int64_t R) {
  int64_t paced = 0;
  for (int64_t r = 0; r < R; ++r) {
    double want = gain * expected[r];
    want = want != want ? 0.0 : want + 0.0;  // NaN -> 0, -0.0 -> 0.0
    // np.clip(want, 0.0, max_delay) of a want with neither NaN nor -0.0
    double v = want > 0.0 ? want : 0.0;
    v = v < max_delay ? v : max_delay;
    v = (e[r] - e[r] == 0.0) ? v : 0.0;  // e finite: e - e is 0 (NaN for inf and NaN)
    out[r] = v;
    slept[r] = (slept[r] - cell[r]) + v;
    cell[r] = v;
    paced += v > 0.0 ? 1 : 0;
  }
  return paced != 0;
}

// `jaxpace_window_step_i8`'s precondition: no row but r0 holds NaN or -0.0 (per `odd`), and
// neither does x (sanitized, so exactly those lie above +inf read as unsigned integers, as in
// `_window_order._count_odd`). Then odd's row r0 becomes 0, as `_count_odd` would set it.
inline bool window_clean(int64_t S, int64_t W, int64_t R, int64_t r0, int64_t* odd,
                         const double* x) {
  int64_t bad = 0;
  for (int64_t i = 0; i < S * W; ++i) bad += (i % W != r0) && odd[i] != 0;
  const uint64_t inf_bits = 0x7FF0000000000000ull;
  for (int64_t i = 0; i < S * R; ++i) {
    uint64_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    bad += bits > inf_bits;
  }
  if (bad) return false;
  for (int64_t s = 0; s < S; ++s) odd[s * W + r0] = 0;
  return true;
}

// `jaxpace_run_buckets`' row passes (restrict-qualified so that they vectorize).

inline void scale_row(const double* __restrict bw, const double* __restrict jit,
                      double* __restrict out, int64_t R) {
  for (int64_t r = 0; r < R; ++r) out[r] = bw[r] * jit[r];
}

inline void add_row(const double* __restrict w, double* __restrict x, int64_t R) {
  for (int64_t r = 0; r < R; ++r) x[r] = x[r] + w[r];
}

inline void copy_row(const double* __restrict from, double* __restrict to, int64_t R) {
  for (int64_t r = 0; r < R; ++r) to[r] = from[r];
}

// One step's spin intervals as seen from its row: rank r's interval m starts at
// starts[m * N + r] and ends at ends[m * L]; `nk` intervals (the buckets before this one).
struct SpinRow {
  const double* starts;
  const double* ends;
  int64_t N, L, nk;
  double slow;
};

// A rank at clock `t` with work `w` entering its spin interval `p`: the interval's start
// (or `t`, if later) and end, the work left past the start, and how much of it the interval
// holds (`_advance`'s arithmetic, shared by both passes below).
__attribute__((always_inline)) inline void enter(const SpinRow& sr, const double* starts,
                                                 const double* ends, double t, double w,
                                                 int64_t p, int64_t r, double& st, double& v,
                                                 double& rem, double& cap) {
  const double u = starts[p * sr.N + r];
  v = ends[p * sr.L];
  st = np_max(t, u);
  rem = w - (st - t);
  cap = np_max(v - st, 0.0) / sr.slow;
}

// `_advance`'s vectorized part: the work `w` from clock `x`, through the interval `ptr`
// points at. Writes the new clock to `out`, moves `ptr` past a finished interval, and
// marks in `again` the ranks that reach the next interval with work left.
inline void spin_first(const SpinRow& sr, const double* __restrict x, const double* __restrict w,
                       int64_t* __restrict ptr, double* __restrict out,
                       uint8_t* __restrict again, int64_t R) {
  const double* __restrict starts = sr.starts;
  const double* __restrict ends = sr.ends;
  for (int64_t r = 0; r < R; ++r) {
    const double t = x[r], wr = w[r];
    const int64_t p = ptr[r];
    double st, v, rem, cap;
    enter(sr, starts, ends, t, wr, p, r, st, v, rem, cap);
    const bool passed = rem > cap;
    double o = passed ? np_max(v, st) + rem - cap : st + rem * sr.slow;
    o = rem <= 0 ? t + wr : o;
    const int64_t p2 = p + (passed ? 1 : 0);
    const int64_t pn = p2 < sr.nk ? p2 : sr.nk - 1;
    const double next = starts[pn * sr.N + r];
    again[r] = passed && p2 < sr.nk && o > next;
    out[r] = o;
    ptr[r] = p2;
  }
}

// `_advance_loop` for one rank that `spin_first` marked: from its first interval's end.
inline double spin_rest(const SpinRow& sr, double t, double w, int64_t& p, int64_t r) {
  double st, v, rem, cap;
  enter(sr, sr.starts, sr.ends, t, w, p - 1, r, st, v, rem, cap);  // what spin_first saw
  return advance_loop(
      np_max(v, st), rem - cap, p, sr.nk, sr.slow,
      [&](int64_t m) { return sr.starts[m * sr.N + r]; },
      [&](int64_t m) { return sr.ends[m * sr.L]; });
}

// A site's bucket: arrive = x, launch = x + delay (after the previous bucket's launch, in
// host order); returns launch.max() (NumPy's max propagates NaN; times here are finite).
inline double launch_row(const double* __restrict x, const double* __restrict d,
                         double* __restrict arrive, double* __restrict launch, bool chain,
                         int64_t R) {
  for (int64_t r = 0; r < R; ++r) {
    arrive[r] = x[r];
    const double lp = x[r] + d[r];
    launch[r] = chain ? np_max(lp, launch[r]) : lp;
  }
  return row_top(launch, R);
}

// A bucket past the sites: launch = max(x, previous launch), in place.
inline double launch_late(const double* __restrict x, double* __restrict launch, int64_t R) {
  for (int64_t r = 0; r < R; ++r) launch[r] = np_max(x[r], launch[r]);
  return row_top(launch, R);
}

// Each rank's own kernel starts after the previous bucket's end, and no later than `last`.
inline void clamp_starts(const double* __restrict launch, double end_prev, double last,
                         double* __restrict start, int64_t R) {
  for (int64_t r = 0; r < R; ++r) start[r] = np_min(np_max(launch[r], end_prev), last);
}

}  // namespace

extern "C" {

int jaxpace_kernels_abi_version() { return kAbiVersion; }

// The constants above by name (see `CONSTANTS` in jaxpace/native/kernels.py); -1 for a name it does not know.
int64_t jaxpace_kernels_constant(const char* name) {
  struct Entry {
    const char* name;
    int64_t value;
  };
  static const Entry kTable[] = {
      {"abi_version", kAbiVersion},
      {"order_max_window", kOrderMaxWindow},
      {"insert_scratch_per_rank", kInsertScratchPerRank},
      {"pick_scratch_per_rank", kPickScratchPerRank},
      {"window_step_scratch_per_rank", kWindowStepScratchPerRank},
      {"coupled_scratch_per_gpu", kCoupledScratchPerGpu},
  };
  for (const Entry& e : kTable) {
    if (std::strcmp(e.name, name) == 0) return e.value;
  }
  return -1;
}

// `jaxpace.sim._cluster._run_buckets` without its two closing sums (left to NumPy): `L` steps
// of `R` ranks side by side, `B` buckets, the first `S` of them pacing sites.
//   a (L, R) compute; D (L, S, R) delays; jit (L, B, R) bucket jitter or null; tc (L,)
//   Outputs: end_prev (L,), arrive (S, L, R), ends (B, L), starts (B, L, R).
//   Scratch: x, bucket_work, launch (L*R), ptr (L*R) int64, row_w, row_t (R), again (R).
// Row by row, in passes the compiler vectorizes: with spin coupling every rank's first spin
// interval in one pass, then (scalar) the few ranks whose work runs past it.
JP_CLONES void jaxpace_run_buckets(int64_t L, int64_t R, int64_t B, int64_t S, const double* a,
                                   const double* D, const double* jit, const double* tc,
                                   double fwd_frac, double bwd_frac, int spin, double slow,
                                   double* end_prev_out, double* arrive, double* ends,
                                   double* starts, double* x, double* bucket_work,
                                   double* launch, int64_t* ptr, double* row_w,
                                   double* row_t, uint8_t* again) {
  const int64_t N = L * R;
  for (int64_t i = 0; i < N; ++i) {
    bucket_work[i] = a[i] * bwd_frac;
    x[i] = a[i] * fwd_frac;
    ptr[i] = 0;
  }
  for (int64_t l = 0; l < L; ++l) end_prev_out[l] = 0.0;
  for (int64_t j = 0; j < B; ++j) {
    double* start_j = starts + j * N;
    for (int64_t l = 0; l < L; ++l) {
      const int64_t i0 = l * R;
      const double end_prev = end_prev_out[l];
      const double* w = bucket_work + i0;
      if (jit) {
        scale_row(bucket_work + i0, jit + (l * B + j) * R, row_w, R);
        w = row_w;
      }
      if (spin && j > 0) {  // `_advance`: every rank's first interval, then the few that run on
        const SpinRow sr{starts + i0, ends + l, N, L, j, slow};
        spin_first(sr, x + i0, w, ptr + i0, row_t, again, R);
        for (int64_t r = 0; r < R; ++r) {
          if (again[r]) row_t[r] = spin_rest(sr, x[i0 + r], w[r], ptr[i0 + r], r);
        }
        copy_row(row_t, x + i0, R);
      } else {
        add_row(w, x + i0, R);
      }
      double top;
      if (j < S) {
        top = launch_row(x + i0, D + (l * S + j) * R, arrive + (j * L + l) * R, launch + i0,
                         j > 0, R);
      } else {
        top = launch_late(x + i0, launch + i0, R);
      }
      const double last = np_max(top, end_prev);
      clamp_starts(launch + i0, end_prev, last, start_j + i0, R);
      ends[j * L + l] = last;
      end_prev_out[l] = last + tc[l];
    }
  }
}

// `_window_order.insert` for every site at one row `r0`, int8 order (window <= 127):
// h (S, W, R) float64, o (S, W, R) int8, x (S, R) sanitized; in place. Row by row over the
// window with the ranks innermost (contiguous, vectorizable); `scratch` is 4 R bytes.
JP_CLONES void jaxpace_order_insert_i8(int64_t S, int64_t W, int64_t R, int64_t r0, double* h, int8_t* o,
                             const double* x, int8_t* scratch) {
  static_assert(kInsertScratchPerRank == 4, "leaving, below, nan, le: R bytes each");
  int8_t* leaving = scratch;
  int8_t* below = scratch + R;
  int8_t* nan = scratch + 2 * R;
  int8_t* le = scratch + 3 * R;
  for (int64_t s = 0; s < S; ++s) {
    double* hs = h + s * W * R;
    int8_t* os = o + s * W * R;
    const double* xs = x + s * R;
    for (int64_t r = 0; r < R; ++r) {
      leaving[r] = os[r0 * R + r];
      below[r] = 0;
      nan[r] = xs[r] != xs[r];  // NaN goes above every entry
      hs[r0 * R + r] = xs[r];
    }
    for (int64_t w = 0; w < W; ++w) {
      const double* hw = hs + w * R;
      int8_t* ow = os + w * R;
      for (int64_t r = 0; r < R; ++r) le[r] = static_cast<int8_t>((hw[r] <= xs[r]) | nan[r]);
      for (int64_t r = 0; r < R; ++r) {
        int8_t v = ow[r];
        v = static_cast<int8_t>(v - (v > leaving[r]));
        below[r] = static_cast<int8_t>(below[r] + le[r]);
        ow[r] = static_cast<int8_t>(v + 1 - le[r]);
      }
    }
    for (int64_t r = 0; r < R; ++r) os[r0 * R + r] = static_cast<int8_t>(below[r] - 1);
  }
}

// `_window_order._at_rank` twice: for each (site, rank), the entries of ranks k0 and k1 of its window.
// Like `_at_rank`, the slot is the sum of the slot numbers that hold the rank (exactly one
// in a kept order); `scratch` is 2 R bytes.
JP_CLONES void jaxpace_order_pick_i8(int64_t S, int64_t W, int64_t R, const double* h, const int8_t* o,
                           int64_t k0, int64_t k1, double* a, double* b, uint8_t* scratch) {
  static_assert(kPickScratchPerRank == 2, "s0, s1: R bytes each");
  uint8_t* s0 = scratch;
  uint8_t* s1 = scratch + R;
  const int8_t q0 = static_cast<int8_t>(k0), q1 = static_cast<int8_t>(k1);
  for (int64_t s = 0; s < S; ++s) {
    const double* hs = h + s * W * R;
    const int8_t* os = o + s * W * R;
    for (int64_t r = 0; r < R; ++r) s0[r] = s1[r] = 0;
    for (int64_t w = 0; w < W; ++w) {
      const int8_t* ow = os + w * R;
      const uint8_t wu = static_cast<uint8_t>(w);
      for (int64_t r = 0; r < R; ++r) {
        s0[r] = static_cast<uint8_t>(s0[r] + ((ow[r] == q0) ? wu : 0));
        s1[r] = static_cast<uint8_t>(s1[r] + ((ow[r] == q1) ? wu : 0));
      }
    }
    for (int64_t r = 0; r < R; ++r) {
      a[s * R + r] = hs[s0[r] * R + r];
      b[s * R + r] = hs[s1[r] * R + r];
    }
  }
}

// `_window_order.insert` (as `jaxpace_order_insert_i8`) and then `_order_quantile` on the order,
// for every site at row r0, in two passes over each window: the new entry's rank (float
// compares), then the order's upkeep, which also sums up the slots holding ranks k0 and k1.
// Only for windows whose rows other than r0 hold no NaN and no -0.0 (`odd` (S, W), the
// policy's count of them per row, is all 0 there) and x with none: else it returns 0 and
// changes nothing (NumPy then); it sets odd's row r0 to 0. The order must be the window's
// (as the policy keeps it), and the first `filled` >= k1 + 1 ranks must be written rows. `mode`
// is `_order_quantile`'s arithmetic: 0 the entry of rank k0; 1 `a + (b - a) * t`; 2
// `b - (b - a) * omt` (omt = 1 - t, computed by the caller). Writes expected (S, R) and each
// site's `expected.max(axis=1)` to spread (S,) and returns 1; `scratch` is 4 R bytes.
JP_CLONES int jaxpace_window_step_i8(int64_t S, int64_t W, int64_t R, int64_t r0, double* h,
                                     int8_t* o, int64_t* odd, const double* x, int64_t k0,
                                     int64_t k1, int mode, double t, double omt,
                                     double* expected, double* spread, int8_t* scratch) {
  if (!window_clean(S, W, R, r0, odd, x)) return 0;
  static_assert(kWindowStepScratchPerRank == 4, "leaving, rank, s0, s1: R bytes each");
  int8_t* leaving = scratch;
  int8_t* rank = scratch + R;
  uint8_t* s0 = reinterpret_cast<uint8_t*>(scratch + 2 * R);
  uint8_t* s1 = reinterpret_cast<uint8_t*>(scratch + 3 * R);
  const int8_t q0 = static_cast<int8_t>(k0), q1 = static_cast<int8_t>(k1);
  for (int64_t s = 0; s < S; ++s) {
    double* hs = h + s * W * R;
    int8_t* os = o + s * W * R;
    const double* xs = x + s * R;
    begin_site(hs + r0 * R, os + r0 * R, xs, leaving, s0, s1, R);
    count_le(hs, xs, rank, W, R);
    for (int64_t w = 0; w < W; ++w) {
      reorder_row(os + w * R, leaving, rank, s0, s1, q0, q1, static_cast<uint8_t>(w), R);
    }
    fix_slot(os + r0 * R, leaving, rank, s0, s1, q0, q1, static_cast<uint8_t>(r0), R);
    double* es = expected + s * R;
    if (mode == 0) {
      for (int64_t r = 0; r < R; ++r) es[r] = hs[s0[r] * R + r];
    } else {
      for (int64_t r = 0; r < R; ++r) {
        const double a = hs[s0[r] * R + r], b = hs[s1[r] * R + r];
        const double diff = b - a;
        es[r] = mode == 1 ? a + diff * t : b - diff * omt;
      }
    }
    spread[s] = row_top(es, R);  // expected.max(axis=1): finite here, no -0.0
  }
  return 1;
}

// `jaxpace.sim._cluster._node_coupled_compute`: couplings (c) and (d) for `nodes` nodes of `g`
// ranks (g > 1). a (nodes * g) compute, d0 (nodes * g) delays at the first site or null when
// nobody sleeps; writes out (nodes * g). Same operations in the same order as the NumPy code;
// `m` is 2 g doubles of scratch.
void jaxpace_node_coupled(int64_t nodes, int64_t g, const double* a, const double* d0,
                          double k_pow, double k_host, double* out, double* m) {
  static_assert(kCoupledScratchPerGpu == 2, "m, e: g doubles each");
  double* e = m + g;
  const double denom = static_cast<double>(g - 1);
  for (int64_t n = 0; n < nodes; ++n) {
    const double* A = a + n * g;
    for (int64_t j = 0; j < g; ++j) e[j] = d0 ? A[j] + d0[n * g + j] : A[j];
    for (int64_t i = 0; i < g; ++i) {
      double adj = 0.0;
      if (k_pow > 0 && d0) {
        for (int64_t j = 0; j < g; ++j) m[j] = np_max(np_min(A[i], e[j]) - A[j], 0.0);
        adj = adj - k_pow * np_sum(m, g) / denom;
      }
      if (k_host > 0) {
        for (int64_t j = 0; j < g; ++j) m[j] = np_max(A[i] - e[j], 0.0);
        adj = adj + k_host * np_sum(m, g) / denom;
      }
      out[n * g + i] = A[i] + adj;
    }
  }
}

// `_adaptive_fast._budgeted_delays` for every site where the budget cannot bind, then
// `_record_delays` at row r0: out = clip(gain * expected (NaN -> 0), 0, max_delay), 0 where
// e is not finite; the delay ring's row r0 and its running sum `slept` updated in the same
// order as the NumPy code (minus the row that leaves, plus the new one). expected, e, slept,
// out (S, R); dh (S, W, R); paced (S,) whether a site asked for any delay. Returns 0, and
// writes nothing, when some `slept` is above `unbound` (the budget may bind: NumPy then).
JP_CLONES int jaxpace_paced_delays(int64_t S, int64_t W, int64_t R, int64_t r0, double gain,
                         double max_delay, double unbound, const double* expected,
                         const double* e, double* dh, double* slept, double* out,
                         uint8_t* paced) {
  int64_t binds = 0;
  for (int64_t i = 0; i < S * R; ++i) binds += !(slept[i] <= unbound);
  if (binds) return 0;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t i = s * R;
    paced[s] = paced_row(expected + i, e + i, dh + (s * W + r0) * R, slept + i, out + i, gain,
                         max_delay, R);
  }
  return 1;
}

}  // extern "C"
