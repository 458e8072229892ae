//! Guest memory: RAM as regions of the architecture's memory map, memory slots, and extra
//! regions such as the PPA page.
//!
//! Data flow: the VM builder asks the memory map for the RAM regions of the configured size
//! (`arch::x86_64::layout::ram_regions`: below the 32-bit MMIO gap and above 4 GiB), and
//! [`GuestRam::create`] maps each as anonymous, unreserved memory (vm-memory's
//! `GuestMemoryMmap`), prefaulted only when asked: a 16 GiB guest costs nothing until the guest
//! touches its pages. [`GuestRam::register`] gives each region a slot from the
//! [`SlotAllocator`] and maps it into the hypervisor's VM; other regions (the PPA page) take the
//! next slots through [`map_region`]. The RAM is shared as an `Arc<GuestMemoryMmap>`: payloads
//! write their images into it before the start, devices (virtio queues) will read it while the
//! guest runs. The memory stays mapped until the VM is dropped, after its vCPUs.

use std::sync::Arc;

use thiserror::Error;
use vm_memory::{
    GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap,
};

use crate::arch::x86_64::layout::Region;
use crate::hypervisor::{self as hv, HvError, MemorySlot};

pub mod backing;
pub use backing::{BackingError, MemoryBacking, PageSize};

