"""Tools built on the library: the demo, the rewriter-scale benchmark, the GPU check of the
Inductor-IR level and the differential fuzzer.

Nothing in the library imports them (``tests/test_architecture.py`` checks it; only the
``optimus`` command line reaches in), and the compile-cache key does not hash them.
"""
