//! Unit tests of the snapshot: resets, parks, derived fields.

use std::collections::BTreeMap;

use super::off_cpu::{off_cpu_split, records_on_cpu, OffCpuInputs};
use super::*;
use crate::accounting::meter::ParkKind;
use crate::accounting::{ByKey, Threshold};
use crate::exit::ExitReason;
use ppa_vmm_api::SplitKind;

fn accounting() -> VcpuAccounting {
    VcpuAccounting::new(Arc::new(VcpuMeter::new(3, 1)), None, None)
}

#[test]
fn threshold_counts_by_name_restart_at_a_reset() {
    let acct = accounting();
    let m = &acct.meter;
    m.exceeded[Threshold::GuestRun].add(2);
    m.exceeded[Threshold::StealWindow].add(3);
    let t = acct.times().0;
    let expect = |g, s| -> BTreeMap<String, u64> {
        [
            ("exit_handling_ns".to_string(), 0),
            ("guest_run_ns".to_string(), g),
            ("wakeup_latency_ns".to_string(), 0),
            ("steal_window_ns".to_string(), s),
        ]
        .into()
    };
    assert_eq!(t.thresholds, expect(2, 3));
    assert!(acct.times_with(false).0.thresholds.is_empty());
    acct.reset();
    m.exceeded[Threshold::StealWindow].add(1);
    assert_eq!(acct.times().0.thresholds, expect(0, 1));
}

#[test]
fn the_overview_lists_the_exit_reasons_that_occurred_and_the_detail_all() {
    let acct = accounting();
    acct.meter.exits[ExitReason::MmioWrite.index()].add(4);
    let overview = acct.times_with(false).0.exits;
    assert_eq!(
        overview,
        BTreeMap::from([(ExitReason::MmioWrite.name().to_string(), 4)])
    );
    let detail = acct.times().0.exits;
    assert_eq!(detail.len(), ExitReason::ALL.len());
    assert_eq!(detail[ExitReason::MmioWrite.name()], 4);
    assert_eq!(detail.values().sum::<u64>(), 4);
}

#[test]
fn parked_time_goes_to_its_kind() {
    let acct = accounting();
    for (kind, ns) in [
        (ParkKind::Idle, 5),
        (ParkKind::Limited, 7),
        (ParkKind::Paused, 11),
    ] {
        acct.meter.blocked[kind].add(ns);
    }
    let t = acct.times().0;
    assert_eq!((t.idle_ns, t.limited_ns, t.paused_ns), (5, 7, 11));
    assert_eq!(t.split().identity_error_ns(), t.identity_error_ns);
    assert_eq!(
        t.identity_error_ns, -23,
        "no wall time: the parks are all error"
    );
    assert_eq!(t.split, SplitKind::None);
    assert_eq!(t.state, ppa_vmm_api::VcpuMicroState::Vmm);
}

/// A sample of a thread that ran 1 s outside parks at level full: 900 ms in KVM_RUN
/// (300 ms on a CPU), 100 ms handling exits (80 ms on a CPU), 120 ms run-queue wait.
fn sample(levels: [u64; 3], on_cpu_complete: bool) -> RawSample {
    let mut meter = MeterReading::default();
    meter.wall[MicroState::Guest] = 900;
    meter.wall[MicroState::Vmm] = 100;
    meter.cpu_guest_full = 300;
    meter.cpu_vmm_full = 80;
    meter.exits_at_level = ByKey::from_fn(|i| levels[i]);
    RawSample {
        at_ns: 1_000,
        wall_ns: 1_000,
        meter,
        used_ns: 380,
        steal_ns: 120,
        kvm: Vec::new(),
        hist: HistSnapshots::none(),
        ticks: None,
        on_cpu_complete,
        blocking_ns: 0,
        live: true,
        began_in_ns: 0,
    }
}

fn split_of(s: &RawSample, halt_wait: u64) -> (u64, u64) {
    off_cpu_split(OffCpuInputs {
        cur: s,
        base: &RawSample {
            meter: MeterReading::default(),
            used_ns: 0,
            steal_ns: 0,
            wall_ns: 0,
            ..s.clone()
        },
        levels: *s.meter.exits_at_level.values(),
        used: s.used_ns,
        steal: s.steal_ns,
        halt_wait,
        halts_in_kernel: halt_wait > 0,
    })
}

