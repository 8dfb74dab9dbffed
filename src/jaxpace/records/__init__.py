"""Every on-disk format jaxpace writes or reads: its own records (`format`, `reader`), stall
records (`stall`), and the sources the report reads (`sources`: jaxpace records,
`jax.profiler` traces, NCCL Inspector logs). Imports nothing of the report or the runtime."""
