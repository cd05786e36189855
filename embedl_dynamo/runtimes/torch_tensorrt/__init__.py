"""The torch_tensorrt runtime."""
