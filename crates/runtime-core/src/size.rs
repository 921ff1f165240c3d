//! Byte sizes: [`Bytes`], the one type the API takes and reports sizes in, with the one
//! parser of size text (`"16GiB"`, `"1.5GB"`, `"1073741824"`) that environment variables,
//! the Python package and command lines use, and binary-unit printing for messages.

use std::fmt;
use std::str::FromStr;

/// A number of bytes. Parsed from text with [`str::parse`] (see [`Bytes::from_str`]),
/// printed in binary units (`32 GiB`, `1.50 MiB`, `17 B`).
///
/// ```
/// use runtime_core::Bytes;
/// assert_eq!("64MiB".parse::<Bytes>().unwrap(), Bytes::mib(64));
/// assert_eq!("1.5GB".parse::<Bytes>().unwrap(), Bytes(1_500_000_000));
/// assert_eq!(Bytes::gib(32).to_string(), "32 GiB");
/// assert!("12 parsecs".parse::<Bytes>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Bytes(pub u64);

impl Bytes {
    /// `n` KiB (1024 bytes each).
    pub const fn kib(n: u64) -> Bytes {
        Bytes(n << 10)
    }

    /// `n` MiB.
    pub const fn mib(n: u64) -> Bytes {
        Bytes(n << 20)
    }

    /// `n` GiB.
    pub const fn gib(n: u64) -> Bytes {
        Bytes(n << 30)
    }

    /// The number of bytes.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl From<u64> for Bytes {
    fn from(n: u64) -> Bytes {
        Bytes(n)
    }
}

impl From<Bytes> for u64 {
    fn from(b: Bytes) -> u64 {
        b.0
    }
}

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
        let mut unit = 0;
        let mut whole = self.0;
        while whole >= 1024 && unit + 1 < UNITS.len() {
            whole /= 1024;
            unit += 1;
        }
        let scale = 1u64 << (10 * unit);
        if self.0.is_multiple_of(scale) {
            write!(f, "{} {}", self.0 / scale, UNITS[unit])
        } else {
            // Precision loss above 2^53 bytes is irrelevant for two decimals.
            #[allow(clippy::cast_precision_loss)]
            let v = self.0 as f64 / scale as f64;
            write!(f, "{v:.2} {}", UNITS[unit])
        }
    }
}

/// Text that is not a byte size (see [`Bytes::from_str`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseBytesError {
    /// The text given.
    pub text: String,
}

impl fmt::Display for ParseBytesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot parse {:?} as a byte size (examples: 1073741824, \"512MiB\", \"16GiB\", \"1.5GB\")",
            self.text
        )
    }
}

impl std::error::Error for ParseBytesError {}

impl FromStr for Bytes {
    type Err = ParseBytesError;

    /// A plain byte count or a number with a unit: `B`, `KB`/`MB`/`GB`/`TB` (powers of
    /// 1000), `KiB`/`MiB`/`GiB`/`TiB` (powers of 1024), case-insensitive, space allowed
    /// (`"16 GiB"`); a bare `K`/`M`/`G`/`T` is the binary unit (as `free -h` reads them).
    /// Fractions round to the nearest byte (`"1.5GB"`).
    fn from_str(text: &str) -> Result<Bytes, ParseBytesError> {
        let bad = || ParseBytesError { text: text.into() };
        let t = text.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        if num.is_empty() {
            return Err(bad());
        }
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "kb" => 1_000,
            "mb" => 1_000_000,
            "gb" => 1_000_000_000,
            "tb" => 1_000_000_000_000,
            "k" | "kib" => 1 << 10,
            "m" | "mib" => 1 << 20,
            "g" | "gib" => 1 << 30,
            "t" | "tib" => 1 << 40,
            _ => return Err(bad()),
        };
        if let Ok(n) = num.parse::<u64>() {
            return n.checked_mul(mult).map(Bytes).ok_or_else(bad);
        }
        let f: f64 = num.parse().map_err(|_| bad())?;
        let bytes = f * mult as f64;
        if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
            return Err(bad());
        }
        Ok(Bytes(bytes.round() as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::Bytes;

    fn parse(s: &str) -> Option<u64> {
        s.parse::<Bytes>().ok().map(Bytes::get)
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse("1024"), Some(1024));
        assert_eq!(parse("16GiB"), Some(16 << 30));
        assert_eq!(parse("16 gib"), Some(16 << 30));
        assert_eq!(parse("512MiB"), Some(512 << 20));
        assert_eq!(parse("1.5GB"), Some(1_500_000_000));
        assert_eq!(parse("64k"), Some(64 << 10));
        assert_eq!(parse("2TB"), Some(2_000_000_000_000));
        assert_eq!(parse("7b"), Some(7));
    }

    #[test]
    fn bad_sizes_are_refused_with_the_text() {
        for bad in [
            "",
            "GiB",
            "12 parsecs",
            "-5",
            "1.2.3GB",
            "99999999999999999999TiB",
        ] {
            let e = bad.parse::<Bytes>().unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn bytes_print_in_binary_units() {
        assert_eq!(Bytes(0).to_string(), "0 B");
        assert_eq!(Bytes(1023).to_string(), "1023 B");
        assert_eq!(Bytes(1024).to_string(), "1 KiB");
        assert_eq!(Bytes(1536).to_string(), "1.50 KiB");
        assert_eq!(Bytes(32 << 30).to_string(), "32 GiB");
        assert_eq!(Bytes((2 << 30) + 12345).to_string(), "2.00 GiB");
        assert_eq!(Bytes(u64::MAX).to_string(), "16384.00 PiB");
    }
}
