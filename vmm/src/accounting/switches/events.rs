//! The kernel tracepoints level full adds to a vCPU thread's ring: KVM's `kvm_entry` and
//! `kvm_exit` (where the guest runs and why it left), and the host's interrupts (`irq:*` and,
//! on x86, `irq_vectors:*`: the local timer and the IPIs are system vectors that
//! `irq:irq_handler_entry` never sees), and the scheduler's `sched_switch` (which thread the
//! kernel picked when this one left its CPU: where the next vCPU's wait ended, for exact
//! pressure).
//!
//! Data flow: the main thread finds the events once per VM ([`TraceCatalog::discover`]:
//! their ids and the offsets of the fields read, from tracefs' `format` files, before any
//! thread drops its privileges), and each vCPU thread opens them on itself
//! ([`TraceFds::open`]) as per-thread perf events whose records go into its context-switch
//! ring (`PERF_EVENT_IOC_SET_OUTPUT`), so that every record is in one time order and drained
//! at KVM_RUN boundaries. Reasons they cannot be had are [`TraceError`]s, one sentence each,
//! that the reports carry beside the null figure.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::pairing::{EventKind, Layout};
use super::{PerfEventAttr, PERF_EVENT_IOC_DISABLE, PERF_EVENT_IOC_ENABLE};

const PERF_TYPE_TRACEPOINT: u32 = 2;
const PERF_SAMPLE_TIME: u64 = 1 << 2;
const PERF_SAMPLE_RAW: u64 = 1 << 10;
const FLAG_DISABLED: u64 = 1 << 0;
const FLAG_USE_CLOCKID: u64 = 1 << 25;
/// The ioctl that sends an event's records into another event's ring (the vCPU filter
/// allows it).
pub const PERF_EVENT_IOC_SET_OUTPUT: libc::c_ulong = 0x2405;

/// Where tracefs may be mounted.
const TRACEFS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// x86's system vectors with their tracepoints (`irq_vectors:NAME_entry`/`_exit`) and their
/// kind (index in `IRQ_KIND_NAMES`). Not `irq_work`: the kernel refuses to sample its exit
/// (perf's own wakeups are irq work, so sampling it could loop), and its time stays in the
/// figure it interrupted.
const VECTORS: [(&str, u8); 4] = [
    ("local_timer", 1),
    ("reschedule", 2),
    ("call_function", 3),
    ("call_function_single", 4),
];

/// Why kernel tracepoints cannot split a vCPU's time (each message one sentence).
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The operator turned them off.
    #[error("kernel tracepoints are turned off (kernel_trace off)")]
    Disabled,
    /// No tracefs.
    #[error(
        "tracefs is not mounted at /sys/kernel/tracing or /sys/kernel/debug/tracing, so the \
         kernel's tracepoints cannot be found (mount -t tracefs nodev /sys/kernel/tracing)"
    )]
    NoTracefs,
    /// The kernel lacks an event.
    #[error("this kernel has no {0} tracepoint")]
    Missing(&'static str),
    /// A tracefs file could not be read.
    #[error("the tracepoint description {} could not be read", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A format file lacks a field read here.
    #[error("the format of the {event} tracepoint has no field {field}")]
    Format {
        /// The event.
        event: &'static str,
        /// The field.
        field: &'static str,
    },
    /// perf refused an event to the vCPU thread.
    #[error(
        "perf_event_open refused the {event} tracepoint to the vCPU thread (its raw records \
         need CAP_PERFMON or perf_event_paranoid -1)"
    )]
    Open {
        /// The event.
        event: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// perf would not send an event's records into the thread's ring.
    #[error("perf could not send the {event} tracepoint's records into the thread's ring")]
    Output {
        /// The event.
        event: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
}

impl TraceError {
    /// The message with its cause, as one sentence for a report.
    pub fn sentence(&self) -> String {
        match std::error::Error::source(self) {
            Some(s) => format!("{self}: {s}"),
            None => self.to_string(),
        }
    }
}

/// One tracepoint of a catalog.
#[derive(Debug, Clone, Copy)]
struct Event {
    name: &'static str,
    id: u16,
}

/// The tracepoints of this kernel that level full uses, found once per VM.
#[derive(Debug)]
pub struct TraceCatalog {
    layout: Layout,
    kvm: Result<[Event; 2], TraceError>,
    irq: Result<Vec<Event>, TraceError>,
    sched: Result<[Event; 1], TraceError>,
    backend: Option<&'static str>,
}

/// `group:name` of an event whose name is built from a vector's (leaked once per process).
fn vector_event(name: &str, end: &str) -> &'static str {
    let s = format!("irq_vectors:{name}_{end}");
    Box::leak(s.into_boxed_str())
}

