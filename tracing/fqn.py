"""Fully qualified names (FQNs) of modules and parameters.

An FQN is the dotted path ``named_modules()`` / ``named_parameters()`` give a
module or parameter; the root module's FQN is ``""``. Everything in execwrap
and tracing that walks, compares or prints FQNs goes through these helpers.

>>> list(ancestors("blocks.0.attn"))
['blocks.0.attn', 'blocks.0', 'blocks', '']
>>> common_ancestor(["blocks.0.attn", "blocks.1.mlp"])
'blocks'
>>> quoted(""), quoted("blocks.0")
('<root>', "'blocks.0'")
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

__all__ = [
    "ROOT_NAME",
    "ancestors",
    "clean_fqn",
    "common_ancestor",
    "display",
    "innermost",
    "is_within",
    "is_wrapper_module",
    "join_fqn",
    "module_phrase",
    "original_class_name",
    "owner_fqn",
    "parent_fqn",
    "quoted",
]

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


# ------------------------------------------------------------------ display
def display(fqn: str) -> str:
    """``fqn`` as written in labels and tables: the root as ``<root>``."""
    return fqn if fqn else ROOT_NAME


def quoted(fqn: str) -> str:
    """``fqn`` as written in sentences: ``'blocks.0'``, the root as ``<root>``."""
    return f"'{fqn}'" if fqn else ROOT_NAME


def module_phrase(fqn: str) -> str:
    """``module 'blocks.0'``, or ``the root module <root>`` for ``""``."""
    return f"the root module {ROOT_NAME}" if fqn == "" else f"module {fqn!r}"


# ------------------------------------------------------------------ structure
def join_fqn(prefix: str, name: str) -> str:
    """Join a module FQN and a child/parameter name (root prefix is ``""``)."""
    return f"{prefix}.{name}" if prefix else name


def owner_fqn(param_fqn: str) -> str:
    """The FQN of the module that owns ``param_fqn`` (``""`` for the root)."""
    return param_fqn.rpartition(".")[0]


def parent_fqn(fqn: str) -> str | None:
    """The FQN of the module enclosing ``fqn``; ``None`` for the root."""
    return fqn.rpartition(".")[0] if fqn else None


def ancestors(fqn: str) -> Iterator[str]:
    """``fqn`` itself, then each enclosing module FQN up to the root ``""``."""
    while True:
        yield fqn
        if not fqn:
            return
        fqn = fqn.rpartition(".")[0]


def is_within(fqn: str, ancestor: str) -> bool:
    """Whether ``fqn`` is ``ancestor`` or lies in its subtree (FQN prefix by
    whole components: ``"a.bc"`` is not within ``"a.b"``)."""
    return ancestor == "" or fqn == ancestor or fqn.startswith(ancestor + ".")


def common_ancestor(fqns: Iterable[str]) -> str:
    """The deepest FQN that is ancestor-or-self of every FQN given (``""``
    when they share none, or when none is given)."""
    parts: list[str] | None = None
    for fqn in fqns:
        p = fqn.split(".") if fqn else []
        if parts is None:
            parts = p
            continue
        n = 0
        while n < min(len(parts), len(p)) and parts[n] == p[n]:
            n += 1
        parts = parts[:n]
    return ".".join(parts or [])


def innermost(fqn: str, candidates: Iterable[str] | dict[str, object] | set[str]) -> str:
    """The innermost FQN among ``candidates`` that encloses ``fqn`` (itself
    included); ``""`` (the root) when none does. Pass a set or dict: each
    ancestor is looked up with ``in``."""
    for anc in ancestors(fqn):
        if anc in candidates:
            return anc
    return ""


# ------------------------------------------------------------------ wrappers
def clean_fqn(fqn: str) -> str:
    """Remove wrapper components from an FQN, giving the original model's name.

    >>> clean_fqn("_fsdp_wrapped_module.layers.0._fsdp_wrapped_module.attn.weight")
    'layers.0.attn.weight'
    """
    if not fqn:
        return fqn
    parts = [p for p in fqn.split(".") if p not in _WRAPPER_NAMES]
    return ".".join(parts)


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
