//! `host serve`: one Prometheus endpoint for every VM of the run directory. Each scrape
//! lists the VMs, asks each for `stats` and its `metrics` text in parallel with a deadline,
//! merges the VMs' families (every series of a VMM already has its `vm` label), adds host
//! totals and, with `--compat`, the vCPU series KubeVirt and the libvirt exporter define.
//! A VM that went away is not listed, so its series drop; one that does not answer in time
//! is left out of that scrape and counted, and the scrape still succeeds.
//!
//! Data flow: a listener thread (this one, [`listen`]) holds up to [`MAX_CONNS`] connections
//! as the VMM's own metrics listener does: each request head (8 KiB) is due 2 s after its
//! accept, and when every slot is taken a new connection evicts the oldest one still sending
//! its head; a whole `GET /metrics` is answered with [`render`] on a thread of its own (at
//! most [`MAX_SCRAPES`] at once), anything else at once (404, 405, 400).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ppa_vmm_api::{Stats, VcpuSummary};

use super::{gather, Ask, VmView};
use crate::rundir::{RunDir, Scan};

pub mod listen;

pub use listen::{Listen, HEAD_DEADLINE, MAX_CONNS, MAX_SCRAPES};

/// Series families of other tools that `--compat` can add.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Compat {
    /// KubeVirt's `kubevirt_vmi_vcpu_seconds_total` and `kubevirt_vmi_vcpu_delay_seconds_total`.
    Kubevirt,
    /// The libvirt exporter's `libvirt_domain_vcpu_time_seconds_total` and
    /// `libvirt_domain_vcpu_delay_seconds_total`.
    Libvirt,
}

/// Options of `host serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeOptions {
    /// The run directory (default /run/ppa-vmm, or $XDG_RUNTIME_DIR/ppa-vmm for others).
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// Where to serve GET /metrics (port 0: any free port, printed at start).
    #[arg(long, value_name = "IP:PORT")]
    pub metrics_listen: SocketAddr,
    /// Other tools' series to add, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub compat: Vec<Compat>,
    /// How long a scrape waits for each VM, ms.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub scrape_timeout_ms: u64,
}

/// One family gathered from the VMs: its HELP and TYPE lines and its samples.
#[derive(Debug, Default)]
struct Family {
    help: String,
    kind: String,
    samples: Vec<String>,
}

/// Adds the families of one VMM's exposition text to `out` (samples of a family gathered
/// under its first HELP and TYPE).
fn merge_text(text: &str, order: &mut Vec<String>, out: &mut BTreeMap<String, Family>) {
    let mut current = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or("").to_string();
            current = name.clone();
            let f = out.entry(name.clone()).or_insert_with(|| {
                order.push(name);
                Family::default()
            });
            if f.help.is_empty() {
                f.help = line.to_string();
            }
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split(' ').next().unwrap_or("").to_string();
            current = name.clone();
            let f = out.entry(name.clone()).or_insert_with(|| {
                order.push(name);
                Family::default()
            });
            if f.kind.is_empty() {
                f.kind = line.to_string();
            }
        } else if !line.is_empty() && !line.starts_with('#') {
            if let Some(f) = out.get_mut(&current) {
                f.samples.push(line.to_string());
            }
        }
    }
}

/// Escapes a label value.
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn secs(ns: u64) -> String {
    format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000)
}

/// Writes one family: its HELP and TYPE lines, then its samples.
fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: &[String]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for x in samples {
        let _ = writeln!(out, "{x}");
    }
}

/// The VMs that answered, by name, with their last `stats`.
fn answered(views: &[VmView]) -> Vec<(&str, &Stats)> {
    views
        .iter()
        .filter_map(|v| {
            let a = v.answer.as_ref().ok()?;
            Some((v.descriptor.name.as_str(), a.stats.last()?))
        })
        .collect()
}

