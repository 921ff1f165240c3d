//! Built-in native kernels. Arguments are output first, like `memcpy(dst, src)`:
//!
//! | kernel | arguments | effect |
//! |---|---|---|
//! | `noop` | none | nothing (measures launch overhead) |
//! | `fill` | `x, value` | `x[:] = value` |
//! | `copy` | `dst, src` | `dst[:] = src` |
//! | `scale` | `out, x, alpha` | `out = alpha * x` |
//! | `axpy` | `y, x, alpha` | `y = alpha * x + y` |
//! | `add` | `out, a, b` | `out = a + b` |
//! | `mul` | `out, a, b` | `out = a * b` |
//! | `sum` | `out, x` | `out[0] = x.sum()` (floats accumulate in float64) |
//! | `matmul` | `c, a, b` | `c = a @ b` for 2-D `a (m,k)`, `b (k,n)`, `c (m,n)` |
//!
//! Element-wise kernels need equal element counts and one dtype. Every kernel takes every
//! dtype ([`DType`]) except where numpy's result would have another type: `scale`, `axpy` and
//! `sum` refuse bool (numpy gives an integer); for bool, `add` is logical or and `mul` logical
//! and, as in numpy. Integers wrap on overflow as in numpy; float16 and bfloat16 are computed in
//! float32 and each stored result rounded to the type (numpy's float16 loops and ml_dtypes'
//! bfloat16 loops do the same); complex uses the textbook product. Scalars for integer and bool tensors must be integers in the dtype's range;
//! float tensors take any real number, complex tensors any number (`KernelArg::Complex` too). An output may be exactly one of its inputs
//! (in place) but must not partly overlap one. float32/float64 (and float16 and bfloat16,
//! widened) matrix products use the `gemm` crate (blocked, SIMD, AVX-512 where the CPU has it);
//! the others a plain i-k-j loop.
//!
//! Memory access: kernels read and write device memory through typed views
//! ([`Buffer::slice_unsynchronized`](crate::memory::Buffer::slice_unsynchronized)); `check`
//! has verified bounds, alignment and overlap, and the launch holds the output's allocation
//! exclusively and the inputs' shared ([`Kernel::access`], [`crate::memory::access`]) while
//! the kernel runs, which is what those views require.

use std::ops::Range;

use half::{bf16, f16};
use num_complex::Complex;

use crate::error::{ArgError, KernelFailure};
use crate::kernel::{Args, DType, Kernel, KernelArg, KernelRef, RunContext, Tensor};
use crate::memory::access::Access;

/// The built-in kernels: statics, held by launches without a reference count
/// ([`KernelRef`]).
static ALL: [Builtin; 9] = {
    use Builtin::*;
    [Noop, Fill, Copy, Scale, Axpy, Add, Mul, Sum, Matmul]
};

/// All built-in kernels.
pub fn all() -> Vec<KernelRef> {
    ALL.iter().map(KernelRef::builtin).collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Builtin {
    Noop,
    Fill,
    Copy,
    Scale,
    Axpy,
    Add,
    Mul,
    Sum,
    Matmul,
}

/// How the arithmetic kernels compute on one dtype: values of `Self`, stored in memory as
/// `Self::Repr`. For most types the two are the same; `bool` is stored as a byte (any nonzero
/// byte reads as true, results are written as 0 or 1) and float16 and bfloat16 are computed in
/// float32 ([`Half`], [`BHalf`]), each result rounded when stored, as numpy's float16 loops do.
trait Elem: Copy + Send + Sync + 'static {
    type Repr: crate::memory::Element;
    fn load(r: Self::Repr) -> Self;
    fn store(self) -> Self::Repr;
    fn from_f64(v: f64) -> Self;
    fn from_i64(v: i64) -> Self;
    /// A complex scalar; only complex types are given one (checked at launch).
    fn from_complex(re: f64, _im: f64) -> Self {
        Self::from_f64(re)
    }
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn zero() -> Self;
    /// The sum of `xs` (integers wrap; floats accumulate in float64, complex in complex128).
    fn sum(xs: &[Self::Repr]) -> Self::Repr;
    /// `c (m x n) = a (m x k) @ b (k x n)`, row-major, `c` disjoint from `a` and `b`.
    fn gemm(
        m: usize,
        k: usize,
        n: usize,
        a: &[Self::Repr],
        b: &[Self::Repr],
        c: &mut [Self::Repr],
    ) {
        gemm_loop::<Self>(m, k, n, a, b, c);
    }
}

/// float16 computed in float32.
#[derive(Clone, Copy)]
struct Half(f32);

/// bfloat16 computed in float32.
#[derive(Clone, Copy)]
struct BHalf(f32);

/// Eight f64 lanes: accurate and vectorisable.
fn sum_f64(xs: impl ExactSizeIterator<Item = f64>) -> f64 {
    let mut acc = [0f64; 8];
    for (i, x) in xs.enumerate() {
        acc[i % 8] += x;
    }
    acc.iter().sum()
}

