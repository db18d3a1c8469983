"""FQN helpers shared by the capture paths."""

from __future__ import annotations

__all__: list[str] = []

#: How the root module (FQN ``""``) is written in messages, notes and labels.
ROOT_NAME = "<root>"

# Prefixes that wrappers insert into module/parameter names: FSDP1's
# FullyShardedDataParallel, activation checkpointing's CheckpointWrapper,
# torch.compile's OptimizedModule, DDP/DataParallel.
_WRAPPER_PREFIXES = (
    "_fsdp_wrapped_module.",
    "_checkpoint_wrapped_module.",
    "_orig_mod.",
    "_offload_wrapped_module.",
)
_WRAPPER_NAMES = tuple(p[:-1] for p in _WRAPPER_PREFIXES)


def clean_fqn(fqn: str) -> str:
    """Remove wrapper components from an FQN, giving the original model's name.

    >>> clean_fqn("_fsdp_wrapped_module.layers.0._fsdp_wrapped_module.attn.weight")
    'layers.0.attn.weight'
    """
    if not fqn:
        return fqn
    parts = [p for p in fqn.split(".") if p not in _WRAPPER_NAMES]
    return ".".join(parts)


def join_fqn(prefix: str, name: str) -> str:
    """Join a module FQN and a child/parameter name (root prefix is ``""``)."""
    return f"{prefix}.{name}" if prefix else name


def owner_fqn(param_fqn: str) -> str:
    """The FQN of the module that owns ``param_fqn`` (``""`` for the root)."""
    return param_fqn.rpartition(".")[0]


def is_wrapper_module(module: object) -> bool:
    """Whether ``module`` only wraps a child registered under a wrapper name.

    FSDP1's ``FullyShardedDataParallel``, ``CheckpointWrapper`` and
    ``OptimizedModule`` hold the original module as a child named
    ``_fsdp_wrapped_module`` / ``_checkpoint_wrapped_module`` / ``_orig_mod``;
    the wrapper and that child have the same :func:`clean_fqn`, so capture
    reports the child (the original module) and skips the wrapper.
    """
    children = getattr(module, "_modules", None)
    if not children:
        return False
    return any(name in _WRAPPER_NAMES for name in children)


def original_class_name(module: object) -> str:
    """The class name of the original module, undoing FSDP2's class swap.

    ``fully_shard`` replaces a module's class by a dynamic subclass named
    ``FSDP<Name>``; this returns ``<Name>`` for such a module and the plain
    class name otherwise.
    """
    cls = type(module)
    name = cls.__name__
    if name.startswith("FSDP"):
        for base in cls.__mro__[1:]:
            if "FSDP" + base.__name__ == name:
                return base.__name__
    return name
