// jaxpace native probes, CUDA part: included at the end of probe.cc (one library, one
// translation unit; setup.py builds probe.cc). The CUDA runtime is dlopen'ed at run time.
//
// Per (site, rank) a GpuPair holds kGpuDepth step slots, each with three events and pinned host
// memory, all made by jaxpace_set_site_devices (at trace time, with that device current) and
// never inside a handler. A measured step enqueues on XLA's stream:
//   arrive: zero the outputs (memset), event `arrive`, [host function: sleep the delay],
//           copy the flag and this rank's 3 payload values (one 2-D copy) from pinned memory
//   done:   event `done`, copy the reduced payload to pinned memory, event `copied`,
//           [host function: wake the drain thread, when the site's policy may delay now]
// The drain (jaxpace_drain -> poll_gpu) makes each pair's device current, turns every step
// whose `copied` event completed into a record (wait = done - arrive, the payload read after
// its copy), and never blocks on the GPU. Every CUDA call is checked: a failure is counted,
// cleared from cudart's per-thread error state (jaxlib reads it), leaves its step unrecorded
// (never a wait of 0), and kMaxCudaStreak failures with no good record in between disable the
// site's CUDA handlers. A slot still waiting for the drain is never reused: a rank with
// kGpuDepth steps in flight leaves the next one unmeasured (counted as dropped).
//
// Tested on CPU against tests/native/fake_cudart.cc; not yet run on a GPU (benchmarks/gpu.sh).

// ------------------------------------------------------------------ the CUDA runtime API used

typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
typedef int cudaError_t;
typedef void (*cudaHostFn_t)(void*);

