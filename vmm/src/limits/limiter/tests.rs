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
        vm_scope: Default::default(),
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
        vm_scope: Default::default(),
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

/// A VM of 2 vCPUs and a limiter holding it to a VM limit of 25 % (the VMM backend, timers).
pub(super) fn vm_limit_of_25_percent() -> (crate::handle::VmHandle, Limiter) {
    let vm = crate::api::tests_support::handle(2);
    let cfg = LimitConfig {
        vm: Some((Limit::parse("25%").unwrap(), "25%".into())),
        groups: Vec::new(),
        backend: Backend::Vmm,
        kick: KickMode::Timer,
        vm_scope: Default::default(),
    };
    let l = Limiter::new(&cfg, vm.vcpus().to_vec(), None, 30_000);
    (vm, l)
}

/// Issue 39: a member that starts after the limit's first period began runs with no share and
/// no deadline until a look sees it, so the limiter looks every `START_POLL_NS` while one has
/// yet to start (4 busy vCPUs on 2 host CPUs start up to 1.1 ms apart, and at 1 ms looks, and
/// only for the first, a 1 ms quota's first period ran 0.4-1.0 ms over), and no more once all
/// have.
#[test]
fn the_limiter_looks_soon_while_a_member_has_yet_to_start() {
    let (vm, l) = vm_limit_of_25_percent();
    let start = 10_000_000_000;
    vm.vcpus()[1].pretend_ran(start, None);
    let mut es = l.lock();
    l.look(&mut es[0], start + 50_000);
    assert_eq!(es[0].period_start, start);
    assert_eq!(
        es[0].next_look,
        Some(start + 50_000 + periods::START_POLL_NS),
        "vCPU 0 has yet to start"
    );
    vm.vcpus()[0].pretend_ran(start + 300_000, None);
    l.look(&mut es[0], start + 350_000);
    let next = es[0].next_look.unwrap();
    assert!(
        next > start + 350_000 + periods::START_POLL_NS,
        "both started: the next look is the decision's, {} µs on",
        (next - start - 350_000) / 1_000
    );
}

/// Issue 39: the first period begins when the first member starts, not when the limiter does
/// (at level full the vCPUs start ~0.5 s later, and a 25 % limit read 22 % over periods that
/// began before any of them), and the last one ends with the last member, its own length
/// counted.
#[test]
fn periods_cover_the_time_the_members_ran() {
    let (vm, l) = vm_limit_of_25_percent();
    let t0 = 10_000_000_000;
    {
        let mut es = l.lock();
        l.look(&mut es[0], t0);
        assert_eq!(es[0].period_start, 0, "no member has started: no period");
        assert_eq!(es[0].next_look, Some(t0 + periods::START_POLL_NS));
        l.look(&mut es[0], t0 + 500_000_000);
        assert_eq!(es[0].period_start, 0);
    }
    // vCPU 1 started 0.6 s after the limiter, vCPU 0 a little later; the limiter looks 1 ms on.
    let start = t0 + 600_000_000;
    vm.vcpus()[1].pretend_ran(start, None);
    vm.vcpus()[0].pretend_ran(start + 200_000, None);
    {
        let mut es = l.lock();
        l.look(&mut es[0], start + 1_000_000);
        assert_eq!(es[0].period_start, start, "from the first member's start");
        assert_eq!(es[0].periods, 0);
    }
    // Both end 250 ms after the start: two whole periods and one of 50 ms.
    let end = start + 250_000_000;
    {
        let mut es = l.lock();
        l.look(&mut es[0], start + 100_000_000);
        l.look(&mut es[0], start + 200_000_000);
    }
    for (k, v) in vm.vcpus().iter().enumerate() {
        v.pretend_ran(start + 200_000 * (1 - k as u64), Some(end - k as u64));
    }
    {
        let mut es = l.lock();
        l.look(&mut es[0], end + 30_000_000);
        assert!(es[0].ended);
        assert_eq!(es[0].next_look, None, "nothing left to look at");
        l.look(&mut es[0], end + 500_000_000);
    }
    let g = &l.groups()[0];
    assert_eq!(g.periods, 3, "{g:?}");
    assert_eq!(g.periods_ns, 250_000_000, "{g:?}");
}

/// A limit set at run time begins at once, whatever its members did before.
#[test]
fn a_limit_set_at_run_time_begins_when_it_is_set() {
    let vm = crate::api::tests_support::handle(1);
    let l = Limiter::new(&LimitConfig::default(), vm.vcpus().to_vec(), None, 30_000);
    vm.vcpus()[0].pretend_ran(1_000_000_000, None);
    l.set_limit("vm", "50%").unwrap();
    let now = crate::sync::now_ns();
    let mut es = l.lock();
    l.look(&mut es[0], now + 1_000);
    assert_eq!(es[0].period_start, es[0].set_at);
    assert!(es[0].set_at <= now && es[0].set_at > 1_000_000_000);
}

/// Scope `vm`: the devices' reserve is last period's use at last period's pace over what is
/// left of the period, so what they leave unused goes back to the vCPUs as it runs out.
#[test]
fn the_device_reserve_runs_out_with_the_period() {
    use super::devices::device_reserve;
    let p = 100_000_000;
    assert_eq!(device_reserve(20_000_000, 0, p), 20_000_000);
    assert_eq!(device_reserve(20_000_000, 25_000_000, p), 15_000_000);
    assert_eq!(device_reserve(20_000_000, 90_000_000, p), 2_000_000);
    assert_eq!(device_reserve(20_000_000, p, p), 0);
    // Late looks (past the boundary) and a zero period keep nothing back.
    assert_eq!(device_reserve(20_000_000, 2 * p, p), 0);
    assert_eq!(device_reserve(20_000_000, 0, 0), 0);
    // No overflow at the largest figures.
    assert_eq!(device_reserve(u64::MAX, 0, u64::MAX), u64::MAX);
}

/// A limit ends with its members' run loops, not with their threads' teardown: at level full
/// closing a vCPU's records took ~0.5 s on the development host, and a 4-vCPU limit counted it
/// as 53 more periods in which nothing ran (charged 91 % of its quota over the run).
#[test]
fn a_limit_ends_where_its_members_loops_ended() {
    let (vm, l) = vm_limit_of_25_percent();
    let start = 10_000_000_000;
    for v in vm.vcpus() {
        v.pretend_ran(start, None);
    }
    let mut es = l.lock();
    l.look(&mut es[0], start + 1_000);
    assert_eq!(es[0].period_start, start);
    // Both loops ended 150 ms in; the threads are still tearing down (not finished).
    for v in vm.vcpus() {
        v.acct
            .ended_ns
            .store(start + 150_000_000, Ordering::Release);
        assert_ne!(v.state(), ThreadState::Finished);
    }
    l.look(&mut es[0], start + 700_000_000);
    assert!(es[0].ended, "every member's loop ended");
    assert_eq!(es[0].periods, 2, "one whole period and the one cut short");
    assert_eq!(es[0].periods_ns, 150_000_000);
    assert_eq!(es[0].next_look, None);
}
