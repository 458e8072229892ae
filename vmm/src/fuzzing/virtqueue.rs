//! The virtqueue fuzz check: a network device's queues over guest memory that is all fuzzer
//! bytes (descriptor table, rings, buffers), as a hostile driver would leave them.
//!
//! Data flow: the first bytes choose the queue size, the features (EVENT_IDX, mergeable
//! buffers) and the available index; the rest is guest memory from address 0, with the
//! descriptor table at 0, the available ring at 0x1000 and the used ring at 0x2000. The same
//! memory then goes through the transmit path (`TxQueue::run` into a sink that checks each
//! frame), the receive path (`RxQueue::deliver` of a frame), and the control queue
//! (`ctrl::run`). Properties: nothing panics or loops (each path is bounded by the queue
//! size), no more chains are taken than the driver made available, every frame written out
//! carries its header and at most 64 KiB, and the used ring's index moves by exactly the
//! chains given back.

use std::cell::Cell;
use std::io;
use std::num::Wrapping;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::netmodel::ModelTap;
use crate::devices::net::ctrl::CtrlQueue;
use crate::devices::net::queues::QueueCounters;
use crate::devices::net::rx::{RxParams, RxQueue, Step};
use crate::devices::net::tap::VNET_HDR_LEN;
use crate::devices::net::tx::{FrameSink, TxQueue, MAX_TX_FRAME};
use crate::devices::virtio::queue::DeviceQueue;

/// Guest memory of the check.
const MEM: usize = 0x1_0000;

/// Counts and checks what the transmit path writes.
struct Sink {
    frames: Cell<u64>,
}

impl FrameSink for Sink {
    unsafe fn write_frame(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        let len: usize = iov.iter().map(|v| v.iov_len).sum();
        assert!(
            len as u64 >= VNET_HDR_LEN as u64 && len as u64 <= VNET_HDR_LEN as u64 + MAX_TX_FRAME,
            "a frame of {len} bytes reached the tap"
        );
        self.frames.set(self.frames.get() + 1);
        Ok(len)
    }
}

/// A queue of `size` over the check's layout, or None when the layout does not fit it.
fn queue(size: u16, event_idx: bool, mem: &GuestMemoryMmap) -> Option<Queue> {
    let mut q = Queue::new(256).ok()?;
    q.try_set_size(size).ok()?;
    q.try_set_desc_table_address(GuestAddress(0)).ok()?;
    q.try_set_avail_ring_address(GuestAddress(0x1000)).ok()?;
    q.try_set_used_ring_address(GuestAddress(0x2000)).ok()?;
    q.set_event_idx(event_idx);
    q.set_ready(true);
    q.is_valid(mem).then_some(q)
}

fn used_idx(q: &Queue, mem: &GuestMemoryMmap) -> u16 {
    q.used_idx(mem, Ordering::Acquire).map_or(0, |w| w.0)
}

/// Checks that the device's used index moved by `given` from `before`. The device's own count
/// is the reference: the driver's memory may hold anything at the ring's index until the device
/// writes it, and a receive buffer may even lie over the index itself.
fn used_moved(q: &Queue, before: u16, given: u16) {
    assert_eq!(
        q.next_used().wrapping_sub(before),
        given,
        "the used index moves by the chains given back"
    );
}

/// `data` as guest memory under a network device's queues, then the same bytes as a
/// sequence of a driver model's actions ([`super::netmodel::run`]).
pub fn virtqueue(data: &[u8]) {
    hostile(data);
    super::netmodel::run(data);
}

/// `data` as guest memory under a network device's queues.
fn hostile(data: &[u8]) {
    let Some((&head, rest)) = data.split_first() else {
        return;
    };
    let size = 1u16 << (head & 7).min(8);
    let (event_idx, mergeable) = (head & 0x10 != 0, head & 0x20 != 0);
    let Ok(mem) = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM)]) else {
        return;
    };
    let mem = Arc::new(mem);
    let n = rest.len().min(MEM);
    if mem.write_slice(&rest[..n], GuestAddress(0)).is_err() {
        return;
    }
    let h = Hostile {
        head,
        rest: &rest[..n],
        size,
        event_idx,
        mergeable,
        mem,
    };
    h.transmit();
    h.receive();
    h.control();
}

