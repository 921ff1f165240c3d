//! Every dtype through the core: `DType`'s names, kinds and ranges, numpy's `view(dtype)` rule
//! (against a byte-level model), and the built-in kernels on the dtypes beyond float32/64 and
//! int32/64 (wrapping integers, bool's or/and, float16 and bfloat16 rounded per result, complex
//! products),
//! with the scalar range checks.
//!
//! All tests share one runtime (same settings, never shut down).

mod common;

use half::{bf16, f16};
use num_complex::Complex;
use proptest::prelude::*;
use runtime_core::error::Error;
use runtime_core::kernel::{DType, KernelArg, LaunchKernel, Tensor};
use runtime_core::memory::{Buffer, Element};
use runtime_core::stream::Stream;

use common::{init, Rng};

fn stream() -> Stream {
    Stream::new(init().device(0).unwrap(), 0).unwrap()
}

fn upload<T: Element>(v: &[T]) -> Buffer {
    let b = init()
        .device(0)
        .unwrap()
        .memory()
        .allocate(size_of_val(v).max(1) as u64)
        .unwrap();
    b.write(0, T::as_bytes(v)).unwrap();
    b
}

fn t(b: &Buffer, dtype: DType, shape: &[usize]) -> KernelArg {
    KernelArg::Tensor(Tensor::new(b.clone(), 0, dtype, shape).unwrap())
}

fn read<T: Element + Default>(b: &Buffer, dtype: DType, n: usize) -> Vec<T> {
    Tensor::new(b.clone(), 0, dtype, vec![n])
        .unwrap()
        .to_vec()
        .unwrap()
}

fn run(s: &Stream, name: &str, args: Vec<KernelArg>) {
    s.launch_kernel(name, args)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    s.synchronize(None).unwrap();
}

fn arg_error(r: runtime_core::Result<()>, arg: &str, text: &str) {
    match r {
        Err(Error::Arg(e)) => {
            assert_eq!(e.arg, arg, "{e}");
            assert!(e.message.contains(text), "{e}");
        }
        other => panic!("expected an ArgError naming {arg}, got {other:?}"),
    }
}

#[test]
fn names_sizes_and_kinds() {
    let want = [
        ("bool", 1, 'b'),
        ("int8", 1, 'i'),
        ("int16", 2, 'i'),
        ("int32", 4, 'i'),
        ("int64", 8, 'i'),
        ("uint8", 1, 'u'),
        ("uint16", 2, 'u'),
        ("uint32", 4, 'u'),
        ("uint64", 8, 'u'),
        ("float16", 2, 'f'),
        ("bfloat16", 2, 'f'),
        ("float32", 4, 'f'),
        ("float64", 8, 'f'),
        ("complex64", 8, 'c'),
        ("complex128", 16, 'c'),
    ];
    assert_eq!(DType::ALL.len(), want.len());
    for (d, (name, size, kind)) in DType::ALL.into_iter().zip(want) {
        assert_eq!((d.name(), d.size(), d.kind()), (name, size, kind));
        assert_eq!(DType::parse(name), Some(d));
        // bfloat16 has no type code: 'f', 2 bytes is float16, as in numpy.
        if d != DType::BF16 {
            assert_eq!(DType::from_kind(kind, size), Some(d));
            let code = if kind == 'b' {
                "b1".to_string()
            } else {
                format!("{kind}{size}")
            };
            assert_eq!(DType::parse(&code), Some(d), "{code}");
            assert_eq!(DType::parse(&format!("<{code}")), Some(d), "<{code}");
        }
        assert_eq!(d.to_string(), name);
        assert_eq!(d.is_float(), kind == 'f');
        assert_eq!(d.is_complex(), kind == 'c');
        assert_eq!(d.is_integer(), kind == 'i' || kind == 'u');
        assert_eq!(d.is_inexact(), kind == 'f' || kind == 'c');
    }
    // numpy's one-letter codes
    for (code, d) in [
        ("?", DType::Bool),
        ("b", DType::I8),
        ("h", DType::I16),
        ("H", DType::U16),
        ("I", DType::U32),
        ("Q", DType::U64),
        ("e", DType::F16),
        ("F", DType::C64),
        ("D", DType::C128),
    ] {
        assert_eq!(DType::parse(code), Some(d), "{code}");
    }
    assert_eq!(DType::from_kind('f', 2), Some(DType::F16));
    assert_eq!(DType::parse("bf16"), None);
    assert_eq!(DType::parse("float128"), None);
    assert_eq!(DType::from_kind('f', 16), None);
}

