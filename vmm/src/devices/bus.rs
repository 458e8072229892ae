//! The device buses: guest-physical (MMIO) and port (PIO) address ranges mapped to devices.
//!
//! Data flow: the VM builder inserts each device at its range before the vCPUs start; the bus
//! never changes afterwards, so a lookup (a binary search) takes no lock. A vCPU's MMIO or PIO
//! exit calls [`Bus::read`] or [`Bus::write`], which hands the device a [`BusAccess`] and returns
//! what the device asks of the vCPU. An access no device claims reads as zeros, is dropped when
//! written, and is counted per vCPU ([`Bus::unclaimed`]): a guest probing for hardware that is
//! not there shows up in the report instead of vanishing.

use std::sync::Arc;

use thiserror::Error;

use super::{BusAccess, BusDevice, VcpuRequest};
use crate::sync::Counter;

/// Why a device could not be added.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BusError {
    /// The range is empty or wraps around.
    #[error("the device range at {base:#x} of length {len:#x} is empty or wraps around")]
    BadRange {
        /// Start.
        base: u64,
        /// Length.
        len: u64,
    },
    /// The range overlaps a device already on the bus.
    #[error("the device range at {base:#x} of length {len:#x} overlaps another device")]
    Overlap {
        /// Start.
        base: u64,
        /// Length.
        len: u64,
    },
}

struct Entry {
    base: u64,
    len: u64,
    device: Arc<dyn BusDevice>,
}

/// A set of non-overlapping ranges, each with a device.
pub struct Bus {
    entries: Vec<Entry>,
    unclaimed: Box<[Counter]>,
}

impl Bus {
    /// An empty bus for a VM of `vcpus` vCPUs.
    pub fn new(vcpus: usize) -> Self {
        Bus {
            entries: Vec::new(),
            unclaimed: (0..vcpus).map(|_| Counter::default()).collect(),
        }
    }

    /// Adds `device` at `[base, base + len)`.
    pub fn insert(
        &mut self,
        base: u64,
        len: u64,
        device: Arc<dyn BusDevice>,
    ) -> Result<(), BusError> {
        let end = base
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or(BusError::BadRange { base, len })?;
        if self
            .entries
            .iter()
            .any(|e| base < e.base + e.len && e.base < end)
        {
            return Err(BusError::Overlap { base, len });
        }
        let pos = self.entries.partition_point(|e| e.base < base);
        self.entries.insert(pos, Entry { base, len, device });
        Ok(())
    }

    /// The device at `addr` and the offset of `addr` inside it. An access must lie wholly inside
    /// one device.
    fn resolve(&self, addr: u64, size: usize) -> Option<(&dyn BusDevice, u64)> {
        let i = self
            .entries
            .partition_point(|e| e.base <= addr)
            .checked_sub(1)?;
        let e = &self.entries[i];
        let offset = addr - e.base;
        let end = offset.checked_add(size as u64)?;
        (end <= e.len).then_some((e.device.as_ref(), offset))
    }

    fn count_unclaimed(&self, vcpu: usize) {
        if let Some(c) = self.unclaimed.get(vcpu) {
            c.add(1);
        }
    }

    /// Vcpu `vcpu` reads at `addr`; with no device there it reads zeros.
    pub fn read(&self, vcpu: usize, addr: u64, data: &mut [u8]) -> Option<VcpuRequest> {
        match self.resolve(addr, data.len()) {
            Some((dev, offset)) => dev.read(BusAccess { vcpu, addr, offset }, data),
            None => {
                data.fill(0);
                self.count_unclaimed(vcpu);
                None
            }
        }
    }

    /// vCPU `vcpu` writes at `addr`; with no device there the write is dropped.
    #[link_section = "ppa_hot"]
    pub fn write(&self, vcpu: usize, addr: u64, data: &[u8]) -> Option<VcpuRequest> {
        match self.resolve(addr, data.len()) {
            Some((dev, offset)) => dev.write(BusAccess { vcpu, addr, offset }, data),
            None => {
                self.count_unclaimed(vcpu);
                None
            }
        }
    }

    /// Accesses of vCPU `vcpu` that no device claimed.
    pub fn unclaimed(&self, vcpu: usize) -> u64 {
        self.unclaimed.get(vcpu).map_or(0, Counter::get)
    }

    /// Every device on the bus, once each, in address order.
    pub fn devices(&self) -> Vec<&dyn BusDevice> {
        let mut out: Vec<&Arc<dyn BusDevice>> = Vec::new();
        for e in &self.entries {
            if !out.iter().any(|d| Arc::ptr_eq(d, &e.device)) {
                out.push(&e.device);
            }
        }
        out.into_iter().map(|d| d.as_ref()).collect()
    }
}

/// The VM's two buses.
pub struct Buses {
    /// Guest-physical addresses with no memory behind them.
    pub mmio: Bus,
    /// I/O ports.
    pub pio: Bus,
}

