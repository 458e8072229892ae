//! The decision of one limit at one instant: which members must stop, and when to look again.
//! Pure: the limiter thread feeds it CPU times it read; tests feed it numbers.
//!
//! Sharing (docs/limits.md): the budget of a period is shared max-min fairly among the
//! members that want CPU ("demanding": running, or stopped by this limit). Members that idle
//! leave their unused part to the others, except what they used in the previous period (up
//! to an equal share), which they are likely to want again. With `B` = quota − what idle
//! members used and keep, the fair share `f` is the level at which `Σ max(used_i, f) = B`
//! over the demanding members; a
//! member whose remaining share `f − used_i` is within the stop margin (the time a kick takes
//! to get a vCPU out of KVM_RUN) is stopped, and released again if the share grows (another
//! member went idle). Each member runs on at most one CPU, so no member can pass its share
//! before `f − used_i − margin` from now (its *runway*): that is when the limiter looks again,
//! or, with kick timers, what the member's own timer is armed for (the limiter then looks
//! only for the pool of several runnable members and as a fallback). Together the members run
//! on at most as many CPUs as the host lets them (`cpus`), so the pool cannot be spent before
//! what is left of it divided by the smaller of that and the runnable members: with 64 vCPUs
//! on 2 host CPUs the pool's bound is 32 times later than with one CPU per member.

/// What the limiter knows of one member now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Member {
    /// CPU time used in this period.
    pub used_ns: u64,
    /// Wants CPU: running, or stopped by this limit (not idle, paused or finished).
    pub demanding: bool,
    /// Stopped by this limit now.
    pub stopped: bool,
    /// May run before the next look (not finished): an idle member can wake up at any time.
    pub can_run: bool,
    /// What it used in the previous period: an idle member keeps this much of the budget
    /// (up to an equal share), since it is likely to wake and want it again.
    pub expected_ns: u64,
    /// Waits its turn this period ([`super::turns`]): stopped, and out of the sharing.
    pub benched: bool,
}

/// The decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether each member must be stopped (in member order).
    pub stop: Vec<bool>,
    /// Look again after this long (`None`: nothing can change before the period ends).
    pub recheck_ns: Option<u64>,
    /// The fair share of the period's budget per demanding member.
    pub share_ns: u64,
    /// For each member that may run on (not stopped, not finished): the CPU time it may still
    /// use before it must stop, its remaining share less the margin (what a kick timer is armed
    /// for); `None` for the others.
    pub runway_ns: Vec<Option<u64>>,
    /// When several members may run: look again after this long, before they could together
    /// spend what is left of the quota (no member's own runway shows that).
    pub pool_recheck_ns: Option<u64>,
}

/// Shortest time between two looks, so a member close to its share is not polled in a loop.
pub const MIN_RECHECK_NS: u64 = 20_000;

/// Fair share: the level `f` with `Σ max(used_i, f) = budget` over `used` (any order).
pub fn fair_share(budget: u64, used: &[u64]) -> u64 {
    let mut sorted: Vec<u64> = used.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let mut rest = budget;
    let mut n = sorted.len() as u64;
    for &u in &sorted {
        if n == 0 {
            break;
        }
        let f = rest / n;
        if u <= f {
            return f;
        }
        // This member already used more than an equal share: it keeps what it used.
        rest = rest.saturating_sub(u);
        n -= 1;
    }
    rest.checked_div(n).unwrap_or(0)
}

