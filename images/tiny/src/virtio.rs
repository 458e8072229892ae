//! What the tiny guest's polled virtio drivers share (virtio 1.x over MMIO, register layout
//! version 2): the device's window ([`Mmio`]: identification, the status handshake, feature
//! negotiation, queue set-up, kicks) and a split queue in guest RAM ([`Vq`]: descriptors,
//! the available ring the guest publishes, the used ring it polls).
//!
//! Data flow: a driver (`net`, `blk`) makes an [`Mmio`] from the window the VMM gave
//! (checking the magic, version and device id), negotiates its features, lays each queue's
//! rings out in the RAM area the VMM gave ([`Vq::new`]) with `VRING_AVAIL_F_NO_INTERRUPT` set
//! (there is no interrupt controller: the guest polls), hands them to the device
//! ([`Mmio::add_queue`]) and says DRIVER_OK. Then it fills descriptors, pushes heads,
//! publishes, kicks when the device did not ask otherwise, and pops used entries.

use core::ptr::{read_volatile, write_volatile};
use core::sync::atomic::{fence, Ordering};

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
/// The device-specific configuration space.
pub const CONFIG: u64 = 0x100;

const S_ACK: u32 = 1;
const S_DRIVER: u32 = 2;
const S_DRIVER_OK: u32 = 4;
const S_FEATURES_OK: u32 = 8;
/// `VIRTIO_F_VERSION_1`, in the high word of the features.
const F_VERSION_1_HI: u32 = 1;
/// `VRING_DESC_F_NEXT`.
pub const DESC_F_NEXT: u16 = 1;
/// `VRING_DESC_F_WRITE`.
pub const DESC_F_WRITE: u16 = 2;
const AVAIL_F_NO_INTERRUPT: u16 = 1;
const USED_F_NO_NOTIFY: u16 = 1;
/// Bytes a queue's rings take in the RAM area (desc, avail, used at 4 KiB steps).
pub const RINGS: u64 = 0x4000;

/// Why a driver could not start.
#[derive(Debug, Clone, Copy)]
pub enum InitError {
    /// No device of the kind (or not version 2) at the window.
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
pub unsafe fn put<T>(addr: u64, v: T) {
    // SAFETY: the caller's contract.
    unsafe { write_volatile(addr as *mut T, v) }
}

/// Reads a `T` at `addr`.
///
/// # Safety
/// As [`put`].
pub unsafe fn get<T: Copy>(addr: u64) -> T {
    // SAFETY: the caller's contract.
    unsafe { read_volatile(addr as *const T) }
}

/// A device's virtio-mmio window.
pub struct Mmio {
    base: u64,
}

impl Mmio {
    /// The device at `base` if it is a version-2 virtio-mmio device of `device_id`.
    ///
    /// # Safety
    /// `base`, when not 0, must be a virtio-mmio window the VMM mapped (identity mapped) for
    /// as long as the returned value lives.
    pub unsafe fn new(base: u64, device_id: u32) -> Result<Mmio, InitError> {
        let m = Mmio { base };
        if base == 0
            || m.r(MAGIC) != u32::from_le_bytes(*b"virt")
            || m.r(VERSION) != 2
            || m.r(DEVICE_ID) != device_id
        {
            return Err(InitError::NoDevice);
        }
        Ok(m)
    }

    /// Reads register `off`.
    pub fn r(&self, off: u64) -> u32 {
        // SAFETY: the device's window (`new`'s contract), 4-byte registers; a read is one
        // MMIO exit. `base` is 0 only before `new` checked it, where no read follows.
        unsafe { get(self.base + off) }
    }

    fn w(&self, off: u64, v: u32) {
        // SAFETY: as in `r`, for a write.
        unsafe { put(self.base + off, v) }
    }

    /// A byte of the configuration space.
    pub fn config_byte(&self, off: u64) -> u8 {
        // SAFETY: the configuration space lies inside the device's window.
        unsafe { get(self.base + CONFIG + off) }
    }

    /// The status register now.
    pub fn status(&self) -> u32 {
        self.r(STATUS)
    }

    /// Resets the device and accepts VERSION_1 and what of `want` (low feature word) the
    /// device offers; returns those.
    pub fn negotiate(&self, want: u32) -> Result<u32, InitError> {
        self.w(STATUS, 0);
        self.w(STATUS, S_ACK);
        self.w(STATUS, S_ACK | S_DRIVER);
        self.w(DEVICE_FEATURES_SEL, 0);
        let lo = self.r(DEVICE_FEATURES) & want;
        self.w(DRIVER_FEATURES_SEL, 0);
        self.w(DRIVER_FEATURES, lo);
        self.w(DRIVER_FEATURES_SEL, 1);
        self.w(DRIVER_FEATURES, F_VERSION_1_HI);
        self.w(STATUS, S_ACK | S_DRIVER | S_FEATURES_OK);
        if self.r(STATUS) & S_FEATURES_OK == 0 {
            return Err(InitError::Features);
        }
        Ok(lo)
    }

