"""Data-parallel Flax NNX + Optax training whose gradient all-reduce is `jaxpace.pmean`.

Run it single-process on simulated CPU devices, as a local multi-process job,
or unchanged on a GPU cluster:

    python -m jaxpace.examples.train --steps 50                    # 1 process, 8 CPU devices
    jaxpace launch -n 4 --local-devices 2 -- python -m jaxpace.examples.train
    srun python -m jaxpace.examples.train --no-cpu                 # SLURM GPU cluster

Gradients are computed locally inside `jax.shard_map` and reduced explicitly
with `jaxpace.pmean(grads, "data")` — the one line that differs from a plain
`lax.pmean` train step. The data is synthetic (a fixed random "teacher"
network), so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time


def _phases(text: str) -> str:
    phases = text.split(",")
    bad = [p for p in phases if p not in ("off", "exchange", "on")]
    if bad or not phases:
        raise argparse.ArgumentTypeError(
            f"phases must be a comma list of off, exchange, on; got {text!r}"
        )
    return text


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-per-device", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--collective", choices=["jaxpace", "lax"], default="jaxpace")
    p.add_argument(
        "--pacing",
        type=_phases,
        default="off",
        help="comma list of phases, each from the same start: 'off' measures only; "
        "'exchange' also exchanges waits in-band but never paces (isolates the "
        "exchange's cost); 'on' paces with jaxpace.adaptive. The demo runs "
        "'off,exchange,on'",
    )
    p.add_argument("--max-delay-s", type=float, default=0.03)
    p.add_argument("--granularity", choices=["process", "device"], default="process")
    p.add_argument(
        "--lag-s",
        type=float,
        default=0.0,
        help="injected host delay per step on --lag-process (a slow rank)",
    )
    p.add_argument("--lag-process", type=int, default=1)
    p.add_argument(
        "--straggle-p",
        type=float,
        default=0.0,
        help="per-process, per-step chance of an extra --straggle-s delay",
    )
    p.add_argument("--straggle-s", type=float, default=0.03)
    p.add_argument(
        "--local-devices", type=int, default=8, help="CPU devices when run as a single process"
    )
    p.add_argument("--no-cpu", action="store_true", help="use the host's accelerators")
    p.add_argument("--out", default=None, help="directory for records and results")
    p.add_argument("--progress", action="store_true", help="print PROGRESS lines for the demo")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    pid, nproc = _join(args)
    import jax

    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    model = _Model(args, mesh)
    # Several phases run interleaved, step by step (A B C A B C ...), each its own
    # training run from the same start, so machine noise hits them alike.
    phases = [_make_phase(args, model, p, pid) for p in args.pacing.split(",")]
    for k in range(args.steps):
        x, y = model.batch(k)
        for ph in phases:
            _inject_imbalance(args, ph, pid)
            t0 = time.perf_counter()
            ph["params"], ph["opt"], loss = ph["step"](ph["params"], ph["opt"], x, y)
            ph["losses"].append(float(loss))  # also waits for the step
            ph["times"].append(time.perf_counter() - t0)
        if args.progress and pid == 0:
            print(f"PROGRESS {k + 1} {args.steps}", flush=True)
    _write_results(args, phases, pid, nproc, jax.device_count())
    return 0


def _join(args: argparse.Namespace) -> tuple[int, int]:
    """Joins the job (under `jaxpace launch` / SLURM) before anything touches the backend."""
    import jax

    from jaxpace import launch

    if not args.no_cpu:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        if "JAXPACE_LOCAL_DEVICES" not in os.environ:
            jax.config.update("jax_num_cpu_devices", args.local_devices)
    return launch.init_from_env(platform=None if args.no_cpu else "cpu")


class _Model:
    """The MLP, its replicated start state, the synthetic data and the train step."""

    D_IN = 32

    def __init__(self, args: argparse.Namespace, mesh) -> None:
        import jax
        import numpy as np
        import optax
        from flax import nnx
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        hidden, d_in = args.hidden, self.D_IN

        class MLP(nnx.Module):
            def __init__(self, rngs: nnx.Rngs):
                self.l1 = nnx.Linear(d_in, hidden, rngs=rngs)
                self.l2 = nnx.Linear(hidden, hidden, rngs=rngs)
                self.l3 = nnx.Linear(hidden, 1, rngs=rngs)

            def __call__(self, x):
                return self.l3(nnx.gelu(self.l2(nnx.gelu(self.l1(x)))))

        self.args, self.mesh = args, mesh
        self.graphdef, params0 = nnx.split(MLP(nnx.Rngs(args.seed)), nnx.Param)
        # Replicate the start state explicitly, so step 2 reuses step 1's compilation.
        self.replicated = NamedSharding(mesh, P())
        self.params0 = jax.device_put(params0, self.replicated)
        self.teacher_w = np.random.default_rng(1234).standard_normal((d_in, 1)).astype(np.float32)
        self.global_batch = jax.device_count() * args.batch_per_device
        self.data_sharding = NamedSharding(mesh, P("data"))
        self.tx = optax.adam(args.lr)

    def batch(self, step: int):
        """Step `step`'s global batch, sharded over "data" (same bytes at any process count)."""
        import jax
        import numpy as np

        rng = np.random.default_rng((self.args.seed, step))
        x = rng.standard_normal((self.global_batch, self.D_IN)).astype(np.float32)
        y = (np.sin(x @ self.teacher_w) + 0.1 * np.cos(3 * x[:, :1])).astype(np.float32)
        return tuple(
            jax.make_array_from_callback(a.shape, self.data_sharding, lambda i, a=a: a[i])
            for a in (x, y)
        )

    def loss(self, params, x, y):
        import jax.numpy as jnp
        from flax import nnx

        model = nnx.merge(self.graphdef, params)
        return jnp.mean((model(x) - y) ** 2)

    def make_step(self, pacer):
        import jax
        import optax
        from jax import lax
        from jax.sharding import PartitionSpec as P

        collective = self.args.collective

        def local_step(params, opt_state, x, y):
            # Mark the replicated parameters as varying over "data" first:
            # otherwise autodiff itself inserts the gradient all-reduce (the
            # transpose of an implicit broadcast) and no wrapper ever sees it.
            local = jax.tree.map(lambda p: lax.pcast(p, "data", to="varying"), params)
            loss, grads = jax.value_and_grad(self.loss)(local, x, y)
            # The loss rides in the same all-reduce as the gradients.
            if collective == "jaxpace":
                grads, loss = pacer.pmean((grads, loss), "data", site="grads")  # <- jaxpace
            else:
                grads, loss = lax.pmean((grads, loss), "data")
            updates, opt_state = self.tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        return jax.jit(
            jax.shard_map(
                local_step,
                mesh=self.mesh,
                in_specs=(P(), P(), P("data"), P("data")),
                out_specs=(P(), P(), P()),
            )
        )


