//! The VM as Firecracker's API and config file describe it before the start, checked as each
//! resource arrives (Firecracker's semantics: a bad value is refused at its `PUT`, not at
//! `InstanceStart`), and its translation into our own [`RunOptions`], the one place where
//! Firecracker's words become ours.
//!
//! Data flow: `PUT`/`PATCH` bodies and the `--config-file` sections come in as
//! [`super::model`] types → [`Resources`]' setters check them against what PPA-VMM can do (a
//! refusal is a [`ResourceError`], whose sentence becomes the `fault_message`) and keep them
//! → at `InstanceStart` (or at once with `--config-file`), [`Resources::to_run_options`]
//! lays them over the options of `--ppa-config` → the binary's `run` path builds the VM from
//! those like `ppa-vmm run` does. Each device kind has its one translation function:
//! [`net_spec`] (`--net`) and [`disk_spec`] (`--disk`).

use std::io::Read;
use std::path::{Path, PathBuf};

use ppa_vmm::config::{RunOptions, MAX_VCPUS};
use ppa_vmm::devices::blk::spec::DiskSpec;
use ppa_vmm::devices::net::spec::NetSpec;
use ppa_vmm::payload::tiny::workload::Assignment;
use thiserror::Error;

use super::model::{
    BootSource, Drive, FullVmConfig, HugePages, Logger, MachineConfig, MachineConfigUpdate,
    Metrics, NetworkInterface, RateLimiter,
};

/// The most network interfaces a VM may have (the memory map has 16 virtio windows).
const MAX_NETS: usize = 16;

