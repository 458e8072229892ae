//! Merging over a queue driven by the model of Linux's ring, on an in-memory disk that counts
//! its calls and can fail a range: requests that follow each other go as one call and are
//! each answered; anything else breaks the batch; a failed merged call is retried request by
//! request so each gets its own status.

use std::cell::Cell;

use ppa_vmm_api::BlkRequestKind;
use virtio_bindings::bindings::virtio_blk::*;
use vm_memory::{Bytes, GuestAddress};

use super::MERGE_MAX;
use crate::devices::blk::memdisk::MemDisk;
use crate::devices::blk::queue::{req_pass, BlkCounters};
use crate::devices::blk::request::Why;
use crate::devices::blk::tests::{limits, pass, req_queue, Req, Rig};
use crate::devices::virtio::counters::QueueCounters;

const S: u64 = 512;

fn counters() -> (QueueCounters, BlkCounters) {
    (QueueCounters::default(), BlkCounters::default())
}

/// Sector `i` as the tests write it.
fn sector(i: u64) -> Vec<u8> {
    (0..S).map(|b| (i * 7 + b) as u8).collect()
}

fn write(rig: &mut Rig, at: u64, data: &[u8]) -> u64 {
    rig.add(&Req {
        ty: VIRTIO_BLK_T_OUT,
        sector: at,
        out: data,
        in_len: 0,
    })
}

fn read(rig: &mut Rig, at: u64, sectors: u32) -> u64 {
    rig.add(&Req {
        ty: VIRTIO_BLK_T_IN,
        sector: at,
        out: &[],
        in_len: sectors * S as u32,
    })
}

fn read_back(rig: &Rig, slot: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rig.mem
        .read_slice(&mut v, GuestAddress(rig.data_of(slot)))
        .unwrap();
    v
}

/// Every chain the pass gave back, in order: (head, used length).
fn used(rig: &mut Rig) -> Vec<(u16, u32)> {
    std::iter::from_fn(|| rig.ring.pop_used(&rig.mem)).collect()
}

#[test]
fn requests_that_follow_each_other_go_as_one_call_and_each_is_answered() {
    let mut rig = Rig::new(64, true);
    let mut rq = req_queue(&rig, limits());
    let disk = MemDisk::new(64);
    let c = counters();
    let w: Vec<u64> = (0..8).map(|i| write(&mut rig, i, &sector(i))).collect();
    let o = pass(&mut rig, &mut rq, &disk, &c);
    assert_eq!((o.handled, o.fault), (8, None));
    assert_eq!(disk.calls.get(), 1, "eight writes, one call");
    let r: Vec<u64> = (0..8).map(|i| read(&mut rig, i, 1)).collect();
    let o = pass(&mut rig, &mut rq, &disk, &c);
    assert_eq!((o.handled, o.fault), (8, None));
    assert_eq!(disk.calls.get(), 2, "eight reads, one call");
    assert!(w.iter().chain(&r).all(|&k| rig.status_of(k) == 0));
    for (i, &k) in r.iter().enumerate() {
        assert_eq!(read_back(&rig, k, S as usize), sector(i as u64), "read {i}");
    }
    let lens: Vec<u32> = used(&mut rig).into_iter().map(|(_, l)| l).collect();
    assert_eq!(lens, [vec![1; 8], vec![S as u32 + 1; 8]].concat());
    let counts = c.1.counts();
    assert_eq!(counts.requests(BlkRequestKind::Write), 8);
    assert_eq!(counts.requests(BlkRequestKind::Read), 8);
    assert_eq!((counts.read, counts.written), (8 * S, 8 * S));
    assert_eq!(counts.service[BlkRequestKind::Read.index()].count(), 8);
    assert_eq!(c.0.packets.get(), 16);
    assert_eq!(
        counts.merged, 14,
        "seven of each joined the call before them"
    );
}

#[test]
fn gaps_turns_and_other_types_break_a_batch() {
    let mut rig = Rig::new(64, false);
    let mut rq = req_queue(&rig, limits());
    let disk = MemDisk::new(64);
    let c = counters();
    // A gap: sectors 0 and 2.
    write(&mut rig, 0, &sector(0));
    write(&mut rig, 2, &sector(2));
    // A turn: a read of sector 3 after the write of 2 ends at 3.
    read(&mut rig, 3, 1);
    // A flush between two reads that follow each other.
    read(&mut rig, 4, 1);
    rig.add(&Req {
        ty: VIRTIO_BLK_T_FLUSH,
        sector: 0,
        out: &[],
        in_len: 0,
    });
    read(&mut rig, 5, 1);
    // Backwards: sector 5 again (it does not start where the batch ends).
    read(&mut rig, 5, 1);
    let o = pass(&mut rig, &mut rq, &disk, &c);
    assert_eq!((o.handled, o.fault), (7, None));
    assert_eq!(disk.calls.get(), 5, "only the reads of 3 and 4 are merged");
    assert_eq!(c.1.counts().merged, 1);
    assert_eq!(disk.syncs.get(), 1);
    let heads: Vec<u16> = used(&mut rig).into_iter().map(|(h, _)| h).collect();
    let mut sorted = heads.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), 7, "each given back once: {heads:?}");
}

#[test]
fn a_batch_holds_at_most_merge_max_requests() {
    let n = MERGE_MAX as u64 + 8;
    let mut rig = Rig::new(256, false);
    let mut rq = req_queue(&rig, limits());
    let disk = MemDisk::new(n);
    let c = counters();
    for i in 0..n {
        read(&mut rig, i, 1);
    }
    let o = pass(&mut rig, &mut rq, &disk, &c);
    assert_eq!((o.handled, o.fault), (n, None));
    assert_eq!(disk.calls.get(), 2);
    assert_eq!(c.1.counts().merged, n - 2);
}

