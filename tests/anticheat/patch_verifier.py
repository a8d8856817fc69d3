"""Cheat: replaces the runner's comparison with one that always passes, then writes nothing at all."""

import cuco.runner.judge.verify as verify

verify.compare = lambda name, *args, **kw: verify.Check(True, "", 0.0, 0)
verify.same = lambda name, *args, **kw: verify.Check(True)


def run(ctx):
    pass
