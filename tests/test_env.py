"""Environment detection with each launcher's real variable sets."""

import pytest

from ddp_lab.world.env import EnvError, detect_env, first_slurm_host, slurm_port

# What torchrun sets for rank 3 of 2 nodes x 2 (captured from torch.distributed.run)
TORCHRUN = {
    "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "3", "ROLE_WORLD_SIZE": "4",
    "MASTER_ADDR": "nid001", "MASTER_PORT": "29400", "TORCHELASTIC_RUN_ID": "none",
    "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
}
# srun --nodes=2 --ntasks-per-node=2 without torchrun: task 2 (first task of node 2)
SRUN = {
    "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NTASKS": "4", "SLURM_NPROCS": "4",
    "SLURM_NODEID": "1", "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2",
    "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_JOB_NODELIST": "nid[002345-002346]", "SLURM_NODELIST": "nid[002345-002346]",
    "SLURM_JOB_ID": "123456", "SLURMD_NODENAME": "nid002346",
}
# mpirun -np 4 --host red01:2,orange07:2: rank 3
OMPI = {
    "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "1", "OMPI_UNIVERSE_SIZE": "4",
    "MASTER_ADDR": "red01", "MASTER_PORT": "1234",
}
# RunAI / Kubeflow PyTorchJob worker pod 1 of 2 (one process per pod)
RUNAI = {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456",
         "PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "job-master-0",
         "PET_MASTER_PORT": "23456", "PET_NPROC_PER_NODE": "1"}


def test_torchrun():
    e = detect_env(TORCHRUN)
    assert (e.rank, e.local_rank, e.world_size, e.local_world_size) == (3, 1, 4, 2)
    assert (e.node_rank, e.num_nodes, e.master_addr, e.master_port) == (1, 2, "nid001", 29400)
    assert e.source == "torchrun" and not e.is_main


def test_torchrun_restart_count():
    assert detect_env({**TORCHRUN, "TORCHELASTIC_RESTART_COUNT": "2"}).restart_count == 2


def test_srun_without_torchrun():
    e = detect_env(SRUN)
    assert (e.rank, e.local_rank, e.world_size, e.local_world_size) == (2, 0, 4, 2)
    assert (e.node_rank, e.num_nodes) == (1, 2)
    assert e.master_addr == "nid002345"  # first host of the node list
    assert e.master_port == slurm_port(123456) and e.source == "slurm"


def test_srun_master_addr_override_wins():
    assert detect_env({**SRUN, "MASTER_ADDR": "10.0.0.1"}).master_addr == "10.0.0.1"


def test_srun_uneven_tasks_per_node():
    env = {**SRUN, "SLURM_TASKS_PER_NODE": "3,1", "SLURM_PROCID": "3", "SLURM_NODEID": "1",
           "SLURM_LOCALID": "0"}
    assert detect_env(env).local_world_size == 1


def test_openmpi():
    e = detect_env(OMPI)
    assert (e.rank, e.local_rank, e.world_size, e.local_world_size) == (3, 1, 4, 2)
    assert (e.node_rank, e.num_nodes, e.master_addr) == (1, 2, "red01")
    assert e.source == "mpi"


def test_openmpi_without_node_rank_derives_it():
    env = {k: v for k, v in OMPI.items() if k != "OMPI_COMM_WORLD_NODE_RANK"}
    assert detect_env(env).node_rank == 1


def test_runai_pods():
    e = detect_env(RUNAI)
    assert (e.rank, e.world_size, e.local_world_size, e.node_rank, e.num_nodes) == (1, 2, 1, 1, 2)
    assert e.master_addr == "job-master-0" and e.source == "runai"


def test_runai_pods_plain_world_size_rank():
    e = detect_env({"WORLD_SIZE": "3", "RANK": "2", "MASTER_ADDR": "m", "MASTER_PORT": "1"})
    assert (e.rank, e.world_size, e.num_nodes, e.source) == (2, 3, 3, "runai")


def test_nothing_set_is_a_single_process():
    e = detect_env({})
    assert (e.rank, e.world_size, e.master_addr, e.source) == (0, 1, "127.0.0.1", "single")


@pytest.mark.parametrize("env,message", [
    ({**TORCHRUN, "RANK": "4"}, "rank 4 from torchrun is outside the world of size 4"),
    ({**TORCHRUN, "LOCAL_RANK": "2"}, "local rank 2"),
    ({**TORCHRUN, "WORLD_SIZE": "four"}, "WORLD_SIZE='four' is not an integer"),
    ({k: v for k, v in TORCHRUN.items() if k != "MASTER_ADDR"}, "MASTER_ADDR is not set for a 2-node"),
    ({**OMPI, "OMPI_COMM_WORLD_RANK": "7"}, "outside the world"),
    ({k: v for k, v in OMPI.items() if k != "MASTER_ADDR"}, "MASTER_ADDR is not set"),
    ({**RUNAI, "PET_NODE_RANK": "2"}, "rank 2 from runai is outside"),
    ({**SRUN, "MASTER_PORT": "70000"}, "MASTER_PORT=70000 is not a valid port"),
    ({**SRUN, "SLURM_TASKS_PER_NODE": "two"}, "SLURM_TASKS_PER_NODE='two'"),
])
def test_inconsistent_sets_are_clear_errors(env, message):
    with pytest.raises(EnvError, match=message.replace("(", r"\(")):
        detect_env(env)


@pytest.mark.parametrize("nodelist,first", [
    ("nid001", "nid001"),
    ("nid[001-004]", "nid001"),
    ("nid[007,001-003]", "nid007"),
    ("node1,node2", "node1"),
    ("gpu-a[10-11],gpu-b1", "gpu-a10"),
    ("rack[1-2]-n[3-4]", "rack1-n3"),
    ("nid[001-002]-ib", "nid001-ib"),
])
def test_first_slurm_host(nodelist, first):
    assert first_slurm_host(nodelist) == first


def test_openmpi_node_rank_is_not_a_node_index():
    # what Open MPI 4.1 really sets for `mpirun -np 3` on one host: NODE_RANK counts the
    # processes on the node (0, 1, 2), it is not which node this is
    for r in range(3):
        env = {"OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": "3",
               "OMPI_COMM_WORLD_LOCAL_RANK": str(r), "OMPI_COMM_WORLD_LOCAL_SIZE": "3",
               "OMPI_COMM_WORLD_NODE_RANK": str(r)}
        e = detect_env(env)
        assert (e.node_rank, e.num_nodes) == (0, 1)


def test_openmpi_uneven_slots_use_the_wrappers_node_index():
    # hosts red01:2, orange07:1, purple11:1 -> rank 2 is alone on node 1 of 3
    env = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
           "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
           "DDP_LAB_NODE_RANK": "1", "DDP_LAB_NUM_NODES": "3", "MASTER_ADDR": "red01"}
    e = detect_env(env)
    assert (e.node_rank, e.num_nodes, e.local_world_size) == (1, 3, 1)
