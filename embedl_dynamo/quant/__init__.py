"""INT8 quantization: QDQ specs, observers, calibration (cached on disk), QDQ insertion, QAT."""