#[test]
fn integer_ranges() {
    assert_eq!(DType::Bool.int_range(), Some((0, 1)));
    assert_eq!(DType::I8.int_range(), Some((-128, 127)));
    assert_eq!(DType::U16.int_range(), Some((0, 65535)));
    assert_eq!(
        DType::I64.int_range(),
        Some((i64::MIN.into(), i64::MAX.into()))
    );
    assert_eq!(DType::U64.int_range(), Some((0, u64::MAX.into())));
    assert_eq!(DType::F16.int_range(), None);
    assert_eq!(DType::BF16.int_range(), None);
    assert_eq!(DType::C128.int_range(), None);
}

#[test]
fn view_shape_follows_numpy() {
    // numpy: np.zeros((3, 4), "i2").view("u4").shape == (3, 2)
    assert_eq!(DType::I16.view_shape(&[3, 4], DType::U32).unwrap(), [3, 2]);
    assert_eq!(DType::I32.view_shape(&[4, 6], DType::I8).unwrap(), [4, 24]);
    assert_eq!(DType::F32.view_shape(&[2, 3], DType::I32).unwrap(), [2, 3]);
    assert_eq!(DType::C128.view_shape(&[5], DType::F64).unwrap(), [10]);
    assert_eq!(DType::U8.view_shape(&[2, 0], DType::C128).unwrap(), [2, 0]);
    // 0-d: only the same item size
    assert_eq!(
        DType::F32.view_shape(&[], DType::I32).unwrap(),
        Vec::<usize>::new()
    );
    let e = DType::F32.view_shape(&[], DType::F64).unwrap_err();
    assert_eq!(e.arg, "dtype");
    assert!(e.message.contains("0d array"), "{e}");
    let e = DType::I16.view_shape(&[4, 3], DType::I64).unwrap_err();
    assert!(e
        .message
        .contains("divisor of the total size in bytes of the last axis"));
    assert!(
        e.message.contains("(4, 3)") && e.message.contains("has 6"),
        "{e}"
    );
}

proptest! {
    /// The rule against a byte-level model: the leading axes stay, the last axis keeps its
    /// bytes, and the view is refused exactly when those bytes do not split evenly (or the
    /// array is 0-d and the size changes).
    #[test]
    fn view_shape_model(
        from in 0usize..14,
        to in 0usize..14,
        shape in proptest::collection::vec(0usize..7, 0..4),
    ) {
        let (from, to) = (DType::ALL[from], DType::ALL[to]);
        let got = from.view_shape(&shape, to);
        if from.size() == to.size() {
            prop_assert_eq!(got.unwrap(), shape);
        } else if let Some((&last, lead)) = shape.split_last() {
            let bytes = last * from.size();
            if bytes % to.size() == 0 {
                let v = got.unwrap();
                prop_assert_eq!(&v[..lead.len()], lead);
                prop_assert_eq!(v[lead.len()] * to.size(), bytes);
            } else {
                prop_assert!(got.is_err());
            }
        } else {
            prop_assert!(got.is_err());
        }
    }
}

