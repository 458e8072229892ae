//! A polled virtio-blk driver (virtio 1.x over MMIO) and the disk workloads `blk-write` and
//! `blk-verify`.
//!
//! Data flow: the VMM gives the device's MMIO window and a RAM area in the boot-info record.
//! [`Disk::init`] resets the device, accepts VERSION_1, FLUSH and RO (when offered), and lays
//! out one request queue of [`QSIZE`] entries in that area with `VRING_AVAIL_F_NO_INTERRUPT`
//! set (no interrupt controller: the guest polls its used ring), then request slots: each a
//! 16-byte header, a 4 KiB data buffer and a status byte, described by three descriptors
//! (`3 * slot` is its head). A workload keeps up to `depth` requests in flight: it fills free
//! slots (for a write, the block's pattern), publishes them, kicks QueueNotify (an
//! ioeventfd: no exit where the host honours it) unless the device asked not to be, and
//! takes what the device gave back, checking each status byte (and, reading, the data
//! against its pattern, [`ppa_guest_abi::blk_pattern`]). `blk-write` ends with a FLUSH. Each
//! ends on its own clock when the device stops answering, so it cannot hang the guest.

use ppa_guest_abi::{blk_pattern, BLK_BLOCK};

use crate::virtio::{get, put, InitError, Mmio, Vq, DESC_F_NEXT, DESC_F_WRITE, RINGS};
use crate::{rdtsc, Clock};

/// Entries of the request queue.
pub const QSIZE: u16 = 256;
/// Requests in flight at most (each takes three descriptors).
pub const MAX_DEPTH: u64 = 64;
/// virtio device id of a block device.
const BLK_DEVICE: u32 = 2;
/// `VIRTIO_BLK_F_RO`.
const F_RO: u32 = 1 << 5;
/// `VIRTIO_BLK_F_FLUSH`.
const F_FLUSH: u32 = 1 << 9;
const T_IN: u32 = 0;
const T_OUT: u32 = 1;
const T_FLUSH: u32 = 4;
/// Where the headers, the status bytes and the data buffers lie in the RAM area.
const HDRS: u64 = RINGS;
const STATUS: u64 = RINGS + 0x1000;
const DATA: u64 = 0x1_0000;
/// Bytes the driver needs in its RAM area.
pub const RAM_NEEDED: u64 = DATA + MAX_DEPTH * BLK_BLOCK;
/// How long a workload waits for the device to give a request back before it gives up.
const STALL_MS: u64 = 2000;
/// Sectors of a block.
const SECTORS: u64 = BLK_BLOCK / 512;
/// Words of a block.
const WORDS: u64 = BLK_BLOCK / 8;

/// What a disk workload counted.
#[derive(Default, Clone, Copy)]
pub struct BlkCounts {
    /// Blocks written or read with status OK.
    pub blocks: u64,
    /// Blocks read OK that did not hold their pattern.
    pub mismatches: u64,
    /// Requests answered with another status (the FLUSH included).
    pub errors: u64,
    /// TSC time of the block requests, from the first made available to the last given back
    /// (the FLUSH after them not included), ns.
    pub ns: u64,
}

/// The device and its request queue.
pub struct Disk {
    mmio: Mmio,
    q: Vq,
    ram: u64,
    /// Free request slots, a bit each.
    free: u64,
    /// The block each slot in flight carries.
    block: [u64; MAX_DEPTH as usize],
}

impl Disk {
    /// Brings the device at `base` up with its ring and slots in `[ram, ram + size)`.
    ///
    /// # Safety
    ///
    /// `base`, when not 0, must be a virtio-mmio window the VMM mapped (identity mapped), and
    /// `[ram, ram + size)` RAM the VMM gave for the ring and buffers, used by nothing else,
    /// for as long as the returned `Disk` lives.
    pub unsafe fn init(base: u64, ram: u64, size: u64) -> Result<Disk, InitError> {
        if ram == 0 || size < RAM_NEEDED || !ram.is_multiple_of(4096) {
            return Err(InitError::Ram);
        }
        // SAFETY: `base` is the VMM's window for this device (this function's contract).
        let mmio = unsafe { Mmio::new(base, BLK_DEVICE) }?;
        let disk = Disk {
            mmio,
            q: Vq::new(0, ram, QSIZE),
            ram,
            free: u64::MAX,
            block: [0; MAX_DEPTH as usize],
        };
        disk.mmio.negotiate(F_RO | F_FLUSH)?;
        disk.mmio.add_queue(&disk.q)?;
        disk.mmio.driver_ok();
        Ok(disk)
    }

    /// The status register now.
    pub fn status(&self) -> u32 {
        self.mmio.status()
    }

    fn data(&self, slot: u64) -> u64 {
        self.ram + DATA + slot * BLK_BLOCK
    }

    fn status_byte(&self, slot: u64) -> u64 {
        self.ram + STATUS + slot
    }

