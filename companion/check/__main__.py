"""Command line: ``python -m companion.check path/to/hwN [--hw hwN] [-k text] [--list]``."""
from __future__ import annotations

import argparse
import sys

from .questions import HOMEWORKS, questions_for
from .runner import check, detect_homework


def main(argv: list[str] | None = None) -> int:
    """Check a homework folder and print the report; exit status 0 when every question passes."""
    parser = argparse.ArgumentParser(
        prog="python -m companion.check",
        description="Check your own needle (course skeleton layout) question by question.")
    parser.add_argument("folder", help="your homework folder, e.g. path/to/hw2")
    parser.add_argument("--hw", choices=HOMEWORKS, help="the homework (default: from the name)")
    parser.add_argument("-k", action="append", metavar="TEXT",
                        help="only questions whose id contains TEXT (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the questions and exit")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds one question may run (default 120)")
    parser.add_argument("--isolate", action="store_true",
                        help="a fresh process for every question (slower)")
    parser.add_argument("--no-build", action="store_true", help="do not compile C++/CUDA")
    args = parser.parse_args(argv)
    try:
        if args.list:
            from pathlib import Path
            hw = args.hw or detect_homework(Path(args.folder))
            for q in questions_for(hw):
                print(f"{q.id:<36} {q.title}")
            return 0
        report = check(args.folder, args.hw, only=args.k, timeout=args.timeout,
                       isolate=args.isolate, do_build=not args.no_build)
    except (ValueError, FileNotFoundError) as exc:
        print(f"companion check: {exc}", file=sys.stderr)
        return 2
    print(report.format())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
