//! Helpers shared by the end-to-end tests: KVM presence, one-at-a-time runs, report access.

#![allow(dead_code)]

use std::sync::{Mutex, MutexGuard};

use ppa_vmm::config::RunOptions;
use ppa_vmm::report::{Report, VcpuReport};
use ppa_vmm::vm::{RunOutcome, Vm};

static SERIAL: Mutex<()> = Mutex::new(());

/// Fails with a clear message where this host has no usable /dev/kvm.
pub fn require_kvm() {
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        panic!(
            "this test boots a VM and needs read-write access to /dev/kvm, which failed: {e}. \
             Run the KVM tests on a host with KVM (CI has it)."
        );
    }
}

/// Runs VMs one at a time in this test binary: accuracy figures need an otherwise idle host.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Builds and runs a VM from `vcpus` and workload specs; panics on setup errors.
pub fn run_vm(vcpus: usize, workloads: &[&str]) -> RunOutcome {
    require_kvm();
    let opts = RunOptions {
        vcpus: Some(vcpus),
        workload: workloads.iter().map(|s| s.to_string()).collect(),
        max_runtime: Some(120.0),
        ..Default::default()
    };
    let (config, _) = opts.into_config().expect("valid config");
    let vm = Vm::try_from(config).expect("VM builds");
    vm.run().expect("VM runs")
}

/// The value the guest reported under `key`.
pub fn reported(v: &VcpuReport, key: &str) -> u64 {
    *v.guest_reported
        .get(key)
        .unwrap_or_else(|| panic!("vCPU {} did not report {key}: {:?}", v.id, v.guest_reported))
}

/// Asserts every vCPU exited with code 0.
pub fn assert_all_exited_ok(r: &Report) {
    for v in &r.vcpus {
        assert_eq!(
            v.exit_code,
            Some(0),
            "vCPU {} ({}) ended {} with {:?}",
            v.id,
            v.workload,
            v.end,
            v.failure
        );
    }
}
