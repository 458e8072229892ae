//! Exact pressure from the vCPUs' own state intervals (level full): each vCPU's tick as
//! disjoint segments in which it was stalled or idle ([`segments`]), and the measure over a
//! set of vCPUs of "at least one non-idle vCPU stalled" (the union of their stalls) and
//! "every non-idle vCPU stalled, at least one non-idle" ([`measure`]). Pure functions, tested
//! against a brute-force walk of every nanosecond.
//!
//! Data flow: `pressure::reader` gathers a vCPU's episodes (its log, a look at its perf ring,
//! its state now) and gives them here; the tracker measures each set of vCPUs whose every
//! member came back known.

use crate::accounting::episodes::{Episode, EpisodeKind};
use crate::accounting::meter::MicroState;

use super::Stall;

/// What a vCPU was doing in a [`Seg`]; outside every segment it was non-idle and not
/// stalled (on a CPU, or asleep in the host kernel: blocked).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Halted, parked idle or paused.
    Idle = 1,
    /// Runnable and waiting for a CPU, or held by a limit.
    Stall = 2,
}

/// A half-open interval `[start, end)` of CLOCK_MONOTONIC ns in one phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seg {
    /// Start.
    pub start: u64,
    /// End (> start).
    pub end: u64,
    /// The phase.
    pub phase: Phase,
}

/// What a vCPU is doing at the end of the window, as its meter and records say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Its micro-state, and since when.
    pub state: MicroState,
    /// See [`Now::state`].
    pub since: u64,
    /// A switch-out with no switch-in yet: (when, preempted).
    pub out: Option<(u64, bool)>,
}

/// The phases of one vCPU in `[from, to)`, disjoint and in order: from its completed
/// `episodes` (any order, duplicates allowed, those outside the window ignored) and what it is
/// doing `now`. `halts`: a sleep inside KVM_RUN is the guest's HLT (an in-kernel irqchip: a
/// Linux guest), hence idle; otherwise it is blocked (non-idle, not stalled).
///
/// Where phases overlap (a preemption inside a park, the park's wake-up wait at its end) a
/// stall wins over idle: at each instant the vCPU is in the strongest phase that covers it.
pub fn segments(
    episodes: &[Episode],
    now: Option<Now>,
    halts: bool,
    from: u64,
    to: u64,
) -> Vec<Seg> {
    let mut raw: Vec<Seg> = Vec::with_capacity(episodes.len() + 2);
    let mut add = |start: u64, end: u64, phase: Phase| {
        let (s, e) = (start.max(from), end.min(to));
        if s < e {
            raw.push(Seg {
                start: s,
                end: e,
                phase,
            });
        }
    };
    for e in episodes {
        match e.kind {
            EpisodeKind::Preempted => add(e.start, e.end, Phase::Stall),
            EpisodeKind::SleptInRun if halts => add(e.start, e.end, Phase::Idle),
            EpisodeKind::SleptInRun | EpisodeKind::Slept | EpisodeKind::Handoff => {}
            EpisodeKind::Limited => add(e.start, e.end, Phase::Stall),
            EpisodeKind::Idle | EpisodeKind::Paused => {
                let woken = e.end.saturating_sub(e.wait).max(e.start);
                add(e.start, woken, Phase::Idle);
                add(woken, e.end, Phase::Stall);
            }
        }
    }
    if let Some(n) = now {
        match n.state.park_kind() {
            Some(crate::accounting::meter::ParkKind::Limited) => add(n.since, to, Phase::Stall),
            Some(_) => add(n.since, to, Phase::Idle),
            None => {}
        }
        if let Some((out, preempted)) = n.out {
            // Inside KVM_RUN when it left its CPU: in a guest run that began before, or
            // before the exit that began the handling in progress.
            let in_run = match n.state {
                MicroState::Guest => out >= n.since,
                MicroState::Vmm => out < n.since,
                _ => false,
            };
            if preempted {
                add(out, to, Phase::Stall);
            } else if in_run && halts {
                add(out, to, Phase::Idle);
            }
        }
    }
    normalize(raw)
}

