// A stand-in for libcudart, for testing jaxpace's CUDA probe handlers on a machine without a GPU.
//
// Implements the CUDA runtime symbols probe_cuda.cc uses, with CUDA's documented semantics where
// they matter to the probes:
// - a stream is a FIFO worker thread: memcpy/memset/event records/host functions run in enqueue
//   order, later work waits for earlier work (a host function that sleeps delays the rest);
// - copies read their source when the stream reaches them (pinned-memory semantics), so a host
//   buffer reused too early shows up as wrong data; copies from or to memory that did not come
//   from cudaMallocHost are counted ("pageable"), as are cudaMallocHost calls;
// - an event is complete once the stream has executed its last record; cudaEventQuery returns
//   cudaErrorNotReady (600) until then; an event belongs to the device current at its creation,
//   and querying or timing it from a thread whose current device differs fails with
//   cudaErrorInvalidResourceHandle (400) and is counted ("wrong_device");
// - the current device and the last error are per thread (cudaGetLastError clears it);
// - errors are injected per API name: the next `count` calls return `code` and set the last
//   error.
// Test controls (fake_*): streams per device, counters, error injection, and holding the stream
// worker before device-to-host copies (to catch a reader that does not wait for the copy).
//
// Build: g++ -O1 -shared -fPIC -std=c++17 fake_cudart.cc -o libfakecudart.so -lpthread

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace {

constexpr int kNotReady = 600, kInvalidHandle = 400, kInvalidDevice = 101, kInvalidValue = 1;
constexpr int kH2D = 1, kD2H = 2;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::mutex g_mu;  // counters, injection, pinned ranges, hold state
std::condition_variable g_cv;
std::map<std::string, int64_t> g_counts;
struct Inject {
  int count = 0, code = 0;
};
std::map<std::string, Inject> g_inject;
std::map<uintptr_t, size_t> g_pinned;  // start -> size
int g_num_devices = 2;
bool g_hold_d2h = false;  // stream workers stop before each device-to-host copy
int g_held = 0;  // workers waiting at a held copy
bool g_gate_closed = false;  // fake_stream_gate tasks wait while set
thread_local int t_device = 0;
thread_local int t_last_error = 0;

void count(const std::string& what, int64_t n = 1) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_counts[what] += n;
}

// The injected result of one call to `api` (0: none), set as this thread's last error.
int injected(const char* api) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_counts[api] += 1;
  auto it = g_inject.find(api);
  if (it == g_inject.end() || it->second.count <= 0) return 0;
  it->second.count -= 1;
  t_last_error = it->second.code;
  return it->second.code;
}

int fail(int code) {
  t_last_error = code;
  return code;
}

bool pinned(const void* p) {
  std::lock_guard<std::mutex> lk(g_mu);
  auto u = reinterpret_cast<uintptr_t>(p);
  auto it = g_pinned.upper_bound(u);
  if (it == g_pinned.begin()) return false;
  --it;
  return u < it->first + it->second;
}

struct Stream {
  int device = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<int, std::function<void()>>> q;  // (kind, task); kind kD2H is holdable
  bool stop = false;
  int64_t busy = 0;  // tasks queued or running
  std::thread worker;

  void run() {
    for (;;) {
      std::pair<int, std::function<void()>> task;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return stop || !q.empty(); });
        if (q.empty()) return;
        task = std::move(q.front());
        q.pop_front();
      }
      if (task.first == kD2H) {
        std::unique_lock<std::mutex> lk(g_mu);
        if (g_hold_d2h) {
          g_held += 1;
          g_cv.notify_all();
          g_cv.wait(lk, [] { return !g_hold_d2h; });
          g_held -= 1;
        }
      }
      task.second();
      std::lock_guard<std::mutex> lk(mu);
      busy -= 1;
      cv.notify_all();
    }
  }
  void push(int kind, std::function<void()> f) {
    std::lock_guard<std::mutex> lk(mu);
    q.emplace_back(kind, std::move(f));
    busy += 1;
    cv.notify_all();
  }
};

struct Event {
  int device = 0;
  std::atomic<int64_t> gen{0};  // records enqueued
  std::atomic<int64_t> done_gen{0};  // records executed
  std::atomic<int64_t> t_ns{0};
};

