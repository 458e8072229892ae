//! The transmit side of a queue pair: the guest's frames out to the tap, straight from guest
//! memory.
//!
//! Data flow: on a kick the queue pair's thread calls [`TxQueue::run`]: with the driver's
//! notifications off, it takes each available chain, checks it ([`Segments::load`]: readable
//! buffers, inside RAM, ending, at least the 12-byte header), gathers its buffers into an
//! `iovec` list and writes it to the tap with one `writev` (the header goes first, as the tap
//! expects with `IFF_VNET_HDR`), gives the chain back, and counts the frame or the drop and
//! its reason. Then it turns notifications back on and looks once more, as the virtio spec
//! asks, so that a frame made available meanwhile is not left behind.

use std::io;

use ppa_vmm_api::DropReason;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

use super::queues::QueueCounters;
use super::rx::{next_chain, QueueFault};
use super::tap::VNET_HDR_LEN;
use crate::devices::virtio::chain::{Direction, Segments};

/// The largest frame a transmit chain may carry after its header: a 64 KiB TSO frame.
pub const MAX_TX_FRAME: u64 = 65_535;

/// Where transmitted frames go (the tap; a socket pair in tests).
pub trait FrameSink {
    /// Writes one frame gathered from `iov`.
    ///
    /// # Safety
    /// Every `iovec` must describe memory valid for reads of its length during the call.
    unsafe fn write_frame(&self, iov: &[libc::iovec]) -> io::Result<usize>;
}

impl FrameSink for super::tap::Tap {
    unsafe fn write_frame(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.writev(iov) }
    }
}

/// Why the tap refused a frame, as a drop reason.
pub fn drop_reason(e: &io::Error) -> DropReason {
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::ENOBUFS) => DropReason::TapWouldBlock,
        Some(libc::EIO) | Some(libc::EBADFD) | Some(libc::ENODEV) | Some(libc::ENXIO) => {
            DropReason::TapDown
        }
        _ => DropReason::TapError,
    }
}

/// A transmit queue and its scratch (made once; nothing allocates per frame).
#[derive(Debug)]
pub struct TxQueue {
    /// The queue.
    pub q: Queue,
    segs: Segments,
    iov: Vec<libc::iovec>,
}

/// What a pass over the queue did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxPass {
    /// Chains given back.
    pub chains: u64,
    /// A fault that needs a reset, after which nothing more was taken.
    pub fault: Option<QueueFault>,
}

impl TxQueue {
    /// `q` with its scratch.
    pub fn new(q: Queue) -> Self {
        let n = usize::from(q.size());
        TxQueue {
            q,
            segs: Segments::with_capacity(n),
            iov: Vec::with_capacity(n),
        }
    }

    /// Sends every frame the driver made available; counts into `c`.
    pub fn run(
        &mut self,
        mem: &GuestMemoryMmap,
        sink: &impl FrameSink,
        c: &QueueCounters,
    ) -> TxPass {
        let mut pass = TxPass::default();
        // A driver that keeps adding frames keeps this loop going; bounded, the rest waits
        // for the next kick (notifications are on again before each return).
        for _ in 0..64 {
            let _ = self.q.disable_notification(mem);
            loop {
                let chain = match next_chain(&mut self.q, mem) {
                    Ok(Some(chain)) => chain,
                    Ok(None) => break,
                    Err(f) => {
                        pass.fault = Some(f);
                        return pass;
                    }
                };
                c.chains.add(1);
                if let Err(e) = self
                    .segs
                    .load(chain, mem, Direction::Read, VNET_HDR_LEN as u64)
                {
                    c.drop_one(DropReason::BadChain);
                    pass.fault = Some(QueueFault::Chain(e));
                    return pass;
                }
                self.send(mem, sink, c);
                if self.q.add_used(mem, self.segs.head(), 0).is_err() {
                    pass.fault = Some(QueueFault::UsedRing);
                    return pass;
                }
                pass.chains += 1;
            }
            // Notifications on again; if the driver added a frame meanwhile, go round once more.
            match self.q.enable_notification(mem) {
                Ok(true) => continue,
                _ => return pass,
            }
        }
        pass
    }

    fn send(&mut self, mem: &GuestMemoryMmap, sink: &impl FrameSink, c: &QueueCounters) {
        let frame = self.segs.total() - VNET_HDR_LEN as u64;
        if frame > MAX_TX_FRAME {
            c.drop_one(DropReason::OversizedFrame);
            return;
        }
        self.iov.clear();
        for s in self.segs.slices(mem) {
            self.iov.push(libc::iovec {
                iov_base: s.ptr_guard().as_ptr().cast_mut().cast(),
                iov_len: s.len(),
            });
        }
        // SAFETY: each iovec points into a guest memory region that `mem` keeps mapped for
        // the whole call (the slices were just made from it and `mem` outlives this call).
        let r = unsafe { sink.write_frame(&self.iov) };
        self.iov.clear();
        match r {
            Ok(_) => {
                c.packets.add(1);
                c.bytes.add(frame);
            }
            Err(e) => c.drop_one(drop_reason(&e)),
        }
    }
}

#[cfg(test)]
mod tests;
