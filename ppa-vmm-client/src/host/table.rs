//! `host top`: esxtop's CPU screen for the host. One row per VM with its CPU over the last
//! interval as percent of one host CPU, summed over its vCPUs as esxtop's VM rows are:
//! USED (vCPU threads on CPU), GUEST (inside KVM_RUN), SYS (in-kernel exit handling, where
//! the host can split it out), RDY (waiting for a host CPU), LMTD (held by a limit), IDLE
//! (halted or parked idle), the VM's pressure (some/full avg10) and DEV (the VMM's other
//! threads: devices and service). `--expand NAME` adds the VM's vCPU rows under it.
//!
//! Data flow: [`super::gather`] takes two `stats` of every VM an interval apart; [`rows`]
//! turns each pair into rates; [`render`] sorts and prints them.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use ppa_vmm_api::{Stats, VcpuSummary};

use super::{gather, Ask, VmView};
use crate::rundir::RunDir;

/// Options of `host top`.
#[derive(Debug, Clone, clap::Args)]
pub struct TopOptions {
    /// The run directory (default /run/ppa-vmm, or $XDG_RUNTIME_DIR/ppa-vmm for others).
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// One screen, then exit.
    #[arg(long)]
    pub once: bool,
    /// This many screens, one per interval, without clearing (for scripts).
    #[arg(long, value_name = "N")]
    pub batch: Option<u64>,
    /// Interval between the samples, ms.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(50..=600_000))]
    pub interval_ms: u64,
    /// Column to sort by (descending): used, guest, rdy, lmtd, idle, some, full, dev, name.
    #[arg(long, default_value = "used")]
    pub sort: String,
    /// Show this VM's vCPUs under its row.
    #[arg(long, value_name = "NAME")]
    pub expand: Vec<String>,
    /// How long to give every VM to answer, ms.
    #[arg(long, default_value_t = 800)]
    pub timeout_ms: u64,
}

/// One row: a VM or one of its vCPUs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Row {
    /// `NAME` or `NAME/vCPU`.
    pub name: String,
    /// vCPUs (1 for a vCPU row).
    pub vcpus: usize,
    /// Percent of one host CPU over the interval.
    pub used: f64,
    /// Likewise.
    pub guest: f64,
    /// Likewise, where known.
    pub sys: Option<f64>,
    /// Likewise.
    pub rdy: f64,
    /// Likewise.
    pub lmtd: f64,
    /// Likewise.
    pub idle: f64,
    /// Pressure some avg10, percent (VM rows).
    pub some: Option<f64>,
    /// Pressure full avg10, percent (VM rows).
    pub full: Option<f64>,
    /// The VMM's other threads, percent of one CPU (VM rows).
    pub dev: Option<f64>,
    /// Why a VM has no figures.
    pub error: Option<String>,
}

fn pct(a: u64, b: u64, secs: f64) -> f64 {
    b.saturating_sub(a) as f64 / 1e9 / secs.max(1e-6) * 100.0
}

fn vcpu_row(name: String, a: &VcpuSummary, b: &VcpuSummary, s: f64) -> Row {
    Row {
        name,
        vcpus: 1,
        used: pct(a.used_ns, b.used_ns, s),
        guest: pct(a.guest_ns, b.guest_ns, s),
        sys: a.kvm_ns.zip(b.kvm_ns).map(|(x, y)| pct(x, y, s)),
        rdy: pct(a.steal_ns, b.steal_ns, s),
        lmtd: pct(a.limited_ns, b.limited_ns, s),
        idle: pct(a.idle_ns + a.halted_ns, b.idle_ns + b.halted_ns, s),
        ..Row::default()
    }
}

fn vm_rows(name: &str, a: &Stats, b: &Stats, s: f64, expand: bool) -> Vec<Row> {
    let vcpus: Vec<Row> = a
        .vcpus
        .iter()
        .zip(&b.vcpus)
        .map(|(x, y)| vcpu_row(format!("{name}/{}", x.id), x, y, s))
        .collect();
    let sum = |f: fn(&Row) -> f64| vcpus.iter().map(f).sum::<f64>();
    let sys = vcpus.iter().map(|r| r.sys).sum::<Option<f64>>();
    let mut out = vec![Row {
        name: name.to_string(),
        vcpus: b.vm.vcpus,
        used: sum(|r| r.used),
        guest: sum(|r| r.guest),
        sys,
        rdy: sum(|r| r.rdy),
        lmtd: sum(|r| r.lmtd),
        idle: sum(|r| r.idle),
        some: Some(b.vm.pressure.some.avg10),
        full: Some(b.vm.pressure.full.avg10),
        dev: Some(pct(a.vm.host_threads_ns, b.vm.host_threads_ns, s)),
        error: None,
    }];
    if expand {
        out.extend(vcpus);
    }
    out
}

