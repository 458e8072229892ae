//! Exited threads the agent goes on publishing for a few samples after their exit, with their
//! final figures and state `X` ([`THREAD_STATE_EXITED`]), so that a reader that looks only
//! now and then (the VMM's final report, read when the guest reboots) still sees the threads
//! that just finished, not only their sum in the transient figures.
//!
//! Data flow: the collector hands every exit to [`Lingering::exited`]: the thread's last
//! sampled record when a sample had seen it, the exit notification when taskstats gave one
//! (either may be missing, not both). [`final_record`] makes the record it keeps. At each
//! sample's choice of the threads to publish, after the live ones, [`Lingering::choose`] ages
//! the records and keeps those whose time is not up, newest exit first, in the room the live
//! threads left ([`evict`]); the others are forgotten. The records kept are published, and
//! [`transient`] leaves them out of the header's transient figures, where a record joins
//! when it is forgotten: each exited thread's CPU is counted in exactly one of the two.

use std::collections::{HashMap, HashSet};

use ppa_guest_abi::ppa_page::THREAD_STATE_EXITED;

use crate::collect::ThreadInfo;
use crate::taskstats::TaskExit;

/// Samples an exited thread stays published by default: a reader one interval after the exit
/// (the Linux image's init reboots one interval and 100 ms after its workload) finds it with
/// two samples to spare.
pub const DEFAULT_LINGER: u32 = 3;

/// The record an exited thread is published with: its final figures, state `X`, and
/// `exited_ns` (when the agent learned of the exit) as its update time. `last` is its last
/// sampled record and `prev_on_cpu` the on-CPU time at the sample before, when a sample had
/// seen it; `exit` the exit notification, whose figures are final and win. `None` when
/// neither is given.
pub fn final_record(
    last: Option<&ThreadInfo>,
    prev_on_cpu: u64,
    exit: Option<&TaskExit>,
    now_ns: u64,
) -> Option<ThreadInfo> {
    let mut t = match (last, exit) {
        (None, None) => return None,
        (Some(l), _) => *l,
        (None, Some(e)) => ThreadInfo {
            tid: e.tid,
            tgid: e.tgid,
            ..ThreadInfo::default()
        },
    };
    // The split to scale to the final on-CPU time: the kernel's own at the exit, else the
    // last sampled one.
    let mut split = (t.utime_ns, t.stime_ns);
    if let Some(e) = exit {
        if e.comm[0] != 0 {
            t.comm = e.comm;
        }
        t.sched.on_cpu_ns = e.cpu_ns;
        t.sched.run_delay_ns = e.run_delay_ns;
        t.sched.timeslices = e.timeslices;
        t.nvcsw = e.nvcsw;
        t.nivcsw = e.nivcsw;
        if e.delays.iter().any(|&d| d != 0) {
            t.delays = e.delays;
            t.delay_counts = e.delay_counts;
        }
        if e.utime_ns + e.stime_ns > 0 {
            split = (e.utime_ns, e.stime_ns);
        }
    }
    let on = t.sched.on_cpu_ns;
    let (u, s) = (u128::from(split.0), u128::from(split.1));
    (t.utime_ns, t.stime_ns) = match (u128::from(on) * u).checked_div(u + s) {
        Some(user) => (user as u64, on - user as u64),
        None => (0, 0),
    };
    t.state = THREAD_STATE_EXITED;
    t.interval_on_cpu_ns = on.saturating_sub(prev_on_cpu);
    t.exited_ns = now_ns.max(1);
    Some(t)
}

/// An exited thread waiting to be published or forgotten, as [`evict`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// Thread id.
    pub tid: u32,
    /// Exit order: a later exit has a larger number.
    pub order: u64,
    /// Samples it may still be published in (0: its time is up).
    pub samples_left: u32,
    /// A live thread has its tid now (the kernel reused it).
    pub reused: bool,
}

