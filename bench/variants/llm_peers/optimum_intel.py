"""OpenVINO peer of the ``llm_decode`` suite: a decoder through optimum-intel, in its own venv.

The suite's decoder (:func:`bench.models.decoder.qwen2_0_5b`: random weights from
``Qwen2Config``, ``torch.manual_seed(0)``), written with ``save_pretrained``, is converted by
``OVModelForCausalLM.from_pretrained(dir, export=True, ...)`` (a stateful model: the KV cache
lives in OpenVINO variables). Variants (``--variants``):

* ``fp32``: float weights, ``INFERENCE_PRECISION_HINT=f32``;
* ``default``: float weights, no precision hint (OpenVINO's default: bf16 on a CPU with
  avx512_bf16);
* ``int8`` / ``int4``: NNCF weight compression through ``OVWeightQuantizationConfig``
  (``bits=8``; ``bits=4, group_size=128, ratio=1.0``, asymmetric, data-free), no precision
  hint; ``int8-f32`` / ``int4-f32`` add ``INFERENCE_PRECISION_HINT=f32``. NNCF keeps the
  embedding and the last linear (the tied output head) at 8 bits by default: each variant's
  line lists the weight-reading ops left at 8 bits, read from the converted model.

Every variant compiles with ``INFERENCE_NUM_THREADS=--threads`` (2). Each variant's
``weight_bytes`` (its roofline) is the bytes of the constants its matmuls read (packed codes,
scales and zero points); its info holds the compiled model's precision and KV cache precision
as OpenVINO reports them (the CPU plugin picks the KV cache precision itself: f16 under the f32
hint, u8 by default) and "convert s", the whole ``from_pretrained`` call.

This runs in its own environment, not the project's: optimum-intel 2.2 pins transformers < 5.6
and huggingface-hub < 1.22, below ``constraints.txt``; it does not import ``embedl_dynamo``.
``bash bench/peers_setup.sh optimum_intel`` makes that environment (``torch==2.13.0`` first,
so pip keeps the local CPU wheel; then ``optimum-intel[openvino,nncf]==2.2.0`` under
``constraints.txt`` less its transformers, tokenizers and huggingface_hub pins). The suite runs
it as ``<venv>/bin/python -m bench.variants.llm_peers.optimum_intel --serve --model-dir DIR``
(:mod:`.protocol`).
"""

from __future__ import annotations

import argparse
import gc
import warnings

import torch

from bench.harness.timer import timed_call
from bench.models.decoder import generate, prompt
from bench.models.zoo import import_model_libraries
from bench.variants.llm_peers.protocol import serve

__all__ = ["ServedVariant", "build_served", "main", "weight_report"]

# variant -> (weight bits or None for float, INFERENCE_PRECISION_HINT or None for the default)
VARIANTS = {
    "fp32": (None, "f32"),
    "default": (None, None),
    "int8": (8, None),
    "int4": (4, None),
    "int8-f32": (8, "f32"),
    "int4-f32": (4, "f32"),
}


def import_transformers():
    """Import transformers with the CPU torch (optimum-intel requires torchvision, whose only
    wheel here is a CUDA build that fails to import until its op schemas exist), quietly."""
    import_model_libraries()
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    return transformers


def convert(name: str, model_dir: str, threads: int):
    """(OVModelForCausalLM, seconds of the whole ``from_pretrained``) for one variant."""
    import_transformers()
    from optimum.intel import OVModelForCausalLM, OVWeightQuantizationConfig

    bits, hint = VARIANTS[name]
    ov_config = {"INFERENCE_NUM_THREADS": threads}
    if hint:
        ov_config["INFERENCE_PRECISION_HINT"] = hint
    if bits == 4:
        kw = {"quantization_config": OVWeightQuantizationConfig(bits=4, group_size=128, ratio=1.0)}
    elif bits == 8:
        kw = {"quantization_config": OVWeightQuantizationConfig(bits=8)}
    else:
        kw = {"load_in_8bit": False}  # never the size-based default compression
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return timed_call(
            OVModelForCausalLM.from_pretrained,
            model_dir,
            export=True,
            device="CPU",
            ov_config=ov_config,
            **kw,
        )


def weight_constants(node) -> list:
    """The constants behind one weight input: through the decompression chain (Convert,
    Subtract, Multiply, Reshape, Transpose) down to Constant nodes."""
    kind = node.get_type_name()
    if kind == "Constant":
        return [node]
    if kind not in {"Convert", "Subtract", "Multiply", "Reshape", "Transpose", "Unsqueeze"}:
        return []
    found = []
    for port in node.inputs():
        found += weight_constants(port.get_source_output().get_node())
    return found


