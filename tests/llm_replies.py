"""Replies shaped like real models' output, for the CPU example's seed (cpu_allgather_matmul/seed.py)."""

DIRECTIVE = ('<directive>{"point": {"backend": "nccl_host", "placement": "stream_overlap", "sync": "chunk", '
             '"issuer": "cta", "chunks": 1}, "text": "start the all-gather asynchronously and multiply this '
             'rank\'s own rows while it runs"}</directive>')

OVERLAP_EDIT = """<<<<<<< SEARCH
    dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group)
    torch.matmul(a_full, b, out=c)
=======
    m = a.shape[0]
    work = dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group, async_op=True)
    torch.matmul(a, b, out=c[ctx.rank * m:(ctx.rank + 1) * m])
    work.wait()
    for p in range(ctx.world):
        if p != ctx.rank:
            torch.matmul(a_full[p * m:(p + 1) * m], b, out=c[p * m:(p + 1) * m])
>>>>>>> REPLACE"""

GOOD_DIFF = f"""The seed waits for the whole all-gather before any compute. This rank's own rows need no
communication, so they can be multiplied while the peers' rows are in flight.

{DIRECTIVE}

{OVERLAP_EDIT}
"""

MALFORMED_DIFF = f"""{DIRECTIVE}

<<<<<<< SEARCH
    dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group)
>>>>>>> REPLACE
"""

FROZEN_EDIT = f"""{DIRECTIVE}

<<<<<<< SEARCH
def run(ctx):
=======
def run(ctx, fast=True):
>>>>>>> REPLACE
"""

WRONG_SEARCH = f"""{DIRECTIVE}

<<<<<<< SEARCH
    dist.all_gather(list(a_full.chunk(ctx.world)), a, group=ctx.group, async_op=False)
=======
    pass
>>>>>>> REPLACE
"""

NO_DIRECTIVE = f"""Here is a faster version.

{OVERLAP_EDIT}
"""

REWRITE = ('<directive>{"point": {"backend": "nccl_host", "placement": "stream_overlap", "sync": "chunk", '
           '"issuer": "cta",\n"chunks": 2}, "text": "two chunks: the second half of the peers\' rows is still '
           'arriving while the first is multiplied"}</directive>\n'
           '''
```python
"""Host-driven: all-gather A, then one matmul. Nothing overlaps."""

import torch
import torch.distributed as dist


def run(ctx):
    a, b, c, a_full = (ctx.buffers[k] for k in ("a", "b", "c", "a_gathered"))
    # EVOLVE-BLOCK-START
    m, half = a.shape[0], a.shape[0] // 2
    works = []
    for r0, r1 in ((0, half), (half, m)):
        outs = [a_full[p * m + r0:p * m + r1] for p in range(ctx.world)]
        works.append((r0, r1, dist.all_gather(outs, a[r0:r1], group=ctx.group, async_op=True)))
    torch.matmul(a, b, out=c[ctx.rank * m:(ctx.rank + 1) * m])
    for r0, r1, work in works:
        work.wait()
        for p in range(ctx.world):
            if p != ctx.rank:
                torch.matmul(a_full[p * m + r0:p * m + r1], b, out=c[p * m + r0:p * m + r1])
    # EVOLVE-BLOCK-END
```
''')

META = """1. What worked: overlapping the all-gather with the matmul of this rank's own rows cut the time in half.
2. What failed: nothing failed yet; the seed serialises communication and compute.
3. Recommendations:
- Keep the asynchronous all-gather and multiply local rows first.
- Try two or four chunks so the peers' first rows can be used earlier.
- Avoid more than eight chunks: each matmul gets too small.
"""

# The overlap edit again, with the async handle renamed: a near duplicate of GOOD_DIFF's program.
RENAMED_DIFF = GOOD_DIFF.replace("work = dist", "handle = dist").replace("work.wait()", "handle.wait()")
