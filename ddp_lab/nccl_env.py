"""`python -m ddp_lab.nccl_env`: the NCCL variables for this cluster's
network (the code: ddp_lab/launch/nccl_env.py)."""

import sys

from .launch.nccl_env import main

if __name__ == "__main__":
    sys.exit(main())
