//! The guest-visible ABI of PPA-VMM.
//!
//! This crate is shared, unchanged, by the VMM (host side) and by guest code (the tiny guest in
//! `images/tiny`). It owns every number both sides must agree on:
//!
//! - the tiny-guest boot protocol: where the VMM puts the per-vCPU [`BootInfo`] record and what it
//!   holds (the guest finds it through RDI at entry);
//! - the doorbell page: a guest-physical page with no memory behind it, so that each write to it
//!   is an MMIO exit the VMM handles ([`doorbell`]);
//! - the port of the port-I/O workload doorbell ([`WORKLOAD_PIO_PORT`]);
//! - the workload encoding ([`WorkloadDesc`], [`workload`]) and the report keys ([`report`]);
//! - the PPA page shared by the VMM and the guest, and its sequence protocol ([`ppa_page`]);
//! - the hypervisor CPUID leaves that tell a Linux guest where the page is ([`cpuid`]).
//!
//! Data flow: the VMM parses a workload spec, encodes it into a [`WorkloadDesc`] inside the
//! vCPU's [`BootInfo`] in guest memory; the guest reads it, runs it, measures itself with rdtsc and
//! writes each measurement to `doorbell::REPORT_BASE + 8 * key`; the VMM decodes the key from
//! the offset. Every record is `#[repr(C)]`, little-endian, with sizes and offsets asserted at
//! compile time below. The layout is append-only: new fields go into reserved space and bump
//! [`BOOT_INFO_VERSION`]'s minor half.
#![no_std]

pub mod cpuid;
pub mod ppa_page;

/// Magic value of [`BootInfo::magic`]: "PPAB" in little-endian.
pub const BOOT_INFO_MAGIC: u32 = u32::from_le_bytes(*b"PPAB");
/// Boot-info layout version: major in the high 16 bits, minor in the low 16 bits. Minor 1
/// gave [`WorkloadDesc::flags`] its first bit ([`workload::FLAG_NO_PUBLISH`]); minor 2 added
/// the `memtouch` workload ([`workload::MEMTOUCH`]) and its report keys; minor 3 the network
/// workloads ([`workload::NET_TX`], [`workload::NET_RX`], [`workload::NET_ECHO`]), the
/// network device's window and RAM in [`BootInfo`] and their report keys; minor 4 the disk
/// workloads ([`workload::BLK_WRITE`], [`workload::BLK_VERIFY`]), the disk's window and RAM
/// and their report keys; minor 5 `blk-verify`'s third parameter (the stride of its
/// comparison; 0, what a 1.4 writer leaves there, compares every word as before).
pub const BOOT_INFO_VERSION: u32 = (1 << 16) | 5;
/// Size of one boot-info record in guest memory.
pub const BOOT_INFO_SIZE: usize = 256;

/// Guest-physical address of the doorbell page (no memory slot: every access exits).
pub const DOORBELL_GPA: u64 = 0xD000_0000;
/// Size of the doorbell page.
pub const DOORBELL_SIZE: u64 = 0x1000;
/// The port the `exits:kind=pio` workload writes to (a 32-bit `out`).
pub const WORKLOAD_PIO_PORT: u16 = 0x0600;
/// The EtherType of the tiny guest's frames: IEEE's "local experimental" 0x88B5, so that no
/// host stack routes them anywhere.
pub const NET_ETHERTYPE: u16 = 0x88B5;

/// Bytes of one block of the disk workloads (`blk-write`, `blk-verify`).
pub const BLK_BLOCK: u64 = 4096;

