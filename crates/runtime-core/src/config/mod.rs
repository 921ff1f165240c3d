//! Configuration: every setting and every environment variable the runtime reads, in one
//! place. Per runtime (from `init` arguments, with environment variables as defaults):
//!
//! | setting | `init` keyword | environment variable | default |
//! |---|---|---|---|
//! | number of devices | `device_count` | `RUNTIME_DEVICE_COUNT` | 8 |
//! | memory per device | `memory` | `RUNTIME_DEVICE_MEMORY` | the profile's HBM size |
//! | device profile | `profile` | `RUNTIME_DEVICE_PROFILE` | `ascend910` |
//!
//! Per process ([`Options`], changed with `set_option`, outliving `shutdown`):
//!
//! | option | environment variable | default |
//! |---|---|---|
//! | `enableMemoryReuse` | | on |
//! | `enablePipelining` | | on |
//! | `enableAsync` | `RUNTIME_LAUNCH_BLOCKING=1` turns it off | on |
//! | `legacyDefaultStream` | `RUNTIME_DEFAULT_STREAM=legacy` turns it on | off |
//! | `enableBatching` | | on |
//! | (largest copy split across helper threads) | `RUNTIME_COPY_SPLIT_MAX` (bytes) | no limit |
//!
//! * [`profile`]: the device models (`ascend910`, `host`).
//!
//! Explicit arguments win over the environment. Sizes accept plain byte counts or a number
//! with a unit: `B`, `KB`/`MB`/`GB`/`TB` (powers of 1000) and `KiB`/`MiB`/`GiB`/`TiB`
//! (powers of 1024), case-insensitive, e.g. `"16GiB"` or `"1.5GB"`.

pub mod profile;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};

use crate::error::{arg_error, ConfigError, Result};
use crate::size::Bytes;
use profile::Profile;

/// Environment variable for the number of devices.
pub const ENV_DEVICE_COUNT: &str = "RUNTIME_DEVICE_COUNT";
/// Environment variable for the memory per device.
pub const ENV_DEVICE_MEMORY: &str = "RUNTIME_DEVICE_MEMORY";
/// Environment variable for the device profile.
pub const ENV_DEVICE_PROFILE: &str = "RUNTIME_DEVICE_PROFILE";
/// Environment variable that turns `enableAsync` off at start (`1`), as CUDA's
/// `CUDA_LAUNCH_BLOCKING`.
pub const ENV_LAUNCH_BLOCKING: &str = "RUNTIME_LAUNCH_BLOCKING";
/// Environment variable that turns `legacyDefaultStream` on at start (`legacy`), as
/// `nvcc --default-stream legacy`.
pub const ENV_DEFAULT_STREAM: &str = "RUNTIME_DEFAULT_STREAM";
/// Environment variable for the largest copy split across the copy helper threads (bytes).
pub const ENV_COPY_SPLIT_MAX: &str = "RUNTIME_COPY_SPLIT_MAX";

/// A process-wide runtime option (`runtime::set_option`). Each has a name, CANN's
/// and the Python package's (`enableAsync`, ...), which [`RuntimeOption::name`] gives and
/// [`str::parse`] reads: the one mapping between names and options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuntimeOption {
    /// `enableMemoryReuse` (default on): cache freed blocks for reuse. Turning it off also
    /// releases the caches.
    MemoryReuse,
    /// `enablePipelining` (default on): copies run on a per-device copy engine beside
    /// compute.
    Pipelining,
    /// `enableAsync` (default on; `RUNTIME_LAUNCH_BLOCKING=1` turns it off): launches and
    /// copies return before they have run. Off, every submission waits for its work.
    Async,
    /// `legacyDefaultStream` (default off; `RUNTIME_DEFAULT_STREAM=legacy` turns it on): each
    /// device's default stream synchronises with its blocking streams, as CUDA's legacy
    /// default stream (off: the per-thread default stream model).
    LegacyDefaultStream,
    /// `enableBatching` (default on): consecutive commands submitted to a running stream
    /// reach its worker as one batch (nothing observable changes but speed).
    Batching,
}

impl RuntimeOption {
    /// Every option, in the order their names are listed.
    pub const ALL: [RuntimeOption; 5] = [
        RuntimeOption::MemoryReuse,
        RuntimeOption::Pipelining,
        RuntimeOption::Async,
        RuntimeOption::LegacyDefaultStream,
        RuntimeOption::Batching,
    ];

