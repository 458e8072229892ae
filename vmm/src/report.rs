//! The final report: what each vCPU published, as JSON (spec section 7) or as a text table,
//! and how it reaches its file.
//!
//! Data flow: after the vCPU threads are joined, `Vm::run` gathers everything the run knows
//! into one [`RunRecord`] (the shared per-vCPU state, the payload's part of the VM and of each
//! vCPU, the end facts, the stop signal the VM's handle recorded, the limiter's groups, the
//! devices, the pressure and the PPA page's guest view) and [`Report::build`] turns it into the
//! report, which nothing patches afterwards; the binary serialises it (`serde_json`) or prints
//! [`Report::to_text`]. The report only reads atomics, so it could equally be built while the
//! vCPUs run. A report file is checked before the VM starts ([`check_writable`]) and written
//! whole or not at all ([`write_atomic`]: a temporary file in the same directory, renamed over
//! the target), so a run never ends with its record lost to a path that could not take it or
//! with a truncated file.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ppa_vmm_api::guest_view::{guest_view_text, HostColumns};
use ppa_vmm_api::{GuestView, VcpuEndKind, VmEnd};
use serde::Serialize;
use thiserror::Error;

use crate::accounting::histogram::{HistogramJson, HistogramSnapshot};
use crate::accounting::snapshot::{HistSnapshots, VcpuTimes};
use crate::accounting::Level;
use crate::hypervisor::RegsDump;
use crate::payload::{PayloadVcpuReport, PayloadVmReport};
use crate::ppa_page::PpaPage;
use crate::vcpu::{VcpuEnd, VcpuShared};

