"""The README's quick start and CI run the same test command, and the layout keeps it true."""

import re
from pathlib import Path

import jaxpace

REPO = Path(__file__).resolve().parent.parent


def _readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"## Quick start.*?```bash\n(.*?)```", text, re.S)
    assert block, "README.md has no ```bash block under '## Quick start'"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_quick_start_is_two_commands_install_then_run():
    cmds = _readme_commands()
    assert len(cmds) == 2, cmds
    assert cmds[0].startswith('pip install ".[demo]"') and cmds[0].endswith("jaxpace demo")
    assert cmds[1].startswith('pip install ".[dev]"') and "pytest" in cmds[1]


def test_ci_runs_the_readmes_test_command_verbatim():
    test_cmd = _readme_commands()[1]
    ci = (REPO / ".ci" / "run").read_text()
    runs = [line for line in ci.splitlines() if test_cmd in line and not line.startswith("#")]
    assert runs, f".ci/run does not run the README's test command {test_cmd!r}"
    assert "pip install -e" not in ci, ".ci/run must install as the README does (not editable)"


def test_tests_import_an_installed_package_not_a_bare_source_tree():
    # src layout: the repository root holds no importable `jaxpace`, so `python -m pytest`
    # from it imports the installed package, whose native libraries sit beside it.
    assert not (REPO / "jaxpace" / "__init__.py").exists()
    pkg = Path(jaxpace.__file__).resolve().parent
    assert pkg != (REPO / "jaxpace").resolve()
