"""Benchmarks and compile checks of the Triton kernels (``optimus.kernels``), one command each.

grouped.py        GPU correctness check + benchmark of grouped_linear and batched_layer_norm
                  against loops of F.linear / F.layer_norm, torch.bmm and torch._grouped_mm
                  (``--dry-run``: the same script on CPU under the Triton interpreter)
overhead.py       host overhead per call (``--host``, CPU, launches stubbed; ``--baseline`` A/B
                  against another checkout), the G = 16 and uniform-shape targets, every route of
                  grouped_linear, and the measured routing table ``routes.json``
embedding_bag.py  GPU correctness check + benchmark of grouped_embedding_bag (``--aot``: compile
                  its kernels for sm_90 without a GPU)
aot_check.py      compile the grouped-linear and layer-norm kernels for sm_90 without a GPU
                  (registers, spills, wgmma)

Run as ``python -m optimus.tools.bench.kernels.<name> --help``. They read the kernels; nothing in
``optimus.kernels`` or the compiler imports them (they are not part of the compile-cache key).
"""