/// Why a report (or histograms) file cannot be written.
#[derive(Debug, Error)]
pub enum ReportFileError {
    /// The path names a directory.
    #[error("{} is a directory, not a file name", .0.display())]
    IsDirectory(PathBuf),
    /// The directory that would hold the file does not exist.
    #[error("the directory {} does not exist", .0.display())]
    NoDirectory(PathBuf),
    /// A file cannot be created in the directory (permissions, a read-only file system).
    #[error("cannot create a file in {}", .dir.display())]
    NotWritable {
        /// The directory.
        dir: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Writing the temporary file or renaming it over the target failed; the target is as
    /// it was.
    #[error("cannot write {}", .path.display())]
    Write {
        /// The target.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// The directory a file at `path` lives in (`.` for a bare name).
fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A new temporary file beside `path`, open for writing: its path and the file.
fn temp_beside(path: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    let dir = parent_dir(path);
    let name = path
        .file_name()
        .map_or_else(|| "report".into(), |n| n.to_string_lossy().into_owned());
    let mut last = None;
    for n in 0..100u32 {
        let tmp = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
        {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free temporary name")))
}

/// Checks, before a run, that a file can later be written at `path`: it is not a directory,
/// and a file can be created in its directory (one is created and removed).
pub fn check_writable(path: &Path) -> Result<(), ReportFileError> {
    if path.is_dir() {
        return Err(ReportFileError::IsDirectory(path.to_path_buf()));
    }
    let dir = parent_dir(path);
    if !dir.is_dir() {
        return Err(ReportFileError::NoDirectory(dir));
    }
    let (tmp, file) = temp_beside(path).map_err(|source| ReportFileError::NotWritable {
        dir: dir.clone(),
        source,
    })?;
    drop(file);
    let _ = std::fs::remove_file(tmp);
    Ok(())
}

/// Writes `bytes` to `path` atomically: into a temporary file in the same directory, flushed
/// to disk, then renamed over `path`. On any failure the temporary file is removed and `path`
/// keeps what it had (nothing, or the previous file).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ReportFileError> {
    let err = |source| ReportFileError::Write {
        path: path.to_path_buf(),
        source,
    };
    if path.is_dir() {
        return Err(ReportFileError::IsDirectory(path.to_path_buf()));
    }
    let (tmp, mut file) = temp_beside(path).map_err(err)?;
    let written = file
        .write_all(bytes)
        .and_then(|()| file.sync_all())
        .and_then(|()| {
            drop(file);
            std::fs::rename(&tmp, path)
        });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(err(e));
    }
    Ok(())
}

/// CLOCK_REALTIME now, ns since the Unix epoch (0 if the clock is before it).
pub fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A CLOCK_REALTIME time as an RFC 3339 UTC timestamp with nanoseconds
/// (`2026-11-23T17:47:00.123456789Z`).
pub fn rfc3339_utc(realtime_ns: u64) -> String {
    let secs = realtime_ns / 1_000_000_000;
    let nanos = realtime_ns % 1_000_000_000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Days since 1970-01-01 to a civil date (H. Hinnant's algorithm, proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{nanos:09}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The PPA page's guest view, with each vCPU's `host_reset` flag: whether a `reset` restarted
/// the host figures that stand beside the guest's (they then do not compare).
pub(crate) fn guest_view(page: &PpaPage, vcpus: &[Arc<VcpuShared>]) -> GuestView {
    let mut v = page.guest_view();
    let reset: Vec<bool> = vcpus
        .iter()
        .map(|s| s.acct.meter.reset_epoch.load(Ordering::Acquire) > 0)
        .collect();
    if reset.contains(&true) {
        v.host_reset = reset;
    }
    v
}

/// VM facts fixed at build time.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct VmInfo {
    /// vCPU count.
    pub vcpus: usize,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// What booted: `tiny`, or the image's path.
    pub image: String,
    /// TSC frequency given to the guest.
    pub tsc_khz: u64,
    /// Median wall time of one KVM_RUN exit round trip with no guest work, measured at start.
    pub kvm_exit_cost_ns: Option<u64>,
    /// The same for the first KVM_RUN after a park (measured after a 200 µs sleep).
    pub kvm_exit_cost_after_park_ns: Option<u64>,
    /// The same after an 8 ms sleep (a park between the two costs what lies between them).
    pub kvm_exit_cost_after_long_park_ns: Option<u64>,
    /// What backs guest RAM.
    pub memory: MemoryInfo,
    /// The placement rules the run ended with (`--pin` and `set-pin`, `KEY=CPUS`).
    pub pins: Vec<String>,
}

/// What backs guest RAM (`--memory-backing`, `--numa-node`).
#[derive(Debug, Clone, Copy, Default, Serialize, schemars::JsonSchema)]
pub struct MemoryInfo {
    /// `4K` (anonymous memory), `2M` or `1G` (huge pages from the kernel's pool).
    pub page_size: crate::memory::PageSize,
    /// The NUMA node RAM is bound to, or null.
    pub numa_node: Option<u32>,
}

/// How the text report says what backs RAM: nothing for anonymous memory on any node.
fn memory_text(m: &MemoryInfo) -> String {
    let mut parts = Vec::new();
    if m.page_size != crate::memory::PageSize::Base {
        parts.push(format!("{} huge pages", m.page_size));
    }
    if let Some(n) = m.numa_node {
        parts.push(format!("NUMA node {n}"));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(", "))
    }
}

/// Everything a finished run knows, gathered once by `Vm::run` after the vCPU threads are
/// joined: the one value [`Report::build`] turns into the report.
#[derive(Debug)]
pub struct RunRecord<'a> {
    /// VM facts fixed at build time.
    pub info: &'a VmInfo,
    /// Each vCPU's published state.
    pub vcpus: &'a [Arc<VcpuShared>],
    /// The payload's part of the VM.
    pub vm_payload: PayloadVmReport,
    /// The payload's part of each vCPU, in vCPU order.
    pub vcpu_payloads: Vec<PayloadVcpuReport>,
    /// The VM's name.
    pub name: String,
    /// CLOCK_REALTIME when the vCPU threads were started, ns.
    pub start_realtime_ns: u64,
    /// CLOCK_REALTIME when the last vCPU thread was joined, ns.
    pub end_realtime_ns: u64,
    /// First spawn to last join.
    pub uptime_ns: u64,
    /// Whether --max-runtime stopped it.
    pub timed_out: bool,
    /// Whether an operator asked for a shutdown (control socket or stop signal).
    pub shutdown: bool,
    /// The stop signal that asked for the shutdown, when one did.
    pub signal: Option<&'static str>,
    /// CPU time of every non-vCPU thread of the process.
    pub host_threads_ns: u64,
    /// The process's CPU split into vCPU threads, device threads and the rest.
    pub host_cpu_ns: ppa_vmm_api::HostCpuSplit,
    /// Paravirt steal this host suffered during the run (all CPUs), when it is itself a VM.
    pub host_steal_ns: Option<u64>,
    /// Accounting level at the end.
    pub level: Level,
    /// CPU pressure over the run, as the sampler last computed it.
    pub pressure: Option<ppa_vmm_api::PressureReport>,
    /// CPU limits and what they did.
    pub groups: Vec<ppa_vmm_api::GroupStats>,
    /// Each device's figures.
    pub devices: Vec<ppa_vmm_api::DeviceStats>,
    /// The guest's view from the PPA page, when there is a page.
    pub guest: Option<GuestView>,
}

/// Per-VM part of the report.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct VmReport {
    /// The VM's name (`--name`; `ppa-vmm-PID` by default).
    pub name: String,
    /// The VMM's process id.
    pub pid: u32,
    /// When the vCPU threads were started, RFC 3339 UTC.
    pub started_at: String,
    /// When the last vCPU thread ended, RFC 3339 UTC.
    pub ended_at: String,
    /// `started_at` as CLOCK_REALTIME ns since the Unix epoch.
    pub started_realtime_ns: u64,
    /// `ended_at` as CLOCK_REALTIME ns since the Unix epoch.
    pub ended_realtime_ns: u64,
    /// The signal that ended the run as `shutdown` does (SIGTERM, SIGINT, SIGHUP), if any.
    pub signal: Option<String>,
    /// Build-time facts.
    #[serde(flatten)]
    pub info: VmInfo,
    /// Time from the first vCPU start to the last join.
    pub uptime_ns: u64,
    /// `completed` (every vCPU exited with 0), `failed`, `timeout` or `shutdown`.
    pub end: VmEnd,
    /// Accounting level at the end.
    pub level: Level,
    /// CPU time of every non-vCPU thread of the VMM process.
    pub host_threads_ns: u64,
    /// The VMM process's CPU: the vCPU threads, the device threads, the rest (service).
    pub host_cpu_ns: ppa_vmm_api::HostCpuSplit,
    /// Time this host lost to its own hypervisor during the run, all CPUs (10 ms resolution);
    /// invisible to the thread clocks, so it may show as identity error.
    pub host_steal_ns: Option<u64>,
    /// Histograms merged over every vCPU.
    pub histograms: BTreeMap<String, HistogramJson>,
    /// CPU pressure of the VM and its vCPU groups over the run (docs/accounting.md,
    /// "Pressure"), as the sampler last computed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pressure: Option<ppa_vmm_api::PressureReport>,
    /// The payload's fields (a Linux guest: command line, console, resets).
    #[serde(flatten)]
    pub payload: PayloadVmReport,
}

/// A failed vCPU's cause.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct FailureReport {
    /// One sentence.
    pub reason: String,
    /// Registers at failure, when available.
    pub regs: Option<RegsDump>,
    /// The vCPU's exit before the fatal one (reason and address), when it made one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_exit: Option<crate::vcpu::LastExit>,
}

