"""jaxpace's compiled libraries, loaded with ctypes: the probes (`probes`: XLA FFI handlers,
`primitive`: the effect-free JAX primitives, `driver`: the drain thread) and the number
kernels (`kernels`: the simulator's and `adaptive`'s loops). `loader` finds and loads each
once. The kernels never import the probes."""
