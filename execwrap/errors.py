"""The execwrap error hierarchy.

Bad user input raises ``ValueError`` / ``TypeError`` (messages name the module
FQN and say how to fix it); failures of execwrap's own checks raise these.
Capture failures raise :class:`tracing.TracingError`.
"""

from __future__ import annotations

from tracing.errors import TracingError

__all__ = [
    "ExecwrapError",
    "MemoryBudgetError",
    "OrderDivergenceError",
    "ParamMismatchError",
    "PlanError",
    "PlanForAnotherModelError",
    "RankFailure",
    "TracingError",
]


class ExecwrapError(RuntimeError):
    """Base class of execwrap's own errors."""


class PlanError(ExecwrapError):
    """A wrap plan failed its own checks (a parameter in no unit or in two,
    an FQN that does not exist in the model, tied parameters split)."""


class MemoryBudgetError(PlanError):
    """No candidate of the auto-planner fits ``memory_budget``
    (``plan_wrap(..., bucket_numel="auto", memory_budget=...)``).

    The message is ``finding`` followed by how to fit, in Python terms.

    Attributes:
        part: the :class:`~execwrap.simulate.MemoryBreakdown` field that
            dominates the smallest peak reached (``"optimizer_state"``,
            ``"activations"``, ...).
        finding: the message without the remedy (the budget, the smallest peak
            reached and what dominates it), for callers that word the remedy
            in their own terms (the command line names its options).
    """

    def __init__(self, message: str, *, part: str, finding: str) -> None:
        super().__init__(message)
        self.part = part
        self.finding = finding


class PlanForAnotherModelError(ValueError):
    """A saved plan was made for another model than the one given
    (:func:`execwrap.plan.pinned.check_plan_fits`): bad input, so a ``ValueError``.

    The message is ``source``, then ``finding``, then how to fix it in Python terms.

    Attributes:
        source: where the plan came from (its file, or "the given plan").
        finding: the message after ``source``, without the remedy (``"was made for
            another model than this GPT: ..."``, naming the first module or parameter
            that differs), for callers that word the remedy in their own terms (the
            command line names its file and options).
    """

    def __init__(self, message: str, *, source: str, finding: str) -> None:
        super().__init__(message)
        self.source = source
        self.finding = finding


class OrderDivergenceError(ExecwrapError):
    """Ranks (or iterations) executed modules in different orders.

    Attributes:
        ranks: the two ranks compared (``(a, b)``), or ``None``.
        index: first divergent call index in ``module_forward_order``.
        expected: module FQN on the first side (``None`` if that order ended).
        found: module FQN on the second side (``None`` if that order ended).
    """

    def __init__(
        self,
        message: str,
        *,
        ranks: tuple[int, int] | None = None,
        index: int | None = None,
        expected: str | None = None,
        found: str | None = None,
    ) -> None:
        super().__init__(message)
        self.ranks = ranks
        self.index = index
        self.expected = expected
        self.found = found


class ParamMismatchError(OrderDivergenceError):
    """Ranks hold different parameters: a parameter one rank has and another
    lacks, or another shape, dtype or ``requires_grad`` of the same parameter.

    FSDP flattens, shards and all-gathers each unit's parameters by shape and
    dtype on every rank, so such ranks exchange buffers of different sizes.

    Attributes:
        ranks: the two ranks compared (``(reference, other)``).
        index: position in ``named_parameters()`` order of the first difference
            (of a missing parameter: on the rank that has it).
        expected: the parameter FQN on the reference rank (``None``: it lacks
            the parameter the other rank has).
        found: the parameter FQN on the other rank (``None``: it lacks it).
        expected_param: ``(shape, dtype, requires_grad)`` on the reference rank,
            or ``None``.
        found_param: the same on the other rank, or ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        ranks: tuple[int, int] | None = None,
        index: int | None = None,
        expected: str | None = None,
        found: str | None = None,
        expected_param: tuple[tuple[int, ...], str, bool] | None = None,
        found_param: tuple[tuple[int, ...], str, bool] | None = None,
    ) -> None:
        super().__init__(message, ranks=ranks, index=index, expected=expected, found=found)
        self.expected_param = expected_param
        self.found_param = found_param


class RankFailure(ExecwrapError):
    """Another rank of the process group failed during a step all ranks take together.

    Raised on every rank that did not fail itself, right after the status exchange
    that follows the step (:mod:`execwrap.distributed.status`), instead of a backend error
    ("Connection closed by peer") or a wait until the process group's timeout. A
    rank that failed raises its own exception, with a note naming the step.

    Attributes:
        phase: the step, in words (``"capture"``, ``"the cross-rank order check"``,
            ``"planning"``, ...).
        failures: ``(global rank, "ExceptionType: message")`` of every rank that
            failed, lowest rank first; empty when the exchange itself failed (a
            rank left the job before it).
        rank: the lowest failing rank, or ``None`` when unknown.
    """

    def __init__(self, message: str, *, phase: str, failures: tuple[tuple[int, str], ...]) -> None:
        super().__init__(message)
        self.phase = phase
        self.failures = failures
        self.rank = failures[0][0] if failures else None