/// Decides for a limit of `quota_ns` per period, given its members now and the number of host
/// CPUs they can run on (`cpus`).
pub fn decide(quota_ns: u64, members: &[Member], margin_ns: u64, cpus: usize) -> Decision {
    let equal = quota_ns / members.len().max(1) as u64;
    // What idle members used, plus what they are expected to want again this period.
    let claim = |m: &Member| {
        let reserve = if m.can_run {
            m.expected_ns.min(equal).saturating_sub(m.used_ns)
        } else {
            0
        };
        m.used_ns + reserve
    };
    // A member waiting its turn keeps what it used (nothing, unless it ran before the turns).
    let idle_claim: u64 = members
        .iter()
        .map(|m| match (m.benched, m.demanding) {
            (true, _) => m.used_ns,
            (false, false) => claim(m),
            (false, true) => 0,
        })
        .sum();
    let budget = quota_ns.saturating_sub(idle_claim);
    let demanding: Vec<u64> = members
        .iter()
        .filter(|m| m.demanding && !m.benched)
        .map(|m| m.used_ns)
        .collect();
    let share = fair_share(budget, &demanding);
    let mut recheck: Option<u64> = None;
    let mut look_by = |t: u64| recheck = Some(recheck.map_or(t, |r: u64| r.min(t)));
    let mut runway_ns = vec![None; members.len()];
    let stop: Vec<bool> = members
        .iter()
        .zip(runway_ns.iter_mut())
        .map(|(m, runway)| {
            if m.benched {
                return true;
            }
            let left = if m.demanding {
                share.saturating_sub(m.used_ns)
            } else if m.can_run {
                // What it could use if it woke now. An idle member with nothing left is
                // stopped where it sleeps: it parks as limited when it wakes, and the limiter
                // need not watch it until the period ends.
                let mut with = demanding.clone();
                with.push(m.used_ns);
                fair_share(budget + claim(m), &with).saturating_sub(m.used_ns)
            } else {
                return false;
            };
            // Hysteresis: a stopped member is released only with room for a few margins.
            let keep_stopped = m.stopped && left <= 4 * margin_ns;
            let must_stop = left <= margin_ns || keep_stopped;
            if !must_stop {
                *runway = Some(left - margin_ns);
                look_by((left - margin_ns).max(MIN_RECHECK_NS));
            }
            must_stop
        })
        .collect();
    // Together, the members that may run can use at most one CPU each, and no more CPUs than
    // the host has for them: look again before they could spend the whole budget. Only a
    // member on a CPU runs on for the stop margin after its stop.
    let runnable = members
        .iter()
        .zip(&stop)
        .filter(|(m, s)| m.can_run && !**s)
        .count() as u64;
    let mut pool_recheck_ns = None;
    if runnable > 0 {
        let on_cpu = runnable.min(cpus.max(1) as u64);
        let used: u64 = members.iter().map(|m| m.used_ns).sum();
        let pool = quota_ns
            .saturating_sub(used)
            .saturating_sub(on_cpu * margin_ns);
        let t = (pool / on_cpu).max(MIN_RECHECK_NS);
        look_by(t);
        // One runnable member cannot pass the pool before its own runway ends.
        pool_recheck_ns = (runnable > 1).then_some(t);
    }
    Decision {
        stop,
        recheck_ns: recheck,
        share_ns: share,
        runway_ns,
        pool_recheck_ns,
    }
}

