"""Every model class of transformers' auto mappings, built small on the meta device.

The configs are made generically from each config class, never written one by one:
start from the class's defaults and shrink what sets the size by its name (layer
counts to 2, or to the fewest layers that keep every kind of layer the full model has:
a hybrid's attention layer after its linear-attention ones; experts to 4 with 2 per
token, heads to 4 (2 key-value heads, also in per-stage lists), hidden sizes to 64
with 16 per head, feed-forward sizes to 64, the vocabulary to 128 or just above the
largest special token id), recursively in each sub-config (text, vision, audio). Only
the shrunk fields are passed to the config class, and never a field the class derives
from others (one its ``__post_init__`` sets: ``layer_types``, ``head_dim``,
DeepSeek's ``qk_head_dim``), so that those are derived again from the shrunk sizes. A
key-value head count equal to the head count stays equal (latent attention needs it).
A class of the causal-LM mapping alone is built as a decoder (``is_decoder=True``, as
its users build it).

Where a class refuses the full shrink, the next level is tried (:data:`LEVELS`):
``"filled"`` also gives a size the class leaves at ``None`` by default (``head_dim``,
key-value heads, experts, experts per token, shared experts, vocabulary, padding id)
its shrunk value, and a ``default_<x>`` it leaves open the first of its config's
``<x>s``; ``"counts"`` shrinks the counts alone (layers, experts), keeping the widths;
``"widths"`` shrinks the widths and experts and keeps every layer (for a class that
ties its layer counts or per-layer lists together); ``"defaults"`` shrinks nothing.
:attr:`Built.level` says which worked.

On the meta device and under fake tensors sizes cost nothing; shrinking keeps building
(one Python module per layer and expert) fast, and makes the models small enough to
train for real on CPU (:func:`build_real`).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "LEVELS",
    "Built",
    "ModelEntry",
    "build_fake",
    "build_meta",
    "build_real",
    "model_entries",
    "tiny_config",
]

_LAYERS = re.compile(r"(^|_)(layers|n_layer|depth|num_blocks)$|^num_\w*layers$")
_EXPERTS = re.compile(r"^(num_|n_)?(local_|routed_|moe_|num_)?experts$|^moe_num_experts$")
_PER_TOKEN = re.compile(r"^(num_experts_per_tok|num_experts_per_token|moe_topk|top_k|moe_k)$")
_SHARED = re.compile(r"^(n_shared_experts|num_shared_experts|moe_num_shared_experts)$")
_HEADS = re.compile(r"^(num_attention_heads|n_head|num_heads|\w+_attention_heads)$")
_KV_HEADS = re.compile(r"^(num_key_value_heads|n_kv_heads|num_kv_heads)$")
_HIDDEN = re.compile(r"^(hidden_size|d_model|n_embd|embed_dim|emb_dim|dim)$")
_EXPERT_GROUPS = re.compile(r"^(n_group|num_expert_group|topk_group|n_expert_groups)$")
_FFN = re.compile(r"^(intermediate_size|\w*ffn_dim|d_ff|n_inner|\w+_intermediate_size)$")

_HEAD_DIMS = re.compile(r"^(\w+_)?head_dim$")
_OFFSET = re.compile(r"^(\w+)_offset$")

#: How much :func:`tiny_config` shrinks: everything, everything and the sizes a class
#: leaves at ``None``, the counts only, the widths only (every layer kept), nothing.
LEVELS = ("shrunk", "filled", "counts", "widths", "defaults")
#: The shrunk value of a size, by its pattern, for sizes left at ``None`` (``"filled"``).
_FILL = (
    (_EXPERTS, 4),
    (_PER_TOKEN, 2),
    (_SHARED, 1),
    (_KV_HEADS, 2),
    (_HEAD_DIMS, 16),
    (re.compile(r"^vocab_size$"), 128),
    (re.compile(r"^pad_token_id$"), 0),
)
#: The levels that shrink widths (heads, hidden and feed-forward sizes, image size).
_WIDTHS = ("shrunk", "filled", "widths")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _shrunk(key: str, v: int, level: str) -> int | None:
    """``key``'s shrunk value, or ``None`` to keep it."""
    if _LAYERS.search(key):
        return None if level == "widths" else min(v, 2)
    if _EXPERTS.match(key):
        return min(v, 4)
    if _PER_TOKEN.match(key):
        return min(v, 2)
    if _SHARED.match(key) or _EXPERT_GROUPS.match(key):
        return min(v, 1)
    if level in _WIDTHS:
        if key == "image_size":
            return min(v, 64)
        for pattern, value in (
            (_HEADS, 4),
            (_KV_HEADS, 2),
            (_HEAD_DIMS, 16),
            (_HIDDEN, 64),
            (_FFN, 64),
        ):
            if pattern.match(key):
                return min(v, value)
    return None


