"""Planted fault: not valid Python."""


def run(ctx)
    pass
