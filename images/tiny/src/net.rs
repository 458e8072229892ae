//! A polled virtio-net driver (virtio 1.x over MMIO) and the network workloads `net-tx`,
//! `net-rx` and `net-echo`.
//!
//! Data flow: the VMM gives the device's MMIO window and a RAM area in the boot-info record.
//! [`Nic::init`] resets the device, accepts VERSION_1 and MAC only, and lays out two split
//! queues of [`QSIZE`] entries (receive 0, transmit 1) and their buffers in that area, with
//! `VRING_AVAIL_F_NO_INTERRUPT` set: there is no interrupt controller, the guest polls each
//! used ring. A frame to send goes into a transmit buffer, its descriptor into the available
//! ring, then a write of the queue's index to QueueNotify (an ioeventfd: no exit to the VMM
//! where the host honours it); the guest counts a frame sent when the device gives its
//! descriptor back. Receive buffers are all made available at the start and each is made
//! available again once read. Every frame is Ethernet with the local experimental EtherType
//! 0x88B5 (`ppa_guest_abi::NET_ETHERTYPE`), never IP. Each workload ends on its own clock
//! (a time limit), so a device that stops answering cannot hang the guest.

use core::ptr::{read_volatile, write_volatile};
use core::sync::atomic::{fence, Ordering};

use ppa_guest_abi::NET_ETHERTYPE;

use crate::{rdtsc, Clock};

/// Entries of each queue.
pub const QSIZE: u16 = 256;
/// Bytes of each buffer.
const BUF: u64 = 2048;
/// The virtio network header in front of every frame (virtio 1.x).
const HDR: u64 = 12;
/// Bytes the driver needs in its RAM area: rings at the start, then the buffers.
pub const RAM_NEEDED: u64 = 0x10_0000 + 2 * QSIZE as u64 * BUF;

// virtio-mmio registers (version 2).
const MAGIC: u64 = 0x000;
const VERSION: u64 = 0x004;
const DEVICE_ID: u64 = 0x008;
const DEVICE_FEATURES: u64 = 0x010;
const DEVICE_FEATURES_SEL: u64 = 0x014;
const DRIVER_FEATURES: u64 = 0x020;
const DRIVER_FEATURES_SEL: u64 = 0x024;
const QUEUE_SEL: u64 = 0x030;
const QUEUE_NUM_MAX: u64 = 0x034;
const QUEUE_NUM: u64 = 0x038;
const QUEUE_READY: u64 = 0x044;
const QUEUE_NOTIFY: u64 = 0x050;
const STATUS: u64 = 0x070;
const QUEUE_DESC: u64 = 0x080;
const QUEUE_AVAIL: u64 = 0x090;
const QUEUE_USED: u64 = 0x0a0;
const CONFIG: u64 = 0x100;

const S_ACK: u32 = 1;
const S_DRIVER: u32 = 2;
const S_DRIVER_OK: u32 = 4;
const S_FEATURES_OK: u32 = 8;
const F_MAC: u32 = 1 << 5;
const F_VERSION_1_HI: u32 = 1;
const DESC_F_WRITE: u16 = 2;
const AVAIL_F_NO_INTERRUPT: u16 = 1;
const USED_F_NO_NOTIFY: u16 = 1;

/// Why the driver could not start.
#[derive(Debug, Clone, Copy)]
pub enum InitError {
    /// No virtio-net device (or not version 2) at the window.
    NoDevice,
    /// The device did not accept the features.
    Features,
    /// A queue is missing or too small.
    Queue,
    /// The RAM area is missing or too small.
    Ram,
}

/// Writes `v` at `addr` (volatile: guest memory the device reads, or a register).
///
/// # Safety
/// `addr` must be an aligned address of mapped guest memory or of the device's window that
/// no Rust object occupies.
unsafe fn put<T>(addr: u64, v: T) {
    // SAFETY: the caller's contract.
    unsafe { write_volatile(addr as *mut T, v) }
}

/// Reads a `T` at `addr`.
///
/// # Safety
/// As [`put`].
unsafe fn get<T: Copy>(addr: u64) -> T {
    // SAFETY: the caller's contract.
    unsafe { read_volatile(addr as *const T) }
}

/// One split queue in the driver's RAM area.
struct Vq {
    index: u16,
    desc: u64,
    avail: u64,
    used: u64,
    /// The next available index to publish.
    next_avail: u16,
    /// The used index seen last.
    seen_used: u16,
    bufs: u64,
}

