//! Frames sent from mock transmit queues into a sink that records them or fails as a tap can.

use std::cell::RefCell;
use std::ops::Range;
use std::sync::Arc;

use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::split::Descriptor as SplitDescriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress};

use super::*;
use crate::devices::virtio::chain::ChainError;
use crate::devices::virtio::queue::DeviceQueue;

const NEXT: u16 = VRING_DESC_F_NEXT as u16;
const WRITE: u16 = VRING_DESC_F_WRITE as u16;

/// Records each frame written, or fails with `errno`.
#[derive(Default)]
struct Sink {
    frames: RefCell<Vec<Vec<u8>>>,
    errno: Option<i32>,
}

impl FrameSink for Sink {
    unsafe fn write_frame(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        if let Some(e) = self.errno {
            return Err(io::Error::from_raw_os_error(e));
        }
        let mut f = Vec::new();
        for v in iov {
            // SAFETY: the caller guarantees each iovec is valid for reads of its length.
            f.extend_from_slice(unsafe {
                std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len)
            });
        }
        let n = f.len();
        self.frames.borrow_mut().push(f);
        Ok(n)
    }
}

fn mem() -> Arc<GuestMemoryMmap> {
    Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x40_0000)]).unwrap())
}

/// A pass with a budget larger than any test's queue, never interrupted by a reset.
fn run(tx: &mut TxQueue, m: &GuestMemoryMmap, sink: &Sink, c: &QueueCounters) -> TxPass {
    tx.run(m, sink, c, 1000u64, || true)
}

fn d(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
    RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
}

#[test]
fn frames_go_out_whole_and_are_counted() {
    let m = mem();
    m.write_slice(&[0xaa; 12], GuestAddress(0x1_0000)).unwrap();
    m.write_slice(&[0xbb; 64], GuestAddress(0x2_0000)).unwrap();
    let vq = MockSplitQueue::new(&*m, 16);
    // Two frames: header and data in two buffers, then all in one.
    vq.add_desc_chains(
        &[
            d(0x1_0000, 12, NEXT, 1),
            d(0x2_0000, 64, 0, 0),
            d(0x3_0000, 12 + 100, 0, 0),
        ],
        0,
    )
    .unwrap();
    let mut tx = TxQueue::new(DeviceQueue::new(vq.create_queue().unwrap(), &m).unwrap());
    let sink = Sink::default();
    let c = QueueCounters::default();
    let pass = run(&mut tx, &m, &sink, &c);
    assert_eq!(
        pass,
        TxPass {
            chains: 2,
            frames: 2,
            ..TxPass::default()
        }
    );
    let frames = sink.frames.borrow();
    assert_eq!(frames.len(), 2);
    assert_eq!(&frames[0][..12], &[0xaa; 12]);
    assert_eq!(&frames[0][12..], &[0xbb; 64]);
    assert_eq!(frames[1].len(), 112);
    assert_eq!(
        (c.chains.get(), c.packets.get(), c.bytes.get()),
        (2, 2, 164)
    );
    assert_eq!(vq.used().idx().load(), 2, "both chains given back");
}

#[test]
fn a_refusing_tap_drops_with_its_reason() {
    for (errno, why) in [
        (libc::EAGAIN, DropReason::TapWouldBlock),
        (libc::EIO, DropReason::TapDown),
        (libc::EBADFD, DropReason::TapDown),
        (libc::EINVAL, DropReason::TapError),
    ] {
        let m = mem();
        let vq = MockSplitQueue::new(&*m, 16);
        vq.add_desc_chains(&[d(0x1_0000, 80, 0, 0)], 0).unwrap();
        let mut tx = TxQueue::new(DeviceQueue::new(vq.create_queue().unwrap(), &m).unwrap());
        let sink = Sink {
            errno: Some(errno),
            ..Default::default()
        };
        let c = QueueCounters::default();
        assert_eq!(run(&mut tx, &m, &sink, &c).chains, 1);
        assert_eq!((c.packets.get(), c.drops(why)), (0, 1), "{why}");
        assert_eq!(vq.used().idx().load(), 1, "the chain is given back anyway");
    }
}

