//! Built-in kernels against plain Rust reference implementations, for float32, float64,
//! int32 and int64; in-place aliasing; and the argument checks done at launch.
//!
//! All tests share one runtime (same settings, never shut down).

mod common;

use std::fmt::Debug;
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::Config;
use runtime_core::error::{ArgError, Error, MemoryError};
use runtime_core::kernel::{self, DType, KernelArg, Tensor};
use runtime_core::memory::Buffer;
use runtime_core::runtime::Runtime;
use runtime_core::stream::Stream;

use common::init;

/// An element type with its reference arithmetic.
trait El: Copy + PartialEq + Debug + Send + Sync + 'static {
    const DT: DType;
    const FLOAT: bool;
    fn to_bytes(v: &[Self]) -> Vec<u8>;
    fn from_bytes(b: &[u8]) -> Vec<Self>;
    /// A test value from a random word (floats: in [-8, 8) with a fraction; ints: any).
    fn gen(r: u64) -> Self;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn zero() -> Self;
}

macro_rules! float_el {
    ($t:ty, $dt:expr) => {
        impl El for $t {
            const DT: DType = $dt;
            const FLOAT: bool = true;
            fn to_bytes(v: &[Self]) -> Vec<u8> {
                v.iter().flat_map(|x| x.to_ne_bytes()).collect()
            }
            fn from_bytes(b: &[u8]) -> Vec<Self> {
                b.chunks_exact(std::mem::size_of::<$t>())
                    .map(|c| <$t>::from_ne_bytes(c.try_into().unwrap()))
                    .collect()
            }
            fn gen(r: u64) -> Self {
                ((r % 1024) as $t - 512.0) / 64.0
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn add(self, o: Self) -> Self {
                self + o
            }
            fn mul(self, o: Self) -> Self {
                self * o
            }
            fn zero() -> Self {
                0.0
            }
        }
    };
}
float_el!(f32, DType::F32);
float_el!(f64, DType::F64);

macro_rules! int_el {
    ($t:ty, $dt:expr) => {
        impl El for $t {
            const DT: DType = $dt;
            const FLOAT: bool = false;
            fn to_bytes(v: &[Self]) -> Vec<u8> {
                v.iter().flat_map(|x| x.to_ne_bytes()).collect()
            }
            fn from_bytes(b: &[u8]) -> Vec<Self> {
                b.chunks_exact(std::mem::size_of::<$t>())
                    .map(|c| <$t>::from_ne_bytes(c.try_into().unwrap()))
                    .collect()
            }
            fn gen(r: u64) -> Self {
                // Mostly large values, so that sums and products wrap.
                if r % 4 == 0 {
                    ((r >> 8) % 201) as $t - 100
                } else {
                    (r >> 3) as $t
                }
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            fn zero() -> Self {
                0
            }
        }
    };
}
int_el!(i32, DType::I32);
int_el!(i64, DType::I64);

/// Deterministic pseudo-random words (splitmix64).
fn words(seed: u64, n: usize) -> Vec<u64> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        })
        .collect()
}

fn data<T: El>(seed: u64, n: usize) -> Vec<T> {
    words(seed, n).into_iter().map(T::gen).collect()
}

struct Ctx {
    rt: Arc<Runtime>,
    s: Stream,
}

impl Ctx {
    fn new() -> Ctx {
        let rt = init();
        let s = Stream::new(rt.device(0).unwrap(), 0).unwrap();
        Ctx { rt, s }
    }

    fn alloc(&self, bytes: usize) -> Buffer {
        self.rt
            .device(0)
            .unwrap()
            .memory()
            .allocate(bytes as u64)
            .unwrap()
    }

    fn upload<T: El>(&self, v: &[T]) -> Buffer {
        let b = self.alloc(std::mem::size_of_val(v).max(1));
        b.write(0, &T::to_bytes(v)).unwrap();
        b
    }

    fn launch(&self, name: &str, args: Vec<KernelArg>) -> runtime_core::Result<()> {
        kernel::launch(&self.s, kernel::find(name)?, args)
    }

    fn run(&self, name: &str, args: Vec<KernelArg>) {
        self.launch(name, args)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        self.s.synchronize(None).unwrap();
    }
}

fn tensor<T: El>(b: &Buffer, offset_elems: usize, shape: &[usize]) -> KernelArg {
    KernelArg::Tensor(
        Tensor::new(
            b.clone(),
            (offset_elems * std::mem::size_of::<T>()) as u64,
            T::DT,
            shape,
        )
        .unwrap(),
    )
}

fn download<T: El>(b: &Buffer, offset_elems: usize, n: usize) -> Vec<T> {
    let size = std::mem::size_of::<T>();
    let mut bytes = vec![0u8; n * size];
    b.read((offset_elems * size) as u64, &mut bytes).unwrap();
    T::from_bytes(&bytes)
}

