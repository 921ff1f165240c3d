//! The data movement of the collectives: each rank's share of the work, over every rank's
//! buffers (device memory is host memory, so a rank reads and writes its peers' buffers
//! directly), with the element-wise reductions generic over the element type.
//!
//! Shares: element range `[count * r / n, count * (r + 1) / n)` is rank `r`'s. For
//! `all_reduce`, rank `r` reads its range of every input once, reduces it tile by tile in a
//! cache-resident accumulator and writes the result to every output: every input byte is read
//! once and every output byte written once (what a reduce-scatter followed by an all-gather
//! moves), and the ranks work in parallel on disjoint ranges. The other collectives split the
//! same way. No two ranks ever touch the same bytes, and a rank reads a tile of an input before
//! it writes the same tile of an output, so an output that *is* its input (in place) is safe;
//! partial overlaps are refused when the collective is issued (`in_place_or_disjoint` in
//! `mod.rs`).
//!
//! For communicators spanning processes the leader of a collective (one thread, while the
//! other local ranks wait) reduces and copies whole tensors with [`reduce_tensors`], [`divide`] and
//! [`copy_bytes`], and exchanges read and write their regions with [`read_bytes`] and
//! [`write_bytes`].
//!
//! Memory access goes through [`Buffer::slice`](crate::memory::Buffer::slice) views, one tile
//! at a time, never a shared and an exclusive view of the same bytes at once.

use half::{bf16, f16};
use num_complex::Complex;

use std::sync::Arc;

use crate::kernel::{DType, Tensor};
use crate::memory::Element;

use super::protocol::Part;
use super::{Kind, ReduceOp};

/// Bytes per tile: the accumulator and one input tile stay in the L1/L2 cache.
const TILE_BYTES: usize = 32 * 1024;

/// Element types the reductions handle: integers wrap on overflow (as numpy's), floats follow
/// IEEE arithmetic; `avg` is the sum divided by the rank count (integer division for
/// integers, as NCCL's `ncclAvg`); `premul_sum` multiplies each rank's input by that rank's
/// factor (converted to the element type) before summing, as NCCL's
/// `ncclRedOpCreatePreMulSum`; the bitwise operators are for integers (and booleans, as
/// bytes of 0 or 1).
pub(crate) trait Num: Element + Default {
    fn add(a: Self, b: Self) -> Self;
    fn mul(a: Self, b: Self) -> Self;
    fn div_count(a: Self, n: usize) -> Self;
    /// The larger (`max`) or smaller value; complex numbers never get here (refused at issue).
    fn pick(a: Self, b: Self, max: bool) -> Self;
    /// A `premul_sum` factor as an element (integral for integer types: checked at issue).
    fn factor(f: f64) -> Self;
    /// `a & b`, `a | b` or `a ^ b`; only integers get here (refused at issue otherwise).
    fn bits(_a: Self, _b: Self, _op: ReduceOp) -> Self {
        unreachable!("bitwise operators are refused at issue for non-integer dtypes")
    }
}

macro_rules! int_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self { a.wrapping_mul(b) }
            #[inline(always)]
            fn div_count(a: Self, n: usize) -> Self { a / (n as Self) }
            #[inline(always)]
            fn pick(a: Self, b: Self, max: bool) -> Self { if (b > a) == max { b } else { a } }
            #[inline(always)]
            fn factor(f: f64) -> Self { f as i128 as Self }
            #[inline(always)]
            fn bits(a: Self, b: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::BAnd => a & b,
                    ReduceOp::BOr => a | b,
                    _ => a ^ b,
                }
            }
        }
    )*};
}
int_num!(u8, i8, u16, i16, u32, i32, u64, i64);

macro_rules! float_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self { a + b }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self { a * b }
            #[inline(always)]
            fn div_count(a: Self, n: usize) -> Self { a / (n as Self) }
            #[inline(always)]
            fn pick(a: Self, b: Self, max: bool) -> Self {
                if (max && b > a) || (!max && b < a) { b } else { a }
            }
            #[inline(always)]
            fn factor(f: f64) -> Self { f as Self }
        }
    )*};
}
float_num!(f32, f64);

