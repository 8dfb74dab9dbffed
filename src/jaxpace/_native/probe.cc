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
// CPU handlers use std::chrono::steady_clock. CUDA handlers (same .so, registered only when XLA
// has a CUDA backend) record cudaEvents on XLA's stream and delay with cudaLaunchHostFunc; the
// CUDA runtime is dlopen'ed at run time, so the build needs no CUDA toolkit. The CUDA path is
// compiled here but has not been run on a GPU yet (see benchmarks/gpu.sh).
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

constexpr int kAbiVersion = 3;  // 2: jaxpace_site_progress; 3: site_pending, site_wake
constexpr int kMaxSites = 4096;

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ------------------------------------------------------------------ release / sleep

std::mutex g_sleep_mu;
std::condition_variable g_sleep_cv;
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

// Layout shared with Python (numpy dtype NATIVE_RECORD_DTYPE in primitive.py): 48 bytes.
struct RecordOut {
  int64_t step;
  int64_t arrive_ns;
  int64_t done_ns;
  int64_t delay_ns;
  int64_t wait_ns;  // done - arrive (CPU); done event - arrive event (GPU)
  int32_t rank;
  int32_t flags;  // bit 0: measured on a GPU stream
};
static_assert(sizeof(RecordOut) == 48, "record layout");

