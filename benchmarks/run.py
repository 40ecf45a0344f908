"""Run a benchmark suite: ``python benchmarks/run.py SUITE [--json] [--quick] [--threads N] [--impl NAME ...]``.

The same as ``attnkit bench SUITE ...``; the suites live in ``attnkit.bench`` (see benchmarks/README.md).
"""

import sys

from attnkit.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
