"""Writing an operator: an Ascend C-style ``add_custom`` in three forms.

1. numba ``@cfunc`` machine code behind the C ABI of ``runtime/kernel.h``, tiled by block
   index the way an Ascend C kernel uses ``GetBlockIdx()`` / ``GetBlockNum()``, launched with
   ``block_dim=8`` (needs numba: ``pip install "runtime-vdev[numba]"``);
2. the same kernel in C, compiled from a ``.c`` file with ``cc`` at run time;
3. a plain Python callable (numpy on views of the buffers), for comparison.

Each is checked against numpy and timed with events, machine code at ``block_dim=8`` against
``block_dim=1``. Parts whose tools are missing are skipped with a message.
"""

import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

import runtime

TOTAL_LENGTH = 8 * 2048 * 64  # elements: 8 blocks x 64 tiles of 2,048
TILE_LENGTH = 2048  # elements a block handles per step (a tile in local memory on a device)
REPEAT = 20

runtime.init()
stream = runtime.Stream()
rng = np.random.default_rng(0)
x_host = rng.standard_normal(TOTAL_LENGTH).astype(np.float32)
y_host = rng.standard_normal(TOTAL_LENGTH).astype(np.float32)
x, y = runtime.to_device(x_host), runtime.to_device(y_host)
want = x_host + y_host


def timed(launch, block_dim):
    """Mean milliseconds per launch over REPEAT launches, measured with events."""
    z = runtime.empty(TOTAL_LENGTH, "float32")
    launch(z, block_dim)  # warm up (and the result we check)
    stream.synchronize()
    np.testing.assert_array_equal(z.copy_to_host(), want)
    start, end = runtime.Event(), runtime.Event()
    start.record(stream)
    for _ in range(REPEAT):
        launch(z, block_dim)
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / REPEAT


results = {}

# --- 1. numba @cfunc ---------------------------------------------------------------------------
try:
    import numba
    from numba import carray, types
except ImportError:
    numba = None
    print("numba is not installed: skipping the @cfunc kernel (pip install numba)")

if numba is not None:
    # int32_t add_custom(uint32_t block_idx, uint32_t block_num, void **params)
    signature = types.int32(types.uint32, types.uint32, types.CPointer(types.voidptr))

    @numba.cfunc(signature)
    def add_custom(block_idx, block_num, params):
        total = carray(params[3], (1,), np.int64)[0]
        x = carray(params[0], (total,), np.float32)
        y = carray(params[1], (total,), np.float32)
        z = carray(params[2], (total,), np.float32)
        # This block's share, as an Ascend C kernel computes it from GetBlockIdx/GetBlockNum.
        block_length = total // block_num
        start = block_idx * block_length
        end = total if block_idx == block_num - 1 else start + block_length
        # Tile by tile (on a device: copy in, compute, copy out per tile). Slicing first lets
        # numba see non-negative indices and vectorise the loop.
        for tile in range(start, end, TILE_LENGTH):
            stop = min(tile + TILE_LENGTH, end)
            xt, yt, zt = x[tile:stop], y[tile:stop], z[tile:stop]
            for i in range(zt.shape[0]):
                zt[i] = xt[i] + yt[i]
        return 0

    # x and y are only read: other work that reads them may run beside this kernel.
    numba_kernel = runtime.Kernel.from_cfunc(add_custom, nargs=4, read_only=(0, 1))

    def launch_numba(z, block_dim):
        numba_kernel(x, y, z, TOTAL_LENGTH, stream=stream, block_dim=block_dim)

    for block_dim in (1, 8):
        results[f"numba @cfunc, block_dim={block_dim}"] = timed(launch_numba, block_dim)

# --- 2. C, compiled at run time ------------------------------------------------------------------
C_SOURCE = r"""
#include <runtime/kernel.h>

#define TILE_LENGTH 2048

RUNTIME_KERNEL(add_custom) {
    const float *x = (const float *)params[0];
    const float *y = (const float *)params[1];
    float *z = (float *)params[2];
    int64_t total = *(const int64_t *)params[3];
    uint64_t start, end;
    runtime_block_range((uint64_t)total, block_idx, block_num, &start, &end);
    for (uint64_t tile = start; tile < end; tile += TILE_LENGTH) {
        uint64_t stop = tile + TILE_LENGTH < end ? tile + TILE_LENGTH : end;
        for (uint64_t i = tile; i < stop; i++) z[i] = x[i] + y[i];
    }
    return 0;
}
"""

cc = shutil.which(os.environ.get("CC", "cc"))
if cc is None:
    print("no C compiler (cc) found: skipping the C kernel")
else:
    with tempfile.TemporaryDirectory() as tmp:
        src, lib = os.path.join(tmp, "add_custom.c"), os.path.join(tmp, "libadd_custom.so")
        with open(src, "w") as f:
            f.write(C_SOURCE)
        subprocess.run(
            [cc, "-O2", "-shared", "-fPIC", "-I", runtime.get_include(), src, "-o", lib],
            check=True,
        )
        c_kernel = runtime.Kernel.load(lib, "add_custom", nargs=4, read_only=(0, 1))

    def launch_c(z, block_dim):
        c_kernel(x, y, z, TOTAL_LENGTH, stream=stream, block_dim=block_dim)

    for block_dim in (1, 8):
        results[f"C (cc -O2), block_dim={block_dim}"] = timed(launch_c, block_dim)


# --- 3. a Python callable ------------------------------------------------------------------------
def add_python(x, y, z):
    """Buffers arrive as numpy views of device memory; the block index works here too."""
    n = len(z)
    i, blocks = runtime.get_block_idx(), runtime.get_block_num()
    lo, hi = n * i // blocks, n * (i + 1) // blocks
    np.add(x[lo:hi], y[lo:hi], out=z[lo:hi])


def launch_python(z, block_dim):
    stream.launch_kernel(add_python, (x, y, z), block_dim=block_dim)


results["Python callable (numpy), block_dim=1"] = timed(launch_python, 1)

print(f"add_custom of {TOTAL_LENGTH:,} float32, checked against numpy; ms per launch:")
for name, ms in results.items():
    print(f"  {name:<40} {ms:8.3f}")
if sys.platform == "linux":
    print(f"(device {stream.device} has {os.cpu_count()} host cores to run blocks on)")

stream.destroy()
runtime.shutdown()
