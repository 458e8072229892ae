//! The PPA page (spec section 8, docs/abi.md): a guest-physical region the VMM and the guest
//! share, layout version 1.5. The VMM writes the host section (each vCPU's section 4 figures,
//! so a guest sees its own steal and limited time); the guest writes the guest section
//! (per-thread records in the manner of PPA's rawppa, per-CPU records in the manner of
//! rawsysppa, transient tasks), which the VMM decodes as untrusted input.
//!
//! Every record is `#[repr(C)]`, little-endian, 8-byte aligned, with its size and offsets
//! asserted at compile time. Records that change while the other side reads start with a
//! sequence counter (`seq`): odd while a write is in progress. The protocols are
//! [`write_record`] and [`read_record`]; their memory orderings are documented there.
//!
//! Layout of a region of `total_size` bytes (offsets in bytes from the region's start):
//!
//! ```text
//! 0                      RegionHeader (64)            written once by the VMM
//! host_offset            host_count × HostVcpu (128)  VMM writes, guest reads
//! vm_offset              HostVm (128), 1.3            VMM writes, guest reads
//! guest_offset           GuestHeader (64)             guest writes, VMM reads
//!   + 64                 GuestAgent (192), optional   1.1: a guest agent's own record
//!   + alarms_offset      GuestAlarms (128) + slots × GuestAlarm (64), 1.5, optional
//!   + threads_offset     threads_count × GuestThread (192, or 256 with the 1.5 tail)
//!   + cpus_offset        cpus_count × GuestCpu (192)
//! ```
//!
//! Minor 1 (1.1) added, all zero or absent in what a 1.0 writer produces: the [`GuestAgent`]
//! record (found at [`AGENT_OFFSET`] when both tables start past it, see
//! [`agent_record_fits`], and recognised by its magic), and meanings for the first two
//! reserved words of [`GuestThread`] (flags, state, on-CPU time in the last interval: see
//! [`GuestThread::flags`]). A reader takes them from a guest header of minor 1 or more only.
//!
//! Minor 3 (1.3) added the VM-wide host record [`HostVm`] (pressure, the VMM's host CPU,
//! network counters), between the host vCPU records and the guest section; the region
//! header's first reserved word became `vm_offset` and `vm_size` ([`RegionHeader::vm_offset`]),
//! both zero from a 1.2 writer. A 1.2 reader never looks there: it finds the guest section
//! at `guest_offset` as before.
//!
//! Minor 4 (1.4) gave the last two reserved words of [`HostVcpu`] meanings: `kvm_ns` and
//! `interrupted_ns`, [`NOT_MEASURED`] where the host does not measure them. A 1.3 writer left
//! them zero, so a reader takes them from a region of minor 4 or more only ([`HostVcpu::kvm`]).
//!
//! Minor 5 (1.5) added the guest's thresholds and alarms, reset, and delay counts: the VM
//! record's last word became [`HostVm::guest_reset`] (a reset the host asks of the agent) and
//! its flags [`VM_PRESSURE_ESTIMATED`]; [`GuestAgent`]'s first reserved words say where its
//! alarm ring is ([`alarms`]) and which reset it honoured; [`GuestThread`]'s reserved words 2
//! to 6 hold the threshold counts and two more delay totals ([`GuestThread::over`]), and a
//! thread record of 256 bytes or more ([`THREAD_RECORD_SIZE_1_5`]) has a tail with the rest:
//! one more delay total and the count of every delay kind ([`GuestThreadTail`]);
//! [`GuestCpu`]'s first reserved words hold its threshold counts. Each is read only from a
//! header (region or guest) of minor 5 or more, and the tail only from a table whose record
//! size holds it.
//!
//! Extending the ABI: records only grow at their end, into their reserved words or by a larger
//! `*_record_size` (readers use the size given in the header, never their own); a new field
//! bumps the minor version; a reader accepts any minor of its major. A new major is a new,
//! incompatible layout.

use core::sync::atomic::{fence, AtomicU32, Ordering};

/// "PPAP": magic of [`RegionHeader`].
pub const REGION_MAGIC: u32 = u32::from_le_bytes(*b"PPAP");
/// "PPAG": magic of [`GuestHeader`].
pub const GUEST_MAGIC: u32 = u32::from_le_bytes(*b"PPAG");
/// Major version of this layout.
pub const MAJOR: u16 = 1;
/// Minor version of this layout (2: [`HostVcpu::blocked_ns`]; 3: [`HostVm`]; 4:
/// [`HostVcpu::kvm_ns`] and [`HostVcpu::interrupted_ns`]; 5: thresholds, alarms, reset,
/// delay counts).
pub const MINOR: u16 = 5;

