"""Device probe: a confined process (Landlock + no capabilities) can still run CUDA, NCCL between two such
processes, pin host memory and open a CUDA IPC tensor shared by an unconfined parent."""
import base64, json, mmap, os, socket, subprocess, sys, tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch

def child(rank, fd):
    from cuco.runner import sandbox
    scratch = Path(tempfile.mkdtemp())
    c = sandbox.confine([scratch, Path("/dev"), Path("/proc")])
    print(rank, c.describe(), flush=True)
    os.environ["TMPDIR"] = str(scratch)
    sock = socket.socket(fileno=fd)
    msg = json.loads(sock.recv(65536))
    torch.cuda.set_device(rank)
    args = list(msg["ipc"])
    args[1] = base64.b64decode(args[1]); args[4] = base64.b64decode(args[4]); args[6] = base64.b64decode(args[6]) if args[6] else None
    st = torch.UntypedStorage._new_shared_cuda(*args)
    t = torch.empty(0, dtype=torch.uint8, device=f"cuda:{rank}").set_(st)
    print(rank, "ipc sum", int(t[:16].sum()), flush=True)
    t[:16].fill_(7); torch.cuda.synchronize()
    m = mmap.mmap(-1, 4096)
    import ctypes
    ptr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    r = torch.cuda.cudart().cudaHostRegister(ptr, 4096, 0)
    print(rank, "hostRegister", r, flush=True)
    import torch.distributed as dist
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29533", rank=rank, world_size=int(os.environ["WORLD"]), device_id=torch.device("cuda", rank))
    x = torch.ones(1 << 20, device="cuda") * (rank + 1)
    dist.all_reduce(x); torch.cuda.synchronize()
    print(rank, "nccl allreduce", float(x[0]), flush=True)
    dist.destroy_process_group()
    sock.send(b"ok")

if __name__ == "__main__":
    if len(sys.argv) > 1:
        child(int(sys.argv[1]), int(sys.argv[2])); sys.exit(0)
    procs, socks, keep = [], [], []
    world = torch.cuda.device_count(); os.environ["WORLD"] = str(world)
    for r in range(world):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        torch.cuda.set_device(r)
        t = torch.full((1 << 22,), 3, dtype=torch.uint8, device=f"cuda:{r}"); keep.append(t)
        ipc = list(t.untyped_storage()._share_cuda_())
        for i in (1, 4, 6):
            ipc[i] = base64.b64encode(ipc[i]).decode() if ipc[i] else None
        p = subprocess.Popen([sys.executable, __file__, str(r), str(b.fileno())], pass_fds=[b.fileno()],
                             env={**os.environ, "NCCL_NVLS_ENABLE": "0"})
        b.close(); a.send(json.dumps({"ipc": ipc}).encode()); procs.append(p); socks.append(a)
    for r, (p, s) in enumerate(zip(procs, socks)):
        print("child", r, s.recv(10), "rc", p.wait(), "parent sees", int(keep[r][:16].sum()))
