//! What every device's passes over its queues share: building a queue a thread serves from
//! the transport's registers, the interrupt decision at the end of a pass, and carrying it
//! out (the interrupt raised, or counted as suppressed).
//!
//! Data flow: at each activation a device thread calls [`device_queue`] for each queue it
//! serves (checked against guest memory, EVENT_IDX as negotiated); a pass over a queue ends
//! with [`end_pass`], whose [`Irq`] the thread hands to [`signal`] (the fuzzer's models look
//! at the `Irq` themselves). Used by `net` and `blk` alike, so both follow one discipline.

use std::sync::Arc;

use virtio_bindings::bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use vm_memory::GuestMemoryMmap;

use super::counters::QueueCounters;
use super::queue::DeviceQueue;
use super::status::Violation;
use super::VirtioShared;

/// Queue `index` (None: a queue this thread does not serve) as the driver set it up, served
/// with the notification discipline; `Ok(None)` when the driver did not enable it, `Err` when
/// it set it up wrongly (NEEDS_RESET).
pub fn device_queue(
    virtio: &VirtioShared,
    index: Option<usize>,
    mem: &Arc<GuestMemoryMmap>,
) -> Result<Option<DeviceQueue>, Violation> {
    let Some(index) = index else {
        return Ok(None);
    };
    let event_idx = virtio.has_feature(VIRTIO_RING_F_EVENT_IDX);
    match (virtio.queue(index), virtio.max_size(index)) {
        (Some(regs), Some(max)) => match regs.to_queue(max, event_idx, mem)? {
            Some(q) => DeviceQueue::new(q, mem)
                .map(Some)
                .map_err(|_| Violation::BadQueue),
            None => Ok(None),
        },
        _ => Ok(None),
    }
}

/// The interrupt decision at the end of a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Irq {
    /// The pass added no used entry.
    None,
    /// The driver wants an interrupt for what the pass gave back.
    Wanted,
    /// The driver asked not to be interrupted for it.
    Suppressed,
}

/// The interrupt decision for the used entries `dq` added since the last one: every used
/// entry counts, a zero-length one included.
pub fn end_pass(dq: &mut DeviceQueue) -> Irq {
    if dq.unsignalled() == 0 {
        Irq::None
    } else if dq.needs_interrupt() {
        Irq::Wanted
    } else {
        Irq::Suppressed
    }
}

/// Carries out `irq` for the queue counted by `c`: raises the used-buffer interrupt when the
/// driver wants one (counted as raised when the guest has an interrupt line), or counts it as
/// suppressed.
pub fn signal(virtio: &VirtioShared, irq: Irq, c: &QueueCounters) {
    match irq {
        Irq::None => {}
        Irq::Wanted => c.interrupt(virtio.signal_used()),
        Irq::Suppressed => c.interrupt(false),
    }
}