/// When to look again after decision `d`, with kick timers on the members `timed` (true: the
/// member's own timer stops it at the end of its runway): the pool's bound, each untimed
/// member's runway, and each timed member's runway plus the fallback delay
/// ([`super::limiter::FALLBACK_NS`]) but not before [`super::limiter::FALLBACK_LOOK_MIN_NS`],
/// whichever comes first, at least [`MIN_RECHECK_NS`] from now. Without timers this is
/// `d.recheck_ns`. `None`: not before the period ends.
pub fn next_look_ns(d: &Decision, timed: &[bool]) -> Option<u64> {
    if !timed.iter().any(|t| *t) {
        return d.recheck_ns;
    }
    d.runway_ns
        .iter()
        .zip(timed)
        .filter_map(|(r, &t)| {
            r.map(|r| {
                if t {
                    (r + super::limiter::FALLBACK_NS).max(super::limiter::FALLBACK_LOOK_MIN_NS)
                } else {
                    r
                }
            })
        })
        .chain(d.pool_recheck_ns)
        .map(|r| r.max(MIN_RECHECK_NS))
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host with a CPU for every member (the bound of the pool is then the members').
    const MANY: usize = 1024;

    fn m(used_ns: u64, demanding: bool) -> Member {
        Member {
            used_ns,
            demanding,
            stopped: false,
            can_run: true,
            expected_ns: 0,
            benched: false,
        }
    }

    #[test]
    fn fair_share_is_max_min() {
        assert_eq!(fair_share(100, &[0, 0]), 50);
        assert_eq!(fair_share(100, &[70, 0]), 30, "the heavy one keeps its 70");
        assert_eq!(fair_share(100, &[10, 20]), 50);
        assert_eq!(fair_share(100, &[]), 0);
        assert_eq!(fair_share(100, &[200, 0]), 0, "overspent: nothing left");
        assert_eq!(fair_share(90, &[30, 30, 30]), 30);
    }

    #[test]
    fn one_member_runs_to_its_quota_less_the_margin() {
        let d = decide(25_000_000, &[m(0, true)], 30_000, MANY);
        assert_eq!(d.stop, vec![false]);
        assert_eq!(d.recheck_ns, Some(25_000_000 - 30_000));
        let d = decide(25_000_000, &[m(24_980_000, true)], 30_000, MANY);
        assert_eq!(d.stop, vec![true], "within the margin: stop now");
        assert_eq!(d.recheck_ns, None);
    }

    #[test]
    fn idle_members_leave_their_part_to_the_others() {
        // Two members, 50 ms; one idles after 5 ms: the other may use 45.
        let d = decide(
            50_000_000,
            &[m(20_000_000, true), m(5_000_000, false)],
            30_000,
            MANY,
        );
        assert_eq!(d.share_ns, 45_000_000);
        assert_eq!(d.stop, vec![false, false]);
        // Both demanding at 25 ms each: both stop.
        let d = decide(
            50_000_000,
            &[m(25_000_000, true), m(25_000_000, true)],
            30_000,
            MANY,
        );
        assert_eq!(d.stop, vec![true, true]);
        // One stopped at its share; the other goes idle having used less: the first is
        // released to use the rest.
        let stopped = Member {
            used_ns: 25_000_000,
            demanding: true,
            stopped: true,
            can_run: true,
            expected_ns: 0,
            benched: false,
        };
        let d = decide(50_000_000, &[stopped, m(10_000_000, false)], 30_000, MANY);
        assert_eq!(d.stop, vec![false, false], "released: 15 ms are free");
        assert!(d.recheck_ns.unwrap() <= 15_000_000);
    }

    #[test]
    fn idle_members_are_looked_at_before_they_could_overrun() {
        // One member idle, one demanding at 10 of 50: the idle one could take 25 if it woke.
        let d = decide(
            50_000_000,
            &[m(10_000_000, true), m(0, false)],
            30_000,
            MANY,
        );
        assert_eq!(
            d.recheck_ns,
            Some(20_000_000 - 30_000),
            "both together: 40 ms left"
        );
        // A finished member is not waited for.
        let mut done = m(0, false);
        done.can_run = false;
        let d = decide(50_000_000, &[m(10_000_000, true), done], 30_000, MANY);
        assert_eq!(d.recheck_ns, Some(40_000_000 - 30_000));
    }

    #[test]
    fn members_that_start_together_cannot_overrun_the_pool() {
        // Four members that have not started: each could take the whole budget alone, but
        // together they could spend it four times as fast.
        let idle = [m(0, false), m(0, false), m(0, false), m(0, false)];
        let d = decide(100_000_000, &idle, 30_000, MANY);
        assert_eq!(d.recheck_ns, Some((100_000_000 - 4 * 30_000) / 4));
    }

    #[test]
    fn an_idle_member_keeps_what_it_used_last_period() {
        // A periodic member used 10 of its 30 last period and idles now: the busy member may
        // use 50, not 60, and the periodic one still gets its 10 when it wakes.
        let mut periodic = m(2_000_000, false);
        periodic.expected_ns = 10_000_000;
        let d = decide(60_000_000, &[m(0, true), periodic], 30_000, MANY);
        assert_eq!(d.share_ns, 50_000_000);
        let mut periodic = m(2_000_000, true);
        periodic.expected_ns = 10_000_000;
        let d = decide(60_000_000, &[m(50_000_000, true), periodic], 30_000, MANY);
        assert_eq!(d.stop, vec![true, false], "the periodic one runs on");
    }

    #[test]
    fn the_runway_is_the_share_left_less_the_margin() {
        // One member at 10 of 25 ms: 15 ms left, 30 µs margin.
        let d = decide(25_000_000, &[m(10_000_000, true)], 30_000, MANY);
        assert_eq!(d.runway_ns, vec![Some(15_000_000 - 30_000)]);
        assert_eq!(
            d.pool_recheck_ns, None,
            "one member: its runway is the bound"
        );
        // Stopped and finished members have none; an idle one has what it could use if it woke.
        let mut done = m(0, false);
        done.can_run = false;
        let d = decide(
            50_000_000,
            &[m(25_000_000, true), done, m(5_000_000, false)],
            30_000,
            MANY,
        );
        assert_eq!(d.stop, vec![false, false, false]);
        assert_eq!(d.runway_ns[1], None);
        assert_eq!(
            d.runway_ns[0],
            Some(50_000_000 - 25_000_000 - 5_000_000 - 30_000)
        );
        // Two runnable members: the pool is the earlier bound, and is reported as such.
        let d = decide(
            50_000_000,
            &[m(10_000_000, true), m(10_000_000, true)],
            30_000,
            MANY,
        );
        assert_eq!(d.runway_ns, vec![Some(15_000_000 - 30_000); 2]);
        assert_eq!(d.pool_recheck_ns, Some((30_000_000 - 60_000) / 2));
        let d = decide(25_000_000, &[m(24_990_000, true)], 30_000, MANY);
        assert_eq!(d.runway_ns, vec![None], "stopped: no runway");
    }

    #[test]
    fn with_timers_the_limiter_looks_after_the_deadline_or_for_the_pool() {
        use crate::limits::limiter::FALLBACK_NS;
        let one = decide(25_000_000, &[m(10_000_000, true)], 30_000, MANY);
        assert_eq!(next_look_ns(&one, &[false]), one.recheck_ns);
        assert_eq!(
            next_look_ns(&one, &[true]),
            Some(15_000_000 - 30_000 + FALLBACK_NS),
            "the timer stops it; the look is the fallback"
        );
        // Two members, one without a timer: its runway; the pool bound is the same here.
        let two = decide(
            50_000_000,
            &[m(10_000_000, true), m(20_000_000, true)],
            30_000,
            MANY,
        );
        let untimed = two.runway_ns[1].unwrap();
        assert_eq!(next_look_ns(&two, &[true, false]), Some(untimed));
        assert_eq!(
            next_look_ns(&two, &[true, true]),
            Some(untimed + FALLBACK_NS)
        );
        // A busy member and an idle one that could wake: together they could spend the pool
        // before either runway ends, so the pool bound decides.
        let pool = decide(
            50_000_000,
            &[m(10_000_000, true), m(0, false)],
            30_000,
            MANY,
        );
        assert_eq!(pool.pool_recheck_ns, Some((40_000_000 - 60_000) / 2));
        assert_eq!(next_look_ns(&pool, &[true, true]), pool.pool_recheck_ns);
        // Stopped members do not bring the look forward.
        let stopped = decide(25_000_000, &[m(24_990_000, true)], 30_000, MANY);
        assert_eq!(next_look_ns(&stopped, &[true]), None);
    }

    #[test]
    fn a_timed_members_fallback_look_is_not_sooner_than_the_floor() {
        use crate::limits::limiter::{FALLBACK_LOOK_MIN_NS, FALLBACK_NS};
        // 200 µs of runway: its timer stops it; the thread looks at the floor, not at 300 µs.
        let short = decide(25_000_000, &[m(25_000_000 - 230_000, true)], 30_000, MANY);
        assert_eq!(short.runway_ns, vec![Some(200_000)]);
        const { assert!(200_000 + FALLBACK_NS < FALLBACK_LOOK_MIN_NS) };
        assert_eq!(next_look_ns(&short, &[true]), Some(FALLBACK_LOOK_MIN_NS));
        // Untimed, the same member is looked at when its runway ends.
        assert_eq!(next_look_ns(&short, &[false]), Some(200_000));
        // The pool bound is not floored: two members that could spend it in 150 µs.
        let pool = decide(
            10_000_000,
            &[m(4_800_000, true), m(4_800_000, true)],
            30_000,
            MANY,
        );
        assert_eq!(pool.pool_recheck_ns, Some((400_000 - 60_000) / 2));
        assert_eq!(next_look_ns(&pool, &[true, true]), pool.pool_recheck_ns);
    }

    #[test]
    fn the_pool_is_spent_no_faster_than_the_host_has_cpus() {
        // 64 busy members, 100 ms per period, 10 ms used: with a CPU each they could spend the
        // other 90 ms (less 64 margins) in 1.4 ms; on 2 host CPUs it takes 45 ms (less 2
        // margins), so the limiter need not look before.
        let busy = vec![m(10_000_000 / 64, true); 64];
        let many = decide(100_000_000, &busy, 30_000, MANY);
        let two = decide(100_000_000, &busy, 30_000, 2);
        let used: u64 = busy.iter().map(|b| b.used_ns).sum();
        let left = 100_000_000 - used;
        assert_eq!(many.pool_recheck_ns, Some((left - 64 * 30_000) / 64));
        assert_eq!(two.pool_recheck_ns, Some((left - 2 * 30_000) / 2));
        // Who stops, and each member's runway, do not depend on the host.
        assert_eq!((&two.stop, &two.runway_ns), (&many.stop, &many.runway_ns));
        // More CPUs than runnable members: the members bound it, as before.
        let pair = [m(10_000_000, true), m(0, false)];
        assert_eq!(
            decide(50_000_000, &pair, 30_000, 8).pool_recheck_ns,
            decide(50_000_000, &pair, 30_000, MANY).pool_recheck_ns
        );
        // No CPU known counts as one.
        assert_eq!(
            decide(100_000_000, &busy, 30_000, 0).pool_recheck_ns,
            Some(left - 30_000)
        );
    }

    #[test]
    fn a_member_waiting_its_turn_is_stopped_and_out_of_the_share() {
        let mut waiting = m(0, true);
        waiting.benched = true;
        waiting.stopped = true;
        let d = decide(1_000_000, &[m(0, true), waiting, waiting], 30_000, MANY);
        assert_eq!(d.stop, vec![false, true, true]);
        assert_eq!(d.share_ns, 1_000_000, "the runner has the whole quota");
        assert_eq!(d.runway_ns, vec![Some(1_000_000 - 30_000), None, None]);
        assert_eq!(d.pool_recheck_ns, None, "one runnable member");
    }

    #[test]
    fn recheck_is_bounded_below() {
        let d = decide(1_000_000, &[m(1_000_000 - 45_000, true)], 30_000, MANY);
        assert_eq!(d.stop, vec![false]);
        assert_eq!(d.recheck_ns, Some(MIN_RECHECK_NS));
    }
}
