"""A device check on a CUDA machine: models on the GPU through the dynamo backends and ``load()``.

Run where a GPU is lent (``PYTHONPATH=. python -m tools.device_check``, the package's
``egg-info`` beside it for the entry points). Each check prints one line, ``ok`` or ``FAIL`` and
what it measured; a check that raises prints its error and the others still run. It covers what
CI cannot (no GPU there):

* a CNN on CUDA through ``embedl_tensorrt`` and ``embedl_onnxruntime``: the outputs stay on the
  GPU and equal eager's, and the report names the runtime (TensorRT where it is installed; else
  the graph stays in PyTorch with one warning, since a CPU engine would copy every call's
  tensors to host memory and back);
* a forced CPU-only runtime on CUDA tensors: a clear error;
* ``export()`` of the CUDA model and ``load()`` fed CUDA tensors: outputs on the GPU, equal;
* a grouped-query Llama's ``generate()`` on CUDA with the static and the dynamic cache: eager's
  tokens, and a bounded number of graphs.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch.fx.experimental import symbolic_shapes

if not hasattr(symbolic_shapes, "optimization_hint"):  # torch < 2.13 (a GPU image's own torch)
    symbolic_shapes.optimization_hint = symbolic_shapes.hint_int

import embedl_dynamo  # noqa: E402

__all__ = ["check", "main"]

RESULTS: list[dict] = []
DEVICE = "cuda"  # --device: "cpu" dry-runs the checks on a machine without a GPU


def check(name: str) -> Callable[[Callable[[], dict]], Callable[[], None]]:
    """Run the decorated check, print ``ok``/``FAIL`` with what it returned, record it."""

    def wrap(fn: Callable[[], dict]) -> Callable[[], None]:
        def run() -> None:
            start = time.perf_counter()
            try:
                info = fn()
                status = "ok" if info.pop("ok") else "FAIL"
            except Exception as exc:  # a check that raises is reported, the others still run
                info, status = {"error": f"{type(exc).__name__}: {exc}"[:600]}, "FAIL"
                traceback.print_exc(limit=3)
            info["seconds"] = round(time.perf_counter() - start, 1)
            print(f"{status} {name}: {json.dumps(info, default=str)}", flush=True)
            RESULTS.append({"check": name, "status": status, **info})

        return run

    return wrap


def _cnn() -> torch.nn.Module:
    """ResNet-18 (torchvision), or the test suite's small ResNet where torchvision is absent."""
    torch.manual_seed(0)
    try:
        import torchvision
    except ImportError:
        from tests.models import ResNetLike, randomize_batchnorm

        return randomize_batchnorm(ResNetLike(width=32)).eval().to(DEVICE)
    return torchvision.models.resnet18(num_classes=10).eval().to(DEVICE)