impl Vq {
    /// Descriptor `i` = buffer `i`, `len` bytes.
    fn set_desc(&self, i: u16, len: u32, flags: u16) {
        let d = self.desc + 16 * u64::from(i);
        // SAFETY: the descriptor table lies in the RAM area the VMM gave for the rings
        // (checked in `init`), identity-mapped; entries are 16-byte aligned.
        unsafe {
            put(d, self.buf(i));
            put(d + 8, len);
            put(d + 12, flags);
            put(d + 14, 0u16);
        }
    }

    fn buf(&self, i: u16) -> u64 {
        self.bufs + u64::from(i) * BUF
    }

    /// Makes descriptor `i` available (not yet published).
    fn push(&mut self, i: u16) {
        let slot = self.avail + 4 + 2 * u64::from(self.next_avail % QSIZE);
        // SAFETY: the available ring lies in the rings' RAM, 2-byte aligned.
        unsafe { put(slot, i) };
        self.next_avail = self.next_avail.wrapping_add(1);
    }

    /// Publishes what was pushed (release: the descriptors and buffers first).
    fn publish(&self) {
        fence(Ordering::Release);
        // SAFETY: the available ring's index, in the rings' RAM.
        unsafe { put(self.avail + 2, self.next_avail) };
        fence(Ordering::SeqCst);
    }

    /// Whether the device asked not to be notified.
    fn no_notify(&self) -> bool {
        // SAFETY: the used ring's flags, in the rings' RAM.
        unsafe { get::<u16>(self.used) & USED_F_NO_NOTIFY != 0 }
    }

    /// The next used element (descriptor id, length), if the device gave one back.
    fn pop_used(&mut self) -> Option<(u16, u32)> {
        // SAFETY: the used ring's index, in the rings' RAM.
        let idx: u16 = unsafe { get(self.used + 2) };
        if idx == self.seen_used {
            return None;
        }
        fence(Ordering::Acquire);
        let e = self.used + 4 + 8 * u64::from(self.seen_used % QSIZE);
        // SAFETY: a used element, in the rings' RAM, 4-byte aligned.
        let (id, len): (u32, u32) = unsafe { (get(e), get(e + 4)) };
        self.seen_used = self.seen_used.wrapping_add(1);
        Some(((id % u32::from(QSIZE)) as u16, len))
    }

    /// Entries made available and not yet given back.
    fn in_flight(&self) -> u16 {
        self.next_avail.wrapping_sub(self.seen_used)
    }
}

/// The device and its two queues.
pub struct Nic {
    base: u64,
    rx: Vq,
    tx: Vq,
    mac: [u8; 6],
    /// Times the guest wrote QueueNotify.
    pub kicks: u64,
}

impl Nic {
    fn r(&self, off: u64) -> u32 {
        // SAFETY: the device's window (a page the VMM gave, identity-mapped: `init`'s
        // contract, and only `init` makes a `Nic`), 4-byte registers; a read is one MMIO exit.
        unsafe { get(self.base + off) }
    }

    fn w(&self, off: u64, v: u32) {
        // SAFETY: as in `r`, for a write.
        unsafe { put(self.base + off, v) }
    }

    /// The status register now.
    pub fn status(&self) -> u32 {
        self.r(STATUS)
    }

