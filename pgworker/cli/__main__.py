"""``python -m pgworker.cli``: the same as the ``pgworker`` command."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
