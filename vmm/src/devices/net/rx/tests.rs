//! Frames received into mock receive queues from a model tap: straight into one chain or into
//! mergeable buffers, through the host buffer when too few are posted, waiting for room,
//! drops over the MTU and past the largest frame, and what a hostile driver can put in the
//! ring.

use std::ops::Range;
use std::sync::Arc;
use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::split::Descriptor as SplitDescriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

use super::*;
use crate::devices::virtio::chain::ChainError;
use crate::fuzzing::driver::{Buf, DriverRing};
use crate::fuzzing::netmodel::ModelTap;

const WRITE: u16 = VRING_DESC_F_WRITE as u16;
const NEXT: u16 = VRING_DESC_F_NEXT as u16;

fn mem() -> Arc<GuestMemoryMmap> {
    Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x40_0000)]).unwrap())
}

fn d(addr: u64, len: u32, flags: u16) -> RawDescriptor {
    RawDescriptor::from(SplitDescriptor::new(addr, len, flags, 0))
}

/// A frame of `len` bytes after a 12-byte header whose first byte is 0x11 (`gso`: marked as
/// a TCPv4 GSO frame).
fn frame(len: usize, gso: bool) -> Vec<u8> {
    let mut f = vec![0u8; VNET_HDR_LEN];
    f[0] = 0x11;
    if gso {
        f[GSO_TYPE_AT] = 1;
    }
    f.extend((0..len).map(|i| (i % 251) as u8));
    f
}

fn used(vq: &MockSplitQueue<'_, GuestMemoryMmap>, i: usize) -> (u32, u32) {
    let e = vq.used().ring().ref_at(i).unwrap().load();
    (e.id(), e.len())
}

fn rxq(
    m: &Arc<GuestMemoryMmap>,
    vq: &MockSplitQueue<'_, GuestMemoryMmap>,
    mergeable: bool,
    mtu: u16,
) -> RxQueue {
    let p = RxParams {
        mergeable,
        gso: false,
        mtu,
    };
    RxQueue::new(DeviceQueue::new(vq.create_queue().unwrap(), m).unwrap(), p)
}

fn delivered(s: Step) -> (u16, usize, bool) {
    match s {
        Step::Delivered {
            chains,
            bytes,
            copied,
        } => (chains, bytes, copied),
        other => panic!("not delivered: {other:?}"),
    }
}

#[test]
fn a_frame_is_read_straight_into_one_chain_with_num_buffers_one() {
    let m = mem();
    let vq = MockSplitQueue::new(&*m, 16);
    vq.add_desc_chains(&[d(0x1_0000, 2048, WRITE), d(0x2_0000, 2048, WRITE)], 0)
        .unwrap();
    let mut rx = rxq(&m, &vq, false, 1500);
    let tap = ModelTap::default();
    let f = frame(100, false);
    tap.push(f.clone());
    assert_eq!(delivered(rx.receive(&m, &tap)), (1, 112, false), "no copy");
    assert_eq!(vq.used().idx().load(), 1);
    assert_eq!(used(&vq, 0), (0, 112));
    let mut got = vec![0u8; 112];
    m.read_slice(&mut got, GuestAddress(0x1_0000)).unwrap();
    assert_eq!(&got[12..], &f[12..]);
    assert_eq!(u16::from_le_bytes([got[10], got[11]]), 1, "num_buffers");
    assert!(matches!(rx.receive(&m, &tap), Step::Idle));
}

