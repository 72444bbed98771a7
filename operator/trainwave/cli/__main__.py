"""`python -m trainwave.cli`: the same as the `trainwave` command."""

import sys

from trainwave.cli import main

if __name__ == "__main__":
    sys.exit(main())
