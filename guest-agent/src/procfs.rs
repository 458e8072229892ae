//! Parsers for the text the agent reads from /proc, as pure functions over bytes: a thread's
//! `stat`, `schedstat` and `status`, and the system-wide `/proc/stat`, `/proc/softirqs`,
//! `/proc/interrupts` and `/proc/schedstat`.
//!
//! Data flow: the collector preads a file into a buffer it keeps and hands the bytes here; a
//! parser returns the fields the agent publishes or `None` for text it does not understand
//! (the collector then treats the thread as gone or the figure as unavailable). Nothing here
//! touches the file system, so every format quirk (a `comm` with spaces and parentheses, a
//! missing column) is unit-tested.

use ppa_guest_abi::ppa_page::{COMM_LEN, SOFTIRQ_KINDS};

/// The fields of `/proc/<pid>/task/<tid>/stat` the agent uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TaskStat {
    /// The thread's name, sanitised ([`comm`]).
    pub comm: [u8; COMM_LEN],
    /// State letter (`R`, `S`, `D`, ...).
    pub state: u8,
    /// `PF_*` flags (field 9).
    pub flags: u32,
    /// User time, clock ticks (field 14).
    pub utime: u64,
    /// System time, clock ticks (field 15).
    pub stime: u64,
    /// Waited-for children's user time, clock ticks (field 16; the process's).
    pub cutime: u64,
    /// Waited-for children's system time, clock ticks (field 17).
    pub cstime: u64,
    /// CPU it last ran on (field 39).
    pub processor: u32,
    /// Block I/O delay, clock ticks (field 42; 0 unless delay accounting is on).
    pub blkio_ticks: u64,
}

/// `PF_KTHREAD`: the thread is a kernel thread.
pub const PF_KTHREAD: u32 = 0x0020_0000;

/// `PF_EXITING`: the thread is in `do_exit` (set before its taskstats exit notification is
/// sent, so a task with it may already have been notified).
pub const PF_EXITING: u32 = 0x0000_0004;

impl TaskStat {
    /// The task has ended or is ending: a zombie, dead, or past the start of `do_exit`. Its
    /// figures are (nearly) final and belong to its exit, not to a live thread.
    pub fn ending(&self) -> bool {
        matches!(self.state, b'Z' | b'X') || self.flags & PF_EXITING != 0
    }
}

/// A name as the agent publishes it: at most [`COMM_LEN`] bytes of UTF-8 (cut at a character
/// boundary), NUL-padded, with control characters and invalid bytes replaced by `?`, so that
/// what a guest names its threads never reads as a malformed record.
pub fn comm(raw: &[u8]) -> [u8; COMM_LEN] {
    let mut out = [0u8; COMM_LEN];
    let mut len = 0;
    for chunk in raw.utf8_chunks() {
        let valid = chunk.valid().chars();
        let bad = (!chunk.invalid().is_empty()).then_some('?');
        for c in valid.chain(bad) {
            let c = if c.is_control() { '?' } else { c };
            let mut buf = [0u8; 4];
            let bytes = c.encode_utf8(&mut buf).as_bytes();
            if len + bytes.len() > COMM_LEN {
                return out;
            }
            out[len..len + bytes.len()].copy_from_slice(bytes);
            len += bytes.len();
        }
    }
    out
}

/// Parses a task's `stat` line. The name sits between the first `(` and the last `)`: it
/// may itself hold spaces and parentheses, never after the last `)`.
pub fn task_stat(buf: &[u8]) -> Option<TaskStat> {
    let open = buf.iter().position(|&b| b == b'(')?;
    let close = buf.iter().rposition(|&b| b == b')')?;
    if close < open {
        return None;
    }
    // Field 3 (the state) is the first word after the name: field N is word N - 3.
    let mut words = buf[close + 1..]
        .split(|b| b.is_ascii_whitespace())
        .filter(|w| !w.is_empty());
    let state = *words.next()?.first()?;
    let mut at = 3;
    let mut next = |field: usize| -> Option<u64> {
        let w = words.nth(field - at - 1)?;
        at = field;
        number(w)
    };
    let flags = next(9)? as u32;
    let utime = next(14)?;
    let stime = next(15)?;
    let cutime = next(16)?;
    let cstime = next(17)?;
    let processor = next(39)? as u32;
    // Field 42 came with Linux 2.6.18; older layouts have none.
    let blkio_ticks = next(42).unwrap_or(0);
    Some(TaskStat {
        comm: comm(&buf[open + 1..close]),
        state,
        flags,
        utime,
        stime,
        cutime,
        cstime,
        processor,
        blkio_ticks,
    })
}

