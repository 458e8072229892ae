//! ACPI tables for a Linux guest: how it finds its vCPUs and its IOAPIC when its kernel has no
//! MP-table parser (Debian's cloud kernel is built without CONFIG_X86_MPPARSE).
//!
//! Data flow: the Linux payload writes [`tables`] into the legacy area below 1 MiB (reserved in
//! e820), where Linux scans 0xE0000–0xFFFFF for the RSDP, and also gives the RSDP's address in
//! the zero page (`acpi_rsdp_addr`). RSDP → XSDT → FADT (hardware-reduced: no PM timer, SCI,
//! fixed registers or legacy PIC; no VGA, no MSI, no 8042 to probe) → DSDT, whose one device is
//! COM1 (PNP0501 at ports 0x3F8–0x3FF with GSI 4, edge, active high: a hardware-reduced guest
//! has no legacy ISA IRQ numbers, so the UART's interrupt must be described here for Linux to
//! map it), and one `LNRO0005` device per virtio-mmio window (its 4 KiB window as a
//! Memory32Fixed and its GSI, edge, active high, in `_CRS`: what Linux's virtio_mmio module
//! matches in its ACPI table, and the only way Debian's kernels, built without
//! `CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES`, find them); XSDT → MADT (one local APIC per vCPU,
//! APIC ID = vCPU index, and the IOAPIC at
//! 0xFEC0_0000 with GSI base 0). Built with the rust-vmm `acpi_tables` crate, which computes
//! the checksums and encodes the AML.
//!
//! The i8042 is left out on purpose: its driver's probe of a controller without a keyboard
//! costs seconds of boot, and `reboot=k` writes its reset command to port 0x64 without it.
//!
//! Why ACPI and an MP table both: the MP table costs nothing and serves kernels without ACPI;
//! ACPI serves kernels without an MP parser. Linux takes ACPI's MADT when both exist.

use acpi_tables::fadt::{FADTBuilder, Flags};
use acpi_tables::madt::{
    EnabledStatus, IoApic, LocalInterruptController, ProcessorLocalApic, MADT,
};
use acpi_tables::rsdp::Rsdp;
use acpi_tables::sdt::Sdt;
use acpi_tables::xsdt::XSDT;
use acpi_tables::{aml, Aml};

use super::layout::IOAPIC_START;
use super::mptable::MAX_CPUS;

/// Where the RSDP goes (the start of the area Linux scans).
pub const RSDP_GPA: u64 = 0xe_0000;
const XSDT_GPA: u64 = 0xe_0040;
const FADT_GPA: u64 = 0xe_0100;
const DSDT_GPA: u64 = 0xe_0300;
// The DSDT grows with the virtio devices (about 80 bytes each): room for 7 KiB.
const MADT_GPA: u64 = 0xe_2000;
/// The end of the area the tables may use.
#[cfg(test)]
const END_GPA: u64 = 0xf_0000;

const OEM_ID: [u8; 6] = *b"PPAVMM";
const OEM_TABLE_ID: [u8; 8] = *b"PPAVMM  ";
const LAPIC_BASE: u32 = 0xfee0_0000;
/// IA-PC boot architecture flags: no VGA (bit 2), no MSI (bit 3); no legacy devices (bit 0)
/// or 8042 (bit 1) for the guest to probe.
const IAPC_BOOT_ARCH: u16 = 0b1100;
/// The serial port the DSDT describes, and its interrupt.
const COM1: (u16, u8, u32) = (0x3f8, 8, 4);

/// `Scope (\_SB) { Device (COM1) { _HID PNP0501, _UID 1, _CRS { IO, Interrupt } } }` as AML.
fn com1() -> Vec<u8> {
    let (port, len, gsi) = COM1;
    let io = aml::IO::new(port, port, 1, len);
    let irq = aml::Interrupt::new(true, true, false, false, gsi);
    let crs = aml::ResourceTemplate::new(vec![&io, &irq]);
    let hid = aml::EISAName::new("PNP0501");
    let uid: u8 = 1;
    let (hid, uid, crs) = (
        aml::Name::new("_HID".into(), &hid),
        aml::Name::new("_UID".into(), &uid),
        aml::Name::new("_CRS".into(), &crs),
    );
    let dev = aml::Device::new("COM1".into(), vec![&hid, &uid, &crs]);
    bytes(&aml::Scope::new("\\_SB_".into(), vec![&dev]))
}

