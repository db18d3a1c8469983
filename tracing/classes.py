"""The classes ``isinstance`` consults for a group of objects, found cheaply.

``isinstance(x, C)`` asks whether ``type(x)`` or ``x.__class__`` is a
subclass of ``C``; the two differ only for objects that report another class
(``weakref.proxy``, mocks, class objects through their metaclass). Asking
``isinstance`` of every object costs a metaclass call each when ``C`` has a
metaclass (``torch.Tensor``, ABCs such as DDP); the set of classes of many
objects is a handful, and ``issubclass`` over that set answers whether *any*
object is an instance, exactly. The capture's checks use it to look at every
module or attribute value once, in C (:func:`instance_classes`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["could_be", "instance_classes"]

#: Built-in classes whose attribute lookup is Python's generic one: an object
#: whose class looks attributes up through one of them reports its type as
#: ``__class__``, unless a class in its MRO defines ``__class__``.
_GENERIC_LOOKUP = frozenset(
    {object, int, float, complex, str, bytes, tuple, list, dict, set, frozenset}
)
#: :func:`reports_its_type` per class seen (a class's MRO and slots are fixed
#: once it exists); emptied when it reaches ``_REPORTS_MAX`` classes.
_REPORTS: dict[type, bool] = {}
_REPORTS_MAX = 4096


def instance_classes(objects: Iterable[Any]) -> set[type]:
    """Every class that ``isinstance(obj, C)`` looks at, for each of ``objects``.

    ``isinstance(obj, C)`` is true for one of the objects exactly when
    ``issubclass(K, C)`` is true for one class ``K`` of the result (for ``C``
    whose metaclass answers by subclass checks, as ``type`` and ``ABCMeta``
    do). The cost is one ``type()`` per object, in C, plus one
    ``obj.__class__`` per object whose class may report another.

    Args:
        objects: the objects (iterated once).

    Returns:
        Their types, plus the ``__class__`` of those that report another.

    Example:
        >>> sorted(c.__name__ for c in instance_classes([1, "a", 2]))
        ['int', 'str']
    """
    listed = objects if isinstance(objects, list) else list(objects)
    classes: set[type] = set(map(type, listed))
    unsure = {cls for cls in classes if not reports_its_type(cls)}
    if unsure:
        reported = (obj.__class__ for obj in listed if type(obj) in unsure)
        classes.update(cls for cls in reported if isinstance(cls, type))
    return classes


def could_be(types: Iterable[type], cls: type) -> bool:
    """Whether an object whose type is among ``types`` can pass ``isinstance(obj, cls)``.

    ``False`` is certain: no type is a subclass of ``cls`` and each reports
    itself as its instances' ``__class__``. ``True`` means: ask ``isinstance``.

    Example:
        >>> could_be({int, str}, float), could_be({int, bool}, int)
        (False, True)
    """
    return any(issubclass(t, cls) or not reports_its_type(t) for t in types)


def reports_its_type(cls: type) -> bool:
    """Whether every instance of ``cls`` has ``obj.__class__ is cls``: attribute
    lookup is the generic one and no class in the MRO defines ``__class__``
    (remembered per class)."""
    known = _REPORTS.get(cls)
    if known is None:
        if len(_REPORTS) >= _REPORTS_MAX:  # classes made on the fly: keep it bounded
            _REPORTS.clear()
        known = _REPORTS[cls] = _reports_its_type(cls)
    return known


def _reports_its_type(cls: type) -> bool:
    lookup = getattr(cls.__getattribute__, "__objclass__", None)  # a C slot's owner
    if lookup not in _GENERIC_LOOKUP:
        return False
    return not any("__class__" in vars(base) for base in cls.__mro__[:-1])