/// float16 and bfloat16: each step computed in f32 and rounded to the type, as numpy's float16
/// loops (and ml_dtypes' bfloat16 loops).
macro_rules! half_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                <$t>::from_f32(a.to_f32() + b.to_f32())
            }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self {
                <$t>::from_f32(a.to_f32() * b.to_f32())
            }
            #[inline(always)]
            fn div_count(a: Self, n: usize) -> Self {
                <$t>::from_f32(a.to_f32() / n as f32)
            }
            #[inline(always)]
            fn pick(a: Self, b: Self, max: bool) -> Self {
                let (x, y) = (a.to_f32(), b.to_f32());
                if (max && y > x) || (!max && y < x) {
                    b
                } else {
                    a
                }
            }
            #[inline(always)]
            fn factor(f: f64) -> Self {
                <$t>::from_f64(f)
            }
        }
    )*};
}
half_num!(f16, bf16);

macro_rules! complex_num {
    ($($t:ty),*) => {$(
        impl Num for Complex<$t> {
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self { a + b }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self { a * b }
            #[inline(always)]
            fn div_count(a: Self, n: usize) -> Self { a / (n as $t) }
            #[inline(always)]
            fn pick(a: Self, _b: Self, _max: bool) -> Self { a }
            #[inline(always)]
            fn factor(f: f64) -> Self { Complex::new(f as $t, 0.0) }
        }
    )*};
}
complex_num!(f32, f64);

/// `acc[i] = acc[i] <op> x[i]`, with `x` first multiplied by `factor` (`premul_sum`): one
/// tight loop per operator, which the compiler vectorises.
fn combine<T: Num>(op: ReduceOp, acc: &mut [T], x: &[T], factor: Option<T>) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => {
            for (a, &b) in acc.iter_mut().zip(x) {
                *a = T::add(*a, b);
            }
        }
        ReduceOp::PreMulSum(_) => match factor {
            Some(f) => {
                for (a, &b) in acc.iter_mut().zip(x) {
                    *a = T::add(*a, T::mul(f, b));
                }
            }
            None => {
                for (a, &b) in acc.iter_mut().zip(x) {
                    *a = T::add(*a, b);
                }
            }
        },
        ReduceOp::Prod => {
            for (a, &b) in acc.iter_mut().zip(x) {
                *a = T::mul(*a, b);
            }
        }
        ReduceOp::Max => {
            for (a, &b) in acc.iter_mut().zip(x) {
                *a = T::pick(*a, b, true);
            }
        }
        ReduceOp::Min => {
            for (a, &b) in acc.iter_mut().zip(x) {
                *a = T::pick(*a, b, false);
            }
        }
        ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => {
            for (a, &b) in acc.iter_mut().zip(x) {
                *a = T::bits(*a, b, op);
            }
        }
    }
}

/// `acc = x` (times `factor` for `premul_sum`): the first input of a reduction.
fn start<T: Num>(acc: &mut [T], x: &[T], factor: Option<T>) {
    match factor {
        Some(f) => {
            for (a, &b) in acc.iter_mut().zip(x) {
                *a = T::mul(f, b);
            }
        }
        None => acc.copy_from_slice(x),
    }
}

fn finish<T: Num>(op: ReduceOp, acc: &mut [T], n: usize) {
    if op == ReduceOp::Avg {
        for a in acc.iter_mut() {
            *a = T::div_count(*a, n);
        }
    }
}

/// One rank's part of a collective: everything the ranks agreed on, and every rank's part.
pub(crate) struct Share<'a> {
    pub kind: Kind,
    pub rank: usize,
    pub size: usize,
    pub parts: &'a [Arc<Part>],
}

/// The same collective over booleans stored as bytes of 0 or 1 (see [`Kind::bool_as_bytes`]).
fn as_bytes_kind(dtype: DType, kind: Kind) -> Kind {
    if dtype.is_bool() {
        kind.bool_as_bytes()
    } else {
        kind
    }
}

/// Run rank `share.rank`'s part for the agreed dtype: the one match on [`DType`].
pub(crate) fn run(dtype: DType, share: &Share<'_>) {
    let share = Share {
        kind: as_bytes_kind(dtype, share.kind),
        ..*share
    };
    let s = &share;
    match dtype {
        DType::F32 => typed::<f32>(s),
        DType::F64 => typed::<f64>(s),
        DType::I32 => typed::<i32>(s),
        DType::I64 => typed::<i64>(s),
        // Booleans are bytes of 0 or 1: or is max and and is min (`check_dtype` refused avg
        // and premul_sum); the bitwise operators keep 0 and 1.
        DType::U8 | DType::Bool => typed::<u8>(s),
        DType::I8 => typed::<i8>(s),
        DType::I16 => typed::<i16>(s),
        DType::U16 => typed::<u16>(s),
        DType::U32 => typed::<u32>(s),
        DType::U64 => typed::<u64>(s),
        DType::F16 => typed::<f16>(s),
        DType::BF16 => typed::<bf16>(s),
        DType::C64 => typed::<Complex<f32>>(s),
        DType::C128 => typed::<Complex<f64>>(s),
    }
}