/// A [`HostVcpu`] figure the host does not measure (`kvm_ns`, `interrupted_ns`).
pub const NOT_MEASURED: u64 = u64::MAX;
/// [`MAJOR`] and [`MINOR`] as one word, major << 16 | minor (as the CPUID leaf gives it).
pub const VERSION: u32 = ((MAJOR as u32) << 16) | MINOR as u32;
/// "PPAA": magic of [`GuestAgent`].
pub const AGENT_MAGIC: u32 = u32::from_le_bytes(*b"PPAA");
/// Offset of the optional [`GuestAgent`] record in the guest section: right after the header.
pub const AGENT_OFFSET: u32 = 64;
/// Most records a reader takes from one table (the VMM refuses a table that declares more);
/// writers publish at most this many.
pub const READER_MAX_RECORDS: u32 = 1024;
/// Default size of the region.
pub const DEFAULT_SIZE: u64 = 64 * 1024;
/// Length of a thread name, NUL-padded (a name of 16 bytes has no NUL).
pub const COMM_LEN: usize = 16;
/// Softirq kinds counted per guest CPU, in Linux's order: HI, TIMER, NET_TX, NET_RX, BLOCK,
/// IRQ_POLL, TASKLET, SCHED, HRTIMER, RCU.
pub const SOFTIRQ_KINDS: usize = 10;

/// The region's header, at offset 0. Written once by the VMM before the guest starts.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionHeader {
    /// [`REGION_MAGIC`].
    pub magic: u32,
    /// [`MAJOR`].
    pub major: u16,
    /// [`MINOR`].
    pub minor: u16,
    /// Size of the whole region, bytes.
    pub total_size: u32,
    /// Size of this header, bytes (64).
    pub header_size: u32,
    /// Offset of the host section.
    pub host_offset: u32,
    /// Number of [`HostVcpu`] records (one per vCPU).
    pub host_count: u32,
    /// Size of one host record (128 in 1.0).
    pub host_record_size: u32,
    /// Offset of the guest section.
    pub guest_offset: u32,
    /// Size of the guest section, bytes.
    pub guest_size: u32,
    /// Nominal refresh interval of the host section, ns.
    pub host_refresh_ns: u32,
    /// Offset of the [`HostVm`] record (1.3; 0 when the region has none: a 1.2 writer).
    pub vm_offset: u32,
    /// Size of the [`HostVm`] record (128 in 1.3; 0 when there is none).
    pub vm_size: u32,
    /// Reserved, zero.
    pub reserved: [u64; 2],
}

impl RegionHeader {
    /// Where the [`HostVm`] record is, when this header has one that lies inside the region
    /// before the guest section and is at least as large as a 1.3 record: `(offset, size)`.
    pub fn vm_record(&self) -> Option<(u32, u32)> {
        let min = core::mem::size_of::<HostVm>() as u32;
        let end = self.vm_offset.checked_add(self.vm_size)?;
        (self.minor >= 3
            && self.vm_offset != 0
            && self.vm_offset.is_multiple_of(8)
            && self.vm_size >= min
            && end <= self.guest_offset
            && end <= self.total_size)
            .then_some((self.vm_offset, self.vm_size))
    }
}

/// [`HostVm::flags`] bit: the pressure fields are filled.
pub const VM_PRESSURE: u32 = 1;
/// [`HostVm::flags`] bit: the host CPU fields are filled.
pub const VM_HOST_CPU: u32 = 2;
/// [`HostVm::flags`] bit: the network fields are filled.
pub const VM_NET: u32 = 4;
/// [`HostVm::flags`] bit (1.5): the pressure figures are partly an estimate (the overlap
/// rule: the vCPUs' state intervals were not known, docs/accounting.md "Pressure").
pub const VM_PRESSURE_ESTIMATED: u32 = 8;