// The device check of event operations: the event's device must be current on this thread.
int check_device(const Event* e) {
  if (e->device == t_device) return 0;
  count("wrong_device");
  return fail(kInvalidHandle);
}

}  // namespace

extern "C" {

// ------------------------------------------------------------------ CUDA runtime API

int cudaGetDevice(int* d) {
  if (int rc = injected("cudaGetDevice")) return rc;
  *d = t_device;
  return 0;
}
int cudaSetDevice(int d) {
  if (int rc = injected("cudaSetDevice")) return rc;
  if (d < 0 || d >= g_num_devices) return fail(kInvalidDevice);
  count("cudaSetDevice:" + std::to_string(d));  // each selects (and may create) a context
  t_device = d;
  return 0;
}
int cudaGetLastError() {
  int e = t_last_error;
  t_last_error = 0;
  return e;
}
int cudaPeekAtLastError() { return t_last_error; }
const char* cudaGetErrorString(int e) {
  switch (e) {
    case 0: return "no error";
    case kNotReady: return "device not ready";
    case kInvalidHandle: return "invalid resource handle";
    default: return "injected error";
  }
}

int cudaMallocHost(void** p, size_t n) {
  if (int rc = injected("cudaMallocHost")) return rc;
  *p = std::malloc(n > 0 ? n : 1);
  std::lock_guard<std::mutex> lk(g_mu);
  g_pinned[reinterpret_cast<uintptr_t>(*p)] = n;
  return 0;
}
int cudaFreeHost(void* p) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_pinned.erase(reinterpret_cast<uintptr_t>(p));
  std::free(p);
  return 0;
}

int cudaEventCreateWithFlags(void** ev, unsigned flags) {
  (void)flags;
  if (int rc = injected("cudaEventCreateWithFlags")) return rc;
  Event* e = new Event();
  e->device = t_device;
  *ev = e;
  return 0;
}
int cudaEventRecord(void* ev, void* stream) {
  if (int rc = injected("cudaEventRecord")) return rc;
  Event* e = static_cast<Event*>(ev);
  Stream* s = static_cast<Stream*>(stream);
  if (e->device != s->device) return fail(kInvalidHandle);
  int64_t g = e->gen.fetch_add(1) + 1;
  s->push(0, [e, g] {
    e->t_ns.store(now_ns());
    e->done_gen.store(g);
  });
  return 0;
}
int cudaEventQuery(void* ev) {
  if (int rc = injected("cudaEventQuery")) return rc;
  Event* e = static_cast<Event*>(ev);
  if (int rc = check_device(e)) return rc;
  return e->done_gen.load() == e->gen.load() ? 0 : kNotReady;  // NotReady is not an error
}
int cudaEventElapsedTime(float* ms, void* a, void* b) {
  if (int rc = injected("cudaEventElapsedTime")) return rc;
  Event* ea = static_cast<Event*>(a);
  Event* eb = static_cast<Event*>(b);
  if (int rc = check_device(ea)) return rc;
  if (ea->device != eb->device) return fail(kInvalidHandle);
  if (ea->done_gen.load() != ea->gen.load() || eb->done_gen.load() != eb->gen.load() ||
      ea->gen.load() == 0 || eb->gen.load() == 0)
    return fail(kNotReady);
  *ms = static_cast<float>((eb->t_ns.load() - ea->t_ns.load()) / 1e6);
  return 0;
}

int cudaLaunchHostFunc(void* stream, void (*fn)(void*), void* data) {
  if (int rc = injected("cudaLaunchHostFunc")) return rc;
  static_cast<Stream*>(stream)->push(0, [fn, data] { fn(data); });
  return 0;
}