/// A scalar argument holding `v`: an integer for int types (as the bindings pass them), a
/// float for float types.
fn scalar<T: El>(v: f64) -> KernelArg {
    if T::FLOAT {
        KernelArg::Float(v)
    } else {
        KernelArg::Int(v as i64)
    }
}

fn assert_close<T: El>(got: &[T], want: &[f64], mags: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let eps = match T::DT {
        DType::F32 => 1e-5,
        _ => 1e-12,
    };
    for (i, ((&g, &w), &m)) in got.iter().zip(want).zip(mags).enumerate() {
        let tol = eps * m.max(1.0);
        assert!(
            (g.to_f64() - w).abs() <= tol,
            "{what}[{i}]: got {g:?}, want {w} (tolerance {tol})"
        );
    }
}

/// Reference matmul: exact (wrapping) for ints; for floats in f64 with magnitudes.
fn ref_matmul<T: El>(
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    b: &[T],
) -> (Vec<T>, Vec<f64>, Vec<f64>) {
    let mut exact = vec![T::zero(); m * n];
    let mut wide = vec![0f64; m * n];
    let mut mag = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            for p in 0..k {
                let (x, y) = (a[i * k + p], b[p * n + j]);
                exact[i * n + j] = exact[i * n + j].add(x.mul(y));
                wide[i * n + j] += x.to_f64() * y.to_f64();
                mag[i * n + j] += (x.to_f64() * y.to_f64()).abs();
            }
        }
    }
    (exact, wide, mag)
}

fn check_matmul<T: El>(c: &Ctx, m: usize, k: usize, n: usize, seed: u64) {
    let (a, b) = (data::<T>(seed, m * k), data::<T>(seed + 1, k * n));
    let (ba, bb) = (c.upload(&a), c.upload(&b));
    // Start `c` with garbage: the kernel must overwrite it.
    let bc = c.upload(&data::<T>(seed + 2, m * n));
    c.run(
        "matmul",
        vec![
            tensor::<T>(&bc, 0, &[m, n]),
            tensor::<T>(&ba, 0, &[m, k]),
            tensor::<T>(&bb, 0, &[k, n]),
        ],
    );
    let got = download::<T>(&bc, 0, m * n);
    let (exact, wide, mag) = ref_matmul(m, k, n, &a, &b);
    if T::FLOAT {
        assert_close(&got, &wide, &mag, &format!("matmul {m}x{k} @ {k}x{n}"));
    } else {
        assert_eq!(got, exact, "matmul {m}x{k} @ {k}x{n}");
    }
}

