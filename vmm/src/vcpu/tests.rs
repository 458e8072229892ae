//! The vCPU thread, its run loop and its accounting on the fake hypervisor: scripted exits
//! through the real buses and tiny devices, with no KVM.

use std::sync::atomic::AtomicU32;
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::Duration;

use ppa_guest_abi::{doorbell, DOORBELL_GPA, WORKLOAD_PIO_PORT};

use super::*;
use crate::accounting::meter::VcpuMeter;
use crate::accounting::snapshot::VcpuAccounting;
use crate::accounting::Level;
use crate::devices::tiny::{Doorbell, TinyBoard};
use crate::hypervisor::fake::{FakeExit, FakeVcpu, Step};
use crate::hypervisor::{RegsDump, Vcpu as _};

fn bell(offset: u64, value: u64) -> FakeExit {
    FakeExit::MmioWrite(DOORBELL_GPA + offset, value.to_le_bytes().to_vec())
}

struct Rig {
    shared: Arc<VcpuShared>,
    control: Arc<AccountingControl>,
    board: Arc<TinyBoard>,
    buses: Arc<Buses>,
    handle: std::thread::JoinHandle<()>,
    done: std::sync::mpsc::Receiver<usize>,
}

/// Starts one vCPU thread replaying `script` at `level`, with the tiny devices on the buses.
fn start(script: Vec<Step>, level: Level) -> Rig {
    start_vcpu(FakeVcpu::new(script), level)
}

/// Starts a thread for `vcpu` at `level`, with the tiny devices on the buses.
fn start_vcpu(vcpu: FakeVcpu, level: Level) -> Rig {
    let board = TinyBoard::new(1);
    let mut buses = Buses::new(1);
    crate::devices::tiny::install(&board, &mut buses).unwrap();
    let buses = Arc::new(buses);
    let meter = Arc::new(VcpuMeter::new(3, 4));
    let shared = Arc::new(VcpuShared::new(0, VcpuAccounting::new(meter, None, None)));
    let control = Arc::new(AccountingControl::new(
        level,
        Default::default(),
        3,
        10_000_000,
    ));
    let gate = Arc::new(AtomicU32::new(1));
    let (tx, rx) = channel();
    let handle = spawn(VcpuThread {
        vcpu,
        shared: Arc::clone(&shared),
        buses: Arc::clone(&buses),
        done: tx,
        start_gate: gate,
        control: Arc::clone(&control),
        warm_up: None,
    })
    .unwrap();
    Rig {
        shared,
        control,
        board,
        buses,
        handle,
        done: rx,
    }
}

impl Rig {
    fn finish(self) -> Self {
        self.done
            .recv_timeout(Duration::from_secs(20))
            .expect("the vCPU thread ends");
        self
    }
}

/// Every kind of exit the tiny devices see, a halt of 2 ms, and the exit doorbell (code 7).
fn every_exit() -> Vec<Step> {
    vec![
        Step::now(FakeExit::MmioWrite(
            DOORBELL_GPA + doorbell::CONSOLE,
            b"h".to_vec(),
        )),
        Step::now(FakeExit::MmioWrite(
            DOORBELL_GPA + doorbell::CONSOLE,
            b"\n".to_vec(),
        )),
        Step::after(200_000, bell(doorbell::WORKLOAD, 1)),
        Step::now(FakeExit::IoOut(WORKLOAD_PIO_PORT, vec![1, 0, 0, 0])),
        Step::now(FakeExit::IoIn(0x80, 1)),
        Step::now(FakeExit::MmioRead(0x4000_0000, 4)),
        Step::now(bell(doorbell::HALT, 2_000_000)),
        Step::now(bell(doorbell::REPORT_BASE + 8 * 3, 1234)),
        Step::now(bell(doorbell::EXIT, 7)),
    ]
}