    /// The option's name (`"enableAsync"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            RuntimeOption::MemoryReuse => "enableMemoryReuse",
            RuntimeOption::Pipelining => "enablePipelining",
            RuntimeOption::Async => "enableAsync",
            RuntimeOption::LegacyDefaultStream => "legacyDefaultStream",
            RuntimeOption::Batching => "enableBatching",
        }
    }
}

impl std::fmt::Display for RuntimeOption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for RuntimeOption {
    type Err = crate::error::Error;

    /// The option named `name` (exactly as [`RuntimeOption::name`] spells it).
    ///
    /// # Errors
    /// `InvalidArgument` (argument `name`) naming the valid options.
    fn from_str(name: &str) -> Result<RuntimeOption> {
        RuntimeOption::ALL
            .into_iter()
            .find(|o| o.name() == name)
            .ok_or_else(|| {
                let valid: Vec<&str> = RuntimeOption::ALL.iter().map(|o| o.name()).collect();
                arg_error(
                    "name",
                    format!(
                        "unknown option {name:?}; valid options: {}",
                        valid.join(", ")
                    ),
                )
            })
    }
}

/// The values of the process-wide [`RuntimeOption`]s. The runtime's live ones outlive
/// `shutdown` and are read and set through `runtime::get_option` and `runtime::set_option`;
/// a value of its own configures a `memory::DeviceMemory` built without a runtime.
#[derive(Debug)]
pub struct Options {
    memory_reuse: AtomicBool,
    pipelining: AtomicBool,
    asynchronous: AtomicBool,
    legacy_default_stream: AtomicBool,
    batching: AtomicBool,
}

impl Default for Options {
    /// Every option on but `legacyDefaultStream`.
    fn default() -> Self {
        Options {
            memory_reuse: AtomicBool::new(true),
            pipelining: AtomicBool::new(true),
            asynchronous: AtomicBool::new(true),
            legacy_default_stream: AtomicBool::new(false),
            batching: AtomicBool::new(true),
        }
    }
}

impl Options {
    /// The defaults, with `enableAsync` off when `RUNTIME_LAUNCH_BLOCKING=1`.
    fn from_env() -> Self {
        let blocking = std::env::var(ENV_LAUNCH_BLOCKING).is_ok_and(|v| v.trim() == "1");
        let o = Options::default();
        o.asynchronous.store(!blocking, Ordering::Relaxed);
        let legacy = std::env::var(ENV_DEFAULT_STREAM).is_ok_and(|v| v.trim() == "legacy");
        o.legacy_default_stream.store(legacy, Ordering::Relaxed);
        o
    }

    fn flag(&self, option: RuntimeOption) -> &AtomicBool {
        match option {
            RuntimeOption::MemoryReuse => &self.memory_reuse,
            RuntimeOption::Pipelining => &self.pipelining,
            RuntimeOption::Async => &self.asynchronous,
            RuntimeOption::LegacyDefaultStream => &self.legacy_default_stream,
            RuntimeOption::Batching => &self.batching,
        }
    }

    /// Set an option.
    pub fn set(&self, option: RuntimeOption, value: bool) {
        self.flag(option).store(value, Ordering::SeqCst);
    }

    /// Read an option.
    pub fn get(&self, option: RuntimeOption) -> bool {
        self.flag(option).load(Ordering::SeqCst)
    }

    /// Whether launches are asynchronous.
    pub(crate) fn is_async(&self) -> bool {
        self.asynchronous.load(Ordering::Relaxed)
    }

    /// Whether freed blocks are cached for reuse.
    pub(crate) fn memory_reuse(&self) -> bool {
        self.memory_reuse.load(Ordering::Relaxed)
    }

    /// Whether the default streams are CUDA's legacy default streams.
    pub(crate) fn legacy_default_stream(&self) -> bool {
        self.legacy_default_stream.load(Ordering::Relaxed)
    }

    /// Whether submissions to a running stream are handed to its worker in batches.
    pub fn batching(&self) -> bool {
        self.batching.load(Ordering::Relaxed)
    }

    /// Whether copies run on their own engine beside compute.
    pub(crate) fn pipelining(&self) -> bool {
        self.pipelining.load(Ordering::Relaxed)
    }
}

static OPTIONS: LazyLock<Arc<Options>> = LazyLock::new(|| Arc::new(Options::from_env()));

/// The process-wide options (the runtime's live ones).
pub(crate) fn options() -> &'static Arc<Options> {
    &OPTIONS
}