/// Why a resource was refused: each message is the `fault_message` a client reads.
#[derive(Debug, Error)]
pub enum ResourceError {
    /// vCPU count out of range.
    #[error(
        "Machine config error: the number of vCPUs must be between 1 and {MAX_VCPUS}, not {0}."
    )]
    VcpuCount(u16),
    /// Memory size out of range.
    #[error("Machine config error: {0}.")]
    Memory(String),
    /// SMT asked for.
    #[error("Machine config error: smt cannot be enabled: PPA-VMM gives every vCPU a host thread of its own and shows the guest no SMT siblings, so each vCPU's time is its own (send smt false).")]
    Smt,
    /// Dirty page tracking asked for.
    #[error("Machine config error: track_dirty_pages cannot be enabled: PPA-VMM takes no snapshots, so there are no dirty pages to track (send track_dirty_pages false).")]
    DirtyPages,
    /// Transparent huge pages asked for.
    #[error("Machine config error: huge_pages \"Transparent\" is not supported: PPA-VMM backs guest memory with 4 KiB pages or with 2 MiB hugetlb pages reserved at the start, never with transparent huge pages, which the kernel may split or not give (send huge_pages \"2M\" or \"None\").")]
    TransparentHugePages,
    /// 2 MiB pages asked for a memory size that is not whole pages.
    #[error("Machine config error: huge_pages \"2M\" needs mem_size_mib to be a multiple of 2, and it is {0} (send an even mem_size_mib).")]
    HugePagesSize(u64),
    /// A CPU template asked for.
    #[error("Machine config error: cpu_template {0:?} is not supported: PPA-VMM passes the host's CPUID through unchanged (send no cpu_template, or \"None\").")]
    CpuTemplate(String),
    /// The kernel cannot be read.
    #[error("Boot source error: the kernel file {path} cannot be opened: {source}.")]
    Kernel {
        /// Path.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The initrd cannot be read.
    #[error("Boot source error: the initrd file {path} cannot be opened: {source}.")]
    Initrd {
        /// Path.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// An initrd with a tiny guest.
    #[error("Boot source error: {0} is a tiny-guest image, which takes no initrd.")]
    TinyInitrd(String),
    /// A bad `ppa.workload=` word for a tiny guest.
    #[error("Boot source error: boot_args word `{word}` is not a tiny-guest workload: {why}.")]
    Workload {
        /// The word.
        word: String,
        /// What is wrong with it.
        why: String,
    },
    /// A bad network interface.
    #[error("Network interface error: {0}.")]
    Net(String),
    /// A rate limiter update the device refused (`PATCH` after the start).
    #[error("Rate limiter error: {id}: {why}.")]
    RateUpdate {
        /// The interface or drive.
        id: String,
        /// Why.
        why: String,
    },
    /// Two interfaces with one MAC.
    #[error("Network interface error: the guest MAC address {0} is already in use.")]
    MacInUse(String),
    /// One interface too many.
    #[error("Network interface error: a VM has room for {MAX_NETS} network interfaces.")]
    TooManyNets,
    /// A drive that cannot be a `--disk`.
    #[error("Drive config error: drive {id}: {why}.")]
    Drive {
        /// The drive's id.
        id: String,
        /// Why.
        why: String,
    },
    /// A second root device.
    #[error("Drive config error: a root block device already exists (drive {0}); a VM has one.")]
    SecondRoot(String),
    /// `PATCH /drives` after the start.
    #[error("Drive config error: drive {0}: PPA-VMM cannot swap a drive's file while the VM runs (its rate limiter it can); stop the VM and start it with the new file.")]
    DriveSwap(String),
    /// A drive `PATCH` names none of the VM's.
    #[error("Drive config error: the VM has no drive {0}.")]
    NoSuchDrive(String),
    /// A config-file section PPA-VMM does not have.
    #[error("The config file's `{0}` section is not supported: {why}.", why = unsupported_why(.0))]
    Section(&'static str),
    /// The config file cannot be read.
    #[error("Cannot read the config file {path}: {source}.")]
    ReadFile {
        /// Path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The config file is not Firecracker's layout.
    #[error("The config file {path} is not valid: {source}.")]
    ParseFile {
        /// Path.
        path: PathBuf,
        /// Cause.
        source: serde_json::Error,
    },
    /// `InstanceStart` before `PUT /boot-source`.
    #[error("Start microvm error: Cannot start microvm without kernel configuration.")]
    NoKernel,
}

/// Why a Firecracker feature is not in PPA-VMM (shared by the config file's sections and the
/// API's endpoints).
pub fn unsupported_why(what: &str) -> &'static str {
    match what {
        "vsock" => "vsock is not there yet in PPA-VMM; the guest has no vsock device",
        "balloon" => "PPA-VMM has no balloon device: guest memory is fixed at the start",
        "mmds-config" | "mmds" => "PPA-VMM has no metadata service (MMDS)",
        "entropy" => "PPA-VMM has no virtio-rng device",
        "cpu-config" => "PPA-VMM passes the host's CPUID through unchanged, without templates",
        "pmem" => "PPA-VMM has no virtio-pmem device",
        "memory-hotplug" | "hotplug" => "guest memory is fixed at the start",
        "snapshot" => "PPA-VMM takes no snapshots",
        "serial" => "the guest's console goes to the VMM's stderr",
        _ => "PPA-VMM does not have it",
    }
}

/// What a kernel image file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelKind {
    /// A tiny-guest ELF (every loadable segment below 4 GiB).
    Tiny,
    /// A Linux kernel: a bzImage, or an ELF vmlinux linked at the kernel's higher half.
    Linux,
}

/// The kind of the image whose first bytes are `head` (its first 4 KiB or more): a bzImage
/// has `HdrS` at 0x202; an ELF whose program headers (within `head`) load anything at or
/// above 4 GiB is a Linux vmlinux; any other ELF is taken as a tiny guest, whose loader then
/// checks it strictly. Anything else is handed to the Linux loader, which says what is wrong.
pub fn kernel_kind(head: &[u8]) -> KernelKind {
    if head.get(0x202..0x206) == Some(b"HdrS") || head.get(..4) != Some(b"\x7fELF") {
        return KernelKind::Linux;
    }
    let u64_at = |o: usize| {
        head.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
    };
    let u16_at = |o: usize| {
        head.get(o..o + 2)
            .map(|b| u16::from_le_bytes(b.try_into().unwrap_or_default()))
    };
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return KernelKind::Linux;
    };
    let high = (0..usize::from(phnum)).any(|i| {
        let at = (phoff as usize).saturating_add(i * usize::from(phentsize));
        let loadable = head.get(at..at + 4) == Some(&1u32.to_le_bytes()[..]);
        // p_vaddr is at offset 16 of an Elf64_Phdr.
        loadable && u64_at(at + 16).is_none_or(|vaddr| vaddr >= 1 << 32)
    });
    if high {
        KernelKind::Linux
    } else {
        KernelKind::Tiny
    }
}

