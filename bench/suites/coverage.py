"""How much of each model a CPU target's runtimes compute, decided without building anything.

For each model (by default every model of the test suite's zoo, ``tests/zoo``: hand-written
``torch.nn`` architectures and tiny transformers configs, ``zoo:<name>``; any registered model
by name) and each target (``--backends``), :func:`embedl_dynamo.coverage` traces the model as
``torch.compile`` does, freezes each Dynamo graph and partitions it by the conformance table,
building no runtime. Rows: the share of compute nodes and of FLOPs placed on a runtime, and
the number of nodes kept in PyTorch, with the kept ops and their reasons as the row's info.
This is the measurement behind the zoo's coverage gate (``tests/test_zoo_coverage.py``), as a
table over time. No timing: the coverage of a model does not depend on the machine.
"""

from __future__ import annotations

import argparse

import torch

from bench.harness.measure import one_line
from bench.harness.record import Record
from bench.harness.table import by_metric
from bench.suites.common import built_models, split_names

__all__ = ["BASELINE", "arguments", "run", "smoke", "table"]

BASELINE = None


def arguments(parser: argparse.ArgumentParser) -> None:
    """The suite's options."""
    parser.add_argument("--models", default="", help="comma-separated (default: tests/zoo)")
    parser.add_argument("--backends", default="onnxruntime,openvino", help="CPU targets")


def smoke(args: argparse.Namespace) -> None:
    """The tiny CNN and the MLP."""
    args.models = "tiny_cnn,mlp"


def run(args: argparse.Namespace, record: Record) -> None:
    """One row set per model and target."""
    import embedl_dynamo

    for name, model, inputs in built_models(args.models, record):
        for backend in split_names(args.backends):
            try:
                found = embedl_dynamo.coverage(model, inputs, backend=backend)
            except Exception as error:  # the trace failing is the row's result
                record.fail(name, backend, one_line(error))
                continue
            kept = [{"op": k.op, "reason": k.reason, "count": k.count} for k in found.kept]
            record.add(name, backend, "op_share", round(found.op_share, 4), "fraction")
            record.add(name, backend, "flop_share", round(found.flop_share, 4), "fraction")
            record.add(
                name,
                backend,
                "kept",
                sum(k["count"] for k in kept),
                "nodes",
                info={"kept": kept} if kept else None,
            )
        print(f"{name}: done", flush=True)
        torch._dynamo.reset()


def table(record: Record, view: str = "main") -> str:
    """A line per model and target: op share, FLOP share, nodes kept in PyTorch."""
    return by_metric(record, ("op_share", "flop_share", "kept"))
