//! The per-vCPU accounting (spec section 4) where it is exact: exit counts, split kinds, reset,
//! pause and run-time level switches, threshold counts. How close the figures come to the
//! guest's own rdtsc measurements, and the identity
//! wall = used + steal + halted + idle + limited + paused, are the accuracy target's
//! (tests/accuracy/accounting.rs).

mod common;

use common::RESET_WORKLOADS;
use common::{
    assert_all_exited_ok, kvm_backend, reported, require_tracefs, run_vm_at, run_vm_traced, serial,
    spawn_vm,
};
use ppa_vmm::accounting::Level;

#[test]
fn exit_counts_are_exact_at_every_level_for_both_kinds() {
    let _g = serial();
    for level in [Level::Off, Level::Basic, Level::Full] {
        for (kind, reason) in [("mmio", "mmio_write"), ("pio", "io_out")] {
            for n in [1u64, 777, 20_000] {
                let out = run_vm_at(1, &[&format!("exits:n={n},kind={kind}")], level);
                assert_all_exited_ok(&out.report);
                let v = &out.report.vcpus[0];
                let protocol = v.tiny().unwrap().doorbells["console"]
                    + v.tiny().unwrap().doorbells["report"]
                    + v.tiny().unwrap().doorbells["exit"];
                let expected = if kind == "mmio" { n + protocol } else { n };
                assert_eq!(v.times.exits[reason], expected, "{level:?} {kind} n={n}");
                let total: u64 = v.times.exits.values().sum();
                assert_eq!(total, n + protocol, "no other exits: {:?}", v.times.exits);
                if n == 20_000 && level != Level::Off {
                    assert_stamp_clock(&v.times);
                }
            }
        }
    }
}

/// A vCPU that took 20,000 exits (hundreds of ms of stamps) says how it took them: extrapolated
/// by the TSC where this host allows it (an invariant TSC that is the kernel's clocksource)
/// unless its rate drifted, vDSO reads where it does not.
fn assert_stamp_clock(t: &ppa_vmm_api::VcpuTimes) {
    use ppa_vmm_api::StampClockMode;
    let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags: Vec<&str> = flags
        .lines()
        .find(|l| l.starts_with("flags"))
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    let invariant = flags.contains(&"constant_tsc") && flags.contains(&"nonstop_tsc");
    let source =
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .unwrap_or_default();
    let allowed = invariant && source.trim() == "tsc";
    let mode = t.stamp_clock;
    match (allowed, t.stamp_clock_drifts) {
        (false, _) => assert_eq!(
            (mode, t.stamp_clock_drifts),
            (Some(StampClockMode::Vdso), 0),
            "clocksource {source:?}, invariant TSC {invariant}"
        ),
        (true, 0) => assert_eq!(mode, Some(StampClockMode::Tsc), "vCPU {}", t.id),
        (true, d) => assert!(
            mode.is_some_and(|m| m != StampClockMode::Vdso),
            "vCPU {}: {mode:?} after {d} drifts",
            t.id
        ),
    }
}

#[test]
fn each_level_reports_its_split_kind() {
    let _g = serial();
    for (level, split) in [
        (Level::Off, ppa_vmm_api::SplitKind::None),
        (Level::Basic, ppa_vmm_api::SplitKind::Estimated),
        (Level::Full, ppa_vmm_api::SplitKind::Exact),
    ] {
        let out = run_vm_at(1, &["busy:ms=50"], level);
        assert_all_exited_ok(&out.report);
        assert_eq!(out.report.vcpus[0].times.split, split, "{level:?}");
    }
}

