//! The collector on this machine's real /proc, with threads of this test process whose
//! behaviour is known.

use super::*;
use std::sync::mpsc;
use std::time::Duration;

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

fn set_name(name: &str) {
    let c = std::ffi::CString::new(name).unwrap();
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, c.as_ptr()) };
}

fn find(c: &Collector, tid: u32) -> Option<ThreadInfo> {
    c.threads().find(|t| t.tid == tid).copied()
}

fn name(t: &ThreadInfo) -> &str {
    let n = t.comm.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
    std::str::from_utf8(&t.comm[..n]).unwrap()
}

/// A thread that names itself, spins `spin` of its own CPU time, reports its tid and CPU
/// time, then waits until told to end.
fn worker(
    name_: &'static str,
    spin: Duration,
) -> (u32, u64, mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        set_name(name_);
        let t0 = crate::thread_cpu_ns();
        while crate::thread_cpu_ns() - t0 < spin.as_nanos() as u64 {}
        tx.send((gettid(), crate::thread_cpu_ns())).unwrap();
        let _ = done_rx.recv();
    });
    let (tid, cpu) = rx.recv().unwrap();
    (tid, cpu, done_tx, h)
}

/// Waits (bounded) until thread `tid` of this process sleeps, as /proc shows it.
fn wait_asleep(tid: u32) {
    let path = format!("/proc/self/task/{tid}/stat");
    for _ in 0..2000 {
        let s = std::fs::read(&path).unwrap();
        if procfs::task_stat(&s).unwrap().state == b'S' {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("thread {tid} never went to sleep");
}

#[test]
fn a_spinning_thread_is_measured_and_an_ended_one_counted() {
    let _g = crate::threads_serial();
    let mut c = Collector::new(None, Options::default()).unwrap();
    c.sample().unwrap();
    let (spin, spun, stop_spin, h1) = worker("spin (x) y", Duration::from_millis(30));
    let (idle, _, stop_idle, h2) = worker("idle", Duration::ZERO);
    wait_asleep(spin);
    c.sample().unwrap();
    let s = find(&c, spin).expect("the spinning thread");
    assert_eq!(name(&s), "spin (x) y");
    assert_eq!(s.tgid, std::process::id());
    assert_eq!(s.state, b'S', "waiting on its channel");
    assert!(!s.kernel);
    // Its own clock read last at `spun`; it only waited after that.
    assert!(
        s.sched.on_cpu_ns >= spun && s.sched.on_cpu_ns < spun + 2_000_000,
        "{s:?} vs {spun}"
    );
    assert_eq!(
        s.interval_on_cpu_ns, s.sched.on_cpu_ns,
        "born in this interval"
    );
    assert!(s.nvcsw >= 1, "it blocked at least once: {s:?}");
    // The tick split adds up to the precise total, or is absent before the first tick.
    let split = s.utime_ns + s.stime_ns;
    assert!(split == s.sched.on_cpu_ns || split == 0, "{s:?}");
    let i = find(&c, idle).expect("the idle thread");
    assert!(i.sched.on_cpu_ns < 5_000_000, "{i:?}");

    // Nothing runs in the spinner now: its interval is empty and its record unchanged.
    c.sample().unwrap();
    let again = find(&c, spin).unwrap();
    assert_eq!(again.interval_on_cpu_ns, 0);
    assert_eq!(again.sched, s.sched);

    // It ends: gone from the table, counted as exited with the CPU last sampled.
    let before = c.totals();
    stop_spin.send(()).unwrap();
    h1.join().unwrap();
    c.sample().unwrap();
    assert!(find(&c, spin).is_none());
    let after = c.totals();
    assert!(after.exited_count > before.exited_count);
    assert!(after.exited_cpu_ns - before.exited_cpu_ns >= s.sched.on_cpu_ns);
    // Still chosen for publication, after the live threads: its last figures, state X.
    let x = c
        .selected()
        .find(|t| t.tid == spin)
        .copied()
        .expect("the ended thread lingers");
    assert_eq!((x.state, x.sched), (b'X', again.sched), "{x:?}");
    assert!(x.exited_ns != 0 && x.interval_on_cpu_ns == 0, "{x:?}");
    assert!(
        c.selected()
            .skip_while(|t| t.exited_ns == 0)
            .all(|t| t.exited_ns != 0),
        "live threads first"
    );
    stop_idle.send(()).unwrap();
    h2.join().unwrap();
}

#[test]
fn a_thread_born_and_ended_between_samples_is_counted_unseen_without_taskstats() {
    let _g = crate::threads_serial();
    let mut c = Collector::new(None, Options::default()).unwrap();
    c.sample().unwrap();
    let before = c.totals();
    std::thread::spawn(|| {}).join().unwrap();
    // The fork count grew by at least that thread, and no listing found it. A task created
    // anywhere on the system while a sample lists /proc is found before its fork is counted,
    // which moves one unit of the balance to the next sample (CI, 2026-12-01: unseen 0 after
    // one sample, as another test's thread started): a few more samples settle it.
    let mut after = c.totals();
    for _ in 0..5 {
        c.sample().unwrap();
        after = c.totals();
        if after.unseen_count > before.unseen_count {
            break;
        }
    }
    assert!(
        after.unseen_count > before.unseen_count,
        "{before:?} -> {after:?}"
    );
    assert!(after.exited_count > before.exited_count);
}

#[test]
fn only_threads_chosen_for_publication_have_their_details_reread() {
    let _g = crate::threads_serial();
    let mut c = Collector::new(
        None,
        Options {
            capacity: 2,
            ..Options::default()
        },
    )
    .unwrap();
    c.sample().unwrap();
    let (spin, _, stop, h) = worker("chosen", Duration::from_millis(20));
    wait_asleep(spin);
    c.sample().unwrap();
    let chosen: Vec<(u64, u32)> = c
        .selected()
        .map(|t| (t.interval_on_cpu_ns, t.tid))
        .collect();
    assert_eq!(chosen.len(), 2);
    // No thread left out ran more in the interval than one chosen (tests running beside
    // this one may outrun the 20 ms spinner, so which threads win is not fixed).
    let least = chosen.iter().map(|c| c.0).min().unwrap();
    let ids: Vec<u32> = chosen.iter().map(|c| c.1).collect();
    for t in c.threads().filter(|t| !ids.contains(&t.tid)) {
        assert!(
            t.interval_on_cpu_ns <= least,
            "{t:?} left out, {chosen:?} chosen"
        );
    }
    let ph = c.phases();
    assert!(ph.threads_detailed <= 2, "{ph:?}");
    assert!(ph.threads_read >= 1);
    assert!(c.nr_cpus() >= 1 && c.cpus().count() == c.nr_cpus() as usize);
    let cpu = c.cpus().next().unwrap();
    assert!(cpu.user_ns + cpu.system_ns + cpu.idle_ns > 0, "{cpu:?}");
    stop.send(()).unwrap();
    h.join().unwrap();
}