impl TraceCatalog {
    /// A catalog without tracepoints (`why` for every figure that needs them).
    pub fn unavailable(why: impl Fn() -> TraceError) -> TraceCatalog {
        TraceCatalog {
            layout: Layout::default(),
            kvm: Err(why()),
            irq: Err(why()),
            sched: Err(why()),
            backend: kvm_backend(),
        }
    }

    /// Finds the events in the tracefs mounted here.
    pub fn discover() -> TraceCatalog {
        match TRACEFS
            .iter()
            .map(Path::new)
            .find(|p| p.join("events").is_dir())
        {
            Some(root) => TraceCatalog::discover_in(&root.join("events")),
            None => TraceCatalog::unavailable(|| TraceError::NoTracefs),
        }
    }

    /// Finds the events under `events` (tracefs' `events` directory, or a copy of it).
    pub fn discover_in(events: &Path) -> TraceCatalog {
        let mut layout = Layout::default();
        let kvm = (|| {
            let entry = find(events, "kvm:kvm_entry")?;
            let exit = find(events, "kvm:kvm_exit")?;
            let format = read(&events.join("kvm/kvm_exit/format"))?;
            layout.exit_reason = field(&format, "kvm:kvm_exit", "exit_reason")?;
            layout.isa = field(&format, "kvm:kvm_exit", "isa")?;
            Ok([entry, exit])
        })();
        if let Ok([entry, exit]) = &kvm {
            layout.push(entry.id, EventKind::KvmEntry);
            layout.push(exit.id, EventKind::KvmExit);
        }
        let irq = (|| {
            let mut v = vec![
                (
                    find(events, "irq:irq_handler_entry")?,
                    EventKind::IrqEnter(0),
                ),
                (find(events, "irq:irq_handler_exit")?, EventKind::IrqExit),
                (find(events, "irq:softirq_entry")?, EventKind::SoftirqEnter),
                (find(events, "irq:softirq_exit")?, EventKind::IrqExit),
            ];
            let format = read(&events.join("irq/softirq_entry/format"))?;
            layout.vec = field(&format, "irq:softirq_entry", "vec")?;
            for (name, kind) in VECTORS {
                let entry = find(events, vector_event(name, "entry"));
                let exit = find(events, vector_event(name, "exit"));
                // x86 only; another architecture's system interrupts are not told apart.
                if let (Ok(entry), Ok(exit)) = (entry, exit) {
                    v.push((entry, EventKind::IrqEnter(kind)));
                    v.push((exit, EventKind::IrqExit));
                }
            }
            Ok(v)
        })();
        let irq = irq.map(|v| {
            v.into_iter()
                .map(|(e, kind)| {
                    layout.push(e.id, kind);
                    e
                })
                .collect()
        });
        let sched = (|| {
            let switch = find(events, "sched:sched_switch")?;
            let format = read(&events.join("sched/sched_switch/format"))?;
            layout.next_pid = field(&format, "sched:sched_switch", "next_pid")?;
            Ok([switch])
        })();
        if let Ok([switch]) = &sched {
            layout.push(switch.id, EventKind::Switch);
        }
        TraceCatalog {
            layout,
            kvm,
            irq,
            sched,
            backend: kvm_backend(),
        }
    }

    /// How the ring's records are decoded.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Why KVM's tracepoints cannot be had (None: they can be opened).
    pub fn kvm_error(&self) -> Option<&TraceError> {
        self.kvm.as_ref().err()
    }

    /// Why the interrupt tracepoints cannot be had (None: they can be opened).
    pub fn irq_error(&self) -> Option<&TraceError> {
        self.irq.as_ref().err()
    }

    /// Why the scheduler's `sched_switch` cannot be had (None: it can be opened).
    pub fn sched_error(&self) -> Option<&TraceError> {
        self.sched.as_ref().err()
    }

    /// Whether any tracepoint is to be opened.
    pub fn any(&self) -> bool {
        self.kvm.is_ok() || self.irq.is_ok() || self.sched.is_ok()
    }

    /// The KVM backend module loaded here (`kvm_intel`, `kvm_amd`, `kvm_pvm`), if known.
    pub fn backend(&self) -> Option<&'static str> {
        self.backend
    }
}

