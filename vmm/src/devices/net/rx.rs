//! The receive side of a queue pair: frames from the tap into the guest's receive chains,
//! read straight into guest memory.
//!
//! Data flow: the queue pair's thread calls [`RxQueue::receive`] while the tap is readable.
//! The queue first holds enough of the guest's chains for the largest frame the tap may give
//! ([`RxParams::max_frame`]: 64 KiB and the header with guest GSO, otherwise the MTU, the
//! Ethernet header, a VLAN tag and the header), popped with the notification discipline of
//! [`DeviceQueue::pop`] and kept, in order, as `iovec`s over guest memory. One `readv` then
//! puts the frame (its 12-byte virtio header first) into them: into one chain, or with
//! mergeable buffers (`VIRTIO_NET_F_MRG_RXBUF`) into as many as it fills, each filled before
//! the next, as Linux posts them; the device writes `num_buffers` and gives those chains back.
//! The chains the frame did not reach stay held for the next frame. No host buffer, no copy.
//! Where each held chain takes the largest frame alone, [`RxQueue::receive_batch`] reads up to
//! [`RX_BATCH`] frames with one [`FrameSource::read_frames`] call (one io_uring_enter on the
//! tap), one read a chain; a read that found nothing while a later one found a frame leaves
//! its chain held, and the frame's chain is given back ahead of it.
//!
//! When the guest has made too few buffers available for the largest frame (a burst that
//! outran the driver's refill), the read goes into the chains held and, past them, into a host
//! buffer: a frame that fits the chains is still read straight into them (the common case for
//! small frames); one that goes on into the host buffer waits there, its head in the chains,
//! until the guest adds buffers, and its tail is then copied in (`copied`). Meanwhile
//! notifications are on and the thread stops reading the tap until the guest's kick (the tap
//! holds what comes meanwhile): frames wait, they are not dropped. Dropped and counted: a frame
//! longer than the largest one the device takes (the buffers offered hold one byte more than
//! that, so a read that reaches past it was cut), one over the MTU without GSO, and one that
//! cannot fit even if every buffer the guest can post were held.
//! Chains are untrusted input ([`crate::devices::virtio::chain`]); every loop is bounded by the
//! queue's size and by [`IOV_MAX`] buffers; nothing allocates per frame.

use std::collections::VecDeque;
use std::io;
use std::ops::Range;

use ppa_vmm_api::DropReason;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::tap::VNET_HDR_LEN;
use crate::devices::virtio::chain::{Direction, Segment, Segments};
use crate::devices::virtio::queue::{DeviceQueue, QueueFault};

/// The most buffers one `readv` takes (Linux's UIO_MAXIOV).
pub const IOV_MAX: usize = 1024;
/// The largest frame a tap gives with GSO, its virtio header included (Firecracker's
/// `MAX_BUFFER_SIZE`): 64 KiB of IP packet, the Ethernet header, a VLAN tag, the header.
pub const MAX_GSO_FRAME: usize = 65_562;
/// The Ethernet header and one VLAN tag, on top of the MTU.
pub const ETH_OVERHEAD: usize = 14 + 4;
/// Frames one batched receive ([`RxQueue::receive_batch`]) reads at most.
pub const RX_BATCH: usize = crate::devices::uring::DEPTH as usize;
/// Offset of `num_buffers` in the header.
const NUM_BUFFERS_AT: u64 = 10;
/// Offset of `gso_type` in the header.
const GSO_TYPE_AT: usize = 1;

/// Where received frames come from (the tap; a socket pair or a script in tests).
pub trait FrameSource {
    /// Reads one frame (virtio header first) scattered over `iov`. Returns the bytes read; a
    /// frame longer than the buffers is cut to them (as a tap does; the rest is lost), so a
    /// read that fills every buffer may have been cut; `WouldBlock` when no frame waits.
    ///
    /// # Safety
    /// Every `iovec` must describe memory valid for writes of its length for the call.
    unsafe fn read_frame(&self, iov: &[libc::iovec]) -> io::Result<usize>;

