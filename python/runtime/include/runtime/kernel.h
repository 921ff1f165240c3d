/*
 * runtime/kernel.h - the C ABI of native kernels for the `runtime` package.
 *
 * A native kernel is one C function:
 *
 *     int32_t my_kernel(uint32_t block_idx, uint32_t block_num, void **params);
 *
 * A launch of `block_dim` blocks calls it once per block, concurrently on the device's
 * compute workers, each call with its own block index (0 .. block_num-1) and its own array
 * of argument pointers, in the launch's argument order:
 *
 *   argument                         params[i] points to
 *   ------------------------------   --------------------------------------------
 *   DeviceBuffer (or a view of one)  its first element (device memory is host memory)
 *   Python int / bool                an int64_t
 *   Python float                     a double
 *   Python complex                   two doubles: real, imaginary
 *   numpy scalar (numpy.float32(1))  a value of that dtype
 *                                    (ml_dtypes.bfloat16: 2 bytes, the upper half of
 *                                    a float32's bits, rounded to nearest even)
 *
 * Return 0 on success. Any other value fails the launch: the stream's next synchronize()
 * raises runtime.KernelError with .code set to it and .block to the (lowest) failing block.
 *
 * The runtime checks the arguments before the call (live buffers of the launch's device,
 * within bounds, the declared argument count), never the machine code: reading or writing
 * outside a buffer, or writing an argument declared read-only, is undefined behaviour, as in
 * a CUDA kernel. The call holds no Python GIL; it must not call back into Python (numba
 * @cfunc code compiled in nopython mode does not) and must not unwind (no C++ exception may
 * leave it). Blocks of one launch may run at the same time: each block should write only its
 * share of an output (runtime_block_range below splits n items the way the built-in kernels
 * do).
 *
 * Load a compiled kernel with runtime.Kernel.load(path, "my_kernel") or, for code made at run
 * time, runtime.Kernel.from_cfunc(numba_cfunc_or_ctypes_function_or_address). Compile with
 * `cc -O2 -shared -fPIC -I"$(python -c 'import runtime; print(runtime.get_include())')"`.
 */
#ifndef RUNTIME_KERNEL_H
#define RUNTIME_KERNEL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Version of this ABI (the signature and the params convention above). */
#define RUNTIME_KERNEL_ABI_VERSION 1

/* Symbol visibility for kernels in a shared library built with -fvisibility=hidden. */
#if defined(_WIN32)
#define RUNTIME_KERNEL_EXPORT __declspec(dllexport)
#else
#define RUNTIME_KERNEL_EXPORT __attribute__((visibility("default")))
#endif

/* The type of a native kernel. */
typedef int32_t (*runtime_kernel_fn)(uint32_t block_idx, uint32_t block_num, void **params);

/* Declare or define a kernel with the right signature and linkage:
 *     RUNTIME_KERNEL(add_custom) { float *out = (float *)params[0]; ... return 0; }
 */
#define RUNTIME_KERNEL(name) \
    RUNTIME_KERNEL_EXPORT int32_t name(uint32_t block_idx, uint32_t block_num, void **params)

/* This block's contiguous share [*begin, *end) of n items: the shares of blocks 0..num-1 are
 * disjoint, in order, cover [0, n) and differ in length by at most one. */
static inline void runtime_block_range(uint64_t n, uint32_t idx, uint32_t num,
                                       uint64_t *begin, uint64_t *end) {
    if (num == 0) {
        *begin = 0;
        *end = n;
        return;
    }
    *begin = (uint64_t)(((unsigned __int128)n * idx) / num);
    *end = (uint64_t)(((unsigned __int128)n * (idx + 1u)) / num);
}

#ifdef __cplusplus
}
#endif

#endif /* RUNTIME_KERNEL_H */