/// `[lo, hi)`: rank `r`'s range of `count` elements split `n` ways.
pub(crate) fn range(count: usize, r: usize, n: usize) -> (usize, usize) {
    let part = |i: usize| ((count as u128 * i as u128) / n as u128) as usize;
    (part(r), part(r + 1))
}

/// Where each block starts when blocks of `counts` elements lie back to back.
pub(crate) fn displacements(counts: &[usize]) -> Vec<usize> {
    counts
        .iter()
        .scan(0usize, |at, &c| {
            let d = *at;
            *at += c;
            Some(d)
        })
        .collect()
}

/// For every block `q` of `counts` (back to back) that meets `[lo, hi)`: `(q, from, to)`, the
/// part of `[lo, hi)` in it, in global element indices.
fn blocks_in(
    counts: &[usize],
    lo: usize,
    hi: usize,
) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    displacements(counts)
        .into_iter()
        .zip(counts)
        .enumerate()
        .filter_map(move |(q, (d, &c))| {
            let (a, b) = (lo.max(d), hi.min(d + c));
            (a < b).then_some((q, a, b))
        })
}

/// A shared view of elements `[lo, hi)` of `t`.
fn view<T: Num>(t: &Tensor, lo: usize, hi: usize) -> &[T] {
    let off = t.offset() + (lo * size_of::<T>()) as u64;
    // SAFETY: `Buffer::slice_unsynchronized` checks bounds and alignment itself (panicking
    // otherwise). No exclusive view of these bytes exists meanwhile: within a collective only
    // this rank touches this element range of any participating tensor (disjoint shares;
    // spanning processes, only the leader touches the local tensors and its staging, and an
    // exchange's regions only under their step's lock while the leader waits for it), each
    // tile's shared view is dropped before any exclusive view of the same bytes is made, and
    // inputs and outputs of one rank are identical or disjoint in memory (checked at issue on
    // the memory they occupy, whichever allocations name it; `copy_bytes` copies overlapping
    // ranges through a temporary). Every local rank's op is running inside this collective
    // and holds its tensors' allocations (`Part::accesses`) until the collective is done, so
    // no other op or host thread touches these buffers meanwhile; staging allocations are the
    // step's own.
    unsafe { t.buffer().slice_unsynchronized::<T>(off, hi - lo) }
}

/// An exclusive view of elements `[lo, hi)` of `t`.
#[allow(clippy::mut_from_ref)] // device memory is shared by design, as for kernels
fn view_mut<T: Num>(t: &Tensor, lo: usize, hi: usize) -> &mut [T] {
    let off = t.offset() + (lo * size_of::<T>()) as u64;
    // SAFETY: as for `view`; in addition the view is the only one of these bytes alive (each
    // is made, written and dropped within one statement of the tile loop).
    unsafe { t.buffer().slice_mut_unsynchronized::<T>(off, hi - lo) }
}

fn tile_elems<T>() -> usize {
    (TILE_BYTES / size_of::<T>()).max(1)
}

/// Reduce `len` elements of every tensor in `inputs` (from element `in_at`; input `i` times
/// `factors[i]` first, for `premul_sum`) and write the result to `len` elements of every tensor
/// in `outputs` (from element `out_at`), one tile at a time.
#[allow(clippy::too_many_arguments)]
fn reduce_into<T: Num>(
    op: ReduceOp,
    inputs: &[&Tensor],
    factors: &[Option<T>],
    in_at: usize,
    outputs: &[&Tensor],
    out_at: usize,
    len: usize,
) {
    let n = inputs.len();
    let f = |i: usize| factors.get(i).copied().flatten();
    let tile = tile_elems::<T>();
    let mut acc = vec![T::default(); tile.min(len)];
    let mut at = 0;
    while at < len {
        let end = (at + tile).min(len);
        let acc = &mut acc[..end - at];
        start(acc, view::<T>(inputs[0], in_at + at, in_at + end), f(0));
        for (i, x) in inputs.iter().enumerate().skip(1) {
            combine(op, acc, view::<T>(x, in_at + at, in_at + end), f(i));
        }
        finish(op, acc, n);
        for y in outputs {
            view_mut::<T>(y, out_at + at, out_at + end).copy_from_slice(acc);
        }
        at = end;
    }
}