    /// Reads one frame into `iov[spans[i]]` for each span, in order, and pushes each read's
    /// result to `out`. By default one [`Self::read_frame`] each, stopping after the first that
    /// fails (nothing waits, or the tap failed); the tap's worker batches them into one system
    /// call ([`super::tap::ring::TapRing`]), which answers every span, so a read that found
    /// nothing may come before one that found a frame that came meanwhile.
    ///
    /// # Safety
    /// Every `iovec` in `iov` must describe memory valid for writes of its length during the
    /// call.
    unsafe fn read_frames(
        &self,
        iov: &[libc::iovec],
        spans: &[Range<usize>],
        out: &mut Vec<io::Result<usize>>,
    ) {
        for span in spans {
            // SAFETY: forwarded from this function's contract; `span` is inside `iov`.
            let r = unsafe { self.read_frame(&iov[span.clone()]) };
            let stop = r.is_err();
            out.push(r);
            if stop {
                break;
            }
        }
    }
}

impl FrameSource for super::tap::Tap {
    unsafe fn read_frame(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.readv(iov) }
    }
}

/// What the driver negotiated that shapes receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxParams {
    /// `VIRTIO_NET_F_MRG_RXBUF`.
    pub mergeable: bool,
    /// The tap may give GSO frames (a guest TSO or UFO feature).
    pub gso: bool,
    /// The device's MTU.
    pub mtu: u16,
}

impl RxParams {
    /// The largest frame the tap may give, header included.
    pub fn max_frame(&self) -> usize {
        if self.gso {
            MAX_GSO_FRAME
        } else {
            VNET_HDR_LEN + ETH_OVERHEAD + usize::from(self.mtu)
        }
    }

    /// Whether a frame of `len` bytes (header included) whose header says `gso_type` is over
    /// the MTU.
    pub fn over_mtu(&self, len: usize, gso_type: u8) -> bool {
        gso_type == 0 && len > VNET_HDR_LEN + ETH_OVERHEAD + usize::from(self.mtu)
    }
}

/// What one call of [`RxQueue::receive`] did.
#[derive(Debug)]
pub enum Step {
    /// A frame of `bytes` (header included) is in the guest, in `chains` chains; `copied`
    /// when it went through the host buffer.
    Delivered {
        /// Chains it filled.
        chains: u16,
        /// Its length with the header.
        bytes: usize,
        /// Whether it was copied from the host buffer.
        copied: bool,
    },
    /// A frame was dropped; the chains it was read into stay with the device.
    Dropped(DropReason),
    /// No frame waits at the tap.
    Idle,
    /// The guest has no room for the frame (held in the host buffer, if one was read);
    /// notifications are on: wait for its kick.
    NoRoom,
    /// The tap failed.
    TapFailed(io::Error),
    /// The driver broke the queue; the device needs a reset.
    Fault(QueueFault),
}

/// A chain popped and not yet given back.
#[derive(Debug, Clone, Copy)]
struct Held {
    head: u16,
    bytes: u32,
    bufs: u16,
}

/// The chains held for the next frames, their buffers as `iovec`s in one window.
#[derive(Debug)]
struct Window {
    chains: VecDeque<Held>,
    iov: Vec<libc::iovec>,
    segs: Vec<Segment>,
    start: usize,
    bytes: u64,
    /// The shortest prefix of `chains` holding `max_frame` bytes (or all of them): chains,
    /// buffers, bytes.
    cover: (usize, usize, u64),
}

impl Window {
    fn new(chains: usize) -> Self {
        let cap = IOV_MAX + chains;
        Window {
            chains: VecDeque::with_capacity(chains),
            iov: Vec::with_capacity(cap),
            segs: Vec::with_capacity(cap),
            start: 0,
            bytes: 0,
            cover: (0, 0, 0),
        }
    }

    fn buffers(&self) -> usize {
        self.iov.len() - self.start
    }

    /// Adds a chain at the back (its buffers checked by `Segments::load`); false when the
    /// window has no room for its buffers.
    fn push(&mut self, segs: &Segments, max_frame: u64) -> bool {
        let list = segs.list();
        // One read takes IOV_MAX buffers: the held chains' and the host buffer.
        if self.buffers() + list.len() >= IOV_MAX || self.chains.len() == self.chains.capacity() {
            return false;
        }
        if self.iov.len() + list.len() > self.iov.capacity() {
            // Move the live part to the front (bounded: at most IOV_MAX entries).
            self.iov.copy_within(self.start.., 0);
            self.segs.copy_within(self.start.., 0);
            let live = self.iov.len() - self.start;
            self.iov.truncate(live);
            self.segs.truncate(live);
            self.start = 0;
        }
        for s in list {
            // Each buffer was checked against guest memory when its chain was loaded.
            self.iov.push(s.iovec());
            self.segs.push(*s);
        }
        let held = Held {
            head: segs.head(),
            bytes: segs.total().min(u64::from(u32::MAX)) as u32,
            bufs: list.len() as u16,
        };
        self.chains.push_back(held);
        self.bytes += u64::from(held.bytes);
        if self.cover.0 + 1 == self.chains.len() && self.cover.2 < max_frame {
            self.cover = (
                self.cover.0 + 1,
                self.cover.1 + list.len(),
                self.cover.2 + u64::from(held.bytes),
            );
        }
        true
    }

