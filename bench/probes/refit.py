"""New weights into a compiled model (issue 51, build item 3): the call after
``load_state_dict`` against a cold compile, in one process.

For ResNet-50 (``resnet50_nn``: random weights and BatchNorm statistics, batch 1, 224x224) at
each ``--precisions`` (int8: 4 random calibration batches, ``accuracy_budget=0.95`` as in the
cold-start suite: random weights miss the default), on ``--runtime`` pinned, in a fresh
cache directory:

* ``cold``: the first call of ``torch.compile``'d model (Dynamo's trace and the whole build);
* ``refit``: the next call after ``model.load_state_dict`` of another seed's weights (the
  refit: the recipe replayed, the artifact's initializers written, the runtime built, judged);
* ``steady``: the call after that (the refitted artifact, nothing built);
* ``refit / cold``: the issue's target is at most 0.25.

Each row's ``info`` has the refit's report entry (``refitted``, its seconds, INT8's cosine).
With ``--check``, a fresh compile of the new weights on the same runtime follows (another
cold compile) and ``equal_to_fresh`` says whether the refitted outputs are that build's bit for
bit (float), or ``cosine_to_float`` how close INT8's are to PyTorch's float outputs.
"""

from __future__ import annotations

import argparse
import tempfile
import warnings

import torch

import embedl_dynamo
from bench.harness.record import Record
from bench.harness.table import by_metric
from bench.harness.timer import timed_call
from bench.models.resnet import ResNet50, resnet50

__all__ = ["BASELINE", "arguments", "run", "smoke", "table"]

BASELINE = None


def arguments(parser: argparse.ArgumentParser) -> None:
    """The probe's options."""
    parser.add_argument("--runtime", default="openvino", choices=["openvino", "onnxruntime"])
    parser.add_argument("--precisions", nargs="+", default=["int8", "fp32"])
    parser.add_argument("--check", action="store_true", help="compare with a fresh build")
    parser.add_argument("--size", type=int, default=224, help="input height and width")


def smoke(args: argparse.Namespace) -> None:
    """fp32 only, at 32x32 on a ResNet-50 of one block per stage, no check."""
    args.precisions, args.check, args.size, args.blocks = ["fp32"], False, 32, 1


def _resnet(seed: int, blocks: int | None) -> torch.nn.Module:
    """:func:`resnet50`, or its layout with ``blocks`` bottlenecks per stage (smoke runs)."""
    if blocks is None:
        return resnet50(seed)
    torch.manual_seed(seed)
    return ResNet50(layers=(blocks,) * 4).eval()


def _options(precision: str, args: argparse.Namespace) -> dict:
    options = {"runtime": args.runtime, "precision": precision, "cache_dir": tempfile.mkdtemp()}
    if precision == "int8":
        generator = torch.Generator().manual_seed(1)
        shape = (1, 3, args.size, args.size)
        data = [(torch.randn(*shape, generator=generator),) for _ in range(4)]
        options.update(calibration_data=data, accuracy_budget=0.95)
    return options


def _case(record: Record, precision: str, args: argparse.Namespace) -> None:
    x = torch.randn(1, 3, args.size, args.size, generator=torch.Generator().manual_seed(2))
    blocks = getattr(args, "blocks", None)
    model, new = _resnet(0, blocks), _resnet(1, blocks).state_dict()
    backend = f"embedl_{args.runtime}"
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, options=_options(precision, args))
    params = {"precision": precision, "runtime": args.runtime}
    with torch.inference_mode():
        _, cold = timed_call(compiled, x)
        model.load_state_dict(new)
        out, refit = timed_call(compiled, x)
        _, steady = timed_call(compiled, x)
        expected = model(x)
    info = dict(embedl_dynamo.last_report().subgraphs[-1].pipeline.get("refit") or {})
    for metric, value in (("cold", cold), ("refit", refit), ("steady", steady)):
        record.add("resnet50_nn", "ours", metric, value, "s", params=params, info=info)
    record.add("resnet50_nn", "ours", "refit / cold", refit / cold, "x", params=params)
    cosine = torch.nn.functional.cosine_similarity(out.flatten(), expected.flatten(), 0)
    record.add("resnet50_nn", "ours", "cosine_to_float", float(cosine), "", params=params)
    if args.check:
        fresh_model = _resnet(1, blocks)
        torch._dynamo.reset()
        fresh = torch.compile(fresh_model, backend=backend, options=_options(precision, args))
        with torch.inference_mode():
            equal = torch.equal(fresh(x), out)
        record.add("resnet50_nn", "ours", "equal_to_fresh", equal, "", params=params)


def run(args: argparse.Namespace, record: Record) -> None:
    """Each precision in turn, in this process."""
    warnings.simplefilter("ignore")
    for precision in args.precisions:
        _case(record, precision, args)


def table(record: Record, view: str = "main") -> str:
    """A line per precision: cold, refit, their ratio, the steady call, the checks."""
    metrics = ("cold", "refit", "refit / cold", "steady", "cosine_to_float", "equal_to_fresh")
    return by_metric(record, metrics)
