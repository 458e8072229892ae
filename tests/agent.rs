//! The guest agent end to end, on the host: a VM whose tiny guest does not publish exposes its
//! PPA page as a file, `ppa-agent --page-file` publishes this machine's threads into it, and
//! the VMM's `guest` command and final report are checked against threads of this test
//! whose CPU time is known (issue 15, "Tests"): a thread spinning 300 ms of its own CPU time,
//! a sleeping one, one that starts and ends between samples, and 50 short-lived processes
//! (each exit in the transient figures or still published as an exited thread, state `X`);
//! then a second agent limited to 8 records, whose aggregate must account for the rest.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::vmm::{Conn, Vmm};
use ppa_vmm_api::{GuestAgentView, GuestView};
use serde_json::json;

/// The agent binary, built beside the VMM's (`cargo test --workspace` builds both).
fn agent_bin() -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_ppa-vmm")).with_file_name("ppa-agent");
    assert!(
        p.exists(),
        "{} is missing: build it with `cargo build --release -p ppa-agent` (cargo test --workspace builds it)",
        p.display()
    );
    p
}

fn clock(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to fill.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

fn guest(c: &mut Conn) -> GuestView {
    serde_json::from_value(c.ok(json!({"cmd": "guest"}))).unwrap()
}

/// Every exit the view accounts for (count, CPU ns): the transient figures and the exited
/// threads (state `X`) still published, which are not in them.
fn exits_in(g: &GuestView) -> (u64, u64) {
    g.threads
        .iter()
        .filter(|t| t.state == "X")
        .fold((g.transient_count, g.transient_cpu_ns), |(n, cpu), t| {
            (n + 1, cpu + t.on_cpu_ns)
        })
}

/// The published records of live threads.
fn live_published(g: &GuestView, a: &GuestAgentView) -> u64 {
    let exited = g.threads.iter().filter(|t| t.state == "X").count() as u64;
    u64::from(a.threads_published) - exited
}

/// Polls `guest` until agent `pid` has taken `more` samples after sample `since` (bounded).
fn after_samples(c: &mut Conn, pid: u32, since: u64, more: u64) -> (GuestView, GuestAgentView) {
    for _ in 0..1500 {
        let g = guest(c);
        if let Some(a) = g.agent.clone() {
            if a.pid == pid && a.samples >= since + more {
                return (g, a);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("the agent did not publish {more} more samples after sample {since}");
}

/// A thread named `name` that spins `spin_ns` of its own CPU time, sends its tid and CPU
/// time (read as the spin ends), then waits until told to end.
fn thread(name: &str, spin_ns: u64) -> (u32, u64, mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    spinner(name, spin_ns, false)
}

/// [`thread`], the spinner at SCHED_FIFO when `fifo` (and the process may: as root), so that
/// no other thread of a busy host cuts its run into short slices.
fn spinner(
    name: &str,
    spin_ns: u64,
    fifo: bool,
) -> (u32, u64, mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let h = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            if fifo {
                let p = libc::sched_param { sched_priority: 1 };
                // SAFETY: sets this thread's own policy from a parameter that lives for the call.
                if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) } != 0 {
                    eprintln!(
                        "SCHED_FIFO refused ({}): the spinner's slices follow the host's load",
                        std::io::Error::last_os_error()
                    );
                }
            }
            let t0 = clock(libc::CLOCK_THREAD_CPUTIME_ID);
            let mut t = t0;
            while t - t0 < spin_ns {
                t = clock(libc::CLOCK_THREAD_CPUTIME_ID);
            }
            tx.send((gettid(), t)).unwrap();
            let _ = stop_rx.recv();
        })
        .unwrap();
    let (tid, cpu) = rx.recv().unwrap();
    (tid, cpu, stop_tx, h)
}

