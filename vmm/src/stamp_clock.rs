//! The vCPU thread's wall clock for its exit and entry stamps: CLOCK_MONOTONIC, read through
//! the vDSO ([`MonoClock`]) about once a millisecond and extrapolated in between by the TSC,
//! where the TSC is the kernel's own clocksource.
//!
//! Why: on the PVM development host, which flushes the TLB at every exit, the clock read just
//! after an exit was the largest single step of level basic's premium over level off: the
//! vDSO's code and its data page are two pages the exit has not touched yet, ~250-300 cycles of
//! page walks a read (docs/design.md, "The exit path in fewer pages"). A TSC read touches no
//! memory; the conversion uses four words of this struct, which lives with the loop.
//!
//! How: each anchor is one reading of CLOCK_MONOTONIC bracketed by two TSC reads (a bracket
//! wider than [`PAIR_MAX_CYCLES`], a preemption or an interrupt in between, is no anchor). The
//! rate, ns per TSC cycle, is the clock's advance over the TSC's since a baseline anchor at
//! least [`RATE_MIN_CYCLES`] back (~14 ms at 2.45 GHz). Once the baseline is half of
//! [`RATE_WINDOW_CYCLES`] (~1.75 s) old, an anchor is noted as the next baseline, and the
//! baseline moves to it when an anchor is half a window after that: the rate is then always
//! measured over half a window to a window, and a change of NTP's slew is followed within
//! seconds. A
//! stamp within [`ANCHOR_CYCLES`] (~0.86 ms) of the last anchor is the anchor's time plus the
//! TSC's advance at that rate; any later one takes a new anchor. Stamps never go back. Each
//! anchor checks the extrapolation against the clock: a difference over [`DRIFT_MAX_NS`] plus
//! 100 ppm (a step in the clock's rate, as chrony's fast slews make, or a TSC that jumped)
//! drops the rate, which is measured again from that anchor on; after [`DRIFTS_MAX`] such
//! drops (a TSC that is not synchronised after all) the thread stops extrapolating. So does a
//! thread whose first [`FAILED_ANCHORS_MAX`] anchors all fail (a TSC read that traps, whose
//! brackets are never narrow): its stamps are then plain vDSO reads, as where the host does
//! not allow extrapolation.
//!
//! Error (docs/accounting.md, "The stamp clock"): an anchor's pairing error is at most half its
//! bracket (~210 ns at 2.45 GHz), so a duration between stamps on either side of an anchor can
//! be off by twice that at worst; typically (brackets of ~100-300 cycles) by a few tens of ns.
//! The rate's error is at most the two anchors' pairing errors over the baseline: 31 ppm at
//! the first rate (2^25 cycles), ~26 ns over an anchor period, during a thread's first ~1.75 s;
//! under 0.3 ppm after. Until a rate is known, and where extrapolation is off, every stamp is a
//! vDSO read.
//!
//! What the thread is doing is published in its [`StampStatus`] (mode and drift count, the
//! `stamp_clock` fields of its figures), written in the anchor path only when it changes.

use crate::arch::x86_64::tsc;
use crate::vdso::MonoClock;
use ppa_vmm_api::StampClockMode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

/// A stamp this many TSC cycles after the last anchor takes a new one (~0.86 ms at 2.45 GHz).
pub const ANCHOR_CYCLES: u64 = 1 << 21;
/// The least span of TSC cycles the rate is measured over (~14 ms at 2.45 GHz).
pub const RATE_MIN_CYCLES: u64 = 1 << 25;
/// The span the rate is measured over once the thread has run for half of it: between half
/// of it and all of it (~1.75-3.5 s at 2.45 GHz).
pub const RATE_WINDOW_CYCLES: u64 = 1 << 33;
/// The widest TSC bracket around a clock reading that still makes an anchor.
pub const PAIR_MAX_CYCLES: u64 = 1024;
/// The largest difference between the extrapolated time and the clock at an anchor, beyond
/// 100 ppm of the time since the last one, before the rate is dropped and measured again.
pub const DRIFT_MAX_NS: u64 = 5_000;
/// Drops of the rate after which a thread stops extrapolating.
pub const DRIFTS_MAX: u32 = 16;
/// Failed anchors in a row, before any rate is known, after which a thread stops trying.
pub const FAILED_ANCHORS_MAX: u32 = 1_000;

/// Where the kernel's clocksource is named.
const CLOCKSOURCE: &str = "/sys/devices/system/clocksource/clocksource0/current_clocksource";

/// Whether this host lets the stamp clock extrapolate: the CPU's TSC is invariant and the
/// kernel keeps CLOCK_MONOTONIC on it (its clocksource is `tsc`, which it keeps only while it
/// finds the TSC synchronised across CPUs). Read once; `Vm::run` asks before its threads'
/// system-call filters are armed.
pub fn tsc_usable() -> bool {
    static USABLE: OnceLock<bool> = OnceLock::new();
    *USABLE.get_or_init(|| {
        tsc::invariant() && std::fs::read_to_string(CLOCKSOURCE).is_ok_and(|s| s.trim() == "tsc")
    })
}

