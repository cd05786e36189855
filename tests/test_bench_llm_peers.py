"""The llm_decode suite's peers (bench/variants/llm_peers): the GGUF that llama.cpp reads, the subprocess line protocol and
the variant names (the peers' own venvs are not needed: the protocol runs on this Python)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from bench.variants import llm_peers
from bench.variants.llm_peers import Peer, PeerDied, PeerSpec, split_variants

CONFIG = {
    "model_type": "qwen2",
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_theta": 5000.0},
    "max_position_embeddings": 64,
    "vocab_size": 40,
    "tie_word_embeddings": True,
}


def qwen2_tensors() -> dict[str, np.ndarray]:
    """A 2-layer Qwen2 state dict as save_pretrained writes it (tied head left out)."""
    rng = np.random.default_rng(0)
    hidden, inter, kv = 32, 48, 2 * 32 // 4
    shapes = {"model.embed_tokens.weight": (40, hidden), "model.norm.weight": (hidden,)}
    for i in range(2):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (hidden, hidden),
            p + "self_attn.q_proj.bias": (hidden,),
            p + "self_attn.k_proj.weight": (kv, hidden),
            p + "self_attn.k_proj.bias": (kv,),
            p + "self_attn.v_proj.weight": (kv, hidden),
            p + "self_attn.v_proj.bias": (kv,),
            p + "self_attn.o_proj.weight": (hidden, hidden),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
        }
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def test_gguf_holds_every_tensor_under_llama_cpp_names(tmp_path):
    gguf = pytest.importorskip("gguf")
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    from bench.variants.llm_peers.llama_cpp import gguf_name, write_gguf

    tensors = qwen2_tensors()
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    safetensors_numpy.save_file(tensors, str(tmp_path / "model.safetensors"))
    write_gguf(tmp_path, tmp_path / "m.gguf")
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    read = {t.name: t for t in reader.tensors}
    assert set(read) == {gguf_name(k) for k in tensors}
    assert "output.weight" not in read  # tied: llama.cpp takes token_embd as the head
    assert read["blk.1.attn_k.bias"].data.shape == (16,)  # 2 kv heads of 8
    for name, array in tensors.items():
        got = read[gguf_name(name)]
        assert list(got.shape) == list(reversed(array.shape))  # ggml's ne order
        np.testing.assert_array_equal(np.asarray(got.data).reshape(array.shape), array)

    def field(key):
        value = reader.fields[key]
        return value.contents() if hasattr(value, "contents") else value.parts[-1][0]

    assert field("general.architecture") == "qwen2"
    assert field("tokenizer.ggml.model") == "none"
    assert field("qwen2.attention.head_count_kv") == 2
    assert field("qwen2.rope.freq_base") == 5000.0
    assert field("qwen2.vocab_size") == 40


def test_gguf_name_refuses_an_unknown_tensor():
    from bench.variants.llm_peers.llama_cpp import gguf_name

    with pytest.raises(ValueError, match="self_attn.rotary"):
        gguf_name("model.layers.0.self_attn.rotary.inv_freq")


FAKE_PEER = """
import sys
from bench.variants.llm_peers.protocol import serve

class Echo:
    def generate(self, prompt, tokens):
        print("noise on stdout")  # must not reach the protocol
        return [prompt[-1] + i for i in range(tokens)]

serve(lambda: ({"a": Echo(), "b": Echo()}, {"a": {"weight_bytes": 1}, "b": {"weight_bytes": 2}}))
"""


def test_peer_protocol_times_and_generates_through_a_subprocess():
    peer = Peer(PeerSpec("fake", "none", "none", ("a", "b")), [sys.executable, "-c", FAKE_PEER])
    try:
        assert peer.info == {"fake-a": {"weight_bytes": 1}, "fake-b": {"weight_bytes": 2}}
        times = peer.time_round(1, [5, 6, 7], [1, 3])
        assert set(times) == {(v, n) for v in ("fake-a", "fake-b") for n in (1, 3)}
        assert all(seconds >= 0 for seconds in times.values())
        assert peer.generate([5, 6, 7], 3) == {"fake-a": [7, 8, 9], "fake-b": [7, 8, 9]}
    finally:
        peer.close()
    assert peer.process.returncode == 0


def test_a_dead_peer_raises_peer_died():
    with pytest.raises(PeerDied, match="status 3"):
        Peer(PeerSpec("fake", "none", "none", ()), [sys.executable, "-c", "exit(3)"])


def test_split_variants_and_missing_venv(tmp_path, monkeypatch, capsys):
    ours, wanted = split_variants(["eager", "llama.cpp-q4_0", "openvino-int8", "ours-fp32"])
    assert ours == ["eager", "ours-fp32"]
    assert {spec.name: v for spec, v in wanted.items()} == {
        "llama.cpp": ["q4_0"],
        "openvino": ["int8"],
    }
    with pytest.raises(ValueError, match=r"it has: f32, q8_0, q4_0"):
        split_variants(["llama.cpp-q5_k"])
    monkeypatch.setenv("EMBEDL_BENCH_PEERS", str(tmp_path))
    assert llm_peers.start_peers(wanted, "model", "work", 2, 128) == []
    printed = capsys.readouterr().out
    assert "bash bench/peers_setup.sh llama_cpp" in printed
    assert "bash bench/peers_setup.sh optimum_intel" in printed
