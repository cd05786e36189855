"""The ONNX artifact: export of a transformed graph, its initializers, INT8 weights, its cache key."""
