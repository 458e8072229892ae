//! One notification discipline for every queue of every device: chains are popped until the
//! ring is empty, then the driver's notifications are turned on and the ring looked at once
//! more; used entries are given back and the driver interrupted when it asked to be.
//!
//! Why here and not in each device: a device that forgets one of these stops for good. With
//! `VIRTIO_RING_F_EVENT_IDX` (Linux always negotiates it) the driver kicks only when its new
//! available index passes the device's `avail_event`; a queue path that drains the ring and
//! waits without writing `avail_event` never hears from the driver again (the receive queue
//! did exactly that under a burst). Without EVENT_IDX the driver reads `VRING_USED_F_NO_NOTIFY`
//! the same way. On the interrupt side, the driver's `used_event` (or, without EVENT_IDX, its
//! `VRING_AVAIL_F_NO_INTERRUPT`, which `virtio_queue` 0.18 does not honour) says when it wants
//! one, and a used entry of length 0 is a used entry like any other.
//!
//! Data flow: a device thread wraps each `virtio_queue::Queue` it built in a [`DeviceQueue`].
//! A batch starts with [`DeviceQueue::quiet`] (no kicks wanted while the device works), takes
//! chains with [`DeviceQueue::pop`] (Firecracker's `pop_or_enable_notification`: `None` only
//! once notifications are on again and the ring is still empty), gives them back with
//! [`DeviceQueue::add_used`], and ends with [`DeviceQueue::needs_interrupt`]. A loop that stops
//! at its budget with chains left re-queues itself (its own kick eventfd) instead of waiting
//! for a kick the driver will not send. Every available index is checked before use
//! ([`QueueFault::AvailIndex`]).

use std::num::Wrapping;
use std::sync::atomic::{fence, AtomicU16, Ordering};
use std::sync::Arc;

use virtio_bindings::bindings::virtio_ring::VRING_AVAIL_F_NO_INTERRUPT;
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use super::chain::ChainError;
use super::status::Violation;

/// A queue the driver broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueFault {
    /// A malformed chain.
    Chain(ChainError),
    /// The available index moved ahead by more than the queue holds.
    AvailIndex,
    /// A ring could not be read or written (it lies outside guest memory now).
    UsedRing,
}

impl QueueFault {
    /// The rule the driver broke, as the device's NEEDS_RESET records it.
    pub fn violation(self) -> Violation {
        match self {
            QueueFault::Chain(_) => Violation::BadChain,
            QueueFault::AvailIndex => Violation::AvailIndex,
            QueueFault::UsedRing => Violation::BadQueue,
        }
    }
}

/// A queue a device thread serves, with the notification discipline.
#[derive(Debug)]
pub struct DeviceQueue {
    q: Queue,
    event_idx: bool,
    /// The driver's available index as last read: chains up to it are popped without reading
    /// it again.
    avail: Wrapping<u16>,
    /// Used entries added since the last interrupt decision.
    unsignalled: u32,
    /// The used index at the last interrupt decision.
    signalled: u16,
    /// Where this process maps the available ring and the used ring (each wholly inside one
    /// region of `mem`, checked when the queue was made): the per-frame accesses go straight
    /// there instead of looking the guest address up each time (a fifth of a received frame's
    /// device CPU went to those lookups, measured with `benches/virtqueue.rs`).
    avail_host: usize,
    used_host: usize,
    /// The guest memory the rings are in, held so that it stays mapped while the queue lives.
    _mem: Arc<GuestMemoryMmap>,
}

/// Linux's `vring_need_event`: whether moving an index from `old` to `new` passes `event`.
#[inline]
pub fn vring_need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