/// Copy `len` elements of `src` (from element `src_at`) to every tensor of `dsts` (from
/// element `dst_at`), tile by tile so the source tile is read from memory once.
fn copy_to_all<T: Num>(src: &Tensor, src_at: usize, dsts: &[&Tensor], dst_at: usize, len: usize) {
    let tile = tile_elems::<T>() * 4;
    let mut at = 0;
    while at < len {
        let end = (at + tile).min(len);
        for d in dsts {
            if same_place(src, src_at + at, d, dst_at + at) {
                continue; // in place: the bytes are already there
            }
            let s = view::<T>(src, src_at + at, src_at + end);
            view_mut::<T>(d, dst_at + at, dst_at + end).copy_from_slice(s);
        }
        at = end;
    }
}

/// Whether element `i` of `a` and element `j` of `b` are the same bytes of memory (whichever
/// allocations and views the tensors were made through).
fn same_place(a: &Tensor, i: usize, b: &Tensor, j: usize) -> bool {
    let (sa, sb) = (
        a.buffer()
            .memory_span(a.offset() + (i * a.dtype().size()) as u64, 1),
        b.buffer()
            .memory_span(b.offset() + (j * b.dtype().size()) as u64, 1),
    );
    sa.file != 0 && sa == sb
}

/// The `premul_sum` factor of every rank as an element (none for other operators).
fn factors<T: Num>(parts: &[Arc<Part>]) -> Vec<Option<T>> {
    parts.iter().map(|p| p.factor().map(T::factor)).collect()
}

fn typed<T: Num>(s: &Share<'_>) {
    let (r, n) = (s.rank, s.size);
    let send = |q: usize| s.parts[q].send.as_ref().expect("send checked at issue");
    let recv = |q: usize| s.parts[q].recv.as_ref().expect("recv checked at issue");
    match s.kind {
        Kind::AllReduce(op) => {
            let count = send(0).len();
            let (lo, hi) = range(count, r, n);
            let ins: Vec<&Tensor> = (0..n).map(send).collect();
            let outs: Vec<&Tensor> = (0..n).map(recv).collect();
            reduce_into::<T>(op, &ins, &factors(s.parts), lo, &outs, lo, hi - lo);
        }
        Kind::AllReduceCoalesced(op) => {
            // Rank r reduces its range of the tensors laid end to end.
            let lens = s.parts[0].coalesced_lens();
            let (lo, hi) = range(lens.iter().sum(), r, n);
            let fs = factors(s.parts);
            for (i, a, b) in blocks_in(&lens, lo, hi) {
                let d = a - displacements(&lens)[i];
                let ins: Vec<&Tensor> = s.parts.iter().map(|p| p.pair(i).0).collect();
                let outs: Vec<&Tensor> = s.parts.iter().map(|p| p.pair(i).1).collect();
                reduce_into::<T>(op, &ins, &fs, d, &outs, d, b - a);
            }
        }
        Kind::Reduce(op, root) => {
            let count = send(0).len();
            let (lo, hi) = range(count, r, n);
            let ins: Vec<&Tensor> = (0..n).map(send).collect();
            reduce_into::<T>(op, &ins, &factors(s.parts), lo, &[recv(root)], lo, hi - lo);
        }
        Kind::Broadcast(root) => {
            // Out of place, the root's send goes to every recv (its own too); in place, its
            // recv to every other rank's.
            let (src, outs): (&Tensor, Vec<&Tensor>) = match &s.parts[root].send {
                Some(src) => (src, (0..n).map(recv).collect()),
                None => (
                    recv(root),
                    (0..n).filter(|&q| q != root).map(recv).collect(),
                ),
            };
            let (lo, hi) = range(src.len(), r, n);
            copy_to_all::<T>(src, lo, &outs, lo, hi - lo);
        }
        Kind::AllGather | Kind::AllGatherV => {
            // Rank r copies its range of the blocks laid end to end to every output.
            let counts = s.parts[0].block_counts(n);
            let outs: Vec<&Tensor> = (0..n).map(recv).collect();
            let (lo, hi) = range(counts.iter().sum(), r, n);
            let displ = displacements(&counts);
            for (q, a, b) in blocks_in(&counts, lo, hi) {
                copy_to_all::<T>(send(q), a - displ[q], &outs, a, b - a);
            }
        }
        Kind::ReduceScatter(op) | Kind::ReduceScatterV(op) => {
            // Rank r reduces its range of the blocks laid end to end into the outputs they
            // belong to.
            let counts = s.parts[0].block_counts(n);
            let ins: Vec<&Tensor> = (0..n).map(send).collect();
            let (lo, hi) = range(counts.iter().sum(), r, n);
            let displ = displacements(&counts);
            let fs = factors(s.parts);
            for (q, a, b) in blocks_in(&counts, lo, hi) {
                reduce_into::<T>(op, &ins, &fs, a, &[recv(q)], a - displ[q], b - a);
            }
        }
        Kind::AllToAll => {
            // Block q of rank r's input goes to block r of rank q's output.
            let count = send(r).len() / n;
            for q in 0..n {
                copy_to_all::<T>(send(r), q * count, &[recv(q)], r * count, count);
            }
        }
        Kind::AllToAllV => {
            // Rank r's block for q (its send counts) goes to rank q's block from r (q's
            // receive counts; the ranks agreed that they match).
            let sc = &s.parts[r].counts;
            let sd = displacements(sc);
            for q in 0..n {
                let rd = displacements(&s.parts[q].recv_counts)[r];
                copy_to_all::<T>(send(r), sd[q], &[recv(q)], rd, sc[q]);
            }
        }
        Kind::Gather(root) => {
            let count = send(r).len();
            copy_to_all::<T>(send(r), 0, &[recv(root)], r * count, count);
        }
        Kind::Scatter(root) => {
            let count = recv(r).len();
            copy_to_all::<T>(send(root), r * count, &[recv(r)], 0, count);
        }
        Kind::Barrier | Kind::Split => {}
    }
}

