//! Turns (issue 39): under a quota too small to give every busy member [`TURN_NS`] per period,
//! the members take turns instead of all running a sliver of each period. Pure: the limiter
//! thread keeps each member's account (`owed`) and asks these functions at each boundary
//! who waits ([`bench`]), at each look whether a waiting member must take over from one that
//! stopped wanting CPU ([`hand_over`]), and at each close what each member is owed
//! ([`settle`]).
//!
//! Why: every stop costs the guest time the quota does not see (on the PVM development host
//! 60-100 µs of the guest's own time per stop and re-entry, docs/limits.md "Small quotas"), so
//! four busy vCPUs held to 1 ms per 10 ms, each stopped every period after 250 µs, kept 73 %
//! of the quota by their rdtsc. Taking turns, one of them runs the whole millisecond and the
//! others stay parked across the boundary: one stop per period instead of four. The price is
//! a coarser share: each member runs one period in four instead of a quarter of each.
//!
//! Fairness is deficit round robin over periods: at each close every member that wanted CPU
//! is owed its equal share of the quota less what it used; the most owed run next.
//!
//! A turn *straddles* a boundary ([`straddle_share`]): its members are released only their
//! share (and a learnt lead) before the period ends and run on into the next period, where
//! they keep their turn and spend its whole share: one stop and one re-entry serve two
//! periods' shares. [`release_at`] says when they are released, [`before_boundary`] what of
//! their use the closing period is charged.

/// The least CPU a member gets per period before members take turns: where one busy vCPU
/// kept 85.6 % of its quota by its rdtsc on the development host (`bench stops`, 1 ms per
/// 10 ms; 83.2 % at 250 µs), against 69-80 % for four members sharing 1-2 ms.
pub const TURN_NS: u64 = 1_000_000;

/// How many members may run in a period of `quota_ns` when `demanding` want CPU: all of them
/// when each gets at least [`TURN_NS`], else as many as get [`TURN_NS`] each (at least one).
pub fn runners(quota_ns: u64, demanding: usize) -> usize {
    let fit = (quota_ns / TURN_NS).max(1) as usize;
    demanding.min(fit)
}

/// Whether the runners of a period of `period_ns` take a turn that straddles its end, and
/// the share each then has of `quota_ns` (per period, `runners` of them on `cpus` host CPUs):
/// where the members take turns (`turns`) or each runner's share is at most [`TURN_NS`],
/// where the runners can all run at once at the period's end, and where two shares fit in
/// a period. `None`: each runner runs from the period's start, as before straddling.
pub fn straddle_share(
    quota_ns: u64,
    period_ns: u64,
    runners: usize,
    cpus: usize,
    turns: bool,
) -> Option<u64> {
    if runners == 0 || runners > cpus {
        return None;
    }
    let share = quota_ns / runners as u64;
    let small = turns || share <= TURN_NS;
    (small && share > 0 && share.saturating_mul(2) <= period_ns).then_some(share)
}

/// When the runners of a straddled turn are released in the period `[start, end)`: their
/// `share_ns` and a `lead_ns` (what a release is expected to lose before the guest runs:
/// the thread's wake-up and re-entry, learnt) before its end, but not before its start.
pub fn release_at(start: u64, end: u64, share_ns: u64, lead_ns: u64) -> u64 {
    end.saturating_sub(share_ns.saturating_add(lead_ns))
        .max(start)
}

/// What a straddling member used before the boundary, given `used_ns` since the period's
/// start read `late_ns` after the boundary, whether it was running then (`running`: the
/// look's lateness was its CPU too), and how long before the boundary it was released
/// (`released_ns`: its CPU clock cannot have advanced more than the wall clock since).
pub fn before_boundary(used_ns: u64, late_ns: u64, running: bool, released_ns: u64) -> u64 {
    let used = if running {
        used_ns.saturating_sub(late_ns)
    } else {
        used_ns
    };
    used.min(released_ns)
}

/// What a straddled turn's release is expected to lose before its members run the guest
/// (the limiter's lateness, the threads' wake-up, the cold re-entry after a long park),
/// learnt from the shortfalls of the last [`LEAD_WINDOW`] releases: their mean (each bounded
/// by [`MAX_LEAD_NS`]). The mean and not the median: the shortfalls have a long tail (300-450
/// µs where most are 100-200 µs on the development host), and with the median a limit of 1 ms
/// per 10 ms over 4 vCPUs was charged 97.6-98.0 % of its quota; with the mean 99.1-99.8 %
/// (docs/limits.md, "Straddled turns").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseLead {
    samples: [u64; LEAD_WINDOW],
    len: usize,
    next: usize,
    initial_ns: u64,
}

/// Releases a [`ReleaseLead`] learns from.
pub const LEAD_WINDOW: usize = 16;

