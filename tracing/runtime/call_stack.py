"""The module calls running now, and when the parameter-use mode is active.

The runtime recorder pushes a frame when a module's forward starts and pops it
when it ends. The :class:`~tracing.runtime.use_mode.ParamUseMode` is entered
when the outermost recorded call starts and exited when it ends, so backward
and code outside the model run without it; its ``target`` always names the
innermost call whose torch calls are the model's own uses (``None`` inside a
wrapper's own forward or a recomputation).

A hook that runs before the recorder's post-forward hook may raise; then the
frames of calls that never ended are dropped when an enclosing call ends.
"""

from __future__ import annotations

import enum
import logging
import sys
from typing import NamedTuple

import torch
import torch.nn as nn

from tracing.runtime.use_mode import ParamUseMode

__all__ = ["CallKind", "CallStack", "Frame"]

logger = logging.getLogger(__name__)


class CallKind(enum.Enum):
    """Why a module's forward runs."""

    FORWARD = "forward"
    #: re-run during backward by activation checkpointing.
    RECOMPUTE = "recompute"
    #: a wrapper's own forward (FSDP1 unshard/reshard, checkpointing): its
    #: tensor calls outside the wrapped module are not the model's.
    WRAPPER = "wrapper"


class Frame(NamedTuple):
    """One running module call."""

    module: nn.Module
    #: (module FQN, call index) whose torch calls are uses; None unless FORWARD.
    target: tuple[str, int] | None
    #: this frame entered the ParamUseMode (the outermost frame).
    pushed_mode: bool
    #: the exception being handled when the call started (``sys.exc_info()``):
    #: a call made inside an ``except`` block sees it until it ends, without
    #: having raised it.
    handling: BaseException | None
    #: recorded forward calls running, this one included (wrapper and
    #: recomputation frames add none).
    depth: int = 0


class CallStack:
    """Running module calls, innermost last, driving a :class:`ParamUseMode`.

    Args:
        mode: the use mode to enter on the outermost call and exit after it.
    """

    def __init__(self, mode: ParamUseMode) -> None:
        self._mode = mode
        self._frames: list[Frame] = []

    def push(self, module: nn.Module, kind: CallKind, target: tuple[str, int] | None) -> None:
        """A call of ``module`` starts; its torch calls are uses of ``target``."""
        pushed = not self._frames and kind is not CallKind.RECOMPUTE
        if pushed:
            self._mode.__enter__()
        depth = (self._frames[-1].depth if self._frames else 0) + (target is not None)
        self._frames.append(Frame(module, target, pushed, sys.exc_info()[1], depth))
        self._mode.target = target

    def pop(self, module: nn.Module) -> BaseException | None:
        """The innermost call of ``module`` ends (frames above it are dropped).

        Returns:
            The exception that was being handled when that call started (see
            :attr:`Frame.handling`), or ``None``.
        """
        frames = self._frames
        handling = None
        if frames and frames[-1].module is module:
            frame = frames.pop()
            handling = frame.handling
            if frame.pushed_mode:
                self._exit_mode()
        else:  # a hook that ran before ours raised: drop the frames above this call
            for i in range(len(frames) - 1, -1, -1):
                if frames[i].module is module:
                    handling = frames[i].handling
                    for frame in reversed(frames[i:]):
                        if frame.pushed_mode:
                            self._exit_mode()
                    del frames[i:]
                    break
        self._mode.target = frames[-1].target if frames else None
        return handling

    def forward_depth(self) -> int:
        """How many recorded forward calls are running (wrapper and
        recomputation frames are not counted): the depth of the next call."""
        return self._frames[-1].depth if self._frames else 0

    def suspend(self) -> None:
        """Torch calls until the next :meth:`push` or :meth:`pop` are no uses."""
        self._mode.target = None

    def clear(self) -> None:
        """Drop every frame and exit the mode (the recorder is being removed)."""
        while self._frames:
            frame = self._frames.pop()
            if frame.pushed_mode:
                self._exit_mode()
        self._mode.target = None

    def _exit_mode(self) -> None:
        stack = torch.overrides._get_current_function_mode_stack()
        if stack and stack[-1] is self._mode:
            self._mode.__exit__(None, None, None)
        elif any(m is self._mode for m in stack):
            logger.warning(
                "RuntimeRecorder: another TorchFunctionMode was left active above the "
                "recorder's mode; the recorder's mode stays on the stack"
            )