/// Every built-in kernel on `T`, against the reference.
fn check_builtins<T: El>(seed: u64) {
    let c = Ctx::new();
    let n = 1000;
    let (a, b) = (data::<T>(seed, n), data::<T>(seed + 1, n));
    let (ba, bb) = (c.upload(&a), c.upload(&b));

    // fill, with a scalar of the natural kind and with the other kind.
    let bo = c.alloc(n * std::mem::size_of::<T>());
    c.run("fill", vec![tensor::<T>(&bo, 0, &[n]), scalar::<T>(3.0)]);
    assert_eq!(download::<T>(&bo, 0, n), vec![T::from_f64(3.0); n]);
    c.run(
        "fill",
        vec![tensor::<T>(&bo, 0, &[10, 100]), KernelArg::Float(-2.0)],
    );
    assert_eq!(download::<T>(&bo, 0, n), vec![T::from_f64(-2.0); n]);
    c.run("fill", vec![tensor::<T>(&bo, 0, &[n]), KernelArg::Int(7)]);
    assert_eq!(download::<T>(&bo, 0, n), vec![T::from_f64(7.0); n]);
    if T::FLOAT {
        c.run(
            "fill",
            vec![tensor::<T>(&bo, 0, &[n]), KernelArg::Float(0.25)],
        );
        assert_eq!(download::<T>(&bo, 0, n), vec![T::from_f64(0.25); n]);
    }
    // fill of a view leaves the rest alone.
    c.run("fill", vec![tensor::<T>(&bo, 100, &[50]), scalar::<T>(1.0)]);
    let got = download::<T>(&bo, 0, n);
    for (i, &v) in got.iter().enumerate() {
        let want = if (100..150).contains(&i) { 1.0 } else { 7.0 };
        let want = if T::FLOAT && !(100..150).contains(&i) {
            0.25
        } else {
            want
        };
        assert_eq!(v, T::from_f64(want), "fill view [{i}]");
    }

    // copy
    c.run(
        "copy",
        vec![tensor::<T>(&bo, 0, &[n]), tensor::<T>(&ba, 0, &[n])],
    );
    assert_eq!(download::<T>(&bo, 0, n), a);
    c.run(
        "copy",
        vec![tensor::<T>(&bo, 10, &[20]), tensor::<T>(&bb, 500, &[20])],
    );
    let mut want = a.clone();
    want[10..30].copy_from_slice(&b[500..520]);
    assert_eq!(download::<T>(&bo, 0, n), want);

    // scale
    let alpha = if T::FLOAT { 1.75 } else { -3.0 };
    let al = T::from_f64(alpha);
    c.run(
        "scale",
        vec![
            tensor::<T>(&bo, 0, &[n]),
            tensor::<T>(&ba, 0, &[n]),
            scalar::<T>(alpha),
        ],
    );
    let want: Vec<T> = a.iter().map(|&x| al.mul(x)).collect();
    assert_eq!(download::<T>(&bo, 0, n), want);

    // axpy: y = alpha * x + y
    let by = c.upload(&b);
    c.run(
        "axpy",
        vec![
            tensor::<T>(&by, 0, &[n]),
            tensor::<T>(&ba, 0, &[n]),
            scalar::<T>(alpha),
        ],
    );
    let want: Vec<T> = a.iter().zip(&b).map(|(&x, &y)| al.mul(x).add(y)).collect();
    assert_eq!(download::<T>(&by, 0, n), want);

    // add, mul (shapes may differ as long as the element counts match)
    c.run(
        "add",
        vec![
            tensor::<T>(&bo, 0, &[n]),
            tensor::<T>(&ba, 0, &[10, 100]),
            tensor::<T>(&bb, 0, &[n]),
        ],
    );
    let want: Vec<T> = a.iter().zip(&b).map(|(&x, &y)| x.add(y)).collect();
    assert_eq!(download::<T>(&bo, 0, n), want);
    c.run(
        "mul",
        vec![
            tensor::<T>(&bo, 0, &[n]),
            tensor::<T>(&ba, 0, &[n]),
            tensor::<T>(&bb, 0, &[n]),
        ],
    );
    let want: Vec<T> = a.iter().zip(&b).map(|(&x, &y)| x.mul(y)).collect();
    assert_eq!(download::<T>(&bo, 0, n), want);

    // sum (floats accumulate in float64)
    let bs = c.upload(&[T::from_f64(99.0)]);
    c.run(
        "sum",
        vec![tensor::<T>(&bs, 0, &[1]), tensor::<T>(&ba, 0, &[n])],
    );
    let got = download::<T>(&bs, 0, 1);
    if T::FLOAT {
        let wide: f64 = a.iter().map(|x| x.to_f64()).sum();
        let mag: f64 = a.iter().map(|x| x.to_f64().abs()).sum();
        // The float64 total, rounded once to T.
        let want = T::from_f64(wide).to_f64();
        assert_close(&got, &[want], &[mag], "sum");
    } else {
        let want = a.iter().fold(T::zero(), |s, &x| s.add(x));
        assert_eq!(got, vec![want], "sum");
    }
    // sum of nothing is zero; sum of a 2-D view.
    c.run(
        "sum",
        vec![tensor::<T>(&bs, 0, &[1]), tensor::<T>(&ba, 0, &[0])],
    );
    assert_eq!(download::<T>(&bs, 0, 1), vec![T::zero()]);
    c.run(
        "sum",
        vec![tensor::<T>(&bs, 0, &[]), tensor::<T>(&ba, 3, &[2, 2])],
    );
    let want = a[3..7].iter().fold(T::zero(), |s, &x| s.add(x));
    if T::FLOAT {
        let w: f64 = a[3..7].iter().map(|x| x.to_f64()).sum();
        assert_close(&download::<T>(&bs, 0, 1), &[w], &[64.0], "sum 2x2");
    } else {
        assert_eq!(download::<T>(&bs, 0, 1), vec![want]);
    }

    // matmul
    check_matmul::<T>(&c, 7, 5, 3, seed + 10);
    check_matmul::<T>(&c, 64, 64, 64, seed + 20);
    check_matmul::<T>(&c, 1, 9, 1, seed + 30);
}

#[test]
fn builtins_f32() {
    check_builtins::<f32>(1);
}

#[test]
fn builtins_f64() {
    check_builtins::<f64>(2);
}

#[test]
fn builtins_i32() {
    check_builtins::<i32>(3);
}

#[test]
fn builtins_i64() {
    check_builtins::<i64>(4);
}