/// fill, add, mul, scale, axpy, sum on one integer type, against wrapping reference ops.
macro_rules! int_kernels {
    ($name:ident, $t:ty, $dt:expr) => {
        #[test]
        fn $name() {
            let s = stream();
            let mut r = Rng(0xD7 ^ <$t>::MAX as u64);
            let n = 37;
            let a: Vec<$t> = (0..n).map(|_| r.next() as $t).collect();
            let b: Vec<$t> = (0..n).map(|_| r.next() as $t).collect();
            let (ab, bb, ob) = (upload(&a), upload(&b), upload(&vec![0 as $t; n]));
            run(
                &s,
                "add",
                vec![t(&ob, $dt, &[n]), t(&ab, $dt, &[n]), t(&bb, $dt, &[n])],
            );
            let want: Vec<$t> = a.iter().zip(&b).map(|(x, y)| x.wrapping_add(*y)).collect();
            assert_eq!(read::<$t>(&ob, $dt, n), want);
            run(
                &s,
                "mul",
                vec![t(&ob, $dt, &[n]), t(&ab, $dt, &[n]), t(&bb, $dt, &[n])],
            );
            let want: Vec<$t> = a.iter().zip(&b).map(|(x, y)| x.wrapping_mul(*y)).collect();
            assert_eq!(read::<$t>(&ob, $dt, n), want);
            run(
                &s,
                "scale",
                vec![t(&ob, $dt, &[n]), t(&ab, $dt, &[n]), KernelArg::Int(3)],
            );
            let want: Vec<$t> = a.iter().map(|x| x.wrapping_mul(3)).collect();
            assert_eq!(read::<$t>(&ob, $dt, n), want);
            run(
                &s,
                "axpy",
                vec![t(&ob, $dt, &[n]), t(&bb, $dt, &[n]), KernelArg::Int(2)],
            );
            let want: Vec<$t> = want
                .iter()
                .zip(&b)
                .map(|(y, x)| x.wrapping_mul(2).wrapping_add(*y))
                .collect();
            assert_eq!(read::<$t>(&ob, $dt, n), want);
            run(&s, "sum", vec![t(&ob, $dt, &[1]), t(&ab, $dt, &[n])]);
            let total = a.iter().fold(0 as $t, |x, y| x.wrapping_add(*y));
            assert_eq!(read::<$t>(&ob, $dt, 1), [total]);
            let (lo, hi) = $dt.int_range().unwrap();
            run(
                &s,
                "fill",
                vec![
                    t(&ob, $dt, &[n]),
                    KernelArg::Int(hi.min(i64::MAX.into()) as i64),
                ],
            );
            assert!(read::<$t>(&ob, $dt, n)
                .iter()
                .all(|&v| v as i128 == hi.min(i64::MAX.into())));
            run(
                &s,
                "fill",
                vec![t(&ob, $dt, &[n]), KernelArg::Float(lo as f64)],
            );
            assert!(read::<$t>(&ob, $dt, n).iter().all(|&v| v as i128 == lo));
            // One past either end is refused, as an int and as a float.
            for bad in [lo - 1, hi + 1] {
                if let Ok(i) = i64::try_from(bad) {
                    arg_error(
                        s.launch_kernel("fill", vec![t(&ob, $dt, &[n]), KernelArg::Int(i)]),
                        "value",
                        "does not fit",
                    );
                }
                arg_error(
                    s.launch_kernel(
                        "fill",
                        vec![t(&ob, $dt, &[n]), KernelArg::Float(bad as f64)],
                    ),
                    "value",
                    "does not fit",
                );
            }
            // Matrix product: wrapping i-k-j.
            let (m, k, p) = (3, 4, 5);
            let (am, bm) = (&a[..m * k], &b[..k * p]);
            let cb = upload(&vec![0 as $t; m * p]);
            run(
                &s,
                "matmul",
                vec![
                    t(&cb, $dt, &[m, p]),
                    t(&upload(am), $dt, &[m, k]),
                    t(&upload(bm), $dt, &[k, p]),
                ],
            );
            let mut want = vec![0 as $t; m * p];
            for i in 0..m {
                for j in 0..p {
                    for q in 0..k {
                        want[i * p + j] =
                            want[i * p + j].wrapping_add(am[i * k + q].wrapping_mul(bm[q * p + j]));
                    }
                }
            }
            assert_eq!(read::<$t>(&cb, $dt, m * p), want);
        }
    };
}
int_kernels!(int8_kernels, i8, DType::I8);
int_kernels!(int16_kernels, i16, DType::I16);
int_kernels!(uint8_kernels, u8, DType::U8);
int_kernels!(uint16_kernels, u16, DType::U16);
int_kernels!(uint32_kernels, u32, DType::U32);
int_kernels!(uint64_kernels, u64, DType::U64);