/// The first 64 KiB of the file at `path` (enough for an ELF's program headers).
fn read_head(path: &str) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::new();
    std::fs::File::open(path)?
        .take(64 << 10)
        .read_to_end(&mut head)?;
    Ok(head)
}

/// The tiny guest's workloads in `boot_args`: each `ppa.workload=SPEC` word is a
/// `--workload SPEC`; other words (a Linux command line's) are ignored, since a tiny guest
/// has no command line.
pub fn tiny_workloads(boot_args: &str) -> Result<Vec<String>, ResourceError> {
    boot_args
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("ppa.workload=").map(|spec| (w, spec)))
        .map(|(word, spec)| {
            Assignment::parse(spec)
                .map(|_| spec.to_string())
                .map_err(|e| ResourceError::Workload {
                    word: word.chars().take(200).collect(),
                    why: ppa_vmm_api::describe(&e),
                })
        })
        .collect()
}

/// A Firecracker rate limiter as `rate=` buckets (`PREFIXbytes:SIZE/REFILLms[:burst=N]` and
/// `PREFIXOPS:…`); buckets of size or refill time 0 limit nothing (Firecracker's rule).
pub fn rate_buckets(limiter: Option<&RateLimiter>, prefix: &str, ops: &str) -> Vec<String> {
    let Some(l) = limiter else {
        return Vec::new();
    };
    [("bytes", &l.bandwidth), (ops, &l.ops)]
        .into_iter()
        .filter_map(|(kind, b)| {
            let b = b.as_ref().filter(|b| b.limits())?;
            let burst = b
                .one_time_burst
                .filter(|n| *n > 0)
                .map_or(String::new(), |n| format!(":burst={n}"));
            Some(format!(
                "{prefix}{kind}:{}/{}ms{burst}",
                b.size, b.refill_time
            ))
        })
        .collect()
}

/// The `--net` value of an interface: `tap=HOST_DEV,id=IFACE_ID[,mac=MAC][,mtu=MTU]
/// [,rate=BUCKETS]`, checked as `--net` checks it. Each limiter's bandwidth bucket limits the
/// frames' bytes and its ops bucket the frames (docs/firecracker.md).
pub fn net_spec(iface: &NetworkInterface) -> Result<String, ResourceError> {
    let mut spec = format!("tap={},id={}", iface.host_dev_name, iface.iface_id);
    if let Some(mac) = &iface.guest_mac {
        spec.push_str(&format!(",mac={mac}"));
    }
    if let Some(mtu) = iface.mtu {
        spec.push_str(&format!(",mtu={mtu}"));
    }
    let mut rate = rate_buckets(iface.rx_rate_limiter.as_ref(), "rx-", "packets");
    rate.extend(rate_buckets(
        iface.tx_rate_limiter.as_ref(),
        "tx-",
        "packets",
    ));
    if !rate.is_empty() {
        spec.push_str(&format!(",rate={}", rate.join("+")));
    }
    NetSpec::parse(&spec).map_err(|e| ResourceError::Net(ppa_vmm_api::describe(&e)))?;
    Ok(spec)
}

