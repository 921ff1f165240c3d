"""Asynchronous copies with pyACL: two streams, memset_async on host memory, a DVPP buffer as
the device side, memcpy_async host -> device -> host, synchronize_stream.

An equivalent, written for this project, of Ascend/samples
``python/level1_single_api/1_acl/2_memory_management/memcpy_host_device_async_python/src/memcpy_host_device_async_python.py``
(Apache-2.0): the same options, the same pyACL calls in the same order, and the same log lines
(including its second view, which reads the host buffer back with kind DEVICE_TO_HOST: the
copy direction follows the addresses, as CANN documents for ``aclrtMemcpy``).

    python -m runtime.acl examples/acl/memcpy_host_device_async.py --release_cycle 2
"""

import argparse
import logging
import sys
from time import sleep

import numpy as np

import acl

ACL_SUCCESS = 0
ACL_DDR_MEM, ACL_HBM_MEM = 0, 1
H2H, H2D, D2H = 0, 1, 2

log = logging.getLogger("memcpy_host_device")
log.setLevel(logging.DEBUG)
_h = logging.StreamHandler()
_h.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s]>>> %(message)s"))
log.addHandler(_h)


def failed(what, ret):
    if ret != ACL_SUCCESS:
        log.error(" %s failed ret = %s", what, ret)
        return True
    return False


def show(label, ptr, size, kind):
    raw = np.ones(size, dtype=np.byte).tobytes()
    failed("acl.rt.memcpy", acl.rt.memcpy(acl.util.bytes_to_ptr(raw), size, ptr, size, kind))
    log.info("%s is %s", label, np.frombuffer(raw, dtype=np.byte))


def mem_report(cycle, release):
    for name, attr in (("DDR", ACL_DDR_MEM), ("HBM", ACL_HBM_MEM)):
        free, total, ret = acl.rt.get_mem_info(attr)
        if failed("acl.rt.get_mem_info", ret):
            return False
        log.info(
            "At number_of_cycles = %s, release_cycle = %s, "
            + name
            + " free memory:%s Byte, "
            + name
            + " total memory:%s Byte.",
            cycle,
            release,
            free,
            total,
        )
    return True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--release_cycle", type=int, default=2, help="Specify the release period")
    p.add_argument(
        "--number_of_cycles", type=int, default=1, help="The number of overall process cycles"
    )
    p.add_argument("--device_id", type=int, default=0, help="The ID of device currently in use")
    p.add_argument(
        "--memory_size", type=int, default=10485760, help="Single request memory size, in bytes"
    )
    a = p.parse_args()
    log.info(
        "Using params are as follows.\n  device id : %s\n  release cycle : %s\n  number of cycles : %s\n  memory size : %s Bytes\n",
        a.device_id,
        a.release_cycle,
        a.number_of_cycles,
        a.memory_size,
    )
    if failed("acl.init", acl.init()) or failed(
        "acl.rt.set_device", acl.rt.set_device(a.device_id)
    ):
        sys.exit(1)
    context, ret = acl.rt.create_context(a.device_id)
    if failed("acl.rt.create_context", ret):
        sys.exit(1)
    stream, ret = acl.rt.create_stream()
    if failed("acl.rt.create_stream", ret):
        sys.exit(1)
    _second_stream, ret = acl.rt.create_stream()  # made, as in the original, and left unused
    if failed("acl.rt.create_stream", ret) or not mem_report(0, 0):
        sys.exit(1)

    size = a.memory_size
    cycle = 0
    while cycle != a.number_of_cycles:
        dvpp_buffers = []
        release = 0
        while release != a.release_cycle:
            host, ret = acl.rt.malloc_host(size)
            if failed("acl.rt.malloc_host", ret):
                continue
            if failed("acl.rt.memset_async", acl.rt.memset_async(host, size, 7, size, stream)):
                continue
            dev, ret = acl.media.dvpp_malloc(size)
            if failed("acl.media.dvpp_malloc", ret):
                continue
            dvpp_buffers.append(dev)
            if failed("acl.rt.synchronize_stream", acl.rt.synchronize_stream(stream)):
                continue
            show("At first memset host data", host, size, H2H)
            if failed(
                "acl.rt.memcpy_async", acl.rt.memcpy_async(dev, size, host, size, H2D, stream)
            ):
                continue
            back, ret = acl.rt.malloc_host(size)
            if failed("acl.rt.malloc_host", ret):
                continue
            if not mem_report(cycle, release):
                sys.exit(1)
            if failed("acl.rt.synchronize_stream", acl.rt.synchronize_stream(stream)):
                continue
            show("At memcpy device data", host, size, D2H)
            if failed(
                "acl.rt.memcpy_async", acl.rt.memcpy_async(back, size, dev, size, D2H, stream)
            ):
                continue
            failed("acl.rt.free_host", acl.rt.free_host(host))
            if failed("acl.rt.synchronize_stream", acl.rt.synchronize_stream(stream)):
                continue
            if failed("acl.rt.free_host", acl.rt.free_host(back)):
                continue
            release += 1
            sleep(1)
        for dev in dvpp_buffers:
            failed("acl.media.dvpp_free", acl.media.dvpp_free(dev))
        cycle += 1
        sleep(1)
        if not mem_report(cycle, release):
            sys.exit(1)

    for what, ret in (
        ("acl.rt.destroy_context", acl.rt.destroy_context(context)),
        ("acl.rt.reset_device", acl.rt.reset_device(a.device_id)),
        ("acl.finalize", acl.finalize()),
    ):
        if ret != ACL_SUCCESS:
            log.error("%s ret = %s", what, ret)
            sys.exit(1)
    print("run success!")


if __name__ == "__main__":
    main()