#[test]
fn frames_over_the_mtu_or_past_the_largest_are_dropped_and_the_chain_takes_the_next() {
    let m = mem();
    let vq = MockSplitQueue::new(&*m, 16);
    vq.add_desc_chains(&[d(0x1_0000, 2048, WRITE)], 0).unwrap();
    let mut rx = rxq(&m, &vq, false, 1500);
    let tap = ModelTap::default();
    // 1,519 bytes of Ethernet frame: one over MTU + header + VLAN tag.
    tap.push(frame(1500 + ETH_OVERHEAD + 1, false));
    // A GSO frame without GSO negotiated, longer than the buffers hold for the largest frame
    // (read into 1,531 of the chain's 2,048: the tap cuts it there).
    tap.push(frame(4000, true));
    tap.push(frame(1500 + ETH_OVERHEAD, false));
    assert!(matches!(
        rx.receive(&m, &tap),
        Step::Dropped(DropReason::OverMtu)
    ));
    assert!(matches!(
        rx.receive(&m, &tap),
        Step::Dropped(DropReason::OversizedFrame)
    ));
    assert_eq!(vq.used().idx().load(), 0, "nothing given back for a drop");
    assert_eq!(
        delivered(rx.receive(&m, &tap)).0,
        1,
        "the MTU's own frame fits"
    );
    assert_eq!(used(&vq, 0), (0, (12 + 1500 + ETH_OVERHEAD) as u32));
}

#[test]
fn a_large_frame_spans_mergeable_buffers_read_straight_into_them() {
    let m = mem();
    // The driver model lays the rings out as the spec does (virtio-queue's mock puts its used
    // ring over the available ring's tail past six entries, which this test passes).
    let mut d = DriverRing::new(&m, 0, 16, true);
    // MTU 9000: the largest frame is 9,030 bytes, so ten buffers of 1,024 are held.
    for i in 0..12u64 {
        let b = [Buf {
            addr: 0x1_0000 + i * 0x1000,
            len: 1024,
            write: true,
        }];
        d.add(&m, &b).unwrap();
    }
    d.publish(&m);
    let p = RxParams {
        mergeable: true,
        gso: false,
        mtu: 9000,
    };
    let mut rx = RxQueue::new(d.device_queue(&m), p);
    let tap = ModelTap::default();
    let f = frame(2500, false); // 2,512 bytes: three buffers
    tap.push(f.clone());
    assert_eq!(delivered(rx.receive(&m, &tap)), (3, 2512, false));
    assert_eq!(
        d.used_idx(&m),
        3,
        "one move of the index for the whole frame"
    );
    let got: Vec<(u16, u32)> = (0..3).map(|_| d.pop_used(&m).unwrap()).collect();
    // Heads as the driver numbered them (its free list hands out 0, 1, 2, ...).
    assert_eq!(
        got.iter().map(|g| g.1).collect::<Vec<_>>(),
        [1024, 1024, 464]
    );
    let mut hdr = [0u8; 12];
    m.read_slice(&mut hdr, GuestAddress(0x1_0000)).unwrap();
    assert_eq!(u16::from_le_bytes([hdr[10], hdr[11]]), 3);
    let mut tail = vec![0u8; 464];
    m.read_slice(&mut tail, GuestAddress(0x1_2000)).unwrap();
    assert_eq!(&tail[..], &f[2048..]);
    // The next frame starts in the fourth buffer, the held ones kept in order.
    tap.push(frame(60, false));
    assert_eq!(delivered(rx.receive(&m, &tap)), (1, 72, false));
    assert_eq!(d.pop_used(&m).map(|u| u.1), Some(72));
    let mut hdr = [0u8; 12];
    m.read_slice(&mut hdr, GuestAddress(0x1_3000)).unwrap();
    assert_eq!(u16::from_le_bytes([hdr[10], hdr[11]]), 1);
}

#[test]
fn with_too_few_buffers_a_frame_waits_in_the_host_buffer_then_goes_in_copied() {
    let m = mem();
    let vq = MockSplitQueue::new(&*m, 16);
    vq.add_desc_chains(&[d(0x1_0000, 1024, WRITE)], 0).unwrap();
    let mut rx = rxq(&m, &vq, true, 1500);
    let tap = ModelTap::default();
    let f = frame(1400, false);
    tap.push(f.clone());
    // 1,024 bytes posted, 1,531 needed to read straight: the frame is read into the host
    // buffer, and does not fit yet.
    assert!(matches!(rx.receive(&m, &tap), Step::NoRoom));
    assert!(rx.has_pending());
    assert_eq!(vq.used().idx().load(), 0);
    // The guest adds a buffer: the same frame now goes in, copied, over both.
    vq.add_desc_chains(&[d(0x2_0000, 1024, WRITE)], 1).unwrap();
    assert_eq!(delivered(rx.receive(&m, &tap)), (2, 1412, true));
    let mut tail = vec![0u8; 388];
    m.read_slice(&mut tail, GuestAddress(0x2_0000)).unwrap();
    assert_eq!(&tail[..], &f[1024..]);
    // Nothing posted at all: no room, and nothing read from the tap.
    tap.push(frame(10, false));
    assert!(matches!(rx.receive(&m, &tap), Step::NoRoom));
    assert!(!rx.has_pending());
}

