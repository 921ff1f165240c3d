//! Inter-process memory (`memory::ipc`): a buffer exported as a handle maps zero-copy in
//! another process (this test binary run again as a child, no fork) or in this one (through
//! `/proc/self/fd`); writes on either side are seen by the other; the importer's bounds are
//! exactly the block; stale, forged and malformed handles are refused; imported memory is
//! accounted apart from the allocator; the exporter exiting leaves the importer's view intact.

mod common;

use std::io::{BufRead, BufReader, Lines, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use runtime_core::config::Options;
use runtime_core::error::{DeviceError, Error, MemoryError};
use runtime_core::memory::access::Access;
use runtime_core::memory::allocator::{Allocator, Block};
use runtime_core::memory::{ipc, Buffer, DeviceMemory};
use runtime_core::runtime;
use runtime_core::stream::Stream;

const MIB: u64 = 1 << 20;

fn memory(device: usize) -> Arc<DeviceMemory> {
    Arc::new(DeviceMemory::new(device, 64 * MIB, Arc::new(Options::default())).unwrap())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn pattern(n: usize, salt: u8) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8 ^ salt).collect()
}

fn is_invalid_handle(e: &Error) -> bool {
    matches!(e, Error::Device(DeviceError::InvalidHandle { .. }))
}

/// A process never holds two allocations over the same memory: opening its own export gives
/// back the exported allocation (on its device), so there is one lock and one idea of which
/// bytes overlap. (Before, an in-process open mapped the file again: after the exported buffer
/// was freed, a write through the alias landed in an unrelated new allocation, and a copy
/// between a buffer and its alias ran as a split memcpy: 515,968 of 524,288 bytes differed
/// from a memmove.)
#[test]
fn opening_your_own_export_returns_that_allocation() {
    let (exp, imp) = (memory(0), memory(1));
    for size in [100u64, 3 * MIB + 5] {
        let a = exp.allocate(size).unwrap();
        let data = pattern(size as usize, 1);
        a.write(0, &data).unwrap();
        let h = a.ipc_handle().unwrap();
        assert_eq!(h.len(), ipc::HANDLE_LEN);
        assert_eq!(a.ipc_handle().unwrap(), h, "the same handle each time");
        let before = imp.stats();
        let b = imp.open_ipc_handle(&h).unwrap();
        assert!(b.same_allocation(&a) && !b.is_imported());
        assert_eq!(
            (b.size(), b.device()),
            (size, 0),
            "the exporter's own allocation"
        );
        assert_eq!(imp.stats(), before, "nothing was mapped or allocated");
        // Freed through one name, the memory stays the allocation the other name holds: a
        // new allocation never shares it.
        drop(a);
        let fresh = exp.allocate(size).unwrap();
        assert!(!fresh.overlaps(0, size, &b, 0, size));
        b.write(0, &[9; 3]).unwrap();
        let mut zero = vec![1u8; size as usize];
        fresh.read(0, &mut zero).unwrap();
        assert!(zero.iter().all(|&x| x == 0), "a new allocation reads zero");
        drop(b);
    }
}

/// A copy between a buffer and the buffer opened from its handle is a copy within one
/// allocation: overlapping ranges move as by `memmove`.
#[test]
fn a_copy_between_a_buffer_and_its_opened_handle_moves_like_memmove() {
    let m = memory(0);
    let n = 512 * 1024;
    let a = m.allocate(n as u64 + 4096).unwrap();
    let data = pattern(n + 4096, 7);
    a.write(0, &data).unwrap();
    let b = m.open_ipc_handle(&a.ipc_handle().unwrap()).unwrap();
    assert!(b.overlaps(4096, n as u64, &a, 0, n as u64));
    b.copy_from(4096, &a, 0, n as u64).unwrap();
    let mut want = data.clone();
    want.copy_within(0..n, 4096);
    let mut got = vec![0; n + 4096];
    a.read(0, &mut got).unwrap();
    assert!(
        got == want,
        "{} bytes differ from a memmove",
        got.iter().zip(&want).filter(|(x, y)| x != y).count()
    );
}