    /// Hands queue `q` to the device (its rings zeroed, interrupts off).
    pub fn add_queue(&self, q: &Vq) -> Result<(), InitError> {
        for off in (0..RINGS).step_by(8) {
            // SAFETY: the rings' RAM, given by the VMM for this (the driver checked the
            // area's size), 16 KiB from the descriptor table.
            unsafe { put(q.desc + off, 0u64) };
        }
        // SAFETY: the available ring's flags, in the rings' RAM.
        unsafe { put(q.avail, AVAIL_F_NO_INTERRUPT) };
        self.w(QUEUE_SEL, u32::from(q.index));
        if self.r(QUEUE_NUM_MAX) < u32::from(q.size) {
            return Err(InitError::Queue);
        }
        self.w(QUEUE_NUM, u32::from(q.size));
        for (reg, addr) in [
            (QUEUE_DESC, q.desc),
            (QUEUE_AVAIL, q.avail),
            (QUEUE_USED, q.used),
        ] {
            self.w(reg, addr as u32);
            self.w(reg + 4, (addr >> 32) as u32);
        }
        self.w(QUEUE_READY, 1);
        Ok(())
    }

    /// Starts the device.
    pub fn driver_ok(&self) {
        self.w(STATUS, S_ACK | S_DRIVER | S_FEATURES_OK | S_DRIVER_OK);
    }

    /// Kicks queue `queue` (a write the VMM normally catches with an ioeventfd: no exit).
    pub fn notify(&self, queue: u16) {
        self.w(QUEUE_NOTIFY, u32::from(queue));
    }
}

/// One split queue in the driver's RAM area.
pub struct Vq {
    /// Its index.
    pub index: u16,
    desc: u64,
    avail: u64,
    used: u64,
    size: u16,
    /// The next available index to publish.
    pub next_avail: u16,
    /// The used index seen last.
    seen_used: u16,
}

impl Vq {
    /// Queue `index` of `size` entries with its rings at `at` (16 KiB of the RAM area).
    pub fn new(index: u16, at: u64, size: u16) -> Vq {
        Vq {
            index,
            desc: at,
            avail: at + 0x1000,
            used: at + 0x2000,
            size,
            next_avail: 0,
            seen_used: 0,
        }
    }

    /// Descriptor `i`: `len` bytes at `addr`, with `flags` and `next`.
    pub fn set_desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let d = self.desc + 16 * u64::from(i);
        // SAFETY: the descriptor table lies in the RAM area the VMM gave for the rings,
        // identity-mapped; entries are 16-byte aligned and `i` is below the size.
        unsafe {
            put(d, addr);
            put(d + 8, len);
            put(d + 12, flags);
            put(d + 14, next);
        }
    }

    /// Makes the chain at `head` available (not yet published).
    pub fn push(&mut self, head: u16) {
        let slot = self.avail + 4 + 2 * u64::from(self.next_avail % self.size);
        // SAFETY: the available ring lies in the rings' RAM, 2-byte aligned.
        unsafe { put(slot, head) };
        self.next_avail = self.next_avail.wrapping_add(1);
    }

    /// Publishes what was pushed (release: the descriptors and buffers first).
    pub fn publish(&self) {
        fence(Ordering::Release);
        // SAFETY: the available ring's index, in the rings' RAM.
        unsafe { put(self.avail + 2, self.next_avail) };
        fence(Ordering::SeqCst);
    }

    /// Whether the device asked not to be notified.
    pub fn no_notify(&self) -> bool {
        // SAFETY: the used ring's flags, in the rings' RAM.
        unsafe { get::<u16>(self.used) & USED_F_NO_NOTIFY != 0 }
    }

    /// The next used element (descriptor id, length), if the device gave one back.
    pub fn pop_used(&mut self) -> Option<(u16, u32)> {
        // SAFETY: the used ring's index, in the rings' RAM.
        let idx: u16 = unsafe { get(self.used + 2) };
        if idx == self.seen_used {
            return None;
        }
        fence(Ordering::Acquire);
        let e = self.used + 4 + 8 * u64::from(self.seen_used % self.size);
        // SAFETY: a used element, in the rings' RAM, 4-byte aligned.
        let (id, len): (u32, u32) = unsafe { (get(e), get(e + 4)) };
        self.seen_used = self.seen_used.wrapping_add(1);
        Some(((id % u32::from(self.size)) as u16, len))
    }

    /// Entries made available and not yet given back.
    pub fn in_flight(&self) -> u16 {
        self.next_avail.wrapping_sub(self.seen_used)
    }
}
