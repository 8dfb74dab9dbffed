"""The curated namespace: every `__all__` name resolves, and the list is sorted."""

import importlib

import jaxpace


def test_all_names_resolve_and_are_sorted():
    assert jaxpace.__all__ == sorted(jaxpace.__all__)
    for name in jaxpace.__all__:
        assert getattr(jaxpace, name) is not None, name


def test_submodules_all_resolve():
    for mod in ["jaxpace.errors", "jaxpace.launch"]:
        m = importlib.import_module(mod)
        for name in getattr(m, "__all__", []):
            assert hasattr(m, name), f"{mod}.{name}"


def test_errors_have_cause_and_fix():
    for name in jaxpace.errors.__all__:
        cls = getattr(jaxpace.errors, name)
        assert issubclass(cls, jaxpace.errors.JaxpaceError)
        assert cls.__doc__ and len(cls.__doc__) > 40
