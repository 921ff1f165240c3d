//! Element types of typed views: plain numbers, valid for every bit pattern and without
//! padding, so a slice of them can be seen as bytes and bytes as a slice of them.
//!
//! float16 is `half::f16` (a `u16` bit pattern with IEEE binary16 conversions), bfloat16
//! `half::bf16` (likewise, the upper half of a binary32); complex
//! numbers are `num_complex::Complex<f32>` / `Complex<f64>` (`#[repr(C)]` real then imaginary,
//! numpy's layout). `bool` is not an element: not every byte is a valid Rust `bool`, so
//! boolean memory is viewed as `u8`.

use half::{bf16, f16};
use num_complex::Complex;

/// Element types a typed view of device memory may have. Sealed: the list is the crate's.
pub trait Element: Copy + Send + Sync + 'static + sealed::Sealed {
    /// The bytes of `values`.
    fn as_bytes(values: &[Self]) -> &[u8] {
        // SAFETY: `Self` is a plain number type (sealed list below): no padding, so every
        // byte of the slice is initialised; the byte slice covers exactly the same memory.
        unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), size_of_val(values)) }
    }

    /// The bytes of `values`, writable.
    fn as_bytes_mut(values: &mut [Self]) -> &mut [u8] {
        // SAFETY: as for `as_bytes`, and every bit pattern is a valid `Self`, so any bytes
        // written through the view leave valid values; the borrow is exclusive.
        unsafe {
            std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<u8>(), size_of_val(values))
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

// Every type listed is plain data valid for any bit pattern, without padding: the integers
// and floats; `f16` and `bf16` (each `#[repr(transparent)]` over `u16`); `Complex<T>` (`#[repr(C)]` of two
// `T`, same-size fields, so no padding).
macro_rules! elements {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {}
    )*};
}
elements!(
    u8,
    i8,
    u16,
    i16,
    u32,
    i32,
    u64,
    i64,
    f16,
    bf16,
    f32,
    f64,
    Complex<f32>,
    Complex<f64>
);
