"""The watch exchange at 8192 processes: one real coordination service (started in-process
through `jaxpace._jax_compat`) holding every process's summary under watch's own keys, read by
the deciding process's `Worker` (benchmarks/watch_exchange.py is the stand-in; the figures are
in docs/benchmarks.md)."""

from benchmarks.watch_exchange import measure


def test_the_leader_reads_8192_processes_summaries_in_one_bounded_call_and_bounded_memory():
    r = measure(8192, overwrites=1)
    print(r)
    # Every process's summary came back in one store call within its bound (KV_TIMEOUT_S:
    # a call over it returns nothing and counts as a failure).
    assert r["all_read"] and r["processes_read"] == 8192 and r["store_failures"] == 0
    # The leader holds them compactly: 28 MiB of JSON peaked at 307 MiB parsed as lists of
    # Python ints, 99 MiB with the rows as int64 arrays (summary.compact; 52 MiB of rows).
    assert r["read_peak_mib"] < 128, r
    # A later window overwrites the same keys: the store does not grow by another copy.
    assert (
        r["rss_growth_after_overwrites_mib"][-1] - r["rss_growth_after_read_mib"] < r["stored_mib"]
    ), r
