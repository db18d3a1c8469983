"""Every architecture of transformers' causal-LM, masked-LM, seq2seq and image-classification
mappings: built small, captured without computing, planned, predicted.

For each class of those auto mappings (:func:`suite_entries`), :func:`run_class`:

1. **builds** it under fake tensors on the CPU from a small config made generically
   from its config class (:func:`benchmarks._tiny_configs.build_fake`: no weights);
2. **captures** its order with :func:`tracing.capture_execution_order`'s ladder on
   example inputs derived from the config (:func:`example_inputs`: token ids, decoder
   ids for a seq2seq model, pixel values of the config's image size and channels),
   with compute times estimated for the cost model's GPU: the zero-cost step (a fake
   run; only the masks and indices fixed by the config and the inputs' shapes are
   computed). A capture that needs the real runtime step does not count;
3. **plans** it with :func:`execwrap.plan_wrap` (``bucket_numel="auto"``: groups,
   prefetch and resharding chosen by the simulator) from the model's own block
   classes (``_no_split_modules``, else the classes its ``nn.ModuleList`` s hold);
4. **predicts** one training step of that plan and of transformers' own plan
   (:func:`execwrap.integrations.transformers.load_fsdp_plan`, where the model has
   one) with :func:`execwrap.simulate_step` on one cost-model preset.

Where the shrunk config does not build or fails to capture (a size it ties to another
that the shrink broke), the next level of the generic shrink is tried
(:data:`CAPTURE_LEVELS`: sizes left at ``None`` filled, then the widths kept with two
layers, then every layer kept with small widths): on fake tensors sizes cost nothing.
transformers' own default config is never captured, only built to tell a broken default
from a shrink that fails. A class that fails every way is kept with the stage and the
reason (:attr:`Row.failed`, :attr:`Row.reason`): a library that is not installed,
transformers' default config failing too, or the capture error (module, op, source line).
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

from benchmarks._tiny_configs import LEVELS, ModelEntry, build_fake, model_entries

__all__ = [
    "MAPPINGS",
    "PRESET",
    "SAMPLE",
    "WORLD_SIZE",
    "Row",
    "example_inputs",
    "family",
    "run_class",
    "suite_entries",
    "wrap_policy",
]

#: The auto mappings of the suite.
MAPPINGS = (
    "for_causal_lm",
    "for_masked_lm",
    "for_seq_to_seq_causal_lm",
    "for_image_classification",
)
#: The cost-model preset and world size of the predictions.
PRESET = "h100-nvlink-8"
WORLD_SIZE = 8
#: The config levels tried (:data:`benchmarks._tiny_configs.LEVELS` less ``"defaults"``:
#: a default config is a full-depth model, slow to build and record in Python).
CAPTURE_LEVELS = LEVELS[:-1]
#: Tokens of the example (decoder: half).
SEQUENCE = 16
#: Examples per batch (2: batch norm in training needs more than one value per channel).
BATCH = 2
#: Largest image side of the example (a config's own ``image_size`` above it is kept).
IMAGE = 64
#: A fast sample across families for the default test run.
SAMPLE = (
    "LlamaForCausalLM",  # dense decoder
    "GemmaForCausalLM",  # tied embeddings
    "Qwen3MoeForCausalLM",  # mixture of experts (grouped-mm experts)
    "Qwen3NextForCausalLM",  # hybrid: linear attention and attention layers
    "M2M100ForConditionalGeneration",  # encoder-decoder with a layer drop
    "T5ForConditionalGeneration",  # encoder-decoder
    "LongformerForMaskedLM",  # .item() on a mask built from the input's shape
    "BertForMaskedLM",  # encoder
    "ViTForImageClassification",  # vision transformer
    "ResNetForImageClassification",  # convolutions, batch norm
    "Gemma3ForConditionalGeneration",  # multimodal
    "XLMWithLMHeadModel",  # .item() on lengths from the token ids' values
)

_LOG_QUIET = ("transformers", "tracing", "execwrap", "torch")


@dataclass
class Row:
    """One class of the suite: how far it got and what was predicted.

    Attributes:
        name: the model class.
        mappings: the suite's mappings it is in (``"causal_lm"``, ...).
        family: :func:`family`.
        level: the config level it was built from (:data:`benchmarks._tiny_configs.LEVELS`).
        capture_step: ``order.capture_step``.
        failed: the stage that failed (``"build"``, ``"capture"``, ``"plan"``,
            ``"predict"``) or ``""``.
        reason: why (the error's first line), or why transformers' plan is missing.
        ours, theirs: ``(groups, step_s, peak_bytes)`` for execwrap's plan and
            transformers' own (``theirs`` ``None`` without one).
        seconds: wall time of the class (build to prediction), under load.
    """

    name: str
    mappings: tuple[str, ...]
    family: str = ""
    level: str = ""
    capture_step: str = ""
    failed: str = ""
    reason: str = ""
    ours: tuple[int, float, int] | None = None
    theirs: tuple[int, float, int] | None = None
    theirs_reason: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Captured without computing, planned and predicted."""
        return not self.failed


def suite_entries() -> list[ModelEntry]:
    """The classes of :data:`MAPPINGS`, by class name."""
    return [e for e in model_entries() if set(MAPPINGS) & set(e.mappings)]


def _image_config(config: Any) -> Any:
    vision = getattr(config, "vision_config", None)
    return vision if vision is not None and hasattr(vision, "to_dict") else config


def _side(size: Any) -> tuple[int, int]:
    if isinstance(size, dict):
        return int(size.get("height", IMAGE)), int(size.get("width", IMAGE))
    if isinstance(size, (list, tuple)) and size:
        return int(size[-2]) if len(size) > 1 else int(size[0]), int(size[-1])
    return (int(size), int(size)) if isinstance(size, int) and size > 0 else (IMAGE, IMAGE)


def example_inputs(model: Any, entry: ModelEntry) -> dict[str, Any]:
    """One training batch for ``model``, derived from its config (real CPU tensors).

    Token ids ``[BATCH, SEQUENCE]`` of one id that is no special token (a model
    with ``num_codebooks`` takes ``BATCH * num_codebooks`` rows); a seq2seq model
    also gets decoder ids ``[BATCH, SEQUENCE // 2]``; an image classifier gets pixel
    values ``[BATCH, num_channels, height, width]`` of its config's image size.
    Each goes to the argument ``forward`` has for it: ``input_ids``, else the
    model's ``main_input_name``. ``use_cache=False`` where ``forward`` takes it (also
    through ``**kwargs`` when the config has ``use_cache``): a training step keeps no
    cache of keys and values. A config that fixes the training length (Reformer's
    ``axial_pos_shape``: its product) sets the sequence length.
    """
    import inspect
    import math

    import torch

    config = model.config
    params = inspect.signature(model.forward).parameters
    main = getattr(model, "main_input_name", "input_ids")
    text_mappings = {"for_causal_lm", "for_masked_lm", "for_seq_to_seq_causal_lm"}
    image = "for_image_classification" in entry.mappings and not set(entry.mappings) & text_mappings
    if image and main != "input_ids":  # ImageGPT classifies images given as token ids
        vision = _image_config(config)
        height, width = _side(getattr(vision, "image_size", None))
        channels = getattr(vision, "num_channels", None) or 3
        return {main: torch.zeros(BATCH, channels, height, width)}
    text = getattr(config, "get_text_config", lambda: config)()
    vocab = getattr(text, "vocab_size", None) or getattr(config, "vocab_size", None) or 128
    special = {
        v for k, v in text.to_dict().items() if k.endswith("_token_id") and isinstance(v, int)
    }
    token = next(i for i in range(vocab - 1, -1, -1) if i not in special)
    rows = BATCH * (getattr(text, "num_codebooks", None) or 1)
    # A config that fixes the training length (Reformer's axial position shape) sets it.
    axial = getattr(config, "axial_pos_shape", None)
    sequence = math.prod(axial) if axial else SEQUENCE
    ids = torch.full((rows, sequence), token, dtype=torch.long)
    out: dict[str, Any] = {"input_ids" if "input_ids" in params else main: ids}
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        out["decoder_input_ids"] = torch.full((rows, SEQUENCE // 2), token, dtype=torch.long)
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if "use_cache" in params or (takes_kwargs and hasattr(config, "use_cache")):
        out["use_cache"] = False  # a training step keeps no cache of keys and values
    return out


def family(entry: ModelEntry, config: Any) -> str:
    """``"vision"``, ``"encoder-decoder"``, ``"multimodal"``, ``"MoE"``, ``"encoder"`` or ``"dense"``."""
    from benchmarks._tiny_configs import _EXPERTS

    text = getattr(config, "get_text_config", lambda: config)()
    if set(entry.mappings) == {"for_image_classification"} or entry.mappings == (
        "for_image_classification",
    ):
        return "vision"
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder"
    if any(
        k in (getattr(config, "sub_configs", {}) or {}) for k in ("vision_config", "audio_config")
    ):
        return "multimodal"
    if any(_EXPERTS.match(k) and isinstance(v, int) and v > 1 for k, v in text.to_dict().items()):
        return "MoE"
    if "for_causal_lm" not in entry.mappings:
        return "encoder"
    return "dense"


def wrap_policy(model: Any) -> Any:
    """A ``ModuleWrapPolicy`` of the model's blocks: ``_no_split_modules``, else the
    classes its ``nn.ModuleList`` s hold."""
    import torch.nn as nn
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    names = set(getattr(model, "_no_split_modules", None) or ())
    classes = {type(m) for m in model.modules() if type(m).__name__ in names}
    if not classes:
        classes = {
            type(child) for m in model.modules() if isinstance(m, nn.ModuleList) for child in m
        }
    return ModuleWrapPolicy(classes)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:400]


def _capture(entry: ModelEntry, cost: Any) -> tuple[Any, Any, str]:
    """The fake model, its timed order and the level, trying the levels in turn.

    Raises:
        _BuildError: no level builds (:func:`_build_reason`).
        Exception: the first capture error of a level that built.
    """
    from tracing import capture_execution_order

    build_error: BaseException | None = None
    capture_error: BaseException | None = None
    for level in CAPTURE_LEVELS:
        try:
            built = build_fake(entry, (level,))
        except Exception as e:  # noqa: BLE001 - the next level is tried
            build_error = build_error or e
            continue
        try:
            inputs = example_inputs(built.model, entry)
            order = capture_execution_order(built.model, example_kwargs=inputs, timing=cost.compute)
        except Exception as e:  # noqa: BLE001 - the next level is tried
            capture_error = capture_error or e
            continue
        if order.capture_step != "runtime":
            return built, order, level
        capture_error = capture_error or RuntimeError(
            f"only a real run decides it: {order.fallback_reason}"
        )
    if capture_error is not None:
        raise capture_error
    assert build_error is not None
    raise _BuildError(_build_reason(entry, build_error)) from build_error


def _build_reason(entry: ModelEntry, error: BaseException) -> str:
    """Why no level builds: a missing library, transformers' own default config of the
    class failing too, or the first level's error."""
    from benchmarks._tiny_configs import build_meta

    if isinstance(error, ImportError):
        return _first_line(error)
    try:
        build_meta(entry, ("defaults",))
    except ImportError as e:
        return _first_line(e)
    except Exception as e:  # noqa: BLE001 - the reason reported
        return f"transformers' default config of the class does not build it: {_first_line(e)}"
    return _first_line(error)


class _BuildError(Exception):
    """No level of the class's config builds."""


def run_class(entry: ModelEntry, cost: Any | None = None) -> Row:
    """Build, capture, plan and predict ``entry`` (see the module docstring)."""
    from execwrap import CostModel

    cost = cost or CostModel.preset(PRESET)
    mappings = tuple(dict.fromkeys(m.removeprefix("for_") for m in entry.mappings if m in MAPPINGS))
    row = Row(entry.class_name, mappings)
    start = time.perf_counter()
    with _quiet():
        try:
            built, order, row.level = _capture(entry, cost)
        except _BuildError as e:
            row.failed, row.reason = "build", str(e)
        except Exception as e:  # noqa: BLE001 - reported in the table
            row.failed, row.reason = "capture", _first_line(e)
        else:
            row.family = family(entry, built.model.config)
            row.capture_step = order.capture_step
            row.notes = list(order.warnings)
            _plan_and_predict(row, built.model, order, cost)
    row.seconds = time.perf_counter() - start
    return row


def _plan_and_predict(row: Row, model: Any, order: Any, cost: Any) -> None:
    from execwrap import plan_wrap, simulate_step
    from execwrap.integrations.transformers import load_fsdp_plan

    try:
        ours = plan_wrap(
            model,
            order,
            wrap_policy(model),
            bucket_numel="auto",
            cost_model=cost,
            world_size=WORLD_SIZE,
        )
    except Exception as e:  # noqa: BLE001 - reported in the table
        row.failed, row.reason = "plan", _first_line(e)
        return
    try:
        step = simulate_step(ours, cost, world_size=WORLD_SIZE)
    except Exception as e:  # noqa: BLE001 - reported in the table
        row.failed, row.reason = "predict", _first_line(e)
        return
    row.ours = (len(ours.groups), step.step_time_s, step.peak_memory_bytes)
    if not getattr(model, "fsdp_plan", None):
        row.theirs_reason = "no fsdp_plan"
        return
    try:
        theirs = load_fsdp_plan(model, order=order)
        step = simulate_step(theirs, cost, world_size=WORLD_SIZE)
    except Exception as e:  # noqa: BLE001 - reported in the table
        row.theirs_reason = _first_line(e)
        return
    row.theirs = (len(theirs.groups), step.step_time_s, step.peak_memory_bytes)


class _quiet:
    """Warnings and INFO/WARNING logs of transformers, torch and capture off, for one class."""

    def __enter__(self) -> None:
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.simplefilter("ignore")
        self._levels = {n: logging.getLogger(n).level for n in _LOG_QUIET}
        for n in _LOG_QUIET:
            logging.getLogger(n).setLevel(logging.ERROR)

    def __exit__(self, *exc: object) -> None:
        for n, level in self._levels.items():
            logging.getLogger(n).setLevel(level)
        self._warnings.__exit__(*exc)
