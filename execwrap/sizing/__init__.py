"""Will a training step fit a cluster: ``execwrap fit`` and :func:`execwrap.fit` without the frameworks.

* :mod:`~execwrap.sizing.cluster`: :class:`Cluster`, :func:`cluster_of` (a preset times
  nodes, or a calibrated cost model);
* :mod:`~execwrap.sizing.precision`: :data:`PRECISIONS` by name (``bf16``, ``bf16-reduce``,
  ``fp32``);
* :mod:`~execwrap.sizing.job`: :class:`SizingModel` and :func:`size_job` (the fastest plan
  at the asked micro-batch, the largest micro-batch that fits);
* :mod:`~execwrap.sizing.largest`: the largest micro-batch from least-memory plans;
* :mod:`~execwrap.sizing.result`: :class:`FitResult`;
* :mod:`~execwrap.sizing.recipes`: :func:`recipe` per framework;
* :mod:`~execwrap.sizing.summary` and :mod:`~execwrap.sizing.page`: the answer as rows
  and as ``fit.html``;
* :mod:`~execwrap.sizing.blocks`: a model given as an ``nn.Module`` or factory.

Models given by a transformers model id or ``config.json``:
:mod:`execwrap.integrations.transformers.fit_source`; the one call over all of them:
:func:`execwrap.fit` (:mod:`execwrap.integrations.fit`).
"""

from __future__ import annotations

from execwrap.sizing.blocks import block_policy, module_target
from execwrap.sizing.cluster import Cluster, cluster_of
from execwrap.sizing.job import SizingModel, size_job
from execwrap.sizing.largest import largest_fitting, least_memory_peak
from execwrap.sizing.page import render_fit_page, write_fit_page
from execwrap.sizing.precision import PRECISIONS, precision_of
from execwrap.sizing.recipes import RECIPE_FRAMEWORKS, recipe
from execwrap.sizing.result import FIT_SCHEMA_VERSION, FitResult
from execwrap.sizing.summary import memory_rows, plan_rows, summary_rows

__all__ = [
    "FIT_SCHEMA_VERSION",
    "PRECISIONS",
    "RECIPE_FRAMEWORKS",
    "Cluster",
    "FitResult",
    "SizingModel",
    "block_policy",
    "cluster_of",
    "largest_fitting",
    "least_memory_peak",
    "memory_rows",
    "module_target",
    "plan_rows",
    "precision_of",
    "recipe",
    "render_fit_page",
    "size_job",
    "summary_rows",
    "write_fit_page",
]
