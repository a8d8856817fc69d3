"""Cheat: ends its process with status 0 in the middle of its first run: a runner that trusts exit statuses
counts an evaluation that never produced an output as passed."""


def run(ctx):
    raise SystemExit(0)
