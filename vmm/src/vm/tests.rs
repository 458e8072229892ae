//! A whole VM built and run on the fake hypervisor: the build steps, the tiny payload's boot
//! state and devices, the run's supervision and the report, without KVM.

use ppa_guest_abi::{doorbell, DOORBELL_GPA};
use ppa_vmm_api::{VcpuEndKind, VmEnd};

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
            Step::after(
                100_000,
                FakeExit::MmioWrite(DOORBELL_GPA + doorbell::WORKLOAD, vec![0; 4]),
            ),
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
    assert_eq!(
        out.exit_code,
        0,
        "{:?}",
        r.vcpus.iter().map(|v| &v.failure).collect::<Vec<_>>()
    );
    assert_eq!(r.vm.end, VmEnd::Completed);
    assert_eq!(r.vm.info.image, "tiny");
    assert_eq!(
        r.vm.info.kvm_exit_cost_ns, None,
        "the fake cannot measure it"
    );
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
    assert_eq!(out.report.vm.end, VmEnd::Failed);
    assert_eq!(out.report.vcpus[0].end, VcpuEndKind::Stopped);
    assert_eq!(out.report.vcpus[1].end, VcpuEndKind::Failed);
}

#[test]
fn build_refuses_what_does_not_fit() {
    let e = Vm::build(config(2, 300 << 10), FakeHypervisor::new(Vec::new()));
    assert!(matches!(
        e,
        Err(VmError::Payload(PayloadError::TooMuchRam { .. }))
    ));
    let mut c = config(1, 32);
    c.ppa_page_size = 32 << 20;
    assert!(Vm::build(c, FakeHypervisor::new(Vec::new())).is_err());
    let e = Vm::build(config(300, 32), FakeHypervisor::new(Vec::new()));
    assert!(matches!(e, Err(VmError::Config(_))));
}

/// A minimal ELF64 kernel: one PT_LOAD of `code` at 1 MiB, entry at its start.
fn elf_kernel(dir: &std::path::Path, code: &[u8]) -> std::path::PathBuf {
    let mut f = vec![0u8; 0x78];
    f[0..4].copy_from_slice(b"\x7fELF");
    f[4] = 2; // 64-bit
    f[5] = 1; // little-endian
    f[6] = 1; // version
    f[0x10..0x12].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    f[0x12..0x14].copy_from_slice(&62u16.to_le_bytes()); // x86_64
    f[0x14..0x18].copy_from_slice(&1u32.to_le_bytes());
    f[0x18..0x20].copy_from_slice(&0x10_0000u64.to_le_bytes()); // entry
    f[0x20..0x28].copy_from_slice(&0x40u64.to_le_bytes()); // phoff
    f[0x34..0x36].copy_from_slice(&0x40u16.to_le_bytes()); // ehsize
    f[0x36..0x38].copy_from_slice(&0x38u16.to_le_bytes()); // phentsize
    f[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes()); // phnum
    let ph = 0x40;
    f[ph..ph + 4].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    f[ph + 4..ph + 8].copy_from_slice(&5u32.to_le_bytes()); // R X
    f[ph + 8..ph + 16].copy_from_slice(&0x78u64.to_le_bytes()); // offset
    f[ph + 16..ph + 24].copy_from_slice(&0x10_0000u64.to_le_bytes()); // vaddr
    f[ph + 24..ph + 32].copy_from_slice(&0x10_0000u64.to_le_bytes()); // paddr
    f[ph + 32..ph + 40].copy_from_slice(&(code.len() as u64).to_le_bytes());
    f[ph + 40..ph + 48].copy_from_slice(&(code.len() as u64).to_le_bytes());
    f.extend_from_slice(code);
    let path = dir.join("vmlinux");
    std::fs::write(&path, f).unwrap();
    path
}

fn linux_config(dir: &std::path::Path, initrd: bool, cmdline: &str) -> VmConfig {
    let initrd = initrd.then(|| {
        let p = dir.join("initrd.img");
        std::fs::write(&p, vec![0x5a; 10_000]).unwrap();
        p
    });
    VmConfig {
        vcpus: 2,
        memory_mib: 128,
        prefault: false,
        payload: Payload::Linux {
            kernel: elf_kernel(dir, &[0xf4; 64]),
            initrd,
            cmdline: cmdline.into(),
        },
        ..Default::default()
    }
}

