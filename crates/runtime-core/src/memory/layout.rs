//! Array layouts over device memory: a shape and byte strides (numpy's `strides`, never
//! negative here), with numpy's contiguity flags, the byte range a layout reaches, the views
//! that keep the same memory (axis slices with a positive step, axis permutations such as a
//! transpose) and the element-wise copy between two layouts of the same shape.
//!
//! A layout is relative to the byte where its first element starts; the buffer and that
//! offset are the caller's ([`Layout::check_fits`] checks the pair). No `unsafe`: every copy
//! here is over slices.
//!
//! Rules, as numpy has them:
//! * C-contiguous: walking the axes from last to first, every axis longer than 1 has the
//!   stride `itemsize * (product of the lengths after it)`; F-contiguous is the same walk from
//!   first to last. Axes of length 1 do not count, and an array with no elements (or no axes)
//!   is both.
//! * Dense: the elements cover exactly `len() * itemsize` bytes without gaps or overlaps
//!   (C, F, and any permutation of their axes). A dense layout is one range of bytes that
//!   byte copies move as a whole; other layouts (step slices, broadcasts) are not.

use crate::error::{arg_error, Result};

/// A shape and byte strides over elements of `itemsize` bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Vec<usize>,
    strides: Vec<usize>,
    itemsize: usize,
}

impl Layout {
    /// Row-major (C order) strides for `shape`. The caller vouches that the elements fit in
    /// memory (a shape checked against an allocation); otherwise the layout's sizes saturate
    /// and [`Layout::check_fits`] refuses it.
    pub fn c(shape: Vec<usize>, itemsize: usize) -> Layout {
        let mut strides = vec![0; shape.len()];
        let mut acc = itemsize;
        for i in (0..shape.len()).rev() {
            strides[i] = acc;
            acc = acc.saturating_mul(shape[i].max(1));
        }
        Layout {
            shape,
            strides,
            itemsize,
        }
    }

    /// Column-major (Fortran order) strides for `shape` (the caller vouches as for
    /// [`Layout::c`]).
    pub fn f(shape: Vec<usize>, itemsize: usize) -> Layout {
        let mut strides = vec![0; shape.len()];
        let mut acc = itemsize;
        for (i, &d) in shape.iter().enumerate() {
            strides[i] = acc;
            acc = acc.saturating_mul(d.max(1));
        }
        Layout {
            shape,
            strides,
            itemsize,
        }
    }

    /// A layout with the given strides (bytes).
    ///
    /// # Errors
    /// `ArgError` naming `strides` when there is not one stride per axis or the bytes the
    /// layout reaches overflow.
    pub fn new(shape: Vec<usize>, strides: Vec<usize>, itemsize: usize) -> Result<Layout> {
        if strides.len() != shape.len() {
            return Err(arg_error(
                "strides",
                format!(
                    "{} strides for {} axes (shape {shape:?})",
                    strides.len(),
                    shape.len()
                ),
            ));
        }
        let l = Layout {
            shape,
            strides,
            itemsize,
        };
        if let Some(&d) = l.shape.iter().find(|&&d| d > isize::MAX as usize) {
            return Err(arg_error(
                "shape",
                format!("axis length {d} is more than {}", isize::MAX),
            ));
        }
        // Strides of 0 reach few bytes whatever the shape, so the elements are counted too:
        // their bytes (what `nbytes` reports and a buffer export hands to its consumer as the
        // length of the elements) must be a number, as numpy's "array is too big".
        l.checked_nbytes().ok_or_else(|| {
            arg_error(
                "shape",
                format!(
                    "shape {:?} holds more than {} bytes of {}-byte elements",
                    l.shape,
                    isize::MAX,
                    l.itemsize
                ),
            )
        })?;
        l.checked_span().ok_or_else(|| {
            arg_error(
                "strides",
                format!(
                    "shape {:?} with strides {:?} reaches past 2**64 bytes",
                    l.shape, l.strides
                ),
            )
        })?;
        Ok(l)
    }

    /// The lengths of the axes.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Bytes between neighbours along each axis.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Bytes per element.
    pub fn itemsize(&self) -> usize {
        self.itemsize
    }

    /// Number of elements (saturating at `usize::MAX`: [`Layout::new`] refuses a shape whose
    /// elements overflow, [`Layout::c`] and [`Layout::f`] take the caller's word).
    pub fn len(&self) -> usize {
        if self.shape.contains(&0) {
            return 0;
        }
        self.shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .unwrap_or(usize::MAX)
    }