/// A vCPU's `episodes` and state `now` with each wait for a CPU ended where the kernel picked
/// its thread: `picked` holds the instants another vCPU's `sched_switch` named it as the next
/// thread on that one's CPU (any order). A preempted episode `[start, end)` ends at the latest
/// of them in `[start, end]`, and a switch-out still open at `now` (preempted) is a wait from
/// it to the latest at or after it, if any (the thread was picked, its switch-in record not yet
/// written). Why: the switch-in record is written after the context switch (on the PVM
/// development host 15-50 µs after the pick, the outgoing vCPU's state being saved), while the
/// kernel's run_delay, and so steal_ns, ends at the pick, and its PSI sees a thread of the
/// group running throughout; two CPUs switching between vCPUs at one scheduler tick made
/// every vCPU look stalled for those µs, 0.3-0.5 % of the window with 4 busy vCPUs on 2 CPUs.
pub fn picked_at(
    episodes: &[Episode],
    now: Option<Now>,
    picked: &[u64],
) -> (Vec<Episode>, Option<Now>) {
    let mut eps = episodes.to_vec();
    let mut now = now;
    if picked.is_empty() {
        return (eps, now);
    }
    let latest_in = |a: u64, b: u64| picked.iter().copied().filter(|&p| a <= p && p <= b).max();
    for e in &mut eps {
        if e.kind == EpisodeKind::Preempted {
            if let Some(p) = latest_in(e.start, e.end) {
                e.end = p;
            }
        }
    }
    if let Some(n) = &mut now {
        if let Some((out, true)) = n.out {
            if let Some(p) = latest_in(out, u64::MAX) {
                eps.push(Episode {
                    start: out,
                    end: p,
                    kind: EpisodeKind::Preempted,
                    wait: 0,
                });
                n.out = None;
            }
        }
    }
    (eps, now)
}

/// Disjoint segments in order, each instant in the strongest phase of `raw` that covers it.
fn normalize(mut raw: Vec<Seg>) -> Vec<Seg> {
    let mut cuts: Vec<u64> = raw.iter().flat_map(|s| [s.start, s.end]).collect();
    cuts.sort_unstable();
    cuts.dedup();
    raw.sort_unstable_by_key(|s| s.start);
    let mut out: Vec<Seg> = Vec::new();
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        let phase = raw
            .iter()
            .take_while(|s| s.start <= a)
            .filter(|s| s.end > a)
            .map(|s| s.phase)
            .max();
        let Some(phase) = phase else { continue };
        match out.last_mut() {
            Some(l) if l.end == a && l.phase == phase => l.end = b,
            _ => out.push(Seg {
                start: a,
                end: b,
                phase,
            }),
        }
    }
    out
}

/// `some` and `full` over `[from, to)` of a set of vCPUs, each given by its [`segments`]: the
/// measure of the instants at which at least one member is stalled, and of those at which
/// every member is stalled or idle with at least one stalled (every non-idle member stalled,
/// at least one being non-idle; a stalled vCPU is non-idle).
pub fn measure(from: u64, to: u64, members: &[&[Seg]]) -> Stall {
    if to <= from || members.is_empty() {
        return Stall::default();
    }
    // (time, member, phase from then on: 0 other, 1 idle, 2 stall)
    let mut events: Vec<(u64, usize, u8)> = Vec::new();
    for (m, segs) in members.iter().enumerate() {
        for s in segs.iter() {
            let (a, b) = (s.start.max(from), s.end.min(to));
            if a < b {
                events.push((a, m, s.phase as u8));
                events.push((b, m, 0));
            }
        }
    }
    // At one instant, ends before starts (a segment that ends where the next begins).
    events.sort_unstable_by_key(|&(t, m, p)| (t, p != 0, m));
    let n = members.len();
    let mut phase = vec![0u8; n];
    let (mut stalled, mut idle) = (0usize, 0usize);
    let mut out = Stall::default();
    let mut at = from;
    let credit = |d: u64, stalled: usize, idle: usize, out: &mut Stall| {
        if stalled > 0 {
            out.some += d;
            if stalled + idle == n {
                out.full += d;
            }
        }
    };
    for (t, m, p) in events {
        if t > at {
            credit(t - at, stalled, idle, &mut out);
            at = t;
        }
        match phase[m] {
            1 => idle -= 1,
            2 => stalled -= 1,
            _ => {}
        }
        phase[m] = p;
        match p {
            1 => idle += 1,
            2 => stalled += 1,
            _ => {}
        }
    }
    if to > at {
        credit(to - at, stalled, idle, &mut out);
    }
    out
}

#[cfg(test)]
#[path = "timeline_tests.rs"]
mod tests;
