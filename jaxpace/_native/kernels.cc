// jaxpace's compiled kernels for the simulator's step loop and `adaptive`'s kept-order window.
//
// A plain C ABI loaded with ctypes (jaxpace/_native/kernels.py); no JAX, no Python headers.
// Each function does exactly the float64 arithmetic of the NumPy code it replaces, operation
// for operation and in the same order (built with -ffp-contract=off: no fused multiply-add),
// so a run gives the same bits with or without this library. tests/test_kernels.py checks
// that against the NumPy paths, which stay in place as the fallback.

#include <cmath>
#include <cstdint>

// The window kernels are compiled twice, for AVX2 and for the baseline, and the loader picks
// the one the CPU runs (GCC/Clang function multiversioning). They are integer and comparison
// work only, so both give the same bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define JP_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define JP_CLONES
#endif

namespace {

// np.maximum / np.minimum: the first operand when it wins, ties included, or is NaN.
inline double np_max(double a, double b) { return (a >= b || std::isnan(a)) ? a : b; }
inline double np_min(double a, double b) { return (a <= b || std::isnan(a)) ? a : b; }

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

}  // namespace

extern "C" {

int jaxpace_kernels_abi_version() { return 2; }

// `jaxpace.sim._engine._run_buckets` without its two closing sums (left to NumPy): `L` steps
// of `R` ranks side by side, `B` buckets, the first `S` of them pacing sites.
//   a (L, R) compute; D (L, S, R) delays; jit (L, B, R) bucket jitter or null; tc (L,)
//   Outputs: end_prev (L,), arrive (S, L, R), ends (B, L), starts (B, L, R).
//   ptr (L*R) int64 scratch.
void jaxpace_run_buckets(int64_t L, int64_t R, int64_t B, int64_t S, const double* a,
                         const double* D, const double* jit, const double* tc, double fwd_frac,
                         double bwd_frac, int spin, double slow, double* end_prev_out,
                         double* arrive, double* ends, double* starts, double* x,
                         double* bucket_work, double* launch, int64_t* ptr) {
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
      const double end_prev = end_prev_out[l];
      const double* ends_l = ends + l;  // ends[m * L + l]: interval m's end for step l
      double top = -INFINITY;
      bool first = true;
      for (int64_t r = 0; r < R; ++r) {
        const int64_t i = l * R + r;
        double w = jit ? bucket_work[i] * jit[(l * B + j) * R + r] : bucket_work[i];
        double t = x[i];
        if (spin && j > 0) {  // `_advance`, then `_advance_loop` for a rank that runs on
          const int64_t nk = j;
          int64_t p = ptr[i];
          const double u = starts[p * N + i], v = ends_l[p * L];
          double st = np_max(t, u);
          double rem = w - (st - t);
          double cap = np_max(v - st, 0.0);
          cap /= slow;
          bool passed = rem > cap;
          double out = passed ? np_max(v, st) + rem - cap : st + rem * slow;
          if (rem <= 0) out = t + w;
          p += passed;
          if (passed && p < nk && out > starts[p * N + i]) {
            out = advance_loop(
                np_max(v, st), rem - cap, p, nk, slow,
                [&](int64_t m) { return starts[m * N + i]; },
                [&](int64_t m) { return ends_l[m * L]; });
          }
          ptr[i] = p;
          t = out;
        } else {
          t = t + w;
        }
        x[i] = t;
        double lp;
        if (j < S) {
          arrive[(j * L + l) * R + r] = t;
          lp = t + D[(l * S + j) * R + r];
          if (j > 0) lp = np_max(lp, launch[i]);
        } else {
          lp = np_max(t, launch[i]);
        }
        launch[i] = lp;
        // launch.max(axis=1): NumPy's max propagates NaN; times here are finite.
        if (first || lp > top || std::isnan(lp)) top = lp;
        first = false;
      }
      const double last = np_max(top, end_prev);
      for (int64_t r = 0; r < R; ++r) {
        const int64_t i = l * R + r;
        start_j[i] = np_min(np_max(launch[i], end_prev), last);
      }
      ends[j * L + l] = last;
      end_prev_out[l] = last + tc[l];
    }
  }
}

// `adaptive`'s `_insert` for every site at one row `r0`, int8 order (window <= 127):
// h (S, W, R) float64, o (S, W, R) int8, x (S, R) sanitized; in place. Row by row over the
// window with the ranks innermost (contiguous, vectorizable); `scratch` is 4 R bytes.
JP_CLONES void jaxpace_order_insert_i8(int64_t S, int64_t W, int64_t R, int64_t r0, double* h, int8_t* o,
                             const double* x, int8_t* scratch) {
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

// `_at_rank` twice: for each (site, rank), the entries of ranks k0 and k1 of its window.
// Like `_at_rank`, the slot is the sum of the slot numbers that hold the rank (exactly one
// in a kept order); `scratch` is 2 R bytes.
JP_CLONES void jaxpace_order_pick_i8(int64_t S, int64_t W, int64_t R, const double* h, const int8_t* o,
                           int64_t k0, int64_t k1, double* a, double* b, uint8_t* scratch) {
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

}  // extern "C"
