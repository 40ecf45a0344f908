"""``python -m attnkit ...``: the same as the ``attnkit`` command (and what ``torchrun -m attnkit`` runs)."""

import sys

from attnkit.cli import main

if __name__ == "__main__":
    sys.exit(main())
