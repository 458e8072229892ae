//! The receive side of a queue pair: frames from the tap into the guest's receive chains.
//!
//! Data flow: the queue pair's thread reads one frame (12-byte virtio header first) from its
//! tap into a host buffer and hands it to [`RxQueue::deliver`], which writes it into the
//! next available chain, or, with mergeable buffers (`VIRTIO_NET_F_MRG_RXBUF`), into as many
//! chains as it takes, setting the header's `num_buffers`. A frame that does not fit what the
//! guest made available stays in the buffer and the thread stops reading the tap until the
//! guest adds buffers (the tap holds what comes meanwhile): frames wait, they are not
//! dropped. Chains are checked as untrusted input ([`crate::devices::virtio::chain`]); a
//! malformed one stops the device (NEEDS_RESET).

use std::num::Wrapping;
use std::sync::atomic::Ordering;

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::GuestMemoryMmap;

use super::tap::VNET_HDR_LEN;
use crate::devices::virtio::chain::{ChainError, Direction, Segments};

/// What became of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// In the guest, in this many chains.
    Delivered(u16),
    /// The guest has not made enough room: try again when it adds buffers.
    NoRoom,
    /// Larger than a receive chain (without mergeable buffers): dropped, the chain given back
    /// empty.
    TooLarge,
    /// A malformed chain, or an available index that jumped: the device needs a reset.
    Bad(QueueFault),
}

/// A queue the driver broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueFault {
    /// A malformed chain.
    Chain(ChainError),
    /// The available index moved ahead by more than the queue holds.
    AvailIndex,
    /// The used ring could not be written (it lies outside guest memory now).
    UsedRing,
}

/// The next chain the driver made available, or None. The available index is checked first:
/// `virtio_queue` would log a jump and give nothing, which must be a fault here, not a quiet
/// stop.
pub fn next_chain<'m>(
    q: &mut Queue,
    mem: &'m GuestMemoryMmap,
) -> Result<Option<virtio_queue::DescriptorChain<&'m GuestMemoryMmap>>, QueueFault> {
    let avail = q
        .avail_idx(mem, Ordering::Acquire)
        .map_err(|_| QueueFault::UsedRing)?;
    let pending = (avail - Wrapping(q.next_avail())).0;
    if pending == 0 {
        return Ok(None);
    }
    if pending > q.size() {
        return Err(QueueFault::AvailIndex);
    }
    // With entries pending, `None` means the ring changed under us into something invalid
    // (its index jumped between the two reads): a fault too, never a quiet stop.
    q.pop_descriptor_chain(mem)
        .map(Some)
        .ok_or(QueueFault::AvailIndex)
}

/// A receive queue and the scratch it needs (made once; nothing allocates per frame).
#[derive(Debug)]
pub struct RxQueue {
    /// The queue.
    pub q: Queue,
    first: Segments,
    rest: Segments,
    used: Vec<(u16, u32)>,
    mergeable: bool,
}

impl RxQueue {
    /// `q`, filled with mergeable buffers when `mergeable`.
    pub fn new(q: Queue, mergeable: bool) -> Self {
        let n = usize::from(q.size());
        RxQueue {
            q,
            first: Segments::with_capacity(n),
            rest: Segments::with_capacity(n),
            used: Vec::with_capacity(n),
            mergeable,
        }
    }

    /// Writes `frame` (header first) into the guest's chains.
    pub fn deliver(&mut self, mem: &GuestMemoryMmap, frame: &[u8]) -> Delivery {
        self.used.clear();
        let chain = match next_chain(&mut self.q, mem) {
            Ok(Some(c)) => c,
            Ok(None) => return Delivery::NoRoom,
            Err(f) => return Delivery::Bad(f),
        };
        if let Err(e) = self
            .first
            .load(chain, mem, Direction::Write, VNET_HDR_LEN as u64)
        {
            return Delivery::Bad(QueueFault::Chain(e));
        }
        if !self.mergeable {
            if self.first.total() < frame.len() as u64 {
                return self.give_back_empty(mem);
            }
            let n = self.first.write_at(mem, 0, frame);
            self.first.write_at(mem, 10, &1u16.to_le_bytes());
            return self.finish(mem, &[(self.first.head(), n as u32)]);
        }
        let mut done = self.first.write_at(mem, 0, frame);
        self.used.push((self.first.head(), done as u32));
        while done < frame.len() {
            let chain = match next_chain(&mut self.q, mem) {
                Ok(Some(c)) => c,
                Ok(None) => {
                    // Not enough room yet: take back every chain taken for this frame.
                    for _ in 0..self.used.len() {
                        self.q.go_to_previous_position();
                    }
                    return Delivery::NoRoom;
                }
                Err(f) => return Delivery::Bad(f),
            };
            if let Err(e) = self.rest.load(chain, mem, Direction::Write, 1) {
                return Delivery::Bad(QueueFault::Chain(e));
            }
            let n = self.rest.write_at(mem, 0, &frame[done..]);
            done += n;
            self.used.push((self.rest.head(), n as u32));
        }
        let count = self.used.len() as u16;
        self.first.write_at(mem, 10, &count.to_le_bytes());
        let used = std::mem::take(&mut self.used);
        let r = self.finish(mem, &used);
        self.used = used;
        r
    }

    fn give_back_empty(&mut self, mem: &GuestMemoryMmap) -> Delivery {
        match self.q.add_used(mem, self.first.head(), 0) {
            Ok(()) => Delivery::TooLarge,
            Err(_) => Delivery::Bad(QueueFault::UsedRing),
        }
    }

    fn finish(&mut self, mem: &GuestMemoryMmap, used: &[(u16, u32)]) -> Delivery {
        for &(head, len) in used {
            if self.q.add_used(mem, head, len).is_err() {
                return Delivery::Bad(QueueFault::UsedRing);
            }
        }
        Delivery::Delivered(used.len() as u16)
    }
}

#[cfg(test)]
mod tests;
