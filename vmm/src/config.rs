//! Configuration: the plain [`VmConfig`] the core is built from, and [`RunOptions`], the one
//! shape shared by the command line and the JSON config file.
//!
//! Data flow: the CLI (clap, in `main.rs`) and the config file (serde, [`RunOptions::from_file`])
//! each produce a [`RunOptions`]; [`RunOptions::merge`] lays the command line over the file;
//! [`RunOptions::into_config`] checks it and splits it into a [`VmConfig`] (what `Vm::try_from`
//! takes) and [`ReportOptions`] (what the binary does with the result).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;

use crate::accounting::histogram::{DEFAULT_FRAC_BITS, MAX_FRAC_BITS};
use crate::accounting::{Level, Thresholds};
use crate::arch::x86_64::layout::{MAX_RAM_BYTES, MAX_VCPUS, MIN_RAM_BYTES};
use crate::workload::{Assignment, WorkloadError};

/// Why a configuration was refused.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// vCPU count out of range.
    #[error("the VM needs between 1 and {MAX_VCPUS} vCPUs, not {0}")]
    Vcpus(usize),
    /// Memory size out of range.
    #[error(
        "guest memory must be between {min} and {max} MiB, not {0} MiB",
        min = MIN_RAM_BYTES >> 20,
        max = MAX_RAM_BYTES >> 20
    )]
    Memory(u64),
    /// `--guest` names an unknown guest.
    #[error("unknown guest `{0}` (the embedded guest is `tiny`; use --kernel PATH for a file)")]
    UnknownGuest(String),
    /// Both `--guest` and `--kernel`.
    #[error("give either --guest or --kernel, not both")]
    GuestAndKernel,
    /// Histogram fractional bits out of range.
    #[error("histogram fractional bits must be between 0 and {MAX_FRAC_BITS}, not {0}")]
    HistogramBits(u8),
    /// A `--threshold` that is not NAME=NS with a known name.
    #[error("`{0}` is not a threshold (exit_handling_ns, guest_run_ns, wakeup_latency_ns or steal_window_ns = whole ns)")]
    Threshold(String),
    /// A VM name that is empty, too long or has control characters.
    #[error("the VM name must be 1 to 128 printable characters, not {0:?}")]
    Name(String),
    /// A metrics address that is not IP:PORT.
    #[error("`{0}` is not an address to serve metrics on (IP:PORT, e.g. 127.0.0.1:9464)")]
    MetricsAddr(String),
    /// An empty socket path.
    #[error("the control socket path is empty")]
    ApiSock,
    /// A bad CPU limit or vCPU group.
    #[error(transparent)]
    Limit(#[from] crate::limits::LimitError),
    /// A bad max runtime.
    #[error("the maximum run time must be a positive number of seconds, not {0}")]
    MaxRuntime(f64),
    /// A bad workload spec.
    #[error("bad workload `{spec}`")]
    Workload {
        /// The spec as given.
        spec: String,
        /// What is wrong with it.
        #[source]
        source: WorkloadError,
    },
    /// The config file cannot be read.
    #[error("cannot read the config file {path}")]
    ReadFile {
        /// Path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The config file is not valid.
    #[error("the config file {path} is not valid")]
    ParseFile {
        /// Path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
}

/// Where the guest image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// The tiny guest embedded in the binary.
    Tiny,
    /// An ELF file following the tiny-guest protocol.
    File(PathBuf),
}

/// Everything the core needs to build a VM.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// Number of vCPUs, 1..=256.
    pub vcpus: usize,
    /// Guest RAM in MiB.
    pub memory_mib: u64,
    /// Guest image.
    pub image: ImageSource,
    /// Workload assignments, applied in order.
    pub workloads: Vec<Assignment>,
    /// Stop every vCPU after this long.
    pub max_runtime: Option<Duration>,
    /// The KVM device node.
    pub kvm_device: PathBuf,
    /// Gap threshold of the guest's rdtsc loops, ns.
    pub gap_threshold_ns: u64,
    /// Accounting level at start.
    pub accounting: Level,
    /// Threshold counters at start.
    pub thresholds: Thresholds,
    /// Fractional bits of the histograms (0..=5).
    pub histogram_bits: u8,
    /// The VM's name (the `vm` label of the metrics); `ppa-vmm-PID` when absent.
    pub name: Option<String>,
    /// Control socket path.
    pub api_sock: Option<PathBuf>,
    /// Address of the HTTP /metrics endpoint.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// CPU limits at start.
    pub limits: crate::limits::limiter::LimitConfig,
    /// Runaway and overload detection.
    pub overload: crate::limits::overload::OverloadConfig,
    /// Size of the PPA page (0: none).
    pub ppa_page_size: u64,
    /// Back the PPA page with this file (host tools can map it).
    pub ppa_page_file: Option<PathBuf>,
}

