//! The tiny guest of PPA-VMM: one workload per vCPU, measured with rdtsc.
//!
//! Every vCPU enters [`_start`] at CPL 3 in long mode, on its own stack, with RDI pointing at its
//! [`BootInfo`] record (the contract is the `ppa-guest-abi` crate). Data flow:
//!
//! 1. **In:** the guest checks the record's magic and major version, then reads the doorbell
//!    address, the TSC frequency, the gap threshold and the [`WorkloadDesc`] from it. Nothing
//!    else comes in; the image keeps no state outside the stack, so all vCPUs share it safely.
//! 2. **Run:** vCPU 0 prints one console line (one CONSOLE doorbell write per byte), then each
//!    vCPU runs its workload (`idle`, `busy`, `periodic`, `exits`, `fault`, `hostile`,
//!    `memtouch`, a network workload over virtio-net: [`net`], or a disk workload over
//!    virtio-blk: [`blk`]). The spin loops read the
//!    TSC back to back; a step between two reads longer than the gap threshold means the vCPU was not running guest code, and is summed as lost
//!    time.
//! 3. **Publish** (unless the workload's `FLAG_NO_PUBLISH` is set): every 2 ms of TSC time the
//!    vCPU writes its running measurements into the PPA page as a worker thread record and a
//!    CPU record, and reads the host's figures for itself ([`ppa`]). The `hostile` workload
//!    writes bad data there instead ([`hostile`]).
//! 4. **Out:** the measurements go to the VMM as one write per [`report`] key to
//!    `doorbell_gpa + REPORT_BASE + 8 * key`, then the exit code goes to the EXIT doorbell.
//!
//! Exit codes: 0 done, `0xE1` bad boot info, `0xE2` unknown workload, `0xE3` a fault workload
//! that did not fault, `0xE4` a hostile workload without a PPA page, `0xE5` a network workload
//! without a usable virtio-net device, `0xE6` a disk workload without a usable virtio-blk
//! device, `0xDEAD` panic.
#![no_std]
#![no_main]

mod blk;
mod boot;
mod hostile;
mod mem;
mod memtouch;
mod net;
mod ppa;
mod virtio;

use core::arch::asm;
use core::panic::PanicInfo;

use ppa_guest_abi::{doorbell, report, workload, BootInfo, WorkloadDesc, WORKLOAD_PIO_PORT};

use boot::{Boot, Doorbell};

/// Exit code: the boot-info record is missing or not one this guest understands.
const EXIT_BAD_BOOT: u64 = 0xE1;
/// Exit code: the workload kind (or sub-kind) is unknown.
const EXIT_BAD_WORKLOAD: u64 = 0xE2;
/// Exit code: a `fault` workload instruction returned instead of shutting the vCPU down.
const EXIT_NO_FAULT: u64 = 0xE3;
/// Exit code: a `hostile` workload found no PPA page to write into.
const EXIT_NO_PAGE: u64 = 0xE4;
/// Exit code: a network workload found no virtio-net device, or could not start it.
const EXIT_NO_NET: u64 = 0xE5;
/// Exit code: a disk workload found no virtio-blk device, or could not start it.
const EXIT_NO_BLK: u64 = 0xE6;
/// Exit code: the guest panicked.
const EXIT_PANIC: u64 = 0xDEAD;
/// Longest single halt of the `idle` workload while it publishes into the PPA page (a
/// publication is due every 10 ms; without one, it halts once for the whole time, as a
/// tickless kernel would, and leaves an idle VMM nothing to do).
const IDLE_STEP_NS: u64 = 10_000_000;

/// Converts between TSC cycles and time.
#[derive(Clone, Copy)]
pub struct Clock {
    /// TSC frequency in kHz (= cycles per ms), never zero.
    khz: u64,
}

impl Clock {
    /// Cycles to ns, saturating.
    pub fn ns(self, cycles: u64) -> u64 {
        sat(u128::from(cycles) * 1_000_000 / u128::from(self.khz))
    }

    /// `amount` units of `unit_ns` ns each (1 = ns, 1_000 = us, 1_000_000 = ms) to cycles,
    /// saturating.
    pub fn cycles(self, amount: u64, unit_ns: u64) -> u64 {
        sat(u128::from(amount) * u128::from(unit_ns) * u128::from(self.khz) / 1_000_000)
    }
}

