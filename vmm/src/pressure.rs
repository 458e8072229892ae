//! CPU pressure of the VM and of each vCPU group, in PSI's terms (spec section 11,
//! docs/accounting.md "Pressure").
//!
//! A vCPU is *stalled* while it is runnable and waiting for a host CPU (steal) or held by a
//! CPU limit (limited); it is *non-idle* unless halted, idle or paused. Over a set of vCPUs,
//! `some` is the time at least one non-idle vCPU is stalled and `full` the time every
//! non-idle vCPU is stalled, at least one being non-idle.
//!
//! Data flow: the sampler thread, at each refresh of the PPA page (every 8 ms), reads each
//! vCPU's summary once (the same read the page's host records take) and, through a
//! [`reader::VcpuReader`] per vCPU, its state intervals in the tick: the episodes its
//! context-switch records showed and its parks ([`crate::accounting::episodes`]), and what its
//! records and meter say now. It hands both to the [`Tracker`]. Where every live member of a
//! set came back with its intervals (level full with records), the tick's `some` and `full`
//! are the measure of the union and of the intersection of their stalls
//! ([`timeline::measure`]): exact. Otherwise each vCPU's stalled and non-idle time in the
//! tick come from the accounting's totals (limited, idle and paused from the meter's park
//! transitions, steal from schedstat run_delay, halted from KVM's halt statistics) and
//! [`combine`] estimates their overlap; a set with such a tick, where its totals did not
//! decide the answer, is marked `estimated`. [`psi::Averages`] folds the totals into
//! avg10/60/300 every 2 s exactly as Linux does. The tracker posts the figures and a 12 s
//! history of the VM's totals on the [`PressureBoard`] (a mutex the sampler and the `api`
//! thread take for a copy, never a vCPU thread); the `pressure` command, `stats`, the metrics
//! and the PPA page read the figures there, and pressure triggers ([`trigger`]) the history.
//! Nothing here runs on a vCPU thread: pressure adds no work to the exit path beyond the
//! episode log's few stores per context switch and park.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

use ppa_vmm_api::{GroupPressure, Pressure, PressureLine, PressureReport, VcpuSummary};

pub mod psi;
pub mod reader;
pub mod timeline;
pub mod trigger;

use timeline::Seg;

/// The `some` and `full` of one tick of a set of vCPUs, ns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stall {
    /// At least one non-idle vCPU stalled.
    pub some: u64,
    /// Every non-idle vCPU stalled, at least one non-idle.
    pub full: u64,
}

/// One vCPU in one tick: its stalled and non-idle time, ns (stalled ≤ non-idle ≤ the tick).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VcpuTick {
    /// Stalled (steal or limited).
    pub stalled: u64,
    /// Not halted, idle or paused.
    pub nonidle: u64,
}

/// The overlap rule: the `some` and `full` time of a tick of `tick_ns` for vCPUs whose
/// stalled and non-idle times in it are `vcpus`.
///
/// Each vCPU's totals in the tick are exact; when in the tick each vCPU stalled is not known
/// for steal (the kernel counts run-queue wait as a total). The rule takes each vCPU's state
/// at an instant of the tick as independent of the others': with s_i and n_i the stalled and
/// non-idle shares of vCPU i, `some` = T·(1 − Π(1 − s_i)) and `full` = T·(Π(1 − n_i + s_i) −
/// Π(1 − n_i)) (every vCPU idle or stalled, less every vCPU idle). Where the tick's figures
/// decide the answer it is that answer: one vCPU stalled gives its own stall as `some`; one
/// vCPU non-idle gives its stall as both; nobody stalled gives zero; everybody stalled all
/// the tick gives the tick.
pub fn combine(tick_ns: u64, vcpus: impl IntoIterator<Item = VcpuTick>) -> Stall {
    combine_decided(tick_ns, vcpus).0
}

