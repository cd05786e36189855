"""The tensorrt runtime."""
