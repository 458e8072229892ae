//! The limiter's side of turns ([`crate::limits::turns`]): at each boundary, who waits its
//! turn in the period that begins ([`Limiter::plan_turns`], before the members are released:
//! a member that waits is not released, so it costs no stop); at each look, a waiting member
//! takes over from a runner that stopped wanting CPU ([`Limiter::hand_over_turns`]); at each
//! close, what each member is owed ([`Limiter::settle_turns`]).
//!
//! A straddled turn ([`Straddle`]): at a boundary where the runners were all stopped, they
//! stay held ([`Limiter::plan_straddle`]) until their share and a learnt lead before the
//! period's end ([`Limiter::release_straddle`]), run into the next period with a budget that
//! covers both halves (so their timers do not stop them at the boundary), and keep their turn
//! there ([`Limiter::plan_turns`]) until its share is spent. The closing period is charged
//! what they used before the boundary ([`Limiter::cut_straddle`]); the next one from there.

use super::{Entity, Limiter};
use crate::accounting::meter::MicroState;
use crate::limits::engine::Member;
use crate::limits::turns::{
    before_boundary, bench, hand_over, release_at, runners, settle, straddle_share, ReleaseLead,
};
use crate::limits::Scope;
use crate::vcpu::ThreadState;
use ppa_vmm_api::{Event, ThrottleEndWhy};

/// The lead a straddled turn's release starts with, until it has learnt its own: what a
/// release loses before the guest runs (the limiter's lateness, the thread's wake-up and the
/// cold re-entry after a long park: 75-130 µs on the PVM development host, docs/limits.md).
pub const RELEASE_LEAD_NS: u64 = 100_000;

/// A limit's straddled turn (module doc).
#[derive(Debug)]
pub(super) struct Straddle {
    /// The members whose turn straddles the end of the period in progress.
    who: Vec<bool>,
    /// When they are to be released (`None`: released, or no straddle).
    release_at: Option<u64>,
    /// When they were released (`None`: not yet, or no straddle).
    released_at: Option<u64>,
    /// The share each has in each of the two periods.
    share_ns: u64,
    /// The lead the release was planned with.
    lead_ns: u64,
    /// Each member's charged CPU at the boundary just closed, where a straddled turn ran
    /// across it: the next period's baseline.
    carry: Vec<Option<u64>>,
    /// The release's lead, learnt from what the releases lost.
    lead: ReleaseLead,
    /// Completed periods whose end a turn straddled.
    pub(super) periods: u64,
}

impl Straddle {
    pub(super) fn new(n: usize) -> Self {
        Straddle {
            who: vec![false; n],
            release_at: None,
            released_at: None,
            share_ns: 0,
            lead_ns: 0,
            carry: vec![None; n],
            lead: ReleaseLead::new(RELEASE_LEAD_NS),
            periods: 0,
        }
    }

    /// The members released late in this period, running into the next.
    fn running(&self) -> bool {
        self.released_at.is_some() && self.who.iter().any(|w| *w)
    }

    /// A release planned and not yet made: the next look is due then.
    pub(super) fn release_due(&self) -> Option<u64> {
        self.release_at
    }

    /// The baseline of member `k` for the period that begins, where a turn straddled the
    /// boundary.
    pub(super) fn take_carry(&mut self, k: usize) -> Option<u64> {
        self.carry.get_mut(k).and_then(Option::take)
    }
}

impl Limiter {
    /// Whether member `k` of `e` wants CPU now: running in the guest or the VMM, or stopped
    /// by this limit (not idle, paused, finished or not yet started).
    pub(super) fn wants_cpu(&self, e: &Entity, k: usize) -> bool {
        let v = &self.vcpus[e.members[k]];
        let finished = v.state() == ThreadState::Created || super::ended_at(v).is_some();
        !finished
            && (e.stopped[k]
                || matches!(
                    v.acct.meter.read().micro_state(),
                    MicroState::Guest | MicroState::Vmm | MicroState::Limited
                ))
    }

