"""What the ranks agree on before a collective could hang.

* :mod:`~execwrap.distributed.status`: a short status exchange after each step the ranks
  take together (capture, the cross-rank check, planning, the checks before sharding), so
  that every rank raises :class:`~execwrap.errors.RankFailure` naming the rank that failed
  and its exception, instead of a backend error or a wait until the process group's timeout;
* :mod:`~execwrap.distributed.timing`: one timing record for every rank (the slowest
  rank's), so that timed orders give the same auto plan on every rank by construction.

Nothing here knows FSDP: it sits below planning (which plans across ranks) and applying.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracing.lazy import lazy_exports

if TYPE_CHECKING:
    from execwrap.distributed.status import fail_together, is_distributed
    from execwrap.distributed.timing import agree_timing

_EXPORTS: dict[str, str] = {
    "fail_together": "execwrap.distributed.status",
    "is_distributed": "execwrap.distributed.status",
    "agree_timing": "execwrap.distributed.timing",
}

__all__ = ["agree_timing", "fail_together", "is_distributed"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
