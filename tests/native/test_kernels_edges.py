"""The ctypes edge of the compiled kernels: shapes checked before any C++ runs, and the
numbers shared with kernels.cc checked when the library loads."""

import numpy as np
import pytest

from jaxpace.native import kernels


@pytest.fixture
def lib():
    ok, why = kernels.available()
    if not ok:  # tests/native/test_kernels.py::test_the_library_is_built_here fails in that case
        pytest.skip(f"the kernel library is not loaded here: {why}")
    return kernels._load()


def _f(*shape):
    return np.zeros(shape)


def _o(*shape):
    return np.zeros(shape, dtype=np.int8)


BAD_CALLS = {
    "run_buckets D": (
        lambda: kernels.run_buckets(_f(4, 8), _f(4, 2, 7), None, _f(4), buckets=3, sites=2,
                                    fwd_frac=0.5, bwd_frac=0.5, spin=False, slow=1.0),
        "`D` must have shape (4, 2, 8)",
    ),
    "run_buckets tc": (
        lambda: kernels.run_buckets(_f(4, 8), _f(4, 2, 8), None, _f(3), buckets=3, sites=2,
                                    fwd_frac=0.5, bwd_frac=0.5, spin=False, slow=1.0),
        "`tc` must have shape (4,)",
    ),
    "run_buckets jit": (
        lambda: kernels.run_buckets(_f(4, 8), _f(4, 2, 8), _f(4, 2, 8), _f(4), buckets=3,
                                    sites=2, fwd_frac=0.5, bwd_frac=0.5, spin=False, slow=1.0),
        "`jit` must have shape (4, 3, 8)",
    ),
    "node_coupled a": (lambda: kernels.node_coupled(_f(10), None, 4, 0.1, 0.1), "`g`=4"),
    "node_coupled d0": (lambda: kernels.node_coupled(_f(8), _f(7), 4, 0.1, 0.1), "`d0`"),
    "order_insert x": (lambda: kernels.order_insert(_f(2, 4, 8), _o(2, 4, 8), 0, _f(2, 7)), "`x`"),
    "order_insert r0": (lambda: kernels.order_insert(_f(2, 4, 8), _o(2, 4, 8), 4, _f(2, 8)), "`r0`"),
    "order_pick k1": (lambda: kernels.order_pick(_f(2, 4, 8), _o(2, 4, 8), 0, 9), "`k1`"),
    "window_step odd": (
        lambda: kernels.window_step(_f(2, 4, 8), _o(2, 4, 8), np.zeros((2, 3), np.int64), 0,
                                    _f(2, 8), (0, 1, 1, 0.5, 0.5)),
        "`odd` must have shape (2, 4)",
    ),
    "window_step x": (
        lambda: kernels.window_step(_f(2, 4, 8), _o(2, 4, 8), np.zeros((2, 4), np.int64), 0,
                                    _f(8), (0, 1, 1, 0.5, 0.5)),
        "`x` must have shape (2, 8)",
    ),
    "paced_delays slept": (
        lambda: kernels.paced_delays(_f(2, 4, 8), _f(2, 7), 0, _f(2, 8), _f(2, 8), gain=0.5,
                                     max_delay_s=0.01, unbound=1.0),
        "`slept` must have shape (2, 8)",
    ),
    "paced_delays e": (
        lambda: kernels.paced_delays(_f(2, 4, 8), _f(2, 8), 0, _f(2, 8), _f(1, 8), gain=0.5,
                                     max_delay_s=0.01, unbound=1.0),
        "`e` must have shape (2, 8)",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_a_wrong_shape_is_a_clear_error_not_a_stray_write(case, lib):
    call, message = BAD_CALLS[case]
    with pytest.raises(ValueError, match="kernels\\.") as err:
        call()
    assert message in str(err.value)


def test_the_built_library_agrees_on_every_shared_constant(lib):
    assert kernels.constants_mismatch(lib.jaxpace_kernels_constant) is None
    assert lib.jaxpace_kernels_constant(b"no_such_constant") == -1
    assert lib.jaxpace_kernels_abi_version() == kernels.ABI_VERSION


def test_a_library_with_other_constants_is_refused_with_the_reason(lib, monkeypatch):
    monkeypatch.setitem(kernels.CONSTANTS, "order_max_window", 126)
    monkeypatch.setitem(kernels._state, "lib", None)
    monkeypatch.setitem(kernels._state, "reason", None)
    ok, why = kernels.available()
    assert not ok
    assert "`order_max_window` is 127 there, 126 here" in why and "rebuild" in why


def test_another_build_is_loaded_from_the_environment(lib, monkeypatch, tmp_path):
    """`JAXPACE_KERNELS_LIBRARY` (what benchmarks/sanitize.sh sets) picks the library; one
    that cannot load is reported, and the NumPy paths run."""
    built = kernels._state["path"]
    monkeypatch.setitem(kernels._state, "lib", None)
    monkeypatch.setitem(kernels._state, "reason", None)
    monkeypatch.setenv("JAXPACE_KERNELS_LIBRARY", built)
    assert kernels.available() == (True, f"compiled kernels ({built.rsplit('/', 1)[-1]})")
    bogus = tmp_path / "not_a_library.so"
    bogus.write_text("not ELF")
    monkeypatch.setitem(kernels._state, "lib", None)
    monkeypatch.setitem(kernels._state, "reason", None)
    monkeypatch.setenv("JAXPACE_KERNELS_LIBRARY", str(bogus))
    ok, why = kernels.available()
    assert not ok and str(bogus) in why and "failed to load" in why
