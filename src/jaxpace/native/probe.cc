// jaxpace native probes: XLA FFI handlers for arrival/done timing, and a C API for Python.
//
// Hot path (inside the compiled program, no Python):
//   Arrive([tok bits, rank]) -> (flag, payload)  clock, pending delay (interruptible sleep),
//                                          the rank's previous wait/step into `payload`
//   Done(reduced, [flag, rank]) -> one          clock, one complete record into the site's ring
// Off the hot path (Python, via ctypes): register sites, set pending delays, drain records,
// release sleeps (`jaxpace_release_all`, also called on SIGTERM by the runtime), and read each
// rank's progress for the stall watchdog (`jaxpace_site_progress`: last arrived step and when,
// after the pacing sleep; last finished step; two relaxed stores per probe, no locks).
//
// CPU handlers use std::chrono::steady_clock. CUDA handlers (probe_cuda.cc, compiled into this
// library, registered only when XLA has a CUDA backend) record cudaEvents on XLA's stream and
// delay with cudaLaunchHostFunc; the CUDA runtime is dlopen'ed at run time, so the build needs
// no CUDA toolkit. The CUDA path is tested against a fake cudart (tests/native/fake_cudart.cc)
// but has not been run on a GPU yet (see benchmarks/gpu.sh).
//
// Steps: a per-(site, rank) counter incremented at each Arrive. Remat replays never reach the
// handlers: the Python primitive registers a partial-eval rule that saves the probes' outputs as
// residuals, so a checkpointed function's recomputation reuses them instead of re-running the
// probes. One Arrive and one Done per (site, rank, step) by construction; the ring never holds
// two records of one (site, rank, step).

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kAbiVersion = 7;  // 2: site_progress; 3: site_pending, site_wake; 4: CUDA counters;
                                // 5: CPU handlers take the device ordinal, arrive aliased results;
                                // 6: CPU arrive copies its last `copies` operands to its results;
                                // 7: records carry XLA's run id (56 bytes)
constexpr int kMaxSites = 4096;

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ------------------------------------------------------------------ release / sleep

// Never destroyed: threads the process does not join (the drain thread, CUDA's host-function
// thread in a sleep) may still wait on them while static destructors run at exit.
std::mutex& g_sleep_mu = *new std::mutex;
std::condition_variable& g_sleep_cv = *new std::condition_variable;
std::atomic<int> g_released{0};
std::atomic<int64_t> g_max_delay_ns{0};  // 0: no delays at all

// Sleeps up to `ns`, returns early when everything (or this site) is released. Returns the ns
// actually slept.
int64_t interruptible_sleep(int64_t ns, const std::atomic<int>* site_released) {
  auto released = [site_released] {
    return g_released.load(std::memory_order_acquire) != 0 ||
           (site_released != nullptr && site_released->load(std::memory_order_acquire) != 0);
  };
  if (ns <= 0 || released()) return 0;
  int64_t t0 = now_ns();
  std::unique_lock<std::mutex> lk(g_sleep_mu);
  g_sleep_cv.wait_for(lk, std::chrono::nanoseconds(ns), released);
  return now_ns() - t0;
}

// ------------------------------------------------------------------ records

// Layout shared with Python (numpy dtype NATIVE_RECORD_DTYPE in probes.py): 56 bytes.
struct RecordOut {
  int64_t step;
  int64_t arrive_ns;
  int64_t done_ns;
  int64_t delay_ns;
  int64_t wait_ns;  // done - arrive (CPU); done event - arrive event (GPU)
  int32_t rank;
  int32_t flags;  // bit 0: measured on a GPU stream
  int64_t run_id;  // XLA's RunId of the program execution the arrive ran in
};
static_assert(sizeof(RecordOut) == 56, "record layout");

// One ring slot: seqlock (2*idx+1 while written, 2*idx+2 when complete) over relaxed atomics.
struct Slot {
  std::atomic<uint64_t> seq{0};
  std::atomic<int64_t> f[6];
  std::atomic<int32_t> rank{0};
  std::atomic<int32_t> flags{0};
};

