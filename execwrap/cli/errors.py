"""How the command line fails: :class:`CLIError` and the exit statuses.

Exit status: :data:`EXIT_OK` (0) success, :data:`EXIT_FINDING` (1) a finding
(``diff``: the orders differ), :data:`EXIT_USAGE` (2) bad usage or bad input
(one ``execwrap: error: ...`` line on stderr, never a traceback),
:data:`EXIT_INTERRUPTED` (130) Ctrl-C.
"""

from __future__ import annotations

__all__ = ["EXIT_FINDING", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "PROG", "CLIError"]

#: The program name in usage lines and error messages.
PROG = "execwrap"

EXIT_OK = 0
EXIT_FINDING = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class CLIError(Exception):
    """Bad usage or input: printed as one ``execwrap: error: ...`` line, exit 2."""
