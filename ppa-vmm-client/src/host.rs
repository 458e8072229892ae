//! `ppa-vmm host`: every VM on the host in one view (spec section 11). `host list` prints
//! each VM the run directory names, `host top` an esxtop-like screen with one row per VM,
//! `host serve` one Prometheus endpoint for all of them.
//!
//! Data flow: [`crate::rundir::RunDir::scan`] lists the live VMs (and cleans stale entries);
//! [`gather`] ([`ask`]) asks every VM's control socket at once, from one thread, for what the
//! view needs (`stats`, twice for rates; `metrics` for `serve`), and takes what arrived by one
//! deadline: a VMM that does not answer in time shows as `not-answering` (one that cannot be
//! reached as `unreachable`) and never holds up the others. The host side holds nothing a
//! VMM waits on: each VMM serves its socket from its own thread and its own snapshot.

use std::path::PathBuf;
use std::time::Duration;

use ppa_vmm_api::{Stats, VmState};
use serde::Serialize;

use crate::rundir::{RunDir, Scan};

pub mod ask;
pub mod serve;
pub mod table;

pub use ask::{gather, Answer, Ask, AskError, VmView};

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
    /// How long to give every VM to answer, ms (the interval comes on top).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub timeout_ms: u64,
    /// Time between the two samples that give host CPU now, ms.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub interval_ms: u64,
}

/// Where a VM of `host list` stands: its own state, or why it gave none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum ListState {
    /// It answered: its state.
    Vm(VmState),
    /// It did not.
    Missing(Missing),
}

/// Why a VM of `host list` gave no state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Missing {
    /// Its socket could not be reached, or it answered wrongly.
    Unreachable,
    /// It was reached but did not answer by the deadline.
    NotAnswering,
}

impl ListState {
    /// The state as `host list` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            ListState::Vm(s) => s.as_str(),
            ListState::Missing(Missing::Unreachable) => "unreachable",
            ListState::Missing(Missing::NotAnswering) => "not-answering",
        }
    }
}

/// One row of `host list --json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ListRow {
    /// The VM's name.
    pub name: String,
    /// The VMM's pid.
    pub pid: u32,
    /// Its state (`running`, `paused`, ...; `unreachable` when it could not be reached,
    /// `not-answering` when it did not answer in time).
    pub state: ListState,
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
                state: ListState::Missing(Missing::Unreachable),
                vcpus: d.vcpus,
                uptime_ns: 0,
                socket: d.socket.clone(),
                cpu_percent: None,
                error: None,
            };
            match &v.answer {
                Ok(a) => {
                    if let Some(last) = a.stats.last() {
                        row.state = ListState::Vm(last.vm.state);
                        row.vcpus = last.vm.vcpus;
                        row.uptime_ns = last.vm.uptime_ns;
                    }
                    if let [first, second] = a.stats.as_slice() {
                        let d = cpu_ns(second).saturating_sub(cpu_ns(first)) as f64;
                        row.cpu_percent =
                            Some((d / 1e9 / a.interval_s.max(1e-6) * 1e4).round() / 100.0);
                    }
                }
                Err(e) => {
                    if e.is_late() {
                        row.state = ListState::Missing(Missing::NotAnswering);
                    }
                    row.error = Some(crate::describe(e));
                }
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
            r.state.as_str(),
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
