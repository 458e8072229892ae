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
//! least [`RATE_MIN_CYCLES`] back (~14 ms at 2.45 GHz); the baseline moves on every
//! [`RATE_WINDOW_CYCLES`] (~3.5 s) so that a change of NTP's slew is followed. A stamp within
//! [`ANCHOR_CYCLES`] (~0.86 ms) of the last anchor is the anchor's time plus the TSC's advance
//! at that rate; any later one takes a new anchor. Stamps never go back. Each anchor checks the
//! extrapolation against the clock: a difference over [`DRIFT_MAX_NS`] and 100 ppm (a TSC that is not
//! synchronised after all, or a clocksource change) turns extrapolation off for the thread.
//!
//! Error: an anchor's pairing error is at most half its bracket; the rate's error is at most
//! the two anchors' pairing errors over the baseline, so at the first rate (the worst case)
//! `2 × 512 cycles / 2^25 cycles` = 31 ppm, ~26 ns over a whole anchor period, and typically
//! (brackets of ~100-300 cycles) a few ns; once the baseline spans a second, a fraction of a
//! ns. Until a rate is known, and where extrapolation is off, every stamp is a vDSO read.

use crate::arch::x86_64::tsc;
use crate::vdso::MonoClock;
use std::sync::OnceLock;

/// A stamp this many TSC cycles after the last anchor takes a new one (~0.86 ms at 2.45 GHz).
pub const ANCHOR_CYCLES: u64 = 1 << 21;
/// The least span of TSC cycles the rate is measured over (~14 ms at 2.45 GHz).
pub const RATE_MIN_CYCLES: u64 = 1 << 25;
/// The span after which the rate's baseline moves to the newest anchor (~3.5 s at 2.45 GHz).
pub const RATE_WINDOW_CYCLES: u64 = 1 << 33;
/// The widest TSC bracket around a clock reading that still makes an anchor.
pub const PAIR_MAX_CYCLES: u64 = 1024;
/// The largest difference between the extrapolated time and the clock at an anchor, beyond
/// 100 ppm of the time since the last one, before extrapolation is turned off for the thread.
pub const DRIFT_MAX_NS: u64 = 5_000;

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

/// One thread's stamp clock (see the module's documentation).
#[derive(Debug, Clone)]
pub struct StampClock {
    mono: MonoClock,
    /// Whether extrapolation is allowed (the host allows it and no anchor found it drifting).
    extrapolate: bool,
    /// The last anchor: TSC and CLOCK_MONOTONIC ns.
    at_tsc: u64,
    at_ns: u64,
    /// The rate's baseline anchor; `base_ns` 0 while there is none.
    base_tsc: u64,
    base_ns: u64,
    /// ns per TSC cycle, 32.32 fixed point; 0 while no rate is known.
    mult: u64,
    /// The last stamp given.
    last: u64,
}

impl StampClock {
    /// A clock reading `mono`, extrapolating where [`tsc_usable`] says so.
    pub fn new(mono: MonoClock) -> StampClock {
        Self::with(mono, tsc_usable())
    }

    /// A clock reading `mono`, extrapolating when `extrapolate` is true (tests choose).
    pub fn with(mono: MonoClock, extrapolate: bool) -> StampClock {
        StampClock {
            mono,
            extrapolate,
            at_tsc: 0,
            at_ns: 0,
            base_tsc: 0,
            base_ns: 0,
            mult: 0,
            last: 0,
        }
    }

    #[cfg(test)]
    /// Whether stamps are being extrapolated by the TSC now (a rate is known and no anchor
    /// has found the TSC drifting).
    pub fn extrapolating(&self) -> bool {
        self.extrapolate && self.mult != 0
    }

    /// CLOCK_MONOTONIC now, ns (see the module's documentation for how and how exactly).
    #[inline]
    pub fn now_ns(&mut self) -> u64 {
        if self.mult != 0 {
            let d = tsc::read_ordered().wrapping_sub(self.at_tsc);
            if d < ANCHOR_CYCLES {
                return self.give(self.at_ns + scale(d, self.mult));
            }
        }
        self.anchor()
    }

    /// CLOCK_MONOTONIC read through the vDSO, never extrapolated (stamps still never go back).
    #[inline]
    pub fn exact_ns(&mut self) -> u64 {
        let ns = self.mono.now_ns();
        self.give(ns)
    }

