//! Configuration: the plain [`VmConfig`] the core is built from, and [`RunOptions`], the one
//! struct that is both the command line (clap) and the JSON config file (serde).
//!
//! Data flow: clap parses `ppa-vmm run`'s flags into a [`RunOptions`], and the config file
//! ([`RunOptions::from_file`]) gives another; [`RunOptions::merge`] lays the command line over
//! the file; [`RunOptions::into_config`] checks it and splits it into a [`VmConfig`] (what
//! `Vm::try_from` takes) and [`ReportOptions`] (what the binary does with the result).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;

use crate::accounting::histogram::{DEFAULT_FRAC_BITS, MAX_FRAC_BITS};
use crate::accounting::{Level, Thresholds};
use crate::arch::x86_64::layout::{MAX_RAM_BYTES, MIN_RAM_BYTES};
use crate::limits::limiter::Backend;
use crate::payload::tiny::workload::{Assignment, WorkloadError};
use crate::payload::tiny::TinyImage;
use crate::payload::Payload;

pub use crate::limits::KickMode;

/// The most vCPUs a VM may have.
pub const MAX_VCPUS: usize = 256;
/// The largest config file read (a config has a few dozen short fields).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// Guest memory of a Linux guest when `--memory-mib` is not given.
pub const LINUX_DEFAULT_MEMORY_MIB: u64 = 512;

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
    #[error("unknown guest `{q}` (the embedded guest is `tiny`; use --tiny-image PATH for a tiny-guest ELF file)", q = ppa_vmm_api::clip(.0))]
    UnknownGuest(String),
    /// More than one of `--guest`, `--tiny-image` and `--kernel`.
    #[error("give one of --guest, --tiny-image and --kernel, not several")]
    GuestAndKernel,
    /// `--initrd` or `--cmdline` without `--kernel`.
    #[error("--initrd and --cmdline go with --kernel (a Linux guest)")]
    LinuxOptionWithoutKernel,
    /// `--workload` with `--kernel`.
    #[error("--workload runs on the tiny guest; a Linux guest's workload goes on its command line (e.g. --cmdline ppa.workload=spin:threads=2,ms=500 with images/linux)")]
    WorkloadForLinux,
    /// Histogram fractional bits out of range.
    #[error("histogram fractional bits must be between 0 and {MAX_FRAC_BITS}, not {0}")]
    HistogramBits(u8),
    /// `--guest-metrics-threads` above the most the metrics name.
    #[error(
        "--guest-metrics-threads takes 0 to {max}, not {0}",
        max = crate::ppa_page::board::MAX_METRICS_THREADS
    )]
    GuestMetricsThreads(usize),
    /// A `--threshold` that is not NAME=NS with a known name.
    #[error("`{q}` is not a threshold (exit_handling_ns, guest_run_ns, wakeup_latency_ns or steal_window_ns = whole ns)", q = ppa_vmm_api::clip(.0))]
    Threshold(String),
    /// A VM name that is empty, too long or has control characters.
    #[error("the VM name must be 1 to 128 printable characters, not {q:?}", q = ppa_vmm_api::clip(.0))]
    Name(String),
    /// A metrics address that is not IP:PORT.
    #[error("`{q}` is not an address to serve metrics on (IP:PORT, e.g. 127.0.0.1:9464)", q = ppa_vmm_api::clip(.0))]
    MetricsAddr(String),
    /// An empty socket path.
    #[error("the control socket path is empty")]
    ApiSock,
    /// A bad CPU limit or vCPU group.
    #[error(transparent)]
    Limit(#[from] crate::limits::LimitError),
    /// A bad max runtime.
    #[error("the maximum run time must be {rule}, not {0}", rule = seconds_rule(*.0))]
    MaxRuntime(f64),
    /// A bad `--client-timeout` or `--idle-timeout`.
    #[error("--{0} must be {rule} (0 for --idle-timeout: never), not {1}", rule = seconds_rule(*.1))]
    ClientTimeout(&'static str, f64),
    /// A bad `--net` value.
    #[error("bad --net `{spec}`")]
    Net {
        /// The value as given (cut).
        spec: String,
        /// What is wrong with it.
        #[source]
        source: crate::devices::net::spec::NetSpecError,
    },
    /// A network device with more queue pairs than the VM has vCPUs.
    #[error("--net tap={tap} asks for {queues} queue pairs but the VM has {vcpus} vCPUs (one pair per vCPU at most)")]
    NetQueues {
        /// The tap.
        tap: String,
        /// Queue pairs asked.
        queues: u16,
        /// vCPUs.
        vcpus: usize,
    },
    /// A bad `--disk` value.
    #[error("bad --disk `{spec}`")]
    Disk {
        /// The value as given (cut).
        spec: String,
        /// What is wrong with it.
        #[source]
        source: crate::devices::blk::spec::DiskSpecError,
    },
    /// A disk with more request queues than the VM has vCPUs.
    #[error("--disk path={path} asks for {queues} request queues but the VM has {vcpus} vCPUs (one queue per vCPU at most)")]
    DiskQueues {
        /// The disk's path.
        path: String,
        /// Queues asked.
        queues: u16,
        /// vCPUs.
        vcpus: usize,
    },
    /// More virtio devices than the memory map has windows for.
    #[error("{0} virtio devices (--net and --disk together); a VM has room for 16")]
    TooManyDevices(usize),
    /// Two devices with one id.
    #[error("two devices are called {0}")]
    DeviceId(String),
    /// A bad `--pin` or `--numa-node`.
    #[error(transparent)]
    Pin(#[from] crate::placement::PinError),
    /// A bad `--memory-backing`.
    #[error(transparent)]
    Backing(#[from] crate::memory::BackingError),
    /// A bad workload spec.
    #[error("bad workload `{q}`", q = ppa_vmm_api::clip(.spec))]
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
    /// The config file is larger than any config needs.
    #[error("the config file {path} is over {max} bytes; a config has a few dozen fields", max = MAX_CONFIG_BYTES)]
    FileTooLarge {
        /// Path.
        path: PathBuf,
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

/// Longest time, in seconds, a time option takes (about 31 years).
pub const MAX_SECONDS: f64 = 1e9;

/// What a time option in seconds must be, said of the value `s` that was refused: too large
/// is said as such.
fn seconds_rule(s: f64) -> String {
    if s >= MAX_SECONDS {
        format!("below {MAX_SECONDS} seconds (about 31 years)")
    } else {
        "a positive number of seconds".to_string()
    }
}

pub use crate::vcpu::VcpuNames;

/// Everything the core needs to build a VM.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// Number of vCPUs, 1..=256.
    pub vcpus: usize,
    /// Guest RAM in MiB.
    pub memory_mib: u64,
    /// Fault every page of guest RAM in before the guest starts.
    pub prefault: bool,
    /// What boots.
    pub payload: Payload,
    /// Stop every vCPU after this long.
    pub max_runtime: Option<Duration>,
    /// The KVM device node.
    pub kvm_device: PathBuf,
    /// Accounting level at start.
    pub accounting: Level,
    /// Threshold counters at start.
    pub thresholds: Thresholds,
    /// Fractional bits of the histograms (0..=5).
    pub histogram_bits: u8,
    /// Level full also opens the kernel's tracepoints (KVM's exits, host interrupts, the
    /// scheduler's switches) on each vCPU thread.
    pub kernel_trace: bool,
    /// The VM's name (the `vm` label of the metrics); `ppa-vmm-PID` when absent.
    pub name: Option<String>,
    /// Control socket path.
    pub api_sock: Option<PathBuf>,
    /// Address of the HTTP /metrics endpoint.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Caps and time limits for the clients of both.
    pub client_limits: crate::api::ClientLimits,
    /// CPU limits at start.
    pub limits: crate::limits::limiter::LimitConfig,
    /// Runaway and overload detection.
    pub overload: crate::limits::overload::OverloadConfig,
    /// Size of the PPA page (0: none).
    pub ppa_page_size: u64,
    /// Back the PPA page with this file (host tools can map it).
    pub ppa_page_file: Option<PathBuf>,
    /// Guest threads the metrics name (the busiest; the rest are summed).
    pub guest_metrics_threads: usize,
    /// Seccomp filters and capability drop after set-up (`none` here; `ppa-vmm run`: `kill`).
    pub seccomp: crate::seccomp::Mode,
    /// Network devices (virtio-net on taps), `net0`, `net1`, … in this order.
    pub net: Vec<crate::devices::net::spec::NetSpec>,
    /// Disks (virtio-blk on files), `blk0`, `blk1`, … in this order, after the network
    /// devices in the memory map.
    pub disks: Vec<crate::devices::blk::spec::DiskSpec>,
    /// Where KVM's measured exit cost is kept for the next VM on this host (the run
    /// directory's `calibration.json`; `None`: measured every time).
    pub calibration_cache: Option<PathBuf>,
    /// Which host CPUs each thread may run on (`--pin`), checked when the VM is built.
    pub placement: crate::placement::Placement,
    /// What backs guest RAM (page size, NUMA node: `--memory-backing`, `--numa-node`).
    pub memory_backing: crate::memory::MemoryBacking,
    /// How the vCPU threads are named (`ppa-vmm firecracker`: Firecracker's names).
    pub vcpu_names: VcpuNames,
}

impl Default for VmConfig {
    fn default() -> Self {
        VmConfig {
            vcpus: 1,
            memory_mib: 32,
            prefault: true,
            payload: Payload::default(),
            max_runtime: None,
            kvm_device: PathBuf::from("/dev/kvm"),
            accounting: Level::Basic,
            thresholds: Thresholds::default(),
            histogram_bits: DEFAULT_FRAC_BITS,
            kernel_trace: true,
            name: None,
            api_sock: None,
            metrics_addr: None,
            client_limits: Default::default(),
            limits: Default::default(),
            overload: Default::default(),
            ppa_page_size: ppa_guest_abi::ppa_page::DEFAULT_SIZE,
            ppa_page_file: None,
            guest_metrics_threads: crate::ppa_page::board::DEFAULT_METRICS_THREADS,
            seccomp: crate::seccomp::Mode::None,
            net: Vec::new(),
            disks: Vec::new(),
            calibration_cache: None,
            placement: Default::default(),
            memory_backing: Default::default(),
            vcpu_names: VcpuNames::Ppa,
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
        if self.guest_metrics_threads > crate::ppa_page::board::MAX_METRICS_THREADS {
            return Err(ConfigError::GuestMetricsThreads(self.guest_metrics_threads));
        }
        devices::check(self.vcpus, &self.net, &self.disks)?;
        Ok(())
    }
}

/// Final report format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum, schemars::JsonSchema)]
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

/// The options of `ppa-vmm run`: the command line's flags (clap) and the config file's keys
/// (serde, the same names with `_` for `-`) in one struct. Every field is optional; unset fields
/// take the defaults of [`VmConfig`].
#[derive(Debug, Clone, Default, PartialEq, Deserialize, clap::Args, schemars::JsonSchema)]
#[serde(
    deny_unknown_fields,
    expecting = "a JSON object of run options, the flags of `ppa-vmm run` with `_` for `-` (docs/operations.md)"
)]
pub struct RunOptions {
    /// JSON config file with the same fields as the flags (flags win).
    #[arg(long, value_name = "FILE.json")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Number of vCPUs (1..=256).
    #[arg(long)]
    pub vcpus: Option<usize>,
    /// Guest memory in MiB (RAM past 3 GiB is placed above 4 GiB).
    #[arg(long)]
    pub memory_mib: Option<u64>,
    /// Fault every page of guest memory in before the guest starts (default true: a first
    /// touch inside the guest can block in the host kernel, time no figure explains).
    #[arg(long, value_name = "true|false")]
    pub prefault: Option<bool>,
    /// Embedded guest to boot (`tiny`).
    #[arg(long)]
    pub guest: Option<String>,
    /// A tiny-guest ELF image file (the protocol of the embedded tiny guest).
    #[arg(long, value_name = "PATH")]
    pub tiny_image: Option<PathBuf>,
    /// A Linux kernel to boot (bzImage or ELF vmlinux).
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,
    /// The Linux guest's initial RAM disk.
    #[arg(long, value_name = "PATH")]
    pub initrd: Option<PathBuf>,
    /// More of the Linux guest's command line (after `console=ttyS0 reboot=k panic=1 pci=off`
    /// and `ppa.page=`).
    #[arg(long, value_name = "STR")]
    pub cmdline: Option<String>,
    /// Workload `SPEC` for all vCPUs or `I=SPEC` for vCPU I (repeatable; later ones win).
    #[arg(long, value_name = "SPEC")]
    #[serde(default)]
    pub workload: Vec<String>,
    /// Final report format.
    #[arg(long, value_enum)]
    pub report: Option<ReportFormat>,
    /// Write the report to this file instead of stdout.
    #[arg(long, value_name = "PATH")]
    pub report_file: Option<PathBuf>,
    /// Write every histogram in the kstats text form (`slot S vcpu V count C avg A p P`) here.
    #[arg(long, value_name = "PATH")]
    pub histograms_file: Option<PathBuf>,
    /// Stop every vCPU after this many seconds.
    #[arg(long, value_name = "SECS")]
    pub max_runtime: Option<f64>,
    /// KVM device node.
    #[arg(long, value_name = "PATH")]
    pub kvm_device: Option<PathBuf>,
    /// Accounting level at start: off, basic or full (switchable at run time).
    #[arg(long, value_enum)]
    pub accounting: Option<Level>,
    /// Fractional bits of the log-linear histograms (0..=5).
    #[arg(long, value_name = "BITS")]
    pub histogram_bits: Option<u8>,
    /// At level full, also open the kernel's tracepoints on each vCPU thread (KVM's exits, host
    /// interrupts, sched_switch: kvm_ns, interrupted_ns, pressure) where allowed (default true).
    #[arg(long, value_name = "true|false")]
    pub kernel_trace: Option<bool>,
    /// A threshold counter, NAME=NS (exit_handling_ns, guest_run_ns, wakeup_latency_ns,
    /// steal_window_ns); repeatable.
    #[arg(long, value_name = "NAME=NS")]
    #[serde(default)]
    pub threshold: Vec<String>,
    /// The VM's name: the `vm` label of the metrics (default `ppa-vmm-PID`). With a name the
    /// VM registers in the run directory (docs/operations.md, "Many VMs on one host").
    #[arg(long)]
    pub name: Option<String>,
    /// The run directory where the VM puts `NAME.sock` (unless --api-sock says otherwise) and
    /// its descriptor `NAME.json` (default /run/ppa-vmm, or $XDG_RUNTIME_DIR/ppa-vmm for users
    /// other than root; used when --name or --run-dir is given).
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// Serve the control socket (JSON Lines, mode 0600) at this path while the VM runs.
    #[arg(long, value_name = "PATH")]
    pub api_sock: Option<PathBuf>,
    /// Serve the metrics over HTTP at http://IP:PORT/metrics while the VM runs.
    #[arg(long, value_name = "IP:PORT")]
    pub metrics_addr: Option<String>,
    /// Close a client of either that takes longer than this to send a request it has begun
    /// (an HTTP client: its whole head), or leaves its answers unread this long (default 10).
    #[arg(long, value_name = "SECS")]
    pub client_timeout: Option<f64>,
    /// Close a control client with nothing in flight and no subscription after this long
    /// without a request (default 300; 0: never).
    #[arg(long, value_name = "SECS")]
    pub idle_timeout: Option<f64>,
    /// VM-wide CPU limit: N% of one CPU (100 ms period) or QUOTA/PERIOD (e.g. 15ms/10ms),
    /// with ,scope=vm to cover the device threads too (default scope=vcpus).
    #[arg(long, value_name = "LIMIT")]
    pub cpu_limit: Option<String>,
    /// A vCPU group with its own CPU limit, NAME:VCPUS:LIMIT (e.g. dataplane:0-1:50%);
    /// repeatable.
    #[arg(long, value_name = "NAME:VCPUS:LIMIT")]
    #[serde(default)]
    pub vcpu_group: Vec<String>,
    /// Who enforces the limits: vmm (precise, default) or cgroup (CFS bandwidth control, for
    /// comparison).
    #[arg(long, value_enum)]
    pub limit_backend: Option<Backend>,
    /// How the vmm backend stops a vCPU: timer (its own kick timer, fired by the kernel; the
    /// limiter thread as fallback; default) or limiter (the limiter thread's kicks alone).
    #[arg(long, value_enum)]
    pub limit_kick: Option<KickMode>,
    /// Raise an overload event when a vCPU stays in the guest this long (ms) without an exit
    /// or an idle (PPA's runaway process).
    #[arg(long, value_name = "MS")]
    pub runaway: Option<f64>,
    /// Raise an overload event when a vCPU uses more than PCT % of its time for WINDOWS
    /// windows of 100 ms in a row.
    #[arg(long, value_name = "PCT:WINDOWS")]
    pub overload: Option<String>,
    /// What a runaway or overload does besides the event: notify, pause or throttle:LIMIT.
    #[arg(long, value_name = "ACTION")]
    pub overload_action: Option<String>,
    /// Size of the PPA page shared with the guest, bytes (default 65536; 0: none).
    #[arg(long, value_name = "BYTES")]
    pub ppa_page_size: Option<u64>,
    /// Back the PPA page with this file, so host tools can map it (removed at the end).
    #[arg(long, value_name = "PATH")]
    pub ppa_page_file: Option<PathBuf>,
    /// Guest threads the metrics name, the busiest by CPU (0 to 100, default 10); the others
    /// are summed under tid="rest".
    #[arg(long, value_name = "N")]
    pub guest_metrics_threads: Option<usize>,
    /// After set-up, each thread drops its capabilities and confines itself to its system
    /// calls: kill (the binary's default: a forbidden call stops the VMM, exit status 159),
    /// log (the kernel logs it) or none (docs/security.md). Unset in code: none, since a
    /// filter stays on the thread that built the VM.
    #[arg(long, value_enum)]
    pub seccomp: Option<crate::seccomp::Mode>,
    /// A virtio-net device on a tap: tap=NAME[,mac=MAC][,queues=N][,mtu=M][,id=ID][,rate=B]
    /// (repeatable: net0, net1, …; rate=tx-bytes:125M/1s+rx-packets:100k/1s: docs/limits.md).
    #[arg(long, value_name = "tap=NAME,...")]
    #[serde(default)]
    pub net: Vec<String>,
    /// A virtio-blk disk on a raw file (or block device):
    /// path=FILE[,readonly=on][,id=NAME][,queues=N][,rate=B] (repeatable: blk0, blk1, …; the
    /// file is locked: a disk one VMM may write is never opened by another; rate=ops:1k/1s).
    #[arg(long, value_name = "path=FILE,...")]
    #[serde(default)]
    pub disk: Vec<String>,
    /// Which host CPUs threads run on, KEY=CPUS (repeatable; the most specific KEY wins):
    /// KEY vcpus, vcpuN, a device id (net0: all its threads), a queue pair (net0-qp1) or
    /// service; CPUS in the kernel's list form (4, 0-3,6).
    #[arg(long, value_name = "KEY=CPUS")]
    #[serde(default)]
    pub pin: Vec<String>,
    /// What backs guest RAM: hugepages (2 MiB), hugepages=2M or hugepages=1G from the
    /// kernel's pool (refused before any vCPU runs when it has too few free pages), or
    /// anonymous (4 KiB pages, the default).
    #[arg(long, value_name = "hugepages[=2M|1G]")]
    pub memory_backing: Option<String>,
    /// Bind guest RAM to NUMA node N (mbind) and keep threads no --pin names on its CPUs.
    #[arg(long, value_name = "N")]
    pub numa_node: Option<u32>,
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
    use crate::limits::{check_groups, GroupSpec};
    let (vm, vm_scope) = match cpu_limit {
        None => (None, Default::default()),
        Some(text) => {
            let (l, scope) = crate::limits::parse_vm_limit(text)?;
            l.check_members(text, vcpus.max(1))?;
            (Some((l, text.to_string())), scope)
        }
    };
    let groups = groups
        .iter()
        .map(|g| GroupSpec::parse(g))
        .collect::<Result<Vec<_>, _>>()?;
    check_groups(&groups, vcpus)?;
    Ok(crate::limits::limiter::LimitConfig {
        vm,
        vm_scope,
        groups,
        backend: Default::default(),
        kick: Default::default(),
    })
}

/// The client limits with `--client-timeout` and `--idle-timeout` applied.
fn client_limits(
    client_timeout: Option<f64>,
    idle_timeout: Option<f64>,
) -> Result<crate::api::ClientLimits, ConfigError> {
    let secs = |name, s: f64, zero_ok: bool| {
        if s.is_finite() && (s > 0.0 || (zero_ok && s == 0.0)) && s < MAX_SECONDS {
            Ok(Duration::from_secs_f64(s))
        } else {
            Err(ConfigError::ClientTimeout(name, s))
        }
    };
    let mut l = crate::api::ClientLimits::default();
    if let Some(s) = client_timeout {
        l.client_timeout = secs("client-timeout", s, false)?;
    }
    if let Some(s) = idle_timeout {
        l.idle_timeout = Some(secs("idle-timeout", s, true)?).filter(|d| !d.is_zero());
    }
    Ok(l)
}

impl RunOptions {
    /// Reads a JSON config file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        use std::io::Read;
        let read = |source| ConfigError::ReadFile {
            path: path.to_path_buf(),
            source,
        };
        let mut text = String::new();
        std::fs::File::open(path)
            .map_err(read)?
            .take(MAX_CONFIG_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(read)?;
        if text.len() as u64 > MAX_CONFIG_BYTES {
            return Err(ConfigError::FileTooLarge {
                path: path.to_path_buf(),
            });
        }
        Self::from_json(&text).map_err(|source| ConfigError::ParseFile {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Parses the text of a JSON config file (what [`RunOptions::from_file`] read; the
    /// config fuzz target feeds it directly).
    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// `over` laid over `self`: set fields of `over` win; workloads of both apply, `self`'s
    /// first, so the command line's override the file's.
    pub fn merge(self, over: RunOptions) -> RunOptions {
        let mut workload = self.workload;
        workload.extend(over.workload);
        let mut threshold = self.threshold;
        threshold.extend(over.threshold);
        RunOptions {
            config: over.config.or(self.config),
            prefault: over.prefault.or(self.prefault),
            tiny_image: over.tiny_image.or(self.tiny_image),
            initrd: over.initrd.or(self.initrd),
            cmdline: over.cmdline.or(self.cmdline),
            accounting: over.accounting.or(self.accounting),
            histogram_bits: over.histogram_bits.or(self.histogram_bits),
            kernel_trace: over.kernel_trace.or(self.kernel_trace),
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
            run_dir: over.run_dir.or(self.run_dir),
            api_sock: over.api_sock.or(self.api_sock),
            metrics_addr: over.metrics_addr.or(self.metrics_addr),
            client_timeout: over.client_timeout.or(self.client_timeout),
            idle_timeout: over.idle_timeout.or(self.idle_timeout),
            cpu_limit: over.cpu_limit.or(self.cpu_limit),
            limit_backend: over.limit_backend.or(self.limit_backend),
            limit_kick: over.limit_kick.or(self.limit_kick),
            runaway: over.runaway.or(self.runaway),
            overload: over.overload.or(self.overload),
            overload_action: over.overload_action.or(self.overload_action),
            ppa_page_size: over.ppa_page_size.or(self.ppa_page_size),
            ppa_page_file: over.ppa_page_file.or(self.ppa_page_file),
            guest_metrics_threads: over.guest_metrics_threads.or(self.guest_metrics_threads),
            seccomp: over.seccomp.or(self.seccomp),
            vcpu_group: if over.vcpu_group.is_empty() {
                self.vcpu_group
            } else {
                over.vcpu_group
            },
            net: if over.net.is_empty() {
                self.net
            } else {
                over.net
            },
            disk: if over.disk.is_empty() {
                self.disk
            } else {
                over.disk
            },
            pin: {
                // Later rules of a key replace earlier ones: the file's, then the flags'.
                let mut pin = self.pin;
                pin.extend(over.pin);
                pin
            },
            memory_backing: over.memory_backing.or(self.memory_backing),
            numa_node: over.numa_node.or(self.numa_node),
        }
    }

    /// The tiny guest's image, or None for a Linux kernel; refuses options that belong to the
    /// other kind of guest.
    fn take_tiny_image(&mut self) -> Result<Option<TinyImage>, ConfigError> {
        let image = match (self.guest.take(), self.tiny_image.take(), &self.kernel) {
            (Some(g), None, None) if g == "tiny" => Some(TinyImage::Embedded),
            (Some(g), None, None) => return Err(ConfigError::UnknownGuest(g)),
            (None, Some(path), None) => Some(TinyImage::File(path)),
            (None, None, Some(_)) => None,
            (None, None, None) => Some(TinyImage::Embedded),
            _ => return Err(ConfigError::GuestAndKernel),
        };
        if image.is_some() && (self.initrd.is_some() || self.cmdline.is_some()) {
            return Err(ConfigError::LinuxOptionWithoutKernel);
        }
        if image.is_none() && !self.workload.is_empty() {
            return Err(ConfigError::WorkloadForLinux);
        }
        Ok(image)
    }

    /// Checks the VM's name and the control socket's path; parses the metrics address.
    fn service_names(&self) -> Result<Option<std::net::SocketAddr>, ConfigError> {
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
        match &self.metrics_addr {
            None => Ok(None),
            Some(a) => Ok(Some(
                a.parse::<std::net::SocketAddr>()
                    .map_err(|_| ConfigError::MetricsAddr(a.clone()))?,
            )),
        }
    }

    /// Checks the options and splits them into the VM's config and the report's.
    pub fn into_config(mut self) -> Result<(VmConfig, ReportOptions), ConfigError> {
        let d = VmConfig::default();
        let image = self.take_tiny_image()?;
        let max_runtime = parse_max_runtime(self.max_runtime)?;
        let workloads = parse_workloads(&self.workload)?;
        let metrics_addr = self.service_names()?;
        let client_limits = client_limits(self.client_timeout, self.idle_timeout)?;
        let net = devices::parse_nets(&self.net)?;
        let disks = devices::parse_disks(&self.disk)?;
        let vcpus = self.vcpus.unwrap_or(d.vcpus);
        // Before anything sized by it (the limits' checks): a count out of range is refused
        // as such, whatever else the config says.
        if vcpus == 0 || vcpus > MAX_VCPUS {
            return Err(ConfigError::Vcpus(vcpus));
        }
        let mut limits = parse_limits(self.cpu_limit.as_deref(), &self.vcpu_group, vcpus)?;
        limits.backend = self.limit_backend.unwrap_or_default();
        limits.kick = self.limit_kick.unwrap_or_default();
        let config = VmConfig {
            vcpus,
            // A Linux guest needs more than the tiny guest's default.
            memory_mib: self.memory_mib.unwrap_or(if image.is_some() {
                d.memory_mib
            } else {
                LINUX_DEFAULT_MEMORY_MIB
            }),
            prefault: self.prefault.unwrap_or(d.prefault),
            payload: match (image, self.kernel) {
                (Some(image), _) => Payload::Tiny {
                    image,
                    workloads,
                    gap_threshold_ns: 2_000,
                },
                (None, kernel) => Payload::Linux {
                    kernel: kernel.unwrap_or_default(),
                    initrd: self.initrd,
                    cmdline: self.cmdline.unwrap_or_default(),
                },
            },
            max_runtime,
            kvm_device: self.kvm_device.unwrap_or(d.kvm_device),
            accounting: self.accounting.unwrap_or(d.accounting),
            thresholds: parse_thresholds(&self.threshold, d.thresholds)?,
            histogram_bits: self.histogram_bits.unwrap_or(d.histogram_bits),
            kernel_trace: self.kernel_trace.unwrap_or(d.kernel_trace),
            name: self.name,
            api_sock: self.api_sock,
            metrics_addr,
            client_limits,
            limits,
            overload: crate::limits::overload::OverloadConfig::parse(
                self.runaway,
                self.overload.as_deref(),
                self.overload_action.as_deref(),
            )?,
            ppa_page_size: self.ppa_page_size.unwrap_or(d.ppa_page_size),
            ppa_page_file: self.ppa_page_file,
            guest_metrics_threads: self
                .guest_metrics_threads
                .unwrap_or(d.guest_metrics_threads),
            seccomp: self.seccomp.unwrap_or_default(),
            net,
            disks,
            calibration_cache: None,
            placement: crate::placement::Placement::parse(&self.pin)?,
            memory_backing: crate::memory::MemoryBacking {
                page: match &self.memory_backing {
                    Some(b) => crate::memory::MemoryBacking::parse(b)?,
                    None => Default::default(),
                },
                numa_node: self.numa_node,
            },
            vcpu_names: VcpuNames::Ppa,
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

/// `--max-runtime` in seconds: finite, positive, below [`MAX_SECONDS`].
fn parse_max_runtime(seconds: Option<f64>) -> Result<Option<Duration>, ConfigError> {
    match seconds {
        None => Ok(None),
        Some(s) if s.is_finite() && s > 0.0 && s < MAX_SECONDS => {
            Ok(Some(Duration::from_secs_f64(s)))
        }
        Some(s) => Err(ConfigError::MaxRuntime(s)),
    }
}

/// Each `--workload` assignment.
fn parse_workloads(specs: &[String]) -> Result<Vec<Assignment>, ConfigError> {
    specs
        .iter()
        .map(|spec| {
            Assignment::parse(spec).map_err(|source| ConfigError::Workload {
                spec: spec.clone(),
                source,
            })
        })
        .collect()
}

pub mod devices;

#[cfg(test)]
mod tests;