    /// At a boundary beginning a period at `start`, before the members are released: who
    /// waits its turn in it (nobody without a limit, or when the quota gives each member that
    /// wants CPU at least [`crate::limits::turns::TURN_NS`]). The members of a turn that
    /// straddled the boundary keep it; else the turn may straddle this period's end.
    pub(super) fn plan_turns(&self, e: &mut Entity, start: u64) {
        let demand: Vec<bool> = (0..e.members.len()).map(|k| self.wants_cpu(e, k)).collect();
        let n = demand.iter().filter(|d| **d).count();
        let s = &mut e.straddle;
        let keep: Vec<bool> = (0..demand.len())
            .map(|k| s.released_at.is_some() && s.who.get(k).copied().unwrap_or(false) && demand[k])
            .collect();
        s.who.iter_mut().for_each(|w| *w = false);
        s.release_at = None;
        s.released_at = None;
        match e.limit.as_ref().map(|(l, _)| l.quota_ns) {
            Some(quota) => {
                let mut owed = e.owed.clone();
                for (o, _) in owed.iter_mut().zip(&keep).filter(|(_, k)| **k) {
                    *o = i64::MAX;
                }
                e.benched = bench(quota, &demand, &owed);
                e.runners = runners(quota, n);
            }
            None => {
                e.benched.iter_mut().for_each(|b| *b = false);
                e.runners = n;
            }
        }
        e.turns_this_period = e.benched.iter().any(|b| *b);
        e.turn_demand = demand;
        if !keep.iter().any(|k| *k) {
            self.plan_straddle(e, start);
        }
    }

    /// At a boundary beginning a period at `start`, where no turn straddled it: if the
    /// period's runners were all stopped (busy: they spent their share, or waited their
    /// turn) and their share is small ([`straddle_share`]), they are held until
    /// [`release_at`] and their turn straddles the period's end.
    fn plan_straddle(&self, e: &mut Entity, start: u64) {
        let Some((l, _)) = e.limit.as_ref() else {
            return;
        };
        if super::scope_of(e) != Scope::Vcpus {
            return;
        }
        let run: Vec<usize> = (0..e.members.len())
            .filter(|&k| e.turn_demand[k] && !e.benched[k])
            .collect();
        let busy = run
            .iter()
            .all(|&k| e.stopped[k] || self.vcpus[e.members[k]].kick_held(e.kind));
        let share = straddle_share(
            l.quota_ns,
            l.period_ns,
            run.len(),
            self.host_cpus,
            e.turns_this_period,
        );
        let Some(share) = share.filter(|_| busy) else {
            return;
        };
        // Never released before a share into the period: the budget of a released turn is the
        // time to the boundary, which must not be most of a short period (1 ms periods).
        let lead = e
            .straddle
            .lead
            .get()
            .min(l.period_ns.saturating_sub(2 * share));
        let end = start + l.period_ns;
        let s = &mut e.straddle;
        s.release_at = Some(release_at(start, end, share, lead));
        s.share_ns = share;
        s.lead_ns = lead;
        for k in run {
            s.who[k] = true;
            // Held like a member waiting its turn until the release.
            e.benched[k] = true;
        }
    }

    /// At a look at `now`: releases a straddled turn whose time has come (its members stop
    /// waiting, and are released here: a share within the hysteresis of a few stop margins
    /// would keep them stopped, and the period would give them nothing); once released, a
    /// member of it that stopped wanting CPU (`members`) ends the straddle (the others'
    /// share falls back to this period's).
    pub(super) fn release_straddle(&self, e: &mut Entity, members: &mut [Member], now: u64) {
        let s = &mut e.straddle;
        if s.release_at.is_some_and(|r| r <= now) {
            s.release_at = None;
            s.released_at = Some(now);
            for (k, m) in members.iter_mut().enumerate() {
                if s.who[k] {
                    e.benched[k] = false;
                    m.benched = false;
                    if e.stopped[k] {
                        self.vcpus[e.members[k]].release(e.kind.into());
                        e.stopped[k] = false;
                        m.stopped = false;
                    }
                }
            }
            if !e.stopped.iter().any(|s| *s) {
                self.event(Event::ThrottleEnd {
                    uptime_ns: self.uptime(now),
                    group: e.name.clone(),
                    why: ThrottleEndWhy::Turn,
                });
            }
        } else if s.running() && members.iter().zip(&s.who).any(|(m, &w)| w && !m.demanding) {
            s.who.iter_mut().for_each(|w| *w = false);
            s.released_at = None;
        }
    }

