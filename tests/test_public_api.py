"""The curated namespace: every `__all__` name resolves, and the list is sorted."""

import jaxpace


def test_all_names_resolve_and_are_sorted():
    assert jaxpace.__all__ == sorted(jaxpace.__all__)
    for name in jaxpace.__all__:
        assert getattr(jaxpace, name) is not None, name


def test_errors_have_cause_and_fix():
    """Every error class documents what causes it and how to fix it, as errors.py promises."""
    names = [n for n in jaxpace.errors.__all__ if n != "JaxpaceError"]
    assert len(names) >= 8
    for name in names:
        cls = getattr(jaxpace.errors, name)
        assert issubclass(cls, jaxpace.errors.JaxpaceError), name
        doc = cls.__doc__ or ""
        assert "Cause:" in doc and "Fix:" in doc, f"{name}'s docstring lacks `Cause:` or `Fix:`"
        cause = doc.split("Cause:", 1)[1].split("Fix:", 1)[0].strip()
        fix = doc.split("Fix:", 1)[1].strip()
        assert len(cause) > 20 and len(fix) > 20, name
        # Each is also a standard exception type, so `except ValueError` etc. work.
        assert set(cls.__mro__) & {ValueError, RuntimeError, NameError, TypeError}, name


def test_lazy_names_are_the_modules_own_objects():
    from jaxpace import runtime as _runtime
    from jaxpace import topology
    from jaxpace.collectives import dropins as _dropins

    assert jaxpace.psum is _dropins.psum and jaxpace.pmean is _dropins.pmean
    assert jaxpace.Pacer is _runtime.Pacer and jaxpace.configure is _runtime.configure
    assert jaxpace.make_mesh is topology.make_mesh
    assert set(jaxpace.__all__) <= set(dir(jaxpace))
    try:
        jaxpace.no_such_name  # noqa: B018
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("an unknown name must raise AttributeError")


def test_report_and_simulate_do_not_import_jax():
    """`jaxpace report`, `jaxpace simulate` and `--help` never touch JAX (about 3 s to import);
    the first drop-in or Pacer does."""
    import subprocess
    import sys

    code = (
        "import sys, jaxpace, jaxpace.report, jaxpace.sim, jaxpace.cli\n"
        "from jaxpace import adaptive, errors\n"
        "from jaxpace.report import synthetic_records, analyze\n"
        "analyze(synthetic_records(num_ranks=4, num_steps=30, seed=0))\n"
        "jaxpace.sim.simulate('paper', nodes=1, steps=20)\n"
        "assert 'jax' not in sys.modules, sorted(m for m in sys.modules if m.startswith('jax.'))\n"
        "jaxpace.Pacer\n"
        "assert 'jax' in sys.modules\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
