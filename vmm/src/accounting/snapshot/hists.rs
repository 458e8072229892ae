//! The histograms of one vCPU as read ([`HistSnapshots`]): userspace exit handling by reason,
//! KVM_RUN durations, wake-up latencies and, where KVM's tracepoints fire, in-kernel exit
//! handling by hardware reason (`kvm_exit_handling.REASON`, slots of the meter's
//! `KvmExits`), with their names, baselines and JSON form.

use std::collections::BTreeMap;

use super::super::histogram::{HistogramJson, HistogramSnapshot};
use super::super::kvm_reasons;
use super::super::meter::{decode_kvm_slot, VcpuMeter};
use crate::accounting::ExitReason;

/// The name of in-kernel exit handling, every reason merged; `PREFIX.REASON` per reason.
pub const KVM_EXIT_HANDLING: &str = "kvm_exit_handling";

/// The reason name of a `KvmExits` slot code.
pub fn kvm_slot_name(code: u64) -> String {
    decode_kvm_slot(code).map_or_else(|| "other".to_string(), kvm_reasons::name)
}

/// Histogram snapshots of one vCPU.
#[derive(Debug, Clone, PartialEq)]
pub struct HistSnapshots {
    /// Exit handling by reason.
    pub exit_handling: Vec<HistogramSnapshot>,
    /// Exit handling, all reasons.
    pub exit_handling_all: HistogramSnapshot,
    /// KVM_RUN durations.
    pub guest_run: HistogramSnapshot,
    /// Wake-up latencies.
    pub wakeup_latency: HistogramSnapshot,
    /// In-kernel exit handling by hardware reason (name, histogram), in slot order.
    pub kvm_exit_handling: Vec<(String, HistogramSnapshot)>,
}

impl HistSnapshots {
    pub(super) fn of(m: &VcpuMeter) -> HistSnapshots {
        HistSnapshots {
            exit_handling: m.hist.exit_handling.iter().map(|h| h.snapshot()).collect(),
            exit_handling_all: m.hist.exit_handling_all.snapshot(),
            guest_run: m.hist.guest_run.snapshot(),
            wakeup_latency: m.hist.wakeup_latency.snapshot(),
            kvm_exit_handling: m.kvm_exits.get().map_or_else(Vec::new, |k| {
                k.code
                    .iter()
                    .zip(k.hist.iter())
                    .filter(|(c, _)| c.get() != 0)
                    .map(|(c, h)| (kvm_slot_name(c.get()), h.snapshot()))
                    .collect()
            }),
        }
    }

    /// No histograms at all (for readers that do not want them; copying them costs ~100 KB
    /// per vCPU).
    pub(super) fn none() -> HistSnapshots {
        let nothing = HistogramSnapshot {
            frac_bits: 0,
            counts: Vec::new(),
            sums: Vec::new(),
            max: 0,
        };
        HistSnapshots {
            exit_handling: Vec::new(),
            exit_handling_all: nothing.clone(),
            guest_run: nothing.clone(),
            wakeup_latency: nothing,
            kvm_exit_handling: Vec::new(),
        }
    }

    pub(super) fn since(&self, b: &HistSnapshots) -> HistSnapshots {
        HistSnapshots {
            exit_handling: self
                .exit_handling
                .iter()
                .zip(&b.exit_handling)
                .map(|(c, b)| c.since(b))
                .collect(),
            exit_handling_all: self.exit_handling_all.since(&b.exit_handling_all),
            guest_run: self.guest_run.since(&b.guest_run),
            wakeup_latency: self.wakeup_latency.since(&b.wakeup_latency),
            kvm_exit_handling: self
                .kvm_exit_handling
                .iter()
                .map(|(n, h)| {
                    let base = b.kvm_exit_handling.iter().find(|(bn, _)| bn == n);
                    (
                        n.clone(),
                        base.map_or_else(|| h.clone(), |(_, bh)| h.since(bh)),
                    )
                })
                .collect(),
        }
    }

    /// In-kernel exit handling, every reason merged (None: KVM's tracepoints split nothing).
    pub fn kvm_exit_handling_all(&self) -> Option<HistogramSnapshot> {
        let (_, first) = self.kvm_exit_handling.first()?;
        let mut all = HistogramSnapshot::empty(first.frac_bits);
        for (_, h) in &self.kvm_exit_handling {
            all.merge(h);
        }
        Some(all)
    }

    /// The histogram called `name`: `exit_handling`, `exit_handling.REASON`, `guest_run`,
    /// `wakeup_latency`, `kvm_exit_handling`, `kvm_exit_handling.REASON` (None: no such
    /// histogram, or no such reason in this vCPU's in-kernel exits).
    pub fn get(&self, name: &str) -> Option<HistogramSnapshot> {
        match name {
            "exit_handling" => Some(self.exit_handling_all.clone()),
            "guest_run" => Some(self.guest_run.clone()),
            "wakeup_latency" => Some(self.wakeup_latency.clone()),
            KVM_EXIT_HANDLING => self.kvm_exit_handling_all(),
            _ => {
                if let Some(reason) = name
                    .strip_prefix(KVM_EXIT_HANDLING)
                    .and_then(|r| r.strip_prefix('.'))
                {
                    let (_, h) = self.kvm_exit_handling.iter().find(|(n, _)| n == reason)?;
                    return Some(h.clone());
                }
                let reason = name.strip_prefix("exit_handling.")?;
                let i = ExitReason::ALL.iter().position(|r| r.name() == reason)?;
                self.exit_handling.get(i).cloned()
            }
        }
    }

    /// Whether `name` can name a histogram (a `kvm_exit_handling.REASON` of a reason no vCPU
    /// has had yet included).
    pub fn is_name(name: &str) -> bool {
        HistSnapshots::names().iter().any(|n| n == name)
            || name
                .strip_prefix(KVM_EXIT_HANDLING)
                .and_then(|r| r.strip_prefix('.'))
                .is_some_and(|r| !r.is_empty())
    }

    /// The names of `all`'s histograms: every fixed name, then each in-kernel exit reason any
    /// of them had.
    pub fn names_of(all: &[&HistSnapshots]) -> Vec<String> {
        let mut v = HistSnapshots::names();
        let mut reasons: Vec<&str> = all
            .iter()
            .flat_map(|h| h.kvm_exit_handling.iter().map(|(n, _)| n.as_str()))
            .collect();
        reasons.sort_unstable();
        reasons.dedup();
        v.extend(reasons.iter().map(|r| format!("{KVM_EXIT_HANDLING}.{r}")));
        v
    }

    /// Every fixed histogram name, in report order (`kvm_exit_handling.REASON` comes with
    /// the reasons: [`HistSnapshots::names_of`]).
    pub fn names() -> Vec<String> {
        let mut v = vec![
            "exit_handling".to_string(),
            "guest_run".to_string(),
            "wakeup_latency".to_string(),
            KVM_EXIT_HANDLING.to_string(),
        ];
        v.extend(
            ExitReason::ALL
                .iter()
                .map(|r| format!("exit_handling.{}", r.name())),
        );
        v
    }

    /// JSON of the non-empty histograms (exit_handling by reason only where it has samples).
    pub fn to_json(&self) -> BTreeMap<String, HistogramJson> {
        HistSnapshots::names_of(&[self])
            .into_iter()
            .filter_map(|n| {
                let h = self.get(&n)?;
                (h.count() > 0 || !n.contains('.')).then(|| (n, h.to_json()))
            })
            .collect()
    }
}