#[test]
fn stale_forged_and_malformed_handles_are_refused() {
    let (exp, imp) = (memory(0), memory(0));
    let a = exp.allocate(5000).unwrap();
    let h = a.ipc_handle().unwrap();
    // Malformed: an argument error.
    let e = imp.open_ipc_handle(b"hello").unwrap_err();
    assert!(matches!(e, Error::Arg(_)), "{e}");
    assert!(
        e.to_string().contains("not a runtime IPC memory handle"),
        "{e}"
    );
    // Forged: every field that names the block is checked against the exporter's table.
    for (at, what) in [(40, "nonce"), (48, "offset"), (56, "length"), (32, "file")] {
        let mut f = h.clone();
        f[at] ^= 0x10;
        let e = imp.open_ipc_handle(&f).unwrap_err();
        assert!(is_invalid_handle(&e), "{what}: {e}");
    }
    let mut f = h.clone();
    f[12..16].copy_from_slice(&u32::MAX.to_le_bytes()); // no such process
    let e = imp.open_ipc_handle(&f).unwrap_err();
    assert!(e.to_string().contains("has exited"), "{e}");
    // Stale: the exporter freed the buffer.
    drop(a);
    let e = imp.open_ipc_handle(&h).unwrap_err();
    assert!(
        is_invalid_handle(&e) && e.to_string().contains("freed"),
        "{e}"
    );
    // Zero-byte buffers have nothing to share.
    assert!(matches!(
        exp.allocate(0).unwrap().ipc_handle(),
        Err(Error::Arg(_))
    ));
}

#[test]
fn an_import_outlives_the_exporters_buffer_without_faulting() {
    let (exp, imp) = (memory(0), memory(0));
    let a = exp.allocate(4 * MIB).unwrap();
    a.fill(0, 4 * MIB, 5).unwrap();
    let b = imp.open_ipc_handle(&a.ipc_handle().unwrap()).unwrap();
    drop(a);
    drop(exp);
    // Unspecified content (CUDA: undefined), but mapped and readable.
    let mut back = vec![0; 4096];
    b.read(4 * MIB - 4096, &mut back).unwrap();
}

/// The child half of the cross-process test: runs only when re-executed with the variable set.
#[test]
fn child_process_entry() {
    let Ok(mode) = std::env::var("RUNTIME_IPC_TEST_CHILD") else {
        return;
    };
    let m = memory(0);
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    if mode == "export" {
        // Export a buffer, tell the parent, check the parent's write, then exit first.
        let a = m.allocate(3 * MIB).unwrap();
        a.write(0, &pattern(3 * MIB as usize, 3)).unwrap();
        println!("HANDLE={}", hex(&a.ipc_handle().unwrap()));
        std::io::stdout().flush().unwrap();
        lines.next().unwrap().unwrap(); // parent wrote
        let mut got = [0u8; 4];
        a.read(MIB, &mut got).unwrap();
        println!("SAW {}", hex(&got));
        std::io::stdout().flush().unwrap();
        std::process::exit(0);
    }
    if mode == "overlap" {
        // Export two blocks of a plugged allocator (at 0 and 2 MiB of one 4 MiB buffer) and
        // the buffer itself: three handles over overlapping bytes. Exit when told.
        let backing = m.allocate(4 * MIB).unwrap();
        m.set_allocator(Some(Arc::new(Slices {
            backing: backing.clone(),
            next: AtomicU64::new(0),
        })));
        let (a, c) = (m.malloc(MIB).unwrap(), m.malloc(MIB).unwrap());
        assert!(a.overlaps(0, MIB, &backing, 0, MIB) && c.overlaps(0, MIB, &backing, 2 * MIB, MIB));
        for (tag, b) in [("A", &a), ("C", &c), ("BACKING", &backing)] {
            println!("{tag}={}", hex(&b.ipc_handle().unwrap()));
        }
        std::io::stdout().flush().unwrap();
        lines.next().unwrap().unwrap();
        std::process::exit(0);
    }
    if mode == "import-across-shutdown" {
        // Hold the import's lock for a host access across a shutdown and a new `init`, then
        // import the block again and write it: the write waits for that access.
        let h = unhex(&std::env::var("RUNTIME_IPC_HANDLE").unwrap());
        let old = common::init()
            .device(0)
            .unwrap()
            .memory()
            .open_ipc_handle(&h)
            .unwrap();
        let started = Arc::new(AtomicBool::new(false));
        let released = Arc::new(AtomicBool::new(false));
        let (st, rel) = (started.clone(), released.clone());
        let holder = std::thread::spawn(move || {
            old.access(Access::Write)
                .host(|| {
                    st.store(true, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(300));
                    rel.store(true, Ordering::SeqCst);
                })
                .unwrap();
        });
        while !started.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        runtime::shutdown().unwrap();
        let new = common::init()
            .device(0)
            .unwrap()
            .memory()
            .open_ipc_handle(&h)
            .unwrap();
        new.fill(0, 4096, 7).unwrap();
        let waited = released.load(Ordering::SeqCst);
        holder.join().unwrap();
        println!("WAITED={waited}");
        std::io::stdout().flush().unwrap();
        std::process::exit(0);
    }
}

