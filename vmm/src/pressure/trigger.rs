//! Pressure triggers (PSI's `poll` triggers, per control connection): a `pressure` event
//! when the VM's `some` or `full` stall within a window exceeds a threshold, at most one per
//! window.
//!
//! Data flow: `subscribe` with a `pressure` member gives the connection a [`Trigger`]; every
//! 10 ms the `api` thread's timer calls [`Trigger::check`] with the board's history of the
//! VM's totals (a point per 8 ms tick). The stall within the window ending at the newest
//! point is that point's total less the total at the window's start, interpolated between the
//! two points around it; a window never reaches back before the trigger was made (as in
//! PSI, where a new trigger's window starts empty).

use std::collections::VecDeque;

use ppa_vmm_api::{PressureKind, PressureTrigger};

use super::Point;

/// A connection's trigger and what it has fired.
#[derive(Debug, Clone)]
pub struct Trigger {
    /// What the client asked for.
    pub spec: PressureTrigger,
    created: u64,
    last_fired: Option<u64>,
}

/// A trigger firing: the stall within the window, µs, and when the window ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fired {
    /// Stall of the trigger's kind within the window, µs.
    pub stall_us: u64,
    /// CLOCK_MONOTONIC ns of the window's end.
    pub at: u64,
}

fn value(p: &Point, kind: PressureKind) -> u64 {
    match kind {
        PressureKind::Some => p.total.some,
        PressureKind::Full => p.total.full,
    }
}

/// The total of `kind` at `t`, interpolated between the history's points (`None` when `t` is
/// before the oldest point).
fn total_at(history: &VecDeque<Point>, t: u64, kind: PressureKind) -> Option<u64> {
    let i = history.partition_point(|p| p.at <= t);
    let before = history.get(i.checked_sub(1)?)?;
    let Some(after) = history.get(i) else {
        return Some(value(before, kind));
    };
    let (v0, v1) = (value(before, kind), value(after, kind));
    let span = after.at - before.at;
    if span == 0 {
        return Some(v1);
    }
    let part =
        (v1.saturating_sub(v0) as u128 * u128::from(t - before.at) / u128::from(span)) as u64;
    Some(v0 + part)
}

impl Trigger {
    /// A trigger made at `now` (CLOCK_MONOTONIC ns). `spec` must be valid
    /// ([`PressureTrigger::validate`]).
    pub fn new(spec: PressureTrigger, now: u64) -> Trigger {
        Trigger {
            spec,
            created: now,
            last_fired: None,
        }
    }

    /// Whether the window ending at the newest point of `history` holds more stall than the
    /// threshold, and the last firing is at least a window ago.
    pub fn check(&mut self, history: &VecDeque<Point>) -> Option<Fired> {
        let newest = history.back()?;
        if newest.at < self.created {
            return None;
        }
        let window = self.spec.window_us * 1000;
        if self
            .last_fired
            .is_some_and(|f| newest.at < f.saturating_add(window))
        {
            return None;
        }
        let start = newest.at.saturating_sub(window).max(self.created);
        let kind = self.spec.kind;
        let stall = value(newest, kind).saturating_sub(total_at(history, start, kind)?);
        if stall <= self.spec.threshold_us * 1000 {
            return None;
        }
        self.last_fired = Some(newest.at);
        Some(Fired {
            stall_us: stall / 1000,
            at: newest.at,
        })
    }
}
