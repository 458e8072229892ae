//! The Intel MultiProcessor table (MP spec 1.4): how a Linux guest finds its vCPUs, its IOAPIC
//! and its interrupt wiring without ACPI.
//!
//! Data flow: the Linux payload writes [`mptable`]'s bytes into the EBDA (where Linux scans
//! for the `_MP_` floating pointer); finding no ACPI tables, Linux reads the MP table. The
//! table lists one processor entry per vCPU
//! (APIC ID = vCPU index, vCPU 0 the bootstrap processor), one ISA bus, the IOAPIC at
//! 0xFEC0_0000, ISA IRQs 0–23 routed 1:1 to IOAPIC pins, LINT0 as ExtINT and LINT1 as NMI.
//!
//! Why an MP table and not ACPI: it is a few hundred bytes of fixed structures, enough for
//! Linux to bring up every vCPU and route the serial port's interrupt, and it needs no AML.
//! What it cannot say (CPU hotplug, power buttons, NUMA) no product feature needs yet.

use super::layout::IOAPIC_START;

/// Most vCPUs an MP table here describes (APIC IDs are 8 bits; one is the IOAPIC's).
pub const MAX_CPUS: usize = 254;
/// Legacy interrupts routed through the IOAPIC.
const IRQS: u8 = 24;
const LAPIC_VERSION: u8 = 0x14;
const LAPIC_BASE: u32 = 0xfee0_0000;

fn checksum(bytes: &[u8]) -> u8 {
    0u8.wrapping_sub(bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b)))
}

/// The floating pointer, configuration table and entries for `vcpus` vCPUs, as placed at
/// `at` (the floating pointer names the table's address).
pub fn mptable(at: u64, vcpus: usize) -> Vec<u8> {
    let vcpus = vcpus.min(MAX_CPUS);
    let ioapic_id = vcpus as u8;
    let mut entries = Vec::new();
    for i in 0..vcpus {
        let mut e = [0u8; 20];
        e[0] = 0; // processor
        e[1] = i as u8; // local APIC id
        e[2] = LAPIC_VERSION;
        e[3] = 0x1 | if i == 0 { 0x2 } else { 0 }; // enabled, BSP
        e[4..8].copy_from_slice(&0x600u32.to_le_bytes()); // signature: family 6
        e[8..12].copy_from_slice(&0x201u32.to_le_bytes()); // features: FPU, APIC
        entries.extend_from_slice(&e);
    }
    let mut bus = [0u8; 8];
    bus[0] = 1; // bus
    bus[2..8].copy_from_slice(b"ISA   ");
    entries.extend_from_slice(&bus);
    let mut ioapic = [0u8; 8];
    ioapic[0] = 2; // IOAPIC
    ioapic[1] = ioapic_id;
    ioapic[2] = LAPIC_VERSION;
    ioapic[3] = 1; // usable
    ioapic[4..8].copy_from_slice(&(IOAPIC_START as u32).to_le_bytes());
    entries.extend_from_slice(&ioapic);
    for irq in 0..IRQS {
        // I/O interrupt: INT, conforming polarity and trigger, ISA bus 0 irq → IOAPIC pin irq.
        entries.extend_from_slice(&[3, 0, 0, 0, 0, irq, ioapic_id, irq]);
    }
    // Local interrupts: ExtINT to LINT0 and NMI to LINT1 of every local APIC (id 0xff).
    entries.extend_from_slice(&[4, 3, 0, 0, 0, 0, 0xff, 0]);
    entries.extend_from_slice(&[4, 1, 0, 0, 0, 0, 0xff, 1]);

    let count = (vcpus + 1 + 1 + IRQS as usize + 2) as u16;
    let mut table = [0u8; 44];
    table[0..4].copy_from_slice(b"PCMP");
    let length = (table.len() + entries.len()) as u16;
    table[4..6].copy_from_slice(&length.to_le_bytes());
    table[6] = 4; // spec 1.4
    table[8..16].copy_from_slice(b"PPA-VMM ");
    table[16..28].copy_from_slice(b"PPA-VMM     ");
    table[34..36].copy_from_slice(&count.to_le_bytes());
    table[36..40].copy_from_slice(&LAPIC_BASE.to_le_bytes());
    let mut body = table.to_vec();
    body.extend_from_slice(&entries);
    body[7] = checksum(&body);

    let mut fp = [0u8; 16];
    fp[0..4].copy_from_slice(b"_MP_");
    fp[4..8].copy_from_slice(&((at + 16) as u32).to_le_bytes());
    fp[8] = 1; // length in 16-byte units
    fp[9] = 4; // spec 1.4
    fp[10] = checksum(&fp);
    let mut out = fp.to_vec();
    out.extend_from_slice(&body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(b: &[u8]) -> u8 {
        b.iter().fold(0u8, |a, x| a.wrapping_add(*x))
    }

    #[test]
    fn the_table_lists_every_vcpu_and_checksums_to_zero() {
        for vcpus in [1usize, 2, 64] {
            let t = mptable(0x9_fc00, vcpus);
            assert_eq!(&t[0..4], b"_MP_");
            assert_eq!(sum(&t[0..16]), 0, "floating pointer checksum");
            assert_eq!(u32::from_le_bytes(t[4..8].try_into().unwrap()), 0x9_fc10);
            let body = &t[16..];
            assert_eq!(&body[0..4], b"PCMP");
            let len = u16::from_le_bytes([body[4], body[5]]) as usize;
            assert_eq!(len, body.len());
            assert_eq!(sum(body), 0, "table checksum");
            let count = u16::from_le_bytes([body[34], body[35]]) as usize;
            assert_eq!(count, vcpus + 2 + 24 + 2);
            // Processor entries: APIC ids 0..n, only the first is the bootstrap processor.
            let cpus: Vec<&[u8]> = body[44..44 + 20 * vcpus].chunks(20).collect();
            for (i, c) in cpus.iter().enumerate() {
                assert_eq!((c[0], usize::from(c[1])), (0, i));
                assert_eq!(c[3] & 0x2 != 0, i == 0, "BSP flag of cpu {i}");
            }
            // The IOAPIC follows the bus, with an id no CPU has.
            let ioapic = &body[44 + 20 * vcpus + 8..][..8];
            assert_eq!((ioapic[0], usize::from(ioapic[1])), (2, vcpus));
            assert_eq!(
                u32::from_le_bytes(ioapic[4..8].try_into().unwrap()),
                0xfec0_0000
            );
        }
        assert_eq!(mptable(0, 1000).len(), mptable(0, MAX_CPUS).len());
    }
}