/// The most a release's lead may be (a sample above it counts as this).
pub const MAX_LEAD_NS: u64 = 2_000_000;

impl ReleaseLead {
    /// A lead that starts at `initial_ns`, until a release taught it.
    pub fn new(initial_ns: u64) -> Self {
        ReleaseLead {
            samples: [0; LEAD_WINDOW],
            len: 0,
            next: 0,
            initial_ns: initial_ns.min(MAX_LEAD_NS),
        }
    }

    /// The lead now, ns.
    pub fn get(&self) -> u64 {
        let held = &self.samples[..self.len];
        match held.len() as u64 {
            0 => self.initial_ns,
            n => held.iter().sum::<u64>() / n,
        }
    }

    /// After a release made with a lead of `lead_ns` fell `short_ns` short of its share
    /// before the boundary (negative: it ran over): the lead that would have made it exact.
    pub fn learn(&mut self, lead_ns: u64, short_ns: i64) {
        let sample = (lead_ns as i64)
            .saturating_add(short_ns)
            .clamp(0, MAX_LEAD_NS as i64) as u64;
        self.samples[self.next] = sample;
        self.next = (self.next + 1) % LEAD_WINDOW;
        self.len = (self.len + 1).min(LEAD_WINDOW);
    }
}

/// Which members wait their turn in a period of `quota_ns`: of those `demanding` at its
/// start, all but the [`runners`] most owed (ties go to the lower index). None when every
/// demanding member may run.
pub fn bench(quota_ns: u64, demanding: &[bool], owed: &[i64]) -> Vec<bool> {
    let mut want: Vec<usize> = (0..demanding.len()).filter(|&k| demanding[k]).collect();
    let run = runners(quota_ns, want.len());
    let mut benched = vec![false; demanding.len()];
    if run == want.len() {
        return benched;
    }
    want.sort_by_key(|&k| (std::cmp::Reverse(owed.get(k).copied().unwrap_or(0)), k));
    for &k in &want[run..] {
        benched[k] = true;
    }
    benched
}

/// Mid-period: while fewer than `runners` members that are not benched still want CPU
/// (`demanding`: a runner went idle or finished), the most owed benched member takes its
/// turn. Returns the members released.
pub fn hand_over(
    benched: &mut [bool],
    demanding: &[bool],
    owed: &[i64],
    runners: usize,
) -> Vec<usize> {
    let mut released = Vec::new();
    loop {
        let running = (0..benched.len())
            .filter(|&k| !benched[k] && demanding.get(k).copied().unwrap_or(false))
            .count();
        if running >= runners {
            return released;
        }
        let next = (0..benched.len())
            .filter(|&k| benched[k])
            .max_by_key(|&k| (owed.get(k).copied().unwrap_or(0), std::cmp::Reverse(k)));
        let Some(k) = next else {
            return released;
        };
        benched[k] = false;
        released.push(k);
    }
}