#[test]
fn the_wake_up_wait_is_steal_and_halts_take_the_rest_of_the_block() {
    let s = sample([0, 0, 5], true);
    // Off CPU 620, of which 120 runnable: 500 not runnable. KVM's halt time (600, which
    // counts the wake-up waits too) bounds the halted part.
    assert_eq!(split_of(&s, 600), (500, 0));
    // A guest that halted for 350 of it: the rest slept in the kernel.
    assert_eq!(split_of(&s, 350), (350, 150));
    // No halts inside KVM_RUN (tiny guests): all of it is blocked.
    assert_eq!(split_of(&s, 0), (0, 500));
}

#[test]
fn the_off_cpu_split_takes_on_cpu_time_from_the_clock_and_reports_the_records_beside_it() {
    // The records measured 380 ns on a CPU; the clock says 400. The off-CPU split takes the
    // clock's (the scheduler's, as run_delay is): halted + blocked is the rest of the wall
    // time at every level, and the records' figure is reported apart where every interval
    // was measured by them.
    for (levels, complete, lost, records) in [
        ([0, 0, 5], true, 0, Some(380)),
        ([0, 5, 0], true, 0, None),
        ([0, 2, 3], true, 0, None),
        ([0, 0, 5], true, 1, None),
        ([0, 0, 5], false, 0, None),
        ([1, 0, 4], true, 0, None),
    ] {
        let mut s = sample(levels, complete);
        s.used_ns = 400;
        if levels[0] == 0 {
            let (h, b) = split_of(&s, 0);
            assert_eq!(400 + 120 + h + b, 1_000, "{levels:?} {complete} {lost}");
        }
        let base = RawSample {
            meter: MeterReading::default(),
            ..s.clone()
        };
        assert_eq!(
            records_on_cpu(&s, &base, levels, lost),
            records,
            "{levels:?} {complete} {lost}"
        );
    }
}

#[test]
fn at_level_off_halted_is_kvms_halt_time() {
    let s = sample([5, 0, 0], true);
    assert_eq!(split_of(&s, 600), (600, 0));
}

/// A live sample of a vCPU in `state` since 400 ns, its records (level full) seeing the
/// interval in progress or not.
fn live_in(state: MicroState, records_saw_it: bool) -> RawSample {
    let mut s = sample([0, 1, 0], records_saw_it);
    s.meter.state = state as u8;
    s.meter.since = 400;
    s.meter.records_on = records_saw_it;
    s
}

#[test]
fn the_time_in_progress_is_placed_only_where_the_sample_can_tell() {
    use super::floor::{hint, Hint, Pending};
    let at = |pending| {
        Some(Hint {
            pending,
            since_ns: 400,
        })
    };
    let guest = live_in(MicroState::Guest, false);
    // Blocked in KVM inside KVM_RUN: a halt, whatever the thread's state says.
    assert_eq!(
        hint(&guest, Some(1), || unreachable!()),
        at(Pending::Halted)
    );
    // Not blocked in KVM: runnable is a wait for a CPU; asleep or unknown stays blocked.
    assert_eq!(hint(&guest, Some(0), || Some(true)), at(Pending::Steal));
    assert_eq!(hint(&guest, None, || Some(true)), at(Pending::Steal));
    assert_eq!(hint(&guest, Some(0), || Some(false)), None);
    assert_eq!(hint(&guest, Some(0), || None), None);
    // Handling an exit: KVM's statistic says nothing there.
    let vmm = live_in(MicroState::Vmm, false);
    assert_eq!(hint(&vmm, Some(1), || Some(false)), None);
    assert_eq!(hint(&vmm, Some(1), || Some(true)), at(Pending::Steal));
    // The micro-state began after the clocks were read: the earlier start bounds it.
    let mut moved = live_in(MicroState::Guest, false);
    moved.began_in_ns = 250;
    assert_eq!(
        hint(&moved, Some(0), || Some(true)).map(|h| h.since_ns),
        Some(250)
    );
    // Nothing to place: a park (measured), records that saw the interval, a final sample,
    // a thread that has not begun.
    for (s, what) in [
        (live_in(MicroState::Idle, false), "a park"),
        (live_in(MicroState::Guest, true), "records"),
        (
            RawSample {
                live: false,
                ..live_in(MicroState::Guest, false)
            },
            "final",
        ),
        (
            RawSample {
                meter: MeterReading {
                    since: 0,
                    ..live_in(MicroState::Guest, false).meter
                },
                ..live_in(MicroState::Guest, false)
            },
            "not begun",
        ),
    ] {
        assert_eq!(hint(&s, Some(1), || Some(true)), None, "{what}");
    }
}
