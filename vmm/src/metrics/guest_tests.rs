//! The guest families: what a guest publishes becomes samples whose number the VM bounds,
//! not the guest (CPUs up to the vCPUs, the named threads, each tid once, the rest summed).

use ppa_vmm_api::{GuestAgentView, GuestCpuView, GuestThreadView, GuestView};

use super::guest::Guest;
use super::render;
use super::tests::{samples, stats};

fn thread(tid: u32, comm: &str, on_cpu_ms: u64) -> GuestThreadView {
    GuestThreadView {
        slot: 0,
        tid,
        tgid: 1,
        comm: comm.into(),
        last_cpu: 0,
        on_cpu_ns: on_cpu_ms * 1_000_000,
        utime_ns: 0,
        stime_ns: 0,
        run_delay_ns: 1_000_000,
        timeslices: 3,
        nvcsw: 0,
        nivcsw: 0,
        delays_ns: [1, 2, 3, 4],
        delays_more_ns: [5, 6, 7],
        delay_counts: [1, 1, 1, 1, 1, 1, 1],
        over: [0; 3],
        work: 0,
        updated_ns: 0,
        lag_ns: 0,
        stale: false,
        state: String::new(),
        kernel: false,
        interval_on_cpu_ns: 0,
    }
}

/// 14 threads (one tid listed twice, one name with quotes), 3 CPU records for a 2-vCPU VM,
/// an agent with 5 threads it did not publish.
pub(super) fn guest() -> Guest {
    let mut threads: Vec<GuestThreadView> = (0..12u32)
        .map(|i| thread(100 + i, &format!("worker-{i}"), 1000 - u64::from(i)))
        .collect();
    threads.insert(1, thread(100, "twice", 999));
    threads.push(thread(200, "say \"hi\"", 1));
    let cpu = |cpu: u32| GuestCpuView {
        cpu,
        times_ns: [1_000_000_000, 2, 3, 4, 5, 6, 7],
        interrupts: 0,
        context_switches: 0,
        softirqs: [0; 10],
        updated_ns: 0,
        over: [0; 2],
    };
    let agent: GuestAgentView = serde_json::from_value(serde_json::json!({
        "pid": 9, "interval_ns": 1_000_000_000u64, "samples": 3, "sample_cpu_ns": 0,
        "sample_max_cpu_ns": 0, "agent_cpu_ns": 5_000_000, "threads_seen": 19,
        "threads_published": 14, "rest_count": 5, "rest_on_cpu_ns": 40_000_000u64,
        "rest_interval_on_cpu_ns": 0, "unseen_count": 0, "unseen_cpu_ns": 0,
        "exited_processes": 0, "exits_missed": 0, "taskstats": true, "delayacct": true,
        "exits_lost": false, "cpu_switches": true, "stopped": false, "updated_ns": 0
    }))
    .unwrap();
    Guest {
        view: GuestView {
            page: true,
            published: true,
            version: "1.5".into(),
            nr_cpus: 3,
            updated_ns: 0,
            threads,
            cpus: vec![cpu(0), cpu(1), cpu(2)],
            transient_count: 4,
            transient_cpu_ns: 8_000_000,
            errors: vec![],
            host: vec![],
            agent: Some(agent),
            host_reset: vec![],
            alarms: Some(ppa_vmm_api::GuestAlarmsView {
                slots: 64,
                written: 3,
                suppressed: 1,
                forwarded: [0, 2, 1, 0, 0],
                ..Default::default()
            }),
            reset: None,
        },
        threads: 10,
        vcpus: 2,
    }
}

#[test]
fn guest_families_are_bounded_by_the_vm_and_the_rest_is_summed() {
    let text = render(&stats());
    let all = samples(&text);
    let of = |name: &str| all.iter().filter(|s| s.name == name).collect::<Vec<_>>();
    // CPUs 0 and 1 only (the VM has 2 vCPUs), 7 modes each.
    let cpus = of("ppa_guest_cpu_seconds_total");
    assert_eq!(cpus.len(), 14);
    assert!(cpus.iter().all(|s| s.label("cpu") != Some("2")));
    // 10 named threads, each tid once, and the rest.
    let t = of("ppa_guest_thread_cpu_seconds_total");
    assert_eq!(t.len(), 11);
    let mut tids: Vec<&str> = t.iter().filter_map(|s| s.label("tid")).collect();
    tids.sort_unstable();
    tids.dedup();
    assert_eq!(tids.len(), 11, "every tid once");
    let rest = t.iter().find(|s| s.label("tid") == Some("rest")).unwrap();
    // The 13th-listed threads (worker-9..11 less one named, the duplicate, the quoted one)
    // and the agent's 40 ms of unpublished threads: 991 + 990 + 989 − … summed exactly.
    let named: f64 = t
        .iter()
        .filter(|s| s.label("tid") != Some("rest"))
        .map(|s| s.value)
        .sum();
    let listed: f64 = guest()
        .view
        .threads
        .iter()
        .map(|t| t.on_cpu_ns as f64 / 1e9)
        .sum();
    assert!(
        ((named + rest.value) - (listed + 0.040)).abs() < 1e-6,
        "{named} + {} vs {listed}",
        rest.value
    );
    // Delays and counts: 8 kinds for each of the 11 series.
    assert_eq!(of("ppa_guest_thread_delay_seconds_total").len(), 88);
    assert_eq!(of("ppa_guest_thread_delays_total").len(), 88);
    // The VMM's alarm and reset counts are there for a VM with a page, zeros included.
    assert_eq!(of("ppa_guest_alarms_total").len(), 5);
    assert_eq!(of("ppa_guest_reset_generation").len(), 2);
    assert_eq!(of("ppa_guest_threads").len(), 2);
    let (ok, out) = super::tests::promtool(&text);
    assert!(ok, "{out}");
}