/// `v` as u64, saturating.
fn sat(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// Reads the TSC (allowed at CPL 3: the VMM leaves CR4.TSD clear).
#[inline(always)]
pub fn rdtsc() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: rdtsc only writes EDX:EAX (declared as outputs); it touches no memory, no stack
    // and no flags. The asm is not `pure`, so every call is a real read that the compiler may
    // neither merge nor drop nor hoist out of a loop.
    unsafe {
        asm!("rdtsc", out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags));
    }
    (u64::from(hi) << 32) | u64::from(lo)
}

/// What the workload measured; times in TSC cycles.
#[derive(Default)]
pub struct Stats {
    /// TSC time spent in spin loops.
    pub spin: u64,
    /// Sum of the gaps longer than the threshold.
    pub lost: u64,
    /// Number of such gaps.
    pub gaps: u64,
    /// Exits made on purpose (console, halt and workload doorbells, pio).
    pub exits: u64,
    /// Workload iterations.
    pub iterations: u64,
    /// TSC time spent in halt doorbells.
    pub halted: u64,
    /// Halt doorbells.
    pub halts: u64,
    /// TSC time in the `exits` workload's doorbell loop: guest code the whole time, from the
    /// guest's point of view, though each pass waits for an exit.
    pub looped: u64,
}

/// Spins reading the TSC back to back until it reaches `deadline`. A step between two reads
/// longer than `gap` cycles is time the vCPU did not run: it goes into `st.lost` and `st.gaps`.
/// The loop's TSC time goes into `st.spin`. Returns the number of loop passes.
#[inline(never)]
fn spin_until(deadline: u64, gap: u64, st: &mut Stats) -> u64 {
    let start = rdtsc();
    let (mut prev, mut lost, mut gaps, mut passes) = (start, 0u64, 0u64, 0u64);
    while prev < deadline {
        let now = rdtsc();
        let step = now.saturating_sub(prev);
        if step > gap {
            lost += step;
            gaps += 1;
        }
        passes += 1;
        prev = now;
    }
    st.spin += prev.saturating_sub(start);
    st.lost += lost;
    st.gaps += gaps;
    passes
}

/// One vCPU's running state: its boot record, doorbell, clock, measurements and publisher.
pub struct Ctx {
    /// This vCPU's boot-info record.
    pub boot: Boot,
    db: Doorbell,
    /// Its TSC clock.
    pub clk: Clock,
    /// The gap threshold in cycles.
    gap: u64,
    /// The measurements so far.
    pub st: Stats,
    /// The PPA page publisher, when publishing.
    ppa: Option<ppa::Publisher>,
    /// Spin-loop passes so far.
    passes: u64,
    /// Whether the passes are the work count (`busy`), not the iterations.
    passes_are_work: bool,
}

impl Ctx {
    /// The work count published: spin-loop passes for `busy`, iterations otherwise.
    fn work(&self) -> u64 {
        if self.passes_are_work {
            self.passes
        } else {
            self.st.iterations
        }
    }

    /// Publishes when due (never makes an exit).
    fn tick(&mut self) {
        let work = self.work();
        if let Some(p) = &mut self.ppa {
            let now = rdtsc();
            if now >= p.next {
                p.publish(now, &self.st, work);
            }
        }
    }

    /// Spins until `deadline`, in chunks that end when a publication is due. The publishing
    /// itself happens between chunks, outside the measured spin time. Returns the passes.
    fn spin(&mut self, deadline: u64) -> u64 {
        let mut passes = 0;
        loop {
            let end = self.ppa.as_ref().map_or(deadline, |p| p.next.min(deadline));
            let n = spin_until(end, self.gap, &mut self.st);
            passes += n;
            self.passes += n;
            if end >= deadline {
                return passes;
            }
            self.tick();
        }
    }

    /// Parks the vCPU for `ns` through the HALT doorbell; the time it took counts as halted.
    fn halt(&mut self, ns: u64) {
        let t0 = rdtsc();
        self.db.write(doorbell::HALT, ns);
        self.st.halted += rdtsc().saturating_sub(t0);
        self.st.halts += 1;
        self.st.exits += 1;
        self.tick();
    }
}

/// `idle`: halts until `ms` of TSC time passed, in steps of at most [`IDLE_STEP_NS`] while
/// publishing (and for as long as is left otherwise).
fn idle(ctx: &mut Ctx, ms: u64) {
    let t0 = rdtsc();
    let total_ns = ms.saturating_mul(1_000_000);
    let step_ns = if ctx.ppa.is_some() {
        IDLE_STEP_NS
    } else {
        u64::MAX
    };
    loop {
        let elapsed_ns = ctx.clk.ns(rdtsc().saturating_sub(t0));
        if elapsed_ns >= total_ns {
            break;
        }
        ctx.st.iterations += 1;
        ctx.halt(step_ns.min(total_ns - elapsed_ns));
    }
}