/// The largest copy split across the copy helper threads (`RUNTIME_COPY_SPLIT_MAX`; by
/// default every copy from 512 KiB is split, as torch's `copy_` splits across its threads).
/// On the 2-vCPU machines this project is measured on, two threads move 16–256 MiB at about
/// twice one thread's rate (`BENCHMARKS.md`, "How cost grows"); a host whose memory bus one
/// core saturates can cap splitting here.
pub(crate) fn copy_split_max() -> usize {
    static MAX: OnceLock<usize> = OnceLock::new();
    *MAX.get_or_init(|| {
        std::env::var(ENV_COPY_SPLIT_MAX)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(usize::MAX)
    })
}

/// Most devices one runtime may have.
pub const MAX_DEVICES: u64 = 64;
/// Smallest memory per device: 1 MiB.
pub const MIN_DEVICE_MEMORY: u64 = 1 << 20;
/// Largest memory per device: 4 TiB of address space.
pub const MAX_DEVICE_MEMORY: u64 = 4 << 40;

/// A complete configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Number of virtual devices.
    pub device_count: usize,
    /// Capacity of each device in bytes.
    pub memory_per_device: u64,
    /// The device model.
    pub profile: Profile,
}

/// Settings as given, each optional; [`ConfigBuilder::build`] fills the gaps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigBuilder {
    /// Number of devices.
    pub device_count: Option<usize>,
    /// Memory per device.
    pub memory: Option<Bytes>,
    /// Profile name ([`profile::PROFILE_NAMES`]).
    pub profile: Option<String>,
}

impl ConfigBuilder {
    /// Fill unset fields from the process environment, then build.
    pub fn build(&self) -> Result<Config, ConfigError> {
        self.build_with_env(|k| std::env::var(k).ok())
    }

    /// Fill unset fields from `env`, then build (testable without touching the process
    /// environment).
    pub fn build_with_env(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let count = match self.device_count {
            Some(n) => n as u64,
            None => match env(ENV_DEVICE_COUNT) {
                Some(s) => parse_device_count(ENV_DEVICE_COUNT, &s)? as u64,
                None => 8,
            },
        };
        check_range("device_count", count, 1, MAX_DEVICES)?;

        let profile_name = self
            .profile
            .clone()
            .or_else(|| env(ENV_DEVICE_PROFILE))
            .unwrap_or_else(|| "ascend910".to_string());
        let profile = Profile::by_name(profile_name.trim())?;

        let memory = match (self.memory, env(ENV_DEVICE_MEMORY)) {
            (Some(b), _) => b.get(),
            (None, Some(s)) => parse_size(ENV_DEVICE_MEMORY, &s)?.get(),
            (None, None) => profile.memory,
        };
        check_range("memory", memory, MIN_DEVICE_MEMORY, MAX_DEVICE_MEMORY)?;
        Ok(Config {
            device_count: count as usize,
            memory_per_device: memory,
            profile,
        })
    }
}

fn check_range(name: &str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange {
            name: name.into(),
            value: value.to_string(),
            min,
            max,
        })
    }
}

/// A device count written as decimal text (an environment variable, or a front end's integer
/// of any size and sign), checked against `1..=MAX_DEVICES`.
///
/// Every integer out of range, negative or too large for any machine type included, gets the
/// one `OutOfRange` wording ("`name` must be between 1 and 64, got -3"); text that is not an
/// integer gets `BadInteger`.
///
/// # Errors
/// `OutOfRange` or `BadInteger`, naming `name` and quoting `text`.
pub fn parse_device_count(name: &str, text: &str) -> Result<usize, ConfigError> {
    let t = text.trim();
    let digits = t.strip_prefix(['-', '+']).unwrap_or(t);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ConfigError::BadInteger {
            name: name.into(),
            value: text.into(),
        });
    }
    let out_of_range = || ConfigError::OutOfRange {
        name: name.into(),
        value: t.into(),
        min: 1,
        max: MAX_DEVICES,
    };
    match t.parse::<i128>() {
        Ok(n) if (1..=i128::from(MAX_DEVICES)).contains(&n) => {
            usize::try_from(n).map_err(|_| out_of_range())
        }
        _ => Err(out_of_range()),
    }
}

