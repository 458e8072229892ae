//! The final record of an exited thread, how long it stays, what gives way when the table is
//! full, and the rule that keeps every exited thread's CPU in exactly one published figure.

use super::*;
use crate::procfs::SchedStat;
use ppa_guest_abi::ppa_page::COMM_LEN;

fn comm(s: &str) -> [u8; COMM_LEN] {
    let mut c = [0; COMM_LEN];
    c[..s.len()].copy_from_slice(s.as_bytes());
    c
}

fn live(tid: u32, on_cpu_ns: u64) -> ThreadInfo {
    ThreadInfo {
        tid,
        tgid: 100,
        comm: comm("spin-0"),
        state: b'R',
        last_cpu: 1,
        sched: SchedStat {
            on_cpu_ns,
            run_delay_ns: 10,
            timeslices: 4,
        },
        utime_ns: on_cpu_ns * 3 / 4,
        stime_ns: on_cpu_ns - on_cpu_ns * 3 / 4,
        nvcsw: 1,
        nivcsw: 2,
        ..ThreadInfo::default()
    }
}

fn exit(tid: u32, cpu_ns: u64) -> TaskExit {
    TaskExit {
        tid,
        tgid: 100,
        comm: comm("spin-0"),
        cpu_ns,
        sched_cpu_ns: cpu_ns,
        elapsed_ns: 2 * cpu_ns,
        run_delay_ns: 30,
        timeslices: 9,
        utime_ns: 0,
        stime_ns: 0,
        nvcsw: 5,
        nivcsw: 6,
        delays: [0; 7],
        delay_counts: [0; 7],
        group_end: false,
    }
}

#[test]
fn an_exit_notification_gives_the_final_figures_and_the_sample_the_rest() {
    let last = live(7, 400);
    let e = exit(7, 500);
    let t = final_record(Some(&last), 300, Some(&e), 9_000).unwrap();
    assert_eq!(t.state, THREAD_STATE_EXITED);
    assert_eq!(
        (t.tid, t.tgid, t.last_cpu),
        (7, 100, 1),
        "kept from the sample"
    );
    assert_eq!(
        (t.sched.on_cpu_ns, t.sched.run_delay_ns, t.sched.timeslices),
        (500, 30, 9),
        "the notification's figures are final"
    );
    assert_eq!((t.nvcsw, t.nivcsw), (5, 6));
    assert_eq!(
        (t.utime_ns, t.stime_ns),
        (375, 125),
        "the sampled 3:1 split scaled to the final on-CPU time"
    );
    assert_eq!(
        t.interval_on_cpu_ns, 200,
        "500 less the 300 of the sample before"
    );
    assert_eq!(t.exited_ns, 9_000);

    // The kernel's own split at the exit wins over the sampled one.
    let e2 = TaskExit {
        utime_ns: 1_000,
        stime_ns: 1_000,
        ..e
    };
    let t = final_record(Some(&last), 0, Some(&e2), 9_000).unwrap();
    assert_eq!((t.utime_ns, t.stime_ns), (250, 250));
}

#[test]
fn without_a_notification_the_last_sample_and_without_a_sample_the_notification() {
    let last = live(7, 400);
    let t = final_record(Some(&last), 400, None, 5).unwrap();
    assert_eq!(t.sched, last.sched, "the last sampled figures");
    assert_eq!((t.state, t.interval_on_cpu_ns), (b'X', 0));
    // Never sampled: everything from the notification; all its time in this interval.
    let t = final_record(None, 0, Some(&exit(8, 50)), 5).unwrap();
    assert_eq!((t.tid, t.tgid, t.sched.on_cpu_ns), (8, 100, 50));
    assert_eq!(&t.comm[..6], b"spin-0");
    assert_eq!((t.interval_on_cpu_ns, t.utime_ns, t.stime_ns), (50, 0, 0));
    assert!(final_record(None, 0, None, 5).is_none());
    // A clock at 0 still marks the record exited.
    assert_ne!(final_record(Some(&last), 0, None, 0).unwrap().exited_ns, 0);
}

fn cand(tid: u32, order: u64, samples_left: u32) -> Candidate {
    Candidate {
        tid,
        order,
        samples_left,
        reused: false,
    }
}

#[test]
fn the_newest_exits_stay_the_oldest_give_way_and_expired_or_reused_ones_go() {
    let c = [
        cand(1, 10, 2),
        cand(2, 30, 1),
        cand(3, 20, 3),
        cand(4, 40, 0),
    ];
    assert_eq!(evict(10, &c), vec![1, 2, 0], "newest first; 4's time is up");
    assert_eq!(
        evict(2, &c),
        vec![1, 2],
        "the oldest exit (tid 1) gives way"
    );
    assert!(
        evict(0, &c).is_empty(),
        "no room: all give way to live threads"
    );
    let mut r = c;
    r[1].reused = true;
    assert_eq!(evict(10, &r), vec![2, 0], "a live thread took tid 2");
}

