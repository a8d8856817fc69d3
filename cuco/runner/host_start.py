"""Where the candidate's process starts (cuco.runner.host is its work): the kernel's parent-death signal is armed
first, before the second it takes to import torch, so that a judge killed in that second leaves no process behind,
running or stopped. Arguments: the channel's descriptor, then the judge's pid."""

import os
import signal
import sys

from cuco.runner.sandbox.native import prctl

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

if __name__ == "__main__":
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(sys.argv[2]):  # the judge died before the signal was armed
        os._exit(1)
    from cuco.runner.host import main

    sys.exit(main(sys.argv[1:2]))
