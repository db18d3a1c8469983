"""What symbolic capture records while ``torch.fx`` builds its graph.

For the duration of exactly one ``tracer.trace()`` call the tracer
*instance*'s ``call_module`` and ``create_proxy`` are wrapped
(:meth:`SymbolicRecorder.patched`):

* ``call_module`` is called by fx for every submodule call (the root's
  ``forward`` is traced directly). The wrapper appends the module's FQN to the
  forward order and keeps a stack of the modules being traced, so every later
  event knows its innermost module.
* ``create_proxy`` is called for every graph node. A ``call_function``,
  ``call_method`` or ``call_module`` node whose input nodes include the
  ``get_attr`` of a parameter uses that parameter. Looking at the node
  (rather than at the Python arguments) sees parameters at any nesting depth:
  positional, keyword, inside lists/tuples/dicts, and ``nn.Parameter`` objects
  that fx turned into ``get_attr`` nodes itself. Because fx caches one proxy
  per parameter, a use can only be found at the op that consumes it, never at
  the attribute access. A leaf module's ``call_module`` node uses all of that
  module's parameters (recursively), since fx does not trace inside it.
  During the trace the wrapper only notes each such node with the innermost
  module call (one append); once the trace has finished, the
  parameters' ``get_attr`` nodes name the nodes that use them (their
  ``users``) and the parameter groups are built, so the trace itself stays
  within a few percent of a bare ``tracer.trace()``.

Source: the approach follows torch's 2022 ``ParamExecOrderWrapPolicy`` tracer
(``torch/distributed/fsdp/_trace_utils.py``, ``_ExecOrderTracer``), which
patched the same two methods; this version keys everything by FQN, finds
parameters inside containers and keyword arguments, restores the tracer
exactly, and names the failing module when tracing fails.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
from collections.abc import Callable, Iterator
from itertools import chain, compress, repeat
from operator import attrgetter, itemgetter
from typing import Any

import torch.fx
import torch.nn as nn
from torch.fx.node import Node, Target

from tracing.order import ExecutionOrder, ParamInfo, ParamUse, param_info
from tracing.uses import METADATA_METHODS
from tracing.walk import ModuleWalk, walk_modules

__all__ = ["SymbolicRecorder"]

logger = logging.getLogger(__name__)

_PATCHED_METHODS = ("call_module", "create_proxy")
_CLASS_NAME = attrgetter("__name__")
_PARAM_FQNS = attrgetter("param_fqns")
_GRAPH = attrgetter("graph")
_PARAMETERS = attrgetter("_parameters")
_USE_KINDS = frozenset({"call_function", "call_method", "call_module"})

_METADATA_ATTRS = frozenset(
    {
        "shape",
        "dtype",
        "device",
        "ndim",
        "layout",
        "requires_grad",
        "is_cuda",
        "is_meta",
        "is_sparse",
        "is_quantized",
    }
)


class SymbolicRecorder:
    """Records module calls and parameter uses during one fx trace.

    All lookups are precomputed dicts keyed by ``id()`` or FQN, so each event
    costs O(1) plus the size of the node's inputs; parameter groups are built
    in :meth:`result`, after the trace.
    """

    def __init__(self, model: nn.Module, walk: ModuleWalk | None = None) -> None:
        self.model = model
        if walk is None:
            walk = walk_modules(model)
        # From the one walk over the module tree (tracing.walk; every alias
        # reached, as named_modules(remove_duplicate=False)), built in C:
        # id(module) -> FQN (its first name), the ExecutionOrder's
        # module_classes (first names, named_modules() order), and every FQN
        # -> module.
        first_names = walk.first_names
        self.module_fqns = dict(zip(map(id, walk.modules), first_names, strict=True))
        classes = map(_CLASS_NAME, map(type, walk.modules))
        self.module_classes = dict(zip(first_names, classes, strict=True))
        self.modules_by_fqn = dict(walk.named)
        # Then, over the modules that hold parameters: every parameter FQN
        # (aliases too, i.e. every get_attr target) -> canonical FQN,
        # canonical FQN -> aliases (tied parameters), and the ExecutionOrder's
        # params (first names, named_parameters() order).
        params: dict[str, ParamInfo] = {}
        id_to_canonical: dict[int, str] = {}
        param_targets: dict[str, str] = {}
        shared: dict[str, list[str]] = {}
        leaf_params: dict[str, tuple[str, ...]] = {}
        # ParamInfo is frozen: parameters alike (the blocks of a transformer)
        # share one, built once per (shape, dtype, requires_grad).
        infos: dict[tuple[Any, ...], ParamInfo] = {}
        holders = map(_PARAMETERS, map(itemgetter(1), walk.named))
        for module_fqn, module in compress(walk.named, holders):
            own: list[str] = []
            prefix = module_fqn + "." if module_fqn else ""
            for name, p in module._parameters.items():
                if p is None:
                    continue
                fqn = prefix + name
                canonical = id_to_canonical.setdefault(id(p), fqn)
                param_targets[fqn] = canonical
                own.append(canonical)
                if canonical == fqn:
                    key = (p.shape, p.dtype, p.requires_grad)
                    info = infos.get(key)
                    if info is None:
                        info = infos[key] = param_info(p)
                    params[fqn] = info
                else:
                    shared.setdefault(canonical, []).append(fqn)
            if not module._modules:
                # A module without children: its leaf parameter group.
                leaf_params[module_fqn] = tuple(dict.fromkeys(own))
        self.params = params
        self.id_to_canonical = id_to_canonical
        self.param_targets = param_targets
        self.shared = shared
        # Module FQN -> canonical FQNs of all its parameters (recursively), for
        # leaf modules: filled here for modules without children, on first use
        # for others (a custom tracer's leaf block).
        self.leaf_params = leaf_params

        self.module_forward_order: list[str] = [""]
        #: per call, how many recorded calls enclose it (the stack's height)
        self.module_call_depths: list[int] = [0]
        #: the calls being traced, innermost last (indices into module_forward_order)
        self.stack: list[int] = [0]
        # Every op and module-call node, and the call on top of the stack when
        # it was created (two lists: nothing allocated per node). They are
        # turned into ParamUses after the trace, so the trace itself pays two
        # appends per node.
        self.nodes: list[Any] = []
        self.node_calls: list[int] = []
        # The innermost module when an exception first passed through a
        # module call, keyed by the exception object.
        self._failed_exc: BaseException | None = None
        self._failed_fqn = ""
        self.debug = logger.isEnabledFor(logging.DEBUG)

    # ------------------------------------------------------------- patching
    @contextlib.contextmanager
    def patched(self, tracer: torch.fx.Tracer) -> Iterator[None]:
        """Wrap ``tracer``'s ``call_module``/``create_proxy`` for one trace.

        The wrappers are set as instance attributes; afterwards (also when
        tracing fails) the instance is exactly as before: attributes it had
        are put back, the others deleted.
        """
        saved = {name: vars(tracer)[name] for name in _PATCHED_METHODS if name in vars(tracer)}
        tracer.call_module = self._wrap_call_module(tracer.call_module)  # type: ignore[method-assign]
        tracer.create_proxy = self._wrap_create_proxy(tracer.create_proxy)  # type: ignore[method-assign]
        try:
            yield
        finally:
            for name in _PATCHED_METHODS:
                if name in saved:
                    setattr(tracer, name, saved[name])
                else:
                    delattr(tracer, name)

    def _wrap_call_module(self, orig_call_module: Callable[..., Any]) -> Callable[..., Any]:
        """``call_module`` that records the call and keeps the module stack."""
        module_fqns = self.module_fqns
        module_forward_order = self.module_forward_order
        depths = self.module_call_depths
        stack = self.stack
        debug = self.debug

        def call_module(
            m: nn.Module,
            forward: Callable[..., Any],
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
        ) -> Any:
            fqn = module_fqns.get(id(m))
            if fqn is None:  # not a submodule of the model: fx reports it
                return orig_call_module(m, forward, args, kwargs)
            call_index = len(module_forward_order)
            module_forward_order.append(fqn)
            depths.append(len(stack))
            stack.append(call_index)
            if debug:
                logger.debug("call %d: %s (%s)", call_index, fqn, type(m).__name__)
            try:
                return orig_call_module(m, forward, args, kwargs)
            except BaseException as e:
                if self._failed_exc is not e:  # the innermost call sees it first
                    self._failed_exc = e
                    self._failed_fqn = fqn
                raise
            finally:
                stack.pop()

        return call_module

    def _wrap_create_proxy(
        self, orig_create_proxy: Callable[..., torch.fx.Proxy]
    ) -> Callable[..., torch.fx.Proxy]:
        """``create_proxy`` that notes each op or module-call node with its module call."""
        stack = self.stack
        nodes_append = self.nodes.append
        calls_append = self.node_calls.append
        use_kinds = _USE_KINDS

        def create_proxy(
            kind: str,
            target: Target,
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
            name: str | None = None,
            type_expr: Any | None = None,
            proxy_factory_fn: Callable[[Node], torch.fx.Proxy] | None = None,
        ) -> torch.fx.Proxy:
            if proxy_factory_fn is None:
                proxy = orig_create_proxy(kind, target, args, kwargs, name, type_expr)
            else:
                proxy = orig_create_proxy(
                    kind, target, args, kwargs, name, type_expr, proxy_factory_fn
                )
            if kind in use_kinds:
                try:
                    nodes_append(proxy.node)
                except AttributeError:  # a custom proxy factory's object, without a node
                    return proxy
                calls_append(stack[-1])
            return proxy

        return create_proxy

    # -------------------------------------------------------------- results
    def result(self) -> ExecutionOrder:
        """The recorded order (call after a successful trace)."""
        nodes, node_calls = self._graph_nodes()
        using = self._param_users(nodes)
        leaf_params = self.leaf_params
        module_forward_order = self.module_forward_order
        param_uses: list[ParamUse] = []
        for node, call_index in zip(nodes, node_calls, strict=True):
            module_fqn = module_forward_order[call_index]
            if node.op == "call_module":
                # A leaf module's own parameters, and any passed to it.
                group = leaf_params.get(node.target)  # type: ignore[arg-type]
                if group is None:
                    group = self._leaf_params(node.target, module_fqn)
                if node in using:
                    group = tuple(dict.fromkeys(group + self._direct_params(node)))
                if not group:
                    continue
                use = ParamUse(module_fqn, call_index, group, "call_module")
            elif node in using:
                if _is_metadata_access(node.op, node.target, node):
                    continue
                group = tuple(dict.fromkeys(self._direct_params(node)))
                use = ParamUse(module_fqn, call_index, group, _op_name(node.target))
            else:
                continue
            param_uses.append(use)
            if self.debug:
                logger.debug(
                    "call %d (%s): %s uses %s", call_index, module_fqn, use.op, use.param_fqns
                )
        # Each parameter's first use: dict keys keep the first insertion.
        first_uses = dict.fromkeys(chain.from_iterable(map(_PARAM_FQNS, param_uses)))
        return ExecutionOrder(
            module_forward_order=list(self.module_forward_order),
            module_call_depths=list(self.module_call_depths),
            param_forward_order=list(first_uses),
            param_uses=param_uses,
            param_backward_order=[],
            shared_params=self.shared,
            params=self.params,
            module_classes=self.module_classes,
            method="symbolic",
        )

    def _graph_nodes(self) -> tuple[list[Node], list[int]]:
        """The recorded nodes and their calls, in creation order (anything a custom
        proxy factory hung on ``.node`` that is not a graph node left out)."""
        if all(map(isinstance, self.nodes, repeat(Node))):
            return self.nodes, self.node_calls
        kept = list(map(isinstance, self.nodes, repeat(Node)))
        return list(compress(self.nodes, kept)), list(compress(self.node_calls, kept))

    def _param_users(self, nodes: list[Node]) -> set[Node]:
        """The nodes that take a parameter's ``get_attr`` node as an input.

        The ``get_attr`` nodes of the graphs ``nodes`` belong to are few (fx
        makes one per parameter and trace), and each knows its users, so
        this finds every node using a parameter at any nesting depth of its
        arguments (fx records a node's inputs wherever they sit: positional,
        keyword, inside lists, tuples and dicts) without looking at the
        inputs of every node.
        """
        param_targets = self.param_targets
        users: set[Node] = set()
        for graph in set(map(_GRAPH, nodes)):
            for n in _get_attr_nodes(graph):
                if n.target in param_targets:
                    users.update(n.users)
        return users

    def _direct_params(self, node: Node) -> tuple[str, ...]:
        """Canonical FQNs of the parameters among ``node``'s input nodes, in order."""
        param_targets = self.param_targets
        return tuple(
            param_targets[n.target]  # type: ignore[index]
            for n in node.all_input_nodes
            if n.op == "get_attr" and n.target in param_targets
        )

    def _leaf_params(self, target: Target, module_fqn: str) -> tuple[str, ...]:
        """Canonical FQNs of all parameters (recursively) of a leaf module.

        ``target`` is the node's module path; for a tracer whose
        ``path_of_module`` gives other names, ``module_fqn`` (the module on top
        of the call stack, i.e. the leaf) is used instead.
        """
        key = target if isinstance(target, str) and target in self.modules_by_fqn else module_fqn
        cached = self.leaf_params.get(key)
        if cached is not None:
            return cached
        params = self.modules_by_fqn[key].parameters()
        result = tuple(dict.fromkeys(self.id_to_canonical[id(p)] for p in params))
        self.leaf_params[key] = result
        return result

    def failed_module(self, error: BaseException) -> tuple[str, str]:
        """``(FQN, class name)`` of the innermost module being traced when
        ``error`` was raised (the root ``""`` when no module call saw it)."""
        fqn = ""
        cause: BaseException | None = error
        while cause is not None:  # the tracer may have wrapped our exception
            if cause is self._failed_exc:
                fqn = self._failed_fqn
                break
            cause = cause.__cause__ or cause.__context__
        module = self.modules_by_fqn.get(fqn, self.model)
        return fqn, type(module).__name__


def _get_attr_nodes(graph: torch.fx.Graph) -> list[Node]:
    """The ``get_attr`` nodes of ``graph``: from fx's lookup table where this torch
    has ``Graph.find_nodes``, else by walking the graph."""
    try:
        return list(graph.find_nodes(op="get_attr", sort=False))
    except (AttributeError, TypeError):  # a torch without find_nodes, or another signature
        return [n for n in graph.nodes if n.op == "get_attr"]


def _op_name(target: Target) -> str:
    """Short op name: ``"linear"`` for ``F.linear``, ``"mul"`` for ``operator.mul``."""
    if isinstance(target, str):
        return target
    return str(getattr(target, "__name__", target))


def _is_metadata_access(kind: str, target: Target, node: Node) -> bool:
    """Whether the node only reads metadata (``w.shape``, ``w.size()``)."""
    if kind == "call_method":
        return target in METADATA_METHODS
    if target is builtins.getattr and len(node.args) >= 2:
        return node.args[1] in _METADATA_ATTRS
    return False