/// Per-vCPU part of the report.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct VcpuReport {
    /// The payload's fields (tiny guest: `workload`, `doorbells`, `guest_reported`).
    #[serde(flatten)]
    pub payload: PayloadVcpuReport,
    /// `exited`, `failed`, `error` or `stopped`.
    pub end: VcpuEndKind,
    /// The code the guest exited with, when it did.
    pub exit_code: Option<u64>,
    /// Why it failed, when it did.
    pub failure: Option<FailureReport>,
    /// The time split and counts of spec section 4.
    #[serde(flatten)]
    pub times: VcpuTimes,
    /// Whether a `reset` restarted this vCPU's figures during the run: they count from the
    /// last reset, /proc's ticks and the VM's uptime from the start.
    pub reset: bool,
    /// Histograms (exit_handling by reason only where it has samples).
    pub histograms: BTreeMap<String, HistogramJson>,
    /// The same histograms as snapshots, for the kstats text form.
    #[serde(skip)]
    pub hist: HistSnapshots,
}

impl VcpuReport {
    /// The tiny guest's part, when the payload is the tiny guest.
    pub fn tiny(&self) -> Option<&crate::payload::tiny::report::TinyVcpuReport> {
        match &self.payload {
            PayloadVcpuReport::Tiny(t) => Some(t),
            PayloadVcpuReport::Linux(_) => None,
        }
    }
}