def _make_phase(args: argparse.Namespace, model: _Model, phase: str, pid: int) -> dict:
    import jax

    import jaxpace as jp

    if phase == "off":
        policy = jp.no_pacing()
    else:
        # 'exchange': the same exchange and policy code, with a threshold the
        # spread never reaches, so it never sleeps.
        policy = jp.adaptive(
            threshold_s=0.002 if phase == "on" else 5.0,
            max_delay_s=args.max_delay_s,
            gain=0.9,
            warmup_steps=3,
            engage_steps=4,
            window=8,
        )
    pacer = jp.Pacer(policy=policy, granularity=args.granularity)
    return {
        "name": phase,
        "pacer": pacer,
        "step": model.make_step(pacer),
        "params": model.params0,
        "opt": jax.device_put(model.tx.init(model.params0), model.replicated),
        # Same straggler draws in every phase: a fair comparison.
        "rnd": random.Random(args.seed * 1000 + pid),
        "losses": [],
        "times": [],
    }


def _inject_imbalance(args: argparse.Namespace, ph: dict, pid: int) -> None:
    """One persistently slow process, plus random episodic stragglers anywhere."""
    if pid == args.lag_process and args.lag_s > 0:
        time.sleep(args.lag_s)
    if args.straggle_p > 0 and ph["rnd"].random() < args.straggle_p:
        time.sleep(args.straggle_s)


def _write_results(args, phases: list[dict], pid: int, nproc: int, devices: int) -> None:
    import jax
    import numpy as np

    results = {"process": pid, "processes": nproc, "devices": devices}
    for ph in phases:
        leaves = jax.tree.leaves(ph["params"])
        digest = hashlib.sha256(b"".join(np.asarray(v).tobytes() for v in leaves)).hexdigest()
        res = {
            "losses": ph["losses"],
            "step_times_s": ph["times"],
            "params_sha256": digest,
            "phase": ph["name"],
            "collective": args.collective,
        }
        if args.out and args.collective == "jaxpace":
            ph["pacer"].export(
                os.path.join(args.out, ph["name"], f"records-p{pid}.jsonl"),
                # Step-interleaved phases: one exit to the next spans all phases' steps.
                header_extra={"interleaved_phases": len(phases)} if len(phases) > 1 else None,
            )
            st = ph["pacer"].stats().get("grads")
            if st is not None:
                res.update(
                    steps_paced=st.steps_paced,
                    total_delay_s=st.total_delay_s,
                    errors=st.errors,
                    engaged=st.engaged,
                )
        results[ph["name"]] = res
        if pid == 0:
            print(
                f"[{ph['name']}] loss {res['losses'][0]:.4f} -> {res['losses'][-1]:.4f}, "
                f"params sha256 {digest[:16]}",
                flush=True,
            )
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"result-p{pid}.json"), "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    sys.exit(main())
