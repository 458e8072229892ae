//! The guest's alarms and resets as the protocol shows them (layout 1.5 of the PPA page,
//! docs/abi.md and docs/agent.md): one alarm ([`GuestAlarmView`], the payload of a
//! `guest-alarm` event and an entry of the `guest` result's last alarms), the ring's state
//! with what the VMM did with it ([`GuestAlarmsView`]), and a reset's request and
//! acknowledgement ([`GuestResetView`], [`GuestResetResult`]).

use serde::{Deserialize, Serialize};

/// Alarm kinds by number (1 to 5), as `what` names them.
pub const ALARM_WHAT: [&str; 5] = ["run_delay", "slice", "nivcsw", "irq", "softirq"];

/// One alarm the guest agent raised: a threshold a thread or a CPU exceeded in a sample.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GuestAlarmView {
    /// The alarm's number in the agent's ring (1, 2, …; restarts with a new agent).
    pub number: u64,
    /// Which threshold: `run_delay` (a thread's mean run-queue wait per wait in an interval),
    /// `slice` (its on-CPU time per timeslice), `nivcsw` (its involuntary switches in an
    /// interval), `irq`, `softirq` (a CPU's time in an interval).
    pub what: String,
    /// The thread's id in the guest (0 for a CPU's alarm).
    pub tid: u32,
    /// The thread's name (empty for a CPU's alarm; control characters replaced).
    pub comm: String,
    /// The CPU it is about, or the thread's last CPU.
    pub cpu: u32,
    /// What was measured: ns, or a count for `nivcsw`.
    pub value: u64,
    /// The threshold it exceeded, same unit.
    pub threshold: u64,
    /// Guest time of the agent's sample that found it, ns (the guest header's clock).
    pub guest_ns: u64,
}

/// The guest agent's alarm ring and what the VMM did with it (the `alarms` member of the
/// `guest` result; docs/accounting.md, "The guest's view").
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GuestAlarmsView {
    /// The ring's slots (0: the agent has no ring; none of its thresholds is set).
    pub slots: u32,
    /// Alarms the agent wrote (the latest alarm's number).
    pub written: u64,
    /// Occurrences the agent counted but wrote no alarm for (its cap per sample).
    pub suppressed: u64,
    /// The agent's thresholds, in `what` order (run_delay, slice, nivcsw, irq, softirq;
    /// ns, ns, a count, ns, ns; 0: off).
    pub thresholds: [u64; 5],
    /// Alarms the VMM forwarded (to subscribers, the metrics and this list), by `what`.
    pub forwarded: [u64; 5],
    /// Alarms the VMM missed: overwritten in the ring before it read them.
    pub lost: u64,
    /// Alarm records the VMM refused (an unknown kind), or read torn.
    pub invalid: u64,
    /// The last alarms forwarded, oldest first (at most 16).
    pub last: Vec<GuestAlarmView>,
}

/// A guest reset: what the host asked and what the agent did (the `reset` member of the
/// `guest` result).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct GuestResetView {
    /// The latest reset the host asked for (`guest-reset`), 0 when none was.
    pub requested: u64,
    /// The latest the guest agent carried out (its figures count from then), 0 when none.
    pub honoured: u64,
    /// When it did, ns on the guest header's clock (0: never).
    pub honoured_ns: u64,
}

/// Result of `guest-reset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GuestResetResult {
    /// The generation asked for now; the agent acknowledges it within one of its sample
    /// intervals (the `guest` result's `reset.honoured`).
    pub generation: u64,
    /// The generation the agent had carried out when the request was made.
    pub honoured: u64,
}

/// A value of alarm kind `what` in its unit: ns as ms, a count as it is.
fn value(what: &str, v: u64) -> String {
    if what == "nivcsw" {
        v.to_string()
    } else {
        format!("{:.3} ms", v as f64 / 1e6)
    }
}

