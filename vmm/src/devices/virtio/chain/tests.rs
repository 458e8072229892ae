//! Chains a hostile driver can make, against [`Segments::load`], on `virtio_queue`'s mock
//! queues in real guest memory.

use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::split::Descriptor as SplitDescriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueOwnedT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::*;

const NEXT: u16 = VRING_DESC_F_NEXT as u16;
const WRITE: u16 = VRING_DESC_F_WRITE as u16;

fn mem() -> GuestMemoryMmap {
    // Two regions with a hole between them, like RAM around the MMIO gap, and the place
    // where the mock queue puts indirect tables.
    GuestMemoryMmap::<()>::from_ranges(&[
        (GuestAddress(0), 0x10_0000),
        (GuestAddress(0x20_0000), 0x10_0000),
        (GuestAddress(0x3000_0000), 0x10_0000),
    ])
    .unwrap()
}

fn d(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
    RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
}

/// Loads the first chain of a queue of 16 holding `descs` (written as given, flags and next
/// included) for `dir`.
fn load(descs: &[RawDescriptor], dir: Direction, min: u64) -> Result<Segments, ChainError> {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    vq.add_desc_chains(descs, 0).unwrap();
    let mut q: Queue = vq.create_queue().unwrap();
    let chain = q.iter(&m).unwrap().next().unwrap();
    let mut s = Segments::with_capacity(16);
    s.load(chain, &m, dir, min).map(|()| s)
}

#[test]
fn a_well_formed_chain_gives_its_buffers_in_order() {
    let s = load(
        &[d(0x1000, 12, NEXT, 1), d(0x2000, 100, 0, 0)],
        Direction::Read,
        12,
    )
    .unwrap();
    let got: Vec<(u64, u32)> = s.list().iter().map(|g| (g.addr, g.len)).collect();
    assert_eq!(got, [(0x1000, 12), (0x2000, 100)]);
    // Each buffer's mapping was found as the chain was checked: 4 KiB apart, as in the guest.
    assert_eq!(s.list()[1].host - s.list()[0].host, 0x1000);
    assert_eq!((s.total(), s.head()), (112, 0));
}

#[test]
fn a_loop_is_broken_not_endless() {
    // 0 -> 1 -> 0 -> ...: the iterator stops after the queue size; the chain never ended.
    let e = load(
        &[d(0x1000, 8, NEXT, 1), d(0x2000, 8, NEXT, 0)],
        Direction::Read,
        1,
    );
    assert_eq!(e.unwrap_err(), ChainError::Broken);
    // A descriptor pointing at itself.
    let e = load(&[d(0x1000, 8, NEXT, 0)], Direction::Read, 1);
    assert_eq!(e.unwrap_err(), ChainError::Broken);
}

#[test]
fn an_index_past_the_table_is_broken() {
    let e = load(&[d(0x1000, 8, NEXT, 500)], Direction::Read, 1);
    assert_eq!(e.unwrap_err(), ChainError::Broken);
}

#[test]
fn buffers_outside_ram_are_refused() {
    for (addr, len) in [
        (0x10_0000 - 4, 8), // runs past the first region
        (0x18_0000, 8),     // in the hole
        (0x40_0000, 8),     // past the end of RAM
        (0x1000, u32::MAX), // a 4 GiB length
        (u64::MAX - 2, 8),  // wraps around
    ] {
        let e = load(&[d(addr, len, 0, 0)], Direction::Read, 1);
        assert_eq!(
            e.unwrap_err(),
            ChainError::OutsideMemory,
            "{addr:#x}+{len:#x}"
        );
    }
    // The second region is RAM too.
    assert!(load(&[d(0x20_0000, 64, 0, 0)], Direction::Read, 1).is_ok());
}

#[test]
fn a_buffer_pointing_the_wrong_way_is_refused() {
    // A read-only buffer in a receive chain.
    let e = load(
        &[d(0x1000, 64, WRITE | NEXT, 1), d(0x2000, 64, 0, 0)],
        Direction::Write,
        1,
    );
    assert_eq!(e.unwrap_err(), ChainError::WrongDirection);
    // A writable buffer in a transmit chain.
    let e = load(&[d(0x1000, 64, WRITE, 0)], Direction::Read, 1);
    assert_eq!(e.unwrap_err(), ChainError::WrongDirection);
    assert!(load(&[d(0x1000, 64, WRITE, 0)], Direction::Write, 1).is_ok());
}

#[test]
fn empty_and_short_chains_are_refused() {
    assert_eq!(
        load(&[d(0x1000, 0, 0, 0)], Direction::Read, 1).unwrap_err(),
        ChainError::Empty
    );
    assert_eq!(
        load(&[d(0x1000, 8, 0, 0)], Direction::Read, 12).unwrap_err(),
        ChainError::Empty
    );
    // Zero-length descriptors inside a chain are skipped, not refused.
    let s = load(
        &[d(0x1000, 0, NEXT, 1), d(0x2000, 20, 0, 0)],
        Direction::Read,
        12,
    )
    .unwrap();
    assert_eq!(s.list().len(), 1);
}

