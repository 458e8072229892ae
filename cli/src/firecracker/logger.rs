//! The log of `ppa-vmm firecracker`: the process's `log` records in Firecracker's line shape
//! (`TIME [ID:THREAD:LEVEL:FILE:LINE] message`), to stderr until `--log-path` or `PUT
//! /logger` names a file or named pipe, at the level `--level` or the logger's `level` sets.
//!
//! Data flow: `main` installs the one [`FcLog`] before anything logs; the command line and
//! `PUT /logger` (pre-boot only, as in Firecracker) call [`configure`]; every thread's log
//! records then go through [`FcLog::log`], one `write` per line.

use std::io::Write;
use std::sync::Mutex;

use thiserror::Error;

use super::model::Logger;

/// Why a logger configuration was refused.
#[derive(Debug, Error)]
pub enum LoggerError {
    /// An unknown level.
    #[error("Logger error: `{0}` is not a log level (Error, Warning, Info, Debug, Trace or Off).")]
    Level(String),
    /// The file cannot be opened.
    #[error("Logger error: the log file {path} cannot be opened: {source}.")]
    Open {
        /// Path.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
}

#[derive(Debug, Default)]
struct Config {
    target: Option<std::fs::File>,
    id: String,
    show_level: bool,
    show_origin: bool,
    module: Option<String>,
}

/// The logger of the `firecracker` subcommand.
#[derive(Debug)]
pub struct FcLog {
    config: Mutex<Config>,
}

static LOG: FcLog = FcLog {
    config: Mutex::new(Config {
        target: None,
        id: String::new(),
        show_level: false,
        show_origin: false,
        module: None,
    }),
};

/// Installs the logger for instance `id`, at `PPA_VMM_LOG`'s level until configured (warn
/// by default, as `ppa-vmm run`).
pub fn install(id: &str) {
    LOG.config.lock().unwrap_or_else(|e| e.into_inner()).id = id.to_string();
    let level = std::env::var("PPA_VMM_LOG")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(log::LevelFilter::Warn);
    if log::set_logger(&LOG).is_ok() {
        log::set_max_level(level);
    }
}

/// Firecracker's level names (any case; `Warning` and `Warn` both).
pub fn level(name: &str) -> Result<log::LevelFilter, LoggerError> {
    match name.to_ascii_lowercase().as_str() {
        "error" => Ok(log::LevelFilter::Error),
        "warning" | "warn" => Ok(log::LevelFilter::Warn),
        "info" => Ok(log::LevelFilter::Info),
        "debug" => Ok(log::LevelFilter::Debug),
        "trace" => Ok(log::LevelFilter::Trace),
        "off" => Ok(log::LevelFilter::Off),
        _ => Err(LoggerError::Level(name.chars().take(32).collect())),
    }
}

/// Applies a logger configuration: everything is checked before anything changes.
pub fn configure(l: &Logger) -> Result<(), LoggerError> {
    use std::os::unix::fs::OpenOptionsExt;
    let lvl = l.level.as_deref().map(level).transpose()?;
    let target = match &l.log_path {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .read(true)
                .append(true)
                .create(true)
                .mode(0o600)
                .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(path)
                .map_err(|source| LoggerError::Open {
                    path: path.clone(),
                    source,
                })?,
        ),
        None => None,
    };
    let mut c = LOG.config.lock().unwrap_or_else(|e| e.into_inner());
    if target.is_some() {
        c.target = target;
    }
    c.show_level = l.show_level.unwrap_or(c.show_level);
    c.show_origin = l.show_log_origin.unwrap_or(c.show_origin);
    if l.module.is_some() {
        c.module = l.module.clone();
    }
    if let Some(lvl) = lvl {
        log::set_max_level(lvl);
    }
    Ok(())
}

/// One log line in Firecracker's shape.
fn format_line(c: &Config, r: &log::Record<'_>, thread: &str, utc: &str) -> String {
    let mut tag = format!("{}:{thread}", c.id);
    if c.show_level {
        tag.push(':');
        tag.push_str(r.level().as_str());
    }
    if c.show_origin {
        tag.push_str(&format!(
            ":{}:{}",
            r.file().unwrap_or("?"),
            r.line().unwrap_or(0)
        ));
    }
    format!("{utc} [{tag}] {}\n", r.args())
}

impl log::Log for FcLog {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &log::Record<'_>) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let c = self.config.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(m), Some(path)) = (&c.module, r.module_path()) {
            if !path.starts_with(m.as_str()) {
                return;
            }
        }
        let utc = ppa_vmm::report::rfc3339_utc(ppa_vmm::report::realtime_ns());
        let current = std::thread::current();
        let line = format_line(&c, r, current.name().unwrap_or("?"), &utc);
        let _ = match &c.target {
            Some(f) => (&*f).write_all(line.as_bytes()),
            None => std::io::stderr().lock().write_all(line.as_bytes()),
        };
    }

    fn flush(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn firecrackers_level_names_in_any_case() {
        assert_eq!(level("Warning").unwrap(), log::LevelFilter::Warn);
        assert_eq!(level("DEBUG").unwrap(), log::LevelFilter::Debug);
        assert_eq!(level("off").unwrap(), log::LevelFilter::Off);
        let e = level("loud").unwrap_err().to_string();
        assert!(e.contains("`loud` is not a log level"), "{e}");
    }

    #[test]
    fn lines_carry_the_id_thread_and_what_is_asked() {
        let c = Config {
            id: "vm-1".into(),
            show_level: true,
            show_origin: true,
            ..Default::default()
        };
        let args = format_args!("hello");
        let r = log::Record::builder()
            .args(args)
            .level(log::Level::Info)
            .file(Some("src/x.rs"))
            .line(Some(7))
            .build();
        let l = format_line(&c, &r, "fc_api", "T");
        assert_eq!(l, "T [vm-1:fc_api:INFO:src/x.rs:7] hello\n");
        let plain = Config {
            id: "vm-1".into(),
            ..Default::default()
        };
        assert_eq!(
            format_line(&plain, &r, "main", "T"),
            "T [vm-1:main] hello\n"
        );
    }
}