impl Default for VmConfig {
    fn default() -> Self {
        VmConfig {
            vcpus: 1,
            memory_mib: 32,
            image: ImageSource::Tiny,
            workloads: Vec::new(),
            max_runtime: None,
            kvm_device: PathBuf::from("/dev/kvm"),
            gap_threshold_ns: 2_000,
            accounting: Level::Basic,
            thresholds: Thresholds::default(),
            histogram_bits: DEFAULT_FRAC_BITS,
            name: None,
            api_sock: None,
            metrics_addr: None,
            limits: Default::default(),
            overload: Default::default(),
            ppa_page_size: ppa_guest_abi::ppa_page::DEFAULT_SIZE,
            ppa_page_file: None,
        }
    }
}

impl VmConfig {
    /// Checks the ranges of the numeric fields.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.vcpus == 0 || self.vcpus > MAX_VCPUS {
            return Err(ConfigError::Vcpus(self.vcpus));
        }
        let bytes = self.memory_mib.saturating_mul(1 << 20);
        if !(MIN_RAM_BYTES..=MAX_RAM_BYTES).contains(&bytes) {
            return Err(ConfigError::Memory(self.memory_mib));
        }
        if self.histogram_bits > MAX_FRAC_BITS {
            return Err(ConfigError::HistogramBits(self.histogram_bits));
        }
        Ok(())
    }
}

/// Final report format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ReportFormat {
    /// One JSON object on stdout (or the report file).
    Json,
    /// A table for people.
    Text,
    /// No report.
    None,
}

/// What to do with the final report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportOptions {
    /// Format.
    pub format: ReportFormat,
    /// Write it here instead of stdout.
    pub file: Option<PathBuf>,
    /// Write every histogram in the kstats text form here.
    pub histograms_file: Option<PathBuf>,
}

/// The options of `ppa-vmm run`, as given on the command line or in a config file. Every field
/// is optional; unset fields take the defaults of [`VmConfig`].
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunOptions {
    /// vCPU count.
    pub vcpus: Option<usize>,
    /// Memory in MiB.
    pub memory_mib: Option<u64>,
    /// Embedded guest name (`tiny`).
    pub guest: Option<String>,
    /// Guest image file.
    pub kernel: Option<PathBuf>,
    /// Workload specs (`SPEC` or `I=SPEC`).
    #[serde(default)]
    pub workload: Vec<String>,
    /// Report format.
    pub report: Option<ReportFormat>,
    /// Report file.
    pub report_file: Option<PathBuf>,
    /// File for every histogram in the kstats text form.
    pub histograms_file: Option<PathBuf>,
    /// Maximum run time in seconds.
    pub max_runtime: Option<f64>,
    /// KVM device path.
    pub kvm_device: Option<PathBuf>,
    /// Accounting level at start.
    pub accounting: Option<Level>,
    /// Histogram fractional bits.
    pub histogram_bits: Option<u8>,
    /// Thresholds as `NAME=NS` strings, in the file as on the command line.
    #[serde(default)]
    pub threshold: Vec<String>,
    /// The VM's name.
    pub name: Option<String>,
    /// Control socket path.
    pub api_sock: Option<PathBuf>,
    /// `IP:PORT` of the HTTP /metrics endpoint.
    pub metrics_addr: Option<String>,
    /// VM-wide CPU limit (`150%`, `15ms/10ms`).
    pub cpu_limit: Option<String>,
    /// vCPU groups, `NAME:VCPUS:LIMIT`.
    #[serde(default)]
    pub vcpu_group: Vec<String>,
    /// Who enforces the limits: `vmm` (default) or `cgroup`.
    pub limit_backend: Option<String>,
    /// Guest run (ms) without an exit or idle that counts as a runaway.
    pub runaway: Option<f64>,
    /// `PCT:WINDOWS`: above PCT % of the time for WINDOWS windows of 100 ms.
    pub overload: Option<String>,
    /// `notify` (default), `pause` or `throttle:LIMIT`.
    pub overload_action: Option<String>,
    /// Size of the PPA page in bytes (0: none).
    pub ppa_page_size: Option<u64>,
    /// File backing the PPA page.
    pub ppa_page_file: Option<PathBuf>,
}

