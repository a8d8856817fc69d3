"""Cheat: reads the seed from the files of the evaluation (the job file beside the candidate's working folder,
the ranks' result files) and regenerates every rank's inputs with the workload's own reference: no
communication at all."""

import glob
import json
import os

import torch


def find_seed():
    for path in glob.glob(os.path.join(os.getcwd(), "..", "*.json")):
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("seed"), int):
            return data["seed"]
    return None


def run(ctx):
    a, b, c = (ctx.buffers[k] for k in ("a", "b", "c"))
    seed = find_seed()
    if seed is None:
        rows = torch.cat([a] * ctx.world)  # nothing to regenerate from: guess
    else:
        import importlib.util

        spec = importlib.util.spec_from_file_location("ref", "cuco/builtin/gemm_allgather/reference.py")
        ref = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(ref)
        rows = torch.cat([ref.make_inputs(ctx.params, ctx.world, r, torch.Generator().manual_seed(seed * 1_000_003 + r),
                                          "cpu")["a"] for r in range(ctx.world)])
    torch.matmul(rows.to(b.dtype), b, out=c)