#[test]
fn running_out_of_buffers_asks_for_the_next_kick() {
    let m = mem();
    let vq = MockSplitQueue::new(&*m, 16);
    vq.add_desc_chains(&[d(0x1_0000, 2048, WRITE)], 0).unwrap();
    let mut q: Queue = vq.create_queue().unwrap();
    q.set_event_idx(true);
    let p = RxParams {
        mergeable: false,
        gso: false,
        mtu: 1500,
    };
    let mut rx = RxQueue::new(DeviceQueue::new(q, &m).unwrap(), p);
    let tap = ModelTap::default();
    tap.push(frame(10, false));
    tap.push(frame(10, false));
    assert_eq!(delivered(rx.receive(&m, &tap)).0, 1);
    assert!(matches!(rx.receive(&m, &tap), Step::NoRoom));
    // avail_event (after the used ring's 16 elements) is the next index: the driver's next
    // buffer kicks. The bug this guards against left it at 0 for good.
    let at = vq.used_addr().0 + 4 + 8 * 16;
    assert_eq!(m.read_obj::<u16>(GuestAddress(at)).unwrap(), 1);
}

#[test]
fn hostile_receive_chains_are_faults() {
    let m = mem();
    let tap = ModelTap::default();
    tap.push(frame(10, false));
    // A device-readable buffer where the device must write.
    let vq = MockSplitQueue::new(&*m, 16);
    vq.add_desc_chains(&[d(0x1_0000, 2048, 0)], 0).unwrap();
    let mut rx = rxq(&m, &vq, true, 1500);
    assert!(matches!(
        rx.receive(&m, &tap),
        Step::Fault(QueueFault::Chain(ChainError::WrongDirection))
    ));
    // A chain that loops.
    let vq = MockSplitQueue::new(&*m, 16);
    vq.add_desc_chains(
        &[RawDescriptor::from(SplitDescriptor::new(
            0x1_0000,
            8,
            WRITE | NEXT,
            0,
        ))],
        0,
    )
    .unwrap();
    let mut rx = rxq(&m, &vq, false, 1500);
    assert!(matches!(
        rx.receive(&m, &tap),
        Step::Fault(QueueFault::Chain(ChainError::Broken))
    ));
    // A buffer shorter than the header.
    let vq = MockSplitQueue::new(&*m, 16);
    vq.add_desc_chains(&[d(0x1_0000, 8, WRITE)], 0).unwrap();
    let mut rx = rxq(&m, &vq, true, 1500);
    assert!(matches!(
        rx.receive(&m, &tap),
        Step::Fault(QueueFault::Chain(ChainError::Empty))
    ));
    // An available index 1000 ahead in a queue of 16.
    let vq = MockSplitQueue::new(&*m, 16);
    vq.avail().idx().store(1000);
    let mut rx = rxq(&m, &vq, false, 1500);
    assert!(matches!(
        rx.receive(&m, &tap),
        Step::Fault(QueueFault::AvailIndex)
    ));
    assert_eq!(tap.len(), 1, "no frame read into a broken queue");
}

