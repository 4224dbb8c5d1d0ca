"""The activation epilogues of the Triton kernels: ``act_fwd`` and ``act_bwd`` on fp32 tiles.

``ACT`` is the code of :data:`~optimus.kernels.runtime.activation.ACTIVATIONS` (0 none, 1 relu,
2 gelu, 3 silu, 4 sigmoid, 5 tanh). Imported only by the families' Triton modules (``kernel.py``),
which are themselves imported on the first launch: the plain-torch paths never need Triton.
Only Triton builtins are called, so the interpreter runs them too.
"""

import triton
import triton.language as tl


@triton.jit
def act_fwd(z, ACT: tl.constexpr):
    if ACT == 1:  # relu
        z = tl.maximum(z, 0.0)
    elif ACT == 2:  # gelu (erf form, = F.gelu(approximate="none"))
        z = 0.5 * z * (1.0 + tl.math.erf(z * 0.7071067811865476))
    elif ACT == 3:  # silu
        z = z / (1.0 + tl.exp(-z))
    elif ACT == 4:  # sigmoid
        z = 1.0 / (1.0 + tl.exp(-z))
    elif ACT == 5:  # tanh
        # not 2 / (1 + exp(-2z)) - 1: the final "- 1" cancels near 0 (tanh(1e-5) came out 0, errors
        # of 1e4 ulps at |z| = 1e-3, 14 ulps at 0.3; torch's tanh is within 1-2 ulps).  Below
        # |z| = 0.4 the odd Taylor polynomial to z^13 (truncation < 4e-9 relative), above it
        # sign(z) (1 - e) / (1 + e) with e = exp(-2|z|) <= 0.45 (no cancellation): <= 3 ulps in fp32
        a = tl.abs(z)
        e = tl.exp(-2.0 * a)
        far = (1.0 - e) / (1.0 + e)
        far = tl.where(z < 0.0, -far, far)
        z2 = z * z
        near = 0.0035921280365724808 * z2 - 0.0088632355299021966
        near = near * z2 + 0.021869488536155203
        near = near * z2 - 0.053968253968253971
        near = near * z2 + 0.13333333333333333
        near = near * z2 - 0.33333333333333333
        near = z + z * (near * z2)
        z = tl.where(a < 0.4, near, far)
    return z


@triton.jit
def act_bwd(dy, aux, ACT: tl.constexpr):
    """dz from dy (fp32) and aux (fp32): aux is y for relu/sigmoid/tanh, z for gelu/silu."""
    if ACT == 1:
        dz = tl.where(aux > 0.0, dy, 0.0)
    elif ACT == 2:
        cdf = 0.5 * (1.0 + tl.math.erf(aux * 0.7071067811865476))
        pdf = tl.exp(-0.5 * aux * aux) * 0.3989422804014327
        dz = dy * (cdf + aux * pdf)
    elif ACT == 3:
        s = 1.0 / (1.0 + tl.exp(-aux))
        dz = dy * (s * (1.0 + aux * (1.0 - s)))
    elif ACT == 4:
        dz = dy * aux * (1.0 - aux)
    elif ACT == 5:
        dz = dy * (1.0 - aux * aux)
    else:
        dz = dy
    return dz
