//! `ppa-vmm host`: every VM on the host in one view (spec section 11). `host list` prints
//! each VM the run directory names, `host top` an esxtop-like screen with one row per VM,
//! `host serve` one Prometheus endpoint for all of them.
//!
//! Data flow: [`crate::rundir::RunDir::scan`] lists the live VMs (and cleans stale entries);
//! [`gather`] asks every VM's control socket in parallel, one thread per VM, for what the view
//! needs (`stats`, twice for rates; `metrics` for `serve`), and takes what arrived by a
//! deadline: a VMM that does not answer shows as unreachable and never holds up the others.
//! The host side holds nothing a VMM waits on: each VMM serves its socket from its own
//! thread and its own snapshot.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ppa_vmm_api::{Command, Stats};
use serde::Serialize;
use serde_json::Value;

use crate::rundir::{Descriptor, RunDir, Scan};
use crate::Client;

pub mod serve;
pub mod table;

/// `ppa-vmm host`, as clap parses it.
#[derive(Debug, Clone, clap::Args)]
pub struct HostOptions {
    /// What to show.
    #[command(subcommand)]
    pub command: HostCommand,
}

/// The `host` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum HostCommand {
    /// Every VM of the run directory: name, pid, state, vCPUs, uptime, host CPU now.
    List(ListOptions),
    /// esxtop's CPU screen for the host: one row per VM.
    Top(table::TopOptions),
    /// One Prometheus endpoint for every VM of the run directory.
    Serve(serve::ServeOptions),
}

/// Options of `host list`.
#[derive(Debug, Clone, clap::Args)]
pub struct ListOptions {
    /// The run directory (default /run/ppa-vmm, or $XDG_RUNTIME_DIR/ppa-vmm for others).
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// One JSON array instead of the table.
    #[arg(long)]
    pub json: bool,
    /// How long to give every VM to answer, ms.
    #[arg(long, default_value_t = 800, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub timeout_ms: u64,
    /// Time between the two samples that give host CPU now, ms.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub interval_ms: u64,
}

/// What one VM answered.
#[derive(Debug, Clone)]
pub struct Answer {
    /// `stats` at the start and, when asked for, after the interval.
    pub stats: Vec<Stats>,
    /// Seconds between the two `stats`, measured.
    pub interval_s: f64,
    /// The `metrics` text, when asked for.
    pub metrics: Option<String>,
}

/// One VM as the host view sees it.
#[derive(Debug, Clone)]
pub struct VmView {
    /// Its descriptor.
    pub descriptor: Descriptor,
    /// What it answered, or why not.
    pub answer: Result<Answer, String>,
}

/// What [`gather`] asks each VM.
#[derive(Debug, Clone, Copy)]
pub struct Ask {
    /// A second `stats` after this long (rates), or just one.
    pub interval: Option<Duration>,
    /// The `metrics` text too.
    pub metrics: bool,
    /// Deadline for every VM's answer, from the start.
    pub timeout: Duration,
}

fn stats(c: &mut Client) -> Result<Stats, String> {
    let r = c.call(Command::Stats {}).map_err(|e| crate::describe(&e))?;
    let v = r
        .result
        .filter(|_| r.ok)
        .ok_or_else(|| r.error.map_or("refused".into(), |e| e.message))?;
    serde_json::from_value(v).map_err(|e| format!("an answer that is not `stats`: {e}"))
}

fn ask_one(socket: &Path, ask: Ask, deadline: Instant) -> Result<Answer, String> {
    let mut c = Client::connect(socket).map_err(|e| crate::describe(&e))?;
    let left = deadline.saturating_duration_since(Instant::now());
    c.set_read_timeout(Some(left.max(Duration::from_millis(1))))
        .map_err(|e| crate::describe(&e))?;
    let t0 = Instant::now();
    let mut out = vec![stats(&mut c)?];
    let metrics = if ask.metrics {
        let r = c
            .call(Command::Metrics {})
            .map_err(|e| crate::describe(&e))?;
        match r.result {
            Some(Value::String(s)) if r.ok => Some(s),
            _ => return Err("the VMM did not give its metrics".into()),
        }
    } else {
        None
    };
    let mut interval_s = 0.0;
    if let Some(i) = ask.interval {
        std::thread::sleep(i.saturating_sub(t0.elapsed()));
        let t1 = Instant::now();
        out.push(stats(&mut c)?);
        interval_s = (t1 - t0).as_secs_f64();
    }
    Ok(Answer {
        stats: out,
        interval_s,
        metrics,
    })
}