/// The VM-wide host record (1.3), at the header's `vm_offset`, refreshed with the host vCPU
/// records. Times are ns (pressure totals µs) since the VM started; averages are in
/// hundredths of a percent (`8647` is 86.47 %), as Linux's PSI files print them.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostVm {
    /// Sequence counter, odd while the VMM writes.
    pub seq: u32,
    /// `VM_*` bits: which groups of fields are filled.
    pub flags: u32,
    /// VM uptime when the figures were taken, ns.
    pub updated_ns: u64,
    /// Host CPU time of the vCPU threads (Σ used_ns), ns.
    pub host_cpu_vcpus_ns: u64,
    /// Host CPU time of the device threads, ns.
    pub host_cpu_devices_ns: u64,
    /// Host CPU time of the VMM's other threads (control socket, sampler, limiter), ns.
    pub host_cpu_service_ns: u64,
    /// Packets sent by the guest's network devices.
    pub net_tx_packets: u64,
    /// Packets received.
    pub net_rx_packets: u64,
    /// Bytes sent.
    pub net_tx_bytes: u64,
    /// Bytes received.
    pub net_rx_bytes: u64,
    /// Packets dropped, either way.
    pub net_drops: u64,
    /// Time at least one non-idle vCPU was stalled (runnable and waiting, or held by a
    /// limit), µs.
    pub pressure_some_total_us: u64,
    /// Time every non-idle vCPU was stalled (at least one being non-idle), µs.
    pub pressure_full_total_us: u64,
    /// `some` averages over 10 s, 60 s and 300 s, hundredths of a percent.
    pub pressure_some_avg: [u32; 3],
    /// `full` averages, likewise.
    pub pressure_full_avg: [u32; 3],
    /// The latest guest reset the host asks for (1.5; `guest-reset` on the control socket):
    /// a generation that only grows, 0 while none was asked. A guest agent that finds it
    /// above the one it honoured restarts its figures from 0 and says so in
    /// [`GuestAgent::reset_generation`]. Zero from a 1.4 writer (the word was reserved).
    pub guest_reset: u64,
}

/// One vCPU's host-side figures (spec section 4), refreshed by the VMM at least every 10 ms.
/// Times are ns since the vCPU started or was reset.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostVcpu {
    /// Sequence counter, odd while the VMM writes.
    pub seq: u32,
    /// vCPU index.
    pub vcpu: u32,
    /// VM uptime when the figures were taken, ns.
    pub updated_ns: u64,
    /// wall_ns.
    pub wall_ns: u64,
    /// used_ns.
    pub used_ns: u64,
    /// guest_ns.
    pub guest_ns: u64,
    /// vmm_ns.
    pub vmm_ns: u64,
    /// steal_ns.
    pub steal_ns: u64,
    /// halted_ns.
    pub halted_ns: u64,
    /// idle_ns.
    pub idle_ns: u64,
    /// limited_ns.
    pub limited_ns: u64,
    /// paused_ns.
    pub paused_ns: u64,
    /// Userspace exits, all reasons.
    pub exits: u64,
    /// Runaway and overload detections.
    pub overloads: u64,
    /// blocked_ns (layout 1.2; zero from a 1.1 writer, whose records then miss it in the
    /// identity).
    pub blocked_ns: u64,
    /// kvm_ns: time the host's KVM spent handling this vCPU's exits in the kernel (layout
    /// 1.4), part of guest_ns's complement in used_ns; [`NOT_MEASURED`] where the host cannot
    /// split it out. Zero from a 1.3 writer: read it with [`HostVcpu::kvm`].
    pub kvm_ns: u64,
    /// interrupted_ns: time the host spent in its own interrupts while this vCPU's thread was
    /// current (layout 1.4), part of used_ns; [`NOT_MEASURED`] where not measured. Read it
    /// with [`HostVcpu::interrupted`].
    pub interrupted_ns: u64,
}

impl HostVcpu {
    /// kvm_ns, if the record's writer (a region of minor `minor`) measured it.
    pub fn kvm(&self, minor: u16) -> Option<u64> {
        (minor >= 4 && self.kvm_ns != NOT_MEASURED).then_some(self.kvm_ns)
    }

    /// interrupted_ns, if the record's writer (a region of minor `minor`) measured it.
    pub fn interrupted(&self, minor: u16) -> Option<u64> {
        (minor >= 4 && self.interrupted_ns != NOT_MEASURED).then_some(self.interrupted_ns)
    }
}

/// The guest section's header, at `guest_offset`. Offsets here are relative to the guest
/// section's start; the VMM checks every one against `guest_size`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GuestHeader {
    /// Sequence counter of this header, odd while the guest writes it.
    pub seq: u32,
    /// [`GUEST_MAGIC`].
    pub magic: u32,
    /// [`MAJOR`].
    pub major: u16,
    /// [`MINOR`].
    pub minor: u16,
    /// Number of guest CPUs.
    pub nr_cpus: u32,
    /// Guest time of the last update of any record, ns (guest clock).
    pub updated_ns: u64,
    /// Offset of the thread records.
    pub threads_offset: u32,
    /// Number of thread records in use.
    pub threads_count: u32,
    /// Size of one thread record (192 in 1.0).
    pub thread_record_size: u32,
    /// Offset of the CPU records.
    pub cpus_offset: u32,
    /// Number of CPU records.
    pub cpus_count: u32,
    /// Size of one CPU record (192 in 1.0).
    pub cpu_record_size: u32,
    /// Transient tasks (PPA requirement 22): threads that exited since the guest started,
    /// whose records are gone.
    pub transient_count: u64,
    /// Their CPU time, ns.
    pub transient_cpu_ns: u64,
}