impl Buses {
    /// Empty buses for a VM of `vcpus` vCPUs.
    pub fn new(vcpus: usize) -> Self {
        Buses {
            mmio: Bus::new(vcpus),
            pio: Bus::new(vcpus),
        }
    }

    /// Tells every device that vCPU `vcpu` has ended.
    pub fn vcpu_ended(&self, vcpu: usize) {
        let mmio = self.mmio.devices();
        for d in &mmio {
            d.vcpu_ended(vcpu);
        }
        for d in self.pio.devices() {
            if !mmio.iter().any(|m| std::ptr::addr_eq(*m, d)) {
                d.vcpu_ended(vcpu);
            }
        }
    }

    /// Accesses of vCPU `vcpu` that no device claimed, on either bus.
    pub fn unclaimed(&self, vcpu: usize) -> u64 {
        self.mmio.unclaimed(vcpu) + self.pio.unclaimed(vcpu)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Reads give `fill + offset`; writes of one byte ask to exit with that byte; writes of two
    /// ask to park until that many ns; counts `vcpu_ended` calls.
    #[derive(Default)]
    struct Probe {
        fill: u8,
        ended: AtomicUsize,
    }

    impl BusDevice for Probe {
        fn read(&self, a: BusAccess, data: &mut [u8]) -> Option<VcpuRequest> {
            data.fill(self.fill + a.offset as u8);
            None
        }
        fn write(&self, a: BusAccess, data: &[u8]) -> Option<VcpuRequest> {
            match data.len() {
                1 => Some(VcpuRequest::Exit(u64::from(data[0]) + a.vcpu as u64)),
                2 => Some(VcpuRequest::Park {
                    deadline_ns: Some(u64::from(u16::from_le_bytes([data[0], data[1]]))),
                }),
                _ => Some(VcpuRequest::Stop),
            }
        }
        fn vcpu_ended(&self, _vcpu: usize) {
            self.ended.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn probe(fill: u8) -> Arc<Probe> {
        Arc::new(Probe {
            fill,
            ..Default::default()
        })
    }

    #[test]
    fn resolves_inside_ranges_only_and_counts_unclaimed_per_vcpu() {
        let mut bus = Bus::new(2);
        bus.insert(0x1000, 0x100, probe(1)).unwrap();
        bus.insert(0x100, 0x10, probe(50)).unwrap();
        let mut b = [0u8; 2];
        assert_eq!(bus.read(0, 0x1004, &mut b), None);
        assert_eq!(b, [5, 5]);
        assert_eq!(bus.read(0, 0x100, &mut b), None);
        assert_eq!(b, [50, 50]);
        b = [9, 9];
        assert_eq!(bus.read(1, 0x10ff, &mut b), None, "straddles the end");
        assert_eq!(b, [0, 0]);
        assert_eq!(bus.write(1, 0xfff, &[1]), None);
        assert_eq!(bus.write(0, u64::MAX, &[7]), None);
        assert_eq!((bus.unclaimed(0), bus.unclaimed(1)), (1, 2));
        assert_eq!(bus.unclaimed(7), 0, "no such vCPU");
    }

    #[test]
    fn devices_answer_with_the_request_vocabulary() {
        let mut bus = Bus::new(2);
        bus.insert(0x1000, 0x100, probe(0)).unwrap();
        assert_eq!(bus.write(1, 0x1000, &[7]), Some(VcpuRequest::Exit(8)));
        assert_eq!(
            bus.write(0, 0x1010, &500u16.to_le_bytes()),
            Some(VcpuRequest::Park {
                deadline_ns: Some(500)
            })
        );
        assert_eq!(bus.write(0, 0x1010, &[0; 4]), Some(VcpuRequest::Stop));
        assert_eq!(bus.unclaimed(0) + bus.unclaimed(1), 0);
    }

    #[test]
    fn refuses_overlaps_and_empty_ranges() {
        let mut bus = Bus::new(1);
        bus.insert(0x1000, 0x100, probe(0)).unwrap();
        assert_eq!(
            bus.insert(0x10ff, 1, probe(0)),
            Err(BusError::Overlap {
                base: 0x10ff,
                len: 1
            })
        );
        assert!(matches!(
            bus.insert(0x2000, 0, probe(0)),
            Err(BusError::BadRange { .. })
        ));
        assert!(matches!(
            bus.insert(u64::MAX, 2, probe(0)),
            Err(BusError::BadRange { .. })
        ));
    }

    #[test]
    fn each_device_hears_once_that_a_vcpu_ended() {
        let shared = probe(0);
        let other = probe(0);
        let mut buses = Buses::new(1);
        buses.mmio.insert(0x1000, 0x10, shared.clone()).unwrap();
        buses.mmio.insert(0x2000, 0x10, shared.clone()).unwrap();
        buses.pio.insert(0x60, 1, shared.clone()).unwrap();
        buses.pio.insert(0x70, 1, other.clone()).unwrap();
        buses.vcpu_ended(0);
        assert_eq!(shared.ended.load(Ordering::Relaxed), 1);
        assert_eq!(other.ended.load(Ordering::Relaxed), 1);
    }
}