/// A plugged allocator handing out consecutive 2 MiB-aligned ranges of one buffer.
struct Slices {
    backing: Buffer,
    next: AtomicU64,
}

impl Allocator for Slices {
    fn allocate(&self, _: &Arc<DeviceMemory>, size: u64) -> runtime_core::Result<Block> {
        let at = self.next.fetch_add(2 * MIB, Ordering::Relaxed);
        Ok(Block::new(self.backing.view(at, size)?))
    }
    fn free(&self, _: Block) {}
}

fn spawn_child(mode: &str) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("RUNTIME_IPC_TEST_CHILD", mode)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, out)
}

/// The hex after `tag=` on the child's next line that has it (libtest prints the test's
/// name on the same line as the first).
fn expect_handle(out: &mut Lines<BufReader<ChildStdout>>, tag: &str) -> Vec<u8> {
    loop {
        let line = out.next().expect("child output").unwrap();
        if let Some(i) = line.find(&format!("{tag}=")) {
            break unhex(line[i + tag.len() + 1..].trim());
        }
    }
}

/// Imports of overlapping blocks of one exporter take turns as one buffer would: a read
/// through one waits for a kernel queued on the other. (Before, each import had its own
/// tracker: the first read of a plugged block's import, made right after queuing a kernel
/// that writes the import of the buffer it is part of, saw none of the kernel's bytes.) An
/// import that would join two imports with different trackers is refused, and opens once one
/// of them is dropped.
#[test]
fn imports_of_overlapping_blocks_take_turns() {
    let rt = common::init();
    let d = rt.device(0).unwrap();
    let s = Stream::new(d, 0).unwrap();
    let (mut child, mut out) = spawn_child("overlap");
    let (ha, hc, hb) = (
        expect_handle(&mut out, "A"),
        expect_handle(&mut out, "C"),
        expect_handle(&mut out, "BACKING"),
    );
    let m = d.memory();
    let (c, backing) = (
        m.open_ipc_handle(&hc).unwrap(),
        m.open_ipc_handle(&hb).unwrap(),
    );
    assert!(c.is_imported() && backing.is_imported() && !c.same_allocation(&backing));
    assert!(c.overlaps(0, MIB, &backing, 2 * MIB, MIB));
    let mut back = vec![0u8; MIB as usize];
    for round in 1..=100u8 {
        common::launch_halves(&s, &backing, 2 * MIB, MIB as usize, round.into());
        c.read(0, &mut back).unwrap();
        assert!(
            common::uniform(&back) && back[0] == round,
            "round {round}: read through one import before the kernel on the other finished \
             ({} then {})",
            back[0],
            back[MIB as usize - 1]
        );
    }
    // A overlaps the backing buffer's import only: it joins that tracker.
    let a = m.open_ipc_handle(&ha).unwrap();
    drop(backing);
    // A and C are open with one tracker; with the backing's import gone, a new one joins it.
    let backing = m.open_ipc_handle(&hb).unwrap();
    drop((a, c, backing));
    // A and C opened apart have two trackers: the buffer over both is refused until one goes.
    let (a, c) = (
        m.open_ipc_handle(&ha).unwrap(),
        m.open_ipc_handle(&hc).unwrap(),
    );
    let e = m.open_ipc_handle(&hb).unwrap_err();
    assert!(
        is_invalid_handle(&e) && e.to_string().contains("overlap two blocks"),
        "{e}"
    );
    drop(c);
    let backing = m.open_ipc_handle(&hb).unwrap();
    assert!(backing.overlaps(0, MIB, &a, 0, MIB));
    writeln!(child.stdin.as_mut().unwrap(), "done").unwrap();
    assert!(child.wait().unwrap().success());
}

