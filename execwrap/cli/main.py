"""The ``execwrap`` entry point: :func:`main`.

``main`` parses the arguments (:mod:`execwrap.cli.parser`), checks them
(:mod:`execwrap.cli.options`), and only then imports the command that runs
(:mod:`~execwrap.cli.report`, :mod:`~execwrap.cli.show`,
:mod:`~execwrap.cli.diff`), which is where torch is first imported: ``--help``
and every argument error answer without loading torch. It is also the only
place that configures logging handlers.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence

from execwrap.cli.budget import join_negative_values
from execwrap.cli.calibrate_args import calibrate_options
from execwrap.cli.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_FINDING,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    PROG,
    CLIError,
    CLIFinding,
)
from execwrap.cli.fit_args import fit_options
from execwrap.cli.options import diff_options, report_options, show_options
from execwrap.cli.parser import build_parser
from execwrap.cli.text import echo

__all__ = ["main"]

logger = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``execwrap`` command line.

    Args:
        argv: arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 success, 1 a finding (``diff``: orders differ; ``fit``:
        the step does not fit; ``report``: no plan within ``--memory-budget``, one
        ``execwrap: ...`` line on stderr), 2 bad usage or input (one
        ``execwrap: error: ...`` line printed to stderr),
        130 interrupted, 141 the output pipe was closed early (``| head``).
    """
    parser = build_parser()
    try:
        args = parser.parse_args(join_negative_values(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # --help (0) or a usage error (2, already printed)
        return int(exc.code or 0) if not isinstance(exc.code, str) else EXIT_USAGE
    if args.command is None:
        print(
            f"{PROG}: error: a command is required: report, diff, show, fit or calibrate (see "
            f"'{PROG} --help')",
            file=sys.stderr,
        )
        return EXIT_USAGE
    restore_logging = _configure_logging(getattr(args, "verbose", 0))
    try:
        status = _run(args)
        sys.stdout.flush()  # a closed pipe fails here, inside the handler below
        return status
    except BrokenPipeError:
        # The reader went away: stop quietly, and point stdout at devnull so the
        # interpreter's final flush cannot fail again (Python docs, "Note on SIGPIPE").
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except CLIFinding as exc:
        echo(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_FINDING
    except CLIError as exc:
        logger.debug("error details", exc_info=True)
        echo(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        restore_logging()


def _run(args: argparse.Namespace) -> int:
    """Check the command's arguments (no torch yet), then import the command and run it."""
    if args.command == "report":
        report = report_options(args)
        from execwrap.cli.report import run_report

        return run_report(report)
    if args.command == "calibrate":
        calibrate = calibrate_options(args)
        from execwrap.cli.calibrate import run_calibrate

        return run_calibrate(calibrate)
    if args.command == "fit":
        fit = fit_options(args)
        from execwrap.cli.fit import run_fit

        return run_fit(fit)
    if args.command == "show":
        show = show_options(args)
        from execwrap.cli.show import run_show

        return run_show(show)
    diff = diff_options(args)
    from execwrap.cli.diff import run_diff

    return run_diff(diff)


def _configure_logging(verbosity: int) -> Callable[[], None]:
    """Send the ``execwrap`` and ``tracing`` loggers to stderr at the chosen level.

    Returns:
        A function that removes the handlers again and restores the levels
        (so that calling :func:`main` in-process leaves logging as it was).
    """
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(level)  # records of sub-loggers set lower (progress) stay out
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    saved: list[tuple[logging.Logger, int]] = []
    for name in ("execwrap", "tracing"):
        log = logging.getLogger(name)
        saved.append((log, log.level))
        log.addHandler(handler)
        log.setLevel(level)

    def restore() -> None:
        for log, old_level in saved:
            log.removeHandler(handler)
            log.setLevel(old_level)

    return restore
