"""`from ddp_lab.check import check` in a real Jupyter kernel (ipykernel, driven by
jupyter_client as a notebook front end drives it): functions defined in cells, one of
them calling another's (allreduce_naive calls reduce_naive), run on real gloo ranks
forked from the kernel; the cell's rich output is the verdicts' table."""

from __future__ import annotations

import queue

import pytest

from helpers import REPO, child_env

import jupyter_client

CELLS = [
    "import torch\nfrom torch import distributed as dist\nfrom torch.distributed import ReduceOp",
    # the notebook's broadcast_naive, as the sheet writes it
    "def broadcast_naive(tensor, src):\n"
    "    if dist.get_rank() == src:\n"
    "        for i in range(dist.get_world_size()):\n"
    "            if i != dist.get_rank():\n"
    "                dist.send(tensor, i)\n"
    "    else:\n"
    "        dist.recv(tensor, src)",
    # a reduce that rebinds its argument for MAX, in a cell of its own
    "def reduce_naive(tensor, dst, op=ReduceOp.SUM):\n"
    "    if dist.get_rank() == dst:\n"
    "        for i in range(dist.get_world_size()):\n"
    "            if i != dst:\n"
    "                buff = torch.empty_like(tensor)\n"
    "                dist.recv(buff, i)\n"
    "                if op == ReduceOp.MAX:\n"
    "                    tensor = torch.max(tensor, buff)\n"
    "                elif op == ReduceOp.MIN:\n"
    "                    tensor = torch.min(tensor, buff)\n"
    "                elif op == ReduceOp.PRODUCT:\n"
    "                    tensor *= buff\n"
    "                else:\n"
    "                    tensor += buff\n"
    "    else:\n"
    "        dist.send(tensor, dst)",
    "def allreduce_naive(tensor, op=ReduceOp.SUM):\n"
    "    reduce_naive(tensor, dst=0, op=op)\n"
    "    broadcast_naive(tensor, src=0)",
]


def _run(kc, code: str, timeout: float = 240) -> list[dict]:
    msg_id = kc.execute(code)
    outputs = []
    while True:
        try:
            msg = kc.get_iopub_msg(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no answer to {code!r} in {timeout} s")
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] in ("execute_result", "display_data", "stream", "error"):
            outputs.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return outputs


@pytest.mark.dist
def test_check_from_a_jupyter_kernel(tmp_path):
    km = jupyter_client.KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(tmp_path), env=child_env())
    try:
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        for cell in CELLS:
            out = _run(kc, cell)
            assert not [o for o in out if o["msg_type"] == "error"], out
        out = _run(kc, "from ddp_lab.check import check\n"
                       "check(broadcast_naive, allreduce_naive, worlds=(1, 2, 3), quiet=True)")
        errors = [o["content"] for o in out if o["msg_type"] == "error"]
        assert not errors, errors
        result = [o for o in out if o["msg_type"] == "execute_result"]
        assert result, out
        html = result[0]["content"]["data"]["text/html"]
        assert "<table>" in html
        rows = {cells[0]: cells[2] for cells in (
            [c.split("</td>")[0] for c in r.split("<td>")[1:]] for r in html.split("<tr>")[2:])}
        assert rows["broadcast_naive"] == "pass", html
        assert rows["allreduce_naive"] == "wrong", html
        assert "rebinds its argument `tensor` in reduce_naive" in html, html
        assert "broadcast_naive" in result[0]["content"]["data"]["text/plain"]
        kc.stop_channels()
    finally:
        km.shutdown_kernel(now=True)
