//! The limiter's side of turns ([`crate::limits::turns`]): at each boundary, who waits its
//! turn in the period that begins ([`Limiter::plan_turns`], before the members are released:
//! a member that waits is not released, so it costs no stop); at each look, a waiting member
//! takes over from a runner that stopped wanting CPU ([`Limiter::hand_over_turns`]); at each
//! close, what each member is owed ([`Limiter::settle_turns`]).

use super::{Entity, Limiter};
use crate::accounting::meter::MicroState;
use crate::limits::engine::Member;
use crate::limits::turns::{bench, hand_over, runners, settle};
use crate::vcpu::ThreadState;

impl Limiter {
    /// Whether member `k` of `e` wants CPU now: running in the guest or the VMM, or stopped
    /// by this limit (not idle, paused, finished or not yet started).
    pub(super) fn wants_cpu(&self, e: &Entity, k: usize) -> bool {
        let v = &self.vcpus[e.members[k]];
        let finished = matches!(v.state(), ThreadState::Finished | ThreadState::Created);
        !finished
            && (e.stopped[k]
                || matches!(
                    v.acct.meter.read().micro_state(),
                    MicroState::Guest | MicroState::Vmm | MicroState::Limited
                ))
    }

    /// At a boundary, before the members are released: who waits its turn in the period that
    /// begins (nobody without a limit, or when the quota gives each member that wants CPU at
    /// least [`crate::limits::turns::TURN_NS`]).
    pub(super) fn plan_turns(&self, e: &mut Entity) {
        let demand: Vec<bool> = (0..e.members.len()).map(|k| self.wants_cpu(e, k)).collect();
        let n = demand.iter().filter(|d| **d).count();
        match e.limit.as_ref().map(|(l, _)| l.quota_ns) {
            Some(quota) => {
                e.benched = bench(quota, &demand, &e.owed);
                e.runners = runners(quota, n);
            }
            None => {
                e.benched.iter_mut().for_each(|b| *b = false);
                e.runners = n;
            }
        }
        e.turns_this_period = e.benched.iter().any(|b| *b);
        e.turn_demand = demand;
    }

    /// At a look: while fewer runners than planned still want CPU, the most owed waiting
    /// member takes its turn; each of `members` is told whether it waits.
    pub(super) fn hand_over_turns(&self, e: &mut Entity, members: &mut [Member]) {
        if e.benched.iter().any(|b| *b) {
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
