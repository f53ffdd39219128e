"""``python -m kvsim.cli``: the same command line as ``python -m kvsim`` (older scripts and
the hardware tests call it by this name)."""

from kvsim.cli import main

raise SystemExit(main())