/// One guest thread (PPA's rawppa for a thread, with Linux's delay accounting).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GuestThread {
    /// Sequence counter, odd while the guest writes.
    pub seq: u32,
    /// Thread id.
    pub tid: u32,
    /// Thread group (process) id.
    pub tgid: u32,
    /// CPU it last ran on.
    pub last_cpu: u32,
    /// Name, UTF-8, NUL-padded.
    pub comm: [u8; COMM_LEN],
    /// On-CPU time, ns.
    pub on_cpu_ns: u64,
    /// User time, ns.
    pub utime_ns: u64,
    /// System time, ns.
    pub stime_ns: u64,
    /// Time runnable but waiting for a CPU, ns.
    pub run_delay_ns: u64,
    /// Times it was put on a CPU.
    pub timeslices: u64,
    /// Voluntary context switches.
    pub nvcsw: u64,
    /// Involuntary context switches.
    pub nivcsw: u64,
    /// Delay accounting: block I/O, ns.
    pub blkio_delay_ns: u64,
    /// Delay accounting: swap-in, ns.
    pub swapin_delay_ns: u64,
    /// Delay accounting: memory reclaim, ns.
    pub freepages_delay_ns: u64,
    /// Delay accounting: IRQ handling on its time, ns.
    pub irq_delay_ns: u64,
    /// Guest time of this record's last update, ns.
    pub updated_ns: u64,
    /// Application-defined count of work done (the tiny guest: loop iterations).
    pub work: u64,
    /// Reserved, zero.
    pub reserved: [u64; 7],
}

/// One guest CPU (PPA's rawsysppa for a CPU, with /proc/stat's split).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GuestCpu {
    /// Sequence counter, odd while the guest writes.
    pub seq: u32,
    /// CPU number.
    pub cpu: u32,
    /// User time, ns.
    pub user_ns: u64,
    /// System time, ns.
    pub system_ns: u64,
    /// Idle time, ns.
    pub idle_ns: u64,
    /// I/O wait, ns.
    pub iowait_ns: u64,
    /// Hard interrupts, ns.
    pub irq_ns: u64,
    /// Softirqs, ns.
    pub softirq_ns: u64,
    /// Steal the guest saw, ns.
    pub steal_ns: u64,
    /// Interrupts.
    pub interrupts: u64,
    /// Context switches.
    pub context_switches: u64,
    /// Softirqs by kind ([`SOFTIRQ_KINDS`]).
    pub softirqs: [u64; SOFTIRQ_KINDS],
    /// Guest time of this record's last update, ns.
    pub updated_ns: u64,
    /// Reserved, zero.
    pub reserved: [u64; 3],
}

impl GuestCpu {
    /// The 1.5 threshold counts (`reserved[0..2]`, offsets 168 and 176): sample intervals in
    /// which this CPU's hard-interrupt time and its softirq time exceeded the writer's
    /// thresholds.
    pub const fn over(&self) -> [u64; 2] {
        [self.reserved[0], self.reserved[1]]
    }

    /// Sets the 1.5 words.
    pub fn set_over(&mut self, over: [u64; 2]) {
        self.reserved[0..2].copy_from_slice(&over);
    }
}

/// [`GuestThread::flags`] bit: a kernel thread (PF_KTHREAD).
pub const THREAD_KERNEL: u32 = 1;

/// [`GuestThread::state`] of a thread that has exited (Linux's own letter for a dead task,
/// `X`): the record holds its final figures, and a writer that keeps such records does not
/// count them in the header's transient figures while they are published (docs/abi.md,
/// "Exited threads"). Any other value is Linux's letter for a live thread, or 0 (unknown).
pub const THREAD_STATE_EXITED: u8 = b'X';

