"""Every model class of transformers' auto mappings, built small on the meta device.

The configs are made generically from each config class, never written one by one:
start from the class's defaults and shrink what sets the size by its name (layer
counts to 2, experts to 4 with 2 per token, heads to 4 (2 key-value heads), hidden
sizes to 64 with 16 per head, feed-forward sizes to 64, the vocabulary to 128 or just
above the largest special token id), recursively in each sub-config (text, vision,
audio). Only the shrunk fields are passed to the config class, so that fields derived
from them (``layer_types``, ``head_dim``) are derived again. Where a class refuses
the full shrink (a size its validation or ``__init__`` ties to another), the counts
alone are shrunk, then nothing: :attr:`Built.level` says which worked.

On the meta device sizes cost nothing; shrinking keeps building (one Python module per
layer and expert) fast.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Built", "ModelEntry", "build_meta", "model_entries", "tiny_config"]

_LAYERS = re.compile(r"(^|_)(layers|n_layer|depth|num_blocks)$|^num_\w*layers$")
_EXPERTS = re.compile(r"^(num_|n_)?(local_|routed_|moe_|num_)?experts$|^moe_num_experts$")
_PER_TOKEN = re.compile(r"^(num_experts_per_tok|num_experts_per_token|moe_topk|top_k|moe_k)$")
_SHARED = re.compile(r"^(n_shared_experts|num_shared_experts|moe_num_shared_experts)$")
_HEADS = re.compile(r"^(num_attention_heads|n_head|num_heads|\w+_attention_heads)$")
_KV_HEADS = re.compile(r"^(num_key_value_heads|n_kv_heads|num_kv_heads)$")
_HIDDEN = re.compile(r"^(hidden_size|d_model|n_embd|embed_dim|dim)$")
_FFN = re.compile(r"^(intermediate_size|\w*ffn_dim|d_ff|n_inner|\w+_intermediate_size)$")

#: How much :func:`tiny_config` shrinks: everything, the counts only, nothing.
LEVELS = ("shrunk", "counts", "defaults")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _overrides(config: Any, level: str) -> dict[str, Any]:
    values = config.to_dict()
    out: dict[str, Any] = {}
    for key, v in values.items():
        if not _is_int(v) or v < 1:
            continue
        if _LAYERS.search(key):
            out[key] = min(v, 2)
        elif _EXPERTS.match(key):
            out[key] = min(v, 4)
        elif _PER_TOKEN.match(key):
            out[key] = min(v, 2)
        elif _SHARED.match(key):
            out[key] = min(v, 1)
        elif level == "shrunk":
            if _HEADS.match(key):
                out[key] = min(v, 4)
            elif _KV_HEADS.match(key):
                out[key] = min(v, 2)
            elif key == "head_dim":
                out[key] = 16
            elif _HIDDEN.match(key):
                out[key] = min(v, 64)
            elif _FFN.match(key):
                out[key] = min(v, 64)
    if level == "shrunk" and _is_int(values.get("vocab_size")):
        ids = [
            v for k, v in values.items() if k.endswith(("_token_id", "_token_index")) and _is_int(v)
        ]
        out["vocab_size"] = min(values["vocab_size"], max([127, *ids]) + 1)
    for key in getattr(config, "sub_configs", {}) or {}:
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "to_dict"):
            out[key] = type(sub)(**_overrides(sub, level))
    return out


def tiny_config(config_cls: Any, level: str = "shrunk") -> Any:
    """A small config of ``config_cls`` (see the module docstring)."""
    if level == "defaults":
        return config_cls()
    return config_cls(**_overrides(config_cls(), level))


@dataclass(frozen=True)
class ModelEntry:
    """One class of an auto mapping: the model type, the class, the mappings it is in."""

    model_type: str
    class_name: str
    mappings: tuple[str, ...]

    @property
    def id(self) -> str:
        return self.class_name


@dataclass
class Built:
    """A model built on the meta device, and the shrink level that worked."""

    model: Any
    level: str


def model_entries() -> list[ModelEntry]:
    """Every model class named in transformers' auto model mappings, by class name.

    Read from ``transformers/models/auto/modeling_auto.py``'s source (the
    ``MODEL_*_MAPPING_NAMES`` literals), so that collecting the tests imports nothing.
    """
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        return []
    source = Path(spec.origin).parent / "models" / "auto" / "modeling_auto.py"
    found: dict[str, tuple[str, list[str]]] = {}
    for node in ast.parse(source.read_text()).body:
        if not (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)):
            continue
        name = node.targets[0].id
        if not (name.startswith("MODEL") and name.endswith("MAPPING_NAMES")):
            continue
        if not (isinstance(node.value, ast.Call) and node.value.args):
            continue
        mapping = name.removeprefix("MODEL_").removesuffix("_MAPPING_NAMES").lower() or "base"
        items = node.value.args[0]
        if not isinstance(items, ast.List):
            continue
        pairs = [ast.literal_eval(e) for e in items.elts if isinstance(e, ast.Tuple)]
        for model_type, classes in pairs:  # a `*other.items()` entry: that mapping's own
            for cls in classes if isinstance(classes, (tuple, list)) else (classes,):
                found.setdefault(cls, (model_type, []))[1].append(mapping)
    return [ModelEntry(t, c, tuple(m)) for c, (t, m) in sorted(found.items())]


def build_meta(entry: ModelEntry) -> Built:
    """``entry``'s model on the meta device from the smallest config that builds.

    Raises:
        Exception: the last level's error (the class or its config cannot be built).
    """
    import torch
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_cls = getattr(transformers, entry.class_name)
    own = getattr(model_cls, "config_class", None)  # Llama4ForCausalLM: Llama4TextConfig
    config_cls = own if isinstance(own, type) else CONFIG_MAPPING[entry.model_type]
    error: Exception | None = None
    for level in LEVELS:
        try:
            config = tiny_config(config_cls, level)
            with torch.device("meta"):
                return Built(model_cls(config), level)
        except Exception as e:  # noqa: BLE001 - the next level is tried
            error = e
    assert error is not None
    raise error