    /// Drops `k` chains from the front (given back to the guest) and extends the cover.
    fn consume(&mut self, k: usize, max_frame: u64) {
        let (mut bufs, mut bytes) = (0, 0);
        for _ in 0..k {
            let Some(c) = self.chains.pop_front() else {
                break;
            };
            bufs += usize::from(c.bufs);
            bytes += u64::from(c.bytes);
        }
        self.start += bufs;
        self.bytes -= bytes;
        self.cover = if k < self.cover.0 {
            (self.cover.0 - k, self.cover.1 - bufs, self.cover.2 - bytes)
        } else {
            (0, 0, 0)
        };
        self.extend_cover(max_frame);
    }

    /// Drops the chain at `pos` (given back to the guest ahead of those before it, which stay
    /// held) and computes the cover again. Moves at most the window's buffers.
    fn take(&mut self, pos: usize, max_frame: u64) {
        let from = self.start + self.bufs_before(pos);
        let Some(c) = self.chains.remove(pos) else {
            return;
        };
        let to = from + usize::from(c.bufs);
        self.iov.drain(from..to);
        self.segs.drain(from..to);
        self.bytes -= u64::from(c.bytes);
        self.cover = (0, 0, 0);
        self.extend_cover(max_frame);
    }

    /// Buffers of the chains before `pos`.
    fn bufs_before(&self, pos: usize) -> usize {
        self.chains
            .iter()
            .take(pos)
            .map(|c| usize::from(c.bufs))
            .sum()
    }

    /// The buffers of the chain at `pos`.
    fn segs_of(&self, pos: usize) -> &[Segment] {
        let from = self.start + self.bufs_before(pos);
        let n = self.chains.get(pos).map_or(0, |c| usize::from(c.bufs));
        &self.segs[from..from + n]
    }

    /// Extends the cover over the chains after it until it holds `max_frame` bytes.
    fn extend_cover(&mut self, max_frame: u64) {
        while self.cover.2 < max_frame {
            let Some(c) = self.chains.get(self.cover.0) else {
                break;
            };
            self.cover = (
                self.cover.0 + 1,
                self.cover.1 + usize::from(c.bufs),
                self.cover.2 + u64::from(c.bytes),
            );
        }
    }

    /// The buffers of the first chain held.
    fn first(&self) -> &[Segment] {
        let n = self.chains.front().map_or(0, |c| usize::from(c.bufs));
        &self.segs[self.start..self.start + n]
    }
}

/// A receive queue, the chains it holds and its host buffer (made once per activation;
/// nothing allocates per frame).
#[derive(Debug)]
pub struct RxQueue {
    /// The queue.
    pub dq: DeviceQueue,
    p: RxParams,
    held: Window,
    load: Segments,
    bounce: Vec<u8>,
    /// A frame whose tail waits in `bounce` for room.
    pending: Option<Pending>,
    /// The iovecs of one read (the held chains' and the host buffer's).
    iov: Vec<libc::iovec>,
    /// The window refused a chain (it holds as many buffers as one read takes).
    window_full: bool,
    used: Vec<(u16, u32)>,
    /// A batch's reads: each one chain's buffers in the window's `iov`.
    spans: Vec<Range<usize>>,
    results: Vec<io::Result<usize>>,
}

/// Writes `bytes` at `offset` of the chain whose buffers are `segs` (across buffers).
fn write_in(mem: &GuestMemoryMmap, segs: &[Segment], offset: u64, bytes: &[u8]) {
    if let Some(s) = segs.first() {
        if bytes.len() <= 16 && offset + bytes.len() as u64 <= u64::from(s.len) {
            // The common case, a header field in the first buffer: through its mapping, found
            // when the chain was checked, without looking the address up again.
            // SAFETY: `s.host` maps the whole buffer (`s.len` bytes) in guest memory, which
            // stays mapped for the VM's life; the bytes written lie inside it. Volatile: the
            // guest may touch the same memory.
            unsafe {
                let dst = (s.host as *mut u8).add(offset as usize);
                for (i, b) in bytes.iter().enumerate() {
                    std::ptr::write_volatile(dst.add(i), *b);
                }
            }
            return;
        }
    }
    let (mut skip, mut done) = (offset, 0);
    for s in segs {
        if done == bytes.len() {
            break;
        }
        let len = u64::from(s.len);
        if skip >= len {
            skip -= len;
            continue;
        }
        let n = ((len - skip) as usize).min(bytes.len() - done);
        let _ = mem.write_slice(&bytes[done..done + n], GuestAddress(s.addr + skip));
        done += n;
        skip = 0;
    }
}

