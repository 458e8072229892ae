//! Where a frame's device CPU goes besides the tap's system call: the virtqueue work per chain
//! (pop with its checks, the chain walk, the used ring), per frame received (straight into the
//! guest's buffers, or through the host buffer and a copy), and the interrupt decision per
//! batch. In-memory rings, no tap: the numbers are the device's own
//! overhead, to set beside `bench net`'s CPU a frame (docs/design.md, "Decisions").

use std::io;
use std::sync::Arc;

use criterion::{black_box, Criterion};
use ppa_vmm::devices::net::rx::{FrameSource, RxParams, RxQueue, Step};
use ppa_vmm::devices::virtio::chain::{Direction, Segments};
use ppa_vmm::devices::virtio::queue::DeviceQueue;
use virtio_bindings::bindings::virtio_ring::VRING_DESC_F_WRITE;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const SIZE: u16 = 256;

/// A frame source that copies one 64-byte frame (and its header) into the buffers, as the
/// tap's `readv` does, without the system call.
struct Frames([u8; 76]);

impl FrameSource for Frames {
    unsafe fn read_frame(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        let n = self.0.len().min(iov[0].iov_len);
        // SAFETY: the caller guarantees the iovec is valid for writes of its length; `n` is at
        // most that.
        unsafe { std::ptr::copy_nonoverlapping(self.0.as_ptr(), iov[0].iov_base.cast(), n) };
        Ok(n)
    }
}

fn mem() -> Arc<GuestMemoryMmap> {
    Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x100_0000)]).unwrap())
}

/// A split ring of `SIZE` at 0x1_0000 laid out as the spec says (virtio-queue's mock puts its
/// used ring over the available ring's tail at this size): descriptor `i` is one buffer of
/// `len` bytes (`write`: device-writable) at its own page, every head available once.
struct Ring {
    avail: u64,
}

fn ring(m: &Arc<GuestMemoryMmap>, len: u32, write: bool) -> (Ring, DeviceQueue) {
    let (desc, avail) = (0x1_0000u64, 0x1_0000 + 16 * u64::from(SIZE));
    let used = (avail + 6 + 2 * u64::from(SIZE)).next_multiple_of(4);
    let flags: u16 = if write { VRING_DESC_F_WRITE as u16 } else { 0 };
    for i in 0..SIZE {
        let d = desc + 16 * u64::from(i);
        m.write_obj(0x10_0000 + u64::from(i) * 0x1000, GuestAddress(d))
            .unwrap();
        m.write_obj(len, GuestAddress(d + 8)).unwrap();
        m.write_obj(flags, GuestAddress(d + 12)).unwrap();
        m.write_obj(i, GuestAddress(avail + 4 + 2 * u64::from(i)))
            .unwrap();
    }
    m.write_obj(SIZE, GuestAddress(avail + 2)).unwrap();
    let mut q = Queue::new(SIZE).unwrap();
    q.try_set_size(SIZE).unwrap();
    q.try_set_desc_table_address(GuestAddress(desc)).unwrap();
    q.try_set_avail_ring_address(GuestAddress(avail)).unwrap();
    q.try_set_used_ring_address(GuestAddress(used)).unwrap();
    q.set_ready(true);
    assert!(q.is_valid(&**m));
    (Ring { avail }, DeviceQueue::new(q, m).unwrap())
}

impl Ring {
    /// Moves the driver's available index by `n` (the chains at those slots made available
    /// again).
    fn publish(&self, m: &GuestMemoryMmap, n: u16) {
        let at = GuestAddress(self.avail + 2);
        let idx: u16 = m.read_obj(at).unwrap();
        m.write_obj(idx.wrapping_add(n), at).unwrap();
    }
}

fn bench(c: &mut Criterion) {
    let m = mem();
    // Transmit: pop, walk and check the chain, give it back; per chain.
    let (vq, mut dq) = ring(&m, 76, false);
    let mut segs = Segments::with_capacity(usize::from(SIZE));
    c.bench_function("tx chain: pop + load + add_used (per chain)", |b| {
        b.iter_custom(|iters| {
            let mut total = std::time::Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let n = left.min(u64::from(SIZE));
                let t = std::time::Instant::now();
                for _ in 0..n {
                    let chain = dq.pop(&m).unwrap().unwrap();
                    segs.load(chain, &m, Direction::Read, 12).unwrap();
                    dq.add_used(segs.head(), 0).unwrap();
                }
                black_box(dq.needs_interrupt());
                total += t.elapsed();
                // Drain what is left of the ring, then make it all available again.
                while dq.pop(&m).unwrap().is_some() {}
                vq.publish(&m, SIZE);
                left -= n;
            }
            total
        })
    });
    // The same with virtio-queue's Reader (a VecDeque of slices made per chain) in place of
    // Segments (one list made once and reused): why the device walks chains with Segments.
    let (vq, mut dq) = ring(&m, 76, false);
    c.bench_function(
        "tx chain: pop + virtio_queue::Reader::new + add_used (per chain)",
        |b| {
            b.iter_custom(|iters| {
                let mut total = std::time::Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let n = left.min(u64::from(SIZE));
                    let t = std::time::Instant::now();
                    for _ in 0..n {
                        let chain = dq.pop(&m).unwrap().unwrap();
                        let head = chain.head_index();
                        let r = virtio_queue::Reader::new(&*m, chain).unwrap();
                        black_box(r.available_bytes());
                        dq.add_used(head, 0).unwrap();
                    }
                    black_box(dq.needs_interrupt());
                    total += t.elapsed();
                    while dq.pop(&m).unwrap().is_some() {}
                    vq.publish(&m, SIZE);
                    left -= n;
                }
                total
            })
        },
    );
    // Receive straight into the guest's buffers (2 KiB chains: the largest frame fits).
    let frames = Frames([0x11; 76]);
    let p = RxParams {
        mergeable: false,
        gso: false,
        mtu: 1500,
    };
    for (name, len) in [
        ("rx frame: straight into the guest (per frame)", 2048u32),
        (
            "rx frame: through the host buffer and a copy (per frame)",
            1024,
        ),
    ] {
        let (vq, dq) = ring(&m, len, true);
        let mut rx = RxQueue::new(dq, p);
        c.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = std::time::Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    // Half a ring a batch, so the queue never runs dry inside one.
                    let n = left.min(u64::from(SIZE / 2));
                    let before = rx.dq.queue().next_avail();
                    let t = std::time::Instant::now();
                    for _ in 0..n {
                        match rx.receive(&m, &frames) {
                            Step::Delivered { .. } => {}
                            other => panic!("{other:?}"),
                        }
                    }
                    black_box(rx.dq.needs_interrupt());
                    total += t.elapsed();
                    // The driver posts again as many chains as the device took.
                    let took = rx.dq.queue().next_avail().wrapping_sub(before);
                    vq.publish(&m, took);
                    left -= n;
                }
                total
            })
        });
    }
}

// criterion's macros make undocumented items.
mod group {
    #![allow(missing_docs)]
    use super::bench;
    use criterion::criterion_group;

    criterion_group!(benches, bench);
}

criterion::criterion_main!(group::benches);
