"""Never silent: plans and policies that are made but never applied are named.

* :mod:`~execwrap.watch.registry`: every plan :func:`execwrap.plan_wrap` returns and every
  :class:`~execwrap.ParamExecOrderWrapPolicy` is watched from its creation; FSDP1 and
  :func:`execwrap.apply_fully_shard` mark what they apply, and the first optimizer step
  warns about the rest (what execwrap refused is not watched any more; a plan for another
  model is refused);
* :mod:`~execwrap.watch.hints`: which framework path holds an object and ignores it (found
  through ``sys.modules``, never importing a framework).

This layer sits below planning (which registers plans) and applying (which marks them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracing.lazy import lazy_exports

if TYPE_CHECKING:
    from execwrap.watch.hints import ignored_by
    from execwrap.watch.registry import (
        check_same_model,
        mark_applied,
        unwatched_if_refused,
        watch,
    )

_EXPORTS: dict[str, str] = {
    "ignored_by": "execwrap.watch.hints",
    "check_same_model": "execwrap.watch.registry",
    "mark_applied": "execwrap.watch.registry",
    "unwatched_if_refused": "execwrap.watch.registry",
    "watch": "execwrap.watch.registry",
}

__all__ = ["check_same_model", "ignored_by", "mark_applied", "unwatched_if_refused", "watch"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