/// Reads the byte at `offset` of the chain whose buffers are `segs`.
fn byte_in(mem: &GuestMemoryMmap, segs: &[Segment], offset: u64) -> u8 {
    let mut skip = offset;
    for (k, s) in segs.iter().enumerate() {
        let len = u64::from(s.len);
        if skip < len {
            if k == 0 {
                // SAFETY: `s.host` maps the whole buffer in guest memory, mapped for the VM's
                // life, and `skip` is inside it. Volatile: the guest may touch it.
                return unsafe {
                    std::ptr::read_volatile((s.host as *const u8).add(skip as usize))
                };
            }
            return mem.read_obj(GuestAddress(s.addr + skip)).unwrap_or(0);
        }
        skip -= len;
    }
    0
}

impl RxQueue {
    /// `dq`, served as `p` says.
    pub fn new(dq: DeviceQueue, p: RxParams) -> Self {
        let n = usize::from(dq.size());
        RxQueue {
            dq,
            p,
            held: Window::new(n),
            load: Segments::with_capacity(n),
            bounce: vec![0; MAX_GSO_FRAME + 1],
            pending: None,
            iov: Vec::with_capacity(IOV_MAX),
            window_full: false,
            used: Vec::with_capacity(n),
            spans: Vec::with_capacity(RX_BATCH),
            results: Vec::with_capacity(RX_BATCH),
        }
    }

    /// Whether a frame waits in the host buffer (lost if the device resets now).
    pub fn has_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Chains held for the next frames.
    pub fn held_chains(&self) -> usize {
        self.held.chains.len()
    }

    /// Bytes the held chains must take to read a frame straight into them: one more than the
    /// largest frame, since a tap cuts a longer frame to the buffers and returns only what it
    /// copied (`tun_chr_read_iter` clamps the length: measured here, a 1,012-byte frame read
    /// into 200 bytes returns 200), so a read that fills them all was too long.
    fn need(&self) -> u64 {
        self.p.max_frame() as u64 + 1
    }

    /// Pops chains until the held ones take `want` bytes (mergeable) or one chain is held;
    /// stops when the ring is empty (notifications then on) or the window is full.
    fn fill(&mut self, mem: &GuestMemoryMmap, want: u64) -> Result<(), QueueFault> {
        let size = usize::from(self.dq.size());
        for _ in 0..size {
            let enough = if self.p.mergeable {
                self.held.bytes >= want
            } else {
                !self.held.chains.is_empty()
            };
            if enough || !self.hold_next(mem)? {
                break;
            }
        }
        Ok(())
    }

    /// Pops the next chain and holds it: false when the ring is empty (notifications then on)
    /// or the window has no room for it (it is put back).
    fn hold_next(&mut self, mem: &GuestMemoryMmap) -> Result<bool, QueueFault> {
        let Some(chain) = self.dq.pop(mem)? else {
            return Ok(false);
        };
        self.load
            .load(chain, mem, Direction::Write, VNET_HDR_LEN as u64)
            .map_err(QueueFault::Chain)?;
        if !self.held.push(&self.load, self.need()) {
            self.dq.unpop(1);
            self.window_full = true;
            return Ok(false);
        }
        Ok(true)
    }

    /// Whether the device holds as much as the guest can ever give it: every entry of the
    /// ring, or as many buffers as one read takes.
    fn held_everything(&self) -> bool {
        self.held.chains.len() >= usize::from(self.dq.size()) || self.window_full
    }

