//! The agent's settings: defaults, then the config file, then the command line.
//!
//! Data flow: `main` parses the command line, loads the config file (`--config PATH`, or
//! [`DEFAULT_PATH`] when it exists) into a [`Config`] with [`Config::load`], and lets each
//! option given on the command line replace the file's value. The file is `key = value` lines
//! with `#` comments; an unknown key or a bad value stops the agent with the line it is on.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ppa_guest_abi::ppa_page::alarms::AlarmKind;
use ppa_guest_abi::ppa_page::READER_MAX_RECORDS;

use crate::collect::alarms::Thresholds;
use thiserror::Error;

/// Where the agent looks for its config file when `--config` is not given.
pub const DEFAULT_PATH: &str = "/etc/ppa-agent.conf";
/// Default sample interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
/// Shortest interval accepted.
pub const MIN_INTERVAL: Duration = Duration::from_millis(10);
/// Longest interval accepted.
pub const MAX_INTERVAL: Duration = Duration::from_secs(3600);

/// Why a duration could not be read.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DurationError {
    /// No unit, or one the agent does not know.
    #[error("\"{0}\" is not a number followed by ns, us, ms, s or m (e.g. 100ms)")]
    Form(String),
    /// Outside [`MIN_INTERVAL`]..=[`MAX_INTERVAL`].
    #[error("{0:?} is outside the 10ms to 1h an interval may be")]
    Range(Duration),
    /// A threshold outside 1 µs to [`MAX_THRESHOLD`].
    #[error("{0:?} is outside the 1us to 1h a threshold may be (0 or off turns it off)")]
    ThresholdRange(Duration),
}

/// Parses `100ms`, `1s`, `2.5s`, `500us`, `1m`.
pub fn parse_interval(s: &str) -> Result<Duration, DurationError> {
    let d = parse_duration(s)?;
    if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&d) {
        return Err(DurationError::Range(d));
    }
    Ok(d)
}

/// Longest time threshold accepted.
pub const MAX_THRESHOLD: Duration = Duration::from_secs(3600);

/// Parses a time threshold: `off` or `0` (0: off), or a duration of 1 µs to 1 h
/// (`500us`, `10ms`); ns.
pub fn parse_threshold(s: &str) -> Result<u64, DurationError> {
    if matches!(s.trim(), "off" | "0") {
        return Ok(0);
    }
    let d = parse_duration(s)?;
    if !(Duration::from_micros(1)..=MAX_THRESHOLD).contains(&d) {
        return Err(DurationError::ThresholdRange(d));
    }
    Ok(d.as_nanos() as u64)
}

/// Parses a count threshold (`off` or `0`: off; at most 10^9).
pub fn parse_count(s: &str) -> Option<u64> {
    match s.trim() {
        "off" => Some(0),
        t => t.parse().ok().filter(|n| *n <= 1_000_000_000),
    }
}

/// A number with a unit, as a duration.
fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| DurationError::Form(s.to_string()))?;
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| DurationError::Form(s.to_string()))?;
    let scale = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" | "min" => 60.0,
        _ => return Err(DurationError::Form(s.to_string())),
    };
    Duration::try_from_secs_f64(n * scale).map_err(|_| DurationError::Form(s.into()))
}

/// Why the config file could not be used.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read the config file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A line is not `key = value`.
    #[error("{path}:{line}: expected `key = value`")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// Line number, from 1.
        line: usize,
    },
    /// A key the agent does not know.
    #[error("{path}:{line}: unknown key `{key}` (known: interval, page_file, max_threads, taskstats, log_exits, linger, alarm_run_delay, alarm_slice, alarm_nivcsw, alarm_irq, alarm_softirq)")]
    UnknownKey {
        /// The file.
        path: PathBuf,
        /// Line number.
        line: usize,
        /// The key.
        key: String,
    },
    /// A value that does not fit its key.
    #[error("{path}:{line}: `{key}` wants {wants}, not `{value}`")]
    Value {
        /// The file.
        path: PathBuf,
        /// Line number.
        line: usize,
        /// The key.
        key: String,
        /// The value given.
        value: String,
        /// What it should be.
        wants: &'static str,
    },
    /// A threshold that cannot be read.
    #[error("{path}:{line}: bad threshold for `{key}`")]
    Threshold {
        /// The file.
        path: PathBuf,
        /// Line number.
        line: usize,
        /// The key.
        key: String,
        /// Cause.
        #[source]
        source: DurationError,
    },
    /// An interval that cannot be read.
    #[error("{path}:{line}: bad interval")]
    Interval {
        /// The file.
        path: PathBuf,
        /// Line number.
        line: usize,
        /// Cause.
        #[source]
        source: DurationError,
    },
}

