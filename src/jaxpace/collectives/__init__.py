"""Trace time: the drop-ins, the decision of what to measure, and the traced program around
the one `jax.lax` call (native probes or `io_callback`), the tie, the site's rank groups, the
invariant-operand check and the in-band exchange."""
