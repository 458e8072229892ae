//! `ppa-vmm top`: an esxtop-like view of a running VM, one row per vCPU and a VM total.
//!
//! Data flow: [`run`] takes a `stats` sample through a [`Client`], sleeps an interval, takes
//! another; [`rows`] turns the two samples into per-vCPU rates over the interval (deltas of
//! the counters, never the absolute counters), [`total`] adds them up, and [`render`] makes
//! the table. Each refresh uses the previous sample as its baseline, so after a `reset` (a
//! counter went down) a row shows `-` once and is right again at the next refresh. A vCPU that
//! had already finished at the start of an interval shows its figures over its whole life,
//! marked `(finished)`, and adds nothing to the total, whose rates are over the interval.
//!
//! `top` also subscribes to `vm-exit`: when the VMM closes the connection it tells the VM's end
//! (exit 0) from a VMM that was killed or crashed ([`crate::EXIT_VMM_LOST`]). With a PPA page,
//! each refresh also asks `guest` and adds the guest pane ([`guest`]: the guest's CPUs and
//! busiest threads over the interval, its last alarms, its reset).
//!
//! Percentages are of one host CPU: a busy 4-vCPU VM shows up to 400 % on its total line.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::PathBuf;
use std::time::Duration;

use ppa_vmm_api::{
    Command, EventKind, GuestView, Stats, TimeSplit, VcpuMicroState, VcpuSummary, VmState, VmStats,
};
use thiserror::Error;

use crate::{describe, kind_name, Client, EXIT_VMM_LOST, VMM_LOST};

/// Prefix of every message on stderr.
const PREFIX: &str = "ppa-vmm top";

/// Shortest refresh interval.
pub const MIN_INTERVAL_MS: u64 = 10;

/// ANSI: cursor home, clear screen.
const CLEAR: &str = "\x1b[H\x1b[2J";

/// Why `top` could not run.
#[derive(Debug, Error)]
pub enum TopError {
    /// The refresh interval is too short.
    #[error("the interval must be at least {MIN_INTERVAL_MS} ms, not {0} ms")]
    Interval(u64),
    /// The `stats` result does not have the expected shape.
    #[error("the VMM's `stats` result cannot be read")]
    BadStats(#[source] serde_json::Error),
}

/// Column to sort the vCPU rows by; numeric columns sort descending, vCPU ascending.
///
/// On the command line (`--sort`) case does not matter, and each name may end in `%` or `/s`
/// as the column headers do (hidden aliases: `USED%`, `exits/s`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SortKey {
    /// VCPU: the vCPU index (ascending).
    #[default]
    #[value(aliases = ["vcpu%", "vcpu/s"])]
    Vcpu,
    /// USED%: on-CPU time (guest + VMM).
    #[value(aliases = ["used%", "used/s"])]
    Used,
    /// GUEST%: on-CPU inside KVM_RUN (guest code only where SYS% is measured).
    #[value(aliases = ["guest%", "guest/s"])]
    Guest,
    /// SYS%: on-CPU inside KVM_RUN in KVM's exit handling (kvm_ns), where measured.
    #[value(aliases = ["sys%", "sys/s"])]
    Sys,
    /// VMM%: on-CPU in the VMM outside KVM_RUN.
    #[value(aliases = ["vmm%", "vmm/s"])]
    Vmm,
    /// RDY%: runnable but waiting for a host CPU (steal).
    #[value(aliases = ["rdy%", "rdy/s"])]
    Rdy,
    /// IDLE%: parked at the guest's request or halted.
    #[value(aliases = ["idle%", "idle/s"])]
    Idle,
    /// LMTD%: parked by a CPU limit.
    #[value(aliases = ["lmtd%", "lmtd/s"])]
    Lmtd,
    /// PSD%: parked by an operator's pause.
    #[value(aliases = ["psd%", "psd/s"])]
    Psd,
    /// EXITS/s: userspace exits per second.
    #[value(aliases = ["exits%", "exits/s"])]
    Exits,
}

/// Rates of one vCPU (or the VM) over one interval. Percentages are of one host CPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rates {
    /// On-CPU time (guest + VMM).
    pub used_pct: f64,
    /// On-CPU inside KVM_RUN.
    pub guest_pct: f64,
    /// On-CPU inside KVM_RUN in KVM's exit handling (kvm_ns), where measured over the
    /// whole interval (esxtop's %SYS).
    pub sys_pct: Option<f64>,
    /// On-CPU in the VMM outside KVM_RUN.
    pub vmm_pct: f64,
    /// Runnable but waiting for a host CPU (steal).
    pub rdy_pct: f64,
    /// Idle: parked at the guest's request or halted inside KVM_RUN.
    pub idle_pct: f64,
    /// Parked by a CPU limit.
    pub lmtd_pct: f64,
    /// Parked by an operator's pause.
    pub psd_pct: f64,
    /// Userspace exits per second.
    pub exits_per_s: f64,
    /// Exits in the interval, by reason (reasons with none left out).
    pub exits: BTreeMap<String, u64>,
    /// The wall time the rates are over, ns: the vCPU's own part of the interval (shorter
    /// when it started or ended in it), or its whole life for a finished row.
    pub interval_ns: u64,
}