class _Records(logging.Handler):
    """The library's warnings, as logged."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage()[:200])


def _sync() -> None:
    """Wait for the GPU's queued work (a CPU dry run has none)."""
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _median_ms(fn: Callable[[], object], runs: int = 20) -> float:
    times = []
    for _ in range(runs):
        _sync()
        start = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - start)
    return sorted(times)[runs // 2] * 1e3


def _through(backend: str, model: torch.nn.Module, x: torch.Tensor) -> dict:
    torch._dynamo.reset()
    records = _Records()
    logging.getLogger("embedl_dynamo").addHandler(records)
    try:
        with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            expected = model(x)
            compiled = torch.compile(model, backend=backend)
            out = compiled(x)
            again = compiled(x)
            eager_ms = [_median_ms(lambda: model(x)) for _ in range(3)]
            ours_ms = [_median_ms(lambda: compiled(x)) for _ in range(3)]
    finally:
        logging.getLogger("embedl_dynamo").removeHandler(records)
    subgraphs = embedl_dynamo.last_report().subgraphs
    diff = float((out - expected).abs().max())
    ok = out.device == x.device and diff < 1e-3 and torch.equal(out, again)
    return {
        "ok": ok,
        "device": str(out.device),
        "max_abs_diff": diff,
        "runtimes": [s.runtime for s in subgraphs],
        "reasons": [s.reason[:200] for s in subgraphs],
        "ms_eager_then_ours": [min(eager_ms), min(ours_ms)],
        "warnings": [str(w.message)[:200] for w in caught] + records.messages,
    }


@check("cnn on CUDA through embedl_tensorrt")
def cnn_tensorrt() -> dict:
    return _through("embedl_tensorrt", _cnn(), torch.randn(4, 3, 64, 64, device=DEVICE))


@check("cnn on CUDA through embedl_onnxruntime")
def cnn_onnxruntime() -> dict:
    return _through("embedl_onnxruntime", _cnn(), torch.randn(4, 3, 64, 64, device=DEVICE))


@check("forced CPU runtime on CUDA tensors names the problem")
def forced_cpu_runtime() -> dict:
    if DEVICE != "cuda":
        return {"ok": True, "skipped": "not on CUDA"}
    torch._dynamo.reset()
    model, x = _cnn(), torch.randn(2, 3, 64, 64, device=DEVICE)
    compiled = torch.compile(
        model, backend="embedl_onnxruntime", options={"runtime": "onnxruntime"}
    )
    try:
        with torch.no_grad():
            compiled(x)
    except Exception as exc:
        message = str(exc)
        return {"ok": "CUDA" in message and "onnxruntime" in message, "error": message[:400]}
    return {"ok": False, "error": "no error raised"}


@check("export() of a CUDA model, load() fed CUDA tensors")
def export_and_load() -> dict:
    model, x = _cnn(), torch.randn(2, 3, 64, 64, device=DEVICE)
    with tempfile.TemporaryDirectory() as folder, torch.no_grad():
        path = embedl_dynamo.export(model, (x,), Path(folder) / "m.onnx", backend="onnxruntime")
        loaded = embedl_dynamo.load(path)
        out, expected = loaded(x), model(x)
    diff = float((out - expected).abs().max())
    return {
        "ok": out.device == x.device and diff < 1e-3,
        "device": str(out.device),
        "max_abs_diff": diff,
        "providers": list(loaded.providers),
    }


def _llama():
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=128,
    )
    return transformers.LlamaForCausalLM(config).eval().to(DEVICE)


def _generate(cache: str) -> dict:
    torch._dynamo.reset()
    model = _llama()
    ids = torch.randint(0, 128, (1, 8), device=DEVICE, generator=None)
    kw = {"max_new_tokens": 12, "do_sample": False}
    if cache == "static":
        kw["cache_implementation"] = "static"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = model.generate(ids, **kw)
        forward = model.forward
        model.forward = torch.compile(forward, backend="embedl_tensorrt")
        try:
            tokens = model.generate(ids, **kw)
            again = model.generate(ids, **kw)
        finally:
            model.forward = forward
    subgraphs = embedl_dynamo.last_report().subgraphs
    ok = torch.equal(tokens, expected) and torch.equal(again, expected)
    return {
        "ok": ok,
        "graphs": len(subgraphs),
        "runtimes": sorted({s.runtime for s in subgraphs}),
        "tokens_equal": torch.equal(tokens, expected),
    }


@check("llama GQA generate() on CUDA, static cache")
def generate_static() -> dict:
    return _generate("static")


@check("llama GQA generate() on CUDA, dynamic cache")
def generate_dynamic() -> dict:
    return _generate("dynamic")


def environment() -> dict:
    import onnxruntime as ort

    found = {}
    for name in ("tensorrt", "torch_tensorrt", "openvino"):
        try:
            found[name] = __import__(name).__version__
        except Exception as exc:
            found[name] = f"missing ({type(exc).__name__})"
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        "torch": torch.__version__,
        "gpu": gpu,
        "onnxruntime": ort.__version__,
        "providers": ort.get_available_providers(),
        **found,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="also write the results as JSON")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run without a GPU")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    logging.basicConfig(level=logging.WARNING)
    env = environment()
    print("environment:", json.dumps(env), flush=True)
    checks = [
        cnn_tensorrt,
        cnn_onnxruntime,
        forced_cpu_runtime,
        export_and_load,
        generate_static,
        generate_dynamic,
    ]
    for run in checks:
        run()
    if args.json:
        Path(args.json).write_text(json.dumps({"environment": env, "checks": RESULTS}, indent=1))


if __name__ == "__main__":
    main()
