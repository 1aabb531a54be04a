"""The hccl backend: lazy communicators, one process per card, asynchronous collectives, arrival-order
reductions and HCCL_DETERMINISTIC, the collectives' results, and what HCCL refuses."""

from __future__ import annotations

import pytest

from npu_sim.testing import ChildFailed, run_ranks


def _backend():
    import torch
    import torch.distributed as dist

    return dist.group.WORLD._get_backend(torch.device("npu"))


# --------------------------------------------------------------------------- communicators


def _lazy(rank, world):
    import time

    import torch
    import torch.distributed as dist

    from npu_sim import cards

    backend = _backend()
    before = (cards.held(), backend.get_hccl_comm_name(rank, init_comm=False))
    started = time.monotonic()
    dist.all_reduce(torch.ones(1, device="npu"))
    first = time.monotonic() - started
    started = time.monotonic()
    dist.all_reduce(torch.ones(1, device="npu"))
    second = time.monotonic() - started
    return before, cards.held(), backend.get_hccl_comm_name(rank), first, second


def test_the_communicator_is_created_at_the_first_collective(tmp_path):
    results = run_ranks(_lazy, 2, tmp_path, env={"NPU_SIM_HCCL_SETUP_DELAY": "1.0"})
    for rank, (before, held, _, first, second) in enumerate(results):
        assert before == ({}, ""), "init_process_group creates no communicator and holds no card"
        assert held == {rank: 1}, "the first collective holds this rank's card"
        assert first >= 1.0 > second, "the set-up delay is spent at the first collective, once"
    assert results[0][2] == results[1][2] and results[0][2].startswith("npusim_")


def _get_name_creates(rank, world):
    from npu_sim import cards

    return _backend().get_hccl_comm_name(rank), cards.held()


def test_asking_for_the_name_creates_the_communicator(tmp_path):
    (name0, held0), (name1, held1) = run_ranks(_get_name_creates, 2, tmp_path)
    assert name0 == name1 and held0 == {0: 1} and held1 == {1: 1}


def _two_jobs_one_card(rank, world):
    import torch
    import torch.distributed as dist

    from npu_sim import cards

    own = [dist.new_group([0]), dist.new_group([1])][rank]  # two one-rank jobs, both on card 0
    coordination = dist.new_group(backend="gloo")
    outcome = {}
    if rank == 0:
        dist.all_reduce(torch.ones(1, device="npu"), group=own)
        outcome["held"] = cards.held()
    dist.barrier(group=coordination)
    if rank == 1:
        try:
            dist.all_reduce(torch.ones(1, device="npu"), group=own)
            outcome["while held"] = "created"
        except RuntimeError as error:
            outcome["while held"] = str(error)
    dist.barrier(group=coordination)
    if rank == 0:
        dist.destroy_process_group(own)
        outcome["after destroy"] = cards.held()
    dist.barrier(group=coordination)
    if rank == 1:
        value = torch.ones(1, device="npu")
        dist.all_reduce(value, group=own)
        outcome["after release"] = (value.item(), cards.held())
    return outcome


def test_a_second_process_on_a_held_card_fails_with_ej0003_until_it_is_released(tmp_path):
    first, second = run_ranks(_two_jobs_one_card, 2, tmp_path, env={"ASCEND_RT_VISIBLE_DEVICES": "0"})
    assert first == {"held": {0: 1}, "after destroy": {}}
    assert "EJ0003" in second["while held"] and "Failed to bind the IP port" in second["while held"]
    assert second["after release"] == (1.0, {0: 1})


def _same_card_one_group(rank, world):
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(1, device="npu"))


def test_every_rank_of_a_group_fails_rather_than_hangs(tmp_path):
    with pytest.raises(ChildFailed) as failed:
        run_ranks(_same_card_one_group, 2, tmp_path, env={"ASCEND_RT_VISIBLE_DEVICES": "0"}, timeout=30)
    message = str(failed.value)
    assert "EJ0003" in message and "could not bind its card" in message


# --------------------------------------------------------------------------- asynchronous collectives


def _asynchronous(rank, world):
    import torch
    import torch.distributed as dist

    facts = {}
    value = torch.full((3,), float(rank + 1), device="npu")
    work = dist.all_reduce(value, async_op=True)
    torch.npu.current_stream().synchronize()  # the compute stream never waited for HCCL's
    facts["before wait"] = value.cpu().tolist()
    work.wait()
    facts["after wait"] = value.cpu().tolist()

    value = torch.full((3,), float(rank + 1), device="npu")
    future = dist.all_reduce(value, async_op=True).get_future()
    facts["future"] = (future.done(), [t.cpu().tolist() for t in future.value()], value.cpu().tolist())

    gathered = torch.zeros(world, device="npu")
    work = dist.all_gather_into_tensor(gathered, torch.full((1,), float(rank), device="npu"), async_op=True)
    facts["gather before"] = gathered.cpu().tolist()
    torch.npu.synchronize()
    facts["gather after synchronize"] = (gathered.cpu().tolist(), work.is_completed())
    return facts