impl Rates {
    /// The exit reason with the most exits in the interval (the first by name on a tie).
    pub fn top_exit(&self) -> Option<&str> {
        self.exits
            .iter()
            .filter(|(_, n)| **n > 0)
            .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
            .map(|(r, _)| r.as_str())
    }

    /// The value of a numeric sort column (`None` for [`SortKey::Vcpu`]).
    fn key(&self, key: SortKey) -> Option<f64> {
        Some(match key {
            SortKey::Vcpu => return None,
            SortKey::Used => self.used_pct,
            SortKey::Guest => self.guest_pct,
            SortKey::Sys => return self.sys_pct,
            SortKey::Vmm => self.vmm_pct,
            SortKey::Rdy => self.rdy_pct,
            SortKey::Idle => self.idle_pct,
            SortKey::Lmtd => self.lmtd_pct,
            SortKey::Psd => self.psd_pct,
            SortKey::Exits => self.exits_per_s,
        })
    }
}

/// One line of the table: a vCPU, or the VM total.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// vCPU index; `None` on the total line.
    pub vcpu: Option<usize>,
    /// Host thread id (0 on the total line).
    pub tid: i32,
    /// A counter went down between the samples: the figures were reset.
    pub reset: bool,
    /// The vCPU had finished before the interval: the rates are over its whole life, and the
    /// total leaves it out (it used nothing in the interval).
    pub finished: bool,
    /// The rates; `None` (shown as `-`) after a reset or when no time passed.
    pub rates: Option<Rates>,
}

/// What two samples of one vCPU give.
enum VcpuSample {
    /// Rates over the interval.
    Rates(Rates),
    /// The vCPU had finished before the interval: rates over its whole life.
    Finished(Rates),
    /// A counter went down: the figures were reset.
    Reset,
    /// No time passed (the vCPU has not started).
    NoTime,
}

/// Rates over `d`, with `exits` in it (`kvm`: whether d's kvm_ns was measured); `None` when
/// `d` has no wall time.
fn rates_over(d: &TimeSplit, kvm: bool, exits: BTreeMap<String, u64>) -> Option<Rates> {
    let dt = d.wall_ns;
    if dt == 0 {
        return None;
    }
    let pct = |ns: u64| ns as f64 * 100.0 / dt as f64;
    Some(Rates {
        used_pct: pct(d.used_ns),
        guest_pct: pct(d.guest_ns),
        sys_pct: kvm.then(|| pct(d.kvm_ns)),
        vmm_pct: pct(d.vmm_ns),
        rdy_pct: pct(d.steal_ns),
        idle_pct: pct(d.idle_ns + d.halted_ns),
        lmtd_pct: pct(d.limited_ns),
        psd_pct: pct(d.paused_ns),
        exits_per_s: exits.values().sum::<u64>() as f64 * 1e9 / dt as f64,
        exits,
        interval_ns: dt,
    })
}

/// What one vCPU did between two of its samples.
fn vcpu_rates(p: &VcpuSummary, c: &VcpuSummary) -> VcpuSample {
    let (before, now) = (p.split(), c.split());
    if now.went_down_from(&before) || c.parks < p.parks {
        return VcpuSample::Reset;
    }
    let mut exits = BTreeMap::new();
    for (reason, before) in &p.exits {
        if c.exits.get(reason).copied().unwrap_or(0) < *before {
            return VcpuSample::Reset;
        }
    }
    for (reason, now) in &c.exits {
        let d = now - p.exits.get(reason).copied().unwrap_or(0);
        if d > 0 {
            exits.insert(reason.clone(), d);
        }
    }
    let kvm = p.kvm_ns.is_some() && c.kvm_ns.is_some();
    if let Some(r) = rates_over(&now.since(&before), kvm, exits) {
        return VcpuSample::Rates(r);
    }
    if c.state == VcpuMicroState::Finished {
        let all: BTreeMap<String, u64> = c
            .exits
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(r, n)| (r.clone(), *n))
            .collect();
        if let Some(r) = rates_over(&now, c.kvm_ns.is_some(), all) {
            return VcpuSample::Finished(r);
        }
    }
    VcpuSample::NoTime
}