macro_rules! float_elem {
    ($t:ty) => {
        impl Elem for $t {
            type Repr = $t;
            fn load(r: $t) -> $t {
                r
            }
            fn store(self) -> $t {
                self
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            fn from_i64(v: i64) -> Self {
                v as $t
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
            fn sum(xs: &[Self]) -> Self {
                let mut acc = [0f64; 8];
                let chunks = xs.chunks_exact(8);
                let rest = chunks.remainder();
                for c in chunks {
                    for i in 0..8 {
                        acc[i] += c[i] as f64;
                    }
                }
                let tail: f64 = rest.iter().map(|&x| x as f64).sum();
                (acc.iter().sum::<f64>() + tail) as $t
            }
            fn gemm(m: usize, k: usize, n: usize, a: &[Self], b: &[Self], c: &mut [Self]) {
                gemm_rows::<$t>(m, k, n, a, b, c);
            }
        }
    };
}
float_elem!(f32);
float_elem!(f64);

/// `c = a @ b` for row-major `a` (`m × k`), `b` (`k × n`) and `c` (`m × n`), on the calling
/// thread (a launch's blocks share out the rows): the `gemm` crate, which picks its kernel for
/// the CPU at run time (AVX-512 where there is one).
fn gemm_rows<T: Copy + 'static + From<u8>>(
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    b: &[T],
    c: &mut [T],
) {
    assert!(a.len() == m * k && b.len() == k * n && c.len() == m * n);
    // SAFETY: the slices hold exactly m*k, k*n and m*n elements (asserted), read with
    // row-major strides (row stride k, n and n, column stride 1) that stay inside them; `c`
    // is disjoint from `a` and `b` (checked at launch; distinct Rust slices here); with
    // `read_dst` false the destination is only written (c = 1 * a @ b).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            1,
            n as isize,
            T::from(0),
            T::from(1),
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    };
}

/// The 16-bit floats: computed in float32 ([`Half`], [`BHalf`]), rounded to the type once per
/// stored result (numpy's float16 loops and ml_dtypes' bfloat16 loops do the same).
macro_rules! half_elem {
    ($name:ident, $t:ty) => {
        impl Elem for $name {
            type Repr = $t;
            fn load(r: $t) -> Self {
                $name(r.to_f32())
            }
            fn store(self) -> $t {
                <$t>::from_f32(self.0)
            }
            fn from_f64(v: f64) -> Self {
                // Round once, from the double, to the value numpy would store.
                $name(<$t>::from_f64(v).to_f32())
            }
            fn from_i64(v: i64) -> Self {
                $name::from_f64(v as f64)
            }
            fn add(self, o: Self) -> Self {
                $name(self.0 + o.0)
            }
            fn mul(self, o: Self) -> Self {
                $name(self.0 * o.0)
            }
            fn zero() -> Self {
                $name(0.0)
            }
            fn sum(xs: &[$t]) -> $t {
                <$t>::from_f64(sum_f64(xs.iter().map(|x| x.to_f64())))
            }
            /// As numpy's float16 matmul: products summed in float32, each result rounded
            /// once.
            fn gemm(m: usize, k: usize, n: usize, a: &[$t], b: &[$t], c: &mut [$t]) {
                let widen = |x: &[$t]| x.iter().map(|v| v.to_f32()).collect::<Vec<f32>>();
                let mut out = vec![0f32; c.len()];
                <f32 as Elem>::gemm(m, k, n, &widen(a), &widen(b), &mut out);
                c.iter_mut()
                    .zip(out)
                    .for_each(|(c, v)| *c = <$t>::from_f32(v));
            }
        }
    };
}
half_elem!(Half, f16);
half_elem!(BHalf, bf16);

macro_rules! complex_elem {
    ($t:ty) => {
        impl Elem for Complex<$t> {
            type Repr = Complex<$t>;
            fn load(r: Self) -> Self {
                r
            }
            fn store(self) -> Self {
                self
            }
            fn from_f64(v: f64) -> Self {
                Complex::new(v as $t, 0.0)
            }
            fn from_i64(v: i64) -> Self {
                Complex::new(v as $t, 0.0)
            }
            fn from_complex(re: f64, im: f64) -> Self {
                Complex::new(re as $t, im as $t)
            }
            fn add(self, o: Self) -> Self {
                self + o
            }
            fn mul(self, o: Self) -> Self {
                self * o
            }
            fn zero() -> Self {
                Complex::new(0.0, 0.0)
            }
            fn sum(xs: &[Self]) -> Self {
                let re = sum_f64(xs.iter().map(|x| x.re as f64));
                let im = sum_f64(xs.iter().map(|x| x.im as f64));
                Complex::new(re as $t, im as $t)
            }
        }
    };
}
complex_elem!(f32);
complex_elem!(f64);

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            type Repr = $t;
            fn load(r: $t) -> $t {
                r
            }
            fn store(self) -> $t {
                self
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            fn from_i64(v: i64) -> Self {
                v as $t
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
            fn sum(xs: &[Self]) -> Self {
                xs.iter().fold(0, |a: $t, &b| a.wrapping_add(b))
            }
        }
    )*};
}
int_elem!(i8, i16, i32, i64, u8, u16, u32, u64);