#[test]
fn scripted_exits_reach_the_devices_and_end_the_vcpu() {
    let script = every_exit();
    let n = script.len() as u64;
    let r = start(script, Level::Basic).finish();
    r.handle.join().unwrap();
    assert!(matches!(r.shared.end(), Some(VcpuEnd::Exited(7))));
    assert_eq!(r.shared.state(), ThreadState::Finished);
    let v = r.board.vcpu(0).unwrap();
    assert_eq!(v.doorbell(Doorbell::Console), 2);
    assert_eq!(v.doorbell(Doorbell::WorkloadMmio), 1);
    assert_eq!(v.doorbell(Doorbell::WorkloadPio), 1);
    assert_eq!(v.doorbell(Doorbell::Halt), 1);
    assert_eq!(v.reported(3), Some(1234));
    assert_eq!(r.buses.unclaimed(0), 2, "the port read and the MMIO read");
    let (t, _) = r.shared.times();
    assert_eq!(t.total_exits(), n, "every exit counted, exactly");
    assert_eq!(t.exits["mmio_write"], 6);
    assert_eq!(
        (t.exits["io_out"], t.exits["io_in"], t.exits["mmio_read"]),
        (1, 1, 1)
    );
    assert_eq!(t.parks, 1, "the halt parked once");
    // A park lasts until its deadline, which the device set 2 ms after it handled the
    // doorbell: from then to the park's start is exit handling (vmm), and any wait for a CPU
    // in between or after the wake-up is steal. So idle alone may fall a few µs short of the
    // 2 ms (seen in CI: 1,996,581 ns), idle + steal + vmm cannot.
    assert!(
        t.idle_ns + t.steal_ns + t.vmm_ns >= 2_000_000,
        "a park lasts at least to its deadline: idle {} ns + steal {} ns + vmm {} ns",
        t.idle_ns,
        t.steal_ns,
        t.vmm_ns
    );
    // The fake spins on the wall clock: its run lasts at least the scripted time, whatever
    // share of it the thread was on a CPU.
    assert!(
        t.kvm_run_wall_ns >= 200_000,
        "the scripted guest time: {}",
        t.kvm_run_wall_ns
    );
    // At level basic the VMM's part is the wall time between an exit and the next entry, so a
    // thread preempted there for longer than the scripted 200 µs leaves the guest's share at
    // 0 (seen once in CI, on a loaded host: the split is marked estimated for this reason,
    // docs/accounting.md). With no wait for a CPU at all the split is exact and must show the
    // scripted guest time.
    if t.steal_ns == 0 {
        assert!(t.guest_ns > 0, "no steal, yet no guest time: {t:?}");
    }
    assert!(
        t.identity_holds(true),
        "wall {} = used {} + steal {} + idle {} ... off by {}",
        t.wall_ns,
        t.used_ns,
        t.steal_ns,
        t.idle_ns,
        t.identity_error_ns
    );
}

#[test]
fn a_stop_request_kicks_a_vcpu_out_of_the_guest() {
    // Level off and basic run in the plain loop, full in the run loop: each must see it.
    for level in [Level::Off, Level::Basic, Level::Full] {
        // One long stretch of guest code: only a kick ends it early.
        let r = start(
            vec![Step::after(60_000_000_000, bell(doorbell::EXIT, 0))],
            level,
        );
        while r.shared.state() != ThreadState::Running {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(20));
        r.shared.kick(Requests::STOP);
        let r = r.finish();
        assert!(
            matches!(r.shared.end(), Some(VcpuEnd::Stopped)),
            "{level:?}"
        );
        let (t, _) = r.shared.times();
        assert_eq!(t.exits["intr"], 1, "the kick is one intr exit ({level:?})");
        assert_eq!(t.total_exits(), 1, "{level:?}");
    }
}

/// The plain loop (`vcpu::plain`, level off and basic) and the run loop (level full) count and
/// carry out the same exits: the same devices reached, the same park, the same end, every exit
/// counted once at its level.
#[test]
fn every_level_counts_and_carries_out_the_same_exits() {
    let mut seen = Vec::new();
    for level in [Level::Off, Level::Basic, Level::Full] {
        let script = every_exit();
        let n = script.len() as u64;
        let r = start(script, level).finish();
        r.handle.join().unwrap();
        assert!(
            matches!(r.shared.end(), Some(VcpuEnd::Exited(7))),
            "{level:?}"
        );
        let v = r.board.vcpu(0).unwrap();
        let bells = [
            Doorbell::Console,
            Doorbell::WorkloadMmio,
            Doorbell::WorkloadPio,
            Doorbell::Halt,
            Doorbell::Report,
            Doorbell::Exit,
        ]
        .map(|d| v.doorbell(d));
        assert_eq!(bells, [2, 1, 1, 1, 1, 1], "{level:?}");
        let (t, _) = r.shared.times();
        assert_eq!(t.total_exits(), n, "{level:?}: every exit counted, exactly");
        assert_eq!(t.parks, 1, "{level:?}: the halt parked once");
        let at = r.shared.acct.meter.read().exits_at_level;
        assert_eq!(at[level], n, "{level:?}: every exit at its level");
        seen.push(t.exits.clone());
    }
    assert!(seen.windows(2).all(|w| w[0] == w[1]), "{seen:?}");
}

