//! A VM: built from a [`VmConfig`] (`Vm::try_from`), run to the end ([`Vm::run`]).
//!
//! Data flow of a build: check the config → resolve workloads → read and check the image
//! against the layout (`loader`) → open KVM, create the VM and one memory slot of RAM →
//! write page tables, GDT, TSS, image segments and per-vCPU boot-info records into guest
//! memory → create each vCPU and set its registers → put the devices on the buses.
//! A run spawns one `vcpu<N>` thread per vCPU, then the calling thread waits on a channel for
//! each to finish; on the first guest failure, or when the maximum run time passes, it kicks
//! the others to stop; it joins them all and returns what they published (`report`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::sync::Arc;
use std::time::Instant;

use kvm_bindings::{kvm_fpu, kvm_userspace_memory_region};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use ppa_guest_abi::{BootInfo, DOORBELL_GPA, DOORBELL_SIZE, WORKLOAD_PIO_PORT};
use ppa_vmm_api::VcpuEndKind;
use thiserror::Error;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use crate::accounting::host::{host_steal_ns, process_cpu_ns};
use crate::accounting::meter::{host_cpu_slots, VcpuMeter};
use crate::accounting::snapshot::VcpuAccounting;
use crate::accounting::AccountingControl;
use crate::api::{ApiServer, EventHub, ServerOptions};
use crate::arch::x86_64::{boot, calibrate, layout};
use crate::bus::{Bus, BusError};
use crate::config::{ConfigError, ImageSource, VmConfig};
use crate::devices::{Doorbells, WorkloadPort};
use crate::kick::now_ns;
use crate::kvm_stats::KvmStats;
use crate::limits::cgroup::CgroupLimits;
use crate::limits::limiter::{Backend, Limiter};
use crate::ppa_page::PpaPage;

/// Numbers the VMs of this process (names their cgroups apart).
static VM_SEQ: AtomicU64 = AtomicU64::new(0);
use crate::loader::{parse_elf, LoaderError};
use crate::report::{Report, VmInfo};
use crate::sampler::Sampler;
use crate::vcpu::{self, VcpuEnd, VcpuError, VcpuShared, VcpuThread, REQ_STOP};
use crate::workload::{resolve, VcpuWorkload, WorkloadError};

mod handle;
pub use handle::VmHandle;

/// The embedded tiny guest (built from images/tiny by build.rs).
pub static TINY_GUEST: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/tiny.elf"));