/// One row per vCPU present in both samples (in vCPU order), with its rates over the
/// interval between them (each vCPU's own `wall_ns` delta).
pub fn rows(prev: &Stats, cur: &Stats) -> Vec<Row> {
    let mut out: Vec<Row> = cur
        .vcpus
        .iter()
        .filter_map(|c| {
            let p = prev.vcpus.iter().find(|p| p.id == c.id)?;
            let (reset, finished, rates) = match vcpu_rates(p, c) {
                VcpuSample::Rates(r) => (false, false, Some(r)),
                VcpuSample::Finished(r) => (false, true, Some(r)),
                VcpuSample::Reset => (true, false, None),
                VcpuSample::NoTime => (false, false, None),
            };
            Some(Row {
                vcpu: Some(c.id),
                tid: c.host_tid,
                reset,
                finished,
                rates,
            })
        })
        .collect();
    out.sort_by_key(|r| r.vcpu);
    out
}

/// The VM total over the interval: the vCPU rows added up (percentages of one CPU add up),
/// each weighted by the part of the interval it covers, so that a vCPU that ended during the
/// interval counts for the time it ran. Finished rows add nothing: they used nothing in the
/// interval. Without rates when any other row has none, rather than a total that leaves a
/// vCPU out.
pub fn total(rows: &[Row]) -> Row {
    let reset = rows.iter().any(|r| r.reset);
    let live: Option<Vec<&Rates>> = rows
        .iter()
        .filter(|r| !r.finished)
        .map(|r| r.rates.as_ref())
        .collect();
    let rates = live.filter(|_| !rows.is_empty()).map(|live| {
        let interval = live.iter().map(|r| r.interval_ns).max().unwrap_or(0);
        let mut t = Rates {
            interval_ns: interval,
            // A total of SYS% only where every row has it.
            sys_pct: live.iter().all(|r| r.sys_pct.is_some()).then_some(0.0),
            ..Rates::default()
        };
        for r in live {
            let w = r.interval_ns as f64 / interval.max(1) as f64;
            t.used_pct += r.used_pct * w;
            t.guest_pct += r.guest_pct * w;
            if let (Some(total), Some(sys)) = (t.sys_pct.as_mut(), r.sys_pct) {
                *total += sys * w;
            }
            t.vmm_pct += r.vmm_pct * w;
            t.rdy_pct += r.rdy_pct * w;
            t.idle_pct += r.idle_pct * w;
            t.lmtd_pct += r.lmtd_pct * w;
            t.psd_pct += r.psd_pct * w;
            t.exits_per_s += r.exits_per_s * w;
            for (reason, n) in &r.exits {
                *t.exits.entry(reason.clone()).or_insert(0) += n;
            }
        }
        t
    });
    Row {
        vcpu: None,
        tid: 0,
        reset,
        finished: false,
        rates,
    }
}

/// Orders rows by `key`: numeric columns descending (rows without rates last), then by vCPU.
pub fn sort_rows(rows: &mut [Row], key: SortKey) {
    rows.sort_by(|a, b| {
        let va = a.rates.as_ref().and_then(|r| r.key(key));
        let vb = b.rates.as_ref().and_then(|r| r.key(key));
        let by_value = match (va, vb) {
            (Some(x), Some(y)) => y.partial_cmp(&x).unwrap_or(Ordering::Equal),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        };
        by_value.then_with(|| a.vcpu.cmp(&b.vcpu))
    });
}

/// Column headers and widths (right-aligned, except TOP-EXIT, which is last).
const COLUMNS: [(&str, usize); 12] = [
    ("VCPU", 4),
    ("TID", 8),
    ("USED%", 7),
    ("GUEST%", 7),
    ("SYS%", 7),
    ("VMM%", 7),
    ("RDY%", 7),
    ("IDLE%", 7),
    ("LMTD%", 7),
    ("PSD%", 7),
    ("EXITS/s", 10),
    ("TOP-EXIT", 0),
];

/// One table line from its cells.
fn line(cells: &[String]) -> String {
    let mut s = String::new();
    for (i, (cell, (_, w))) in cells.iter().zip(COLUMNS).enumerate() {
        if i > 0 {
            s.push_str("  ");
        }
        if i + 1 == COLUMNS.len() {
            s.push_str(cell);
        } else {
            let _ = write!(s, "{cell:>w$}");
        }
    }
    s.trim_end().to_string()
}