/// What the stamp clock reads: the TSC and CLOCK_MONOTONIC (the host's in [`HostClocks`], a
/// script in tests).
pub trait Clocks {
    /// The TSC, read in order with the loads before it.
    fn tsc(&mut self) -> u64;
    /// CLOCK_MONOTONIC, ns.
    fn mono(&mut self) -> u64;
}

/// The host's clocks: `lfence; rdtsc` and the vDSO's `clock_gettime`.
#[derive(Debug, Clone, Copy)]
pub struct HostClocks(pub MonoClock);

impl Clocks for HostClocks {
    #[inline]
    fn tsc(&mut self) -> u64 {
        tsc::read_ordered()
    }

    #[inline]
    fn mono(&mut self) -> u64 {
        self.0.now_ns()
    }
}

/// What a thread's stamp clock is doing, for readers: its mode and how many times it dropped
/// its rate (one word, written by the thread when either changes).
#[derive(Debug, Default)]
pub struct StampStatus(AtomicU32);

/// The modes in the order of their codes in [`StampStatus`]; code 0 is "not started".
const MODES: [StampClockMode; 4] = [
    StampClockMode::Tsc,
    StampClockMode::Learning,
    StampClockMode::Vdso,
    StampClockMode::GivenUp,
];

impl StampStatus {
    /// The mode (None before the thread's clock started) and the drops of the rate so far.
    pub fn read(&self) -> (Option<StampClockMode>, u32) {
        let w = self.0.load(Ordering::Relaxed);
        let mode = (w & 0xff)
            .checked_sub(1)
            .and_then(|i| MODES.get(i as usize));
        (mode.copied(), w >> 8)
    }

    /// The word for `mode` and `drifts`.
    fn word(mode: StampClockMode, drifts: u32) -> u32 {
        let i = MODES.iter().position(|&m| m == mode).unwrap_or(0) as u32;
        (i + 1) | (drifts.min(u32::MAX >> 8) << 8)
    }
}

/// One thread's stamp clock (see the module's documentation). Not `Clone`: two copies would
/// each keep their own stamps from going back, not each other's.
#[derive(Debug)]
pub struct StampClock<C: Clocks = HostClocks> {
    clocks: C,
    /// Whether the host allows extrapolation ([`tsc_usable`]).
    allowed: bool,
    /// Whether extrapolation is allowed (the host allows it, and it has not been given up).
    extrapolate: bool,
    /// The last anchor: TSC and CLOCK_MONOTONIC ns.
    at_tsc: u64,
    at_ns: u64,
    /// The rate's baseline anchor; `base_ns` 0 while there is none.
    base_tsc: u64,
    base_ns: u64,
    /// The first anchor at least half a window after the baseline, the next baseline once an
    /// anchor is half a window after it; `mid_ns` 0 while there is none.
    mid_tsc: u64,
    mid_ns: u64,
    /// ns per TSC cycle, 32.32 fixed point; 0 while no rate is known.
    mult: u64,
    /// The last stamp given.
    last: u64,
    /// Drops of the rate so far.
    drifts: u32,
    /// Failed anchors in a row while no rate was known.
    failed: u32,
    /// Where the mode and drifts are published, and the word last written there.
    status: Arc<StampStatus>,
    published: u32,
}

impl StampClock<HostClocks> {
    /// A clock reading `mono`, extrapolating where [`tsc_usable`] says so, publishing what it
    /// does in `status`.
    pub fn new(mono: MonoClock, status: Arc<StampStatus>) -> Self {
        Self::with(HostClocks(mono), tsc_usable()).publishing(status)
    }
}

impl<C: Clocks> StampClock<C> {
    /// A clock reading `clocks`, extrapolating when `extrapolate` is true.
    pub fn with(clocks: C, extrapolate: bool) -> Self {
        let mut c = StampClock {
            clocks,
            allowed: extrapolate,
            extrapolate,
            at_tsc: 0,
            at_ns: 0,
            base_tsc: 0,
            base_ns: 0,
            mid_tsc: 0,
            mid_ns: 0,
            mult: 0,
            last: 0,
            drifts: 0,
            failed: 0,
            status: Arc::default(),
            published: 0,
        };
        c.publish();
        c
    }

    /// The clock, publishing what it does in `status` from now on.
    pub fn publishing(mut self, status: Arc<StampStatus>) -> Self {
        self.status = status;
        self.published = 0;
        self.publish();
        self
    }

