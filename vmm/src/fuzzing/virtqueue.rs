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

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::devices::net::ctrl;
use crate::devices::net::queues::QueueCounters;
use crate::devices::net::rx::{Delivery, RxQueue};
use crate::devices::net::tap::VNET_HDR_LEN;
use crate::devices::net::tx::{FrameSink, TxQueue, MAX_TX_FRAME};
use crate::devices::virtio::chain::Segments;

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

/// `data` as guest memory under a network device's queues.
pub fn virtqueue(data: &[u8]) {
    let Some((&head, rest)) = data.split_first() else {
        return;
    };
    let size = 1u16 << (head & 7).min(8);
    let (event_idx, mergeable) = (head & 0x10 != 0, head & 0x20 != 0);
    let Ok(mem) = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM)]) else {
        return;
    };
    let n = rest.len().min(MEM);
    if mem.write_slice(&rest[..n], GuestAddress(0)).is_err() {
        return;
    }
    let available = |q: &Queue| {
        q.avail_idx(&mem, Ordering::Acquire)
            .map_or(0, |i| (i - Wrapping(q.next_avail())).0)
    };

    // Transmit.
    if let Some(q) = queue(size, event_idx, &mem) {
        let offered = available(&q);
        let before = used_idx(&q, &mem);
        let mut tx = TxQueue::new(q);
        let sink = Sink {
            frames: Cell::new(0),
        };
        let c = QueueCounters::default();
        let pass = tx.run(&mem, &sink, &c);
        assert!(
            pass.chains <= u64::from(size),
            "{} chains from a queue of {size}",
            pass.chains
        );
        if pass.fault.is_none() {
            assert!(
                pass.chains <= u64::from(offered),
                "more chains than made available"
            );
        }
        assert!(sink.frames.get() <= pass.chains + 1);
        assert_eq!(
            used_idx(&tx.q, &mem).wrapping_sub(before),
            pass.chains as u16,
            "the used index moves by the chains given back"
        );
    }

    // Receive: a frame of the data's own bytes (a header and up to 2 KiB).
    let _ = mem.write_slice(&rest[..n], GuestAddress(0));
    if let Some(q) = queue(size, event_idx, &mem) {
        let before = used_idx(&q, &mem);
        let mut rx = RxQueue::new(q, mergeable);
        let frame_len = VNET_HDR_LEN + (usize::from(head) * 8).min(2048);
        let frame: Vec<u8> = rest.iter().copied().cycle().take(frame_len).collect();
        if frame.len() == frame_len {
            match rx.deliver(&mem, &frame) {
                Delivery::Delivered(k) => {
                    assert!(k >= 1 && k <= size);
                    assert_eq!(used_idx(&rx.q, &mem).wrapping_sub(before), k);
                }
                Delivery::TooLarge => assert_eq!(used_idx(&rx.q, &mem).wrapping_sub(before), 1),
                Delivery::NoRoom => assert_eq!(used_idx(&rx.q, &mem), before),
                Delivery::Bad(_) => {}
            }
        }
    }

    // Control.
    let _ = mem.write_slice(&rest[..n], GuestAddress(0));
    if let Some(mut q) = queue(size, event_idx, &mem) {
        let mut segs = Segments::with_capacity(usize::from(size));
        let c = QueueCounters::default();
        let pass = ctrl::run(&mut q, &mem, &mut segs, 4, &c);
        assert!(c.chains.get() <= u64::from(size));
        if let Some(p) = pass.pairs {
            assert!((1..=4).contains(&p));
        }
    }
}
