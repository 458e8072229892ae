//! How early a vCPU's kick timer fires before the CPU target it stops at: the *lead*, learnt
//! per vCPU from its own firings. Pure: the vCPU thread feeds it one sample per firing; tests
//! feed it numbers.
//!
//! Data flow. The kick timer (`vcpu::kick_timer`) is armed `lead` before the wall time at
//! which the vCPU, running on, reaches its CPU target. When it fires, the vCPU reads its CPU
//! clock: with less than `lead` of CPU left it spins in user space until its clock reaches the
//! target and stops there (issue 29: the stop then lands on the target, within a clock read,
//! instead of wherever the timer's latency put it); with more left it re-arms. Each firing is
//! one sample: the CPU the vCPU used after the time its timer was armed for (`lead` − the CPU
//! left at the firing), which is the timer's latency in CPU terms (the hrtimer's expiry, the
//! signal, leaving the guest and KVM_RUN; less where the thread was preempted meanwhile). The
//! lead is the largest of the last [`WINDOW`] samples plus [`PAD_NS`], within
//! [`MIN_LEAD_NS`]…[`MAX_LEAD_NS`]: a firing later than that (about 1 in 65) stops
//! past its target as before, and every stop costs the vCPU at most the lead of spinning,
//! counted as VMM time (docs/limits.md, "The exact stop").

/// Samples the lead is taken over.
pub const WINDOW: usize = 64;
/// The lead before any firing.
pub const INITIAL_LEAD_NS: u64 = 100_000;
/// Added to the largest sample.
pub const PAD_NS: u64 = 20_000;
/// Bounds of the lead: no less than a stop decision's own cost, no more than this much
/// spinning per stop.
pub const MIN_LEAD_NS: u64 = 10_000;
/// See [`MIN_LEAD_NS`].
pub const MAX_LEAD_NS: u64 = 250_000;

/// A vCPU's learnt timer lead: a ring of the last [`WINDOW`] firings' CPU latencies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lead {
    /// 0 where no firing was recorded yet: a sample is never below 0, so the window's
    /// largest is the same with or without the unused slots.
    samples: [u64; WINDOW],
    next: usize,
    lead_ns: u64,
}

impl Default for Lead {
    fn default() -> Self {
        Lead {
            samples: [0; WINDOW],
            next: 0,
            lead_ns: INITIAL_LEAD_NS,
        }
    }
}

impl Lead {
    /// The lead now, ns.
    pub fn get(&self) -> u64 {
        self.lead_ns
    }

    /// One firing: the timer was armed `armed_lead_ns` before the vCPU would reach
    /// `target_ns` of CPU, and its CPU clock read `cpu_ns` when it looked. The sample is the
    /// CPU used since the armed-for time (0 when the vCPU ran less than the wall time: halted
    /// or preempted), and the lead becomes the largest of the window plus [`PAD_NS`].
    pub fn learn(&mut self, armed_lead_ns: u64, target_ns: u64, cpu_ns: u64) {
        let sample = cpu_ns
            .saturating_add(armed_lead_ns)
            .saturating_sub(target_ns);
        self.samples[self.next] = sample;
        self.next = (self.next + 1) % WINDOW;
        let worst = self.samples.iter().copied().max().unwrap_or(0);
        self.lead_ns = worst.saturating_add(PAD_NS).clamp(MIN_LEAD_NS, MAX_LEAD_NS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lead_covers_the_worst_recent_latency() {
        let mut l = Lead::default();
        assert_eq!(l.get(), INITIAL_LEAD_NS);
        // Armed 100 µs early, the vCPU read its clock 40 µs of CPU before its target: the
        // firing took 60 µs of CPU.
        l.learn(100_000, 1_000_000, 960_000);
        assert_eq!(l.get(), 60_000 + PAD_NS);
        l.learn(l.get(), 2_000_000, 2_000_000 - l.get() + 30_000);
        assert_eq!(
            l.get(),
            60_000 + PAD_NS,
            "a shorter latency keeps the worst"
        );
        // Armed 65 µs early (60 + the pad), read 20 µs past the target: 85 µs.
        l.learn(l.get(), 3_000_000, 3_000_000 + 20_000);
        assert_eq!(
            l.get(),
            60_000 + PAD_NS + 20_000 + PAD_NS,
            "a stop past the target widens it"
        );
    }

    #[test]
    fn a_late_firing_leaves_the_window() {
        let mut l = Lead::default();
        l.learn(100_000, 1_000_000, 1_100_000); // 200 µs
        assert_eq!(l.get(), 200_000 + PAD_NS);
        for k in 0..WINDOW as u64 {
            l.learn(
                l.get(),
                10_000_000 * (k + 2),
                10_000_000 * (k + 2) - l.get() + 50_000,
            );
        }
        assert_eq!(
            l.get(),
            50_000 + PAD_NS,
            "a window of firings of 50 µs later"
        );
    }

    #[test]
    fn the_lead_is_bounded() {
        let mut l = Lead::default();
        l.learn(100_000, 1_000_000, 50_000_000);
        assert_eq!(
            l.get(),
            MAX_LEAD_NS,
            "a millisecond's burst costs at most the cap"
        );
        let mut l = Lead::default();
        l.learn(100_000, 1_000_000, 0);
        assert_eq!(
            l.get(),
            PAD_NS.max(MIN_LEAD_NS),
            "a halted vCPU: no latency seen"
        );
    }
}