def test_a_collective_result_appears_when_it_is_waited_for(tmp_path):
    for rank, facts in enumerate(run_ranks(_asynchronous, 2, tmp_path)):
        assert facts["before wait"] == [rank + 1.0] * 3
        assert facts["after wait"] == [3.0] * 3
        assert facts["future"] == (True, [[3.0] * 3], [3.0] * 3), "the future is complete, its value the result"
        assert facts["gather before"] == [0.0, 0.0]
        assert facts["gather after synchronize"] == ([0.0, 1.0], True)


def _wrapped_work(rank, world):
    import torch
    import torch.distributed as dist

    seen = []
    originals = {name: getattr(dist.Work, name) for name in ("wait", "synchronize", "get_future", "is_completed")}

    def wrapper(name):
        def wrapped(self, *args, **kwargs):
            # torch answers is_completed for a Python Work's C++ base: its own answer is the override's
            own = type(self).is_completed if name == "is_completed" else originals[name]
            result = own(self, *args, **kwargs)
            seen.append((name, type(self).__name__, result if name == "is_completed" else None))
            return result

        return wrapped

    for name in originals:
        setattr(dist.Work, name, wrapper(name))
    try:
        value = torch.ones(2, device="npu")
        dist.all_reduce(value, async_op=True).wait()
        dist.all_reduce(value, async_op=True).synchronize()
        future = dist.all_reduce(value, async_op=True).get_future()
        polled = dist.all_reduce(value, async_op=True)
        while not polled.is_completed():
            pass
        seen = [entry for i, entry in enumerate(seen) if entry[0] != "is_completed" or i == len(seen) - 1]
        outcome = (seen, value.cpu().tolist(), [t.cpu().tolist() for t in future.value()])
    finally:
        for name, original in originals.items():
            setattr(dist.Work, name, original)
    return outcome


def test_wrappers_on_dist_work_see_every_wait(tmp_path):
    """A hardware Work is torch's own dist.Work: what a probe wraps there sees its waits, as on a device."""
    for seen, value, future in run_ranks(_wrapped_work, 2, tmp_path):
        assert [(name, answer) for name, _, answer in seen] == [
            ("wait", None), ("synchronize", None), ("get_future", None), ("is_completed", True)]
        assert value == [16.0, 16.0] and future == [value]  # the future holds the outputs: the value tensor


# --------------------------------------------------------------------------- reduction order


SPREAD = [[1e8, 3.0, -1e8], [1.0, 1e-3, 7.5], [-1e8, 1e8, 1.0]]  # exponents far apart: the sum's bits
FORWARD, STRAGGLER = (0, 1, 2), (2, 0, 1)  # the order in which the ranks reach the all-reduce


def _in_turn(rank, world, orders):
    """One all-reduce per order, the ranks arriving in that order; the bits every rank holds after each."""
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    store = c10d._get_default_store()
    _backend().get_hccl_comm_name(rank)  # the communicator first: creating it is collective, as HCCL's is
    results = []
    for round_, order in enumerate(orders):
        value = torch.tensor(SPREAD[rank], dtype=torch.float32).repeat(4).npu()
        position = order.index(rank)
        if position:
            store.wait([f"arrived-{round_}-{order[position - 1]}"])
        work = dist.all_reduce(value, async_op=True)
        store.set(f"arrived-{round_}-{rank}", "1")
        work.wait()
        results.append(value.cpu().view(torch.int32).tolist())
    return results


def _left_fold(order):
    import torch

    total = torch.tensor(SPREAD[order[0]], dtype=torch.float32)
    for rank in order[1:]:
        total += torch.tensor(SPREAD[rank], dtype=torch.float32)
    return total.repeat(4).view(torch.int32).tolist()


def test_reductions_sum_in_the_order_the_ranks_arrived(tmp_path):
    for forward, straggler in run_ranks(_in_turn, 3, tmp_path, (FORWARD, STRAGGLER)):
        assert forward == _left_fold(FORWARD), "every rank holds the arrival-order sum"
        assert straggler == _left_fold(STRAGGLER)
        assert forward != straggler, "a straggler changes the bits"


