"""llama.cpp peer of the ``llm_decode`` suite (runs in its own venv: ``bash bench/peers_setup.sh``).

The model is the one the suite saved with ``save_pretrained`` (random weights: no
tokenizer), written as an F32 GGUF by :func:`write_gguf` (architecture ``qwen2``, Hugging
Face's tensor layout, the q/k/v biases, the embedding tied as the output head,
``tokenizer.ggml.model`` "none") and quantized by llama.cpp's own
``llama_model_quantize`` (Q8_0, Q4_0; llama.cpp then stores the tied head as it chooses).
Variants (``--variants``):

* ``f32``: the F32 file, flash attention off and an F32 KV cache (it then computes what
  transformers' eager does, to ~3e-6);
* ``q8_0`` / ``q4_0``: the quantized files with llama.cpp's defaults for a CPU (flash
  attention, F16 KV cache).

Token ids go in and come out (greedy: the argmax of the last logits), so no tokenizer is
needed. Each variant's ``weight_bytes`` is the GGUF's tensor bytes (a decode step reads every
tensor once: the embedding is also the head). On a CPU with AMX, llama.cpp's AMX weight
buffer (quantized types only) crashes on batched prompts (ggml-org/llama.cpp#20824), so there
the quantized variants evaluate the prompt one token per micro-batch (``n_ubatch=1``;
``--ubatch`` overrides): decoding is unaffected, their time to first token is pessimistic.
"""

from __future__ import annotations

import argparse
import ctypes
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.harness.timer import stopwatch, timed_call
from bench.variants.llm_peers.protocol import serve

__all__ = ["LlamaCppVariant", "gguf_weight_bytes", "quantize", "write_gguf"]

VARIANTS = ("f32", "q8_0", "q4_0")

# Hugging Face Qwen2 name (after "model.layers.{i}.") -> GGUF name (after "blk.{i}.")
LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf_name: str) -> str:
    """The GGUF tensor name of a Hugging Face Qwen2 tensor name."""
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    index, _, rest = hf_name.removeprefix("model.layers.").partition(".")
    if not hf_name.startswith("model.layers.") or not index.isdigit() or rest not in LAYER_TENSORS:
        raise ValueError(f"no GGUF name for the Qwen2 tensor {hf_name!r}")
    return f"blk.{index}.{LAYER_TENSORS[rest]}"


def write_gguf(model_dir: str | Path, path: str | Path) -> None:
    """Write the ``save_pretrained`` Qwen2 model in ``model_dir`` as an F32 GGUF at ``path``."""
    import gguf
    from safetensors.numpy import load_file

    config = json.loads((Path(model_dir) / "config.json").read_text())
    if config.get("model_type") != "qwen2":
        raise ValueError(f"write_gguf writes Qwen2 only, not {config.get('model_type')!r}")
    rope = config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta")
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name("random Qwen2 (bench llm_decode)")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(float(rope or 10000.0))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("none")
    for shard in sorted(Path(model_dir).glob("*.safetensors")):
        for name, array in load_file(shard).items():
            if name == "lm_head.weight" and config.get("tie_word_embeddings"):
                continue  # tied: llama.cpp reads token_embd as the head
            writer.add_tensor(gguf_name(name), np.ascontiguousarray(array, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def quantize(source: str | Path, target: str | Path, variant: str, threads: int) -> None:
    """llama.cpp's ``llama_model_quantize`` of ``source`` to ``variant`` (q8_0 or q4_0)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = {
        "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
        "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
    }[variant]
    params.nthread = threads
    status = llama_cpp.llama_model_quantize(
        str(source).encode(), str(target).encode(), ctypes.byref(params)
    )
    if status != 0:
        raise RuntimeError(f"llama_model_quantize to {variant} failed ({status})")


def gguf_weight_bytes(path: str | Path) -> tuple[int, dict[str, int]]:
    """(bytes of every tensor in the GGUF, tensor count by type) as ``gguf.GGUFReader`` reads."""
    import gguf

    total, by_type = 0, {}
    for tensor in gguf.GGUFReader(str(path)).tensors:
        total += int(tensor.n_bytes)
        kind = tensor.tensor_type.name
        by_type[kind] = by_type.get(kind, 0) + 1
    return total, by_type


def has_amx() -> bool:
    try:
        return " amx_int8" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


class LlamaCppVariant:
    """One GGUF file in a ``llama_cpp.Llama`` context; greedy generation on token ids."""

    def __init__(self, path: Path, variant: str, args: argparse.Namespace) -> None:
        import llama_cpp

        exact = variant == "f32"
        kv_type = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32}
        self.vocab = args.vocab
        self.llm = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=args.context,
            n_batch=args.context,
            n_ubatch=args.ubatch or (1 if has_amx() and not exact else 512),
            n_threads=args.threads,
            n_threads_batch=args.threads,
            flash_attn=not exact,
            verbose=False,
            **(kv_type if exact else {}),
        )
        self.get_logits = llama_cpp.llama_get_logits_ith

    def next_token(self) -> int:
        logits = np.ctypeslib.as_array(self.get_logits(self.llm.ctx, -1), shape=(self.vocab,))
        return int(np.argmax(logits))

    def generate(self, prompt: Sequence[int], tokens: int) -> list[int]:
        self.llm.reset()  # n_tokens = 0: eval() drops the whole KV cache, no prefix reuse
        self.llm.eval(list(prompt))
        out = [self.next_token()]
        while len(out) < tokens:
            self.llm.eval(out[-1:])
            out.append(self.next_token())
        return out


def build(args: argparse.Namespace) -> tuple[dict, dict]:
    """Write, quantize and load each variant (timed), generate 4 tokens once each."""
    import llama_cpp

    directory = Path(args.work_dir)
    f32 = directory / "model-f32.gguf"
    _, written = timed_call(write_gguf, args.model_dir, f32)
    variants, info = {}, {}
    for name in args.variants:
        path = f32 if name == "f32" else directory / f"model-{name}.gguf"
        with stopwatch() as elapsed:
            if name != "f32":
                quantize(f32, path, name, args.threads)
            variant = LlamaCppVariant(path, name, args)
        prepared = elapsed() + (written if name == "f32" else 0.0)
        _, first = timed_call(variant.generate, args.warmup_prompt, 4)
        weight_bytes, by_type = gguf_weight_bytes(path)
        info[name] = {
            "weight_bytes": weight_bytes,
            "tensor_types": by_type,
            "build_s": prepared,
            "first_generate_s": first,
            "n_ubatch": variant.llm.context_params.n_ubatch,
            "tool": f"llama.cpp (llama-cpp-python {llama_cpp.__version__})",
        }
        print(
            f"{name}: {weight_bytes / 1e6:.0f} MB of tensors {by_type}, n_ubatch "
            f"{info[name]['n_ubatch']}, ready in {prepared:.1f} s"
        )
        variants[name] = variant
    return variants, info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--serve", action="store_true", help="the protocol (the only mode)")
    parser.add_argument("--model-dir", required=True, help="a save_pretrained Qwen2 model")
    parser.add_argument("--work-dir", required=True, help="where the GGUF files go")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=512, help="KV cache length (tokens)")
    parser.add_argument(
        "--ubatch", type=int, default=0, help="0: 1 for quantized files on AMX CPUs, else 512"
    )
    args = parser.parse_args()
    config = json.loads((Path(args.model_dir) / "config.json").read_text())
    args.vocab = config["vocab_size"]
    args.warmup_prompt = list(range(8))
    serve(lambda: build(args))


if __name__ == "__main__":
    main()