    /// Brings the device at `base` up with its rings and buffers in `[ram, ram + size)`.
    ///
    /// # Safety
    ///
    /// `base`, when not 0, must be a virtio-mmio window the VMM mapped (identity mapped), and
    /// `[ram, ram + size)` RAM the VMM gave for the rings and buffers, used by nothing else,
    /// for as long as the returned `Nic` lives.
    pub unsafe fn init(base: u64, ram: u64, size: u64) -> Result<Nic, InitError> {
        if ram == 0 || size < RAM_NEEDED || !ram.is_multiple_of(4096) {
            return Err(InitError::Ram);
        }
        let vq = |index: u16, at: u64, bufs: u64| Vq {
            index,
            desc: at,
            avail: at + 0x1000,
            used: at + 0x2000,
            next_avail: 0,
            seen_used: 0,
            bufs,
        };
        let mut nic = Nic {
            base,
            rx: vq(0, ram, ram + 0x10_0000),
            tx: vq(1, ram + 0x4000, ram + 0x10_0000 + u64::from(QSIZE) * BUF),
            mac: [0; 6],
            kicks: 0,
        };
        if base == 0
            || nic.r(MAGIC) != u32::from_le_bytes(*b"virt")
            || nic.r(VERSION) != 2
            || nic.r(DEVICE_ID) != 1
        {
            return Err(InitError::NoDevice);
        }
        nic.w(STATUS, 0);
        nic.w(STATUS, S_ACK);
        nic.w(STATUS, S_ACK | S_DRIVER);
        nic.w(DEVICE_FEATURES_SEL, 0);
        let lo = nic.r(DEVICE_FEATURES) & F_MAC;
        nic.w(DRIVER_FEATURES_SEL, 0);
        nic.w(DRIVER_FEATURES, lo);
        nic.w(DRIVER_FEATURES_SEL, 1);
        nic.w(DRIVER_FEATURES, F_VERSION_1_HI);
        nic.w(STATUS, S_ACK | S_DRIVER | S_FEATURES_OK);
        if nic.r(STATUS) & S_FEATURES_OK == 0 {
            return Err(InitError::Features);
        }
        for q in [&nic.rx, &nic.tx] {
            for off in (0..0x4000).step_by(8) {
                // SAFETY: the rings' RAM, given by the VMM for this and checked above (each
                // queue's rings fit in 16 KiB from its descriptor table).
                unsafe { put(q.desc + off, 0u64) };
            }
            // SAFETY: the available ring's flags, in the rings' RAM.
            unsafe { put(q.avail, AVAIL_F_NO_INTERRUPT) };
            nic.w(QUEUE_SEL, u32::from(q.index));
            if nic.r(QUEUE_NUM_MAX) < u32::from(QSIZE) {
                return Err(InitError::Queue);
            }
            nic.w(QUEUE_NUM, u32::from(QSIZE));
            for (reg, addr) in [
                (QUEUE_DESC, q.desc),
                (QUEUE_AVAIL, q.avail),
                (QUEUE_USED, q.used),
            ] {
                nic.w(reg, addr as u32);
                nic.w(reg + 4, (addr >> 32) as u32);
            }
            nic.w(QUEUE_READY, 1);
        }
        nic.w(STATUS, S_ACK | S_DRIVER | S_FEATURES_OK | S_DRIVER_OK);
        for i in 0..6 {
            // SAFETY: the configuration space's MAC bytes, in the device's window.
            nic.mac[i] = unsafe { get(base + CONFIG + i as u64) };
        }
        Ok(nic)
    }

    fn kick(&mut self, queue: u16) {
        self.kicks += 1;
        self.w(QUEUE_NOTIFY, u32::from(queue));
    }

    /// Writes an Ethernet frame of `size` bytes (header included) to `to` into transmit
    /// buffer `i`, carrying `seq`.
    fn frame(&self, i: u16, to: [u8; 6], size: u64, seq: u64) {
        let b = self.tx.buf(i);
        // SAFETY: transmit buffer `i` lies in the buffers' RAM (`RAM_NEEDED` checked in
        // `init`); `size` is at most `BUF - HDR` (the callers clamp it).
        unsafe {
            for off in (0..HDR).step_by(4) {
                put(b + off, 0u32);
            }
            let f = b + HDR;
            for (k, byte) in to.iter().chain(self.mac.iter()).enumerate() {
                put(f + k as u64, *byte);
            }
            put(f + 12, NET_ETHERTYPE.to_be_bytes());
            put(f + 14, seq.to_le_bytes());
            for off in 22..size {
                put(f + off, off as u8);
            }
        }
    }

    /// Sends what it can of `frames` more frames of `size` to `to`, numbering from `seq`;
    /// returns how many it made available.
    fn send(&mut self, frames: u64, size: u64, to: [u8; 6], seq: u64) -> u64 {
        let mut n = 0;
        while n < frames && self.tx.in_flight() < QSIZE {
            let i = self.tx.next_avail % QSIZE;
            self.frame(i, to, size, seq + n);
            self.tx.set_desc(i, (HDR + size) as u32, 0);
            self.tx.push(i);
            n += 1;
        }
        if n > 0 {
            self.tx.publish();
            if !self.tx.no_notify() {
                self.kick(1);
            }
        }
        n
    }

    /// Transmit buffers the device gave back now.
    fn reap_tx(&mut self) -> u64 {
        let mut n = 0;
        while self.tx.pop_used().is_some() {
            n += 1;
        }
        n
    }

    /// Makes every receive buffer available.
    fn fill_rx(&mut self) {
        for i in 0..QSIZE {
            self.rx.set_desc(i, BUF as u32, DESC_F_WRITE);
            self.rx.push(i);
        }
        self.rx.publish();
        self.kick(0);
    }

    /// The next received frame: (buffer id, frame length without the header).
    fn recv(&mut self) -> Option<(u16, u64)> {
        self.rx
            .pop_used()
            .map(|(id, len)| (id, u64::from(len).saturating_sub(HDR)))
    }

