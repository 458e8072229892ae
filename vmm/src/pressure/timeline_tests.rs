use super::*;
use crate::accounting::episodes::{Episode, EpisodeKind};
use crate::accounting::meter::MicroState;

fn ep(start: u64, end: u64, kind: EpisodeKind, wait: u64) -> Episode {
    Episode {
        start,
        end,
        kind,
        wait,
    }
}

fn seg(start: u64, end: u64, phase: Phase) -> Seg {
    Seg { start, end, phase }
}

/// The phase of `segs` at instant `t` (0: non-idle, not stalled).
fn phase_at(segs: &[Seg], t: u64) -> u8 {
    segs.iter()
        .find(|s| s.start <= t && t < s.end)
        .map_or(0, |s| s.phase as u8)
}

/// `some` and `full` by looking at every instant.
fn brute(from: u64, to: u64, members: &[&[Seg]]) -> Stall {
    let mut out = Stall::default();
    for t in from..to {
        let ph: Vec<u8> = members.iter().map(|m| phase_at(m, t)).collect();
        let stalled = ph.iter().filter(|&&p| p == 2).count();
        if stalled > 0 {
            out.some += 1;
            if ph.iter().all(|&p| p != 0) {
                out.full += 1;
            }
        }
    }
    out
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn four_vcpus_on_two_cpus_have_full_pressure_zero_and_some_the_whole_tick() {
    // Two always run, two always wait: each vCPU waits half the tick, in turns.
    let (from, to) = (0, 1000);
    let a = [seg(0, 500, Phase::Stall)];
    let b = [seg(0, 500, Phase::Stall)];
    let c = [seg(500, 1000, Phase::Stall)];
    let d = [seg(500, 1000, Phase::Stall)];
    let s = measure(from, to, &[&a, &b, &c, &d]);
    assert_eq!(
        s,
        Stall {
            some: 1000,
            full: 0
        }
    );
    // The overlap rule, knowing only that each stalled half the tick, says otherwise.
    let rule = crate::pressure::combine(
        1000,
        (0..4).map(|_| crate::pressure::VcpuTick {
            stalled: 500,
            nonidle: 1000,
        }),
    );
    assert_eq!(
        rule,
        Stall {
            some: 938,
            full: 63
        }
    );
}

#[test]
fn full_is_the_time_every_non_idle_vcpu_waits_and_not_while_all_are_idle() {
    // vCPU 0 stalled 0..300, idle 300..600, stalled 600..700; vCPU 1 idle 0..400, stalled
    // 400..650; nothing else.
    let a = [
        seg(0, 300, Phase::Stall),
        seg(300, 600, Phase::Idle),
        seg(600, 700, Phase::Stall),
    ];
    let b = [seg(0, 400, Phase::Idle), seg(400, 650, Phase::Stall)];
    let s = measure(0, 1000, &[&a, &b]);
    // some: 0..300, 400..650, 650..700 → 300 + 300 = 600.
    // full: 0..300 (b idle), 400..600 (a idle, b stalled), 600..650 (both) → 550.
    assert_eq!(
        s,
        Stall {
            some: 600,
            full: 550
        }
    );
    assert_eq!(s, brute(0, 1000, &[&a, &b]));
    // No members, or an empty window: nothing.
    assert_eq!(measure(0, 1000, &[]), Stall::default());
    assert_eq!(measure(5, 5, &[&a]), Stall::default());
}

#[test]
fn measure_agrees_with_every_instant_on_random_sets() {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..400 {
        let (from, to) = (r.below(50), 200 + r.below(100));
        let n = 1 + r.below(5) as usize;
        let members: Vec<Vec<Seg>> = (0..n)
            .map(|_| {
                let raw: Vec<Episode> = (0..r.below(8))
                    .map(|_| {
                        let s = r.below(320);
                        let kind = match r.below(6) {
                            0 => EpisodeKind::Preempted,
                            1 => EpisodeKind::SleptInRun,
                            2 => EpisodeKind::Slept,
                            3 => EpisodeKind::Idle,
                            4 => EpisodeKind::Limited,
                            _ => EpisodeKind::Paused,
                        };
                        let len = r.below(80);
                        ep(s, s + len, kind, r.below(len + 1))
                    })
                    .collect();
                segments(&raw, None, r.below(2) == 0, from, to)
            })
            .collect();
        let refs: Vec<&[Seg]> = members.iter().map(Vec::as_slice).collect();
        assert_eq!(
            measure(from, to, &refs),
            brute(from, to, &refs),
            "{members:?}"
        );
        for m in &members {
            // Disjoint, ordered, inside the window.
            for w in m.windows(2) {
                assert!(w[0].end <= w[1].start, "{m:?}");
            }
            assert!(m
                .iter()
                .all(|s| s.start >= from && s.end <= to && s.start < s.end));
        }
    }
}

#[test]
fn episodes_become_phases_a_stall_winning_over_idle() {
    let eps = [
        // A preemption, a sleep inside KVM_RUN, a sleep in the VMM.
        ep(10, 20, EpisodeKind::Preempted, 0),
        ep(30, 40, EpisodeKind::SleptInRun, 0),
        ep(50, 60, EpisodeKind::Slept, 0),
        // An idle park whose wake-up waited 5 at its end, with a preemption inside it.
        ep(100, 200, EpisodeKind::Idle, 5),
        ep(120, 130, EpisodeKind::Preempted, 0),
        // A limited park.
        ep(300, 350, EpisodeKind::Limited, 7),
    ];
    let halting = segments(&eps, None, true, 0, 1000);
    assert_eq!(
        halting,
        vec![
            seg(10, 20, Phase::Stall),
            seg(30, 40, Phase::Idle),
            seg(100, 120, Phase::Idle),
            seg(120, 130, Phase::Stall),
            seg(130, 195, Phase::Idle),
            seg(195, 200, Phase::Stall),
            seg(300, 350, Phase::Stall),
        ]
    );
    // Without an in-kernel HLT a sleep inside KVM_RUN is blocked: neither idle nor stalled.
    let tiny = segments(&eps, None, false, 0, 1000);
    assert!(!tiny.contains(&seg(30, 40, Phase::Idle)));
    // The window clips.
    assert_eq!(
        segments(&eps, None, true, 15, 35),
        vec![seg(15, 20, Phase::Stall), seg(30, 35, Phase::Idle)]
    );
}

#[test]
fn what_the_vcpu_does_now_runs_to_the_end_of_the_window() {
    let parked = |state, since| Now {
        state,
        since,
        out: None,
    };
    assert_eq!(
        segments(&[], Some(parked(MicroState::Limited, 40)), true, 0, 100),
        vec![seg(40, 100, Phase::Stall)]
    );
    assert_eq!(
        segments(&[], Some(parked(MicroState::Paused, 0)), true, 10, 100),
        vec![seg(10, 100, Phase::Idle)]
    );
    assert_eq!(
        segments(&[], Some(parked(MicroState::Guest, 5)), true, 0, 100),
        vec![]
    );
    // Off its CPU since 70: preempted is a stall; asleep inside the run in progress is a halt
    // where the guest halts in the kernel; asleep in the VMM after the run is neither.
    let off = |state, since, out| Now {
        state,
        since,
        out: Some(out),
    };
    assert_eq!(
        segments(
            &[],
            Some(off(MicroState::Guest, 50, (70, true))),
            false,
            0,
            100
        ),
        vec![seg(70, 100, Phase::Stall)]
    );
    assert_eq!(
        segments(
            &[],
            Some(off(MicroState::Guest, 50, (70, false))),
            true,
            0,
            100
        ),
        vec![seg(70, 100, Phase::Idle)]
    );
    assert_eq!(
        segments(
            &[],
            Some(off(MicroState::Vmm, 50, (70, false))),
            true,
            0,
            100
        ),
        vec![]
    );
    assert_eq!(
        segments(
            &[],
            Some(off(MicroState::Vmm, 80, (70, false))),
            true,
            0,
            100
        ),
        vec![seg(70, 100, Phase::Idle)]
    );
}

#[test]
fn a_wait_ends_where_the_kernel_picked_the_vcpu_not_at_its_switch_in_record() {
    use EpisodeKind::Preempted;
    // Two CPUs switch between vCPUs at one tick (500): a's and c's switch-outs at 500, b's and
    // d's switch-in records 30 later (the context switch), though the kernel picked b and d at
    // 500 (a's and c's handoffs).
    let a = [ep(500, 1000, Preempted, 0)];
    let b = [ep(0, 530, Preempted, 0)];
    let c = [ep(501, 1000, Preempted, 0)];
    let d = [ep(0, 531, Preempted, 0)];
    let place = |eps: &[Episode], picked: &[u64]| {
        let (eps, now) = picked_at(eps, None, picked);
        segments(&eps, now, false, 0, 1000)
    };
    let records = [&a[..], &b, &c, &d].map(|e| place(e, &[]));
    let refs: Vec<&[Seg]> = records.iter().map(Vec::as_slice).collect();
    assert_eq!(
        measure(0, 1000, &refs),
        Stall {
            some: 1000,
            full: 29
        }
    );
    let picked = [
        place(&a, &[]),
        place(&b, &[500]),
        place(&c, &[]),
        place(&d, &[501]),
    ];
    let refs: Vec<&[Seg]> = picked.iter().map(Vec::as_slice).collect();
    assert_eq!(
        measure(0, 1000, &refs),
        Stall {
            some: 1000,
            full: 0
        }
    );
    assert_eq!(picked[1], vec![seg(0, 500, Phase::Stall)]);

    // The latest pick inside the wait ends it; picks outside it change nothing; other
    // episodes keep their ends.
    let eps = [
        ep(100, 200, Preempted, 0),
        ep(300, 400, EpisodeKind::Slept, 0),
        ep(500, 600, EpisodeKind::Limited, 0),
    ];
    let (got, _) = picked_at(&eps, None, &[50, 150, 170, 350, 550, 700]);
    assert_eq!(got[0], ep(100, 170, Preempted, 0));
    assert_eq!(&got[1..], &eps[1..]);
    // A pick at the switch-out itself leaves a wait of no length.
    let (got, _) = picked_at(&eps[..1], None, &[100]);
    assert_eq!(got[0], ep(100, 100, Preempted, 0));

    // Picked while still off its CPU (no switch-in record yet): the wait ends at the pick.
    let now = Now {
        state: MicroState::Guest,
        since: 10,
        out: Some((800, true)),
    };
    let (eps, n) = picked_at(&[], Some(now), &[790, 820]);
    assert_eq!(
        segments(&eps, n, false, 0, 1000),
        vec![seg(800, 820, Phase::Stall)]
    );
    // Not picked since: waiting to the end of the window.
    let (eps, n) = picked_at(&[], Some(now), &[790]);
    assert_eq!(
        segments(&eps, n, false, 0, 1000),
        vec![seg(800, 1000, Phase::Stall)]
    );
    // Asleep (not preempted): a pick does not make it a wait.
    let asleep = Now {
        out: Some((800, false)),
        ..now
    };
    let (eps, n) = picked_at(&[], Some(asleep), &[820]);
    assert_eq!(
        segments(&eps, n, true, 0, 1000),
        vec![seg(800, 1000, Phase::Idle)]
    );
}
