"""walk_modules: one walk giving what named_modules() and modules() give."""

from __future__ import annotations

from collections.abc import Iterator

import torch.nn as nn

from tracing.walk import walk_modules


def test_walk_is_named_modules_with_aliases_then_first_names() -> None:
    shared = nn.Linear(2, 2)
    inner = nn.Sequential(shared, nn.ReLU())
    model = nn.Sequential(inner, shared, nn.Sequential(shared))
    model.add_module("gap", None)
    walk = walk_modules(model)
    assert [fqn for fqn, _ in walk.named] == ["", "0", "0.0", "0.1", "1", "2", "2.0"]
    assert walk.named == list(model.named_modules(remove_duplicate=False))
    assert walk.first_names == ["", "0", "0.0", "0.1", "2"]
    assert walk.modules == list(model.modules())


class Hiding(nn.Sequential):
    """Overrides named_modules: its children are not listed."""

    def named_modules(
        self, memo: set[nn.Module] | None = None, prefix: str = "", remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Module]]:
        yield prefix, self


def test_a_class_overriding_named_modules_is_walked_by_its_own_method() -> None:
    model = nn.Sequential(Hiding(nn.Linear(2, 2)), nn.ReLU())
    walk = walk_modules(model)
    assert [fqn for fqn, _ in walk.named] == ["", "0", "1"]
    assert walk.first_names == ["", "0", "1"]
