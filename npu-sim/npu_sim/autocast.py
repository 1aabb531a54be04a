"""``torch.autocast("npu", dtype=...)`` on the emulated device.

torch routes autocast for a PrivateUse1 device through the ``AutocastPrivateUse1`` key and registers no
kernels there (the device's extension does, as torch_npu does in C++).  The emulator registers a
fallthrough for every op and, for the ops below, Python kernels with torch's CUDA autocast policy: the
GEMM and convolution ops run in the autocast dtype, the numerically sensitive ones in float32.  Not
modelled: the cache of cast weights (each call casts again) and the policy's "promote" class.
"""

from __future__ import annotations

import functools

import torch

#: Ops that run in the autocast dtype (float16 / bfloat16).
LOWER_PRECISION = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "conv1d", "conv2d",
                   "conv3d", "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "prelu")
#: Ops that run in float32.
FLOAT32 = ("softmax.int", "log_softmax.int", "layer_norm", "group_norm", "cross_entropy_loss", "nll_loss",
           "mse_loss", "l1_loss", "smooth_l1_loss", "binary_cross_entropy_with_logits", "kl_div", "exp", "log",
           "log1p", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "rsqrt", "reciprocal", "logsumexp", "cumsum",
           "sum", "prod", "norm.Scalar", "norm.ScalarOpt_dim", "cosine_similarity")

_KEY = "AutocastPrivateUse1"


def _cast(value, dtype: torch.dtype):
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.device.type == "npu" and value.dtype != dtype:
            return value.to(dtype)
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(item, dtype) for item in value)
    return value


def _kernel(op, float32: bool):
    excluded = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, _KEY))

    def kernel(*args, **kwargs):
        dtype = torch.float32 if float32 else torch.get_autocast_dtype("npu")
        with torch._C._ExcludeDispatchKeyGuard(excluded):
            return op(*_cast(args, dtype), **_cast(kwargs, dtype))

    return kernel


@functools.cache
def install() -> tuple[torch.library.Library, ...]:
    """Register the fallthrough and the policy's kernels for ``AutocastPrivateUse1`` (once per process: the cache
    keeps the libraries, whose registrations live as long as they do)."""
    fallthrough = torch.library.Library("_", "IMPL")
    fallthrough.fallback(torch.library.fallthrough_kernel, _KEY)
    kernels = torch.library.Library("aten", "IMPL")
    for names, float32 in ((LOWER_PRECISION, False), (FLOAT32, True)):
        for name in names:
            packet, _, overload = name.partition(".")
            op = getattr(getattr(torch.ops.aten, packet), overload or "default")
            kernels.impl(name, _kernel(op, float32), _KEY)
    return fallthrough, kernels
