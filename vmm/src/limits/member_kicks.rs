//! A limit's members' kick-timer readings: stops, re-arms and the stages of the timer stops.
//!
//! Data flow: the limiter reads every member ([`MemberKicks::read`]) when a limit is set (the
//! base) and again whenever the limit's figures are asked for; `kicks` in the groups' figures
//! is the difference, summed (counts) or merged (the stages' histograms, [`stages_since`]).
//! Only the limiter thread (a limit set) and the `api` thread (figures) read; the vCPU threads
//! write their histograms as before.

use ppa_vmm_api::KickStages;

use crate::accounting::histogram::HistogramSnapshot;
use crate::vcpu::{LimitKind, StopStages, VcpuShared};

/// Fractional bits of the stage histograms (those of the vCPU's kick timer).
const FRAC_BITS: u8 = 3;

/// One member's readings at an instant.
#[derive(Debug, Clone)]
pub struct MemberKicks {
    /// Stops its kick timer made for the limit's kind.
    pub stops: u64,
    /// Firings after which it had CPU left and re-armed.
    pub rearms: u64,
    /// The stages of its timer stops (all kinds: a stop's stages are the vCPU's).
    pub stages: StopStages,
}

impl MemberKicks {
    /// Nothing counted yet (a limit never set).
    pub fn zero() -> Self {
        let empty = || HistogramSnapshot::empty(FRAC_BITS);
        MemberKicks {
            stops: 0,
            rearms: 0,
            stages: StopStages {
                to_handler: empty(),
                to_decision: empty(),
                spin: empty(),
                to_park: empty(),
            },
        }
    }

    /// `v`'s readings now, for a limit of `kind`.
    pub fn read(v: &VcpuShared, kind: LimitKind) -> Self {
        let t = &v.kick_timer;
        MemberKicks {
            stops: t.stops(kind),
            rearms: t.rearms(kind),
            stages: t.stages(),
        }
    }
}

/// The members' stages between `base` and `now` (member by member, in the same order),
/// merged.
pub fn stages_since(now: &[MemberKicks], base: &[MemberKicks]) -> KickStages {
    let mut merged = MemberKicks::zero().stages;
    for (n, b) in now.iter().zip(base) {
        merged
            .to_handler
            .merge(&n.stages.to_handler.since(&b.stages.to_handler));
        merged
            .to_decision
            .merge(&n.stages.to_decision.since(&b.stages.to_decision));
        merged.spin.merge(&n.stages.spin.since(&b.stages.spin));
        merged
            .to_park
            .merge(&n.stages.to_park.since(&b.stages.to_park));
    }
    KickStages {
        to_handler: merged.to_handler.to_json(),
        to_decision: merged.to_decision.to_json(),
        spin: merged.spin.to_json(),
        to_park: merged.to_park.to_json(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounting::histogram::Histogram;

    fn member(handler: &[u64]) -> MemberKicks {
        let h = Histogram::new(FRAC_BITS).unwrap();
        for &v in handler {
            h.record(v);
        }
        let mut m = MemberKicks::zero();
        m.stages.to_handler = h.snapshot();
        m
    }

    #[test]
    fn stages_count_only_the_stops_since_the_base_over_every_member() {
        // Member 0 had two stops before the limit was set and one after; member 1 one after.
        let base = [member(&[1_000, 2_000]), member(&[])];
        let now = [member(&[1_000, 2_000, 50_000]), member(&[60_000])];
        let s = stages_since(&now, &base);
        assert_eq!(s.to_handler.count, 2);
        assert!(
            s.to_handler.p50 >= 48_000 && s.to_handler.max <= 64_000,
            "{s:?}"
        );
        assert_eq!(s.to_decision.count, 0);
        assert_eq!(s.spin.count, 0);
        assert_eq!(s.to_park.count, 0);
    }
}
