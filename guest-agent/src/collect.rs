//! Sampling the guest's threads and CPUs, cheaply and precisely, and counting the tasks that
//! exited (PPA requirement 22).
//!
//! Data flow of one [`Collector::sample`]:
//! 1. [`cpus::CpuFiles`] rereads the system-wide files; `/proc/stat`'s fork count says
//!    whether any task was created since the last sample.
//! 2. Each known process's CPU clock (one `clock_gettime`, no file) says whether any of its
//!    threads ran; only those processes' threads are looked at.
//! 3. For each such thread, a pread of its kept-open `schedstat` (on-CPU ns, run delay,
//!    timeslices). A read that fails means the thread is gone.
//! 4. When tasks were created, `/proc` is listed for new processes, and a process whose
//!    `task` directory's link count (2 + its threads) changed is listed for new threads.
//! 5. Exit notifications ([`crate::taskstats`]) are drained: a thread the table knows is
//!    removed with its final CPU time; one it never sampled started and ended between two
//!    samples. Without taskstats, a thread that vanished counts with its last sampled
//!    figures, and the tasks created but never seen are the fork count's growth less the new
//!    threads found (their CPU estimated from their parents' children time, for which the
//!    `stat` of every thread that ran is read).
//!    Every exit also goes to [`linger::Lingering`], which keeps the exited thread's final
//!    record for a few samples.
//! 6. The threads to publish are chosen ([`rank::select`]: most on-CPU time in the
//!    interval first, up to the page's capacity; then, in the room left, the exited threads
//!    still lingering, newest exit first), and only those live ones whose figures moved since
//!    their last full read have their `stat` (state, last CPU, utime/stime split), `status`
//!    (switch counts) and, with delay accounting on, taskstats delay totals reread. A thread
//!    that is not published costs one schedstat read when it ran, nothing when it did not.
//!
//! Nothing here writes anywhere; [`crate::publish`] reads the table and the selection
//! afterwards.

pub mod alarms;
pub mod cpus;
pub mod linger;
pub mod rank;
pub mod reset;
mod types;

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;

use ppa_guest_abi::ppa_page::{GuestCpu, COMM_LEN, DELAY_KINDS};

use crate::procfs::{self, SchedStat, PF_KTHREAD};
use crate::taskstats::{TaskExit, Taskstats};
use alarms::{Occurrence, ThreadWatch};
use cpus::{pread_all, CpuFiles};
use linger::Lingering;
pub use types::{Options, Phases, Totals};

/// One thread as the agent publishes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ThreadInfo {
    /// Thread id.
    pub tid: u32,
    /// Process id.
    pub tgid: u32,
    /// Name.
    pub comm: [u8; COMM_LEN],
    /// State letter.
    pub state: u8,
    /// A kernel thread.
    pub kernel: bool,
    /// CPU it last ran on.
    pub last_cpu: u32,
    /// Scheduler figures.
    pub sched: SchedStat,
    /// User and system time, ns: the kernel's tick-sampled split of `on_cpu_ns`, scaled to
    /// add up to it (0 and 0 until a tick has sampled the thread).
    pub utime_ns: u64,
    /// See `utime_ns`.
    pub stime_ns: u64,
    /// Voluntary and involuntary context switches.
    pub nvcsw: u64,
    /// See `nvcsw`.
    pub nivcsw: u64,
    /// Delay totals, ns, and their counts, by kind: block I/O, swap-in, reclaim, IRQ,
    /// thrashing, compaction, write-protect copy.
    pub delays: [u64; DELAY_KINDS],
    /// See `delays`.
    pub delay_counts: [u64; DELAY_KINDS],
    /// Threshold occurrences: run delay, slice, involuntary switches
    /// ([`alarms::ThreadWatch::over`]).
    pub over: [u64; 3],
    /// On-CPU time in the last interval, ns.
    pub interval_on_cpu_ns: u64,
    /// When the agent learned of its exit (CLOCK_MONOTONIC ns); 0 for a live thread. An
    /// exited thread's figures are final and its state is `X`.
    pub exited_ns: u64,
}