struct RankState {
  std::atomic<int64_t> next_step{0};
  std::atomic<int64_t> pending_delay_ns{0};
  // Open step (arrive seen, done not yet): written by Arrive, read by Done.
  std::atomic<int64_t> open_step{-1};
  std::atomic<int64_t> open_arrive_ns{0};
  std::atomic<int64_t> open_delay_ns{0};
  std::atomic<int64_t> open_run_id{0};  // XLA's RunId of the open step's execution
  // Exchange state: this rank's previous wait and its step, packed into one word so that a
  // reader never pairs one step's wait with another's step ((wait_ns << 20) | step mod 2^20;
  // -1: unknown), and its previous step time (-1: unknown).
  std::atomic<int64_t> prev_wait{-1};
  std::atomic<int64_t> prev_step_ns{-1};
  std::atomic<int64_t> last_done_ns{-1};
  std::atomic<int64_t> overlaps{0};
  // Stall watchdog (jaxpace_site_progress): last measured step arrived at + 1 (0: none) and
  // when (steady clock, after the pacing sleep, so a sleep never counts), last step done + 1.
  std::atomic<int64_t> wd_arrived{0};
  std::atomic<int64_t> wd_arrived_ns{0};
  std::atomic<int64_t> wd_done{0};
};

// Marks (for the watchdog) that rank `st` arrived at `step` at `t`: the time first, then the
// step with release, so a reader that sees the step (acquire) sees its time.
inline void wd_arrive(RankState& st, int64_t step, int64_t t) {
  st.wd_arrived_ns.store(t, std::memory_order_relaxed);
  st.wd_arrived.store(step + 1, std::memory_order_release);
}
inline void wd_done(RankState& st, int64_t step) {
  st.wd_done.store(step + 1, std::memory_order_release);
}

struct GpuPair;  // CUDA bookkeeping, defined in probe_cuda.cc

constexpr int64_t kStepTagMod = int64_t{1} << 20;  // the exchange's step tag (jaxpace/collectives/exchange.py)
inline int64_t pack_wait(int64_t wait_ns, int64_t step) {
  if (wait_ns < 0 || wait_ns >= (int64_t{1} << 42)) return -1;  // over 73 min: not a wait
  return (wait_ns << 20) | (step & (kStepTagMod - 1));
}

struct Site {
  int32_t num_slots = 0;
  int32_t fixed_rank = -1;  // >= 0: every active arrive is this rank (one shard per process)
  int64_t sample_every = 1;
  int64_t capacity = 0;  // power of two
  int32_t payload_len = 0;  // floats stored per record (reduced payload), 0 without exchange
  std::vector<RankState> ranks;
  std::vector<Slot> slots;
  std::vector<std::atomic<float>> payloads;  // capacity * payload_len
  std::atomic<uint64_t> head{0};
  // 0: the site's policy cannot delay now (not engaged): its records do not wake the drain
  // thread, which then drains the site on its timer. Set by jaxpace_set_site_wake.
  std::atomic<int> wake{1};
  uint64_t tail = 0;  // consumer side, under drain_mu
  std::mutex drain_mu;
  std::atomic<int64_t> dropped{0};
  std::atomic<int64_t> unsampled{0};
  std::atomic<int> released{0};  // this site's sleeps end (its pacer closed)
  std::atomic<int64_t> max_delay_ns{-1};  // >= 0: this site's bound; -1: the global one
  // GPU (probe_cuda.cc). Set up by jaxpace_set_site_devices, before a program runs; never
  // freed (a running handler may hold them), like the site itself.
  std::atomic<const std::vector<int32_t>*> ordinals{nullptr};  // rank per local device ordinal
  std::atomic<std::atomic<GpuPair*>*> gpu_tab{nullptr};  // per rank: its events and buffers
  std::vector<GpuPair*> gpu_list;  // the same pairs, for the drain's poll (under drain_mu)
  std::atomic<int64_t> cuda_errors{0};  // CUDA calls that failed (each cleared after)
  std::atomic<int64_t> gpu_invalid{0};  // measured steps left unrecorded by an error
  std::atomic<int32_t> cuda_streak{0};  // errors since the last good record
  std::atomic<int> gpu_disabled{0};  // 1: too many errors in a row, the handlers do nothing
  Site(int32_t n, int64_t cap, int32_t plen)
      : num_slots(n), capacity(cap), payload_len(plen), ranks(n), slots(cap),
        payloads(static_cast<size_t>(cap) * plen) {}
};