/// A level switch while the vCPU runs in the plain loop takes it out before its next entry:
/// the exits after the switch count at the new level, and none is lost or counted twice.
#[test]
fn a_level_switch_takes_the_vcpu_out_of_the_plain_loop() {
    let n = 3000u64;
    let mut script: Vec<Step> = (0..n)
        .map(|_| Step::after(20_000, bell(doorbell::WORKLOAD, 1)))
        .collect();
    script.push(Step::now(bell(doorbell::EXIT, 0)));
    let r = start(script, Level::Off);
    let count = |r: &Rig| r.shared.times().0.total_exits();
    while count(&r) < 100 {
        std::thread::yield_now();
    }
    r.control.set_level(Level::Basic);
    let switched = count(&r);
    while count(&r) < switched + 100 {
        std::thread::yield_now();
    }
    r.control.set_level(Level::Off);
    let r = r.finish();
    assert!(matches!(r.shared.end(), Some(VcpuEnd::Exited(0))));
    let at = r.shared.acct.meter.read().exits_at_level;
    assert_eq!(at[Level::Off] + at[Level::Basic], n + 1, "{at:?}");
    assert!(
        at[Level::Basic] >= 100,
        "the exits after the switch: {at:?}"
    );
    assert!(
        at[Level::Off] >= 100,
        "before it and after the switch back: {at:?}"
    );
    assert_eq!(r.shared.times().0.total_exits(), n + 1);
}

#[test]
fn a_hlt_parks_until_kicked_and_a_kick_while_parked_costs_no_exit() {
    let r = start(
        vec![Step::now(FakeExit::Hlt), Step::now(bell(doorbell::EXIT, 0))],
        Level::Basic,
    );
    while r.shared.state() != ThreadState::Parked {
        std::thread::yield_now();
    }
    // A pause while parked: the idle park ends, the pause park begins; a resume lets the
    // vCPU go on to its exit doorbell. No kick may show up as an extra `intr` exit.
    r.shared.kick(Requests::PAUSE);
    while !(r.shared.state() == ThreadState::Parked && r.shared.times().0.parks >= 1) {
        std::thread::yield_now();
    }
    std::thread::sleep(Duration::from_millis(5));
    r.shared.resume();
    let r = r.finish();
    assert!(matches!(r.shared.end(), Some(VcpuEnd::Exited(0))));
    let (t, _) = r.shared.times();
    assert_eq!(t.exits["hlt"], 1);
    assert_eq!(
        t.exits.get("intr").copied().unwrap_or(0),
        0,
        "{:?}",
        t.exits
    );
    assert_eq!(t.parks, 2, "idle, then paused");
    assert!(t.paused_ns > 0);
}

#[test]
fn a_guest_failure_ends_the_vcpu_with_its_registers() {
    let r = start(vec![Step::after(100_000, FakeExit::Shutdown)], Level::Full);
    let r = r.finish();
    let Some(VcpuEnd::Failed {
        failure,
        regs,
        last_exit,
    }) = r.shared.end()
    else {
        panic!("expected a failure, got {:?}", r.shared.end());
    };
    assert_eq!(*failure, crate::exit::Failure::Shutdown);
    assert!(regs.is_some(), "the fake gives its registers");
    assert_eq!(*last_exit, None, "the fault was the first exit");
    assert!(r.shared.end().unwrap().is_failure());
    let (t, _) = r.shared.times();
    assert_eq!(t.exits["shutdown"], 1);
    assert_eq!(
        t.split,
        ppa_vmm_api::SplitKind::Exact,
        "level full splits exactly"
    );
    assert!(
        t.identity_holds(true),
        "identity off by {}",
        t.identity_error_ns
    );
}