#[test]
fn another_process_exports_and_the_import_survives_its_exit() {
    let (mut child, mut out) = spawn_child("export");
    let handle = expect_handle(&mut out, "HANDLE");
    let m = memory(1);
    let before = m.stats();
    let b = m.open_ipc_handle(&handle).unwrap();
    assert!(b.is_imported());
    assert_eq!((b.size(), b.device()), (3 * MIB, 1));
    // Accounted apart: the importing device's allocator is untouched.
    assert_eq!(m.stats(), before);
    let st = ipc::imported_stats(1);
    assert!(st.buffers >= 1 && st.bytes >= 3 * MIB);
    // Bounds are exactly the block, even though whole pages are mapped.
    for (off, n) in [(3 * MIB, 1), (3 * MIB - 1, 2), (u64::MAX, 2)] {
        let e = b.write(off, &vec![0; n]).unwrap_err();
        assert!(
            matches!(e, Error::Memory(MemoryError::OutOfBounds { .. })),
            "{e}"
        );
    }
    // Re-exporting an imported buffer hands on the original handle; opening it again gives
    // the same allocation.
    assert_eq!(b.ipc_handle().unwrap(), handle);
    assert!(m.open_ipc_handle(&handle).unwrap().same_allocation(&b));
    let mut back = vec![0; 3 * MIB as usize];
    b.read(0, &mut back).unwrap();
    assert_eq!(back, pattern(3 * MIB as usize, 3));
    b.write(MIB, &[1, 2, 3, 4]).unwrap();
    writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
    let saw = loop {
        let line = out.next().expect("child output").unwrap();
        if let Some(i) = line.find("SAW ") {
            break line[i + 4..].trim().to_string();
        }
    };
    assert_eq!(saw, "01020304", "the exporter sees the importer's write");
    assert!(child.wait().unwrap().success());
    // The exporter is gone; its memory stays mapped here with the data.
    b.read(0, &mut back).unwrap();
    let mut want = pattern(3 * MIB as usize, 3);
    want[MIB as usize..MIB as usize + 4].copy_from_slice(&[1, 2, 3, 4]);
    assert_eq!(back, want);
    // A new import of the dead process's handle is refused.
    let e = m.open_ipc_handle(&handle).unwrap_err();
    assert!(e.to_string().contains("has exited"), "{e}");
}

/// An import the program still holds from before a shutdown and a new `init` shares its
/// tracker with a new import of the same block: a host copy through the old one may still be
/// running (a shutdown drains the streams, not host threads), and a write through the new one
/// waits for it. (Before, the old import no longer counted once its runtime was shut down: the
/// new import had a lock of its own and its write did not wait, and a read through it tore
/// against a 512 MiB write through the old one in 1 of 5 rounds.) Run in a child importer,
/// since it shuts down its runtime.
#[test]
fn an_import_from_before_a_shutdown_takes_turns_with_a_new_import_of_its_block() {
    let (mut exporter, mut out) = spawn_child("overlap");
    let backing = expect_handle(&mut out, "BACKING");
    let importer = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("RUNTIME_IPC_TEST_CHILD", "import-across-shutdown")
        .env("RUNTIME_IPC_HANDLE", hex(&backing))
        .output()
        .unwrap();
    writeln!(exporter.stdin.as_mut().unwrap(), "done").unwrap();
    assert!(exporter.wait().unwrap().success());
    let text = String::from_utf8_lossy(&importer.stdout);
    assert!(importer.status.success(), "importer failed: {text}");
    assert!(
        text.contains("WAITED=true"),
        "the new import's write did not wait for the old import's host access: {text}"
    );
}