/// The final report.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Report {
    /// The VM.
    pub vm: VmReport,
    /// Each vCPU.
    pub vcpus: Vec<VcpuReport>,
    /// CPU limits (the VM's as group `vm`, then each vCPU group) and what they did.
    pub groups: Vec<ppa_vmm_api::GroupStats>,
    /// What the guest published in the PPA page at the end, decoded (when there is a page).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest: Option<ppa_vmm_api::GuestView>,
    /// Each device: its threads, queues, CPU and drops (spec section 10).
    pub devices: Vec<ppa_vmm_api::DeviceStats>,
}

fn vcpu_report(s: &VcpuShared, payload: PayloadVcpuReport) -> (VcpuReport, HistSnapshots) {
    // The thread's own final figures, exact, not held at what live readers were given.
    let (times, hist) = s.times_exact();
    let (end, exit_code) = s
        .end()
        .map_or((VcpuEndKind::Stopped, None), VcpuEnd::kind_and_code);
    let failure = s.end().and_then(|e| {
        Some(FailureReport {
            reason: e.reason()?,
            regs: match e {
                VcpuEnd::Failed { regs, .. } => regs.as_deref().cloned(),
                _ => None,
            },
            last_exit: match e {
                VcpuEnd::Failed { last_exit, .. } => *last_exit,
                _ => None,
            },
        })
    });
    let report = VcpuReport {
        payload,
        end,
        exit_code,
        failure,
        times,
        reset: s.acct.meter.reset_epoch.load(Ordering::Acquire) > 0,
        histograms: hist.to_json(),
        hist: hist.clone(),
    };
    (report, hist)
}

/// Merges every vCPU's histograms into one set.
fn merge_all(all: &[HistSnapshots]) -> BTreeMap<String, HistogramJson> {
    let mut out = BTreeMap::new();
    let Some(first) = all.first() else {
        return out;
    };
    let refs: Vec<&HistSnapshots> = all.iter().collect();
    for name in HistSnapshots::names_of(&refs) {
        let bits = first.get(&name).map_or(3, |h| h.frac_bits);
        let mut m = HistogramSnapshot::empty(bits);
        for h in all.iter().filter_map(|a| a.get(&name)) {
            m.merge(&h);
        }
        if m.count() > 0 || !name.contains('.') {
            out.insert(name, m.to_json());
        }
    }
    out
}

impl Report {
    /// Builds the report from everything the run recorded.
    pub fn build(run: RunRecord<'_>) -> Report {
        let guest_stop = run
            .vcpus
            .iter()
            .any(|v| matches!(v.end(), Some(VcpuEnd::GuestStop)));
        let (vcpus, hists): (Vec<VcpuReport>, Vec<HistSnapshots>) = run
            .vcpus
            .iter()
            .zip(run.vcpu_payloads)
            .map(|(s, p)| vcpu_report(s, p))
            .unzip();
        let any_failed = vcpus.iter().any(|v| v.failure.is_some());
        // A guest that asked the VM to stop (a Linux `reboot`) ended it cleanly, even though
        // the VMM stopped its other vCPUs.
        let all_ok = vcpus.iter().all(|v| v.exit_code == Some(0)) || (guest_stop && !any_failed);
        let end = match (run.timed_out, all_ok) {
            (_, true) => VmEnd::Completed,
            _ if run.shutdown && !any_failed => VmEnd::Shutdown,
            (true, false) => VmEnd::Timeout,
            (false, false) => VmEnd::Failed,
        };
        Report {
            vm: VmReport {
                name: run.name,
                pid: std::process::id(),
                started_at: rfc3339_utc(run.start_realtime_ns),
                ended_at: rfc3339_utc(run.end_realtime_ns),
                started_realtime_ns: run.start_realtime_ns,
                ended_realtime_ns: run.end_realtime_ns,
                signal: run.signal.map(str::to_string),
                info: run.info.clone(),
                uptime_ns: run.uptime_ns,
                end,
                level: run.level,
                host_threads_ns: run.host_threads_ns,
                host_cpu_ns: run.host_cpu_ns,
                host_steal_ns: run.host_steal_ns,
                histograms: merge_all(&hists),
                pressure: run.pressure,
                payload: run.vm_payload,
            },
            vcpus,
            groups: run.groups,
            guest: run.guest,
            devices: run.devices,
        }
    }

