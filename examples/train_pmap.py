"""The same measured gradient all-reduce under `jax.pmap` (one process, 8 CPU devices).

python examples/train_pmap.py
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import jaxpace as jp  # noqa: E402

n = jax.local_device_count()
tx = optax.sgd(0.1)
w = jnp.zeros((4,))
opt = tx.init(w)
true_w = jnp.array([1.0, -2.0, 0.5, 3.0])


def step(w, opt, x):
    y = x @ true_w
    loss, g = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
    g, loss = jp.pmean((g, loss), "batch")  # was: jax.lax.pmean
    upd, opt = tx.update(g, opt)
    return optax.apply_updates(w, upd), opt, loss


pstep = jax.pmap(step, axis_name="batch")
ws, opts = jax.tree.map(lambda a: jnp.stack([a] * n), (w, opt))
key = jax.random.PRNGKey(0)
for k in range(30):
    x = jax.random.normal(jax.random.fold_in(key, k), (n, 16, 4))
    ws, opts, loss = pstep(ws, opts, x)
print(f"loss after 30 steps: {float(loss[0]):.5f}; w = {ws[0]}")
print({site: s.steps for site, s in jp.default_pacer().stats().items()})
