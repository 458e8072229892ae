//! The notification discipline against a model of Linux's driver: kicks re-armed whenever the
//! ring empties, interrupts exactly when the driver asks, a frame's used entries published
//! together.

use vm_memory::{GuestAddress, GuestMemoryMmap};

use super::*;
use crate::fuzzing::driver::{Buf, DriverRing};

fn mem() -> Arc<GuestMemoryMmap> {
    Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap())
}

/// The device's queue over the driver's rings.
fn device(d: &DriverRing, event_idx: bool, m: &Arc<GuestMemoryMmap>) -> DeviceQueue {
    let q = d.device_queue(m);
    assert_eq!(q.event_idx(), event_idx);
    q
}

fn buf(i: u64) -> [Buf; 1] {
    [Buf {
        addr: 0x8_0000 + i * 0x100,
        len: 64,
        write: true,
    }]
}

#[test]
fn with_event_idx_an_emptied_ring_asks_for_the_next_kick() {
    let m = mem();
    let mut d = DriverRing::new(&m, 0, 8, true);
    let mut q = device(&d, true, &m);
    for i in 0..3 {
        d.add(&m, &buf(i));
    }
    assert!(d.publish(&m), "the first publish kicks (avail_event 0)");
    q.quiet(&m).unwrap();
    let mut heads = Vec::new();
    while let Some(c) = q.pop(&m).unwrap() {
        heads.push(c.head_index());
    }
    assert_eq!(heads.len(), 3);
    // The ring ran dry: the device re-armed, so the driver's next buffer kicks. Without the
    // re-arm avail_event stays 0 and Linux never kicks again (the receive queue's bug).
    d.add(&m, &buf(3));
    assert!(
        d.publish(&m),
        "a kick for the buffer after the ring ran dry"
    );
    // While the device still has buffers to take it asks for nothing.
    d.add(&m, &buf(4));
    assert!(
        !d.publish(&m),
        "no kick while the device has not drained the ring"
    );
    assert!(q.pop(&m).unwrap().is_some());
    assert!(q.pop(&m).unwrap().is_some());
    assert!(q.pop(&m).unwrap().is_none());
    d.add(&m, &buf(5));
    assert!(d.publish(&m));
}

#[test]
fn without_event_idx_the_no_notify_flag_is_set_for_a_batch_and_cleared_when_dry() {
    let m = mem();
    let mut d = DriverRing::new(&m, 0, 8, false);
    let mut q = device(&d, false, &m);
    d.add(&m, &buf(0));
    assert!(d.publish(&m));
    q.quiet(&m).unwrap();
    d.add(&m, &buf(1));
    assert!(!d.publish(&m), "quiet: NO_NOTIFY set");
    assert!(q.pop(&m).unwrap().is_some());
    assert!(q.pop(&m).unwrap().is_some());
    assert!(q.pop(&m).unwrap().is_none());
    d.add(&m, &buf(2));
    assert!(d.publish(&m), "dry: NO_NOTIFY cleared");
}

#[test]
fn a_buffer_published_between_the_last_pop_and_the_re_arm_is_not_missed() {
    let m = mem();
    let mut d = DriverRing::new(&m, 0, 8, true);
    let mut q = device(&d, true, &m);
    d.add(&m, &buf(0));
    d.publish(&m);
    assert!(q.try_pop(&m).unwrap().is_some());
    // The driver publishes before the device looks again (its kick check saw a stale
    // avail_event); `pop` re-arms and then finds it.
    d.add(&m, &buf(1));
    assert!(!d.publish(&m));
    assert!(q.pop(&m).unwrap().is_some(), "found after the re-arm");
}

#[test]
fn interrupts_follow_used_event_and_no_interrupt_and_count_zero_length_entries() {
    let m = mem();
    // EVENT_IDX: the driver wants one at its used_event.
    let mut d = DriverRing::new(&m, 0, 8, true);
    let mut q = device(&d, true, &m);
    for i in 0..4 {
        d.add(&m, &buf(i));
    }
    d.publish(&m);
    assert!(d.enable_cb(&m));
    let h = q.pop(&m).unwrap().unwrap().head_index();
    assert!(!q.needs_interrupt(), "nothing added yet");
    q.add_used(h, 0).unwrap();
    assert!(
        q.needs_interrupt(),
        "a zero-length used entry is a used entry"
    );
    // Polling: the driver turned interrupts off.
    d.disable_cb(&m);
    let h = q.pop(&m).unwrap().unwrap().head_index();
    q.add_used(h, 10).unwrap();
    assert!(!q.needs_interrupt(), "used_event not passed");
    // Without EVENT_IDX, VRING_AVAIL_F_NO_INTERRUPT says the same.
    let mut d = DriverRing::new(&m, 0x4000, 8, false);
    let mut q = device(&d, false, &m);
    d.add(&m, &buf(0));
    d.add(&m, &buf(1));
    d.publish(&m);
    d.disable_cb(&m);
    let h = q.pop(&m).unwrap().unwrap().head_index();
    q.add_used(h, 10).unwrap();
    assert!(!q.needs_interrupt(), "NO_INTERRUPT honoured");
    d.enable_cb(&m);
    let h = q.pop(&m).unwrap().unwrap().head_index();
    q.add_used(h, 10).unwrap();
    assert!(q.needs_interrupt());
}

#[test]
fn several_used_entries_appear_together() {
    let m = mem();
    let mut d = DriverRing::new(&m, 0, 8, true);
    let mut q = device(&d, true, &m);
    for i in 0..3 {
        d.add(&m, &buf(i));
    }
    d.publish(&m);
    let heads: Vec<u16> = (0..3)
        .map(|_| q.pop(&m).unwrap().unwrap().head_index())
        .collect();
    let entries: Vec<(u16, u32)> = heads.iter().map(|&h| (h, 7)).collect();
    q.add_used_many(&entries).unwrap();
    assert_eq!(d.used_idx(&m), 3, "one move of the index");
    assert_eq!(q.unsignalled(), 3);
    for h in heads {
        assert_eq!(d.pop_used(&m), Some((h, 7)));
    }
    assert_eq!(
        q.add_used_many(&[(8, 1)]),
        Err(QueueFault::UsedRing),
        "a head past the queue"
    );
}

#[test]
fn an_available_index_too_far_ahead_is_a_fault_and_unpop_takes_chains_back() {
    let m = mem();
    let mut d = DriverRing::new(&m, 0, 8, true);
    let mut q = device(&d, true, &m);
    d.add(&m, &buf(0));
    d.add(&m, &buf(1));
    d.publish(&m);
    let a = q.pop(&m).unwrap().unwrap().head_index();
    q.pop(&m).unwrap().unwrap();
    q.unpop(1);
    assert_ne!(q.pop(&m).unwrap().unwrap().head_index(), a);
    let (_, avail, _) = d.addrs();
    vm_memory::Bytes::write_obj(&*m, 100u16, GuestAddress(avail + 2)).unwrap();
    assert_eq!(q.pop(&m).unwrap_err(), QueueFault::AvailIndex);
}
