//! Unit tests of the rendered-metrics cache and the self-monitoring readers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::exporter::{Exporter, Listener, ServerCounters};
use super::process::{start_time_from, ProcessReading, ThreadCpu, ThreadKind};
use super::{Detailed, FAMILIES};
use crate::sync::now_ns;
use ppa_vmm_api::{Level, Thresholds, VmState, VmStats};

/// A VM without vCPUs whose uptime says when it was collected.
fn figures(at_ns: u64) -> Detailed {
    Detailed {
        vm: VmStats {
            name: "cache".into(),
            pid: 1,
            state: VmState::Running,
            vcpus: 0,
            uptime_ns: at_ns,
            level: Level::Basic,
            thresholds: Thresholds::default(),
            host_threads_ns: 0,
            host_cpu_ns: Default::default(),
            pressure: Default::default(),
        },
        vcpus: Vec::new(),
        groups: Vec::new(),
        devices: Vec::new(),
        process: None,
        pressure_groups: vec![],
        guest: None,
    }
}

/// The value of the sample of `name` (no labels but `vm`) in `text`.
fn value(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// With a clock the test moves: one render per interval, the same text in between.
#[test]
fn renders_at_most_once_per_interval() {
    let clock = Arc::new(AtomicU64::new(1_000_000_000));
    let c = Arc::clone(&clock);
    let e = Exporter::with_clock(100_000_000, move || c.load(Ordering::SeqCst));
    let collected = AtomicU64::new(0);
    let serve = |e: &Exporter| {
        e.serve(|_| {
            collected.fetch_add(1, Ordering::SeqCst);
            figures(clock.load(Ordering::SeqCst))
        })
    };
    let first = serve(&e);
    assert_eq!(e.renders(), 1);
    for step in [0, 1, 50_000_000, 99_999_999] {
        clock.store(1_000_000_000 + step, Ordering::SeqCst);
        let r = serve(&e);
        assert!(Arc::ptr_eq(&r, &first), "cached {step} ns after the render");
    }
    assert_eq!((e.renders(), collected.load(Ordering::SeqCst)), (1, 1));
    clock.store(1_100_000_000, Ordering::SeqCst);
    let second = serve(&e);
    assert!(!Arc::ptr_eq(&second, &first), "rendered again after 100 ms");
    assert_eq!(second.at_ns, 1_100_000_000);
    assert_eq!((e.renders(), collected.load(Ordering::SeqCst)), (2, 2));
    // The exporter's own figures: the request that rendered, the render count.
    assert_eq!(value(&first.text, "ppa_metrics_requests_total"), Some(1));
    assert_eq!(value(&second.text, "ppa_metrics_requests_total"), Some(6));
    assert_eq!(value(&second.text, "ppa_metrics_renders_total"), Some(2));
    assert!(second
        .text
        .contains("ppa_metrics_render_interval_seconds{vm=\"cache\"} 0.1\n"));
    // Interval 0: every request renders.
    let e = Exporter::with_clock(0, || 5);
    for _ in 0..3 {
        e.serve(|_| figures(5));
    }
    assert_eq!(e.renders(), 3);
}

/// Four threads scraping as fast as they can on the real clock: never more renders than
/// intervals elapsed (plus the first), and no text older than the interval when served.
#[test]
fn a_scrape_flood_renders_once_per_interval_and_reads_fresh_figures() {
    const INTERVAL: u64 = 5_000_000;
    let e = Arc::new(Exporter::with_interval(INTERVAL));
    let collected = Arc::new(AtomicU64::new(0));
    let start = now_ns();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (e, collected) = (Arc::clone(&e), Arc::clone(&collected));
            std::thread::spawn(move || {
                let mut served = 0u64;
                for _ in 0..2_000 {
                    let asked = now_ns();
                    let r = e.serve(|_| {
                        collected.fetch_add(1, Ordering::SeqCst);
                        figures(now_ns())
                    });
                    // Every figure was read after at_ns, and at_ns is within the interval.
                    assert!(
                        r.at_ns + INTERVAL > asked,
                        "served a text rendered {} ns before the request",
                        asked - r.at_ns
                    );
                    served += 1;
                }
                served
            })
        })
        .collect();
    let served: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let elapsed = now_ns() - start;
    let renders = e.renders();
    assert_eq!(renders, collected.load(Ordering::SeqCst));
    assert!(
        renders <= elapsed / INTERVAL + 1,
        "{renders} renders in {elapsed} ns"
    );
    assert_eq!(served, 8_000);
    assert!(renders < served, "{renders} renders for {served} requests");
}

