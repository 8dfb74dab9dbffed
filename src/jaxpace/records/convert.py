"""`jaxpace convert IN OUT`: any source the report reads, to the native records format (Parquet).

jaxpace's JSONL records become one Parquet file per input file (per process), two
files at a time: a clean file of one process through pyarrow's parser
(`records.jsonl_arrow`), any other through the records reader (so a bad line is
dropped, counted and located, as the report would), the same bytes either way; `jax.profiler` traces and NCCL Inspector logs go through their
readers and become one Parquet file per process, whose headers keep the source's
label and whether it has arrival times (`source`, `source_label`, `timed`), so the
report reads the converted run as it read the original. A progress bar shows on
long inputs (more than one file, on a terminal or with `--progress`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from jaxpace.errors import JaxpaceError, RecordsError

__all__ = ["cli_main", "configure_parser", "convert"]

# Inputs of this many bytes or more show a progress bar (on a terminal).
_PROGRESS_BYTES = 64 << 20
# Files converted at a time (pyarrow's parser and Parquet writer release the GIL).
_THREADS = 2


def _progress(total: int, show: bool):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not show,
        transient=False,
    )


def convert(
    source: str | os.PathLike, out: str | os.PathLike, *, progress: bool | None = None
) -> list[Path]:
    """Converts `source` (a run directory or file of JSONL or Parquet records, traces, or
    Inspector logs) to Parquet records in the directory `out`; returns the files written.

    Args:
      source: what `jaxpace report` reads.
      out: the directory to write `records-p{i}.parquet` into (created; files of the same
        name are replaced, each atomically).
      progress: show a progress bar (default: on a terminal, for inputs of several files
        and 64 MiB or more).

    Raises:
      RecordsError: unreadable or malformed input (names file and line), or `out` is
        `source` itself.
    """
    from jaxpace.records import format as fmt
    from jaxpace.records.reader import load_records
    from jaxpace.records.sources import detect, load

    src, dst = Path(source), Path(out)
    if not src.exists():
        raise RecordsError(f"`jaxpace convert`: input {src} does not exist.")
    if dst.exists() and not dst.is_dir():
        raise RecordsError(
            f"`jaxpace convert`: output {dst} exists and is not a directory; pass a directory."
        )
    if src.is_dir() and dst.resolve() == src.resolve():
        raise RecordsError(
            f"`jaxpace convert`: output {dst} is the input directory; pass another one."
        )
    kind = detect(src)
    if kind != "records":
        recs = load(src).records
        # The source reader's notes (bad lines, gaps, ...) travel in the headers.
        keep = {"source_notes": list(recs.notes), "source_partial": bool(recs.partial)}
        recs = dataclasses.replace(recs, headers=tuple({**h, **keep} for h in recs.headers))
        return recs.write_parquet(dst)
    files = fmt.records_files(src) if src.is_dir() else [src]
    if not files:
        recs = load_records(src)  # its error says what was expected
    total = sum(f.stat().st_size for f in files)
    show = (
        progress
        if progress is not None
        else (len(files) > 1 and total >= _PROGRESS_BYTES and sys.stderr.isatty())
    )
    written: list[Path] = []

    def one(f: Path) -> list[Path]:
        fast = _convert_clean(f, dst)
        return [fast] if fast is not None else load_records(f).write_parquet(dst)

    with _progress(len(files), show) as bar, ThreadPoolExecutor(_THREADS) as pool:
        task = bar.add_task(f"converting {src}", total=len(files))
        for paths in pool.map(one, files):
            for w in paths:
                if w not in written:
                    written.append(w)
            bar.advance(task)
    return sorted(written)


def _convert_clean(f: Path, dst: Path) -> Path | None:
    """A JSONL records file of one process that pyarrow's parser reads cleanly
    (`jsonl_arrow.read_clean`), written as `load_records(f).write_parquet(dst)` writes it
    (the same header checks, rows and layout) without the engine; None for any other file
    (read by `load_records`: a Parquet file, a bad line, several processes)."""
    import numpy as np
    import pyarrow.compute as pc

    from jaxpace.records.format import FORMAT_VERSION, INT_STEP_FIELDS, records_filename
    from jaxpace.records.format import write_parquet as write
    from jaxpace.records.jsonl_arrow import read_clean
    from jaxpace.records.jsonl_checked import ends_with_newline, first_line
    from jaxpace.records.parquet_reader import is_parquet
    from jaxpace.records.reader import run_meta

    if is_parquet(f) or not ends_with_newline(f):
        return None
    header, where, _ = first_line(f)
    table = read_clean(f) if header is not None else None
    if table is None or table.num_rows == 0:
        return None
    if table.column("execution").null_count < table.num_rows:
        return None  # (raw execution ids: `load_records` numbers them)
    proc = table.column("process")
    p = pc.min(proc).as_py()
    if p != pc.max(proc).as_py() or p != header.get("process_index"):
        return None
    meta = run_meta([(header, where)], [], [str(f)], np.array([p], np.int64), table.num_rows)
    names = np.array(sorted(set(pc.unique(table.column("site")).to_pylist())), dtype=object)
    site = np.asarray(table.column("site").to_numpy(zero_copy_only=False), dtype=object)
    cols = {k: table.column(k).to_numpy() for k in INT_STEP_FIELDS}
    cols["site"] = np.searchsorted(names, site).astype(np.int64)
    cols["engaged"] = table.column("engaged").to_numpy(zero_copy_only=False).astype(bool)
    cols["device"] = pc.fill_null(table.column("device"), -1).to_numpy()
    head = meta.headers[0]
    head = {
        **head,
        "format": head.get("format", FORMAT_VERSION),
        "granularity": head.get("granularity", meta.granularity),
    }
    return Path(write(dst / records_filename(p), head, cols, tuple(names.tolist())))


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "input", help="records (JSONL or Parquet), jax.profiler traces or Inspector logs"
    )
    p.add_argument("output", help="directory for the Parquet records (records-p{i}.parquet)")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar (default: on a terminal, for inputs of 64 MiB or more)",
    )


def cli_main(args: argparse.Namespace) -> int:
    try:
        paths = convert(args.input, args.output, progress=args.progress)
    except (JaxpaceError, OSError) as e:
        print(f"jaxpace convert: {e}", file=sys.stderr)
        return 2
    rows = "" if not paths else f" ({len(paths)} files)"
    print(f"jaxpace convert: wrote {args.output}{rows}")
    return 0