fn check_in_place<T: El>(seed: u64) {
    let c = Ctx::new();
    let n = 257;
    let (a, b) = (data::<T>(seed, n), data::<T>(seed + 1, n));
    let bb = c.upload(&b);
    let alpha = if T::FLOAT { 0.5 } else { 3.0 };
    let al = T::from_f64(alpha);

    // out == a
    let ba = c.upload(&a);
    c.run(
        "add",
        vec![
            tensor::<T>(&ba, 0, &[n]),
            tensor::<T>(&ba, 0, &[n]),
            tensor::<T>(&bb, 0, &[n]),
        ],
    );
    let want: Vec<T> = a.iter().zip(&b).map(|(&x, &y)| x.add(y)).collect();
    assert_eq!(download::<T>(&ba, 0, n), want, "add out == a");

    // out == b
    let ba = c.upload(&a);
    let bb2 = c.upload(&b);
    c.run(
        "mul",
        vec![
            tensor::<T>(&bb2, 0, &[n]),
            tensor::<T>(&ba, 0, &[n]),
            tensor::<T>(&bb2, 0, &[n]),
        ],
    );
    let want: Vec<T> = a.iter().zip(&b).map(|(&x, &y)| x.mul(y)).collect();
    assert_eq!(download::<T>(&bb2, 0, n), want, "mul out == b");

    // out == a == b
    let ba = c.upload(&a);
    c.run(
        "add",
        vec![
            tensor::<T>(&ba, 0, &[n]),
            tensor::<T>(&ba, 0, &[n]),
            tensor::<T>(&ba, 0, &[n]),
        ],
    );
    let want: Vec<T> = a.iter().map(|&x| x.add(x)).collect();
    assert_eq!(download::<T>(&ba, 0, n), want, "add out == a == b");
    let ba = c.upload(&a);
    c.run(
        "mul",
        vec![
            tensor::<T>(&ba, 0, &[n]),
            tensor::<T>(&ba, 0, &[n]),
            tensor::<T>(&ba, 0, &[n]),
        ],
    );
    let want: Vec<T> = a.iter().map(|&x| x.mul(x)).collect();
    assert_eq!(download::<T>(&ba, 0, n), want, "mul out == a == b");

    // scale in place
    let ba = c.upload(&a);
    c.run(
        "scale",
        vec![
            tensor::<T>(&ba, 0, &[n]),
            tensor::<T>(&ba, 0, &[n]),
            scalar::<T>(alpha),
        ],
    );
    let want: Vec<T> = a.iter().map(|&x| al.mul(x)).collect();
    assert_eq!(download::<T>(&ba, 0, n), want, "scale in place");

    // axpy with y == x: y = alpha * y + y
    let ba = c.upload(&a);
    c.run(
        "axpy",
        vec![
            tensor::<T>(&ba, 0, &[n]),
            tensor::<T>(&ba, 0, &[n]),
            scalar::<T>(alpha),
        ],
    );
    let want: Vec<T> = a.iter().map(|&x| al.mul(x).add(x)).collect();
    assert_eq!(download::<T>(&ba, 0, n), want, "axpy in place");

    // copy onto itself is a no-op
    let ba = c.upload(&a);
    c.run(
        "copy",
        vec![tensor::<T>(&ba, 0, &[n]), tensor::<T>(&ba, 0, &[n])],
    );
    assert_eq!(download::<T>(&ba, 0, n), a, "copy onto itself");

    // in place on a view in the middle of a buffer: the rest is untouched
    let ba = c.upload(&a);
    c.run(
        "add",
        vec![
            tensor::<T>(&ba, 100, &[50]),
            tensor::<T>(&ba, 100, &[50]),
            tensor::<T>(&ba, 0, &[50]),
        ],
    );
    let mut want = a.clone();
    for i in 0..50 {
        want[100 + i] = a[100 + i].add(a[i]);
    }
    assert_eq!(download::<T>(&ba, 0, n), want, "add on views");

    // matmul with a and b the same (read-only) tensor
    let m = 8;
    let sq = data::<T>(seed + 5, m * m);
    let bsq = c.upload(&sq);
    let bc = c.alloc(m * m * std::mem::size_of::<T>());
    c.run(
        "matmul",
        vec![
            tensor::<T>(&bc, 0, &[m, m]),
            tensor::<T>(&bsq, 0, &[m, m]),
            tensor::<T>(&bsq, 0, &[m, m]),
        ],
    );
    let (exact, wide, mag) = ref_matmul(m, m, m, &sq, &sq);
    let got = download::<T>(&bc, 0, m * m);
    if T::FLOAT {
        assert_close(&got, &wide, &mag, "a @ a");
    } else {
        assert_eq!(got, exact, "a @ a");
    }
}

#[test]
fn in_place_aliasing_f32() {
    check_in_place::<f32>(11);
}

#[test]
fn in_place_aliasing_f64() {
    check_in_place::<f64>(12);
}

#[test]
fn in_place_aliasing_i32() {
    check_in_place::<i32>(13);
}

#[test]
fn in_place_aliasing_i64() {
    check_in_place::<i64>(14);
}

fn expect_arg_error(r: runtime_core::Result<()>, arg: &str, contains: &str) {
    match r {
        Err(Error::Arg(ArgError { arg: a, message })) => {
            assert_eq!(a, arg, "{message}");
            assert!(message.contains(contains), "{message:?} lacks {contains:?}");
        }
        other => panic!("expected an ArgError for {arg}, got {other:?}"),
    }
}

