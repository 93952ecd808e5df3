//! The `process_*` metrics every Prometheus client exports (CPU time, memory, file
//! descriptors, start time), read from `/proc` at scrape time on Linux, and left out elsewhere.
//!
//! The names, units and sources are those of the Go client's process collector (and its
//! `procfs`): `/proc/self/stat` for CPU time, virtual memory and start time (in clock ticks of
//! `USER_HZ`, 100 on every Linux port capataz builds for, as `procfs` also assumes),
//! `/proc/self/status` for the resident set (in kB, so no page size is needed),
//! `/proc/self/fd` for open descriptors, `/proc/self/limits` for the soft limit on them, and
//! `/proc/stat` for the boot time the start time counts from. A file that cannot be read or
//! parsed leaves its metrics out of that scrape rather than reporting a wrong value.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

/// The process's figures, as read at the start of a scrape (`None`: not available here).
#[derive(Debug, Default, PartialEq)]
pub(super) struct ProcessStats {
    cpu_seconds: Option<f64>,
    resident_bytes: Option<u64>,
    virtual_bytes: Option<u64>,
    open_fds: Option<u64>,
    max_fds: Option<u64>,
    start_time_seconds: Option<f64>,
}

/// Clock ticks per second in `/proc/self/stat` (`USER_HZ`).
#[cfg(any(target_os = "linux", test))]
const USER_HZ: f64 = 100.0;

impl ProcessStats {
    /// Reads the figures of this process.
    #[cfg(target_os = "linux")]
    pub(super) fn read() -> ProcessStats {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let stat = read("/proc/self/stat").and_then(|text| parse_stat(&text));
        let boot = read("/proc/stat").and_then(|text| parse_boot_time(&text));
        ProcessStats {
            cpu_seconds: stat.as_ref().map(|s| s.cpu_ticks as f64 / USER_HZ),
            resident_bytes: read("/proc/self/status").and_then(|text| parse_rss(&text)),
            virtual_bytes: stat.as_ref().map(|s| s.virtual_bytes),
            open_fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|dir| dir.count() as u64),
            max_fds: read("/proc/self/limits").and_then(|text| parse_max_fds(&text)),
            start_time_seconds: stat
                .zip(boot)
                .map(|(s, boot)| boot as f64 + s.start_ticks as f64 / USER_HZ),
        }
    }

    /// Nothing outside Linux.
    #[cfg(not(target_os = "linux"))]
    pub(super) fn read() -> ProcessStats {
        ProcessStats::default()
    }
}

/// What `/proc/self/stat` gives.
#[cfg(any(target_os = "linux", test))]
#[derive(Debug, PartialEq)]
struct Stat {
    /// utime + stime, in clock ticks.
    cpu_ticks: u64,
    /// Start time after boot, in clock ticks.
    start_ticks: u64,
    virtual_bytes: u64,
}

/// Parses `/proc/self/stat`: the fields after the command name, which is in parentheses and
/// may itself hold spaces and parentheses (so the last `)` ends it).
#[cfg(any(target_os = "linux", test))]
fn parse_stat(text: &str) -> Option<Stat> {
    let (_, rest) = text.rsplit_once(')')?;
    // Fields from 3 (state) on; field n is at index n - 3.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        cpu_ticks: field(14)?.checked_add(field(15)?)?,
        start_ticks: field(22)?,
        virtual_bytes: field(23)?,
    })
}

/// The `btime` line of `/proc/stat`: boot time, in seconds since the epoch.
#[cfg(any(target_os = "linux", test))]
fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|value| value.trim().parse().ok())
}

/// The `VmRSS:` line of `/proc/self/status`, in bytes.
#[cfg(any(target_os = "linux", test))]
fn parse_rss(text: &str) -> Option<u64> {
    let line = text.lines().find_map(|line| line.strip_prefix("VmRSS:"))?;
    let kb = line.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?;
    kb.checked_mul(1024)
}

/// The soft limit of `Max open files` in `/proc/self/limits` (`unlimited` is left out).
#[cfg(any(target_os = "linux", test))]
fn parse_max_fds(text: &str) -> Option<u64> {
    let line = text
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))?;
    line.split_whitespace().next()?.parse().ok()
}

impl Collector for ProcessStats {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        if let Some(seconds) = self.cpu_seconds {
            let metric = ConstCounter::new(seconds);
            let family = encoder.encode_descriptor(
                "process_cpu",
                "Total user and system CPU time spent in seconds.",
                Some(&Unit::Seconds),
                MetricType::Counter,
            )?;
            metric.encode(family)?;
        }
        let gauges = [
            (
                "process_resident_memory",
                "Resident memory size in bytes.",
                Unit::Bytes,
                self.resident_bytes.map(|b| b as f64),
            ),
            (
                "process_virtual_memory",
                "Virtual memory size in bytes.",
                Unit::Bytes,
                self.virtual_bytes.map(|b| b as f64),
            ),
            (
                "process_start_time",
                "Start time of the process since unix epoch in seconds.",
                Unit::Seconds,
                self.start_time_seconds,
            ),
        ];
        for (name, help, unit, value) in gauges {
            if let Some(value) = value {
                let family =
                    encoder.encode_descriptor(name, help, Some(&unit), MetricType::Gauge)?;
                ConstGauge::new(value).encode(family)?;
            }
        }
        let counts = [
            (
                "process_open_fds",
                "Number of open file descriptors.",
                self.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors.",
                self.max_fds,
            ),
        ];
        for (name, help, value) in counts {
            if let Some(value) = value {
                let family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
                ConstGauge::new(value as i64).encode(family)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_after_a_command_name_with_spaces_and_parentheses() {
        // Fields 3..=23 after the name: state, ppid, ..., utime (14) = 250, stime (15) = 50,
        // starttime (22) = 12345, vsize (23) = 4096000.
        let text = "42 (cap (a) z) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 \
                    12345 4096000 500 18446744073709551615\n";
        assert_eq!(
            parse_stat(text),
            Some(Stat {
                cpu_ticks: 300,
                start_ticks: 12345,
                virtual_bytes: 4_096_000,
            })
        );
        assert_eq!(parse_stat("42 (truncated"), None);
        assert_eq!(parse_stat("42 (x) S 1 2"), None);
    }

    #[test]
    fn status_limits_and_boot_time_are_read_from_their_lines() {
        let status = "Name:\tcapataz\nVmPeak:\t  9000 kB\nVmRSS:\t    5120 kB\n";
        assert_eq!(parse_rss(status), Some(5 * 1024 * 1024));
        assert_eq!(parse_rss("VmRSS: lots\n"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 1048576              files\n";
        assert_eq!(parse_max_fds(limits), Some(1024));
        assert_eq!(
            parse_max_fds(
                "Max open files            unlimited            unlimited            files\n"
            ),
            None
        );
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nbtime 1764547200\nprocesses 9\n"),
            Some(1_764_547_200)
        );
        assert!((300.0 / USER_HZ - 3.0).abs() < f64::EPSILON);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_has_every_figure_on_linux() {
        let stats = ProcessStats::read();
        assert!(stats.cpu_seconds.is_some());
        assert!(stats.resident_bytes.is_some_and(|b| b > 0));
        assert!(stats.virtual_bytes.is_some_and(|b| b > 0));
        assert!(stats.open_fds.is_some_and(|n| n > 0));
        assert!(stats.max_fds.is_some_and(|n| n > 0));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = stats.start_time_seconds.unwrap();
        assert!(
            start <= now + 60.0 && start > now - 86_400.0,
            "{start} {now}"
        );
    }
}
