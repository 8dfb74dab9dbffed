"""The CUDA probe handlers (probe_cuda.cc) driven on CPU, against a fake cudart.

tests/native/fake_cudart.cc stands in for libcudart: each stream is a FIFO worker thread, copies
read their source when the stream reaches them, events complete when executed, the current
device and the last error are per thread, and errors can be injected. It is built here with g++
and loaded through the package's own loader (`JAXPACE_CUDART`). The handlers' bodies are called
through the library's test entry points with "device" buffers that are host memory.

Nothing here measures speed: sleeps are ordering checks (a delay must come before the work
queued after it), and every wait on a stream is bounded.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import threading

import numpy as np
import pytest

from jaxpace.native import probes as nat

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE_SRC = os.path.join(HERE, "native", "fake_cudart.cc")
SYNC_MS = 20_000  # bound on every wait for a fake stream

OK, WHY = nat.available()
pytestmark = pytest.mark.skipif(not OK, reason=f"native probes unavailable: {WHY}")


def _build_fake(out_dir: str) -> str:
    path = os.environ.get("JAXPACE_FAKE_CUDART_LIB")  # prebuilt (the sanitizer script's)
    if path:
        return path
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.fail("the fake cudart needs a C++ compiler (g++), which the native build needs too")
    path = os.path.join(out_dir, "libfakecudart.so")
    cmd = [cxx, "-O1", "-g", "-shared", "-fPIC", "-std=c++17", FAKE_SRC, "-o", path, "-lpthread"]
    subprocess.run(cmd, check=True, timeout=300, capture_output=True)
    return path


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    """The fake cudart, loaded as the probes' CUDA runtime through the package's loader."""
    path = _build_fake(str(tmp_path_factory.mktemp("fakecudart")))
    old = os.environ.get("JAXPACE_CUDART")
    os.environ["JAXPACE_CUDART"] = path
    try:
        assert nat.cudart_candidates() == [path]
        nat._state["cuda"] = None  # the loader caches its answer; this process has no GPU
        ok, why = nat.cuda_available()
    finally:
        if old is None:
            os.environ.pop("JAXPACE_CUDART", None)
        else:
            os.environ["JAXPACE_CUDART"] = old
    assert ok, why
    assert path in why
    lib = ctypes.CDLL(path)  # the same handle the probe library opened: the same globals
    vp, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
    for name, res, args in [
        ("fake_stream_create", vp, [ctypes.c_int]),
        ("fake_stream_destroy", None, [vp]),
        ("fake_stream_sync", ctypes.c_int, [vp, i64]),
        ("fake_stream_gate", None, [vp]),
        ("fake_open_gates", None, []),
        ("fake_stream_write", None, [vp, vp, vp, ctypes.c_size_t]),
        ("fake_set_num_devices", None, [ctypes.c_int]),
        ("fake_inject", None, [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]),
        ("fake_count", i64, [ctypes.c_char_p]),
        ("fake_reset_counts", None, []),
        ("fake_hold_d2h", None, [ctypes.c_int]),
        ("fake_wait_held", ctypes.c_int, [ctypes.c_int, i64]),
        ("fake_current_device", ctypes.c_int, []),
        ("cudaSetDevice", ctypes.c_int, [ctypes.c_int]),
        ("cudaPeekAtLastError", ctypes.c_int, []),
    ]:
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    del i32
    lib.fake_set_num_devices(2)
    return lib


class Rank:
    """One rank's "device" buffers and stream, and the two handlers on them."""

    def __init__(self, fake, sid, ordinal, payload_len):
        self.fake, self.sid, self.ordinal = fake, sid, ordinal
        self.stream = fake.fake_stream_create(ordinal)
        self.flag = np.full(1, -7, np.int32)  # garbage until the arrive writes it
        self.pay = np.full(max(payload_len, 1), np.nan, np.float32)
        self.plen = payload_len
        self.red = np.zeros(max(payload_len, 1), np.float32)
        self.one = np.full(1, -1.0, np.float32)

    def arrive(self) -> int:
        return nat._lib().jaxpace_test_arrive_cuda(
            self.stream, self.ordinal, self.sid, self.flag.ctypes.data, self.pay.ctypes.data,
            self.plen,
        )  # fmt: skip

    def done(self) -> int:
        return nat._lib().jaxpace_test_done_cuda(
            self.stream, self.ordinal, self.sid, self.red.ctypes.data, self.plen,
            self.one.ctypes.data,
        )  # fmt: skip

    def step(self, reduced=None) -> None:
        assert self.arrive() == 0, nat._lib().jaxpace_cuda_error()
        if reduced is not None:  # the collective writes its result, in stream order
            src = np.ascontiguousarray(reduced, np.float32)
            self.fake.fake_stream_write(
                self.stream, self.red.ctypes.data, src.ctypes.data, src.nbytes
            )
        assert self.done() == 0, nat._lib().jaxpace_cuda_error()

    def sync(self) -> None:
        assert self.fake.fake_stream_sync(self.stream, SYNC_MS) == 1, "fake stream stuck"

    def close(self) -> None:
        self.sync()
        self.fake.fake_stream_destroy(self.stream)


