# coding: utf-7
"""Cheat: a coding declaration makes the importer decode the source as UTF-7, where `+AAo-` is a newline: each
comment line at the end is, to the interpreter, a comment followed by a line of code. The text the static checks
read is an honest all-gather and matmul; the code the importer would run replaces it with a thread that does the
whole all-gather and matmul while the clock is stopped (work_in_the_gap.py's trick, without an import L0 sees).
The loader reads the text the checks read, so the hidden lines stay comments there too; both refuse the file."""

import torch
import torch.distributed as dist


def run(ctx):
    a, b, c, a_full = (ctx.buffers[k] for k in ("a", "b", "c", "a_gathered"))
    dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group)
    torch.matmul(a_full, b, out=c)

#+AAo-import threading
#+AAo-def _work(ctx):
#+AAo-    a, b, a_full, early = (ctx.state[k] for k in ("a", "b", "a_full", "early"))
#+AAo-    while not ctx.state["stop"]:
#+AAo-        if torch.isnan(a_full[0, 0]):
#+AAo-            dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group)
#+AAo-            torch.matmul(a_full, b, out=early)
#+AAo-            ctx.state["ready"].set()
#+AAo-        ctx.state["tick"].wait(0.0002)
#+AAo-def setup(ctx):
#+AAo-    a, b, a_full = (ctx.buffers[k] for k in ("a", "b", "a_gathered"))
#+AAo-    ctx.state.update(a=a, b=b, a_full=a_full, early=torch.empty_like(ctx.buffers["c"]), stop=False,
#+AAo-                     ready=threading.Event(), tick=threading.Event())
#+AAo-    ctx.state["thread"] = threading.Thread(target=_work, args=(ctx,), daemon=True)
#+AAo-    ctx.state["thread"].start()
#+AAo-def run(ctx):
#+AAo-    ctx.state["ready"].wait()
#+AAo-    ctx.state["ready"].clear()
#+AAo-    ctx.buffers["c"].copy_(ctx.state["early"])
#+AAo-def teardown(ctx):
#+AAo-    ctx.state["stop"] = True
#+AAo-    ctx.state["thread"].join()
