"""Oracles, corpus readers and fuzz generators shared by ``tests/`` and ``bench/``.

Like ``numpy.testing`` or ``xgrammar.testing``: the library itself never imports this package.
It lives here, and not in ``bench/`` or ``tests/``, so that the test suite and the benchmark
scripts check constraints the same way without one importing the other.
"""