/// The 1.1 meanings of [`GuestThread`]'s first two reserved words (zero from a 1.0 writer):
/// `reserved[0]` holds `flags` (bits 0–31) and `state` (bits 32–39), `reserved[1]` holds
/// `interval_on_cpu_ns`. In C: `uint32_t flags; uint8_t state; uint8_t pad[3]; uint64_t
/// interval_on_cpu_ns;` at offsets 136, 140 and 144.
impl GuestThread {
    /// Flags ([`THREAD_KERNEL`]).
    pub const fn flags(&self) -> u32 {
        self.reserved[0] as u32
    }

    /// Scheduler state as Linux shows it (`R`, `S`, `D`, `T`, `Z`, `I`, ...), 0 when unknown;
    /// [`THREAD_STATE_EXITED`] (`X`) for a thread that exited.
    pub const fn state(&self) -> u8 {
        (self.reserved[0] >> 32) as u8
    }

    /// On-CPU time in the writer's last sample interval, ns: how a writer that publishes
    /// only its busiest threads ranked this one.
    pub const fn interval_on_cpu_ns(&self) -> u64 {
        self.reserved[1]
    }

    /// Sets the 1.1 words.
    pub fn set_ext(&mut self, flags: u32, state: u8, interval_on_cpu_ns: u64) {
        self.reserved[0] = u64::from(flags) | (u64::from(state) << 32);
        self.reserved[1] = interval_on_cpu_ns;
    }

    /// The 1.5 threshold counts (`reserved[2..5]`, offsets 152, 160, 168), by
    /// [`alarms::AlarmKind`] of a thread: sample intervals in which its mean run-queue wait
    /// per wait, its on-CPU time per timeslice, and its involuntary switches exceeded the
    /// writer's thresholds (docs/agent.md, "Thresholds and alarms").
    pub const fn over(&self) -> [u64; 3] {
        [self.reserved[2], self.reserved[3], self.reserved[4]]
    }

    /// The 1.5 delay totals that had no field (`reserved[5..7]`, offsets 176 and 184):
    /// thrashing and compaction, ns.
    pub const fn more_delays_ns(&self) -> [u64; 2] {
        [self.reserved[5], self.reserved[6]]
    }

    /// Sets the 1.5 words.
    pub fn set_v15(&mut self, over: [u64; 3], more_delays_ns: [u64; 2]) {
        self.reserved[2..5].copy_from_slice(&over);
        self.reserved[5..7].copy_from_slice(&more_delays_ns);
    }
}

/// Size of a thread record with the 1.5 tail.
pub const THREAD_RECORD_SIZE_1_5: u32 = 256;

/// The tail a 1.5 writer may append to each thread record (a table whose
/// `thread_record_size` is at least [`THREAD_RECORD_SIZE_1_5`]): the last delay total
/// without a field and the count of delays of each kind, from the kernel's taskstats.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GuestThreadTail {
    /// Delay accounting: write-protect copy (copy-on-write faults), ns (taskstats 13).
    pub wpcopy_delay_ns: u64,
    /// Delays counted, by kind: block I/O, swap-in, memory reclaim, IRQ, thrashing,
    /// compaction, write-protect copy (the totals' order: the record's four, then
    /// [`GuestThread::more_delays_ns`], then [`GuestThreadTail::wpcopy_delay_ns`]).
    pub delay_counts: [u64; DELAY_KINDS],
}

/// Delay kinds a 1.5 thread record carries: blkio, swapin, freepages, irq, thrashing,
/// compact, wpcopy.
pub const DELAY_KINDS: usize = 7;

/// A 1.5 thread record with its tail, written and read as one record (one sequence counter).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GuestThreadFull {
    /// The record as 1.0 to 1.5 lay it out.
    pub thread: GuestThread,
    /// The 1.5 tail.
    pub tail: GuestThreadTail,
}

impl GuestThreadFull {
    /// Every delay total, ns, in [`GuestThreadTail::delay_counts`]'s order.
    pub fn delays_ns(&self) -> [u64; DELAY_KINDS] {
        let t = &self.thread;
        let [thrash, compact] = t.more_delays_ns();
        [
            t.blkio_delay_ns,
            t.swapin_delay_ns,
            t.freepages_delay_ns,
            t.irq_delay_ns,
            thrash,
            compact,
            self.tail.wpcopy_delay_ns,
        ]
    }
}