#[test]
fn bad_arguments_fail_at_launch() {
    let c = Ctx::new();
    let f32b = c.alloc(64 * 4);
    let f64b = c.alloc(64 * 8);
    let t32 = |off: usize, shape: &[usize]| tensor::<f32>(&f32b, off, shape);
    let t64 = |off: usize, shape: &[usize]| tensor::<f64>(&f64b, off, shape);
    let before = c.s.counters();

    // Argument counts.
    expect_arg_error(
        c.launch("fill", vec![t32(0, &[4])]),
        "args",
        "takes 2 arguments",
    );
    expect_arg_error(
        c.launch("add", vec![t32(0, &[4]), t32(8, &[4])]),
        "args",
        "takes 3 arguments",
    );
    expect_arg_error(c.launch("noop", vec![KernelArg::Int(1)]), "args", "takes 0");
    expect_arg_error(
        c.launch("matmul", vec![t32(0, &[2, 2]); 4]),
        "args",
        "takes 3 arguments",
    );

    // Wrong dtypes.
    expect_arg_error(
        c.launch("add", vec![t32(0, &[4]), t32(8, &[4]), t64(0, &[4])]),
        "b",
        "dtype float64 does not match float32",
    );
    expect_arg_error(
        c.launch(
            "scale",
            vec![t64(0, &[4]), t32(8, &[4]), KernelArg::Float(2.0)],
        ),
        "x",
        "dtype",
    );
    expect_arg_error(
        c.launch("sum", vec![t32(0, &[1]), t64(8, &[4])]),
        "x",
        "dtype",
    );
    expect_arg_error(
        c.launch(
            "matmul",
            vec![t32(0, &[2, 2]), t64(0, &[2, 2]), t32(8, &[2, 2])],
        ),
        "a",
        "dtype",
    );
    let u8t = KernelArg::Tensor(Tensor::new(f32b.clone(), 0, DType::U8, vec![8]).unwrap());
    expect_arg_error(
        c.launch("fill", vec![u8t, KernelArg::Int(256)]),
        "value",
        "does not fit in uint8",
    );

    // Wrong kinds of argument.
    expect_arg_error(
        c.launch("fill", vec![t32(0, &[4]), t32(8, &[4])]),
        "value",
        "must be a number",
    );
    expect_arg_error(
        c.launch(
            "add",
            vec![KernelArg::Float(1.0), t32(0, &[4]), t32(8, &[4])],
        ),
        "out",
        "must be a device buffer",
    );
    let i32b = c.alloc(16 * 4);
    expect_arg_error(
        c.launch(
            "fill",
            vec![tensor::<i32>(&i32b, 0, &[4]), KernelArg::Float(2.5)],
        ),
        "value",
        "not an integer",
    );
    expect_arg_error(
        c.launch(
            "scale",
            vec![
                tensor::<i32>(&i32b, 0, &[4]),
                tensor::<i32>(&i32b, 4, &[4]),
                KernelArg::Float(0.5),
            ],
        ),
        "alpha",
        "not an integer",
    );

    // Wrong shapes.
    expect_arg_error(
        c.launch("add", vec![t32(0, &[4]), t32(8, &[5]), t32(16, &[4])]),
        "a",
        "5 elements",
    );
    expect_arg_error(
        c.launch("copy", vec![t32(0, &[4]), t32(8, &[3])]),
        "src",
        "bytes",
    );
    expect_arg_error(
        c.launch("sum", vec![t32(0, &[2]), t32(8, &[4])]),
        "out",
        "exactly 1 element",
    );
    expect_arg_error(
        c.launch(
            "matmul",
            vec![t32(0, &[2, 2]), t32(8, &[2, 3]), t32(16, &[2, 2])],
        ),
        "b",
        "inner dimensions differ",
    );
    expect_arg_error(
        c.launch(
            "matmul",
            vec![t32(0, &[2, 3]), t32(8, &[2, 2]), t32(16, &[2, 2])],
        ),
        "c",
        "must be 2x2",
    );
    expect_arg_error(
        c.launch(
            "matmul",
            vec![t32(0, &[2, 2]), t32(8, &[4]), t32(16, &[2, 2])],
        ),
        "a",
        "2-D",
    );

    // Partial overlap of an input with the output.
    expect_arg_error(
        c.launch("add", vec![t32(0, &[8]), t32(1, &[8]), t32(16, &[8])]),
        "a",
        "partly overlaps",
    );
    expect_arg_error(
        c.launch("mul", vec![t32(4, &[8]), t32(16, &[8]), t32(0, &[8])]),
        "b",
        "partly overlaps",
    );
    expect_arg_error(
        c.launch(
            "scale",
            vec![t32(0, &[8]), t32(7, &[8]), KernelArg::Float(1.0)],
        ),
        "x",
        "partly overlaps",
    );
    expect_arg_error(
        c.launch(
            "axpy",
            vec![t32(2, &[8]), t32(0, &[8]), KernelArg::Float(1.0)],
        ),
        "x",
        "partly overlaps",
    );
    expect_arg_error(
        c.launch("copy", vec![t32(0, &[8]), t32(4, &[8])]),
        "src",
        "partly overlaps",
    );
    // `copy` is a byte copy: it checks byte counts, not dtypes.
    let as_i32 = KernelArg::Tensor(Tensor::new(f32b.clone(), 128, DType::I32, vec![8]).unwrap());
    expect_arg_error(
        c.launch("copy", vec![t32(0, &[9]), as_i32]),
        "src",
        "src has 32 bytes, dst 36",
    );
    // sum and matmul need a separate output.
    expect_arg_error(
        c.launch("sum", vec![t32(3, &[1]), t32(0, &[8])]),
        "x",
        "overlaps",
    );
    expect_arg_error(
        c.launch(
            "matmul",
            vec![t32(0, &[2, 2]), t32(0, &[2, 2]), t32(16, &[2, 2])],
        ),
        "a",
        "overlaps",
    );
    expect_arg_error(
        c.launch(
            "matmul",
            vec![t32(0, &[2, 2]), t32(16, &[2, 2]), t32(2, &[2, 2])],
        ),
        "b",
        "overlaps",
    );

    // A tensor on another device than the stream.
    let other = init().device(1).unwrap().memory().allocate(64).unwrap();
    expect_arg_error(
        c.launch(
            "fill",
            vec![tensor::<f32>(&other, 0, &[4]), KernelArg::Float(1.0)],
        ),
        "args",
        "device 1",
    );

    // Unknown kernel names list the registered ones.
    match kernel::find("no_such_kernel") {
        Err(Error::Arg(e)) => {
            assert_eq!(e.arg, "kernel");
            assert!(
                e.message.contains("matmul") && e.message.contains("fill"),
                "{e}"
            );
        }
        other => panic!("{:?}", other.map(|k| k.name().to_string())),
    }

    // Nothing was queued, and nothing was written.
    assert_eq!(c.s.counters(), before);
    c.s.synchronize(None).unwrap();
    assert_eq!(download::<f32>(&f32b, 0, 64), vec![0.0; 64]);
}

