//! Requests as a driver (or a hostile one) makes them, against [`serve`] on an in-memory disk:
//! what reaches the disk, what the guest reads back, and the status each gets.

use ppa_vmm_api::{BlkRequestKind, BlkStatus};
use virtio_bindings::bindings::virtio_blk::*;
use vm_memory::{Bytes, GuestAddress};

use super::*;
use crate::devices::blk::memdisk::MemDisk;
use crate::devices::blk::tests::{limits, Req, Rig};
use crate::fuzzing::driver::Buf;

const OK: u8 = VIRTIO_BLK_S_OK as u8;
const IOERR_B: u8 = VIRTIO_BLK_S_IOERR as u8;
const UNSUPP_B: u8 = VIRTIO_BLK_S_UNSUPP as u8;

/// A sector's worth of a pattern made from `seed`.
fn pattern(seed: u8, sectors: usize) -> Vec<u8> {
    (0..512 * sectors)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

fn one(rig: &mut Rig, disk: &MemDisk, l: &Limits, r: Req<'_>) -> (Done, u8, u64) {
    let k = rig.add(&r);
    let d = rig.serve(disk, l).expect("answered");
    (d, rig.status_of(k), k)
}

#[test]
fn a_write_reaches_the_disk_at_its_sector_and_a_read_brings_it_back() {
    let (mut rig, disk, l) = (Rig::new(16, false), MemDisk::new(64), limits());
    let data = pattern(5, 8);
    let (d, st, _) = one(
        &mut rig,
        &disk,
        &l,
        Req {
            ty: VIRTIO_BLK_T_OUT,
            sector: 3,
            out: &data,
            in_len: 0,
        },
    );
    assert_eq!(
        (st, d.kind, d.error, d.used, d.written),
        (OK, BlkRequestKind::Write, None, 1, 4096)
    );
    assert_eq!(&disk.bytes.borrow()[3 * 512..11 * 512], &data[..]);
    assert!(disk.bytes.borrow()[..3 * 512].iter().all(|b| *b == 0));
    let (d, st, k) = one(
        &mut rig,
        &disk,
        &l,
        Req {
            ty: VIRTIO_BLK_T_IN,
            sector: 3,
            out: &[],
            in_len: 4096,
        },
    );
    assert_eq!((st, d.used, d.read), (OK, 4097, 4096));
    let mut back = vec![0u8; 4096];
    rig.mem
        .read_slice(&mut back, GuestAddress(rig.data_of(k)))
        .unwrap();
    assert_eq!(back, data);
    assert_eq!(disk.syncs.get(), 0, "write back: no sync until a FLUSH");
}

#[test]
fn a_flush_syncs_and_without_flush_negotiated_every_write_is_durable() {
    let (mut rig, disk, mut l) = (Rig::new(16, false), MemDisk::new(64), limits());
    let data = pattern(1, 1);
    one(
        &mut rig,
        &disk,
        &l,
        Req {
            ty: VIRTIO_BLK_T_OUT,
            sector: 0,
            out: &data,
            in_len: 0,
        },
    );
    assert_eq!(disk.unsynced.get(), 512);
    let (d, st, _) = one(
        &mut rig,
        &disk,
        &l,
        Req {
            ty: VIRTIO_BLK_T_FLUSH,
            sector: 0,
            out: &[],
            in_len: 0,
        },
    );
    assert_eq!((st, d.kind), (OK, BlkRequestKind::Flush));
    assert_eq!((disk.syncs.get(), disk.unsynced.get()), (1, 0));
    l.writeback = false;
    one(
        &mut rig,
        &disk,
        &l,
        Req {
            ty: VIRTIO_BLK_T_OUT,
            sector: 1,
            out: &data,
            in_len: 0,
        },
    );
    assert_eq!(
        (disk.syncs.get(), disk.unsynced.get()),
        (2, 0),
        "synced before it completed"
    );
    disk.fail.set(true);
    let (d, st, _) = one(
        &mut rig,
        &disk,
        &l,
        Req {
            ty: VIRTIO_BLK_T_FLUSH,
            sector: 0,
            out: &[],
            in_len: 0,
        },
    );
    assert_eq!((st, d.error), (IOERR_B, Some((BlkStatus::Ioerr, Why::Io))));
}

#[test]
fn a_read_only_disk_refuses_writes_with_ioerr_and_changes_nothing() {
    let (mut rig, disk, mut l) = (Rig::new(16, false), MemDisk::new(64), limits());
    l.readonly = true;
    let data = pattern(9, 1);
    let (d, st, _) = one(
        &mut rig,
        &disk,
        &l,
        Req {
            ty: VIRTIO_BLK_T_OUT,
            sector: 0,
            out: &data,
            in_len: 0,
        },
    );
    assert_eq!(
        (st, d.error),
        (IOERR_B, Some((BlkStatus::Ioerr, Why::ReadOnly)))
    );
    let range = [0u8; 16];
    for ty in [VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_WRITE_ZEROES] {
        let (_, st, _) = one(
            &mut rig,
            &disk,
            &l,
            Req {
                ty,
                sector: 0,
                out: &range,
                in_len: 0,
            },
        );
        assert_eq!(st, UNSUPP_B, "not offered on a read-only disk");
    }
    assert!(disk.bytes.borrow().iter().all(|b| *b == 0));
    // Reads and flushes still work.
    let (_, st, _) = one(
        &mut rig,
        &disk,
        &l,
        Req {
            ty: VIRTIO_BLK_T_IN,
            sector: 63,
            out: &[],
            in_len: 512,
        },
    );
    assert_eq!(st, OK);
}

#[test]
fn requests_past_the_end_or_not_in_sectors_get_ioerr() {
    let (mut rig, disk, l) = (Rig::new(16, false), MemDisk::new(64), limits());
    for (ty, sector, out, in_len, why) in [
        (VIRTIO_BLK_T_IN, 63, 0, 1024, Why::PastEnd),
        (VIRTIO_BLK_T_IN, u64::MAX, 0, 512, Why::PastEnd),
        (VIRTIO_BLK_T_OUT, 64, 512, 0, Why::PastEnd),
        (VIRTIO_BLK_T_IN, 0, 0, 100, Why::Unaligned),
        (VIRTIO_BLK_T_OUT, 0, 513, 0, Why::Unaligned),
        // Data in both directions.
        (VIRTIO_BLK_T_IN, 0, 512, 512, Why::Layout),
        (VIRTIO_BLK_T_OUT, 0, 512, 512, Why::Layout),
        (VIRTIO_BLK_T_GET_ID, 0, 16, 20, Why::Layout),
    ] {
        let out = vec![1u8; out];
        let (d, st, _) = one(
            &mut rig,
            &disk,
            &l,
            Req {
                ty,
                sector,
                out: &out,
                in_len,
            },
        );
        assert_eq!(
            (st, d.error),
            (IOERR_B, Some((BlkStatus::Ioerr, why))),
            "type {ty} sector {sector}"
        );
        assert_eq!(d.used, 1);
    }
    assert!(
        disk.bytes.borrow().iter().all(|b| *b == 0),
        "nothing written"
    );
    let (d, st, _) = one(
        &mut rig,
        &disk,
        &l,
        Req {
            ty: 0x7777,
            sector: 0,
            out: &[],
            in_len: 0,
        },
    );
    assert_eq!(
        (st, d.kind, d.error.map(|e| e.0)),
        (UNSUPP_B, BlkRequestKind::Unknown, Some(BlkStatus::Unsupp))
    );
}

#[test]
fn a_short_header_gets_ioerr_and_no_status_byte_is_refused() {
    let (mut rig, disk, l) = (Rig::new(16, false), MemDisk::new(64), limits());
    rig.mem.write_obj(0xffu8, GuestAddress(0x3_0000)).unwrap();
    rig.raw(&[
        Buf {
            addr: 0x2_0000,
            len: 8,
            write: false,
        },
        Buf {
            addr: 0x3_0000,
            len: 1,
            write: true,
        },
    ]);
    let d = rig.serve(&disk, &l).unwrap();
    assert_eq!(d.error, Some((BlkStatus::Ioerr, Why::Header)));
    assert_eq!(rig.status_of(0), IOERR_B);
    rig.raw(&[Buf {
        addr: 0x2_0000,
        len: 16,
        write: false,
    }]);
    assert_eq!(rig.serve(&disk, &l), Err(Refused));
}

#[test]
fn the_status_is_the_last_writable_byte_wherever_the_buffers_split() {
    // One writable buffer holding both the data and the status, as a driver may make it.
    let (mut rig, disk, l) = (Rig::new(16, false), MemDisk::new(64), limits());
    disk.bytes.borrow_mut()[..512].copy_from_slice(&pattern(3, 1));
    let mut h = [0u8; 16];
    h[..4].copy_from_slice(&VIRTIO_BLK_T_IN.to_le_bytes());
    rig.mem.write_slice(&h, GuestAddress(0x2_0000)).unwrap();
    rig.raw(&[
        Buf {
            addr: 0x2_0000,
            len: 16,
            write: false,
        },
        Buf {
            addr: 0x10_0000,
            len: 513,
            write: true,
        },
    ]);
    let d = rig.serve(&disk, &l).unwrap();
    assert_eq!((d.error, d.read), (None, 512));
    let mut back = vec![0u8; 513];
    rig.mem
        .read_slice(&mut back, GuestAddress(0x10_0000))
        .unwrap();
    assert_eq!(&back[..512], &pattern(3, 1)[..]);
    assert_eq!(back[512], OK);
}

#[test]
fn get_id_answers_the_id_in_twenty_bytes() {
    let (mut rig, disk, l) = (Rig::new(16, false), MemDisk::new(64), limits());
    let (d, st, k) = one(
        &mut rig,
        &disk,
        &l,
        Req {
            ty: VIRTIO_BLK_T_GET_ID,
            sector: 0,
            out: &[],
            in_len: 20,
        },
    );
    assert_eq!((st, d.used), (OK, 21));
    let mut id = [0u8; 20];
    rig.mem
        .read_slice(&mut id, GuestAddress(rig.data_of(k)))
        .unwrap();
    assert_eq!(&id[..5], b"blk0\0");
    // A shorter buffer gets what fits.
    let (d, st, _) = one(
        &mut rig,
        &disk,
        &l,
        Req {
            ty: VIRTIO_BLK_T_GET_ID,
            sector: 0,
            out: &[],
            in_len: 2,
        },
    );
    assert_eq!((st, d.used), (OK, 3));
}

fn ranges(list: &[(u64, u32, u32)]) -> Vec<u8> {
    list.iter()
        .flat_map(|(s, n, f)| {
            let mut b = s.to_le_bytes().to_vec();
            b.extend(n.to_le_bytes());
            b.extend(f.to_le_bytes());
            b
        })
        .collect()
}

#[test]
fn discard_and_write_zeroes_zero_their_ranges_and_check_them_all_first() {
    let (mut rig, disk, mut l) = (Rig::new(16, false), MemDisk::new(64), limits());
    disk.bytes.borrow_mut().fill(0xaa);
    let out = ranges(&[(2, 2, 0), (10, 1, 0)]);
    let (_, st, _) = one(
        &mut rig,
        &disk,
        &l,
        Req {
            ty: VIRTIO_BLK_T_DISCARD,
            sector: 0,
            out: &out,
            in_len: 0,
        },
    );
    assert_eq!(st, OK);
    let zero = |s: usize, n: usize| {
        disk.bytes.borrow()[s * 512..(s + n) * 512]
            .iter()
            .all(|b| *b == 0)
    };
    assert!(zero(2, 2) && zero(10, 1));
    assert_eq!(disk.bytes.borrow()[4 * 512], 0xaa);
    let unmap = VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP;
    let out = ranges(&[(20, 3, unmap), (30, 1, 0)]);
    let (_, st, _) = one(
        &mut rig,
        &disk,
        &l,
        Req {
            ty: VIRTIO_BLK_T_WRITE_ZEROES,
            sector: 0,
            out: &out,
            in_len: 0,
        },
    );
    assert_eq!(st, OK);
    assert!(zero(20, 3) && zero(30, 1));
    // A bad range anywhere: nothing is done, not even the good ones before it.
    for (list, status) in [
        (vec![(40, 1, 0), (63, 2, 0)], IOERR_B),
        (vec![(40, 1, 0), (41, 1, 4)], UNSUPP_B),
        (vec![(40, MAX_RANGE_SECTORS + 1, 0)], IOERR_B),
    ] {
        let out = ranges(&list);
        let (_, st, _) = one(
            &mut rig,
            &disk,
            &l,
            Req {
                ty: VIRTIO_BLK_T_WRITE_ZEROES,
                sector: 0,
                out: &out,
                in_len: 0,
            },
        );
        assert_eq!(st, status, "{list:?}");
        assert_eq!(disk.bytes.borrow()[40 * 512], 0xaa);
    }
    let out = ranges(&[(40, 1, unmap)]);
    let (_, st, _) = one(
        &mut rig,
        &disk,
        &l,
        Req {
            ty: VIRTIO_BLK_T_DISCARD,
            sector: 0,
            out: &out,
            in_len: 0,
        },
    );
    assert_eq!(st, UNSUPP_B, "DISCARD takes no unmap flag");
    let many = ranges(&vec![(0, 1, 0); MAX_RANGES as usize + 1]);
    let (d, st, _) = one(
        &mut rig,
        &disk,
        &l,
        Req {
            ty: VIRTIO_BLK_T_DISCARD,
            sector: 0,
            out: &many,
            in_len: 0,
        },
    );
    assert_eq!((st, d.error.map(|e| e.1)), (IOERR_B, Some(Why::Ranges)));
    l.discard = false;
    let (_, st, _) = one(
        &mut rig,
        &disk,
        &l,
        Req {
            ty: VIRTIO_BLK_T_DISCARD,
            sector: 0,
            out: &ranges(&[(0, 1, 0)]),
            in_len: 0,
        },
    );
    assert_eq!(st, UNSUPP_B, "not negotiated");
}

#[test]
fn short_transfers_complete_and_a_failing_disk_gives_ioerr() {
    let (mut rig, disk, l) = (Rig::new(16, false), MemDisk::new(64), limits());
    disk.chunk.set(Some(100));
    let data = pattern(7, 4);
    let (_, st, _) = one(
        &mut rig,
        &disk,
        &l,
        Req {
            ty: VIRTIO_BLK_T_OUT,
            sector: 8,
            out: &data,
            in_len: 0,
        },
    );
    assert_eq!(st, OK);
    assert_eq!(&disk.bytes.borrow()[8 * 512..12 * 512], &data[..]);
    let (_, st, k) = one(
        &mut rig,
        &disk,
        &l,
        Req {
            ty: VIRTIO_BLK_T_IN,
            sector: 8,
            out: &[],
            in_len: 2048,
        },
    );
    assert_eq!(st, OK);
    let mut back = vec![0u8; 2048];
    rig.mem
        .read_slice(&mut back, GuestAddress(rig.data_of(k)))
        .unwrap();
    assert_eq!(back, data);
    disk.fail.set(true);
    let (d, st, _) = one(
        &mut rig,
        &disk,
        &l,
        Req {
            ty: VIRTIO_BLK_T_IN,
            sector: 8,
            out: &[],
            in_len: 512,
        },
    );
    assert_eq!(
        (st, d.error.map(|e| e.1), d.read),
        (IOERR_B, Some(Why::Io), 0)
    );
}

#[test]
fn a_transfer_that_never_moves_ends() {
    let mut buf = [0u8; 16];
    let mut iov = [libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    }];
    let mut calls = 0;
    let r = transfer(&mut iov, 0, |_, _| {
        calls += 1;
        Err(io::Error::from(io::ErrorKind::Interrupted))
    });
    assert!(r.is_err());
    assert_eq!(calls, IO_TRIES);
    let r = transfer(&mut iov, 0, |_, _| Ok(0));
    assert_eq!(r.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    // One byte at a time, offsets moving with it.
    let mut seen = Vec::new();
    transfer(&mut iov, 100, |v, at| {
        seen.push(at);
        assert_eq!(
            v.iter().map(|x| x.iov_len).sum::<usize>(),
            16 - (at - 100) as usize
        );
        Ok(1)
    })
    .unwrap();
    assert_eq!(seen, (100..116).collect::<Vec<u64>>());
}