/// [`GuestAgent::flags`] bit: exits come from the kernel's taskstats exit notifications, so
/// every task that exited is counted with its CPU time.
pub const AGENT_TASKSTATS: u32 = 1;
/// [`GuestAgent::flags`] bit: the kernel's `task_delayacct` is on, so the thread records'
/// delay totals (block I/O, swap-in, reclaim, IRQ) are filled.
pub const AGENT_DELAYACCT: u32 = 2;
/// [`GuestAgent::flags`] bit: the kernel dropped exit notifications at least once (its
/// socket buffer overflowed); [`GuestAgent::exits_missed`] counts the exits recovered from
/// /proc.
pub const AGENT_EXITS_LOST: u32 = 4;
/// [`GuestAgent::flags`] bit: the CPU records' `context_switches` are filled (from
/// /proc/schedstat); without it they are 0.
pub const AGENT_CPU_SWITCHES: u32 = 8;
/// [`GuestAgent::flags`] bit: the agent stopped; the records are its last.
pub const AGENT_STOPPED: u32 = 16;

/// A guest agent's own record (1.1), at [`AGENT_OFFSET`] in the guest section: how it
/// samples, what it costs, what it could not publish, and the transient tasks it counted.
/// Cumulative figures count from the agent's start.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GuestAgent {
    /// Sequence counter, odd while the agent writes.
    pub seq: u32,
    /// [`AGENT_MAGIC`].
    pub magic: u32,
    /// Size of this record (192 in 1.1); a reader uses the fields it knows.
    pub size: u32,
    /// `AGENT_*` bits.
    pub flags: u32,
    /// The agent's process id.
    pub pid: u32,
    /// Threads alive at the last sample.
    pub threads_seen: u32,
    /// Thread records published at the last sample.
    pub threads_published: u32,
    /// Reserved, zero.
    pub reserved0: u32,
    /// Sample interval, ns.
    pub interval_ns: u64,
    /// Samples taken.
    pub samples: u64,
    /// CPU time of the last sample (collection and publication), ns.
    pub sample_cpu_ns: u64,
    /// The most CPU time one sample took, ns.
    pub sample_max_cpu_ns: u64,
    /// All the agent's CPU time since it started (samples, exit notifications), ns.
    pub agent_cpu_ns: u64,
    /// The aggregate record: threads alive but not published (over the table's capacity).
    pub rest_count: u64,
    /// Their on-CPU time, ns.
    pub rest_on_cpu_ns: u64,
    /// Their on-CPU time in the last interval, ns.
    pub rest_interval_on_cpu_ns: u64,
    /// Tasks that started and ended between two samples (PPA requirement 22): never in a
    /// sample. A subset of the guest header's `transient_count`.
    pub unseen_count: u64,
    /// Their CPU time, ns.
    pub unseen_cpu_ns: u64,
    /// Thread groups (processes) that ended.
    pub exited_processes: u64,
    /// Exits the agent found in /proc without a notification (see [`AGENT_EXITS_LOST`]),
    /// counted with their CPU time as last sampled.
    pub exits_missed: u64,
    /// Guest time of this record's last update, ns (the guest header's clock).
    pub updated_ns: u64,
    /// Reserved, zero.
    pub reserved: [u64; 7],
}

/// The 1.5 meanings of [`GuestAgent`]'s first three reserved words (zero from a 1.1 to 1.4
/// writer): `reserved[0]` holds `alarms_offset` (bits 0–31) and `alarms_size` (bits 32–63),
/// where its alarm ring is in the guest section ([`alarms`]; 0: none); `reserved[1]` the
/// reset generation it honoured last ([`HostVm::guest_reset`]); `reserved[2]` when, on the
/// header's clock. In C: `uint32_t alarms_offset, alarms_size; uint64_t reset_generation,
/// reset_ns;` at offsets 136, 140, 144 and 152.
impl GuestAgent {
    /// The alarm ring's (offset, size) in the guest section, if the agent has one.
    pub const fn alarms(&self) -> Option<(u32, u32)> {
        let (off, size) = (self.reserved[0] as u32, (self.reserved[0] >> 32) as u32);
        if off == 0 || size == 0 {
            None
        } else {
            Some((off, size))
        }
    }

    /// The reset generation the agent honoured last (0: none).
    pub const fn reset_generation(&self) -> u64 {
        self.reserved[1]
    }

    /// When it did, ns on the guest header's clock (0: never).
    pub const fn reset_ns(&self) -> u64 {
        self.reserved[2]
    }

    /// Sets the 1.5 words.
    pub fn set_v15(&mut self, alarms: Option<(u32, u32)>, reset_generation: u64, reset_ns: u64) {
        let (off, size) = alarms.unwrap_or((0, 0));
        self.reserved[0] = u64::from(off) | (u64::from(size) << 32);
        self.reserved[1] = reset_generation;
        self.reserved[2] = reset_ns;
    }
}

