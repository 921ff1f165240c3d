"""Host <-> DVPP memory copies with pyACL: malloc_host / media.dvpp_malloc, memset, memcpy,
get_mem_info before and after, dvpp_free.

An equivalent, written for this project, of Ascend/samples
``python/level1_single_api/1_acl/2_memory_management/memcpy_host_DVPP_python/src/memcpy_host_dvpp.py``
(Apache-2.0): the same options, the same pyACL calls in the same order, and the same log lines
(its second view reads the host buffer with kind DEVICE_TO_HOST, as the original does).

    python -m runtime.acl examples/acl/memcpy_host_dvpp.py --release_cycle 2

Without arguments it runs 2 release cycles and ends; the Ascend sample's default,
``--release_cycle -1``, repeats until interrupted (Ctrl-C), here as there.
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
        log.error("{} failed ret = {}".format(what, ret))
        return True
    return False


def show(label, ptr, size, kind):
    raw = np.ones(size, dtype=np.byte).tobytes()
    failed("acl.rt.memcpy", acl.rt.memcpy(acl.util.bytes_to_ptr(raw), size, ptr, size, kind))
    log.info("{} is {}".format(label, np.frombuffer(raw, dtype=np.byte)))


def mem_report(cycle, release):
    for name, attr in (("DDR", ACL_DDR_MEM), ("HBM", ACL_HBM_MEM)):
        free, total, ret = acl.rt.get_mem_info(attr)
        if failed("acl.rt.get_mem_info", ret):
            return False
        log.info(
            "At number_of_cycles = {}, release_cycle = {}, {} free memory:{} Byte, {} total memory:{} Byte.".format(
                cycle, release, name, free, name, total
            )
        )
    return True


def main():
    p = argparse.ArgumentParser()
    p.add_argument(
        "--release_cycle",
        type=int,
        default=2,
        help="Specify the release period (default 2; -1 repeats until Ctrl-C, the Ascend sample's default)",
    )
    p.add_argument(
        "--number_of_cycles", type=int, default=1, help="The number of overall process cycles"
    )
    p.add_argument("--device_id", type=int, default=0, help="The ID of device currently in use")
    p.add_argument(
        "--memory_size", type=int, default=10485760, help="Single request memory size, in bytes"
    )
    p.add_argument("--memory_reuse", action="store_true", help="Whether to reuse the buffers")
    a = p.parse_args()
    log.info(
        "Using params are as follows.\n  device id : {}\n  release cycle : {}\n"
        "  number of cycles : {}\n  memory size : {} Bytes\n  memory_reuse : {}\n".format(
            a.device_id, a.release_cycle, a.number_of_cycles, a.memory_size, a.memory_reuse
        )
    )
    if failed("acl.init", acl.init()) or failed(
        "acl.rt.set_device", acl.rt.set_device(a.device_id)
    ):
        sys.exit(1)
    context, ret = acl.rt.create_context(a.device_id)
    if failed("acl.rt.create_context", ret) or not mem_report(0, 0):
        sys.exit(1)

    size = a.memory_size
    cycle = 0
    while cycle != a.number_of_cycles:
        hosts, devs = [], []

        def allocate():
            h, ret = acl.rt.malloc_host(size)
            if failed("acl.rt.malloc_host", ret):
                return None
            d, ret = acl.media.dvpp_malloc(size)
            if failed("acl.media.dvpp_malloc", ret):
                return None
            hosts.append(h)
            devs.append(d)
            return h, d

        pair = allocate() if a.memory_reuse else None
        release = 0
        while release != a.release_cycle:
            if not a.memory_reuse:
                pair = allocate()
            if pair is None:
                continue
            host, dev = pair
            if failed("acl.rt.memset", acl.rt.memset(host, size, 7, size)):
                continue
            show("At first memset host data", host, size, H2H)
            if failed("acl.rt.memcpy", acl.rt.memcpy(dev, size, host, size, H2D)):
                continue
            show("At memcpy device data", host, size, D2H)
            release += 1
            sleep(1)
            if not mem_report(cycle, release):
                sys.exit(1)
        for h in hosts:
            failed("acl.rt.free_host", acl.rt.free_host(h))
        for d in devs:
            failed("acl.media.dvpp_free", acl.media.dvpp_free(d))
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
            log.error("{} ret = {}".format(what, ret))
            sys.exit(1)
    print("run success!")


if __name__ == "__main__":
    main()