/// Rows of every VM (and the vCPUs of those in `expand`), in sort order.
pub fn rows(views: &[VmView], expand: &[String], sort: &str) -> Vec<Vec<Row>> {
    let mut groups: Vec<Vec<Row>> = views
        .iter()
        .map(|v| {
            let name = &v.descriptor.name;
            match &v.answer {
                Ok(a) => match a.stats.as_slice() {
                    [x, y] => vm_rows(name, x, y, a.interval_s, expand.contains(name)),
                    _ => vec![Row {
                        name: name.clone(),
                        error: Some("one sample only".into()),
                        ..Row::default()
                    }],
                },
                Err(e) => vec![Row {
                    name: name.clone(),
                    vcpus: v.descriptor.vcpus,
                    error: Some(crate::describe(e)),
                    ..Row::default()
                }],
            }
        })
        .collect();
    let key = |r: &Row| -> f64 {
        match sort {
            "guest" => r.guest,
            "rdy" => r.rdy,
            "lmtd" => r.lmtd,
            "idle" => r.idle,
            "some" => r.some.unwrap_or(0.0),
            "full" => r.full.unwrap_or(0.0),
            "dev" => r.dev.unwrap_or(0.0),
            _ => r.used,
        }
    };
    if sort == "name" {
        groups.sort_by(|a, b| a[0].name.cmp(&b[0].name));
    } else {
        groups.sort_by(|a, b| {
            key(&b[0])
                .total_cmp(&key(&a[0]))
                .then(a[0].name.cmp(&b[0].name))
        });
    }
    groups
}

/// The screen.
pub fn render(groups: &[Vec<Row>], interval_s: f64) -> String {
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.1}"));
    let mut s = format!(
        "ppa-vmm host top - {} VMs, interval {interval_s:.1} s, percent of one host CPU\n\n\
         {:<28} {:>5} {:>7} {:>7} {:>6} {:>6} {:>6} {:>7} {:>6} {:>6} {:>6}\n",
        groups.len(),
        "NAME",
        "VCPUS",
        "USED%",
        "GUEST%",
        "SYS%",
        "RDY%",
        "LMTD%",
        "IDLE%",
        "SOME%",
        "FULL%",
        "DEV%"
    );
    for r in groups.iter().flatten() {
        if let Some(e) = &r.error {
            let _ = writeln!(s, "{:<28} {:>5}  ({e})", r.name, r.vcpus);
            continue;
        }
        let _ = writeln!(
            s,
            "{:<28} {:>5} {:>7.1} {:>7.1} {:>6} {:>6.1} {:>6.1} {:>7.1} {:>6} {:>6} {:>6}",
            r.name,
            r.vcpus,
            r.used,
            r.guest,
            opt(r.sys),
            r.rdy,
            r.lmtd,
            r.idle,
            opt(r.some),
            opt(r.full),
            opt(r.dev)
        );
    }
    s
}

/// Runs `host top`: 0, or 2 when the run directory cannot be used.
pub fn run(opts: TopOptions) -> i32 {
    let dir = match RunDir::open(opts.run_dir.as_deref(), false) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("ppa-vmm: error: {}", crate::describe(&e));
            return 2;
        }
    };
    let screens = if opts.once { Some(1) } else { opts.batch };
    let interval = Duration::from_millis(opts.interval_ms);
    let mut shown = 0u64;
    loop {
        let scan = match dir.scan() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("ppa-vmm: error: {}", crate::describe(&e));
                return 2;
            }
        };
        let views = gather(
            &scan,
            Ask {
                interval: Some(interval),
                metrics: false,
                timeout: Duration::from_millis(opts.timeout_ms),
            },
        );
        let mut text = render(
            &rows(&views, &opts.expand, &opts.sort),
            interval.as_secs_f64(),
        );
        for n in super::scan_notes(&scan) {
            text.push_str(&n);
            text.push('\n');
        }
        if screens.is_none() {
            print!("\x1b[H\x1b[2J");
        }
        println!("{text}");
        shown += 1;
        if screens.is_some_and(|n| shown >= n) {
            return 0;
        }
    }
}
