//! The guest-physical memory map of a VM on x86_64: RAM around a 32-bit MMIO gap, and what the
//! VMM places in the gap.
//!
//! ```text
//! 0x0000_0000      RAM, up to MMIO_GAP_START (3 GiB)
//! 0xC000_0000      MMIO gap (1 GiB), no RAM:
//!   0xC000_0000      device window: MMIO devices of a VM (256 MiB); virtio-mmio windows of
//!                    4 KiB each from its start (device i at + i × 4 KiB, interrupt GSI 5 + i)
//!   0xD000_0000      the tiny guest's doorbell page (ppa_guest_abi::DOORBELL_GPA)
//!   0xFD00_0000      the PPA page, up to 16 MiB (a Linux guest sees it as e820 reserved)
//!   0xFEC0_0000      IOAPIC, then HPET (0xFED0_0000), LAPIC (0xFEE0_0000), firmware
//! 0x1_0000_0000    RAM above 4 GiB: what did not fit below the gap
//! ```
//! The layout follows the PC: Linux finds its RAM in e820 and every fixed device where it
//! expects it. Everything is a pure function of the RAM size, unit-tested below; the memory
//! manager (`memory`) maps what [`ram_regions`] returns.

use ppa_guest_abi::{DOORBELL_GPA, DOORBELL_SIZE};

/// Start of the 32-bit MMIO gap: RAM below 4 GiB ends here.
pub const MMIO_GAP_START: u64 = 0xC000_0000;
/// End of the gap: RAM resumes here.
pub const MMIO_GAP_END: u64 = 1 << 32;
/// Start of the window for a VM's MMIO devices.
pub const DEVICE_WINDOW_START: u64 = 0xC000_0000;
/// Size of the device window.
pub const DEVICE_WINDOW_SIZE: u64 = 0x1000_0000;
/// Size of one virtio-mmio window.
pub const VIRTIO_WINDOW: u64 = 0x1000;
/// The most virtio devices a VM has (their interrupts take IOAPIC pins 5 to 20).
pub const MAX_VIRTIO_DEVICES: usize = 16;
/// The interrupt (GSI, IOAPIC pin) of virtio device 0; device i has `VIRTIO_GSI_BASE + i`.
/// Pins 0 to 4 are the PC's (timer, keyboard, cascade, COM2, COM1).
pub const VIRTIO_GSI_BASE: u32 = 5;
/// Guest-physical address of the PPA page, in the gap, outside RAM.
pub const PPA_PAGE_GPA: u64 = 0xFD00_0000;
/// Most bytes the PPA page may take at [`PPA_PAGE_GPA`].
pub const PPA_PAGE_MAX: u64 = 16 << 20;
/// IOAPIC: the start of the PC's fixed devices, which nothing of ours may overlap.
pub const IOAPIC_START: u64 = 0xFEC0_0000;
/// Smallest RAM size.
pub const MIN_RAM_BYTES: u64 = 2 << 20;
/// Largest RAM size (1 TiB: the physical address bits every x86_64 host has leave room
/// above it; a payload may accept less).
pub const MAX_RAM_BYTES: u64 = 1 << 40;

const _: () = {
    assert!(DEVICE_WINDOW_START >= MMIO_GAP_START);
    assert!(DEVICE_WINDOW_START + DEVICE_WINDOW_SIZE <= DOORBELL_GPA);
    assert!(DOORBELL_GPA + DOORBELL_SIZE <= PPA_PAGE_GPA);
    assert!(PPA_PAGE_GPA + PPA_PAGE_MAX <= IOAPIC_START);
};

/// A range of guest-physical addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// Start.
    pub gpa: u64,
    /// Bytes.
    pub size: u64,
}

impl Region {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.gpa + self.size
    }

    /// Whether the two ranges share a byte.
    pub fn overlaps(&self, other: &Region) -> bool {
        self.gpa < other.end() && other.gpa < self.end()
    }
}