/// Which exited threads stay published when `room` records are left after the live threads:
/// those whose time is not up and whose tid no live thread took, newest exit first, at most
/// `room`. Returns their indices in `cands`, newest exit first; the others are forgotten
/// (oldest exit first when room is short).
pub fn evict(room: usize, cands: &[Candidate]) -> Vec<usize> {
    let mut keep: Vec<usize> = (0..cands.len())
        .filter(|&i| cands[i].samples_left > 0 && !cands[i].reused)
        .collect();
    keep.sort_unstable_by_key(|&i| std::cmp::Reverse(cands[i].order));
    keep.truncate(room);
    keep
}

/// The header's transient figures (count, CPU ns): every exit counted so far (`exited`: count,
/// CPU ns) less the exited threads still `listed` (published with state `X`). So the
/// published threads' on-CPU time, the aggregate of the live threads left out and the
/// transient CPU add up to the CPU of every thread the agent saw, each counted once.
pub fn transient<'a>(
    exited: (u64, u64),
    listed: impl IntoIterator<Item = &'a ThreadInfo>,
) -> (u64, u64) {
    listed.into_iter().fold(exited, |(n, cpu), t| {
        (n.saturating_sub(1), cpu.saturating_sub(t.sched.on_cpu_ns))
    })
}

#[derive(Debug)]
struct Exited {
    info: ThreadInfo,
    order: u64,
    samples_left: u32,
    prev_on_cpu: u64,
}

/// The exited threads kept for publication.
#[derive(Debug)]
pub struct Lingering {
    linger: u32,
    exited: HashMap<u32, Exited>,
    next: u64,
}

impl Lingering {
    /// Keeps each exited thread for `linger` samples (0: none is kept).
    pub fn new(linger: u32) -> Lingering {
        Lingering {
            linger,
            exited: HashMap::new(),
            next: 0,
        }
    }

    /// A thread exited (see [`final_record`] for the arguments).
    pub fn exited(
        &mut self,
        last: Option<&ThreadInfo>,
        prev_on_cpu: u64,
        exit: Option<&TaskExit>,
        now_ns: u64,
    ) {
        if self.linger == 0 {
            return;
        }
        if let Some(info) = final_record(last, prev_on_cpu, exit, now_ns) {
            self.next += 1;
            let e = Exited {
                info,
                order: self.next,
                samples_left: self.linger,
                prev_on_cpu,
            };
            self.exited.insert(info.tid, e);
        }
    }

    /// One sample's choice: ages every record, forgets those whose time is up, whose tid
    /// `live` says a live thread has, or that do not fit in `room`; returns the tids kept,
    /// newest exit first, with their interval on-CPU time brought to this sample.
    pub fn choose(&mut self, room: usize, live: impl Fn(u32) -> bool) -> Vec<u32> {
        let cands: Vec<Candidate> = self
            .exited
            .values()
            .map(|e| Candidate {
                tid: e.info.tid,
                order: e.order,
                samples_left: e.samples_left,
                reused: live(e.info.tid),
            })
            .collect();
        let kept: Vec<u32> = evict(room, &cands)
            .into_iter()
            .map(|i| cands[i].tid)
            .collect();
        let keep: HashSet<u32> = kept.iter().copied().collect();
        self.exited.retain(|tid, _| keep.contains(tid));
        for e in self.exited.values_mut() {
            e.samples_left -= 1;
            let on = e.info.sched.on_cpu_ns;
            e.info.interval_on_cpu_ns = on.saturating_sub(e.prev_on_cpu);
            e.prev_on_cpu = on;
        }
        kept
    }

    /// Forgets every record (a reset: their figures are all before it).
    pub fn clear(&mut self) {
        self.exited.clear();
    }

    /// The record of exited thread `tid`, while it is kept.
    pub fn get(&self, tid: u32) -> Option<&ThreadInfo> {
        self.exited.get(&tid).map(|e| &e.info)
    }

    /// Records kept.
    pub fn len(&self) -> usize {
        self.exited.len()
    }

    /// No record kept.
    pub fn is_empty(&self) -> bool {
        self.exited.is_empty()
    }
}

#[cfg(test)]
mod tests;