/// [`combine`], and whether the vCPUs' figures decide the answer, so that it is no estimate:
/// `some` is decided when at most one vCPU stalled or one stalled all the tick; `full` when
/// at most one vCPU was non-idle, nobody stalled, one vCPU was non-idle and never stalled all
/// the tick (then it is 0), or every vCPU stalled all the tick.
pub fn combine_decided(tick_ns: u64, vcpus: impl IntoIterator<Item = VcpuTick>) -> (Stall, bool) {
    if tick_ns == 0 {
        return (Stall::default(), true);
    }
    let t = tick_ns as f64;
    let (mut none_stalled, mut idle_or_stalled, mut all_idle) = (1.0f64, 1.0f64, 1.0f64);
    let (mut stalling, mut nonidle, mut count) = (0usize, 0usize, 0usize);
    let (mut one_stalls_all, mut one_runs_all, mut all_stall_all) = (false, false, true);
    for v in vcpus {
        let stalled = v.stalled.min(v.nonidle).min(tick_ns);
        let n = v.nonidle.min(tick_ns) as f64 / t;
        let s = stalled as f64 / t;
        count += 1;
        stalling += usize::from(stalled > 0);
        nonidle += usize::from(v.nonidle > 0);
        one_stalls_all |= stalled == tick_ns;
        one_runs_all |= v.nonidle.min(tick_ns) - stalled == tick_ns;
        all_stall_all &= stalled == tick_ns;
        none_stalled *= 1.0 - s;
        idle_or_stalled *= 1.0 - n + s;
        all_idle *= 1.0 - n;
    }
    if stalling == 0 {
        return (Stall::default(), true);
    }
    let some_decided = stalling <= 1 || one_stalls_all;
    let full_decided = nonidle <= 1 || one_runs_all || (all_stall_all && count > 0);
    let ns = |share: f64| ((share.clamp(0.0, 1.0) * t).round() as u64).min(tick_ns);
    (
        Stall {
            some: ns(1.0 - none_stalled),
            full: ns(idle_or_stalled - all_idle),
        },
        some_decided && full_decided,
    )
}

/// What the tracker keeps of one vCPU between ticks: its totals at the last tick, and stall
/// reported late (a run-queue wait counts when it ends, possibly in a later tick than the
/// one it filled) that did not fit in its tick.
#[derive(Debug, Clone, Copy, Default)]
struct Cursor {
    last: Option<Totals>,
    carry: u64,
}

/// The figures of a vCPU summary that pressure uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Totals {
    wall: u64,
    stalled: u64,
    idle: u64,
}

impl Totals {
    fn of(s: &VcpuSummary) -> Totals {
        Totals {
            wall: s.wall_ns,
            stalled: s.steal_ns.saturating_add(s.limited_ns),
            idle: s
                .halted_ns
                .saturating_add(s.idle_ns)
                .saturating_add(s.paused_ns),
        }
    }
}

impl Cursor {
    /// The vCPU's tick of `tick_ns` ending with `now` (`now` None: it has not started or has
    /// ended). None: the vCPU has no time in the tick (not running, its first tick, a reset).
    fn advance(&mut self, now: Option<Totals>, tick_ns: u64) -> Option<VcpuTick> {
        let Some(now) = now else {
            *self = Cursor::default();
            return None;
        };
        let last = self.last.replace(now)?;
        if now.wall < last.wall || now.stalled < last.stalled || now.idle < last.idle {
            // A reset: the totals start again; this tick counts nothing.
            self.carry = 0;
            return None;
        }
        let wall = (now.wall - last.wall).min(tick_ns);
        let nonidle = wall.saturating_sub(now.idle - last.idle);
        let owed = self.carry + (now.stalled - last.stalled);
        let stalled = owed.min(nonidle);
        // What did not fit waits for the next ticks (bounded: a few ticks' worth).
        self.carry = (owed - stalled).min(4 * tick_ns);
        Some(VcpuTick { stalled, nonidle })
    }
}