/// Whether a guest header leaves room for a [`GuestAgent`] record at [`AGENT_OFFSET`]: a 1.1
/// or later header whose tables (those with records) both start at or past its end. Only
/// then may a reader look for one (and then it checks the magic).
pub fn agent_record_fits(h: &GuestHeader) -> bool {
    let end = AGENT_OFFSET + core::mem::size_of::<GuestAgent>() as u32;
    h.minor >= 1
        && (h.threads_count == 0 || h.threads_offset >= end)
        && (h.cpus_count == 0 || h.cpus_offset >= end)
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<RegionHeader>() == 64);
    assert!(offset_of!(RegionHeader, total_size) == 8);
    assert!(offset_of!(RegionHeader, host_offset) == 16);
    assert!(offset_of!(RegionHeader, guest_offset) == 28);
    assert!(offset_of!(RegionHeader, vm_offset) == 40);
    assert!(offset_of!(RegionHeader, vm_size) == 44);
    assert!(offset_of!(RegionHeader, reserved) == 48);
    assert!(size_of::<HostVm>() == 128);
    assert!(offset_of!(HostVm, updated_ns) == 8);
    assert!(offset_of!(HostVm, host_cpu_vcpus_ns) == 16);
    assert!(offset_of!(HostVm, net_tx_packets) == 40);
    assert!(offset_of!(HostVm, net_drops) == 72);
    assert!(offset_of!(HostVm, pressure_some_total_us) == 80);
    assert!(offset_of!(HostVm, pressure_full_total_us) == 88);
    assert!(offset_of!(HostVm, pressure_some_avg) == 96);
    assert!(offset_of!(HostVm, pressure_full_avg) == 108);
    assert!(offset_of!(HostVm, guest_reset) == 120);
    assert!(size_of::<HostVcpu>() == 128);
    assert!(offset_of!(HostVcpu, updated_ns) == 8);
    assert!(offset_of!(HostVcpu, steal_ns) == 48);
    assert!(offset_of!(HostVcpu, limited_ns) == 72);
    assert!(offset_of!(HostVcpu, overloads) == 96);
    assert!(offset_of!(HostVcpu, blocked_ns) == 104);
    assert!(offset_of!(HostVcpu, kvm_ns) == 112);
    assert!(offset_of!(HostVcpu, interrupted_ns) == 120);
    assert!(size_of::<GuestHeader>() == 64);
    assert!(offset_of!(GuestHeader, updated_ns) == 16);
    assert!(offset_of!(GuestHeader, threads_offset) == 24);
    assert!(offset_of!(GuestHeader, transient_count) == 48);
    assert!(size_of::<GuestThread>() == 192);
    assert!(offset_of!(GuestThread, comm) == 16);
    assert!(offset_of!(GuestThread, on_cpu_ns) == 32);
    assert!(offset_of!(GuestThread, run_delay_ns) == 56);
    assert!(offset_of!(GuestThread, updated_ns) == 120);
    assert!(offset_of!(GuestThread, work) == 128);
    assert!(size_of::<GuestCpu>() == 192);
    assert!(offset_of!(GuestCpu, steal_ns) == 56);
    assert!(offset_of!(GuestCpu, softirqs) == 80);
    assert!(offset_of!(GuestCpu, updated_ns) == 160);
    assert!(size_of::<GuestAgent>() == 192);
    assert!(offset_of!(GuestAgent, interval_ns) == 32);
    assert!(offset_of!(GuestAgent, rest_count) == 72);
    assert!(offset_of!(GuestAgent, unseen_count) == 96);
    assert!(offset_of!(GuestAgent, updated_ns) == 128);
    assert!(offset_of!(GuestAgent, reserved) == 136);
    assert!(size_of::<GuestThreadTail>() == 64);
    assert!(size_of::<GuestThreadFull>() == THREAD_RECORD_SIZE_1_5 as usize);
    assert!(offset_of!(GuestThreadFull, tail) == 192);
    assert!(AGENT_OFFSET as usize == size_of::<GuestHeader>());
};

/// Plain-old-data records: every bit pattern is a valid value, every byte belongs to a field
/// (so a record may be copied as bytes or 8-byte words), and the first field is the `u32`
/// sequence counter.
///
/// # Safety
///
/// Implementors must be `#[repr(C)]`, contain only integer fields (any bit pattern valid),
/// have no padding bytes and a size that is a multiple of 8, and have a `u32` sequence
/// counter at offset 0.
pub unsafe trait Record: Copy {}