/// The KVM backend module loaded on this host.
fn kvm_backend() -> Option<&'static str> {
    ["kvm_intel", "kvm_amd", "kvm_pvm"]
        .into_iter()
        .find(|m| Path::new("/sys/module").join(m).exists())
}

fn read(path: &Path) -> Result<String, TraceError> {
    std::fs::read_to_string(path).map_err(|source| TraceError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// The id of `group:name` under `events`.
fn find(events: &Path, event: &'static str) -> Result<Event, TraceError> {
    let (group, name) = event.split_once(':').unwrap_or(("", event));
    let dir = events.join(group).join(name);
    if !dir.is_dir() {
        return Err(TraceError::Missing(event));
    }
    let path = dir.join("id");
    let text = read(&path)?;
    let id = text.trim().parse::<u16>().map_err(|e| TraceError::Read {
        path,
        source: io::Error::new(io::ErrorKind::InvalidData, e),
    })?;
    Ok(Event { name: event, id })
}

/// The byte offset of field `name` in a tracepoint's raw record, from its `format` text
/// (lines like `field:unsigned int exit_reason; offset:8; size:4; signed:0;`, tab-separated).
pub fn field(format: &str, event: &'static str, name: &'static str) -> Result<u16, TraceError> {
    format
        .lines()
        .filter_map(|l| {
            let decl = l.trim().strip_prefix("field:")?;
            let (decl, rest) = decl.split_once(';')?;
            let last = decl.split_whitespace().last()?;
            let ident = last.split('[').next()?;
            let off = rest
                .split(';')
                .find_map(|p| p.trim().strip_prefix("offset:"))?;
            Some((ident.to_string(), off.trim().parse::<u16>().ok()?))
        })
        .find(|(ident, _)| ident == name)
        .map(|(_, off)| off)
        .ok_or(TraceError::Format { event, field: name })
}

/// In-kernel exits between two kicks of the thread by its `kvm_exit` kicker: 512 exits are
/// ~80 KiB of records, a third of a 256 KiB ring.
const KVM_KICK_PERIOD: u64 = 512;
/// Interrupts between two kicks by the interrupt kicker (a few seconds of timer ticks: ~120
/// KiB of records with the softirqs that follow them).
const IRQ_KICK_PERIOD: u64 = 1024;

/// Opens one tracepoint on the calling thread, disabled, its records going into the ring of
/// `leader`: a sample of every hit (time and raw data), or, as a kicker (`kick`: the signal
/// and this thread's id, and the period), a bare sample of every `period`-th hit that also
/// sends the kick signal to the thread, so that a vCPU that stays in KVM_RUN comes out to
/// drain its ring before it overflows. (perf signals an event with a signal owner at every
/// sample it takes, so the events that sample every hit have none.)
fn open_one(
    e: Event,
    leader: &OwnedFd,
    kick: Option<(libc::c_int, libc::pid_t, u64)>,
) -> Result<OwnedFd, TraceError> {
    let (sample_period, sample_type) = match kick {
        Some((_, _, period)) => (period, PERF_SAMPLE_TIME),
        None => (1, PERF_SAMPLE_TIME | PERF_SAMPLE_RAW),
    };
    let attr = PerfEventAttr {
        type_: PERF_TYPE_TRACEPOINT,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config: u64::from(e.id),
        sample_period,
        sample_type,
        flags: FLAG_DISABLED | FLAG_USE_CLOCKID,
        clockid: libc::CLOCK_MONOTONIC,
        ..Default::default()
    };
    let fd = super::open_on_self(&attr).map_err(|source| TraceError::Open {
        event: e.name,
        source,
    })?;
    // SAFETY: SET_OUTPUT takes the fd of the event whose ring receives the records; both are
    // this thread's own events, alive for the call.
    let r = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            PERF_EVENT_IOC_SET_OUTPUT as _,
            leader.as_raw_fd(),
        )
    };
    if r < 0 {
        return Err(TraceError::Output {
            event: e.name,
            source: io::Error::last_os_error(),
        });
    }
    if let Some((sig, tid, _)) = kick {
        signal_on_wakeup(&fd, sig, tid);
    }
    Ok(fd)
}

const F_SETSIG: libc::c_int = 10;
const F_SETOWN_EX: libc::c_int = 15;
const F_OWNER_TID: libc::c_int = 0;

