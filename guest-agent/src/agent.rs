//! The agent's loop: discover, map, then sample and publish every interval until told to
//! stop, and `--probe`.
//!
//! Data flow: [`run`] finds and maps the page ([`crate::discover`], [`crate::page`]),
//! registers for exit notifications when it may ([`crate::taskstats`]), and then, on an
//! absolute CLOCK_MONOTONIC deadline every interval, takes a sample ([`crate::collect`]) and
//! publishes it ([`crate::publish`]) with the CPU time the sample cost. Between samples it
//! sleeps in `ppoll` on the exit-notification socket (drained whenever it is readable, so no
//! exit is lost to a full buffer) and on a signalfd for SIGTERM, SIGINT and SIGHUP, which end
//! the loop after a last publication that marks the agent stopped.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use thiserror::Error;

use crate::collect::{Collector, Options};
use crate::config::Config;
use crate::discover::Discovery;
use crate::page::{Access, Page, PageError};
use crate::publish::{AgentFigures, PublishError, Publisher};
use crate::taskstats::{Taskstats, TaskstatsError};

/// `--probe` exit code: a page the agent can use.
pub const EXIT_FOUND: i32 = 0;
/// Exit code: no page here (`--probe`, or the agent started without one).
pub const EXIT_NO_PAGE: i32 = 3;
/// Exit code: a page is there but the agent cannot use it (not mapped, not understood).
pub const EXIT_UNUSABLE: i32 = 4;

/// Why the agent stopped.
#[derive(Debug, Error)]
pub enum AgentError {
    /// No source names a page.
    #[error("no PPA page here (no PPA-VMM CPUID leaves, no ppa.page= on the kernel command line, no --page-file)")]
    NoPage,
    /// The page cannot be used.
    #[error("cannot use the PPA page named by the {source_name}")]
    Page {
        /// Which discovery source.
        source_name: &'static str,
        /// Cause.
        #[source]
        source: PageError,
    },
    /// The page cannot hold the agent's layout, or changed under it.
    #[error("stopped publishing")]
    Publish(#[source] PublishError),
    /// /proc could not be read.
    #[error("cannot sample /proc")]
    Collect(#[source] io::Error),
    /// Signals or waiting failed.
    #[error("the agent's wait for its next sample failed")]
    Wait(#[source] io::Error),
}

impl AgentError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            AgentError::NoPage => EXIT_NO_PAGE,
            AgentError::Page { .. } => EXIT_UNUSABLE,
            _ => 1,
        }
    }
}

/// The possible CPUs, as the kernel lists them (`0-3`).
fn possible_cpus() -> String {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| {
            // SAFETY: sysconf has no preconditions.
            let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1);
            format!("0-{}", n - 1)
        })
}

fn log(msg: &str) {
    eprintln!("ppa-agent: {msg}");
}

/// Finds and maps the page: the first answer of discovery, checked.
fn open_page(cfg: &Config, access: Access) -> Result<(Discovery, Page), AgentError> {
    let d = Discovery::run(cfg.page_file.as_deref());
    let (source_name, place) = d.choice().ok_or(AgentError::NoPage)?;
    let page = Page::open(&place, access).map_err(|source| AgentError::Page {
        source_name,
        source,
    })?;
    Ok((d, page))
}

/// Registers for exit notifications, or says why the agent counts exits from /proc.
fn taskstats(cfg: &Config) -> Result<Taskstats, String> {
    if !cfg.taskstats {
        return Err("taskstats is off in the configuration".into());
    }
    Taskstats::open(&possible_cpus()).map_err(|e: TaskstatsError| crate::describe(&e))
}

