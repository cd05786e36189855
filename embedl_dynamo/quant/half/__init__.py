"""FP16 / BF16 in the graph: matmul-class layers in half precision, the sensitive rest in FP32."""
