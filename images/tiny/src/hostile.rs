//! The `hostile` workload: a guest that writes bad data into the PPA page's guest section on
//! purpose, as fast as it can, so that tests can check the VMM's decoder and everything
//! around it stay undisturbed (issue 7, "What bad input gets").
//!
//! Data flow: [`run`] finds the guest section through the boot-info record, then, until its
//! deadline, rewrites the section in one mode (`ppa_guest_abi::workload::HOSTILE_*`) without
//! pause, or in every mode in turn, 10 ms each. All writes are volatile stores of words into
//! the shared section; nothing here makes an exit.

use ppa_guest_abi::ppa_page::{GuestHeader, GuestThread, Record, COMM_LEN, GUEST_MAGIC, MAJOR};
use ppa_guest_abi::workload as w;

use crate::ppa::Section;
use crate::{rdtsc, Ctx};

/// Modes with their own pattern (all but `HOSTILE_ALL`).
const MODES: u64 = w::HOSTILE_ALL;
/// Time in each mode when cycling through all of them.
const MODE_NS: u64 = 10_000_000;

/// A well-formed header for `threads` thread records at offset 64 and no CPU records.
fn header(threads: u32) -> GuestHeader {
    GuestHeader {
        seq: 0,
        magic: GUEST_MAGIC,
        major: MAJOR,
        minor: 0,
        nr_cpus: 1,
        updated_ns: 0,
        threads_offset: 64,
        threads_count: threads,
        thread_record_size: core::mem::size_of::<GuestThread>() as u32,
        cpus_offset: 64,
        cpus_count: 0,
        cpu_record_size: 192,
        transient_count: 0,
        transient_cpu_ns: 0,
    }
}

/// Writes into the guest section, each write checked against its length ([`Section`]).
struct Writer {
    sec: Section,
}

impl Writer {
    /// Stores `v` at byte offset `off` when the word lies inside the section.
    fn word(&self, off: u64, v: u64) {
        self.sec.word(off, v);
    }

    /// Writes `h` at offset 0 (plainly: seq is whatever `h` says).
    fn header(&self, h: &GuestHeader) {
        self.record(0, h);
    }

    /// Copies the record `r` to offset `off`, word by word (plainly: no protocol).
    fn record<T: Record>(&self, off: u64, r: &T) {
        let words = core::mem::size_of::<T>() / 8;
        let p = r as *const T as *const u64;
        for i in 0..words {
            // SAFETY: `T: Record` is repr(C) integers with no padding and a size that is a
            // multiple of 8 (the trait's contract), so word `i` < size/8 is in bounds and
            // initialised; read_unaligned needs no alignment.
            let v = unsafe { core::ptr::read_unaligned(p.add(i)) };
            self.word(off + 8 * i as u64, v);
        }
    }

    /// A thread record whose name is `comm`, at slot `slot` of a table at 64.
    fn thread(&self, slot: u64, comm: [u8; COMM_LEN], seq: u32) {
        let t = GuestThread {
            seq,
            tid: slot as u32 + 100,
            comm,
            on_cpu_ns: 1000 * (slot + 1),
            ..Default::default()
        };
        self.record(64 + slot * core::mem::size_of::<GuestThread>() as u64, &t);
    }
}

/// Writes one pass of `mode`; `x` is the random state, `k` the pass number.
fn pass(wr: &Writer, mode: u64, x: &mut u64, k: u64) {
    match mode {
        w::HOSTILE_STORM => {
            let mut off = 0;
            while off < wr.sec.size() {
                *x ^= *x << 13;
                *x ^= *x >> 7;
                *x ^= *x << 17;
                wr.word(off, *x);
                off += 8;
            }
        }
        w::HOSTILE_MAGIC => wr.header(&GuestHeader {
            magic: 0xDEAD_BEEF,
            ..header(1)
        }),
        w::HOSTILE_VERSION => wr.header(&GuestHeader {
            major: 9,
            ..header(1)
        }),
        w::HOSTILE_COUNTS => wr.header(&GuestHeader {
            threads_count: u32::MAX,
            cpus_count: 1000,
            ..header(1)
        }),
        w::HOSTILE_OFFSETS => wr.header(&GuestHeader {
            threads_offset: 0xFFFF_FF00,
            cpus_offset: wr.sec.size() as u32 - 64,
            cpus_count: 1,
            ..header(1)
        }),
        w::HOSTILE_ODD => {
            wr.header(&header(2));
            wr.thread(0, *b"stuck\0\0\0\0\0\0\0\0\0\0\0", 0x7777_7777);
            wr.thread(1, *b"fine\0\0\0\0\0\0\0\0\0\0\0\0", 2);
        }
        w::HOSTILE_NAMES => {
            wr.header(&header(3));
            wr.thread(0, *b"AAAAAAAAAAAAAAAA", 2);
            wr.thread(1, *b"bad\xff\xfe\0\0\0\0\0\0\0\0\0\0\0", 2);
            wr.thread(2, *b"bell\x07\x1b[2J\0\0\0\0\0\0\0", 2);
        }
        _ => {
            // HOSTILE_REWRITE: every counting field holds k, so a torn copy shows. The header
            // is the same bytes every pass, so rewriting it plainly cannot tear it.
            wr.header(&header(1));
            let t = GuestThread {
                tid: 1,
                comm: *b"rewrite\0\0\0\0\0\0\0\0\0",
                on_cpu_ns: k,
                utime_ns: k,
                stime_ns: k,
                run_delay_ns: k,
                updated_ns: k,
                work: k,
                reserved: [k; 7],
                ..Default::default()
            };
            // This vCPU is the only writer that follows the protocol.
            wr.sec.write(64, &t);
        }
    }
}

/// Runs `mode` for `ms`; returns false when there is no PPA page to attack.
pub fn run(ctx: &mut Ctx, ms: u64, mode: u64) -> bool {
    let Some((sec, _)) = crate::ppa::find(ctx.boot) else {
        return false;
    };
    if sec.size() < 64 + core::mem::size_of::<GuestThread>() as u64 * 3 {
        return false;
    }
    let wr = Writer { sec };
    let t0 = rdtsc();
    let deadline = t0.saturating_add(ctx.clk.cycles(ms, 1_000_000));
    let per_mode = ctx.clk.cycles(MODE_NS, 1).max(1);
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(ctx.boot.vcpu_index);
    let mut k = 0u64;
    loop {
        let now = rdtsc();
        if now >= deadline {
            break;
        }
        let m = if mode == w::HOSTILE_ALL {
            (now - t0) / per_mode % MODES
        } else {
            mode
        };
        pass(&wr, m, &mut x, k);
        k += 1;
    }
    ctx.st.iterations = k;
    true
}
