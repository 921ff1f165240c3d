"""The peers beside the runtime and the machine they run on.

``Peers`` imports pyopencl and torch lazily, only when asked for; any failure (not installed,
no OpenCL CPU device) marks that peer missing with its error instead of stopping the run.
``ThreadQueueStream`` is the stdlib peer's executor. ``machine_info`` records the host, the
versions and the load average for the report.
"""

from __future__ import annotations

import datetime
import os
import platform
import queue
import threading

import numpy as np

import runtime as rt

_OCL_SRC = """
__kernel void noop(void) {}
__kernel void scale(__global float *out, __global const float *x, const float alpha) {
    size_t i = get_global_id(0);
    out[i] = alpha * x[i];
}
"""


class ThreadQueueStream:
    """The stdlib peer: one worker thread draining a ``queue.Queue`` of callables."""

    def __init__(self):
        self.q: queue.Queue = queue.Queue()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        get, done = self.q.get, self.q.task_done
        while True:
            f = get()
            if f is None:
                done()
                return
            try:
                f()
            finally:
                done()

    def close(self):
        self.q.put(None)
        self.t.join()


class Peers:
    """Imports and sets up the peers; a failure marks the peer missing with its error."""

    def __init__(self, wanted):
        self.missing: dict[str, str] = {}
        self.versions: dict[str, str] = {"numpy": np.__version__}
        self.cl = self.torch = None
        self.info: dict[str, str] = {}
        if "pyopencl" in wanted:
            try:
                import pyopencl as cl

                dev = None
                for p in cl.get_platforms():
                    for d in p.get_devices():
                        if d.type & cl.device_type.CPU:
                            dev = d
                            break
                    if dev is not None:
                        break
                if dev is None:
                    raise RuntimeError(
                        "no OpenCL CPU device (is pocl-binary-distribution installed?)"
                    )
                self.cl = cl
                self.cl_dev = dev
                self.cl_ctx = cl.Context([dev])
                self.cl_q = cl.CommandQueue(self.cl_ctx, dev)
                self.cl_prg = cl.Program(self.cl_ctx, _OCL_SRC).build()
                self.cl_noop = cl.Kernel(self.cl_prg, "noop")
                self.versions["pyopencl"] = cl.VERSION_TEXT
                self.info["opencl_device"] = f"{dev.platform.version} / {dev.name.strip()}"
            except Exception as e:  # any failure: the peer is missing, with the reason
                self.cl = None
                self.missing["pyopencl"] = f"{type(e).__name__}: {e}"
        if "torch" in wanted:
            try:
                import torch

                self.torch = torch
                self.versions["torch"] = torch.__version__
                self.info["torch_threads"] = str(torch.get_num_threads())
            except Exception as e:
                self.missing["torch"] = f"{type(e).__name__}: {e}"


def machine_info(peers: Peers) -> dict:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    mem = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_bytes": mem,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "runtime": rt.__version__,
        "versions": dict(peers.versions),
        "peer_info": dict(peers.info),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "loadavg_start": _loadavg(),
        # Set by `python -m runtime bench` (see `cli.exec_with_quiet_blas`), or by the user.
        "openblas_thread_timeout": os.environ.get("OPENBLAS_THREAD_TIMEOUT"),
        "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
    }


def _loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
