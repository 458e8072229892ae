//! Frames delivered into mock receive queues: single chains, mergeable buffers, waiting for
//! room, and what a hostile driver can put in the ring.

use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::split::Descriptor as SplitDescriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress};

use super::*;

const WRITE: u16 = VRING_DESC_F_WRITE as u16;
const NEXT: u16 = VRING_DESC_F_NEXT as u16;

fn mem() -> GuestMemoryMmap {
    GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x40_0000)]).unwrap()
}

fn d(addr: u64, len: u32, flags: u16) -> RawDescriptor {
    RawDescriptor::from(SplitDescriptor::new(addr, len, flags, 0))
}

/// A frame of `len` bytes after a 12-byte header whose first byte is 0x11.
fn frame(len: usize) -> Vec<u8> {
    let mut f = vec![0u8; VNET_HDR_LEN];
    f[0] = 0x11;
    f.extend((0..len).map(|i| (i % 251) as u8));
    f
}

fn used(vq: &MockSplitQueue<'_, GuestMemoryMmap>, i: usize) -> (u32, u32) {
    let e = vq.used().ring().ref_at(i).unwrap().load();
    (e.id(), e.len())
}

#[test]
fn a_frame_fills_one_chain_with_num_buffers_one() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    vq.add_desc_chains(&[d(0x1_0000, 2048, WRITE), d(0x2_0000, 2048, WRITE)], 0)
        .unwrap();
    let mut rx = RxQueue::new(vq.create_queue().unwrap(), false);
    let f = frame(100);
    assert_eq!(rx.deliver(&m, &f), Delivery::Delivered(1));
    assert_eq!(vq.used().idx().load(), 1);
    assert_eq!(used(&vq, 0), (0, 112));
    let mut got = vec![0u8; 112];
    m.read_slice(&mut got, GuestAddress(0x1_0000)).unwrap();
    assert_eq!(&got[12..], &f[12..]);
    assert_eq!(u16::from_le_bytes([got[10], got[11]]), 1, "num_buffers");
}

#[test]
fn a_frame_larger_than_a_chain_without_mergeable_buffers_is_dropped_and_the_chain_returned() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    vq.add_desc_chains(&[d(0x1_0000, 64, WRITE)], 0).unwrap();
    let mut rx = RxQueue::new(vq.create_queue().unwrap(), false);
    assert_eq!(rx.deliver(&m, &frame(1000)), Delivery::TooLarge);
    assert_eq!(used(&vq, 0), (0, 0));
}

#[test]
fn a_large_frame_spans_mergeable_buffers_and_says_how_many() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    let descs: Vec<_> = (0..4)
        .map(|i| d(0x1_0000 + i * 0x1000, 1024, WRITE))
        .collect();
    vq.add_desc_chains(&descs, 0).unwrap();
    let mut rx = RxQueue::new(vq.create_queue().unwrap(), true);
    let f = frame(2500); // 2512 bytes: three chains of 1024
    assert_eq!(rx.deliver(&m, &f), Delivery::Delivered(3));
    assert_eq!(vq.used().idx().load(), 3);
    assert_eq!(
        [used(&vq, 0), used(&vq, 1), used(&vq, 2)],
        [(0, 1024), (1, 1024), (2, 464)]
    );
    let mut hdr = [0u8; 12];
    m.read_slice(&mut hdr, GuestAddress(0x1_0000)).unwrap();
    assert_eq!(u16::from_le_bytes([hdr[10], hdr[11]]), 3);
    let mut tail = vec![0u8; 464];
    m.read_slice(&mut tail, GuestAddress(0x1_2000)).unwrap();
    assert_eq!(&tail[..], &f[2048..]);
}

#[test]
fn without_room_the_frame_waits_and_nothing_is_taken() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    vq.add_desc_chains(&[d(0x1_0000, 1024, WRITE)], 0).unwrap();
    let mut rx = RxQueue::new(vq.create_queue().unwrap(), true);
    let f = frame(2000);
    assert_eq!(rx.deliver(&m, &f), Delivery::NoRoom);
    assert_eq!(rx.q.next_avail(), 0, "the chain taken is given back");
    assert_eq!(vq.used().idx().load(), 0);
    // The guest adds a buffer: the same frame now goes in.
    vq.add_desc_chains(&[d(0x2_0000, 1024, WRITE)], 1).unwrap();
    assert_eq!(rx.deliver(&m, &f), Delivery::Delivered(2));
    // An empty queue is room for nothing.
    assert_eq!(rx.deliver(&m, &f), Delivery::NoRoom);
}

#[test]
fn hostile_receive_chains_are_faults() {
    let m = mem();
    // A device-readable buffer where the device must write.
    let vq = MockSplitQueue::new(&m, 16);
    vq.add_desc_chains(&[d(0x1_0000, 2048, 0)], 0).unwrap();
    let mut rx = RxQueue::new(vq.create_queue().unwrap(), true);
    assert_eq!(
        rx.deliver(&m, &frame(10)),
        Delivery::Bad(QueueFault::Chain(ChainError::WrongDirection))
    );
    // A chain that loops.
    let vq = MockSplitQueue::new(&m, 16);
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
    let mut rx = RxQueue::new(vq.create_queue().unwrap(), false);
    assert_eq!(
        rx.deliver(&m, &frame(10)),
        Delivery::Bad(QueueFault::Chain(ChainError::Broken))
    );
    // An available index 1000 ahead in a queue of 16.
    let vq = MockSplitQueue::new(&m, 16);
    vq.avail().idx().store(1000);
    let mut rx = RxQueue::new(vq.create_queue().unwrap(), false);
    assert_eq!(
        rx.deliver(&m, &frame(10)),
        Delivery::Bad(QueueFault::AvailIndex)
    );
}