/// `--probe`: says what each discovery source found and whether the page is usable;
/// returns the exit code.
pub fn probe(cfg: &Config) -> i32 {
    let d = Discovery::run(cfg.page_file.as_deref());
    for l in d.report() {
        log(&l);
    }
    let Some((source_name, place)) = d.choice() else {
        log(&AgentError::NoPage.to_string());
        return EXIT_NO_PAGE;
    };
    let page = match Page::open(&place, Access::Look) {
        Ok(p) => p,
        Err(source) => {
            let e = AgentError::Page {
                source_name,
                source,
            };
            log(&crate::describe(&e));
            return EXIT_UNUSABLE;
        }
    };
    let h = page.header();
    log(&format!(
        "PPA page found through the {source_name}: {}, {} bytes, layout {}.{}, {} vCPUs, guest section {} bytes at offset {}",
        page.at(),
        h.total_size,
        h.major,
        h.minor,
        h.host_count,
        h.guest_size,
        h.guest_offset
    ));
    match taskstats(cfg) {
        Ok(_) => log("taskstats: exit notifications available; every exiting task is counted"),
        Err(why) => log(&format!(
            "taskstats: unavailable ({why}); transient tasks are counted from /proc"
        )),
    }
    log(&format!(
        "delay accounting (kernel.task_delayacct): {}",
        if crate::collect::delayacct_on() {
            "on"
        } else {
            "off: thread delay totals other than run delay are 0"
        }
    ));
    EXIT_FOUND
}

/// A signalfd for SIGTERM, SIGINT and SIGHUP (blocked for normal delivery).
fn signals() -> io::Result<OwnedFd> {
    // SAFETY: sigset operations on a local set; sigprocmask and signalfd take valid
    // pointers; the descriptor is checked and then owned.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// What woke the wait.
enum Woken {
    Deadline,
    Exits,
    Signal,
}

/// Waits until `deadline_ns` (CLOCK_MONOTONIC), an exit notification or a signal.
fn wait(deadline_ns: u64, exits: Option<i32>, sig: &OwnedFd) -> io::Result<Woken> {
    let now = crate::monotonic_ns();
    if now >= deadline_ns {
        return Ok(Woken::Deadline);
    }
    let left = deadline_ns - now;
    let ts = libc::timespec {
        tv_sec: (left / 1_000_000_000) as libc::time_t,
        tv_nsec: (left % 1_000_000_000) as libc::c_long,
    };
    let mut fds = [
        libc::pollfd {
            fd: sig.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: exits.unwrap_or(-1),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: `fds` and `ts` are valid for the call; a negative fd is ignored by ppoll.
    let r = unsafe { libc::ppoll(fds.as_mut_ptr(), 2, &ts, std::ptr::null()) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(Woken::Deadline)
        } else {
            Err(e)
        };
    }
    if fds[0].revents != 0 {
        return Ok(Woken::Signal);
    }
    if fds[1].revents != 0 {
        return Ok(Woken::Exits);
    }
    Ok(Woken::Deadline)
}

/// How long to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limit {
    /// Stop after this many samples (`--samples N`; `--once` is 1).
    pub samples: Option<u64>,
}

/// Runs the agent until a signal (or `limit`).
pub fn run(cfg: &Config, limit: Limit) -> Result<(), AgentError> {
    let (d, page) = open_page(cfg, Access::Publish)?;
    for l in d.report() {
        log(&l);
    }
    let ts = match taskstats(cfg) {
        Ok(t) => Some(t),
        Err(why) => {
            log(&format!(
                "taskstats unavailable ({why}): exits are counted from /proc, and tasks that start and end between two samples are counted from the fork count with their CPU time estimated"
            ));
            None
        }
    };
    let mut c = Collector::new(
        ts,
        Options {
            log_exits: cfg.log_exits,
            linger: cfg.linger,
            thresholds: cfg.thresholds,
            ..Options::default()
        },
    )
    .map_err(AgentError::Collect)?;
    let mut p = Publisher::new(&page, c.nr_cpus(), cfg.max_threads, cfg.thresholds)
        .map_err(AgentError::Publish)?;
    c.set_capacity(p.layout().capacity as usize);
    let sig = signals().map_err(AgentError::Wait)?;
    log(&format!(
        "publishing into {} every {:?}: {} CPU records, room for {} thread records, exited threads kept {} samples; taskstats {}, delay accounting {}; {}",
        page.at(),
        cfg.interval,
        c.nr_cpus(),
        p.layout().capacity,
        cfg.linger,
        if c.taskstats() { "on" } else { "off" },
        if c.delayacct() { "on" } else { "off" },
        alarms_line(cfg, p.layout().alarms)
    ));
    let interval = u64::try_from(cfg.interval.as_nanos()).unwrap_or(u64::MAX);
    let mut me = AgentFigures {
        interval_ns: interval,
        ..Default::default()
    };
    let mut deadline = crate::monotonic_ns();
    loop {
        let t0 = crate::thread_cpu_ns();
        c.sample().map_err(AgentError::Collect)?;
        if let Some(generation) = reset_asked(&page, me.reset.0) {
            c.reset();
            me.reset = (generation, c.now_ns());
            log(&format!(
                "the host asked for reset {generation}: figures count from now"
            ));
        }
        me.samples += 1;
        me.agent_cpu_ns = crate::clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID).unwrap_or(0);
        // The publication's own cost lands in the next sample's figure.
        p.publish(&c, &me).map_err(AgentError::Publish)?;
        me.sample_cpu_ns = crate::thread_cpu_ns() - t0;
        me.sample_max_cpu_ns = me.sample_max_cpu_ns.max(me.sample_cpu_ns);
        if limit.samples.is_some_and(|n| me.samples >= n) {
            break;
        }
        // The next deadline on the grid; a sample late by more than an interval skips.
        deadline += interval;
        let now = crate::monotonic_ns();
        if deadline < now {
            deadline = now + interval - (now - deadline) % interval;
        }
        let stop = loop {
            match wait(deadline, c.exit_fd(), &sig).map_err(AgentError::Wait)? {
                Woken::Deadline => break false,
                Woken::Signal => break true,
                Woken::Exits => c.drain_exits().map_err(AgentError::Collect)?,
            }
        };
        if stop {
            break;
        }
    }
    me.stopped = true;
    me.agent_cpu_ns = crate::clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID).unwrap_or(0);
    p.publish(&c, &me).map_err(AgentError::Publish)?;
    log(&format!(
        "stopped after {} samples, {:.3} ms of CPU",
        me.samples,
        me.agent_cpu_ns as f64 / 1e6
    ));
    Ok(())
}

