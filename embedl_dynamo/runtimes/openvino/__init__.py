"""The openvino runtime."""
