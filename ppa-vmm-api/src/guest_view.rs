//! The text form of a decoded guest section ("GUEST VIEW"), beside host figures.
//!
//! Data flow: the VMM's final report (with each vCPU's final times) and `ppa-vmm ctl --text
//! guest` (with the host records the page holds now) both call [`guest_view_text`] on a
//! [`GuestView`], which the VMM's page decoder (`ppa_vmm::ppa_page::decode`) made; the caller
//! chooses which three host figures stand beside the guest's busy, idle and steal columns.
//! What a guest agent adds (its own record, threads grouped by process) is shown when it
//! published one. It lives in `ppa-vmm-api`, which both use, because it needs only the protocol's types.

use std::fmt::Write as _;

use crate::GuestView;

/// Threads shown; the rest are counted.
const MAX_THREADS: usize = 20;
/// Processes shown in a guest agent's view.
const MAX_PROCESSES: usize = 10;
/// The state of a thread that exited (`ppa_guest_abi::ppa_page::THREAD_STATE_EXITED`): a
/// guest agent keeps publishing it for a few samples with its final figures.
const EXITED: &str = "X";

/// Three host figures per guest CPU, in ns, shown after the guest's busy, idle and steal.
pub struct HostColumns<'a> {
    /// Column titles.
    pub names: [&'static str; 3],
    /// The figures of the vCPU with this index, if the host knows it.
    pub values: &'a dyn Fn(u32) -> Option<[u64; 3]>,
    /// By vCPU index, whether a `reset` restarted its host figures (they are then marked `*`:
    /// they count from the reset, the guest's from its boot).
    pub reset: &'a [bool],
}

/// The guest's view as a text block: a CPU table, a thread table, transient threads and one
/// line per problem; empty when the guest published nothing and nothing was wrong.
pub fn guest_view_text(g: &GuestView, host: &HostColumns) -> String {
    let mut out = String::new();
    if !g.published && g.errors.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "GUEST VIEW (PPA page, layout {}): what the guest published, beside the host's figures",
        if g.version.is_empty() {
            "?"
        } else {
            &g.version
        }
    );
    cpu_text(&mut out, g, host);
    thread_text(&mut out, g);
    if let Some(a) = &g.agent {
        agent_text(&mut out, g, a);
    }
    out.push_str(&crate::guest_alarms::alarms_text(
        g.alarms.as_ref(),
        g.reset.as_ref(),
    ));
    for e in &g.errors {
        let _ = writeln!(out, "  guest page problem: {e}");
    }
    out
}

/// Milliseconds, for the tables.
fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// The CPU table: the guest's busy, idle and steal beside the host's three figures, and a note
/// on the vCPUs whose host figures a `reset` restarted.
fn cpu_text(out: &mut String, g: &GuestView, host: &HostColumns) {
    if !g.cpus.is_empty() {
        let _ = writeln!(
            out,
            "{:>4} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}",
            "CPU",
            "BUSY guest",
            host.names[0],
            "IDLE guest",
            host.names[1],
            "STEAL seen",
            host.names[2]
        );
    }
    let was_reset = |cpu: u32| host.reset.get(cpu as usize).copied().unwrap_or(false);
    for c in &g.cpus {
        let h = (host.values)(c.cpu);
        let mark = if was_reset(c.cpu) { "*" } else { "" };
        let col = |i: usize| h.map_or("-".to_string(), |v| format!("{:.2}{mark}", ms(v[i])));
        let _ = writeln!(
            out,
            "{:>4} {:>11.2} {:>11} {:>11.2} {:>11} {:>11.2} {:>11}",
            c.cpu,
            ms(c.times_ns[0].saturating_add(c.times_ns[1])),
            col(0),
            ms(c.times_ns[2]),
            col(1),
            ms(c.times_ns[6]),
            col(2),
        );
    }
    let reset: Vec<String> = g
        .cpus
        .iter()
        .filter(|c| was_reset(c.cpu))
        .map(|c| c.cpu.to_string())
        .collect();
    if !reset.is_empty() {
        let _ = writeln!(
            out,
            "  * host figures of vCPU {} count from a `reset`, the guest's from its boot: \
             they do not compare",
            reset.join(", ")
        );
    }
}

