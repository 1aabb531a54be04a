"""``coc-plan``: plan MC2-style chunks for one matmul shape and predict the overlap.

Prints a few human-readable lines, then, as the last line, one JSON object::

    {"blocks": [...], "bound": "comm"|"compute", "predicted_us": ...,
     "serial_us": ..., "ideal_us": ..., "exposed_comm_us": ..., "order": ...}

``predicted_us`` is the pipeline model's makespan with the fitted costs (no
inflation; with ``--chunk-efficiency``, each chunk's matmul at the device's
measured chunk penalty), ``serial_us`` the unchunked matmul plus collective, ``ideal_us``
the perfect-overlap bound of the planned chunks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from coc_impl.errors import CoCConfigError, CoCShapeError
from coc_impl.planner import DEFAULT_INFLATION, plan_blocks
from coc_shared.chunk_efficiency import ENV as EFFICIENCY_ENV
from coc_shared.chunk_efficiency import EfficiencyError, chunked_matmul
from coc_shared.chunk_efficiency import load as load_efficiency
from coc_shared.cost_model import CostFileError, load_costs
from coc_shared.timeline import ORDERS, simulate

DTYPE_SIZES: dict[str, int] = {"float16": 2, "bfloat16": 2, "float32": 4, "int8": 1}


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="coc-plan",
        description="Plan the m-axis chunks of a matmul overlapped with its collective "
        "(MC2 tiling method) and predict the pipelined time.",
    )
    parser.add_argument("--m", type=_positive_int, required=True, help="rows (tokens) of the matmul input")
    parser.add_argument("--k", type=_positive_int, required=True, help="reduction dimension")
    parser.add_argument(
        "--n", type=_positive_int, required=True, help="output columns (the communicated width)"
    )
    parser.add_argument(
        "--dtype", choices=sorted(DTYPE_SIZES), default="float16", help="element type (default float16)"
    )
    parser.add_argument("--costs", required=True, metavar="FILE", help="cost-model JSON file (schema 1)")
    parser.add_argument(
        "--inflation",
        type=_positive_float,
        default=DEFAULT_INFLATION,
        help=f"planning factor for overlap contention (default {DEFAULT_INFLATION})",
    )
    parser.add_argument(
        "--chunk-efficiency", metavar="FILE", default=os.environ.get(EFFICIENCY_ENV) or None,
        help="the device check's JSON (python -m conformance.bench device): its chunked-GEMM efficiency "
        f"makes a chunk's matmul dearer than its share of the whole (default: ${EFFICIENCY_ENV}, else none)",
    )
    parser.add_argument(
        "--order",
        choices=ORDERS,
        default="compute_first",
        help="compute_first: matmul then collective per chunk (all-reduce/reduce-scatter); "
        "comm_first: collective then matmul (all-gather)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    dtype_size = DTYPE_SIZES[args.dtype]
    try:
        models = load_costs(args.costs)
    except (CoCConfigError, CostFileError) as exc:
        parser.error(str(exc))
    mm_cost, comm_cost = models.bind(args.k, args.n, dtype_size)
    try:
        efficiency = load_efficiency(args.chunk_efficiency) if args.chunk_efficiency else None
    except EfficiencyError as exc:
        parser.error(str(exc))
    if efficiency is not None:
        mm_cost = chunked_matmul(mm_cost, args.m, args.k, args.n, efficiency)
    try:
        plan = plan_blocks(args.m, args.k, args.n, dtype_size, mm_cost, comm_cost, args.inflation)
    except CoCShapeError as exc:
        parser.error(str(exc))
    timeline = simulate(plan.blocks, mm_cost, comm_cost, args.order)

    print(f"shape: M={args.m} K={args.k} N={args.n} {args.dtype} ({dtype_size} bytes)")
    measured = (models.matmul.k, models.matmul.n)
    if measured != (args.k, args.n):
        print(f"note: matmul cost measured at K={measured[0]} N={measured[1]}, scaled by FLOPs to this shape")
    if efficiency is not None:
        print(f"note: chunked matmuls cost the device's measured efficiency ({args.chunk_efficiency})")
    print(f"bound: {plan.bound} (matmul {mm_cost(args.m):.1f} us, comm {comm_cost(args.m):.1f} us unchunked)")
    if plan.count:
        where = "first" if plan.bound == "comm" else "last"
        print(f"blocks: {list(plan.blocks)} (short block {plan.m0} {where}, {plan.count} x {plan.m1})")
    else:
        print(f"blocks: {list(plan.blocks)} (single block: no efficient split fits M)")
    print(
        f"predicted: {timeline.makespan:.1f} us ({args.order}), serial {timeline.serial:.1f} us, "
        f"ideal {timeline.ideal:.1f} us, exposed comm {timeline.exposed_comm:.1f} us, "
        f"gain {timeline.gain:.1%}"
    )
    print(
        json.dumps(
            {
                "blocks": list(plan.blocks),
                "bound": plan.bound,
                "predicted_us": round(timeline.makespan, 3),
                "serial_us": round(timeline.serial, 3),
                "ideal_us": round(timeline.ideal, 3),
                "exposed_comm_us": round(timeline.exposed_comm, 3),
                "order": args.order,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