/// The `--disk` value of a drive: `path=PATH_ON_HOST,id=DRIVE_ID[,readonly=on][,rate=…]`,
/// checked as `--disk` checks it, the file opened as the VM will open it (Firecracker refuses
/// a file it cannot open at the `PUT`). `io_engine` `Sync` and `Async` both mean our one
/// thread per queue; `cache_type` `Unsafe` and `Writeback` both get a device that offers
/// FLUSH and honours it (`fdatasync`), the safer of the two; the rate limiter's bandwidth
/// bucket limits the requests' data bytes, its ops bucket the requests. Refused with a
/// sentence: a vhost-user `socket`, another cache type or engine, a path with a comma.
pub fn disk_spec(drive: &Drive) -> Result<String, ResourceError> {
    let refuse = |why: String| ResourceError::Drive {
        id: drive.drive_id.chars().take(64).collect(),
        why,
    };
    if drive.socket.is_some() {
        return Err(refuse(
            "vhost-user block devices are not there in PPA-VMM; give path_on_host".into(),
        ));
    }
    if let Some(c) = drive
        .cache_type
        .as_deref()
        .filter(|c| !matches!(*c, "Unsafe" | "Writeback"))
    {
        return Err(refuse(format!(
            "the cache type {:?} is not one of Unsafe and Writeback",
            c.chars().take(64).collect::<String>()
        )));
    }
    if let Some(e) = drive
        .io_engine
        .as_deref()
        .filter(|e| !matches!(*e, "Sync" | "Async"))
    {
        return Err(refuse(format!(
            "the I/O engine {:?} is not one of Sync and Async",
            e.chars().take(64).collect::<String>()
        )));
    }
    // It goes on the guest's command line: a UUID's characters only.
    let uuid_char = |c: char| c.is_ascii_hexdigit() || c == '-';
    if let Some(u) = drive
        .partuuid
        .as_deref()
        .filter(|u| u.is_empty() || u.len() > 64 || !u.chars().all(uuid_char))
    {
        return Err(refuse(format!(
            "the partuuid {:?} is not a partition UUID (hex digits and dashes)",
            u.chars().take(64).collect::<String>()
        )));
    }
    let Some(path) = drive.path_on_host.as_deref() else {
        return Err(refuse("it has no path_on_host".into()));
    };
    if path.contains(',') {
        return Err(refuse(
            "a path_on_host with a comma cannot be given to --disk; link the file under another name".into(),
        ));
    }
    let readonly = drive.is_read_only.unwrap_or(false);
    let mut spec = format!("path={path},id={}", drive.drive_id);
    if readonly {
        spec.push_str(",readonly=on");
    }
    let rate = rate_buckets(drive.rate_limiter.as_ref(), "", "ops");
    if !rate.is_empty() {
        spec.push_str(&format!(",rate={}", rate.join("+")));
    }
    DiskSpec::parse(&spec).map_err(|e| refuse(ppa_vmm_api::describe(&e)))?;
    std::fs::OpenOptions::new()
        .read(true)
        .write(!readonly)
        .open(path)
        .map_err(|e| refuse(format!("cannot open {path}: {e}")))?;
    Ok(spec)
}

/// The root device's words for a Linux command line, as Firecracker adds them:
/// `root=/dev/vda` (the root drive is the first disk) or `root=PARTUUID=…`, and `ro` or `rw`.
fn root_args(drive: &Drive) -> String {
    let root = match &drive.partuuid {
        Some(u) => format!("root=PARTUUID={u}"),
        None => "root=/dev/vda".into(),
    };
    let mode = if drive.is_read_only.unwrap_or(false) {
        "ro"
    } else {
        "rw"
    };
    format!("{root} {mode}")
}

/// The VM before the start, as Firecracker's resources describe it.
#[derive(Debug, Clone, Default)]
pub struct Resources {
    /// vCPUs and memory.
    pub machine: MachineConfig,
    /// What boots, and whether it is a tiny guest or Linux.
    pub boot: Option<(BootSource, KernelKind)>,
    /// Network interfaces, in the order first given.
    pub nets: Vec<NetworkInterface>,
    /// Drives (none until virtio-blk is there).
    pub drives: Vec<Drive>,
    /// The logger, as configured.
    pub logger: Option<Logger>,
    /// The metrics file, as configured.
    pub metrics: Option<Metrics>,
}

/// Checks a whole machine config.
fn check_machine(m: &MachineConfig) -> Result<(), ResourceError> {
    if m.vcpu_count == 0 || usize::from(m.vcpu_count) > MAX_VCPUS {
        return Err(ResourceError::VcpuCount(m.vcpu_count));
    }
    let config = ppa_vmm::config::VmConfig {
        memory_mib: m.mem_size_mib,
        ..Default::default()
    };
    if let Err(e) = config.validate() {
        return Err(ResourceError::Memory(e.to_string()));
    }
    if m.smt {
        return Err(ResourceError::Smt);
    }
    if m.track_dirty_pages {
        return Err(ResourceError::DirtyPages);
    }
    match m.huge_pages {
        HugePages::None => {}
        HugePages::Transparent => return Err(ResourceError::TransparentHugePages),
        HugePages::Hugetlbfs2M if m.mem_size_mib % 2 != 0 => {
            return Err(ResourceError::HugePagesSize(m.mem_size_mib));
        }
        // Mapped to `--memory-backing hugepages=2M` at the start, which reads the pool then.
        HugePages::Hugetlbfs2M => {}
    }
    match m.cpu_template.as_deref() {
        None | Some("None") => Ok(()),
        Some(t) => Err(ResourceError::CpuTemplate(t.chars().take(64).collect())),
    }
}