/// A set of vCPUs whose pressure is tracked: the VM, or a vCPU group.
#[derive(Debug, Clone)]
struct Set {
    name: String,
    vcpus: Vec<usize>,
    total: Stall,
    averages: psi::Averages<2>,
    /// Some tick was the overlap rule's estimate.
    estimated: bool,
    /// Ticks measured from the members' intervals, and ticks estimated (for the tests and
    /// the log).
    exact_ticks: u64,
    estimated_ticks: u64,
}

impl Set {
    fn new(name: String, vcpus: Vec<usize>, now: u64) -> Set {
        Set {
            name,
            vcpus,
            total: Stall::default(),
            averages: psi::Averages::new(now),
            estimated: false,
            exact_ticks: 0,
            estimated_ticks: 0,
        }
    }

    fn figures(&self) -> SetFigures {
        SetFigures {
            some_total_us: self.total.some / 1000,
            full_total_us: self.total.full / 1000,
            some_avg: self.averages.hundredths(0),
            full_avg: self.averages.hundredths(1),
            estimated: self.estimated,
        }
    }

    /// This tick's stall of the set: measured from its live members' intervals when each has
    /// them, else the overlap rule over their totals (`estimated` when it decides nothing).
    fn tick(
        &mut self,
        from: u64,
        to: u64,
        ticks: &[Option<VcpuTick>],
        timelines: &[Option<&[Seg]>],
    ) -> Stall {
        let live: Vec<usize> = self
            .vcpus
            .iter()
            .copied()
            .filter(|&i| ticks.get(i).copied().flatten().is_some())
            .collect();
        let known: Option<Vec<&[Seg]>> = live
            .iter()
            .map(|&i| timelines.get(i).copied().flatten())
            .collect();
        match known {
            Some(segs) if !live.is_empty() => {
                self.exact_ticks += 1;
                timeline::measure(from, to, &segs)
            }
            _ => {
                let (s, decided) = combine_decided(
                    to.saturating_sub(from),
                    live.iter().filter_map(|&i| ticks[i]),
                );
                if !decided {
                    self.estimated = true;
                    self.estimated_ticks += 1;
                }
                s
            }
        }
    }
}

/// A set's figures as readers take them: totals in µs, averages in hundredths of a percent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetFigures {
    /// `some` total, µs.
    pub some_total_us: u64,
    /// `full` total, µs.
    pub full_total_us: u64,
    /// `some` avg10, avg60, avg300.
    pub some_avg: [u32; 3],
    /// `full` avg10, avg60, avg300.
    pub full_avg: [u32; 3],
    /// Part of the figures is the overlap rule's estimate.
    pub estimated: bool,
}

impl SetFigures {
    /// As the protocol gives them.
    pub fn pressure(&self) -> Pressure {
        Pressure {
            some: PressureLine::from_hundredths(self.some_avg, self.some_total_us),
            full: PressureLine::from_hundredths(self.full_avg, self.full_total_us),
            estimated: self.estimated,
        }
    }
}

/// How long the board keeps the VM's totals: the longest trigger window and two refreshes.
pub const HISTORY_NS: u64 = 12_000_000_000;

/// One point of the history: when (CLOCK_MONOTONIC) and the VM's totals then, ns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Point {
    /// CLOCK_MONOTONIC ns.
    pub at: u64,
    /// The VM's totals.
    pub total: Stall,
}

/// What readers see: the figures of the VM and of each group, and the VM's recent totals.
#[derive(Debug, Clone, Default)]
pub struct Posted {
    /// VM uptime at the tick, ns.
    pub uptime_ns: u64,
    /// The VM.
    pub vm: SetFigures,
    /// Each group: name, vCPUs, figures.
    pub groups: Vec<(String, Vec<usize>, SetFigures)>,
    /// The VM's totals at each tick of the last [`HISTORY_NS`], oldest first.
    pub history: VecDeque<Point>,
}