#[test]
fn an_oversized_frame_is_dropped_and_the_next_one_still_goes() {
    let m = mem();
    let vq = MockSplitQueue::new(&*m, 16);
    vq.add_desc_chains(
        &[d(0x1_0000, 12 + 65_536, 0, 0), d(0x3_0000, 12 + 10, 0, 0)],
        0,
    )
    .unwrap();
    let mut tx = TxQueue::new(DeviceQueue::new(vq.create_queue().unwrap(), &m).unwrap());
    let sink = Sink::default();
    let c = QueueCounters::default();
    assert_eq!(run(&mut tx, &m, &sink, &c).chains, 2);
    assert_eq!(c.drops(DropReason::OversizedFrame), 1);
    assert_eq!(c.packets.get(), 1);
}

#[test]
fn a_malformed_chain_stops_the_queue_with_a_fault() {
    let m = mem();
    let vq = MockSplitQueue::new(&*m, 16);
    vq.add_desc_chains(
        &[
            d(0x1_0000, 80, 0, 0),
            d(0x2_0000, 80, WRITE, 0), // writable in a transmit chain
            d(0x3_0000, 80, 0, 0),
        ],
        0,
    )
    .unwrap();
    let mut tx = TxQueue::new(DeviceQueue::new(vq.create_queue().unwrap(), &m).unwrap());
    let sink = Sink::default();
    let c = QueueCounters::default();
    let pass = run(&mut tx, &m, &sink, &c);
    assert_eq!(
        pass,
        TxPass {
            chains: 1,
            frames: 2,
            fault: Some(QueueFault::Chain(ChainError::WrongDirection)),
            ..TxPass::default()
        }
    );
    assert_eq!(c.drops(DropReason::BadChain), 1);
    assert_eq!(sink.frames.borrow().len(), 1, "nothing after the bad chain");
    // A chain shorter than the header is malformed too.
    let vq = MockSplitQueue::new(&*m, 16);
    vq.add_desc_chains(&[d(0x1_0000, 4, 0, 0)], 0).unwrap();
    let mut tx = TxQueue::new(DeviceQueue::new(vq.create_queue().unwrap(), &m).unwrap());
    assert_eq!(
        run(&mut tx, &m, &sink, &c).fault,
        Some(QueueFault::Chain(ChainError::Empty))
    );
    // A buffer outside RAM.
    let vq = MockSplitQueue::new(&*m, 16);
    vq.add_desc_chains(&[d(0x7000_0000, 100, 0, 0)], 0).unwrap();
    let mut tx = TxQueue::new(DeviceQueue::new(vq.create_queue().unwrap(), &m).unwrap());
    assert_eq!(
        run(&mut tx, &m, &sink, &c).fault,
        Some(QueueFault::Chain(ChainError::OutsideMemory))
    );
}

#[test]
fn a_pass_stops_at_its_budget_and_says_chains_are_left() {
    let m = mem();
    let vq = MockSplitQueue::new(&*m, 16);
    let descs: Vec<_> = (0..5).map(|i| d(0x1_0000 + i * 0x100, 80, 0, 0)).collect();
    vq.add_desc_chains(&descs, 0).unwrap();
    let mut tx = TxQueue::new(DeviceQueue::new(vq.create_queue().unwrap(), &m).unwrap());
    let (sink, c) = (Sink::default(), QueueCounters::default());
    let pass = tx.run(&m, &sink, &c, 2u64, || true);
    assert_eq!(
        (pass.chains, pass.more),
        (2, true),
        "two sent, more left: run again"
    );
    let pass = tx.run(&m, &sink, &c, 2u64, || true);
    assert_eq!((pass.chains, pass.more), (2, true));
    let pass = tx.run(&m, &sink, &c, 2u64, || true);
    assert_eq!(
        (pass.chains, pass.more),
        (1, false),
        "the last one, nothing left"
    );
    assert_eq!(sink.frames.borrow().len(), 5);
}