/// `Scope (\_SB) { Device (VNNN) { _HID "LNRO0005", _UID N, _CCA 1, _CRS { Memory32Fixed,
/// Interrupt } } }` for each virtio-mmio window `(base, size, gsi)`, as AML.
fn virtio_devices(windows: &[(u64, u64, u32)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, &(base, size, gsi)) in windows.iter().enumerate() {
        let mem = aml::Memory32Fixed::new(true, base as u32, size as u32);
        let irq = aml::Interrupt::new(true, true, false, false, gsi);
        let crs = aml::ResourceTemplate::new(vec![&mem, &irq]);
        let hid: &'static str = "LNRO0005";
        let uid = i as u32;
        let (hid, uid, cca, crs) = (
            aml::Name::new("_HID".into(), &hid),
            aml::Name::new("_UID".into(), &uid),
            aml::Name::new("_CCA".into(), &aml::ONE),
            aml::Name::new("_CRS".into(), &crs),
        );
        let name = format!("V{i:03}");
        let dev = aml::Device::new(name.as_str().into(), vec![&hid, &uid, &cca, &crs]);
        out.extend(bytes(&aml::Scope::new("\\_SB_".into(), vec![&dev])));
    }
    out
}

fn bytes(t: &dyn Aml) -> Vec<u8> {
    let mut v = Vec::new();
    t.to_aml_bytes(&mut v);
    v
}