impl Posted {
    /// The `pressure` command's result.
    pub fn report(&self) -> PressureReport {
        PressureReport {
            uptime_ns: self.uptime_ns,
            vm: self.vm.pressure(),
            groups: self
                .groups
                .iter()
                .map(|(name, vcpus, f)| GroupPressure {
                    name: name.clone(),
                    vcpus: vcpus.clone(),
                    pressure: f.pressure(),
                })
                .collect(),
        }
    }
}

/// Where the tracker posts and readers read (a mutex held for a copy; no vCPU thread takes
/// it).
#[derive(Debug, Default)]
pub struct PressureBoard(Mutex<Posted>);

impl PressureBoard {
    /// The posted figures, locked (hold it only to copy).
    pub fn lock(&self) -> MutexGuard<'_, Posted> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The `pressure` command's result.
    pub fn report(&self) -> PressureReport {
        self.lock().report()
    }

    /// The VM's figures.
    pub fn vm(&self) -> SetFigures {
        self.lock().vm
    }
}

/// The sampler's side: each vCPU's cursor, the VM and its groups.
#[derive(Debug)]
pub struct Tracker {
    cursors: Vec<Cursor>,
    sets: Vec<Set>,
    last_tick: u64,
}

impl Tracker {
    /// A tracker of `vcpus` vCPUs and the given groups (name, members), starting at `now`.
    pub fn new(vcpus: usize, groups: Vec<(String, Vec<usize>)>, now: u64) -> Tracker {
        let mut sets = vec![Set::new("vm".into(), (0..vcpus).collect(), now)];
        sets.extend(
            groups
                .into_iter()
                .map(|(name, members)| Set::new(name, members, now)),
        );
        Tracker {
            cursors: vec![Cursor::default(); vcpus],
            sets,
            last_tick: now,
        }
    }

    /// Where the next tick's window starts (the last tick's time).
    pub fn window_start(&self) -> u64 {
        self.last_tick
    }

    /// One tick at `now` (CLOCK_MONOTONIC ns): the i-th summary is vCPU i's, `None` for a
    /// vCPU whose thread has not started or has ended; the i-th timeline is vCPU i's phases
    /// in the window since the last tick, `None` where they are not known (missing entries
    /// count as not known).
    pub fn tick<'a>(
        &mut self,
        now: u64,
        summaries: impl IntoIterator<Item = Option<&'a VcpuSummary>>,
        timelines: &[Option<&[Seg]>],
    ) {
        let from = self.last_tick;
        let tick_ns = now.saturating_sub(from);
        self.last_tick = now;
        let ticks: Vec<Option<VcpuTick>> = self
            .cursors
            .iter_mut()
            .zip(summaries.into_iter().map(|s| s.map(Totals::of)))
            .map(|(c, t)| c.advance(t, tick_ns))
            .collect();
        for set in &mut self.sets {
            let s = set.tick(from, now.max(from), &ticks, timelines);
            set.total.some += s.some;
            set.total.full += s.full;
            set.averages.update(now, [set.total.some, set.total.full]);
        }
    }

    /// Ticks of the VM measured from intervals and ticks estimated, so far.
    pub fn vm_ticks(&self) -> (u64, u64) {
        (self.sets[0].exact_ticks, self.sets[0].estimated_ticks)
    }

    /// The VM's running totals, ns.
    pub fn vm_total(&self) -> Stall {
        self.sets[0].total
    }

    /// Posts the figures on `board`, with the VM's totals at `now` added to its history.
    pub fn post(&self, board: &PressureBoard, now: u64, uptime_ns: u64) {
        let mut p = board.lock();
        p.uptime_ns = uptime_ns;
        p.vm = self.sets[0].figures();
        p.groups = self.sets[1..]
            .iter()
            .map(|s| (s.name.clone(), s.vcpus.clone(), s.figures()))
            .collect();
        p.history.push_back(Point {
            at: now,
            total: self.sets[0].total,
        });
        while p
            .history
            .front()
            .is_some_and(|f| now.saturating_sub(f.at) > HISTORY_NS)
        {
            p.history.pop_front();
        }
    }
}

#[cfg(test)]
mod tests;
