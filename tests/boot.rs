//! End-to-end tests that boot the tiny guest on KVM through the library and check what it
//! reports against exact counts and its own measurements (how close those come to the wall
//! clock is the accuracy target's, tests/accuracy.rs).

mod common;

use common::{assert_all_exited_ok, reported, run_busy_alone, run_vm, serial};

#[test]
fn every_workload_but_fault_exits_zero() {
    let _g = serial();
    let out = run_vm(
        5,
        &[
            "0=idle:ms=50",
            "1=busy:ms=50",
            "2=periodic:run_us=300,period_us=3000,count=10",
            "3=exits:n=100,kind=mmio",
            "4=exits:n=100,kind=pio",
        ],
    );
    assert_all_exited_ok(&out.report);
    assert_eq!(out.exit_code, 0);
    assert_eq!(out.report.vm.end, ppa_vmm_api::VmEnd::Completed);
    for v in &out.report.vcpus {
        assert!(v.times.host_tid > 0, "vCPU {} has a host tid", v.times.id);
        assert!(v.times.wall_ns > 0);
        assert_eq!(v.tiny().unwrap().doorbells["exit"], 1, "one exit doorbell");
        assert_eq!(v.tiny().unwrap().doorbells["unhandled"], 0);
    }
    // Every idle step and periodic sleep is a halt doorbell the guest counted too.
    let idle = &out.report.vcpus[0];
    assert_eq!(
        idle.tiny().unwrap().doorbells["halt"],
        reported(idle, "iterations")
    );
    let periodic = &out.report.vcpus[2];
    assert_eq!(reported(periodic, "iterations"), 10);
    assert!(periodic.tiny().unwrap().doorbells["halt"] <= 10);
}

fn exact_exits(n: u64, kind: &str) {
    let out = run_vm(1, &[&format!("exits:n={n},kind={kind}")]);
    assert_all_exited_ok(&out.report);
    let v = &out.report.vcpus[0];
    let (bell, reason) = match kind {
        "mmio" => ("workload_mmio", "mmio_write"),
        _ => ("workload_pio", "io_out"),
    };
    assert_eq!(
        v.tiny().unwrap().doorbells[bell],
        n,
        "workload exits of kind {kind}"
    );
    assert_eq!(reported(v, "iterations"), n);
    // The protocol's own doorbells are told apart: console (vCPU 0's greeting), reports, exit.
    let protocol = v.tiny().unwrap().doorbells["console"]
        + v.tiny().unwrap().doorbells["report"]
        + v.tiny().unwrap().doorbells["exit"];
    assert!(protocol > 0);
    match kind {
        "mmio" => assert_eq!(v.times.exits[reason], n + protocol),
        _ => {
            assert_eq!(v.times.exits[reason], n, "only the workload uses port I/O");
            assert_eq!(v.times.exits["mmio_write"], protocol);
        }
    }
    // The guest's own count of exits it made = workload exits + console bytes.
    assert_eq!(
        reported(v, "exits_made"),
        n + v.tiny().unwrap().doorbells["console"]
    );
}

#[test]
fn exits_workload_makes_exactly_n_mmio_exits() {
    let _g = serial();
    for n in [1, 1000, 100_000] {
        exact_exits(n, "mmio");
    }
}

#[test]
fn exits_workload_makes_exactly_n_pio_exits() {
    let _g = serial();
    for n in [1, 1000, 100_000] {
        exact_exits(n, "pio");
    }
}

#[test]
fn one_two_eight_and_sixty_four_vcpus_run() {
    let _g = serial();
    for vcpus in [1, 2, 8, 64] {
        let out = run_vm(vcpus, &["mixed:ms=40"]);
        assert_eq!(out.report.vcpus.len(), vcpus);
        assert_all_exited_ok(&out.report);
        let mut tids: Vec<i32> = out.report.vcpus.iter().map(|v| v.times.host_tid).collect();
        tids.sort_unstable();
        tids.dedup();
        assert_eq!(tids.len(), vcpus, "one host thread per vCPU");
    }
}

/// A busy guest's figures agree with one another; how close its spin comes to 300 ms is the
/// accuracy target's (`busy_spin_matches_wall_time_and_loses_little_alone`).
#[test]
fn a_busy_guest_reports_consistent_figures() {
    let _g = serial();
    let (out, spin, lost) = run_busy_alone(300);
    let v = &out.report.vcpus[0];
    assert_eq!(reported(v, "ran_ns"), spin - lost);
    // The host's wall clock for the vCPU thread covers the guest's spin.
    assert!(
        v.times.wall_ns >= spin,
        "wall {} >= spin {spin}",
        v.times.wall_ns
    );
}

#[test]
fn fault_is_reported_and_the_others_stop_cleanly() {
    let _g = serial();
    for kind in ["hlt", "ud"] {
        let out = run_vm(3, &["busy:ms=5000", &format!("1=fault:kind={kind}")]);
        assert_ne!(out.exit_code, 0);
        assert_eq!(out.report.vm.end, ppa_vmm_api::VmEnd::Failed);
        let f = &out.report.vcpus[1];
        assert_eq!(f.end, ppa_vmm_api::VcpuEndKind::Failed);
        assert_eq!(f.times.exits["shutdown"], 1);
        let failure = f.failure.as_ref().expect("failure reported");
        assert!(failure.reason.contains("shut down"), "{}", failure.reason);
        let regs = failure.regs.as_ref().expect("registers reported");
        if regs.reset {
            // KVM on SVM resets the vCPU after a triple fault: the report must say so and
            // give the last exit the VMM saw (the console line of vCPU 0 is not this vCPU's).
            assert!(failure.reason.contains("reset state"), "{}", failure.reason);
            assert_eq!((regs.cs.as_str(), regs.rip.as_str()), ("0xf000", "0xfff0"));
        } else {
            assert_eq!(regs.cs, "0x33", "failed at CPL 3 in the guest");
        }
        // The 5 s busy vCPUs cannot have finished: the VMM stopped them, without failure.
        for other in [&out.report.vcpus[0], &out.report.vcpus[2]] {
            assert_eq!(
                other.end,
                ppa_vmm_api::VcpuEndKind::Stopped,
                "vCPU {}",
                other.times.id
            );
            assert!(other.failure.is_none());
            assert!(
                other.tiny().unwrap().guest_reported.is_empty(),
                "stopped before reporting"
            );
        }
    }
}

#[test]
fn a_5_gib_vm_has_ram_above_4_gib_that_the_guest_writes_and_reads_back() {
    common::require_kvm();
    let _g = serial();
    let opts = ppa_vmm::config::RunOptions {
        vcpus: Some(2),
        memory_mib: Some(5 << 10),
        // 5 GiB of host memory is not faulted in: only what the guest touches is.
        prefault: Some(false),
        workload: vec!["memtouch:mib=256".into(), "1=idle:ms=10".into()],
        max_runtime: Some(120.0),
        ..Default::default()
    };
    let (config, _) = opts.into_config().unwrap();
    let out = ppa_vmm::vm::Vm::try_from(config).unwrap().run().unwrap();
    assert_all_exited_ok(&out.report);
    let v = &out.report.vcpus[0];
    assert_eq!(reported(v, "touch_base"), 4 << 30, "RAM above 4 GiB");
    assert_eq!(reported(v, "touched_bytes"), 256 << 20);
    assert_eq!(
        reported(v, "touch_errors"),
        0,
        "every word read back as written"
    );
    assert_eq!(out.report.vm.info.memory_mib, 5 << 10);
}
