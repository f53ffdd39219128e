"""``python -m kvsim``: the same as the ``kvsim`` command."""

import sys

from kvsim.cli import console_main

sys.exit(console_main())