/// Parse the size setting `name` from `text` ([`Bytes`]'s parser): the environment
/// variables, the Python package and command lines read sizes through here, so a bad one gives
/// the same error wherever it came from.
///
/// # Errors
/// `BadSize` naming the setting and the text.
pub fn parse_size(name: &str, text: &str) -> Result<Bytes, ConfigError> {
    text.parse()
        .map_err(|e: crate::size::ParseBytesError| ConfigError::BadSize {
            name: name.into(),
            value: e.text,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn bad_sizes_are_refused_with_the_name() {
        for bad in ["", "GiB", "12 parsecs", "-5", "99999999999999999999TiB"] {
            let e = parse_size("memory", bad).unwrap_err();
            assert!(e.to_string().starts_with("memory:"), "{e}");
        }
        assert_eq!(parse_size("memory", "16GiB").unwrap(), Bytes::gib(16));
    }

    #[test]
    fn option_names_map_both_ways() {
        for o in RuntimeOption::ALL {
            assert_eq!(o.name().parse::<RuntimeOption>().unwrap(), o);
        }
        let e = "enableTurbo"
            .parse::<RuntimeOption>()
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("name: unknown option") && e.contains("enableAsync"),
            "{e}"
        );
    }

    #[test]
    fn every_out_of_range_device_count_gets_one_wording() {
        for (text, shown) in [
            ("0", "0"),
            ("-1", "-1"),
            (" -3 ", "-3"),
            ("65", "65"),
            ("18446744073709551616", "18446744073709551616"),
            (
                "-99999999999999999999999999999999999999999",
                "-99999999999999999999999999999999999999999",
            ),
        ] {
            let e = parse_device_count("device_count", text).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("device_count must be between 1 and 64, got {shown}")
            );
        }
        let e = ConfigBuilder {
            device_count: Some(0),
            ..Default::default()
        }
        .build_with_env(no_env)
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "device_count must be between 1 and 64, got 0"
        );
        for bad in ["", "-", "eight", "1.5", "0x10", "2 devices"] {
            let e = parse_device_count("RUNTIME_DEVICE_COUNT", bad).unwrap_err();
            assert!(matches!(e, ConfigError::BadInteger { .. }), "{bad:?}: {e}");
        }
        assert_eq!(parse_device_count("n", "+8").unwrap(), 8);
        assert_eq!(parse_device_count("n", " 64 ").unwrap(), 64);
    }

    #[test]
    fn defaults_give_eight_ascend_devices() {
        let c = ConfigBuilder::default().build_with_env(no_env).unwrap();
        assert_eq!(c.device_count, 8);
        assert_eq!(c.profile.name, "ascend910");
        assert_eq!(c.memory_per_device, c.profile.memory);
    }

    #[test]
    fn environment_fills_gaps_and_arguments_win() {
        let env = |k: &str| match k {
            ENV_DEVICE_COUNT => Some("3".to_string()),
            ENV_DEVICE_MEMORY => Some("2GiB".to_string()),
            ENV_DEVICE_PROFILE => Some("host".to_string()),
            _ => None,
        };
        let c = ConfigBuilder::default().build_with_env(env).unwrap();
        assert_eq!((c.device_count, c.memory_per_device), (3, 2 << 30));
        assert_eq!(c.profile.name, "host");
        let b = ConfigBuilder {
            device_count: Some(5),
            memory: Some(Bytes::gib(1)),
            profile: Some("ascend910".into()),
        };
        let c = b.build_with_env(env).unwrap();
        assert_eq!((c.device_count, c.memory_per_device), (5, 1 << 30));
        assert_eq!(c.profile.name, "ascend910");
    }

    #[test]
    fn out_of_range_values_name_the_setting() {
        let b = ConfigBuilder {
            device_count: Some(0),
            ..Default::default()
        };
        assert!(b
            .build_with_env(no_env)
            .unwrap_err()
            .to_string()
            .contains("device_count"));
        let b = ConfigBuilder {
            device_count: Some(65),
            ..Default::default()
        };
        assert!(b.build_with_env(no_env).is_err());
        let b = ConfigBuilder {
            memory: Some(Bytes::kib(1)),
            ..Default::default()
        };
        assert!(b
            .build_with_env(no_env)
            .unwrap_err()
            .to_string()
            .contains("memory"));
        let env = |k: &str| (k == ENV_DEVICE_COUNT).then(|| "eight".to_string());
        let e = ConfigBuilder::default().build_with_env(env).unwrap_err();
        assert!(e.to_string().contains(ENV_DEVICE_COUNT));
        let env = |k: &str| (k == ENV_DEVICE_COUNT).then(|| "-3".to_string());
        let e = ConfigBuilder::default().build_with_env(env).unwrap_err();
        assert_eq!(
            e.to_string(),
            "RUNTIME_DEVICE_COUNT must be between 1 and 64, got -3"
        );
        let b = ConfigBuilder {
            profile: Some("tpu".into()),
            ..Default::default()
        };
        let e = b.build_with_env(no_env).unwrap_err().to_string();
        assert!(e.contains("ascend910") && e.contains("host"), "{e}");
    }
}
