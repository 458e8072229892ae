//! A whole VM built and run on the fake hypervisor: the build steps, the tiny payload's boot
//! state and devices, the run's supervision and the report, without KVM.

use ppa_guest_abi::{doorbell, DOORBELL_GPA};

use super::*;
use crate::arch::x86_64::layout::PPA_PAGE_GPA;
use crate::hypervisor::fake::{FakeExit, FakeHypervisor, Step};
use crate::payload::tiny::layout as tiny_layout;
use crate::payload::Payload;

fn bell(offset: u64, value: u64) -> Step {
    Step::now(FakeExit::MmioWrite(
        DOORBELL_GPA + offset,
        value.to_le_bytes().to_vec(),
    ))
}

fn config(vcpus: usize, memory_mib: u64) -> VmConfig {
    VmConfig {
        vcpus,
        memory_mib,
        prefault: false,
        payload: Payload::default(),
        ..Default::default()
    }
}

#[test]
fn a_vm_on_the_fake_hypervisor_boots_runs_and_reports() {
    let report_key = |k: u64, v: u64| bell(doorbell::REPORT_BASE + 8 * k, v);
    let scripts = vec![
        vec![
            Step::after(100_000, FakeExit::MmioWrite(DOORBELL_GPA + doorbell::WORKLOAD, vec![0; 4])),
            report_key(ppa_guest_abi::report::SPIN_NS, 42),
            bell(doorbell::EXIT, 0),
        ],
        vec![bell(doorbell::HALT, 1_000_000), bell(doorbell::EXIT, 0)],
    ];
    let vm = Vm::build(config(2, 5 << 10), FakeHypervisor::new(scripts)).unwrap();
    // RAM below the gap, RAM above 4 GiB, the PPA page: one slot each.
    let slots: Vec<(u32, u64, u64)> = vm
        .hypervisor_vm()
        .slots
        .lock()
        .unwrap()
        .iter()
        .map(|s| (s.slot, s.gpa, s.size))
        .collect();
    assert_eq!(
        slots,
        vec![
            (0, 0, 3 << 30),
            (1, 4 << 30, 2 << 30),
            (2, PPA_PAGE_GPA, ppa_guest_abi::ppa_page::DEFAULT_SIZE)
        ]
    );
    // The payload set each vCPU's registers: entry, its own stack and boot record, CPL 3.
    for (i, v) in vm.vcpus.iter().enumerate() {
        use crate::hypervisor::Vcpu as _;
        let r = v.regs().unwrap();
        let s = v.sregs().unwrap();
        assert_eq!(r.rdi, tiny_layout::boot_info_gpa(i));
        assert_eq!(r.rsp, tiny_layout::stack_pointer(i, 3 << 30));
        assert_eq!(s.cs.selector, 0x33);
        assert_eq!(s.cr3, tiny_layout::TABLES.pml4);
    }
    let out = vm.run().unwrap();
    let r = &out.report;
    assert_eq!(out.exit_code, 0, "{:?}", r.vcpus.iter().map(|v| &v.failure).collect::<Vec<_>>());
    assert_eq!(r.vm.end, "completed");
    assert_eq!(r.vm.info.image, "tiny");
    assert_eq!(r.vm.info.kvm_exit_cost_ns, None, "the fake cannot measure it");
    let t0 = r.vcpus[0].tiny().unwrap();
    assert_eq!(t0.guest_reported["spin_ns"], 42);
    assert_eq!(t0.doorbells["workload_mmio"], 1);
    assert_eq!(r.vcpus[1].tiny().unwrap().doorbells["halt"], 1);
    assert_eq!(r.vcpus[0].times.total_exits(), 3);
    // The JSON keeps the tiny guest's fields on the vCPU object, as before the payload split.
    let json = serde_json::to_value(r).unwrap();
    let v0 = &json["vcpus"][0];
    assert_eq!(v0["workload"], "busy:ms=1000");
    assert_eq!(v0["guest_reported"]["spin_ns"], 42);
    assert_eq!(v0["doorbells"]["exit"], 1);
    assert!(v0.get("payload").is_none(), "flattened");
}

#[test]
fn a_failing_vcpu_stops_the_others() {
    let scripts = vec![
        vec![Step::after(60_000_000_000, FakeExit::Shutdown)],
        vec![Step::after(1_000_000, FakeExit::Shutdown)],
    ];
    let out = Vm::build(config(2, 32), FakeHypervisor::new(scripts))
        .unwrap()
        .run()
        .unwrap();
    assert_eq!(out.exit_code, 1);
    assert_eq!(out.report.vm.end, "failed");
    assert_eq!(out.report.vcpus[0].end, "stopped");
    assert_eq!(out.report.vcpus[1].end, "failed");
}

#[test]
fn build_refuses_what_does_not_fit() {
    let e = Vm::build(config(2, 300 << 10), FakeHypervisor::new(Vec::new()));
    assert!(matches!(e, Err(VmError::Payload(PayloadError::TooMuchRam { .. }))));
    let mut c = config(1, 32);
    c.ppa_page_size = 32 << 20;
    assert!(Vm::build(c, FakeHypervisor::new(Vec::new())).is_err());
    let e = Vm::build(config(300, 32), FakeHypervisor::new(Vec::new()));
    assert!(matches!(e, Err(VmError::Config(_))));
}