/// numpy's bool arithmetic: `+` is logical or, `*` logical and.
impl Elem for bool {
    type Repr = u8;
    fn load(r: u8) -> bool {
        r != 0
    }
    fn store(self) -> u8 {
        u8::from(self)
    }
    fn from_f64(v: f64) -> bool {
        v != 0.0
    }
    fn from_i64(v: i64) -> bool {
        v != 0
    }
    fn add(self, o: bool) -> bool {
        self | o
    }
    fn mul(self, o: bool) -> bool {
        self & o
    }
    fn zero() -> bool {
        false
    }
    fn sum(xs: &[u8]) -> u8 {
        u8::from(xs.iter().any(|&x| x != 0))
    }
}

fn err(arg: &str, msg: impl Into<String>) -> ArgError {
    ArgError::new(arg, msg)
}

fn tensor<'a>(
    args: &'a [KernelArg],
    i: usize,
    name: &str,
    kernel: &str,
) -> Result<&'a Tensor, ArgError> {
    match args.get(i) {
        Some(KernelArg::Tensor(t)) => Ok(t),
        Some(other) => Err(err(
            name,
            format!(
                "{kernel}: argument {i} ({name}) must be a device buffer or view, got {other:?}"
            ),
        )),
        None => Err(err(
            name,
            format!("{kernel}: missing argument {i} ({name})"),
        )),
    }
}

fn scalar(
    args: &[KernelArg],
    i: usize,
    name: &str,
    kernel: &str,
    dtype: DType,
) -> Result<KernelArg, ArgError> {
    let s = match args.get(i) {
        Some(s @ (KernelArg::Float(_) | KernelArg::Int(_))) => s,
        Some(s @ KernelArg::Complex(..)) if dtype.is_complex() => return Ok(s.clone()),
        Some(KernelArg::Complex(re, im)) => {
            return Err(err(
                name,
                format!(
                    "{kernel}: {name}=({re}{im:+}j) is complex, but the tensors are {}",
                    dtype.name()
                ),
            ))
        }
        Some(other) => {
            return Err(err(
                name,
                format!("{kernel}: argument {i} ({name}) must be a number, got {other:?}"),
            ))
        }
        None => {
            return Err(err(
                name,
                format!("{kernel}: missing argument {i} ({name})"),
            ))
        }
    };
    // Integer and bool tensors take integers in their range (as numpy 2 refuses
    // `np.uint8(300)`); float and complex tensors any number.
    let Some((lo, hi)) = dtype.int_range() else {
        return Ok(s.clone());
    };
    let fits = match *s {
        KernelArg::Float(f) if f.fract() != 0.0 => {
            return Err(err(
                name,
                format!(
                    "{kernel}: {name}={f} is not an integer, but the tensors are {}",
                    dtype.name()
                ),
            ))
        }
        // Integral (NaN and infinities have no zero fraction): compare as floats. The bounds
        // `lo` and `hi + 1` are powers of two or exact, so `f < hi + 1` means `f <= hi`.
        KernelArg::Float(f) => f >= lo as f64 && f < (hi + 1) as f64,
        KernelArg::Int(n) => (lo..=hi).contains(&i128::from(n)),
        KernelArg::Tensor(_) | KernelArg::Complex(..) | KernelArg::Typed(_) => {
            unreachable!("matched above")
        }
    };
    if !fits {
        let v = match *s {
            KernelArg::Float(f) => f.to_string(),
            KernelArg::Int(n) => n.to_string(),
            KernelArg::Tensor(_) | KernelArg::Complex(..) | KernelArg::Typed(_) => {
                unreachable!("matched above")
            }
        };
        return Err(err(
            name,
            format!(
                "{kernel}: {name}={v} does not fit in {} ({lo}..={hi})",
                dtype.name()
            ),
        ));
    }
    Ok(s.clone())
}

fn count(args: &[KernelArg], n: usize, kernel: &str, sig: &str) -> Result<(), ArgError> {
    if args.len() == n {
        Ok(())
    } else {
        Err(err(
            "args",
            format!("{kernel} takes {n} arguments ({sig}), got {}", args.len()),
        ))
    }
}

/// Refuse bool where numpy's result would not be bool (`2 * x`, `x.sum()`).
fn not_bool(t: &Tensor, name: &str, kernel: &str) -> Result<(), ArgError> {
    if t.dtype == DType::Bool {
        Err(err(name, format!("{kernel}: dtype bool is not supported (numpy's result would be an integer); view or convert the data to an integer dtype")))
    } else {
        Ok(())
    }
}

fn same(
    out: &Tensor,
    x: &Tensor,
    name: &str,
    kernel: &str,
    equal_len: bool,
) -> Result<(), ArgError> {
    if out.dtype != x.dtype {
        return Err(err(
            name,
            format!(
                "{kernel}: dtype {} does not match {}",
                x.dtype.name(),
                out.dtype.name()
            ),
        ));
    }
    if equal_len && out.len() != x.len() {
        return Err(err(
            name,
            format!(
                "{kernel}: {} elements (shape {:?}) do not match the output's {} (shape {:?})",
                x.len(),
                x.shape,
                out.len(),
                out.shape
            ),
        ));
    }
    Ok(())
}

/// Inputs may be exactly the output, or disjoint from it; partial overlap is refused.
fn no_partial_overlap(out: &Tensor, x: &Tensor, name: &str, kernel: &str) -> Result<(), ArgError> {
    let (a, b) = (out.span(), x.span());
    if a.overlaps(&b) && a != b {
        Err(err(name, format!("{kernel}: {name} partly overlaps the output; use disjoint buffers or exactly the same view")))
    } else {
        Ok(())
    }
}