#[test]
fn receive_goes_on_a_token_is_charged_each_frames_length_and_then_waits() {
    use crate::devices::net::batch::rx_pass;
    use crate::devices::rate::{BucketSpec, RateSpec, SharedLimiter};
    use crate::devices::virtio::counters::QueueCounters;
    let m = mem();
    let vq = MockSplitQueue::new(&*m, 16);
    let descs: Vec<_> = (0..8)
        .map(|i| d(0x1_0000 + i * 0x1000, 2048, WRITE))
        .collect();
    vq.add_desc_chains(&descs, 0).unwrap();
    let mut rx = rxq(&m, &vq, false, 1500);
    let tap = ModelTap::default();
    for _ in 0..5 {
        tap.push(frame(1000, false));
    }
    // 1,500 bytes an hour: the first frame goes on a full bucket, the second on what is left
    // (500, then owing 500), the third waits.
    let rate = SharedLimiter::new(&RateSpec {
        bytes: Some(BucketSpec {
            size: 1_500,
            refill_ns: 3_600_000_000_000,
            burst: 0,
        }),
        ops: None,
    })
    .unwrap();
    let c = QueueCounters::default();
    let o = rx_pass(&mut rx, &m, &tap, &c, Some(&rate), || true);
    assert_eq!(o.handled, 2);
    assert!(o.throttled.is_some_and(|w| w > 1_000_000_000_000), "{o:?}");
    assert!(!o.blocked && o.fault.is_none());
    assert_eq!((c.packets.get(), c.bytes.get()), (2, 2_000));
    assert_eq!(vq.used().idx().load(), 2);
    // Without a limiter the rest comes in.
    let o = rx_pass(&mut rx, &m, &tap, &c, None, || true);
    assert_eq!((o.handled, o.throttled), (3, None));
}

/// A tap read the way io_uring reads it: every span of a batch is answered, and the reads
/// listed in `empty` find nothing although frames wait (as when a frame comes just after a
/// read found the tap empty).
struct RingTap {
    tap: ModelTap,
    empty: std::cell::RefCell<Vec<usize>>,
    batches: std::cell::Cell<usize>,
}

impl FrameSource for RingTap {
    unsafe fn read_frame(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.tap.read_frame(iov) }
    }

    unsafe fn read_frames(
        &self,
        iov: &[libc::iovec],
        spans: &[Range<usize>],
        out: &mut Vec<io::Result<usize>>,
    ) {
        self.batches.set(self.batches.get() + 1);
        let empty = std::mem::take(&mut *self.empty.borrow_mut());
        for (i, span) in spans.iter().enumerate() {
            out.push(if empty.contains(&i) {
                Err(io::Error::from(io::ErrorKind::WouldBlock))
            } else {
                // SAFETY: forwarded from this function's contract; `span` is inside `iov`.
                unsafe { self.tap.read_frame(&iov[span.clone()]) }
            });
        }
    }
}

/// The bytes of chain `at` as far as its frame of `len` bytes.
fn read_back(m: &GuestMemoryMmap, at: u64, len: usize) -> Vec<u8> {
    let mut got = vec![0u8; len];
    m.read_slice(&mut got, GuestAddress(at)).unwrap();
    got
}

#[test]
fn a_batch_reads_each_frame_into_its_own_chain_in_one_call_and_ends_idle() {
    for mergeable in [false, true] {
        let m = mem();
        let vq = MockSplitQueue::new(&*m, 16);
        let chains: Vec<_> = (0..5).map(|i| d(0x1_0000 * (i + 1), 2048, WRITE)).collect();
        vq.add_desc_chains(&chains, 0).unwrap();
        let mut rx = rxq(&m, &vq, mergeable, 1500);
        let tap = RingTap {
            tap: ModelTap::default(),
            empty: Default::default(),
            batches: Default::default(),
        };
        let frames: Vec<_> = (0..3).map(|i| frame(60 + i * 10, false)).collect();
        for f in &frames {
            tap.tap.push(f.clone());
        }
        let mut steps = Vec::new();
        let (n, end) = rx
            .receive_batch(&m, &tap, 256, |s| steps.push(delivered(s)))
            .expect("five chains that each take the largest frame");
        assert_eq!(n, 3);
        assert!(matches!(end, Some(Step::Idle)), "{end:?}");
        assert_eq!(tap.batches.get(), 1, "one call for the batch");
        assert_eq!(steps, vec![(1, 72, false), (1, 82, false), (1, 92, false)]);
        for (i, f) in frames.iter().enumerate() {
            assert_eq!(used(&vq, i), (i as u32, f.len() as u32));
            let got = read_back(&m, 0x1_0000 * (i as u64 + 1), f.len());
            assert_eq!(&got[12..], &f[12..]);
            assert_eq!(u16::from_le_bytes([got[10], got[11]]), 1, "num_buffers");
        }
        assert_eq!(vq.used().idx().load(), 3);
        assert_eq!(rx.held_chains(), 2, "the two chains left stay held");
    }
}