/// Copy `t`'s elements to host bytes (a point-to-point send's staging copy).
pub(crate) fn stage(t: &Tensor) -> crate::Result<Vec<u8>> {
    let mut out = vec![0u8; t.nbytes() as usize];
    t.buffer().read(t.offset(), &mut out)?;
    Ok(out)
}

/// Copy staged bytes into `t` (a point-to-point receive).
pub(crate) fn unstage(t: &Tensor, bytes: &[u8]) -> crate::Result<()> {
    t.buffer().write(t.offset(), bytes)
}

/// `out = op(in_0, ..., in_k)` element-wise over `count` elements: each input and output
/// starts at its element index; inputs are reduced in order, input `i` multiplied by
/// `factors[i]` first for `premul_sum` (`factors` may be shorter: no factor). `Avg` is summed,
/// not divided (see [`divide`]). Outputs may be inputs at the same place (in place).
pub(crate) fn reduce_tensors(
    dtype: DType,
    op: ReduceOp,
    inputs: &[(&Tensor, usize)],
    factors: &[f64],
    outputs: &[(&Tensor, usize)],
    count: usize,
) {
    let (dtype, op) = if dtype.is_bool() {
        match Kind::Reduce(op, 0).bool_as_bytes() {
            Kind::Reduce(op, _) => (DType::U8, op),
            _ => unreachable!("bool_as_bytes keeps the kind"),
        }
    } else {
        (dtype, op)
    };
    let scaled = matches!(op, ReduceOp::PreMulSum(_)) && factors.iter().any(|&f| f != 1.0);
    if let [(x, i)] = inputs {
        if !scaled && outputs.iter().all(|(y, j)| same_place(x, *i, y, *j)) {
            return; // one input, already in place
        }
    }
    macro_rules! go {
        ($t:ty) => {
            combine_typed::<$t>(op, inputs, factors, outputs, count)
        };
    }
    match dtype {
        DType::F32 => go!(f32),
        DType::F64 => go!(f64),
        DType::I32 => go!(i32),
        DType::I64 => go!(i64),
        DType::U8 | DType::Bool => go!(u8),
        DType::I8 => go!(i8),
        DType::I16 => go!(i16),
        DType::U16 => go!(u16),
        DType::U32 => go!(u32),
        DType::U64 => go!(u64),
        DType::F16 => go!(f16),
        DType::BF16 => go!(bf16),
        DType::C64 => go!(Complex<f32>),
        DType::C128 => go!(Complex<f64>),
    }
}