/// `struct f_owner_ex`.
#[repr(C)]
struct OwnerEx {
    kind: libc::c_int,
    pid: libc::pid_t,
}

/// Asks perf to send `sig` to thread `tid` at each wakeup of `fd`: each sample it takes, and
/// for an event without samples (the context-switch event) each time its records cross half
/// the ring (perf's default watermark). Best effort: without it a long KVM_RUN can overflow
/// the ring, which the drain then reports as lost records.
pub fn signal_on_wakeup(fd: &OwnedFd, sig: libc::c_int, tid: libc::pid_t) {
    let owner = OwnerEx {
        kind: F_OWNER_TID,
        pid: tid,
    };
    let raw = fd.as_raw_fd();
    // SAFETY: fcntl on our own descriptor; F_SETOWN_EX reads a `struct f_owner_ex` that
    // lives for the call, F_SETSIG and F_GETFL/F_SETFL take integers.
    unsafe {
        if libc::fcntl(raw, F_SETOWN_EX, &owner as *const OwnerEx) < 0
            || libc::fcntl(raw, F_SETSIG, sig) < 0
        {
            return;
        }
        let flags = libc::fcntl(raw, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(raw, libc::F_SETFL, flags | libc::O_ASYNC);
        }
    }
}

/// The tracepoints a vCPU thread opened on itself (KVM's and the interrupts', each group with
/// its kicker last).
#[derive(Debug, Default)]
pub struct TraceFds {
    kvm: Vec<OwnedFd>,
    irq: Vec<OwnedFd>,
    /// `sched:sched_switch` (no kicker: at most one sample per context switch of the thread,
    /// and the ring's half-full signal drains it).
    sched: Vec<OwnedFd>,
    /// KVM's events found silent: off, and kept open until the thread's records are dropped
    /// ([`TraceFds::drop_kvm`]).
    silenced: Vec<OwnedFd>,
}

/// What opening gave: the events, and why each group could not be had.
#[derive(Debug)]
pub struct Opened {
    /// The events opened.
    pub fds: TraceFds,
    /// Why KVM's tracepoints are not there (None: opened).
    pub kvm: Option<TraceError>,
    /// Why the interrupt tracepoints are not there (None: opened).
    pub irq: Option<TraceError>,
    /// Why `sched:sched_switch` is not there (None: opened).
    pub sched: Option<TraceError>,
}

impl TraceFds {
    /// Opens the catalog's events on the calling thread into `leader`'s ring (disabled).
    /// `signal`: the kick signal and this thread's id, for each group's kicker (on `kvm_exit`,
    /// and on the local timer's or else the softirqs' entry).
    pub fn open(
        catalog: &TraceCatalog,
        leader: &OwnedFd,
        signal: Option<(libc::c_int, libc::pid_t)>,
    ) -> Opened {
        let kvm = open_group(
            catalog.kvm.as_ref().map(|e| &e[..]),
            leader,
            signal,
            (&["kvm:kvm_exit"], KVM_KICK_PERIOD),
        );
        let irq = open_group(
            catalog.irq.as_ref().map(|e| &e[..]),
            leader,
            signal,
            (
                &["irq_vectors:local_timer_entry", "irq:softirq_entry"],
                IRQ_KICK_PERIOD,
            ),
        );
        let sched = open_group(
            catalog.sched.as_ref().map(|e| &e[..]),
            leader,
            None,
            (&[], 0),
        );
        let (kvm, kvm_err) = split(kvm);
        let (irq, irq_err) = split(irq);
        let (sched, sched_err) = split(sched);
        Opened {
            fds: TraceFds {
                kvm,
                irq,
                sched,
                silenced: Vec::new(),
            },
            kvm: kvm_err,
            irq: irq_err,
            sched: sched_err,
        }
    }

    /// Whether KVM's events are open.
    pub fn has_kvm(&self) -> bool {
        !self.kvm.is_empty()
    }

    /// Whether the interrupt events are open.
    pub fn has_irq(&self) -> bool {
        !self.irq.is_empty()
    }

    /// Whether `sched:sched_switch` is open.
    pub fn has_sched(&self) -> bool {
        !self.sched.is_empty()
    }

    /// Turns every event on or off (a system call each, only when the level changes).
    pub fn set_enabled(&self, on: bool) -> io::Result<()> {
        for fd in self.kvm.iter().chain(&self.irq).chain(&self.sched) {
            ioctl_enable(fd, on)?;
        }
        Ok(())
    }

