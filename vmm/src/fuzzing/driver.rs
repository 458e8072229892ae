//! A model of Linux's split-ring virtio driver (drivers/virtio/virtio_ring.c), over guest
//! memory, for the fuzzer's driver model and the devices' unit tests: it adds buffers,
//! publishes them and kicks only when `vring_need_event` (or the device's NO_NOTIFY flag)
//! says so, takes used entries back, and turns its interrupts off and on as Linux's NAPI does
//! (`VRING_AVAIL_F_NO_INTERRUPT` without EVENT_IDX; `used_event` with it).
//!
//! Data flow: a test makes a [`DriverRing`] over a free area of guest memory, gives the
//! device its three ring addresses, and then plays the driver: [`DriverRing::add`] and
//! [`DriverRing::publish`] (which says whether to kick), [`DriverRing::pop_used`] after an
//! interrupt, [`DriverRing::disable_cb`] and [`DriverRing::enable_cb`] around a poll. Every
//! access is a plain load or store of guest memory, with the fences Linux uses.

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::devices::virtio::queue::DeviceQueue;

/// `VRING_DESC_F_NEXT`.
const NEXT: u16 = 1;
/// `VRING_DESC_F_WRITE`.
const WRITE: u16 = 2;
/// `VRING_AVAIL_F_NO_INTERRUPT`.
const NO_INTERRUPT: u16 = 1;
/// `VRING_USED_F_NO_NOTIFY`.
const NO_NOTIFY: u16 = 1;

pub use crate::devices::virtio::queue::vring_need_event;

/// Bytes the three rings of a queue of `size` take from their base (desc, avail, used at
/// 4-byte alignment).
pub fn rings_len(size: u16) -> u64 {
    let s = u64::from(size);
    let avail = 16 * s;
    let used = (avail + 6 + 2 * s).next_multiple_of(4);
    used + 6 + 8 * s
}

/// One buffer of a chain: guest address, length, whether the device writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buf {
    /// Guest-physical address.
    pub addr: u64,
    /// Bytes.
    pub len: u32,
    /// Device-writable.
    pub write: bool,
}

/// The driver's side of one split virtqueue.
#[derive(Debug)]
pub struct DriverRing {
    size: u16,
    desc: u64,
    avail: u64,
    used: u64,
    event_idx: bool,
    /// The next available index to fill (not yet published past `published`).
    avail_idx: u16,
    published: u16,
    last_used: u16,
    free: Vec<u16>,
    /// For each head: the descriptors of its chain (to free them).
    chains: Vec<Vec<u16>>,
    /// The descriptors of the chain [`DriverRing::pop_used`] gave back last.
    last: Vec<u16>,
    /// Kicks the driver made.
    pub kicks: u64,
}

impl DriverRing {
    /// A queue of `size` (a power of two) with its rings at `base` (zeroed here).
    pub fn new(mem: &GuestMemoryMmap, base: u64, size: u16, event_idx: bool) -> Self {
        let zeros = vec![0u8; rings_len(size) as usize];
        let _ = mem.write_slice(&zeros, GuestAddress(base));
        let avail = base + 16 * u64::from(size);
        let used = (avail + 6 + 2 * u64::from(size)).next_multiple_of(4);
        DriverRing {
            size,
            desc: base,
            avail,
            used,
            event_idx,
            avail_idx: 0,
            published: 0,
            last_used: 0,
            free: (0..size).rev().collect(),
            chains: vec![Vec::new(); usize::from(size)],
            last: Vec::new(),
            kicks: 0,
        }
    }

    /// The queue's size.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// The device's side of this queue (what a device thread builds from the transport's
    /// registers), over the same rings.
    pub fn device_queue(&self, mem: &Arc<GuestMemoryMmap>) -> DeviceQueue {
        let mut q = Queue::new(1024).expect("1024 is a valid maximum");
        q.try_set_size(self.size).expect("a power of two");
        q.try_set_desc_table_address(GuestAddress(self.desc))
            .expect("aligned");
        q.try_set_avail_ring_address(GuestAddress(self.avail))
            .expect("aligned");
        q.try_set_used_ring_address(GuestAddress(self.used))
            .expect("aligned");
        q.set_event_idx(self.event_idx);
        q.set_ready(true);
        assert!(q.is_valid(&**mem), "the rings lie in guest memory");
        DeviceQueue::new(q, mem).expect("the rings lie in guest memory")
    }

