"""docs/architecture.md names every module of the package, so the map stays complete."""

from pathlib import Path

import jaxpace

PKG = Path(jaxpace.__file__).parent
REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"


def _named(rel: Path, text: str) -> bool:
    """`a/b/c.py` is named by its path, or by `c.py` beside its folder `a/b/` (a package's
    list of modules); a package's `__init__.py` by its folder (`a/b/`)."""
    path = rel.as_posix()
    folder = rel.parent.as_posix() + "/" if rel.parent != Path(".") else ""
    if rel.name == "__init__.py" and folder:
        return f"{folder}__init__.py" in text or f"`{folder}" in text or f"{folder}`" in text
    if path in text:
        return True
    return bool(folder) and folder in text and f"`{rel.name}`" in text


def _modules() -> list[Path]:
    found = [p.relative_to(PKG) for p in PKG.rglob("*") if p.suffix in (".py", ".cc")]
    return sorted(p for p in found if "__pycache__" not in p.parts)


def test_every_module_is_named_in_the_architecture_doc():
    text = DOC.read_text()
    missing = [m.as_posix() for m in _modules() if not _named(m, text)]
    assert not missing, f"docs/architecture.md does not name: {missing}"


def test_the_check_sees_the_modules_it_should():
    """The walk finds the package's modules (a wrong root would pass vacuously)."""
    names = {m.as_posix() for m in _modules()}
    assert {"policy/adaptive.py", "runtime/pacer.py", "native/kernels.cc"} <= names
    assert not _named(Path("policy/no_such_module.py"), DOC.read_text())
