"""The npu device in one process: tensors, views and in-place ops, storages, printing and pickling, the
GEMM's shape-dependent rounding, the autograd device thread, autocast, random numbers, streams and events.

Each test body runs in a fresh child process with the emulator active (npu_sim.testing.in_npu_process).
"""

from __future__ import annotations

from npu_sim.testing import in_npu_process


def _basics():
    import pickle

    import torch

    import npu_sim

    npu_sim.activate()  # a second activation changes nothing
    cpu = torch.arange(6.0).reshape(2, 3)
    x = cpu.to("npu")
    factory = torch.zeros(2, 3, device="npu")
    facts = {
        "from data": (str(torch.tensor([[0.0, 1, 2], [3, 4, 5]], device="npu").device),
                      torch.equal(torch.tensor([[0.0, 1, 2], [3, 4, 5]], device="npu").cpu(), cpu)),
        "device": str(x.device),
        "factory": str(factory.device),
        "cpu back": x.cpu().device.type == "cpu" and torch.equal(x.cpu(), cpu),
        "to cpu": x.to("cpu").device.type,
        "item": x.sum().item(),
        "repr": repr(x),
        "result on npu": str((x * 2 + 1).device),
        "parameter": isinstance(torch.nn.Parameter(x), torch.nn.Parameter),
        "parameter device": str(torch.nn.Parameter(x).device),
    }
    try:
        x.numpy()
        facts["numpy"] = "converted"
    except TypeError as error:
        facts["numpy"] = str(error)
    loaded = pickle.loads(pickle.dumps(x))
    facts["pickled"] = (str(loaded.device), torch.equal(loaded.cpu(), cpu))
    return facts


def test_tensors_live_on_npu_and_leave_it_only_by_copy():
    facts = in_npu_process(_basics)
    assert facts["device"] == facts["factory"] == facts["result on npu"] == "npu:0"
    assert facts["from data"] == ("npu:0", True)
    assert facts["cpu back"] and facts["to cpu"] == "cpu"
    assert facts["item"] == 15.0
    assert facts["repr"].startswith("tensor([[0., 1., 2.],") and facts["repr"].endswith("device='npu:0')")
    assert facts["parameter"] and facts["parameter device"] == "npu:0"
    assert facts["numpy"].startswith("can't convert npu:0 device type tensor to numpy")
    assert facts["pickled"] == ("npu:0", True)


def _tensors_from_data_under_a_dispatch_mode():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passes():
        made = torch.tensor([[0.0, 1.5], [2.0, 3.0]], dtype=torch.float32, device="npu")
        strided = torch.tensor([1, 2, 3], device="npu")
    return str(made.device), made.cpu().tolist(), strided.cpu().tolist()


def test_tensors_from_data_under_a_dispatch_mode():
    """torch.tensor(..., device="npu") under a TorchDispatchMode (a profiler's, a probe's) allocates and copies as on
    any device (the allocation went to a Python fallback torch cannot run under a mode: "func != nullptr")."""
    assert in_npu_process(_tensors_from_data_under_a_dispatch_mode) == ("npu:0", [[0.0, 1.5], [2.0, 3.0]], [1, 2, 3])


def _mixing_devices():
    import torch

    x = torch.ones(3, device="npu")
    outcomes = {}
    for name, attempt in {
        "add": lambda: x + torch.ones(3),
        "matmul": lambda: torch.ones(2, 3, device="npu") @ torch.ones(3, 2),
        "cat": lambda: torch.cat([x, torch.ones(3)]),
        "cpu scalar": lambda: x + torch.tensor(2.0),
        "cpu indices": lambda: x[torch.tensor([0, 2])],
        "copy from cpu": lambda: x.copy_(torch.zeros(3)),
    }.items():
        try:
            outcomes[name] = str(attempt().device)
        except RuntimeError as error:
            outcomes[name] = str(error)
    return outcomes


def test_an_op_refuses_a_cpu_tensor_beside_npu_ones():
    outcomes = in_npu_process(_mixing_devices)
    refusal = "Expected all tensors to be on the same device, but found at least two devices, npu:0 and cpu!"
    assert outcomes["add"] == outcomes["matmul"] == outcomes["cat"] == refusal
    assert outcomes["cpu scalar"] == outcomes["cpu indices"] == outcomes["copy from cpu"] == "npu:0"


def _aliasing():
    import torch

    base = torch.arange(12.0, device="npu").reshape(3, 4)
    view = base[1:, ::2]
    view.mul_(-1)  # through a strided view, into the base
    added = base.add_(100)
    out = torch.empty(0, device="npu")
    returned = torch.mm(torch.ones(2, 3, device="npu"), torch.ones(3, 5, device="npu"), out=out)
    transposed = torch.ones(2, 3, device="npu")
    transposed.t_()
    clone = base.clone()
    return {
        "base": base.cpu().tolist(),
        "in-place returns its argument": added is base,
        "out returns out": returned is out,
        "out resized": (list(out.shape), out.cpu().sum().item()),
        "t_ metadata": (list(transposed.shape), list(transposed.stride())),
        "view shares storage": view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr(),
        "view data_ptr": (view.data_ptr() - base.data_ptr()) // base.element_size() == view.storage_offset(),
        "view offset": view.storage_offset(),
        "clone has its own": clone.untyped_storage().data_ptr() != base.untyped_storage().data_ptr(),
    }