/// A short-lived process: forks, spins `spin_ns` of CPU reading its clock (so the
/// scheduler's figure is current when it exits), leaves that figure in shared memory and
/// exits. Returns (pid, its CPU at its last clock read, its CPU as wait4's rusage gives it).
fn short_process(shared: *mut u64, spin_ns: u64) -> (u32, u64, u64) {
    // SAFETY: the child only reads a clock, stores one word and calls _exit, all
    // async-signal-safe, so forking this multi-threaded test process is sound.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let t0 = clock(libc::CLOCK_PROCESS_CPUTIME_ID);
        let mut t = t0;
        while t - t0 < spin_ns {
            t = clock(libc::CLOCK_PROCESS_CPUTIME_ID);
        }
        // SAFETY: the shared page is mapped in the child too; _exit never returns.
        unsafe {
            shared.write_volatile(t);
            libc::_exit(0)
        }
    }
    // SAFETY: zeroed rusage is valid; waiting for our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let mut status = 0;
    // SAFETY: as above.
    unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    // SAFETY: the child wrote the word before it exited.
    let seen = unsafe { shared.read_volatile() };
    (pid as u32, seen, tv(ru.ru_utime) + tv(ru.ru_stime))
}

/// Starts the agent on `page`; its stderr goes to `log`. The kernel kills it when the thread
/// that started it ends, so a failed assertion (which aborts: `panic = "abort"`) leaves no
/// agent behind.
fn start_agent(page: &Path, log: &Path, extra: &[&str]) -> Child {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(agent_bin());
    cmd.args([
        "--config",
        "/dev/null",
        "--interval",
        "100ms",
        "--log-exits",
    ])
    .arg("--page-file")
    .arg(page)
    .args(extra)
    .stderr(Stdio::from(std::fs::File::create(log).unwrap()));
    // SAFETY: the closure runs in the child between fork and exec and only calls prctl,
    // which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        })
    };
    cmd.spawn().expect("ppa-agent starts")
}

fn stop_agent(mut child: Child) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "the agent ends cleanly on SIGTERM");
}

/// The exit lines of the agent's log, by tid: (cpu_ns, process_end).
fn exits(log: &Path) -> std::collections::HashMap<u32, (u64, bool)> {
    let mut text = String::new();
    std::fs::File::open(log)
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    let field = |l: &str, k: &str| -> Option<String> {
        l.split_whitespace()
            .find_map(|w| w.strip_prefix(k).map(str::to_string))
    };
    text.lines()
        .filter(|l| l.starts_with("ppa-agent: exit "))
        .filter_map(|l| {
            Some((
                field(l, "tid=")?.parse().ok()?,
                (
                    field(l, "cpu_ns=")?.parse().ok()?,
                    field(l, "process_end=")? == "yes",
                ),
            ))
        })
        .collect()
}