/// The RAM regions of a VM with `ram_bytes` of RAM: from 0 up to the gap, the rest from
/// 4 GiB. Sizes are kept as given (the caller checks page alignment).
pub fn ram_regions(ram_bytes: u64) -> Vec<Region> {
    let low = ram_bytes.min(MMIO_GAP_START);
    let mut out = vec![Region { gpa: 0, size: low }];
    if ram_bytes > low {
        out.push(Region {
            gpa: MMIO_GAP_END,
            size: ram_bytes - low,
        });
    }
    out
}

/// Virtio device `i`'s MMIO window and its interrupt, or None past the last one.
pub fn virtio_slot(i: usize) -> Option<(Region, u32)> {
    (i < MAX_VIRTIO_DEVICES).then(|| {
        (
            Region {
                gpa: DEVICE_WINDOW_START + i as u64 * VIRTIO_WINDOW,
                size: VIRTIO_WINDOW,
            },
            VIRTIO_GSI_BASE + i as u32,
        )
    })
}

/// The PPA page's region for a page of `size` bytes, or None when it does not fit.
pub fn ppa_page_region(size: u64) -> Option<Region> {
    (size <= PPA_PAGE_MAX).then_some(Region {
        gpa: PPA_PAGE_GPA,
        size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ram_fits_below_the_gap_or_continues_above_4gib() {
        assert_eq!(
            ram_regions(32 << 20),
            vec![Region {
                gpa: 0,
                size: 32 << 20
            }]
        );
        assert_eq!(
            ram_regions(MMIO_GAP_START),
            vec![Region {
                gpa: 0,
                size: MMIO_GAP_START
            }],
            "exactly up to the gap: no high region"
        );
        let five = ram_regions(5 << 30);
        assert_eq!(
            five,
            vec![
                Region {
                    gpa: 0,
                    size: 3 << 30
                },
                Region {
                    gpa: 4 << 30,
                    size: 2 << 30
                }
            ]
        );
        assert_eq!(
            five.iter().map(|r| r.size).sum::<u64>(),
            5 << 30,
            "no RAM lost"
        );
        for r in ram_regions(MAX_RAM_BYTES) {
            let gap = Region {
                gpa: MMIO_GAP_START,
                size: MMIO_GAP_END - MMIO_GAP_START,
            };
            assert!(!r.overlaps(&gap), "{r:?} overlaps the gap");
        }
    }

    #[test]
    fn virtio_windows_are_in_the_device_window_with_pins_below_the_ioapic_limit() {
        let (first, gsi) = virtio_slot(0).unwrap();
        assert_eq!((first.gpa, first.size, gsi), (0xC000_0000, 0x1000, 5));
        let (last, gsi) = virtio_slot(MAX_VIRTIO_DEVICES - 1).unwrap();
        assert!(last.end() <= DEVICE_WINDOW_START + DEVICE_WINDOW_SIZE);
        assert!(gsi < 24, "an IOAPIC has 24 pins");
        assert!(virtio_slot(MAX_VIRTIO_DEVICES).is_none());
        assert!(!last.overlaps(&first));
    }

    #[test]
    fn the_ppa_page_lies_in_the_gap_outside_ram_and_devices() {
        let page = ppa_page_region(PPA_PAGE_MAX).unwrap();
        assert!(page.gpa >= MMIO_GAP_START && page.end() <= IOAPIC_START);
        for r in ram_regions(64 << 30) {
            assert!(!r.overlaps(&page));
        }
        let doorbell = Region {
            gpa: DOORBELL_GPA,
            size: DOORBELL_SIZE,
        };
        assert!(!page.overlaps(&doorbell));
        assert!(ppa_page_region(PPA_PAGE_MAX + 4096).is_none());
        assert!(!Region { gpa: 0, size: 10 }.overlaps(&Region { gpa: 10, size: 1 }));
    }
}
