"""A transformers model to size, from a model id, a ``config.json`` or a config.

``execwrap fit meta-llama/Llama-3.1-8B`` needs only the model's ``config.json``: the
model is built from it on the meta device (no weights, nothing computed), its FSDP
units are its decoder layers (transformers' ``_no_split_modules``), and its step is
recorded with token ids and labels ``[micro_batch, sequence_length]`` and the loss
transformers computes (:func:`transformers_target`). A model id is looked up in the
Hugging Face cache or fetched from the Hub when the machine is online; offline, the
error says how to pass a local ``config.json``.
"""

from __future__ import annotations

import os
import socket
import urllib.parse
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from execwrap.sizing.blocks import block_policy
from execwrap.sizing.job import SizingModel

__all__ = ["load_config", "transformers_target"]


def load_config(source: str | os.PathLike[str]) -> tuple[PretrainedConfig, str]:
    """The config of a model id, a folder holding ``config.json``, or a JSON file.

    Returns:
        ``(config, where)``: the config and the path or id it was read from.

    Raises:
        ValueError: a file or folder that is not a transformers config; a path that does
            not exist (one that ends with a path separator, starts with ``./``, ``../``,
            ``/`` or ``~``, ends in ``.json``, or has more than one ``/``); a model id
            whose ``config.json`` is neither in the cache nor fetchable (offline): the
            message says that only ``config.json`` is needed and how to pass it.
    """
    text = os.fspath(source)
    try:
        path = Path(text).expanduser()
    except RuntimeError:  # ~user of no such user
        path = Path(text)
    if path.is_file() or path.is_dir():
        try:
            return AutoConfig.from_pretrained(str(path)), text
        except Exception as exc:  # transformers raises many kinds for a config it cannot read
            raise ValueError(
                f"transformers cannot read the config {text!r} ({type(exc).__name__}: "
                f"{_first_line(exc)}); check its fields, or pass a model's config.json (with its model_type) or "
                "the folder holding it"
            ) from exc
    why = _path_sign(text)
    if why is not None:
        raise ValueError(
            f"no such file or folder: {text!r} (read as a path: {why}; a Hugging Face model "
            "id looks like 'org/name'); pass an existing config.json or the folder holding it"
        )
    try:  # the cache first: no network, no retries
        return AutoConfig.from_pretrained(text, local_files_only=True), text
    except (OSError, ValueError):
        pass
    try:
        if not _hub_resolves():
            raise OSError(f"cannot resolve {_hub_host()}: this machine is offline")
        return AutoConfig.from_pretrained(text), text
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"model id {text!r}: its config.json is not in the Hugging Face cache and "
            f"could not be fetched ({_first_line(exc)}). Only config.json is needed, no "
            f"weights: download https://huggingface.co/{text}/resolve/main/config.json on "
            "a machine that is online and pass its path (execwrap fit path/to/config.json), "
            "or build the config in Python and pass it to execwrap.fit"
        ) from exc


def transformers_target(
    source: str | os.PathLike[str] | PretrainedConfig,
    *,
    model_class: Any = AutoModelForCausalLM,
) -> SizingModel:
    """The :class:`~execwrap.sizing.job.SizingModel` of a transformers model (module docstring).

    Args:
        source: a model id, a folder holding ``config.json``, a JSON config file, or a
            ``PretrainedConfig``.
        model_class: the auto class (or model class) to build (default: causal LM).

    Returns:
        The model on the meta device (float32 master weights), its decoder-layer
        policy, its inputs (``input_ids`` and ``labels``) and its loss.

    Raises:
        ValueError: what :func:`load_config` raises; transformers cannot build the
            model from the config (its message, with the config's class).

    Example:
        >>> target = transformers_target("path/to/config.json")  # doctest: +SKIP
        >>> type(target.model).__name__  # doctest: +SKIP
        'LlamaForCausalLM'
    """
    if isinstance(source, PretrainedConfig):
        config, where = source, f"a {type(source).__name__}"
    else:
        config, where = load_config(source)
    model = _meta_model(config, model_class)

    def inputs(micro_batch: int, sequence_length: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        ids = torch.zeros(micro_batch, sequence_length, dtype=torch.long, device="meta")
        return (), {"input_ids": ids, "labels": ids}

    kind = {"kind": "transformers", "config": where, "model_class": _class_name(model_class)}
    return SizingModel(
        model=model,
        name=f"{type(model).__name__} ({where})",
        init_policy=_layer_policy(model),
        inputs=inputs,
        loss_fn=_loss,
        source=kind,
    )


def _loss(output: Any) -> torch.Tensor:
    loss: torch.Tensor = output.loss
    return loss


def _layer_policy(model: nn.Module) -> Any:
    """``ModuleWrapPolicy`` of the model's ``_no_split_modules`` classes (its decoder
    layers), else its repeated blocks."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    classes = {type(m) for m in model.modules() if type(m).__name__ in names}
    return ModuleWrapPolicy(classes) if classes else block_policy(model)


def _meta_model(config: PretrainedConfig, model_class: Any) -> nn.Module:
    name = _class_name(model_class)
    try:
        with torch.device("meta"):
            if hasattr(model_class, "_model_mapping"):  # an auto class
                model: nn.Module = model_class.from_config(config, dtype=torch.float32)
            else:
                model = model_class(config)
    except Exception as exc:  # transformers raises many kinds for a config it cannot build
        raise ValueError(
            f"transformers cannot build {name} from this {type(config).__name__} "
            f"(model_type {getattr(config, 'model_type', '?')!r}): {type(exc).__name__}: "
            f"{_first_line(exc)}"
        ) from exc
    return model


def _class_name(model_class: Any) -> str:
    return str(getattr(model_class, "__name__", repr(model_class)))


def _path_sign(text: str) -> str | None:
    """Why ``text`` is clearly a path, not a model id (``None``: it may be an id)."""
    seps = tuple({"/", os.sep})
    if text.endswith(seps):
        return f"it ends with {text[-1]!r}"
    starts = [p for p in ("./", "../", ".\\", "..\\", "~") if text.startswith(p)]
    if text.startswith(seps) or starts:
        return f"it starts with {(starts[0] if starts else text[0])!r}"
    if text.endswith(".json"):
        return "it ends in '.json'"
    if os.sep in text.strip("/") and not _looks_like_id(text):
        return "it has more than one '/'"
    return None


def _looks_like_id(text: str) -> bool:
    """``org/name``: one slash, no leading dot or slash."""
    return text.count("/") == 1 and not text.startswith((".", "/"))


def _hub_host() -> str:
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    return urllib.parse.urlparse(endpoint).hostname or "huggingface.co"


def _hub_resolves() -> bool:
    """Whether the Hub's host name resolves (offline, huggingface_hub would retry for
    half a minute before failing); ``False`` too when ``HF_HUB_OFFLINE`` is set."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}:
        return False
    try:
        socket.getaddrinfo(_hub_host(), 443)
    except OSError:
        return False
    return True


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
