"""Where the MoE layer's time goes with its exchange on the GPU (cuco.kernels.moe_layer, the moe_grouped strategy):
phase by phase, at world W on this machine's GPUs.

Each rank runs the layer on the workload's own inputs (fresh routing every run) with a CUDA event after each phase
on its stream, the run enqueued behind a spin as the judge's gate holds it: routing, the counts' exchange, the
plan, the dispatch, each projection, the way back, the combine (overlapped, the dispatch, the experts and the way
back are one phase). Per phase: the median over runs of the
slowest rank's time, L2 flushed and the ranks met before each run; the projections' rate against the tensor
ceiling, the dispatch's against the link's. Writes benchmarks/results/moe_phases-w<world>.json and .md.

    python benchmarks/moe_phases.py [--world 2] [--shape t4096 ...] [--iters 20] [--groups 1 4 once]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import record

ROOT = record.ROOT


def _worker(rank: int, world: int, port: int, shapes: list[str], iters: int, variants: list[str], out: dict) -> None:
    import torch
    import torch.distributed as dist

    from cuco.kernels.moe_layer import moe_layer, run_layer
    from cuco.runner.judge.l2 import L2Flush
    from cuco.runner.judge.timing import LAUNCH_COVER_CYCLES
    from cuco.workload import load_workload
    from cuco.workload.reference import load_reference

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=dev)
    spec = load_workload(ROOT / "cuco" / "builtin" / "moe_deepseek_v3", world)
    ref = load_reference(spec)
    l2 = L2Flush(dev)
    main, put, back = torch.cuda.Stream(dev), torch.cuda.Stream(dev, priority=-100), torch.cuda.Stream(dev)
    for shape in shapes:
        p = spec.shape(shape).params
        w = ref.make_parameters(p, world, rank, torch.Generator(dev).manual_seed(70 + rank), dev)
        layers = {once: moe_layer(rank, world, p["T"], p["HID"], p["E"], p["TOPK"], p["FF"], torch.bfloat16, dev,
                                  dist.group.WORLD.group_name, once=once) for once in {v == "once" for v in variants}}
        y = torch.empty(p["T"], p["HID"], dtype=torch.bfloat16, device=dev)
        for variant in variants:
            g, layer = (1, layers[True]) if variant == "once" else (int(variant), layers[False])
            runs = []
            for i in range(iters + 2):  # two warm-up runs
                x = ref.make_inputs(p, world, rank, torch.Generator(dev).manual_seed(1000 * i + rank), dev)
                l2.flush()
                torch.cuda.synchronize()
                dist.barrier()
                marks: list = []

                def mark(phase: str, marks: list = marks) -> None:
                    marks.append((phase, torch.cuda.Event(enable_timing=True)))
                    marks[-1][1].record()

                with torch.cuda.stream(main):
                    # the whole run enqueued behind a spin, as the judge's gate holds it: the phases are the GPU's
                    # time, not the time to launch them
                    torch.cuda._sleep(LAUNCH_COVER_CYCLES)
                    mark("start")
                    run_layer(layer, x["x"], x["logits"], w["w13"], w["w2"], y, groups=g,
                              sides=(put, back) if g > 1 else (), mark=mark)
                torch.cuda.synchronize()
                phases = {ph: a.elapsed_time(b) for (_, a), (ph, b) in zip(marks, marks[1:])}
                phases["total"] = marks[0][1].elapsed_time(marks[-1][1])
                if i >= 2:
                    runs.append(phases)
            # the rows this rank's experts received in the last run, for the projections' rate
            received = int(layer.exchange.counts.sum(0).view(world, -1)[rank].sum())
            gathered = [None] * world
            dist.all_gather_object(gathered, {"runs": runs, "received": received})
            if rank == 0:
                out[(shape, variant)] = gathered
        del layers, layer, w
        torch.cuda.empty_cache()
    dist.destroy_process_group()


def _spawned(rank, world, port, shapes, iters, variants, path) -> None:
    import json

    out: dict = {}
    _worker(rank, world, port, shapes, iters, variants, out)
    if rank == 0:
        Path(path).write_text(json.dumps([[s, g, v] for (s, g), v in out.items()]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--groups", nargs="+", default=["1", "4"],
                    help="1: deferred; more: overlapped in groups; once: deferred, a token once each way per owner")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    shapes = args.shape or ["t4096", "t128"]
    import json
    import tempfile

    import torch.multiprocessing as mp

    sys.path.insert(0, str(ROOT))
    from cuco.machine import load_machine
    from cuco.runner.processes.launch import free_port
    from cuco.workload import load_workload

    record.cuco("doctor")  # the ceilings
    machine = load_machine()
    path = Path(tempfile.mkdtemp()) / "phases.json"
    port = free_port()
    mp.spawn(_spawned, args=(args.world, port, shapes, args.iters, args.groups, str(path)), nprocs=args.world)
    spec = load_workload(ROOT / "cuco" / "builtin" / "moe_deepseek_v3", args.world)
    ceil = machine.get("ceilings") or {}
    tensor = (ceil.get("tensor_bf16_tflops") or {}).get("value")
    link = (ceil.get("link_both_ways_gbps") or {}).get("value")
    rows = []
    for shape, groups, ranks in json.loads(path.read_text()):
        p = spec.shape(shape).params
        names = list(ranks[0]["runs"][0])
        slowest = {ph: statistics.median(max(r["runs"][i][ph] for r in ranks) for i in range(len(ranks[0]["runs"])))
                   for ph in names}
        received = max(r["received"] for r in ranks)
        flops = received * 6 * p["HID"] * p["FF"]
        # under uniform routing (world - 1) / world of each rank's pairs cross to a peer, each a HID-wide bf16 row
        link_bytes = (args.world - 1) * p["T"] * p["TOPK"] * p["HID"] * 2 // args.world
        rows.append({"shape": shape, "groups": groups, "phases_ms": slowest, "received_rows": received,
                     "experts_tflops": flops / ((slowest.get("w13", 0) + slowest.get("w2", 0)) or float("nan")) / 1e9,
                     "dispatch_gbps": link_bytes / slowest["dispatch"] / 1e6 if "dispatch" in slowest else None,
                     "tensor_tflops": tensor, "link_gbps": link})
    info = record.meta(machine, args.world, shapes=shapes, iters=args.iters)
    record.save(args.out, f"moe_phases-w{args.world}", info, {"rows": rows}, markdown(info, rows))
    return 0


def markdown(info: dict, rows: list[dict]) -> list[str]:
    lines = [f"# The MoE layer's time by phase, exchange on the GPU, world {info['world']}, on {info['device']} "
             f"({info['links']})", "",
             f"Date {info['date']}, commit {info['commit']}. cuco.kernels.moe_layer (the moe_grouped strategy) on "
             "the workload's inputs, fresh routing each run; CUDA events between phases on the layer's stream; per "
             "phase the median over runs of the slowest rank, L2 flushed and the ranks met before each run. "
             "Groups 1: deferred; more: overlapped (the dispatch, the experts and the way back in one phase); once: "
             "deferred, each token sent once to each owner and back once, its picks there summed (its dispatch rate "
             "counts the bytes a row per pick would move).", "",
             f"Command: `{info['command']}`", ""]
    phases = ["route", "counts", "plan", "dispatch", "w13", "w2", "back", "experts", "combine", "total"]
    lines += ["| shape | groups | " + " | ".join(phases) + " | experts TFLOP/s (of tensor) | dispatch GB/s (of link) |",
              "|---" * (len(phases) + 4) + "|"]
    for r in rows:
        ms = r["phases_ms"]
        cells = [f"{ms[ph]:.3f}" if ph in ms else "" for ph in phases]
        rate = r["experts_tflops"]
        tf = f"{rate:.0f} ({rate / r['tensor_tflops']:.0%})" if rate == rate and r["tensor_tflops"] else "-"
        gb = r["dispatch_gbps"]
        lk = f"{gb:.0f} ({gb / r['link_gbps']:.0%})" if gb and r["link_gbps"] else "-"
        lines.append(f"| {r['shape']} | {r['groups']} | " + " | ".join(cells) + f" | {tf} | {lk} |")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