    /// The budget a look shares under `quota_ns` in a period ending at `end`: while a
    /// straddled turn runs, the quota and, for each of its members, the time left to the
    /// boundary from the release (its most before the boundary), so that its timer is armed
    /// for its share of the next period too.
    pub(super) fn straddle_budget(e: &Entity, quota_ns: u64, end: u64) -> u64 {
        let s = &e.straddle;
        match s.released_at.filter(|_| s.running()) {
            Some(r) => {
                let n = s.who.iter().filter(|w| **w).count() as u64;
                quota_ns.saturating_add(n.saturating_mul(end.saturating_sub(r)))
            }
            None => quota_ns,
        }
    }

    /// At the close of a period that ended at `boundary`, looked at `now`: of what each
    /// member of a straddled turn used (`per`, read now), what the period is charged (what it
    /// used before the boundary, [`before_boundary`]); the rest is the next period's, whose
    /// baseline is kept. The release's lead learns from the shortfall. Whether a turn
    /// straddled the boundary (the period's error is then the release's, not a stop's).
    pub(super) fn cut_straddle(
        &self,
        e: &mut Entity,
        per: &mut [u64],
        boundary: u64,
        now: u64,
    ) -> bool {
        let s = &mut e.straddle;
        let Some(released) = s.released_at.filter(|_| s.running()) else {
            return false;
        };
        let late = now.saturating_sub(boundary);
        let mut short: i64 = 0;
        let mut n = 0;
        for (k, &i) in e.members.iter().enumerate() {
            if !s.who[k] {
                continue;
            }
            let v = &self.vcpus[i];
            let running = matches!(
                v.acct.meter.read().micro_state(),
                MicroState::Guest | MicroState::Vmm
            );
            let before = before_boundary(per[k], late, running, boundary.saturating_sub(released));
            s.carry[k] = e.base_cpu[k].map(|b| b + before);
            per[k] = before;
            short += s.share_ns as i64 - before as i64;
            n += 1;
        }
        // The lead that would have made the period exact: the lead it was released with plus
        // the shortfall.
        s.lead.learn(s.lead_ns, short / n.max(1));
        s.periods += 1;
        true
    }

    /// At a look: while fewer runners than planned still want CPU, the most owed waiting
    /// member takes its turn; each of `members` is told whether it waits.
    pub(super) fn hand_over_turns(&self, e: &mut Entity, members: &mut [Member]) {
        // A straddled turn held for its release is not a runner gone idle.
        if e.straddle.release_due().is_none() && e.benched.iter().any(|b| *b) {
            let demanding: Vec<bool> = members.iter().map(|m| m.demanding).collect();
            hand_over(&mut e.benched, &demanding, &e.owed, e.runners);
        }
        for (m, &b) in members.iter_mut().zip(&e.benched) {
            m.benched = b;
        }
    }