#[test]
fn uint64_takes_floats_up_to_its_top() {
    let s = stream();
    let b = upload(&[0u64; 2]);
    // 2**63 is beyond an Int scalar but exact as a float.
    run(
        &s,
        "fill",
        vec![t(&b, DType::U64, &[2]), KernelArg::Float(2f64.powi(63))],
    );
    assert_eq!(read::<u64>(&b, DType::U64, 2), [1 << 63; 2]);
    arg_error(
        s.launch_kernel(
            "fill",
            vec![t(&b, DType::U64, &[2]), KernelArg::Float(2f64.powi(64))],
        ),
        "value",
        "does not fit",
    );
    arg_error(
        s.launch_kernel("fill", vec![t(&b, DType::U64, &[2]), KernelArg::Int(-1)]),
        "value",
        "does not fit",
    );
}

#[test]
fn bool_is_or_and_and() {
    let s = stream();
    // Any nonzero byte reads as true; results are 0 or 1.
    let a = upload(&[0u8, 1, 0, 7]);
    let b = upload(&[0u8, 0, 1, 2]);
    let o = upload(&[9u8; 4]);
    let bt = DType::Bool;
    run(
        &s,
        "add",
        vec![t(&o, bt, &[4]), t(&a, bt, &[4]), t(&b, bt, &[4])],
    );
    assert_eq!(read::<u8>(&o, bt, 4), [0, 1, 1, 1]);
    run(
        &s,
        "mul",
        vec![t(&o, bt, &[4]), t(&a, bt, &[4]), t(&b, bt, &[4])],
    );
    assert_eq!(read::<u8>(&o, bt, 4), [0, 0, 0, 1]);
    run(&s, "fill", vec![t(&o, bt, &[4]), KernelArg::Int(1)]);
    assert_eq!(read::<u8>(&o, bt, 4), [1; 4]);
    run(&s, "copy", vec![t(&o, bt, &[4]), t(&a, bt, &[4])]);
    assert_eq!(read::<u8>(&o, bt, 4), [0, 1, 0, 7]);
    // [[0,1],[0,7]] @ [[0,0],[1,2]] as or-of-ands = [[1,1],[1,1]]
    let c = upload(&[5u8; 4]);
    run(
        &s,
        "matmul",
        vec![t(&c, bt, &[2, 2]), t(&a, bt, &[2, 2]), t(&b, bt, &[2, 2])],
    );
    assert_eq!(read::<u8>(&c, bt, 4), [1, 1, 1, 1]);
    arg_error(
        s.launch_kernel("fill", vec![t(&o, bt, &[4]), KernelArg::Int(2)]),
        "value",
        "does not fit in bool",
    );
    arg_error(
        s.launch_kernel(
            "scale",
            vec![t(&o, bt, &[4]), t(&a, bt, &[4]), KernelArg::Int(1)],
        ),
        "out",
        "bool",
    );
    arg_error(
        s.launch_kernel(
            "axpy",
            vec![t(&o, bt, &[4]), t(&a, bt, &[4]), KernelArg::Int(1)],
        ),
        "y",
        "bool",
    );
    arg_error(
        s.launch_kernel("sum", vec![t(&c, bt, &[1]), t(&a, bt, &[4])]),
        "out",
        "bool",
    );
}