impl DeviceQueue {
    /// Serves `q` (its `event_idx` already set as negotiated, its rings checked against `mem`
    /// with `Queue::is_valid`); `UsedRing` when a ring is not wholly in one region of `mem`.
    pub fn new(q: Queue, mem: &Arc<GuestMemoryMmap>) -> Result<Self, QueueFault> {
        let size = u64::from(q.size());
        let host = |addr: u64, len: u64| {
            mem.get_slice(GuestAddress(addr), len as usize)
                .map(|s| s.ptr_guard().as_ptr() as usize)
                .map_err(|_| QueueFault::UsedRing)
        };
        let avail_host = host(q.avail_ring(), 6 + 2 * size)?;
        let used_host = host(q.used_ring(), 6 + 8 * size)?;
        let event_idx = q.event_idx_enabled();
        let avail = Wrapping(q.next_avail());
        let signalled = q.next_used();
        Ok(DeviceQueue {
            q,
            event_idx,
            avail,
            unsignalled: 0,
            signalled,
            avail_host,
            used_host,
            _mem: Arc::clone(mem),
        })
    }

    /// The 16-bit field at `offset` of the available ring, read with `order`.
    #[inline]
    fn avail_u16(&self, offset: u64, order: Ordering) -> u16 {
        // SAFETY: `avail_host` maps the whole available ring (6 + 2 × size bytes) in `_mem`,
        // which this queue holds, so it stays mapped; every offset used is inside the ring
        // and even, and the ring is 2-byte aligned (`Queue::is_valid`). Atomic: the guest
        // writes the ring concurrently.
        let a = unsafe { &*((self.avail_host + offset as usize) as *const AtomicU16) };
        u16::from_le(a.load(order))
    }

    /// Stores the 16-bit field at `offset` of the used ring with `order`.
    #[inline]
    fn used_store_u16(&self, offset: u64, v: u16, order: Ordering) {
        // SAFETY: `used_host` maps the whole used ring (6 + 8 × size bytes) in `_mem`, which
        // this queue holds; every offset used is inside the ring and even, and the ring is
        // 4-byte aligned (`Queue::is_valid`). Atomic: the guest reads it concurrently.
        let a = unsafe { &*((self.used_host + offset as usize) as *const AtomicU16) };
        a.store(v.to_le(), order);
    }

    /// The queue's size.
    pub fn size(&self) -> u16 {
        self.q.size()
    }

    /// Whether the driver negotiated `VIRTIO_RING_F_EVENT_IDX`.
    pub fn event_idx(&self) -> bool {
        self.event_idx
    }

    /// The underlying queue (tests and the fuzzer's model look inside).
    pub fn queue(&self) -> &Queue {
        &self.q
    }

    /// The start of a batch: the driver need not kick while the device works (without
    /// EVENT_IDX, `VRING_USED_F_NO_NOTIFY`; with it nothing is written: `avail_event` stays
    /// behind, which asks for no kick).
    pub fn quiet(&mut self, mem: &GuestMemoryMmap) -> Result<(), QueueFault> {
        self.q
            .disable_notification(mem)
            .map_err(|_| QueueFault::UsedRing)
    }

    /// Chains available now, by the driver's index (read again), checked.
    fn refresh(&mut self) -> Result<u16, QueueFault> {
        let avail = Wrapping(self.avail_u16(2, Ordering::Acquire));
        let pending = (avail - Wrapping(self.q.next_avail())).0;
        if pending > self.q.size() {
            return Err(QueueFault::AvailIndex);
        }
        self.avail = avail;
        Ok(pending)
    }

    /// Chains popped-able without reading the driver's index again.
    fn known(&self) -> u16 {
        (self.avail - Wrapping(self.q.next_avail())).0
    }