def new_site(num_slots, ordinals, *, payload_len=0, max_delay_s=0.0, fixed_rank=-1):
    sid = nat.allocate_site_id()
    nat.register_site(sid, num_slots, capacity=256, payload_len=payload_len, fixed_rank=fixed_rank)
    nat.set_site_max_delay(sid, max_delay_s)
    nat.set_site_devices(sid, ordinals)
    return sid


@pytest.fixture
def counts(fake):
    fake.fake_reset_counts()
    yield lambda what: int(fake.fake_count(what.encode()))
    fake.fake_hold_d2h(0)
    fake.fake_open_gates()
    fake.fake_reset_counts()


def test_payload_is_read_only_after_its_copy_reached_the_host(fake, counts):
    """The payload race: the drain must not see a step before its device-to-host copy ran."""
    sid = new_site(2, [0], payload_len=6)
    rk = Rank(fake, sid, 0, 6)
    try:
        fake.fake_hold_d2h(1)  # the stream stops before the payload copy
        rk.step(reduced=np.arange(1, 7, dtype=np.float32))
        assert fake.fake_wait_held(1, SYNC_MS) == 1
        recs, _ = nat.drain(sid, 6)
        assert len(recs) == 0  # the done event ran, the copy did not: nothing to read yet
        assert nat.pending(sid) == 1
        fake.fake_hold_d2h(0)
        rk.sync()
        recs, pays = nat.drain(sid, 6)
        assert len(recs) == 1 and recs[0]["step"] == 0 and recs[0]["flags"] == 1
        np.testing.assert_array_equal(pays[0], np.arange(1, 7, dtype=np.float32))
        assert rk.flag[0] == 1 and rk.one[0] == 1.0
        assert not np.asarray(rk.pay).any()  # step 0: no previous wait to send
        # Step 1 sends step 0's wait, with its step tag (2 + step) in the presence slot.
        rk.step(reduced=np.zeros(6, np.float32))
        rk.sync()
        w0 = np.float32(recs[0]["wait_ns"] * 1e-9)
        assert rk.flag[0] == 2
        np.testing.assert_array_equal(rk.pay, np.array([w0, 0, 2.0, 0, 0, 0], np.float32))
    finally:
        fake.fake_hold_d2h(0)
        rk.close()
    # Everything the handlers copied came from pinned memory made at set-up time.
    assert counts("pageable") == 0


def test_no_allocation_or_pageable_copy_inside_the_handlers(fake, counts):
    sid = new_site(4, [2, 1], payload_len=12)  # ordinal 0 -> rank 2, ordinal 1 -> rank 1
    made = (counts("cudaMallocHost"), counts("cudaEventCreateWithFlags"))
    assert made[0] >= 1 and made[1] == 2 * 3 * 64  # two ranks' events, made at set-up
    ranks = [Rank(fake, sid, o, 12) for o in (0, 1)]
    try:
        for _ in range(5):
            for rk in ranks:
                rk.step(reduced=np.ones(12, np.float32))
        for rk in ranks:
            rk.sync()
    finally:
        for rk in ranks:
            rk.close()
    assert (counts("cudaMallocHost"), counts("cudaEventCreateWithFlags")) == made
    assert counts("pageable") == 0
    recs, _ = nat.drain(sid, 12)
    assert sorted(set(recs["rank"].tolist())) == [1, 2] and len(recs) == 10


