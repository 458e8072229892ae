//! A VM: built from a [`VmConfig`] (`Vm::try_from`, or [`Vm::build`] on any hypervisor), run to
//! the end ([`Vm::run`], in [`run`]).
//!
//! A build is a short sequence of named steps: check the config → prepare the payload against
//! the RAM layout (read and check its image, resolve its workloads) → measure the exit cost on
//! a scratch VM → create the VM → map RAM and the PPA page into it, slot by slot → create the
//! vCPUs → load the payload (memory, registers, devices on the buses) → set up the per-vCPU
//! accounting → set up the limiter. Each step is a function below; none knows a payload's
//! protocol. The `Vm` is generic over the hypervisor (KVM by default; a fake one in tests) so
//! that its vCPU loops are statically dispatched.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use thiserror::Error;

use crate::accounting::meter::{host_cpu_slots, VcpuMeter};
use crate::accounting::snapshot::VcpuAccounting;
use crate::accounting::switches::events::{TraceCatalog, TraceError};
use crate::accounting::AccountingControl;
use crate::api::ServerOptions;
use crate::arch::x86_64::layout::{ppa_page_region, ram_regions, Region};
use crate::config::{ConfigError, VmConfig};
use crate::devices::Buses;
use crate::event_hub::EventHub;
use crate::handle::{VmHandle, VmStatus};
use crate::hypervisor::kvm::Kvm;
use crate::hypervisor::{self as hv, ExitCost, HvError, Hypervisor, Vm as _};
use crate::limits::cgroup::CgroupLimits;
use crate::limits::limiter::{Backend, Limiter};
use crate::memory::{map_region, GuestRam, MemoryError, SlotAllocator};
use crate::payload::{Boot, Load, PayloadError};
use crate::placement::PlacementBoard;
use crate::ppa_page::PpaPage;
use crate::report::{Report, VmInfo};
use crate::sync::now_ns;
use crate::vcpu::{VcpuError, VcpuShared};

mod devices;
mod run;

/// Numbers the VMs of this process (names their cgroups apart).
static VM_SEQ: AtomicU64 = AtomicU64::new(0);

