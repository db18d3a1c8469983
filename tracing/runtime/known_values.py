"""Values a fake run can know: those fixed by the config, the inputs' shapes and constants.

A fake tensor has metadata and no values, so an op whose result depends on
values (``.item()``, ``if mask.any():``, ``nonzero``, indexing with a boolean
mask, also in backward) cannot run on it. In real models many such values do
not depend on the weights or the activations at all: an attention mask of ones
built from the input's shape (``torch.ones(batch, seq)``), position ids
(``torch.arange(seq)``), a length tensor (``torch.full((batch,), seq)``), a
mask compared with a constant, a random draw compared with the config's
layer-drop probability. :class:`KnownValues` computes exactly those, for real
and on CPU, beside the fake run of :class:`~tracing.runtime.shadow.ShadowMode`:

* **known from the start**: literals (``torch.tensor([...])``), real tensors met
  during the run, and the example inputs, buffers and plain tensor attributes
  that are real (not on the meta device); never a parameter;
* **known by computing**: the result of an op whose tensor arguments are all
  known, of a factory op (``arange``, ``ones``, ``full``; never ``empty``),
  and of an op whose result depends on its arguments' shapes only
  (``zeros_like``, ``new_ones``, ``fill_``, ``copy_`` of a known source:
  :data:`VALUE_FREE`);
* **random draws** (``torch.rand([])``, ``bernoulli``) on known arguments are
  drawn from a generator seeded with :data:`SEED` (the same draws on every rank
  and every run; the user's random stream is never touched). When such a value
  decides Python control flow (``if torch.rand([]) < self.layerdrop:``) the
  order is that of one seeded draw, and a note says so (:attr:`KnownValues.notes`);
* **forgotten**: a tensor written by an op that was not computed (its storage,
  and so every view of it).

Values are kept per storage, as the fake run's storages are: a view of a known
tensor is known through its base, and a write through a view updates the base.
A value larger than :data:`KNOWN_BYTES_LIMIT`, or any beyond
:data:`KNOWN_BYTES_TOTAL` in all, is not kept (its op runs fake only), so the
cost stays that of the masks and indices of the example's shapes; weights and
activations are never computed.

Example:
    >>> from tracing.runtime.shadow import ShadowMode
    >>> mode = ShadowMode()
    >>> with mode:
    ...     mask = torch.ones(2, 8, device="meta")
    ...     bool((mask > 0).any()), int(mask.sum())
    (True, 16)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
)
from torch.utils._mode_utils import no_dispatch

from tracing.source_line import stack_source_line

__all__ = ["KNOWN_BYTES_LIMIT", "KNOWN_BYTES_TOTAL", "SEED", "VALUE_FREE", "KnownValues"]

logger = logging.getLogger(__name__)

_aten = torch.ops.aten

#: Largest storage (bytes) whose value is kept: a ``[2, 1, 1024, 1024]`` boolean mask.
KNOWN_BYTES_LIMIT = 1 << 21
#: Most bytes of values kept in one run; later values are not kept.
KNOWN_BYTES_TOTAL = 1 << 28
#: Seed of the generator random draws on known values are drawn from.
SEED = 0

#: Ops whose result does not depend on the value of their first argument (its
#: shape, dtype and device only): an unknown first argument does not make them unknown.
VALUE_FREE = frozenset(
    {
        _aten.zeros_like.default,
        _aten.ones_like.default,
        _aten.full_like.default,
        _aten.new_zeros.default,
        _aten.new_ones.default,
        _aten.new_full.default,
        _aten.fill_.Scalar,
        _aten.zero_.default,
        _aten.copy_.default,
        _aten.rand_like.default,
        _aten.randn_like.default,
        _aten.uniform_.default,
        _aten.normal_.default,
    }
)
#: Ops whose result is never known: uninitialised memory, storage surgery.
_NEVER = frozenset(
    {
        _aten.empty.memory_format,
        _aten.empty_strided.default,
        _aten.empty_like.default,
        _aten.new_empty.default,
        _aten.new_empty_strided.default,
        _aten.set_.source_Storage,
        _aten.set_.source_Storage_storage_offset,
        _aten.set_.source_Tensor,
        _aten.set_.default,
        _aten.resize_.default,
    }
)
#: Ops that turn a value into Python control flow.
_DECIDES = frozenset({_aten._local_scalar_dense.default, _aten.is_nonzero.default})

_Entry = tuple[Any, torch.UntypedStorage, bool]  # (fake storage kept alive, real storage, random)


class KnownValues:
    """The known values of one fake run, by fake storage (see the module docstring).

    Attributes:
        notes: one sentence per place where a seeded random draw decided
            control flow (source line of the model's code).
    """

    def __init__(self) -> None:
        self._entries: dict[int, _Entry] = {}
        self._owners: set[int] = set()  # real storages already mirroring a fake one
        self._bytes = 0
        self._draws = 0
        self.notes: list[str] = []

    # ---- what is known -------------------------------------------------------
    def add(self, fake: torch.Tensor, real: torch.Tensor) -> None:
        """Make ``fake``'s value ``real``'s (a copy; real, not meta, within the limits)."""
        if not _is_fake(fake) or _is_fake(real) or real.device.type == "meta":
            return
        if self._key(fake) in self._entries or real.is_sparse:
            return
        with _real():
            copy = real.detach().to("cpu", copy=True)
        self._register(fake, copy, random=False)

    def value(self, t: Any) -> torch.Tensor | None:
        """The value of ``t`` (a CPU tensor viewing the kept storage), or ``None``."""
        if not isinstance(t, torch.Tensor):
            return None
        if not _is_fake(t):
            if t.device.type == "meta" or t.untyped_storage().nbytes() > KNOWN_BYTES_LIMIT:
                return None
            with _real():
                return t.detach().to("cpu", copy=True)
        entry = self._entries.get(self._key(t))
        if entry is None:
            return None
        with _real():
            return torch.empty(0, dtype=t.dtype).set_(
                entry[1], t.storage_offset(), t.size(), t.stride()
            )

    # ---- one op --------------------------------------------------------------
    def dispatch(
        self,
        mode: Any,
        func: Any,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        fake_call: Callable[[], Any],
    ) -> Any:
        """Run ``func`` fake (``fake_call``) and, where its arguments are known, for real.

        A value-dependent op (``_local_scalar_dense``, ``nonzero``) whose fake
        run raises gets its result from the real one; an op that is not computed
        makes what it writes unknown.
        """
        if not isinstance(func, torch._ops.OpOverload):
            return fake_call()
        flat, spec = pytree.tree_flatten((args, kwargs))
        real = self._real_arguments(func, flat)
        try:
            out = fake_call()
        except (DataDependentOutputException, DynamicOutputShapeException):
            if real is None:
                raise
            computed = self._compute(func, real, spec)
            if computed is None:
                raise
            self._note_decision(func, flat)
            return self._as_fake(mode, computed, _device(flat))
        if real is not None and _fits(out):
            computed = self._compute(func, real, spec)
            if computed is not None:
                self._register_outputs(out, computed, random=self._is_random(func, flat))
                return out
        self._forget_writes(func, args, kwargs)
        return out

    def _real_arguments(self, func: Any, flat: list[Any]) -> list[Any] | None:
        """``flat`` with every tensor replaced by its value, or ``None`` if one is unknown."""
        if func in _NEVER:
            return None
        real: list[Any] = []
        for i, a in enumerate(flat):
            if isinstance(a, torch.Tensor):
                v = self.value(a)
                if v is None:
                    if i != 0 or func not in VALUE_FREE or a.nbytes > KNOWN_BYTES_LIMIT:
                        return None
                    with _real():
                        v = torch.zeros(a.size(), dtype=a.dtype)  # its value is not read
                real.append(v)
            elif isinstance(a, torch.device):
                real.append(torch.device("cpu"))
            else:
                real.append(a)
        return real

    def _compute(self, func: Any, real: list[Any], spec: Any) -> Any:
        args, kwargs = pytree.tree_unflatten(real, spec)
        try:
            with _real():
                if torch.Tag.nondeterministic_seeded in func.tags:
                    with torch.random.fork_rng(devices=[]):
                        torch.manual_seed(SEED + self._draws)
                        self._draws += 1
                        return func(*args, **kwargs)
                return func(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the op stays fake-only
            logger.debug("known values: %s not computed on CPU: %r", func, e)
            return None

    def _is_random(self, func: Any, flat: list[Any]) -> bool:
        if torch.Tag.nondeterministic_seeded in func.tags:
            return True
        return any(
            _is_fake(a) and self._entries.get(self._key(a), (None, None, False))[2] for a in flat
        )

    def _note_decision(self, func: Any, flat: list[Any]) -> None:
        if func in _DECIDES and self._is_random(func, flat):
            where = stack_source_line() or "an unknown line"
            note = (
                f"a random draw decided control flow at {where} (e.g. a training-time layer "
                f"drop); the order is that of one draw from a generator seeded with {SEED}, "
                "the same on every rank; a step with other draws may skip or add calls"
            )
            if note not in self.notes:
                self.notes.append(note)

    # ---- keeping values ------------------------------------------------------
    @staticmethod
    def _key(t: torch.Tensor) -> int:
        return int(t.untyped_storage()._cdata)

    def _register(self, fake: torch.Tensor, real: torch.Tensor, *, random: bool) -> None:
        """Keep ``real`` as ``fake``'s value: its storage, or a copy laid out as ``fake``'s."""
        storage = fake.untyped_storage()
        nbytes = storage.nbytes()
        if nbytes > KNOWN_BYTES_LIMIT or self._bytes + nbytes > KNOWN_BYTES_TOTAL:
            return
        with _real():
            mirrored = real.untyped_storage()
            same_layout = (
                real.stride() == fake.stride()
                and real.storage_offset() == fake.storage_offset()
                and mirrored.nbytes() >= nbytes
                and int(mirrored._cdata) not in self._owners
            )
            if not same_layout:
                mirrored = torch.zeros(nbytes, dtype=torch.uint8).untyped_storage()
                view = torch.empty(0, dtype=fake.dtype).set_(
                    mirrored, fake.storage_offset(), fake.size(), fake.stride()
                )
                view.copy_(real)
        self._owners.add(int(mirrored._cdata))
        self._entries[self._key(fake)] = (storage, mirrored, random)
        self._bytes += nbytes

    def _register_outputs(self, out: Any, computed: Any, *, random: bool) -> None:
        fakes = pytree.tree_leaves(out)
        reals = pytree.tree_leaves(computed)
        if len(fakes) != len(reals):
            return
        for f, r in zip(fakes, reals, strict=True):
            if not (_is_fake(f) and isinstance(r, torch.Tensor)):
                continue
            entry = self._entries.get(self._key(f))
            if entry is not None:  # a view of, or a write into, a known storage
                if random and not entry[2]:
                    self._entries[self._key(f)] = (entry[0], entry[1], True)
                continue
            if f.size() == r.size() and f.dtype == r.dtype and _covers_storage(f):
                self._register(f, r, random=random)

    def _forget_writes(self, func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        """Forget the storages ``func`` writes (it was not computed)."""
        if not self._entries or not func._schema.is_mutable:
            return
        for i, arg in enumerate(func._schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            for t in pytree.tree_leaves(value):
                if _is_fake(t):
                    entry = self._entries.pop(self._key(t), None)
                    if entry is not None:
                        self._owners.discard(int(entry[1]._cdata))

    def _as_fake(self, mode: Any, computed: Any, device: torch.device) -> Any:
        """``computed`` (real outputs of a value-dependent op) as fake ones, values kept."""

        def fake(r: torch.Tensor) -> torch.Tensor:
            with mode:
                f = torch.empty_strided(r.size(), r.stride(), dtype=r.dtype, device=device)
            self._register(f, r, random=False)
            return f

        return pytree.tree_map_only(torch.Tensor, fake, computed)


@contextmanager
def _real() -> Iterator[None]:
    """Plain tensors for the block: no dispatch mode, no vmap level, no autograd."""
    with no_dispatch(), torch.no_grad(), temporarily_clear_interpreter_stack():
        yield


def _is_fake(t: Any) -> bool:
    return isinstance(t, FakeTensor)


def _fits(out: Any) -> bool:
    return all(
        not isinstance(t, torch.Tensor) or t.untyped_storage().nbytes() <= KNOWN_BYTES_LIMIT
        for t in pytree.tree_leaves(out)
    )


def _covers_storage(t: torch.Tensor) -> bool:
    """Whether ``t`` is laid out over its whole storage (a new tensor, not a view into one)."""
    return t.storage_offset() == 0 and t.untyped_storage().nbytes() <= max(
        t.nbytes, t.element_size()
    )


def _device(flat: list[Any]) -> torch.device:
    for a in flat:
        if isinstance(a, torch.Tensor):
            return a.device
    for a in flat:
        if isinstance(a, torch.device):
            return a
    return torch.device("cpu")