    /// The descriptor table, available ring and used ring addresses.
    pub fn addrs(&self) -> (u64, u64, u64) {
        (self.desc, self.avail, self.used)
    }

    /// Free descriptors.
    pub fn free(&self) -> usize {
        self.free.len()
    }

    /// The descriptor id the `k`-th buffer of the next chain [`DriverRing::add`] makes will
    /// take, if that many are free.
    pub fn peek_free(&self, k: usize) -> Option<u16> {
        self.free.len().checked_sub(k + 1).map(|i| self.free[i])
    }

    /// The descriptors of the chain the last [`DriverRing::pop_used`] gave back (its head
    /// first).
    pub fn last_chain(&self) -> &[u16] {
        &self.last
    }

    /// Chains added and not yet given back.
    pub fn outstanding(&self) -> u16 {
        self.avail_idx.wrapping_sub(self.last_used)
    }

    /// Adds a chain of `bufs` (not yet published); None when too few descriptors are free.
    pub fn add(&mut self, mem: &GuestMemoryMmap, bufs: &[Buf]) -> Option<u16> {
        if bufs.is_empty() || bufs.len() > self.free.len() {
            return None;
        }
        let ids: Vec<u16> = (0..bufs.len()).filter_map(|_| self.free.pop()).collect();
        for (k, (b, &id)) in bufs.iter().zip(&ids).enumerate() {
            let last = k + 1 == bufs.len();
            let flags = if b.write { WRITE } else { 0 } | if last { 0 } else { NEXT };
            let next = if last { 0 } else { ids[k + 1] };
            let d = self.desc + 16 * u64::from(id);
            let _ = mem.write_obj(b.addr.to_le(), GuestAddress(d));
            let _ = mem.write_obj(b.len.to_le(), GuestAddress(d + 8));
            let _ = mem.write_obj(flags.to_le(), GuestAddress(d + 12));
            let _ = mem.write_obj(next.to_le(), GuestAddress(d + 14));
        }
        let head = ids[0];
        self.chains[usize::from(head)] = ids;
        let slot = self.avail + 4 + 2 * u64::from(self.avail_idx % self.size);
        let _ = mem.write_obj(head.to_le(), GuestAddress(slot));
        self.avail_idx = self.avail_idx.wrapping_add(1);
        Some(head)
    }

    /// Publishes what was added (the available index) and says whether the device wants a
    /// kick for it, as `virtqueue_kick_prepare` does; counts the kick when so.
    pub fn publish(&mut self, mem: &GuestMemoryMmap) -> bool {
        fence(Ordering::Release);
        let _ = mem.write_obj(self.avail_idx.to_le(), GuestAddress(self.avail + 2));
        fence(Ordering::SeqCst);
        let (old, new) = (self.published, self.avail_idx);
        self.published = new;
        if old == new {
            return false;
        }
        let kick = if self.event_idx {
            let at = self.used + 4 + 8 * u64::from(self.size);
            let event = u16::from_le(mem.read_obj(GuestAddress(at)).unwrap_or(0));
            vring_need_event(event, new, old)
        } else {
            let flags = u16::from_le(mem.read_obj(GuestAddress(self.used)).unwrap_or(0));
            flags & NO_NOTIFY == 0
        };
        if kick {
            self.kicks += 1;
        }
        kick
    }

    /// The device's used index.
    pub fn used_idx(&self, mem: &GuestMemoryMmap) -> u16 {
        u16::from_le(mem.read_obj(GuestAddress(self.used + 2)).unwrap_or(0))
    }

    /// Whether the device gave back entries the driver has not taken.
    pub fn has_used(&self, mem: &GuestMemoryMmap) -> bool {
        self.used_idx(mem) != self.last_used
    }

