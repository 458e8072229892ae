//! CPU pressure of a VM and of its vCPU groups, in the terms of Linux's PSI (spec section
//! 11, docs/accounting.md "Pressure"): the `pressure` command's result, the `pressure` member
//! of `stats`, and the trigger a `subscribe` may carry.

use serde::{Deserialize, Serialize};

/// Which of PSI's two figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PressureKind {
    /// At least one non-idle vCPU stalled.
    Some,
    /// Every non-idle vCPU stalled, at least one being non-idle.
    Full,
}

impl PressureKind {
    /// The word on the wire.
    pub fn name(self) -> &'static str {
        match self {
            PressureKind::Some => "some",
            PressureKind::Full => "full",
        }
    }
}

/// One line of a PSI file: the running averages and the total.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PressureLine {
    /// Share of the last ~10 s stalled, percent (two decimals, as Linux prints it).
    pub avg10: f64,
    /// Likewise over ~60 s.
    pub avg60: f64,
    /// Likewise over ~300 s.
    pub avg300: f64,
    /// Stalled time since the VM started, µs.
    pub total_us: u64,
}

impl PressureLine {
    /// A line from averages in hundredths of a percent and a total in µs.
    pub fn from_hundredths(avg: [u32; 3], total_us: u64) -> Self {
        let pct = |h: u32| f64::from(h) / 100.0;
        PressureLine {
            avg10: pct(avg[0]),
            avg60: pct(avg[1]),
            avg300: pct(avg[2]),
            total_us,
        }
    }
}

/// `some` and `full` of one VM or group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Pressure {
    /// At least one non-idle vCPU stalled.
    pub some: PressureLine,
    /// Every non-idle vCPU stalled.
    pub full: PressureLine,
    /// True when part of the figures is an estimate: some tick combined the vCPUs' stall by
    /// the overlap rule because their state intervals were not known (level basic, a vCPU
    /// without context-switch records, records lost), in a case their totals did not decide
    /// (docs/accounting.md, "Pressure"). False: measured from every vCPU's own intervals.
    #[serde(default)]
    pub estimated: bool,
}

impl Pressure {
    /// The line of `kind`.
    pub fn line(&self, kind: PressureKind) -> &PressureLine {
        match kind {
            PressureKind::Some => &self.some,
            PressureKind::Full => &self.full,
        }
    }
}

/// One vCPU group's pressure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GroupPressure {
    /// The group's name (`--vcpu-group NAME:...`).
    pub name: String,
    /// Its vCPUs.
    pub vcpus: Vec<usize>,
    /// Its pressure.
    #[serde(flatten)]
    pub pressure: Pressure,
}

/// Result of `pressure`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PressureReport {
    /// VM uptime when the figures were computed, ns (they are refreshed every 8 ms).
    pub uptime_ns: u64,
    /// The whole VM.
    pub vm: Pressure,
    /// Each vCPU group.
    pub groups: Vec<GroupPressure>,
}

/// Shortest trigger window, µs (PSI's own).
pub const TRIGGER_MIN_WINDOW_US: u64 = 500_000;
/// Longest trigger window, µs (PSI's own).
pub const TRIGGER_MAX_WINDOW_US: u64 = 10_000_000;

/// A pressure trigger (`subscribe`'s `pressure` member): a `pressure` event when the stall of
/// `kind` within a window of `window_us` exceeds `threshold_us`, at most one per window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PressureTrigger {
    /// `some` or `full`.
    pub kind: PressureKind,
    /// Stall within one window that fires it, µs (0 < T ≤ window).
    pub threshold_us: u64,
    /// The window, µs (500 ms to 10 s).
    pub window_us: u64,
}

impl PressureTrigger {
    /// Checks the ranges; the error is one sentence for the client.
    pub fn validate(&self) -> Result<(), String> {
        if !(TRIGGER_MIN_WINDOW_US..=TRIGGER_MAX_WINDOW_US).contains(&self.window_us) {
            return Err(format!(
                "a pressure trigger's window_us must be from {TRIGGER_MIN_WINDOW_US} (500 ms) to \
                 {TRIGGER_MAX_WINDOW_US} (10 s), not {}",
                self.window_us
            ));
        }
        if self.threshold_us == 0 || self.threshold_us > self.window_us {
            return Err(format!(
                "a pressure trigger's threshold_us must be above 0 and at most its window_us \
                 ({}), not {}",
                self.window_us, self.threshold_us
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triggers_are_checked_against_psis_ranges() {
        let t = |threshold_us, window_us| PressureTrigger {
            kind: PressureKind::Some,
            threshold_us,
            window_us,
        };
        assert!(t(100_000, 1_000_000).validate().is_ok());
        assert!(t(500_000, 500_000).validate().is_ok());
        assert!(t(1, 10_000_000).validate().is_ok());
        let e = t(100, 499_999).validate().unwrap_err();
        assert!(e.contains("window_us must be from 500000"), "{e}");
        assert!(t(100, 10_000_001).validate().is_err());
        let e = t(0, 1_000_000).validate().unwrap_err();
        assert!(e.contains("threshold_us must be above 0"), "{e}");
        assert!(t(1_000_001, 1_000_000).validate().is_err());
        let j: PressureTrigger =
            serde_json::from_str(r#"{"kind":"full","threshold_us":5,"window_us":600000}"#).unwrap();
        assert_eq!(j.kind, PressureKind::Full);
        assert!(serde_json::from_str::<PressureTrigger>(
            r#"{"kind":"half","threshold_us":5,"window_us":600000}"#
        )
        .is_err());
        assert!(serde_json::from_str::<PressureTrigger>(
            r#"{"kind":"some","threshold_us":5,"window_us":600000,"x":1}"#
        )
        .is_err());
    }

    #[test]
    fn lines_print_hundredths_as_percent() {
        let l = PressureLine::from_hundredths([8647, 5, 0], 42);
        assert_eq!(
            (l.avg10, l.avg60, l.avg300, l.total_us),
            (86.47, 0.05, 0.0, 42)
        );
    }
}