#[test]
fn reset_restarts_every_field() {
    let _g = serial();
    let (handle, runner) = spawn_vm(2, &RESET_WORKLOADS, Level::Basic);
    std::thread::sleep(std::time::Duration::from_millis(400));
    let before: Vec<_> = (0..2).map(|i| handle.times(i).unwrap().0).collect();
    handle.reset(None).unwrap();
    let after: Vec<_> = (0..2).map(|i| handle.times(i).unwrap()).collect();
    for (b, (a, h)) in before.iter().zip(&after) {
        assert!(b.wall_ns > 300_000_000, "ran a while before the reset");
        assert!(
            a.wall_ns < b.wall_ns / 10,
            "wall restarts: {} then {}",
            b.wall_ns,
            a.wall_ns
        );
        assert!(a.used_ns < b.used_ns / 10 + 1_000_000);
        assert!(a.idle_ns <= b.idle_ns / 10 + 1_000_000);
        let exits_before: u64 = b.exits.values().sum();
        let exits_after: u64 = a.exits.values().sum();
        assert!(
            exits_after < exits_before.max(10),
            "{exits_after} vs {exits_before}"
        );
        assert!(h.guest_run.count() <= 2, "histograms restart");
    }
    assert!(handle.reset(Some(5)).is_err(), "no vCPU 5");
    let out = runner.join().unwrap();
    assert_all_exited_ok(&out.report);
    for (v, b) in out.report.vcpus.iter().zip(&before) {
        assert!(
            v.times.wall_ns < 700_000_000 && v.times.wall_ns + b.wall_ns > 800_000_000,
            "vCPU {} wall since reset {} (before: {})",
            v.times.id,
            v.times.wall_ns,
            b.wall_ns
        );
    }
}

