"""What every kernel family shares; no family's own code lives here.

backend.py       which implementation a call takes (``set_backend``), Triton availability, the
                 device guard and SM count, the lazy import of a family's Triton module
checks.py        the list API's member checks, the ops' packed / column operand checks, tracing
                 detection, which tensors run on Triton, the kernels' int32 limits
layout.py        the packed and column operand layouts (``pack``, ``unpack``, conversions)
registration.py  ``define``: how every ``optimus::`` op is registered (schema, implementation,
                 fake, autograd)
launch.py        ``launch``: a compiled Triton kernel called directly after its first launch
tables.py        device-resident int64 tables: asynchronous, capture-safe upload, cache keyed by
                 what they encode
plans.py         the eager paths' per-signature plans, table fills and lean ``Function.apply``
params.py        parameters read in place where they lie concatenated (the ``*_params`` ops)
activation.py    the fusable activations: names, kernel codes, plain-torch forward and gradient
activation_jit.py  the same activations as Triton epilogues (``act_fwd``, ``act_bwd``)

A family imports from here (and torch, triton, numpy), never from another family.
"""
