"""optimus.torch_api's TF32 helpers read and set torch's flag through either API: once TF32 is set
through ``fp32_precision`` (torch >= 2.9), reading the legacy ``allow_tf32`` raises, and the
planner's cost model and the bench's accuracy check must not. Run in a subprocess: the flags
are global to the process."""

import subprocess
import sys
import textwrap


def test_tf32_helpers_work_after_the_new_api_set_tf32():
    code = textwrap.dedent(
        """
        import torch
        from optimus import torch_api
        from optimus.tools.bench.accuracy import tf32_mode
        from optimus.planner.costmodel import dtype_class
        m = torch.backends.cuda.matmul
        assert torch_api.cuda_matmul_allows_tf32() is False and dtype_class(torch.float32) == "fp32"
        if hasattr(torch.backends, "fp32_precision"):
            torch.backends.fp32_precision = "tf32"   # the new, global API
            assert torch_api.cuda_matmul_allows_tf32() is True
            assert dtype_class(torch.float32) == "tf32"
            with tf32_mode(False):
                assert torch_api.cuda_matmul_allows_tf32() is False
            assert torch_api.cuda_matmul_allows_tf32() is True
            m.fp32_precision = "ieee"
            assert torch_api.cuda_matmul_allows_tf32() is False
            with torch_api.tf32(True):
                assert torch_api.cuda_matmul_allows_tf32() is True
            assert m.fp32_precision == "ieee"
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
