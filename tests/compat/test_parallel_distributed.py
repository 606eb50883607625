"""apex.parallel across 2 real gloo processes on loopback (SyncBatchNorm, DDP averaging, Reducer)."""
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "_scripts" / "two_rank_parallel.py"


def test_sync_batchnorm_ddp_and_reducer_over_two_processes():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, str(SCRIPT)], env=dict(env, RANK=str(rank)), cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    try:
        results = [proc.communicate(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for rank, (proc, (out, err)) in enumerate(zip(procs, results)):
        assert proc.returncode == 0, err
        assert f"rank {rank} ok" in out
