"""Data-parallel training: every device holds a replica of the model and a shard of the batch.

Each step, every device computes its gradient with native kernels on its own stream, the
gradients are summed with ``all_reduce`` (in stream order: no host synchronisation between the
backward pass, the reduction and the update), and every replica applies the same update. The
result is checked against full-batch gradient descent in numpy.

    python examples/data_parallel.py                        # 8 devices in one process
    mpiexec -n 2 python examples/data_parallel.py --mpi     # 2 processes (x 1 device each)
    mpiexec -n 2 python examples/data_parallel.py --mpi --devices 4   # 2 x 4 = 8 ranks

The model is linear regression, loss = |X W - Y|^2 / (2 B), gradient X^T (X W - Y) / B.
"""

from __future__ import annotations

import argparse

import numpy as np

import runtime
from runtime import kernels

D_IN, D_OUT, BATCH, STEPS, LR = 64, 16, 512, 20, 0.5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mpi", action="store_true", help="ranks across MPI processes (mpiexec)")
    ap.add_argument("--devices", type=int, default=None, help="devices per process")
    a = ap.parse_args()
    ndev = a.devices or (1 if a.mpi else 8)
    runtime.init(device_count=ndev, memory="256MiB")
    devices = list(range(ndev))
    if a.mpi:
        try:
            from runtime.comm import init_mpi
        except ImportError:
            from runtime._mpi import init_mpi
        comms = init_mpi(devices)
    else:
        from runtime.comm import init_all

        comms = init_all(devices)
    world = comms[0].size
    if BATCH % world:
        raise SystemExit(f"the batch of {BATCH} does not split over {world} ranks")
    shard = BATCH // world

    # The same data in every process; rank r trains on rows r*shard .. (r+1)*shard.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, D_IN)).astype(np.float32)
    w_true = rng.standard_normal((D_IN, D_OUT)).astype(np.float32)
    y = x @ w_true + 0.01 * rng.standard_normal((BATCH, D_OUT)).astype(np.float32)
    w0 = np.zeros((D_IN, D_OUT), np.float32)

    replicas = []
    for c in comms:
        rows = slice(c.rank * shard, (c.rank + 1) * shard)
        d = c.device
        replicas.append(
            {
                "comm": c,
                "stream": runtime.Stream(d),
                "x": runtime.to_device(np.ascontiguousarray(x[rows]), d),
                "xt": runtime.to_device(np.ascontiguousarray(x[rows].T), d),
                "y": runtime.to_device(np.ascontiguousarray(y[rows]), d),
                "w": runtime.to_device(w0, d),
                "pred": runtime.empty((shard, D_OUT), "float32", d),
                "grad": runtime.empty((D_IN, D_OUT), "float32", d),
            }
        )

    for _ in range(STEPS):
        for r in replicas:  # queue the whole step on every device; nothing waits here
            s = r["stream"]
            kernels.matmul(r["pred"], r["x"], r["w"], stream=s)  # forward: X W
            kernels.axpy(r["pred"], r["y"], -1.0, stream=s)  # error: X W - Y
            kernels.matmul(r["grad"], r["xt"], r["pred"], stream=s)  # X^T (X W - Y)
            kernels.scale(r["grad"], r["grad"], 1.0 / BATCH, stream=s)
            r["comm"].all_reduce(r["grad"], r["grad"], op="sum", stream=s)
            kernels.axpy(r["w"], r["grad"], -LR, stream=s)  # W -= lr * grad
    for r in replicas:
        r["stream"].synchronize()

    # Full-batch gradient descent in numpy gives the same weights.
    w = w0.copy()
    for _ in range(STEPS):
        w -= LR * (x.T @ (x @ w - y) / BATCH)
    for r in replicas:
        got = r["w"].copy_to_host()
        assert np.allclose(got, w, rtol=1e-4, atol=1e-5), np.abs(got - w).max()
    loss = float(np.square(x @ replicas[0]["w"].copy_to_host() - y).sum() / (2 * BATCH))
    first = comms[0]
    if first.rank == 0:
        where = "MPI" if a.mpi else "one process"
        print(
            f"{world} ranks ({where}, {len(comms)} device(s) per process): {STEPS} steps, "
            f"loss {loss:.5f}, weights match full-batch gradient descent"
        )
    for c in comms:
        c.destroy()
    runtime.shutdown()


if __name__ == "__main__":
    main()