std::atomic<Site*> g_sites[kMaxSites];
// Records pushed by sites that can delay (their effective bound > 0): what wakes the drain
// thread, whose policy turns each one into the rank's next delay. Measure-only sites never
// notify (no futex call on the hot path); the drain thread batches them on a timer.
std::atomic<uint64_t> g_pushed_eager{0};
std::atomic<int> g_waiters{0};
std::mutex& g_wait_mu = *new std::mutex;  // never destroyed (see g_sleep_mu)
std::condition_variable& g_wait_cv = *new std::condition_variable;

// Wakes the drain thread (jaxpace_wait_records): records (or GPU steps) of a site that can
// delay are ready. Only atomics, one short lock when someone waits; called from CUDA's
// host-function thread too.
void wake_drain() {
  g_pushed_eager.fetch_add(1, std::memory_order_release);
  if (g_waiters.load(std::memory_order_acquire) > 0) {
    { std::lock_guard<std::mutex> lk(g_wait_mu); }
    g_wait_cv.notify_all();
  }
}

// Whether records of `s` wake the drain thread: its policy may delay now.
inline bool site_eager(const Site* s) {
  int64_t mx = s->max_delay_ns.load(std::memory_order_relaxed);
  if (mx < 0) mx = g_max_delay_ns.load(std::memory_order_relaxed);
  return mx > 0 && s->wake.load(std::memory_order_relaxed) != 0;
}

inline Site* site_of(int64_t id) {
  if (id < 0 || id >= kMaxSites) return nullptr;
  return g_sites[id].load(std::memory_order_acquire);
}

