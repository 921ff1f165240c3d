//! Element types: [`DType`], every fixed-size numpy number type, with its size, numpy name
//! and kind, and the rule for reinterpreting a C-contiguous array as another dtype
//! ([`DType::view_shape`], numpy's `ndarray.view(dtype)`).
//!
//! Storage is native byte order. `bool` is one byte (0 or 1 when written by this runtime; any
//! nonzero byte reads as true), `float16` is IEEE binary16, `bfloat16` the upper half of an
//! IEEE binary32 (8 exponent bits, 7 mantissa bits: `ml_dtypes.bfloat16`, torch's and JAX's
//! `bfloat16`), `complex64` / `complex128` are a real and an imaginary float32 / float64, as
//! numpy lays them out.

use crate::error::ArgError;

/// Element types of device arrays and kernel arguments: numpy's fixed-size number types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// Boolean, one byte (numpy `bool`).
    Bool,
    /// 8-bit signed integer.
    I8,
    /// 16-bit signed integer.
    I16,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// Unsigned byte (also the dtype of raw buffers).
    U8,
    /// 16-bit unsigned integer.
    U16,
    /// 32-bit unsigned integer.
    U32,
    /// 64-bit unsigned integer.
    U64,
    /// 16-bit IEEE float (kernels compute in float32 and round each result).
    F16,
    /// 16-bit brain float (`ml_dtypes.bfloat16`; kernels compute in float32 and round each
    /// result). Its kind here is `f`: numpy reports ml_dtypes' extension type as kind `V`, but
    /// it is a real float for every rule of this runtime (scalars, reductions, DLPack).
    BF16,
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
    /// Complex of two float32.
    C64,
    /// Complex of two float64.
    C128,
}

