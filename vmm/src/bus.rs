//! The device bus: guest-physical (MMIO) and port (PIO) address ranges mapped to devices.
//!
//! Data flow: a vCPU thread gets an MMIO or PIO exit from KVM_RUN, `exit::handle_exit` looks the
//! address up here, and the device behind it returns a [`DeviceAction`] for the vCPU to carry
//! out. Devices are stateless or keep their own per-vCPU state in atomics, so a lookup takes no
//! lock; the bus is built before the vCPUs start and never changes while they run.

use std::sync::Arc;

use thiserror::Error;

/// What a device asks of the vCPU that accessed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceAction {
    /// Nothing more: resume the guest.
    None,
    /// A console byte from the guest.
    Console(u8),
    /// The vCPU exits with this code.
    Exit(u64),
    /// Park the vCPU for this many ns (or until kicked): the tiny guest's HLT.
    Halt(u64),
    /// The guest reports a measurement.
    Report {
        /// Report key (`ppa_guest_abi::report`).
        key: u64,
        /// Value.
        value: u64,
    },
    /// A workload doorbell ring (counted, nothing else).
    Workload,
    /// An access the device does not implement (reads give zeros, writes are dropped).
    Unhandled,
}

/// A device on a bus.
pub trait BusDevice: Send + Sync {
    /// The guest reads `data.len()` bytes at `offset` inside the device's range.
    fn read(&self, vcpu: usize, offset: u64, data: &mut [u8]) -> DeviceAction;
    /// The guest writes `data` at `offset` inside the device's range.
    fn write(&self, vcpu: usize, offset: u64, data: &[u8]) -> DeviceAction;
}

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

/// A set of non-overlapping ranges, each with a device; lookups are a binary search.
#[derive(Default)]
pub struct Bus {
    entries: Vec<Entry>,
}

impl Bus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
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
    pub fn resolve(&self, addr: u64, size: usize) -> Option<(&dyn BusDevice, u64)> {
        let i = self
            .entries
            .partition_point(|e| e.base <= addr)
            .checked_sub(1)?;
        let e = &self.entries[i];
        let offset = addr - e.base;
        let end = offset.checked_add(size as u64)?;
        (end <= e.len).then_some((e.device.as_ref(), offset))
    }

    /// Reads from the device at `addr`; with none there the guest reads zeros.
    pub fn read(&self, vcpu: usize, addr: u64, data: &mut [u8]) -> DeviceAction {
        match self.resolve(addr, data.len()) {
            Some((dev, offset)) => dev.read(vcpu, offset, data),
            None => {
                data.fill(0);
                DeviceAction::Unhandled
            }
        }
    }

    /// Writes to the device at `addr`; with none there the write is dropped.
    pub fn write(&self, vcpu: usize, addr: u64, data: &[u8]) -> DeviceAction {
        match self.resolve(addr, data.len()) {
            Some((dev, offset)) => dev.write(vcpu, offset, data),
            None => DeviceAction::Unhandled,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Echo(u8);
    impl BusDevice for Echo {
        fn read(&self, _vcpu: usize, offset: u64, data: &mut [u8]) -> DeviceAction {
            data.fill(self.0 + offset as u8);
            DeviceAction::None
        }
        fn write(&self, _vcpu: usize, _offset: u64, data: &[u8]) -> DeviceAction {
            DeviceAction::Console(data[0])
        }
    }

    #[test]
    fn resolves_inside_ranges_only() {
        let mut bus = Bus::new();
        bus.insert(0x1000, 0x100, Arc::new(Echo(1))).unwrap();
        bus.insert(0x100, 0x10, Arc::new(Echo(50))).unwrap();
        let mut b = [0u8; 2];
        assert_eq!(bus.read(0, 0x1004, &mut b), DeviceAction::None);
        assert_eq!(b, [5, 5]);
        assert_eq!(bus.read(0, 0x100, &mut b), DeviceAction::None);
        assert_eq!(b, [50, 50]);
        assert_eq!(
            bus.read(0, 0x10ff, &mut b),
            DeviceAction::Unhandled,
            "straddles the end"
        );
        assert_eq!(b, [0, 0]);
        assert_eq!(bus.write(0, 0xfff, &[1]), DeviceAction::Unhandled);
        assert_eq!(bus.write(0, 0x1000, &[7]), DeviceAction::Console(7));
        assert_eq!(bus.write(0, u64::MAX, &[7]), DeviceAction::Unhandled);
    }

    #[test]
    fn refuses_overlaps_and_empty_ranges() {
        let mut bus = Bus::new();
        bus.insert(0x1000, 0x100, Arc::new(Echo(0))).unwrap();
        assert_eq!(
            bus.insert(0x10ff, 1, Arc::new(Echo(0))),
            Err(BusError::Overlap {
                base: 0x10ff,
                len: 1
            })
        );
        assert!(matches!(
            bus.insert(0x2000, 0, Arc::new(Echo(0))),
            Err(BusError::BadRange { .. })
        ));
        assert!(matches!(
            bus.insert(u64::MAX, 2, Arc::new(Echo(0))),
            Err(BusError::BadRange { .. })
        ));
    }
}
