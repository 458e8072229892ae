//! A limit's periods: when the first begins (when its first member starts, or when the limit
//! was set at run time), how each one closes (its charged use, its stops, its overshoot, the
//! margin it teaches), and the last one, closed at the end of the last member's run loop.
//!
//! Data flow: [`Limiter::look`] asks [`Limiter::first_period`] until the first period has
//! begun, closes each period at its boundary with [`Limiter::end_period`], and once every
//! member's run loop has ended [`Limiter::close_at_end`] closes the period in progress at the
//! last one's end and stops looking. So a limit's share (`used_ns` / `periods_ns`) is over the
//! time its members ran (issue 39: at level full the vCPUs start ~0.5 s after the limiter, and
//! a 25 % limit read 22 % over periods that began before any of them; their threads' teardown
//! after their loops, ~0.5 s at level full, made a 1 ms per 10 ms limit read 91 %).

use std::sync::atomic::Ordering;

use super::{stops_of, used_since, Entity, Limiter, PERIOD_LOG};
use ppa_vmm_api::ThrottleEndWhy;

/// How often the thread looks for a member's start: for the first member's, which begins a
/// limit of the VM's config, and then for each later one's (a member that starts runs with no
/// share until a look sees it). At 1 ms, and only for the first, 4 busy vCPUs on 2 host CPUs
/// (which start up to 1.1 ms apart, as the host gives the last two a CPU) ran a 1 ms quota's
/// first period 0.4-1.0 ms over (issue 39).
pub const START_POLL_NS: u64 = 100_000;

impl Limiter {
    /// Begins the first period of `e` if a member has started (false, with a look planned
    /// [`START_POLL_NS`] later, if none has). A limit of the VM's config begins when its
    /// first member started, each member charged from its own start; one set at run time,
    /// when it was set.
    pub(super) fn first_period(&self, e: &mut Entity, now: u64) -> bool {
        let first_start = e
            .members
            .iter()
            .map(|&i| self.vcpus[i].acct.started_ns.load(Ordering::Acquire))
            .filter(|&s| s != 0)
            .min();
        let Some(first_start) = first_start else {
            e.next_look = Some(now + START_POLL_NS);
            return false;
        };
        // A new limit: its members' limited time and kicks count from now.
        for (k, &i) in e.members.iter().enumerate() {
            e.limited_base[k] = super::limited_total(&self.vcpus[i], now);
        }
        self.devices_set(e);
        e.timer_base = e.timer_counts(&self.vcpus);
        e.limiter_kicks = 0;
        let from_start = e.set_at <= first_start;
        let start = if from_start { first_start } else { e.set_at };
        self.begin_period(e, start.min(now), ThrottleEndWhy::Period);
        if from_start {
            // Charged from each member's start (its CPU clock then, before any stop).
            e.base_cpu.iter_mut().for_each(|b| *b = None);
            e.base_stops
                .iter_mut()
                .for_each(|b| *b = Default::default());
        }
        true
    }

    /// Whether a member of `e` has not started yet (nor ended).
    pub(super) fn members_to_start(&self, e: &Entity) -> bool {
        e.members.iter().any(|&i| {
            let v = &self.vcpus[i];
            v.acct.started_ns.load(Ordering::Acquire) == 0 && super::ended_at(v).is_none()
        })
    }

    /// Once every member's run loop has ended: closes the period in progress at the last member's
    /// end (a period cut short: its own length counts in `periods_ns`), clears the deadlines
    /// and looks no more. False while a member may still run.
    pub(super) fn close_at_end(&self, e: &mut Entity) -> bool {
        let ends: Option<Vec<u64>> = e
            .members
            .iter()
            .map(|&i| super::ended_at(&self.vcpus[i]))
            .collect();
        let Some(ends) = ends else {
            return false;
        };
        let end = ends.into_iter().max().unwrap_or(0);
        if e.period_start != 0 && e.limit.is_some() {
            let period = e.limit.as_ref().map_or(0, |(l, _)| l.period_ns);
            if end >= e.period_start + period {
                let boundary = e.period_start + period;
                self.end_period(e, boundary, boundary);
            }
            if end > e.period_start {
                self.record_period(e, end - e.period_start, None);
            }
        }
        self.clear_deadlines(e);
        e.ended = true;
        e.next_look = None;
        true
    }

    /// Counts the period in progress as closed after `length` ns: the members' charged use,
    /// their stops, the expected use of each next period and the overshoot; a whole period
    /// (`at`: the boundary it ended at, and when it was looked at) also teaches the margin,
    /// and a turn that straddled its end is cut there.
    pub(super) fn record_period(&self, e: &mut Entity, length: u64, at: Option<(u64, u64)>) {
        let Some(l) = e.limit.as_ref().map(|(l, _)| *l) else {
            return;
        };
        let mut per: Vec<u64> = e
            .members
            .iter()
            .zip(e.base_cpu.iter_mut())
            .map(|(&i, b)| used_since(&self.vcpus[i], b))
            .collect();
        let straddled = at.is_some_and(|(b, now)| self.cut_straddle(e, &mut per, b, now));
        let used: u64 = per.iter().sum();
        Self::settle_turns(e, &per, l.quota_ns);
        let equal = l.quota_ns / e.members.len().max(1) as u64;
        e.last_used = per
            .iter()
            .zip(&e.was_stopped)
            .map(|(&u, &s)| {
                let want = u + u / 10;
                if s {
                    want.max(equal)
                } else {
                    want
                }
            })
            .collect();
        // Scope `vm`: the device threads' CPU is the VM's too.
        let used = used
            + if super::scope_of(e) == crate::limits::Scope::Vm {
                self.devices_close(e)
            } else {
                0
            };
        e.periods += 1;
        e.periods_ns += length;
        e.used_ns += used;
        for (&i, b) in e.members.iter().zip(&e.base_stops) {
            let now = stops_of(&self.vcpus[i]);
            e.stops.count += now.stops.saturating_sub(b.stops);
            e.stops.cpu_ns += now.cpu_ns.saturating_sub(b.cpu_ns);
            e.stops.kvm_ns_estimate += now.kvm_estimate_ns.saturating_sub(b.kvm_estimate_ns);
        }
        if e.log.len() < PERIOD_LOG && self.keep_log.load(Ordering::Relaxed) {
            e.log.push(used);
        }
        if e.stopped_this_period {
            e.throttled_periods += 1;
            // Learn the margin from the error of a period that ended in stops (not in a
            // straddled turn's release).
            let err = used as i64 - l.quota_ns as i64;
            if let Some(m) = e.margin.as_mut().filter(|_| at.is_some() && !straddled) {
                m.learn(err, e.stops_this_period);
            }
        }
        if used > l.quota_ns {
            let over = used - l.quota_ns;
            e.overshoot.record(over);
            e.overshoot_max = e.overshoot_max.max(over);
        }
    }

    /// Closes the period that ended at `boundary`; applies a pending change.
    pub(super) fn end_period(&self, e: &mut Entity, boundary: u64, now: u64) {
        if let Some((l, _)) = &e.limit {
            let length = l.period_ns;
            self.record_period(e, length, Some((boundary, now)));
        }
        if let Some(change) = e.pending.take() {
            e.limit = change;
        }
        // Fell behind by more than a period (the thread was held up): start afresh from now.
        let start = match &e.limit {
            Some((l, _)) if now < boundary + l.period_ns => boundary,
            _ => now,
        };
        self.begin_period(e, start, ThrottleEndWhy::Period);
        e.period_start = start;
    }
}
