"""Op conformance: for each op and CPU runtime, whether the runtime computes it as PyTorch does.

One table (:data:`ROWS`, in :mod:`.table`), the single source of truth for three readers: the
compile hands a node to a CPU runtime only when its op has a row that says ``exact`` or
``bounded`` for that runtime and the op's input dtype (:func:`node_blocker`: an allow-list
judged per node; an op without such a row stays in PyTorch, with the reason "``<op>`` has no
conformance row for ``<runtime>``" in the report, and the rest of its graph still runs on the
runtime, :mod:`embedl_dynamo.partition`); a listed difference on NaN or infinities is allowed
behind a per-call guard that sends calls with non-finite inputs to PyTorch
(:func:`needs_finite_inputs`), one on finite values keeps the op in PyTorch; the conformance suite
(``tests/runtimes/test_conformance.py``) takes each row as the expected result of PyTorch's own
OpInfo samples plus edge values; ``docs/op-conformance.md`` is generated from it
(``python -m tools.op_conformance_doc``).

* ``exact``: the runtime's outputs equal PyTorch's bit for bit (same dtype and shape; NaN and
  infinities where PyTorch has them), on every sample and edge value;
* ``bounded``: floats within :data:`FLOAT_ATOL` absolute or :data:`FLOAT_RTOL` relative to
  the output's scale (kernels reorder sums), NaN and infinities at PyTorch's positions;
  integers and bools still bit for bit;
* ``kept``: the runtime computes it otherwise (the reason says how), so a graph holding it
  runs in PyTorch, with that reason in the report.

What is judged is the graph Dynamo hands the backend, frozen and made functional (torch
functions such as ``conv2d``, Tensor methods such as ``view``, ``operator`` functions such as
``add``), before the pipeline rewrites it: the ops the pipeline introduces itself (canonical
fused ops, Q/DQ pairs, the exact forms of :mod:`embedl_dynamo.graph.exact_ops`) replace ops
judged here and are checked against eager by their own tests and the compile's judge. Each
row is checked one of three ways (:attr:`OpRow.checked_by`):

* by its OpInfo entries (``op_db``), the suite's default;
* by a named test file with OpInfo-like samples where ``op_db`` has no usable entry
  (``scaled_dot_product_attention``, ``_transformer_encoder_layer_fwd``, ``setitem``);
* :data:`STRUCTURAL`: the op computes no tensor values a runtime could compute otherwise
  (sizes, attributes, constants, PyTorch's logging, ``dropout`` at inference).

A row holds for the dtypes it names (``float``: floating point; ``int``: integers and bools;
a row for ``float`` only leaves an integer input of that op in PyTorch). Picking one output of
a multi-output op (``operator.getitem`` on a tuple) computes nothing and is not judged;
indexing a tensor is (``getitem``). Several ``exact`` rows hold only through the forms
:mod:`embedl_dynamo.graph.exact_ops` gives those ops in every export (NaN-propagating
``max``/``argmax``, integer sums by ``CumSum``, zeros for fully masked attention rows).

The table speaks for the CPU runtimes (:data:`CPU_RUNTIMES`), the ones it can be checked on.
TensorRT and Torch-TensorRT (on a GPU, in TF32 or lower precision by design) and third-party
runtimes are not judged by it: what they cannot build fails loudly and runs in PyTorch, and
the compile's judge compares their outputs with eager's. The ``tensorrt`` target's CPU
fallback runs on ONNX Runtime or OpenVINO and is judged like any graph for those.
"""

from __future__ import annotations

from embedl_dynamo.runtimes.conformance.judge import (
    NON_FINITE_EDGES,
    differences,
    kept_in_pytorch,
    needs_finite_inputs,
    node_blocker,
    op_name,
    rule_for,
)
from embedl_dynamo.runtimes.conformance.op_names import OPINFO_ALIASES
from embedl_dynamo.runtimes.conformance.rules import (
    CPU_RUNTIMES,
    FLOAT_ATOL,
    FLOAT_RTOL,
    STRUCTURAL,
    Difference,
    OpRow,
    Rule,
    Verdict,
)
from embedl_dynamo.runtimes.conformance.table import ROWS

__all__ = [
    "NON_FINITE_EDGES",
    "CPU_RUNTIMES",
    "Difference",
    "FLOAT_ATOL",
    "FLOAT_RTOL",
    "OPINFO_ALIASES",
    "OpRow",
    "ROWS",
    "Rule",
    "STRUCTURAL",
    "Verdict",
    "differences",
    "kept_in_pytorch",
    "needs_finite_inputs",
    "node_blocker",
    "op_name",
    "rule_for",
]