/// Word `word` (0 to 511) of block `block` of the disk workloads: what `blk-write` writes and
/// `blk-verify` expects, so any block read back at another offset, or left unwritten, shows.
pub const fn blk_pattern(block: u64, word: u64) -> u64 {
    (block.wrapping_add(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (word << 32 | word)
}

/// Offsets inside the doorbell page. Every doorbell is an 8-byte aligned register; the guest
/// writes a little-endian value (1 to 8 bytes) to it.
pub mod doorbell {
    /// Write one byte: it goes to the vCPU's console line buffer.
    pub const CONSOLE: u64 = 0x00;
    /// Write the exit code: the vCPU stops with it.
    pub const EXIT: u64 = 0x08;
    /// Write a duration in ns: the VMM parks this vCPU for that long or until it is kicked.
    /// This is the tiny guest's HLT.
    pub const HALT: u64 = 0x10;
    /// The `exits:kind=mmio` workload doorbell: counted, value ignored.
    pub const WORKLOAD: u64 = 0x18;
    /// First report register: a write of value V to `REPORT_BASE + 8 * K` reports key K = V.
    pub const REPORT_BASE: u64 = 0x100;
    /// Number of report registers.
    pub const REPORT_KEYS: u64 = 32;
}

/// Report keys (see [`doorbell::REPORT_BASE`]). All times are nanoseconds of guest TSC time.
pub mod report {
    /// TSC time spent in the busy and periodic spin loops.
    pub const SPIN_NS: u64 = 0;
    /// Sum of the gaps between two back-to-back rdtsc reads longer than the threshold.
    pub const LOST_NS: u64 = 1;
    /// Number of such gaps.
    pub const GAPS: u64 = 2;
    /// `SPIN_NS - LOST_NS`: the guest's own view of the time it ran.
    pub const RAN_NS: u64 = 3;
    /// Exits the workload made on purpose (halt and workload doorbells, console bytes); the
    /// report and exit doorbells are not counted.
    pub const EXITS_MADE: u64 = 4;
    /// Loop iterations of the workload (spin-loop passes, periods, doorbell writes).
    pub const ITERATIONS: u64 = 5;
    /// TSC time from the vCPU's first instruction to its report (taken as the last report
    /// is written, just before the exit doorbell).
    pub const ELAPSED_NS: u64 = 6;
    /// `steal_ns` of this vCPU's host record in the PPA page, as the guest last read it (just
    /// before reporting). Reported only when the guest publishes to a PPA page.
    pub const STEAL_SEEN_NS: u64 = 7;
    /// `wall_ns` of that same host record: how far into the vCPU's life the VMM took it.
    pub const STEAL_SEEN_WALL_NS: u64 = 8;
    /// Number of times the guest published its PPA page records.
    pub const PUBLISHES: u64 = 9;
    /// TSC time from the vCPU's first instruction to the moment the guest read the host
    /// record of [`STEAL_SEEN_NS`] (same origin as [`ELAPSED_NS`], so `elapsed_ns −
    /// steal_seen_at_ns` is how long before its end the guest read it).
    pub const STEAL_SEEN_AT_NS: u64 = 10;
    /// `memtouch`: bytes the guest wrote and read back.
    pub const TOUCHED_BYTES: u64 = 11;
    /// `memtouch`: 8-byte words that did not read back as written.
    pub const TOUCH_ERRORS: u64 = 12;
    /// `memtouch`: guest-physical address of the first byte touched.
    pub const TOUCH_BASE: u64 = 13;
    /// Network workloads: frames the guest made available to transmit and the device gave
    /// back (sent, or dropped by the device: the device's counters say which).
    pub const NET_SENT: u64 = 14;
    /// Network workloads: frames the guest found in its receive buffers.
    pub const NET_RECEIVED: u64 = 15;
    /// `net-echo`: frames the guest sent back (a subset of `net_sent`).
    pub const NET_ECHOED: u64 = 16;
    /// Network workloads: the device's status when the workload ended (0 when it never
    /// started; the virtio status bits otherwise, 0x40 NEEDS_RESET).
    pub const NET_STATUS: u64 = 17;
    /// Disk workloads: blocks written (`blk-write`) or read (`blk-verify`) with status OK.
    pub const BLK_BLOCKS: u64 = 18;
    /// `blk-verify`: blocks read OK that did not hold their pattern.
    pub const BLK_MISMATCHES: u64 = 19;
    /// Disk workloads: requests answered with a status other than OK (the final FLUSH of
    /// `blk-write` included).
    pub const BLK_ERRORS: u64 = 20;
    /// Disk workloads: the device's status when the workload ended (as `net_status`).
    pub const BLK_STATUS: u64 = 21;
    /// Disk workloads: TSC time of the block requests, from the first made available to the
    /// last given back (`blk-write`'s FLUSH after them not included), ns.
    pub const BLK_NS: u64 = 22;

    /// Name of each key, index = key.
    pub const NAMES: [&str; 23] = [
        "spin_ns",
        "lost_ns",
        "gaps",
        "ran_ns",
        "exits_made",
        "iterations",
        "elapsed_ns",
        "steal_seen_ns",
        "steal_seen_wall_ns",
        "publishes",
        "steal_seen_at_ns",
        "touched_bytes",
        "touch_errors",
        "touch_base",
        "net_sent",
        "net_received",
        "net_echoed",
        "net_status",
        "blk_blocks",
        "blk_mismatches",
        "blk_errors",
        "blk_status",
        "blk_ns",
    ];
}

/// Workload kinds of [`WorkloadDesc::kind`] and the meaning of its `params`.
pub mod workload {
    /// `idle`: params[0] = ms; halts in 10 ms steps until that much TSC time passed.
    pub const IDLE: u32 = 1;
    /// `busy`: params[0] = ms; spins on rdtsc for that long.
    pub const BUSY: u32 = 2;
    /// `periodic`: params = [run_us, period_us, count]; spins run_us, halts to the next period.
    pub const PERIODIC: u32 = 3;
    /// `exits`: params = [n, kind] with kind [`EXITS_MMIO`], [`EXITS_PIO`] or
    /// [`EXITS_CPUID`].
    pub const EXITS: u32 = 4;
    /// `fault`: params[0] = [`FAULT_HLT`] or [`FAULT_UD`]; shuts the vCPU down on purpose.
    pub const FAULT: u32 = 5;
    /// `hostile`: params = [ms, mode]; writes bad data into the PPA page's guest section as
    /// fast as it can for `ms`, in one of the `HOSTILE_*` modes. It never publishes honestly.
    pub const HOSTILE: u32 = 6;

    /// `memtouch`: params = [bytes, base]: writes a pattern over `[base, base + bytes)` (a RAM
    /// range the VMM chose and identity-mapped), reads it back, and reports
    /// [`crate::report::TOUCHED_BYTES`], [`crate::report::TOUCH_ERRORS`] and
    /// [`crate::report::TOUCH_BASE`].
    pub const MEMTOUCH: u32 = 7;
    /// `net-tx`: params = [packets, size]: sends `packets` frames of `size` bytes (Ethernet
    /// header included, [`crate::NET_ETHERTYPE`]) through the virtio-net device at
    /// [`crate::BootInfo::net_mmio_gpa`], polling its used ring; reports
    /// [`crate::report::NET_SENT`].
    pub const NET_TX: u32 = 8;
    /// `net-rx`: params = [packets, ms]: receives until `packets` frames came or `ms` passed;
    /// reports [`crate::report::NET_RECEIVED`].
    pub const NET_RX: u32 = 9;
    /// `net-echo`: params = [ms]: sends every frame it receives back to its sender for `ms`;
    /// reports [`crate::report::NET_RECEIVED`], [`crate::report::NET_ECHOED`] and
    /// [`crate::report::NET_SENT`].
    pub const NET_ECHO: u32 = 10;
    /// `blk-write`: params = [blocks, depth, hold_ms]: writes 4 KiB block `i` (sectors `8i`
    /// to `8i + 7`) with [`crate::blk_pattern`]`(i, ..)` for `i` in `0..blocks`, up to `depth`
    /// requests in flight, through the virtio-blk device at
    /// [`crate::BootInfo::blk_mmio_gpa`], polling its used ring, then FLUSHes and spins
    /// `hold_ms` (a test kills the VMM meanwhile); reports
    /// [`crate::report::BLK_BLOCKS`], [`crate::report::BLK_ERRORS`],
    /// [`crate::report::BLK_STATUS`] and [`crate::report::BLK_NS`].
    pub const BLK_WRITE: u32 = 11;
    /// `blk-verify`: params = [blocks, depth, stride]: reads the same blocks back and
    /// compares each with its pattern, every `stride`-th 8-byte word (0 or 1: every word; 64:
    /// the first word of each 512-byte sector); reports what `blk-write` does and
    /// [`crate::report::BLK_MISMATCHES`].
    pub const BLK_VERIFY: u32 = 12;

    /// [`crate::WorkloadDesc::flags`] bit: do not publish to the PPA page.
    pub const FLAG_NO_PUBLISH: u32 = 1;

    /// `exits` through the MMIO workload doorbell.
    pub const EXITS_MMIO: u64 = 0;
    /// `exits` through [`crate::WORKLOAD_PIO_PORT`].
    pub const EXITS_PIO: u64 = 1;
    /// `exits` by CPUID (leaf 0): on VMX and SVM an exit KVM handles in the kernel, never
    /// seen by the VMM.
    pub const EXITS_CPUID: u64 = 2;
    /// `fault` by a HLT at CPL 3 (#GP).
    pub const FAULT_HLT: u64 = 0;
    /// `fault` by UD2 (#UD).
    pub const FAULT_UD: u64 = 1;

    /// `hostile`: random bytes over the whole guest section, rewritten without pause.
    pub const HOSTILE_STORM: u64 = 0;
    /// `hostile`: a well-formed guest header with a wrong magic.
    pub const HOSTILE_MAGIC: u64 = 1;
    /// `hostile`: the right magic with major version 9.
    pub const HOSTILE_VERSION: u64 = 2;
    /// `hostile`: thread and CPU counts larger than the section can hold.
    pub const HOSTILE_COUNTS: u64 = 3;
    /// `hostile`: table offsets outside the section.
    pub const HOSTILE_OFFSETS: u64 = 4;
    /// `hostile`: thread record 0's sequence counter stuck odd; record 1 well-formed.
    pub const HOSTILE_ODD: u64 = 5;
    /// `hostile`: names with no NUL, with invalid UTF-8 and with control characters.
    pub const HOSTILE_NAMES: u64 = 6;
    /// `hostile`: one well-formed thread record rewritten back to back under the sequence
    /// protocol; every field that counts holds the same number, so a torn copy shows.
    pub const HOSTILE_REWRITE: u64 = 7;
    /// `hostile`: every mode above in turn, 10 ms each.
    pub const HOSTILE_ALL: u64 = 8;
    /// Names of the modes, index = mode.
    pub const HOSTILE_MODES: [&str; 9] = [
        "storm", "magic", "version", "counts", "offsets", "odd", "names", "rewrite", "all",
    ];
}

/// A workload as the guest reads it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkloadDesc {
    /// One of the [`workload`] kinds.
    pub kind: u32,
    /// [`workload::FLAG_NO_PUBLISH`]; the other bits are reserved, zero.
    pub flags: u32,
    /// Kind-specific parameters.
    pub params: [u64; 4],
}

/// The per-vCPU boot-info record. RDI holds its guest-physical address at entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BootInfo {
    /// [`BOOT_INFO_MAGIC`].
    pub magic: u32,
    /// [`BOOT_INFO_VERSION`].
    pub version: u32,
    /// This vCPU's index, 0-based.
    pub vcpu_index: u32,
    /// Number of vCPUs of the VM.
    pub vcpu_count: u32,
    /// TSC frequency in kHz, for converting rdtsc deltas to ns.
    pub tsc_khz: u64,
    /// Guest-physical address of the doorbell page.
    pub doorbell_gpa: u64,
    /// Guest-physical address of the PPA page, 0 when there is none.
    pub ppa_page_gpa: u64,
    /// Size of the PPA page in bytes, 0 when there is none.
    pub ppa_page_size: u64,
    /// A gap between two rdtsc reads longer than this (ns) counts as lost time.
    pub gap_threshold_ns: u64,
    /// What this vCPU runs.
    pub workload: WorkloadDesc,
    /// Guest-physical address of the first virtio-net device's MMIO window, 0 when none
    /// (minor 3).
    pub net_mmio_gpa: u64,
    /// Guest-physical address of a RAM area the network workload may use for its rings and
    /// buffers, 0 when none (minor 3).
    pub net_ram_gpa: u64,
    /// Size of that area (minor 3).
    pub net_ram_size: u64,
    /// Guest-physical address of the first virtio-blk device's MMIO window, 0 when none
    /// (minor 4).
    pub blk_mmio_gpa: u64,
    /// Guest-physical address of a RAM area the disk workload may use for its ring, headers
    /// and buffers, 0 when none (minor 4).
    pub blk_ram_gpa: u64,
    /// Size of that area (minor 4).
    pub blk_ram_size: u64,
    /// Zero; room for minor-version additions.
    pub reserved: [u64; 14],
}

