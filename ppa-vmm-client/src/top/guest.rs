//! `top`'s guest pane: what the guest agent publishes in the PPA page (docs/agent.md), as
//! rates between two `guest` results: each guest CPU's busy share, the busiest threads' CPU
//! and run-queue wait, the last alarms the VMM forwarded, and the guest reset.
//!
//! Data flow: at each refresh `top` asks `guest` too (unless the VM has no PPA page, which
//! the first answer says); [`pane`] compares it with the previous one over the guest's own
//! clock (the header's `updated_ns`: the agent samples at its own interval, so a refresh
//! shorter than it may see no new sample, which the pane says).

use std::fmt::Write as _;

use ppa_vmm_api::{guest_alarms_text, GuestView};

/// Threads the pane shows.
const THREADS: usize = 8;
/// Alarms the pane shows (the latest).
const ALARMS: usize = 4;

/// The pane for `cur`, with rates over the guest time since `prev` (empty when the guest has
/// published nothing).
pub fn pane(prev: Option<&GuestView>, cur: &GuestView) -> String {
    let mut s = String::new();
    if !cur.published {
        return s;
    }
    let dt = prev.map_or(0, |p| cur.updated_ns.saturating_sub(p.updated_ns));
    let agent = cur.agent.as_ref().map_or(String::new(), |a| {
        format!(
            "; agent pid {} every {:.0} ms",
            a.pid,
            a.interval_ns as f64 / 1e6
        )
    });
    let _ = writeln!(s, "\nGUEST (PPA page, layout {}{agent})", cur.version);
    let pct = |ns: u64| 100.0 * ns as f64 / dt.max(1) as f64;
    let prev = prev.filter(|_| dt > 0);
    match prev {
        None => {
            let _ = writeln!(
                s,
                "  no new guest sample in this interval: rates at the next one"
            );
        }
        Some(p) => {
            let cpus: Vec<String> = cur
                .cpus
                .iter()
                .map(|c| {
                    let before = p.cpus.iter().find(|b| b.cpu == c.cpu);
                    let busy = |v: &ppa_vmm_api::GuestCpuView| {
                        v.times_ns[0]
                            .saturating_add(v.times_ns[1])
                            .saturating_add(v.times_ns[4])
                            .saturating_add(v.times_ns[5])
                    };
                    match before {
                        Some(b) => {
                            format!("{} {:.1} %", c.cpu, pct(busy(c).saturating_sub(busy(b))))
                        }
                        None => format!("{} -", c.cpu),
                    }
                })
                .collect();
            let _ = writeln!(s, "  CPUs busy: {}", cpus.join("  "));
            let mut rows: Vec<(u64, u64, &ppa_vmm_api::GuestThreadView)> = cur
                .threads
                .iter()
                .filter_map(|t| {
                    let b = p
                        .threads
                        .iter()
                        .find(|b| b.tid == t.tid && b.comm == t.comm)?;
                    Some((
                        t.on_cpu_ns.saturating_sub(b.on_cpu_ns),
                        t.run_delay_ns.saturating_sub(b.run_delay_ns),
                        t,
                    ))
                })
                .filter(|(cpu, wait, _)| *cpu + *wait > 0)
                .collect();
            rows.sort_by(|a, b| b.0.cmp(&a.0).then(a.2.tid.cmp(&b.2.tid)));
            let _ = writeln!(
                s,
                "{:>8} {:<16} {:>4} {:>7} {:>7}  (guest threads by CPU over the interval)",
                "TID", "NAME", "CPU", "CPU%", "RDY%"
            );
            for (cpu, wait, t) in rows.iter().take(THREADS) {
                let _ = writeln!(
                    s,
                    "{:>8} {:<16} {:>4} {:>7.1} {:>7.1}",
                    t.tid,
                    t.comm,
                    t.last_cpu,
                    pct(*cpu),
                    pct(*wait)
                );
            }
        }
    }
    let mut shown = cur.alarms.clone();
    if let Some(a) = &mut shown {
        let skip = a.last.len().saturating_sub(ALARMS);
        a.last.drain(..skip);
    }
    s.push_str(&guest_alarms_text(shown.as_ref(), cur.reset.as_ref()));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use ppa_vmm_api::{GuestCpuView, GuestThreadView};

    fn view(at_ms: u64, cpu_ms: u64) -> GuestView {
        let t: GuestThreadView = serde_json::from_value(serde_json::json!({
            "slot": 0, "tid": 97, "tgid": 96, "comm": "spin-0", "last_cpu": 1,
            "on_cpu_ns": cpu_ms * 1_000_000, "utime_ns": 0, "stime_ns": 0,
            "run_delay_ns": cpu_ms * 100_000, "timeslices": 1, "nvcsw": 0, "nivcsw": 0,
            "delays_ns": [0, 0, 0, 0], "work": 0, "updated_ns": 0, "lag_ns": 0, "stale": false
        }))
        .unwrap();
        GuestView {
            page: true,
            published: true,
            version: "1.5".into(),
            nr_cpus: 1,
            updated_ns: at_ms * 1_000_000,
            threads: vec![t],
            cpus: vec![GuestCpuView {
                cpu: 0,
                times_ns: [cpu_ms * 1_000_000, 0, 0, 0, 0, 0, 0],
                interrupts: 0,
                context_switches: 0,
                softirqs: [0; 10],
                updated_ns: 0,
                over: [0; 2],
            }],
            transient_count: 0,
            transient_cpu_ns: 0,
            errors: vec![],
            host: vec![],
            agent: None,
            host_reset: vec![],
            alarms: None,
            reset: None,
        }
    }

    #[test]
    fn rates_over_the_guests_own_clock() {
        let a = view(1000, 100);
        let b = view(2000, 600);
        let p = pane(Some(&a), &b);
        assert!(p.contains("CPUs busy: 0 50.0 %"), "{p}");
        let row = p.lines().find(|l| l.contains("spin-0")).expect(&p);
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            ["97", "spin-0", "1", "50.0", "5.0"]
        );
        // No new guest sample: said, no rates.
        let p = pane(Some(&b), &b);
        assert!(p.contains("no new guest sample"), "{p}");
        // Nothing published: no pane.
        let mut none = view(0, 0);
        none.published = false;
        assert_eq!(pane(None, &none), "");
    }
}
