"""Maintenance tools that are not benchmarks: the docs' generated op conformance table
(``python -m tools.op_conformance_doc``) and the check run on a GPU machine
(``python -m tools.device_check``)."""

__all__: list[str] = []
