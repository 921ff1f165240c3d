//! Device profiles: the model a virtual device reports (name, memory, clock, cores, peak).
//!
//! * `ascend910`: the seed's device. Figures from public sources:
//!   Huawei's Ascend 910 launch (23 Aug 2019) and the Hot Chips 31 (2019) DaVinci talk give
//!   32 DaVinci AI cores, 256 TFLOPS FP16 (nominal peak), 32 GB HBM2 in four stacks and
//!   1.2 TB/s memory bandwidth. Each core's cube unit does 16x16x16 FP16 MACs per cycle
//!   (8192 FLOP/cycle), so 256 TFLOPS over 32 cores implies a ~1.0 GHz clock, the figure used.
//! * `host`: this machine's real logical core count, memory (`/proc/meminfo`) and clock
//!   (`/proc/cpuinfo`), with a peak of 32 FP32 FLOP per cycle per core (two 8-wide FMA units,
//!   AVX2) and 12 GB/s, the single-thread memcpy bandwidth measured on the reference VM.

use crate::error::ConfigError;

/// A device model.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Short name used in configuration (`"ascend910"`, `"host"`).
    pub name: &'static str,
    /// Device name reported in properties; always says the device is virtual.
    pub device_name: String,
    /// Default memory per device in bytes.
    pub memory: u64,
    /// Clock rate in kHz.
    pub clock_rate_khz: u64,
    /// Compute cores (AI cores for Ascend; logical CPUs for host).
    pub cores: u32,
    /// Nominal peak FLOP/s.
    pub fpeak: f64,
    /// Nominal memory bandwidth, bytes per second.
    pub memory_bandwidth: f64,
}

/// Names accepted by [`Profile::by_name`].
pub const PROFILE_NAMES: &[&str] = &["ascend910", "host"];

impl Profile {
    /// Look a profile up by name.
    pub fn by_name(name: &str) -> Result<Profile, ConfigError> {
        match name.to_ascii_lowercase().as_str() {
            "ascend910" | "ascend" | "910" => Ok(Self::ascend910()),
            "host" | "cpu" => Ok(Self::host()),
            _ => Err(ConfigError::UnknownProfile {
                value: name.to_string(),
                valid: PROFILE_NAMES.join(", "),
            }),
        }
    }

    /// The Ascend 910 model (see the module docs for sources).
    pub fn ascend910() -> Profile {
        Profile {
            name: "ascend910",
            device_name: "Virtual Ascend 910 (host-backed)".to_string(),
            memory: 32 << 30,
            clock_rate_khz: 1_000_000,
            cores: 32,
            fpeak: 256e12,
            memory_bandwidth: 1.2e12,
        }
    }

    /// A model of this host.
    pub fn host() -> Profile {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        let memory = read_meminfo_total().unwrap_or(8 << 30);
        let mhz = read_cpu_mhz().unwrap_or(2000.0);
        let clock_rate_khz = (mhz * 1000.0).round() as u64;
        Profile {
            name: "host",
            device_name: format!("Virtual Host CPU x{cores} (host-backed)"),
            memory,
            clock_rate_khz,
            cores,
            fpeak: f64::from(cores) * mhz * 1e6 * 32.0,
            memory_bandwidth: 12e9,
        }
    }
}

fn read_meminfo_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn read_cpu_mhz() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu MHz"))?;
    line.split(':').nth(1)?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_profile_says_it_is_virtual() {
        for name in PROFILE_NAMES {
            let p = Profile::by_name(name).unwrap();
            assert!(p.device_name.contains("Virtual"), "{}", p.device_name);
            assert!(p.cores > 0 && p.clock_rate_khz > 0 && p.fpeak > 0.0 && p.memory > 0);
        }
    }

    #[test]
    fn host_profile_reads_this_machine() {
        let p = Profile::host();
        let n = std::thread::available_parallelism().unwrap().get() as u32;
        assert_eq!(p.cores, n);
    }
}
