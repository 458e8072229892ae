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

use ppa_guest_abi::NET_ETHERTYPE;

use crate::virtio::InitError;
use crate::virtio::{get, put, Mmio, Vq, DESC_F_WRITE, RINGS};
use crate::{rdtsc, Clock};

/// Entries of each queue.
pub const QSIZE: u16 = 256;
/// Bytes of each buffer.
const BUF: u64 = 2048;
/// The virtio network header in front of every frame (virtio 1.x).
const HDR: u64 = 12;
/// Bytes the driver needs in its RAM area: rings at the start, then the buffers.
pub const RAM_NEEDED: u64 = 0x10_0000 + 2 * QSIZE as u64 * BUF;
/// virtio device id of a network card.
const NET_DEVICE: u32 = 1;
/// `VIRTIO_NET_F_MAC`.
const F_MAC: u32 = 1 << 5;

/// Buffer `i` of the buffers at `bufs`.
fn buf(bufs: u64, i: u16) -> u64 {
    bufs + u64::from(i) * BUF
}

/// The device and its two queues.
pub struct Nic {
    mmio: Mmio,
    rx: Vq,
    tx: Vq,
    rx_bufs: u64,
    tx_bufs: u64,
    mac: [u8; 6],
    /// Times the guest wrote QueueNotify.
    pub kicks: u64,
}

impl Nic {
    /// The status register now.
    pub fn status(&self) -> u32 {
        self.mmio.status()
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
        // SAFETY: `base` is the VMM's window for this device (this function's contract).
        let mmio = unsafe { Mmio::new(base, NET_DEVICE) }?;
        let mut nic = Nic {
            mmio,
            rx: Vq::new(0, ram, QSIZE),
            tx: Vq::new(1, ram + RINGS, QSIZE),
            rx_bufs: ram + 0x10_0000,
            tx_bufs: ram + 0x10_0000 + u64::from(QSIZE) * BUF,
            mac: [0; 6],
            kicks: 0,
        };
        nic.mmio.negotiate(F_MAC)?;
        nic.mmio.add_queue(&nic.rx)?;
        nic.mmio.add_queue(&nic.tx)?;
        nic.mmio.driver_ok();
        for i in 0..6 {
            nic.mac[i] = nic.mmio.config_byte(i as u64);
        }
        Ok(nic)
    }

    fn kick(&mut self, queue: u16) {
        self.kicks += 1;
        self.mmio.notify(queue);
    }

    /// Writes an Ethernet frame of `size` bytes (header included) to `to` into transmit
    /// buffer `i`, carrying `seq`.
    fn frame(&self, i: u16, to: [u8; 6], size: u64, seq: u64) {
        let b = buf(self.tx_bufs, i);
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
            self.tx
                .set_desc(i, buf(self.tx_bufs, i), (HDR + size) as u32, 0, 0);
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
            self.rx
                .set_desc(i, buf(self.rx_bufs, i), BUF as u32, DESC_F_WRITE, 0);
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
            let src = buf(nic.rx_bufs, id) + HDR;
            let i = nic.tx.next_avail % QSIZE;
            let dst = buf(nic.tx_bufs, i);
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
            nic.tx
                .set_desc(i, buf(nic.tx_bufs, i), (HDR + len) as u32, 0, 0);
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
