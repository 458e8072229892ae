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
