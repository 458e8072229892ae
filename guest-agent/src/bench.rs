//! `ppa-agent bench`: the agent's CPU per sample with 100, 1,000 and 5,000 extra threads, and
//! the share of one CPU that makes at an interval, with where the time goes.
//!
//! Data flow: for each thread count N, a helper process (forked before this process has any
//! other thread) starts N threads that sleep on a futex in shared memory. This process then
//! runs the agent's own collector and publisher against a page file of its own, measuring
//! each sample's CPU time with its thread CPU clock, in three cases: the first sample (every
//! thread is new: its files are opened and read), samples while the helper's threads sleep
//! (the usual case: nothing to read for them), and samples after waking every thread once
//! per interval (the worst case: every thread's schedstat, stat and status are read).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::collect::{Collector, Options, Phases};
use crate::discover::Place;
use crate::page::{write_region_file, Access, Page};
use crate::publish::{AgentFigures, Publisher};

/// What the benchmark runs.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Thread counts.
    pub threads: Vec<usize>,
    /// Samples per case.
    pub samples: usize,
    /// The interval the share of a CPU is given for.
    pub interval: Duration,
}

#[repr(C)]
struct Shared {
    gen: AtomicU32,
    ack: AtomicU32,
    ready: AtomicU32,
}

const END: u32 = u32::MAX;

fn futex(word: &AtomicU32, op: libc::c_int, val: u32) {
    // SAFETY: the futex word is a live, aligned u32 in shared memory; a null timeout waits
    // without limit (FUTEX_WAIT returns at once if the word no longer holds `val`).
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            op,
            val,
            std::ptr::null::<libc::timespec>(),
        )
    };
}

/// The helper: `n` threads that each wake once per generation, do a little work, and ack.
fn helper(shared: &'static Shared, n: usize) -> ! {
    for _ in 0..n {
        let spawned = std::thread::Builder::new()
            .stack_size(64 << 10)
            .spawn(move || {
                let mut seen = 0;
                loop {
                    let g = shared.gen.load(Ordering::Acquire);
                    if g == END {
                        return;
                    }
                    if g == seen {
                        futex(&shared.gen, libc::FUTEX_WAIT, seen);
                        continue;
                    }
                    seen = g;
                    std::hint::black_box((0..200u32).sum::<u32>());
                    shared.ack.fetch_add(1, Ordering::Release);
                }
            });
        if spawned.is_err() {
            shared.ready.store(2, Ordering::Release);
            // SAFETY: ending the helper process.
            unsafe { libc::_exit(1) };
        }
    }
    shared.ready.store(1, Ordering::Release);
    while shared.gen.load(Ordering::Acquire) != END {
        let g = shared.gen.load(Ordering::Acquire);
        futex(&shared.gen, libc::FUTEX_WAIT, g);
    }
    // SAFETY: ending the helper process; its threads end with it.
    unsafe { libc::_exit(0) }
}

/// CPU ns of each sample, and the phases summed.
struct Case {
    cpu: Vec<u64>,
    phases: Phases,
}

impl Case {
    fn mean(&self) -> u64 {
        self.cpu.iter().sum::<u64>() / self.cpu.len().max(1) as u64
    }
    fn median(&self) -> u64 {
        let mut v = self.cpu.clone();
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    }
}

fn sample(c: &mut Collector, p: &mut Publisher<'_>, case: &mut Case) -> Result<(), String> {
    let t0 = crate::thread_cpu_ns();
    c.sample().map_err(|e| format!("sample: {e}"))?;
    p.publish(c, &AgentFigures::default())
        .map_err(|e| format!("publish: {e}"))?;
    case.cpu.push(crate::thread_cpu_ns() - t0);
    let ph = c.phases();
    let s = &mut case.phases;
    s.system_ns += ph.system_ns;
    s.processes_ns += ph.processes_ns;
    s.threads_ns += ph.threads_ns;
    s.discover_ns += ph.discover_ns;
    s.exits_ns += ph.exits_ns;
    s.details_ns += ph.details_ns;
    s.threads_read += ph.threads_read;
    s.threads_detailed += ph.threads_detailed;
    Ok(())
}

fn phases(p: &Phases, n: usize) -> String {
    let us = |ns: u64| ns as f64 / 1e3 / n.max(1) as f64;
    format!(
        "system files {:.0} us, process clocks {:.0} us, schedstat of {} threads {:.0} us, listing {:.0} us, exits {:.0} us, stat+status of {} chosen threads {:.0} us",
        us(p.system_ns),
        us(p.processes_ns),
        p.threads_read / n.max(1) as u64,
        us(p.threads_ns),
        us(p.discover_ns),
        us(p.exits_ns),
        p.threads_detailed / n.max(1) as u64,
        us(p.details_ns),
    )
}