#[test]
fn a_frame_read_after_an_empty_read_is_given_back_ahead_of_the_empty_chain() {
    let m = mem();
    let vq = MockSplitQueue::new(&*m, 16);
    let chains: Vec<_> = (0..4).map(|i| d(0x1_0000 * (i + 1), 2048, WRITE)).collect();
    vq.add_desc_chains(&chains, 0).unwrap();
    let mut rx = rxq(&m, &vq, true, 1500);
    let tap = RingTap {
        tap: ModelTap::default(),
        // The second read finds nothing; the third finds the frame that came meanwhile; the
        // third frame is over the MTU: its chain stays held too.
        empty: std::cell::RefCell::new(vec![1]),
        batches: Default::default(),
    };
    let (a, b, big) = (frame(100, false), frame(200, false), frame(1600, false));
    tap.tap.push(a.clone());
    tap.tap.push(b.clone());
    tap.tap.push(big);
    let mut steps = Vec::new();
    let (n, end) = rx
        .receive_batch(&m, &tap, 256, |s| steps.push(format!("{s:?}")))
        .unwrap();
    assert_eq!(n, 3, "{steps:?}");
    assert!(end.is_none(), "the last read found a frame: {end:?}");
    assert!(steps[2].contains("OverMtu"), "{steps:?}");
    // Chain 0 took a, chain 2 took b; chains 1 (empty read) and 3 (dropped) stay held.
    assert_eq!(vq.used().idx().load(), 2);
    assert_eq!(used(&vq, 0), (0, a.len() as u32));
    assert_eq!(used(&vq, 1), (2, b.len() as u32));
    assert_eq!(&read_back(&m, 0x3_0000, b.len())[12..], &b[12..]);
    assert_eq!(rx.held_chains(), 2);
    // The next frame goes into the first chain still held (1), then the one after it (3).
    let c = frame(300, false);
    let d2 = frame(40, false);
    tap.tap.push(c.clone());
    tap.tap.push(d2.clone());
    let (n, end) = rx.receive_batch(&m, &tap, 256, |_| {}).unwrap();
    assert_eq!(n, 2);
    assert!(end.is_none(), "{end:?}");
    assert_eq!(used(&vq, 2), (1, c.len() as u32));
    assert_eq!(used(&vq, 3), (3, d2.len() as u32));
    assert_eq!(&read_back(&m, 0x2_0000, c.len())[12..], &c[12..]);
    assert_eq!(&read_back(&m, 0x4_0000, d2.len())[12..], &d2[12..]);
    assert_eq!(rx.held_chains(), 0);
    // Nothing held and the ring empty: no batch; the single path says there is no room.
    assert!(rx.receive_batch(&m, &tap, 256, |_| {}).is_none());
}

#[test]
fn no_batch_where_a_chain_cannot_take_the_largest_frame_alone() {
    let m = mem();
    let vq = MockSplitQueue::new(&*m, 16);
    // Mergeable 1,024-byte buffers: a 1,500-byte MTU frame may need two.
    let chains: Vec<_> = (0..4).map(|i| d(0x1_0000 * (i + 1), 1024, WRITE)).collect();
    vq.add_desc_chains(&chains, 0).unwrap();
    let mut rx = rxq(&m, &vq, true, 1500);
    let tap = ModelTap::default();
    tap.push(frame(100, false));
    assert!(rx.receive_batch(&m, &tap, 256, |_| {}).is_none());
    assert_eq!(tap.len(), 1, "nothing read");
    assert_eq!(delivered(rx.receive(&m, &tap)), (1, 112, false));
}