def weight_report(model) -> dict:
    """What the converted model's weights are: bytes a decode step reads through the matmuls
    (each constant once), matmul count by weight type, and the weight-reading ops (matmuls
    and the embedding Gather) whose largest constant is 8-bit."""
    matmul_bytes, by_type, eight_bit, seen = 0, {}, [], set()
    for op in model.model.get_ordered_ops():
        kind = op.get_type_name()
        if kind not in {"MatMul", "Gather"}:
            continue
        port = 1 if kind == "MatMul" else 0
        constants = weight_constants(op.input_value(port).get_node())
        constants = [c for c in constants if c.get_byte_size() >= 4096]
        if not constants:
            continue
        largest = max(constants, key=lambda c: c.get_byte_size())
        element = largest.get_output_element_type(0).get_type_name()
        name = op.get_friendly_name().removeprefix("__module.").split("/")[0]
        if kind == "MatMul":
            by_type[element] = by_type.get(element, 0) + 1
            matmul_bytes += sum(c.get_byte_size() for c in constants if c.get_name() not in seen)
            seen.update(c.get_name() for c in constants)
        if largest.get_output_element_type(0).bitwidth == 8:
            eight_bit.append(f"{name} ({kind}, {element})")
    return {
        "matmul_weight_bytes": matmul_bytes,
        "matmuls_by_weight_type": by_type,
        "kept_8bit": eight_bit,
    }


def compiled_properties(model) -> dict:
    """The compiled model's precision, threads and KV cache precision, as OpenVINO reports."""
    compiled = model.request.get_compiled_model()
    names = ["INFERENCE_PRECISION_HINT", "INFERENCE_NUM_THREADS", "KV_CACHE_PRECISION"]
    properties = {}
    for name in names:
        try:
            value = compiled.get_property(name)
        except RuntimeError:
            value = "n/a"
        properties[name] = value.get_type_name() if hasattr(value, "get_type_name") else str(value)
    return properties


def build_variants(args, model_dir: str, ids) -> dict:
    """Convert each variant; return name -> (model, info) with its conversion seconds, first
    generate() seconds, compiled properties and weight report, each printed."""
    variants = {}
    for name in args.variants:
        model, seconds = convert(name, model_dir, args.threads)
        _, first = timed_call(generate, model, ids, 4)
        info = {
            "convert_s": seconds,
            "first_generate_s": first,
            "compiled": compiled_properties(model),
            **weight_report(model),
        }
        kept = info["kept_8bit"]
        listed = ", ".join(kept) if len(kept) <= 8 else f"{len(kept)} ops"
        print(
            f"{name}: converted in {seconds:.1f} s; {info['compiled']}; matmul weights "
            f"{info['matmuls_by_weight_type']}; 8-bit weights: {listed or 'none'}"
        )
        variants[name] = (model, info)
        gc.collect()
    return variants


class ServedVariant:
    """One converted model as :mod:`.protocol` times it (token ids in and out)."""

    def __init__(self, model) -> None:
        self.model = model

    def generate(self, prompt: list[int], tokens: int) -> list[int]:
        out = generate(self.model, torch.tensor([prompt]), tokens)
        return out[0, len(prompt) :].tolist()


def build_served(args) -> tuple[dict, dict]:
    """Each variant converted from ``--model-dir`` (the suite's saved model), with the weight
    bytes its matmuls read as ``weight_bytes`` (see :func:`weight_report`)."""
    torch.set_num_threads(args.threads)
    variants, info = {}, {}
    tool = ", ".join(f"{k} {v}" for k, v in versions().items())
    for name, (model, details) in build_variants(args, args.model_dir, prompt()).items():
        variants[name] = ServedVariant(model)
        info[name] = {
            **details,
            "weight_bytes": details["matmul_weight_bytes"],
            "build_s": details["convert_s"],
            "tool": tool,
        }
    return variants, info


def versions() -> dict:
    """The versions of the peer's stack."""
    from importlib.metadata import version

    packages = ["optimum-intel", "openvino", "nncf", "transformers", "torch"]
    return {name: version(name) for name in packages}


def main() -> None:
    """The peer: ``--serve --model-dir DIR`` (the only mode)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--serve", action="store_true", help="the protocol (the only mode)")
    parser.add_argument("--model-dir", required=True, help="the save_pretrained model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--variants", nargs="+", default=["fp32", "int8", "int4"], choices=list(VARIANTS)
    )
    args = parser.parse_args()
    import_transformers()
    serve(lambda: build_served(args))


if __name__ == "__main__":
    main()