/// A decimal number of ASCII digits.
fn number(w: &[u8]) -> Option<u64> {
    if w.is_empty() || w.len() > 20 {
        return None;
    }
    w.iter().try_fold(0u64, |n, &b| {
        b.is_ascii_digit()
            .then(|| n.checked_mul(10)?.checked_add(u64::from(b - b'0')))
            .flatten()
    })
}

/// A thread's `schedstat`: on-CPU ns, run-queue wait ns, timeslices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SchedStat {
    /// Time on a CPU, ns (the scheduler's `sum_exec_runtime`).
    pub on_cpu_ns: u64,
    /// Time runnable but waiting for a CPU, ns.
    pub run_delay_ns: u64,
    /// Times it was put on a CPU.
    pub timeslices: u64,
}

/// Parses `schedstat`: three numbers.
pub fn schedstat(buf: &[u8]) -> Option<SchedStat> {
    let mut it = buf
        .split(|b| b.is_ascii_whitespace())
        .filter(|w| !w.is_empty())
        .map(number);
    Some(SchedStat {
        on_cpu_ns: it.next()??,
        run_delay_ns: it.next()??,
        timeslices: it.next()??,
    })
}

/// The number after `key` at the start of a line of `buf`.
fn keyed(buf: &[u8], key: &[u8]) -> Option<u64> {
    let mut rest = buf;
    loop {
        if let Some(v) = rest.strip_prefix(key) {
            let end = v.iter().position(|&b| b == b'\n').unwrap_or(v.len());
            return number(v[..end].trim_ascii());
        }
        let nl = rest.iter().position(|&b| b == b'\n')?;
        rest = &rest[nl + 1..];
    }
}

/// Voluntary and involuntary context switches from a task's `status` (its last lines).
pub fn switches(buf: &[u8]) -> Option<(u64, u64)> {
    // Both are near the end: start the search at the last 200 bytes' first line.
    let from = buf.len().saturating_sub(200);
    let tail = match buf[..from].iter().rposition(|&b| b == b'\n') {
        Some(nl) => &buf[nl + 1..],
        None => buf,
    };
    let find = |key: &[u8]| keyed(tail, key).or_else(|| keyed(buf, key));
    Some((
        find(b"voluntary_ctxt_switches:")?,
        find(b"nonvoluntary_ctxt_switches:")?,
    ))
}

/// One CPU's line of `/proc/stat`, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuTicks {
    /// CPU number.
    pub cpu: u32,
    /// user, nice, system, idle, iowait, irq, softirq, steal.
    pub ticks: [u64; 8],
}

/// What the agent takes from `/proc/stat`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SystemStat {
    /// Each online CPU.
    pub cpus: Vec<CpuTicks>,
    /// Tasks created since boot (every fork and clone).
    pub processes: u64,
    /// Context switches since boot, all CPUs.
    pub ctxt: u64,
}

/// Parses `/proc/stat`. A CPU line with fewer than 8 numbers (kernels before 2.6.11) counts
/// the missing ones as 0.
pub fn system_stat(buf: &[u8]) -> Option<SystemStat> {
    let s = std::str::from_utf8(buf).ok()?;
    let mut out = SystemStat::default();
    for line in s.lines() {
        let mut w = line.split_ascii_whitespace();
        let Some(key) = w.next() else { continue };
        if let Some(n) = key.strip_prefix("cpu").filter(|n| !n.is_empty()) {
            let cpu = n.parse().ok()?;
            let mut ticks = [0u64; 8];
            for (t, v) in ticks.iter_mut().zip(w) {
                *t = v.parse().ok()?;
            }
            out.cpus.push(CpuTicks { cpu, ticks });
        } else if key == "processes" {
            out.processes = w.next()?.parse().ok()?;
        } else if key == "ctxt" {
            out.ctxt = w.next()?.parse().ok()?;
        }
    }
    (!out.cpus.is_empty()).then_some(out)
}