#[test]
fn a_failed_merged_call_is_retried_alone_and_only_the_bad_request_fails() {
    let mut rig = Rig::new(64, true);
    let mut rq = req_queue(&rig, limits());
    let disk = MemDisk::new(64);
    let c = counters();
    for i in 0..4 {
        disk.bytes.borrow_mut()[(i * S) as usize..((i + 1) * S) as usize]
            .copy_from_slice(&sector(i));
    }
    disk.bad.set(Some((2 * S, 2 * S + 1)));
    let r: Vec<u64> = (0..4).map(|i| read(&mut rig, i, 1)).collect();
    let o = pass(&mut rig, &mut rq, &disk, &c);
    assert_eq!((o.handled, o.fault), (4, None));
    assert_eq!(disk.calls.get(), 5, "the merged call, then one per request");
    let status: Vec<u8> = r.iter().map(|&k| rig.status_of(k)).collect();
    assert_eq!(status, [0, 0, VIRTIO_BLK_S_IOERR as u8, 0]);
    for i in [0, 1, 3] {
        assert_eq!(read_back(&rig, r[i], S as usize), sector(i as u64));
    }
    assert!(o.reasons().any(|w| w == Why::Io));
    let lens: Vec<u32> = used(&mut rig).into_iter().map(|(_, l)| l).collect();
    assert_eq!(lens, [S as u32 + 1, S as u32 + 1, 1, S as u32 + 1]);
    assert_eq!(c.1.counts().read, 3 * S, "the failed read moved nothing");
    assert_eq!(c.1.counts().merged, 0, "each went alone in the end");
}

#[test]
fn short_transfers_go_on_across_the_requests_of_a_batch() {
    let mut rig = Rig::new(64, false);
    let mut rq = req_queue(&rig, limits());
    let disk = MemDisk::new(64);
    disk.chunk.set(Some(700));
    let c = counters();
    // Two sectors per request, so the 700-byte pieces cross buffers and requests.
    let data: Vec<Vec<u8>> = (0..6)
        .map(|i| [sector(2 * i), sector(2 * i + 1)].concat())
        .collect();
    for (i, d) in data.iter().enumerate() {
        write(&mut rig, 2 * i as u64, d);
    }
    let r: Vec<u64> = (0..6).map(|i| read(&mut rig, 2 * i, 2)).collect();
    let o = pass(&mut rig, &mut rq, &disk, &c);
    assert_eq!((o.handled, o.fault), (12, None));
    for (i, &k) in r.iter().enumerate() {
        assert_eq!(rig.status_of(k), 0);
        assert_eq!(read_back(&rig, k, 2 * S as usize), data[i], "request {i}");
    }
}

#[test]
fn write_through_makes_a_batch_durable_before_it_is_answered() {
    let mut rig = Rig::new(64, false);
    let mut l = limits();
    l.writeback = false;
    let mut rq = req_queue(&rig, l);
    let disk = MemDisk::new(64);
    let c = counters();
    for i in 0..4 {
        write(&mut rig, i, &sector(i));
    }
    let o = pass(&mut rig, &mut rq, &disk, &c);
    assert_eq!(o.handled, 4);
    assert_eq!((disk.calls.get(), disk.syncs.get()), (1, 1));
    assert_eq!(
        disk.unsynced.get(),
        0,
        "nothing answered before it was durable"
    );
}

#[test]
fn an_abandoned_pass_answers_nothing_it_held() {
    let mut rig = Rig::new(64, false);
    let mut rq = req_queue(&rig, limits());
    let disk = MemDisk::new(64);
    let c = counters();
    let r: Vec<u64> = (0..4).map(|i| read(&mut rig, i, 1)).collect();
    // The reset comes after three requests are taken.
    let asked = Cell::new(0);
    let o = req_pass(&mut rq, &rig.mem, &disk, &c.0, &c.1, || {
        asked.set(asked.get() + 1);
        asked.get() <= 3
    });
    assert!(o.abandoned);
    assert_eq!((o.handled, disk.calls.get()), (0, 0));
    assert!(r.iter().all(|&k| rig.status_of(k) == 0xff), "not answered");
    assert!(used(&mut rig).is_empty());
}

#[test]
fn a_held_pass_leaves_the_driver_quiet_and_the_next_pass_turns_its_kicks_on() {
    for event_idx in [true, false] {
        let mut rig = Rig::new(64, event_idx);
        let mut rq = req_queue(&rig, limits());
        let disk = MemDisk::new(64);
        let c = counters();
        read(&mut rig, 0, 1);
        assert_eq!(rig.kicks, 1, "the first request is kicked");
        // Polling: the pass empties the ring and leaves notifications off.
        rq.hold = true;
        assert_eq!(pass(&mut rig, &mut rq, &disk, &c).handled, 1);
        read(&mut rig, 1, 1);
        assert_eq!(
            rig.kicks, 1,
            "no kick while the thread polls (event_idx {event_idx})"
        );
        assert!(rq.dq.has_available().unwrap(), "the poller sees it");
        assert_eq!(pass(&mut rig, &mut rq, &disk, &c).handled, 1);
        assert!(!rq.dq.has_available().unwrap());
        // The polling ends: a pass without the hold turns notifications on.
        rq.hold = false;
        assert_eq!(pass(&mut rig, &mut rq, &disk, &c).handled, 0);
        read(&mut rig, 2, 1);
        assert_eq!(rig.kicks, 2, "kicked again (event_idx {event_idx})");
        assert_eq!(pass(&mut rig, &mut rq, &disk, &c).handled, 1);
        assert_eq!(used(&mut rig).len(), 3);
    }
}