#[test]
fn tensor_views_are_checked() {
    let c = Ctx::new();
    let b = c.alloc(64);
    match Tensor::new(b.clone(), 2, DType::F32, vec![4]) {
        Err(Error::Arg(e)) => assert_eq!(e.arg, "offset"),
        other => panic!("{other:?}"),
    }
    match Tensor::new(b.clone(), 8, DType::F64, vec![8]) {
        Err(Error::Memory(MemoryError::OutOfBounds { size: 64, .. })) => {}
        other => panic!("{other:?}"),
    }
    match Tensor::new(b.clone(), 0, DType::F64, vec![usize::MAX, 2]) {
        Err(Error::Arg(e)) => assert_eq!(e.arg, "shape"),
        other => panic!("{other:?}"),
    }
    let t = Tensor::new(b.clone(), 8, DType::F64, vec![7]).unwrap();
    assert_eq!((t.len(), t.nbytes()), (7, 56));
    // Alignment is checked in memory, not within the view: offset 0 of a view that starts
    // at byte 1 is misaligned for f64 (a native kernel would get that pointer as it is), and
    // offset 7 of it is aligned.
    let odd = b.view(1, 63).unwrap();
    match Tensor::new(odd.clone(), 0, DType::F64, vec![4]) {
        Err(Error::Arg(e)) => {
            assert_eq!(e.arg, "offset");
            assert!(e.to_string().contains("the view starts 1 byte past"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    let t = Tensor::new(odd, 7, DType::F64, vec![7]).unwrap();
    assert_eq!(
        t.span(),
        Tensor::new(b, 8, DType::F64, vec![7]).unwrap().span()
    );
}

/// A view one allocation past the end of a small buffer is refused even though the device's
/// address space continues there (the check is against the allocation, not the arena).
#[test]
fn kernel_arguments_outside_their_allocation_or_misaligned_are_refused() {
    let c = Ctx::new();
    let small = c.alloc(64);
    let _neighbour = c.alloc(64);
    for (offset, dtype, len) in [
        (4096, DType::F32, 1),
        (64, DType::U8, 1),
        (0, DType::F32, 17),
        (u64::MAX - 3, DType::F32, 1),
    ] {
        match Tensor::new(small.clone(), offset, dtype, vec![len]) {
            Err(Error::Memory(MemoryError::OutOfBounds { size: 64, .. })) => {}
            other => panic!("offset {offset}, {len} x {dtype:?}: {other:?}"),
        }
    }
    for (offset, dtype) in [(1, DType::F32), (4, DType::F64), (2, DType::I32)] {
        match Tensor::new(small.clone(), offset, dtype, vec![1]) {
            Err(Error::Arg(e)) => assert_eq!(e.arg, "offset"),
            other => panic!("offset {offset}, {dtype:?}: {other:?}"),
        }
    }
}

/// The built-ins are statics, held by launches without a reference count: every lookup
/// names the same object, so arguments it checked pass for it, and for no other built-in.
#[test]
fn a_builtin_is_one_object_for_every_lookup() {
    let _rt = init();
    let (a, b) = (
        kernel::find("scale").unwrap(),
        kernel::find("scale").unwrap(),
    );
    assert!(kernel::KernelRef::same(&a, &b));
    assert!(!kernel::KernelRef::same(&a, &kernel::find("mul").unwrap()));
    let c = Ctx::new();
    let x = c.alloc(16);
    let ok = kernel::Args::check(
        &a,
        vec![
            tensor::<f32>(&x, 0, &[4]),
            tensor::<f32>(&x, 0, &[4]),
            KernelArg::Float(2.0),
        ],
    )
    .unwrap();
    assert!(ok.checked_by(&*b) && !ok.checked_by(&*kernel::find("mul").unwrap()));
}

/// `Kernel::run` only takes arguments checked by that same kernel: a kernel that accepts
/// anything cannot hand partly overlapping views to a built-in that relies on its own check.
#[test]
fn a_builtin_refuses_arguments_checked_by_another_kernel() {
    struct Lax;
    impl kernel::Kernel for Lax {
        fn name(&self) -> &str {
            "lax"
        }
        fn check(&self, _: &[KernelArg]) -> Result<(), ArgError> {
            Ok(())
        }
        fn run(
            &self,
            _: &kernel::Args,
            _: &kernel::RunContext,
        ) -> Result<(), runtime_core::error::KernelFailure> {
            Ok(())
        }
    }
    let c = Ctx::new();
    let b = c.alloc(64);
    let overlapping = vec![
        tensor::<f32>(&b, 0, &[8]),
        tensor::<f32>(&b, 1, &[8]),
        tensor::<f32>(&b, 2, &[8]),
    ];
    let add = kernel::find("add").unwrap();
    match kernel::Args::check(&add, overlapping.clone()) {
        Err(e) => assert_eq!(e.arg, "a"),
        Ok(_) => panic!("partly overlapping views passed add's check"),
    }
    let lax: Arc<dyn kernel::Kernel> = Arc::new(Lax);
    let laundered = kernel::Args::check(&lax, overlapping).unwrap();
    assert!(laundered.checked_by(&*lax) && !laundered.checked_by(&*add));
    let failure = add
        .run(&laundered, &kernel::RunContext::single())
        .unwrap_err();
    assert!(
        failure.to_string().contains("checked by another kernel"),
        "{failure}"
    );
}

/// Identity by ownership: arguments hold the kernel that checked them, so a kernel made after
/// the checking one was dropped can never sit at its address and pass for it. (With an
/// address kept instead, a fresh built-in `add` landed where a freed lax kernel had been and
/// accepted its partly overlapping arguments: `&mut [f32]` aliasing `&[f32]`.)
#[test]
fn arguments_checked_by_a_dropped_kernel_never_pass_for_a_new_one() {
    struct Lax(#[allow(dead_code)] u8);
    impl kernel::Kernel for Lax {
        fn name(&self) -> &str {
            "lax"
        }
        fn check(&self, _: &[KernelArg]) -> Result<(), ArgError> {
            Ok(())
        }
        fn run(
            &self,
            _: &kernel::Args,
            _: &kernel::RunContext,
        ) -> Result<(), runtime_core::error::KernelFailure> {
            Ok(())
        }
    }
    let c = Ctx::new();
    let b = c.alloc(64);
    for _ in 0..2000 {
        let overlapping = vec![
            tensor::<f32>(&b, 0, &[8]),
            tensor::<f32>(&b, 1, &[8]),
            tensor::<f32>(&b, 2, &[8]),
        ];
        let lax: Arc<dyn kernel::Kernel> = Arc::new(Lax(1));
        let args = kernel::Args::check(&lax, overlapping).unwrap();
        drop(lax);
        for fresh in kernel::builtin::all() {
            assert!(!args.checked_by(&*fresh), "{} passed for lax", fresh.name());
            if fresh.name() == "add" {
                assert!(fresh.run(&args, &kernel::RunContext::single()).is_err());
            }
        }
    }
}

/// Raw typed views check the allocation's bounds and the alignment in every build.
#[test]
fn raw_views_are_checked_against_the_allocation() {
    let c = Ctx::new();
    let b = c.alloc(64);
    let _neighbour = c.alloc(64);
    let past_end = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: nothing else uses `b`; the call must panic before making a slice.
        unsafe { b.slice_unsynchronized::<f32>(0, 17).len() }
    }));
    assert!(past_end.is_err());
    let misaligned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: as above.
        unsafe { b.slice_unsynchronized::<f64>(4, 1).len() }
    }));
    assert!(misaligned.is_err());
    // SAFETY: as above; in bounds and aligned.
    assert_eq!(unsafe { b.slice_unsynchronized::<f64>(8, 7) }, &[0.0; 7]);
}

