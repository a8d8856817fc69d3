"""Cheat: zeroes the weights and writes zeros, so that a reference computed from the weights where the candidate can
write them agrees with it; it puts the weights back in its next run, before any check that comes only at the end."""


def setup(ctx):
    ctx.state["saved"] = None


def run(ctx):
    b, c = ctx.buffers["b"], ctx.buffers["c"]
    if ctx.state["saved"] is None:
        ctx.state["saved"] = b.clone()
        b.zero_()
    else:
        b.copy_(ctx.state["saved"])
        ctx.state["saved"] = None
    c.zero_()