/// The host's counts: VMs listed, which answered, entries skipped, the scrape's duration.
fn host_counts(out: &mut String, views: &[VmView], scan: &Scan, took: Duration) {
    family(
        out,
        "ppa_host_vms",
        "gauge",
        "VMs the run directory lists (live VMMs).",
        &[format!("ppa_host_vms {}", views.len())],
    );
    let up: Vec<String> = views
        .iter()
        .map(|v| {
            format!(
                "ppa_host_vm_up{{vm=\"{}\"}} {}",
                esc(&v.descriptor.name),
                u8::from(v.answer.is_ok())
            )
        })
        .collect();
    family(
        out,
        "ppa_host_vm_up",
        "gauge",
        "1 when the VM answered this scrape in time, 0 when not.",
        &up,
    );
    family(
        out,
        "ppa_host_foreign_entries",
        "gauge",
        "Run-directory entries of other users, skipped.",
        &[format!("ppa_host_foreign_entries {}", scan.foreign)],
    );
    family(
        out,
        "ppa_host_scrape_duration_seconds",
        "gauge",
        "How long this scrape took to ask every VM.",
        &[format!(
            "ppa_host_scrape_duration_seconds {:.6}",
            took.as_secs_f64()
        )],
    );
}

/// The host's sums over the VMs that answered: vCPUs, their used and steal time, the VMMs'
/// other threads.
fn host_sums(out: &mut String, answered: &[(&str, &Stats)]) {
    let total = |f: &dyn Fn(&Stats) -> u64| answered.iter().map(|(_, s)| f(s)).sum::<u64>();
    let vcpu_total =
        |f: fn(&VcpuSummary) -> u64| total(&|s: &Stats| s.vcpus.iter().map(f).sum::<u64>());
    family(
        out,
        "ppa_host_vcpus",
        "gauge",
        "vCPUs of the VMs that answered.",
        &[format!("ppa_host_vcpus {}", total(&|s| s.vm.vcpus as u64))],
    );
    family(
        out,
        "ppa_host_vcpu_used_seconds",
        "gauge",
        "Sum of the answering VMs' vCPU used time (a gauge: a VM that ends leaves the sum).",
        &[format!(
            "ppa_host_vcpu_used_seconds {}",
            secs(vcpu_total(|v| v.used_ns))
        )],
    );
    family(
        out,
        "ppa_host_vcpu_steal_seconds",
        "gauge",
        "Sum of the answering VMs' vCPU steal time.",
        &[format!(
            "ppa_host_vcpu_steal_seconds {}",
            secs(vcpu_total(|v| v.steal_ns))
        )],
    );
    family(
        out,
        "ppa_host_vmm_threads_seconds",
        "gauge",
        "Sum of the answering VMMs' non-vCPU thread CPU time.",
        &[format!(
            "ppa_host_vmm_threads_seconds {}",
            secs(total(&|s| s.vm.host_threads_ns))
        )],
    );
}

/// A per-vCPU family of another tool that `--compat` adds.
struct CompatFamily {
    /// Which `--compat` value adds it.
    compat: Compat,
    /// Its name.
    name: &'static str,
    /// Its help text (theirs, and what our value is).
    help: &'static str,
    /// A sample's labels for the VM (escaped) and the vCPU id.
    labels: fn(&str, usize) -> String,
    /// A sample's value, ns.
    value: fn(&VcpuSummary) -> u64,
}

/// The families `--compat` can add, in the order they are written.
const COMPAT_FAMILIES: [CompatFamily; 4] = [
    CompatFamily {
        compat: Compat::Kubevirt,
        name: "kubevirt_vmi_vcpu_seconds_total",
        help: "Total amount of time spent in each state by each vcpu (PPA-VMM: state running is used_ns, exact).",
        labels: |vm, id| format!("name=\"{vm}\",namespace=\"\",id=\"{id}\",state=\"running\""),
        value: |v| v.used_ns,
    },
    CompatFamily {
        compat: Compat::Kubevirt,
        name: "kubevirt_vmi_vcpu_delay_seconds_total",
        help: "Time the vCPU was enqueued by the host scheduler but could not run (PPA-VMM: steal_ns).",
        labels: |vm, id| format!("name=\"{vm}\",namespace=\"\",id=\"{id}\""),
        value: |v| v.steal_ns,
    },
    CompatFamily {
        compat: Compat::Libvirt,
        name: "libvirt_domain_vcpu_time_seconds_total",
        help: "Amount of CPU time used by the domain's VCPU (PPA-VMM: used_ns).",
        labels: |vm, id| format!("domain=\"{vm}\",vcpu=\"{id}\""),
        value: |v| v.used_ns,
    },
    CompatFamily {
        compat: Compat::Libvirt,
        name: "libvirt_domain_vcpu_delay_seconds_total",
        help: "Time the VCPU waited in the host's run queue (PPA-VMM: steal_ns).",
        labels: |vm, id| format!("domain=\"{vm}\",vcpu=\"{id}\""),
        value: |v| v.steal_ns,
    },
];