@pytest.mark.parametrize("setting", ["true", "strict"])
def test_hccl_deterministic_sums_in_rank_order(tmp_path, setting):
    for forward, straggler in run_ranks(_in_turn, 3, tmp_path, (FORWARD, STRAGGLER),
                                        env={"HCCL_DETERMINISTIC": setting}):
        assert forward == straggler == _left_fold((0, 1, 2))


def test_hccl_deterministic_takes_only_its_values(tmp_path):
    with pytest.raises(ChildFailed, match="HCCL_DETERMINISTIC='yes': HCCL takes false, true, strict"):
        run_ranks(_in_turn, 2, tmp_path, ((0, 1),), env={"HCCL_DETERMINISTIC": "yes"})


# --------------------------------------------------------------------------- what each collective gives


def _every_collective(rank, world):
    import torch
    import torch.distributed as dist

    def npu(values):
        return torch.tensor(values, dtype=torch.float32, device="npu")

    out = {}
    listed = [torch.zeros(2, device="npu") for _ in range(world)]
    dist.all_gather(listed, npu([rank, rank + 10]))
    out["all_gather"] = [t.cpu().tolist() for t in listed]
    scattered = torch.zeros(2, device="npu")
    dist.reduce_scatter_tensor(scattered, npu([1.0 * rank, 2, 3, 4 + rank]))
    out["reduce_scatter_tensor"] = scattered.cpu().tolist()
    dist.reduce_scatter(scattered, [npu([rank, 1]), npu([2, rank])])
    out["reduce_scatter"] = scattered.cpu().tolist()
    exchanged = torch.zeros(4, device="npu")
    dist.all_to_all_single(exchanged, npu([10 * rank, 10 * rank + 1, 10 * rank + 2, 10 * rank + 3]))
    out["all_to_all_single"] = exchanged.cpu().tolist()
    # Rank 0 sends 1 element to itself and 2 to rank 1; rank 1 sends 2 to rank 0 and none to itself.
    sends, receives = ([1, 2], [1, 2]) if rank == 0 else ([2, 0], [2, 0])
    uneven = torch.zeros(sum(receives), device="npu")
    dist.all_to_all_single(uneven, npu([100.0 * rank + i for i in range(sum(sends))]),
                           output_split_sizes=receives, input_split_sizes=sends)
    out["all_to_all_uneven"] = uneven.cpu().tolist()
    outs = [torch.zeros(1, device="npu") for _ in range(world)]
    dist.all_to_all(outs, [npu([10 * rank + peer]) for peer in range(world)])
    out["all_to_all"] = [t.item() for t in outs]
    value = npu([rank + 1.0])
    dist.broadcast(value, src=1)
    out["broadcast"] = value.item()
    value = npu([rank + 1.0])
    dist.reduce(value, dst=0, op=dist.ReduceOp.MAX)
    out["reduce"] = value.item()
    gathered = [torch.zeros(1, device="npu") for _ in range(world)] if rank == 0 else None
    dist.gather(npu([rank + 5.0]), gathered, dst=0)
    out["gather"] = [t.item() for t in gathered] if gathered else None
    received = torch.zeros(1, device="npu")
    dist.scatter(received, [npu([7.0]), npu([8.0])] if rank == 0 else None, src=0)
    out["scatter"] = received.item()
    if rank == 0:
        dist.send(npu([42.0]), dst=1)
        out["p2p"] = None
    else:
        incoming = torch.zeros(1, device="npu")
        dist.recv(incoming, src=0)
        out["p2p"] = incoming.item()
    value = npu([2.0 + rank])
    dist.all_reduce(value, op=dist.ReduceOp.AVG)
    out["avg"] = value.item()
    flag = torch.tensor([rank == 1], device="npu")
    dist.all_reduce(flag)
    out["bool sum"] = flag.item()
    objects = [None, None]
    dist.all_gather_object(objects, {"rank": rank})
    out["objects"] = objects
    # Batched calls: torch routes them to the coalesced c10d ops.
    summed = [npu([rank + 1.0]), npu([10.0])]
    gathered, reduced = torch.zeros(4, device="npu"), torch.zeros(1, device="npu")
    with dist._coalescing_manager(async_ops=True) as manager:
        for value in summed:
            dist.all_reduce(value)
    manager.wait()
    with dist._coalescing_manager(async_ops=True) as manager:
        dist.all_gather_into_tensor(gathered[:2], npu([rank]))
        dist.all_gather_into_tensor(gathered[2:], npu([5 * rank]))
    manager.wait()
    with dist._coalescing_manager(async_ops=True) as manager:
        dist.reduce_scatter_tensor(reduced, npu([1.0, 2.0 + rank]))
    manager.wait()
    out["coalesced"] = ([t.item() for t in summed], gathered.cpu().tolist(), reduced.item())
    dist.barrier()
    return out