    /// The next chain, or `None` once the ring is empty *and* the driver's notifications are
    /// on again (EVENT_IDX: `avail_event` = the next index; otherwise the NO_NOTIFY flag
    /// cleared), the ring having been looked at after that, so the driver's next buffer is
    /// either popped here or kicked.
    pub fn pop<'m>(
        &mut self,
        mem: &'m GuestMemoryMmap,
    ) -> Result<Option<DescriptorChain<&'m GuestMemoryMmap>>, QueueFault> {
        if self.known() == 0 && self.refresh()? == 0 {
            self.q
                .enable_notification(mem)
                .map_err(|_| QueueFault::UsedRing)?;
            // `enable_notification` fenced its write before reading the index; read it again
            // through the checked path.
            if self.refresh()? == 0 {
                return Ok(None);
            }
        }
        self.take(mem).map(Some)
    }

    /// The next chain if one is available, without touching notifications (a device that
    /// only looks, e.g. to learn whether buffers are there).
    pub fn try_pop<'m>(
        &mut self,
        mem: &'m GuestMemoryMmap,
    ) -> Result<Option<DescriptorChain<&'m GuestMemoryMmap>>, QueueFault> {
        if self.known() == 0 && self.refresh()? == 0 {
            return Ok(None);
        }
        self.take(mem).map(Some)
    }

    fn take<'m>(
        &mut self,
        mem: &'m GuestMemoryMmap,
    ) -> Result<DescriptorChain<&'m GuestMemoryMmap>, QueueFault> {
        // Entries are known to be there (checked against the queue's size above): `None`
        // means the ring changed under us into something invalid (its index jumped between
        // the reads), a fault, never a quiet stop.
        self.q
            .pop_descriptor_chain(mem)
            .ok_or(QueueFault::AvailIndex)
    }

    /// Whether the driver has made a chain available that was not popped yet, by its index
    /// read now; notifications untouched (a thread polling its ring).
    pub fn has_available(&mut self) -> Result<bool, QueueFault> {
        Ok(self.known() > 0 || self.refresh()? > 0)
    }

    /// Puts the last `n` popped chains back (they are popped again, in order, next time).
    pub fn unpop(&mut self, n: u16) {
        for _ in 0..n {
            self.q.go_to_previous_position();
        }
    }

    /// Gives chain `head` back with `len` bytes written.
    pub fn add_used(&mut self, head: u16, len: u32) -> Result<(), QueueFault> {
        self.add_used_many(&[(head, len)])
    }

    /// Gives `entries` (head, bytes written) back at once: every element is written before
    /// the used index moves (once, release), so a driver polling meanwhile sees a frame's
    /// buffers all together or not at all (Linux drops a mergeable frame whose later buffers
    /// are not there yet: "rx error: N buffers out of M missing").
    pub fn add_used_many(&mut self, entries: &[(u16, u32)]) -> Result<(), QueueFault> {
        let size = self.q.size();
        let mut next = self.q.next_used();
        for &(head, len) in entries {
            if head >= size {
                return Err(QueueFault::UsedRing);
            }
            let at = 4 + 8 * usize::from(next % size);
            // SAFETY: `used_host` maps the whole used ring in `_mem`, which this queue holds;
            // element `next % size` lies inside it, 4-byte aligned (the ring is). Volatile:
            // the guest reads the ring concurrently (the index below publishes it).
            unsafe {
                let e = (self.used_host + at) as *mut u32;
                std::ptr::write_volatile(e, u32::from(head).to_le());
                std::ptr::write_volatile(e.add(1), len.to_le());
            }
            next = next.wrapping_add(1);
        }
        self.used_store_u16(2, next, Ordering::Release);
        self.q.set_next_used(next);
        self.unsignalled += entries.len() as u32;
        Ok(())
    }

    /// Whether the driver wants an interrupt for the used entries added since the last call
    /// (false when none were): with EVENT_IDX when the used index passed its `used_event`
    /// (`vring_need_event`, as Linux computes it), otherwise unless it set
    /// `VRING_AVAIL_F_NO_INTERRUPT`. A ring that cannot be read asks for one (the driver then
    /// finds what is there).
    pub fn needs_interrupt(&mut self) -> bool {
        if self.unsignalled == 0 {
            return false;
        }
        self.unsignalled = 0;
        let (old, new) = (self.signalled, self.q.next_used());
        self.signalled = new;
        // Complete the used ring's writes before reading the driver's wish.
        fence(Ordering::SeqCst);
        if self.event_idx {
            let event = self.avail_u16(4 + 2 * u64::from(self.q.size()), Ordering::Relaxed);
            return vring_need_event(event, new, old);
        }
        self.avail_u16(0, Ordering::Relaxed) & VRING_AVAIL_F_NO_INTERRUPT as u16 == 0
    }

    /// Used entries not yet decided on (a thread that abandons its batch at a reset).
    pub fn unsignalled(&self) -> u32 {
        self.unsignalled
    }
}

#[cfg(test)]
mod tests;