/// At a period's close, with turns in it: each member that wanted CPU at its start is owed
/// its equal share of `quota_ns` less what it `used`; the others are owed nothing. The
/// account is bounded by a few quotas either way, so a member that wanted CPU once long ago
/// does not hold the others back for long.
pub fn settle(owed: &mut [i64], demanding: &[bool], used: &[u64], quota_ns: u64) {
    let n = demanding.iter().filter(|d| **d).count().max(1) as i64;
    let equal = i64::try_from(quota_ns).unwrap_or(i64::MAX) / n;
    let bound = equal.saturating_mul(4 * n);
    for (k, o) in owed.iter_mut().enumerate() {
        *o = if demanding.get(k).copied().unwrap_or(false) {
            let u = i64::try_from(used.get(k).copied().unwrap_or(0)).unwrap_or(i64::MAX);
            o.saturating_add(equal.saturating_sub(u))
                .clamp(-bound, bound)
        } else {
            0
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_take_turns_only_below_the_turn() {
        assert_eq!(runners(1_000_000, 4), 1);
        assert_eq!(runners(2_500_000, 4), 2);
        assert_eq!(runners(4_000_000, 4), 4, "1 ms each: no turns");
        assert_eq!(runners(250_000, 1), 1);
        assert_eq!(runners(250_000, 0), 0);
        let all = [true; 4];
        assert_eq!(bench(4_000_000, &all, &[0; 4]), vec![false; 4]);
        assert_eq!(
            bench(1_000_000, &all, &[0; 4]),
            vec![false, true, true, true],
            "ties go to the lower index"
        );
        // Idle members neither run nor wait.
        let some = [false, true, false, true];
        assert_eq!(
            bench(1_000_000, &some, &[0; 4]),
            vec![false, false, false, true]
        );
    }

    #[test]
    fn four_busy_members_each_run_one_period_in_four() {
        let quota = 1_000_000;
        let all = [true; 4];
        let mut owed = [0i64; 4];
        let mut ran = [0u32; 4];
        for _ in 0..40 {
            let b = bench(quota, &all, &owed);
            let used: Vec<u64> = b.iter().map(|&w| if w { 0 } else { quota }).collect();
            for (k, &w) in b.iter().enumerate() {
                ran[k] += u32::from(!w);
            }
            settle(&mut owed, &all, &used, quota);
        }
        assert_eq!(ran, [10; 4], "{owed:?}");
        assert!(owed.iter().all(|o| o.unsigned_abs() <= quota));
    }

    #[test]
    fn a_turn_straddles_only_where_it_can_fit_and_run() {
        let p = 10_000_000;
        // Four busy vCPUs under 1 ms per 10 ms on 2 host CPUs: one runs, with turns.
        assert_eq!(straddle_share(1_000_000, p, 1, 2, true), Some(1_000_000));
        // One vCPU at 250 us: no turns, but a share under a turn.
        assert_eq!(straddle_share(250_000, p, 1, 2, false), Some(250_000));
        // 5 ms each: runs from the period's start.
        assert_eq!(straddle_share(5_000_000, p, 1, 2, false), None);
        // With turns, 2 runners of 1.25 ms each on 2 CPUs: both at the end.
        assert_eq!(straddle_share(2_500_000, p, 2, 2, true), Some(1_250_000));
        // More runners than host CPUs could not all run their share at the end.
        assert_eq!(straddle_share(3_000_000, p, 3, 2, true), None);
        // Two shares must fit in a period.
        assert_eq!(straddle_share(6_000_000, p, 1, 2, true), None);
        assert_eq!(straddle_share(1_000_000, p, 0, 2, true), None);
    }

    #[test]
    fn a_straddled_turn_is_released_its_share_and_lead_before_the_end() {
        assert_eq!(release_at(0, 10_000, 1_000, 100), 8_900);
        assert_eq!(
            release_at(0, 10_000, 100, 150),
            9_750,
            "a lead above the share"
        );
        assert_eq!(
            release_at(9_500, 10_000, 1_000, 100),
            9_500,
            "not before the start"
        );
        // Read 30 us late while running: those 30 us are the next period's.
        assert_eq!(before_boundary(1_010_000, 30_000, true, 1_100_000), 980_000);
        // Parked when read: all of it was before.
        assert_eq!(
            before_boundary(1_010_000, 30_000, false, 1_100_000),
            1_010_000
        );
        // Never more than the wall time since the release.
        assert_eq!(
            before_boundary(1_500_000, 30_000, true, 1_100_000),
            1_100_000
        );
    }

    #[test]
    fn the_release_lead_is_the_mean_shortfall() {
        let mut l = ReleaseLead::new(100_000);
        assert_eq!(l.get(), 100_000);
        // Released with 100 us of lead, it ran 50 us short: 150 us would have been exact.
        l.learn(100_000, 50_000);
        assert_eq!(l.get(), 150_000);
        l.learn(150_000, -30_000);
        assert_eq!(l.get(), 135_000);
        // A burst counts, bounded.
        l.learn(135_000, 1_900_000);
        assert_eq!(
            l.get(),
            (150_000 + 120_000 + MAX_LEAD_NS) / 3,
            "clamped to the bound"
        );
        for _ in 0..LEAD_WINDOW {
            l.learn(200_000, 0);
        }
        assert_eq!(l.get(), 200_000, "the window forgets");
        l.learn(0, -500_000);
        assert_eq!(l.get(), 200_000 * 15 / 16, "never below zero");
    }

    #[test]
    fn a_runner_that_goes_idle_hands_its_turn_over() {
        let owed = [0, 300, 500, 0];
        let mut benched = vec![false, true, true, true];
        // The runner still wants CPU: nobody else runs.
        assert!(hand_over(&mut benched, &[true; 4], &owed, 1).is_empty());
        // It went idle: the most owed benched member runs.
        let r = hand_over(&mut benched, &[false, true, true, true], &owed, 1);
        assert_eq!(r, vec![2]);
        assert_eq!(benched, vec![false, true, false, true]);
    }

    #[test]
    fn the_account_is_bounded_and_forgets_idle_members() {
        let mut owed = [0i64, 0];
        for _ in 0..1_000 {
            settle(&mut owed, &[true, true], &[0, 1_000_000], 1_000_000);
        }
        assert_eq!(owed, [4_000_000, -4_000_000], "four quotas at most");
        settle(&mut owed, &[false, true], &[0, 0], 1_000_000);
        assert_eq!(owed, [0, -3_000_000]);
    }
}
