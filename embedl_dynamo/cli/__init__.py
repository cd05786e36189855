"""The ``embedl-dynamo`` command line: backends, plan, export, bench, serve, cache.

::

    embedl-dynamo backends
    embedl-dynamo plan  MODULE:FACTORY --input-shape 1,3,224,224 [--backend tensorrt]
    embedl-dynamo export MODULE:FACTORY --input-shape 1,3,224,224 -o model.onnx \\
        [--int8 --calibration batches.npy|.pt] [--engine] [--no-verify]
    embedl-dynamo bench MODULE:FACTORY --input-shape 1,3,224,224 [--plot latency.png]
    embedl-dynamo serve model.onnx [--replicas 2 --port 8000 --host 127.0.0.1]
    embedl-dynamo cache info|clear [--cache-dir DIR]

``MODULE`` is an importable module (``torchvision.models``) or a ``.py`` file; ``FACTORY`` a
function or class in it called with no arguments that returns the ``nn.Module``. Inputs are
random tensors of the given shapes (repeat ``--input-shape`` for several inputs).

Errors print one line, the cause and the fix, and no traceback unless ``--debug``. Exit codes:

====  =================================================================================
0     success
1     internal error (a bug: rerun with ``--debug`` and report it)
2     usage error: bad arguments, unknown backend, factory not found, bad calibration file
3     the model cannot be captured, transformed or exported
4     the exported file does not match PyTorch within tolerance (``--no-verify`` keeps it)
5     a required runtime is unavailable here (TensorRT / CUDA for ``--engine``)
====  =================================================================================
"""

from embedl_dynamo.cli.inputs import (
    EXIT_EXPORT,
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    EXIT_VERIFY,
    load_factory,
    parse_shape,
)
from embedl_dynamo.cli.main import main

__all__ = [
    "EXIT_EXPORT",
    "EXIT_INTERNAL",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "EXIT_VERIFY",
    "load_factory",
    "main",
    "parse_shape",
]