/// Why guest memory could not be made or mapped.
#[derive(Debug, Error)]
pub enum MemoryError {
    /// The host would not give the memory.
    #[error("cannot map {bytes} bytes of guest memory")]
    Map {
        /// Bytes asked for.
        bytes: u64,
        /// Cause.
        #[source]
        source: vm_memory::mmap::FromRangesError,
    },
    /// The backing asked for (huge pages, a NUMA node) cannot be had.
    #[error(transparent)]
    Backing(#[from] BackingError),
    /// A region has no host address (a bug: it was just mapped).
    #[error("guest memory at {gpa:#x} has no host address")]
    HostAddress {
        /// Start of the region.
        gpa: u64,
        /// Cause.
        #[source]
        source: vm_memory::GuestMemoryError,
    },
    /// The region does not start and end on a page boundary.
    #[error("the memory region at {gpa:#x} of {size:#x} bytes is not in whole 4 KiB pages")]
    Unaligned {
        /// Start.
        gpa: u64,
        /// Size.
        size: u64,
    },
    /// Every slot the allocator hands out is taken.
    #[error("no memory slot is left (the VM has {0})")]
    NoSlot(u32),
    /// The hypervisor refused a slot.
    #[error(transparent)]
    Hypervisor(#[from] HvError),
}

/// Hands out memory slot numbers in order.
#[derive(Debug, Default)]
pub struct SlotAllocator {
    next: u32,
}

impl SlotAllocator {
    /// Most slots a VM gets (KVM allows at least 32 on every host; we need a handful).
    pub const MAX: u32 = 32;

    /// The next free slot.
    pub fn allocate(&mut self) -> Result<u32, MemoryError> {
        if self.next >= Self::MAX {
            return Err(MemoryError::NoSlot(Self::MAX));
        }
        self.next += 1;
        Ok(self.next - 1)
    }
}

/// Maps `[host_addr, host_addr + region.size)` at `region.gpa` in its own slot.
///
/// # Safety
/// The host range must stay mapped, and be used for nothing but this guest memory, until `vm`
/// and its vCPUs are dropped.
pub unsafe fn map_region<V: hv::Vm>(
    vm: &V,
    slots: &mut SlotAllocator,
    region: Region,
    host_addr: u64,
) -> Result<(), MemoryError> {
    if region.gpa % 4096 != 0 || region.size % 4096 != 0 || region.size == 0 {
        return Err(MemoryError::Unaligned {
            gpa: region.gpa,
            size: region.size,
        });
    }
    let slot = MemorySlot {
        slot: slots.allocate()?,
        gpa: region.gpa,
        size: region.size,
        host_addr,
    };
    // SAFETY: forwarded from this function's contract.
    unsafe { vm.map_memory(&slot) }?;
    Ok(())
}

/// Guest RAM.
#[derive(Debug, Clone)]
pub struct GuestRam {
    memory: Arc<GuestMemoryMmap>,
    regions: Vec<Region>,
}

impl GuestRam {
    /// Maps `regions` (each in whole pages) as `backing` says, prefaulting every page when
    /// `prefault`. Huge pages are checked against their pool first (nothing is mapped when
    /// it is short).
    pub fn create(
        regions: &[Region],
        prefault: bool,
        backing: &MemoryBacking,
    ) -> Result<GuestRam, MemoryError> {
        for r in regions {
            if r.gpa % 4096 != 0 || r.size % 4096 != 0 || r.size == 0 {
                return Err(MemoryError::Unaligned {
                    gpa: r.gpa,
                    size: r.size,
                });
            }
        }
        let bytes: u64 = regions.iter().map(|r| r.size).sum();
        let sizes: Vec<u64> = regions.iter().map(|r| r.size).collect();
        let pool = backing::Pool::read(backing.page);
        backing.check(&sizes, bytes >> 20, pool)?;
        let mapped = regions
            .iter()
            .map(|r| {
                let m = backing::map_region(r.size, backing)?;
                GuestRegionMmap::new(m, GuestAddress(r.gpa)).ok_or(MemoryError::Unaligned {
                    gpa: r.gpa,
                    size: r.size,
                })
            })
            .collect::<Result<Vec<_>, MemoryError>>()?;
        let memory = GuestMemoryMmap::<()>::from_regions(mapped).map_err(|e| MemoryError::Map {
            bytes,
            source: e.into(),
        })?;
        let ram = GuestRam {
            memory: Arc::new(memory),
            regions: regions.to_vec(),
        };
        if prefault {
            ram.prefault();
        }
        Ok(ram)
    }

    /// Faults every page in now, so that a first touch from inside the guest does not fault
    /// in host pages under mmap_lock and block behind any thread creating a mapping (a thread
    /// stack) for milliseconds: time that is neither CPU, run-queue wait nor idle. Best effort.
    fn prefault(&self) {
        for r in self.memory.iter() {
            let host = r.as_ptr();
            // SAFETY: `host` and `r.len()` describe a private anonymous mapping owned by
            // `self.memory`; MADV_POPULATE_WRITE only faults its pages in, it does not change
            // their contents.
            let done =
                unsafe { libc::madvise(host.cast(), r.len() as usize, libc::MADV_POPULATE_WRITE) };
            if done != 0 {
                log::warn!(
                    "cannot prefault guest memory: {}",
                    std::io::Error::last_os_error()
                );
                return;
            }
        }
    }

    /// Maps every region into `vm`, one slot each.
    ///
    /// # Safety
    /// `self` (or a clone of its memory) must outlive `vm` and its vCPUs.
    pub unsafe fn register<V: hv::Vm>(
        &self,
        vm: &V,
        slots: &mut SlotAllocator,
    ) -> Result<(), MemoryError> {
        for r in &self.regions {
            let host = self
                .memory
                .get_host_address(GuestAddress(r.gpa))
                .map_err(|source| MemoryError::HostAddress { gpa: r.gpa, source })?;
            // SAFETY: `host` starts the mapping of `r` owned by `self.memory`, which the
            // caller keeps alive longer than `vm` (this function's contract).
            unsafe { map_region(vm, slots, *r, host as u64) }?;
        }
        Ok(())
    }

    /// The memory, for payloads and devices.
    pub fn memory(&self) -> &Arc<GuestMemoryMmap> {
        &self.memory
    }

    /// Bytes of RAM.
    #[cfg(test)]
    pub fn size(&self) -> u64 {
        self.regions.iter().map(|r| r.size).sum()
    }
}

#[cfg(test)]
mod tests {
    use vm_memory::Bytes;

    use super::*;
    use crate::arch::x86_64::layout::ram_regions;
    use crate::hypervisor::fake::FakeHypervisor;
    use crate::hypervisor::Hypervisor;

    #[test]
    fn slots_are_handed_out_in_order_up_to_the_limit() {
        let mut s = SlotAllocator::default();
        for i in 0..SlotAllocator::MAX {
            assert_eq!(s.allocate().unwrap(), i);
        }
        assert!(matches!(s.allocate(), Err(MemoryError::NoSlot(32))));
    }

    #[test]
    fn a_16_gib_guest_maps_without_touching_its_memory() {
        let regions = ram_regions(16 << 30);
        let rss = || {
            let s = std::fs::read_to_string("/proc/self/statm").unwrap();
            s.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 4096
        };
        let before = rss();
        let ram = GuestRam::create(&regions, false, &MemoryBacking::default()).unwrap();
        assert_eq!(ram.size(), 16 << 30);
        assert!(
            rss() < before + (64 << 20),
            "mapping 16 GiB without prefault made {} MiB resident",
            (rss() - before) >> 20
        );
        // Both sides of the gap are real memory.
        ram.memory()
            .write_obj(0x1234_5678u64, GuestAddress(5 << 30))
            .unwrap();
        assert_eq!(
            ram.memory().read_obj::<u64>(GuestAddress(5 << 30)).unwrap(),
            0x1234_5678
        );
        assert!(
            ram.memory()
                .read_obj::<u64>(GuestAddress(0xD000_0000))
                .is_err(),
            "the gap has no memory"
        );
    }

    #[test]
    fn ram_and_other_regions_get_their_own_slots() {
        let hv = FakeHypervisor::new(Vec::new());
        let vm = hv.create_vm().unwrap();
        let ram =
            GuestRam::create(&ram_regions(5 << 30), false, &MemoryBacking::default()).unwrap();
        let mut slots = SlotAllocator::default();
        // SAFETY: `ram` outlives `vm` (declared before it, dropped after).
        unsafe { ram.register(&vm, &mut slots) }.unwrap();
        let page = vec![0u8; 8192];
        let region = Region {
            gpa: 0xFD00_0000,
            size: 8192,
        };
        // SAFETY: `page` outlives `vm`.
        unsafe { map_region(&vm, &mut slots, region, page.as_ptr() as u64) }.unwrap();
        let got = vm.slots.lock().unwrap().clone();
        assert_eq!(got.len(), 3);
        assert_eq!(
            got.iter()
                .map(|s| (s.slot, s.gpa, s.size))
                .collect::<Vec<_>>(),
            vec![
                (0, 0, 3 << 30),
                (1, 4 << 30, 2 << 30),
                (2, 0xFD00_0000, 8192)
            ]
        );
        let bad = Region {
            gpa: 0x100,
            size: 4096,
        };
        // SAFETY: refused before anything is mapped.
        let refused = unsafe { map_region(&vm, &mut slots, bad, 0) };
        assert!(matches!(refused, Err(MemoryError::Unaligned { .. })));
        assert!(matches!(
            GuestRam::create(
                &[Region { gpa: 0, size: 100 }],
                false,
                &MemoryBacking::default()
            ),
            Err(MemoryError::Unaligned { .. })
        ));
    }
}