    /// Takes the next frame from `src` into the guest.
    pub fn receive(&mut self, mem: &GuestMemoryMmap, src: &impl FrameSource) -> Step {
        if let Some(p) = self.pending {
            return self.place_tail(mem, p);
        }
        if let Err(f) = self.fill(mem, self.need()) {
            return Step::Fault(f);
        }
        if self.held.chains.is_empty() {
            // The ring is empty and notifications are on: the guest's next buffers kick.
            return Step::NoRoom;
        }
        // The frame goes into the held chains (all that take it without mergeable buffers:
        // the first), and what does not fit there into the host buffer, so that the buffers
        // offered always hold one byte more than the largest frame.
        let (chains, bufs, cap) = if self.p.mergeable {
            self.held.cover
        } else {
            let c = self.held.chains[0];
            (1, usize::from(c.bufs), u64::from(c.bytes))
        };
        let spill = self.need().saturating_sub(cap) as usize;
        let r = self.held.start..self.held.start + bufs;
        let n = {
            let iov = &mut self.iov;
            iov.clear();
            iov.extend_from_slice(&self.held.iov[r]);
            if spill > 0 {
                iov.push(libc::iovec {
                    iov_base: self.bounce.as_mut_ptr().cast(),
                    iov_len: spill.min(self.bounce.len()),
                });
            }
            // SAFETY: each held iovec points into guest memory that `mem` maps for the VM's
            // life (checked when its chain was loaded; the regions never change), given to the
            // device by the driver to write; the last one, when there, covers `bounce`, which
            // lives and is not otherwise borrowed for the call.
            match unsafe { src.read_frame(iov) } {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Idle,
                Err(e) => return Step::TapFailed(e),
            }
        };
        let gso = byte_in(mem, self.held.first(), GSO_TYPE_AT as u64);
        if let Some(why) = self.dropped(n, gso) {
            return Step::Dropped(why);
        }
        if n as u64 <= cap {
            return self.commit(mem, n, None);
        }
        if !self.p.mergeable {
            // A chain without mergeable buffers holds one frame: this one never fits.
            return Step::Dropped(DropReason::OversizedFrame);
        }
        // The frame fills the held chains and goes on in the host buffer: it waits there for
        // more chains.
        let p = Pending {
            len: n,
            in_chains: cap as usize,
            chains,
        };
        self.pending = Some(p);
        self.place_tail(mem, p)
    }

    /// Puts the tail of the pending frame (in the host buffer) into chains after those its
    /// head fills, popping more as it needs.
    fn place_tail(&mut self, mem: &GuestMemoryMmap, p: Pending) -> Step {
        if let Err(f) = self.fill(mem, p.len as u64) {
            return Step::Fault(f);
        }
        if self.held.bytes < p.len as u64 {
            if self.held_everything() {
                // Every buffer the guest can post is held and the frame is larger still:
                // waiting would stop receive for good.
                self.pending = None;
                return Step::Dropped(DropReason::OversizedFrame);
            }
            return Step::NoRoom;
        }
        self.pending = None;
        debug_assert!(self.held.chains.len() >= p.chains);
        self.commit(mem, p.len, Some(p.in_chains))
    }

