"""``python -m vagent ...`` is ``vagent ...`` (torchrun starts workers as ``-m vagent train ...``)."""

import sys

from vagent.cli import main

if __name__ == "__main__":
    sys.exit(main())