#[test]
fn builtins_are_registered() {
    let names = kernel::names();
    for n in [
        "noop", "fill", "copy", "scale", "axpy", "add", "mul", "sum", "matmul",
    ] {
        assert!(names.iter().any(|x| x == n), "{n} in {names:?}");
        assert_eq!(kernel::find(n).unwrap().name(), n);
    }
    let c = Ctx::new();
    c.run("noop", vec![]);
}

proptest! {
    #![proptest_config(Config { cases: 32, failure_persistence: None, ..Config::default() })]

    /// Any small shape, zero dimensions included.
    #[test]
    fn matmul_matches_the_reference_for_any_small_shape(
        m in 0usize..7, k in 0usize..7, n in 0usize..7, seed in any::<u64>(),
    ) {
        let c = Ctx::new();
        check_matmul::<i64>(&c, m, k, n, seed);
        check_matmul::<i32>(&c, m, k, n, seed);
        check_matmul::<f64>(&c, m, k, n, seed);
        check_matmul::<f32>(&c, m, k, n, seed);
    }

    /// Element-wise kernels on views at any offset inside a larger buffer.
    #[test]
    fn elementwise_views_match_the_reference(
        len in 0usize..200, off_a in 0usize..50, off_b in 0usize..50, seed in any::<u64>(),
    ) {
        let c = Ctx::new();
        let a = data::<f64>(seed, len + 50);
        let b = data::<f64>(seed ^ 1, len + 50);
        let (ba, bb) = (c.upload(&a), c.upload(&b));
        let bo = c.alloc((len + 1) * 8);
        c.run("add", vec![
            tensor::<f64>(&bo, 0, &[len]),
            tensor::<f64>(&ba, off_a, &[len]),
            tensor::<f64>(&bb, off_b, &[len]),
        ]);
        let want: Vec<f64> = (0..len).map(|i| a[off_a + i] + b[off_b + i]).collect();
        prop_assert_eq!(download::<f64>(&bo, 0, len), want);
        prop_assert_eq!(download::<f64>(&bo, len, 1), vec![0.0]);
    }
}