def _layers_for_kinds(values: dict[str, Any], layers: int) -> int:
    """The fewest layers whose kinds (per-layer lists, ``*_period``/``*_offset`` layouts)
    are every kind of the ``layers`` the full config has."""
    need = 0
    for key, v in values.items():
        if isinstance(v, list) and len(v) == layers and v and all(isinstance(x, str) for x in v):
            need = max(need, *(v.index(kind) + 1 for kind in set(v)))
        match = _OFFSET.match(key)
        if match and _is_int(v) and _is_int(values.get(f"{match.group(1)}_period")) and v < layers:
            need = max(need, v + 1)
    return need


def _derived(config: Any) -> set[str]:
    """The keys of ``config.to_dict()`` its class derives from others (``head_dim`` from
    the hidden size and heads, ``qk_head_dim`` from its parts): not dataclass fields, or
    fields whose value differs from the field's default. Empty for a config class that
    is no dataclass. Passing a derived key would keep it from being derived again."""
    if not dataclasses.is_dataclass(config):
        return set()
    fields = {f.name: f for f in dataclasses.fields(config)}
    stored = set((getattr(config, "attribute_map", None) or {}).values())  # a field's alias
    out = set()
    for key, v in config.to_dict().items():
        f = fields.get(key)
        if f is None:
            if key not in stored:
                out.add(key)
        elif f.default is not dataclasses.MISSING and f.default is None and v is not None:
            out.add(key)
    return out


def _keep_heads_tied(values: dict[str, Any], out: dict[str, Any]) -> None:
    """A key-value head count equal to the head count (multi-head attention, which
    latent attention requires) stays equal to it when both are shrunk."""
    heads = [k for k in values if _HEADS.match(k) and k in out and _is_int(out[k])]
    for key in [k for k in out if _KV_HEADS.match(k)]:
        tied = [h for h in heads if values[h] == values[key]]
        if tied:
            out[key] = out[tied[0]]


def _filled_choices(values: dict[str, Any]) -> dict[str, Any]:
    """Choices a class leaves open that its config fixes (``"filled"``): a ``default_<x>``
    left at ``None`` is the first of the config's ``<x>s`` (X-MOD's default language)."""
    out: dict[str, Any] = {}
    for key, v in values.items():
        choices = values.get(f"{key.removeprefix('default_')}s")
        if key.startswith("default_") and v is None and isinstance(choices, (list, tuple)):
            if choices:
                out[key] = choices[0]
    return out


def _overrides(config: Any, level: str) -> dict[str, Any]:
    values = config.to_dict()
    derived = _derived(config) - set(getattr(config, "sub_configs", {}) or {})
    out: dict[str, Any] = {}
    for key, v in values.items():
        if key in derived:
            continue
        if level == "filled" and v is None:
            filled = [value for pattern, value in _FILL if pattern.match(key)]
            if filled:
                out[key] = filled[0]
        elif _is_int(v) and v >= 1:
            small = _shrunk(key, v, level)
            if small is not None:
                if _LAYERS.search(key):
                    small = max(small, _layers_for_kinds(values, v))
                out[key] = small
        elif isinstance(v, list) and v and all(_is_int(x) and x >= 1 for x in v):
            if _HEADS.match(key) and level in _WIDTHS:  # per-stage heads
                out[key] = [min(x, 4) for x in v]
            elif _FFN.match(key) and level in _WIDTHS:  # per-layer feed-forward sizes
                out[key] = [min(x, 64) for x in v]
    if level == "filled":
        out.update(_filled_choices(values))
    _keep_heads_tied(values, out)
    if level in _WIDTHS and _is_int(values.get("vocab_size")) and "vocab_size" not in derived:
        ids = [
            v for k, v in values.items() if k.endswith(("_token_id", "_token_index")) and _is_int(v)
        ]
        out["vocab_size"] = min(values["vocab_size"], max([127, *ids]) + 1)
    for key in getattr(config, "sub_configs", {}) or {}:
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "to_dict"):
            out[key] = type(sub)(**_overrides(sub, level))
    return out