    /// Stops using KVM's events (a host whose KVM does not fire them): turns them off (one
    /// system call each, once) and keeps them open until these fds are dropped, at the
    /// thread's end after its last reading. Not closed now: closing a tracepoint's last event
    /// waits for an RCU grace period, 36-46 ms each on the development host, which the vCPU
    /// thread spent blocked inside its measured time (82 ms at the start of every vCPU at
    /// level full on a PVM host, a quarter of a short `bench overhead` run).
    pub fn drop_kvm(&mut self) {
        if self.kvm.is_empty() {
            // Already done: taking the empty list would close the silenced ones now.
            return;
        }
        for fd in &self.kvm {
            // Off or not, it no longer counts: a silent tracepoint sends no record.
            let _ = ioctl_enable(fd, false);
        }
        self.silenced = std::mem::take(&mut self.kvm);
    }
}

/// Opens a group's events into `leader`'s ring, and with `signal` its kicker: the first of
/// `kicker.0`'s events the group has, sampling every `kicker.1`-th hit.
fn open_group(
    events: Result<&[Event], &TraceError>,
    leader: &OwnedFd,
    signal: Option<(libc::c_int, libc::pid_t)>,
    kicker: (&[&str], u64),
) -> Result<Vec<OwnedFd>, TraceError> {
    let events = events.map_err(copy_error)?;
    let mut fds = events
        .iter()
        .map(|e| open_one(*e, leader, None))
        .collect::<Result<Vec<_>, _>>()?;
    let kick = kicker
        .0
        .iter()
        .find_map(|n| events.iter().find(|e| e.name == *n));
    if let (Some((sig, tid)), Some(e)) = (signal, kick) {
        fds.push(open_one(*e, leader, Some((sig, tid, kicker.1)))?);
    }
    Ok(fds)
}

fn split(r: Result<Vec<OwnedFd>, TraceError>) -> (Vec<OwnedFd>, Option<TraceError>) {
    match r {
        Ok(v) => (v, None),
        Err(e) => (Vec::new(), Some(e)),
    }
}

/// A catalog's error, for one vCPU's copy of it.
fn copy_error(e: &TraceError) -> TraceError {
    let again = |source: &io::Error| io::Error::new(source.kind(), source.to_string());
    match e {
        TraceError::Disabled => TraceError::Disabled,
        TraceError::NoTracefs => TraceError::NoTracefs,
        TraceError::Missing(n) => TraceError::Missing(n),
        TraceError::Read { path, source } => TraceError::Read {
            path: path.clone(),
            source: again(source),
        },
        TraceError::Format { event, field } => TraceError::Format { event, field },
        TraceError::Open { event, source } => TraceError::Open {
            event,
            source: again(source),
        },
        TraceError::Output { event, source } => TraceError::Output {
            event,
            source: again(source),
        },
    }
}

/// PERF_EVENT_IOC_ENABLE or _DISABLE on `fd`.
pub fn ioctl_enable(fd: &OwnedFd, on: bool) -> io::Result<()> {
    let req = if on {
        PERF_EVENT_IOC_ENABLE
    } else {
        PERF_EVENT_IOC_DISABLE
    };
    // SAFETY: ENABLE/DISABLE take no argument and act on this event's own fd.
    if unsafe { libc::ioctl(fd.as_raw_fd(), req as _, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether this kernel charges interrupt time to the CPU instead of the thread it interrupted
/// (CONFIG_IRQ_TIME_ACCOUNTING, from `/boot/config-RELEASE`, and not turned off with
/// `tsc=noirqtime` on its command line): the thread CPU clock then leaves out the interrupts
/// the thread took. False where the configuration cannot be read (docs/accounting.md).
/// Read once per process.
pub fn irq_time_accounted() -> bool {
    static ONCE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ONCE.get_or_init(|| {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let config =
            std::fs::read_to_string(format!("/boot/config-{}", release.trim())).unwrap_or_default();
        let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
        irq_time_in_config(&config, &cmdline)
    })
}

/// [`irq_time_accounted`] of a kernel configuration's text and a command line.
pub fn irq_time_in_config(config: &str, cmdline: &str) -> bool {
    config
        .lines()
        .any(|l| l.trim() == "CONFIG_IRQ_TIME_ACCOUNTING=y")
        && !cmdline.split_whitespace().any(|w| w == "tsc=noirqtime")
}
