"""``python -m thesis_lib.cli``: the command line, as the ``thesis-lib`` script runs it."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