/// The server's counters appear once attached, with what the server counted.
#[test]
fn server_counters_appear_once_attached() {
    let e = Exporter::with_interval(0);
    let before = e.serve(|_| figures(0));
    assert!(!before.text.contains("ppa_api_"), "{}", before.text);
    let c = Arc::new(ServerCounters::default());
    assert!(e.attach_server(Arc::clone(&c)));
    assert!(!e.attach_server(Arc::new(ServerCounters::default())));
    for _ in 0..3 {
        c.connected(Listener::Http);
    }
    c.closed(Listener::Http);
    c.connected(Listener::Socket);
    c.refused(Listener::Socket);
    c.closed(Listener::Socket);
    c.closed(Listener::Socket);
    c.events_dropped(7);
    let text = &e.serve(|_| figures(0)).text;
    for line in [
        "ppa_api_clients{vm=\"cache\",listener=\"http\"} 2",
        "ppa_api_clients{vm=\"cache\",listener=\"socket\"} 0",
        "ppa_api_connections_total{vm=\"cache\",listener=\"http\"} 3",
        "ppa_api_connections_total{vm=\"cache\",listener=\"socket\"} 1",
        "ppa_api_connections_refused_total{vm=\"cache\",listener=\"socket\"} 1",
        "ppa_api_connections_refused_total{vm=\"cache\",listener=\"http\"} 0",
        "ppa_api_events_dropped_total{vm=\"cache\"} 7",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
    }
    let (ok, said) = super::tests::promtool(text);
    assert!(ok, "promtool: {said}\n{text}");
}

/// The exporter's families are not among the renderer's (each family once per text).
#[test]
fn exporter_families_are_distinct() {
    for d in super::exporter::exporter_families() {
        assert!(FAMILIES.iter().all(|f| f.name != d.name), "{}", d.name);
    }
}

#[test]
fn thread_kinds_from_names() {
    let kind = |tid, comm| ThreadKind::of(tid, 100, comm);
    assert_eq!(kind(100, "ppa-vmm\n"), ThreadKind::Main);
    assert_eq!(kind(100, "vcpu0"), ThreadKind::Main);
    assert_eq!(kind(101, "vcpu0\n"), ThreadKind::Vcpu);
    assert_eq!(kind(102, "vcpu63"), ThreadKind::Vcpu);
    assert_eq!(kind(103, "vcpu"), ThreadKind::Other);
    assert_eq!(kind(103, "vcpux"), ThreadKind::Other);
    assert_eq!(kind(104, "api"), ThreadKind::Api);
    assert_eq!(kind(105, "api-stats"), ThreadKind::Api);
    assert_eq!(kind(106, "sampler"), ThreadKind::Sampler);
    assert_eq!(kind(107, "limiter"), ThreadKind::Limiter);
    assert_eq!(kind(108, "kvm-nx-lpage-re"), ThreadKind::Other);
    assert_eq!(kind(109, "net0-qp0"), ThreadKind::Device);
    assert_eq!(kind(110, "uplink-qp15"), ThreadKind::Device);
    assert_eq!(kind(111, "-qp1"), ThreadKind::Other);
    assert_eq!(kind(112, "net0-qp"), ThreadKind::Other);
    assert_eq!(kind(113, "blk0-q0"), ThreadKind::Device);
    assert_eq!(kind(114, "data-q15"), ThreadKind::Device);
    assert_eq!(kind(115, "blk0-q"), ThreadKind::Other);
    // Firecracker's names (`ppa-vmm firecracker`).
    assert_eq!(kind(116, "fc_vcpu 0\n"), ThreadKind::Vcpu);
    assert_eq!(kind(117, "fc_vcpu 255"), ThreadKind::Vcpu);
    assert_eq!(kind(118, "fc_vcpu "), ThreadKind::Other);
    assert_eq!(kind(119, "fc_vcpu0"), ThreadKind::Other);
}