/// The ACPI tables of a VM with `vcpus` vCPUs and the virtio-mmio windows `virtio`
/// (`(base, size, gsi)` each), as `(guest address, bytes)`.
pub fn tables(vcpus: usize, virtio: &[(u64, u64, u32)]) -> Vec<(u64, Vec<u8>)> {
    let vcpus = vcpus.clamp(1, MAX_CPUS);
    let mut dsdt = Sdt::new(*b"DSDT", 36, 6, OEM_ID, OEM_TABLE_ID, 1);
    dsdt.append_slice(&com1());
    dsdt.append_slice(&virtio_devices(virtio));
    dsdt.update_checksum();
    let mut fadt = FADTBuilder::new(OEM_ID, OEM_TABLE_ID, 1)
        .dsdt_64(DSDT_GPA)
        .flag(Flags::HwReducedAcpi)
        .flag(Flags::PwrButton)
        .flag(Flags::SlpButton);
    fadt.iapc_boot_arch = IAPC_BOOT_ARCH.into();
    let fadt = fadt.finalize();
    let mut madt = MADT::new(
        OEM_ID,
        OEM_TABLE_ID,
        1,
        LocalInterruptController::Address(LAPIC_BASE),
    );
    for i in 0..vcpus {
        madt.add_structure(ProcessorLocalApic::new(
            i as u8,
            i as u8,
            EnabledStatus::Enabled,
        ));
    }
    madt.add_structure(IoApic::new(vcpus as u8, IOAPIC_START as u32, 0));
    let mut xsdt = XSDT::new(OEM_ID, OEM_TABLE_ID, 1);
    xsdt.add_entry(FADT_GPA);
    xsdt.add_entry(MADT_GPA);
    let rsdp = Rsdp::new(OEM_ID, XSDT_GPA);
    vec![
        (RSDP_GPA, bytes(&rsdp)),
        (XSDT_GPA, bytes(&xsdt)),
        (FADT_GPA, bytes(&fadt)),
        (DSDT_GPA, dsdt.as_slice().to_vec()),
        (MADT_GPA, bytes(&madt)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(b: &[u8]) -> u8 {
        b.iter().fold(0u8, |a, x| a.wrapping_add(*x))
    }

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    fn u64_at(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
    }

    #[test]
    fn the_tables_chain_from_the_rsdp_and_checksum_to_zero() {
        for vcpus in [1usize, 2, 64, 254] {
            let t = tables(vcpus, &[]);
            // Each table fits before the next and below the end of the area.
            for w in t.windows(2) {
                assert!(
                    w[0].0 + w[0].1.len() as u64 <= w[1].0,
                    "{:#x} overlaps",
                    w[0].0
                );
            }
            let (last, b) = t.last().unwrap();
            assert!(last + b.len() as u64 <= END_GPA);
            let at = |gpa: u64| &t.iter().find(|(a, _)| *a == gpa).unwrap().1;
            let rsdp = at(RSDP_GPA);
            assert_eq!(&rsdp[0..8], b"RSD PTR ");
            assert_eq!(sum(&rsdp[0..20]), 0);
            assert_eq!(sum(rsdp), 0, "extended checksum");
            let xsdt = at(u64_at(rsdp, 24));
            assert_eq!(&xsdt[0..4], b"XSDT");
            assert_eq!(sum(xsdt), 0);
            let entries: Vec<u64> = (36..xsdt.len())
                .step_by(8)
                .map(|o| u64_at(xsdt, o))
                .collect();
            let fadt = at(entries[0]);
            assert_eq!(&fadt[0..4], b"FACP");
            assert_eq!(sum(fadt), 0);
            assert_ne!(u32_at(fadt, 112) & (1 << 20), 0, "hardware-reduced");
            let dsdt = at(u64_at(fadt, 140));
            assert_eq!((&dsdt[0..4], sum(dsdt)), (&b"DSDT"[..], 0));
            assert_eq!(u32_at(dsdt, 4) as usize, dsdt.len());
            let aml = &dsdt[36..];
            let has = |needle: &[u8]| aml.windows(needle.len()).any(|w| w == needle);
            assert!(has(b"COM1") && has(b"_HID") && has(b"_CRS"), "{aml:x?}");
            // The interrupt descriptor: extended IRQ, consumer + edge, one interrupt, GSI 4.
            assert!(has(&[0x89, 6, 0, 0x03, 1, 4, 0, 0, 0]), "{aml:x?}");
            assert_eq!(u16::from_le_bytes([fadt[109], fadt[110]]), IAPC_BOOT_ARCH);
            let madt = at(entries[1]);
            assert_eq!(&madt[0..4], b"APIC");
            assert_eq!(sum(madt), 0);
            assert_eq!(u32_at(madt, 4) as usize, madt.len());
            // Entries: vcpus local APICs (type 0, ids 0..n), then the IOAPIC (type 1).
            let mut off = 44;
            for i in 0..vcpus {
                assert_eq!((madt[off], madt[off + 1], madt[off + 3]), (0, 8, i as u8));
                assert_eq!(u32_at(madt, off + 4), 1, "enabled");
                off += 8;
            }
            assert_eq!(
                (madt[off], madt[off + 1], madt[off + 2]),
                (1, 12, vcpus as u8)
            );
            assert_eq!(u32_at(madt, off + 4), 0xfec0_0000);
        }
    }

    #[test]
    fn each_virtio_window_is_an_lnro0005_device_with_its_memory_and_interrupt() {
        let windows = [(0xC000_0000, 0x1000, 5), (0xC000_1000, 0x1000, 6)];
        let t = tables(2, &windows);
        let dsdt = &t.iter().find(|(a, _)| *a == DSDT_GPA).unwrap().1;
        assert_eq!(sum(dsdt), 0);
        assert_eq!(u32_at(dsdt, 4) as usize, dsdt.len());
        let aml = &dsdt[36..];
        let count = |needle: &[u8]| aml.windows(needle.len()).filter(|w| *w == needle).count();
        assert_eq!(count(b"LNRO0005\0"), 2, "two devices: {aml:x?}");
        assert_eq!(count(b"V000"), 1);
        assert_eq!(count(b"V001"), 1);
        for (base, size, gsi) in windows {
            // Memory32Fixed: tag 0x86, length 9, read-write, base, size.
            let mut m = vec![0x86, 9, 0, 1];
            m.extend((base as u32).to_le_bytes());
            m.extend((size as u32).to_le_bytes());
            assert_eq!(count(&m), 1, "window at {base:#x}");
            // Extended interrupt: consumer, edge, active high, exclusive; one GSI.
            let mut i = vec![0x89, 6, 0, 0x03, 1];
            i.extend(gsi.to_le_bytes());
            assert_eq!(count(&i), 1, "GSI {gsi}");
        }
        // The tables still fit their area.
        let (last, b) = t.last().unwrap();
        assert!(last + b.len() as u64 <= END_GPA);
        for w in t.windows(2) {
            assert!(w[0].0 + w[0].1.len() as u64 <= w[1].0);
        }
    }
}