/// What the agent runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Time between samples.
    pub interval: Duration,
    /// Publish into this file (a VMM's `--ppa-page-file`) instead of discovering the page.
    pub page_file: Option<PathBuf>,
    /// Most thread records published (the page's capacity may allow fewer).
    pub max_threads: u32,
    /// Use taskstats exit notifications when the kernel and the agent's capabilities allow.
    pub taskstats: bool,
    /// Print one line per exit notification on stderr.
    pub log_exits: bool,
    /// Samples an exited thread stays published, with its final figures and state `X`
    /// (0: an exited thread only adds to the transient figures).
    pub linger: u32,
    /// Thresholds whose occurrences are counted and raised as alarms (all off by default).
    pub thresholds: Thresholds,
}

/// Most samples an exited thread may stay published.
pub const MAX_LINGER: u32 = 1000;

impl Default for Config {
    fn default() -> Self {
        Config {
            interval: DEFAULT_INTERVAL,
            page_file: None,
            max_threads: READER_MAX_RECORDS,
            taskstats: true,
            log_exits: false,
            linger: crate::collect::linger::DEFAULT_LINGER,
            thresholds: Thresholds::default(),
        }
    }
}

fn on_off(v: &str) -> Option<bool> {
    match v {
        "on" | "yes" | "true" | "1" => Some(true),
        "off" | "no" | "false" | "0" => Some(false),
        _ => None,
    }
}

impl Config {
    /// Reads `path` over the defaults.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(path, &text)
    }

    /// Parses the text of the file at `path` over the defaults.
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let mut c = Config::default();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let l = raw.split('#').next().unwrap_or("").trim();
            if l.is_empty() {
                continue;
            }
            let (key, value) = l.split_once('=').ok_or_else(|| ConfigError::Syntax {
                path: path.to_path_buf(),
                line,
            })?;
            let (key, value) = (key.trim(), value.trim());
            let bad = |wants| ConfigError::Value {
                path: path.to_path_buf(),
                line,
                key: key.to_string(),
                value: value.to_string(),
                wants,
            };
            match key {
                "interval" => {
                    c.interval = parse_interval(value).map_err(|source| ConfigError::Interval {
                        path: path.to_path_buf(),
                        line,
                        source,
                    })?
                }
                "page_file" => c.page_file = Some(PathBuf::from(value)),
                "max_threads" => {
                    c.max_threads = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=READER_MAX_RECORDS).contains(n))
                        .ok_or_else(|| bad("a number from 1 to 1024"))?
                }
                "taskstats" => c.taskstats = on_off(value).ok_or_else(|| bad("on or off"))?,
                "log_exits" => c.log_exits = on_off(value).ok_or_else(|| bad("on or off"))?,
                "linger" => {
                    c.linger = value
                        .parse()
                        .ok()
                        .filter(|n| *n <= MAX_LINGER)
                        .ok_or_else(|| bad("a number of samples from 0 to 1000"))?
                }
                "alarm_nivcsw" => c.thresholds.set(
                    AlarmKind::Nivcsw,
                    parse_count(value).ok_or_else(|| bad("a count from 0 (off) to 1000000000"))?,
                ),
                k => match threshold_key(k) {
                    Some(kind) => c.thresholds.set(
                        kind,
                        parse_threshold(value).map_err(|source| ConfigError::Threshold {
                            path: path.to_path_buf(),
                            line,
                            key: k.to_string(),
                            source,
                        })?,
                    ),
                    None => {
                        return Err(ConfigError::UnknownKey {
                            path: path.to_path_buf(),
                            line,
                            key: key.to_string(),
                        })
                    }
                },
            }
        }
        Ok(c)
    }
}

