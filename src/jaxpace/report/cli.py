"""`jaxpace report RUN_DIR`: the command line of the report (`jaxpace.cli` delegates here)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jaxpace.errors import RecordsError
from jaxpace.records.format import has_records
from jaxpace.records.reader import Records, find_runs
from jaxpace.records.safe_io import check_output_path
from jaxpace.records.sources import detect, xprof
from jaxpace.report.analyze import analyze
from jaxpace.report.model import DEFAULT_WARMUP_STEPS, write_json
from jaxpace.report.render.html import write_html
from jaxpace.report.render.terminal import print_summary, printable
from jaxpace.report.render.trace import write_trace
from jaxpace.report.stalls import format_stalls, load_stalls

__all__ = ["cli_main", "configure_parser"]


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Adds the `jaxpace report` arguments to `parser`."""
    parser.add_argument(
        "run_dir",
        help="run directory of `records-p*.parquet` (or `.jsonl`) files (or one file), a "
        "`jaxpace.watch` out= folder, `jax.profiler` traces (a directory, or one per process), "
        "or NCCL Inspector logs (`<host>-pid<pid>.log`)",
    )
    parser.add_argument("--html", help="HTML report path (default: RUN_DIR/report.html)")
    parser.add_argument("--trace", help="Perfetto trace path (default: RUN_DIR/trace.json)")
    parser.add_argument("--json", help="also write the report as JSON to this path")
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help=f"steps to skip at the start (default {DEFAULT_WARMUP_STEPS}, at most a quarter)",
    )
    parser.add_argument(
        "--site", help="one collective site to analyze (default: the whole step, every site)"
    )
    parser.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="print every table, the evidence and the notes (default: a short summary)",
    )
    parser.add_argument(
        "--run",
        help="which run to report when RUN_DIR's `jax.profiler` traces hold several (a "
        "program traced again into the same folder): its number as listed, or a profiler "
        "session folder name only it holds",
    )
    parser.add_argument(
        "--expected-transfer-ms",
        type=float,
        default=None,
        help="alpha-beta expectation of the collective's transfer time, for contention",
    )


def cli_main(args: argparse.Namespace) -> int:
    """Runs `jaxpace report`; returns the exit code (2 for unusable records).

    A folder that holds several runs and no records of its own (`jaxpace demo`'s
    output) is listed, with the command that reports each: exit code 0.
    """
    runs = _runs_inside(args.run_dir)
    if len(runs) > 1:
        print(f"{args.run_dir} holds {len(runs)} runs; report one of them:")
        print("\n".join(f"  jaxpace report {r}" for r in runs))
        return 0
    args.run_dir = _one_run(args.run_dir)
    writing = "html"  # the output being written, named if writing it fails
    try:
        source = _trace_run(args)
        if source is None:  # the runs were listed
            return 0
        outputs = _output_paths(args)
        stalls = format_stalls(load_stalls(args.run_dir))  # a hung run: its stall records first
        if stalls:
            print(printable(stalls, keep_newlines=True) + "\n")
        report = analyze(
            source,
            warmup_steps=args.warmup,
            site=args.site,
            expected_transfer_s=(
                args.expected_transfer_ms / 1e3
                if getattr(args, "expected_transfer_ms", None)
                else None
            ),
        )
        print_summary(report, verbose=bool(getattr(args, "verbose", False)))
        _print_sites(report, verbose=bool(getattr(args, "verbose", False)))
        written = []
        for writing, write in (("html", write_html), ("trace", write_trace), ("json", write_json)):
            if writing in outputs:
                written.append(write(report, outputs[writing]))
    except (RecordsError, ValueError) as e:
        print(f"jaxpace report: error: {printable(e, keep_newlines=True)}", file=sys.stderr)
        return 2
    except MemoryError:
        print(
            f"jaxpace report: error: not enough memory to analyze {args.run_dir}; report "
            "fewer steps or one site (--site), or run it on a machine with more memory.",
            file=sys.stderr,
        )
        return 2
    except OSError as e:  # from `write_atomic`: its message names the path and the OS error
        if e.filename is None:
            detail = f"{e} (That path is set with `--{writing}`.)"
        else:
            detail = (
                f"cannot write output ({e.strerror or e}: {e.filename}). Pass writable paths "
                "with --html/--trace/--json."
            )
        print(f"jaxpace report: error: {printable(detail)}", file=sys.stderr)
        return 2
    print("wrote " + ", ".join(str(w) for w in written))
    return 0


def _trace_run(args: argparse.Namespace) -> Records | str | None:
    """What to analyze: `args.run_dir`, or the `--run` chosen among the runs of its
    `jax.profiler` traces; None after listing several runs when `--run` is not given."""
    run = getattr(args, "run", None)
    if detect(args.run_dir) != "xprof":
        if run is not None:
            raise RecordsError(
                f"`--run` chooses among the runs of `jax.profiler` traces, and "
                f"{args.run_dir} holds none; report a run of records or Inspector logs by "
                "its folder instead."
            )
        return args.run_dir
    traces = xprof.read(Path(args.run_dir))
    if len(traces.runs) > 1 and run is None:
        print(f"{args.run_dir} holds {len(traces.runs)} runs of `jax.profiler` traces; report one:")
        print(traces.listing(f"jaxpace report {args.run_dir}"))
        return None
    return traces.load(run).records


def _runs_inside(run_dir: str) -> list[Path]:
    """The runs inside a folder without records of its own (else [])."""
    base = Path(run_dir)
    if base.is_dir() and not has_records(base):
        return find_runs(base)
    return []


def _output_paths(args: argparse.Namespace) -> dict[str, Path]:
    """Where the HTML, trace and JSON go; each checked first (no FIFO, no device)."""
    base = Path(args.run_dir)
    out_dir = base if base.is_dir() else base.parent
    paths = {
        "html": Path(args.html or out_dir / "report.html"),
        "trace": Path(args.trace or out_dir / "trace.json"),
    }
    if args.json:
        paths["json"] = Path(args.json)
    for key, p in paths.items():
        check_output_path(p, f"{key.upper()} output", f"--{key}")
    return paths


def _print_sites(report, *, verbose: bool = False) -> None:
    """Every site in step order, with who is late within each group (several sites only):
    the rows `analyze` computed (`Report.sites_table`); names shown as `printable` text,
    shortened and groups summarized unless `verbose` (`render.terminal.site_table_lines`)."""
    if report.sites_table:
        from jaxpace.report.render.terminal import site_table_lines

        text = "\n".join(site_table_lines(report.sites_table, verbose=verbose))
        print("\n" + printable(text, keep_newlines=True))


def _one_run(run_dir: str) -> str:
    """`run_dir`, or the one run inside a folder without records of its own.

    A folder of several runs is listed by `cli_main` before this.
    """
    base = Path(run_dir)
    if detect(base) != "records":  # a profiler trace or Inspector logs: one run
        return run_dir
    if base.is_dir() and not has_records(base):
        runs = find_runs(base)
        if len(runs) == 1:
            print(f"{base} holds one run: reporting {runs[0]}")
            return str(runs[0])
    return run_dir
