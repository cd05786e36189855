"""The on-disk artifact cache: content keys (:mod:`.keys`) and the atomic, locked store (:mod:`.store`).

Everything stored is data (ONNX files, engines, JSON); entries are found by content and rebuilt when corrupt.
"""
