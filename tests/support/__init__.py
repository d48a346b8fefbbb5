"""Plain helper modules of the test suite, imported one way everywhere: ``from support.<module> import``.

pytest puts ``tests/`` on ``sys.path`` (the folder of the suite's conftest.py and test modules, which
is not a package), so this package is found by that name; fixtures live in ``tests/conftest.py``.
Code that the benchmarks share with the tests (corpus readers, oracles, fuzz generators) is in
``constrain.testing`` instead, since tests never import ``bench``.
"""