/// The time threshold a config key sets.
fn threshold_key(key: &str) -> Option<AlarmKind> {
    match key {
        "alarm_run_delay" => Some(AlarmKind::RunDelay),
        "alarm_slice" => Some(AlarmKind::Slice),
        "alarm_irq" => Some(AlarmKind::Irq),
        "alarm_softirq" => Some(AlarmKind::Softirq),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_config_file_is_the_defaults_and_the_unit_probes_first() {
        let c = Config::parse(
            Path::new("ppa-agent.conf"),
            include_str!("../ppa-agent.conf"),
        );
        assert_eq!(c.unwrap(), Config::default());
        let unit = include_str!("../ppa-agent.service");
        let cond = unit
            .lines()
            .find_map(|l| l.strip_prefix("ExecCondition="))
            .expect("an ExecCondition");
        assert!(cond.ends_with("--probe"), "{cond}");
        let start = unit
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .unwrap();
        assert_eq!(
            cond.strip_suffix(" --probe"),
            Some(start),
            "probe what is started"
        );
    }

    #[test]
    fn intervals_with_units() {
        assert_eq!(parse_interval("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_interval("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_interval("2.5s"), Ok(Duration::from_millis(2500)));
        assert_eq!(parse_interval("20000us"), Ok(Duration::from_millis(20)));
        assert_eq!(parse_interval("1m"), Ok(Duration::from_secs(60)));
        assert!(matches!(parse_interval("100"), Err(DurationError::Form(_))));
        assert!(matches!(parse_interval("1h"), Err(DurationError::Form(_))));
        assert!(matches!(parse_interval("ms"), Err(DurationError::Form(_))));
        assert_eq!(
            parse_interval("1ms"),
            Err(DurationError::Range(Duration::from_millis(1)))
        );
        assert_eq!(
            parse_interval("1ms").unwrap_err().to_string(),
            "1ms is outside the 10ms to 1h an interval may be"
        );
    }

    #[test]
    fn a_config_file_over_the_defaults() {
        let p = Path::new("/etc/ppa-agent.conf");
        let c = Config::parse(
            p,
            "# comment\n\ninterval = 250ms  # faster\nmax_threads=64\ntaskstats = off\nlinger = 0\n",
        )
        .unwrap();
        assert_eq!(
            c,
            Config {
                interval: Duration::from_millis(250),
                max_threads: 64,
                taskstats: false,
                linger: 0,
                ..Config::default()
            }
        );
        let e = Config::parse(p, "linger = 1001\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "/etc/ppa-agent.conf:1: `linger` wants a number of samples from 0 to 1000, not `1001`"
        );
        let e = Config::parse(p, "interval = 1s\nspeed = 3\n").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/etc/ppa-agent.conf:2: unknown key `speed`"),
            "{e}"
        );
        let e = Config::parse(p, "max_threads = 5000\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "/etc/ppa-agent.conf:1: `max_threads` wants a number from 1 to 1024, not `5000`"
        );
        let e = Config::parse(p, "taskstats\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "/etc/ppa-agent.conf:1: expected `key = value`"
        );
        assert!(matches!(
            Config::parse(p, "interval = fast\n"),
            Err(ConfigError::Interval { line: 1, .. })
        ));
    }

    #[test]
    fn thresholds_from_the_file() {
        let p = Path::new("/etc/ppa-agent.conf");
        let c = Config::parse(
            p,
            "alarm_run_delay = 10ms\nalarm_slice = 2.5ms\nalarm_nivcsw = 200\nalarm_irq = 500us\nalarm_softirq = off\n",
        )
        .unwrap();
        assert_eq!(
            c.thresholds,
            Thresholds([10_000_000, 2_500_000, 200, 500_000, 0])
        );
        let e = Config::parse(p, "alarm_slice = 90m\n").unwrap_err();
        assert_eq!(
            crate::describe(&e),
            "/etc/ppa-agent.conf:1: bad threshold for `alarm_slice`: 5400s is outside the 1us to 1h a threshold may be (0 or off turns it off)"
        );
        let e = Config::parse(p, "alarm_nivcsw = many\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "/etc/ppa-agent.conf:1: `alarm_nivcsw` wants a count from 0 (off) to 1000000000, not `many`"
        );
        assert_eq!(parse_threshold("0"), Ok(0));
        assert_eq!(parse_threshold("1us"), Ok(1000));
        assert!(parse_threshold("1ns").is_err());
    }
}
