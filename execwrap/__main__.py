"""``python -m execwrap``: the same as the ``execwrap`` console script."""

from __future__ import annotations

import sys

from execwrap.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