    /// Takes up to `max` frames from `src` with one [`FrameSource::read_frames`] call, each read
    /// into one held chain that alone takes the largest frame (so no frame needs the host
    /// buffer or a second chain), and hands each frame's step (delivered or dropped) to `each`.
    /// Returns how many frames it handled and, when it stopped for a reason the caller must act
    /// on, that step (`Idle` when its last read found nothing, `TapFailed`, `Fault`). None when
    /// it does not apply (a frame waits in the host buffer, or fewer than two such chains are
    /// held or available): [`Self::receive`] takes the next frame.
    ///
    /// A read that found nothing may come before one that found a frame that arrived
    /// meanwhile: that frame's chain is given back ahead of the empty one, which stays held,
    /// as does the chain of a frame dropped. Frames reach the guest in the tap's order.
    pub fn receive_batch(
        &mut self,
        mem: &GuestMemoryMmap,
        src: &impl FrameSource,
        max: usize,
        mut each: impl FnMut(Step),
    ) -> Option<(usize, Option<Step>)> {
        if self.pending.is_some() || max < 2 {
            return None;
        }
        let want = max.min(RX_BATCH);
        if let Err(f) = self.fill_chains(mem, want) {
            return Some((0, Some(Step::Fault(f))));
        }
        let need = self.need();
        let k = self
            .held
            .chains
            .iter()
            .take(want)
            .take_while(|c| u64::from(c.bytes) >= need)
            .count();
        if k < 2 {
            return None;
        }
        self.spans.clear();
        let mut at = self.held.start;
        for c in self.held.chains.iter().take(k) {
            let n = usize::from(c.bufs);
            self.spans.push(at..at + n);
            at += n;
        }
        let mut results = std::mem::take(&mut self.results);
        results.clear();
        // SAFETY: each held iovec points into guest memory that `mem` maps for the VM's life
        // (checked when its chain was loaded; the regions never change), given to the device
        // by the driver to write; the spans lie inside the window's list.
        unsafe { src.read_frames(&self.held.iov, &self.spans, &mut results) };
        let (mut kept, mut frames, mut end, mut idle) = (0, 0, None, false);
        for r in results.drain(..) {
            let n = match r {
                Ok(n) => n,
                Err(e) => {
                    if e.kind() == io::ErrorKind::WouldBlock {
                        idle = true;
                    } else if end.is_none() {
                        end = Some(Step::TapFailed(e));
                    }
                    kept += 1;
                    continue;
                }
            };
            idle = false;
            frames += 1;
            let segs = self.held.segs_of(kept);
            if let Some(why) = self.dropped(n, byte_in(mem, segs, GSO_TYPE_AT as u64)) {
                kept += 1;
                each(Step::Dropped(why));
                continue;
            }
            write_in(mem, segs, NUM_BUFFERS_AT, &1u16.to_le_bytes());
            let head = self.held.chains[kept].head;
            if let Err(f) = self.dq.add_used(head, n as u32) {
                end = Some(Step::Fault(f));
                idle = false;
                break;
            }
            if kept == 0 {
                self.held.consume(1, need);
            } else {
                self.held.take(kept, need);
            }
            self.window_full = false;
            each(Step::Delivered {
                chains: 1,
                bytes: n,
                copied: false,
            });
        }
        self.results = results;
        if end.is_none() && idle {
            end = Some(Step::Idle);
        }
        Some((frames, end))
    }

    /// Why a frame of `n` bytes (header included) read into chains that take the largest
    /// frame and one byte more, whose header says `gso_type`, is dropped, if it is.
    fn dropped(&self, n: usize, gso_type: u8) -> Option<DropReason> {
        if n < VNET_HDR_LEN {
            Some(DropReason::TapError)
        } else if self.p.over_mtu(n, gso_type) {
            Some(DropReason::OverMtu)
        } else if n > self.p.max_frame() {
            // The buffers hold one byte more than the largest frame: one that reaches past it
            // was longer (and cut there).
            Some(DropReason::OversizedFrame)
        } else {
            None
        }
    }

    /// Pops chains until `want` are held; stops when the ring is empty (notifications then on)
    /// or the window is full.
    fn fill_chains(&mut self, mem: &GuestMemoryMmap, want: usize) -> Result<(), QueueFault> {
        while self.held.chains.len() < want && self.hold_next(mem)? {}
        Ok(())
    }

    /// Gives back the chains a frame of `len` bytes fills, with `num_buffers` written; with
    /// `tail`, the frame's bytes from that offset on are in the host buffer and are copied into
    /// the chains after those its head filled.
    fn commit(&mut self, mem: &GuestMemoryMmap, len: usize, tail: Option<usize>) -> Step {
        self.used.clear();
        let (mut left, mut from, mut buf) = (len as u64, 0usize, self.held.start);
        for c in self.held.chains.iter() {
            if left == 0 {
                break;
            }
            let take = left.min(u64::from(c.bytes));
            if let Some(t) = tail.filter(|&t| from >= t) {
                let segs = &self.held.segs[buf..buf + usize::from(c.bufs)];
                let src = &self.bounce[from - t..from - t + take as usize];
                write_in(mem, segs, 0, src);
            }
            self.used.push((c.head, take as u32));
            left -= take;
            from += take as usize;
            buf += usize::from(c.bufs);
            if !self.p.mergeable {
                break;
            }
        }
        let count = self.used.len() as u16;
        write_in(mem, self.held.first(), NUM_BUFFERS_AT, &count.to_le_bytes());
        if let Err(f) = self.dq.add_used_many(&self.used) {
            return Step::Fault(f);
        }
        self.held.consume(usize::from(count), self.need());
        self.window_full = false;
        Step::Delivered {
            chains: count,
            bytes: len,
            copied: tail.is_some(),
        }
    }
}

/// A frame whose head filled `chains` held chains (`in_chains` bytes) and whose tail waits in
/// the host buffer.
#[derive(Debug, Clone, Copy)]
struct Pending {
    len: usize,
    in_chains: usize,
    chains: usize,
}

#[cfg(test)]
mod tests;
