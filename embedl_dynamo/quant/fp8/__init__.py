"""FP8 (E4M3FN) for TensorRT: the INT8 placement cut to TensorRT's FP8 layers, and INT8's
calibrated quantizers turned into FP8 ones with the same ``amax``."""