/// Why a VM could not be built or run.
#[derive(Debug, Error)]
pub enum VmError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A workload targets a vCPU that does not exist, or similar.
    #[error("the workloads do not fit this VM")]
    Workload(#[from] WorkloadError),
    /// The image file cannot be read.
    #[error("cannot read the guest image {path}")]
    ReadImage {
        /// Path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The image is not loadable.
    #[error("the guest image cannot be loaded")]
    Loader(#[from] LoaderError),
    /// Memory too small for the vCPU stacks and the image.
    #[error("{memory_mib} MiB of guest memory is too small for {vcpus} vCPU stacks and the image")]
    MemoryTooSmall {
        /// Memory given.
        memory_mib: u64,
        /// vCPUs.
        vcpus: usize,
    },
    /// The KVM device does not exist.
    #[error("{0} does not exist: this host has no KVM (it needs kvm_intel, kvm_amd or kvm_pvm)")]
    KvmMissing(PathBuf),
    /// No permission to open the KVM device.
    #[error("no permission to open {0}: run as root or join the group that owns it (kvm)")]
    KvmAccess(PathBuf),
    /// Another failure opening the KVM device.
    #[error("cannot open {path}")]
    KvmOpen {
        /// Path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// KVM allows fewer vCPUs.
    #[error("KVM on this host allows at most {max} vCPUs per VM, not {vcpus}")]
    KvmVcpuLimit {
        /// Host limit.
        max: usize,
        /// Requested.
        vcpus: usize,
    },
    /// A KVM call failed while building the VM.
    #[error("KVM refused to {step}")]
    Kvm {
        /// What was being done.
        step: &'static str,
        /// Cause.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// Guest memory could not be created or written.
    #[error("guest memory: {0}")]
    Memory(String),
    /// A device could not be placed on a bus.
    #[error("cannot place a device")]
    Bus(#[from] BusError),
    /// A vCPU thread could not be started.
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    /// The control socket or metrics endpoint could not be served.
    #[error(transparent)]
    Socket(#[from] crate::api::SocketError),
    /// The PPA page could not be made.
    #[error(transparent)]
    PpaPage(#[from] crate::ppa_page::PpaPageError),
    /// The cgroup limit backend could not be set up.
    #[error("cannot set up the cgroup limit backend")]
    Cgroup(#[source] crate::limits::cgroup::CgroupError),
    /// The sampler thread could not be started.
    #[error("cannot start the sampler thread")]
    Sampler(#[source] std::io::Error),
    /// A request named a vCPU the VM does not have.
    #[error("the VM has no vCPU {index} (it has {count})")]
    NoSuchVcpu {
        /// Index asked for.
        index: usize,
        /// vCPUs of the VM.
        count: usize,
    },
}

fn kvm_err(step: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmError {
    move |source| VmError::Kvm { step, source }
}

/// VM-wide state that the run loop and every [`VmHandle`] share.
#[derive(Debug)]
pub struct VmStatus {
    name: String,
    /// CLOCK_MONOTONIC when the vCPUs were released (0 before).
    start_ns: AtomicU64,
    shutdown: AtomicBool,
    finished: AtomicBool,
}

impl VmStatus {
    /// A VM called `name` that has not started.
    pub fn new(name: String) -> Self {
        VmStatus {
            name,
            start_ns: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
            finished: AtomicBool::new(false),
        }
    }

    /// Marks the start (the moment the vCPUs are released).
    pub fn mark_started(&self) {
        self.start_ns.store(now_ns(), Ordering::Release);
    }

    /// Marks the end (every vCPU thread has ended).
    pub fn mark_finished(&self) {
        self.finished.store(true, Ordering::Release);
    }
}

/// A VM ready to run.
pub struct Vm {
    status: Arc<VmStatus>,
    hub: Arc<EventHub>,
    limiter: Arc<Limiter>,
    vcpus: Vec<VcpuFd>,
    shared: Vec<Arc<VcpuShared>>,
    control: Arc<AccountingControl>,
    workloads: Vec<VcpuWorkload>,
    info: VmInfo,
    mmio: Arc<Bus>,
    pio: Arc<Bus>,
    max_runtime: Option<std::time::Duration>,
    server_options: ServerOptions,
    overload: crate::limits::overload::OverloadConfig,
    ppa_page: Option<Arc<PpaPage>>,
    // Kept alive (and dropped after the vCPUs) for the VM's whole life.
    _memory: GuestMemoryMmap,
    _vm_fd: VmFd,
    _kvm: Kvm,
}

/// The result of a run.
#[derive(Debug)]
pub struct RunOutcome {
    /// The final report.
    pub report: Report,
    /// Process exit code: 0 when every vCPU exited with code 0.
    pub exit_code: i32,
}

fn open_kvm(path: &std::path::Path) -> Result<Kvm, VmError> {
    let cpath = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| VmError::KvmMissing(path.to_path_buf()))?;
    Kvm::new_with_path(&cpath).map_err(|e| match e.errno() {
        libc::ENOENT => VmError::KvmMissing(path.to_path_buf()),
        libc::EACCES | libc::EPERM => VmError::KvmAccess(path.to_path_buf()),
        _ => VmError::KvmOpen {
            path: path.to_path_buf(),
            source: e,
        },
    })
}

/// The vcpu-exit event of a vCPU whose thread has ended.
fn vcpu_exit_event(v: &VcpuShared, uptime_ns: u64) -> ppa_vmm_api::Event {
    let (end, exit_code) = match v.end() {
        Some(VcpuEnd::Exited(code)) => (VcpuEndKind::Exited, Some(*code)),
        Some(VcpuEnd::Failed { .. }) => (VcpuEndKind::Failed, None),
        Some(VcpuEnd::Error(_)) => (VcpuEndKind::Error, None),
        Some(VcpuEnd::Stopped) | None => (VcpuEndKind::Stopped, None),
    };
    ppa_vmm_api::Event::VcpuExit {
        uptime_ns,
        vcpu: v.id,
        end,
        exit_code,
    }
}

/// TSC frequency: KVM's, or measured against CLOCK_MONOTONIC over 20 ms.
fn tsc_khz(vcpu: &VcpuFd) -> u64 {
    if let Ok(khz) = vcpu.get_tsc_khz() {
        if khz > 0 {
            return u64::from(khz);
        }
    }
    // SAFETY: rdtsc has no preconditions on x86_64.
    let (t0, c0) = (now_ns(), unsafe { core::arch::x86_64::_rdtsc() });
    std::thread::sleep(std::time::Duration::from_millis(20));
    // SAFETY: as above.
    let (t1, c1) = (now_ns(), unsafe { core::arch::x86_64::_rdtsc() });
    (c1 - c0) * 1_000_000 / (t1 - t0).max(1)
}

fn write(mem: &GuestMemoryMmap, gpa: u64, bytes: &[u8]) -> Result<(), VmError> {
    mem.write_slice(bytes, GuestAddress(gpa)).map_err(|e| {
        VmError::Memory(format!(
            "cannot write {} bytes at {gpa:#x}: {e}",
            bytes.len()
        ))
    })
}

fn setup_vcpu(fd: &VcpuFd, entry: u64, index: usize, ram: u64) -> Result<(), VmError> {
    let mut sregs = fd
        .get_sregs()
        .map_err(kvm_err("read the vCPU's special registers"))?;
    boot::setup_sregs(&mut sregs);
    fd.set_sregs(&sregs)
        .map_err(kvm_err("set the vCPU's special registers"))?;
    let regs = boot::entry_regs(
        entry,
        layout::stack_pointer(index, ram),
        layout::boot_info_gpa(index),
    );
    fd.set_regs(&regs)
        .map_err(kvm_err("set the vCPU's registers"))?;
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    fd.set_fpu(&fpu)
        .map_err(kvm_err("set the vCPU's FPU state"))?;
    Ok(())
}

impl TryFrom<VmConfig> for Vm {
    type Error = VmError;

    fn try_from(config: VmConfig) -> Result<Self, VmError> {
        config.validate()?;
        let workloads = resolve(&config.workloads, config.vcpus)?;
        let ram = config.memory_mib << 20;
        let (image_bytes, image_label): (std::borrow::Cow<[u8]>, String) = match &config.image {
            ImageSource::Tiny => (TINY_GUEST.into(), "tiny".to_string()),
            ImageSource::File(path) => (
                std::fs::read(path)
                    .map_err(|source| VmError::ReadImage {
                        path: path.clone(),
                        source,
                    })?
                    .into(),
                path.display().to_string(),
            ),
        };
        let stacks = layout::stacks_bottom(config.vcpus, ram);
        if stacks <= layout::IMAGE_MIN_GPA {
            return Err(VmError::MemoryTooSmall {
                memory_mib: config.memory_mib,
                vcpus: config.vcpus,
            });
        }
        let image = parse_elf(&image_bytes, layout::IMAGE_MIN_GPA..stacks)?;

        let kvm = open_kvm(&config.kvm_device)?;
        let max = kvm.get_max_vcpus();
        if config.vcpus > max {
            return Err(VmError::KvmVcpuLimit {
                max,
                vcpus: config.vcpus,
            });
        }
        let vm_fd = kvm.create_vm().map_err(kvm_err("create a VM"))?;
        let memory = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), ram as usize)])
            .map_err(|e| VmError::Memory(format!("cannot map {ram} bytes: {e}")))?;
        let host = memory
            .get_host_address(GuestAddress(0))
            .map_err(|e| VmError::Memory(e.to_string()))?;
        // Prefault guest RAM: a first touch from inside KVM_RUN would otherwise fault in host
        // pages under mmap_lock, and block behind any thread creating a mapping (a thread stack)
        // for milliseconds: time that is neither CPU, run-queue wait nor idle. Best effort.
        // SAFETY: `host` and `ram` describe a private anonymous mapping owned by `memory`;
        // MADV_POPULATE_WRITE only faults its pages in, it does not change their contents.
        let populated =
            unsafe { libc::madvise(host.cast(), ram as usize, libc::MADV_POPULATE_WRITE) };
        if populated != 0 {
            log::warn!(
                "cannot prefault guest memory: {}",
                std::io::Error::last_os_error()
            );
        }
        let region = kvm_userspace_memory_region {
            slot: 0,
            flags: 0,
            guest_phys_addr: 0,
            memory_size: ram,
            userspace_addr: host as u64,
        };
        // SAFETY: `host` is the start of a mapping of `ram` bytes owned by `memory`. The Vm keeps
        // `memory` until it is dropped, and the guest can only touch the slot inside KVM_RUN:
        // `run` joins every vCPU thread (and `run_raw` returns) before the Vm can be dropped.
        unsafe { vm_fd.set_user_memory_region(region) }
            .map_err(kvm_err("register guest memory"))?;

        let ppa_page = match config.ppa_page_size {
            0 => None,
            size => Some(Arc::new(PpaPage::create(
                size,
                config.vcpus,
                config.ppa_page_file.as_deref(),
            )?)),
        };
        if let Some(p) = &ppa_page {
            let region = kvm_userspace_memory_region {
                slot: 1,
                flags: 0,
                guest_phys_addr: layout::PPA_PAGE_GPA,
                memory_size: p.size(),
                userspace_addr: p.host_addr(),
            };
            // SAFETY: the region is a shared mapping of `size` bytes owned by `p`, which the
            // Vm keeps (an Arc) until after its vCPUs are joined, as for guest RAM.
            unsafe { vm_fd.set_user_memory_region(region) }
                .map_err(kvm_err("register the PPA page"))?;
        }

        for (gpa, table) in boot::page_tables() {
            let bytes: Vec<u8> = table.iter().flat_map(|e| e.to_le_bytes()).collect();
            write(&memory, gpa, &bytes)?;
        }
        write(&memory, layout::GDT_GPA, &boot::gdt())?;
        write(&memory, layout::TSS_GPA, &boot::tss())?;
        write(&memory, calibrate::STUB_GPA, &calibrate::STUB)?;
        for seg in &image.segments {
            write(&memory, seg.gpa, &image_bytes[seg.file.clone()])?;
        }

        let mut vcpus = Vec::with_capacity(config.vcpus);
        for index in 0..config.vcpus {
            let fd = vm_fd
                .create_vcpu(index as u64)
                .map_err(kvm_err("create a vCPU"))?;
            setup_vcpu(&fd, image.entry, index, ram)?;
            vcpus.push(fd);
        }
        let tsc_khz = tsc_khz(&vcpus[0]);
        let kvm_exit_cost = calibrate::exit_cost(&mut vcpus[0], 200);
        // Complete the stub's last MMIO exit (KVM finishes it on the next KVM_RUN, which
        // immediate_exit turns into an immediate return) before setting the real registers.
        vcpus[0].set_kvm_immediate_exit(1);
        let _ = vcpus[0].run();
        vcpus[0].set_kvm_immediate_exit(0);
        setup_vcpu(&vcpus[0], image.entry, 0, ram)?;
        let control = Arc::new(AccountingControl::new(
            config.accounting,
            config.thresholds,
            config.histogram_bits,
            10_000_000,
        ));
        let host_cpus = host_cpu_slots();
        let shared: Vec<Arc<VcpuShared>> = vcpus
            .iter()
            .enumerate()
            .map(|(id, fd)| {
                let meter = Arc::new(VcpuMeter::new(config.histogram_bits, host_cpus));
                let kvm = KvmStats::from_fd(fd)
                    .map_err(|e| log::warn!("vCPU {id}: no KVM statistics: {e}"))
                    .ok();
                let acct = VcpuAccounting::new(meter, kvm, kvm_exit_cost);
                Arc::new(VcpuShared::new(id, acct))
            })
            .collect();
        for (index, w) in workloads.iter().enumerate() {
            let mut info = BootInfo::new();
            info.vcpu_index = index as u32;
            info.vcpu_count = config.vcpus as u32;
            info.tsc_khz = tsc_khz;
            info.gap_threshold_ns = config.gap_threshold_ns;
            info.workload = w.to_desc();
            if let Some(p) = &ppa_page {
                info.ppa_page_gpa = layout::PPA_PAGE_GPA;
                info.ppa_page_size = p.size();
            }
            write(&memory, layout::boot_info_gpa(index), &info.to_bytes())?;
        }

        let mut mmio = Bus::new();
        mmio.insert(DOORBELL_GPA, DOORBELL_SIZE, Arc::new(Doorbells))?;
        let mut pio = Bus::new();
        pio.insert(u64::from(WORKLOAD_PIO_PORT), 4, Arc::new(WorkloadPort))?;

        let name = config
            .name
            .clone()
            .unwrap_or_else(|| format!("ppa-vmm-{}", std::process::id()));
        let hub = Arc::new(
            EventHub::new()
                .map_err(|e| VmError::Memory(format!("cannot create an eventfd: {e}")))?,
        );
        // From the limiter's decision to the vCPU's stop: the limiter's wake-up, the signal,
        // the exit out of KVM_RUN and the park. Measured here at about two exit round trips
        // plus 30 µs (docs/limits.md); the stop margin is that estimate.
        let margin_ns = kvm_exit_cost.map_or(70_000, |c| 2 * c.hot_ns + 30_000);
        let cgroup = match config.limits.backend {
            Backend::Vmm => None,
            Backend::Cgroup => Some(
                CgroupLimits::create(
                    &config.limits,
                    config.vcpus,
                    &format!(
                        "{}-{}",
                        std::process::id(),
                        VM_SEQ.fetch_add(1, Ordering::Relaxed)
                    ),
                )
                .map_err(VmError::Cgroup)?,
            ),
        };
        let limiter = Arc::new(Limiter::with_cgroup(
            &config.limits,
            shared.clone(),
            Some(Arc::clone(&hub)),
            margin_ns,
            cgroup,
        ));
        Ok(Vm {
            status: Arc::new(VmStatus::new(name)),
            hub,
            limiter,
            vcpus,
            workloads,
            info: VmInfo {
                vcpus: config.vcpus,
                memory_mib: config.memory_mib,
                image: image_label,
                tsc_khz,
                kvm_exit_cost_ns: kvm_exit_cost.map(|c| c.hot_ns),
                kvm_exit_cost_after_park_ns: kvm_exit_cost.map(|c| c.after_park_ns),
            },
            shared,
            control,
            mmio: Arc::new(mmio),
            pio: Arc::new(pio),
            max_runtime: config.max_runtime,
            overload: config.overload.clone(),
            ppa_page,
            server_options: ServerOptions {
                api_sock: config.api_sock.clone(),
                metrics_addr: config.metrics_addr,
                stats_max_age_ns: crate::api::handler::STATS_MAX_AGE_NS,
            },
            _memory: memory,
            _vm_fd: vm_fd,
            _kvm: kvm,
        })
    }
}

impl Vm {
    /// The baseline of `bench overhead`: runs vCPU 0 on this thread in a bare KVM_RUN loop with
    /// no VMM logic (no bus, no accounting, no other vCPU) until the guest writes the exit
    /// doorbell. Returns (exits, ns from the first KVM_RUN to the last return).
    pub fn run_raw(mut self) -> Result<(u64, u64), VmError> {
        let exit_gpa = DOORBELL_GPA + ppa_guest_abi::doorbell::EXIT;
        let fd = &mut self.vcpus[0];
        let mut exits = 0u64;
        let t0 = now_ns();
        loop {
            match fd.run() {
                Ok(kvm_ioctls::VcpuExit::MmioWrite(a, _)) if a == exit_gpa => break,
                Ok(_) => exits += 1,
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {}
                Err(source) => {
                    return Err(VmError::Kvm {
                        step: "run the raw benchmark loop",
                        source,
                    })
                }
            }
        }
        Ok((exits + 1, now_ns() - t0))
    }

    /// A handle on the VM's accounting for other threads.
    pub fn handle(&self) -> VmHandle {
        VmHandle {
            control: Arc::clone(&self.control),
            vcpus: self.shared.clone().into(),
            status: Arc::clone(&self.status),
            limiter: Arc::clone(&self.limiter),
            ppa_page: self.ppa_page.clone(),
        }
    }

    /// Runs every vCPU to its end and returns the final report.
    pub fn run(mut self) -> Result<RunOutcome, VmError> {
        crate::kick::install_handler().map_err(|e| VmError::Kvm {
            step: "install the vCPU kick signal handler",
            source: e,
        })?;
        let handle = self.handle();
        let server = ApiServer::start(
            self.server_options.clone(),
            handle.clone(),
            Arc::clone(&self.hub),
        )?;
        let limiter = {
            let l = Arc::clone(&self.limiter);
            std::thread::Builder::new()
                .name("limiter".into())
                .spawn(move || l.run())
                .map_err(VmError::Sampler)?
        };
        let start = Instant::now();
        let steal_at_start = host_steal_ns();
        let (done_tx, done_rx) = channel();
        let shared = std::mem::take(&mut self.shared);
        let mut handles = Vec::with_capacity(self.vcpus.len());
        let stop_all = |shared: &[Arc<VcpuShared>]| shared.iter().for_each(|s| s.kick(REQ_STOP));
        let sampler = Sampler::start(
            shared.clone(),
            Arc::clone(&self.control),
            self.overload.enabled().then(|| crate::sampler::Overload {
                config: self.overload.clone(),
                vm: handle.clone(),
                hub: Arc::clone(&self.hub),
            }),
            self.ppa_page.clone().map(|p| (p, handle.clone())),
        )
        .map_err(VmError::Sampler)?;
        let start_gate = Arc::new(std::sync::atomic::AtomicU32::new(0));
        for (s, fd) in shared.iter().zip(self.vcpus.drain(..)) {
            let spawned = vcpu::spawn(VcpuThread {
                fd,
                shared: Arc::clone(s),
                mmio: Arc::clone(&self.mmio),
                pio: Arc::clone(&self.pio),
                done: done_tx.clone(),
                control: Arc::clone(&self.control),
                start_gate: Arc::clone(&start_gate),
            });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    stop_all(&shared);
                    crate::kick::futex_wake(&start_gate);
                    sampler.stop();
                    self.limiter.stop();
                    let _ = limiter.join();
                    if let Some(s) = server {
                        s.stop();
                    }
                    handles.into_iter().for_each(|h| {
                        let _ = h.join();
                    });
                    return Err(e.into());
                }
            }
        }
        drop(done_tx);
        if let Err(e) = self.limiter.place_threads() {
            stop_all(&shared);
            crate::kick::futex_wake(&start_gate);
            handles.into_iter().for_each(|h| {
                let _ = h.join();
            });
            sampler.stop();
            self.limiter.stop();
            let _ = limiter.join();
            if let Some(s) = server {
                s.stop();
            }
            return Err(VmError::Cgroup(e));
        }
        self.status.mark_started();
        crate::kick::futex_wake(&start_gate);

        let deadline = self.max_runtime.map(|d| start + d);
        let mut timed_out = false;
        let mut stopping = false;
        let mut finished = 0;
        while finished < shared.len() {
            let got = match deadline {
                Some(d) => done_rx.recv_timeout(d.saturating_duration_since(Instant::now())),
                None => done_rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match got {
                Ok(id) => {
                    finished += 1;
                    if let Some(s) = &server {
                        s.hub()
                            .push(vcpu_exit_event(&shared[id], handle.uptime_ns()));
                    }
                    let failed = matches!(
                        shared[id].end(),
                        Some(VcpuEnd::Failed { .. } | VcpuEnd::Error(_))
                    );
                    if failed && !stopping {
                        log::warn!("vCPU {id} failed: stopping the other vCPUs");
                        stopping = true;
                        stop_all(&shared);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    if !timed_out {
                        log::warn!("maximum run time reached: stopping every vCPU");
                        timed_out = true;
                        stop_all(&shared);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
            if timed_out {
                // Every vCPU has been kicked; wait for the rest without a deadline.
                for _ in finished..shared.len() {
                    match done_rx.recv() {
                        Ok(id) => {
                            if let Some(s) = &server {
                                s.hub()
                                    .push(vcpu_exit_event(&shared[id], handle.uptime_ns()));
                            }
                        }
                        Err(_) => break,
                    }
                }
                break;
            }
        }
        for h in handles {
            let _ = h.join();
        }
        sampler.stop();
        self.limiter.stop();
        let _ = limiter.join();
        self.status.mark_finished();
        let uptime_ns = start.elapsed().as_nanos() as u64;
        // Every vCPU thread has exited: the process CPU clock includes them, and each published
        // its own CPU time on its way out.
        let vcpu_cpu: u64 = shared
            .iter()
            .filter_map(|s| s.acct.finals.get().map(|f| f.cpu_ns))
            .sum();
        let host_threads_ns = process_cpu_ns().saturating_sub(vcpu_cpu);
        let host_steal_ns = steal_at_start
            .zip(host_steal_ns())
            .map(|(a, b)| b.saturating_sub(a));
        let report = Report::build(
            &self.info,
            &self.workloads,
            &shared,
            crate::report::RunFacts {
                uptime_ns,
                timed_out,
                shutdown: handle.shutdown_requested(),
                host_threads_ns,
                host_steal_ns,
                level: self.control.level(),
            },
        );
        let mut report = report;
        report.groups = self.limiter.groups();
        report.guest = self.ppa_page.as_ref().map(|p| p.guest_view());
        let exit_code = report.exit_code();
        if let Some(s) = server {
            s.hub().push(ppa_vmm_api::Event::VmExit {
                uptime_ns,
                end: report.vm.end,
            });
            s.stop();
        }
        Ok(RunOutcome { report, exit_code })
    }
}