/// The thread table (the first [`MAX_THREADS`] by on-CPU time), then the transient threads
/// and the exited ones still published.
fn thread_text(out: &mut String, g: &GuestView) {
    if !g.threads.is_empty() {
        let _ = writeln!(
            out,
            "{:>6} {:<16} {:>4} {:>11} {:>11} {:>12}  (threads by on-CPU time)",
            "TID", "NAME", "CPU", "ON-CPU ms", "DELAY ms", "WORK"
        );
    }
    for t in g.threads.iter().take(MAX_THREADS) {
        let _ = writeln!(
            out,
            "{:>6} {:<16} {:>4} {:>11.2} {:>11.2} {:>12}{}",
            t.tid,
            t.comm,
            t.last_cpu,
            ms(t.on_cpu_ns),
            ms(t.run_delay_ns),
            t.work,
            if t.state == EXITED {
                "  exited"
            } else if t.stale {
                "  stale"
            } else {
                ""
            }
        );
    }
    if g.threads.len() > MAX_THREADS {
        let _ = writeln!(
            out,
            "  ... and {} more threads",
            g.threads.len() - MAX_THREADS
        );
    }
    if g.transient_count > 0 {
        let _ = writeln!(
            out,
            "  transient threads: {} exited, {:.2} ms CPU",
            g.transient_count,
            ms(g.transient_cpu_ns)
        );
    }
    let exited: Vec<_> = g.threads.iter().filter(|t| t.state == EXITED).collect();
    if !exited.is_empty() {
        let _ = writeln!(
            out,
            "  exited threads still published (state X): {}, {:.2} ms CPU, not in the transient figures",
            exited.len(),
            ms(exited.iter().map(|t| t.on_cpu_ns).sum())
        );
    }
}

/// A guest agent's record, and the published threads grouped by process.
fn agent_text(out: &mut String, g: &GuestView, a: &crate::GuestAgentView) {
    let _ = writeln!(
        out,
        "  of which started and ended between samples: {} ({:.2} ms CPU); processes ended: {}{}",
        a.unseen_count,
        ms(a.unseen_cpu_ns),
        a.exited_processes,
        if a.taskstats {
            ""
        } else {
            " (no taskstats: counted from /proc, CPU estimated)"
        }
    );
    if a.rest_count > 0 {
        let _ = writeln!(
            out,
            "  not published (over the page's capacity): {} threads, {:.2} ms CPU, {:.2} ms in the last interval",
            a.rest_count,
            ms(a.rest_on_cpu_ns),
            ms(a.rest_interval_on_cpu_ns)
        );
    }
    // Published records of exited threads are not among the threads alive it counts.
    let exited = g.threads.iter().filter(|t| t.state == EXITED).count() as u32;
    let _ = writeln!(
        out,
        "  agent: pid {}, every {:.0} ms, {} samples, {} of {} threads published{}; last sample {:.0} us CPU (max {:.0} us), {:.3} % of a CPU in all{}",
        a.pid,
        ms(a.interval_ns),
        a.samples,
        a.threads_published.saturating_sub(exited),
        a.threads_seen,
        if exited > 0 {
            format!(" (and {exited} exited)")
        } else {
            String::new()
        },
        a.sample_cpu_ns as f64 / 1e3,
        a.sample_max_cpu_ns as f64 / 1e3,
        100.0 * a.agent_cpu_ns as f64 / (a.samples.max(1) as f64 * a.interval_ns.max(1) as f64),
        if a.stopped { "; stopped" } else { "" }
    );
    // Processes: published threads grouped by tgid, named after the thread whose tid is
    // the tgid (the process's first thread) when it is published.
    let mut procs: Vec<(u32, String, usize, u64)> = Vec::new();
    for t in &g.threads {
        match procs.iter_mut().find(|p| p.0 == t.tgid) {
            Some(p) => {
                p.2 += 1;
                p.3 += t.on_cpu_ns;
                if t.tid == t.tgid {
                    p.1.clone_from(&t.comm);
                }
            }
            None => procs.push((t.tgid, t.comm.clone(), 1, t.on_cpu_ns)),
        }
    }
    procs.sort_by(|a, b| b.3.cmp(&a.3).then(a.0.cmp(&b.0)));
    let _ = writeln!(
        out,
        "{:>6} {:<16} {:>7} {:>11}  (processes by on-CPU time of their published threads)",
        "TGID", "NAME", "THREADS", "ON-CPU ms"
    );
    for (tgid, name, n, on_cpu) in procs.iter().take(MAX_PROCESSES) {
        let _ = writeln!(out, "{tgid:>6} {name:<16} {n:>7} {:>11.2}", ms(*on_cpu));
    }
    if procs.len() > MAX_PROCESSES {
        let _ = writeln!(
            out,
            "  ... and {} more processes",
            procs.len() - MAX_PROCESSES
        );
    }
}

