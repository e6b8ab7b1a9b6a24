"""train.cuda_graph=true (issue 32): the key, its refusals (one line naming the key and the
fix, before any process starts), the runner chosen in one place; on a GPU, graphed
training against eager (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from ddp_lab.config import CUDA_GRAPH_SYNCS
from ddp_lab import fast_step as cuda_graph
from ddp_lab.command import validate
from ddp_lab.step import run_steps
from ddp_lab.timing import Clock, CommRecorder
from helpers import compose, run_cli, run_dir_of, summary

GPU = ["train.cuda_graph=true", "dist.device=cuda", "dist.backend=nccl"]
NEEDS = "CUDA graphs capture CUDA kernels: needs dist.device=cuda and dist.backend=nccl"

# (id, overrides, what the one line must contain); None: accepted
RULES = [
    ("off", ["dist.device=cpu"], None),
    ("on-gpu-ddp", [*GPU, "sync=ddp"], None),
    ("on-gpu-fp16", [*GPU, "sync=ddp", "sync.compress=fp16"], None),
    *[(f"on-gpu-{s}", [*GPU, f"sync={s}"], None) for s in CUDA_GRAPH_SYNCS],
    ("device-cpu", ["train.cuda_graph=true", "dist.device=cpu"], NEEDS),
    ("backend-gloo", ["train.cuda_graph=true", "dist.device=cuda", "dist.backend=gloo"], NEEDS),
    ("powersgd", [*GPU, "sync=ddp", "sync.compress=powersgd"], "sync.compress=powersgd: PowerSGD decides on the host"),
    ("ring", [*GPU, "sync=ring"], "train.cuda_graph=true with sync=ring: its send/recv"),
    ("reduce_broadcast", [*GPU, "sync=reduce_broadcast"], "sync=ddp, naive, allreduce or zero1"),
    ("overlap-thread", [*GPU, "sync=allreduce", "sync.overlap=true"],
     "the overlap runs the collectives on a background thread"),
    ("compile", [*GPU, "train.compile=true"], "with train.compile=true: pick one"),
    ("micro-batch", [*GPU, "train.batch_size=64", "train.micro_batch=16"],
     "train.cuda_graph=true with train.micro_batch=16"),
]


@pytest.mark.parametrize("overrides, expected", [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_cuda_graph_rule(overrides, expected):
    message = validate.cuda_graph_fits(compose(*overrides))
    if expected is None:
        assert message is None
    else:
        assert message is not None and expected in message
        assert "train.cuda_graph" in message and "\n" not in message


def test_the_rule_is_in_the_trainers_table():
    assert validate.cuda_graph_fits in validate.TRAIN


def test_auto_device_on_a_local_machine_without_gpus_is_refused(monkeypatch):
    monkeypatch.setattr(validate, "local_gpus", lambda: 0)
    assert NEEDS in validate.cuda_graph_fits(compose("train.cuda_graph=true"))
    # a dry run only renders, and slurm's nodes may have GPUs: auto stands
    assert validate.cuda_graph_fits(compose("train.cuda_graph=true", "launcher.dry_run=true")) is None


def test_the_key_defaults_to_off():
    cfg = compose()
    assert cfg.train.cuda_graph is False


def test_eager_runner_unless_asked():
    cfg = compose()
    assert cuda_graph.graphed_steps(cfg.train, None, None, 16) is None
    assert isinstance(cuda_graph.graph_stream(compose(*GPU).train, torch.device("cpu")),
                      type(cuda_graph.nullcontext()))


def test_graphed_runner_refuses_a_cpu_rank():
    class Syncer:
        device = torch.device("cpu")
    with pytest.raises(ValueError, match="train.cuda_graph=true: this rank's device is cpu"):
        cuda_graph.graphed_steps(compose(*GPU).train, Syncer(), None, 16)


class FakeStream:
    def __init__(self, *args) -> None:
        pass

    def wait_stream(self, other) -> None:
        pass


class FakeGraph:
    """A CUDA graph on CPU: the fake capture below runs the step's body (a real one only
    records it), so the first replay, the capture batch's, runs nothing; every later replay
    runs the body again, its .grad written afresh as a replayed backward writes it."""

    body = zero_grad = None

    def __init__(self) -> None:
        self.captured_batch_pending = True

    def replay(self) -> None:
        if self.captured_batch_pending:
            self.captured_batch_pending = False
            return
        FakeGraph.zero_grad()
        FakeGraph.body()


def test_graphed_steps_train_as_eager_with_fake_graphs(monkeypatch):
    """The graph path's bookkeeping on CPU, CUDA faked: warm-up steps eager, one capture,
    replays, the shorter last batch eager; the weights, loss and correct sums are the
    eager run's, bit for bit, and the graph's steps are timed whole."""
    from contextlib import nullcontext

    from ddp_lab.models import build_model, build_optimizer
    from ddp_lab.sync import build_sync
    from ddp_lab.timing import StepTimer

    for name, value in {"Stream": FakeStream, "stream": lambda s: nullcontext(),
                        "current_stream": lambda *a: FakeStream(), "synchronize": lambda *a: None,
                        "CUDAGraph": FakeGraph, "graph": lambda g: nullcontext()}.items():
        monkeypatch.setattr(torch.cuda, name, value)
    cfg = compose("optim=sgd", "optim.momentum=0.9", "sync=ddp")
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(n, 1, 28, 28, generator=gen), torch.randint(0, 10, (n,), generator=gen))
               for n in [16] * 7 + [8]]

    def parts():
        torch.manual_seed(0)
        module = build_model(cfg.model)
        clock = Clock(torch.device("cpu"))
        syncer = build_sync(cfg.sync, module, torch.device("cpu"), 1, clock=clock)
        timer = StepTimer(clock)
        timer.watch_grads(module)
        return module, syncer, build_optimizer(cfg.optim, syncer.optimizer_params(), 0.01), timer

    m_eager, s_eager, o_eager, t_eager = parts()
    loss_e, right_e = run_steps(s_eager, o_eager, batches, t_eager)
    module, syncer, optimizer, timer = parts()
    graphed = cuda_graph.GraphedSteps(syncer, optimizer, 16, warmup=3)
    FakeGraph.body, FakeGraph.zero_grad = graphed.step, lambda: optimizer.zero_grad(set_to_none=True)
    loss_g, right_g = graphed.run_steps(batches, timer)

    assert graphed.graph is not None and graphed.eager_steps == 3 and graphed.replays == 4
    assert timer.grads is None  # its hooks would record events inside the capture
    for a, b in zip(m_eager.parameters(), module.parameters()):
        assert torch.equal(a, b)
    assert torch.equal(loss_e, loss_g) and torch.equal(right_e, right_g)
    names = [[n for n, _, _ in st.spans] for st in timer.collect()]
    assert names[:3] == [["forward", "backward", "sync", "optim"]] * 3
    assert names[3:7] == [["step"]] * 4  # timed whole
    assert names[7] == ["forward", "backward", "sync", "optim"]  # the shorter batch: eager
    # a second epoch replays the same graph, the sums start again from zero
    loss2, _ = graphed.run_steps(batches[:2], timer)
    assert graphed.replays == 2 and loss2.item() > 0
    # a part that starts with the shorter batch (resumed at an epoch's last step): it runs
    # eagerly, the full ones after it replay
    graphed.run_steps([batches[7], batches[0]], timer)
    assert graphed.replays == 1


def test_make_capturable_moves_adams_step_count():
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.Adam([p], lr=0.1)
    p.grad = torch.ones(3)
    opt.step()
    cuda_graph.make_capturable(opt)
    assert opt.param_groups[0]["capturable"] is True
    step = opt.state[p]["step"]
    assert step.device == p.device and step.dtype == torch.float32
    sgd = torch.optim.SGD([p], lr=0.1)
    cuda_graph.make_capturable(sgd)  # nothing to do
    assert "capturable" not in sgd.param_groups[0]


def test_replays_are_counted_from_the_capture():
    rec = CommRecorder(Clock(torch.device("cpu")), world_size=2, enabled=False)
    before = rec.counts()
    with rec.timed("all_reduce", 100, 50, 50):
        pass
    delta = tuple(a - b for a, b in zip(rec.counts(), before))
    rec.add_counts(delta, -1)  # the capture ran nothing
    assert rec.counts() == before
    rec.add_counts(delta, 7)  # seven replays
    stats = rec.collect()
    assert stats.calls == 7 and stats.payload_bytes == 700 and stats.bytes_sent == 350


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("sync", ["ddp", "zero1"])
def test_graphed_training_matches_eager(tmp_path, shared_data_root, sync):
    """One rank, one whole epoch (its last, shorter batch runs eagerly): the graphed weights
    are the eager ones within 1e-3 (the same kernels, replayed; Adam's capturable update
    reads its step count from the device), test accuracy within 0.3 points."""
    def run(flag: str):
        proc = run_cli("launcher.nproc_per_node=1", "dist.device=cuda", "dist.backend=nccl",
                       f"sync={sync}", "train.epochs=1", f"train.cuda_graph={flag}",
                       f"data.root={shared_data_root}", f"run.root={tmp_path / flag}",
                       "log.progress=lines", cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return run_dir_of(proc), proc.stdout + proc.stderr

    eager, _ = run("false")
    graphed, log = run("true")
    assert "step timed whole (cuda_graph)" in log
    a = torch.load(eager / "checkpoints" / "epoch_0001.pt", map_location="cpu")["model"]
    b = torch.load(graphed / "checkpoints" / "epoch_0001.pt", map_location="cpu")["model"]
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-3, rtol=0), k
    se, sg = summary(eager), summary(graphed)
    assert abs(se["test_accuracy"] - sg["test_accuracy"]) <= 0.003
    assert sg["cuda_graph"] is True and se["cuda_graph"] is False