/// Outputs past `STREAM_BYTES` are written with streaming stores, a few cache lines at a time:
/// the values are those of the plain path, at an offset that misaligns the output (head and
/// tail around the aligned body), with an odd length, as one block and as several, and the
/// bytes around the output stay untouched.
#[test]
fn streamed_outputs_match_the_plain_path() {
    let c = Ctx::new();
    let n = (kernel::builtin::STREAM_BYTES as usize) / 4 + 13;
    let (a, b) = (data::<f32>(71, n), data::<f32>(72, n));
    let (ba, bb) = (c.upload(&a), c.upload(&b));
    // One element of slack before and after the output, which must keep its marker value.
    let bo = c.upload(&vec![-1.0f32; n + 2]);
    let out = || tensor::<f32>(&bo, 1, &[n]);
    let check = |what: &str, want: &dyn Fn(usize) -> f32| {
        let got = download::<f32>(&bo, 0, n + 2);
        assert_eq!(got[0], -1.0, "{what}: the element before the output");
        assert_eq!(got[n + 1], -1.0, "{what}: the element after the output");
        for i in 0..n {
            assert_eq!(got[i + 1], want(i), "{what} [{i}] of {n}");
        }
    };
    for blocks in [1u32, 3] {
        let run = |name: &str, args: Vec<KernelArg>| {
            kernel::launch_blocks(&c.s, kernel::find(name).unwrap(), args, Some(blocks)).unwrap();
            c.s.synchronize(None).unwrap();
        };
        let ta = || tensor::<f32>(&ba, 0, &[n]);
        let tb = || tensor::<f32>(&bb, 0, &[n]);
        run("add", vec![out(), ta(), tb()]);
        check(&format!("add, {blocks} blocks"), &|i| a[i] + b[i]);
        run("mul", vec![out(), ta(), tb()]);
        check(&format!("mul, {blocks} blocks"), &|i| a[i] * b[i]);
        run("scale", vec![out(), ta(), KernelArg::Float(0.5)]);
        check(&format!("scale, {blocks} blocks"), &|i| 0.5 * a[i]);
        run("fill", vec![out(), KernelArg::Float(2.5)]);
        check(&format!("fill, {blocks} blocks"), &|_| 2.5);
        run("copy", vec![out(), tb()]);
        check(&format!("copy, {blocks} blocks"), &|i| b[i]);
    }
}

/// A launch holds its buffers until it has run, and no longer: with batching on (the default)
/// the queue keeps the launch's box for a later launch, but drops the launch itself as it runs.
#[test]
fn a_launch_lets_its_buffers_go_once_it_has_run() {
    let c = Ctx::new();
    let b = c.alloc(4096);
    for _ in 0..3 {
        c.run(
            "fill",
            vec![tensor::<f32>(&b, 0, &[1024]), KernelArg::Float(2.0)],
        );
        assert_eq!(b.ref_count(), 1, "only this test's handle is left");
    }
    // Watched through a view of its own (it shares the allocation's count), not through the
    // device's allocation count, which the tests running beside this one change.
    let watch = b.view(0, 4).unwrap();
    c.launch(
        "fill",
        vec![tensor::<f32>(&b, 0, &[1024]), KernelArg::Float(3.0)],
    )
    .unwrap();
    drop(b);
    c.s.synchronize(None).unwrap();
    assert_eq!(
        watch.ref_count(),
        1,
        "the queued launch held the buffer, and let it go once it ran"
    );
}