    /// Makes a request of type `ty` at `sector` in `slot` available (not yet published):
    /// header, the slot's 4 KiB buffer unless a FLUSH, status.
    fn push(&mut self, slot: u64, ty: u32, sector: u64) {
        let hdr = self.ram + HDRS + 16 * slot;
        // SAFETY: the slot's header and status byte lie in the RAM area (`RAM_NEEDED`
        // checked in `init`; slot < MAX_DEPTH), aligned for their types.
        unsafe {
            put(hdr, ty);
            put(hdr + 4, 0u32);
            put(hdr + 8, sector);
            put(self.status_byte(slot), 0xffu8);
        }
        let head = (3 * slot) as u16;
        let last = head + 2;
        if ty == T_FLUSH {
            self.q.set_desc(head, hdr, 16, DESC_F_NEXT, last);
        } else {
            let dir = if ty == T_IN { DESC_F_WRITE } else { 0 };
            self.q.set_desc(head, hdr, 16, DESC_F_NEXT, head + 1);
            self.q.set_desc(
                head + 1,
                self.data(slot),
                BLK_BLOCK as u32,
                dir | DESC_F_NEXT,
                last,
            );
        }
        self.q
            .set_desc(last, self.status_byte(slot), 1, DESC_F_WRITE, 0);
        self.q.push(head);
    }

    fn publish(&mut self) {
        self.q.publish();
        if !self.q.no_notify() {
            self.mmio.notify(0);
        }
    }

    /// The next request given back: its slot and its status byte.
    fn pop(&mut self) -> Option<(u64, u8)> {
        let (id, _) = self.q.pop_used()?;
        let slot = u64::from(id / 3) % MAX_DEPTH;
        self.free |= 1 << slot;
        // SAFETY: the slot's status byte, in the RAM area; the device gave the chain back.
        Some((slot, unsafe { get::<u8>(self.status_byte(slot)) }))
    }

    /// Fills `slot`'s buffer with block `block`'s pattern.
    fn fill(&self, slot: u64, block: u64) {
        let b = self.data(slot);
        for w in 0..WORDS {
            // SAFETY: the slot's data buffer lies in the RAM area, 8-byte aligned.
            unsafe { put(b + 8 * w, blk_pattern(block, w)) };
        }
    }

    /// Whether `slot`'s buffer holds block `block`'s pattern, in every `stride`-th word
    /// (1: every word; 64: the first word of each sector).
    fn holds(&self, slot: u64, block: u64, stride: u64) -> bool {
        let b = self.data(slot);
        // SAFETY: as in `fill`; the device wrote the buffer and gave it back.
        (0..WORDS)
            .step_by(stride.clamp(1, WORDS) as usize)
            .all(|w| unsafe { get::<u64>(b + 8 * w) } == blk_pattern(block, w))
    }
}

/// A deadline `ms` from now, in TSC cycles.
fn deadline(clk: Clock, ms: u64) -> u64 {
    rdtsc().saturating_add(clk.cycles(ms, 1_000_000))
}

/// Writes (`check` None) or reads and checks blocks `0..blocks` (every `check`-th word),
/// `depth` requests in flight.
fn run(disk: &mut Disk, clk: Clock, blocks: u64, depth: u64, check: Option<u64>) -> BlkCounts {
    let write = check.is_none();
    let depth = depth.clamp(1, MAX_DEPTH);
    disk.free = if depth == 64 {
        u64::MAX
    } else {
        (1 << depth) - 1
    };
    let mut c = BlkCounts::default();
    let (mut next, mut done) = (0, 0);
    let t0 = rdtsc();
    let mut stall = deadline(clk, STALL_MS);
    while done < blocks && rdtsc() < stall {
        let mut pushed = false;
        while next < blocks && disk.free != 0 {
            let slot = u64::from(disk.free.trailing_zeros());
            disk.free &= !(1 << slot);
            disk.block[slot as usize] = next;
            if write {
                disk.fill(slot, next);
            }
            disk.push(slot, if write { T_OUT } else { T_IN }, next * SECTORS);
            next += 1;
            pushed = true;
        }
        if pushed {
            disk.publish();
        }
        while let Some((slot, status)) = disk.pop() {
            done += 1;
            stall = deadline(clk, STALL_MS);
            if status != 0 {
                c.errors += 1;
                continue;
            }
            c.blocks += 1;
            if let Some(stride) = check {
                if !disk.holds(slot, disk.block[slot as usize], stride) {
                    c.mismatches += 1;
                }
            }
        }
    }
    c.ns = clk.ns(rdtsc().saturating_sub(t0));
    if write && done == blocks {
        c.errors += u64::from(!flush(disk, clk));
    }
    c
}

/// A FLUSH, waited for: whether it came back OK.
fn flush(disk: &mut Disk, clk: Clock) -> bool {
    disk.free &= !1;
    disk.push(0, T_FLUSH, 0);
    disk.publish();
    let stall = deadline(clk, STALL_MS);
    while rdtsc() < stall {
        if let Some((_, status)) = disk.pop() {
            return status == 0;
        }
    }
    false
}

/// `blk-write`: blocks `0..blocks` with their patterns, then a FLUSH, then `hold_ms` of
/// spinning (the counts' time ends before it).
pub fn write(disk: &mut Disk, clk: Clock, blocks: u64, depth: u64, hold_ms: u64) -> BlkCounts {
    let c = run(disk, clk, blocks, depth, None);
    let end = deadline(clk, hold_ms);
    while rdtsc() < end {
        core::hint::spin_loop();
    }
    c
}

/// `blk-verify`: blocks `0..blocks` read back and compared with their patterns, every
/// `stride`-th word of each (0 or 1: every word).
pub fn verify(disk: &mut Disk, clk: Clock, blocks: u64, depth: u64, stride: u64) -> BlkCounts {
    run(disk, clk, blocks, depth, Some(stride))
}