#[test]
fn the_agent_publishes_this_hosts_threads_and_the_vmm_shows_them() {
    let _g = common::serial();
    // 256 KiB: room for 1024 thread records, more than this host runs, so the threads of
    // this test are published whatever else runs beside it.
    let vmm = Vmm::with_page(
        "agent",
        &[
            "--vcpus",
            "1",
            "--ppa-page-size",
            "262144",
            "--workload",
            "busy:ms=60000,publish=off",
        ],
    );
    let page = vmm.page();
    let log = std::env::temp_dir().join(format!("ppa-agent-e2e-{}.log", std::process::id()));
    let mut c = vmm.connect();
    let g = guest(&mut c);
    assert!(!g.published, "the tiny guest publishes nothing: {g:?}");

    let agent = start_agent(&page, &log, &[]);
    let pid = agent.id();
    let (_, a0) = after_samples(&mut c, pid, 0, 2);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert!(
            a0.taskstats,
            "as root the agent registers for exit notifications: {a0:?}"
        );
    }

    let (sleep_tid, _, stop_sleep, h_sleep) = thread("agent-sleep", 0);
    let (spin_tid, spun, stop_spin, h_spin) = thread("agent-spin", 300_000_000);
    // One thread that starts and ends between two samples (most likely: it lives ~2 ms
    // of a 100 ms interval; if a sample catches it, it is counted as an exit all the same).
    after_samples(&mut c, pid, a0.samples, 1);
    let before = guest(&mut c);
    let (blip_tid, blip_cpu, stop_blip, h_blip) = thread("agent-blip", 2_000_000);
    stop_blip.send(()).unwrap();
    h_blip.join().unwrap();
    // 50 short-lived processes, each 3 ms of CPU.
    // SAFETY: an anonymous shared page for the children's figures, checked below.
    let shared = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(shared, libc::MAP_FAILED);
    let children: Vec<(u32, u64, u64)> = (0..50)
        .map(|_| short_process(shared.cast(), 3_000_000))
        .collect();
    // Two samples after the last child ended (the sample under way may predate it).
    let now = guest(&mut c).agent.map_or(0, |a| a.samples);
    let (g, a) = after_samples(&mut c, pid, now, 2);

    // The spinner: its published on-CPU time is its own measurement within 1 %.
    let spin = g
        .threads
        .iter()
        .find(|t| t.tid == spin_tid)
        .unwrap_or_else(|| panic!("no record of the spinning thread {spin_tid}: {g:?}"));
    assert_eq!(spin.comm, "agent-spin");
    assert_eq!(spin.tgid, std::process::id());
    let off = spin.on_cpu_ns.abs_diff(spun) as f64 / spun as f64;
    eprintln!(
        "spinner: published {} ns, its own clock {spun} ns: {:.3} % apart",
        spin.on_cpu_ns,
        100.0 * off
    );
    assert!(off <= 0.01, "{spin:?} vs {spun}");
    assert_eq!(spin.state, "S", "it waits on its channel");
    // The sleeper: nothing but its start.
    let sleep = g
        .threads
        .iter()
        .find(|t| t.tid == sleep_tid)
        .expect("the sleeper");
    assert!(sleep.on_cpu_ns < 2_000_000, "{sleep:?}");
    assert_eq!(sleep.state, "S");

    // Transient tasks: the 50 processes and the thread, each with its CPU time, in the
    // transient figures or still published as exited threads.
    let (exited, exited_cpu) = {
        let (now, then) = (exits_in(&g), exits_in(&before));
        (now.0 - then.0, now.1 - then.1)
    };
    let children_cpu: u64 = children.iter().map(|c| c.1).sum();
    eprintln!(
        "transient: {exited} exits with {exited_cpu} ns CPU in the window; the 50 children measured {children_cpu} ns, the thread {blip_cpu} ns; unseen so far {} ({} ns)",
        a.unseen_count, a.unseen_cpu_ns
    );
    assert!(exited >= 51, "{exited} exits counted");
    if a.taskstats {
        // Every exit is notified with the scheduler's figure, which each task's last clock
        // read made current; the exit path (counted by rusage) comes after.
        assert!(
            exited_cpu >= children_cpu + blip_cpu,
            "{exited_cpu} < {children_cpu}"
        );
        let ex = exits(&log);
        // A child that ran in one timeslice is notified with its elapsed time less its
        // run-queue wait (the scheduler's own figure lags by up to that slice): an upper bound
        // that also holds what the hypervisor below this host stole during the slice, which
        // the kernel leaves out of rusage (paravirt steal accounting). That share is measured
        // beside the run, as the accuracy tests do (tests/common).
        let platform = common::platform_interrupt_share(200);
        for &(pid, seen, rusage) in &children {
            let &(cpu, end) = ex
                .get(&pid)
                .unwrap_or_else(|| panic!("no exit notification for child {pid}"));
            assert!(end, "child {pid} ended its process");
            let bound = rusage + 100_000 + (rusage as f64 * 2.0 * platform) as u64;
            assert!(
                cpu >= seen && cpu <= bound,
                "child {pid}: notified {cpu} ns, measured {seen} ns, rusage {rusage} ns \
                 (bound {bound} ns with the platform's {:.2} %)",
                100.0 * platform
            );
        }
        let &(cpu, end) = ex.get(&blip_tid).expect("the short thread's exit");
        assert!(!end && cpu >= blip_cpu, "{cpu} vs {blip_cpu}");
        assert!(a.exited_processes >= 50, "{a:?}");
        // Children still published as exited threads carry their notified figures.
        for t in g.threads.iter().filter(|t| t.state == "X") {
            if let Some(&(cpu, _)) = ex.get(&t.tid) {
                assert_eq!(t.on_cpu_ns, cpu, "{t:?}");
            }
        }
        // The last child exited before sample `now + 1` took its exits, so the 3 samples an
        // exited thread stays published (the default) still list it at sample `now + 2`.
        let last = children.last().unwrap().0;
        eprintln!(
            "exited threads still published at sample {} (window from {now}): {}",
            a.samples,
            g.threads.iter().filter(|t| t.state == "X").count()
        );
        if a.samples == now + 2 {
            let t = g.threads.iter().find(|t| t.tid == last);
            assert!(
                t.is_some_and(|t| t.state == "X" && t.tgid == last),
                "the last child {last} is not published as exited: {t:?}"
            );
        }
    }
    let (all_exits, all_exits_cpu) = exits_in(&g);
    assert!(a.unseen_count <= all_exits && a.unseen_cpu_ns <= all_exits_cpu);
    assert_eq!(a.threads_published as usize, g.threads.len(), "{a:?}");
    assert_eq!(
        a.rest_count,
        u64::from(a.threads_seen) - live_published(&g, &a),
        "the aggregate is the live threads not published: {a:?}"
    );

    // The text view names the agent's figures.
    let text = String::from_utf8(
        Command::new(common::vmm::bin())
            .args(["ctl", "--api-sock"])
            .arg(&vmm.sock)
            .args(["--text", "guest"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    // (It lists the 20 threads with the most on-CPU time, which need not include ours.)
    assert!(
        text.contains(&format!("agent: pid {pid}, every 100 ms")),
        "{text}"
    );
    assert!(
        text.contains("of which started and ended between samples"),
        "{text}"
    );
    assert!(text.contains("TGID NAME"), "{text}");

    // A stopped agent leaves its last publication, marked.
    stop_agent(agent);
    let g = guest(&mut c);
    assert!(g.agent.as_ref().is_some_and(|a| a.stopped), "{:?}", g.agent);

    // A second agent with room for 8 records: the top 8 and one aggregate for the rest.
    let log2 = log.with_extension("2.log");
    let agent = start_agent(&page, &log2, &["--max-threads", "8"]);
    let (g, a) = after_samples(&mut c, agent.id(), 0, 2);
    assert!(!a.stopped);
    assert_eq!((g.threads.len(), a.threads_published), (8, 8), "{a:?}");
    assert_eq!(a.rest_count, u64::from(a.threads_seen) - 8, "{a:?}");
    assert!(a.rest_count > 0 && a.rest_on_cpu_ns > 0, "{a:?}");
    // The 8 are the busiest of the last interval.
    let least = g
        .threads
        .iter()
        .map(|t| t.interval_on_cpu_ns)
        .min()
        .unwrap();
    assert!(
        a.rest_interval_on_cpu_ns <= least * a.rest_count,
        "{a:?} {least}"
    );

    stop_spin.send(()).unwrap();
    stop_sleep.send(()).unwrap();
    h_spin.join().unwrap();
    h_sleep.join().unwrap();
    let (code, report) = vmm.shutdown();
    assert_eq!(code, 0, "{report}");
    stop_agent(agent);
    let g: GuestView = serde_json::from_value(report["guest"].clone()).expect("a guest view");
    let a = g
        .agent
        .clone()
        .expect("the agent's record in the final report");
    assert_eq!(g.threads.len(), 8, "{g:?}");
    assert_eq!(a.rest_count, u64::from(a.threads_seen) - 8, "{a:?}");
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(&log2);
}

/// Reads event lines from `c` until one satisfies `want` (at most `secs`).
fn event_where(
    c: &mut Conn,
    secs: u64,
    want: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let until = std::time::Instant::now() + Duration::from_secs(secs);
    while std::time::Instant::now() < until {
        let v = c.line();
        if v.get("event").is_some() && want(&v) {
            return v;
        }
    }
    panic!("no such event within {secs} s");
}

#[test]
fn the_agents_alarms_reach_a_subscriber_and_a_guest_reset_restarts_its_figures() {
    let _g = common::serial();
    let vmm = Vmm::with_page(
        "agent-alarms",
        &[
            "--vcpus",
            "1",
            "--ppa-page-size",
            "262144",
            "--workload",
            "busy:ms=60000,publish=off",
        ],
    );
    let page = vmm.page();
    let log = std::env::temp_dir().join(format!("ppa-agent-alarms-{}.log", std::process::id()));
    let mut c = vmm.connect();
    let mut events = vmm.connect();
    let r = events.ok(json!({"cmd": "subscribe", "events": ["guest-alarm"]}));
    assert_eq!(r["events"], json!(["guest-alarm"]));
    // A thread's on-CPU slice over 20 ms: an alarm.
    let agent = start_agent(&page, &log, &["--alarm-slice", "20ms"]);
    let pid = agent.id();
    let (_, a0) = after_samples(&mut c, pid, 0, 2);
    // At SCHED_FIFO: on a busy host a plain spinner's slices are a few ms, not one long run.
    // 500 ms: the agent (every 100 ms, sharing the other CPU with the busy vCPU) must see the
    // thread while it spins; a CI rehearsal once waited 20 s for an alarm of a 200 ms spin.
    let (tid, spun, stop, h) = spinner("alarm-spin", 500_000_000, true);
    let e = event_where(&mut events, 20, |e| e["tid"] == json!(tid));
    assert_eq!(e["event"], "guest-alarm", "{e}");
    assert_eq!(e["what"], "slice", "{e}");
    assert_eq!(e["comm"], "alarm-spin", "{e}");
    assert_eq!(e["threshold"], json!(20_000_000u64), "{e}");
    assert!(e["value"].as_u64().unwrap() > 20_000_000, "{e}");
    assert!(
        e["number"].as_u64().unwrap() >= 1 && e["guest_ns"].as_u64().unwrap() > 0,
        "{e}"
    );
    // The `guest` view has the ring, the thread's count and the alarm among the last ones.
    // Two samples after the spin ended (the alarm came from one taken while it ran).
    let now = guest(&mut c).agent.map_or(a0.samples, |a| a.samples);
    let (g, _) = after_samples(&mut c, pid, now, 2);
    let alarms = g.alarms.clone().expect("the agent's ring");
    assert_eq!(alarms.thresholds, [0, 20_000_000, 0, 0, 0]);
    assert!(alarms.forwarded[1] >= 1, "{alarms:?}");
    assert!(alarms.last.iter().any(|a| a.tid == tid), "{alarms:?}");
    let t = g
        .threads
        .iter()
        .find(|t| t.tid == tid)
        .expect("the spinner is published");
    assert!(t.over[1] >= 1, "its slice counted: {t:?}");
    assert!(t.on_cpu_ns >= spun - spun / 100, "{t:?}");
    // The metrics count it, and stay valid exposition.
    let text = c
        .ok(json!({"cmd": "metrics"}))
        .as_str()
        .unwrap()
        .to_string();
    let slice = text
        .lines()
        .find(|l| l.starts_with("ppa_guest_alarms_total{") && l.contains("what=\"slice\""))
        .expect("ppa_guest_alarms_total of slice");
    assert!(!slice.ends_with(" 0"), "{slice}");
    assert!(
        text.contains("ppa_guest_thread_cpu_seconds_total{"),
        "{text}"
    );
    common::prom::promtool_accepts(&text);

    // A guest reset: the host asks, the agent restarts its figures and says which reset it
    // carried out; the spinner, idle since, starts from 0.
    let r = c.ok(json!({"cmd": "guest-reset"}));
    assert_eq!(r["generation"], 1, "{r}");
    let now = guest(&mut c).agent.map_or(0, |a| a.samples);
    let (after, _) = after_samples(&mut c, pid, now, 2);
    let reset = after.reset.expect("the reset is shown");
    assert_eq!((reset.requested, reset.honoured), (1, 1), "{reset:?}");
    assert!(reset.honoured_ns > 0);
    let t = after.threads.iter().find(|t| t.tid == tid);
    assert!(
        t.is_none_or(|t| t.on_cpu_ns < 5_000_000 && t.over == [0; 3]),
        "the idle spinner counts from the reset: {t:?}"
    );
    let cpu = |g: &GuestView| g.cpus.iter().map(|c| c.times_ns[2]).sum::<u64>();
    assert!(
        cpu(&after) < cpu(&g),
        "CPU idle time restarted: {} vs {}",
        cpu(&after),
        cpu(&g)
    );
    stop.send(()).unwrap();
    h.join().unwrap();
    stop_agent(agent);
    let _ = std::fs::remove_file(&log);
    let (code, _) = vmm.shutdown();
    assert_eq!(code, 0);
}
