"""Tools built on the library: the ``optimus`` command line (``cli``), the demo, the
differential fuzzer (``fuzz``), the benchmark harness and the kernel benchmarks (``bench``),
the model zoo (``models``), the measurement helpers, the rewriter-scale benchmark, the GPU
check of the Inductor-IR level and the dynamic-shapes report.

Nothing outside this folder imports them (``tests/test_architecture.py`` checks it), and the
compile-cache key hashes every module of the package but these (``compile.TOOLS_FOLDER``).
"""