/// `busy`: spins for `ms` of TSC time.
fn busy(ctx: &mut Ctx, ms: u64) {
    let deadline = rdtsc().saturating_add(ctx.clk.cycles(ms, 1_000_000));
    ctx.st.iterations = ctx.spin(deadline);
}

/// `periodic`: `count` periods of `period_us`, each spinning `run_us` from the period's start
/// and halting for the rest of it.
fn periodic(ctx: &mut Ctx, params: [u64; 4]) {
    let run = ctx.clk.cycles(params[0], 1_000);
    let period = ctx.clk.cycles(params[1], 1_000);
    let count = params[2].max(1);
    let base = rdtsc();
    for k in 0..count {
        let start = base.saturating_add(k.saturating_mul(period));
        ctx.spin(start.saturating_add(run));
        ctx.st.iterations += 1;
        let next = start.saturating_add(period);
        let now = rdtsc();
        if now < next {
            let ns = ctx.clk.ns(next - now);
            if ns > 0 {
                ctx.halt(ns);
            }
        }
    }
}

/// `exits`: `n` writes to the MMIO workload doorbell, `n` 32-bit `out`s to the pio port, or
/// `n` CPUIDs (exits KVM handles in the kernel on VMX and SVM; not counted in `exits_made`,
/// which counts what reaches the VMM).
fn exits(ctx: &mut Ctx, n: u64, kind: u64) {
    if kind != workload::EXITS_MMIO && kind != workload::EXITS_PIO && kind != workload::EXITS_CPUID
    {
        ctx.db.exit(EXIT_BAD_WORKLOAD);
    }
    let t0 = rdtsc();
    for i in 0..n {
        if kind == workload::EXITS_MMIO {
            ctx.db.write(doorbell::WORKLOAD, i);
        } else if kind == workload::EXITS_CPUID {
            // SAFETY: CPUID leaf 0 only reads registers (EAX in, EAX..EDX out); RBX is saved
            // and restored around it (the compiler reserves it), no memory or flags change.
            unsafe {
                asm!("mov {tmp}, rbx", "cpuid", "mov rbx, {tmp}", tmp = out(reg) _,
                    inout("eax") 0u32 => _, inout("ecx") 0u32 => _, out("edx") _,
                    options(nomem, nostack, preserves_flags));
            }
            ctx.st.iterations += 1;
            if i % 64 == 0 {
                ctx.st.looped = rdtsc().saturating_sub(t0);
                ctx.tick();
            }
            continue;
        } else {
            // SAFETY: the VMM sets RFLAGS.IOPL = 3, so `out` at CPL 3 does not fault; it only
            // exits to the VMM. It reads DX and EAX (declared inputs) and touches no memory,
            // no stack and no flags.
            unsafe {
                asm!("out dx, eax", in("dx") WORKLOAD_PIO_PORT, in("eax") i as u32,
                    options(nomem, nostack, preserves_flags));
            }
        }
        ctx.st.exits += 1;
        ctx.st.iterations += 1;
        if i % 64 == 0 {
            ctx.st.looped = rdtsc().saturating_sub(t0);
            ctx.tick();
        }
    }
    ctx.st.looped = rdtsc().saturating_sub(t0);
}

/// `fault`: shuts the vCPU down on purpose. Returns only if the instruction did not fault.
fn fault(db: Doorbell, kind: u64) -> ! {
    match kind {
        // SAFETY: HLT at CPL 3 raises #GP, which without an IDT shuts the vCPU down; that is
        // the point. It touches no memory or stack; if it ever returns (CPL 0), we report it.
        workload::FAULT_HLT => unsafe { asm!("hlt", options(nomem, nostack)) },
        // SAFETY: UD2 raises #UD, which without an IDT shuts the vCPU down; that is the point.
        // It touches no memory or stack.
        workload::FAULT_UD => unsafe { asm!("ud2", options(nomem, nostack)) },
        _ => db.exit(EXIT_BAD_WORKLOAD),
    }
    db.exit(EXIT_NO_FAULT)
}

/// Calls `f` with each decimal digit of `n`, most significant first.
fn digits(n: u32, mut f: impl FnMut(u8)) {
    let mut div = 1;
    while div <= n / 10 {
        div *= 10;
    }
    while div > 0 {
        f(b'0' + (n / div % 10) as u8);
        div /= 10;
    }
}

