"""thesis-companion: speculative decoding with a dense or FlashHead draft, reproducibly.

Modules, one idea each: ``models`` (specs, embedded pair, loading), ``heads`` (greedy token selection),
``state`` (one model's KV cache), ``drafters`` (propose/observe), ``decoding`` (the loops), ``profiling``
(phase clocks), ``prompts``, ``bench`` (benchmarks), ``tiny`` (tiny in-process models), ``cli``.
"""

__version__ = "0.1.0"
