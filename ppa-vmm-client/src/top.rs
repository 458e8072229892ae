//! `ppa-vmm top`: an esxtop-like view of a running VM, one row per vCPU and a VM total.
//!
//! Data flow: [`run`] takes a `stats` sample through a [`Client`], sleeps an interval, takes
//! another; [`rows`] turns the two samples into per-vCPU rates over the interval (deltas of
//! the counters, never the absolute counters), [`total`] adds them up, and [`render`] makes
//! the table. Each refresh uses the previous sample as its baseline, so after a `reset` (a
//! counter went down) a row shows `-` once and is right again at the next refresh.
//!
//! Percentages are of one host CPU: a busy 4-vCPU VM shows up to 400 % on its total line.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::PathBuf;
use std::time::Duration;

use ppa_vmm_api::{Command, Stats, VcpuSummary, VmState, VmStats};
use thiserror::Error;

use crate::{describe, kind_name, Client};

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
    /// GUEST%: on-CPU inside KVM_RUN.
    #[value(aliases = ["guest%", "guest/s"])]
    Guest,
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
    /// The rates; `None` (shown as `-`) after a reset or when no time passed.
    pub rates: Option<Rates>,
}

/// Rates of one vCPU between two of its samples; `Err(true)` after a reset, `Err(false)` when
/// no time passed.
fn vcpu_rates(p: &VcpuSummary, c: &VcpuSummary) -> Result<Rates, bool> {
    let (before, now) = (p.split(), c.split());
    if now.went_down_from(&before) || c.parks < p.parks {
        return Err(true);
    }
    let mut exits = BTreeMap::new();
    for (reason, before) in &p.exits {
        if c.exits.get(reason).copied().unwrap_or(0) < *before {
            return Err(true);
        }
    }
    for (reason, now) in &c.exits {
        let d = now - p.exits.get(reason).copied().unwrap_or(0);
        if d > 0 {
            exits.insert(reason.clone(), d);
        }
    }
    let d = now.since(&before);
    let dt = d.wall_ns;
    if dt == 0 {
        return Err(false);
    }
    let pct = |ns: u64| ns as f64 * 100.0 / dt as f64;
    Ok(Rates {
        used_pct: pct(d.used_ns),
        guest_pct: pct(d.guest_ns),
        vmm_pct: pct(d.vmm_ns),
        rdy_pct: pct(d.steal_ns),
        idle_pct: pct(d.idle_ns + d.halted_ns),
        lmtd_pct: pct(d.limited_ns),
        psd_pct: pct(d.paused_ns),
        exits_per_s: exits.values().sum::<u64>() as f64 * 1e9 / dt as f64,
        exits,
    })
}

/// One row per vCPU present in both samples (in vCPU order), with its rates over the
/// interval between them (each vCPU's own `wall_ns` delta).
pub fn rows(prev: &Stats, cur: &Stats) -> Vec<Row> {
    let mut out: Vec<Row> = cur
        .vcpus
        .iter()
        .filter_map(|c| {
            let p = prev.vcpus.iter().find(|p| p.id == c.id)?;
            let (reset, rates) = match vcpu_rates(p, c) {
                Ok(r) => (false, Some(r)),
                Err(reset) => (reset, None),
            };
            Some(Row {
                vcpu: Some(c.id),
                tid: c.host_tid,
                reset,
                rates,
            })
        })
        .collect();
    out.sort_by_key(|r| r.vcpu);
    out
}

/// The VM total: the sum of the vCPU rows (percentages of one CPU add up). Without rates when
/// any vCPU row has none, rather than a total that leaves a vCPU out.
pub fn total(rows: &[Row]) -> Row {
    let reset = rows.iter().any(|r| r.reset);
    let rates = rows
        .iter()
        .try_fold(Rates::default(), |mut t, r| {
            let r = r.rates.as_ref()?;
            t.used_pct += r.used_pct;
            t.guest_pct += r.guest_pct;
            t.vmm_pct += r.vmm_pct;
            t.rdy_pct += r.rdy_pct;
            t.idle_pct += r.idle_pct;
            t.lmtd_pct += r.lmtd_pct;
            t.psd_pct += r.psd_pct;
            t.exits_per_s += r.exits_per_s;
            for (reason, n) in &r.exits {
                *t.exits.entry(reason.clone()).or_insert(0) += n;
            }
            Some(t)
        })
        .filter(|_| !rows.is_empty());
    Row {
        vcpu: None,
        tid: 0,
        reset,
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
const COLUMNS: [(&str, usize); 11] = [
    ("VCPU", 4),
    ("TID", 8),
    ("USED%", 7),
    ("GUEST%", 7),
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
            for v in [
                r.used_pct,
                r.guest_pct,
                r.vmm_pct,
                r.rdy_pct,
                r.idle_pct,
                r.lmtd_pct,
                r.psd_pct,
                r.exits_per_s,
            ] {
                c.push(format!("{v:.1}"));
            }
            c.push(r.top_exit().unwrap_or("-").to_string());
        }
        None => {
            c.extend(std::iter::repeat_n("-".to_string(), 8));
            c.push(if row.reset { "(reset)" } else { "-" }.to_string());
        }
    }
    c
}