#[test]
fn a_linux_guest_gets_its_boot_state_devices_and_a_clean_end_on_reset() {
    use vm_memory::{Bytes, GuestAddress};

    use crate::arch::x86_64::linux as boot;
    use crate::hypervisor::Vcpu as _;

    let dir = vmm_sys_util::tempdir::TempDir::new().unwrap();
    let serial = |b: u8| Step::now(FakeExit::IoOut(0x3f8, vec![b]));
    let mut bsp: Vec<Step> = b"Linux\n".iter().map(|&b| serial(b)).collect();
    bsp.push(Step::now(FakeExit::IoOut(0x80, vec![0]))); // POST code: unclaimed
    bsp.push(Step::now(FakeExit::IoOut(0x64, vec![0xfe]))); // i8042 reset
    let scripts = vec![bsp, vec![Step::after(60_000_000_000, FakeExit::Hlt)]];
    let vm = Vm::build(
        linux_config(dir.as_path(), true, "quiet ppa.workload=spin"),
        FakeHypervisor::new(scripts),
    )
    .unwrap();
    let mem = vm._ram.memory();
    // The zero page: the command line with the VMM's part first, the initrd, the e820 map.
    let params: linux_loader::loader::bootparam::boot_params =
        mem.read_obj(GuestAddress(boot::ZERO_PAGE_GPA)).unwrap();
    let hdr = params.hdr;
    let (ramdisk, ramdisk_size) = (hdr.ramdisk_image, hdr.ramdisk_size);
    assert_eq!(ramdisk_size, 10_000);
    assert_eq!(
        mem.read_obj::<u8>(GuestAddress(u64::from(ramdisk)))
            .unwrap(),
        0x5a
    );
    let mut cmdline = vec![0u8; hdr.cmdline_size as usize];
    mem.read_slice(&mut cmdline, GuestAddress(boot::CMDLINE_GPA))
        .unwrap();
    let cmdline = String::from_utf8(cmdline).unwrap();
    assert!(
        cmdline.starts_with("console=ttyS0 reboot=k panic=1 pci=off ppa.page=0xfd000000,65536 "),
        "{cmdline}"
    );
    assert!(cmdline.ends_with(" quiet ppa.workload=spin"), "{cmdline}");
    let entries = params.e820_entries as usize;
    let page = params.e820_table[..entries]
        .iter()
        .find(|e| e.addr == PPA_PAGE_GPA)
        .expect("the PPA page is in the e820 map");
    let kind = page.r#type;
    assert_eq!(kind, boot::E820_RESERVED);
    assert_eq!(
        mem.read_obj::<[u8; 4]>(GuestAddress(boot::MPTABLE_GPA))
            .unwrap(),
        *b"_MP_"
    );
    assert_eq!(
        mem.read_obj::<[u8; 8]>(GuestAddress(crate::arch::x86_64::acpi::RSDP_GPA))
            .unwrap(),
        *b"RSD PTR "
    );
    let rsdp_addr = params.acpi_rsdp_addr;
    assert_eq!(rsdp_addr, crate::arch::x86_64::acpi::RSDP_GPA);
    // The boot vCPU enters the kernel in 64-bit mode with RSI at the zero page; every vCPU has
    // its APIC ID in CPUID and the boot MSRs.
    let r = vm.vcpus[0].regs().unwrap();
    assert_eq!((r.rip, r.rsi), (0x10_0000, boot::ZERO_PAGE_GPA));
    assert!(vm.vcpus[0].sregs().unwrap().cs.l);
    for (i, v) in vm.vcpus.iter().enumerate() {
        let leaf1 = v
            .cpuid
            .lock()
            .unwrap()
            .iter()
            .find(|e| e.function == 1)
            .copied()
            .unwrap();
        assert_eq!(leaf1.ebx >> 24, i as u32);
        assert!(!v.msrs.lock().unwrap().is_empty());
    }
    let out = vm.run().unwrap();
    let r = &out.report;
    assert_eq!(out.exit_code, 0, "a guest reset ends the run cleanly");
    assert_eq!(r.vm.end, VmEnd::Completed);
    assert_eq!(
        (r.vcpus[0].end, r.vcpus[0].exit_code),
        (VcpuEndKind::Exited, Some(0))
    );
    assert_eq!(r.vcpus[1].end, VcpuEndKind::Stopped);
    let json = serde_json::to_value(r).unwrap();
    assert_eq!(json["vm"]["console_lines"], 1);
    assert_eq!(json["vm"]["resets"], 1);
    assert!(json["vm"]["cmdline"]
        .as_str()
        .unwrap()
        .contains("ppa.page="));
    assert!(json["vcpus"][0].get("workload").is_none(), "no tiny fields");
}

