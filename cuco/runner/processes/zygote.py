"""The judges' zygote: one process per launcher that imports the judge (torch with it) once, then forks a judge for
every rank of every evaluation. A judge costs a fork, not an interpreter's start and an import of torch (about two
CPU-seconds each): a search's evaluations, and a test suite's, cost half as much CPU.

Not multiprocessing's forkserver: its children re-run the launcher's main script (a Ray worker's, a test runner's)
before their target, and a judge must hold nothing but cuco's own modules.

The launcher holds one end of a socket pair; each request is a JSON message (the rank's arguments, its environment,
its folder) with two descriptors attached (the rank's log and the pipe that holds the judges' token). The zygote
answers with the judge's pid, and with its exit code once it has reaped it. The zygote holds no secret: it passes
the token's pipe on unread and closes it. Its memory is closed to other processes of its uid all the same, as the
launcher's is, since the pipe sits in its table for a moment. When the launcher dies, its end of the socket closes
and the zygote exits; each judge dies with the zygote (its parent-death signal), each host with its judge.
"""

from __future__ import annotations

import json
import os
import select
import socket
import sys
from typing import NoReturn

from cuco.runner.processes.zygote_client import MAX_MESSAGE


def _become_judge(request: dict, log_fd: int, token_fd: int, zygote_pid: int, keep: set[int]) -> NoReturn:
    """The child's side of the fork: never returns into the zygote's loop."""
    from cuco.runner.sandbox import end_as_child

    def judge() -> int:
        from cuco.runner.processes.job import JUDGE_TOKEN_FD_ENV
        from cuco.runner.processes.rank import main
        from cuco.runner.sandbox import die_with_parent, name_process

        die_with_parent(zygote_pid)
        name_process("cuco-judge")
        for fd in keep:  # the zygote's socket and its other children's pidfds
            os.close(fd)
        os.setsid()  # a process group of its own: the launcher's watchdog kills the judge's group
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        os.environ.clear()
        os.environ.update(request["env"], **{JUDGE_TOKEN_FD_ENV: str(token_fd)})
        os.chdir(request["cwd"])
        import torch

        # Each judge draws its own generator state, not the zygote's shared by all (nothing secret is drawn from it:
        # inputs and keys come from generators seeded by the judges' secret).
        torch.seed()
        return main(request["args"])

    end_as_child(judge)


def serve(sock: socket.socket) -> None:
    """Fork a judge per request; report each judge's exit; return when the launcher's end closes."""
    children: dict[int, int] = {}  # pidfd -> pid
    me = os.getpid()
    while True:
        ready, _, _ = select.select([sock, *children], [], [])
        for fd in ready:
            if fd is sock:
                data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 2)
                if not data:
                    return
                log_fd, token_fd = fds
                pid = os.fork()
                if pid == 0:
                    _become_judge(json.loads(data), log_fd, token_fd, me, {sock.fileno(), *children})
                for f in fds:
                    os.close(f)
                children[os.pidfd_open(pid)] = pid
                sock.send(json.dumps({"pid": pid}).encode())
            else:
                pid = children.pop(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                sock.send(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


def main(argv: list[str]) -> int:
    from cuco.runner.sandbox import keep_private, name_process

    keep_private()
    name_process("cuco-zygote")
    import cuco.runner.judge.run  # noqa: F401  torch and the whole judge, once, for every judge forked from here
    import cuco.runner.processes.rank  # noqa: F401

    sock = socket.socket(fileno=int(argv[0]))
    try:
        serve(sock)
    except (BrokenPipeError, ConnectionResetError):  # the launcher is gone
        pass
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # at once, without the interpreter's teardown of torch: the judges die with this process
