"""needle.distributed: MPI data parallelism.

A 2-process ``mpiexec -n 2`` job must train to the same parameters as one process on the full
batch (the oracle: plain single-process SGD), and the collectives must give hand-computed sums.
A job whose ranks disagree (one raises, one lacks a gradient, parameters in another order or
shape) must end quickly with an error, never hang or sum unrelated numbers.
Needs the lectures extra (mpi4py and the mpich wheel, which puts mpiexec beside python).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

# The lectures extra (installed by `make test`) provides mpi4py and mpiexec.
import mpi4py  # noqa: E402,F401
import numpy as np
import pytest

import needle as ndl  # noqa: E402
from needle import distributed as dist  # noqa: E402

pytestmark = pytest.mark.apps

ROOT = Path(__file__).resolve().parents[2]


def _mpiexec() -> str:
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    assert found, "mpiexec not found: install the mpich wheel (pip install mpich)"
    return found


def _run(args, timeout=240):
    result = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def _run_job(script: str, timeout: float = 60):
    """(returncode, stdout + stderr, seconds) of ``script`` on 2 ranks; a job still running
    after ``timeout`` seconds is killed with all its processes (no rank left spinning) and the
    test fails."""
    start = time.perf_counter()
    job = subprocess.Popen(
        [_mpiexec(), "-n", "2", sys.executable, "-c", textwrap.dedent(script)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        out, _ = job.communicate()
        pytest.fail(f"the 2-rank job was still running after {timeout} s (hung):\n{out}")
    return job.returncode, out, time.perf_counter() - start


# Each rank r has gradients a.grad = r + 1 (2, 3) and b.grad = r + 1 (4,) before the script's body.
SETUP = """
    import numpy as np, needle as ndl
    from needle import distributed as dist
    r = dist.rank()
    a = ndl.Tensor(np.zeros((2, 3)), dtype="float32")
    b = ndl.Tensor(np.zeros(4), dtype="float32")
    a.grad = ndl.Tensor(np.full((2, 3), r + 1.0), dtype="float32")
    b.grad = ndl.Tensor(np.full(4, r + 1.0), dtype="float32")
"""


def test_a_failing_rank_ends_the_job():
    """Rank 1 raises while rank 0 waits in allreduce_gradients: the job must abort, not hang."""
    code, out, seconds = _run_job(
        SETUP
        + """
    if r == 1:
        raise RuntimeError("rank 1 breaks down")
    dist.allreduce_gradients([a, b])
    print("rank 0 got past the allreduce")
    """
    )
    assert code != 0, out
    assert "RuntimeError: rank 1 breaks down" in out, out
    assert "rank 0 got past" not in out, out
    assert seconds < 30, seconds


def test_the_abort_waits_until_the_message_has_been_read(monkeypatch):
    """test_a_failing_rank_ends_the_job failed now and then under load: the abort overtook the
    rank's message, which mpiexec had not read yet ("RuntimeError: " and no text). The hook
    must abort only once the reader of the rank's output pipe (here a thread that starts
    reading 0.3 s late) has taken every byte of the message."""
    import threading
    import types

    read_fd, write_fd = os.pipe()
    message = b"Traceback ...\nRuntimeError: rank 1 breaks down\n"
    received, at_abort = [], []

    def reader():
        time.sleep(0.3)
        received.append(os.read(read_fd, 1 << 16))

    def abort(code):
        at_abort.append((code, b"".join(received)))

    monkeypatch.setattr(
        dist, "MPI", types.SimpleNamespace(COMM_WORLD=types.SimpleNamespace(Abort=abort))
    )
    monkeypatch.setattr(dist, "_OUTPUT_FDS", (write_fd,))
    hook = dist._abort_on_uncaught_exception(lambda *exc_info: os.write(write_fd, message))
    thread = threading.Thread(target=reader)
    thread.start()
    try:
        hook(RuntimeError, RuntimeError("rank 1 breaks down"), None)
    finally:
        thread.join(10)
        os.close(read_fd)
        os.close(write_fd)
    assert at_abort == [(1, message)]


def test_waiting_for_the_reader_is_bounded(tmp_path):
    """Nobody reads the pipe: the wait gives up after its limit (the job must still end); a
    file is not waited on at all."""
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"unread")
    try:
        start = time.perf_counter()
        dist._wait_until_read([write_fd], limit=0.2)
        assert 0.15 < time.perf_counter() - start < 5
    finally:
        os.close(read_fd)
        os.close(write_fd)
    with open(tmp_path / "out.txt", "w") as f:
        start = time.perf_counter()
        dist._wait_until_read([f.fileno()], limit=5)
        assert time.perf_counter() - start < 1


# Each rank writes what it saw to its own file (printed lines of two ranks can interleave).
REPORT = """
    try:
        dist.{call}
        seen = "summed"
    except ValueError as error:
        seen = f"refused: {{error}}"
    open(f"{out}/rank{{r}}.txt", "w").write(seen)