/// Applies `NAME=NS` settings to `t`.
pub fn parse_thresholds(specs: &[String], mut t: Thresholds) -> Result<Thresholds, ConfigError> {
    for spec in specs {
        let bad = || ConfigError::Threshold(spec.clone());
        let (name, value) = spec.split_once('=').ok_or_else(bad)?;
        let v: u64 = value.trim().parse().map_err(|_| bad())?;
        let threshold: ppa_vmm_api::Threshold = name.trim().parse().map_err(|_| bad())?;
        threshold.set(&mut t, v);
    }
    Ok(t)
}

/// Parses and checks the VM limit and the groups against a VM of `vcpus` vCPUs.
pub fn parse_limits(
    cpu_limit: Option<&str>,
    groups: &[String],
    vcpus: usize,
) -> Result<crate::limits::limiter::LimitConfig, ConfigError> {
    use crate::limits::{check_groups, GroupSpec, Limit};
    let vm = match cpu_limit {
        None => None,
        Some(text) => {
            let l = Limit::parse(text)?;
            l.check_members(text, vcpus.max(1))?;
            Some((l, text.to_string()))
        }
    };
    let groups = groups
        .iter()
        .map(|g| GroupSpec::parse(g))
        .collect::<Result<Vec<_>, _>>()?;
    check_groups(&groups, vcpus)?;
    Ok(crate::limits::limiter::LimitConfig {
        vm,
        groups,
        backend: Default::default(),
    })
}

