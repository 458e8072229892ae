//! Self-monitoring: what the host knows about the VMM process itself, for the `process_*`
//! families (the names every Prometheus client library's process collector uses) and the CPU
//! time of the VMM's threads by kind.
//!
//! Data flow: at each render the exporter calls [`ThreadCpu::read`] (its state lives between
//! renders) and [`ProcessReading::read`], which read `/proc/self` and two clocks; the result
//! is plain data that the renderer turns into samples. Nothing here runs on a vCPU thread.
//!
//! | figure | source |
//! | --- | --- |
//! | CPU time | `CLOCK_PROCESS_CPUTIME_ID` (exact, threads that ended included) |
//! | resident and virtual memory | `/proc/self/statm` (pages) × the page size |
//! | open and maximum fds | entries of `/proc/self/fd`; `RLIMIT_NOFILE` (soft) |
//! | start time | `starttime` of `/proc/self/stat` (ticks after boot) + `btime` of `/proc/stat` |
//! | CPU time per thread kind | each thread's CPU clock ([`ThreadClock::of_tid`]), by its name |
//!
//! A thread's kind comes from its name (`/proc/self/task/TID/comm`), read when the thread is
//! first seen (and again while it has no known name, as a new thread may not be named yet): the
//! process's first thread is `main`; `vcpuN` (and Firecracker's `fc_vcpu N`, the names of
//! `ppa-vmm firecracker`) is `vcpu`; `api` and `api-stats` are `api`;
//! `sampler` and `limiter` are themselves; any other name is `other`. The per-kind sums stay
//! monotonic: the last reading of a thread that has ended (or changed kind) stays in its kind.

use std::collections::HashMap;

use crate::accounting::host::{process_cpu_ns, ThreadClock};

/// What a thread of the VMM does, from its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ThreadKind {
    /// The process's first thread (set-up, the run loop, the final report).
    Main,
    /// A vCPU thread (`vcpuN`).
    Vcpu,
    /// The control socket and metrics endpoint (`api`, `api-stats`).
    Api,
    /// The sampler (`sampler`).
    Sampler,
    /// The CPU limiter (`limiter`).
    Limiter,
    /// A device's queue-pair thread (`net0-qp0`).
    Device,
    /// Any other thread.
    Other,
}

impl ThreadKind {
    /// Every kind, in output order.
    pub const ALL: [ThreadKind; 7] = [
        ThreadKind::Main,
        ThreadKind::Vcpu,
        ThreadKind::Api,
        ThreadKind::Sampler,
        ThreadKind::Limiter,
        ThreadKind::Device,
        ThreadKind::Other,
    ];

    /// The `kind` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ThreadKind::Main => "main",
            ThreadKind::Vcpu => "vcpu",
            ThreadKind::Api => "api",
            ThreadKind::Sampler => "sampler",
            ThreadKind::Limiter => "limiter",
            ThreadKind::Device => "device",
            ThreadKind::Other => "other",
        }
    }

    /// The kind of thread `tid` of process `pid` named `comm`.
    pub fn of(tid: i32, pid: i32, comm: &str) -> ThreadKind {
        let comm = comm.trim_end();
        if tid == pid {
            return ThreadKind::Main;
        }
        match comm {
            "api" | "api-stats" => ThreadKind::Api,
            "sampler" => ThreadKind::Sampler,
            "limiter" => ThreadKind::Limiter,
            c if c
                .strip_prefix("vcpu")
                .or_else(|| c.strip_prefix("fc_vcpu "))
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) =>
            {
                ThreadKind::Vcpu
            }
            c if c.rsplit_once("-qp").is_some_and(|(d, n)| {
                !d.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
            }) =>
            {
                ThreadKind::Device
            }
            _ => ThreadKind::Other,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One thread as last seen: its kind, its CPU time when it got that kind, its latest CPU time.
#[derive(Debug, Clone, Copy)]
struct Seen {
    kind: ThreadKind,
    base_ns: u64,
    last_ns: u64,
}

/// CPU time of the process's threads by kind, kept monotonic across thread ends.
#[derive(Debug, Default)]
pub struct ThreadCpu {
    seen: HashMap<i32, Seen>,
    /// The kind and CPU clock of each thread seen at the last reading.
    clocks: HashMap<i32, (ThreadKind, ThreadClock)>,
    /// CPU time of threads (or thread names) no longer seen, per kind.
    departed: [u64; ThreadKind::ALL.len()],
}

impl ThreadCpu {
    /// Folds in one reading of every live thread: `(tid, kind, CPU ns)`. Returns the CPU time
    /// per kind (in [`ThreadKind::ALL`] order), threads that ended included.
    pub fn update(
        &mut self,
        live: impl IntoIterator<Item = (i32, ThreadKind, u64)>,
    ) -> [u64; ThreadKind::ALL.len()] {
        let mut now: HashMap<i32, Seen> = HashMap::with_capacity(self.seen.len());
        for (tid, kind, ns) in live {
            let seen = match self.seen.remove(&tid) {
                // The clock of a live thread never goes back; a smaller value is a new
                // thread that reuses the tid.
                Some(s) if s.kind == kind && ns >= s.last_ns => Seen { last_ns: ns, ..s },
                Some(s) => {
                    self.departed[s.kind.index()] += s.last_ns - s.base_ns;
                    let base_ns = if ns >= s.last_ns { s.last_ns } else { 0 };
                    Seen {
                        kind,
                        base_ns,
                        last_ns: ns,
                    }
                }
                None => Seen {
                    kind,
                    base_ns: 0,
                    last_ns: ns,
                },
            };
            now.insert(tid, seen);
        }
        for s in self.seen.values() {
            self.departed[s.kind.index()] += s.last_ns - s.base_ns;
        }
        self.seen = now;
        let mut per_kind = self.departed;
        for s in self.seen.values() {
            per_kind[s.kind.index()] += s.last_ns - s.base_ns;
        }
        per_kind
    }

    /// Reads every thread of this process and folds it in (see [`ThreadCpu::update`]); also
    /// returns the number of threads. Per render: one listing of `/proc/self/task` and one
    /// clock read per thread; a thread's name is read when it is first seen and, while it
    /// is `other` (a new thread may not have its name yet), at every render.
    pub fn read(&mut self) -> ([u64; ThreadKind::ALL.len()], u64) {
        let pid = std::process::id() as i32;
        let mut live = Vec::new();
        let mut clocks = HashMap::with_capacity(self.clocks.len());
        if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
            for entry in dir.flatten() {
                let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                    continue;
                };
                let known = self
                    .clocks
                    .remove(&tid)
                    .filter(|(kind, _)| *kind != ThreadKind::Other);
                let (kind, clock) = match known {
                    Some(k) => k,
                    None => {
                        let comm =
                            std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
                        // A thread that ended since the listing has no clock: leave it out.
                        let Ok(clock) = ThreadClock::of_tid(tid) else {
                            continue;
                        };
                        (ThreadKind::of(tid, pid, &comm), clock)
                    }
                };
                let Ok(ns) = clock.read_ns() else {
                    continue;
                };
                clocks.insert(tid, (kind, clock));
                live.push((tid, kind, ns));
            }
        }
        self.clocks = clocks;
        let threads = live.len() as u64;
        (self.update(live), threads)
    }
}

