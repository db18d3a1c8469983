"""How the command line fails: :class:`CLIError` and the exit statuses.

Exit status: :data:`EXIT_OK` (0) success, :data:`EXIT_FINDING` (1) a finding
(``diff``: the orders differ; ``fit``: the step does not fit; ``report``: no plan within
``--memory-budget``, one ``execwrap: ...`` line, :class:`CLIFinding`), :data:`EXIT_USAGE` (2)
bad usage or bad input (one ``execwrap: error: ...`` line on stderr, never a traceback),
:data:`EXIT_INTERRUPTED` (130) Ctrl-C, :data:`EXIT_BROKEN_PIPE` (141, as a process
killed by SIGPIPE) the reader of the output went away (``execwrap show r.json | head``):
no traceback either.
"""

from __future__ import annotations

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_FINDING",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "PROG",
    "CLIError",
    "CLIFinding",
]

#: The program name in usage lines and error messages.
PROG = "execwrap"

EXIT_OK = 0
EXIT_FINDING = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE


class CLIError(Exception):
    """Bad usage or input: printed as one ``execwrap: error: ...`` line, exit 2."""


class CLIFinding(CLIError):
    """A finding the command answers with one line and no output (``report``: no plan
    within ``--memory-budget``): printed as ``execwrap: ...`` (not ``error:``), exit 1,
    as ``fit`` exits 1 for a step that does not fit."""