    /// CLOCK_MONOTONIC read through the vDSO, taken as an anchor where it can be one.
    #[cold]
    #[inline(never)]
    fn anchor(&mut self) -> u64 {
        if !self.extrapolate {
            return self.give(self.mono.now_ns());
        }
        let before = tsc::read_ordered();
        let ns = self.mono.now_ns();
        let after = tsc::read_ordered();
        let bracket = after.wrapping_sub(before);
        if bracket > PAIR_MAX_CYCLES {
            return self.give(ns);
        }
        let t = before + bracket / 2;
        if self.mult != 0 && self.drifted(t, ns) {
            self.extrapolate = false;
            self.mult = 0;
            return self.give(ns);
        }
        if self.base_ns == 0 {
            (self.base_tsc, self.base_ns) = (t, ns);
        } else {
            let span = t.wrapping_sub(self.base_tsc);
            if (RATE_MIN_CYCLES..1 << 62).contains(&span) && ns > self.base_ns {
                let mult = (u128::from(ns - self.base_ns) << 32) / u128::from(span);
                self.mult = u64::try_from(mult).unwrap_or(0);
                if span >= RATE_WINDOW_CYCLES {
                    (self.base_tsc, self.base_ns) = (t, ns);
                }
            }
        }
        (self.at_tsc, self.at_ns) = (t, ns);
        self.give(ns)
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
mod tests {
    use super::*;

    /// Reads both clocks until the stamp clock has a rate (or gives up after `max_ms`).
    fn until_rate(c: &mut StampClock, max_ms: u64) -> bool {
        let end = crate::sync::now_ns() + max_ms * 1_000_000;
        while !c.extrapolating() && crate::sync::now_ns() < end {
            c.now_ns();
            std::thread::sleep(std::time::Duration::from_micros(500));
        }
        c.extrapolating()
    }

    /// A clock of this host's with its rate known; None (said on stderr) where the host's
    /// clocksource is not the TSC, which leaves nothing to extrapolate.
    fn with_rate() -> Option<StampClock> {
        if !tsc_usable() {
            eprintln!("the TSC is not this host's clocksource: nothing to extrapolate");
            return None;
        }
        let mut c = StampClock::new(MonoClock::get());
        assert!(until_rate(&mut c, 2_000), "no rate after 2 s: {c:?}");
        Some(c)
    }

    #[test]
    fn without_extrapolation_every_stamp_is_the_clock() {
        let mut c = StampClock::with(MonoClock::get(), false);
        for _ in 0..1000 {
            let a = crate::sync::now_ns();
            let s = c.now_ns();
            let b = crate::sync::now_ns();
            assert!(a <= s && s <= b, "{a} <= {s} <= {b}");
        }
        assert!(!c.extrapolating());
    }

    #[test]
    fn extrapolated_stamps_follow_the_clock_and_never_go_back() {
        let Some(mut c) = with_rate() else { return };
        // Each stamp lies between two clock reads around it, give or take the extrapolation's
        // error (a few ns; 2 µs bounds it with room for a first, short baseline).
        let mut last = 0;
        let mut worst = 0i64;
        for i in 0..20_000 {
            let a = crate::sync::now_ns();
            let s = c.now_ns();
            let b = crate::sync::now_ns();
            assert!(s >= last, "stamp {i} went back: {last} then {s}");
            last = s;
            let off = if s < a {
                a as i64 - s as i64
            } else {
                s.saturating_sub(b) as i64
            };
            worst = worst.max(off);
            if i % 1000 == 0 {
                std::thread::sleep(std::time::Duration::from_micros(300));
            }
        }
        assert!(
            c.extrapolating(),
            "an anchor turned extrapolation off: {c:?}"
        );
        assert!(
            worst <= 2_000,
            "a stamp was {worst} ns outside its bracket: {c:?}"
        );
    }

    #[test]
    fn a_tsc_that_drifts_from_the_clock_turns_extrapolation_off() {
        let Some(mut c) = with_rate() else { return };
        // A rate 1 % off: the next anchor, 2 ms on or later, finds 20 µs of drift or more. A
        // stamp whose bracket is too wide (the vDSO's pages cold after the sleep, an interrupt)
        // makes no anchor and checks nothing, and the next stamp tries again: a few tries.
        c.mult += c.mult / 100;
        std::thread::sleep(std::time::Duration::from_millis(2));
        let at = c.at_tsc;
        for _ in 0..100 {
            c.now_ns();
            if c.at_tsc != at || !c.extrapolating() {
                break;
            }
        }
        assert!(!c.extrapolating(), "a 1 % rate error went unnoticed: {c:?}");
        let a = crate::sync::now_ns();
        let s = c.now_ns();
        assert!(s >= a, "after it, stamps are the clock's: {s} < {a}");
    }

    #[test]
    fn scale_is_fixed_point() {
        assert_eq!(scale(1_000, 1 << 32), 1_000);
        assert_eq!(scale(1_000, 1 << 31), 500);
        assert_eq!(scale(u64::MAX >> 4, 2 << 32), (u64::MAX >> 4) * 2);
    }
}