#[test]
fn float16_rounds_each_result() {
    let s = stream();
    let mut r = Rng(16);
    let n = 64;
    let gen = |r: &mut Rng| f16::from_f64(((r.next() % 4096) as f64 - 2048.0) / 64.0);
    let a: Vec<f16> = (0..n).map(|_| gen(&mut r)).collect();
    let b: Vec<f16> = (0..n).map(|_| gen(&mut r)).collect();
    let (ab, bb, ob) = (upload(&a), upload(&b), upload(&vec![f16::ZERO; n]));
    let h = DType::F16;
    // numpy's float16 add/mul: widen to float32, operate, round to float16.
    let op = |f: fn(f32, f32) -> f32| -> Vec<f16> {
        a.iter()
            .zip(&b)
            .map(|(x, y)| f16::from_f32(f(x.to_f32(), y.to_f32())))
            .collect()
    };
    run(
        &s,
        "add",
        vec![t(&ob, h, &[n]), t(&ab, h, &[n]), t(&bb, h, &[n])],
    );
    assert_eq!(read::<f16>(&ob, h, n), op(|x, y| x + y));
    run(
        &s,
        "mul",
        vec![t(&ob, h, &[n]), t(&ab, h, &[n]), t(&bb, h, &[n])],
    );
    assert_eq!(read::<f16>(&ob, h, n), op(|x, y| x * y));
    run(
        &s,
        "scale",
        vec![t(&ob, h, &[n]), t(&ab, h, &[n]), KernelArg::Float(0.5)],
    );
    let want: Vec<f16> = a.iter().map(|x| f16::from_f32(0.5 * x.to_f32())).collect();
    assert_eq!(read::<f16>(&ob, h, n), want);
    run(&s, "fill", vec![t(&ob, h, &[n]), KernelArg::Float(0.1)]);
    assert!(read::<f16>(&ob, h, n)
        .iter()
        .all(|&v| v == f16::from_f64(0.1)));
    run(&s, "fill", vec![t(&ob, h, &[n]), KernelArg::Float(1e6)]);
    assert!(read::<f16>(&ob, h, n).iter().all(|v| v.is_infinite()));
    run(&s, "sum", vec![t(&ob, h, &[1]), t(&ab, h, &[n])]);
    let total: f64 = a.iter().map(|x| x.to_f64()).sum();
    assert_eq!(read::<f16>(&ob, h, 1), [f16::from_f64(total)]);
    // matmul: float32 accumulation, one rounding per result
    let (m, k, p) = (4, 8, 8);
    let cb = upload(&vec![f16::ZERO; m * p]);
    run(
        &s,
        "matmul",
        vec![t(&cb, h, &[m, p]), t(&ab, h, &[m, k]), t(&bb, h, &[k, p])],
    );
    let got = read::<f16>(&cb, h, m * p);
    for i in 0..m {
        for j in 0..p {
            let want: f32 = (0..k)
                .map(|q| a[i * k + q].to_f32() * b[q * p + j].to_f32())
                .sum();
            let g = got[i * p + j].to_f32();
            assert!(
                (g - want).abs() <= 1e-3 * want.abs().max(1.0),
                "{g} vs {want}"
            );
        }
    }
}

