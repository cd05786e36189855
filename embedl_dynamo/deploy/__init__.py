"""Ahead-of-time deployment: :func:`export` (ONNX + verified sidecar), :func:`load` (run it again,
torch in, torch out), ONNX's backend API over ONNX Runtime, and latency measurement.
"""