/// Asks every VM of `scan` in parallel; what has not arrived by the deadline is an error.
pub fn gather(scan: &Scan, ask: Ask) -> Vec<VmView> {
    let start = Instant::now();
    let deadline = start + ask.timeout + ask.interval.unwrap_or_default();
    let (tx, rx) = mpsc::channel();
    for (i, e) in scan.vms.iter().enumerate() {
        let (to_thread, on_failure) = (tx.clone(), tx.clone());
        let socket = e.descriptor.socket.clone();
        let spawned = std::thread::Builder::new()
            .name("host-ask".into())
            .spawn(move || {
                let r = match socket {
                    Some(s) => ask_one(&s, ask, deadline),
                    None => Err("the VM has no control socket".into()),
                };
                let _ = to_thread.send((i, r));
            });
        if spawned.is_err() {
            let _ = on_failure.send((i, Err("could not start a thread to ask it".into())));
        }
    }
    drop(tx);
    let mut answers: Vec<Option<Result<Answer, String>>> = vec![None; scan.vms.len()];
    while let Ok((i, r)) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        answers[i] = Some(r);
    }
    let waited = ask.timeout.as_millis();
    scan.vms
        .iter()
        .zip(answers)
        .map(|(e, a)| VmView {
            descriptor: e.descriptor.clone(),
            answer: a.unwrap_or_else(|| Err(format!("no answer within {waited} ms"))),
        })
        .collect()
}

/// One row of `host list --json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ListRow {
    /// The VM's name.
    pub name: String,
    /// The VMM's pid.
    pub pid: u32,
    /// Its state (`running`, `paused`, ...; `unreachable` when it did not answer).
    pub state: String,
    /// vCPUs.
    pub vcpus: usize,
    /// Uptime, ns (0 when it did not answer).
    pub uptime_ns: u64,
    /// Its control socket.
    pub socket: Option<PathBuf>,
    /// Host CPU of the whole VMM over the interval, percent of one CPU (vCPU threads and
    /// the others).
    pub cpu_percent: Option<f64>,
    /// Why it did not answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Host CPU of the VMM between two `stats`, ns: every vCPU's used time and the other threads'.
pub fn cpu_ns(s: &Stats) -> u64 {
    s.vcpus.iter().map(|v| v.used_ns).sum::<u64>() + s.vm.host_threads_ns
}

/// The rows of `host list`.
pub fn list_rows(views: &[VmView]) -> Vec<ListRow> {
    views
        .iter()
        .map(|v| {
            let d = &v.descriptor;
            let mut row = ListRow {
                name: d.name.clone(),
                pid: d.pid,
                state: "unreachable".into(),
                vcpus: d.vcpus,
                uptime_ns: 0,
                socket: d.socket.clone(),
                cpu_percent: None,
                error: None,
            };
            match &v.answer {
                Ok(a) => {
                    let last = a.stats.last().expect("at least one stats");
                    row.state = last.vm.state.to_string();
                    row.vcpus = last.vm.vcpus;
                    row.uptime_ns = last.vm.uptime_ns;
                    if let [first, second] = a.stats.as_slice() {
                        let d = cpu_ns(second).saturating_sub(cpu_ns(first)) as f64;
                        row.cpu_percent =
                            Some((d / 1e9 / a.interval_s.max(1e-6) * 1e4).round() / 100.0);
                    }
                }
                Err(e) => row.error = Some(e.clone()),
            }
            row
        })
        .collect()
}

/// The table of `host list`.
pub fn list_text(rows: &[ListRow], scan: &Scan) -> String {
    use std::fmt::Write as _;
    let mut s = format!(
        "{:<24} {:>8} {:<12} {:>5} {:>12} {:>8}  SOCKET\n",
        "NAME", "PID", "STATE", "VCPUS", "UPTIME s", "CPU%"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<24} {:>8} {:<12} {:>5} {:>12.1} {:>8}  {}{}",
            r.name,
            r.pid,
            r.state,
            r.vcpus,
            r.uptime_ns as f64 / 1e9,
            r.cpu_percent.map_or("-".into(), |c| format!("{c:.1}")),
            r.socket
                .as_ref()
                .map_or("-".into(), |p| p.display().to_string()),
            r.error
                .as_ref()
                .map_or(String::new(), |e| format!("  ({e})")),
        );
    }
    if scan.foreign > 0 || !scan.removed.is_empty() || scan.unreadable > 0 {
        let _ = writeln!(
            s,
            "({} entries of other users skipped, {} stale entries removed, {} unreadable)",
            scan.foreign,
            scan.removed.len(),
            scan.unreadable
        );
    }
    s
}

/// Runs `host list`: 0, or 2 when the run directory cannot be used.
pub fn list(opts: ListOptions) -> i32 {
    let scan = match RunDir::open(opts.run_dir.as_deref(), false).and_then(|d| d.scan()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ppa-vmm: error: {}", crate::describe(&e));
            return 2;
        }
    };
    let views = gather(
        &scan,
        Ask {
            interval: (opts.interval_ms > 0).then(|| Duration::from_millis(opts.interval_ms)),
            metrics: false,
            timeout: Duration::from_millis(opts.timeout_ms),
        },
    );
    let rows = list_rows(&views);
    if opts.json {
        println!(
            "{}",
            serde_json::to_string(&rows).unwrap_or_else(|_| "[]".into())
        );
    } else {
        print!("{}", list_text(&rows, &scan));
    }
    0
}

/// Runs `ppa-vmm host`.
pub fn run(opts: HostOptions) -> i32 {
    match opts.command {
        HostCommand::List(o) => list(o),
        HostCommand::Top(o) => table::run(o),
        HostCommand::Serve(o) => serve::run(o),
    }
}

#[cfg(test)]
mod tests;
