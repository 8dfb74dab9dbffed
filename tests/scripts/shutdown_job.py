"""One process, 8 CPU devices, granularity="device": STEPS measured steps, then one way of ending.

python tests/scripts/shutdown_job.py OUT MODE   (MODE: one of those below)

- exit: the loop ends and the interpreter exits; nobody calls close().
- raise: an exception ends the training loop (uncaught: exit code 1).
- sigterm: writes OUT/ready, then waits to be killed by SIGTERM (default action).
- sigterm_handled: as sigterm, with the program's own SIGTERM handler (sys.exit(143)),
  installed before the first trace; it appends a line to OUT/handler-calls each time it runs.
- sigterm_handled_after: as sigterm_handled, the handler installed after the first trace.
- sigterm_native: as sigterm, with a native SIGTERM handler installed before the first trace
  (`faulthandler.register`: it dumps the stack to OUT/native-dump, which `signal.getsignal`
  does not see, and does not end the process); the program ends normally once it ran.
- sigterm_paced_first / sigterm_paced_after: as sigterm, with a second pacer that paces
  (`fixed`, no sinks) traced before / after the first trace of the pacer with the sinks.
- sigterm_stuck: as sigterm, but the main thread is blocked inside a computation that never
  ends, so Python cannot run a signal handler there.

A counting sink writes how many summaries it received when its close() is called
(OUT/sink-closed.json); an atexit hook registered before the first trace (so it runs
after jaxpace's own) writes how many step records the pacer holds (OUT/records.json).
"""

import atexit
import faulthandler
import json
import os
import signal
import sys
import threading
import time

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.pop("XLA_FLAGS", None)

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxpace as jp  # noqa: E402
import jaxpace.sinks  # noqa: E402

out, mode = sys.argv[1], sys.argv[2]
STEPS = 40


class CountingSink:
    def __init__(self) -> None:
        self.pairs = set()
        self.n = 0

    def __call__(self, s) -> None:
        self.n += 1
        self.pairs.add((s["rank"], s["step"]))

    def close(self) -> None:
        with open(os.path.join(out, "sink-closed.json"), "w") as f:
            json.dump({"summaries": self.n, "distinct": len(self.pairs)}, f)


counting = CountingSink()
prom = jaxpace.sinks.prometheus_textfile(os.path.join(out, "m.prom"), write_every_s=3600)
tb = jaxpace.sinks.tensorboard(os.path.join(out, "tb"), flush_secs=3600)
pacer = jp.Pacer(granularity="device", sinks=[counting, prom, tb])


def count_records() -> None:
    steps = [r for r in pacer.records() if r.get("type") == "step"]
    with open(os.path.join(out, "records.json"), "w") as f:
        json.dump({"steps": len(steps)}, f)


def handler(signum, frame) -> None:
    with open(os.path.join(out, "handler-calls"), "a") as f:
        f.write(f"{signum}\n")
    sys.exit(143)


atexit.register(count_records)  # before the first trace: runs after jaxpace's close
if mode == "sigterm_handled":
    signal.signal(signal.SIGTERM, handler)
if mode == "sigterm_native":
    dump = open(os.path.join(out, "native-dump"), "w")  # noqa: SIM115 - open until the end
    faulthandler.register(signal.SIGTERM, file=dump, all_threads=False)

mesh = jax.make_mesh((8,), ("data",))
step = jax.jit(
    jax.shard_map(
        lambda x: pacer.psum(x, "data", site="grads"), mesh=mesh, in_specs=P("data"), out_specs=P()
    )
)
x = jax.device_put(np.ones((8, 4), np.float32), NamedSharding(mesh, P("data")))


def run_a_pacing_pacer() -> None:
    paced = jp.Pacer(policy=jp.fixed(0.001))
    f = jax.jit(
        jax.shard_map(
            lambda v: paced.psum(v, "data", site="paced"),
            mesh=mesh,
            in_specs=P("data"),
            out_specs=P(),
        )
    )
    jax.block_until_ready(f(x))
    run_a_pacing_pacer.pacer = paced  # kept alive


if mode == "sigterm_paced_first":
    run_a_pacing_pacer()
for _ in range(STEPS - 1):
    # One step at a time: XLA:CPU can deadlock its collective rendezvous with many 8-device
    # steps queued on few cores (seen with plain lax.psum too).
    jax.block_until_ready(step(x))
if mode == "sigterm_paced_after":
    run_a_pacing_pacer()
if mode == "sigterm_handled_after":
    signal.signal(signal.SIGTERM, handler)
y = step(x)  # the last step: not waited for, still in flight when the loop ends
if mode == "raise":
    raise RuntimeError("the training loop ended with an exception")
if mode.startswith("sigterm"):
    with open(os.path.join(out, "ready"), "w") as f:
        f.write("1")
if mode == "sigterm_stuck":  # the main thread blocks inside a computation that never ends
    forever = threading.Event()
    stuck = jax.jit(lambda v: jax.pure_callback(lambda a: forever.wait() or a, v, v))
    np.asarray(stuck(np.ones(2, np.float32)))  # device_get: waits in C++, no signal checks
if mode.startswith("sigterm"):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the test kills us long before
        time.sleep(0.05)
        if mode == "sigterm_native" and os.path.getsize(os.path.join(out, "native-dump")):
            sys.exit(0)  # the native handler ran, and the process lives on
    sys.exit(3)