#[derive(Debug)]
struct Thread {
    info: ThreadInfo,
    schedstat: Option<File>,
    stat: Option<File>,
    status: Option<File>,
    ticks: (u64, u64),
    prev_on_cpu: u64,
    /// Its schedstat moved since its stat and status were last read.
    stale: bool,
    /// Its last stat said it is a zombie or in `do_exit` ([`procfs::TaskStat::ending`]).
    ending: bool,
    /// Its thresholds' state.
    watch: ThreadWatch,
    /// The sample whose status read gave `info.nivcsw` (0: never read).
    nivcsw_at: u64,
}

impl Thread {
    fn fds(&self) -> usize {
        [&self.schedstat, &self.stat, &self.status]
            .iter()
            .filter(|f| f.is_some())
            .count()
    }
}

#[derive(Debug)]
struct Process {
    task_dir: Option<File>,
    cpu_ns: Option<u64>,
    tids: Vec<u32>,
    /// Zombie threads its listing shows (counted in its link count, not published).
    zombies: Vec<u32>,
    child_ticks: Option<u64>,
    relist: bool,
}

/// What became of a thread a listing found.
enum Found {
    Added,
    Gone,
    Zombie,
}

/// The thread and process tables and the system-wide files.
#[derive(Debug)]
pub struct Collector {
    procs: HashMap<u32, Process>,
    threads: HashMap<u32, Thread>,
    cpus: CpuFiles,
    taskstats: Option<Taskstats>,
    delayacct: bool,
    forks: Option<u64>,
    fork_balance: i64,
    totals: Totals,
    phases: Phases,
    samples: u64,
    now_ns: u64,
    buf: Vec<u8>,
    tick_ns: u64,
    fd_budget: usize,
    fds: usize,
    opts: Options,
    vanished: Vec<u32>,
    new_found: u64,
    child_ns: u64,
    reaped_ns: u64,
    selected: Vec<u32>,
    lingering: Lingering,
    /// This sample's threshold occurrences, and each CPU's counts and previous record.
    found: Vec<Occurrence>,
    cpu_over: Vec<[u64; 2]>,
    cpu_prev: Vec<Option<GuestCpu>>,
    /// Baselines of the last reset ([`reset`]): each thread's then, each CPU's then.
    bases: HashMap<u32, ThreadInfo>,
    cpu_base: Vec<Option<GuestCpu>>,
}

/// Raises the open-file limit to its hard limit; returns the soft limit now in force.
pub fn raise_nofile() -> usize {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid rlimit for the kernel to fill / read.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
            }
        }
    }
    usize::try_from(r.rlim_cur).unwrap_or(usize::MAX)
}

/// Whether the kernel's delay accounting is on (`kernel.task_delayacct`; a kernel without
/// the switch, before 5.14, has it on unless booted with `nodelayacct`).
pub fn delayacct_on() -> bool {
    match std::fs::read_to_string("/proc/sys/kernel/task_delayacct") {
        Ok(s) => s.trim() == "1",
        Err(_) => std::path::Path::new("/proc/self/task").exists(),
    }
}