/// Why a VM could not be built or run.
#[derive(Debug, Error)]
pub enum VmError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The payload cannot boot in this VM.
    #[error(transparent)]
    Payload(#[from] PayloadError),
    /// The hypervisor refused.
    #[error(transparent)]
    Hypervisor(#[from] HvError),
    /// The hypervisor allows fewer vCPUs.
    #[error("the hypervisor on this host allows at most {max} vCPUs per VM, not {vcpus}")]
    VcpuLimit {
        /// Host limit.
        max: usize,
        /// Requested.
        vcpus: usize,
    },
    /// Guest memory could not be made or mapped.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// The PPA page does not fit its place in the memory map.
    #[error("a PPA page of {0} bytes does not fit its place in the memory map")]
    PpaPageTooLarge(u64),
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
    /// A helper thread could not be started.
    #[error("cannot start the {0} thread")]
    Thread(&'static str, #[source] std::io::Error),
    /// A network device could not be made.
    #[error(transparent)]
    Net(#[from] crate::devices::net::NetError),
    /// A disk could not be made.
    #[error(transparent)]
    Blk(#[from] crate::devices::blk::BlkError),
    /// The threads could not be put on their CPUs.
    #[error(transparent)]
    Place(#[from] crate::handle::PlaceError),
}

/// A VM ready to run, on hypervisor `H`.
pub struct Vm<H: Hypervisor = Kvm> {
    status: Arc<VmStatus>,
    hub: Arc<EventHub>,
    limiter: Arc<Limiter>,
    placement: Arc<PlacementBoard>,
    vcpus: Vec<<H::Vm as hv::Vm>::Vcpu>,
    shared: Vec<Arc<VcpuShared>>,
    control: Arc<AccountingControl>,
    boot: Boot,
    buses: Arc<Buses>,
    devices: Vec<Arc<dyn crate::devices::Device>>,
    info: VmInfo,
    max_runtime: Option<std::time::Duration>,
    server_options: ServerOptions,
    overload: crate::limits::overload::OverloadConfig,
    ppa_page: Option<Arc<PpaPage>>,
    seccomp: crate::seccomp::Mode,
    /// systemd's readiness socket, when the VMM runs under `Type=notify`.
    notifier: Option<crate::notify::Notifier>,
    // Dropped last, in this order: the hypervisor's VM (after its vCPUs above), then the
    // memory it maps, then the hypervisor.
    hv_vm: H::Vm,
    _ram: GuestRam,
    _hv: H,
}

/// The result of a run.
#[derive(Debug)]
pub struct RunOutcome {
    /// The final report.
    pub report: Report,
    /// Process exit code: 0 when every vCPU exited with code 0.
    pub exit_code: i32,
}

impl TryFrom<VmConfig> for Vm<Kvm> {
    type Error = VmError;

    /// Builds the VM on KVM, opened at the config's device node.
    fn try_from(config: VmConfig) -> Result<Self, VmError> {
        let kvm = Kvm::open(&config.kvm_device)?;
        Vm::build(config, kvm)
    }
}

/// The hypervisor's VM, checked to allow `vcpus` vCPUs.
fn create_vm<H: Hypervisor>(hv: &H, vcpus: usize) -> Result<H::Vm, VmError> {
    let max = hv.max_vcpus();
    if vcpus > max {
        return Err(VmError::VcpuLimit { max, vcpus });
    }
    Ok(hv.create_vm()?)
}

/// Maps RAM (`regions`, backed as `config` says and prefaulted when it asks) into `vm`.
fn map_ram<V: hv::Vm>(
    vm: &V,
    slots: &mut SlotAllocator,
    regions: &[Region],
    config: &VmConfig,
) -> Result<GuestRam, VmError> {
    let ram = GuestRam::create(regions, config.prefault, &config.memory_backing)?;
    // SAFETY: the returned `GuestRam` is kept by the `Vm` in a field dropped after the
    // hypervisor's VM and every vCPU (see the field order of `Vm`).
    unsafe { ram.register(vm, slots) }?;
    Ok(ram)
}

/// The PPA page of `size` bytes (none when 0), mapped into `vm` at its place outside RAM.
fn map_ppa_page<V: hv::Vm>(
    vm: &V,
    slots: &mut SlotAllocator,
    config: &VmConfig,
) -> Result<Option<Arc<PpaPage>>, VmError> {
    if config.ppa_page_size == 0 {
        return Ok(None);
    }
    let page = Arc::new(PpaPage::create(
        config.ppa_page_size,
        config.vcpus,
        config.ppa_page_file.as_deref(),
    )?);
    page.board()
        .set_metrics_threads(config.guest_metrics_threads);
    let region =
        ppa_page_region(page.size()).ok_or(VmError::PpaPageTooLarge(config.ppa_page_size))?;
    // SAFETY: the page's mapping is owned by the `PpaPage`, which the `Vm` keeps (an Arc, also
    // held by handles) at least until after the hypervisor's VM is dropped.
    unsafe { map_region(vm, slots, region, page.host_addr()) }?;
    Ok(Some(page))
}

fn create_vcpus<V: hv::Vm>(vm: &V, n: usize) -> Result<Vec<V::Vcpu>, VmError> {
    (0..n)
        .map(|i| vm.create_vcpu(i).map_err(VmError::from))
        .collect()
}

/// The VM's placement, checked (a rule naming a vCPU or device it lacks, or a CPU outside
/// the process's allowed set, and a NUMA node that does not exist, are refused here, before
/// anything is mapped), with the node's CPUs for the threads no rule names.
fn placement(config: &VmConfig) -> Result<Arc<PlacementBoard>, VmError> {
    let original = crate::placement::allowed();
    let devices: Vec<(String, usize)> = config
        .net
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let id = n.id.clone().unwrap_or_else(|| format!("net{i}"));
            (id, usize::from(n.queues))
        })
        .chain(config.disks.iter().enumerate().map(|(i, d)| {
            // A disk's threads take its device's rule (`blk0`); it has no queue pairs.
            let id = d.id.clone().unwrap_or_else(|| format!("blk{i}"));
            (id, 0)
        }))
        .collect();
    let mut p = config.placement.clone();
    p.check(config.vcpus, &devices, &original)
        .map_err(ConfigError::from)?;
    if let Some(node) = config.memory_backing.numa_node {
        p.node_cpus =
            Some(crate::placement::node_cpus(node, &original).map_err(ConfigError::from)?);
    }
    Ok(Arc::new(PlacementBoard::new(
        p,
        original,
        config.vcpus,
        devices,
    )))
}

/// TSC frequency: the hypervisor's, or measured against CLOCK_MONOTONIC over 20 ms.
fn tsc_khz<V: hv::Vcpu>(vcpu: &V) -> u64 {
    if let Some(khz) = vcpu.tsc_khz() {
        return khz;
    }
    // SAFETY: rdtsc has no preconditions on x86_64.
    let (t0, c0) = (now_ns(), unsafe { core::arch::x86_64::_rdtsc() });
    std::thread::sleep(std::time::Duration::from_millis(20));
    // SAFETY: as above.
    let (t1, c1) = (now_ns(), unsafe { core::arch::x86_64::_rdtsc() });
    (c1 - c0) * 1_000_000 / (t1 - t0).max(1)
}

/// One [`VcpuShared`] per vCPU, with its meter and the hypervisor's statistics for it.
fn accounting<V: hv::Vcpu>(
    vcpus: &[V],
    histogram_bits: u8,
    exit_cost: Option<ExitCost>,
) -> Vec<Arc<VcpuShared>> {
    let host_cpus = host_cpu_slots();
    vcpus
        .iter()
        .enumerate()
        .map(|(id, v)| {
            let meter = Arc::new(VcpuMeter::new(histogram_bits, host_cpus));
            let acct = VcpuAccounting::new(meter, v.stats(), exit_cost);
            Arc::new(VcpuShared::new(id, acct))
        })
        .collect()
}

/// The limiter, with the cgroup backend when configured.
fn limiter(
    config: &VmConfig,
    shared: &[Arc<VcpuShared>],
    hub: &Arc<EventHub>,
    exit_cost: Option<ExitCost>,
) -> Result<Arc<Limiter>, VmError> {
    // From the limiter's decision to the vCPU's stop: the limiter's wake-up, the signal,
    // the exit out of the guest and the park. Measured here at about two exit round trips
    // plus 30 µs (docs/limits.md); the stop margin is that estimate.
    let margin_ns = exit_cost.map_or(70_000, |c| 2 * c.hot_ns + 30_000);
    let cgroup = match config.limits.backend {
        Backend::Vmm => None,
        Backend::Cgroup => {
            let name = format!(
                "{}-{}",
                std::process::id(),
                VM_SEQ.fetch_add(1, Ordering::Relaxed)
            );
            Some(
                CgroupLimits::create(&config.limits, config.vcpus, &name)
                    .map_err(VmError::Cgroup)?,
            )
        }
    };
    Ok(Arc::new(Limiter::with_cgroup(
        &config.limits,
        shared.to_vec(),
        Some(Arc::clone(hub)),
        margin_ns,
        cgroup,
    )))
}

/// KVM's exit cost: from the calibration cache when the config names one, else measured.
fn measured_exit_cost<H: Hypervisor>(hv: &H, config: &VmConfig) -> Option<ExitCost> {
    match &config.calibration_cache {
        Some(file) => crate::calibration_cache::exit_cost(file, || hv.exit_cost()),
        None => hv.exit_cost(),
    }
}

/// The VM's accounting control at the config's level, thresholds and histogram resolution,
/// with the kernel tracepoints discovered (before any thread drops its privileges: tracefs is
/// root's) unless the config turns them off.
fn accounting_control(config: &VmConfig) -> Arc<AccountingControl> {
    let trace = if config.kernel_trace {
        TraceCatalog::discover()
    } else {
        TraceCatalog::unavailable(|| TraceError::Disabled)
    };
    Arc::new(
        AccountingControl::new(
            config.accounting,
            config.thresholds,
            config.histogram_bits,
            10_000_000,
        )
        .with_trace(trace),
    )
}

impl<H: Hypervisor> Vm<H> {
    /// Builds the VM of `config` on `hv`.
    pub fn build(config: VmConfig, hv: H) -> Result<Self, VmError> {
        config.validate()?;
        if config.payload.is_kernel() {
            if let Some(why) = hv.cannot_boot_kernels() {
                return Err(PayloadError::HostCannotBoot(why).into());
            }
        }
        let placement = placement(&config)?;
        let regions = ram_regions(config.memory_mib << 20);
        let page = (config.ppa_page_size > 0)
            .then(|| ppa_page_region(config.ppa_page_size))
            .flatten();
        let virtio = devices::virtio_slots(&config)?;
        let boot = Boot::prepare(&config.payload, config.vcpus, &regions, page, &virtio)?;
        let exit_cost = measured_exit_cost(&hv, &config);
        let hv_vm = create_vm(&hv, config.vcpus)?;
        let cpuid = if boot.needs_platform() {
            hv_vm.create_platform()?;
            hv.supported_cpuid()?
        } else {
            Vec::new()
        };
        let mut slots = SlotAllocator::default();
        let ram = map_ram(&hv_vm, &mut slots, &regions, &config)?;
        let ppa_page = map_ppa_page(&hv_vm, &mut slots, &config)?;
        let vcpus = create_vcpus(&hv_vm, config.vcpus)?;
        let tsc_khz = tsc_khz(&vcpus[0]);
        let mut buses = Buses::new(config.vcpus);
        boot.load(&mut Load {
            memory: ram.memory(),
            tsc_khz,
            ppa_page: ppa_page.as_ref().and_then(|p| ppa_page_region(p.size())),
            cpuid,
            vm: &hv_vm,
            vcpus: &vcpus,
            buses: &mut buses,
        })?;
        let devices = devices::build(
            devices::Build {
                config: &config,
                vm: &hv_vm,
                memory: ram.memory(),
                slots: &virtio,
                interrupts: boot.needs_platform(),
            },
            &mut buses,
        )?;
        devices::register_ioevents(&hv_vm, &buses);
        let shared = accounting(&vcpus, config.histogram_bits, exit_cost);
        let control = accounting_control(&config);
        let hub = Arc::new(EventHub::new().map_err(|e| VmError::Thread("event hub", e))?);
        let limiter = limiter(&config, &shared, &hub, exit_cost)?;
        limiter.set_devices(devices.clone());
        let name = config
            .name
            .clone()
            .unwrap_or_else(|| format!("ppa-vmm-{}", std::process::id()));
        Ok(Vm {
            status: Arc::new(VmStatus::new(name).with_vcpu_names(config.vcpu_names)),
            hub,
            limiter,
            info: VmInfo {
                vcpus: config.vcpus,
                memory_mib: config.memory_mib,
                image: boot.label(),
                tsc_khz,
                kvm_exit_cost_ns: exit_cost.map(|c| c.hot_ns),
                kvm_exit_cost_after_park_ns: exit_cost.map(|c| c.after_park_ns),
                kvm_exit_cost_after_long_park_ns: exit_cost.map(|c| c.after_long_park_ns),
                memory: crate::report::MemoryInfo {
                    page_size: config.memory_backing.page,
                    numa_node: config.memory_backing.numa_node,
                },
                pins: config.placement.texts(),
            },
            placement,
            vcpus,
            shared,
            control,
            boot,
            buses: Arc::new(buses),
            devices,
            max_runtime: config.max_runtime,
            server_options: ServerOptions {
                api_sock: config.api_sock.clone(),
                metrics_addr: config.metrics_addr,
                stats_max_age_ns: crate::api::handler::STATS_MAX_AGE_NS,
                limits: config.client_limits,
            },
            overload: config.overload.clone(),
            ppa_page,
            seccomp: config.seccomp,
            notifier: None,
            hv_vm,
            _ram: ram,
            _hv: hv,
        })
    }

    /// A handle on the VM's accounting for other threads.
    pub fn handle(&self) -> VmHandle {
        VmHandle::new(
            Arc::clone(&self.control),
            self.shared.clone(),
            Arc::clone(&self.status),
            Arc::clone(&self.limiter),
            self.ppa_page.clone(),
        )
        .with_devices(self.devices.clone())
        .with_placement(Arc::clone(&self.placement))
    }

    /// Sends systemd's readiness messages through `n` (`READY=1` once every vCPU runs and
    /// the control socket answers, `STOPPING=1` at the end).
    pub fn set_notifier(&mut self, n: crate::notify::Notifier) {
        self.notifier = Some(n);
    }

    /// The hypervisor's VM (tests inspect the fake one).
    pub fn hypervisor_vm(&self) -> &H::Vm {
        &self.hv_vm
    }
}

#[cfg(test)]
mod tests;