/// One reading of the process (see the module doc for the sources). A figure the host would
/// not give is `None` and its sample is left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessReading {
    /// User + system CPU time of every thread, those that ended included, ns.
    pub cpu_ns: u64,
    /// Resident set size, bytes.
    pub resident_bytes: Option<u64>,
    /// Virtual memory size, bytes.
    pub virtual_bytes: Option<u64>,
    /// Open file descriptors.
    pub open_fds: Option<u64>,
    /// The soft limit on open file descriptors (`None` too when unlimited).
    pub max_fds: Option<u64>,
    /// When the process started, ns since the Unix epoch.
    pub start_time_ns: Option<u64>,
    /// Threads of the process.
    pub threads: u64,
    /// CPU time per thread kind ([`ThreadKind::ALL`] order), ns, threads that ended included.
    pub thread_cpu_ns: [u64; ThreadKind::ALL.len()],
}

impl ProcessReading {
    /// Reads the process now; `threads` keeps the per-kind sums between readings.
    pub fn read(threads: &mut ThreadCpu) -> ProcessReading {
        let (thread_cpu_ns, n) = threads.read();
        let page = page_size();
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        let mut statm = statm.split_whitespace().map(|f| f.parse::<u64>().ok());
        let virtual_pages = statm.next().flatten();
        let resident_pages = statm.next().flatten();
        ProcessReading {
            cpu_ns: process_cpu_ns(),
            resident_bytes: resident_pages.map(|p| p.saturating_mul(page)),
            virtual_bytes: virtual_pages.map(|p| p.saturating_mul(page)),
            open_fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|d| d.count() as u64),
            max_fds: max_fds(),
            start_time_ns: start_time_ns(),
            threads: n,
            thread_cpu_ns,
        }
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p).unwrap_or(4096)
}

fn max_fds() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid, writable rlimit for the call, which writes only into it.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return None;
    }
    (r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// The process start time, ns since the Unix epoch (computed once: it does not change).
fn start_time_ns() -> Option<u64> {
    static START: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *START.get_or_init(|| {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        // SAFETY: sysconf has no preconditions.
        let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok()?;
        start_time_from(&stat, &boot, hz)
    })
}

/// The start time from the texts of `/proc/PID/stat` and `/proc/stat` and the clock tick
/// rate: `btime` seconds plus `starttime` (field 22) ticks, in ns since the epoch.
pub fn start_time_from(stat: &str, proc_stat: &str, hz: u64) -> Option<u64> {
    // The name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    // rest starts at field 3 (state); starttime is field 22.
    let ticks: u64 = rest.split_whitespace().nth(22 - 3)?.parse().ok()?;
    let btime: u64 = proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    if hz == 0 {
        return None;
    }
    let ns = btime
        .checked_mul(1_000_000_000)?
        .checked_add(ticks / hz * 1_000_000_000 + ticks % hz * 1_000_000_000 / hz)?;
    Some(ns)
}