/// The table: a header line about the VM, the column headers, the vCPU rows sorted by
/// `sort`, and the total line.
pub fn render(rows: &[Row], total: &Row, header: &VmStats, sort: SortKey) -> String {
    let mut s = format!(
        "ppa-vmm top - vm {}  state {}  level {}  uptime {:.3} s  vcpus {}\n\n",
        header.name,
        header.state,
        header.level,
        header.uptime_ns as f64 / 1e9,
        header.vcpus
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
/// `stats`, 2 on a usage or connection error.
pub fn run(opts: TopOptions) -> i32 {
    run_to(opts, &mut io::stdout().lock(), &mut io::stderr().lock())
}

/// [`run`] with its streams given (for tests).
pub(crate) fn run_to(opts: TopOptions, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    if opts.interval_ms < MIN_INTERVAL_MS {
        return fail(err, 2, &TopError::Interval(opts.interval_ms).to_string());
    }
    let mut client = match Client::connect(&opts.api_sock) {
        Ok(c) => c,
        Err(e) => return fail(err, 2, &describe(&e)),
    };
    let ended = |out: &mut dyn Write| {
        // The VM is gone either way: a failed write changes nothing.
        let _ = writeln!(out, "The VM has ended (its VMM closed the control socket).");
        0
    };
    let mut prev = match sample(&mut client, err) {
        Ok(s) => s,
        Err(SampleError::Closed) => return ended(out),
        Err(SampleError::Fail(code)) => return code,
    };
    let interval = Duration::from_millis(opts.interval_ms);
    loop {
        std::thread::sleep(interval);
        let cur = match sample(&mut client, err) {
            Ok(s) => s,
            Err(SampleError::Closed) => return ended(out),
            Err(SampleError::Fail(code)) => return code,
        };
        let r = rows(&prev, &cur);
        let table = render(&r, &total(&r), &cur.vm, opts.sort);
        let screen = if opts.once {
            table
        } else {
            format!("{CLEAR}{table}")
        };
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
            return ended(out);
        }
        prev = cur;
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

/// Prints `ppa-vmm top: MESSAGE` to `err` and returns `code`.
fn fail(err: &mut dyn Write, code: i32, message: &str) -> i32 {
    // Nothing more can be done when stderr itself fails.
    let _ = writeln!(err, "{PREFIX}: {message}");
    code
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{stats, vcpu, FakeServer};
    use ppa_vmm_api::Response;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000 * MS;

    fn rates(row: &Row) -> &Rates {
        row.rates.as_ref().expect("the row has rates")
    }

    /// Two samples 1 s apart: vCPU 0 used 250 ms (200 guest, 50 VMM), 100 ms steal, 20 io_out
    /// and 5 hlt exits; vCPU 1 used 900 ms and 1000 mmio_write exits.
    fn samples() -> (Stats, Stats) {
        let p0 = vcpu(0, 10 * S, 4 * S, &[("io_out", 100), ("hlt", 10)]);
        let p1 = vcpu(1, 10 * S, 2 * S, &[("mmio_write", 50)]);
        let mut c0 = vcpu(0, 11 * S, 4 * S + 250 * MS, &[("io_out", 120), ("hlt", 15)]);
        c0.guest_ns = 4 * S + 200 * MS;
        c0.vmm_ns = 50 * MS;
        c0.steal_ns = 100 * MS;
        c0.idle_ns = p0.idle_ns + 600 * MS;
        c0.halted_ns = 50 * MS;
        let c1 = vcpu(1, 11 * S, 2 * S + 900 * MS, &[("mmio_write", 1050)]);
        (stats(&[p0, p1], 10), stats(&[c0, c1], 11))
    }

    #[test]
    fn rates_over_the_interval() {
        let (prev, cur) = samples();
        let r = rows(&prev, &cur);
        assert_eq!(r.len(), 2);
        let a = rates(&r[0]);
        assert_eq!(a.used_pct, 25.0);
        assert_eq!(a.guest_pct, 20.0);
        assert_eq!(a.vmm_pct, 5.0);
        assert_eq!(a.rdy_pct, 10.0);
        assert_eq!(a.idle_pct, 65.0);
        assert_eq!(a.lmtd_pct, 0.0);
        assert_eq!(a.exits_per_s, 25.0);
        assert_eq!(a.top_exit(), Some("io_out"));
        assert_eq!(r[0].tid, 1000);
        let b = rates(&r[1]);
        assert_eq!(b.used_pct, 90.0);
        assert_eq!(b.exits_per_s, 1000.0);
        assert_eq!(b.top_exit(), Some("mmio_write"));

        let t = total(&r);
        assert_eq!(t.vcpu, None);
        let t = rates(&t);
        assert_eq!(t.used_pct, 115.0);
        assert_eq!(t.exits_per_s, 1025.0);
        assert_eq!(t.top_exit(), Some("mmio_write"));
    }

    #[test]
    fn no_exits_and_half_intervals() {
        let prev = stats(&[vcpu(0, S, 0, &[("hlt", 3)])], 1);
        let cur = stats(&[vcpu(0, S + 500 * MS, 125 * MS, &[("hlt", 3)])], 2);
        let r = rows(&prev, &cur);
        assert_eq!(rates(&r[0]).used_pct, 25.0);
        assert_eq!(rates(&r[0]).exits_per_s, 0.0);
        assert_eq!(rates(&r[0]).top_exit(), None);
        // The same sample twice: no time passed, no rates, but no reset either.
        let r = rows(&cur, &cur);
        assert!(r[0].rates.is_none() && !r[0].reset);
    }

    #[test]
    fn a_reset_between_samples_flags_the_row() {
        let (prev, mut cur) = samples();
        // vCPU 1 was reset half a second ago: its counters restarted from zero.
        cur.vcpus[1] = vcpu(1, 500 * MS, 400 * MS, &[("mmio_write", 7)]).into();
        let r = rows(&prev, &cur);
        assert!(!r[0].reset && r[0].rates.is_some());
        assert!(r[1].reset && r[1].rates.is_none());
        let t = total(&r);
        assert!(t.reset && t.rates.is_none());
        // A reset shows only through an exit counter going down.
        let (prev, mut cur) = samples();
        cur.vcpus[0].exits.insert("hlt".into(), 1);
        assert!(rows(&prev, &cur)[0].reset);
        // The next refresh uses the new baseline.
        let mut next = cur.clone();
        next.vcpus[0].wall_ns += S;
        next.vcpus[0].used_ns += 500 * MS;
        next.vcpus[0].idle_ns += 500 * MS;
        let r = rows(&cur, &next);
        assert!(!r[0].reset);
        assert_eq!(rates(&r[0]).used_pct, 50.0);
    }

    #[test]
    fn vcpus_in_one_sample_only_are_left_out() {
        let (prev, mut cur) = samples();
        cur.vcpus.push(vcpu(2, S, S, &[]).into());
        cur.vcpus.swap(0, 2);
        let r = rows(&prev, &cur);
        assert_eq!(
            r.iter().map(|r| r.vcpu).collect::<Vec<_>>(),
            [Some(0), Some(1)]
        );
    }

    /// `top`'s arguments as the binary parses them.
    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        top: TopOptions,
    }

    fn parse(args: &[&str]) -> Result<TopOptions, clap::Error> {
        use clap::Parser;
        let argv = ["top", "--api-sock", "s"].iter().chain(args);
        Cli::try_parse_from(argv).map(|c| c.top)
    }

    #[test]
    fn options_parse_as_documented() {
        let o = parse(&[]).unwrap();
        assert_eq!(
            (o.once, o.interval_ms, o.sort),
            (false, 1000, SortKey::Vcpu)
        );
        let o = parse(&["--once", "--interval", "200", "--sort", "exits"]).unwrap();
        assert_eq!((o.once, o.interval_ms, o.sort), (true, 200, SortKey::Exits));
    }

    #[test]
    fn sort_keys_ignore_case_and_take_the_header_suffix() {
        let sort = |k: &str| parse(&["--sort", k]).map(|o| o.sort);
        assert_eq!(sort("USED").unwrap(), SortKey::Used);
        assert_eq!(sort("rdy%").unwrap(), SortKey::Rdy);
        assert_eq!(sort("Exits/s").unwrap(), SortKey::Exits);
        assert_eq!(sort("LMTD%").unwrap(), SortKey::Lmtd);
        // A name that is no column is refused with the list of columns.
        let e = sort("tid").unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue);
        let msg = e.to_string();
        assert!(msg.contains("'tid'"), "{msg}");
        assert!(
            msg.contains("vcpu, used, guest, vmm, rdy, idle, lmtd, psd, exits"),
            "the columns, and not the aliases: {msg}"
        );
    }

    #[test]
    fn sort_rows_by_each_kind_of_column() {
        let (prev, mut cur) = samples();
        cur.vcpus.push(vcpu(2, S, 0, &[]).into());
        let mut prev = prev;
        prev.vcpus.push(vcpu(2, 0, 0, &[]).into());
        let mut r = rows(&prev, &cur);
        let ids = |r: &[Row]| r.iter().map(|r| r.vcpu.unwrap()).collect::<Vec<_>>();
        sort_rows(&mut r, SortKey::Used);
        assert_eq!(ids(&r), [1, 0, 2]);
        sort_rows(&mut r, SortKey::Rdy);
        assert_eq!(ids(&r), [0, 1, 2]);
        sort_rows(&mut r, SortKey::Idle);
        assert_eq!(ids(&r), [2, 0, 1]);
        sort_rows(&mut r, SortKey::Vcpu);
        assert_eq!(ids(&r), [0, 1, 2]);
        r[0].rates = None;
        sort_rows(&mut r, SortKey::Exits);
        assert_eq!(ids(&r), [1, 2, 0], "rows without rates go last");
    }

    #[test]
    fn render_has_a_line_per_vcpu_and_the_total() {
        let (prev, mut cur) = samples();
        cur.vcpus[1] = vcpu(1, 500 * MS, 400 * MS, &[]).into();
        let r = rows(&prev, &cur);
        let text = render(&r, &total(&r), &cur.vm, SortKey::Used);
        println!("{text}");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2 + 1 + 2 + 1, "{text}");
        assert!(lines[0].contains("vm test") && lines[0].contains("vcpus 2"));
        assert!(lines[0].contains("level full") && lines[0].contains("uptime 11.000 s"));
        assert!(lines[2].starts_with("VCPU") && lines[2].ends_with("TOP-EXIT"));
        assert!(
            lines[3].starts_with("   0") && lines[3].ends_with("io_out"),
            "{text}"
        );
        assert!(
            lines[4].starts_with("   1") && lines[4].ends_with("(reset)"),
            "{text}"
        );
        assert!(lines[5].starts_with("  VM"), "{text}");
        // Columns line up: every header ends where its numbers end.
        let end = lines[2].find("USED%").unwrap() + "USED%".len();
        assert_eq!(&lines[3][end - 4..end], "25.0");
        assert_eq!(&lines[4][end - 1..end], "-");
    }

    #[test]
    fn render_a_four_vcpu_vm() {
        let prev = stats(
            &(0..4)
                .map(|i| vcpu(i, 10 * S, S, &[("io_out", 10)]))
                .collect::<Vec<_>>(),
            10,
        );
        let cur = stats(
            &(0..4)
                .map(|i| {
                    let mut v = vcpu(i, 11 * S, 2 * S, &[("io_out", 10 + 1000 * i as u64)]);
                    v.idle_ns = prev.vcpus[i].idle_ns;
                    v
                })
                .collect::<Vec<_>>(),
            11,
        );
        let r = rows(&prev, &cur);
        let t = total(&r);
        assert_eq!(rates(&t).used_pct, 400.0);
        let text = render(&r, &t, &cur.vm, SortKey::Exits);
        println!("{text}");
        assert_eq!(text.lines().count(), 3 + 4 + 1);
        assert!(text.lines().nth(3).unwrap().starts_with("   3"), "{text}");
    }

    fn top_opts(sock: &std::path::Path, once: bool, interval_ms: u64, sort: SortKey) -> TopOptions {
        TopOptions {
            api_sock: sock.to_path_buf(),
            once,
            interval_ms,
            sort,
        }
    }

    #[test]
    fn run_once_and_until_the_vm_ends() {
        let (prev, cur) = samples();
        let answers = [prev.clone(), cur.clone(), prev, cur];
        let server = FakeServer::start(move |req, n| match answers.get(n) {
            Some(s) => vec![Response::ok(req.id, serde_json::to_value(s).unwrap()).to_line()],
            None => Vec::new(),
        });
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run_to(
            top_opts(server.path(), true, 10, SortKey::Vcpu),
            &mut out,
            &mut err,
        );
        assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
        let text = String::from_utf8_lossy(&out);
        assert!(!text.contains(CLEAR));
        assert_eq!(text.lines().count(), 6, "{text}");

        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run_to(
            top_opts(server.path(), false, 10, SortKey::Used),
            &mut out,
            &mut err,
        );
        assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
        let text = String::from_utf8_lossy(&out);
        assert_eq!(text.matches(CLEAR).count(), 1, "{text}");
        assert!(text.ends_with("The VM has ended (its VMM closed the control socket).\n"));
    }

    #[test]
    fn run_refuses_a_short_interval() {
        let server = FakeServer::start(|_, _| Vec::new());
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert_eq!(
            run_to(
                top_opts(server.path(), true, 5, SortKey::Vcpu),
                &mut out,
                &mut err
            ),
            2
        );
        assert_eq!(
            String::from_utf8_lossy(&err),
            "ppa-vmm top: the interval must be at least 10 ms, not 5 ms\n"
        );
    }
}