/// Runs the benchmark for one thread count; returns its report lines.
fn one(n: usize, opts: &BenchOptions, taskstats: bool) -> Result<Vec<String>, String> {
    // The futex words live until the process ends (the helper references them until it
    // exits).
    let mem = crate::shared_page().ok_or("cannot map shared memory")?;
    // SAFETY: the page is zeroed, page-aligned, large enough and never unmapped; atomics of
    // zero are valid.
    let shared: &'static Shared = unsafe { &*mem.as_ptr().cast::<Shared>() };
    // SAFETY: this process has no other thread (the benchmark never starts one here), so
    // the child may use the standard library.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err("fork failed".into());
    }
    if child == 0 {
        helper(shared, n);
    }
    while shared.ready.load(Ordering::Acquire) == 0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let end = |shared: &Shared| {
        shared.gen.store(END, Ordering::Release);
        futex(&shared.gen, libc::FUTEX_WAKE, i32::MAX as u32);
        let mut st = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(child, &mut st, 0) };
    };
    if shared.ready.load(Ordering::Acquire) != 1 {
        end(shared);
        return Err(format!("the helper could not start {n} threads"));
    }
    // The default 64 KiB page, and where the threads exceed its capacity, a page that
    // holds as many records as a reader takes.
    let mut lines = Vec::new();
    let mut result = measure(n, opts, taskstats, shared, 64 << 10, 0);
    if let Ok(l) = &mut result {
        lines.append(l);
        if n > 300 {
            result = measure(n, opts, taskstats, shared, 1 << 20, opts.samples as u32);
            if let Ok(l) = &mut result {
                lines.append(l);
            }
        }
    }
    end(shared);
    result.map(|_| lines)
}

fn measure(
    n: usize,
    opts: &BenchOptions,
    taskstats: bool,
    shared: &Shared,
    page_size: u32,
    round0: u32,
) -> Result<Vec<String>, String> {
    let path = std::env::temp_dir().join(format!("ppa-agent-bench-{}", std::process::id()));
    write_region_file(&path, page_size, 2).map_err(|e| format!("page file: {e}"))?;
    let page =
        Page::open(&Place::File(path.clone()), Access::Publish).map_err(|e| crate::describe(&e))?;
    let _ = std::fs::remove_file(&path);
    let ts = if taskstats {
        crate::taskstats::Taskstats::open(
            std::fs::read_to_string("/sys/devices/system/cpu/possible")
                .unwrap_or_else(|_| "0".into())
                .trim(),
        )
        .ok()
    } else {
        None
    };
    let mut c = Collector::new(ts, Options::default()).map_err(|e| e.to_string())?;
    let mut p =
        Publisher::new(&page, c.nr_cpus(), 1024, Default::default()).map_err(|e| e.to_string())?;
    c.set_capacity(p.layout().capacity as usize);
    let new = || Case {
        cpu: Vec::new(),
        phases: Phases::default(),
    };
    let mut first = new();
    sample(&mut c, &mut p, &mut first)?;
    let total = c.thread_count();
    let mut idle = new();
    for _ in 0..opts.samples {
        std::thread::sleep(Duration::from_millis(20));
        c.drain_exits().map_err(|e| e.to_string())?;
        sample(&mut c, &mut p, &mut idle)?;
    }
    let mut active = new();
    for round in round0 + 1..=round0 + opts.samples as u32 {
        shared.gen.store(round, Ordering::Release);
        futex(&shared.gen, libc::FUTEX_WAKE, i32::MAX as u32);
        let want = round * n as u32;
        while shared.ack.load(Ordering::Acquire) < want {
            std::thread::sleep(Duration::from_millis(1));
        }
        c.drain_exits().map_err(|e| e.to_string())?;
        sample(&mut c, &mut p, &mut active)?;
    }
    let share = |ns: u64| 100.0 * ns as f64 / opts.interval.as_nanos() as f64;
    let ms = |ns: u64| ns as f64 / 1e6;
    Ok(vec![
        format!(
            "{n} helper threads ({total} threads in all), a {} KiB page ({} thread records):",
            page_size >> 10,
            p.layout().capacity
        ),
        format!("  first sample (opens and reads every thread): {:.2} ms", ms(first.mean())),
        format!(
            "  threads asleep: {:.3} ms per sample (median {:.3}, max {:.3}): {:.3} % of one CPU at {:?}",
            ms(idle.mean()),
            ms(idle.median()),
            ms(idle.cpu.iter().copied().max().unwrap_or(0)),
            share(idle.mean()),
            opts.interval
        ),
        format!("    {}", phases(&idle.phases, idle.cpu.len())),
        format!(
            "  every thread ran since the last sample: {:.3} ms per sample (median {:.3}): {:.3} % of one CPU at {:?}",
            ms(active.mean()),
            ms(active.median()),
            share(active.mean()),
            opts.interval
        ),
        format!("    {}", phases(&active.phases, active.cpu.len())),
    ])
}

/// Runs the benchmark; prints as it goes.
pub fn run(opts: &BenchOptions) -> Result<(), String> {
    let taskstats = crate::taskstats::Taskstats::open(
        std::fs::read_to_string("/sys/devices/system/cpu/possible")
            .unwrap_or_else(|_| "0".into())
            .trim(),
    )
    .is_ok();
    println!(
        "ppa-agent bench: CPU per sample (collection and publication), {} samples per case; taskstats {}",
        opts.samples,
        if taskstats { "on" } else { "off" }
    );
    for &n in &opts.threads {
        for line in one(n, opts, taskstats)? {
            println!("{line}");
        }
    }
    Ok(())
}
