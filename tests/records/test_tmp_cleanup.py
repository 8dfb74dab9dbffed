"""Issue 26, item 1: the test suite does not leave its temporary files behind.

pytest kept every test's `tmp_path` of the last three sessions (about 100 MB
after a full run); pyproject.toml now keeps only failed tests' directories.
"""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO


def _size(path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def test_a_passing_tests_tmp_path_is_removed(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_big.py").write_text(
        "def test_writes_4_mb(tmp_path):\n"
        "    (tmp_path / 'blob').write_bytes(b'x' * (4 << 20))\n"
        "def test_fails(tmp_path):\n"
        "    (tmp_path / 'kept').write_bytes(b'y')\n"
        "    assert False\n"
    )
    basetemp = tmp_path / "basetemp"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-c", str(REPO / "pyproject.toml"), "--rootdir", str(suite),
         "--basetemp", str(basetemp), str(suite / "test_big.py")],
        capture_output=True, text=True, timeout=120, cwd=suite,
    )  # fmt: skip
    assert "1 failed, 1 passed" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert _size(basetemp) < 1 << 20  # the 4 MB of the passing test are gone
    kept = [f for _, _, files in os.walk(basetemp) for f in files]
    assert kept == ["kept"]  # the failing test's directory stays for a look
