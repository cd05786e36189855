"""One-off investigations on the suites' runner, timer and record (``python -m bench list``).

Each answers one question a suite raised (where a decode step's time goes, what a guard costs,
how a runtime's kernels stream weights, where two tools put Q/DQ) and is run as ``python -m
bench run <probe>``; :mod:`.qdq_placement` is the ``modelopt_agreement`` probe's analysis.
"""

__all__: list[str] = []