def test_a_delay_blocks_the_work_queued_after_it_and_the_record_keeps_what_was_slept(fake, counts):
    sid = new_site(2, [0], max_delay_s=1.0)
    rk = Rank(fake, sid, 0, 0)
    try:
        nat.set_delay(sid, 0, 0.05)
        rk.step()
        rk.sync()
        recs, _ = nat.drain(sid)
    finally:
        rk.close()
    assert len(recs) == 1
    r = recs[0]
    assert r["delay_ns"] >= 50_000_000  # the sleep ran on the stream, in full
    # The done event ran after the sleep (1 us: the float milliseconds of cudaEventElapsedTime).
    assert r["wait_ns"] >= r["delay_ns"] - 1_000
    assert counts("cudaLaunchHostFunc") >= 1


def test_a_released_delay_records_the_time_slept_not_the_time_asked(fake, counts):
    sid = new_site(2, [0], max_delay_s=60.0)
    rk = Rank(fake, sid, 0, 0)
    try:
        nat.set_delay(sid, 0, 30.0)
        assert rk.arrive() == 0
        nat.release_site(sid)  # the pacer closed: the stream's sleep ends now
        assert rk.done() == 0
        rk.sync()  # bounded: fails if the sleep was not released
        recs, _ = nat.drain(sid)
    finally:
        rk.close()
    assert len(recs) == 1
    assert 0 <= recs[0]["delay_ns"] < 30_000_000_000
    assert recs[0]["wait_ns"] >= recs[0]["delay_ns"] - 1_000


def test_a_failed_cuda_call_is_counted_cleared_and_leaves_no_record(fake, counts):
    sid = new_site(2, [0], payload_len=6)
    rk = Rank(fake, sid, 0, 6)
    try:
        fake.fake_inject(b"cudaEventRecord", 1, 999)  # step 0's arrive event
        rk.step(reduced=np.ones(6, np.float32))
        assert fake.cudaPeekAtLastError() == 0  # cleared: jaxlib's next kernel sees no error
        rk.sync()
        assert rk.flag[0] == 0  # an unrecorded step says "not measured" to the program
        assert not np.isnan(rk.pay).any()  # the outputs were still written (zeros)
        rk.step(reduced=np.ones(6, np.float32))  # step 1: fine
        fake.fake_inject(b"cudaEventElapsedTime", 1, 999)
        rk.sync()
        recs, _ = nat.drain(sid, 6)  # step 1's times cannot be read: no record either
        assert len(recs) == 0
        assert fake.cudaPeekAtLastError() == 0
        rk.step(reduced=np.ones(6, np.float32))
        rk.sync()
        recs, _ = nat.drain(sid, 6)
    finally:
        rk.close()
    assert recs["step"].tolist() == [2]  # never a wait of 0 from a failed step
    c = nat.counters(sid)
    assert c["cuda_errors"] == 2 and c["gpu_invalid"] == 2 and c["gpu_disabled"] == 0
    assert "cudaEventElapsedTime" in nat._lib().jaxpace_cuda_error().decode()


def test_outputs_that_cannot_be_written_fail_the_call_instead_of_leaving_garbage(fake, counts):
    sid = new_site(2, [0], payload_len=6)
    rk = Rank(fake, sid, 0, 6)
    try:
        fake.fake_inject(b"cudaMemsetAsync", 1, 999)
        assert rk.arrive() == 1
        assert "zero its outputs" in nat._lib().jaxpace_cuda_error().decode()
        assert fake.cudaPeekAtLastError() == 0
        assert nat.counters(sid)["cuda_errors"] == 1
    finally:
        rk.close()


def test_repeated_errors_disable_the_site(fake, counts):
    sid = new_site(2, [0])
    rk = Rank(fake, sid, 0, 0)
    try:
        fake.fake_inject(b"cudaEventRecord", 1000, 999)
        for _ in range(20):
            rk.step()
        rk.sync()
        assert nat.counters(sid)["gpu_disabled"] == 1
        before = counts("cudaEventRecord")
        fake.fake_inject(b"cudaEventRecord", 0, 0)
        rk.step()
        rk.sync()
        assert counts("cudaEventRecord") == before  # disabled: nothing enqueued but the outputs
        assert rk.flag[0] == 0 and rk.one[0] == 1.0
    finally:
        rk.close()
    recs, _ = nat.drain(sid)
    assert len(recs) == 0
    assert nat.counters(sid)["cuda_errors"] == 16  # kMaxCudaStreak