    /// What it does now (its drops of the rate are in `drifts`; both are published by
    /// [`Self::publish`]).
    pub fn mode(&self) -> StampClockMode {
        match (self.allowed, self.extrapolate, self.mult != 0) {
            (false, _, _) => StampClockMode::Vdso,
            (true, false, _) => StampClockMode::GivenUp,
            (true, true, false) => StampClockMode::Learning,
            (true, true, true) => StampClockMode::Tsc,
        }
    }

    /// Writes the mode and drifts to the status word where they changed.
    fn publish(&mut self) {
        let w = StampStatus::word(self.mode(), self.drifts);
        if w != self.published {
            self.published = w;
            self.status.0.store(w, Ordering::Relaxed);
        }
    }

    /// CLOCK_MONOTONIC now, ns (see the module's documentation for how and how exactly).
    #[inline]
    pub fn now_ns(&mut self) -> u64 {
        if self.mult != 0 {
            let d = self.clocks.tsc().wrapping_sub(self.at_tsc);
            if d < ANCHOR_CYCLES {
                return self.give(self.at_ns + scale(d, self.mult));
            }
        }
        self.anchor()
    }

    /// CLOCK_MONOTONIC read through the vDSO, never extrapolated; like every stamp, never
    /// before the last one (so just after extrapolated stamps it can be up to their error
    /// ahead of the clock).
    #[inline]
    pub fn exact_ns(&mut self) -> u64 {
        let ns = self.clocks.mono();
        self.give(ns)
    }

    /// CLOCK_MONOTONIC read through the vDSO, taken as an anchor where it can be one.
    #[cold]
    #[inline(never)]
    fn anchor(&mut self) -> u64 {
        if !self.extrapolate {
            return self.exact_ns();
        }
        let before = self.clocks.tsc();
        let ns = self.clocks.mono();
        let after = self.clocks.tsc();
        let bracket = after.wrapping_sub(before);
        if bracket > PAIR_MAX_CYCLES {
            if self.mult == 0 {
                self.failed += 1;
                self.extrapolate = self.failed < FAILED_ANCHORS_MAX;
                self.publish();
            }
            return self.give(ns);
        }
        self.failed = 0;
        let t = before + bracket / 2;
        if self.mult != 0 && self.drifted(t, ns) {
            // The rate no longer holds: measure it again from this anchor on.
            self.drifts += 1;
            self.extrapolate = self.drifts < DRIFTS_MAX;
            (self.mult, self.base_ns, self.mid_ns) = (0, 0, 0);
        }
        self.learn(t, ns);
        (self.at_tsc, self.at_ns) = (t, ns);
        self.publish();
        self.give(ns)
    }

    /// Takes the anchor (`t`, `ns`) into the rate: the baseline's first anchor, else the rate
    /// over the baseline's span once it is long enough, and the baseline's move.
    fn learn(&mut self, t: u64, ns: u64) {
        if self.base_ns == 0 {
            (self.base_tsc, self.base_ns) = (t, ns);
            return;
        }
        let span = t.wrapping_sub(self.base_tsc);
        if !(RATE_MIN_CYCLES..1 << 62).contains(&span) || ns <= self.base_ns {
            return;
        }
        let mult = (u128::from(ns - self.base_ns) << 32) / u128::from(span);
        self.mult = u64::try_from(mult).unwrap_or(0);
        let half = RATE_WINDOW_CYCLES / 2;
        if self.mid_ns == 0 {
            if span >= half {
                (self.mid_tsc, self.mid_ns) = (t, ns);
            }
        } else if t.wrapping_sub(self.mid_tsc) >= half {
            (self.base_tsc, self.base_ns) = (self.mid_tsc, self.mid_ns);
            (self.mid_tsc, self.mid_ns) = (t, ns);
        }
    }

    /// Whether the time extrapolated from the last anchor to TSC `t` differs from the clock's
    /// `ns` by more than [`DRIFT_MAX_NS`] plus 100 ppm of the time since the anchor (what a
    /// first, short baseline's rate can be off by, with room).
    fn drifted(&self, t: u64, ns: u64) -> bool {
        let predicted = if t >= self.at_tsc {
            self.at_ns + scale(t - self.at_tsc, self.mult)
        } else {
            self.at_ns.saturating_sub(scale(self.at_tsc - t, self.mult))
        };
        predicted.abs_diff(ns) > DRIFT_MAX_NS + ns.saturating_sub(self.at_ns) / 10_000
    }

    /// `ns`, or the last stamp if that is later: stamps never go back.
    #[inline]
    fn give(&mut self, ns: u64) -> u64 {
        let ns = ns.max(self.last);
        self.last = ns;
        ns
    }
}

/// `cycles` at `mult` ns per cycle (32.32 fixed point).
#[inline]
fn scale(cycles: u64, mult: u64) -> u64 {
    ((u128::from(cycles) * u128::from(mult)) >> 32) as u64
}

#[cfg(test)]
mod tests;