fn disjoint(out: &Tensor, x: &Tensor, name: &str, kernel: &str) -> Result<(), ArgError> {
    if out.span().overlaps(&x.span()) {
        Err(err(
            name,
            format!("{kernel}: {name} overlaps the output; matmul needs a separate output"),
        ))
    } else {
        Ok(())
    }
}

impl Kernel for Builtin {
    fn name(&self) -> &str {
        match self {
            Builtin::Noop => "noop",
            Builtin::Fill => "fill",
            Builtin::Copy => "copy",
            Builtin::Scale => "scale",
            Builtin::Axpy => "axpy",
            Builtin::Add => "add",
            Builtin::Mul => "mul",
            Builtin::Sum => "sum",
            Builtin::Matmul => "matmul",
        }
    }

    fn check(&self, args: &[KernelArg]) -> Result<(), ArgError> {
        let k = self.name();
        match self {
            Builtin::Noop => count(args, 0, k, "no arguments"),
            Builtin::Fill => {
                count(args, 2, k, "x, value")?;
                let x = tensor(args, 0, "x", k)?;
                scalar(args, 1, "value", k, x.dtype).map(|_| ())
            }
            Builtin::Copy => {
                count(args, 2, k, "dst, src")?;
                let (d, s) = (tensor(args, 0, "dst", k)?, tensor(args, 1, "src", k)?);
                if d.nbytes() != s.nbytes() {
                    return Err(err(
                        "src",
                        format!("copy: src has {} bytes, dst {}", s.nbytes(), d.nbytes()),
                    ));
                }
                no_partial_overlap(d, s, "src", k)
            }
            Builtin::Scale | Builtin::Axpy => {
                let names = if *self == Builtin::Scale {
                    ("out", "out, x, alpha")
                } else {
                    ("y", "y, x, alpha")
                };
                count(args, 3, k, names.1)?;
                let (o, x) = (tensor(args, 0, names.0, k)?, tensor(args, 1, "x", k)?);
                not_bool(o, names.0, k)?;
                same(o, x, "x", k, true)?;
                no_partial_overlap(o, x, "x", k)?;
                scalar(args, 2, "alpha", k, o.dtype).map(|_| ())
            }
            Builtin::Add | Builtin::Mul => {
                count(args, 3, k, "out, a, b")?;
                let o = tensor(args, 0, "out", k)?;
                for (i, n) in [(1, "a"), (2, "b")] {
                    let x = tensor(args, i, n, k)?;
                    same(o, x, n, k, true)?;
                    no_partial_overlap(o, x, n, k)?;
                }
                Ok(())
            }
            Builtin::Sum => {
                count(args, 2, k, "out, x")?;
                let (o, x) = (tensor(args, 0, "out", k)?, tensor(args, 1, "x", k)?);
                not_bool(o, "out", k)?;
                same(o, x, "x", k, false)?;
                if o.len() != 1 {
                    return Err(err(
                        "out",
                        format!("sum: out must hold exactly 1 element, has {}", o.len()),
                    ));
                }
                disjoint(o, x, "x", k)
            }
            Builtin::Matmul => {
                count(args, 3, k, "c, a, b")?;
                let (c, a, b) = (
                    tensor(args, 0, "c", k)?,
                    tensor(args, 1, "a", k)?,
                    tensor(args, 2, "b", k)?,
                );
                same(c, a, "a", k, false)?;
                same(c, b, "b", k, false)?;
                for (t, n) in [(c, "c"), (a, "a"), (b, "b")] {
                    if t.shape.len() != 2 {
                        return Err(err(
                            n,
                            format!("matmul: {n} must be 2-D, has shape {:?}", t.shape),
                        ));
                    }
                }
                let (m, ka, kb, n) = (a.shape[0], a.shape[1], b.shape[0], b.shape[1]);
                if ka != kb {
                    return Err(err(
                        "b",
                        format!("matmul: a is {m}x{ka} but b is {kb}x{n}; inner dimensions differ"),
                    ));
                }
                if c.shape[..] != [m, n] {
                    return Err(err(
                        "c",
                        format!("matmul: c must be {m}x{n}, has shape {:?}", c.shape),
                    ));
                }
                disjoint(c, a, "a", k)?;
                disjoint(c, b, "b", k)
            }
        }
    }

    fn access(&self, index: usize) -> Access {
        // Output first; `axpy` reads its output too, which a write access covers.
        if index == 0 {
            Access::Write
        } else {
            Access::Read
        }
    }

    /// Element-wise kernels and matmul run on every compute worker once their data is large
    /// enough to pay for waking them ([`SPLIT_BYTES`], [`SPLIT_MACS`]); the others as one
    /// block.
    fn blocks(&self, args: &Args, workers: u32) -> u32 {
        if self.work(args) >= Work::Split {
            workers.clamp(1, super::MAX_BLOCK_DIM)
        } else {
            1
        }
    }

    fn wakes_workers(&self, args: &Args, _blocks: u32) -> bool {
        self.work(args) >= Work::Wake
    }