"""


# case: (what the script does on each rank, the call, the error every rank must raise)
DISAGREE = {
    "missing gradient": (
        "if r == 1: b.grad = None",
        "allreduce_gradients([a, b])",
        "parameter 1 \\(\\(4,\\) float32\\) has no gradient on rank 1",
    ),
    "other order": (
        "params = [a, b] if r == 0 else [b, a]",
        "allreduce_gradients(params)",
        "parameter 0 is \\(2, 3\\) float32 on rank 0 but \\(4,\\) float32 on rank 1",
    ),
    "same size, other shape": (
        "if r == 1: a = ndl.Tensor(np.zeros((3, 2)), dtype='float32'); "
        "a.grad = ndl.Tensor(np.ones((3, 2)), dtype='float32')",
        "allreduce_gradients([a, b])",
        "parameter 0 is \\(2, 3\\) float32 on rank 0 but \\(3, 2\\) float32 on rank 1",
    ),
    "fewer parameters": (
        "params = [a, b] if r == 0 else [a]",
        "allreduce_gradients(params)",
        "rank 0 passes 2 parameters, rank 1 passes 1",
    ),
    "broadcast, other order": (
        "params = [a, b] if r == 0 else [b, a]",
        "broadcast_parameters(params)",
        "broadcast_parameters: parameter 0 is \\(2, 3\\)",
    ),
}


@pytest.mark.parametrize("case", list(DISAGREE))
def test_ranks_that_disagree_all_raise_the_same_error(case, tmp_path):
    body, call, message = DISAGREE[case]
    code, out, _ = _run_job(SETUP + f"\n    {body}\n" + REPORT.format(call=call, out=tmp_path))
    assert code == 0, out
    for r in (0, 1):
        seen = (tmp_path / f"rank{r}.txt").read_text()
        assert re.match(f"refused: .*{message}", seen), (case, r, seen)


def test_two_ranks_match_single_process_full_batch(tmp_path):
    common = ["-m", "companion.apps.distributed_train", "--steps", "25", "--batch", "64"]
    _run([sys.executable, *common, "--out", str(tmp_path / "one.npz")])
    _run([_mpiexec(), "-n", "2", sys.executable, *common, "--out", str(tmp_path / "two.npz")])
    one, two = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    assert int(one["world"]) == 1 and int(two["world"]) == 2
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-5)
    assert one["losses"][-1] < 0.6 * one["losses"][0]  # it trained
    for i in range(4):
        a, b = one[f"param_{i}"], two[f"param_{i}"]
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5 * np.abs(a).max())
    # counted from the first step: one Allreduce of every gradient per step, 4-byte floats
    n_params = sum(one[f"param_{i}"].size for i in range(4))
    assert int(two["comm_calls"]) == 25
    assert int(two["comm_bytes"]) == 25 * 4 * n_params


def test_collectives_on_two_ranks():
    script = textwrap.dedent("""
        import numpy as np, needle as ndl
        from needle import distributed as dist
        r, k = dist.rank(), dist.world_size()
        assert k == 2, k
        a = ndl.Tensor(np.zeros((2, 3)), dtype="float32")
        b = ndl.Tensor(np.zeros(4), dtype="float32")
        a.grad = ndl.Tensor(np.full((2, 3), r + 1.0), dtype="float32")
        b.grad = ndl.Tensor(np.arange(4.0) * (r + 1), dtype="float32")
        dist.allreduce_gradients([a, b])
        assert np.array_equal(a.grad.numpy(), np.full((2, 3), 1.5)), a.grad
        assert np.array_equal(b.grad.numpy(), np.arange(4.0) * 1.5), b.grad
        a.grad = ndl.Tensor(np.full((2, 3), r + 1.0), dtype="float32")
        b.grad = ndl.Tensor(np.full(4, 1.0), dtype="float32")
        dist.allreduce_gradients([a, b], average=False)
        assert np.array_equal(a.grad.numpy(), np.full((2, 3), 3.0)), a.grad
        p = ndl.Tensor(np.full(3, 10.0 * r), dtype="float32")
        dist.broadcast_parameters([p], root=1)
        assert np.array_equal(p.numpy(), np.full(3, 10.0)), p
        assert dist.allreduce_mean(r) == 0.5
        if dist.allreduce_mean(1.0) == 1.0 and r == 0:  # reached only if both ranks got here
            print("both ranks ok")
    """)
    out = _run([_mpiexec(), "-n", "2", sys.executable, "-c", script]).stdout
    assert "both ranks ok" in out, out


def test_single_process_world_and_errors():
    assert dist.world_size() == 1 and dist.rank() == 0
    p = ndl.Tensor(np.ones(3), dtype="float32")
    p.grad = ndl.Tensor(np.array([1.0, 2.0, 3.0]), dtype="float32")
    dist.allreduce_gradients([p])
    np.testing.assert_array_equal(p.grad.numpy(), [1.0, 2.0, 3.0])
    q = ndl.Tensor(np.ones(2), dtype="float32")
    with pytest.raises(
        ValueError, match="parameter 1 \\(\\(2,\\) float32\\) has no gradient on rank 0"
    ):
        dist.allreduce_gradients([p, q])
    q.grad = ndl.Tensor(np.ones(3), dtype="float32")
    with pytest.raises(
        ValueError,
        match="gradient of parameter 1 is \\(3,\\) float32 on rank 0, "
        "the parameter \\(2,\\) float32",
    ):
        dist.allreduce_gradients([p, q])
    with pytest.raises(TypeError, match="parameter 1 is a ndarray, not a Tensor"):
        dist.allreduce_gradients([p, np.ones(2)])
    with pytest.raises(ValueError, match="no parameters"):
        dist.allreduce_gradients([])
    with pytest.raises(ValueError, match="root 1 is not a rank"):
        dist.broadcast_parameters([p], root=1)
