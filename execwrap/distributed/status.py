"""Failures named on every rank: a status exchange after each step the ranks take together.

Capture, the cross-rank checks, planning and sharding run on every rank of a
process group, between collectives. When one rank raises in such a step, the
others go on to the next collective and meet a rank that is not there: gloo
reports "Connection closed by peer" once the failing process has ended, NCCL
waits until the process group's timeout, and neither says what went wrong.

:func:`fail_together` runs a step on every rank and then exchanges each rank's
status, ``(rank, None)`` or ``(rank, "ValueError: ...")``, in one
``all_gather_object``. A rank that failed re-raises its own exception (with a
note naming the step and the ranks told); every other rank raises
:class:`~execwrap.errors.RankFailure`, naming the failing rank and its
exception. Collectives that carry data anyway fold the status into their own
exchange instead (:func:`execwrap.fsdp.ranks.check_order_across_ranks`,
:func:`execwrap.distributed.timing.agree_timing`).

Rules of use: a step holds no collective (a rank that fails before it would
leave the others pairing that collective with the status exchange), and every
rank of the group runs the same steps in the same order.

Timeouts: the exchange runs under the process group's own timeout, like every
collective of the group. A rank that fails inside a step answers at once; a
rank whose process ended is seen by the backend at once (gloo: "Connection
closed by peer"), and the exchange then raises :class:`RankFailure` saying that
a rank left before reporting; a rank stuck elsewhere fails the exchange at the
group's timeout. No shorter timer is set: one rank can legitimately capture or
plan minutes longer than another, and a timer cannot tell a slow rank from a
stuck one.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch.distributed as dist

from execwrap.errors import RankFailure

__all__ = [
    "MAX_ERROR_CHARS",
    "add_note",
    "describe_error",
    "exchange_status",
    "fail_together",
    "is_distributed",
    "raise_failures",
]

logger = logging.getLogger(__name__)

#: Longest error text a rank sends (longer messages are cut, with "...").
MAX_ERROR_CHARS = 2000

#: ``(global rank, "ExceptionType: message")`` of one failing rank.
Failure = tuple[int, str]


def is_distributed(group: dist.ProcessGroup | None = None) -> bool:
    """Whether a process group is initialised and ``group`` has more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def describe_error(error: BaseException) -> str:
    """``"ExceptionType: message"``, at most :data:`MAX_ERROR_CHARS` characters."""
    text = f"{type(error).__name__}: {error}"
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 3] + "..."
    return text


def add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)`` (PEP 678); on Python 3.10, the ``__notes__`` list."""
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:  # pragma: no cover - Python 3.10
        error.__notes__ = [*getattr(error, "__notes__", []), note]  # type: ignore[attr-defined]


def exchange_status(
    phase: str, error: BaseException | None, group: dist.ProcessGroup | None = None
) -> tuple[Failure, ...]:
    """Tell every rank of ``group`` whether this rank's ``phase`` failed; hear theirs.

    Collective: one ``all_gather_object`` of ``(rank, None | "Type: message")``.
    Without an initialised process group, or with one rank, returns at once.

    Args:
        phase: the step, in words, for messages.
        error: this rank's exception, or ``None``.
        group: the process group (default: ``WORLD``).

    Returns:
        ``(global rank, "Type: message")`` of every failing rank, this one
        included, lowest rank first.

    Raises:
        RankFailure: the exchange itself failed (a rank left the job before
            reporting); ``failures`` is empty.
    """
    if not is_distributed(group):
        return ()
    mine = (dist.get_rank(), None if error is None else describe_error(error))
    gathered: list[tuple[int, str | None] | None] = [None] * dist.get_world_size(group)
    try:
        dist.all_gather_object(gathered, mine, group=group)
    except Exception as e:  # the backend: a rank is gone, or the group timed out
        raise RankFailure(
            f"the ranks' status exchange after {phase} failed ({describe_error(e)}): a rank "
            "left the job before reporting (its process ended, or it failed outside "
            "execwrap). Look for the first failure in the other ranks' output",
            phase=phase,
            failures=(),
        ) from e
    failures = sorted((r, text) for r, text in (g for g in gathered if g is not None) if text)
    logger.debug("status after %s: %d failing rank(s)", phase, len(failures))
    return tuple(failures)


def _init() -> bool:
    return dist.is_available() and dist.is_initialized()


def raise_failures(
    phase: str, failures: tuple[Failure, ...], error: BaseException | None = None
) -> None:
    """Raise what this rank should raise after an exchange: its own ``error`` (with a
    note naming ``phase`` and the other failing ranks), else :class:`RankFailure`
    when another rank failed; return when no rank failed.

    Raises:
        RankFailure: another rank failed and this one did not.
        BaseException: ``error``, when given.
    """
    if error is not None:
        if _init():
            me = dist.get_rank()
            others = [f"rank {r}: {text}" for r, text in failures if r != me]
            note = (
                f"execwrap: rank {me} failed during {phase}; every rank of the process group "
                "was told and stops too"
            )
            if others:
                note += f" (failing too: {'; '.join(others)})"
            add_note(error, note)
        raise error
    if failures:
        raise RankFailure(_message(phase, failures), phase=phase, failures=failures)


def _message(phase: str, failures: tuple[Failure, ...]) -> str:
    ranks = [r for r, _ in failures]
    me = dist.get_rank() if _init() else 0
    if len(failures) == 1:
        head = f"rank {ranks[0]} failed during {phase}: {failures[0][1]}"
    else:
        listed = ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"
        head = f"ranks {listed} failed during {phase}: " + "; ".join(
            f"rank {r}: {text}" for r, text in failures
        )
    return (
        f"{head.rstrip('.')}. This rank ({me}) stops too: every rank takes this step together, and going "
        "on would leave the ranks' collectives unpaired (a hang, or gloo's \"Connection closed "
        f'by peer"). Fix the error on rank {ranks[0]} (its own traceback is in its output)'
    )


@contextlib.contextmanager
def fail_together(phase: str, *, group: dist.ProcessGroup | None = None) -> Iterator[None]:
    """Run the ``with`` block on every rank, then exchange each rank's status.

    Collective when a process group of more than one rank is initialised (one
    ``all_gather_object`` after the block, also when it raised); otherwise the
    block runs as it is. The block must hold no collective (see the module
    docstring).

    Args:
        phase: the step, in words (``"capture"``), for messages.
        group: the process group (default: ``WORLD``).

    Raises:
        RankFailure: on every rank whose block succeeded, when another rank's failed.
        BaseException: on a failing rank, its own exception, with a note.

    Example:
        >>> with fail_together("capture"):  # no process group: runs as it is
        ...     order = 1
    """
    if not is_distributed(group):
        yield
        return
    try:
        yield
    except Exception as e:
        raise_failures(phase, exchange_status(phase, e, group), e)
    raise_failures(phase, exchange_status(phase, None, group))