impl BootInfo {
    /// An empty record with magic and version set.
    pub const fn new() -> Self {
        BootInfo {
            magic: BOOT_INFO_MAGIC,
            version: BOOT_INFO_VERSION,
            vcpu_index: 0,
            vcpu_count: 0,
            tsc_khz: 0,
            doorbell_gpa: DOORBELL_GPA,
            ppa_page_gpa: 0,
            ppa_page_size: 0,
            gap_threshold_ns: 2_000,
            workload: WorkloadDesc {
                kind: 0,
                flags: 0,
                params: [0; 4],
            },
            net_mmio_gpa: 0,
            net_ram_gpa: 0,
            net_ram_size: 0,
            blk_mmio_gpa: 0,
            blk_ram_gpa: 0,
            blk_ram_size: 0,
            reserved: [0; 14],
        }
    }

    /// The record as little-endian bytes, for the VMM to write into guest memory.
    pub fn to_bytes(&self) -> [u8; BOOT_INFO_SIZE] {
        let mut out = [0u8; BOOT_INFO_SIZE];
        let mut w = Writer {
            buf: &mut out,
            pos: 0,
        };
        w.u32(self.magic);
        w.u32(self.version);
        w.u32(self.vcpu_index);
        w.u32(self.vcpu_count);
        w.u64(self.tsc_khz);
        w.u64(self.doorbell_gpa);
        w.u64(self.ppa_page_gpa);
        w.u64(self.ppa_page_size);
        w.u64(self.gap_threshold_ns);
        w.u32(self.workload.kind);
        w.u32(self.workload.flags);
        for p in self.workload.params {
            w.u64(p);
        }
        w.u64(self.net_mmio_gpa);
        w.u64(self.net_ram_gpa);
        w.u64(self.net_ram_size);
        w.u64(self.blk_mmio_gpa);
        w.u64(self.blk_ram_gpa);
        w.u64(self.blk_ram_size);
        for r in self.reserved {
            w.u64(r);
        }
        out
    }
}

