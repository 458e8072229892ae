//! `host serve`: one Prometheus endpoint for every VM of the run directory. Each scrape
//! lists the VMs, asks each for `stats` and its `metrics` text in parallel with a deadline,
//! merges the VMs' families (every series of a VMM already has its `vm` label), adds host
//! totals and, with `--compat`, the vCPU series KubeVirt and the libvirt exporter define.
//! A VM that went away is not listed, so its series drop; one that does not answer in time
//! is left out of that scrape and counted, and the scrape still succeeds.
//!
//! Data flow: a listener thread (this one) accepts; each connection is served on a thread of
//! its own (at most [`MAX_CONNS`] at once, the rest get 503): read the request head (8 KiB,
//! 2 s), answer `GET /metrics` with [`render`], anything else with 404.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{gather, Ask, VmView};
use crate::rundir::{RunDir, Scan};

/// Connections served at once.
pub const MAX_CONNS: usize = 8;
/// Longest request head read.
const MAX_HEAD: usize = 8192;

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

/// The host's own families and the compat ones, written after the VMs'.
fn host_families(views: &[VmView], scan: &Scan, compat: &[Compat], took: Duration) -> String {
    let mut s = String::new();
    let answered: Vec<(&str, &ppa_vmm_api::Stats)> = views
        .iter()
        .filter_map(|v| {
            let a = v.answer.as_ref().ok()?;
            Some((v.descriptor.name.as_str(), a.stats.last()?))
        })
        .collect();
    let mut fam = |name: &str, kind: &str, help: &str, samples: Vec<String>| {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for x in samples {
            let _ = writeln!(s, "{x}");
        }
    };
    fam(
        "ppa_host_vms",
        "gauge",
        "VMs the run directory lists (live VMMs).",
        vec![format!("ppa_host_vms {}", views.len())],
    );
    fam(
        "ppa_host_vm_up",
        "gauge",
        "1 when the VM answered this scrape in time, 0 when not.",
        views
            .iter()
            .map(|v| {
                format!(
                    "ppa_host_vm_up{{vm=\"{}\"}} {}",
                    esc(&v.descriptor.name),
                    u8::from(v.answer.is_ok())
                )
            })
            .collect(),
    );
    fam(
        "ppa_host_foreign_entries",
        "gauge",
        "Run-directory entries of other users, skipped.",
        vec![format!("ppa_host_foreign_entries {}", scan.foreign)],
    );
    fam(
        "ppa_host_scrape_duration_seconds",
        "gauge",
        "How long this scrape took to ask every VM.",
        vec![format!(
            "ppa_host_scrape_duration_seconds {:.6}",
            took.as_secs_f64()
        )],
    );
    let total = |f: fn(&ppa_vmm_api::Stats) -> u64| answered.iter().map(|(_, s)| f(s)).sum::<u64>();
    fam(
        "ppa_host_vcpus",
        "gauge",
        "vCPUs of the VMs that answered.",
        vec![format!("ppa_host_vcpus {}", total(|s| s.vm.vcpus as u64))],
    );
    fam(
        "ppa_host_vcpu_used_seconds",
        "gauge",
        "Sum of the answering VMs' vCPU used time (a gauge: a VM that ends leaves the sum).",
        vec![format!(
            "ppa_host_vcpu_used_seconds {}",
            secs(total(|s| s.vcpus.iter().map(|v| v.used_ns).sum()))
        )],
    );
    fam(
        "ppa_host_vcpu_steal_seconds",
        "gauge",
        "Sum of the answering VMs' vCPU steal time.",
        vec![format!(
            "ppa_host_vcpu_steal_seconds {}",
            secs(total(|s| s.vcpus.iter().map(|v| v.steal_ns).sum()))
        )],
    );
    fam(
        "ppa_host_vmm_threads_seconds",
        "gauge",
        "Sum of the answering VMMs' non-vCPU thread CPU time.",
        vec![format!(
            "ppa_host_vmm_threads_seconds {}",
            secs(total(|s| s.vm.host_threads_ns))
        )],
    );
    let per_vcpu = |f: &dyn Fn(&str, usize, &ppa_vmm_api::VcpuSummary) -> String| -> Vec<String> {
        answered
            .iter()
            .flat_map(|(name, s)| s.vcpus.iter().map(move |v| f(name, v.id, v)))
            .collect()
    };
    if compat.contains(&Compat::Kubevirt) {
        fam(
            "kubevirt_vmi_vcpu_seconds_total",
            "counter",
            "Total amount of time spent in each state by each vcpu (PPA-VMM: state running is used_ns, exact).",
            per_vcpu(&|n, id, v| {
                format!(
                    "kubevirt_vmi_vcpu_seconds_total{{name=\"{}\",namespace=\"\",id=\"{id}\",state=\"running\"}} {}",
                    esc(n),
                    secs(v.used_ns)
                )
            }),
        );
        fam(
            "kubevirt_vmi_vcpu_delay_seconds_total",
            "counter",
            "Time the vCPU was enqueued by the host scheduler but could not run (PPA-VMM: steal_ns).",
            per_vcpu(&|n, id, v| {
                format!(
                    "kubevirt_vmi_vcpu_delay_seconds_total{{name=\"{}\",namespace=\"\",id=\"{id}\"}} {}",
                    esc(n),
                    secs(v.steal_ns)
                )
            }),
        );
    }
    if compat.contains(&Compat::Libvirt) {
        fam(
            "libvirt_domain_vcpu_time_seconds_total",
            "counter",
            "Amount of CPU time used by the domain's VCPU (PPA-VMM: used_ns).",
            per_vcpu(&|n, id, v| {
                format!(
                    "libvirt_domain_vcpu_time_seconds_total{{domain=\"{}\",vcpu=\"{id}\"}} {}",
                    esc(n),
                    secs(v.used_ns)
                )
            }),
        );
        fam(
            "libvirt_domain_vcpu_delay_seconds_total",
            "counter",
            "Time the VCPU waited in the host's run queue (PPA-VMM: steal_ns).",
            per_vcpu(&|n, id, v| {
                format!(
                    "libvirt_domain_vcpu_delay_seconds_total{{domain=\"{}\",vcpu=\"{id}\"}} {}",
                    esc(n),
                    secs(v.steal_ns)
                )
            }),
        );
    }
    s
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

fn respond(mut s: TcpStream, dir: &RunDir, compat: &[Compat], timeout: Duration) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(10)));
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let first = String::from_utf8_lossy(&head);
    let target = first.lines().next().unwrap_or("").split(' ').nth(1);
    let get = first.starts_with("GET ");
    let (status, kind, body) = match (get, target) {
        (true, Some("/metrics")) => match scrape(dir, compat, timeout) {
            Ok(text) => ("200 OK", "text/plain; version=0.0.4; charset=utf-8", text),
            Err(e) => ("500 Internal Server Error", "text/plain", e + "\n"),
        },
        _ => (
            "404 Not Found",
            "text/plain",
            "only GET /metrics is served here\n".into(),
        ),
    };
    let _ = write!(
        s,
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
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
    let busy = Arc::new(AtomicUsize::new(0));
    let timeout = Duration::from_millis(opts.scrape_timeout_ms);
    for conn in listener.incoming() {
        let Ok(mut s) = conn else { continue };
        if busy.fetch_add(1, Ordering::AcqRel) >= MAX_CONNS {
            busy.fetch_sub(1, Ordering::AcqRel);
            let _ = s.write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            continue;
        }
        let (dir, compat, busy2) = (dir.clone(), opts.compat.clone(), Arc::clone(&busy));
        let spawned = std::thread::Builder::new()
            .name("host-scrape".into())
            .spawn(move || {
                respond(s, &dir, &compat, timeout);
                busy2.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            busy.fetch_sub(1, Ordering::AcqRel);
        }
    }
    0
}
