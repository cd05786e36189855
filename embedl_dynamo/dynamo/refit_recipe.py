"""The weight recipe of a build, recorded while its pipeline runs, for a refit later.

:func:`record_transform` runs the pipeline stage of a build (:mod:`~.graph_build`) under
:func:`~embedl_dynamo.graph.weight_recorder.record_weights`, so that the job keeps the tensor
ops that derive its transformed graphs' constants from the frozen weights
(``job.weight_recipe``); :mod:`~.refit` replays them on new weights. Only for a runtime that
runs an ONNX artifact a refit can write new initializers into (ONNX Runtime, OpenVINO).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from torch import fx

from embedl_dynamo.dynamo.subgraph_job import SubgraphJob
from embedl_dynamo.graph.weight_recorder import record_weights
from embedl_dynamo.graph.weight_tensors import recipe_leaves
from embedl_dynamo.pipeline import PipelineResult

__all__ = ["record_transform"]

logger = logging.getLogger(__name__)


def record_transform(
    job: SubgraphJob,
    graph: fx.GraphModule,
    transform: Callable[[SubgraphJob, fx.GraphModule], PipelineResult | None],
) -> PipelineResult | None:
    """``transform(job, graph)`` (the pipeline), recording the weight recipe of its models into
    ``job.weight_recipe`` where the runtime runs an ONNX artifact a refit can write into."""
    if job.runtime_cls.cpu_target is None:
        return transform(job, graph)
    with record_weights(recipe_leaves(graph)) as recorder:
        result = transform(job, graph)
    if result is not None:
        models = {"model": result.model, "float_model": result.float_model or result.model}
        # not replayed here to check it (that would add its weight ops to every compile): a
        # refit judges its artifact against the new weights' graph as a build does
        job.weight_recipe = recorder.finish(models, check=False)
        if job.weight_recipe.problem is not None:
            logger.info(
                "subgraph %d: new weights will be built anew (%s)",
                job.report.index,
                job.weight_recipe.problem,
            )
    return result