    fn run(&self, args: &Args, cx: &RunContext) -> Result<(), KernelFailure> {
        if *self == Builtin::Noop && args.checked_by(self) {
            return Ok(());
        }
        // The typed views of `compute` are sound only while nothing else touches the tensors.
        args.hold_for(self, cx, |i| self.access(i), || self.compute(args, cx))
    }
}

impl Builtin {
    /// The work of block `cx`, the tensors held (see `run`).
    fn compute(&self, args: &Args, cx: &RunContext) {
        match self {
            Builtin::Noop => {}
            Builtin::Copy => {
                let (d, s) = (t(args, 0), t(args, 1));
                if d.span() != s.span() {
                    // Disjoint (checked): this block's share of the bytes.
                    let r = cx.share_aligned(d.nbytes() as usize, SHARE_ALIGN_BYTES);
                    let (dst, src) = (view_mut_part::<u8>(d, r.clone()), view_part::<u8>(s, r));
                    if d.nbytes() >= STREAM_BYTES {
                        crate::memory::host::stream_copy_slice(dst, src);
                    } else {
                        dst.copy_from_slice(src);
                    }
                }
            }
            // One block sums it all: the others have nothing to do.
            Builtin::Sum if cx.block_idx() != 0 => {}
            _ => dispatch(*self, args, cx),
        }
    }
}

/// How much work a launch of a built-in is, for choosing its blocks when the launch names
/// none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Work {
    /// One block.
    Small,
    /// A block per compute worker, run by the op's thread and threads already awake or
    /// waiting for the stream ([`SPLIT_BYTES`], [`SPLIT_MACS`]).
    Split,
    /// Worth waking sleeping workers too ([`WAKE_BYTES`], [`WAKE_MACS`]).
    Wake,
}

impl Builtin {
    fn work(&self, args: &Args) -> Work {
        let (size, split, wake) = match self {
            Builtin::Noop | Builtin::Sum => return Work::Small,
            Builtin::Matmul => {
                let (a, b) = (t(args, 1), t(args, 2));
                if a.shape[0] < 2 {
                    return Work::Small;
                }
                let macs = (a.shape[0] as u128) * (a.shape[1] as u128) * (b.shape[1] as u128);
                (macs, SPLIT_MACS, WAKE_MACS)
            }
            _ => {
                let bytes: u64 = args
                    .iter()
                    .map(|a| match a {
                        KernelArg::Tensor(t) => t.nbytes(),
                        _ => 0,
                    })
                    .sum();
                (
                    u128::from(bytes),
                    u128::from(SPLIT_BYTES),
                    u128::from(WAKE_BYTES),
                )
            }
        };
        if size >= wake {
            Work::Wake
        } else if size >= split {
            Work::Split
        } else {
            Work::Small
        }
    }
}

/// Bytes of tensor data (inputs and output together) from which an element-wise kernel runs
/// on every compute worker when the launch names no `block_dim`.
pub const SPLIT_BYTES: u64 = 512 << 10;

/// Bytes of tensor data from which an element-wise launch that runs as several blocks also
/// wakes sleeping compute workers for them: below it the blocks take less time than a
/// wake-up (tens of microseconds), so only threads already awake run them
/// ([`Kernel::wakes_workers`]).
pub const WAKE_BYTES: u64 = 4 << 20;

/// Multiply-adds from which a multi-block matmul wakes sleeping compute workers (a
/// 128 x 128 x 128 product).
pub const WAKE_MACS: u128 = 128 * 128 * 128;

/// Output bytes from which element-wise built-ins (`fill`, `copy`, `scale`, `add`, `mul` into
/// a separate output) write with streaming stores: outputs that do not fit the caches.
pub const STREAM_BYTES: u64 = 16 << 20;

/// Bytes of a streamed output computed into a stack buffer at a time: four cache lines.
/// Streaming stores drain through a core's few write-combining buffers; a larger burst
/// stalls on them with the loads waiting behind. Measured on 2^24 float32 adds, 1 and 2
/// threads: 8 KiB and 1 KiB bursts were no faster than plain stores, 256 bytes took
/// 0.76-0.80x their time (computing straight into streaming stores 0.73x).
const STREAM_CHUNK: usize = 256;

/// Elements of that buffer: [`STREAM_CHUNK`] bytes of every element type of 4 bytes or more
/// (fewer bytes for the narrower ones, whose chunks are still whole cache lines).
const STREAM_CHUNK_ELEMS: usize = 64;

/// Multiply-adds from which a matmul runs on every compute worker when the launch names no
/// `block_dim` (a 64 x 64 x 64 product).
pub const SPLIT_MACS: u128 = 64 * 64 * 64;

/// Shares of element-wise kernels start on multiples of this many bytes (a cache line, and
/// whole vectors for every element size).
const SHARE_ALIGN_BYTES: usize = 64;

fn t(args: &[KernelArg], i: usize) -> &Tensor {
    match &args[i] {
        KernelArg::Tensor(t) => t,
        _ => unreachable!("checked at launch"),
    }
}

fn s<T: Elem>(args: &[KernelArg], i: usize) -> T {
    match args[i] {
        KernelArg::Float(f) => T::from_f64(f),
        KernelArg::Int(n) => T::from_i64(n),
        KernelArg::Complex(re, im) => T::from_complex(re, im),
        KernelArg::Tensor(_) | KernelArg::Typed(_) => unreachable!("checked at launch"),
    }
}