fn tids_of(tgid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{tgid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Reads a kept file, or (over the descriptor budget) opens, reads and closes
/// `/proc/<tgid>/task/<tid>/<name>`.
fn read_kept(
    kept: &Option<File>,
    (tgid, tid, name): (u32, u32, &str),
    buf: &mut Vec<u8>,
) -> io::Result<usize> {
    match kept {
        Some(f) => pread_all(f, buf),
        None => pread_all(&File::open(format!("/proc/{tgid}/task/{tid}/{name}"))?, buf),
    }
}

impl Collector {
    /// Opens the system-wide files. `taskstats`: exit notifications, when registered.
    pub fn new(taskstats: Option<Taskstats>, opts: Options) -> io::Result<Collector> {
        let mut buf = vec![0u8; 16 << 10];
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        let tick_ns = 1_000_000_000 / hz;
        let cpus = CpuFiles::open(&mut buf, tick_ns)?;
        let limit = raise_nofile();
        Ok(Collector {
            procs: HashMap::new(),
            threads: HashMap::new(),
            cpus,
            delayacct: delayacct_on(),
            taskstats,
            forks: None,
            fork_balance: 0,
            totals: Totals::default(),
            phases: Phases::default(),
            samples: 0,
            now_ns: 0,
            buf,
            tick_ns,
            fd_budget: limit.saturating_sub(64),
            fds: 0,
            opts,
            vanished: Vec::new(),
            new_found: 0,
            child_ns: 0,
            reaped_ns: 0,
            selected: Vec::new(),
            lingering: Lingering::new(opts.linger),
            found: Vec::new(),
            cpu_over: Vec::new(),
            cpu_prev: Vec::new(),
            bases: HashMap::new(),
            cpu_base: Vec::new(),
        })
    }

    /// Sets how many threads each sample chooses for publication.
    pub fn set_capacity(&mut self, capacity: usize) {
        self.opts.capacity = capacity;
    }

    /// The threads chosen at the last sample, best first (the publisher's order): the live
    /// ones, then the exited ones still lingering. A chosen thread that exited since is
    /// given with its final record.
    pub fn selected(&self) -> impl Iterator<Item = &ThreadInfo> {
        self.selected.iter().filter_map(|tid| {
            self.threads
                .get(tid)
                .map(|t| &t.info)
                .or_else(|| self.lingering.get(*tid))
        })
    }

    /// Exit notifications are on.
    pub fn taskstats(&self) -> bool {
        self.taskstats.is_some()
    }

    /// The descriptor to poll for exit notifications.
    pub fn exit_fd(&self) -> Option<std::os::fd::RawFd> {
        self.taskstats.as_ref().map(Taskstats::exit_fd)
    }

    /// Delay accounting is on (thread delay totals are filled).
    pub fn delayacct(&self) -> bool {
        self.delayacct
    }

    /// Per-CPU context switches are available.
    pub fn cpu_switches(&self) -> bool {
        self.cpus.switches()
    }

    /// Number of CPU records.
    pub fn nr_cpus(&self) -> u32 {
        self.cpus.nr_cpus()
    }

    /// The CPU records filled so far.
    pub fn cpus(&self) -> impl Iterator<Item = &GuestCpu> {
        self.cpus.records().map(|(_, r)| r)
    }

    /// Every thread alive at the last sample.
    pub fn threads(&self) -> impl Iterator<Item = &ThreadInfo> {
        self.threads.values().map(|t| &t.info)
    }

    /// Number of threads alive at the last sample.
    pub fn thread_count(&self) -> usize {
        self.threads.len()
    }

    /// Exits so far.
    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// Where the last sample's time went.
    pub fn phases(&self) -> Phases {
        self.phases
    }

    /// Guest time of the last sample, ns.
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// Handles the exit notifications waiting; the agent calls this whenever the socket is
    /// readable, so the kernel's buffer does not overflow between samples.
    pub fn drain_exits(&mut self) -> io::Result<()> {
        let Some(mut ts) = self.taskstats.take() else {
            return Ok(());
        };
        let mut exits = Vec::new();
        let r = ts.drain(|e| exits.push(e));
        if ts.take_lost() {
            self.totals.exits_lost = true;
        }
        self.taskstats = Some(ts);
        for e in exits {
            self.on_exit(e);
        }
        r.map_err(io::Error::other)
    }

    fn on_exit(&mut self, e: TaskExit) {
        let gone = self.threads.remove(&e.tid);
        let seen = gone.is_some();
        if let Some(t) = &gone {
            self.fds -= t.fds();
        }
        let (last, prev) = gone.map_or((None, 0), |t| (Some(t.info), t.prev_on_cpu));
        self.lingering
            .exited(last.as_ref(), prev, Some(&e), crate::monotonic_ns());
        let since_reset = e.cpu_ns.saturating_sub(self.base_on_cpu(e.tid));
        let t = &mut self.totals;
        t.exited_count += 1;
        t.exited_cpu_ns += since_reset;
        if !seen {
            t.unseen_count += 1;
            t.unseen_cpu_ns += e.cpu_ns;
        }
        if e.group_end {
            t.exited_processes += 1;
            self.procs.remove(&e.tgid);
        } else if let Some(p) = self.procs.get_mut(&e.tgid) {
            p.tids.retain(|&x| x != e.tid);
        }
        if self.opts.log_exits {
            let n = e.comm.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
            eprintln!(
                "ppa-agent: exit tid={} tgid={} comm={} cpu_ns={} sched_cpu_ns={} elapsed_ns={} run_delay_ns={} timeslices={} seen={} process_end={}",
                e.tid,
                e.tgid,
                String::from_utf8_lossy(&e.comm[..n]),
                e.cpu_ns,
                e.sched_cpu_ns,
                e.elapsed_ns,
                e.run_delay_ns,
                e.timeslices,
                if seen { "yes" } else { "no" },
                if e.group_end { "yes" } else { "no" }
            );
        }
    }

    /// Takes one sample.
    pub fn sample(&mut self) -> io::Result<()> {
        let first = self.samples == 0;
        self.samples += 1;
        self.phases = Phases::default();
        let mut t = crate::monotonic_ns();
        self.now_ns = t;
        let mut lap = |slot: &mut u64| {
            let now = crate::monotonic_ns();
            *slot = now - t;
            t = now;
        };
        let forks = self.cpus.sample(&mut self.buf, self.now_ns)?;
        let forked = self.forks.is_none_or(|f| f != forks);
        let fork_delta = forks.saturating_sub(self.forks.unwrap_or(forks));
        self.forks = Some(forks);
        let mut ph = Phases::default();
        lap(&mut ph.system_ns);

        // Processes whose CPU clock moved; those whose clock is gone have ended.
        let mut active = Vec::new();
        let mut ended = Vec::new();
        for (&tgid, p) in self.procs.iter_mut() {
            match crate::clock_ns(crate::process_clock(tgid)) {
                None => ended.push(tgid),
                Some(ns) => {
                    if p.cpu_ns != Some(ns) || p.relist {
                        active.push(tgid);
                    }
                    p.cpu_ns = Some(ns);
                }
            }
        }
        lap(&mut ph.processes_ns);

        self.vanished.clear();
        for &tgid in &ended {
            if let Some(p) = self.procs.get(&tgid) {
                self.vanished.extend_from_slice(&p.tids);
            }
        }
        for &tgid in &active {
            for i in 0.. {
                let Some(tid) = self.procs.get(&tgid).and_then(|p| p.tids.get(i).copied()) else {
                    break;
                };
                if !self.refresh(tid, false, &mut ph) {
                    self.vanished.push(tid);
                    if let Some(p) = self.procs.get_mut(&tgid) {
                        p.relist = true;
                    }
                }
            }
        }
        lap(&mut ph.threads_ns);

        self.new_found = 0;
        if forked || first {
            self.discover(first, &mut ph);
        }
        for p in self.procs.values_mut() {
            p.relist = false;
        }
        lap(&mut ph.discover_ns);

        self.drain_exits()?;
        self.reconcile(&ended, fork_delta, first);
        for th in self.threads.values_mut() {
            th.info.interval_on_cpu_ns = th.info.sched.on_cpu_ns.saturating_sub(th.prev_on_cpu);
            th.prev_on_cpu = th.info.sched.on_cpu_ns;
        }
        lap(&mut ph.exits_ns);
        self.choose(&mut ph);
        self.check_thresholds();
        self.forget_bases();
        lap(&mut ph.details_ns);
        self.phases = ph;
        Ok(())
    }

    /// Chooses the threads to publish and rereads the details of those whose figures moved.
    fn choose(&mut self, ph: &mut Phases) {
        let cands: Vec<(u64, u64, u32)> = self
            .threads
            .values()
            .map(|t| {
                (
                    t.info.interval_on_cpu_ns,
                    t.info.sched.on_cpu_ns,
                    t.info.tid,
                )
            })
            .collect();
        let chosen = rank::select(&cands, self.opts.capacity);
        self.selected.clear();
        for i in chosen {
            let tid = cands[i].2;
            let stale = self.threads.get(&tid).is_some_and(|t| t.stale);
            if stale {
                ph.threads_detailed += 1;
            }
            // One that vanished since its schedstat read is left for the next sample.
            if !stale || self.details(tid) {
                self.selected.push(tid);
            }
        }
        let room = self.opts.capacity.saturating_sub(self.selected.len());
        let threads = &self.threads;
        let kept = self
            .lingering
            .choose(room, |tid| threads.contains_key(&tid));
        self.selected.extend(kept);
    }

    /// Counts what vanished without a notification, and (without taskstats) the tasks that
    /// came and went unseen.
    fn reconcile(&mut self, ended: &[u32], fork_delta: u64, first: bool) {
        self.vanished.sort_unstable();
        self.vanished.dedup();
        let missed = self.taskstats.is_some();
        self.reaped_ns = 0;
        for i in 0..self.vanished.len() {
            let tid = self.vanished[i];
            let Some(t) = self.threads.remove(&tid) else {
                continue; // notified already
            };
            self.fds -= t.fds();
            self.lingering
                .exited(Some(&t.info), t.prev_on_cpu, None, self.now_ns);
            self.totals.exited_count += 1;
            self.totals.exited_cpu_ns +=
                t.info.sched.on_cpu_ns.saturating_sub(self.base_on_cpu(tid));
            if missed {
                self.totals.exits_missed += 1;
            }
            if ended.contains(&t.info.tgid) {
                self.reaped_ns += t.info.sched.on_cpu_ns;
            }
            if let Some(p) = self.procs.get_mut(&t.info.tgid) {
                p.tids.retain(|&x| x != tid);
            }
        }
        for tgid in ended {
            if self.procs.remove(tgid).is_some() {
                self.totals.exited_processes += 1;
            }
        }
        if self.taskstats.is_none() && !first {
            // Tasks created since the last sample that no listing found: they came and went.
            // The balance carries a task created during this sample's listing (found now,
            // counted in the next fork count) to the next sample.
            self.fork_balance += fork_delta as i64 - self.new_found as i64;
            if self.fork_balance > 0 {
                let n = self.fork_balance as u64;
                self.fork_balance = 0;
                // Their CPU: what parents' children time grew by, less the known processes
                // that ended (whose time moves into their parents' when reaped).
                let cpu = self.child_ns.saturating_sub(self.reaped_ns);
                let t = &mut self.totals;
                t.unseen_count += n;
                t.unseen_cpu_ns += cpu;
                t.exited_count += n;
                t.exited_cpu_ns += cpu;
            }
        }
        self.child_ns = 0;
    }

    /// Lists /proc for new processes, and the processes whose thread count changed (or that
    /// lost a thread) for new threads.
    fn discover(&mut self, first: bool, ph: &mut Phases) {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return;
        };
        let mut listed = Vec::new();
        for e in dir.flatten() {
            if let Some(tgid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) {
                listed.push(tgid);
            }
        }
        for tgid in listed {
            let known = match self.procs.get(&tgid) {
                Some(p) => {
                    let links = p.task_dir.as_ref().and_then(|d| d.metadata().ok());
                    let count = links.map(|m| m.nlink().saturating_sub(2) as usize);
                    !(p.relist || count != Some(p.tids.len() + p.zombies.len()))
                }
                None => {
                    let task_dir = File::open(format!("/proc/{tgid}/task")).ok();
                    if task_dir.is_none() {
                        continue; // gone already
                    }
                    self.procs.insert(
                        tgid,
                        Process {
                            task_dir,
                            cpu_ns: crate::clock_ns(crate::process_clock(tgid)),
                            tids: Vec::new(),
                            zombies: Vec::new(),
                            child_ticks: None,
                            relist: true,
                        },
                    );
                    false
                }
            };
            if known {
                continue;
            }
            let listing = tids_of(tgid);
            if let Some(p) = self.procs.get_mut(&tgid) {
                p.zombies.retain(|z| listing.contains(z));
            }
            for tid in listing {
                let had = self
                    .procs
                    .get(&tgid)
                    .is_some_and(|p| p.tids.contains(&tid) || p.zombies.contains(&tid));
                if had || self.threads.contains_key(&tid) {
                    continue;
                }
                let found = self.add(tgid, tid, first, ph);
                let Some(p) = self.procs.get_mut(&tgid) else {
                    continue;
                };
                match found {
                    Found::Added => {
                        self.new_found += 1;
                        p.tids.push(tid);
                    }
                    Found::Zombie => p.zombies.push(tid),
                    Found::Gone => {}
                }
            }
        }
    }

    /// Opens and reads a thread found by a listing. A zombie is not added: its exit was
    /// counted when it exited (or will be when it is reaped and vanishes).
    fn add(&mut self, tgid: u32, tid: u32, first: bool, ph: &mut Phases) -> Found {
        let base = format!("/proc/{tgid}/task/{tid}/");
        let mut open = |name: &str| -> Option<File> {
            (self.fds < self.fd_budget)
                .then(|| File::open(format!("{base}{name}")).ok())
                .flatten()
                .inspect(|_| self.fds += 1)
        };
        let schedstat = open("schedstat");
        let stat = open("stat");
        let status = open("status");
        let th = Thread {
            info: ThreadInfo {
                tid,
                tgid,
                ..Default::default()
            },
            schedstat,
            stat,
            status,
            ticks: (0, 0),
            prev_on_cpu: 0,
            stale: true,
            ending: false,
            watch: ThreadWatch::default(),
            nivcsw_at: 0,
        };
        self.threads.insert(tid, th);
        let alive = self.refresh(tid, true, ph);
        // A task already in `do_exit` is not added either: its exit notification may have
        // been handled before this listing found it (the notification is sent before the
        // task's memory is torn down, which can take milliseconds), and adding it would count
        // its exit twice and replace the notified figures with a later /proc reading.
        let zombie = self.threads.get(&tid).is_some_and(|t| t.ending);
        if !alive || zombie {
            if let Some(t) = self.threads.remove(&tid) {
                self.fds -= t.fds();
            }
            return if alive { Found::Zombie } else { Found::Gone };
        }
        if first {
            // Known from before the agent started: its interval starts now.
            if let Some(t) = self.threads.get_mut(&tid) {
                t.prev_on_cpu = t.info.sched.on_cpu_ns;
            }
        }
        Found::Added
    }

    /// Rereads thread `tid`'s schedstat (all its files when `full`); false when it is gone.
    /// Without taskstats, the stat of a thread whose figures moved is read too, for its
    /// process's children time.
    fn refresh(&mut self, tid: u32, full: bool, ph: &mut Phases) -> bool {
        let Some(th) = self.threads.get_mut(&tid) else {
            return false;
        };
        ph.threads_read += 1;
        let sched = match read_kept(
            &th.schedstat,
            (th.info.tgid, tid, "schedstat"),
            &mut self.buf,
        )
        .ok()
        .and_then(|n| procfs::schedstat(&self.buf[..n]))
        {
            Some(s) => s,
            None => return false,
        };
        if sched == th.info.sched && !full {
            return true;
        }
        th.info.sched = sched;
        th.stale = true;
        if full {
            return self.details(tid);
        }
        if self.taskstats.is_none() {
            return self.stat(tid).is_some();
        }
        true
    }

    /// Rereads thread `tid`'s stat: name, state, last CPU, tick split, children time.
    fn stat(&mut self, tid: u32) -> Option<()> {
        let th = self.threads.get_mut(&tid)?;
        let tgid = th.info.tgid;
        let n = read_kept(&th.stat, (tgid, tid, "stat"), &mut self.buf).ok()?;
        let st = procfs::task_stat(&self.buf[..n])?;
        let info = &mut th.info;
        info.comm = st.comm;
        info.state = st.state;
        info.kernel = st.flags & PF_KTHREAD != 0;
        info.last_cpu = st.processor;
        th.ending = st.ending();
        th.ticks = (st.utime, st.stime);
        info.delays[0] = st.blkio_ticks * self.tick_ns;
        // The process's children time, for the estimate of tasks never seen.
        if let Some(p) = self.procs.get_mut(&tgid) {
            let ticks = st.cutime + st.cstime;
            if let Some(old) = p.child_ticks {
                self.child_ns += ticks.saturating_sub(old) * self.tick_ns;
            }
            p.child_ticks = Some(ticks);
        }
        Some(())
    }

    /// Rereads everything of thread `tid` beyond schedstat: stat, status, and its delay
    /// totals from taskstats when delay accounting is on. False when it is gone.
    fn details(&mut self, tid: u32) -> bool {
        if self.stat(tid).is_none() {
            return false;
        }
        let Some(th) = self.threads.get_mut(&tid) else {
            return false;
        };
        let info = &mut th.info;
        let (u, s) = th.ticks;
        if u + s > 0 {
            let on = info.sched.on_cpu_ns;
            let user = (u128::from(on) * u128::from(u) / u128::from(u + s)) as u64;
            info.utime_ns = user;
            info.stime_ns = on - user;
        }
        if let Ok(n) = read_kept(&th.status, (info.tgid, tid, "status"), &mut self.buf) {
            if let Some((v, i)) = procfs::switches(&self.buf[..n]) {
                info.nvcsw = v;
                info.nivcsw = i;
                th.nivcsw_at = self.samples;
            }
        }
        th.stale = false;
        if self.delayacct {
            if let Some(Ok(Some(q))) = self.taskstats.as_mut().map(|ts| ts.query(tid)) {
                th.info.delays = q.delays;
                th.info.delay_counts = q.delay_counts;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests;