def tiny_config(config_cls: Any, level: str = "shrunk", *, decoder: bool = False) -> Any:
    """A small config of ``config_cls`` (see the module docstring); ``decoder``: ``is_decoder=True``."""
    extra = {"is_decoder": True} if decoder else {}
    if level == "defaults":
        return config_cls(**extra)
    return config_cls(**_overrides(config_cls(), level), **extra)


@dataclass(frozen=True)
class ModelEntry:
    """One class of an auto mapping: the model type, the class, the mappings it is in."""

    model_type: str
    class_name: str
    mappings: tuple[str, ...]

    @property
    def id(self) -> str:
        return self.class_name

    @property
    def decoder(self) -> bool:
        """In the causal-LM mapping and in no mapping of encoders (masked LM)."""
        return "for_causal_lm" in self.mappings and "for_masked_lm" not in self.mappings


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


def build_meta(entry: ModelEntry, levels: tuple[str, ...] = LEVELS) -> Built:
    """``entry``'s model on the meta device from the smallest config that builds.

    Args:
        entry: the class.
        levels: the levels to try, in order (:data:`LEVELS`).

    Raises:
        Exception: the first level's error (the class or its config cannot be built).
    """
    import torch
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_cls = getattr(transformers, entry.class_name)
    own = getattr(model_cls, "config_class", None)  # Llama4ForCausalLM: Llama4TextConfig
    config_cls = own if isinstance(own, type) else CONFIG_MAPPING[entry.model_type]
    error: Exception | None = None
    for level in levels:
        try:
            config = tiny_config(config_cls, level, decoder=entry.decoder)
            with torch.device("meta"):
                return Built(model_cls(config), level)
        except Exception as e:  # noqa: BLE001 - the next level is tried
            error = error or e
    assert error is not None
    raise error


def build_fake(entry: ModelEntry, levels: tuple[str, ...] = LEVELS) -> Built:
    """``entry``'s model under fake tensors on the CPU: :func:`build_meta`, then every
    parameter and buffer made a fake CPU tensor (no storage; tied ones stay tied).

    Real CPU example inputs then fit it, and their values are known to a zero-cost
    capture (a token id compared with the padding id); nothing is ever computed on it.
    A legacy constructor's stray CPU tensor (``nn.Parameter(torch.Tensor(n))``, which
    ignores the default device) is made fake too.
    """
    import torch
    import torch.nn as nn
    from torch._subclasses import FakeTensorMode

    built = build_meta(entry, levels)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    cpu = torch.device("cpu")
    fakes: dict[int, Any] = {}
    for module in built.model.modules():
        for slot in (module._parameters, module._buffers):
            for name, t in slot.items():
                if t is None:
                    continue
                if id(t) not in fakes:
                    meta = t if t.is_meta else t.detach().to("meta")
                    fake = mode.fake_tensor_converter.from_meta_and_device(mode, meta, cpu)
                    if isinstance(t, nn.Parameter):
                        fake = nn.Parameter(fake, requires_grad=t.requires_grad)
                    fakes[id(t)] = fake
                slot[name] = fakes[id(t)]
    return built


def build_real(entry: ModelEntry, *, seed: int = 0) -> Built:
    """``entry``'s model on the CPU with real weights, from the ``"shrunk"`` config.

    Raises:
        Exception: the class cannot be built from its shrunk config.
    """
    import torch
    import transformers

    meta = build_meta(entry, ("shrunk",))
    torch.manual_seed(seed)
    model = getattr(transformers, entry.class_name)(meta.model.config)
    return Built(model, meta.level)
