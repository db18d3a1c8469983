"""Tests for tracing.config.TracingConfig."""

from __future__ import annotations

import pytest
import torch.fx

from tests.tracing.models import BlockLeafTracer
from tracing import TracingConfig


def test_defaults_give_distinct_fresh_tracers() -> None:
    a, b = TracingConfig(), TracingConfig()
    assert type(a.tracer) is torch.fx.Tracer
    assert a.tracer is not b.tracer
    assert a.concrete_args is None


def test_custom_tracer_and_concrete_args_are_kept() -> None:
    tracer = BlockLeafTracer()
    config = TracingConfig(tracer=tracer, concrete_args={"use_extra": False})
    assert config.tracer is tracer
    assert config.concrete_args == {"use_extra": False}


def test_tracer_class_instead_of_instance_is_rejected_with_a_hint() -> None:
    with pytest.raises(
        TypeError,
        match=r"TracingConfig\.tracer must be a torch\.fx\.Tracer instance, got type; "
        r"pass an instance, e\.g\. tracer=BlockLeafTracer\(\)",
    ):
        TracingConfig(tracer=BlockLeafTracer)  # type: ignore[arg-type]


def test_tracer_of_wrong_type_is_rejected() -> None:
    with pytest.raises(
        TypeError, match=r"TracingConfig\.tracer must be a torch\.fx\.Tracer instance, got str$"
    ):
        TracingConfig(tracer="fx")  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [[("use_extra", False)], ("flag",), "use_extra"])
def test_concrete_args_must_be_a_dict_or_none(value: object) -> None:
    with pytest.raises(
        TypeError,
        match=rf"TracingConfig\.concrete_args must be a dict .* got {type(value).__name__}$",
    ):
        TracingConfig(concrete_args=value)  # type: ignore[arg-type]
