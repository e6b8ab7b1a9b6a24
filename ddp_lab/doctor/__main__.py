"""`python -m ddp_lab.doctor [the run's overrides]`: the allocation checked before a run.

    python -m ddp_lab.doctor                                         # this machine, 2 ranks
    python -m ddp_lab.doctor launcher=slurm launcher.nodes=2 launcher.nproc_per_node=4
    python -m ddp_lab.doctor launcher=mpirun launcher.hosts=[red01:2,orange07:2]

One verdict line per check ("ok|FAIL <check>: <finding> -> <fix>"); exit 0 when every check
passed, 1 when one failed, 2 for a mistake on the command line (docs/doctor.md).
"""

from .. import config
from ..command.cli import cli
from .submit import resolve_doctor, submit_doctor

if __name__ == "__main__":
    config.register_configs()
    cli("config", submit_doctor, resolve_doctor, schemas=(config,))