/// The host columns `ctl --text guest` can show from the view alone: each vCPU's used,
/// limited and steal time as its host record holds them now.
pub fn page_host_columns(g: &GuestView) -> impl Fn(u32) -> Option<[u64; 3]> + '_ {
    |cpu| {
        g.host
            .get(cpu as usize)
            .map(|&[steal, limited, used, _]| [used, limited, steal])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GuestCpuView, GuestThreadView};

    fn view() -> GuestView {
        GuestView {
            page: true,
            published: true,
            version: "1.0".into(),
            nr_cpus: 1,
            updated_ns: 9,
            threads: vec![GuestThreadView {
                slot: 0,
                tid: 7,
                tgid: 1,
                comm: "busy-0".into(),
                last_cpu: 0,
                on_cpu_ns: 2_500_000,
                utime_ns: 2_500_000,
                stime_ns: 0,
                run_delay_ns: 1_000_000,
                timeslices: 1,
                nvcsw: 0,
                nivcsw: 0,
                delays_ns: [0; 4],
                delays_more_ns: [0; 3],
                delay_counts: [0; 7],
                over: [0; 3],
                work: 42,
                updated_ns: 9,
                lag_ns: 0,
                stale: true,
                state: String::new(),
                kernel: false,
                interval_on_cpu_ns: 0,
            }],
            cpus: vec![GuestCpuView {
                cpu: 0,
                times_ns: [2_000_000, 500_000, 3_000_000, 0, 0, 0, 4_000_000],
                interrupts: 0,
                context_switches: 0,
                softirqs: [0; 10],
                updated_ns: 9,
                over: [0; 2],
            }],
            transient_count: 2,
            transient_cpu_ns: 1_500_000,
            errors: vec!["thread record 3 stayed mid-update for 8 tries".into()],
            host: vec![[4_500_000, 6_000_000, 7_000_000, 1]],
            agent: None,
            host_reset: Vec::new(),
            alarms: None,
            reset: None,
        }
    }

    #[test]
    fn every_part_is_shown_with_the_chosen_host_columns() {
        let g = view();
        let cols = page_host_columns(&g);
        let text = guest_view_text(
            &g,
            &HostColumns {
                names: ["USED host", "LMTD host", "STEAL host"],
                values: &cols,
                reset: &g.host_reset,
            },
        );
        assert!(!text.contains('*'), "nothing was reset: {text}");
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("layout 1.0"), "{text}");
        assert!(lines[1].contains("LMTD host"), "{text}");
        let cpu: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            cpu,
            ["0", "2.50", "7.00", "3.00", "6.00", "4.00", "4.50"],
            "busy = user + system; host used, limited, steal: {text}"
        );
        assert!(lines[4].contains("busy-0") && lines[4].ends_with("42  stale"));
        assert!(text.contains("2 exited, 1.50 ms CPU"));
        assert!(text.contains("guest page problem: thread record 3"));
    }

    #[test]
    fn an_agents_record_and_processes_are_shown_when_it_published() {
        let mut g = GuestView {
            errors: vec![],
            ..view()
        };
        let none = |_: u32| None;
        let cols = HostColumns {
            names: ["a", "b", "c"],
            values: &none,
            reset: &[],
        };
        assert!(!guest_view_text(&g, &cols).contains("agent:"));
        let t = g.threads[0].clone();
        g.threads.push(GuestThreadView {
            tid: 1,
            comm: "main".into(),
            on_cpu_ns: 500_000,
            ..t.clone()
        });
        g.threads.push(GuestThreadView {
            tid: 9,
            tgid: 9,
            comm: "other".into(),
            on_cpu_ns: 1_000_000,
            ..t
        });
        g.agent = Some(agent());
        let text = guest_view_text(&g, &cols);
        assert!(
            text.contains("between samples: 2 (0.25 ms CPU); processes ended: 1 (no taskstats"),
            "{text}"
        );
        assert!(
            text.contains("not published (over the page's capacity): 37 threads, 9.00 ms CPU"),
            "{text}"
        );
        assert!(text.contains("agent: pid 77, every 1000 ms, 10 samples, 3 of 40 threads published; last sample 120 us CPU (max 300 us), 0.015 % of a CPU"), "{text}");
        assert!(!text.contains("exited threads still"), "{text}");
        // Process 1 (busy-0 and main, named after main: tid = tgid) leads with 3.00 ms.
        let procs: Vec<Vec<&str>> = text
            .lines()
            .skip_while(|l| !l.contains("TGID"))
            .skip(1)
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            procs,
            [
                vec!["1", "main", "2", "3.00"],
                vec!["9", "other", "1", "1.00"]
            ]
        );
    }

    fn agent() -> crate::GuestAgentView {
        crate::GuestAgentView {
            pid: 77,
            interval_ns: 1_000_000_000,
            samples: 10,
            sample_cpu_ns: 120_000,
            sample_max_cpu_ns: 300_000,
            agent_cpu_ns: 1_500_000,
            threads_seen: 40,
            threads_published: 3,
            rest_count: 37,
            rest_on_cpu_ns: 9_000_000,
            rest_interval_on_cpu_ns: 1_000_000,
            unseen_count: 2,
            unseen_cpu_ns: 250_000,
            exited_processes: 1,
            exits_missed: 0,
            taskstats: false,
            delayacct: false,
            exits_lost: false,
            cpu_switches: false,
            stopped: false,
            updated_ns: 9,
        }
    }

    #[test]
    fn exited_threads_are_marked_and_summed_apart_from_the_transient_figures() {
        let mut g = view();
        g.threads[0].state = "X".into();
        let t = g.threads[0].clone();
        g.threads.push(GuestThreadView {
            tid: 8,
            comm: "spin-1".into(),
            on_cpu_ns: 500_000,
            state: "X".into(),
            ..t.clone()
        });
        g.threads.push(GuestThreadView {
            tid: 9,
            comm: "live".into(),
            state: "?".into(),
            ..t
        });
        let none = |_: u32| None;
        let cols = HostColumns {
            names: ["a", "b", "c"],
            values: &none,
            reset: &[],
        };
        g.agent = Some(crate::GuestAgentView {
            threads_seen: 40,
            threads_published: 3,
            ..agent()
        });
        let text = guest_view_text(&g, &cols);
        assert!(
            text.contains("1 of 40 threads published (and 2 exited);"),
            "{text}"
        );
        let row = |name: &str| text.lines().find(|l| l.contains(name)).unwrap();
        assert!(row("busy-0").ends_with("42  exited"), "{text}");
        assert!(row("spin-1").ends_with("  exited"), "{text}");
        assert!(row("live").ends_with("42  stale"), "{text}");
        assert!(
            text.contains(
                "exited threads still published (state X): 2, 3.00 ms CPU, not in the transient figures"
            ),
            "{text}"
        );
    }

    #[test]
    fn host_figures_restarted_by_a_reset_are_marked() {
        let g = GuestView {
            host_reset: vec![true],
            ..view()
        };
        let cols = page_host_columns(&g);
        let text = guest_view_text(
            &g,
            &HostColumns {
                names: ["USED host", "LMTD host", "STEAL host"],
                values: &cols,
                reset: &g.host_reset,
            },
        );
        let cpu: Vec<&str> = text.lines().nth(2).unwrap().split_whitespace().collect();
        assert_eq!(
            cpu,
            ["0", "2.50", "7.00*", "3.00", "6.00*", "4.00", "4.50*"],
            "{text}"
        );
        assert!(
            text.contains("host figures of vCPU 0 count from a `reset`"),
            "{text}"
        );
    }

    #[test]
    fn nothing_published_and_nothing_wrong_prints_nothing() {
        let g = GuestView {
            published: false,
            errors: vec![],
            ..view()
        };
        let none = |_: u32| None;
        let cols = HostColumns {
            names: ["a", "b", "c"],
            values: &none,
            reset: &[],
        };
        assert_eq!(guest_view_text(&g, &cols), "");
        let bad = GuestView {
            published: false,
            cpus: vec![],
            threads: vec![],
            ..view()
        };
        assert!(guest_view_text(&bad, &cols).contains("problem"));
    }
}
