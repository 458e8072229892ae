//! The members' kick timers, seen from the limiter thread: at each look it publishes each
//! running member's deadline (its runway, what its timer is armed for), adopts the stops the
//! timers made since the last look as this limit's own, and clears the deadlines when the
//! limit goes or the thread ends.

use ppa_vmm_api::Event;

use super::{used_since, Entity, Limiter};
use crate::limits::engine::Decision;
use crate::vcpu::Deadline;

impl Limiter {
    /// The timers' deadlines: what each running member may still use (`cpu`: its CPU clock
    /// as read by this look). Which members have an active timer.
    pub(super) fn publish_deadlines(
        &self,
        e: &Entity,
        d: &Decision,
        cpu: &[Option<u64>],
        now: u64,
    ) -> Vec<bool> {
        let mut timed = vec![false; e.members.len()];
        if self.timers {
            for (k, &i) in e.members.iter().enumerate() {
                let v = &self.vcpus[i];
                timed[k] = v.kick_timer.active();
                if !e.stopped[k] {
                    let deadline = d.runway_ns[k].zip(cpu[k]);
                    v.set_kick_deadline(e.kind, deadline.map(|(r, c)| Deadline::after(now, c, r)));
                }
            }
        }
        timed
    }

    /// Members their kick timer stopped since the last look: stopped by this limit from now
    /// on, as if this thread had kicked them (its request, figures, event).
    pub(super) fn adopt_holds(&self, e: &mut Entity, now: u64) {
        if !self.timers {
            return;
        }
        let mut newly = Vec::new();
        for (k, &i) in e.members.iter().enumerate() {
            if !e.stopped[k] && self.vcpus[i].kick_held(e.kind) {
                self.vcpus[i].adopt_kick_hold(e.kind);
                e.stopped[k] = true;
                e.was_stopped[k] = true;
                e.stops_this_period += 1;
                newly.push(i);
            }
        }
        if newly.is_empty() {
            return;
        }
        e.stopped_this_period = true;
        let used_ns = e
            .members
            .iter()
            .zip(e.base_cpu.iter_mut())
            .map(|(&i, b)| used_since(&self.vcpus[i], b))
            .sum();
        self.event(Event::ThrottleStart {
            uptime_ns: self.uptime(now),
            group: e.name.clone(),
            vcpus: newly,
            used_ns,
            quota_ns: e.limit.as_ref().map_or(0, |(l, _)| l.quota_ns),
        });
    }

    /// No deadline for the members' timers (the limit is gone, or the thread ends).
    pub(super) fn clear_deadlines(&self, e: &Entity) {
        for &i in &e.members {
            self.vcpus[i].set_kick_deadline(e.kind, None);
        }
    }
}