// One ring slot: seqlock (2*idx+1 while written, 2*idx+2 when complete) over relaxed atomics.
struct Slot {
  std::atomic<uint64_t> seq{0};
  std::atomic<int64_t> f[5];
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
  // Exchange state: this rank's previous wait and step time (-1: unknown).
  std::atomic<int64_t> prev_wait_ns{-1};
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

struct GpuPair;  // CUDA bookkeeping, defined below

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
  // GPU: pending event pairs per rank (ring of kGpuDepth), polled by the drain.
  std::vector<GpuPair*> gpu;
  // GPU: rank of each local device ordinal (-1: that device's shard does not measure).
  std::vector<int32_t> rank_of_ordinal;
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
std::mutex g_wait_mu;
std::condition_variable g_wait_cv;

inline Site* site_of(int64_t id) {
  if (id < 0 || id >= kMaxSites) return nullptr;
  return g_sites[id].load(std::memory_order_acquire);
}

void push_record(Site* s, const RecordOut& r, const float* payload, int32_t plen) {
  uint64_t idx = s->head.fetch_add(1, std::memory_order_relaxed);
  Slot& sl = s->slots[idx & (s->capacity - 1)];
  sl.seq.store(2 * idx + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  sl.f[0].store(r.step, std::memory_order_relaxed);
  sl.f[1].store(r.arrive_ns, std::memory_order_relaxed);
  sl.f[2].store(r.done_ns, std::memory_order_relaxed);
  sl.f[3].store(r.delay_ns, std::memory_order_relaxed);
  sl.f[4].store(r.wait_ns, std::memory_order_relaxed);
  sl.rank.store(r.rank, std::memory_order_relaxed);
  sl.flags.store(r.flags, std::memory_order_relaxed);
  if (s->payload_len > 0) {
    std::atomic<float>* dst = &s->payloads[(idx & (s->capacity - 1)) * s->payload_len];
    for (int32_t i = 0; i < s->payload_len; ++i)
      dst[i].store(payload != nullptr && i < plen ? payload[i] : 0.0f, std::memory_order_relaxed);
  }
  sl.seq.store(2 * idx + 2, std::memory_order_release);
  int64_t mx = s->max_delay_ns.load(std::memory_order_relaxed);
  if (mx < 0) mx = g_max_delay_ns.load(std::memory_order_relaxed);
  if (mx <= 0) return;  // measure only: nothing waits on this record
  if (s->wake.load(std::memory_order_relaxed) == 0) return;  // policy idle: drained on a timer
  g_pushed_eager.fetch_add(1, std::memory_order_release);
  if (g_waiters.load(std::memory_order_acquire) > 0) {
    { std::lock_guard<std::mutex> lk(g_wait_mu); }
    g_wait_cv.notify_all();
  }
}

// The rank whose state an active arrive/done uses, or -1 (inactive shard / bad rank).
inline int32_t resolve_rank(const Site* s, int32_t rank_in) {
  if (rank_in < 0) return -1;
  int32_t r = s->fixed_rank >= 0 ? s->fixed_rank : rank_in;
  return r < s->num_slots ? r : -1;
}

// Writes this rank's previous wait/step into a zeroed host payload (layout: jaxpace/_exchange.py).
void fill_payload(const Site* s, const RankState& st, int32_t r, float* p, int64_t len) {
  const int64_t n = s->num_slots;
  if (len < 3 * n) return;
  int64_t w = st.prev_wait_ns.load(std::memory_order_relaxed);
  int64_t d = st.prev_step_ns.load(std::memory_order_relaxed);
  if (w >= 0) {
    p[r] = static_cast<float>(w * 1e-9);
    p[n + r] = 1.0f;
  }
  if (d > 0) p[2 * n + r] = static_cast<float>(d * 1e-9);
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

// `tr` = [bit pattern of the dependency token, rank (-1: this shard does not measure)].
ffi::Error ArriveCpu(ffi::BufferR1<ffi::S32> tr, ffi::ResultBufferR0<ffi::S32> flag,
                     ffi::Result<ffi::BufferR1<ffi::F32>> pay, int64_t site) {
  const int64_t len = static_cast<int64_t>(pay->element_count());
  float* p = pay->typed_data();
  if (len > 0) std::memset(p, 0, sizeof(float) * len);
  flag->typed_data()[0] = 0;
  Site* s = site_of(site);
  if (s == nullptr) return ffi::Error::Success();
  int32_t r = tr.element_count() >= 2 ? resolve_rank(s, tr.typed_data()[1]) : -1;
  if (r < 0) return ffi::Error::Success();
  int64_t t = now_ns();
  int64_t delay = 0, step = 0;
  int32_t f = arrive_common(s, r, t, &delay, &step);
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
  st.prev_wait_ns.store(wait_ns, std::memory_order_relaxed);
  int64_t last = st.last_done_ns.exchange(t_done, std::memory_order_relaxed);
  st.prev_step_ns.store(last >= 0 && t_done > last ? t_done - last : -1, std::memory_order_relaxed);
  RecordOut rec{step, t_arr, t_done, st.open_delay_ns.load(std::memory_order_relaxed), wait_ns, r,
                flags};
  push_record(s, rec, reduced, plen);
}

// `fr` = [flag from Arrive (0: not measured), rank].
ffi::Error DoneCpu(ffi::BufferR1<ffi::F32> reduced, ffi::BufferR1<ffi::S32> fr,
                   ffi::ResultBufferR0<ffi::F32> one, int64_t site) {
  int64_t t = now_ns();
  one->typed_data()[0] = 1.0f;  // never negative: the output tie keeps the result's bits
  if (fr.element_count() < 2 || fr.typed_data()[0] <= 0) return ffi::Error::Success();
  Site* s = site_of(site);
  if (s == nullptr) return ffi::Error::Success();
  int32_t r = resolve_rank(s, fr.typed_data()[1]);
  if (r < 0) return ffi::Error::Success();
  done_record(s, r, t, -1, 0, reduced.typed_data(),
              static_cast<int32_t>(reduced.element_count()));
  return ffi::Error::Success();
}

// ------------------------------------------------------------------ CUDA (dlopen'ed runtime)

// The few CUDA runtime declarations used (ABI-stable C API of libcudart.so.12).
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
typedef int cudaError_t;
typedef void (*cudaHostFn_t)(void*);
constexpr unsigned kCudaEventDefault = 0;
constexpr int kCudaMemcpyHostToDevice = 1;
constexpr int kCudaMemcpyDeviceToHost = 2;

struct Cuda {
  bool ok = false;
  cudaError_t (*EventCreateWithFlags)(cudaEvent_t*, unsigned) = nullptr;
  cudaError_t (*EventRecord)(cudaEvent_t, cudaStream_t) = nullptr;
  cudaError_t (*EventQuery)(cudaEvent_t) = nullptr;
  cudaError_t (*EventElapsedTime)(float*, cudaEvent_t, cudaEvent_t) = nullptr;
  cudaError_t (*LaunchHostFunc)(cudaStream_t, cudaHostFn_t, void*) = nullptr;
  cudaError_t (*MemcpyAsync)(void*, const void*, size_t, int, cudaStream_t) = nullptr;
  cudaError_t (*MemsetAsync)(void*, int, size_t, cudaStream_t) = nullptr;
  cudaError_t (*MallocHost)(void**, size_t) = nullptr;
};
Cuda g_cuda;
std::mutex g_cuda_mu;
char g_cuda_error[256] = "not loaded";

template <typename T>
bool load_sym(void* h, const char* name, T* out) {
  *out = reinterpret_cast<T>(dlsym(h, name));
  return *out != nullptr;
}

constexpr int kGpuDepth = 64;  // in-flight steps per (site, rank) before the oldest is dropped

// One step's events on the stream, plus pinned host memory for the reduced payload.
struct GpuStep {
  cudaEvent_t ev_arrive = nullptr, ev_done = nullptr;
  float* host_payload = nullptr;  // pinned, payload_len floats
  int64_t step = -1, host_arrive_ns = 0, delay_ns = 0;
  int state = 0;  // 0 free, 1 arrived, 2 done (waiting for the events)
};
struct GpuPair {
  GpuStep steps[kGpuDepth];
  int64_t seq = 0;  // next slot (handler thread)
  int64_t polled = 0;  // next slot to poll (drain thread)
  std::mutex mu;
};

struct HostSleep {
  int64_t ns;
  const std::atomic<int>* released;
};
void host_sleep_fn(void* p) {  // runs on CUDA's host-callback thread, never the enqueuer
  HostSleep* hs = static_cast<HostSleep*>(p);
  interruptible_sleep(hs->ns, hs->released);
  delete hs;
}

GpuPair* gpu_pair(Site* s, int32_t r) {
  std::lock_guard<std::mutex> lk(s->drain_mu);
  if (s->gpu.empty()) s->gpu.assign(s->num_slots, nullptr);
  if (s->gpu[r] == nullptr) s->gpu[r] = new GpuPair();
  return s->gpu[r];
}

// The rank of the shard on device `ordinal` (GPU: operands live in device memory, so the rank
// comes from the host-side table that Python registered for the site).
inline int32_t gpu_rank(const Site* s, int32_t ordinal) {
  if (s == nullptr || ordinal < 0 || ordinal >= static_cast<int32_t>(s->rank_of_ordinal.size()))
    return -1;
  return resolve_rank(s, s->rank_of_ordinal[ordinal]);
}

ffi::Error ArriveCuda(cudaStream_t stream, int32_t ordinal, ffi::BufferR1<ffi::S32> tr,
                      ffi::ResultBufferR0<ffi::S32> flag,
                      ffi::Result<ffi::BufferR1<ffi::F32>> pay, int64_t site) {
  (void)tr;  // device memory: reading the rank would need a sync; the ordinal table gives it
  if (!g_cuda.ok) return ffi::Error(ffi::ErrorCode::kInternal, "jaxpace: CUDA runtime not loaded");
  const int64_t len = static_cast<int64_t>(pay->element_count());
  std::vector<float> host(len > 0 ? len : 0, 0.0f);
  int32_t f = 0;
  Site* s = site_of(site);
  int32_t r = gpu_rank(s, ordinal);
  if (r >= 0) {
    int64_t delay = 0, step = 0;
    int64_t t = now_ns();
    f = arrive_common(s, r, t, &delay, &step);
    if (f > 0) {
      if (len > 0) fill_payload(s, s->ranks[r], r, host.data(), len);
      GpuPair* gp = gpu_pair(s, r);
      std::lock_guard<std::mutex> lk(gp->mu);
      GpuStep& gs = gp->steps[gp->seq % kGpuDepth];
      if (gs.state != 0) s->dropped.fetch_add(1, std::memory_order_relaxed);  // overrun
      if (gs.ev_arrive == nullptr) {
        g_cuda.EventCreateWithFlags(&gs.ev_arrive, kCudaEventDefault);
        g_cuda.EventCreateWithFlags(&gs.ev_done, kCudaEventDefault);
        if (s->payload_len > 0)
          g_cuda.MallocHost(reinterpret_cast<void**>(&gs.host_payload),
                            sizeof(float) * s->payload_len);
      }
      gs.step = step;
      gs.host_arrive_ns = t;
      gs.delay_ns = delay;
      gs.state = 1;
      g_cuda.EventRecord(gs.ev_arrive, stream);
      s->ranks[r].open_delay_ns.store(delay, std::memory_order_relaxed);
      // Host time of the enqueue plus the delay the stream sleeps first; done is marked when
      // the drain sees the done event complete (poll_gpu). Not yet run on a GPU.
      wd_arrive(s->ranks[r], step, t + delay);
    }
    if (delay > 0) g_cuda.LaunchHostFunc(stream, host_sleep_fn, new HostSleep{delay, &s->released});
  }
  // Pageable host -> device copies are staged at once: no stream or device synchronization.
  g_cuda.MemcpyAsync(flag->typed_data(), &f, sizeof(f), kCudaMemcpyHostToDevice, stream);
  if (len > 0)
    g_cuda.MemcpyAsync(pay->typed_data(), host.data(), sizeof(float) * len,
                       kCudaMemcpyHostToDevice, stream);
  return ffi::Error::Success();
}

ffi::Error DoneCuda(cudaStream_t stream, int32_t ordinal, ffi::BufferR1<ffi::F32> reduced,
                    ffi::BufferR1<ffi::S32> fr, ffi::ResultBufferR0<ffi::F32> one, int64_t site) {
  (void)fr;  // device memory; the open step on the host says whether this step is measured
  if (!g_cuda.ok) return ffi::Error(ffi::ErrorCode::kInternal, "jaxpace: CUDA runtime not loaded");
  static const float kOne = 1.0f;
  g_cuda.MemcpyAsync(one->typed_data(), &kOne, sizeof(kOne), kCudaMemcpyHostToDevice, stream);
  Site* s = site_of(site);
  int32_t r = gpu_rank(s, ordinal);
  if (r < 0) return ffi::Error::Success();
  RankState& st = s->ranks[r];
  int64_t step = st.open_step.exchange(-1, std::memory_order_acq_rel);
  if (step < 0) return ffi::Error::Success();
  GpuPair* gp = gpu_pair(s, r);
  std::lock_guard<std::mutex> lk(gp->mu);
  GpuStep& gs = gp->steps[gp->seq % kGpuDepth];
  if (gs.state != 1 || gs.step != step) return ffi::Error::Success();
  g_cuda.EventRecord(gs.ev_done, stream);
  if (s->payload_len > 0 && gs.host_payload != nullptr) {
    int64_t n = std::min<int64_t>(reduced.element_count(), s->payload_len);
    g_cuda.MemcpyAsync(gs.host_payload, reduced.typed_data(), sizeof(float) * n,
                       kCudaMemcpyDeviceToHost, stream);  // pinned: asynchronous
  }
  gs.state = 2;
  gp->seq += 1;
  return ffi::Error::Success();
}

// Reads finished GPU steps of one site (non-blocking cudaEventQuery) into its ring.
void poll_gpu(Site* s) {
  if (!g_cuda.ok) return;
  std::vector<GpuPair*> pairs;
  {
    std::lock_guard<std::mutex> lk(s->drain_mu);
    pairs = s->gpu;
  }
  for (size_t r = 0; r < pairs.size(); ++r) {
    GpuPair* gp = pairs[r];
    if (gp == nullptr) continue;
    std::lock_guard<std::mutex> lk(gp->mu);
    while (gp->polled < gp->seq) {
      GpuStep& gs = gp->steps[gp->polled % kGpuDepth];
      if (gs.state != 2) {
        gp->polled += 1;
        continue;
      }
      if (g_cuda.EventQuery(gs.ev_done) != 0) break;  // not reached yet (in order per stream)
      float ms = 0.0f;
      g_cuda.EventElapsedTime(&ms, gs.ev_arrive, gs.ev_done);
      int64_t wait = static_cast<int64_t>(static_cast<double>(ms) * 1e6);
      RankState& st = s->ranks[r];
      wd_done(st, gs.step);
      st.prev_wait_ns.store(wait, std::memory_order_relaxed);
      int64_t t_done = gs.host_arrive_ns + wait;  // host timeline estimate; durations are exact
      int64_t last = st.last_done_ns.exchange(t_done, std::memory_order_relaxed);
      st.prev_step_ns.store(last >= 0 && t_done > last ? t_done - last : -1,
                            std::memory_order_relaxed);
      RecordOut rec{gs.step, gs.host_arrive_ns, t_done, gs.delay_ns, wait,
                    static_cast<int32_t>(r), 1};
      push_record(s, rec, gs.host_payload, s->payload_len);
      gs.state = 0;
      gp->polled += 1;
    }
  }
}

}  // namespace

// ------------------------------------------------------------------ FFI symbols

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpaceArriveCpu, ArriveCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::BufferR1<ffi::S32>>()
                                  .Ret<ffi::BufferR0<ffi::S32>>()
                                  .Ret<ffi::BufferR1<ffi::F32>>()
                                  .Attr<int64_t>("site"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpaceDoneCpu, DoneCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::BufferR1<ffi::F32>>()
                                  .Arg<ffi::BufferR1<ffi::S32>>()
                                  .Ret<ffi::BufferR0<ffi::F32>>()
                                  .Attr<int64_t>("site"));

// Not marked command-buffer compatible: each call enqueues different work (its own events, a
// delay only when one is pending), which a captured CUDA graph would replay verbatim.
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpaceArriveCuda, ArriveCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::BufferR1<ffi::S32>>()
                                  .Ret<ffi::BufferR0<ffi::S32>>()
                                  .Ret<ffi::BufferR1<ffi::F32>>()
                                  .Attr<int64_t>("site"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpaceDoneCuda, DoneCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::BufferR1<ffi::F32>>()
                                  .Arg<ffi::BufferR1<ffi::S32>>()
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

// GPU: rank of each local device ordinal for site `id` (-1: not measured on that device).
int jaxpace_set_site_devices(int64_t id, const int32_t* rank_of_ordinal, int32_t n) {
  Site* s = site_of(id);
  if (s == nullptr || n < 0 || n > 4096) return -1;
  std::lock_guard<std::mutex> lk(s->drain_mu);
  s->rank_of_ordinal.assign(rank_of_ordinal, rank_of_ordinal + n);
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
                sl.flags.load(std::memory_order_relaxed)};
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

// counters[0..4] = records pushed, dropped, unsampled arrivals, overlapping arrivals, capacity.
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
  return static_cast<int64_t>(head - s->tail) + (s->gpu.empty() ? 0 : 1);
}

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

// Loads the CUDA runtime from `path` (or the default names when null/empty).
// Returns 1 when loaded; jaxpace_cuda_error() says why not.
int jaxpace_cuda_load(const char* path) {
  std::lock_guard<std::mutex> lk(g_cuda_mu);
  if (g_cuda.ok) return 1;
  const char* names[] = {path, "libcudart.so.12", "libcudart.so"};
  void* h = nullptr;
  for (const char* n : names) {
    if (n == nullptr || n[0] == '\0') continue;
    h = dlopen(n, RTLD_NOW | RTLD_LOCAL);
    if (h != nullptr) break;
  }
  if (h == nullptr) {
    const char* e = dlerror();
    std::snprintf(g_cuda_error, sizeof(g_cuda_error), "dlopen libcudart failed: %s",
                  e ? e : "unknown");
    return 0;
  }
  Cuda c;
  bool ok = load_sym(h, "cudaEventCreateWithFlags", &c.EventCreateWithFlags) &&
            load_sym(h, "cudaEventRecord", &c.EventRecord) &&
            load_sym(h, "cudaEventQuery", &c.EventQuery) &&
            load_sym(h, "cudaEventElapsedTime", &c.EventElapsedTime) &&
            load_sym(h, "cudaLaunchHostFunc", &c.LaunchHostFunc) &&
            load_sym(h, "cudaMemcpyAsync", &c.MemcpyAsync) &&
            load_sym(h, "cudaMemsetAsync", &c.MemsetAsync) &&
            load_sym(h, "cudaMallocHost", &c.MallocHost);
  if (!ok) {
    std::snprintf(g_cuda_error, sizeof(g_cuda_error), "libcudart lacks a needed symbol");
    return 0;
  }
  c.ok = true;
  g_cuda = c;
  g_cuda_error[0] = '\0';
  return 1;
}
const char* jaxpace_cuda_error() { return g_cuda_error; }

}  // extern "C"