#[test]
fn a_reset_ends_a_pass_before_the_next_chain() {
    let m = mem();
    let vq = MockSplitQueue::new(&*m, 16);
    let descs: Vec<_> = (0..4).map(|i| d(0x1_0000 + i * 0x100, 80, 0, 0)).collect();
    vq.add_desc_chains(&descs, 0).unwrap();
    let mut tx = TxQueue::new(DeviceQueue::new(vq.create_queue().unwrap(), &m).unwrap());
    let (sink, c) = (Sink::default(), QueueCounters::default());
    let left = std::cell::Cell::new(2);
    let pass = tx.run(&m, &sink, &c, 1000u64, || {
        left.set(left.get() - 1);
        left.get() >= 0
    });
    assert_eq!((pass.chains, pass.abandoned), (2, true));
    assert_eq!(
        vq.used().idx().load(),
        2,
        "nothing given back after the reset"
    );
}

#[test]
fn a_frame_the_rate_cannot_pay_for_is_put_back_and_goes_when_tokens_are_there() {
    use crate::devices::rate::{BucketSpec, RateSpec, SharedLimiter};
    let m = mem();
    let vq = MockSplitQueue::new(&*m, 16);
    let descs: Vec<_> = (0..5).map(|i| d(0x1_0000 + i * 0x100, 80, 0, 0)).collect();
    vq.add_desc_chains(&descs, 0).unwrap();
    let mut tx = TxQueue::new(DeviceQueue::new(vq.create_queue().unwrap(), &m).unwrap());
    let (sink, c) = (Sink::default(), QueueCounters::default());
    // Two frames an hour: nothing refills during the test.
    let spec = RateSpec {
        bytes: None,
        ops: Some(BucketSpec {
            size: 2,
            refill_ns: 3_600_000_000_000,
            burst: 0,
        }),
    };
    let rate = SharedLimiter::new(&spec).unwrap();
    let budget = |r| TxBudget {
        chains: 1000,
        rate: Some(r),
    };
    let pass = tx.run(&m, &sink, &c, budget(&rate), || true);
    assert_eq!(pass.chains, 2);
    let wait = pass.throttled.expect("the third frame waits");
    assert!(wait > 1_000_000_000_000, "half an hour for a token: {wait}");
    assert!(!pass.more && pass.fault.is_none());
    assert_eq!(vq.used().idx().load(), 2);
    assert_eq!(c.chains.get(), 2, "the chain put back is not counted");
    let pass = tx.run(&m, &sink, &c, budget(&rate), || true);
    assert_eq!((pass.chains, pass.throttled.is_some()), (0, true));
    // Tokens again: the frame put back goes first, in order.
    let refilled = SharedLimiter::new(&spec).unwrap();
    let pass = tx.run(&m, &sink, &c, budget(&refilled), || true);
    assert_eq!((pass.chains, pass.throttled.is_some()), (2, true));
    assert_eq!(vq.used().idx().load(), 4);
    let heads: Vec<u32> = (0..4)
        .map(|i| vq.used().ring().ref_at(i).unwrap().load().id())
        .collect();
    assert_eq!(heads, vec![0, 1, 2, 3]);
    assert_eq!((c.packets.get(), sink.frames.borrow().len()), (4, 4));
}

/// Records frames like [`Sink`], counts the batch calls, and refuses frame `fail` (counted
/// from the first frame it is given) with EINVAL.
#[derive(Default)]
struct BatchSink {
    inner: Sink,
    calls: std::cell::Cell<usize>,
    offered: std::cell::Cell<usize>,
    fail: Option<usize>,
}