/// The compat families `compat` asks for, one sample per vCPU of each VM that answered.
fn compat_families(out: &mut String, answered: &[(&str, &Stats)], compat: &[Compat]) {
    for f in COMPAT_FAMILIES
        .iter()
        .filter(|f| compat.contains(&f.compat))
    {
        let samples: Vec<String> = answered
            .iter()
            .flat_map(|(vm, s)| {
                s.vcpus.iter().map(move |v| {
                    format!(
                        "{}{{{}}} {}",
                        f.name,
                        (f.labels)(&esc(vm), v.id),
                        secs((f.value)(v))
                    )
                })
            })
            .collect();
        family(out, f.name, "counter", f.help, &samples);
    }
}

/// The host's own families and the compat ones, written after the VMs'.
fn host_families(views: &[VmView], scan: &Scan, compat: &[Compat], took: Duration) -> String {
    let mut out = String::new();
    let answered = answered(views);
    host_counts(&mut out, views, scan, took);
    host_sums(&mut out, &answered);
    compat_families(&mut out, &answered, compat);
    out
}

/// The whole exposition for the VMs `views` (asked with metrics) found by `scan`.
pub fn render(views: &[VmView], scan: &Scan, compat: &[Compat], took: Duration) -> String {
    let mut order = Vec::new();
    let mut families = BTreeMap::new();
    for v in views {
        if let Some(text) = v.answer.as_ref().ok().and_then(|a| a.metrics.as_deref()) {
            merge_text(text, &mut order, &mut families);
        }
    }
    let mut s = String::new();
    for name in &order {
        let f = &families[name];
        for l in [&f.help, &f.kind] {
            if !l.is_empty() {
                s.push_str(l);
                s.push('\n');
            }
        }
        for x in &f.samples {
            s.push_str(x);
            s.push('\n');
        }
    }
    s.push_str(&host_families(views, scan, compat, took));
    s
}

/// One scrape: scan, ask, render.
pub fn scrape(dir: &RunDir, compat: &[Compat], timeout: Duration) -> Result<String, String> {
    let t0 = Instant::now();
    let scan = dir.scan().map_err(|e| crate::describe(&e))?;
    for k in &scan.kept {
        eprintln!("ppa-vmm: warn: {k}");
    }
    let views = gather(
        &scan,
        Ask {
            interval: None,
            metrics: true,
            timeout,
        },
    );
    Ok(render(&views, &scan, compat, t0.elapsed()))
}

/// Runs `host serve` until killed: 2 when the run directory or the address cannot be used.
pub fn run(opts: ServeOptions) -> i32 {
    let fail = |m: String| {
        eprintln!("ppa-vmm: error: {m}");
        2
    };
    let dir = match RunDir::open(opts.run_dir.as_deref(), false) {
        Ok(d) => d,
        Err(e) => return fail(crate::describe(&e)),
    };
    let listener = match TcpListener::bind(opts.metrics_listen) {
        Ok(l) => l,
        Err(e) => return fail(format!("cannot listen on {}: {e}", opts.metrics_listen)),
    };
    if let Ok(a) = listener.local_addr() {
        eprintln!("ppa-vmm: serving the host's metrics at http://{a}/metrics");
    }
    let timeout = Duration::from_millis(opts.scrape_timeout_ms);
    let compat = opts.compat.clone();
    let scrape = Arc::new(move || scrape(&dir, &compat, timeout));
    match Listen::new(listener, scrape) {
        Ok(l) => l.run(),
        Err(e) => fail(format!("cannot serve {}: {e}", opts.metrics_listen)),
    }
}