def test_views_write_through_and_in_place_ops_return_their_argument():
    facts = in_npu_process(_aliasing)
    assert facts["base"] == [[100, 101, 102, 103], [96, 105, 94, 107], [92, 109, 90, 111]]
    assert facts["in-place returns its argument"] and facts["out returns out"]
    assert facts["out resized"] == ([2, 5], 30.0)
    assert facts["t_ metadata"] == ([3, 2], [1, 3])


def test_storages_answer_for_the_device_data():
    facts = in_npu_process(_aliasing)
    assert facts["view shares storage"] and facts["view data_ptr"] and facts["view offset"] == 4
    assert facts["clone has its own"]


def _device_thread():
    import threading

    import torch

    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            thread = threading.current_thread()
            seen.append((threading.get_ident(), thread.name))
            return grad * 2

    x = torch.randn(4, 3, device="npu", requires_grad=True)
    for _ in range(2):
        Probe.apply(x).sum().backward()
    return seen, (threading.get_ident(), threading.current_thread().name)


def test_backward_runs_on_one_long_lived_device_thread():
    (first, second), caller = in_npu_process(_device_thread)
    assert first == second, "both backwards run on the same thread"
    assert first[0] != caller[0], "not on the caller's thread"


def _gemm_rows(m_small, m_large, k, n):
    import torch

    from npu_sim import gemm

    generator = torch.Generator().manual_seed(3)
    x = (torch.randn(m_large, k, generator=generator) * 4).to(torch.float16)
    w = torch.randn(k, n, generator=generator).to(torch.float16)
    small = (x[:m_small].npu() @ w.npu()).cpu()
    large = (x.npu() @ w.npu()).cpu()[:m_small]

    def documented(rows, splits):
        step = -(-k // splits)
        total = sum(rows[:, s:s + step].float() @ w[s:s + step].float() for s in range(0, k, step))
        return total.to(torch.float16)

    return {
        "splits": (gemm.k_splits(m_small, n, k), gemm.k_splits(m_large, n, k)),
        "small is the documented rule": torch.equal(small, documented(x[:m_small], gemm.k_splits(m_small, n, k))),
        "large is the documented rule": torch.equal(large, documented(x[:m_small], gemm.k_splits(m_large, n, k))),
        "rows differ": not torch.equal(small, large),
    }


def test_gemm_rounding_depends_on_how_many_rows_it_was_given():
    facts = in_npu_process(_gemm_rows, 8, 2560, 1024, 128)
    assert facts["splits"] == (4, 1)
    assert facts["small is the documented rule"] and facts["large is the documented rule"]
    assert facts["rows differ"], "the same rows round differently in a GEMM of 8 rows and of 2560"


def _autocast():
    import torch

    a, b = torch.randn(4, 8, device="npu"), torch.randn(8, 4, device="npu")
    with torch.autocast("npu", dtype=torch.bfloat16):
        product = a @ b
        linear = torch.nn.functional.linear(a, b.t())
        soft = torch.softmax(product, dim=-1)
        summed = a + a
    return [str(t.dtype) for t in (product, linear, soft, summed)]


def test_autocast_by_device_type():
    assert in_npu_process(_autocast) == ["torch.bfloat16", "torch.bfloat16", "torch.float32", "torch.float32"]


def _random_numbers():
    import torch

    torch.manual_seed(1)
    cpu_before = torch.rand(3)
    torch.manual_seed(1)
    torch.npu.manual_seed(7)
    first = torch.randn(5, device="npu").cpu()
    dropped = torch.nn.functional.dropout(torch.ones(64, device="npu"), 0.5).cpu()
    torch.npu.manual_seed(7)
    again = torch.randn(5, device="npu").cpu()
    dropped_again = torch.nn.functional.dropout(torch.ones(64, device="npu"), 0.5).cpu()
    cpu_after = torch.rand(3)
    return torch.equal(first, again), torch.equal(dropped, dropped_again), torch.equal(cpu_before, cpu_after)


def test_device_random_numbers_come_from_the_device_generator():
    same_draws, same_masks, cpu_untouched = in_npu_process(_random_numbers)
    assert same_draws and same_masks, "torch.npu.manual_seed makes device draws repeat"
    assert cpu_untouched, "device draws do not consume the CPU generator"


def _streams_and_events():
    import time

    import torch

    default = torch.npu.current_stream()
    side = torch.npu.Stream()
    with torch.npu.stream(side):
        inside = torch.npu.current_stream()
    start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
    start.record()
    time.sleep(0.05)
    end.record()
    side.wait_stream(default)
    try:
        torch.npu.Event().elapsed_time(torch.npu.Event())
        untimed = "no error"
    except RuntimeError as error:
        untimed = str(error)
    return {
        "inside": inside == side,
        "after": torch.npu.current_stream() == default,
        "default": default == torch.npu.default_stream(),
        "distinct": side != default,
        "elapsed": start.elapsed_time(end),
        "query": (side.query(), end.query()),
        "untimed": untimed,
    }


def test_streams_are_bookkeeping_and_events_time_the_host():
    facts = in_npu_process(_streams_and_events)
    assert facts["inside"] and facts["after"] and facts["default"] and facts["distinct"]
    assert 40 <= facts["elapsed"] < 5000
    assert facts["query"] == (True, True)
    assert "enable_timing=True" in facts["untimed"]