/// bfloat16 as ml_dtypes computes it (its ufuncs widen to float32 and round each result to
/// nearest even): add, mul, scale and fill bit-exact against that model, overflow past
/// bfloat16's largest finite value (about 3.39e38) to infinity, sum through float64 and matmul
/// with float32 accumulation.
#[test]
fn bfloat16_rounds_each_result() {
    let s = stream();
    let mut r = Rng(17);
    let n = 64;
    // Random bit patterns of finite bfloat16 values of moderate size (exponent 2^-8..2^8),
    // so that sums and products need rounding to 8 significant bits.
    let gen = |r: &mut Rng| {
        let bits = r.next() as u16;
        let exp = 119 + (bits >> 7) % 16; // biased exponent
        bf16::from_bits((bits & 0x807f) | (exp << 7))
    };
    let a: Vec<bf16> = (0..n).map(|_| gen(&mut r)).collect();
    let b: Vec<bf16> = (0..n).map(|_| gen(&mut r)).collect();
    let (ab, bb, ob) = (upload(&a), upload(&b), upload(&vec![bf16::ZERO; n]));
    let h = DType::BF16;
    let op = |f: fn(f32, f32) -> f32| -> Vec<bf16> {
        a.iter()
            .zip(&b)
            .map(|(x, y)| bf16::from_f32(f(x.to_f32(), y.to_f32())))
            .collect()
    };
    let args = |o: &Buffer| vec![t(o, h, &[n]), t(&ab, h, &[n]), t(&bb, h, &[n])];
    run(&s, "add", args(&ob));
    let sum = op(|x, y| x + y);
    assert_eq!(read::<bf16>(&ob, h, n), sum);
    // The model does round: some sums are not exact in bfloat16.
    assert!(a
        .iter()
        .zip(&b)
        .zip(&sum)
        .any(|((x, y), z)| x.to_f32() + y.to_f32() != z.to_f32()));
    run(&s, "mul", args(&ob));
    assert_eq!(read::<bf16>(&ob, h, n), op(|x, y| x * y));
    run(
        &s,
        "scale",
        vec![t(&ob, h, &[n]), t(&ab, h, &[n]), KernelArg::Float(0.1)],
    );
    // The scalar is rounded to bfloat16 first (as `np.asarray(0.1, bfloat16) * x`).
    let alpha = bf16::from_f64(0.1).to_f32();
    let want: Vec<bf16> = a
        .iter()
        .map(|x| bf16::from_f32(alpha * x.to_f32()))
        .collect();
    assert_eq!(read::<bf16>(&ob, h, n), want);
    run(&s, "fill", vec![t(&ob, h, &[n]), KernelArg::Float(0.1)]);
    assert!(read::<bf16>(&ob, h, n)
        .iter()
        .all(|&v| v.to_bits() == 0x3dcd)); // 0.1 rounded to nearest: 0x3dcccccd -> 0x3dcd
    run(&s, "fill", vec![t(&ob, h, &[n]), KernelArg::Float(1e39)]);
    assert!(read::<bf16>(&ob, h, n).iter().all(|v| v.is_infinite()));
    run(&s, "fill", vec![t(&ob, h, &[n]), KernelArg::Float(3e38)]);
    assert!(read::<bf16>(&ob, h, n).iter().all(|v| v.is_finite()));
    run(&s, "sum", vec![t(&ob, h, &[1]), t(&ab, h, &[n])]);
    let total: f64 = a.iter().map(|x| x.to_f64()).sum();
    assert_eq!(read::<bf16>(&ob, h, 1), [bf16::from_f64(total)]);
    let (m, k, p) = (4, 8, 8);
    let cb = upload(&vec![bf16::ZERO; m * p]);
    run(
        &s,
        "matmul",
        vec![t(&cb, h, &[m, p]), t(&ab, h, &[m, k]), t(&bb, h, &[k, p])],
    );
    let got = read::<bf16>(&cb, h, m * p);
    for i in 0..m {
        for j in 0..p {
            let (want, mag): (f32, f32) = (0..k)
                .map(|q| a[i * k + q].to_f32() * b[q * p + j].to_f32())
                .fold((0.0, 0.0), |(s, m), v| (s + v, m + v.abs()));
            let g = got[i * p + j].to_f32();
            // one bfloat16 rounding (2^-8 relative) of the float32 sum
            assert!(
                (g - want).abs() <= 2f32.powi(-8) * mag + 1e-6,
                "{g} vs {want}"
            );
        }
    }
}