fn dispatch(k: Builtin, args: &[KernelArg], cx: &RunContext) {
    match t(args, 0).dtype {
        DType::Bool => typed::<bool>(k, args, cx),
        DType::I8 => typed::<i8>(k, args, cx),
        DType::I16 => typed::<i16>(k, args, cx),
        DType::I32 => typed::<i32>(k, args, cx),
        DType::I64 => typed::<i64>(k, args, cx),
        DType::U8 => typed::<u8>(k, args, cx),
        DType::U16 => typed::<u16>(k, args, cx),
        DType::U32 => typed::<u32>(k, args, cx),
        DType::U64 => typed::<u64>(k, args, cx),
        DType::F16 => typed::<Half>(k, args, cx),
        DType::BF16 => typed::<BHalf>(k, args, cx),
        DType::F32 => typed::<f32>(k, args, cx),
        DType::F64 => typed::<f64>(k, args, cx),
        DType::C64 => typed::<Complex<f32>>(k, args, cx),
        DType::C128 => typed::<Complex<f64>>(k, args, cx),
    }
}

/// Read-only view of elements `range` of `x`. SAFETY contract of
/// `Buffer::slice_unsynchronized`: `check` verified bounds, alignment (the offset is a
/// multiple of the item size, which every `Repr`'s alignment divides), and that the tensor is
/// either disjoint from every output or exactly an output (in which case callers use the
/// in-place paths and never hold both views); `run` computes only while its thread holds
/// every tensor's allocation (the output exclusively, `access`) itself, or borrows it from
/// the blocks of this very launch, whose blocks view disjoint element ranges of each output
/// (`RunContext::share_aligned`, one claimed block index each), so no other op, block or
/// host thread touches the bytes meanwhile.
fn view_part<T: crate::memory::Element>(x: &Tensor, range: std::ops::Range<usize>) -> &[T] {
    let at = x.offset + (range.start * size_of::<T>()) as u64;
    // SAFETY: see above.
    unsafe { x.buffer.slice_unsynchronized::<T>(at, range.len()) }
}

#[allow(clippy::mut_from_ref)] // the op holds the allocation exclusively; see `view_part`
fn view_mut_part<T: crate::memory::Element>(x: &Tensor, range: std::ops::Range<usize>) -> &mut [T] {
    let at = x.offset + (range.start * size_of::<T>()) as u64;
    // SAFETY: see `view_part`; the output's share is the only mutable view of those bytes
    // alive, in this block and in every other block of the launch.
    unsafe { x.buffer.slice_mut_unsynchronized::<T>(at, range.len()) }
}

fn typed<'a, T: Elem>(k: Builtin, args: &'a [KernelArg], cx: &RunContext) {
    let out = t(args, 0);
    let share = cx.share_aligned(
        out.len(),
        (SHARE_ALIGN_BYTES / size_of::<T::Repr>().max(1)).max(1),
    );
    let part = |x: &'a Tensor| view_part::<T::Repr>(x, share.clone());
    let out_part = || view_mut_part::<T::Repr>(out, share.clone());
    let streaming = out.nbytes() >= STREAM_BYTES;
    match k {
        Builtin::Fill if streaming => fill_streamed::<T>(out_part(), s::<T>(args, 1).store()),
        Builtin::Fill => out_part().fill(s::<T>(args, 1).store()),
        Builtin::Scale => {
            let alpha = s::<T>(args, 2);
            let x = t(args, 1);
            if x.span() == out.span() {
                map_in_place::<T, _>(out_part(), move |v| alpha.mul(v));
            } else if streaming {
                map_streamed::<T, _>(out_part(), part(x), move |x| alpha.mul(x));
            } else {
                map_from::<T, _>(out_part(), part(x), move |_, x| alpha.mul(x));
            }
        }
        Builtin::Axpy => {
            let alpha = s::<T>(args, 2);
            let x = t(args, 1);
            if x.span() == out.span() {
                map_in_place::<T, _>(out_part(), move |y| alpha.mul(y).add(y));
            } else {
                map_from::<T, _>(out_part(), part(x), move |y, x| alpha.mul(x).add(y));
            }
        }
        Builtin::Add => binary::<T, _>(out, t(args, 1), t(args, 2), &share, T::add),
        Builtin::Mul => binary::<T, _>(out, t(args, 1), t(args, 2), &share, T::mul),
        Builtin::Sum => {
            let total = T::sum(view_part::<T::Repr>(t(args, 1), 0..t(args, 1).len()));
            view_mut_part::<T::Repr>(out, 0..1)[0] = total;
        }
        Builtin::Matmul => matmul::<T>(out, t(args, 1), t(args, 2), cx),
        Builtin::Noop | Builtin::Copy => {}
    }
}

/// `o[i] = f(o[i])`.
#[multiversion::multiversion(targets = "simd")]
fn map_in_place<T: Elem, F: Fn(T) -> T>(o: &mut [T::Repr], f: F) {
    for v in o.iter_mut() {
        *v = f(T::load(*v)).store();
    }
}