/// The CPU numbers of a header line such as `CPU0 CPU1 CPU3`.
fn cpu_columns(header: &str) -> Option<Vec<u32>> {
    header
        .split_ascii_whitespace()
        .map(|w| w.strip_prefix("CPU")?.parse().ok())
        .collect()
}

/// Linux's softirq names, in the ABI's order.
const SOFTIRQ_NAMES: [&str; SOFTIRQ_KINDS] = [
    "HI:",
    "TIMER:",
    "NET_TX:",
    "NET_RX:",
    "BLOCK:",
    "IRQ_POLL:",
    "TASKLET:",
    "SCHED:",
    "HRTIMER:",
    "RCU:",
];

/// Parses `/proc/softirqs`: per CPU, the count of each kind (a kind the kernel does not list
/// stays 0; one it lists that the ABI does not know is left out).
pub fn softirqs(buf: &[u8]) -> Option<Vec<(u32, [u64; SOFTIRQ_KINDS])>> {
    let s = std::str::from_utf8(buf).ok()?;
    let mut lines = s.lines();
    let cols = cpu_columns(lines.next()?)?;
    let mut out: Vec<(u32, [u64; SOFTIRQ_KINDS])> =
        cols.iter().map(|&c| (c, [0; SOFTIRQ_KINDS])).collect();
    for line in lines {
        let mut w = line.split_ascii_whitespace();
        let Some(kind) = w
            .next()
            .and_then(|k| SOFTIRQ_NAMES.iter().position(|n| *n == k))
        else {
            continue;
        };
        for (slot, v) in out.iter_mut().zip(w) {
            slot.1[kind] = v.parse().ok()?;
        }
    }
    Some(out)
}

/// Parses `/proc/interrupts`: per CPU, the sum of its column over every row that has a count
/// for each CPU (rows such as `ERR:` and `MIS:` hold one system-wide count and are left out).
pub fn interrupts(buf: &[u8]) -> Option<Vec<(u32, u64)>> {
    let s = std::str::from_utf8(buf).ok()?;
    let mut lines = s.lines();
    let cols = cpu_columns(lines.next()?)?;
    let mut sums = vec![0u64; cols.len()];
    for line in lines {
        let mut w = line.split_ascii_whitespace();
        if !w.next().is_some_and(|l| l.ends_with(':')) {
            continue;
        }
        let counts: Vec<u64> = w.take(cols.len()).map_while(|v| v.parse().ok()).collect();
        if counts.len() == cols.len() {
            for (s, c) in sums.iter_mut().zip(counts) {
                *s = s.wrapping_add(c);
            }
        }
    }
    Some(cols.into_iter().zip(sums).collect())
}

/// Parses `/proc/schedstat` (versions 15 to 17): per CPU, the timeslices run on it (the
/// runqueue's `pcount`, the ninth number of its `cpuN` line): the tasks switched onto it.
pub fn cpu_timeslices(buf: &[u8]) -> Option<Vec<(u32, u64)>> {
    let s = std::str::from_utf8(buf).ok()?;
    let mut lines = s.lines();
    let version: u32 = lines
        .next()?
        .strip_prefix("version ")?
        .trim()
        .parse()
        .ok()?;
    if !(15..=17).contains(&version) {
        return None;
    }
    let mut out = Vec::new();
    for line in lines {
        let mut w = line.split_ascii_whitespace();
        let Some(cpu) = w.next().and_then(|k| k.strip_prefix("cpu")) else {
            continue;
        };
        let cpu = cpu.parse().ok()?;
        out.push((cpu, w.nth(8)?.parse().ok()?));
    }
    Some(out)
}

#[cfg(test)]
mod tests;
