"""The `jaxpace` command: launch, demo, report, convert, simulate, topo."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

# Subcommands whose parser and entry point live in their own module:
# name -> (module, help)
_DELEGATED = {
    "demo": (
        "jaxpace.demo",
        "run the main job: a 4-process Flax/Optax training run with an injected straggler, "
        "diagnosed (report, HTML, Perfetto trace), then measure-only, exchange and pacing "
        "interleaved step by step",
    ),
    "report": ("jaxpace.report", "analyze a run's records: tables, HTML report, Perfetto trace"),
    "convert": (
        "jaxpace.records.convert",
        "convert records, jax.profiler traces or NCCL Inspector logs to Parquet records",
    ),
    "simulate": ("jaxpace.sim", "simulate 1-1024 nodes with and without pacing"),
    "topo": ("jaxpace.topology", "show this host's topology and the suggested mesh"),
}


def _launch_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--num-processes", type=int, default=2, help="processes (default 2)")
    p.add_argument("--local-devices", type=int, default=1, help="CPU devices per process")
    p.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="kill every rank after this many seconds (default 600)",
    )
    p.add_argument(
        "--heartbeat-timeout",
        type=int,
        default=10,
        help="whole seconds (at least 1) before JAX declares a silent peer dead (default 10)",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=5.0,
        help="seconds between forwarding SIGTERM/SIGINT/SIGHUP to the ranks and killing them "
        "(default 5)",
    )
    p.add_argument(
        "--keep-going",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="when a rank fails, let the others run up to this many seconds more (JAX's "
        "heartbeat abort or their own handling may end them) before stopping them "
        "(default 0: at once; at most 600)",
    )
    p.add_argument(
        "--output-file",
        default=None,
        help="also write every prefixed output line here, a regular file (truncated) or a new "
        "path (the launcher keeps only the last 200 lines per rank in memory)",
    )
    p.add_argument(
        "--no-cpu",
        action="store_true",
        help="do not force JAX_PLATFORMS=cpu (use the host's accelerators)",
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")


def _launch_main(args: argparse.Namespace) -> int:
    from jaxpace import launch
    from jaxpace.errors import JaxpaceError

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    try:
        res = launch.launch(
            cmd,
            num_processes=args.num_processes,
            local_devices=args.local_devices,
            timeout_s=args.timeout,
            heartbeat_timeout_s=args.heartbeat_timeout,
            cpu=not args.no_cpu,
            grace_s=args.grace,
            output_file=args.output_file,
            keep_going_s=args.keep_going,
        )
    except KeyboardInterrupt:
        print("jaxpace launch: interrupted; every rank was stopped.", file=sys.stderr)
        return 130
    except JaxpaceError as e:
        print(f"jaxpace launch: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        what = e.filename if e.filename is not None else cmd[0]
        print(f"jaxpace launch: cannot open or run {what!r}: {e.strerror}", file=sys.stderr)
        return 2
    if res.output_file_error:
        print(f"jaxpace launch: warning: {res.output_file_error}.", file=sys.stderr)
    if not res.ok:
        print(f"jaxpace launch: {launch.describe_failure(res, args.timeout)}", file=sys.stderr)
        if res.signal is not None:
            return 128 + res.signal
        return 124 if res.timed_out else (res.returncodes[res.failed_rank] or 1)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxpace",
        description="Measure and pace JAX collectives across ranks.",
    )
    from jaxpace import __version__

    parser.add_argument("--version", action="version", version=f"jaxpace {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("launch", help="run a command as several local JAX processes")
    _launch_parser(p)
    p.set_defaults(_main=_launch_main)
    parser.subcommands = {"launch": p}
    for name, (mod, help_) in _DELEGATED.items():
        p = sub.add_parser(name, help=help_, description=help_[0].upper() + help_[1:] + ".")
        m = importlib.import_module(mod)
        m.configure_parser(p)
        p.set_defaults(_main=m.cli_main)
        parser.subcommands[name] = p
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `jaxpace` console script."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # a typo under a subcommand: that subcommand's usage, not the top-level one
        sub = parser.subcommands.get(getattr(args, "command", None), parser)
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "_main", None):
        parser.print_help()
        return 0
    return int(args._main(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