/// One hostile input: its first byte, guest memory made of the rest, the queue it sets up.
struct Hostile<'a> {
    head: u8,
    rest: &'a [u8],
    size: u16,
    event_idx: bool,
    mergeable: bool,
    mem: Arc<GuestMemoryMmap>,
}

impl Hostile<'_> {
    fn available(&self, q: &Queue) -> u16 {
        q.avail_idx(&*self.mem, Ordering::Acquire)
            .map_or(0, |i| (i - Wrapping(q.next_avail())).0)
    }

    /// The same memory again, as the driver left it (a path before may have written it).
    fn reload(&self) {
        let _ = self.mem.write_slice(self.rest, GuestAddress(0));
    }

    /// The transmit path over the memory.
    fn transmit(&self) {
        // Transmit.
        if let Some(q) = queue(self.size, self.event_idx, &self.mem) {
            let offered = self.available(&q);
            let before = q.next_used();
            let Ok(dq) = DeviceQueue::new(q, &self.mem) else {
                return;
            };
            let mut tx = TxQueue::new(dq);
            let sink = Sink {
                frames: Cell::new(0),
            };
            let c = QueueCounters::default();
            let pass = tx.run(&self.mem, &sink, &c, u64::from(self.size), || true);
            assert!(
                pass.chains <= u64::from(self.size),
                "{} chains from a queue of {}",
                pass.chains,
                self.size
            );
            if pass.fault.is_none() {
                assert!(
                    pass.chains <= u64::from(offered),
                    "more chains than made available"
                );
            }
            assert!(sink.frames.get() <= pass.chains + 1);
            used_moved(tx.dq.queue(), before, pass.chains as u16);
            if pass.chains > 0 {
                // Transmit writes nothing into guest buffers: the ring shows the device's index.
                assert_eq!(
                    used_idx(tx.dq.queue(), &self.mem),
                    tx.dq.queue().next_used(),
                    "the used ring shows the index"
                );
            }
        }
    }

    /// Receive from a model tap into the memory's queue.
    fn receive(&self) {
        // Receive: frames of the data's own bytes (a header and up to 2 KiB), until the queue
        // has no room, is broken, or the frames run out.
        self.reload();
        if let Some(q) = queue(self.size, self.event_idx, &self.mem) {
            let before = q.next_used();
            let params = RxParams {
                mergeable: self.mergeable,
                gso: self.head & 0x40 != 0,
                mtu: 1500,
            };
            let Ok(dq) = DeviceQueue::new(q, &self.mem) else {
                return;
            };
            let mut rx = RxQueue::new(dq, params);
            let frame_len = VNET_HDR_LEN + (usize::from(self.head) * 8).min(2048);
            let frame: Vec<u8> = self.rest.iter().copied().cycle().take(frame_len).collect();
            let tap = ModelTap::default();
            for _ in 0..4 {
                tap.push(frame.clone());
            }
            let mut given = 0u32;
            for _ in 0..usize::from(self.size) + 8 {
                match rx.receive(&self.mem, &tap) {
                    Step::Delivered { chains, .. } => {
                        assert!(chains >= 1 && chains <= self.size);
                        given += u32::from(chains);
                    }
                    Step::Dropped(_) => {}
                    Step::Idle | Step::NoRoom | Step::Fault(_) | Step::TapFailed(_) => break,
                }
            }
            assert!(
                given <= u32::from(self.size) * 4,
                "more chains than a queue holds"
            );
            used_moved(rx.dq.queue(), before, given as u16);
        }
    }

    /// The control queue over the memory.
    fn control(&self) {
        // Control.
        self.reload();
        if let Some(q) = queue(self.size, self.event_idx, &self.mem) {
            let Ok(dq) = DeviceQueue::new(q, &self.mem) else {
                return;
            };
            let mut ctrl = CtrlQueue::new(dq, 4, true);
            let c = QueueCounters::default();
            let pass = ctrl.run(&self.mem, &c, u64::from(self.size), || true);
            assert!(c.chains.get() <= u64::from(self.size));
            if let Some(p) = pass.pairs {
                assert!((1..=4).contains(&p));
            }
        }
    }
}
