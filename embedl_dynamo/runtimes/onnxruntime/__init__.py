"""The onnxruntime runtime."""
