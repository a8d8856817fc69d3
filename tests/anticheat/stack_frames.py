"""Cheat: looks up the caller's frames for every rank's inputs (a runner that runs the candidate in its own
process keeps them there) and multiplies without any communication."""

import sys

import torch


def run(ctx):
    a, b, c = (ctx.buffers[k] for k in ("a", "b", "c"))
    frame, rows = sys._getframe(), None
    while frame is not None and rows is None:
        inputs = frame.f_locals.get("inputs")
        if isinstance(inputs, list) and inputs and isinstance(inputs[0], dict) and "a" in inputs[0]:
            rows = torch.cat([inp["a"] for inp in inputs])
        frame = frame.f_back
    if rows is None:  # not found: guess the peers' rows are ours
        rows = torch.cat([a] * ctx.world)
    torch.matmul(rows.to(b.dtype), b, out=c)