namespace {

constexpr unsigned kCudaEventDefault = 0;
constexpr unsigned kCudaEventDisableTiming = 2;
constexpr int kCudaMemcpyHostToDevice = 1;
constexpr int kCudaMemcpyDeviceToHost = 2;
constexpr cudaError_t kCudaErrorNotReady = 600;
constexpr int kGpuDepth = 64;  // steps in flight per (site, rank) before one goes unmeasured
constexpr int kSpareSleeps = 8;  // delays of unmeasured arrivals in flight per (site, rank)
constexpr int32_t kMaxCudaStreak = 16;  // failures in a row that disable a site's handlers

struct Cuda {
  bool ok = false;
  cudaError_t (*EventCreateWithFlags)(cudaEvent_t*, unsigned) = nullptr;
  cudaError_t (*EventRecord)(cudaEvent_t, cudaStream_t) = nullptr;
  cudaError_t (*EventQuery)(cudaEvent_t) = nullptr;
  cudaError_t (*EventElapsedTime)(float*, cudaEvent_t, cudaEvent_t) = nullptr;
  cudaError_t (*LaunchHostFunc)(cudaStream_t, cudaHostFn_t, void*) = nullptr;
  cudaError_t (*MemcpyAsync)(void*, const void*, size_t, int, cudaStream_t) = nullptr;
  cudaError_t (*Memcpy2DAsync)(void*, size_t, const void*, size_t, size_t, size_t, int,
                               cudaStream_t) = nullptr;
  cudaError_t (*MemsetAsync)(void*, int, size_t, cudaStream_t) = nullptr;
  cudaError_t (*MallocHost)(void**, size_t) = nullptr;
  cudaError_t (*GetDevice)(int*) = nullptr;
  cudaError_t (*SetDevice)(int) = nullptr;
  cudaError_t (*GetLastError)() = nullptr;
  cudaError_t (*PeekAtLastError)() = nullptr;
  const char* (*GetErrorString)(cudaError_t) = nullptr;
};
Cuda g_cuda;
std::mutex& g_cuda_mu = *new std::mutex;  // loading; the last error's text (never destroyed)
char g_cuda_error[256] = "not loaded";
float* g_one = nullptr;  // pinned 1.0f, the done probe's output (made at the first set-up)

template <typename T>
bool load_sym(void* h, const char* name, T* out) {
  *out = reinterpret_cast<T>(dlsym(h, name));
  return *out != nullptr;
}

// A delay slept by a host function on the stream; `slept` is what the record stores.
struct HostSleep {
  int64_t ns = 0;
  std::atomic<int64_t> slept{0};
  std::atomic<int> busy{0};
  const std::atomic<int>* released = nullptr;
};

struct GpuStep {
  cudaEvent_t ev_arrive = nullptr, ev_done = nullptr, ev_copied = nullptr;
  int32_t* host_flag = nullptr;  // pinned: the flag copied to the device
  float* host_vals = nullptr;  // pinned: this rank's 3 payload values copied to the device
  float* host_payload = nullptr;  // pinned: the reduced payload copied back (payload_len)
  int64_t step = -1, host_arrive_ns = 0, run_id = 0;
  HostSleep sleep;
  bool slept_here = false;  // this step's delay ran in `sleep` (else the record says 0)
  int state = 0;  // 0 free, 1 arrived, 2 enqueued (waiting for the drain), 3 failed
};

struct GpuPair {
  int32_t device = -1, rank = -1;
  GpuStep steps[kGpuDepth];
  HostSleep spare[kSpareSleeps];
  std::atomic<int64_t> seq{0};  // next slot (handler threads, under mu)
  std::atomic<int64_t> polled{0};  // next slot to poll (drain, under mu)
  std::mutex mu;
};

void set_error_text(const char* text) {
  std::lock_guard<std::mutex> lk(g_cuda_mu);
  std::snprintf(g_cuda_error, sizeof(g_cuda_error), "%s", text);
}

void note_error(cudaError_t rc, const char* what) {
  const char* text = g_cuda.GetErrorString != nullptr ? g_cuda.GetErrorString(rc) : nullptr;
  std::lock_guard<std::mutex> lk(g_cuda_mu);
  std::snprintf(g_cuda_error, sizeof(g_cuda_error), "%s failed: error %d (%s)", what, rc,
                text != nullptr ? text : "?");
}

// Checks one CUDA call. A failure is cleared from cudart's per-thread error state (jaxlib's own
// kernels read it), counted for the site, and keeps its text; kMaxCudaStreak failures since the
// site's last good record disable its handlers.
bool ck(Site* s, cudaError_t rc, const char* what) {
  if (rc == 0) return true;
  g_cuda.GetLastError();
  note_error(rc, what);
  if (s != nullptr) {
    s->cuda_errors.fetch_add(1, std::memory_order_relaxed);
    if (s->cuda_streak.fetch_add(1, std::memory_order_relaxed) + 1 >= kMaxCudaStreak)
      s->gpu_disabled.store(1, std::memory_order_relaxed);
  }
  return false;
}

void host_sleep_fn(void* p) {  // on CUDA's host-function thread: no CUDA calls here
  HostSleep* hs = static_cast<HostSleep*>(p);
  hs->slept.store(interruptible_sleep(hs->ns, hs->released), std::memory_order_release);
  hs->busy.store(0, std::memory_order_release);
}

void host_signal_fn(void*) { wake_drain(); }  // only signals: the drain does the CUDA calls

// The pair that measures on device `ordinal` for site `s`, and its rank; null when none.
GpuPair* pair_of(Site* s, int32_t ordinal, int32_t* r_out) {
  int32_t r = table_rank(s, ordinal);  // the table first: it is published after gpu_tab
  std::atomic<GpuPair*>* tab = s->gpu_tab.load(std::memory_order_acquire);
  if (tab == nullptr || r < 0) return nullptr;
  GpuPair* gp = tab[r].load(std::memory_order_acquire);
  if (gp == nullptr || gp->device != ordinal) return nullptr;  // one device per rank
  *r_out = r;
  return gp;
}

// The slot for a measured step (gp->mu held), or null when the drain has not yet read the step
// kGpuDepth back: the step is then not measured, and counted as dropped.
GpuStep* claim_step(Site* s, GpuPair* gp, int32_t r) {
  GpuStep* gs = &gp->steps[gp->seq.load(std::memory_order_relaxed) % kGpuDepth];
  if (gs->state == 2) {
    s->ranks[r].open_step.store(-1, std::memory_order_relaxed);
    s->dropped.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  return gs;  // free, or an arrive whose done never came (abandoned): reused
}

HostSleep* spare_sleep(GpuPair* gp) {
  for (HostSleep& hs : gp->spare)
    if (hs.busy.load(std::memory_order_acquire) == 0) return &hs;
  return nullptr;  // all in flight: this unmeasured arrival is not delayed
}

// Enqueues the delay's host function; false when it could not (then no delay).
bool launch_sleep(Site* s, HostSleep* hs, int64_t delay, cudaStream_t stream) {
  hs->ns = delay;
  hs->slept.store(0, std::memory_order_relaxed);
  hs->released = &s->released;
  hs->busy.store(1, std::memory_order_release);
  if (ck(s, g_cuda.LaunchHostFunc(stream, host_sleep_fn, hs), "cudaLaunchHostFunc")) return true;
  hs->ns = 0;
  hs->busy.store(0, std::memory_order_release);
  return false;
}

// A measured step's outputs: the flag, then this rank's 3 payload values (one 2-D copy into
// slots r, n + r, 2n + r of the zeroed payload), from the step's pinned memory.
bool copy_arrive_outputs(Site* s, GpuStep* gs, int32_t r, int32_t f, int32_t* flag_dev,
                         float* pay_dev, int64_t len, cudaStream_t stream) {
  *gs->host_flag = f;
  if (!ck(s, g_cuda.MemcpyAsync(flag_dev, gs->host_flag, sizeof(int32_t), kCudaMemcpyHostToDevice,
                                stream),
          "cudaMemcpyAsync"))
    return false;
  const int64_t n = s->num_slots;
  if (len < 3 * n || !payload_values(s->ranks[r], gs->host_vals)) return true;
  return ck(s,
            g_cuda.Memcpy2DAsync(pay_dev + r, sizeof(float) * n, gs->host_vals, sizeof(float),
                                 sizeof(float), 3, kCudaMemcpyHostToDevice, stream),
            "cudaMemcpy2DAsync");
}

// What one arrive enqueues. Returns an error only when the outputs could not be zeroed (the
// step must not run on undefined bits); any other failure is counted and leaves the step
// unrecorded.
const char* arrive_cuda(cudaStream_t stream, int32_t ordinal, int64_t run_id, int64_t site,
                        int32_t* flag_dev, float* pay_dev, int64_t len) {
  if (!g_cuda.ok) return "jaxpace: CUDA runtime not loaded";
  Site* s = site_of(site);
  if (!ck(s, g_cuda.MemsetAsync(flag_dev, 0, sizeof(int32_t), stream), "cudaMemsetAsync") ||
      (len > 0 &&
       !ck(s, g_cuda.MemsetAsync(pay_dev, 0, sizeof(float) * len, stream), "cudaMemsetAsync")))
    return "jaxpace: the arrive probe could not zero its outputs (cudaMemsetAsync failed)";
  int32_t r = -1;
  GpuPair* gp = s != nullptr ? pair_of(s, ordinal, &r) : nullptr;
  if (gp == nullptr || s->gpu_disabled.load(std::memory_order_relaxed) != 0) return nullptr;
  int64_t t = now_ns(), delay = 0, step = 0;
  int32_t f = arrive_common(s, r, t, &delay, &step);
  std::lock_guard<std::mutex> lk(gp->mu);
  GpuStep* gs = f > 0 ? claim_step(s, gp, r) : nullptr;
  bool ok = true;
  if (gs != nullptr) {
    gs->step = step;
    gs->host_arrive_ns = t;
    gs->run_id = run_id;
    gs->slept_here = false;
    ok = ck(s, g_cuda.EventRecord(gs->ev_arrive, stream), "cudaEventRecord");
  }
  // A reused slot whose abandoned arrive's sleep is still queued keeps it: no delay then.
  HostSleep* hs = gs != nullptr ? (gs->sleep.busy.load(std::memory_order_acquire) ? nullptr
                                                                                   : &gs->sleep)
                                : spare_sleep(gp);
  if (delay > 0 && (hs == nullptr || !launch_sleep(s, hs, delay, stream))) delay = 0;
  if (gs != nullptr) gs->slept_here = delay > 0;
  if (gs == nullptr) return nullptr;
  ok = ok && copy_arrive_outputs(s, gs, r, f, flag_dev, pay_dev, len, stream);
  gs->state = ok ? 1 : 3;
  s->ranks[r].open_delay_ns.store(delay, std::memory_order_relaxed);
  // Host time of the enqueue plus the delay the stream sleeps first; done is marked when the
  // drain reads the step (poll_gpu).
  wd_arrive(s->ranks[r], step, t + delay);
  return nullptr;
}

// What one done enqueues. Returns an error only when its output could not be written.
const char* done_cuda(cudaStream_t stream, int32_t ordinal, int64_t site, const float* red_dev,
                      int64_t n_red, float* one_dev) {
  if (!g_cuda.ok) return "jaxpace: CUDA runtime not loaded";
  Site* s = site_of(site);
  // 1.0 from pinned memory; +0.0 (a memset) before any set-up made it: never negative either way.
  cudaError_t rc = g_one != nullptr ? g_cuda.MemcpyAsync(one_dev, g_one, sizeof(float),
                                                         kCudaMemcpyHostToDevice, stream)
                                    : g_cuda.MemsetAsync(one_dev, 0, sizeof(float), stream);
  if (!ck(s, rc, "cudaMemcpyAsync")) return "jaxpace: the done probe could not write its output";
  int32_t r = -1;
  GpuPair* gp = s != nullptr ? pair_of(s, ordinal, &r) : nullptr;
  if (gp == nullptr) return nullptr;
  int64_t step = s->ranks[r].open_step.exchange(-1, std::memory_order_acq_rel);
  if (step < 0) return nullptr;
  std::lock_guard<std::mutex> lk(gp->mu);
  GpuStep& gs = gp->steps[gp->seq.load(std::memory_order_relaxed) % kGpuDepth];
  if (gs.step != step || (gs.state != 1 && gs.state != 3)) return nullptr;
  bool ok = gs.state == 1 && s->gpu_disabled.load(std::memory_order_relaxed) == 0 &&
            ck(s, g_cuda.EventRecord(gs.ev_done, stream), "cudaEventRecord");
  const int64_t plen = s->payload_len;
  if (ok && plen > 0) {
    int64_t n = std::min<int64_t>(std::max<int64_t>(n_red, 0), plen);
    std::fill(gs.host_payload + n, gs.host_payload + plen, 0.0f);  // no copy pending here
    ok = n == 0 || ck(s,
                      g_cuda.MemcpyAsync(gs.host_payload, red_dev, sizeof(float) * n,
                                         kCudaMemcpyDeviceToHost, stream),
                      "cudaMemcpyAsync");
  }
  ok = ok && ck(s, g_cuda.EventRecord(gs.ev_copied, stream), "cudaEventRecord");
  // A site whose policy may delay now wakes the drain as soon as the GPU is there; a failed
  // launch only means the drain's timer finds the step.
  if (ok && site_eager(s)) ck(s, g_cuda.LaunchHostFunc(stream, host_signal_fn, nullptr),
                              "cudaLaunchHostFunc");
  gs.state = ok ? 2 : 3;
  gp->seq.fetch_add(1, std::memory_order_relaxed);
  return nullptr;
}

ffi::Error ffi_result(const char* err) {
  return err == nullptr ? ffi::Error::Success() : ffi::Error(ffi::ErrorCode::kInternal, err);
}

ffi::Error ArriveCuda(cudaStream_t stream, int32_t ordinal, ffi::RunId run,
                      ffi::BufferR0<ffi::S32> rank,
                      ffi::RemainingArgs deps, ffi::ResultBufferR0<ffi::S32> flag,
                      ffi::Result<ffi::BufferR1<ffi::F32>> pay, ffi::RemainingRets firsts,
                      int64_t site) {
  (void)rank;  // device memory: reading the rank would need a sync; the ordinal table gives it
  (void)deps;  // the operand leaves: a dependency only
  (void)firsts;  // aliased to the last operands: they come back as they are, untouched
  return ffi_result(arrive_cuda(stream, ordinal, run.run_id, site, flag->typed_data(),
                                pay->typed_data(), static_cast<int64_t>(pay->element_count())));
}

ffi::Error DoneCuda(cudaStream_t stream, int32_t ordinal, ffi::BufferR1<ffi::F32> reduced,
                    ffi::BufferR0<ffi::S32> tag, ffi::BufferR0<ffi::S32> rank,
                    ffi::RemainingArgs deps, ffi::ResultBufferR0<ffi::F32> one, int64_t site) {
  // Device memory; the open step on the host says whether this step is measured.
  (void)tag;
  (void)rank;
  (void)deps;  // the output leaves: a dependency only
  return ffi_result(done_cuda(stream, ordinal, site, reduced.typed_data(),
                              static_cast<int64_t>(reduced.element_count()), one->typed_data()));
}

// ------------------------------------------------------------------ the drain's poll

// Makes `dev` current on this thread (the drain's events live on several devices).
bool use_device(Site* s, int32_t dev, int* cur) {
  if (*cur == dev) return true;
  if (!ck(s, g_cuda.SetDevice(dev), "cudaSetDevice")) return false;
  *cur = dev;
  return true;
}

// One finished step into the ring; false when its times could not be read.
bool push_gpu_record(Site* s, GpuPair* gp, GpuStep& gs) {
  float ms = 0.0f;
  if (!ck(s, g_cuda.EventElapsedTime(&ms, gs.ev_arrive, gs.ev_done), "cudaEventElapsedTime"))
    return false;
  int64_t wait = static_cast<int64_t>(static_cast<double>(ms) * 1e6);
  if (wait < 0) return false;
  RankState& st = s->ranks[gp->rank];
  wd_done(st, gs.step);
  st.prev_wait.store(pack_wait(wait, gs.step), std::memory_order_relaxed);
  int64_t t_done = gs.host_arrive_ns + wait;  // host timeline estimate; durations are exact
  int64_t last = st.last_done_ns.exchange(t_done, std::memory_order_relaxed);
  st.prev_step_ns.store(last >= 0 && t_done > last ? t_done - last : -1,
                        std::memory_order_relaxed);
  int64_t slept = gs.slept_here ? gs.sleep.slept.load(std::memory_order_acquire) : 0;
  RecordOut rec{gs.step, gs.host_arrive_ns, t_done, slept, wait, gp->rank, 1, gs.run_id};
  push_record(s, rec, gs.host_payload, s->payload_len, /*notify=*/false);
  s->cuda_streak.store(0, std::memory_order_relaxed);
  return true;
}

// Reads one pair's finished steps, in order; stops at the first still on the GPU.
void poll_pair(Site* s, GpuPair* gp, int* cur) {
  std::lock_guard<std::mutex> lk(gp->mu);
  while (gp->polled.load(std::memory_order_relaxed) < gp->seq.load(std::memory_order_relaxed)) {
    GpuStep& gs = gp->steps[gp->polled.load(std::memory_order_relaxed) % kGpuDepth];
    bool good = false;
    if (gs.state == 2) {
      if (!use_device(s, gp->device, cur)) return;
      cudaError_t q = g_cuda.EventQuery(gs.ev_copied);
      if (q == kCudaErrorNotReady) {
        if (g_cuda.PeekAtLastError() == kCudaErrorNotReady) g_cuda.GetLastError();
        return;  // not reached yet (steps complete in order on a stream)
      }
      good = ck(s, q, "cudaEventQuery") && push_gpu_record(s, gp, gs);
    }
    if (!good) s->gpu_invalid.fetch_add(1, std::memory_order_relaxed);
    gs.state = 0;
    gp->polled.fetch_add(1, std::memory_order_relaxed);
  }
}

// Reads finished GPU steps of one site into its ring (non-blocking cudaEventQuery), each with
// its device current; the caller's current device is restored when it is one of them.
void poll_gpu(Site* s) {
  if (!g_cuda.ok || s->gpu_tab.load(std::memory_order_acquire) == nullptr) return;
  std::lock_guard<std::mutex> lk(s->drain_mu);
  int prev = -1;
  if (g_cuda.GetDevice(&prev) != 0) {
    g_cuda.GetLastError();
    prev = -1;
  }
  int cur = prev;
  bool restore = false;
  for (GpuPair* gp : s->gpu_list) {
    restore = restore || gp->device == prev;
    poll_pair(s, gp, &cur);
  }
  // Restoring a device this site does not use could create a context there: left alone.
  if (restore && cur != prev) ck(s, g_cuda.SetDevice(prev), "cudaSetDevice");
}

// Measured GPU steps enqueued and not yet read by the drain (lock-free).
int64_t gpu_in_flight(Site* s) {
  std::atomic<GpuPair*>* tab = s->gpu_tab.load(std::memory_order_acquire);
  if (tab == nullptr) return 0;
  int64_t n = 0;
  for (GpuPair* gp : s->gpu_list)
    n += gp->seq.load(std::memory_order_relaxed) - gp->polled.load(std::memory_order_relaxed);
  return n;
}

// ------------------------------------------------------------------ set-up (trace time)

// Events and pinned memory of one pair, made with its device current.
bool setup_pair(Site* s, GpuPair* gp) {
  if (!ck(s, g_cuda.SetDevice(gp->device), "cudaSetDevice")) return false;
  if (g_one == nullptr) {
    void* one = nullptr;
    if (!ck(s, g_cuda.MallocHost(&one, sizeof(float)), "cudaMallocHost")) return false;
    *static_cast<float*>(one) = 1.0f;
    g_one = static_cast<float*>(one);
  }
  const size_t stride = (sizeof(int32_t) + 3 * sizeof(float) + sizeof(float) * s->payload_len +
                         63) / 64 * 64;
  void* block = nullptr;
  if (!ck(s, g_cuda.MallocHost(&block, stride * kGpuDepth), "cudaMallocHost")) return false;
  std::memset(block, 0, stride * kGpuDepth);
  for (int i = 0; i < kGpuDepth; ++i) {
    GpuStep& gs = gp->steps[i];
    char* base = static_cast<char*>(block) + stride * i;
    gs.host_flag = reinterpret_cast<int32_t*>(base);
    gs.host_vals = reinterpret_cast<float*>(base + sizeof(int32_t));
    gs.host_payload = reinterpret_cast<float*>(base + sizeof(int32_t) + 3 * sizeof(float));
    if (!ck(s, g_cuda.EventCreateWithFlags(&gs.ev_arrive, kCudaEventDefault), "cudaEventCreate") ||
        !ck(s, g_cuda.EventCreateWithFlags(&gs.ev_done, kCudaEventDefault), "cudaEventCreate") ||
        !ck(s, g_cuda.EventCreateWithFlags(&gs.ev_copied, kCudaEventDisableTiming),
            "cudaEventCreate"))
      return false;
  }
  return true;
}

// Pairs for the ranks measured on this process's devices (drain_mu held). Returns 0, or -2
// when a CUDA call failed (jaxpace_cuda_error says which).
int setup_pairs(Site* s, const std::vector<int32_t>& ranks) {
  std::atomic<GpuPair*>* tab = s->gpu_tab.load(std::memory_order_acquire);
  if (tab == nullptr) {
    tab = new std::atomic<GpuPair*>[s->num_slots];
    for (int32_t i = 0; i < s->num_slots; ++i) tab[i].store(nullptr, std::memory_order_relaxed);
    s->gpu_tab.store(tab, std::memory_order_release);
  }
  int prev = -1;
  if (g_cuda.GetDevice(&prev) != 0) g_cuda.GetLastError();
  bool restore = false;  // only to a device this site uses: cudaSetDevice makes a context
  int rc = 0;
  for (int32_t o = 0; o < static_cast<int32_t>(ranks.size()) && rc == 0; ++o) {
    int32_t r = resolve_rank(s, ranks[o]);
    restore = restore || (r >= 0 && o == prev);
    if (r < 0 || tab[r].load(std::memory_order_acquire) != nullptr) continue;
    GpuPair* gp = new GpuPair();
    gp->device = o;
    gp->rank = r;
    if (!setup_pair(s, gp)) {
      rc = -2;  // the pair is leaked: a failure path, before any program used it
      break;
    }
    s->gpu_list.push_back(gp);
    tab[r].store(gp, std::memory_order_release);
  }
  if (restore) ck(s, g_cuda.SetDevice(prev), "cudaSetDevice");
  return rc;
}

}  // namespace

// ------------------------------------------------------------------ FFI symbols (CUDA)

// Not marked command-buffer compatible: each call enqueues different work (its own events, a
// delay only when one is pending), which a captured CUDA graph would replay verbatim.
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpaceArriveCuda, ArriveCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Ctx<ffi::RunId>()
                                  .Arg<ffi::BufferR0<ffi::S32>>()
                                  .RemainingArgs()
                                  .Ret<ffi::BufferR0<ffi::S32>>()
                                  .Ret<ffi::BufferR1<ffi::F32>>()
                                  .RemainingRets()
                                  .Attr<int64_t>("site"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpaceDoneCuda, DoneCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::BufferR1<ffi::F32>>()
                                  .Arg<ffi::BufferR0<ffi::S32>>()
                                  .Arg<ffi::BufferR0<ffi::S32>>()
                                  .RemainingArgs()
                                  .Ret<ffi::BufferR0<ffi::F32>>()
                                  .Attr<int64_t>("site"));

// ------------------------------------------------------------------ C API (CUDA)

extern "C" {

// GPU: the rank of each local device ordinal for site `id` (-1: not measured on that device).
// With a CUDA runtime loaded, also makes the events and pinned memory of those ranks (each
// with its device current; the caller's current device is restored). Returns 0, -1 on bad
// arguments, -2 when a CUDA call failed (jaxpace_cuda_error says which).
// `cuda` 0: only the table (the CPU handlers' ranks), never CUDA events, even with a CUDA
// runtime loaded.
int jaxpace_set_site_devices(int64_t id, const int32_t* rank_of_ordinal, int32_t n,
                             int32_t cuda) {
  Site* s = site_of(id);
  if (s == nullptr || n < 0 || n > 4096 || (n > 0 && rank_of_ordinal == nullptr)) return -1;
  std::lock_guard<std::mutex> lk(s->drain_mu);
  auto* ranks = new std::vector<int32_t>(rank_of_ordinal, rank_of_ordinal + n);
  int rc = cuda != 0 && g_cuda.ok ? setup_pairs(s, *ranks) : 0;
  s->ordinals.store(ranks, std::memory_order_release);  // the old table is leaked on purpose
  return rc;
}

// Loads the CUDA runtime from `path` (or the default names when null/empty).
// Returns 1 when loaded; jaxpace_cuda_error() says why not.
int jaxpace_cuda_load(const char* path) {
  std::lock_guard<std::mutex> lk(g_cuda_mu);
  if (g_cuda.ok) return 1;
  const char* names[] = {path, "libcudart.so.13", "libcudart.so.12", "libcudart.so"};
  void* h = nullptr;
  for (const char* n : names) {
    if (n == nullptr || n[0] == '\0') continue;
    h = dlopen(n, RTLD_NOW | RTLD_LOCAL);
    if (h != nullptr || (path != nullptr && path[0] != '\0')) break;  // a path: that one only
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
            load_sym(h, "cudaMemcpy2DAsync", &c.Memcpy2DAsync) &&
            load_sym(h, "cudaMemsetAsync", &c.MemsetAsync) &&
            load_sym(h, "cudaMallocHost", &c.MallocHost) &&
            load_sym(h, "cudaGetDevice", &c.GetDevice) &&
            load_sym(h, "cudaSetDevice", &c.SetDevice) &&
            load_sym(h, "cudaGetLastError", &c.GetLastError) &&
            load_sym(h, "cudaPeekAtLastError", &c.PeekAtLastError) &&
            load_sym(h, "cudaGetErrorString", &c.GetErrorString);
  if (!ok) {
    std::snprintf(g_cuda_error, sizeof(g_cuda_error), "libcudart lacks a needed symbol");
    return 0;
  }
  c.ok = true;
  g_cuda = c;
  g_cuda_error[0] = '\0';
  return 1;
}

// The last CUDA failure's text (or why the runtime did not load). Copied under the lock.
const char* jaxpace_cuda_error() {
  thread_local char buf[256];
  std::lock_guard<std::mutex> lk(g_cuda_mu);
  std::memcpy(buf, g_cuda_error, sizeof(buf));
  return buf;
}

constexpr int64_t kTestRunId = 7;  // must match tests/native/test_cuda_probe_fake.py

// Test entry points (tests/test_cuda_probe_fake.py): the CUDA handlers' bodies without XLA,
// on a stream and "device" buffers of a stand-in cudart. 0: success; 1: the handler's error.
int jaxpace_test_arrive_cuda(void* stream, int32_t ordinal, int64_t site, int32_t* flag_dev,
                             float* pay_dev, int64_t len) {
  // XLA's run id in a program; here a fixed one the test can find in the records.
  const char* err = arrive_cuda(static_cast<cudaStream_t>(stream), ordinal, kTestRunId, site,
                                flag_dev, pay_dev, len);
  if (err != nullptr) set_error_text(err);
  return err == nullptr ? 0 : 1;
}
int jaxpace_test_done_cuda(void* stream, int32_t ordinal, int64_t site, const float* red_dev,
                           int64_t n, float* one_dev) {
  const char* err =
      done_cuda(static_cast<cudaStream_t>(stream), ordinal, site, red_dev, n, one_dev);
  if (err != nullptr) set_error_text(err);
  return err == nullptr ? 0 : 1;
}

}  // extern "C"
