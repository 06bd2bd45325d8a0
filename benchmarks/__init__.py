"""Benchmarks: needle beside numpy, run with ``python -m benchmarks`` (``make bench``).

Every ``bench_*.py`` module here exposes ``main()``; ``benchmarks.common`` holds the shared
timing and table helpers.
"""