/// The lines the GUEST VIEW adds for a guest agent's alarms and resets (empty without either):
/// what was forwarded, lost and suppressed, the thresholds, the last alarms, the reset.
pub fn alarms_text(alarms: Option<&GuestAlarmsView>, reset: Option<&GuestResetView>) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if let Some(a) = alarms {
        let by: Vec<String> = ALARM_WHAT
            .iter()
            .zip(a.forwarded)
            .filter(|(_, n)| *n > 0)
            .map(|(w, n)| format!("{w} {n}"))
            .collect();
        let thresholds: Vec<String> = ALARM_WHAT
            .iter()
            .zip(a.thresholds)
            .map(|(w, t)| match t {
                0 => format!("{w} off"),
                t => format!("{w} {}", value(w, t)),
            })
            .collect();
        let _ = writeln!(
            out,
            "  alarms: {} forwarded{}, {} lost, {} refused; the agent wrote {} and suppressed {}; thresholds: {}",
            a.forwarded.iter().sum::<u64>(),
            if by.is_empty() {
                String::new()
            } else {
                format!(" ({})", by.join(", "))
            },
            a.lost,
            a.invalid,
            a.written,
            a.suppressed,
            thresholds.join(", ")
        );
        for l in &a.last {
            let who = if l.tid == 0 {
                format!("cpu {}", l.cpu)
            } else {
                format!("tid {} {} cpu {}", l.tid, l.comm, l.cpu)
            };
            let _ = writeln!(
                out,
                "    #{} {} {who}: {} over {} at {:.3} s (guest clock)",
                l.number,
                l.what,
                value(&l.what, l.value),
                value(&l.what, l.threshold),
                l.guest_ns as f64 / 1e9
            );
        }
    }
    if let Some(r) = reset {
        let _ = writeln!(
            out,
            "  guest reset: asked {}, carried out {}{}",
            r.requested,
            r.honoured,
            if r.honoured == 0 {
                String::new()
            } else {
                format!(
                    " at {:.3} s (guest clock): the guest's figures above count from it",
                    r.honoured_ns as f64 / 1e9
                )
            }
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alarms_and_resets_read_as_sentences() {
        assert_eq!(alarms_text(None, None), "");
        let a = GuestAlarmsView {
            slots: 64,
            written: 3,
            suppressed: 1,
            thresholds: [0, 50_000_000, 100, 0, 0],
            forwarded: [0, 2, 1, 0, 0],
            lost: 0,
            invalid: 0,
            last: vec![
                GuestAlarmView {
                    number: 2,
                    what: "slice".into(),
                    tid: 97,
                    comm: "spin-0".into(),
                    cpu: 1,
                    value: 60_012_000,
                    threshold: 50_000_000,
                    guest_ns: 5_212_000_000,
                },
                GuestAlarmView {
                    number: 3,
                    what: "irq".into(),
                    tid: 0,
                    comm: String::new(),
                    cpu: 0,
                    value: 6_000_000,
                    threshold: 5_000_000,
                    guest_ns: 6_000_000_000,
                },
            ],
        };
        let r = GuestResetView {
            requested: 2,
            honoured: 1,
            honoured_ns: 4_100_000_000,
        };
        let t = alarms_text(Some(&a), Some(&r));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "  alarms: 3 forwarded (slice 2, nivcsw 1), 0 lost, 0 refused; the agent wrote 3 and suppressed 1; thresholds: run_delay off, slice 50.000 ms, nivcsw 100, irq off, softirq off"
        );
        assert_eq!(
            lines[1],
            "    #2 slice tid 97 spin-0 cpu 1: 60.012 ms over 50.000 ms at 5.212 s (guest clock)"
        );
        assert_eq!(
            lines[2],
            "    #3 irq cpu 0: 6.000 ms over 5.000 ms at 6.000 s (guest clock)"
        );
        assert_eq!(
            lines[3],
            "  guest reset: asked 2, carried out 1 at 4.100 s (guest clock): the guest's figures above count from it"
        );
    }
}