impl FrameSink for BatchSink {
    unsafe fn write_frame(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.inner.write_frame(iov) }
    }

    unsafe fn write_frames(
        &self,
        iov: &[libc::iovec],
        spans: &[Range<usize>],
        out: &mut Vec<io::Result<usize>>,
    ) {
        self.calls.set(self.calls.get() + 1);
        for span in spans {
            let seen = self.offered.replace(self.offered.get() + 1);
            out.push(if Some(seen) == self.fail {
                Err(io::Error::from_raw_os_error(libc::EINVAL))
            } else {
                // SAFETY: forwarded from this function's contract; `span` is inside `iov`.
                unsafe { self.inner.write_frame(&iov[span.clone()]) }
            });
        }
    }
}

#[test]
fn frames_go_out_in_batches_in_order_and_a_refused_one_is_dropped_alone() {
    let m = mem();
    let vq = MockSplitQueue::new(&*m, 256);
    // 100 frames, frame i filled with byte i; every third in two buffers.
    let mut descs = Vec::new();
    for i in 0..100u64 {
        let at = 0x1_0000 + i * 0x200;
        m.write_slice(&[i as u8; 12 + 20], GuestAddress(at))
            .unwrap();
        if i % 3 == 0 {
            let next = descs.len() as u16 + 1;
            descs.push(d(at, 12, NEXT, next));
            descs.push(d(at + 12, 20, 0, 0));
        } else {
            descs.push(d(at, 12 + 20, 0, 0));
        }
    }
    vq.add_desc_chains(&descs, 0).unwrap();
    let mut tx = TxQueue::new(DeviceQueue::new(vq.create_queue().unwrap(), &m).unwrap());
    // The 70th frame (index 69, in the second batch) is refused.
    let sink = BatchSink {
        fail: Some(69),
        ..Default::default()
    };
    let c = QueueCounters::default();
    let pass = tx.run(&m, &sink, &c, 1000u64, || true);
    assert_eq!((pass.chains, pass.frames), (100, 100));
    assert_eq!(
        sink.calls.get(),
        100usize.div_ceil(BATCH),
        "one call a batch of {BATCH}"
    );
    let frames = sink.inner.frames.borrow();
    assert_eq!(frames.len(), 99);
    let order: Vec<u8> = frames.iter().map(|f| f[0]).collect();
    let want: Vec<u8> = (0..100u8).filter(|&i| i != 69).collect();
    assert_eq!(
        order, want,
        "sent in the guest's order, the refused one left out"
    );
    assert!(frames
        .iter()
        .all(|f| f.len() == 32 && f.iter().all(|&b| b == f[0])));
    assert_eq!(
        (
            c.packets.get(),
            c.drops(DropReason::TapError),
            c.bytes.get()
        ),
        (99, 1, 99 * 20)
    );
    assert_eq!(vq.used().idx().load(), 100, "every chain given back");
}

#[test]
fn a_batch_taken_before_a_reset_or_the_budget_still_goes_out_whole() {
    let m = mem();
    let vq = MockSplitQueue::new(&*m, 256);
    let descs: Vec<_> = (0..10).map(|i| d(0x1_0000 + i * 0x100, 80, 0, 0)).collect();
    vq.add_desc_chains(&descs, 0).unwrap();
    let mut tx = TxQueue::new(DeviceQueue::new(vq.create_queue().unwrap(), &m).unwrap());
    let (sink, c) = (BatchSink::default(), QueueCounters::default());
    // Budget 4: four frames in one call, and more left.
    let pass = tx.run(&m, &sink, &c, 4u64, || true);
    assert_eq!((pass.chains, pass.more, sink.calls.get()), (4, true, 1));
    assert_eq!(vq.used().idx().load(), 4);
    // A reset after three chains were taken: those three go and are given back, no more.
    let left = std::cell::Cell::new(4);
    let pass = tx.run(&m, &sink, &c, 1000u64, || {
        left.set(left.get() - 1);
        left.get() > 0
    });
    assert_eq!((pass.chains, pass.abandoned), (3, true));
    assert_eq!(sink.inner.frames.borrow().len(), 7);
    assert_eq!(vq.used().idx().load(), 7);
    assert_eq!(c.packets.get() + c.drops(DropReason::TapError), 7);
}
