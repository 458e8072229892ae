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
    /// Uptime, ns (`null` when it did not answer: unknown).
    pub uptime_ns: Option<u64>,
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
                uptime_ns: None,
                socket: d.socket.clone(),
                cpu_percent: None,
                error: None,
            };
            match &v.answer {
                Ok(a) => {
                    if let Some(last) = a.stats.last() {
                        row.state = ListState::Vm(last.vm.state);
                        row.vcpus = last.vm.vcpus;
                        row.uptime_ns = Some(last.vm.uptime_ns);
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

/// Columns of `host list`: heading, narrowest width, right-aligned. The last (SOCKET, and
/// why a VM did not answer) is not padded.
const LIST_COLUMNS: [(&str, usize, bool); 6] = [
    ("NAME", 24, false),
    ("PID", 8, true),
    ("STATE", 13, false),
    ("VCPUS", 5, true),
    ("UPTIME s", 12, true),
    ("CPU%", 8, true),
];

/// One row's cells, in [`LIST_COLUMNS`] order, then the unpadded rest.
fn list_cells(r: &ListRow) -> ([String; 6], String) {
    let rest = format!(
        "{}{}",
        r.socket
            .as_ref()
            .map_or("-".into(), |p| p.display().to_string()),
        r.error
            .as_ref()
            .map_or(String::new(), |e| format!("  ({e})")),
    );
    (
        [
            r.name.clone(),
            r.pid.to_string(),
            r.state.as_str().to_string(),
            r.vcpus.to_string(),
            r.uptime_ns
                .map_or("unknown".into(), |u| format!("{:.1}", u as f64 / 1e9)),
            r.cpu_percent.map_or("-".into(), |c| format!("{c:.1}")),
        ],
        rest,
    )
}

/// What a scan did that the list's reader should know: entries skipped or cleaned, and the
/// socket paths of stale entries left alone (one line each).
pub fn scan_notes(scan: &Scan) -> Vec<String> {
    let mut notes = Vec::new();
    if scan.foreign > 0 || !scan.removed.is_empty() || scan.unreadable > 0 {
        notes.push(format!(
            "({} entries of other users skipped, {} stale entries removed, {} unreadable)",
            scan.foreign,
            scan.removed.len(),
            scan.unreadable
        ));
    }
    notes.extend(scan.kept.iter().map(|k| format!("({k})")));
    notes
}

/// The table of `host list`: every column as wide as its widest cell, so that a long name or
/// `not-answering` keeps the rows in line.
pub fn list_text(rows: &[ListRow], scan: &Scan) -> String {
    use std::fmt::Write as _;
    let cells: Vec<([String; 6], String)> = rows.iter().map(list_cells).collect();
    let widths: Vec<usize> = LIST_COLUMNS
        .iter()
        .enumerate()
        .map(|(i, (head, min, _))| {
            cells
                .iter()
                .map(|(c, _)| c[i].chars().count())
                .chain([head.len(), *min])
                .max()
                .unwrap_or(*min)
        })
        .collect();
    let line = |out: &mut String, c: &[String], rest: &str| {
        let padded: Vec<String> = LIST_COLUMNS
            .iter()
            .zip(c.iter().zip(&widths))
            .map(|((_, _, right), (cell, &w))| {
                if *right {
                    format!("{cell:>w$}")
                } else {
                    format!("{cell:<w$}")
                }
            })
            .collect();
        let _ = writeln!(out, "{}  {rest}", padded.join(" "));
    };
    let mut s = String::new();
    let head: Vec<String> = LIST_COLUMNS.iter().map(|c| c.0.to_string()).collect();
    line(&mut s, &head, "SOCKET");
    for (c, rest) in &cells {
        line(&mut s, c, rest);
    }
    for n in scan_notes(scan) {
        let _ = writeln!(s, "{n}");
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
        // stdout keeps the JSON array alone; what the scan skipped goes to stderr.
        for k in &scan.kept {
            eprintln!("ppa-vmm: warn: {k}");
        }
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
