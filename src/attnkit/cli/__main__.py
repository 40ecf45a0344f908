"""``python -m attnkit.cli ...``: the same as ``attnkit ...`` (``python -m attnkit`` is the shorter spelling)."""

import sys

from attnkit.cli import main

if __name__ == "__main__":
    sys.exit(main())