#[test]
fn a_thread_is_published_for_exactly_linger_samples_after_its_exit() {
    for n in 0..5 {
        let mut l = Lingering::new(n);
        l.exited(Some(&live(7, 400)), 300, Some(&exit(7, 500)), 1);
        let mut published = 0;
        for sample in 0..10 {
            let kept = l.choose(8, |_| false);
            if kept == [7] {
                published += 1;
                let t = l.get(7).unwrap();
                let want = if sample == 0 { 200 } else { 0 };
                assert_eq!(t.interval_on_cpu_ns, want, "sample {sample}");
            } else {
                assert!(kept.is_empty() && l.get(7).is_none());
            }
        }
        assert_eq!(published, n, "linger {n}");
        assert!(l.is_empty());
    }
}

#[test]
fn lingering_records_give_way_to_live_threads_oldest_exit_first() {
    let mut l = Lingering::new(3);
    for tid in [1, 2, 3] {
        l.exited(Some(&live(tid, 100)), 0, None, u64::from(tid));
    }
    assert_eq!(l.choose(3, |_| false), vec![3, 2, 1]);
    // Live threads now need all but one record: the newest exit keeps its place.
    assert_eq!(l.choose(1, |_| false), vec![3]);
    assert_eq!(
        l.len(),
        1,
        "the ones that gave way are forgotten, not put back"
    );
    assert_eq!(l.choose(3, |_| false), vec![3]);
    // A new thread with tid 3: the exited one goes.
    l.exited(Some(&live(4, 100)), 0, None, 9);
    assert_eq!(l.choose(3, |tid| tid == 3), vec![4]);
}

#[test]
fn published_plus_aggregate_plus_transient_is_all_the_cpu_seen_each_counted_once() {
    // Live: 5 threads; the page holds 4 records. Exits: 3 (CPU 100, 200, 400).
    let live_threads: Vec<ThreadInfo> = (1..=5).map(|t| live(t, 1000 * u64::from(t))).collect();
    let live_cpu: u64 = live_threads.iter().map(|t| t.sched.on_cpu_ns).sum();
    let mut l = Lingering::new(2);
    let mut exited = (0u64, 0u64);
    for (tid, cpu) in [(11, 100), (12, 200), (13, 400)] {
        l.exited(None, 0, Some(&exit(tid, cpu)), u64::from(tid));
        exited = (exited.0 + 1, exited.1 + cpu);
    }
    let seen = live_cpu + exited.1;
    for (capacity, listed_exits) in [(4, 0), (5, 0), (6, 1), (7, 2), (9, 3)] {
        let mut lc = Lingering::new(2);
        for (tid, cpu) in [(11, 100), (12, 200), (13, 400)] {
            lc.exited(None, 0, Some(&exit(tid, cpu)), u64::from(tid));
        }
        // The busiest live threads first, up to capacity, then the lingering ones.
        let live_pub: Vec<&ThreadInfo> = live_threads.iter().rev().take(capacity).collect();
        let kept = lc.choose(capacity - live_pub.len(), |_| false);
        let exits: Vec<&ThreadInfo> = kept.iter().filter_map(|t| lc.get(*t)).collect();
        assert_eq!(exits.len(), listed_exits, "capacity {capacity}");
        let published: u64 = live_pub
            .iter()
            .chain(exits.iter())
            .map(|t| t.sched.on_cpu_ns)
            .sum();
        let rest: u64 = live_threads
            .iter()
            .filter(|t| !live_pub.iter().any(|p| p.tid == t.tid))
            .map(|t| t.sched.on_cpu_ns)
            .sum();
        let (n, cpu) = transient(exited, exits.iter().copied());
        assert_eq!(published + rest + cpu, seen, "capacity {capacity}");
        assert_eq!(n as usize + exits.len(), 3, "capacity {capacity}");
    }
    // Over the samples the transient figures only grow, and end with every exit.
    let mut last = (0, 0);
    for _ in 0..4 {
        let kept = l.choose(8, |_| false);
        let t = transient(exited, kept.iter().filter_map(|t| l.get(*t)));
        assert!(t.0 >= last.0 && t.1 >= last.1, "{t:?} after {last:?}");
        last = t;
    }
    assert_eq!(last, exited);
}