    /// The next used entry (head, length), its descriptors freed; None when there is none.
    /// Panics when the device gave back a head it does not hold or moved the used index
    /// past what was made available: a device bug.
    pub fn pop_used(&mut self, mem: &GuestMemoryMmap) -> Option<(u16, u32)> {
        let idx = self.used_idx(mem);
        if idx == self.last_used {
            return None;
        }
        assert!(
            idx.wrapping_sub(self.last_used) <= self.published.wrapping_sub(self.last_used),
            "the used index {idx} passed what was made available ({})",
            self.published
        );
        fence(Ordering::Acquire);
        let e = self.used + 4 + 8 * u64::from(self.last_used % self.size);
        let id: u32 = u32::from_le(mem.read_obj(GuestAddress(e)).unwrap_or(u32::MAX));
        let len: u32 = u32::from_le(mem.read_obj(GuestAddress(e + 4)).unwrap_or(0));
        let head = u16::try_from(id)
            .ok()
            .filter(|&h| h < self.size && !self.chains[usize::from(h)].is_empty())
            .unwrap_or_else(|| panic!("the device gave back head {id}, which it did not hold"));
        let ids = std::mem::take(&mut self.chains[usize::from(head)]);
        self.free.extend(ids.iter().rev());
        self.last = ids;
        self.last_used = self.last_used.wrapping_add(1);
        Some((head, len))
    }

    /// Interrupts off while polling (`virtqueue_disable_cb`).
    pub fn disable_cb(&mut self, mem: &GuestMemoryMmap) {
        if self.event_idx {
            // Linux writes 0 ("a hack") so the device does not interrupt until the index wraps.
            let at = self.avail + 4 + 2 * u64::from(self.size);
            let _ = mem.write_obj(0u16, GuestAddress(at));
        } else {
            let _ = mem.write_obj(NO_INTERRUPT.to_le(), GuestAddress(self.avail));
        }
    }

    /// Interrupts on again (`virtqueue_enable_cb`): true when nothing is waiting, so the
    /// driver may sleep; false when used entries came meanwhile (poll again).
    pub fn enable_cb(&mut self, mem: &GuestMemoryMmap) -> bool {
        if self.event_idx {
            let at = self.avail + 4 + 2 * u64::from(self.size);
            let _ = mem.write_obj(self.last_used.to_le(), GuestAddress(at));
        } else {
            let _ = mem.write_obj(0u16, GuestAddress(self.avail));
        }
        fence(Ordering::SeqCst);
        !self.has_used(mem)
    }

    /// Whether the driver asks for an interrupt now for entries up to the device's used
    /// index (the device must interrupt when this is true after it added entries).
    pub fn wants_interrupt(&self, mem: &GuestMemoryMmap, old_used: u16) -> bool {
        let new = self.used_idx(mem);
        if new == old_used {
            return false;
        }
        if self.event_idx {
            let at = self.avail + 4 + 2 * u64::from(self.size);
            let event = u16::from_le(mem.read_obj(GuestAddress(at)).unwrap_or(0));
            vring_need_event(event, new, old_used)
        } else {
            let flags = u16::from_le(mem.read_obj(GuestAddress(self.avail)).unwrap_or(0));
            flags & NO_INTERRUPT == 0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn need_event_is_linuxs() {
        assert!(vring_need_event(0, 1, 0));
        assert!(!vring_need_event(0, 2, 1), "event 0 passed already");
        assert!(vring_need_event(5, 9, 3));
        assert!(!vring_need_event(9, 9, 3));
        assert!(vring_need_event(65535, 2, 65534), "across the wrap");
    }

    #[test]
    fn rings_fit_the_layout_the_spec_gives() {
        // Size 256: 4096 of descriptors, 518 of available ring, used ring from 4616.
        assert_eq!(rings_len(256), 4616 + 6 + 8 * 256);
        assert_eq!(rings_len(1), 16 + 8 + 14);
    }
}
