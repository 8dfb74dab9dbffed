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