    /// At a close, what each member used in it (`per`): a period with turns settles the
    /// accounts (and counts), one without clears them.
    pub(super) fn settle_turns(e: &mut Entity, per: &[u64], quota_ns: u64) {
        if e.turns_this_period {
            settle(&mut e.owed, &e.turn_demand, per, quota_ns);
            e.turn_periods += 1;
        } else {
            e.owed.iter_mut().for_each(|o| *o = 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::Limit;

    /// When the members of the tests below started.
    const START: u64 = 10_000_000_000;

    /// A VM of 2 vCPUs that started at [`START`], under a VM limit of `limit`, both members
    /// stopped by it (busy: they spent their share).
    fn two_busy_members_under(limit: &str) -> (crate::handle::VmHandle, Limiter) {
        let (vm, l) = super::super::tests::vm_limit_of_25_percent();
        for v in vm.vcpus() {
            v.pretend_ran(START, None);
        }
        {
            let mut es = l.lock();
            es[0].limit = Some((Limit::parse(limit).unwrap(), limit.into()));
            es[0].stopped = vec![true, true];
        }
        (vm, l)
    }

    /// A straddled turn, step by step: held at the boundary where both members were stopped
    /// (one runs, with turns), released its share and lead before the end, with a budget
    /// that covers the next period's share, cut at the boundary (never more than the wall
    /// time since the release; the lead learns), and kept in the next period however much
    /// its member owes.
    #[test]
    fn a_straddled_turn_is_held_released_cut_and_kept() {
        let (t0, period, quota) = (START, 10_000_000, 1_000_000);
        let (_vm, l) = two_busy_members_under("1ms/10ms");
        let mut es = l.lock();
        let e = &mut es[0];
        l.plan_turns(e, t0);
        assert!(e.turns_this_period);
        assert_eq!(e.benched, [true, true], "the runner is held too");
        assert_eq!(e.straddle.who, [true, false]);
        let release = t0 + period - quota - RELEASE_LEAD_NS;
        assert_eq!(e.straddle.release_due(), Some(release));

        let mut members = vec![
            Member {
                demanding: true,
                stopped: true,
                benched: true,
                ..Default::default()
            };
            2
        ];
        l.release_straddle(e, &mut members, release - 1);
        assert_eq!(e.benched, [true, true], "not before its time");
        l.release_straddle(e, &mut members, release + 50_000);
        assert_eq!(e.benched, [false, true]);
        assert_eq!(e.stopped, [false, true], "released whatever the hysteresis");
        assert!(!members[0].benched && !members[0].stopped);
        let end = t0 + period;
        assert_eq!(
            Limiter::straddle_budget(e, quota, end),
            quota + (end - release - 50_000),
            "the quota and the time to the boundary"
        );

        e.base_cpu[0] = Some(5_000_000);
        let mut per = vec![1_300_000, 0];
        assert!(l.cut_straddle(e, &mut per, end, end + 40_000));
        let since_release = end - release - 50_000;
        assert_eq!(per, [since_release, 0]);
        assert_eq!(e.straddle.carry[0], Some(5_000_000 + since_release));
        assert_eq!(e.straddle.periods, 1);
        // It used 50 µs more than its share before the boundary: 50 µs less lead is exact.
        assert_eq!(
            e.straddle.lead.get(),
            RELEASE_LEAD_NS - (since_release - quota)
        );

        // The next period: its member keeps the turn, though the other is owed more.
        e.owed = vec![-4_000_000, 4_000_000];
        e.stopped = vec![true, true];
        l.plan_turns(e, end);
        assert_eq!(e.benched, [false, true]);
        assert_eq!(
            e.straddle.release_due(),
            None,
            "no straddle planned over a kept turn"
        );
        assert_eq!(e.straddle.take_carry(0), Some(5_000_000 + since_release));
    }

    /// A lead learnt long (a loaded host) never releases a turn before a share into a short
    /// period: its budget, the time to the boundary, would let it run most of the period.
    #[test]
    fn a_long_lead_leaves_a_short_period_its_first_share() {
        let t0 = START;
        let (_vm, l) = two_busy_members_under("250us/1ms");
        let mut es = l.lock();
        let e = &mut es[0];
        e.straddle.lead = ReleaseLead::new(2_000_000);
        l.plan_turns(e, t0);
        assert_eq!(e.straddle.who, [true, false]);
        assert_eq!(e.straddle.release_due(), Some(t0 + 250_000));
    }
}