/// The reset generation the VMM asks for in its VM record (layout 1.5), when it is above
/// `honoured`, the last one the agent carried out.
fn reset_asked(page: &Page, honoured: u64) -> Option<u64> {
    if page.header().minor < 5 {
        return None;
    }
    let vm = page.host_vm(8)?.ok()?;
    (vm.guest_reset > honoured).then_some(vm.guest_reset)
}

/// What the log says of the thresholds and the alarm ring.
fn alarms_line(cfg: &Config, ring: Option<(u32, u32)>) -> String {
    if !cfg.thresholds.any() {
        return "no thresholds (alarms off)".into();
    }
    let names = [
        "run delay",
        "slice",
        "involuntary switches",
        "irq",
        "softirq",
    ];
    let on: Vec<String> = cfg
        .thresholds
        .0
        .iter()
        .zip(names)
        .filter(|(t, _)| **t != 0)
        .map(|(t, n)| match n {
            "involuntary switches" => format!("{n} > {t} an interval"),
            _ => format!("{n} > {:.3} ms", *t as f64 / 1e6),
        })
        .collect();
    match ring {
        Some((_, slots)) => format!("thresholds {}; alarms in a ring of {slots}", on.join(", ")),
        None => format!(
            "thresholds {}; counted, but the page has no room for the alarm ring",
            on.join(", ")
        ),
    }
}

/// Parses an interval for clap.
pub fn interval_arg(s: &str) -> Result<Duration, String> {
    crate::config::parse_interval(s).map_err(|e| e.to_string())
}
