//! Runaway and overload detection (PPA requirement 20): a vCPU that runs guest code longer
//! than a threshold without an exit, an idle or a halt (`--runaway MS`), or that uses more
//! than a share of its time for N windows in a row (`--overload PCT:WINDOWS`), raises an
//! `overload` event, counts in its `overloads`, and gets the action (`--overload-action notify
//! | pause | throttle:LIMIT`). This module owns the settings and the overload windows; the
//! runaway detector, which needs the vCPU's figures, is the sampler's (`sampler/runaway.rs`).
//!
//! Data flow: the sampler thread calls [`Detector::check_window`] every window (100 ms) with
//! the vCPU's thread CPU time; the detector says what fired, and the sampler applies the
//! action through the limiter or the vCPU's pause request.

use super::{Limit, LimitError};

/// Length of an overload window.
pub const WINDOW_NS: u64 = 100_000_000;

/// What to do when a detector fires.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Action {
    /// An event and the counter only.
    #[default]
    Notify,
    /// Pause that vCPU (the socket's `resume` releases it).
    Pause,
    /// Hold that vCPU to a limit from then on.
    Throttle(Limit, String),
}

impl Action {
    /// Parses `notify`, `pause` or `throttle:LIMIT`.
    pub fn parse(s: &str) -> Result<Action, LimitError> {
        match s.trim() {
            "notify" => Ok(Action::Notify),
            "pause" => Ok(Action::Pause),
            t => match t.strip_prefix("throttle:") {
                Some(l) => {
                    let limit = Limit::parse(l)?;
                    limit.check_members(l, 1)?;
                    Ok(Action::Throttle(limit, l.to_string()))
                }
                None => Err(LimitError::Action(s.to_string())),
            },
        }
    }

    /// The action's name in events.
    pub fn name(&self) -> String {
        match self {
            Action::Notify => "notify".into(),
            Action::Pause => "pause".into(),
            Action::Throttle(_, l) => format!("throttle:{l}"),
        }
    }
}

/// The detection settings of a VM.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OverloadConfig {
    /// Guest run without an exit that counts as a runaway.
    pub runaway_ns: Option<u64>,
    /// (share of wall in per mille, consecutive windows).
    pub overload: Option<(u64, u32)>,
    /// What to do.
    pub action: Action,
}

impl OverloadConfig {
    /// Parses the three options.
    pub fn parse(
        runaway_ms: Option<f64>,
        overload: Option<&str>,
        action: Option<&str>,
    ) -> Result<OverloadConfig, LimitError> {
        let runaway_ns = match runaway_ms {
            None => None,
            Some(ms) if (1.0..=3_600_000.0).contains(&ms) => Some((ms * 1e6) as u64),
            Some(ms) => return Err(LimitError::Runaway(ms.to_string())),
        };
        let overload = match overload {
            None => None,
            Some(s) => {
                let bad = || LimitError::Overload(s.to_string());
                let (pct, n) = s.split_once(':').ok_or_else(bad)?;
                let pct: f64 = pct
                    .trim()
                    .trim_end_matches('%')
                    .parse()
                    .map_err(|_| bad())?;
                let n: u32 = n.trim().parse().map_err(|_| bad())?;
                if !(pct > 0.0 && pct <= 100.0) || n == 0 || n > 10_000 {
                    return Err(bad());
                }
                // The rule is kept in per mille: a share that rounds to none (under 0.05 %)
                // would fire on any use at all.
                let per_mille = (pct * 10.0).round() as u64;
                if per_mille == 0 {
                    return Err(bad());
                }
                Some((per_mille, n))
            }
        };
        Ok(OverloadConfig {
            runaway_ns,
            overload,
            action: action.map(Action::parse).transpose()?.unwrap_or_default(),
        })
    }

    /// Whether anything is to be detected.
    pub fn enabled(&self) -> bool {
        self.runaway_ns.is_some() || self.overload.is_some()
    }
}

/// What fired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fired {
    /// Above the share for `windows` windows.
    Overload {
        /// Share of the last window, per mille.
        per_mille: u64,
        /// Windows in a row.
        windows: u32,
    },
}

/// Per-vCPU detection state.
#[derive(Debug, Clone, Default)]
pub struct Detector {
    window: Option<(u64, u64)>,
    above: u32,
}

impl Detector {
    /// Overload check at a window boundary with the vCPU's CPU time `cpu_ns` at `now`.
    pub fn check_window(&mut self, cfg: &OverloadConfig, cpu_ns: u64, now: u64) -> Option<Fired> {
        let (limit, n) = cfg.overload?;
        let prev = self.window.replace((now, cpu_ns))?;
        let wall = now.saturating_sub(prev.0).max(1);
        let per_mille = cpu_ns.saturating_sub(prev.1) * 1000 / wall;
        if per_mille > limit {
            self.above += 1;
            if self.above == n {
                return Some(Fired::Overload {
                    per_mille,
                    windows: n,
                });
            }
        } else {
            self.above = 0;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse() {
        let c = OverloadConfig::parse(Some(100.0), Some("90:3"), Some("throttle:25%")).unwrap();
        assert_eq!(c.runaway_ns, Some(100_000_000));
        assert_eq!(c.overload, Some((900, 3)));
        assert!(matches!(c.action, Action::Throttle(l, _) if l.quota_ns == 25_000_000));
        assert_eq!(
            OverloadConfig::parse(None, None, Some("pause"))
                .unwrap()
                .action,
            Action::Pause
        );
        assert!(!OverloadConfig::default().enabled());
        for (r, o, a) in [
            (Some(0.0), None, None),
            (Some(-5.0), None, None),
            (None, Some("90"), None),
            (None, Some("0:3"), None),
            (None, Some("90:0"), None),
            // Found by the limit fuzzer in CI: 0.01 % rounded to 0 per mille.
            (None, Some("1e-2:5"), None),
            (None, Some("0.04:5"), None),
            (None, Some("x:3"), None),
            (None, None, Some("kill")),
            (None, None, Some("throttle:0%")),
            (None, None, Some("throttle:200%")),
        ] {
            assert!(OverloadConfig::parse(r, o, a).is_err(), "{r:?} {o:?} {a:?}");
        }
    }

    #[test]
    fn overload_needs_n_windows_in_a_row() {
        let c = OverloadConfig::parse(None, Some("50:2"), None).unwrap();
        let mut d = Detector::default();
        let w = WINDOW_NS;
        assert_eq!(d.check_window(&c, 0, 0), None, "first sample");
        assert_eq!(d.check_window(&c, 80 * w / 100, w), None, "1 window above");
        assert_eq!(d.check_window(&c, 90 * w / 100, 2 * w), None, "back under");
        assert_eq!(d.check_window(&c, 160 * w / 100, 3 * w), None);
        assert_eq!(
            d.check_window(&c, 230 * w / 100, 4 * w),
            Some(Fired::Overload {
                per_mille: 700,
                windows: 2
            })
        );
        assert_eq!(d.check_window(&c, 300 * w / 100, 5 * w), None, "fires once");
    }
}