#[test]
fn bad_linux_input_is_refused_before_any_vcpu_runs() {
    let dir = vmm_sys_util::tempdir::TempDir::new().unwrap();
    let d = dir.as_path();
    let build = |c: VmConfig| Vm::build(c, FakeHypervisor::new(Vec::new())).err();
    // Not a kernel.
    let mut c = linux_config(d, false, "");
    let junk = d.join("junk");
    std::fs::write(&junk, b"not a kernel at all").unwrap();
    c.payload = Payload::Linux {
        kernel: junk,
        initrd: None,
        cmdline: String::new(),
    };
    assert!(matches!(
        build(c),
        Some(VmError::Payload(PayloadError::Kernel(_)))
    ));
    // A missing initrd.
    let mut c = linux_config(d, false, "");
    if let Payload::Linux { initrd, .. } = &mut c.payload {
        *initrd = Some(d.join("missing.img"));
    }
    assert!(matches!(
        build(c),
        Some(VmError::Payload(PayloadError::ReadImage { .. }))
    ));
    // An over-long command line.
    let c = linux_config(d, false, &"x".repeat(3000));
    assert!(matches!(
        build(c),
        Some(VmError::Payload(PayloadError::CmdlineTooLong { .. }))
    ));
    // Too little memory.
    let mut c = linux_config(d, false, "");
    c.memory_mib = 16;
    let e = build(c).unwrap();
    assert!(
        matches!(e, VmError::Payload(PayloadError::LinuxTooSmall { .. })),
        "{e}"
    );
    assert!(e.to_string().contains("too small"));
}

/// The command line a Linux VM's kernel finds in guest memory.
fn guest_cmdline<H: Hypervisor>(vm: &Vm<H>) -> String {
    use vm_memory::{Bytes, GuestAddress};

    use crate::arch::x86_64::linux as boot;

    let mem = vm._ram.memory();
    let params: linux_loader::loader::bootparam::boot_params =
        mem.read_obj(GuestAddress(boot::ZERO_PAGE_GPA)).unwrap();
    let mut cmdline = vec![0u8; params.hdr.cmdline_size as usize];
    mem.read_slice(&mut cmdline, GuestAddress(boot::CMDLINE_GPA))
        .unwrap();
    String::from_utf8(cmdline).unwrap()
}

#[test]
fn a_linux_vcpu_finds_the_ppa_page_by_cpuid_as_by_its_command_line() {
    use ppa_guest_abi::cpuid::{self, CpuidLeaf, PageLocation};
    use ppa_guest_abi::ppa_page::{MAJOR, MINOR};

    let dir = vmm_sys_util::tempdir::TempDir::new().unwrap();
    for size in [64 << 10, crate::arch::x86_64::layout::PPA_PAGE_MAX] {
        let mut c = linux_config(dir.as_path(), false, "quiet");
        c.ppa_page_size = size;
        let vm = Vm::build(c, FakeHypervisor::new(Vec::new())).unwrap();
        // The command line, read by the agent's own parser (as from /proc/cmdline).
        let cmdline = guest_cmdline(&vm);
        assert_eq!(
            ppa_agent::discover::cmdline_page(&cmdline),
            Ok(Some((PPA_PAGE_GPA, size))),
            "{cmdline}"
        );
        for (i, v) in vm.vcpus.iter().enumerate() {
            let entries = v.cpuid.lock().unwrap().clone();
            let leaf = |function: u32| {
                let found: Vec<_> = entries.iter().filter(|e| e.function == function).collect();
                assert_eq!(found.len(), 1, "vCPU {i}: leaf {function:#x} once");
                let e = found[0];
                CpuidLeaf {
                    function,
                    eax: e.eax,
                    ebx: e.ebx,
                    ecx: e.ecx,
                    edx: e.edx,
                }
            };
            assert_eq!(
                cpuid::decode(leaf(cpuid::BASE), leaf(cpuid::LEAF_PAGE)),
                Ok(PageLocation {
                    gpa: PPA_PAGE_GPA,
                    size: size as u32,
                    major: MAJOR,
                    minor: MINOR,
                }),
                "vCPU {i}"
            );
            // KVM's leaves stay where Linux looks first; ours is a separate range.
            assert_eq!(leaf(0x4000_0000).ebx, 0x4b4d_564b, "vCPU {i}: KVMK");
        }
    }
    // Without a page, neither the leaves nor the parameter.
    let mut c = linux_config(dir.as_path(), false, "");
    c.ppa_page_size = 0;
    let vm = Vm::build(c, FakeHypervisor::new(Vec::new())).unwrap();
    assert_eq!(
        ppa_agent::discover::cmdline_page(&guest_cmdline(&vm)),
        Ok(None)
    );
    for v in &vm.vcpus {
        let entries = v.cpuid.lock().unwrap();
        assert!(!entries.iter().any(|e| e.function == cpuid::BASE));
        assert!(!entries.is_empty(), "the rest of the CPUID is there");
    }
}
