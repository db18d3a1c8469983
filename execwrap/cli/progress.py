"""Progress on the terminal: :class:`ProgressHandler`, a ``logging`` handler.

Long steps (calibration's phases, :mod:`execwrap.cost.calibrate`) log each
phase at INFO with ``extra={"progress": (done, total, name)}``. The handler
shows those records, and only those: on a terminal one line that redraws
itself (a bar, the phase, the seconds so far), elsewhere (a pipe, a log file)
one line per phase. ``--quiet`` leaves it out; with ``-v`` the log lines say
the same, so the command line attaches it only at the default verbosity.
"""

from __future__ import annotations

import logging
import time
from typing import IO

__all__ = ["BAR_WIDTH", "ProgressHandler"]

#: Characters of the bar on a terminal.
BAR_WIDTH = 24


class ProgressHandler(logging.Handler):
    """Shows the ``progress`` records logged to the loggers it is attached to.

    Args:
        stream: where to write (the command line passes ``sys.stderr``).
        what: the step's name on the bar, e.g. ``"calibrating"``.
    """

    def __init__(self, stream: IO[str], what: str) -> None:
        super().__init__(logging.INFO)
        self.stream = stream
        self.what = what
        self.started = time.perf_counter()
        isatty = getattr(stream, "isatty", None)
        self.tty = bool(isatty()) if callable(isatty) else False

    def emit(self, record: logging.LogRecord) -> None:
        progress = getattr(record, "progress", None)
        if progress is None:
            return
        done, total, name = progress
        try:
            if not self.tty:
                self.stream.write(record.getMessage() + "\n")
            else:
                filled = BAR_WIDTH * done // max(1, total)
                bar = "#" * filled + "." * (BAR_WIDTH - filled)
                phase = f"{min(done + 1, total)}/{total} {name}" if done < total else "done"
                seconds = time.perf_counter() - self.started
                end = "\n" if done >= total else ""
                self.stream.write(f"\r{self.what} [{bar}] {phase} ({seconds:.0f} s)\x1b[K{end}")
            self.stream.flush()
        except Exception:  # noqa: BLE001 - a broken stream must not stop the step
            self.handleError(record)
