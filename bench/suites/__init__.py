"""The suites: the benchmarks the docs' tables come from (``python -m bench list``).

``cpu_table`` (every precision of ours against the best CPU peer at it), ``transformers``
(encoders and GPT-2 against inductor, OpenVINO and NNCF), ``llm_decode`` (a decoder's ms per
token against llama.cpp, OpenVINO and the roofline), ``cold_start`` (a fresh process's first
output, cold, warm and read-only), ``serving`` (concurrent clients against ``load()`` and Ray
Serve) and ``coverage`` (how much of each model a CPU runtime computes). Each is a plug-in of
:mod:`bench.harness.plugins`.
"""

__all__: list[str] = []