def test_every_collective_gives_its_result(tmp_path):
    zero, one = run_ranks(_every_collective, 2, tmp_path)
    for rank, out in enumerate((zero, one)):
        assert out["all_gather"] == [[0, 10], [1, 11]]
        assert out["all_to_all"] == [0.0 + rank, 10.0 + rank]
        assert out["broadcast"] == 2.0
        assert out["scatter"] == 7.0 + rank
        assert out["avg"] == 2.5
        assert out["bool sum"] is True
        assert out["objects"] == [{"rank": 0}, {"rank": 1}]
        assert out["coalesced"][:2] == ([3.0, 20.0], [0.0, 1.0, 0.0, 5.0])
    assert zero["reduce_scatter_tensor"] == [1.0, 4.0] and one["reduce_scatter_tensor"] == [6.0, 9.0]
    assert zero["reduce_scatter"] == [1.0, 2.0] and one["reduce_scatter"] == [4.0, 1.0]
    assert zero["all_to_all_single"] == [0.0, 1.0, 10.0, 11.0] and one["all_to_all_single"] == [2.0, 3.0, 12.0, 13.0]
    assert zero["all_to_all_uneven"] == [0.0, 100.0, 101.0] and one["all_to_all_uneven"] == [1.0, 2.0]
    assert zero["reduce"] == 2.0 and one["reduce"] == 2.0  # the root's maximum; the other keeps its value
    assert zero["gather"] == [5.0, 6.0] and one["gather"] is None
    assert one["p2p"] == 42.0
    assert zero["coalesced"][2] == 2.0 and one["coalesced"][2] == 5.0


def _functional(rank, world):
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    group = dist.group.WORLD
    npu = torch.ops._c10d_functional
    value = torch.full((2,), rank + 1.0, device="npu")
    issued = npu.all_reduce(value, "sum", group.group_name)
    waited = npu.wait_tensor(issued)
    return {
        "all_reduce": (waited is issued, waited.cpu().tolist(), value.cpu().tolist()),
        "funcol all_reduce": funcol.all_reduce(value, "sum", group).cpu().tolist(),
        "all_gather": funcol.all_gather_tensor(value, 0, group).cpu().tolist(),
        "reduce_scatter": funcol.reduce_scatter_tensor(torch.arange(4.0, device="npu") * (rank + 1), "sum", 0,
                                                       group).cpu().tolist(),
        "all_to_all": funcol.all_to_all_single(torch.tensor([10.0 * rank, 10.0 * rank + 1], device="npu"),
                                               None, None, group).cpu().tolist(),
        "broadcast": funcol.broadcast(value, 1, group).cpu().tolist(),
    }


def test_functional_collectives(tmp_path):
    for rank, out in enumerate(run_ranks(_functional, 2, tmp_path)):
        assert out["all_reduce"] == (True, [3.0, 3.0], [rank + 1.0] * 2), "a new tensor; the input is untouched"
        assert out["funcol all_reduce"] == [3.0, 3.0]
        assert out["all_gather"] == [1.0, 1.0, 2.0, 2.0]
        assert out["reduce_scatter"] == ([0.0, 3.0] if rank == 0 else [6.0, 9.0])
        assert out["all_to_all"] == ([0.0, 10.0] if rank == 0 else [1.0, 11.0])
        assert out["broadcast"] == [2.0, 2.0]


def _refusals(rank, world):
    import torch
    import torch.distributed as dist

    refused = {}
    for name, call in {
        "cpu tensor": lambda: dist.all_reduce(torch.ones(1)),
        "bitwise and": lambda: dist.all_reduce(torch.ones(1, dtype=torch.int32, device="npu"), op=dist.ReduceOp.BAND),
        "float64": lambda: dist.all_reduce(torch.ones(1, dtype=torch.float64, device="npu")),
    }.items():
        try:
            call()
            refused[name] = "accepted"
        except (RuntimeError, ValueError) as error:
            refused[name] = str(error)
    return refused


def test_hccl_refuses_what_it_does_not_take(tmp_path):
    for refused in run_ranks(_refusals, 2, tmp_path):
        assert "No backend type associated with device type cpu" in refused["cpu tensor"]
        assert refused["bitwise and"] == "Cannot use ReduceOp.BAND with HCCL"
        assert refused["float64"] == "HCCL allreduce: Unsupported data type torch.float64"