// `notify`: whether a waiting drain thread is woken (false when the drain thread pushes it).
void push_record(Site* s, const RecordOut& r, const float* payload, int32_t plen,
                 bool notify = true) {
  uint64_t idx = s->head.fetch_add(1, std::memory_order_relaxed);
  Slot& sl = s->slots[idx & (s->capacity - 1)];
  sl.seq.store(2 * idx + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  sl.f[0].store(r.step, std::memory_order_relaxed);
  sl.f[1].store(r.arrive_ns, std::memory_order_relaxed);
  sl.f[2].store(r.done_ns, std::memory_order_relaxed);
  sl.f[3].store(r.delay_ns, std::memory_order_relaxed);
  sl.f[4].store(r.wait_ns, std::memory_order_relaxed);
  sl.f[5].store(r.run_id, std::memory_order_relaxed);
  sl.rank.store(r.rank, std::memory_order_relaxed);
  sl.flags.store(r.flags, std::memory_order_relaxed);
  if (s->payload_len > 0) {
    std::atomic<float>* dst = &s->payloads[(idx & (s->capacity - 1)) * s->payload_len];
    for (int32_t i = 0; i < s->payload_len; ++i)
      dst[i].store(payload != nullptr && i < plen ? payload[i] : 0.0f, std::memory_order_relaxed);
  }
  sl.seq.store(2 * idx + 2, std::memory_order_release);
  // Measure only, or the policy is idle: nothing waits on this record (drained on a timer).
  if (notify && site_eager(s)) wake_drain();
}

// The rank whose state an active arrive/done uses, or -1 (inactive shard / bad rank).
inline int32_t resolve_rank(const Site* s, int32_t rank_in) {
  if (rank_in < 0) return -1;
  int32_t r = s->fixed_rank >= 0 ? s->fixed_rank : rank_in;
  return r < s->num_slots ? r : -1;
}

// A CPU probe's rank operand when the program does not compute ranks: the site's table of
// ranks per local device ordinal (jaxpace_set_site_devices) gives it. Must match
// RANK_FROM_DEVICE in jaxpace/native/probes.py.
constexpr int32_t kRankFromDevice = -2;

// The rank the site's table gives local device `ordinal`, resolved; -1 when the table is
// missing or does not hold `ordinal`. (The CUDA handlers' ranks; the CPU ones' with
// kRankFromDevice.)
inline int32_t table_rank(const Site* s, int32_t ordinal) {
  const std::vector<int32_t>* t = s->ordinals.load(std::memory_order_acquire);
  if (t == nullptr || ordinal < 0 || ordinal >= static_cast<int32_t>(t->size())) return -1;
  return resolve_rank(s, (*t)[ordinal]);
}

// A CPU handler's rank: `rank_in`, or the table's for `ordinal` when it is kRankFromDevice.
inline int32_t shard_rank(const Site* s, int32_t rank_in, int32_t ordinal) {
  return rank_in == kRankFromDevice ? table_rank(s, ordinal) : resolve_rank(s, rank_in);
}

// This rank's three payload values (layout: jaxpace/collectives/exchange.py): its previous wait (s), the
// wait's presence and step (2 + step mod 2^20; 0: absent), its previous step time (s).
// Returns false when there is no previous wait (then all three are zero).
bool payload_values(const RankState& st, float v[3]) {
  int64_t w = st.prev_wait.load(std::memory_order_relaxed);
  int64_t d = st.prev_step_ns.load(std::memory_order_relaxed);
  v[0] = v[1] = v[2] = 0.0f;
  if (w < 0) return false;
  v[0] = static_cast<float>((w >> 20) * 1e-9);
  v[1] = static_cast<float>(2 + (w & (kStepTagMod - 1)));
  if (d > 0) v[2] = static_cast<float>(d * 1e-9);
  return true;
}

// Writes this rank's previous wait/step into a zeroed host payload.
void fill_payload(const Site* s, const RankState& st, int32_t r, float* p, int64_t len) {
  const int64_t n = s->num_slots;
  float v[3];
  if (len < 3 * n || !payload_values(st, v)) return;
  p[r] = v[0];
  p[n + r] = v[1];
  p[2 * n + r] = v[2];
}

// Common arrive logic. Returns the flag (step + 1 when this step is measured, else 0) and
// sets *delay to the delay to apply now (already clamped).
int32_t arrive_common(Site* s, int32_t r, int64_t t, int64_t* delay, int64_t* step_out) {
  RankState& st = s->ranks[r];
  int64_t step = st.next_step.fetch_add(1, std::memory_order_relaxed);
  int64_t d = st.pending_delay_ns.exchange(0, std::memory_order_relaxed);
  int64_t mx = s->max_delay_ns.load(std::memory_order_relaxed);
  if (mx < 0) mx = g_max_delay_ns.load(std::memory_order_relaxed);
  if (d > mx) d = mx;
  if (d < 0) d = 0;
  *delay = d;
  *step_out = step;
  if (s->sample_every > 1 && step % s->sample_every != 0) {
    s->unsampled.fetch_add(1, std::memory_order_relaxed);
    return 0;
  }
  if (st.open_step.load(std::memory_order_relaxed) >= 0)
    st.overlaps.fetch_add(1, std::memory_order_relaxed);
  st.open_arrive_ns.store(t, std::memory_order_relaxed);
  st.open_step.store(step, std::memory_order_release);
  return static_cast<int32_t>(1 + (step & 0x3fffffff));
}

// ------------------------------------------------------------------ CPU handlers

// The last `copies` operands copied, byte for byte, into the last `copies` results: the small
// operand leaves, which the collective then reads (a tie in the program is a kernel of its own
// wherever XLA cannot fuse it into the leaf's producer, e.g. for every `jit` argument). Any
// mismatch is an error: a result left unwritten would hand the collective garbage.
ffi::Error copy_through(const ffi::RemainingArgs& args, ffi::RemainingRets& rets, int64_t copies) {
  const size_t n = copies > 0 ? static_cast<size_t>(copies) : 0;
  auto bad = [] {
    return ffi::Error(ffi::ErrorCode::kInternal, "jaxpace arrive: operand/result mismatch");
  };
  if (n > args.size() || n > rets.size()) return bad();
  for (size_t i = 0; i < n; ++i) {
    auto src = args.get<ffi::AnyBuffer>(args.size() - n + i);
    auto dst = rets.get<ffi::AnyBuffer>(rets.size() - n + i);
    if (!src.has_value() || !dst.has_value()) return bad();
    size_t bytes = src->size_bytes();
    if (bytes != (*dst)->size_bytes()) return bad();
    if (bytes > 0) std::memcpy((*dst)->untyped_data(), src->untyped_data(), bytes);
  }
  return ffi::Error::Success();
}

// `ordinal`: the local device running this shard. `rank`: this shard's rank (-1: it does not
// measure; kRankFromDevice: the site's table gives it for `ordinal`). `deps`: the collective's
// operand leaves, passed only so that XLA runs this probe once they are ready; never read,
// except the last `copies`, which come back copied in the last `copies` results. The other
// results, `firsts`, are aliased to the operands before those (large leaves' first elements)
// and come back untouched.
ffi::Error ArriveCpu(int32_t ordinal, ffi::RunId run, ffi::BufferR0<ffi::S32> rank,
                     ffi::RemainingArgs deps,
                     ffi::ResultBufferR0<ffi::S32> flag, ffi::Result<ffi::BufferR1<ffi::F32>> pay,
                     ffi::RemainingRets firsts, int64_t site, int64_t copies) {
  // First, whatever the shard: every shard's collective reads these results.
  ffi::Error copied = copy_through(deps, firsts, copies);
  if (copied.failure()) return copied;
  const int64_t len = static_cast<int64_t>(pay->element_count());
  float* p = pay->typed_data();
  if (len > 0) std::memset(p, 0, sizeof(float) * len);
  flag->typed_data()[0] = 0;
  Site* s = site_of(site);
  if (s == nullptr) return ffi::Error::Success();
  int32_t r = shard_rank(s, rank.typed_data()[0], ordinal);
  if (r < 0) return ffi::Error::Success();
  int64_t t = now_ns();
  int64_t delay = 0, step = 0;
  int32_t f = arrive_common(s, r, t, &delay, &step);
  if (f > 0) s->ranks[r].open_run_id.store(run.run_id, std::memory_order_relaxed);
  if (f > 0 && len > 0) fill_payload(s, s->ranks[r], r, p, len);
  int64_t slept = interruptible_sleep(delay, &s->released);
  if (f > 0) {
    s->ranks[r].open_delay_ns.store(slept, std::memory_order_relaxed);
    // After the sleep (a sleep is never a stall); no second clock read without one.
    wd_arrive(s->ranks[r], step, slept > 0 ? now_ns() : t);
  }
  flag->typed_data()[0] = f;
  return ffi::Error::Success();
}

void done_record(Site* s, int32_t r, int64_t t_done, int64_t wait_ns, int32_t flags,
                 const float* reduced, int32_t plen) {
  RankState& st = s->ranks[r];
  int64_t step = st.open_step.exchange(-1, std::memory_order_acq_rel);
  if (step < 0) return;  // no open arrive: nothing to close
  wd_done(st, step);
  int64_t t_arr = st.open_arrive_ns.load(std::memory_order_relaxed);
  if (wait_ns < 0) wait_ns = t_done - t_arr;
  if (wait_ns < 0) return;  // a clock that went backwards: trust nothing
  st.prev_wait.store(pack_wait(wait_ns, step), std::memory_order_relaxed);
  int64_t last = st.last_done_ns.exchange(t_done, std::memory_order_relaxed);
  st.prev_step_ns.store(last >= 0 && t_done > last ? t_done - last : -1, std::memory_order_relaxed);
  RecordOut rec{step, t_arr, t_done, st.open_delay_ns.load(std::memory_order_relaxed), wait_ns, r,
                flags, st.open_run_id.load(std::memory_order_relaxed)};
  push_record(s, rec, reduced, plen);
}

// `reduced`: the reduced exchange payload (empty without one); `tag`: Arrive's flag (0: not
// measured); `ordinal` and `rank` as for Arrive. `deps`: the collective's output leaves, passed
// only so that XLA runs this probe once the collective has finished; never read.
ffi::Error DoneCpu(int32_t ordinal, ffi::BufferR1<ffi::F32> reduced, ffi::BufferR0<ffi::S32> tag,
                   ffi::BufferR0<ffi::S32> rank, ffi::RemainingArgs deps,
                   ffi::ResultBufferR0<ffi::F32> one, int64_t site) {
  (void)deps;
  int64_t t = now_ns();
  one->typed_data()[0] = 1.0f;  // never negative: the output tie keeps the result's bits
  if (tag.typed_data()[0] <= 0) return ffi::Error::Success();
  Site* s = site_of(site);
  if (s == nullptr) return ffi::Error::Success();
  int32_t r = shard_rank(s, rank.typed_data()[0], ordinal);
  if (r < 0) return ffi::Error::Success();
  done_record(s, r, t, -1, 0, reduced.typed_data(),
              static_cast<int32_t>(reduced.element_count()));
  return ffi::Error::Success();
}

// The CUDA handlers live in probe_cuda.cc (included at the end of this file).
void poll_gpu(Site* s);
int64_t gpu_in_flight(Site* s);

}  // namespace