    /// Every histogram in the kstats text form: for each name, a header line, then one line per
    /// slot and vCPU and one per slot for all vCPUs.
    pub fn histograms_text(&self) -> String {
        let mut out = String::new();
        let all: Vec<&HistSnapshots> = self.vcpus.iter().map(|v| &v.hist).collect();
        for name in HistSnapshots::names_of(&all) {
            let per_vcpu: Vec<(usize, HistogramSnapshot)> = self
                .vcpus
                .iter()
                .filter_map(|v| v.hist.get(&name).map(|h| (v.times.id, h)))
                .collect();
            if per_vcpu.iter().any(|(_, h)| h.count() > 0) {
                out.push_str(&crate::accounting::histogram::kstats_text(&name, &per_vcpu));
            }
        }
        out
    }

    /// 0 when every vCPU exited with code 0, else 1.
    pub fn exit_code(&self) -> i32 {
        i32::from(!self.vm.end.is_clean())
    }

    /// A table for people: the time split per vCPU beside /proc's tick-based figure, the
    /// guest's own measurements, then failures.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        self.vm_text(&mut out);
        self.vcpu_table_text(&mut out);
        self.kernel_text(&mut out);
        if self.vcpus.iter().any(|v| v.reset) {
            let _ = writeln!(
                out,
                "* reset during the run: that vCPU's figures count from its last reset, its \
                 /proc ms and the VM's uptime from the start."
            );
        }
        self.groups_text(&mut out);
        out.push_str(&ppa_vmm_api::devices_text::devices_text(&self.devices));
        if !self.devices.is_empty() {
            out.push_str(&ppa_vmm_api::devices_text::host_cpu_line(
                &self.vm.host_cpu_ns,
            ));
        }
        let rows: Vec<(usize, &PayloadVcpuReport, Option<u64>)> = self
            .vcpus
            .iter()
            .map(|v| {
                let p99 = v.histograms.get("exit_handling").map(|h| h.p99);
                (v.times.id, &v.payload, p99)
            })
            .collect();
        out.push_str(&crate::payload::text(&self.vm.payload, &rows));
        self.guest_text(&mut out);
        self.failures_text(&mut out);
        out
    }

    /// The VM's lines: name, pid and times; its facts; its pressure.
    fn vm_text(&self, out: &mut String) {
        let ms = |ns: u64| ns as f64 / 1e6;
        let vm = &self.vm;
        let cost = vm
            .info
            .kvm_exit_cost_ns
            .map_or("unmeasured".to_string(), |c| {
                format!("{:.1} us", c as f64 / 1e3)
            });
        let _ = writeln!(
            out,
            "VM {} (pid {}): {} to {}{}",
            vm.name,
            vm.pid,
            vm.started_at,
            vm.ended_at,
            vm.signal
                .as_ref()
                .map_or(String::new(), |s| format!(", stopped by {s}")),
        );
        let _ = writeln!(
            out,
            "VM: {} vCPUs, {} MiB{}, image {}, TSC {} kHz, uptime {:.1} ms, {}, accounting {:?}, \
             exit round trip in KVM {cost}, VMM threads {:.2} ms CPU",
            vm.info.vcpus,
            vm.info.memory_mib,
            memory_text(&vm.info.memory),
            vm.info.image,
            vm.info.tsc_khz,
            ms(vm.uptime_ns),
            vm.end,
            vm.level,
            ms(vm.host_threads_ns),
        );
        if let Some(p) = &vm.pressure {
            let line = |l: &ppa_vmm_api::PressureLine| {
                format!(
                    "avg10={:.2} avg60={:.2} avg300={:.2} total={:.1} ms",
                    l.avg10,
                    l.avg60,
                    l.avg300,
                    l.total_us as f64 / 1e3
                )
            };
            let _ = writeln!(
                out,
                "PRESSURE some {}; full {}{}",
                line(&p.vm.some),
                line(&p.vm.full),
                if p.vm.estimated {
                    " (ESTIMATE: the vCPUs' stall intervals were not known, level full measures them)"
                } else {
                    ""
                }
            );
        }
    }

    /// The time split table, one row per vCPU, and its legend.
    fn vcpu_table_text(&self, out: &mut String) {
        let ms = |ns: u64| ns as f64 / 1e6;
        let _ = writeln!(
            out,
            "{:>4} {:<24} {:>8} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8} {:>7}",
            "VCPU",
            "WORKLOAD",
            "END",
            "WALL ms",
            "USED ms",
            "GUEST",
            "KVM",
            "INTR",
            "VMM",
            "STEAL",
            "IDLE",
            "HALT",
            "LMTD",
            "BLKD",
            "/proc ms",
            "EXITS",
            "IDENT"
        );
        for v in &self.vcpus {
            let t = &v.times;
            let total: u64 = t.exits.values().sum();
            let ticks = t.proc_ticks.map_or("-".to_string(), |k| {
                format!("{:.0}", ms(k.utime_ns + k.stime_ns))
            });
            let end = match v.exit_code {
                Some(c) => format!("exit {c}"),
                None => v.end.to_string(),
            };
            let mut w = v.tiny().map_or(String::new(), |t| t.workload.clone());
            w.truncate(24);
            let wall = format!("{:.2}{}", ms(t.wall_ns), if v.reset { "*" } else { "" });
            let opt = |ns: Option<u64>| ns.map_or("-".to_string(), |n| format!("{:.2}", ms(n)));
            let _ = writeln!(
                out,
                "{:>4} {:<24} {:>8} {:>9} {:>9.3} {:>8.2} {:>8} {:>8} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>9} {:>8} {:>6.2}%",
                v.times.id,
                w,
                end,
                wall,
                ms(t.used_ns),
                ms(t.guest_ns),
                opt(t.kvm_ns),
                opt(t.interrupted_ns),
                ms(t.vmm_ns),
                ms(t.steal_ns),
                ms(t.idle_ns),
                ms(t.halted_ns),
                ms(t.limited_ns),
                ms(t.blocked_ns),
                ticks,
                total,
                t.identity_error_ns as f64 * 100.0 / t.wall_ns.max(1) as f64,
            );
        }
        let _ = writeln!(
            out,
            "USED is the thread's CPU clock (ns); /proc ms is utime+stime from ticks (10 ms units). \
             GUEST/VMM split: {}. KVM: in-kernel exit handling, INTR: host interrupts \
             (level full; - where not measured). BLKD: asleep in the kernel outside parks, not \
             halted. IDENT = wall - (used+steal+halted+idle+limited+paused+blocked).",
            self.vcpus
                .first()
                .map_or("-".to_string(), |v| v.times.split.legend(v.times.split_source)),
        );
    }

    /// One line per CPU limit group.
    fn groups_text(&self, out: &mut String) {
        let ms = |ns: u64| ns as f64 / 1e6;
        for g in &self.groups {
            let _ = writeln!(
                out,
                "LIMIT {} (vCPUs {:?}, {}, {} backend): {} of {} periods throttled, charged {:.2} ms = {:.2} % of one CPU over its periods, limited {:.2} ms, worst overshoot {:.1} us; kick {}: {} by timer ({} re-arms), {} by the limiter",
                g.name,
                g.vcpus,
                g.limit,
                g.backend,
                g.throttled_periods,
                g.periods,
                ms(g.used_ns),
                g.used_percent().unwrap_or(0.0),
                ms(g.limited_ns),
                g.overshoot_max_ns as f64 / 1e3,
                g.kicks.path,
                g.kicks.timer,
                g.kicks.rearms,
                g.kicks.limiter,
            );
            if g.backend == ppa_vmm_api::LimitBackend::Vmm {
                let _ = writeln!(
                    out,
                    "  stops of {}: {} cost the VMM {:.2} ms outside the quota ({:.2} ms of CPU, {:.2} ms of KVM round trips, an estimate); charged = the members' CPU less that",
                    g.name,
                    g.stops.count,
                    ms(g.stops.total_ns()),
                    ms(g.stops.cpu_ns),
                    ms(g.stops.kvm_ns_estimate),
                );
            }
            if g.turn_periods > 0 {
                let _ = writeln!(
                    out,
                    "  turns in {}: in {} of {} periods the quota gave each busy vCPU under 1 ms, so some ran the period while the others waited their turn (docs/limits.md, \"Turns\")",
                    g.name, g.turn_periods, g.periods,
                );
            }
            if g.straddled_periods > 0 {
                let (n, s, p) = (&g.name, g.straddled_periods, g.periods);
                let _ = writeln!(out, "  straddled turns in {n}: {s} of {p} periods ended in a turn that ran on into the next period, one stop for two periods' shares; their figures are the release's, not the exact stop's (docs/limits.md, \"Straddled turns\")");
            }
            if let Some(line) = g.kicks.stages.as_ref().map(|s| s.summary()) {
                let _ = writeln!(out, "  stop stages of {}: {line}", g.name);
            }
        }
    }

    /// Each failed vCPU's reason and registers.
    fn failures_text(&self, out: &mut String) {
        for v in &self.vcpus {
            if let Some(f) = &v.failure {
                let _ = writeln!(out, "vCPU {} {}: {}", v.times.id, v.end, f.reason);
                if let Some(r) = &f.regs {
                    let _ = writeln!(
                        out,
                        "  rip={} rsp={} rflags={} cs={} ss={} cr0={} cr3={} cr4={} efer={}",
                        r.rip, r.rsp, r.rflags, r.cs, r.ss, r.cr0, r.cr3, r.cr4, r.efer
                    );
                }
            }
        }
    }

    /// Per vCPU, its in-kernel exits by reason (most first) and its host interrupts by kind;
    /// then, once each, why KVM or INTR is `-`.
    fn kernel_text(&self, out: &mut String) {
        let mut reasons: Vec<&str> = Vec::new();
        for v in &self.vcpus {
            let t = &v.times;
            let mut exits: Vec<(&String, &u64)> = t.kvm_exits.iter().collect();
            exits.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
            if !exits.is_empty() {
                let list: Vec<String> = exits
                    .iter()
                    .map(|(r, n)| {
                        let ns = t.kvm_exit_ns.get(*r).copied().unwrap_or(0);
                        format!("{r} {n} ({:.2} ms)", ns as f64 / 1e6)
                    })
                    .collect();
                let _ = writeln!(out, "KVM EXITS vCPU {}: {}", t.id, list.join(", "));
            }
            if !t.interrupts.is_empty() {
                let list: Vec<String> = t
                    .interrupts
                    .iter()
                    .map(|(k, n)| format!("{k} {n}"))
                    .collect();
                let _ = writeln!(out, "INTERRUPTS vCPU {}: {}", t.id, list.join(", "));
            }
            for r in [&t.kvm_ns_reason, &t.interrupted_reason]
                .into_iter()
                .flatten()
            {
                if !reasons.contains(&r.as_str()) {
                    reasons.push(r);
                }
            }
        }
        for r in reasons {
            let _ = writeln!(out, "NOT MEASURED: {r}.");
        }
    }

    /// The guest's own view from the PPA page, each guest CPU beside its vCPU's host figures,
    /// then the guest's threads; nothing when the guest published nothing.
    fn guest_text(&self, out: &mut String) {
        let Some(g) = &self.guest else { return };
        let host = |cpu: u32| {
            self.vcpus
                .iter()
                .find(|v| v.times.id == cpu as usize)
                .map(|v| {
                    let t = &v.times;
                    [t.guest_ns, t.halted_ns + t.idle_ns, t.steal_ns]
                })
        };
        out.push_str(&guest_view_text(
            g,
            &HostColumns {
                names: ["GUEST host", "IDLE host", "STEAL host"],
                values: &host,
                reset: &g.host_reset,
            },
        ));
    }
}