/// Writes "tiny: N vcpus\n" to the console, one byte per exit.
fn hello(db: Doorbell, vcpus: u32, st: &mut Stats) {
    let mut put = |b: u8| {
        db.console(b);
        st.exits += 1;
    };
    b"tiny: ".iter().for_each(|&b| put(b));
    digits(vcpus, &mut put);
    let tail: &[u8] = if vcpus == 1 { b" vcpu\n" } else { b" vcpus\n" };
    tail.iter().for_each(|&b| put(b));
}

/// The thread name of a workload kind.
fn kind_name(kind: u32) -> &'static [u8] {
    match kind {
        workload::IDLE => b"idle",
        workload::BUSY => b"busy",
        workload::PERIODIC => b"periodic",
        workload::EXITS => b"exits",
        workload::NET_TX | workload::NET_RX | workload::NET_ECHO => b"net",
        workload::BLK_WRITE | workload::BLK_VERIFY => b"blk",
        _ => b"worker",
    }
}

/// `blk-write` or `blk-verify` on the first virtio-blk device; reports its counts.
fn disk_workload(ctx: &mut Ctx, kind: u32, params: [u64; 4]) {
    let b = ctx.boot;
    // SAFETY: `b` is the VMM's checked record: its disk window and RAM area are ones the VMM
    // mapped for this VM's virtio-blk device and for nothing else.
    let disk = unsafe { blk::Disk::init(b.blk_mmio_gpa, b.blk_ram_gpa, b.blk_ram_size) };
    let Ok(mut disk) = disk else {
        ctx.db.exit(EXIT_NO_BLK)
    };
    let c = if kind == workload::BLK_WRITE {
        blk::write(&mut disk, ctx.clk, params[0], params[1], params[2])
    } else {
        blk::verify(&mut disk, ctx.clk, params[0], params[1], params[2])
    };
    ctx.st.iterations = c.blocks;
    for (key, value) in [
        (report::BLK_BLOCKS, c.blocks),
        (report::BLK_MISMATCHES, c.mismatches),
        (report::BLK_ERRORS, c.errors),
        (report::BLK_STATUS, u64::from(disk.status())),
        (report::BLK_NS, c.ns),
    ] {
        ctx.db.write(doorbell::REPORT_BASE + 8 * key, value);
    }
}