// ------------------------------------------------------------------ FFI symbols

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpaceArriveCpu, ArriveCpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Ctx<ffi::RunId>()
                                  .Arg<ffi::BufferR0<ffi::S32>>()
                                  .RemainingArgs()
                                  .Ret<ffi::BufferR0<ffi::S32>>()
                                  .Ret<ffi::BufferR1<ffi::F32>>()
                                  .RemainingRets()
                                  .Attr<int64_t>("site")
                                  .Attr<int64_t>("copies"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpaceDoneCpu, DoneCpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::BufferR1<ffi::F32>>()
                                  .Arg<ffi::BufferR0<ffi::S32>>()
                                  .Arg<ffi::BufferR0<ffi::S32>>()
                                  .RemainingArgs()
                                  .Ret<ffi::BufferR0<ffi::F32>>()
                                  .Attr<int64_t>("site"));

// ------------------------------------------------------------------ C API (ctypes)

extern "C" {

int jaxpace_abi_version() { return kAbiVersion; }
int64_t jaxpace_now_ns() { return now_ns(); }

// Registers (or re-registers) site `id`. capacity is rounded up to a power of two.
// Returns 0 on success, -1 on bad arguments.
int jaxpace_register_site(int64_t id, int32_t num_slots, int64_t capacity, int32_t fixed_rank,
                          int64_t sample_every, int32_t payload_len) {
  if (id < 0 || id >= kMaxSites || num_slots <= 0 || num_slots > (1 << 20) || capacity <= 0 ||
      capacity > (1 << 24) || sample_every < 1 || payload_len < 0 || fixed_rank >= num_slots)
    return -1;
  int64_t cap = 1;
  while (cap < capacity) cap <<= 1;
  Site* s = new Site(num_slots, cap, payload_len);
  s->fixed_rank = fixed_rank;
  s->sample_every = sample_every;
  // The old site (if any) is leaked on purpose: a running handler may still hold it.
  g_sites[id].store(s, std::memory_order_release);
  return 0;
}

int jaxpace_set_delay_ns(int64_t id, int32_t rank, int64_t ns) {
  Site* s = site_of(id);
  if (s == nullptr || rank < 0 || rank >= s->num_slots) return -1;
  s->ranks[rank].pending_delay_ns.store(ns > 0 ? ns : 0, std::memory_order_relaxed);
  return 0;
}

// This site's delay bound (its policy's max_delay_s); -1 falls back to the global bound.
int jaxpace_set_site_max_delay_ns(int64_t id, int64_t ns) {
  Site* s = site_of(id);
  if (s == nullptr) return -1;
  s->max_delay_ns.store(ns < 0 ? -1 : ns, std::memory_order_relaxed);
  return 0;
}

void jaxpace_set_max_delay_ns(int64_t ns) { g_max_delay_ns.store(ns > 0 ? ns : 0); }

// Ends every sleep in progress and makes later ones return at once (until jaxpace_rearm).
void jaxpace_release_all() {
  g_released.store(1, std::memory_order_release);
  { std::lock_guard<std::mutex> lk(g_sleep_mu); }
  g_sleep_cv.notify_all();
  { std::lock_guard<std::mutex> lk(g_wait_mu); }
  g_wait_cv.notify_all();
}
// Ends the sleeps of one site (its pacer closed) and makes its later ones return at once.
int jaxpace_release_site(int64_t id) {
  Site* s = site_of(id);
  if (s == nullptr) return -1;
  s->released.store(1, std::memory_order_release);
  { std::lock_guard<std::mutex> lk(g_sleep_mu); }
  g_sleep_cv.notify_all();
  return 0;
}

void jaxpace_rearm() { g_released.store(0, std::memory_order_release); }
int jaxpace_released() { return g_released.load(std::memory_order_acquire); }

// Copies up to `max_n` finished records of site `id` (oldest first) into `out`, and their
// reduced payloads (payload_len floats each) into `payload_out` when non-null. Returns the
// count, or -1 for an unknown site. Records overwritten before being drained are counted in
// jaxpace_site_counters (dropped).
int64_t jaxpace_drain(int64_t id, int64_t max_n, RecordOut* out, float* payload_out) {
  Site* s = site_of(id);
  if (s == nullptr) return -1;
  poll_gpu(s);
  std::lock_guard<std::mutex> lk(s->drain_mu);
  uint64_t head = s->head.load(std::memory_order_acquire);
  if (head - s->tail > static_cast<uint64_t>(s->capacity)) {
    s->dropped.fetch_add(static_cast<int64_t>(head - s->tail - s->capacity));
    s->tail = head - s->capacity;
  }
  int64_t c = 0;
  while (s->tail < head && c < max_n) {
    uint64_t idx = s->tail;
    Slot& sl = s->slots[idx & (s->capacity - 1)];
    uint64_t s1 = sl.seq.load(std::memory_order_acquire);
    if (s1 < 2 * idx + 2) break;  // still being written: next drain
    RecordOut r{sl.f[0].load(std::memory_order_relaxed), sl.f[1].load(std::memory_order_relaxed),
                sl.f[2].load(std::memory_order_relaxed), sl.f[3].load(std::memory_order_relaxed),
                sl.f[4].load(std::memory_order_relaxed), sl.rank.load(std::memory_order_relaxed),
                sl.flags.load(std::memory_order_relaxed), sl.f[5].load(std::memory_order_relaxed)};
    if (payload_out != nullptr && s->payload_len > 0) {
      std::atomic<float>* src = &s->payloads[(idx & (s->capacity - 1)) * s->payload_len];
      for (int32_t i = 0; i < s->payload_len; ++i)
        payload_out[c * s->payload_len + i] = src[i].load(std::memory_order_relaxed);
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    uint64_t s2 = sl.seq.load(std::memory_order_relaxed);
    s->tail += 1;
    if (s1 != 2 * idx + 2 || s2 != s1) {  // overwritten while we read it
      s->dropped.fetch_add(1);
      continue;
    }
    out[c++] = r;
  }
  return c;
}

// Whether records of site `id` wake the drain thread (1) or wait for its timer (0).
int jaxpace_set_site_wake(int64_t id, int32_t on) {
  Site* s = site_of(id);
  if (s == nullptr) return -1;
  s->wake.store(on != 0 ? 1 : 0, std::memory_order_relaxed);
  return 0;
}

// What a drain would find: the records pushed and not yet drained, plus 1 while the site has
// GPU event pairs (their records are pushed by the drain's own poll). -1: unknown site.
// Lets the drain thread skip sites with nothing new at a few ns each.
int64_t jaxpace_site_pending(int64_t id) {
  Site* s = site_of(id);
  if (s == nullptr) return -1;
  std::lock_guard<std::mutex> lk(s->drain_mu);
  uint64_t head = s->head.load(std::memory_order_acquire);
  return static_cast<int64_t>(head - s->tail) + gpu_in_flight(s);
}

// counters[0..7] = records pushed, dropped, unsampled arrivals, overlapping arrivals, capacity,
// CUDA calls failed, measured GPU steps left unrecorded by an error, 1 when the site's CUDA
// handlers were disabled after repeated errors.
int jaxpace_site_counters(int64_t id, int64_t* counters) {
  Site* s = site_of(id);
  if (s == nullptr) return -1;
  int64_t overlaps = 0;
  for (auto& st : s->ranks) overlaps += st.overlaps.load();
  counters[0] = static_cast<int64_t>(s->head.load());
  counters[1] = s->dropped.load();
  counters[2] = s->unsampled.load();
  counters[3] = overlaps;
  counters[4] = s->capacity;
  counters[5] = s->cuda_errors.load();
  counters[6] = s->gpu_invalid.load();
  counters[7] = s->gpu_disabled.load();
  return 0;
}

// Stall watchdog: for ranks 0..min(n, num_slots)-1 of site `id`, writes 4 int64 per rank into
// `out`: last measured step arrived at (-1: none), its steady-clock ns after the pacing sleep,
// last measured step finished (-1: none), and arrivals counted (sampled or not). Lock-free
// reads; a rank arrived at step k and not done with it has arrived > done. Returns the ranks
// written, or -1 for an unknown site.
int64_t jaxpace_site_progress(int64_t id, int64_t* out, int64_t n) {
  Site* s = site_of(id);
  if (s == nullptr || out == nullptr || n < 0) return -1;
  int64_t m = std::min<int64_t>(n, s->num_slots);
  for (int64_t r = 0; r < m; ++r) {
    const RankState& st = s->ranks[r];
    int64_t a = st.wd_arrived.load(std::memory_order_acquire);
    out[4 * r] = a - 1;
    out[4 * r + 1] = a > 0 ? st.wd_arrived_ns.load(std::memory_order_relaxed) : 0;
    out[4 * r + 2] = st.wd_done.load(std::memory_order_acquire) - 1;
    out[4 * r + 3] = st.next_step.load(std::memory_order_relaxed);
  }
  return m;
}

// Blocks (GIL released by ctypes) until more records than `seen` were pushed by sites that
// can delay, the timeout passes, or jaxpace_release_all is called. Returns that total so far.
uint64_t jaxpace_wait_records(uint64_t seen, int64_t timeout_ns) {
  uint64_t cur = g_pushed_eager.load(std::memory_order_acquire);
  if (cur != seen || timeout_ns <= 0) return cur;
  g_waiters.fetch_add(1);
  {
    std::unique_lock<std::mutex> lk(g_wait_mu);
    g_wait_cv.wait_for(lk, std::chrono::nanoseconds(timeout_ns), [&] {
      return g_pushed_eager.load(std::memory_order_acquire) != seen ||
             g_released.load(std::memory_order_acquire) != 0;
    });
  }
  g_waiters.fetch_sub(1);
  return g_pushed_eager.load(std::memory_order_acquire);
}


}  // extern "C"

#include "probe_cuda.cc"  // CUDA handlers, their set-up and the drain's poll