impl RunOptions {
    /// Reads a JSON config file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
            path: path.to_path_buf(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|source| ConfigError::ParseFile {
            path: path.to_path_buf(),
            source,
        })
    }

    /// `over` laid over `self`: set fields of `over` win; workloads of both apply, `self`'s
    /// first, so the command line's override the file's.
    pub fn merge(self, over: RunOptions) -> RunOptions {
        let mut workload = self.workload;
        workload.extend(over.workload);
        let mut threshold = self.threshold;
        threshold.extend(over.threshold);
        RunOptions {
            accounting: over.accounting.or(self.accounting),
            histogram_bits: over.histogram_bits.or(self.histogram_bits),
            threshold,
            vcpus: over.vcpus.or(self.vcpus),
            memory_mib: over.memory_mib.or(self.memory_mib),
            guest: over.guest.or(self.guest),
            kernel: over.kernel.or(self.kernel),
            workload,
            report: over.report.or(self.report),
            report_file: over.report_file.or(self.report_file),
            histograms_file: over.histograms_file.or(self.histograms_file),
            max_runtime: over.max_runtime.or(self.max_runtime),
            kvm_device: over.kvm_device.or(self.kvm_device),
            name: over.name.or(self.name),
            api_sock: over.api_sock.or(self.api_sock),
            metrics_addr: over.metrics_addr.or(self.metrics_addr),
            cpu_limit: over.cpu_limit.or(self.cpu_limit),
            limit_backend: over.limit_backend.or(self.limit_backend),
            runaway: over.runaway.or(self.runaway),
            overload: over.overload.or(self.overload),
            overload_action: over.overload_action.or(self.overload_action),
            ppa_page_size: over.ppa_page_size.or(self.ppa_page_size),
            ppa_page_file: over.ppa_page_file.or(self.ppa_page_file),
            vcpu_group: if over.vcpu_group.is_empty() {
                self.vcpu_group
            } else {
                over.vcpu_group
            },
        }
    }

    /// Checks the options and splits them into the VM's config and the report's.
    pub fn into_config(self) -> Result<(VmConfig, ReportOptions), ConfigError> {
        let d = VmConfig::default();
        let image = match (self.guest, self.kernel) {
            (Some(_), Some(_)) => return Err(ConfigError::GuestAndKernel),
            (Some(g), None) if g == "tiny" => ImageSource::Tiny,
            (Some(g), None) => return Err(ConfigError::UnknownGuest(g)),
            (None, Some(path)) => ImageSource::File(path),
            (None, None) => ImageSource::Tiny,
        };
        let max_runtime = match self.max_runtime {
            None => None,
            Some(s) if s.is_finite() && s > 0.0 && s < 1e9 => Some(Duration::from_secs_f64(s)),
            Some(s) => return Err(ConfigError::MaxRuntime(s)),
        };
        let workloads = self
            .workload
            .iter()
            .map(|spec| {
                Assignment::parse(spec).map_err(|source| ConfigError::Workload {
                    spec: spec.clone(),
                    source,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(n) = &self.name {
            if n.is_empty() || n.chars().count() > 128 || n.chars().any(char::is_control) {
                return Err(ConfigError::Name(n.clone()));
            }
        }
        if self
            .api_sock
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            return Err(ConfigError::ApiSock);
        }
        let metrics_addr = match &self.metrics_addr {
            None => None,
            Some(a) => Some(
                a.parse::<std::net::SocketAddr>()
                    .map_err(|_| ConfigError::MetricsAddr(a.clone()))?,
            ),
        };
        let vcpus = self.vcpus.unwrap_or(d.vcpus);
        let mut limits = parse_limits(self.cpu_limit.as_deref(), &self.vcpu_group, vcpus)?;
        limits.backend = match self.limit_backend.as_deref() {
            None | Some("vmm") => crate::limits::limiter::Backend::Vmm,
            Some("cgroup") => crate::limits::limiter::Backend::Cgroup,
            Some(other) => {
                return Err(crate::limits::LimitError::BackendName(other.to_string()).into())
            }
        };
        let config = VmConfig {
            vcpus,
            memory_mib: self.memory_mib.unwrap_or(d.memory_mib),
            image,
            workloads,
            max_runtime,
            kvm_device: self.kvm_device.unwrap_or(d.kvm_device),
            gap_threshold_ns: d.gap_threshold_ns,
            accounting: self.accounting.unwrap_or(d.accounting),
            thresholds: parse_thresholds(&self.threshold, d.thresholds)?,
            histogram_bits: self.histogram_bits.unwrap_or(d.histogram_bits),
            name: self.name,
            api_sock: self.api_sock,
            metrics_addr,
            limits,
            overload: crate::limits::overload::OverloadConfig::parse(
                self.runaway,
                self.overload.as_deref(),
                self.overload_action.as_deref(),
            )?,
            ppa_page_size: self.ppa_page_size.unwrap_or(d.ppa_page_size),
            ppa_page_file: self.ppa_page_file,
        };
        config.validate()?;
        let report = ReportOptions {
            format: self.report.unwrap_or(ReportFormat::Text),
            file: self.report_file,
            histograms_file: self.histograms_file,
        };
        Ok((config, report))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(json: &str) -> Result<RunOptions, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn file_and_command_line_merge() {
        let file =
            opts(r#"{"vcpus": 4, "memory_mib": 64, "workload": ["busy:ms=5"], "report": "json"}"#)
                .unwrap();
        let cli = RunOptions {
            vcpus: Some(2),
            workload: vec!["1=idle:ms=1".into()],
            ..Default::default()
        };
        let (vm, report) = file.merge(cli).into_config().unwrap();
        assert_eq!(vm.vcpus, 2);
        assert_eq!(vm.memory_mib, 64);
        assert_eq!(vm.workloads.len(), 2);
        assert_eq!(vm.workloads[1].target, Some(1));
        assert_eq!(report.format, ReportFormat::Json);
        assert_eq!(vm.image, ImageSource::Tiny);
    }

    #[test]
    fn rejects_unknown_keys_and_bad_values() {
        assert!(opts(r#"{"cpus": 4}"#)
            .unwrap_err()
            .to_string()
            .contains("unknown field"));
        assert!(opts(r#"{"vcpus": -1}"#).is_err());
        assert!(opts(r#"{"report": "xml"}"#).is_err());
        let bad = |o: RunOptions| o.into_config().unwrap_err();
        assert!(matches!(
            bad(RunOptions {
                vcpus: Some(0),
                ..Default::default()
            }),
            ConfigError::Vcpus(0)
        ));
        assert!(matches!(
            bad(RunOptions {
                vcpus: Some(257),
                ..Default::default()
            }),
            ConfigError::Vcpus(257)
        ));
        assert!(matches!(
            bad(RunOptions {
                memory_mib: Some(1),
                ..Default::default()
            }),
            ConfigError::Memory(1)
        ));
        assert!(matches!(
            bad(RunOptions {
                memory_mib: Some(1 << 40),
                ..Default::default()
            }),
            ConfigError::Memory(_)
        ));
        assert!(matches!(
            bad(RunOptions {
                guest: Some("linux".into()),
                ..Default::default()
            }),
            ConfigError::UnknownGuest(_)
        ));
        assert!(matches!(
            bad(RunOptions {
                guest: Some("tiny".into()),
                kernel: Some("x".into()),
                ..Default::default()
            }),
            ConfigError::GuestAndKernel
        ));
        assert!(matches!(
            bad(RunOptions {
                max_runtime: Some(-1.0),
                ..Default::default()
            }),
            ConfigError::MaxRuntime(_)
        ));
        let e = bad(RunOptions {
            workload: vec!["nap:ms=1".into()],
            ..Default::default()
        });
        assert!(matches!(e, ConfigError::Workload { .. }));
    }

    #[test]
    fn accounting_options() {
        let o = opts(
            r#"{"accounting": "full", "histogram_bits": 5, "threshold": ["guest_run_ns=1000"]}"#,
        )
        .unwrap();
        let (vm, _) = o.into_config().unwrap();
        assert_eq!(vm.accounting, Level::Full);
        assert_eq!(vm.histogram_bits, 5);
        assert_eq!(vm.thresholds.guest_run_ns, 1000);
        assert!(opts(r#"{"accounting": "max"}"#).is_err());
        let bad = |o: RunOptions| o.into_config().unwrap_err();
        assert!(matches!(
            bad(RunOptions {
                histogram_bits: Some(6),
                ..Default::default()
            }),
            ConfigError::HistogramBits(6)
        ));
        for t in ["guest_run=5", "guest_run_ns", "guest_run_ns=x"] {
            assert!(matches!(
                bad(RunOptions {
                    threshold: vec![t.into()],
                    ..Default::default()
                }),
                ConfigError::Threshold(_)
            ));
        }
    }

    #[test]
    fn control_options() {
        let o = opts(
            r#"{"name": "nf-1", "api_sock": "/run/ppa.sock", "metrics_addr": "127.0.0.1:9464"}"#,
        )
        .unwrap();
        let (vm, _) = o.into_config().unwrap();
        assert_eq!(vm.name.as_deref(), Some("nf-1"));
        assert_eq!(vm.metrics_addr.unwrap().port(), 9464);
        let bad = |o: RunOptions| o.into_config().unwrap_err();
        for a in ["localhost", "127.0.0.1", "1.2.3.4:99999", ""] {
            let e = bad(RunOptions {
                metrics_addr: Some(a.into()),
                ..Default::default()
            });
            assert!(matches!(e, ConfigError::MetricsAddr(_)), "{a}");
        }
        for n in ["", "a\nb", &"x".repeat(129)] {
            let e = bad(RunOptions {
                name: Some(n.into()),
                ..Default::default()
            });
            assert!(matches!(e, ConfigError::Name(_)), "{n:?}");
        }
        let e = bad(RunOptions {
            api_sock: Some(PathBuf::new()),
            ..Default::default()
        });
        assert!(matches!(e, ConfigError::ApiSock));
    }

    #[test]
    fn missing_config_file_is_named() {
        let e = RunOptions::from_file(Path::new("/nonexistent/ppa.json")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/ppa.json"));
    }
}