#[test]
fn an_indirect_table_longer_than_the_queue_is_broken() {
    let run = |len: u16| {
        let m = mem();
        let mut vq = MockSplitQueue::new(&m, 16);
        // An indirect table of `len` descriptors, chained 0 -> 1 -> ... by the mock.
        vq.add_indirect_chain(len).unwrap();
        let mut q: Queue = vq.create_queue().unwrap();
        let chain = q.iter(&m).unwrap().next().unwrap();
        let mut s = Segments::with_capacity(16);
        s.load(chain, &m, Direction::Read, 1)
            .map(|()| s.list().len())
    };
    // Within the queue size: loads (a driver may use indirect tables; the device offers them).
    assert_eq!(run(8), Ok(8));
    // The spec's bound is the queue size, indirect descriptors included.
    assert_eq!(run(64), Err(ChainError::Broken));
}

#[test]
fn copies_go_through_the_buffers_in_order() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    vq.add_desc_chains(
        &[d(0x1000, 4, WRITE | NEXT, 1), d(0x2000, 100, WRITE, 0)],
        0,
    )
    .unwrap();
    let mut q: Queue = vq.create_queue().unwrap();
    let chain = q.iter(&m).unwrap().next().unwrap();
    let mut s = Segments::with_capacity(16);
    s.load(chain, &m, Direction::Write, 1).unwrap();
    assert_eq!(s.write_at(&m, 2, b"abcdefgh"), 8);
    let mut a = [0u8; 4];
    m.read_slice(&mut a, GuestAddress(0x1000)).unwrap();
    assert_eq!(&a, b"\0\0ab");
    let mut b = [0u8; 6];
    m.read_slice(&mut b, GuestAddress(0x2000)).unwrap();
    assert_eq!(&b, b"cdefgh");
    let mut out = [0u8; 10];
    assert_eq!(s.read_into(&m, &mut out), 10);
    assert_eq!(&out, b"\0\0abcdefgh");
    // More than fits: stops at the chain's end.
    assert_eq!(s.write_at(&m, 0, &[7u8; 200]), 104);
}

#[test]
fn a_request_with_its_answer_is_readable_then_writable() {
    let s = load(
        &[
            d(0x1000, 2, NEXT, 1),
            d(0x2000, 2, NEXT, 2),
            d(0x3000, 1, WRITE, 0),
        ],
        Direction::ReadThenWrite,
        1,
    )
    .unwrap();
    let (r, w) = s.split();
    assert_eq!((r.len(), w.len()), (2, 1));
    assert_eq!(w[0].addr, 0x3000);
    // A readable buffer after a writable one is refused.
    let e = load(
        &[d(0x1000, 2, WRITE | NEXT, 1), d(0x2000, 2, 0, 0)],
        Direction::ReadThenWrite,
        1,
    );
    assert_eq!(e.unwrap_err(), ChainError::WrongDirection);
}

#[test]
fn iovecs_cover_a_byte_range_across_buffers_and_never_grow() {
    let m = mem();
    let vq = MockSplitQueue::new(&m, 16);
    vq.add_desc_chains(
        &[
            d(0x1000, 16, NEXT, 1),
            d(0x2000, 100, NEXT | WRITE, 2),
            d(0x3000, 1, WRITE, 0),
        ],
        0,
    )
    .unwrap();
    let mut q: Queue = vq.create_queue().unwrap();
    let chain = q.iter(&m).unwrap().next().unwrap();
    let mut s = Segments::with_capacity(16);
    s.load(chain, &m, Direction::ReadThenWrite, 17).unwrap();
    let mut iov = Vec::with_capacity(16);
    // The write buffers' data: from byte 16, 100 bytes, not the status byte after them.
    assert_eq!(s.iovecs(16, 100, &mut iov), 100);
    assert_eq!(iov.len(), 1);
    let base = m.get_host_address(GuestAddress(0x2000)).unwrap();
    assert_eq!((iov[0].iov_base as *mut u8, iov[0].iov_len), (base, 100));
    // A range across two buffers, starting inside the first.
    assert_eq!(s.iovecs(10, 10, &mut iov), 10);
    assert_eq!(
        iov.iter().map(|v| v.iov_len).collect::<Vec<_>>(),
        vec![6, 4]
    );
    // Past the end: only what is there.
    assert_eq!(s.iovecs(110, 50, &mut iov), 7);
    assert_eq!(s.iovecs(500, 5, &mut iov), 0);
    assert!(iov.is_empty());
    assert_eq!(iov.capacity(), 16, "no allocation");
    // Appending keeps what is there; the chain's last byte is the status.
    s.iovecs(16, 100, &mut iov);
    assert_eq!(s.append_iovecs(0, 16, &mut iov), 16);
    assert_eq!(iov.len(), 2);
    assert_eq!(s.last_byte(), Some(GuestAddress(0x3000)));
}