impl Resources {
    /// `PUT /machine-config`: the whole config, unset fields at their defaults.
    pub fn put_machine(&mut self, m: MachineConfig) -> Result<(), ResourceError> {
        check_machine(&m)?;
        self.machine = m;
        Ok(())
    }

    /// `PATCH /machine-config`: the fields given, over the current config.
    pub fn patch_machine(&mut self, u: MachineConfigUpdate) -> Result<(), ResourceError> {
        let c = &self.machine;
        let m = MachineConfig {
            vcpu_count: u.vcpu_count.unwrap_or(c.vcpu_count),
            mem_size_mib: u.mem_size_mib.unwrap_or(c.mem_size_mib),
            smt: u.smt.unwrap_or(c.smt),
            cpu_template: u.cpu_template.or_else(|| c.cpu_template.clone()),
            track_dirty_pages: u.track_dirty_pages.unwrap_or(c.track_dirty_pages),
            huge_pages: u.huge_pages.unwrap_or(c.huge_pages),
        };
        self.put_machine(m)
    }

    /// `PUT /boot-source`: the kernel (and initrd) must open, as Firecracker checks; a
    /// tiny-guest image's `ppa.workload=` words must parse.
    pub fn put_boot(&mut self, b: BootSource) -> Result<(), ResourceError> {
        let head = read_head(&b.kernel_image_path).map_err(|source| ResourceError::Kernel {
            path: b.kernel_image_path.clone(),
            source,
        })?;
        let kind = kernel_kind(&head);
        if let Some(initrd) = &b.initrd_path {
            if kind == KernelKind::Tiny {
                return Err(ResourceError::TinyInitrd(b.kernel_image_path.clone()));
            }
            std::fs::File::open(initrd).map_err(|source| ResourceError::Initrd {
                path: initrd.clone(),
                source,
            })?;
        }
        if kind == KernelKind::Tiny {
            tiny_workloads(b.boot_args.as_deref().unwrap_or_default())?;
        }
        self.boot = Some((b, kind));
        Ok(())
    }

    /// `PUT /network-interfaces/{id}`: added, or replacing the interface of that id.
    pub fn put_net(&mut self, iface: NetworkInterface) -> Result<(), ResourceError> {
        net_spec(&iface)?;
        if let Some(mac) = &iface.guest_mac {
            let taken = self.nets.iter().any(|n| {
                n.iface_id != iface.iface_id
                    && n.guest_mac.as_deref().map(str::to_ascii_lowercase)
                        == Some(mac.to_ascii_lowercase())
            });
            if taken {
                return Err(ResourceError::MacInUse(mac.clone()));
            }
        }
        match self.nets.iter().position(|n| n.iface_id == iface.iface_id) {
            Some(i) => self.nets[i] = iface,
            None if self.nets.len() >= MAX_NETS => return Err(ResourceError::TooManyNets),
            None => self.nets.push(iface),
        }
        Ok(())
    }

    /// `PUT /drives/{id}`: added, or replacing the drive of that id ([`disk_spec`]); one
    /// root device at most.
    pub fn put_drive(&mut self, drive: Drive) -> Result<(), ResourceError> {
        disk_spec(&drive)?;
        if drive.is_root_device {
            if let Some(other) = self
                .drives
                .iter()
                .find(|d| d.is_root_device && d.drive_id != drive.drive_id)
            {
                return Err(ResourceError::SecondRoot(other.drive_id.clone()));
            }
        }
        match self
            .drives
            .iter_mut()
            .find(|d| d.drive_id == drive.drive_id)
        {
            Some(d) => *d = drive,
            None => self.drives.push(drive),
        }
        Ok(())
    }

