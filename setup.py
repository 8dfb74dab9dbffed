"""Builds jaxpace's optional native probes (XLA FFI handlers) with the installed jaxlib's headers.

The extension is a plain shared library loaded with ctypes (no Python C API). It needs a C++17
compiler and jax at build time (pyproject's build-system requires it); no CUDA toolkit (the
CUDA runtime is dlopen'ed at run time). If anything about the build fails, the install still
succeeds without it and jaxpace falls back to io_callback probes (`Pacer.stats()` says so).
Set JAXPACE_BUILD_NATIVE=0 to skip the build.
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext whose failure (no compiler, no jax headers) is a warning, not an error."""

    def run(self):
        try:
            super().run()
        except Exception as e:  # noqa: BLE001 - the extension is optional
            self._skip(e)

    def build_extension(self, ext):
        try:
            if ext.name.endswith("_jaxpace_probe"):  # the kernels need no JAX headers
                import jax.ffi

                ext.include_dirs.append(jax.ffi.include_dir())
            super().build_extension(ext)
        except Exception as e:  # noqa: BLE001
            self._skip(e)

    def get_export_symbols(self, ext):
        return []  # a ctypes library: no PyInit_ symbol

    @staticmethod
    def _skip(e):
        sys.stderr.write(
            f"\nWARNING: a jaxpace native library was not built ({type(e).__name__}: {e}).\n"
            "jaxpace will use its fallbacks instead (io_callback probes; the NumPy simulator\n"
            "and policy kernels, slower). To build them, install a C++17 compiler and reinstall.\n\n"
        )


ext_modules = []
if os.environ.get("JAXPACE_BUILD_NATIVE", "1") != "0":
    ext_modules.append(
        Extension(
            "jaxpace.native._jaxpace_probe",
            sources=["src/jaxpace/native/probe.cc"],  # includes probe_cuda.cc
            depends=["src/jaxpace/native/probe_cuda.cc"],
            language="c++",
            extra_compile_args=["-std=c++17", "-O2"],
            libraries=["dl"],
        )
    )
    # The simulator's and `adaptive`'s compiled kernels (same bits as their NumPy fallback;
    # -ffp-contract=off keeps the compiler from fusing a multiply and an add; -fno-trapping-math
    # only lets selects on compares vectorize, every operation still rounds as IEEE says).
    ext_modules.append(
        Extension(
            "jaxpace.native._jaxpace_kernels",
            sources=["src/jaxpace/native/kernels.cc"],
            language="c++",
            extra_compile_args=[
                "-std=c++17", "-O3", "-ffp-contract=off", "-fno-fast-math", "-fno-trapping-math",
            ],  # fmt: skip
        )
    )

setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
