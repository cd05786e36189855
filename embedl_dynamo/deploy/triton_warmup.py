"""What a Triton model config says about batching beyond its size: the batch sizes the dynamic
batcher prefers, and the warm-up requests Triton runs before it reports the model ready.

Triton answers the first requests of a model slowly: its runtime allocates, tunes and (for
TensorRT through ONNX Runtime) builds on the first run of each shape. ``model_warmup`` makes
Triton run those before the model is ready, so no client pays for them. :func:`add_warmup` writes
one request of zeros per batch size Triton will form: a batch of one and each preferred size
for a batching model, one request for a model with a static batch. Each input's dims are the
config's own (without the batch axis); a model with another dynamic axis gets no warm-up, since
no size is known to fit it.

:func:`prefer_batch_sizes` sets ``dynamic_batching.preferred_batch_size``: the batcher then
forms batches of those sizes when enough requests are queued (within
``max_queue_delay_microseconds``), as the throughput objective measured them to pay
(:func:`embedl_dynamo.serve.objective.write_triton_for_objective`).

Both work on tritonclient's ``model_config_pb2.ModelConfig``, the schema Triton parses;
:mod:`embedl_dynamo.deploy.triton` calls them while it builds the config.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from embedl_dynamo.errors import ExportArgumentError

__all__ = ["add_warmup", "prefer_batch_sizes"]

logger = logging.getLogger(__name__)


def prefer_batch_sizes(config: Any, sizes: Sequence[int] | None) -> None:
    """Set the dynamic batcher's preferred batch sizes (sorted, once each). A config without
    dynamic batching (a static batch axis, or one request per run for another reason) keeps
    none, with a warning: the sizes are advice for a batcher it does not have.

    Raises:
        ExportArgumentError: a size that is no integer in ``1..max_batch_size``.
    """
    if not sizes:
        return
    bad = [s for s in sizes if isinstance(s, bool) or not isinstance(s, int) or s < 1]
    if bad:
        raise ExportArgumentError(f"preferred_batch_sizes {bad}: give integers >= 1")
    if not config.HasField("dynamic_batching"):
        logger.warning(
            "%s: preferred_batch_sizes %s left out: Triton does not batch this model",
            config.name,
            list(sizes),
        )
        return
    over = [s for s in sizes if s > config.max_batch_size]
    if over:
        raise ExportArgumentError(
            f"preferred_batch_sizes {over} exceed max_batch_size={config.max_batch_size}; "
            "raise max_batch_size or lower them"
        )
    config.dynamic_batching.preferred_batch_size.extend(sorted(set(sizes)))


def add_warmup(config: Any, pb2: Any) -> None:
    """Add ``model_warmup``: one request of zeros per batch size Triton will form (1 and the
    preferred sizes where it batches, else one request); none where an input has another
    dynamic axis."""
    dynamic = [t.name for t in config.input if any(d < 0 for d in t.dims)]
    if dynamic:
        logger.debug("%s: no model_warmup: inputs %s have a dynamic axis", config.name, dynamic)
        return
    sizes = [1]
    if config.max_batch_size:
        sizes = sorted({1, *config.dynamic_batching.preferred_batch_size})
    for size in sizes:
        warmup = config.model_warmup.add(name=f"zeros_batch_{size}", batch_size=size, count=1)
        for tensor in config.input:
            sample = pb2.ModelWarmup.Input(data_type=tensor.data_type, dims=list(tensor.dims))
            sample.zero_data = True
            warmup.inputs[tensor.name].CopyFrom(sample)