#[test]
fn complex_products_and_sums() {
    let s = stream();
    let a = [
        Complex::new(1.0f64, 2.0),
        Complex::new(-3.0, 0.5),
        Complex::new(0.0, -1.0),
    ];
    let b = [
        Complex::new(2.0f64, -1.0),
        Complex::new(4.0, 4.0),
        Complex::new(0.0, -1.0),
    ];
    let c = DType::C128;
    let (ab, bb, ob) = (
        upload(&a),
        upload(&b),
        upload(&[Complex::new(0.0f64, 0.0); 3]),
    );
    run(
        &s,
        "mul",
        vec![t(&ob, c, &[3]), t(&ab, c, &[3]), t(&bb, c, &[3])],
    );
    let want: Vec<_> = a.iter().zip(&b).map(|(x, y)| x * y).collect();
    assert_eq!(read::<Complex<f64>>(&ob, c, 3), want);
    assert_eq!(want[0], Complex::new(4.0, 3.0)); // (1+2i)(2-i)
    run(
        &s,
        "scale",
        vec![t(&ob, c, &[3]), t(&ab, c, &[3]), KernelArg::Float(2.0)],
    );
    let want: Vec<_> = a.iter().map(|x| x * 2.0).collect();
    assert_eq!(read::<Complex<f64>>(&ob, c, 3), want);
    run(&s, "sum", vec![t(&ob, c, &[1]), t(&ab, c, &[3])]);
    assert_eq!(read::<Complex<f64>>(&ob, c, 1), [Complex::new(-2.0, 1.5)]);
    run(
        &s,
        "scale",
        vec![
            t(&ob, c, &[3]),
            t(&ab, c, &[3]),
            KernelArg::Complex(0.0, 1.0),
        ],
    );
    let want: Vec<_> = a.iter().map(|x| x * Complex::new(0.0, 1.0)).collect();
    assert_eq!(read::<Complex<f64>>(&ob, c, 3), want);
    run(
        &s,
        "fill",
        vec![t(&ob, c, &[3]), KernelArg::Complex(1.0, -2.0)],
    );
    assert_eq!(
        read::<Complex<f64>>(&ob, c, 3),
        [Complex::new(1.0, -2.0); 3]
    );
    let f = upload(&[0f64; 3]);
    arg_error(
        s.launch_kernel(
            "fill",
            vec![t(&f, DType::F64, &[3]), KernelArg::Complex(1.0, 0.0)],
        ),
        "value",
        "is complex, but the tensors are float64",
    );
    run(&s, "fill", vec![t(&ob, c, &[3]), KernelArg::Float(0.25)]);
    assert_eq!(
        read::<Complex<f64>>(&ob, c, 3),
        [Complex::new(0.25, 0.0); 3]
    );
    // complex64 matmul [[a0, a1]] @ [[b0], [b1]]
    let a32: Vec<Complex<f32>> = a
        .iter()
        .map(|z| Complex::new(z.re as f32, z.im as f32))
        .collect();
    let b32: Vec<Complex<f32>> = b
        .iter()
        .map(|z| Complex::new(z.re as f32, z.im as f32))
        .collect();
    let cb = upload(&[Complex::new(9.0f32, 9.0)]);
    run(
        &s,
        "matmul",
        vec![
            t(&cb, DType::C64, &[1, 1]),
            t(&upload(&a32[..2]), DType::C64, &[1, 2]),
            t(&upload(&b32[..2]), DType::C64, &[2, 1]),
        ],
    );
    assert_eq!(
        read::<Complex<f32>>(&cb, DType::C64, 1),
        [a32[0] * b32[0] + a32[1] * b32[1]]
    );
}

#[test]
fn copy_moves_bytes_for_every_dtype() {
    let s = stream();
    for d in DType::ALL {
        let n = 5;
        let bytes: Vec<u8> = (0..(n * d.size()) as u8).map(|b| b % 2).collect();
        let (src, dst) = (upload(&bytes), upload(&vec![0xAAu8; bytes.len()]));
        run(&s, "copy", vec![t(&dst, d, &[n]), t(&src, d, &[n])]);
        assert_eq!(read::<u8>(&dst, DType::U8, bytes.len()), bytes, "{d}");
        run(&s, "fill", vec![t(&dst, d, &[n]), KernelArg::Int(0)]);
        assert!(
            read::<u8>(&dst, DType::U8, bytes.len())
                .iter()
                .all(|&b| b == 0),
            "{d}"
        );
    }
}

#[test]
fn mixed_dtypes_are_refused() {
    let s = stream();
    let a = upload(&[0u8; 8]);
    arg_error(
        s.launch_kernel(
            "add",
            vec![
                t(&a, DType::I16, &[4]),
                t(&a, DType::I16, &[4]),
                t(&a, DType::U16, &[4]),
            ],
        ),
        "b",
        "dtype uint16 does not match int16",
    );
}
