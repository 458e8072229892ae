//! What the VMM keeps of the guest side between looks (layout 1.5): the reset generation an
//! operator asked for (`guest-reset`), which the sampler writes into the VM record for the
//! guest agent, and the alarms it forwarded: counts by kind, the ones it lost or refused,
//! and the last [`LAST_ALARMS`] for `guest`, `ctl` and `top`.
//!
//! Data flow: the `api` thread bumps the reset generation ([`GuestBoard::ask_reset`]); the
//! sampler reads it at each page refresh into the VM record, polls the agent's alarm ring
//! (`ppa_page::alarms`) and records what it forwarded here ([`GuestBoard::record`]); readers
//! (`guest`, the metrics, the final report) copy it ([`GuestBoard::alarms_view`]). The lock is
//! the sampler's and the readers', held for a few stores or a copy; no vCPU thread takes it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use ppa_vmm_api::{GuestAlarmView, GuestAlarmsView, ALARM_WHAT};

use super::alarms::Poll;

/// Alarms kept for the `guest` result, `ctl` and `top`.
pub const LAST_ALARMS: usize = 16;
/// Most guest threads a VM's metrics name (`--guest-metrics-threads` is at most this).
pub const MAX_METRICS_THREADS: usize = 100;
/// Guest threads the metrics name by default.
pub const DEFAULT_METRICS_THREADS: usize = 10;

/// Counts and the last alarms (behind the board's lock).
#[derive(Debug, Default, Clone)]
struct Alarms {
    forwarded: [u64; 5],
    lost: u64,
    invalid: u64,
    last: VecDeque<GuestAlarmView>,
}

/// The guest side's state the VMM keeps (one per PPA page).
#[derive(Debug)]
pub struct GuestBoard {
    reset: AtomicU64,
    alarms: Mutex<Alarms>,
    /// Guest threads the metrics name (`--guest-metrics-threads`).
    metrics_threads: AtomicUsize,
}

impl Default for GuestBoard {
    fn default() -> Self {
        GuestBoard {
            reset: AtomicU64::new(0),
            alarms: Mutex::default(),
            metrics_threads: AtomicUsize::new(DEFAULT_METRICS_THREADS),
        }
    }
}

impl GuestBoard {
    /// Sets how many guest threads the metrics name (at most [`MAX_METRICS_THREADS`]).
    pub fn set_metrics_threads(&self, n: usize) {
        self.metrics_threads
            .store(n.min(MAX_METRICS_THREADS), Ordering::Relaxed);
    }

    /// How many guest threads the metrics name.
    pub fn metrics_threads(&self) -> usize {
        self.metrics_threads.load(Ordering::Relaxed)
    }

    /// Asks the guest agent for a reset: the next generation, which is returned.
    pub fn ask_reset(&self) -> u64 {
        self.reset.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// The latest reset generation asked for (0: none).
    pub fn reset_asked(&self) -> u64 {
        self.reset.load(Ordering::Acquire)
    }

    /// Records what a poll found and forwarded.
    pub fn record(&self, p: &Poll) {
        let mut a = self.alarms.lock().unwrap_or_else(|e| e.into_inner());
        a.lost = a.lost.saturating_add(p.lost);
        a.invalid = a.invalid.saturating_add(p.invalid);
        for alarm in &p.alarms {
            if let Some(i) = ALARM_WHAT.iter().position(|w| *w == alarm.what) {
                a.forwarded[i] += 1;
            }
            if a.last.len() == LAST_ALARMS {
                a.last.pop_front();
            }
            a.last.push_back(alarm.clone());
        }
    }

    /// The counts and the last alarms, over `ring` (what the decoder read of the agent's
    /// ring; None: it has none, and then only what was forwarded before is shown, if any).
    pub fn alarms_view(&self, ring: Option<GuestAlarmsView>) -> Option<GuestAlarmsView> {
        let a = self
            .alarms
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let seen = a.forwarded.iter().any(|&n| n > 0) || a.lost > 0 || a.invalid > 0;
        if ring.is_none() && !seen {
            return None;
        }
        Some(GuestAlarmsView {
            forwarded: a.forwarded,
            lost: a.lost,
            invalid: a.invalid,
            last: a.last.into_iter().collect(),
            ..ring.unwrap_or_default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alarm(n: u64, what: &str) -> GuestAlarmView {
        GuestAlarmView {
            number: n,
            what: what.into(),
            tid: 1,
            comm: "t".into(),
            cpu: 0,
            value: 2,
            threshold: 1,
            guest_ns: n,
        }
    }

    #[test]
    fn resets_are_numbered_and_alarms_counted_with_the_last_sixteen_kept() {
        let b = GuestBoard::default();
        assert_eq!(b.reset_asked(), 0);
        assert_eq!((b.ask_reset(), b.ask_reset(), b.reset_asked()), (1, 2, 2));
        assert_eq!(b.alarms_view(None), None, "no ring, nothing forwarded");
        let alarms: Vec<GuestAlarmView> = (1..=20)
            .map(|n| alarm(n, if n % 4 == 0 { "irq" } else { "slice" }))
            .collect();
        b.record(&Poll {
            alarms,
            lost: 3,
            invalid: 1,
            problem: None,
        });
        let v = b.alarms_view(None).unwrap();
        assert_eq!(v.forwarded, [0, 15, 0, 5, 0]);
        assert_eq!((v.lost, v.invalid), (3, 1));
        assert_eq!(v.last.len(), LAST_ALARMS);
        assert_eq!(v.last.first().map(|a| a.number), Some(5));
        assert_eq!(v.last.last().map(|a| a.number), Some(20));
        let ring = GuestAlarmsView {
            slots: 64,
            written: 20,
            ..Default::default()
        };
        let v = b.alarms_view(Some(ring)).unwrap();
        assert_eq!((v.slots, v.written, v.forwarded[1]), (64, 20, 15));
    }
}