#[test]
fn registers_in_reset_state_are_called_so_with_the_last_exit_the_vmm_saw() {
    let script = vec![
        Step::now(bell(doorbell::WORKLOAD, 1)),
        Step::now(FakeExit::Shutdown),
    ];
    // What KVM on SVM hands back after a triple fault.
    let vcpu = FakeVcpu::new(Vec::new());
    let mut s = vcpu.sregs().unwrap();
    s.cs.selector = 0xf000;
    let r = crate::arch::x86_64::regs::Regs {
        rip: 0xfff0,
        ..Default::default()
    };
    let dump = RegsDump::new(&r, &s);
    assert!(dump.reset);
    let end = VcpuEnd::Failed {
        failure: crate::exit::Failure::Shutdown,
        regs: Some(Box::new(dump)),
        last_exit: Some(LastExit {
            reason: crate::exit::ExitReason::MmioWrite,
            addr: Some(DOORBELL_GPA + doorbell::WORKLOAD),
        }),
    };
    let reason = end.reason().unwrap();
    assert!(reason.contains("reset state"), "{reason}");
    assert!(reason.contains("mmio_write at 0xd0000018"), "{reason}");
    // And the loop keeps the exit before the fatal one: the plain loop at levels off and
    // basic, the run loop at full.
    for level in [Level::Off, Level::Full] {
        let r = start(script.clone(), level).finish();
        let Some(VcpuEnd::Failed { last_exit, .. }) = r.shared.end() else {
            panic!("failed at {level:?}");
        };
        assert_eq!(
            last_exit.map(|e| e.addr),
            Some(Some(DOORBELL_GPA + doorbell::WORKLOAD)),
            "{level:?}"
        );
    }
    let r = start(script, Level::Basic).finish();
    let Some(VcpuEnd::Failed {
        last_exit, regs, ..
    }) = r.shared.end()
    else {
        panic!("failed");
    };
    assert_eq!(
        *last_exit,
        Some(LastExit {
            reason: crate::exit::ExitReason::MmioWrite,
            addr: Some(DOORBELL_GPA + doorbell::WORKLOAD)
        })
    );
    assert!(
        !regs.as_ref().unwrap().reset,
        "ordinary registers are not called reset"
    );
    let json = serde_json::to_value(regs.as_deref().unwrap()).unwrap();
    assert!(
        json.get("reset").is_none(),
        "the key appears only when true"
    );
}

#[test]
fn a_script_that_ends_is_an_unexpected_exit_not_a_hang() {
    let r = start(Vec::new(), Level::Off).finish();
    assert!(matches!(
        r.shared.end(),
        Some(VcpuEnd::Failed {
            failure: crate::exit::Failure::Unexpected(_),
            ..
        })
    ));
}

#[test]
fn reads_get_the_devices_bytes_and_an_internal_error_keeps_its_suberror() {
    let script = vec![
        Step::now(FakeExit::MmioRead(DOORBELL_GPA, 8)),
        Step::now(FakeExit::IoIn(WORKLOAD_PIO_PORT, 4)),
        Step::now(FakeExit::InternalError(3)),
    ];
    let vcpu = FakeVcpu::new(script);
    let reads = vcpu.reads();
    let r = start_vcpu(vcpu, Level::Basic).finish();
    r.handle.join().unwrap();
    let shared = r.shared;
    assert!(matches!(
        shared.end(),
        Some(VcpuEnd::Failed {
            failure: crate::exit::Failure::Fatal(crate::exit::FatalExit::InternalError {
                suberror: 3
            }),
            ..
        })
    ));
    // The fake filled each read with 0xAA; the devices answered zeros.
    let log = reads.lock().unwrap().clone();
    assert_eq!(
        log,
        vec![
            (DOORBELL_GPA, vec![0; 8]),
            (u64::from(WORKLOAD_PIO_PORT), vec![0; 4])
        ]
    );
}

/// Issue 39: a kick before the thread is in its loop (a tight limit stopping a member that has
/// not started, where it sleeps) sent the signal that cut its warm-up run short ("warm-up run
/// failed"); the request alone waits for the loop's first turn.
#[test]
fn a_kick_before_the_loop_runs_sends_no_signal() {
    struct Count(Arc<std::sync::atomic::AtomicU64>);
    impl crate::hypervisor::Kicker for Count {
        fn kick(&self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    let meter = Arc::new(VcpuMeter::new(3, 2));
    let shared = VcpuShared::new(0, VcpuAccounting::new(meter, None, None));
    let kicks = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let _ = shared.kicker.set(Box::new(Count(Arc::clone(&kicks))));
    shared.kick(crate::vcpu::LimitKind::Vm.into());
    assert_eq!(kicks.load(Ordering::Relaxed), 0, "created: no signal");
    assert!(shared.requested(Requests::LIMIT), "the request waits");
    shared.pretend_ran(1, None);
    shared.kick(Requests::PAUSE);
    assert_eq!(kicks.load(Ordering::Relaxed), 1, "running: the signal");
}
