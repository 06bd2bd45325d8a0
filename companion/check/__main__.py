"""Command line: ``python -m companion.check path/to/hwN [--hw hwN] [-k text] [--list]``, and
``python -m companion.check --progress [FOLDER ...]`` (see ``progress.py``)."""

from __future__ import annotations

import argparse
import sys

from . import progress
from .boxed import GIB, Limits
from .questions import HOMEWORKS, questions_for
from .runner import check, detect_homework


def _seconds(text: str) -> float:
    """A positive number of seconds (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


def _parser() -> argparse.ArgumentParser:
    """The command line's options."""
    parser = argparse.ArgumentParser(
        prog="python -m companion.check",
        description="Check your own needle (course skeleton layout) question by question.",
    )
    parser.add_argument(
        "folder",
        nargs="*",
        help="your homework folder, e.g. path/to/hw2 "
        "(with --progress: any number, default the current folder)",
    )
    parser.add_argument("--hw", choices=HOMEWORKS, help="the homework (default: from the name)")
    parser.add_argument(
        "-k",
        action="append",
        metavar="TEXT",
        help="only questions whose id contains TEXT (repeatable)",
    )
    parser.add_argument("--list", action="store_true", help="list the questions and exit")
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=120.0,
        help="seconds one question (and the import) may run (default 120)",
    )
    parser.add_argument(
        "--build-timeout",
        type=_seconds,
        default=600.0,
        help="seconds one build step may run (default 600)",
    )
    parser.add_argument(
        "--isolate", action="store_true", help="a fresh process for every question (slower)"
    )
    parser.add_argument("--no-build", action="store_true", help="do not compile C++/CUDA")
    parser.add_argument(
        "--memory",
        type=_seconds,
        default=4.0,
        metavar="GIB",
        help="memory a worker may use, in GiB (RLIMIT_DATA; default 4)",
    )
    parser.add_argument(
        "--cpu-time",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="CPU seconds a worker may use (RLIMIT_CPU; default: --timeout per question)",
    )
    parser.add_argument(
        "--max-processes",
        type=int,
        default=64,
        metavar="N",
        help="processes a worker may have running at once (default 64)",
    )
    parser.add_argument(
        "--progress",
        action="store_true",
        help="print passed/total, changes and the next question per homework",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Check a homework folder and print the report; exit status 0 when every question passes."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.progress:
        return _progress(args.folder or ["."])
    if len(args.folder) != 1:
        parser.error("give one homework folder (or --progress with any number)")
    args.folder = args.folder[0]
    try:
        if args.list:
            from pathlib import Path

            hw = args.hw or detect_homework(Path(args.folder))
            for q in questions_for(hw):
                print(f"{q.id:<36} {q.title}")
                if q.help:
                    print(f"{'':<36}   ({q.help})")
            return 0
        report = check(
            args.folder,
            args.hw,
            only=args.k,
            timeout=args.timeout,
            isolate=args.isolate,
            do_build=not args.no_build,
            build_timeout=args.build_timeout,
            limits=Limits(int(args.memory * GIB), args.cpu_time, args.max_processes),
        )
    except (ValueError, FileNotFoundError) as exc:
        print(f"companion check: {exc}", file=sys.stderr)
        return 2
    print(report.format())
    note = progress.record(report, args.k)
    if note:
        print(note, file=sys.stderr)
    else:
        mine = progress.Progress(report.hw, report.root, progress.load_history(report.root))
        print("\n" + "\n".join(mine.format()))
    return 0 if report.ok else 1


def _progress(folders: list[str]) -> int:
    try:
        print(progress.format_progress(progress.progress(folders)))
    except (ValueError, FileNotFoundError) as exc:
        print(f"companion check: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
