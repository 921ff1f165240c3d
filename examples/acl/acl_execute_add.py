"""A single "Add" operator through pyACL: tensor descriptors, device buffers, data buffers,
op.execute_v2 on a stream, the result read back through malloc_host memory.

An equivalent, written for this project, of Ascend/samples
``python/level1_single_api/1_acl/4_blas/acl_operator_add/src/acl_execute_add.py``
(Apache-2.0): two random int32 8x16 matrices, the same pyACL calls in the same order and the
same printed stages and result. On an NPU the original needs the Add operator compiled into
``test_data/op_models`` (ATC); runtime.acl runs Add on its native kernel, so the folder given to
``acl.op.set_model_dir`` need not exist.

    python -m runtime.acl examples/acl/acl_execute_add.py
"""

import os

import numpy as np

import acl

ACL_SUCCESS = 0
ACL_MEM_MALLOC_NORMAL_ONLY = 2
ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST = 1, 2
ACL_FORMAT_ND = 2
ACL_DTYPE = {
    "float": 0,
    "float16": 1,
    "int8": 2,
    "int32": 3,
    "uint8": 4,
    "int16": 6,
    "int64": 9,
    "double": 11,
}


def check(what, ret):
    if ret != ACL_SUCCESS:
        raise Exception("{} failed ret={}".format(what, ret))


class AddOperator:
    """Sets ACL up, runs Add(a, b) once, tears everything down."""

    def __init__(self, device_id, a, b, model_dir, op_type="Add"):
        if a.shape != b.shape:
            raise ValueError("factor_a:{} factor_b:{} isn't same shape!!!".format(a.shape, b.shape))
        if a.dtype != b.dtype:
            raise ValueError("factor_a:{} factor_b:{} isn't same dtype!!!".format(a.dtype, b.dtype))
        self.device_id, self.a, self.b, self.op_type = device_id, a, b, op_type
        self.shape, self.dtype = list(a.shape), ACL_DTYPE[str(a.dtype)]
        self.in_descs, self.in_devs, self.in_bufs = [], [], []
        self.out_descs, self.out_devs, self.out_bufs, self.out_hosts = [], [], [], []
        print("init resource stage:")
        check("acl.init", acl.init())
        check("acl.rt.set_device", acl.rt.set_device(device_id))
        self.context, ret = acl.rt.create_context(device_id)
        check("acl.rt.create_context", ret)
        self.stream, ret = acl.rt.create_stream()
        check("acl.rt.create_stream", ret)
        self.attr = acl.op.create_attr()
        check("acl.op.set_model_dir", acl.op.set_model_dir(model_dir))
        print("init resource success")

    def inputs(self):
        print("gen input data stage:")
        for arr in (self.a, self.b):
            desc = acl.create_tensor_desc(self.dtype, self.shape, ACL_FORMAT_ND)
            size = acl.get_tensor_desc_size(desc)
            dev, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_NORMAL_ONLY)
            check("acl.rt.malloc", ret)
            raw = arr.tobytes()
            check(
                "acl.rt.memcpy",
                acl.rt.memcpy(
                    dev, size, acl.util.bytes_to_ptr(raw), size, ACL_MEMCPY_HOST_TO_DEVICE
                ),
            )
            self.in_descs.append(desc)
            self.in_devs.append(dev)
            self.in_bufs.append(acl.create_data_buffer(dev, size))
        print("gen input data success")

    def outputs(self):
        print("gen output data stage:")
        desc = acl.create_tensor_desc(self.dtype, self.shape, ACL_FORMAT_ND)
        size = acl.get_tensor_desc_size(desc)
        dev, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_NORMAL_ONLY)
        check("acl.rt.malloc", ret)
        self.out_descs.append(desc)
        self.out_devs.append(dev)
        self.out_bufs.append(acl.create_data_buffer(dev, size))
        self.out_hosts.append(acl.rt.malloc_host(size)[0])
        print("gen output data success")

    def forward(self):
        print("execute stage:")
        check(
            "acl.op.execute_v2",
            acl.op.execute_v2(
                self.op_type,
                self.in_descs,
                self.in_bufs,
                self.out_descs,
                self.out_bufs,
                self.attr,
                self.stream,
            ),
        )
        check("acl.rt.synchronize_stream", acl.rt.synchronize_stream(self.stream))
        print("execute success")

    def result(self):
        print("get operator result stage:")
        results = []
        for desc, dev, host in zip(self.out_descs, self.out_devs, self.out_hosts):
            size = acl.get_tensor_desc_size(desc)
            check("acl.rt.memcpy", acl.rt.memcpy(host, size, dev, size, ACL_MEMCPY_DEVICE_TO_HOST))
            print("shape:", tuple(self.shape))
            data = np.frombuffer(acl.util.ptr_to_bytes(host, size), dtype=self.a.dtype).reshape(
                tuple(self.shape)
            )
            print("ACL output:\n", data)
            results.append(data)
        print("get operator result success")
        return results

    def release(self):
        print("release source stage:")
        for bufs, devs, descs in (
            (self.in_bufs, self.in_devs, self.in_descs),
            (self.out_bufs, self.out_devs, self.out_descs),
        ):
            while descs:
                check("acl.destroy_data_buffer", acl.destroy_data_buffer(bufs.pop()))
                check("acl.rt.free", acl.rt.free(devs.pop()))
                acl.destroy_tensor_desc(descs.pop())
        acl.op.destroy_attr(self.attr)
        check("acl.rt.destroy_stream", acl.rt.destroy_stream(self.stream))
        check("acl.rt.destroy_context", acl.rt.destroy_context(self.context))
        check("acl.rt.reset_device", acl.rt.reset_device(self.device_id))
        check("acl.finalize", acl.finalize())
        print("release source success")

    def run(self):
        self.inputs()
        self.outputs()
        self.forward()
        out = self.result()
        self.release()
        return out


if __name__ == "__main__":
    a = np.random.randint(100, size=(8, 16)).astype(np.int32)
    b = np.random.randint(100, size=(8, 16)).astype(np.int32)
    print("factor_a:\n{} \nfactor_b:\n{}".format(a, b))
    here = os.path.dirname(os.path.abspath(__file__))
    AddOperator(0, a, b, os.path.join(here, "../test_data/op_models")).run()