    /// The resources of a `--config-file` (Firecracker's layout), each section checked as
    /// its `PUT` would be; sections PPA-VMM does not have are refused by name.
    pub fn from_config_file(path: &Path) -> Result<(Resources, FullVmConfig), ResourceError> {
        let read = |source| ResourceError::ReadFile {
            path: path.to_path_buf(),
            source,
        };
        let mut text = String::new();
        std::fs::File::open(path)
            .map_err(read)?
            .take(ppa_vmm::config::MAX_CONFIG_BYTES)
            .read_to_string(&mut text)
            .map_err(read)?;
        let file: FullVmConfig =
            serde_json::from_str(&text).map_err(|source| ResourceError::ParseFile {
                path: path.to_path_buf(),
                source,
            })?;
        let unsupported = [
            ("balloon", file.balloon.is_some()),
            ("cpu-config", file.cpu_config.is_some()),
            ("mmds-config", file.mmds_config.is_some()),
            ("vsock", file.vsock.is_some()),
            ("entropy", file.entropy.is_some()),
            ("pmem", !file.pmem.is_empty()),
            ("memory-hotplug", file.memory_hotplug.is_some()),
        ];
        if let Some((name, _)) = unsupported.iter().find(|(_, given)| *given) {
            return Err(ResourceError::Section(name));
        }
        let mut r = Resources::default();
        if let Some(m) = file.machine_config.clone() {
            r.put_machine(m)?;
        }
        match file.boot_source.clone() {
            Some(b) => r.put_boot(b)?,
            None => return Err(ResourceError::NoKernel),
        }
        for n in file.network_interfaces.clone() {
            r.put_net(n)?;
        }
        for d in file.drives.clone() {
            r.put_drive(d)?;
        }
        r.logger = file.logger.clone();
        r.metrics = file.metrics.clone();
        Ok((r, file))
    }

    /// What `GET /vm/config` answers: every resource as given.
    pub fn full_config(&self) -> FullVmConfig {
        FullVmConfig {
            drives: self.drives.clone(),
            boot_source: self.boot.as_ref().map(|(b, _)| b.clone()),
            logger: self.logger.clone(),
            machine_config: Some(self.machine.clone()),
            metrics: self.metrics.clone(),
            network_interfaces: self.nets.clone(),
            ..Default::default()
        }
    }

    /// The run options of this VM: Firecracker's resources laid over `base` (the options of
    /// `--ppa-config`, for what Firecracker has no words for: limits, accounting, a report).
    pub fn to_run_options(&self, base: RunOptions) -> Result<RunOptions, ResourceError> {
        let (boot, kind) = self.boot.as_ref().ok_or(ResourceError::NoKernel)?;
        let mut o = base;
        o.vcpus = Some(usize::from(self.machine.vcpu_count));
        o.memory_mib = Some(self.machine.mem_size_mib);
        if self.machine.huge_pages == HugePages::Hugetlbfs2M {
            o.memory_backing = Some("hugepages=2M".into());
        }
        let image = PathBuf::from(&boot.kernel_image_path);
        match kind {
            KernelKind::Tiny => {
                o.guest = None;
                o.kernel = None;
                o.tiny_image = Some(image);
                o.workload.extend(tiny_workloads(
                    boot.boot_args.as_deref().unwrap_or_default(),
                )?);
            }
            KernelKind::Linux => {
                o.guest = None;
                o.tiny_image = None;
                o.kernel = Some(image);
                o.initrd = boot.initrd_path.as_ref().map(PathBuf::from);
                o.cmdline = boot.boot_args.clone();
            }
        }
        o.net = self.nets.iter().map(net_spec).collect::<Result<_, _>>()?;
        // The root device first (`/dev/vda`), the others in the order given.
        let mut drives: Vec<&Drive> = self.drives.iter().collect();
        drives.sort_by_key(|d| !d.is_root_device);
        o.disk = drives
            .iter()
            .map(|d| disk_spec(d))
            .collect::<Result<_, _>>()?;
        let root = drives.first().filter(|d| d.is_root_device);
        if let (KernelKind::Linux, Some(root)) = (*kind, root) {
            // Words the boot args already have are theirs (the kernel would take the last).
            let args = o.cmdline.take().unwrap_or_default();
            let has_root = args.split_whitespace().any(|w| w.starts_with("root="));
            o.cmdline = Some(if has_root {
                args
            } else {
                format!("{args} {}", root_args(root)).trim().to_string()
            });
        }
        Ok(o)
    }
}