// SAFETY: repr(C), integers only, `seq: u32` first; no padding and a size a multiple of 8:
// each field is aligned where the one before it ends (the sizes and offsets are asserted
// above, and `every_record_is_its_fields_without_padding` checks the fields fill it).
unsafe impl Record for HostVcpu {}
// SAFETY: as above.
unsafe impl Record for HostVm {}
// SAFETY: as above.
unsafe impl Record for GuestHeader {}
// SAFETY: as above.
unsafe impl Record for GuestThread {}
// SAFETY: as above.
unsafe impl Record for GuestCpu {}
// SAFETY: as above.
unsafe impl Record for GuestAgent {}
// SAFETY: as above: two records of that kind one after the other (192 + 64 bytes, both
// multiples of 8, so no padding between or after), the thread record's `seq` first.
unsafe impl Record for GuestThreadFull {}

/// Writes `value` (its `seq` field ignored) into the shared record at `dst` under the
/// sequence protocol: `seq` becomes odd (Relaxed store, then a Release fence so that no
/// payload store is seen before it), the payload is stored with volatile writes, then `seq`
/// becomes even again with a Release store (the payload is seen before it). One writer per
/// record.
///
/// # Safety
///
/// `dst` must be valid for writes of `size_of::<T>()` bytes, aligned to 8, and only this
/// writer may write it; readers may read it concurrently.
pub unsafe fn write_record<T: Record>(dst: *mut T, value: &T) {
    // SAFETY: the caller guarantees `dst` is valid and aligned; `seq` is its first u32, and
    // an AtomicU32 has the layout of a u32.
    let seq = unsafe { &*(dst as *const AtomicU32) };
    let s = seq.load(Ordering::Relaxed);
    let odd = s.wrapping_add(1) | 1;
    seq.store(odd, Ordering::Relaxed);
    fence(Ordering::Release);
    let src = value as *const T as *const u8;
    let out = dst as *mut u8;
    // Payload after the counter, byte for byte (the record is plain data).
    for i in 4..core::mem::size_of::<T>() {
        // SAFETY: `i` is within both records; volatile, as another agent reads concurrently.
        unsafe { core::ptr::write_volatile(out.add(i), core::ptr::read(src.add(i))) };
    }
    seq.store(odd.wrapping_add(1), Ordering::Release);
}

/// Why a record could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadError {
    /// The writer was always writing (odd, or changed `seq`) in `tries` attempts.
    Torn {
        /// Attempts made.
        tries: u32,
    },
}

/// Reads a consistent copy of the shared record at `src`, trying at most `tries` times: load
/// `seq` (Acquire); if odd, try again; copy the payload with volatile reads; an Acquire fence;
/// load `seq` again; the copy is consistent when both loads are the same even value. Never
/// blocks and never loops past `tries`.
///
/// # Safety
///
/// `src` must be valid for reads of `size_of::<T>()` bytes and aligned to 8. It may be written
/// concurrently by one writer following [`write_record`] (or by a hostile one: the result is
/// then any bit pattern, which every [`Record`] accepts, or an error).
pub unsafe fn read_record<T: Record>(src: *const T, tries: u32) -> Result<T, ReadError> {
    // SAFETY: the caller guarantees `src` is valid and aligned; `seq` is its first u32.
    let seq = unsafe { &*(src as *const AtomicU32) };
    for _ in 0..tries {
        let s1 = seq.load(Ordering::Acquire);
        if s1 & 1 == 1 {
            core::hint::spin_loop();
            continue;
        }
        let mut out = core::mem::MaybeUninit::<T>::uninit();
        let dst = out.as_mut_ptr() as *mut u8;
        let from = src as *const u8;
        for i in 0..core::mem::size_of::<T>() {
            // SAFETY: `i` is within both; volatile, as the writer may be storing.
            unsafe { dst.add(i).write(core::ptr::read_volatile(from.add(i))) };
        }
        fence(Ordering::Acquire);
        let s2 = seq.load(Ordering::Relaxed);
        if s1 == s2 {
            // SAFETY: every byte was written above, and any bit pattern is a valid `T`
            // (the `Record` contract).
            let mut v = unsafe { out.assume_init() };
            // The copy's own counter is whatever was read; report the stable one.
            // SAFETY: `seq` is the first u32 of `v` (the `Record` contract).
            unsafe { *(&mut v as *mut T as *mut u32) = s1 };
            return Ok(v);
        }
    }
    Err(ReadError::Torn { tries })
}

pub mod alarms;

#[cfg(test)]
mod tests;
