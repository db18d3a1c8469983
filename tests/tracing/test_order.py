"""Tests for tracing.order: ExecutionOrder data, JSON round trip and load errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tests.tracing import models as M
from tracing import SCHEMA_VERSION, ExecutionOrder, ParamInfo, ParamUse, trace_execution_order
from tracing.order import param_info, param_infos, shared_param_map


@pytest.fixture
def order() -> ExecutionOrder:
    return trace_execution_order(M.TiedLM())


def test_to_dict_from_dict_round_trip(order: ExecutionOrder) -> None:
    data = order.to_dict()
    assert data["schema_version"] == SCHEMA_VERSION == 3
    assert data["param_uses"][2] == {
        "module_fqn": "head",
        "call_index": 3,
        "param_fqns": ["emb.weight"],
        "op": "call_module",
    }
    assert data["params"]["emb.weight"] == {
        "numel": 40,
        "dtype": "float32",
        "requires_grad": True,
        "shape": [10, 4],
    }
    assert ExecutionOrder.from_dict(data) == order
    # The dict is plain JSON data.
    assert ExecutionOrder.from_dict(json.loads(json.dumps(data))) == order


def test_save_load_round_trip(order: ExecutionOrder, tmp_path: Path) -> None:
    path = order.save(tmp_path / "sub" / "order.json")
    assert path == tmp_path / "sub" / "order.json"
    loaded = ExecutionOrder.load(path)
    assert loaded == order
    assert loaded.shared_params == {"emb.weight": ["head.weight"]}
    assert loaded.param_uses[0] == ParamUse("emb", 1, ("emb.weight",), "call_module")
    assert [p.name for p in path.parent.iterdir()] == ["order.json"]  # no temp file left


def test_runtime_fields_round_trip(tmp_path: Path) -> None:
    order = ExecutionOrder(
        module_forward_order=["", "a"],
        param_forward_order=["a.w"],
        param_uses=[ParamUse("a", 1, ("a.w",))],
        param_backward_order=["a.w"],
        module_backward_order=["a", ""],
        recompute_order=["a"],
        params={"a.w": ParamInfo(numel=6, dtype="bfloat16", requires_grad=False, shape=(2, 3))},
        module_classes={"": "Net", "a": "Linear"},
        method="runtime",
        fallback_reason="TracingError: data-dependent control flow",
    )
    assert ExecutionOrder.load(order.save(tmp_path / "o.json")) == order
    assert order.params["a.w"].bytes == 12


def test_load_accepts_a_report_with_an_order_entry(order: ExecutionOrder, tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"order": order.to_dict(), "plan": {}}))
    assert ExecutionOrder.load(path) == order


def test_load_other_schema_version_names_the_file(order: ExecutionOrder, tmp_path: Path) -> None:
    data = order.to_dict()
    data["schema_version"] = 99
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    with pytest.raises(
        ValueError, match=r"old\.json: unsupported ExecutionOrder schema_version 99"
    ):
        ExecutionOrder.load(path)


def test_load_malformed_file_names_the_file_and_field(
    order: ExecutionOrder, tmp_path: Path
) -> None:
    data = order.to_dict()
    del data["param_uses"]
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    with pytest.raises(
        ValueError, match=r"broken\.json: malformed ExecutionOrder: field param_uses: missing$"
    ):
        ExecutionOrder.load(path)

    data = order.to_dict()
    data["module_forward_order"] = "not a list"
    path.write_text(json.dumps(data))
    with pytest.raises(
        ValueError,
        match=r"broken\.json: malformed ExecutionOrder: field module_forward_order: expected a "
        r"list, got str 'not a list'$",
    ):
        ExecutionOrder.load(path)

    data = order.to_dict()
    data["method"] = "guess"
    path.write_text(json.dumps(data))
    with pytest.raises(
        ValueError,
        match=r"broken\.json: malformed ExecutionOrder: field method: expected one of "
        r"'symbolic', 'runtime', got str 'guess'$",
    ):
        ExecutionOrder.load(path)


def test_load_non_json_and_non_object(tmp_path: Path) -> None:
    path = tmp_path / "garbage.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"garbage\.json: not valid JSON"):
        ExecutionOrder.load(path)
    path.write_text("[1, 2]")
    with pytest.raises(
        ValueError, match=r"garbage\.json: expected a JSON object for an ExecutionOrder, got list"
    ):
        ExecutionOrder.load(path)


def test_load_missing_file_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        ExecutionOrder.load(tmp_path / "absent.json")


def test_invalid_method_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"ExecutionOrder.method must be one of .* got 'trace'"):
        ExecutionOrder(method="trace")  # type: ignore[arg-type]


def test_index_helpers(order: ExecutionOrder) -> None:
    assert order.first_call_index() == {"": 0, "emb": 1, "proj": 2, "head": 3}
    assert order.param_first_use_index() == {"emb.weight": 1, "proj.weight": 2, "proj.bias": 2}
    assert order.param_last_use_index() == {"emb.weight": 3, "proj.weight": 2, "proj.bias": 2}
    assert order.total_numel() == 40 + 16 + 4
    assert order.alias_to_canonical() == {
        "emb.weight": "emb.weight",
        "head.weight": "emb.weight",
        "proj.weight": "proj.weight",
        "proj.bias": "proj.bias",
    }


def test_param_helpers_on_tied_model() -> None:
    model = M.TiedLM()
    id_to_canonical, shared = shared_param_map(model)
    assert shared == {"emb.weight": ["head.weight"]}
    assert id_to_canonical[id(model.head.weight)] == "emb.weight"
    infos = param_infos(model)
    assert list(infos) == ["emb.weight", "proj.weight", "proj.bias"]
    assert infos["proj.bias"] == ParamInfo(numel=4, dtype="float32", requires_grad=True, shape=(4,))
    with torch.device("meta"):
        meta = torch.nn.Parameter(torch.empty(3, 5, dtype=torch.float16), requires_grad=False)
    assert param_info(meta) == ParamInfo(
        numel=15, dtype="float16", requires_grad=False, shape=(3, 5)
    )
    assert param_info(meta).bytes == 30


def test_load_of_a_foreign_json_file_says_so(tmp_path: Path) -> None:
    path = tmp_path / "other.json"
    path.write_text('{"a": 1}')
    with pytest.raises(ValueError, match=r"other.json: not an execwrap ExecutionOrder or report"):
        ExecutionOrder.load(path)


def test_save_to_a_folder_names_it(tmp_path: Path) -> None:
    folder = tmp_path / "orders"
    folder.mkdir()
    order = ExecutionOrder(module_forward_order=[""])
    with pytest.raises(IsADirectoryError) as info:
        order.save(folder)
    assert str(info.value) == (
        f"ExecutionOrder.save: {str(folder)!r} is a folder; pass the path of the file to write, "
        f"e.g. {str(folder / 'order.json')!r}"
    )
    assert list(folder.iterdir()) == []
    assert ExecutionOrder.load(order.save(folder / "order.json")) == order


def test_saved_file_has_the_usual_mode(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        path = ExecutionOrder(module_forward_order=[""]).save(tmp_path / "o.json")
    finally:
        os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o644


def test_version_1_file_loads_without_timing(order: ExecutionOrder, tmp_path: Path) -> None:
    data = order.to_dict()
    for key in (
        "forward_times_s",
        "forward_start_s",
        "backward_start_s",
        "backward_end_s",
        "backward_times_s",
        "saved_activation_bytes",
        "timing_device",
        "timing_method",
    ):
        del data[key]
    data["schema_version"] = 1
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    loaded = ExecutionOrder.load(path)
    assert loaded == order
    assert loaded.has_timing is False
    assert (loaded.forward_times_s, loaded.timing_method, loaded.backward_end_s) == ([], "", None)


def test_timing_fields_round_trip(tmp_path: Path) -> None:
    order = ExecutionOrder(
        module_forward_order=["", "a"],
        forward_times_s=[0.5, 0.25],
        forward_start_s=[0.0, 0.125],
        backward_start_s=[0.75, None],
        backward_end_s=1.5,
        backward_times_s={"": 0.75},
        saved_activation_bytes=[0, 4096],
        timing_device="cpu",
        timing_method="measured",
        method="runtime",
    )
    loaded = ExecutionOrder.load(order.save(tmp_path / "t.json"))
    assert loaded == order
    assert loaded.to_dict()["backward_start_s"] == [0.75, None]
    with pytest.raises(ValueError, match=r"timing_method must be one of .*got 'guessed'"):
        ExecutionOrder(timing_method="guessed")  # type: ignore[arg-type]


def test_version_1_files_still_load(order: ExecutionOrder, tmp_path: Path) -> None:
    data = order.to_dict()
    data["schema_version"] = 1
    del data["zero_cost"], data["warnings"]
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(data))
    loaded = ExecutionOrder.load(path)
    assert loaded == order
    assert (loaded.zero_cost, loaded.warnings, loaded.schema_version) == (False, [], 3)


def test_zero_cost_and_warnings_round_trip() -> None:
    order = ExecutionOrder(method="runtime", zero_cost=True, warnings=["optional 'mask'"])
    data = order.to_dict()
    assert (data["zero_cost"], data["warnings"]) == (True, ["optional 'mask'"])
    assert ExecutionOrder.from_dict(data) == order
    assert order.capture_step == "zero-cost runtime"


def test_call_depths_give_each_call_its_enclosing_call() -> None:
    order = ExecutionOrder(
        module_forward_order=["", "a", "a.x", "a.y", "b", "a.x"],
        module_call_depths=[0, 1, 2, 2, 1, 1],
    )
    assert order.enclosing_calls() == [-1, 0, 1, 1, 0, 0]
    assert ExecutionOrder(module_forward_order=["", "a"]).enclosing_calls() == []
    assert ExecutionOrder.from_dict(order.to_dict()).module_call_depths == [0, 1, 2, 2, 1, 1]


@pytest.mark.parametrize(
    "depths,message",
    [
        ([0, 1], "field module_call_depths: 2 depths for 3 calls of module_forward_order"),
        (
            [1, 1, 2],
            "field module_call_depths[0]: depth 1 after depth none: a call is at most "
            "one level deeper than the call before it (0 for the first)",
        ),
        (
            [0, 1, 3],
            "field module_call_depths[2]: depth 3 after depth 1: a call is at most one "
            "level deeper than the call before it (0 for the first)",
        ),
    ],
)
def test_bad_call_depths_are_refused(depths: list[int], message: str) -> None:
    data = ExecutionOrder(module_forward_order=["", "a", "a.x"]).to_dict()
    data["module_call_depths"] = depths
    with pytest.raises(ValueError) as info:
        ExecutionOrder.from_dict(data, source="o.json")
    assert str(info.value) == f"o.json: malformed ExecutionOrder: {message}"