    /// Makes receive buffer `id` available again (published by [`Nic::flush_rx`]).
    fn recycle(&mut self, id: u16) {
        self.rx.push(id);
    }

    fn flush_rx(&mut self) {
        self.rx.publish();
        if !self.rx.no_notify() {
            self.kick(0);
        }
    }
}

/// What a network workload counted.
#[derive(Default, Clone, Copy)]
pub struct NetCounts {
    /// Frames given back by the device after transmit.
    pub sent: u64,
    /// Frames received.
    pub received: u64,
    /// Frames sent back (`net-echo`).
    pub echoed: u64,
}

/// A deadline `ms` from now, in TSC cycles.
fn deadline(clk: Clock, ms: u64) -> u64 {
    rdtsc().saturating_add(clk.cycles(ms, 1_000_000))
}

/// How long the transmit loop waits for the device to give frames back before it gives up.
const TX_STALL_MS: u64 = 2000;

/// `net-tx`: `packets` frames of `size` bytes to the broadcast address.
pub fn tx(nic: &mut Nic, clk: Clock, packets: u64, size: u64) -> NetCounts {
    let size = size.clamp(60, BUF - HDR);
    let mut c = NetCounts::default();
    let mut posted = 0;
    let mut stall = deadline(clk, TX_STALL_MS);
    while c.sent < packets && rdtsc() < stall {
        posted += nic.send(packets - posted, size, [0xff; 6], posted);
        let done = nic.reap_tx();
        if done > 0 {
            c.sent += done;
            stall = deadline(clk, TX_STALL_MS);
        }
    }
    c
}

/// The shortest frame a receive or an echo takes (an Ethernet header): a used entry shorter
/// than that is not a frame, and is neither counted nor echoed.
const MIN_FRAME: u64 = 14;

/// `net-rx`: after `wait_ms` with no buffer posted (the frames the host sends meanwhile wait
/// at the tap), receives until `packets` frames came or `ms` passed.
pub fn rx(nic: &mut Nic, clk: Clock, packets: u64, ms: u64, wait_ms: u64) -> NetCounts {
    let mut c = NetCounts::default();
    let wait = deadline(clk, wait_ms);
    while rdtsc() < wait {
        core::hint::spin_loop();
    }
    nic.fill_rx();
    let end = deadline(clk, ms);
    while c.received < packets && rdtsc() < end {
        let mut got = false;
        while let Some((id, len)) = nic.recv() {
            if len >= MIN_FRAME {
                c.received += 1;
            }
            nic.recycle(id);
            got = true;
        }
        if got {
            nic.flush_rx();
        }
    }
    c
}

/// `net-echo`: for `ms`, sends every frame received back to its sender.
pub fn echo(nic: &mut Nic, clk: Clock, ms: u64) -> NetCounts {
    let mut c = NetCounts::default();
    nic.fill_rx();
    let end = deadline(clk, ms);
    while rdtsc() < end {
        c.sent += nic.reap_tx();
        let mut got = false;
        while nic.tx.in_flight() < QSIZE {
            let Some((id, len)) = nic.recv() else { break };
            got = true;
            if len < MIN_FRAME {
                // Not a frame: nothing to count or send back.
                nic.recycle(id);
                continue;
            }
            c.received += 1;
            let src = nic.rx.buf(id) + HDR;
            let i = nic.tx.next_avail % QSIZE;
            let dst = nic.tx.buf(i);
            let len = len.min(BUF - HDR);
            // SAFETY: receive buffer `id` and transmit buffer `i` lie in the buffers' RAM;
            // `len` is at most a buffer less its header. The device wrote the receive buffer
            // and gave it back, so it no longer writes it.
            unsafe {
                for off in (0..HDR).step_by(4) {
                    put(dst + off, 0u32);
                }
                for k in 0..6 {
                    // Back to the sender: its source address becomes our destination.
                    put(dst + HDR + k, get::<u8>(src + 6 + k));
                    put(dst + HDR + 6 + k, nic.mac[k as usize]);
                }
                for off in 12..len {
                    put(dst + HDR + off, get::<u8>(src + off));
                }
            }
            nic.tx.set_desc(i, (HDR + len) as u32, 0);
            nic.tx.push(i);
            nic.recycle(id);
            c.echoed += 1;
        }
        if got {
            nic.tx.publish();
            if !nic.tx.no_notify() {
                nic.kick(1);
            }
            nic.flush_rx();
        }
    }
    // Let the last echoes go.
    let stall = deadline(clk, 100);
    while nic.tx.in_flight() > 0 && rdtsc() < stall {
        c.sent += nic.reap_tx();
    }
    c
}