/// The entry point of every vCPU: RDI = this vCPU's [`BootInfo`], RSP = its own stack.
///
/// # Safety
///
/// Only the VMM enters here, as the ABI says: `boot` is this vCPU's boot-info record, written
/// before the vCPU started and never changed, and every address in it is one the VMM mapped.
#[no_mangle]
pub unsafe extern "C" fn _start(boot: *const BootInfo) -> ! {
    let t_start = rdtsc();
    // SAFETY: this function's contract (the ABI's entry): `boot` is this vCPU's record, which
    // the VMM wrote before the vCPU started and never changes, with the addresses it mapped.
    let Some(b) = (unsafe { Boot::from_vmm(boot) }) else {
        // The record's doorbell address cannot be trusted: use the ABI's fixed one.
        // SAFETY: the VMM maps the doorbell page at the ABI's fixed address for every vCPU.
        unsafe { Doorbell::fixed() }.exit(EXIT_BAD_BOOT)
    };
    let db = b.doorbell();
    let clk = Clock { khz: b.tsc_khz };
    let WorkloadDesc {
        kind,
        flags,
        params,
        ..
    } = b.workload;
    let publish = flags & workload::FLAG_NO_PUBLISH == 0 && kind != workload::HOSTILE;
    let mut ctx = Ctx {
        boot: b,
        db,
        clk,
        gap: clk.cycles(b.gap_threshold_ns, 1),
        st: Stats::default(),
        ppa: None,
        passes: 0,
        passes_are_work: kind == workload::BUSY,
    };
    if publish {
        ctx.ppa = ppa::Publisher::new(b, clk, &ppa::name(kind_name(kind), b.vcpu_index));
    }

    if b.vcpu_index == 0 {
        hello(db, b.vcpu_count, &mut ctx.st);
    }

    match kind {
        workload::IDLE => idle(&mut ctx, params[0]),
        workload::BUSY => busy(&mut ctx, params[0]),
        workload::PERIODIC => periodic(&mut ctx, params),
        workload::EXITS => exits(&mut ctx, params[0], params[1]),
        workload::FAULT => fault(db, params[0]),
        workload::HOSTILE if params[1] <= workload::HOSTILE_ALL => {
            if !hostile::run(&mut ctx, params[0], params[1]) {
                db.exit(EXIT_NO_PAGE)
            }
        }
        workload::NET_TX | workload::NET_RX | workload::NET_ECHO => {
            // SAFETY: `b` is the VMM's checked record: its network window and RAM area are
            // ones the VMM mapped for this VM's virtio-net device and for nothing else.
            let nic = unsafe { net::Nic::init(b.net_mmio_gpa, b.net_ram_gpa, b.net_ram_size) };
            let Ok(mut nic) = nic else {
                db.exit(EXIT_NO_NET)
            };
            let c = match kind {
                workload::NET_TX => net::tx(&mut nic, clk, params[0], params[1]),
                workload::NET_RX => net::rx(&mut nic, clk, params[0], params[1], params[2]),
                _ => net::echo(&mut nic, clk, params[0]),
            };
            ctx.st.iterations = c.sent + c.received;
            for (key, value) in [
                (report::NET_SENT, c.sent),
                (report::NET_RECEIVED, c.received),
                (report::NET_ECHOED, c.echoed),
                (report::NET_STATUS, u64::from(nic.status())),
            ] {
                db.write(doorbell::REPORT_BASE + 8 * key, value);
            }
        }
        workload::BLK_WRITE | workload::BLK_VERIFY => disk_workload(&mut ctx, kind, params),
        // SAFETY: the VMM's checked record gives this range as RAM of this VM, identity
        // mapped and used by nothing else (no image, stack, table or record lies there).
        workload::MEMTOUCH => match unsafe { memtouch::run(params[1], params[0]) } {
            Some(t) => {
                ctx.st.iterations = 1;
                for (key, value) in [
                    (report::TOUCHED_BYTES, t.bytes),
                    (report::TOUCH_ERRORS, t.errors),
                    (report::TOUCH_BASE, params[1]),
                ] {
                    db.write(doorbell::REPORT_BASE + 8 * key, value);
                }
            }
            None => db.exit(EXIT_BAD_WORKLOAD),
        },
        _ => db.exit(EXIT_BAD_WORKLOAD),
    }

    let st = &ctx.st;
    let spin_ns = clk.ns(st.spin);
    let lost_ns = clk.ns(st.lost);
    let work = ctx.work();
    let mut seen = None;
    if let Some(p) = &mut ctx.ppa {
        // The final figures, then the freshest host record for the steal report.
        p.publish(rdtsc(), st, work);
        seen = p.host_seen.map(|(h, tsc)| {
            let at = clk.ns(tsc.saturating_sub(t_start));
            (h.steal_ns, h.wall_ns, p.publishes, at)
        });
    }
    for (key, value) in [
        (report::SPIN_NS, spin_ns),
        (report::LOST_NS, lost_ns),
        (report::GAPS, st.gaps),
        (report::RAN_NS, spin_ns.saturating_sub(lost_ns)),
        (report::EXITS_MADE, st.exits),
        (report::ITERATIONS, st.iterations),
    ] {
        db.write(doorbell::REPORT_BASE + 8 * key, value);
    }
    if let Some((steal, wall, publishes, at)) = seen {
        for (key, value) in [
            (report::STEAL_SEEN_NS, steal),
            (report::STEAL_SEEN_WALL_NS, wall),
            (report::PUBLISHES, publishes),
            (report::STEAL_SEEN_AT_NS, at),
        ] {
            db.write(doorbell::REPORT_BASE + 8 * key, value);
        }
    }
    // Last, so that it ends as close to the vCPU's end as a report can.
    let elapsed_ns = clk.ns(rdtsc().saturating_sub(t_start));
    db.write(doorbell::REPORT_BASE + 8 * report::ELAPSED_NS, elapsed_ns);
    db.exit(0)
}

/// A panic stops the vCPU with exit code `0xDEAD`. The image keeps no per-vCPU state outside
/// the stack, so this uses the ABI's fixed doorbell address.
#[panic_handler]
fn panic(_: &PanicInfo) -> ! {
    // SAFETY: the VMM maps the doorbell page at the ABI's fixed address for every vCPU.
    unsafe { Doorbell::fixed() }.exit(EXIT_PANIC)
}

/// Never called: the guest is built with `panic = "abort"` and never unwinds. The prebuilt
/// `core` still names this symbol in its unwind tables, and unoptimised builds keep those
/// tables, so the symbol must exist for the image to link.
#[no_mangle]
pub extern "C" fn rust_eh_personality() {}