/// `o[i] = f(o[i], x[i])`.
#[multiversion::multiversion(targets = "simd")]
fn map_from<T: Elem, F: Fn(T, T) -> T>(o: &mut [T::Repr], x: &[T::Repr], f: F) {
    let x = &x[..o.len()];
    for (o, &x) in o.iter_mut().zip(x) {
        *o = f(T::load(*o), T::load(x)).store();
    }
}

/// `o[i] = f(a[i], b[i])`.
#[multiversion::multiversion(targets = "simd")]
fn zip_into<T: Elem, F: Fn(T, T) -> T>(o: &mut [T::Repr], a: &[T::Repr], b: &[T::Repr], f: F) {
    let n = o.len();
    let (a, b) = (&a[..n], &b[..n]);
    for i in 0..n {
        o[i] = f(T::load(a[i]), T::load(b[i])).store();
    }
}

fn binary<'a, T: Elem, F: Fn(T, T) -> T + Copy>(
    out: &'a Tensor,
    a: &'a Tensor,
    b: &'a Tensor,
    share: &std::ops::Range<usize>,
    f: F,
) {
    let part = |x: &'a Tensor| view_part::<T::Repr>(x, share.clone());
    let o = view_mut_part::<T::Repr>(out, share.clone());
    match (out.span() == a.span(), out.span() == b.span()) {
        (true, true) => map_in_place::<T, _>(o, move |v| f(v, v)),
        (true, false) => map_from::<T, _>(o, part(b), f),
        (false, true) => map_from::<T, _>(o, part(a), move |o, a| f(a, o)),
        (false, false) if out.nbytes() >= STREAM_BYTES => {
            zip_streamed::<T, _>(o, part(a), part(b), f);
        }
        (false, false) => zip_into::<T, _>(o, part(a), part(b), f),
    }
}

/// `o[i] = v`, written with streaming stores ([`streamed`]).
#[multiversion::multiversion(targets = "simd")]
fn fill_streamed<T: Elem>(o: &mut [T::Repr], v: T::Repr) {
    streamed(o, |_, buf| buf.fill(v));
}

/// `o[i] = f(x[i])`, written with streaming stores ([`streamed`]).
#[multiversion::multiversion(targets = "simd")]
fn map_streamed<T: Elem, F: Fn(T) -> T>(o: &mut [T::Repr], x: &[T::Repr], f: F) {
    let x = &x[..o.len()];
    streamed(o, |r, buf| {
        for (o, &x) in buf.iter_mut().zip(&x[r]) {
            *o = f(T::load(x)).store();
        }
    });
}

/// `o[i] = f(a[i], b[i])`, written with streaming stores ([`streamed`]).
#[multiversion::multiversion(targets = "simd")]
fn zip_streamed<T: Elem, F: Fn(T, T) -> T>(o: &mut [T::Repr], a: &[T::Repr], b: &[T::Repr], f: F) {
    let n = o.len();
    let (a, b) = (&a[..n], &b[..n]);
    streamed(o, |r, buf| {
        for ((o, &a), &b) in buf.iter_mut().zip(&a[r.clone()]).zip(&b[r]) {
            *o = f(T::load(a), T::load(b)).store();
        }
    });
}

/// Write `o` with streaming stores, [`STREAM_CHUNK`] bytes at a time: `compute(range, buf)`
/// writes the values of `o[range]` into `buf`, a stack buffer that then goes to `o` whole
/// lines at a time ([`stream_chunk`]); the part of `o` before its first cache-line boundary
/// and the tail shorter than a chunk are computed into `o` itself. For an output larger
/// than the caches this saves reading each line of `o` before writing it (a quarter of an
/// element-wise add's memory traffic) and evicting the inputs for it. Inlined into the
/// callers' SIMD versions, so `compute` is vectorised with them.
#[inline(always)]
fn streamed<R: crate::memory::Element>(o: &mut [R], compute: impl Fn(Range<usize>, &mut [R])) {
    let n = o.len();
    let Some(&first) = o.first() else {
        return;
    };
    if !cfg!(target_arch = "x86_64") {
        compute(0..n, o);
        return;
    }
    let step = (STREAM_CHUNK / size_of::<R>()).clamp(1, STREAM_CHUNK_ELEMS);
    // `usize::MAX` (so all of `o` as head) where no element starts on a line boundary.
    let head = o.as_ptr().align_offset(64).min(n);
    compute(0..head, &mut o[..head]);
    let mut buf = [first; STREAM_CHUNK_ELEMS];
    let buf = &mut buf[..step];
    let mut at = head;
    while n - at >= step {
        compute(at..at + step, buf);
        stream_chunk(&mut o[at..at + step], buf);
        at += step;
    }
    compute(at..n, &mut o[at..]);
    stream_fence();
}