/// The cells of one row.
fn cells(row: &Row) -> Vec<String> {
    let mut c = vec![
        row.vcpu.map_or_else(|| "VM".to_string(), |v| v.to_string()),
        match (row.vcpu, row.tid) {
            (None, _) | (_, 0) => "-".to_string(),
            (_, tid) => tid.to_string(),
        },
    ];
    match &row.rates {
        Some(r) => {
            c.push(format!("{:.1}", r.used_pct));
            c.push(format!("{:.1}", r.guest_pct));
            c.push(
                r.sys_pct
                    .map_or_else(|| "-".to_string(), |v| format!("{v:.1}")),
            );
            for v in [
                r.vmm_pct,
                r.rdy_pct,
                r.idle_pct,
                r.lmtd_pct,
                r.psd_pct,
                r.exits_per_s,
            ] {
                c.push(format!("{v:.1}"));
            }
            let top = if row.finished {
                "(finished)"
            } else {
                r.top_exit().unwrap_or("-")
            };
            c.push(top.to_string());
        }
        None => {
            c.extend(std::iter::repeat_n("-".to_string(), 9));
            c.push(if row.reset { "(reset)" } else { "-" }.to_string());
        }
    }
    c
}

/// The table: a header line about the VM, the column headers, the vCPU rows sorted by
/// `sort`, and the total line.
pub fn render(rows: &[Row], total: &Row, header: &VmStats, sort: SortKey) -> String {
    let mut s = format!(
        "ppa-vmm top - vm {}  state {}  level {}  uptime {:.3} s  vcpus {}  \
         pressure some {:.2} % full {:.2} % (avg10{})\n\n",
        header.name,
        header.state,
        header.level,
        header.uptime_ns as f64 / 1e9,
        header.vcpus,
        header.pressure.some.avg10,
        header.pressure.full.avg10,
        if header.pressure.estimated {
            ", estimated"
        } else {
            ""
        }
    );
    let titles: Vec<String> = COLUMNS.iter().map(|(t, _)| t.to_string()).collect();
    s.push_str(&line(&titles));
    s.push('\n');
    let mut sorted = rows.to_vec();
    sort_rows(&mut sorted, sort);
    for row in sorted.iter().chain(std::iter::once(total)) {
        s.push_str(&line(&cells(row)));
        s.push('\n');
    }
    s
}

/// Options of `ppa-vmm top`, as clap parses them.
#[derive(Debug, Clone, clap::Args)]
pub struct TopOptions {
    /// The VMM's control socket (`run --api-sock`).
    #[arg(long, value_name = "PATH")]
    pub api_sock: PathBuf,
    /// Print one table and exit.
    #[arg(long)]
    pub once: bool,
    /// Refresh interval in ms (rates are computed over it; at least 10).
    #[arg(long = "interval", default_value_t = 1000, value_name = "MS")]
    pub interval_ms: u64,
    /// Sort column.
    #[arg(
        long,
        value_enum,
        ignore_case = true,
        default_value_t,
        value_name = "COL"
    )]
    pub sort: SortKey,
}

/// Why a sample could not be taken.
enum SampleError {
    /// The VMM closed the connection: the VM ended.
    Closed,
    /// Exit with this code after the message was printed.
    Fail(i32),
}

/// Runs `ppa-vmm top`: 0 when done (`once`, or the VM ended), 1 when the VMM refused
/// `stats`, 2 on a usage or connection error, 3 when the VMM went away without ending the VM
/// (killed or crashed).
pub fn run(opts: TopOptions) -> i32 {
    use std::io::IsTerminal;
    let stdout = io::stdout();
    let screen = if stdout.is_terminal() {
        Screen::Terminal
    } else {
        Screen::Plain
    };
    run_on(opts, &mut stdout.lock(), &mut io::stderr().lock(), screen)
}

/// Where `top` writes its tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Screen {
    /// A terminal: each table replaces the last (the screen is cleared first).
    Terminal,
    /// A pipe or a file: the tables follow each other, a blank line between, with no escape
    /// codes.
    Plain,
}

/// [`run`] with its streams given, on a terminal (for tests).
#[cfg(test)]
pub(crate) fn run_to(opts: TopOptions, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    run_on(opts, out, err, Screen::Terminal)
}

