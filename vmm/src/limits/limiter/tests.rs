//! Unit tests of the limiter: set-limit's checks and queueing, the periods' figures.
use super::*;
use crate::limits::GroupSpec;

#[test]
fn set_limit_checks_and_queues() {
    let vm = crate::api::tests_support::handle(2);
    let g = GroupSpec::parse("a:0-1:50%").unwrap();
    let cfg = LimitConfig {
        vm: None,
        groups: vec![g],
        backend: Backend::Vmm,
        kick: KickMode::Timer,
    };
    let l = Limiter::new(&cfg, vm.vcpus().to_vec(), None, 30_000);
    assert!(matches!(
        l.set_limit("b", "10%"),
        Err(LimitError::NoSuchGroup(_))
    ));
    assert!(matches!(
        l.set_limit("a", "300%"),
        Err(LimitError::OverMembers { .. })
    ));
    assert!(matches!(l.set_limit("a", "0%"), Err(LimitError::Zero(_))));
    l.set_limit("a", "25%").unwrap();
    l.set_limit("vm", "150%").unwrap();
    let groups = l.groups();
    assert_eq!(groups[0].name, "vm");
    assert_eq!(groups[0].quota_ns, 150_000_000);
    assert_eq!(groups[1].limit, "50%", "a change waits for the boundary");
    l.set_limit("vm", "none").unwrap();
}

/// Issue 28: after a limit was changed or removed, what its periods covered is the sum of
/// their lengths (the text report divided by `periods` × the current `period_ns`, 0 once
/// removed, and printed 32947357800 % of one CPU).
#[test]
fn periods_ns_sums_the_length_of_every_completed_period() {
    let vm = crate::api::tests_support::handle(2);
    let cfg = LimitConfig {
        vm: None,
        groups: vec![GroupSpec::parse("a:0-1:50%").unwrap()],
        backend: Backend::Vmm,
        kick: KickMode::Timer,
    };
    let l = Limiter::new(&cfg, vm.vcpus().to_vec(), None, 30_000);
    let close = |n: usize, every: u64, t: &mut u64| {
        for _ in 0..n {
            *t += every;
            let mut es = l.lock();
            l.end_period(&mut es[0], *t, *t);
        }
    };
    let mut t = 1_000_000_000;
    close(2, 100_000_000, &mut t);
    // Applies at the next boundary: the period in progress is still one of 100 ms.
    l.set_limit("a", "3ms/10ms").unwrap();
    close(1, 100_000_000, &mut t);
    close(3, 10_000_000, &mut t);
    l.set_limit("a", "none").unwrap();
    close(1, 10_000_000, &mut t);
    // Without a limit no period is counted.
    close(5, 10_000_000, &mut t);
    let g = &l.groups()[0];
    assert_eq!(g.limit, "none");
    assert_eq!((g.periods, g.period_ns), (7, 0), "{g:?}");
    assert_eq!(g.periods_ns, 3 * 100_000_000 + 4 * 10_000_000, "{g:?}");
    assert!(
        l.period_log("a").is_empty(),
        "no per-period log unless asked for (issue 28: it grew for the whole run)"
    );
    l.keep_period_log();
    l.set_limit("a", "10%").unwrap();
    close(3, 100_000_000, &mut t);
    assert_eq!(l.period_log("a").len(), 3);
    let mut removed = g.clone();
    removed.used_ns = 34_000_000;
    assert_eq!(removed.used_percent(), Some(10.0));
}