    /// Whether the layout has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the elements themselves (numpy's `nbytes`; saturating like [`Layout::len`]).
    pub fn nbytes(&self) -> u64 {
        self.checked_nbytes().unwrap_or(u64::MAX)
    }

    /// [`Layout::nbytes`], when it is at most `isize::MAX` (what Rust and the buffer protocol
    /// can address).
    fn checked_nbytes(&self) -> Option<u64> {
        if self.shape.contains(&0) {
            return Some(0);
        }
        self.shape
            .iter()
            .try_fold(self.itemsize as u64, |acc, &d| acc.checked_mul(d as u64))
            .filter(|&n| n <= isize::MAX as u64)
    }

    fn checked_span(&self) -> Option<u64> {
        if self.shape.contains(&0) {
            return Some(0);
        }
        self.shape
            .iter()
            .zip(&self.strides)
            .try_fold(self.itemsize as u64, |acc, (&d, &s)| {
                (d as u64 - 1)
                    .checked_mul(s as u64)
                    .and_then(|x| acc.checked_add(x))
            })
    }

    /// Bytes from the first element's start to the last element's end (0 with no
    /// elements): the range a copy of the whole layout touches.
    ///
    /// Saturates at `u64::MAX` for a layout [`Layout::c`] or [`Layout::f`] made from a shape
    /// no buffer can hold ([`Layout::check_fits`] then refuses it).
    pub fn span(&self) -> u64 {
        self.checked_span().unwrap_or(u64::MAX)
    }

    /// numpy's `C_CONTIGUOUS`.
    pub fn is_c_contiguous(&self) -> bool {
        self.contiguous_along((0..self.shape.len()).rev())
    }

    /// numpy's `F_CONTIGUOUS`.
    pub fn is_f_contiguous(&self) -> bool {
        self.contiguous_along(0..self.shape.len())
    }

    fn contiguous_along(&self, axes: impl Iterator<Item = usize>) -> bool {
        if self.shape.contains(&0) {
            return true;
        }
        let mut want = self.itemsize;
        for i in axes {
            if self.shape[i] != 1 {
                if self.strides[i] != want {
                    return false;
                }
                want = want.saturating_mul(self.shape[i]);
            }
        }
        true
    }

    /// Whether the elements fill their span exactly (C, F or a permutation of their axes).
    pub fn is_dense(&self) -> bool {
        if self.shape.contains(&0) {
            return true;
        }
        let mut axes: Vec<usize> = (0..self.shape.len())
            .filter(|&i| self.shape[i] != 1)
            .collect();
        axes.sort_by_key(|&i| self.strides[i]);
        let mut want = self.itemsize;
        for i in axes {
            if self.strides[i] != want {
                return false;
            }
            want = want.saturating_mul(self.shape[i]);
        }
        true
    }

    /// Check that a layout whose first element is at byte `offset` stays inside a buffer of
    /// `len` bytes.
    ///
    /// # Errors
    /// `ArgError` naming `shape` with the numbers.
    pub fn check_fits(&self, offset: u64, len: u64) -> Result<()> {
        let span = self.span();
        match offset.checked_add(span) {
            Some(end) if end <= len => Ok(()),
            _ => Err(arg_error(
                "shape",
                format!(
                    "shape {:?} with strides {:?} reaches {span} bytes from offset {offset}, past the end of the {len}-byte buffer",
                    self.shape, self.strides
                ),
            )),
        }
    }

    /// The axes in reverse order (numpy's `.T`): a C layout becomes an F one.
    pub fn transpose(&self) -> Layout {
        Layout {
            shape: self.shape.iter().rev().copied().collect(),
            strides: self.strides.iter().rev().copied().collect(),
            itemsize: self.itemsize,
        }
    }

    /// The axes in the order `axes` names them (numpy's `transpose(axes)`).
    ///
    /// # Errors
    /// `ArgError` naming `axes` unless it is a permutation of `0..ndim`.
    pub fn permute(&self, axes: &[usize]) -> Result<Layout> {
        let n = self.shape.len();
        let mut seen = vec![false; n];
        let ok = axes.len() == n
            && axes
                .iter()
                .all(|&a| a < n && !std::mem::replace(&mut seen[a], true));
        if !ok {
            return Err(arg_error(
                "axes",
                format!("{axes:?} is not a permutation of the {n} axes"),
            ));
        }
        Ok(Layout {
            shape: axes.iter().map(|&a| self.shape[a]).collect(),
            strides: axes.iter().map(|&a| self.strides[a]).collect(),
            itemsize: self.itemsize,
        })
    }