impl DType {
    /// Every dtype, in numpy's kind order (bool, signed, unsigned, float, complex); float16
    /// comes before bfloat16, so [`DType::from_kind`]`('f', 2)` is float16, as in numpy.
    pub const ALL: [DType; 15] = [
        DType::Bool,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::C64,
        DType::C128,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::I8 | DType::U8 => 1,
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 | DType::C64 => 8,
            DType::C128 => 16,
        }
    }

    /// numpy name (`"float32"`, `"complex128"`, `"bool"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::C64 => "complex64",
            DType::C128 => "complex128",
        }
    }

    /// numpy's kind character: `b` bool, `i` signed, `u` unsigned, `f` float, `c` complex.
    pub fn kind(self) -> char {
        match self {
            DType::Bool => 'b',
            DType::I8 | DType::I16 | DType::I32 | DType::I64 => 'i',
            DType::U8 | DType::U16 | DType::U32 | DType::U64 => 'u',
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 => 'f',
            DType::C64 | DType::C128 => 'c',
        }
    }

    /// The dtype of numpy kind `kind` (see [`DType::kind`]) and `size` bytes, if there is one
    /// (`('f', 2)` is float16: bfloat16 is only ever named).
    pub fn from_kind(kind: char, size: usize) -> Option<DType> {
        DType::ALL
            .into_iter()
            .find(|d| d.kind() == kind && d.size() == size)
    }

    /// Parse a numpy-style name: the full name (`"float32"`, `"uint16"`, `"bool"`), the
    /// type code with its size (`"f4"`, `"u2"`, `"c8"`, `"b1"`, optionally with `<`, `|` or
    /// `=` in front) or the one-letter C code (`"f"`, `"H"`, `"F"`, `"?"`). Codes name native
    /// byte order, as the device holds it. bfloat16 has only its name (`"bfloat16"`), as in
    /// ml_dtypes.
    pub fn parse(s: &str) -> Option<DType> {
        let s = s.strip_prefix(['<', '|', '=']).unwrap_or(s);
        Some(match s {
            "bool" | "b1" | "?" => DType::Bool,
            "int8" | "i1" | "b" => DType::I8,
            "int16" | "i2" | "h" => DType::I16,
            "int32" | "i4" | "i" => DType::I32,
            "int64" | "i8" | "q" | "l" | "int" => DType::I64,
            "uint8" | "u1" | "B" => DType::U8,
            "uint16" | "u2" | "H" => DType::U16,
            "uint32" | "u4" | "I" => DType::U32,
            "uint64" | "u8" | "Q" | "L" => DType::U64,
            "float16" | "f2" | "e" | "half" => DType::F16,
            "bfloat16" => DType::BF16,
            "float32" | "f4" | "f" => DType::F32,
            "float64" | "f8" | "d" | "float" => DType::F64,
            "complex64" | "c8" | "F" => DType::C64,
            "complex128" | "c16" | "D" | "complex" => DType::C128,
            _ => return None,
        })
    }

    /// Whether this is a real float type (float16, bfloat16, float32, float64).
    pub fn is_float(self) -> bool {
        self.kind() == 'f'
    }

    /// Whether this is a complex type.
    pub fn is_complex(self) -> bool {
        self.kind() == 'c'
    }

    /// Whether this is an integer type, signed or unsigned (not bool).
    pub fn is_integer(self) -> bool {
        matches!(self.kind(), 'i' | 'u')
    }

    /// Whether this is a signed integer type.
    pub fn is_signed(self) -> bool {
        self.kind() == 'i'
    }

    /// Whether this is `bool`.
    pub fn is_bool(self) -> bool {
        self == DType::Bool
    }

    /// Whether values of this type are inexact (float or complex): any number is a valid
    /// scalar for it, where integer and bool types take only integers in their range.
    pub fn is_inexact(self) -> bool {
        self.is_float() || self.is_complex()
    }

    /// The values an integer or bool scalar may take for this type, as `(min, max)`; `None`
    /// for inexact types.
    pub fn int_range(self) -> Option<(i128, i128)> {
        let bits = 8 * self.size() as u32;
        match self.kind() {
            'b' => Some((0, 1)),
            'i' => Some((-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)),
            'u' => Some((0, (1i128 << bits) - 1)),
            _ => None,
        }
    }

    /// The shape of a C-contiguous array of this dtype and `shape` seen as dtype `to`, by
    /// numpy's `ndarray.view(dtype)` rule: the same shape when the item sizes are equal;
    /// otherwise the last axis is rescaled (its bytes are split into items of the new size),
    /// which a 0-d array cannot do and which needs the last axis's bytes to divide evenly.
    ///
    /// # Errors
    /// `ArgError` naming `dtype`, with numpy's wording and the sizes involved.
    pub fn view_shape(self, shape: &[usize], to: DType) -> Result<Vec<usize>, ArgError> {
        let (from_size, to_size) = (self.size(), to.size());
        if from_size == to_size {
            return Ok(shape.to_vec());
        }
        let Some((&last, _)) = shape.split_last() else {
            return Err(ArgError::new(
                "dtype",
                format!(
                    "changing the dtype of a 0d array is only supported if the itemsize is unchanged ({} is {from_size} bytes, {} is {to_size})",
                    self.name(),
                    to.name()
                ),
            ));
        };
        let mut out = shape.to_vec();
        let bytes = last.checked_mul(from_size).ok_or_else(|| {
            ArgError::new("dtype", format!("shape {} is too large", tuple(shape)))
        })?;
        if to_size < from_size {
            if from_size % to_size != 0 {
                return Err(ArgError::new(
                    "dtype",
                    format!(
                        "when changing to a smaller dtype, its size must be a divisor of the size of original dtype ({} is {to_size} bytes, {} is {from_size})",
                        to.name(),
                        self.name()
                    ),
                ));
            }
        } else if bytes % to_size != 0 {
            return Err(ArgError::new(
                "dtype",
                format!(
                    "when changing to a larger dtype, its size must be a divisor of the total size in bytes of the last axis of the array ({} is {to_size} bytes; the last axis of the {} array of shape {} has {bytes})",
                    to.name(),
                    self.name(),
                    tuple(shape)
                ),
            ));
        }
        *out.last_mut().expect("not 0-d") = bytes / to_size;
        Ok(out)
    }
}

/// A shape as numpy prints it: `(3,)`, `(2, 5)`.
fn tuple(shape: &[usize]) -> String {
    match shape {
        [n] => format!("({n},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