fn combine_typed<T: Num>(
    op: ReduceOp,
    inputs: &[(&Tensor, usize)],
    factors: &[f64],
    outputs: &[(&Tensor, usize)],
    count: usize,
) {
    let f = |i: usize| match op {
        ReduceOp::PreMulSum(_) => factors.get(i).map(|&x| T::factor(x)),
        _ => None,
    };
    let tile = tile_elems::<T>();
    let mut acc = vec![T::default(); tile.min(count)];
    let mut at = 0;
    while at < count {
        let end = (at + tile).min(count);
        let acc = &mut acc[..end - at];
        let (x0, b0) = inputs[0];
        start(acc, view::<T>(x0, b0 + at, b0 + end), f(0));
        for (i, (x, b)) in inputs.iter().enumerate().skip(1) {
            combine(op, acc, view::<T>(x, b + at, b + end), f(i));
        }
        for (y, b) in outputs {
            view_mut::<T>(y, b + at, b + end).copy_from_slice(acc);
        }
        at = end;
    }
}

/// `t[i] /= n` for elements `[at, at + count)` (the end of an `Avg`; integer division for
/// integers). Booleans never get here (`avg` of bool is refused at issue).
pub(crate) fn divide(dtype: DType, t: &Tensor, at: usize, count: usize, n: usize) {
    macro_rules! go {
        ($t:ty) => {{
            let tile = tile_elems::<$t>();
            let mut i = at;
            while i < at + count {
                let end = (i + tile).min(at + count);
                finish(ReduceOp::Avg, view_mut::<$t>(t, i, end), n);
                i = end;
            }
        }};
    }
    match dtype {
        DType::F32 => go!(f32),
        DType::F64 => go!(f64),
        DType::I32 => go!(i32),
        DType::I64 => go!(i64),
        DType::U8 | DType::Bool => go!(u8),
        DType::I8 => go!(i8),
        DType::I16 => go!(i16),
        DType::U16 => go!(u16),
        DType::U32 => go!(u32),
        DType::U64 => go!(u64),
        DType::F16 => go!(f16),
        DType::BF16 => go!(bf16),
        DType::C64 => go!(Complex<f32>),
        DType::C128 => go!(Complex<f64>),
    }
}

/// Copy `len` bytes from byte `src_at` of `src` to byte `dst_at` of `dst` (nothing when they
/// are the same bytes; overlapping ranges go through a temporary, as `memmove`). Overlap is
/// judged on the memory, whichever allocations name it.
pub(crate) fn copy_bytes(src: &Tensor, src_at: usize, dst: &Tensor, dst_at: usize, len: usize) {
    if len == 0 {
        return;
    }
    let s = src
        .buffer()
        .memory_span(src.offset() + src_at as u64, len as u64);
    let d = dst
        .buffer()
        .memory_span(dst.offset() + dst_at as u64, len as u64);
    if s == d && s.file != 0 {
        return;
    }
    if s.overlaps(&d) {
        let mut tmp = vec![0u8; len];
        read_bytes(src, src_at, &mut tmp);
        write_bytes(dst, dst_at, &tmp);
        return;
    }
    let tile = TILE_BYTES * 4;
    let mut at = 0;
    while at < len {
        let end = (at + tile).min(len);
        let s = bytes(src, src_at + at, end - at);
        bytes_mut(dst, dst_at + at, end - at).copy_from_slice(s);
        at = end;
    }
}

/// Copy bytes `[at, at + dst.len())` of `t` into `dst`.
pub(crate) fn read_bytes(t: &Tensor, at: usize, dst: &mut [u8]) {
    dst.copy_from_slice(bytes(t, at, dst.len()));
}

/// Copy `src` to bytes `[at, at + src.len())` of `t`.
pub(crate) fn write_bytes(t: &Tensor, at: usize, src: &[u8]) {
    bytes_mut(t, at, src.len()).copy_from_slice(src);
}

/// A shared view of `len` bytes at byte `at` of `t`.
fn bytes(t: &Tensor, at: usize, len: usize) -> &[u8] {
    // SAFETY: as for `view` (bytes have no alignment requirement;
    // `Buffer::slice_unsynchronized` checks the bounds).
    unsafe {
        t.buffer()
            .slice_unsynchronized::<u8>(t.offset() + at as u64, len)
    }
}

/// An exclusive view of `len` bytes at byte `at` of `t`.
#[allow(clippy::mut_from_ref)] // device memory is shared by design, as for kernels
fn bytes_mut(t: &Tensor, at: usize, len: usize) -> &mut [u8] {
    // SAFETY: as for `view_mut`: the view is the only one of these bytes alive (made, written
    // and dropped within one statement of its caller).
    unsafe {
        t.buffer()
            .slice_mut_unsynchronized::<u8>(t.offset() + at as u64, len)
    }
}
