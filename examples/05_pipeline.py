"""A copy -> compute -> copy pipeline over chunks on two streams.

Chunk i goes to stream i % 2: H2D copy, a native kernel, D2H copy. With enablePipelining on,
copies on one stream overlap the kernel on the other. Pass a path to write a timeline trace.
"""

import sys

import numpy as np

import runtime

runtime.init()
chunks, n = 8, 1 << 20
host_in = np.random.rand(chunks, n).astype(np.float32)
host_out = np.empty_like(host_in)
streams = [runtime.Stream(0), runtime.Stream(0)]
bufs = [runtime.empty(n, np.float32) for _ in streams]


def run():
    for i in range(chunks):
        s, b = streams[i % 2], bufs[i % 2]
        runtime.memcpy_host_to_device(b, host_in[i], s)
        s.launch_kernel(runtime.kernels.scale, (b, b, 3.0))
        runtime.memcpy_device_to_host(host_out[i], b, s)
    runtime.stream_synchronize()


if len(sys.argv) > 1:
    with runtime.profile(sys.argv[1]):
        run()
    print("trace written to", sys.argv[1])
else:
    run()
assert np.allclose(host_out, 3 * host_in)
print(f"pipelined {chunks} chunks of {n * 4 >> 20} MiB on {len(streams)} streams")
runtime.shutdown()