impl Default for BootInfo {
    fn default() -> Self {
        Self::new()
    }
}

struct Writer<'a> {
    buf: &'a mut [u8; BOOT_INFO_SIZE],
    pos: usize,
}

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) {
        self.buf[self.pos..self.pos + bytes.len()].copy_from_slice(bytes);
        self.pos += bytes.len();
    }
    fn u32(&mut self, v: u32) {
        self.put(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.put(&v.to_le_bytes());
    }
}

const _: () = {
    assert!(core::mem::size_of::<WorkloadDesc>() == 40);
    assert!(core::mem::size_of::<BootInfo>() == BOOT_INFO_SIZE);
    assert!(core::mem::offset_of!(BootInfo, tsc_khz) == 16);
    assert!(core::mem::offset_of!(BootInfo, doorbell_gpa) == 24);
    assert!(core::mem::offset_of!(BootInfo, gap_threshold_ns) == 48);
    assert!(core::mem::offset_of!(BootInfo, workload) == 56);
    assert!(core::mem::offset_of!(BootInfo, net_mmio_gpa) == 96);
    assert!(core::mem::offset_of!(BootInfo, blk_mmio_gpa) == 120);
    assert!(core::mem::offset_of!(BootInfo, reserved) == 144);
    assert!(doorbell::REPORT_BASE + 8 * doorbell::REPORT_KEYS <= DOORBELL_SIZE);
    assert!(report::NAMES.len() as u64 <= doorbell::REPORT_KEYS);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_info_layout_matches_numbers() {
        assert_eq!(core::mem::size_of::<BootInfo>(), 256);
        assert_eq!(core::mem::offset_of!(BootInfo, magic), 0);
        assert_eq!(core::mem::offset_of!(BootInfo, version), 4);
        assert_eq!(core::mem::offset_of!(BootInfo, vcpu_index), 8);
        assert_eq!(core::mem::offset_of!(BootInfo, vcpu_count), 12);
        assert_eq!(core::mem::offset_of!(BootInfo, ppa_page_gpa), 32);
        assert_eq!(core::mem::offset_of!(BootInfo, ppa_page_size), 40);
        assert_eq!(core::mem::offset_of!(WorkloadDesc, params), 8);
    }

    #[test]
    fn to_bytes_is_the_in_memory_layout() {
        let mut b = BootInfo::new();
        b.vcpu_index = 7;
        b.vcpu_count = 9;
        b.tsc_khz = 2_000_000;
        b.workload.kind = workload::PERIODIC;
        b.workload.params = [300, 3000, 10, 0];
        let bytes = b.to_bytes();
        // SAFETY: BootInfo is repr(C), made only of integers (no padding, asserted by the size
        // checks above), so viewing it as bytes is sound; the slice lives no longer than `b`.
        let raw = unsafe {
            core::slice::from_raw_parts((&b as *const BootInfo).cast::<u8>(), BOOT_INFO_SIZE)
        };
        assert_eq!(&bytes[..], raw);
        assert_eq!(&bytes[0..4], b"PPAB");
        assert_eq!(u64::from_le_bytes(bytes[64..72].try_into().unwrap()), 300);
    }
}