def test_ring_overrun_past_64_steps_keeps_the_oldest_intact_and_counts_the_rest(fake, counts):
    sid = new_site(2, [0], payload_len=6)
    rk = Rank(fake, sid, 0, 6)
    try:
        for k in range(100):  # no drain in between: 64 steps fill the pair's slots
            rk.step(reduced=np.full(6, k, np.float32))
        rk.sync()
        recs, pays = nat.drain(sid, 6)
        assert recs["step"].tolist() == list(range(64))
        np.testing.assert_array_equal(pays[:, 0], np.arange(64, dtype=np.float32))
        assert nat.counters(sid)["dropped"] == 36
        assert nat.pending(sid) == 0
        rk.step(reduced=np.full(6, 100, np.float32))  # slots free again: measured
        rk.sync()
        recs, pays = nat.drain(sid, 6)
    finally:
        rk.close()
    assert recs["step"].tolist() == [100] and pays[0, 0] == 100


def test_the_drain_makes_each_device_current_and_restores_the_callers(fake, counts):
    fake.cudaSetDevice(1)
    try:
        sid = new_site(2, [0, 1])
        assert fake.fake_current_device() == 1  # set-up switched devices and came back
    finally:
        fake.cudaSetDevice(0)
    ranks = [Rank(fake, sid, o, 0) for o in (0, 1)]
    try:
        for rk in ranks:
            rk.step()
            rk.sync()
        got = {}
        # A fresh thread (current device 0, never set), like the drain thread.
        t = threading.Thread(target=lambda: got.setdefault("r", nat.drain(sid)[0]))
        t.start()
        t.join(SYNC_MS / 1000)
        assert not t.is_alive()
    finally:
        for rk in ranks:
            rk.close()
    assert sorted(got["r"]["rank"].tolist()) == [0, 1]
    assert counts("wrong_device") == 0  # every event was queried with its device current
    assert nat.counters(sid)["cuda_errors"] == 0


def test_a_process_on_one_device_never_selects_another(fake, counts):
    """Selecting a device makes a CUDA context there (hundreds of MB): set-up and drain keep to
    the devices the site measures on, even from threads whose current device is another."""
    sid = new_site(2, [-1, 0])  # ordinal 0 does not measure, ordinal 1 is rank 0
    rk = Rank(fake, sid, 1, 0)
    try:
        for _ in range(3):
            rk.step()
        rk.sync()
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("r", nat.drain(sid)[0]))
        t.start()
        t.join(SYNC_MS / 1000)
        assert not t.is_alive()
        got["main"] = nat.drain(sid)[0]  # nothing left; this thread's device is 0
    finally:
        rk.close()
    assert got["r"]["step"].tolist() == [0, 1, 2]
    assert counts("cudaSetDevice:0") == 0 and counts("cudaSetDevice:1") >= 1


def test_a_delay_that_could_not_be_enqueued_is_recorded_as_none(fake, counts):
    sid = new_site(2, [0], max_delay_s=1.0)
    rk = Rank(fake, sid, 0, 0)
    try:
        nat.set_delay(sid, 0, 0.01)
        rk.step()  # slept: 10 ms
        rk.sync()
        first, _ = nat.drain(sid)
        for _ in range(63):  # the same slot comes back after 64 steps, with no delay asked
            rk.step()
        rk.sync()
        nat.drain(sid)
        rk.step()  # step 64, in step 0's slot, with no delay
        nat.set_delay(sid, 0, 0.01)
        fake.fake_inject(b"cudaLaunchHostFunc", 1, 999)  # step 65: a delay that cannot be queued
        rk.step()
        rk.sync()
        last, _ = nat.drain(sid)
    finally:
        rk.close()
    assert first["delay_ns"][0] >= 10_000_000
    assert last["step"].tolist() == [64, 65]
    assert last["delay_ns"].tolist() == [0, 0]  # not the slot's old 10 ms, not the one asked
    assert nat.counters(sid)["cuda_errors"] == 1


def test_a_gpu_step_wakes_the_drain_when_the_policy_may_delay(fake, counts):
    eager = new_site(2, [0], max_delay_s=0.01)
    lazy = new_site(2, [0], max_delay_s=0.0)  # measure only: no host function at all
    rk_lazy = Rank(fake, lazy, 0, 0)
    try:
        rk_lazy.step()
        rk_lazy.sync()
    finally:
        rk_lazy.close()
    assert counts("cudaLaunchHostFunc") == 0
    assert len(nat.drain(lazy)[0]) == 1
    seen = nat.wait_records(0, 0)
    rk = Rank(fake, eager, 0, 0)
    try:
        rk.step()
        # Returns as soon as the stream ran the done's host function; the bound only keeps a
        # broken build from hanging the test.
        assert nat.wait_records(seen, SYNC_MS / 1000) != seen
        rk.sync()
    finally:
        rk.close()
    assert counts("cudaLaunchHostFunc") == 1
    assert len(nat.drain(eager)[0]) == 1