#[test]
fn pause_freezes_used_time_and_accounts_paused_time() {
    let _g = serial();
    let (handle, runner) = common::spawn_and_pause();
    assert!(handle.paused());
    // Wait until both vCPUs are parked as paused.
    while (0..2).any(|i| handle.times(i).unwrap().0.state != ppa_vmm_api::VcpuMicroState::Paused) {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let a: Vec<_> = (0..2).map(|i| handle.times(i).unwrap().0).collect();
    std::thread::sleep(std::time::Duration::from_millis(250));
    let b: Vec<_> = (0..2).map(|i| handle.times(i).unwrap().0).collect();
    for (x, y) in a.iter().zip(&b) {
        // While paused, a vCPU uses (almost) no CPU and its paused time grows with the wall.
        assert!(
            y.used_ns - x.used_ns < 5_000_000,
            "used grew {} ns while paused",
            y.used_ns - x.used_ns
        );
        let grew = y.paused_ns - x.paused_ns;
        let wall = y.wall_ns - x.wall_ns;
        assert!(
            grew * 10 >= wall * 9,
            "paused grew {grew} of {wall} ns wall"
        );
        let exits_x: u64 = x.exits.values().sum();
        let exits_y: u64 = y.exits.values().sum();
        assert_eq!(exits_x, exits_y, "no exits while paused");
    }
    handle.resume();
    assert!(!handle.paused());
    let out = runner.join().unwrap();
    assert_all_exited_ok(&out.report);
    for v in &out.report.vcpus {
        assert!(
            v.times.paused_ns >= 250_000_000,
            "vCPU {} paused {}",
            v.times.id,
            v.times.paused_ns
        );
    }
    // The guests' own clocks saw the pause as lost time (busy) or a late period (periodic).
    assert!(reported(&out.report.vcpus[0], "lost_ns") >= 250_000_000);
}

#[test]
fn level_switches_at_run_time() {
    let _g = serial();
    // A periodic guest lasts 0.6 s whatever an exit costs on the host, and exits every period.
    let (handle, runner) = spawn_vm(
        1,
        &["periodic:run_us=100,period_us=1000,count=600"],
        Level::Off,
    );
    // Switch once the guest has made some exits at level off.
    while handle.times(0).unwrap().0.exits["mmio_write"] < 50 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    handle.set_level(Level::Full);
    assert_eq!(handle.level(), Level::Full);
    let out = runner.join().unwrap();
    let v = &out.report.vcpus[0];
    assert_all_exited_ok(&out.report);
    assert_eq!(reported(v, "iterations"), 600);
    // Exits before the switch were untimed, those after it exact.
    assert_eq!(
        v.times.split,
        ppa_vmm_api::SplitKind::Mixed,
        "{:?}",
        v.times
    );
    let timed = v.histograms["exit_handling"].count;
    let exits: u64 = v.times.exits.values().sum();
    assert!(timed > 0 && timed < exits, "timed {timed} of {exits} exits");
    assert_eq!(
        v.tiny().unwrap().doorbells["halt"]
            + v.tiny().unwrap().doorbells["report"]
            + v.tiny().unwrap().doorbells["exit"]
            + v.tiny().unwrap().doorbells["console"],
        exits
    );
}

#[test]
fn thresholds_count_occurrences() {
    let _g = serial();
    let mut vm_opts = ppa_vmm::config::RunOptions {
        vcpus: Some(1),
        workload: vec!["periodic:run_us=300,period_us=3000,count=50".into()],
        threshold: vec!["guest_run_ns=100000".into(), "exit_handling_ns=1".into()],
        ..Default::default()
    };
    vm_opts.max_runtime = Some(60.0);
    common::require_kvm();
    let (config, _) = vm_opts.into_config().unwrap();
    let out = ppa_vmm::vm::Vm::try_from(config).unwrap().run().unwrap();
    let v = &out.report.vcpus[0];
    // The threshold counts the same runs the guest_run histogram records: the runs in the
    // histogram's slots wholly above 100 µs, and at most those of the slot holding 100 µs
    // too. (How many runs exceed 100 µs depends on the host: each period spins ~300 µs and
    // halts, but under steal a period is cut short or joins the next one.)
    let runs_above = v.times.thresholds["guest_run_ns"];
    let run_hist = &v.histograms["guest_run"];
    let over = |edge: fn(&ppa_vmm_api::SlotJson) -> u64| -> u64 {
        run_hist
            .slots
            .iter()
            .filter(|s| edge(s) > 100_000)
            .map(|s| s.count)
            .sum()
    };
    let (surely, maybe) = (over(|s| s.lo), over(|s| s.hi + 1));
    assert!(
        (surely..=maybe).contains(&runs_above) && (1..=60).contains(&runs_above),
        "guest runs above 100 µs: {runs_above}, the histogram says {surely} to {maybe}"
    );
    // Every exit's handling takes more than 1 ns.
    let exits: u64 = v.times.exits.values().sum();
    assert!(v.times.thresholds["exit_handling_ns"] >= exits - 2);
    let hist = &v.histograms["guest_run"];
    assert_eq!(hist.count, exits, "one KVM_RUN per exit");
}

/// Spec section 4: every figure is non-decreasing between resets, live reads included. On 2
/// host CPUs, 6 vCPUs wait for a CPU most of the time, so a read often finds a run-queue wait
/// under way (schedstat counts it only when it ends); the exit-heavy and the periodic vCPUs
/// also find halts, parks and exit handling in progress.
#[test]
fn live_figures_never_go_down() {
    let _g = serial();
    for level in [Level::Basic, Level::Full, Level::Off] {
        let (handle, runner) = spawn_vm(
            6,
            &[
                "0=busy:ms=1500",
                "1=busy:ms=1500",
                "2=busy:ms=1500",
                "3=exits:n=40000,kind=mmio",
                "4=periodic:run_us=300,period_us=2000,count=700",
                "5=idle:ms=1200",
            ],
            level,
        );
        let mut last: Vec<Option<ppa_vmm_api::TimeSplit>> = vec![None; 6];
        let (mut reads, mut drops) = (0u64, Vec::new());
        let t0 = std::time::Instant::now();
        while t0.elapsed() < std::time::Duration::from_millis(1300) {
            for (i, prev) in last.iter_mut().enumerate() {
                let now = handle.times(i).unwrap().0.split();
                if let Some(p) = prev {
                    for (k, (a, b)) in p.values().iter().zip(now.values()).enumerate() {
                        if b < *a {
                            drops.push((i, ppa_vmm_api::TimeSplit::NAMES[k], *a - b));
                        }
                    }
                }
                reads += 1;
                *prev = Some(now);
            }
            std::thread::sleep(std::time::Duration::from_micros(300));
        }
        let out = runner.join().unwrap();
        assert_all_exited_ok(&out.report);
        // Enough reads to catch a figure going down (~4,000 on a quiet host, fewer when loaded).
        assert!(reads > 200, "{level:?}: {reads} reads");
        // The held live figures after the end still add up, like the report's exact ones (a
        // shortfall the host's own steal explains allowed, as everywhere: `assert_identity`;
        // CI, level off: 9.5 ms of 1.5 s missing, over the 0.5 % tolerance).
        let host_steal = out.report.vm.host_steal_ns.unwrap_or(0);
        for (i, v) in out.report.vcpus.iter().enumerate() {
            let held = handle.times(i).unwrap().0;
            assert!(
                common::identity_explained(held.wall_ns, held.identity_error_ns, host_steal),
                "{level:?} vCPU {i} (host steal {host_steal} ns): {held:?}"
            );
            common::assert_identity(&out.report, v);
        }
        assert!(
            drops.is_empty(),
            "{level:?}: {} of {reads} reads went down (vCPU, figure, by ns), first: {:?}",
            drops.len(),
            &drops[..drops.len().min(12)]
        );
    }
}

/// Level full's kernel tracepoints on this host: the interrupts the busy vCPU's thread takes
/// (the host's timer ticks land on it) become interrupted_ns, out of guest_ns; KVM's own
/// `kvm_exit`/`kvm_entry` do not fire under PVM (docs/accounting.md), so kvm_ns stays null
/// with that reason. On a VMX/SVM host the same run measures kvm_ns instead, and its in-kernel
/// exits with the userspace ones make up KVM's `exits` statistic exactly.
#[test]
fn kernel_tracepoints_split_host_interrupts_out_and_say_why_kvm_ns_is_null() {
    let _g = serial();
    require_tracefs();
    // The machine below takes time from the thread while it is on its CPU (its steal): the
    // records count that time inside KVM_RUN (wall less off-CPU episodes), the thread's CPU
    // clock, which used_ns and so the parts come from, leaves it out (this guest kernel
    // accounts paravirt steal). It is bounded by the platform's share, measured beside the
    // run (the larger of before and after: it comes in bursts). Found in CI rehearsals, 5 of
    // 18 runs failing by 0.9-3.9 % of the run with only the 0.5 % tolerance. A burst inside the
    // run that neither measurement saw (CI, 2026-11-28: 7.3 % short, platform 5.52 %) shows in
    // the run's own host steal (`vm.host_steal_ns`, /proc/stat ticks): where that counted any,
    // it and one tick per host CPU bound the shortfall too, as in `common::assert_identity`.
    let before = common::platform_interrupt_share(300);
    let out = run_vm_traced(
        2,
        &["0=busy:ms=300", "1=exits:n=3000,kind=mmio"],
        Level::Full,
        true,
    );
    let platform = before.max(common::platform_interrupt_share(300));
    assert_all_exited_ok(&out.report);
    for v in &out.report.vcpus {
        let t = &v.times;
        let irq = t
            .interrupted_ns
            .unwrap_or_else(|| panic!("vCPU {}: {:?}", t.id, t.interrupted_reason));
        assert_eq!(t.interrupted_reason, None);
        assert_eq!(
            t.guest_ns + t.kvm_ns.unwrap_or(0) + irq + t.vmm_ns,
            t.used_ns,
            "vCPU {}: used = guest + kvm + interrupted + vmm",
            t.id
        );
        assert!(t.identity_holds(true), "vCPU {}: {t:?}", t.id);
        assert_eq!(t.records_lost, 0, "vCPU {}", t.id);
        // What ran inside KVM_RUN, as the records measured it run by run, against the split's
        // parts measured apart (interrupted_ns also holds the interrupts of exit handling).
        let in_run = t.kvm_run_cpu_ns.expect("a run at level full");
        let parts = t.guest_ns + t.kvm_ns.unwrap_or(0) + irq;
        let tol = ppa_vmm_api::TimeSplit::identity_tolerance_ns(t.wall_ns, true);
        let host_steal = out.report.vm.host_steal_ns.unwrap_or(0);
        let stolen = if host_steal > 0 {
            host_steal + 20_000_000
        } else {
            0
        };
        let below = ((in_run as f64 * platform) as u64).max(stolen);
        assert!(
            parts + tol + below >= in_run && parts <= in_run + irq + tol,
            "vCPU {}: {parts} ns of parts against {in_run} ns inside KVM_RUN (platform {:.2} %, \
             host steal {host_steal} ns)",
            t.id,
            100.0 * platform
        );
        match kvm_backend() {
            Some("kvm_pvm") => {
                assert_eq!(t.kvm_ns, None, "vCPU {}", t.id);
                let why = t.kvm_ns_reason.as_deref().unwrap_or("");
                assert!(
                    why.contains("did not fire kvm:kvm_entry") && why.contains("kvm_pvm"),
                    "vCPU {}: {why}",
                    t.id
                );
                assert!(t.kvm_exits.is_empty() && t.kvm_exits_to_user == 0);
                assert_eq!(t.split_source, ppa_vmm_api::SplitSource::Records);
                // The silent tracepoints are turned off, not closed, while the vCPU runs:
                // closing one waits for an RCU grace period (36-46 ms here), and the thread
                // was blocked for two of them inside its wall time at every start. A busy
                // vCPU that never halts has no other reason to sleep than such a wait.
                assert!(
                    t.blocked_ns < 20_000_000,
                    "vCPU {}: blocked {} ns outside parks: {t:?}",
                    t.id,
                    t.blocked_ns
                );
            }
            _ => {
                assert!(t.kvm_ns.is_some_and(|k| k > 0), "vCPU {}: {t:?}", t.id);
                let in_kernel: u64 = t.kvm_exits.values().sum();
                assert_eq!(
                    in_kernel + t.kvm_exits_to_user,
                    t.kvm_stats["exits"],
                    "vCPU {}",
                    t.id
                );
                assert_eq!(t.split_source, ppa_vmm_api::SplitSource::Tracepoints);
            }
        }
    }
    // The busy vCPU spun 300 ms on a CPU that takes the host's timer ticks (HZ 250 and more):
    // they landed on its thread, and their time is no longer guest time.
    let busy = &out.report.vcpus[0].times;
    let ticks = busy.interrupts.get("local_timer").copied().unwrap_or(0);
    assert!(ticks >= 10, "local timer interrupts: {:?}", busy.interrupts);
    let irq = busy.interrupted_ns.unwrap();
    assert!(irq > 0 && irq < busy.used_ns / 5, "{busy:?}");

    // Without the tracepoints, or below level full, nothing is split out, and the reports say
    // why.
    for (level, trace, why) in [
        (Level::Full, false, "turned off"),
        (Level::Basic, true, "level full only"),
    ] {
        let out = run_vm_traced(1, &["busy:ms=50"], level, trace);
        assert_all_exited_ok(&out.report);
        let t = &out.report.vcpus[0].times;
        assert_eq!(
            (t.kvm_ns, t.interrupted_ns),
            (None, None),
            "{level:?} {trace}"
        );
        for reason in [&t.kvm_ns_reason, &t.interrupted_reason] {
            let r = reason.as_deref().unwrap_or("");
            assert!(r.contains(why), "{level:?} {trace}: {r}");
        }
        assert!(t.interrupts.is_empty());
        assert_eq!(t.guest_ns + t.vmm_ns, t.used_ns);
    }
}