    /// `len` elements of axis `axis`, from index `start`, every `step`-th: the byte offset of
    /// the view's first element (relative to this layout's) and its layout. The indices are
    /// numpy's after `slice.indices` (`start` and the count in range).
    ///
    /// # Errors
    /// `ArgError` naming `axis` (no such axis), `step` (not positive) or `key` (the
    /// elements leave the axis).
    pub fn slice(
        &self,
        axis: usize,
        start: usize,
        step: usize,
        len: usize,
    ) -> Result<(u64, Layout)> {
        let Some(&dim) = self.shape.get(axis) else {
            return Err(arg_error(
                "axis",
                format!("axis {axis} is out of range for {} axes", self.shape.len()),
            ));
        };
        if step == 0 {
            return Err(arg_error("step", "slice step must be positive, got 0"));
        }
        let last = start as u128 + (len.max(1) as u128 - 1) * step as u128;
        if len > 0 && last >= dim as u128 {
            return Err(arg_error(
                "key",
                format!(
                    "{len} elements from {start} every {step} leave axis {axis} of length {dim}"
                ),
            ));
        }
        let mut out = self.clone();
        out.shape[axis] = len;
        // numpy scales the stride whatever the length (an axis of length 0 or 1 reaches no
        // neighbour through it, so the product only has to be representable).
        out.strides[axis] = self.strides[axis].saturating_mul(step);
        // An empty view starts where its first element would (kept inside the span).
        let at = (start as u64).saturating_mul(self.strides[axis] as u64);
        let delta = if len == 0 || self.is_empty() {
            at.min(self.span())
        } else {
            at
        };
        Ok((delta, out))
    }

    /// The byte offset (from the first element) of every element, in C order of the shape.
    pub fn offsets(&self) -> impl Iterator<Item = usize> + '_ {
        let n = self.len();
        let mut index = vec![0usize; self.shape.len()];
        let mut at = 0usize;
        (0..n).map(move |k| {
            if k > 0 {
                // Advance the index like an odometer, last axis fastest.
                // Wrapping: stepping past the end of an axis may pass beyond the span (an
                // axis of length 1 with any stride) before it is taken back; the offset of
                // every element itself is within the span, so modulo 2^64 it is exact.
                for i in (0..index.len()).rev() {
                    index[i] += 1;
                    at = at.wrapping_add(self.strides[i]);
                    if index[i] < self.shape[i] {
                        break;
                    }
                    at = at.wrapping_sub(self.strides[i].wrapping_mul(index[i]));
                    index[i] = 0;
                }
            }
            at
        })
    }
}

