"""INT8: the calibrated Q/DQ pipeline (specs, placement rules, the per-target quantizer,
SmoothQuant, observers, calibration and its on-disk cache, fake-quant insertion), its stage,
QAT, lazy calibration on a compiled model's first calls, and Torch-TensorRT's QDQ form.

``fp8`` and ``mixed`` calibrate through the same pipeline (:func:`.stage.calibrate_graph`).
"""