/// [`run`] with its streams and the kind of its stdout given.
pub(crate) fn run_on(
    opts: TopOptions,
    out: &mut dyn Write,
    err: &mut dyn Write,
    screen: Screen,
) -> i32 {
    if opts.interval_ms < MIN_INTERVAL_MS {
        return fail(err, 2, &TopError::Interval(opts.interval_ms).to_string());
    }
    let mut client = match Client::connect(&opts.api_sock) {
        Ok(c) => c,
        Err(e) => return fail(err, 2, &describe(&e)),
    };
    // The vm-exit event, which arrives just before the VMM closes the connection at the VM's
    // end, tells that end from a VMM that was killed.
    match client.call(Command::Subscribe {
        events: vec![EventKind::VmExit],
        pressure: None,
    }) {
        Ok(r) if r.ok => {}
        Ok(r) => {
            let message = match &r.error {
                Some(e) => format!("{}: {}", kind_name(e.kind), e.message),
                None => "the VMM refused `subscribe` without saying why".to_string(),
            };
            return fail(err, 1, &message);
        }
        Err(e) if e.is_closed() => return ended(&client, out, err),
        Err(e) => return fail(err, 2, &describe(&e)),
    }
    let mut prev = match sample(&mut client, err) {
        Ok(s) => s,
        Err(SampleError::Closed) => return ended(&client, out, err),
        Err(SampleError::Fail(code)) => return code,
    };
    let interval = Duration::from_millis(opts.interval_ms);
    let mut first = true;
    // The guest pane: asked while the VM has a page (the first refusal ends it).
    let mut guest_on = true;
    let mut guest_prev: Option<GuestView> = None;
    loop {
        std::thread::sleep(interval);
        let cur = match sample(&mut client, err) {
            Ok(s) => s,
            Err(SampleError::Closed) => return ended(&client, out, err),
            Err(SampleError::Fail(code)) => return code,
        };
        let r = rows(&prev, &cur);
        let mut table = render(&r, &total(&r), &cur.vm, opts.sort);
        table.push_str(&devices::device_rows(&prev, &cur));
        if guest_on {
            match guest_sample(&mut client) {
                Some(g) => {
                    table.push_str(&guest::pane(guest_prev.as_ref(), &g));
                    guest_prev = Some(g);
                }
                None => guest_on = false,
            }
        }
        let screen = match (opts.once, screen, first) {
            (true, _, _) | (false, Screen::Plain, true) => table,
            (false, Screen::Plain, false) => format!("\n{table}"),
            (false, Screen::Terminal, _) => format!("{CLEAR}{table}"),
        };
        first = false;
        if let Err(e) = out.write_all(screen.as_bytes()).and_then(|()| out.flush()) {
            if e.kind() == io::ErrorKind::BrokenPipe {
                return 0;
            }
            return fail(err, 2, &format!("cannot write to stdout: {e}"));
        }
        if opts.once {
            return 0;
        }
        if cur.vm.state == VmState::Finished {
            // The VM's own word that it ended: the connection need not close first.
            let _ = writeln!(out, "The VM has ended.");
            return 0;
        }
        prev = cur;
    }
}

/// The VMM closed the connection: 0 with a line on `out` when the VM ended first (its
/// vm-exit event came), [`EXIT_VMM_LOST`] with a message on `err` when it did not.
fn ended(client: &Client, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    match client.vm_end() {
        Some(end) => {
            // The VM is gone either way: a failed write changes nothing.
            let _ = writeln!(out, "The VM has ended ({end}).");
            0
        }
        None => fail(err, EXIT_VMM_LOST, VMM_LOST),
    }
}

/// One `stats` sample; errors are printed to `err`.
fn sample(client: &mut Client, err: &mut dyn Write) -> Result<Stats, SampleError> {
    let response = match client.call(Command::Stats {}) {
        Ok(r) => r,
        Err(e) if e.is_closed() => return Err(SampleError::Closed),
        Err(e) => return Err(SampleError::Fail(fail(err, 2, &describe(&e)))),
    };
    if !response.ok {
        let message = match &response.error {
            Some(e) => format!("{}: {}", kind_name(e.kind), e.message),
            None => "the VMM refused `stats` without saying why".to_string(),
        };
        return Err(SampleError::Fail(fail(err, 1, &message)));
    }
    serde_json::from_value(response.result.unwrap_or_default())
        .map_err(|e| SampleError::Fail(fail(err, 2, &describe(&TopError::BadStats(e)))))
}

/// One `guest` result, or None when the VM has no PPA page (or the answer is unreadable).
fn guest_sample(client: &mut Client) -> Option<GuestView> {
    let r = client.call(Command::Guest {}).ok().filter(|r| r.ok)?;
    serde_json::from_value(r.result?).ok()
}

/// Prints `ppa-vmm top: MESSAGE` to `err` and returns `code`.
fn fail(err: &mut dyn Write, code: i32, message: &str) -> i32 {
    // Nothing more can be done when stderr itself fails.
    let _ = writeln!(err, "{PREFIX}: {message}");
    code
}

mod devices;
mod guest;

#[cfg(test)]
mod tests;