/// Copy every element of `src` (laid out by `src_layout` from byte 0 of `src`) to the same
/// index of `dst` (laid out by `dst_layout` from byte 0 of `dst`), as numpy's `copyto` between
/// two arrays of one shape; bytes of `dst` that no element covers are left as they are.
///
/// # Errors
/// `ArgError` naming `dst` when the shapes or item sizes differ, or a layout reaches past its
/// slice; nothing is copied then.
pub fn copy_elements(
    dst: &mut [u8],
    dst_layout: &Layout,
    src: &[u8],
    src_layout: &Layout,
) -> Result<()> {
    if dst_layout.shape != src_layout.shape || dst_layout.itemsize != src_layout.itemsize {
        return Err(arg_error(
            "dst",
            format!(
                "shape {:?} of {}-byte items differs from the source's {:?} of {}-byte items",
                dst_layout.shape, dst_layout.itemsize, src_layout.shape, src_layout.itemsize
            ),
        ));
    }
    dst_layout.check_fits(0, dst.len() as u64)?;
    src_layout.check_fits(0, src.len() as u64)?;
    let item = dst_layout.itemsize;
    for (d, s) in dst_layout.offsets().zip(src_layout.offsets()) {
        dst[d..d + item].copy_from_slice(&src[s..s + item]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_bytes_past_isize_max_are_refused_whatever_the_strides() {
        // Zero strides reach one element whatever the shape; the element count still has to
        // be a number (it is the length a buffer export promises its consumer).
        let e = Layout::new(vec![(1 << 40) + 1, 1 << 24], vec![0, 0], 1).unwrap_err();
        assert!(e.to_string().contains("shape"), "{e}");
        assert!(Layout::new(vec![0, usize::MAX], vec![0, 0], 1).is_err());
        let ok = Layout::new(vec![1 << 20, 1 << 20], vec![0, 0], 4).unwrap();
        assert_eq!((ok.len(), ok.nbytes(), ok.span()), (1 << 40, 1 << 42, 4));
    }

    #[test]
    fn absurd_shapes_saturate_instead_of_panicking() {
        let l = Layout::c(vec![1 << 40, 1 << 40], 1);
        assert_eq!(
            (l.len(), l.nbytes(), l.span()),
            (usize::MAX, u64::MAX, u64::MAX)
        );
        assert!(l.check_fits(0, 1 << 20).is_err());
        // An axis of length 1 with a stride near the top: its offsets are still exact.
        let one = Layout::new(vec![1, 3], vec![usize::MAX - 7, 4], 4).unwrap();
        assert_eq!(one.offsets().collect::<Vec<_>>(), vec![0, 4, 8]);
        let (at, s) = Layout::c(vec![0], 4).slice(0, 0, 1, 0).unwrap();
        assert_eq!((at, s.len()), (0, 0));
    }

    #[test]
    fn c_and_f_strides_match_numpy() {
        // numpy: np.empty((2, 5), np.int64).strides == (40, 8); order="F" gives (8, 16).
        assert_eq!(Layout::c(vec![2, 5], 8).strides(), &[40, 8]);
        assert_eq!(Layout::f(vec![2, 5], 8).strides(), &[8, 16]);
        let c = Layout::c(vec![2, 5], 8);
        assert!(c.is_c_contiguous() && !c.is_f_contiguous() && c.is_dense());
        let f = Layout::f(vec![2, 5], 8);
        assert!(!f.is_c_contiguous() && f.is_f_contiguous() && f.is_dense());
        assert_eq!(c.transpose(), Layout::f(vec![5, 2], 8));
    }

    #[test]
    fn one_element_axes_and_empty_layouts_are_both() {
        for shape in [vec![], vec![7], vec![1, 7], vec![7, 1], vec![0, 3]] {
            let l = Layout::c(shape.clone(), 4);
            assert!(l.is_c_contiguous() && l.is_f_contiguous(), "{shape:?}");
        }
    }

    #[test]
    fn a_step_slice_is_neither_and_not_dense() {
        let (delta, s) = Layout::c(vec![10], 4).slice(0, 1, 2, 5).unwrap();
        assert_eq!((delta, s.strides()), (4, &[8][..]));
        assert!(!s.is_c_contiguous() && !s.is_f_contiguous() && !s.is_dense());
        assert_eq!(s.span(), 4 * 8 + 4);
        assert_eq!(s.offsets().collect::<Vec<_>>(), vec![0, 8, 16, 24, 32]);
        assert!(Layout::c(vec![10], 4).slice(0, 8, 2, 2).is_err());
    }

    #[test]
    fn copy_between_layouts_matches_a_transpose() {
        // A 2x3 C array [[0,1,2],[3,4,5]] copied into F layout holds 0,3,1,4,2,5.
        let src: Vec<u8> = (0..6).collect();
        let mut dst = vec![0u8; 6];
        let (c, f) = (Layout::c(vec![2, 3], 1), Layout::f(vec![2, 3], 1));
        copy_elements(&mut dst, &f, &src, &c).unwrap();
        assert_eq!(dst, vec![0, 3, 1, 4, 2, 5]);
        assert!(copy_elements(&mut dst, &Layout::c(vec![3, 2], 1), &src, &c).is_err());
    }

    #[test]
    fn permute_checks_axes() {
        let l = Layout::c(vec![2, 3, 4], 1);
        assert_eq!(l.permute(&[2, 1, 0]).unwrap(), l.transpose());
        assert!(l.permute(&[0, 0, 1]).is_err());
        assert!(l.permute(&[0, 1]).is_err());
        assert!(l.permute(&[1, 0, 2]).unwrap().is_dense());
    }

    #[test]
    fn new_and_fits_report_the_numbers() {
        assert!(Layout::new(vec![2], vec![1, 1], 1).is_err());
        assert!(Layout::new(vec![usize::MAX, 2], vec![usize::MAX, 1], 1).is_err());
        let l = Layout::new(vec![3], vec![16], 8).unwrap();
        assert_eq!(l.span(), 40);
        assert!(l.check_fits(0, 40).is_ok());
        let e = l.check_fits(8, 40).unwrap_err().to_string();
        assert!(e.contains("40-byte"), "{e}");
    }
}