/// `dst = src` (equal lengths) with SSE2's non-temporal stores, which every x86-64 CPU has,
/// when `dst` starts on a 16-byte boundary and holds whole 16-byte units ([`streamed`]'s
/// chunks always do); a plain copy otherwise. The stores are weakly ordered: call
/// [`stream_fence`] before the op ends.
#[inline(always)]
fn stream_chunk<R: crate::memory::Element>(dst: &mut [R], src: &[R]) {
    let (dst, src) = (R::as_bytes_mut(dst), R::as_bytes(src));
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if dst.len() == src.len() && dst.len() % 16 == 0 && dst.as_ptr().align_offset(16) == 0 {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        for (d, s) in dst.chunks_exact_mut(16).zip(src.chunks_exact(16)) {
            // SAFETY: `s` and `d` are 16 bytes each (`chunks_exact`), inside slices borrowed
            // for this call (`d` exclusively), so the unaligned load reads only `s` and the
            // store writes only `d`; `d` starts on a 16-byte boundary as `_mm_stream_si128`
            // requires (`dst` does, checked above, and each chunk is 16 bytes further on).
            // SSE2 is part of the x86-64 baseline: no CPU check is needed.
            unsafe {
                _mm_stream_si128(
                    d.as_mut_ptr().cast::<__m128i>(),
                    _mm_loadu_si128(s.as_ptr().cast::<__m128i>()),
                );
            }
        }
        return;
    }
    dst.copy_from_slice(src);
}

/// Order this thread's streaming stores before its later stores, so that the op's
/// completion (which other threads read) follows them: a sequentially consistent fence,
/// `mfence` on x86-64, which orders non-temporal stores too (a release store does not).
fn stream_fence() {
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// This block's rows of `c = a @ b`.
fn matmul<T: Elem>(c: &Tensor, a: &Tensor, b: &Tensor, cx: &RunContext) {
    let (m, k, n) = (a.shape[0], a.shape[1], b.shape[1]);
    let rows = cx.share(m);
    let mr = rows.len();
    if mr == 0 {
        return;
    }
    T::gemm(
        mr,
        k,
        n,
        view_part::<T::Repr>(a, rows.start * k..rows.end * k),
        view_part::<T::Repr>(b, 0..k * n),
        view_mut_part::<T::Repr>(c, rows.start * n..rows.end * n),
    );
}

/// Plain i-k-j product (integers wrap, as numpy; bool is or-of-ands; complex exact formula).
fn gemm_loop<T: Elem>(
    m: usize,
    k: usize,
    n: usize,
    a: &[T::Repr],
    b: &[T::Repr],
    c: &mut [T::Repr],
) {
    if n == 0 {
        return;
    }
    let mut row = vec![T::zero(); n];
    for (i, out) in c.chunks_exact_mut(n).enumerate().take(m) {
        row.fill(T::zero());
        for p in 0..k {
            let aip = T::load(a[i * k + p]);
            let brow = &b[p * n..(p + 1) * n];
            row.iter_mut()
                .zip(brow)
                .for_each(|(c, &b)| *c = c.add(aip.mul(T::load(b))));
        }
        out.iter_mut().zip(&row).for_each(|(o, &v)| *o = v.store());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values from a word per element, any element type (wrapping casts).
    fn values<T: Elem>(seed: u64, n: usize) -> Vec<T::Repr> {
        (0..n as u64)
            .map(|i| T::from_i64(((i.wrapping_mul(seed) ^ (i >> 3)) % 251) as i64 - 125).store())
            .collect()
    }

    /// The streamed loops write what the plain ones write, for every element width (so every
    /// chunk length), from every start within a cache line and at lengths around the chunk
    /// and line boundaries, and leave the elements around the output alone.
    fn streamed_matches_plain<T: Elem>()
    where
        T::Repr: PartialEq + std::fmt::Debug,
    {
        let size = size_of::<T::Repr>();
        let step = (STREAM_CHUNK / size).clamp(1, STREAM_CHUNK_ELEMS);
        let line = 64 / size;
        let lengths = [
            0,
            1,
            line - 1,
            line,
            step - 1,
            step,
            step + 1,
            3 * step + line + 1,
        ];
        let marker = T::from_i64(7).store();
        for start in 0..line {
            for &n in &lengths {
                let (a, b) = (values::<T>(3, start + n), values::<T>(5, start + n));
                let (a, b) = (&a[start..], &b[start..]);
                let mut want = vec![marker; start + n + 1];
                let mut got = want.clone();
                zip_into::<T, _>(&mut want[start..start + n], a, b, T::add);
                zip_streamed::<T, _>(&mut got[start..start + n], a, b, T::add);
                assert_eq!(
                    got, want,
                    "add, {size}-byte elements from {start}, {n} of them"
                );
                map_from::<T, _>(&mut want[start..start + n], a, |_, x| x.mul(x));
                map_streamed::<T, _>(&mut got[start..start + n], a, |x| x.mul(x));
                assert_eq!(
                    got, want,
                    "map, {size}-byte elements from {start}, {n} of them"
                );
                let v = T::from_i64(-3).store();
                want[start..start + n].fill(v);
                fill_streamed::<T>(&mut got[start..start + n], v);
                assert_eq!(
                    got, want,
                    "fill, {size}-byte elements from {start}, {n} of them"
                );
            }
        }
    }

    #[test]
    fn streamed_loops_match_the_plain_ones_for_every_element_width() {
        streamed_matches_plain::<u8>();
        streamed_matches_plain::<i16>();
        streamed_matches_plain::<Half>();
        streamed_matches_plain::<f32>();
        streamed_matches_plain::<i64>();
        streamed_matches_plain::<Complex<f32>>();
        streamed_matches_plain::<Complex<f64>>();
    }
}