def test_the_drain_never_waits_for_a_step_still_on_the_gpu(fake, counts):
    sid = new_site(2, [0])
    rk = Rank(fake, sid, 0, 0)
    try:
        rk.step()
        rk.sync()
        fake.fake_stream_gate(rk.stream)  # the stream computes until the gate opens
        rk.step()
        recs, _ = nat.drain(sid)  # returns at once: step 1 is not there yet
        assert recs["step"].tolist() == [0]
        assert nat.pending(sid) == 1
        fake.fake_open_gates()
        rk.sync()
        recs, _ = nat.drain(sid)
    finally:
        fake.fake_open_gates()
        rk.close()
    assert recs["step"].tolist() == [1]


def test_loader_candidates_put_the_cuda13_wheel_and_mapped_runtime_first(tmp_path, monkeypatch):
    monkeypatch.delenv("JAXPACE_CUDART", raising=False)
    for sub in (("nvidia", "cu13", "lib"), ("nvidia", "cuda_runtime", "lib")):
        d = tmp_path.joinpath(*sub)
        d.mkdir(parents=True)
    (tmp_path / "nvidia/cu13/lib/libcudart.so.13").write_bytes(b"")
    (tmp_path / "nvidia/cuda_runtime/lib/libcudart.so.12").write_bytes(b"")
    monkeypatch.setattr(nat, "_site_dirs", lambda: [str(tmp_path)])
    monkeypatch.setattr(nat, "_mapped_cudart", lambda: ["/opt/x/libcudart.so.12"])
    monkeypatch.setattr(nat, "_plugin_majors", lambda: [13, 12])
    got = nat.cudart_candidates()
    assert got == [
        "/opt/x/libcudart.so.12",
        str(tmp_path / "nvidia/cu13/lib/libcudart.so.13"),
        str(tmp_path / "nvidia/cuda_runtime/lib/libcudart.so.12"),
        "",
    ]
    monkeypatch.setattr(nat, "_plugin_majors", lambda: [12, 13])
    monkeypatch.setattr(nat, "_mapped_cudart", lambda: [])
    assert nat.cudart_candidates()[0].endswith("libcudart.so.12")


def test_the_drain_thread_turns_a_gpu_step_into_the_next_steps_delay(fake, counts):
    """End to end on the fake: GPU step -> drain thread -> policy -> native delay -> the next
    step's stream sleeps it, and the record says so."""
    from jaxpace.native import driver

    calls: list[tuple[int, int]] = []
    executions: list[int] = []  # XLA's run id per record (the test entry's fixed 7)
    first = threading.Event()

    class Runtime:  # the two methods the drain thread calls (jaxpace.runtime.hooks)
        def native_record(
            self, site, rank, step, arrive_ns, done_ns, delay_ns, red, scale, *, execution
        ):
            calls.append((step, delay_ns))
            executions.append(execution)
            first.set()
            return 0.005  # the policy's answer: sleep 5 ms at the next arrival

        def native_wants_wake(self, site):
            return True

    class HostSite:
        name, probe, memo = "gpu-site", "native", None

    sid = driver.attach(
        Runtime(), HostSite(), num_slots=2, fixed_rank=-1, sample_every=1, payload_len=0,
        scale=1.0, capacity=64, max_delay_s=0.05, stop=None,
    )  # fmt: skip
    nat.set_site_devices(sid, [0])
    rk = Rank(fake, sid, 0, 0)
    try:
        rk.step()
        assert first.wait(SYNC_MS / 1000)  # the drain thread read step 0 by itself
        # The thread stores the delay right after the policy returns: it lands on the next
        # arrival after that (bounded retries, no timing assumption).
        for _ in range(100):
            rk.step()
            rk.sync()
            driver.sync(sid)
            if any(d > 0 for _, d in calls):
                break
    finally:
        rk.close()
    assert calls[0] == (0, 0)
    assert [s for s, _ in calls] == list(range(len(calls)))  # every step, once, in order
    assert max(d for _, d in calls) >= 5_000_000  # a later step slept the 5 ms on its stream
    assert executions and set(executions) == {7}  # the arrive's run id reaches the record
