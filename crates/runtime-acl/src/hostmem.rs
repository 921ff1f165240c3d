//! Host memory the runtime did not hand out (a C program's stack, heap or static data): read
//! and written only through `process_vm_readv`, so an address that is not mapped, or not
//! writable, makes the call fail with an error instead of crashing the process.
//!
//! The kernel checks both ranges of every transfer as it copies (`EFAULT`), whoever owns the
//! memory; nothing here creates a Rust reference to it. Where the kernel refuses the system
//! call itself (a seccomp filter without `process_vm_readv`, `ENOSYS` / `EPERM`), the copy
//! falls back to a plain `memmove`, and the caller's promise that the range is valid is all
//! there is, as with CANN's own library.

use std::io;
use std::sync::atomic::{AtomicU8, Ordering};

/// 0: not tried yet, 1: the system call works, 2: refused (plain copies).
static VM_CALLS: AtomicU8 = AtomicU8::new(0);

/// Copy `len` bytes from address `src` to address `dst` (both of this process; they may
/// overlap only if equal ranges). Fails with `EFAULT` when a byte of either range cannot be
/// read (`src`) or written (`dst`); bytes of `dst` may have been written then.
pub(crate) fn copy(dst: usize, src: usize, len: usize) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    if VM_CALLS.load(Ordering::Relaxed) != 2 {
        let local = libc::iovec {
            iov_base: dst as *mut libc::c_void,
            iov_len: len,
        };
        let remote = libc::iovec {
            iov_base: src as *mut libc::c_void,
            iov_len: len,
        };
        // SAFETY: a system call with two valid iovec structs on the stack. The kernel reads
        // `remote` and writes `local` through its own checked user-memory access, so an
        // unmapped or read-only page yields EFAULT, never a fault in this process.
        let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
        if n >= 0 && n as usize == len {
            VM_CALLS.store(1, Ordering::Relaxed);
            return Ok(());
        }
        let err = io::Error::last_os_error();
        let refused = matches!(err.raw_os_error(), Some(libc::ENOSYS | libc::EPERM));
        if n >= 0 || !refused || VM_CALLS.load(Ordering::Relaxed) == 1 {
            return Err(if n >= 0 {
                io::Error::from_raw_os_error(libc::EFAULT)
            } else {
                err
            });
        }
        VM_CALLS.store(2, Ordering::Relaxed);
    }
    // SAFETY: only reached where the kernel refuses process_vm_readv; the caller (a C
    // program through the ACL API) promised both ranges are valid, as CANN's library relies on.
    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
    Ok(())
}

/// Set `len` bytes at address `dst` to `byte`, through [`copy`] from a buffer of that byte.
pub(crate) fn fill(dst: usize, byte: u8, len: usize) -> io::Result<()> {
    const CHUNK: usize = 64 << 10;
    let pattern = vec![byte; len.min(CHUNK)];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(CHUNK);
        copy(dst + done, pattern.as_ptr() as usize, n)?;
        done += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_valid_ranges_and_refuses_unmapped_ones() {
        let src: Vec<u8> = (0..=255).collect();
        let mut dst = vec![0u8; 256];
        copy(dst.as_mut_ptr() as usize, src.as_ptr() as usize, 256).unwrap();
        assert_eq!(dst, src);
        // Page 0 is never mapped: both directions fail without a crash.
        assert!(copy(dst.as_mut_ptr() as usize, 16, 8).is_err());
        assert!(copy(16, src.as_ptr() as usize, 8).is_err());
        fill(dst.as_mut_ptr() as usize + 10, 7, 5).unwrap();
        assert_eq!(&dst[9..16], &[9, 7, 7, 7, 7, 7, 15]);
        // A read-only page (the text of this function) cannot be written.
        let text = copies_valid_ranges_and_refuses_unmapped_ones as *const () as usize;
        assert!(copy(text, src.as_ptr() as usize, 1).is_err());
    }
}
