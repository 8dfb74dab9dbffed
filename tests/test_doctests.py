"""The package's docstring examples, run against the installed package.

With the src layout the tests import the installed jaxpace (with its native libraries),
so the docstrings are collected here rather than by pytest's `--doctest-modules` on the
source tree, which would import a second copy of the package from `src/`.
"""

import doctest
import importlib
import importlib.util
import pkgutil

import pytest

import jaxpace

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(jaxpace.__path__, prefix="jaxpace.")
    # `python -m jaxpace` parses argv at import; the native libraries are ctypes libraries.
    if m.name != "jaxpace.__main__" and importlib.util.find_spec(m.name).origin.endswith(".py")
)


def test_walk_finds_the_package_and_its_examples():
    assert "jaxpace.report" in MODULES and len(MODULES) > 40
    finder = doctest.DocTestFinder(exclude_empty=True)
    examples = sum(
        len(t.examples) for n in MODULES for t in finder.find(importlib.import_module(n), n)
    )
    assert examples > 50, examples


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in finder.find(module, name):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
