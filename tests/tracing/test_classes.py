"""instance_classes / could_be: isinstance answered from the classes of many objects."""

from __future__ import annotations

import weakref

import torch
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule

from tracing.classes import could_be, instance_classes


class ClaimsTensor:
    """Reports torch.Tensor as its __class__, so isinstance(obj, torch.Tensor) is True."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return torch.Tensor


def test_classes_include_what_objects_report_as_their_class() -> None:
    t = torch.ones(1)
    proxy = weakref.proxy(t)
    objects = [1, "a", None, proxy, ClaimsTensor(), nn.Linear(1, 1)]
    assert [isinstance(o, torch.Tensor) for o in objects] == [False] * 3 + [True, True, False]
    classes = instance_classes(objects)
    assert classes == {int, str, type(None), type(proxy), ClaimsTensor, torch.Tensor, nn.Linear}
    assert could_be(classes, torch.Tensor)


def test_could_be_is_false_only_when_no_instance_can_pass() -> None:
    assert could_be({int, str, dict, nn.Linear}, torch.Tensor) is False
    assert could_be({nn.Parameter}, torch.Tensor) is True
    assert could_be({ClaimsTensor}, torch.Tensor) is True
    assert could_be({nn.Linear, nn.ReLU}, FSDPModule) is False
