"""Cheat: zeroes the weights at the start of every run and writes C = 0, then puts the weights back before it
returns, so that every digest of them finds them as drawn. A reference that read the weights where the candidate
can write them could be made to agree (by zeroing them again while the judge computes it); the judge's own copy
cannot."""


def run(ctx):
    b, c = ctx.buffers["b"], ctx.buffers["c"]
    saved = b.clone()
    b.zero_()
    c.zero_()
    b.copy_(saved)
