"""How `jaxpace launch` starts a rank on Linux: `python rank_exec.py PARENT_PID CMD...`.

Asks the kernel to send this process SIGTERM when its parent (the launcher) dies, even by
SIGKILL (`prctl(PR_SET_PDEATHSIG)`, kept across `exec`), then replaces itself with the
rank's command (same PID, same process group). It runs as a file, not as `-m jaxpace...`,
so it imports only the standard library (no JAX). Done in a fresh process rather than in a
`preexec_fn`, because a `preexec_fn` makes `subprocess` fork the launcher, and a launcher
that imported JAX is multithreaded (JAX warns that such a fork may deadlock).
"""

from __future__ import annotations

import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    parent, cmd = int(argv[0]), argv[1:]
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
    except (OSError, AttributeError):  # no prctl here: start the rank all the same
        pass
    if os.getppid() != parent:  # the launcher died before the prctl: do not start
        return 128 + int(signal.SIGTERM)
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        print(f"jaxpace launch: cannot run {cmd[0]!r}: {e.strerror or e}", file=sys.stderr)
        return 127
    return 0  # not reached: execvp does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