int cudaMemcpyAsync(void* dst, const void* src, size_t n, int kind, void* stream) {
  if (int rc = injected("cudaMemcpyAsync")) return rc;
  if (kind == kH2D && !pinned(src)) count("pageable");
  if (kind == kD2H && !pinned(dst)) count("pageable");
  static_cast<Stream*>(stream)->push(kind == kD2H ? kD2H : 0,
                                     [dst, src, n] { std::memcpy(dst, src, n); });
  return 0;
}
int cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                      size_t height, int kind, void* stream) {
  if (int rc = injected("cudaMemcpy2DAsync")) return rc;
  if (width > dpitch || width > spitch) return fail(kInvalidValue);
  if (kind == kH2D && !pinned(src)) count("pageable");
  if (kind == kD2H && !pinned(dst)) count("pageable");
  static_cast<Stream*>(stream)->push(kind == kD2H ? kD2H : 0, [=] {
    for (size_t i = 0; i < height; ++i)
      std::memcpy(static_cast<char*>(dst) + i * dpitch,
                  static_cast<const char*>(src) + i * spitch, width);
  });
  return 0;
}
int cudaMemsetAsync(void* dst, int v, size_t n, void* stream) {
  if (int rc = injected("cudaMemsetAsync")) return rc;
  static_cast<Stream*>(stream)->push(0, [dst, v, n] { std::memset(dst, v, n); });
  return 0;
}

// ------------------------------------------------------------------ test controls

void* fake_stream_create(int device) {
  Stream* s = new Stream();
  s->device = device;
  s->worker = std::thread([s] { s->run(); });
  return s;
}
void fake_stream_destroy(void* stream) {
  Stream* s = static_cast<Stream*>(stream);
  {
    std::lock_guard<std::mutex> lk(s->mu);
    s->stop = true;
    s->cv.notify_all();
  }
  s->worker.join();
  delete s;
}
// Waits until the stream has run everything enqueued (1), or `timeout_ms` passed (0).
int fake_stream_sync(void* stream, int64_t timeout_ms) {
  Stream* s = static_cast<Stream*>(stream);
  std::unique_lock<std::mutex> lk(s->mu);
  return s->cv.wait_for(lk, std::chrono::milliseconds(timeout_ms), [s] { return s->busy == 0; })
             ? 1
             : 0;
}
// Enqueues a "kernel" that keeps the stream busy until fake_open_gates() (the stream's own
// compute, as long as the test wants).
void fake_stream_gate(void* stream) {
  {
    std::lock_guard<std::mutex> lk(g_mu);
    g_gate_closed = true;
  }
  static_cast<Stream*>(stream)->push(0, [] {
    std::unique_lock<std::mutex> lk(g_mu);
    g_cv.wait(lk, [] { return !g_gate_closed; });
  });
}
// Enqueues a "kernel" that writes `n` bytes (taken from `src` now) to device memory `dst`: the
// collective producing its result in stream order.
void fake_stream_write(void* stream, void* dst, const void* src, size_t n) {
  std::string bytes(static_cast<const char*>(src), n);
  static_cast<Stream*>(stream)->push(0, [dst, bytes] {
    std::memcpy(dst, bytes.data(), bytes.size());
  });
}
void fake_open_gates() {
  std::lock_guard<std::mutex> lk(g_mu);
  g_gate_closed = false;
  g_cv.notify_all();
}
void fake_set_num_devices(int n) { g_num_devices = n; }
// The next `count` calls of `api` return `code` (and set the calling thread's last error).
void fake_inject(const char* api, int count, int code) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_inject[api] = Inject{count, code};
}
int64_t fake_count(const char* what) {
  std::lock_guard<std::mutex> lk(g_mu);
  auto it = g_counts.find(what);
  return it == g_counts.end() ? 0 : it->second;
}
void fake_reset_counts() {
  std::lock_guard<std::mutex> lk(g_mu);
  g_counts.clear();
  g_inject.clear();
}
// Holds (1) or releases (0) every stream worker before its device-to-host copies.
void fake_hold_d2h(int on) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_hold_d2h = on != 0;
  g_cv.notify_all();
}
// Waits until `n` workers are held before a copy (1) or `timeout_ms` passed (0).
int fake_wait_held(int n, int64_t timeout_ms) {
  std::unique_lock<std::mutex> lk(g_mu);
  return g_cv.wait_for(lk, std::chrono::milliseconds(timeout_ms), [n] { return g_held >= n; })
             ? 1
             : 0;
}
// Host-side "device" memory for tests is plain memory: nothing to allocate here.
int fake_current_device() { return t_device; }

}  // extern "C"