/// Per-kind CPU time never decreases: a thread that ends, a tid reused by a new thread, a
/// thread renamed.
#[test]
fn thread_cpu_per_kind_stays_monotonic() {
    use ThreadKind::{Api, Main, Other, Vcpu};
    let mut t = ThreadCpu::default();
    let at = |k: ThreadKind, v: [u64; ThreadKind::ALL.len()]| {
        v[ThreadKind::ALL.iter().position(|x| *x == k).unwrap()]
    };
    let r = t.update([(1, Main, 10), (2, Vcpu, 100), (3, Vcpu, 200)]);
    assert_eq!((at(Main, r), at(Vcpu, r)), (10, 300));
    // vCPU 3 ended: its 200 stay.
    let r = t.update([(1, Main, 11), (2, Vcpu, 150)]);
    assert_eq!((at(Main, r), at(Vcpu, r)), (11, 350));
    // tid 3 comes back as a new thread (its clock starts again).
    let r = t.update([(1, Main, 11), (2, Vcpu, 150), (3, Vcpu, 5)]);
    assert_eq!(at(Vcpu, r), 355);
    // tid 4 first seen with an inherited name, then named `api`: its time so far stays
    // `other`, what follows is `api`.
    let r = t.update([(4, Other, 7)]);
    assert_eq!(at(Other, r), 7);
    assert_eq!(at(Vcpu, r), 355, "every thread but 4 ended");
    let r = t.update([(4, Api, 9)]);
    assert_eq!((at(Other, r), at(Api, r)), (7, 2));
    let r = t.update([]);
    assert_eq!(r.iter().sum::<u64>(), 11 + 355 + 7 + 2);
}

#[test]
fn start_time_from_proc_texts() {
    // A name with spaces and a parenthesis; starttime (field 22) is 12345 ticks.
    let stat = "42 (a) b (c) S 1 42 42 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 3 0 12345 1000 20";
    let proc_stat = "cpu  1 2 3\nbtime 1700000000\nprocesses 5\n";
    assert_eq!(
        start_time_from(stat, proc_stat, 100),
        Some(1_700_000_000_000_000_000 + 123_450_000_000)
    );
    assert_eq!(start_time_from(stat, "cpu 1\n", 100), None);
    assert_eq!(start_time_from("garbage", proc_stat, 100), None);
    assert_eq!(start_time_from(stat, proc_stat, 0), None);
}

/// A reading of this test process: every figure the host gives is there and plausible.
#[test]
fn the_process_reads_itself() {
    let mut threads = ThreadCpu::default();
    // Some CPU time to see.
    let mut x = 0u64;
    for i in 0..2_000_000u64 {
        x = x.wrapping_mul(31).wrapping_add(i);
    }
    std::hint::black_box(x);
    let p = ProcessReading::read(&mut threads);
    assert!(p.cpu_ns > 0);
    assert!(p.resident_bytes.is_some_and(|b| b > 0));
    assert!(p.virtual_bytes >= p.resident_bytes);
    assert!(p.open_fds.is_some_and(|n| n >= 3), "{p:?}");
    assert!(p.threads >= 1);
    assert!(p.thread_cpu_ns.iter().sum::<u64>() > 0, "{p:?}");
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let start_s = p.start_time_ns.expect("a start time") / 1_000_000_000;
    // Started before now (clock ticks round down), and after 2020.
    assert!(
        start_s <= now_s && start_s > 1_577_836_800,
        "{start_s} vs {now_s}"
    );
}
