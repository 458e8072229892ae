//! KVM binary statistics (`KVM_GET_STATS_FD`): the kernel's own per-vCPU (or per-VM) counters.
//!
//! This module owns the statistics file descriptor that `KVM_GET_STATS_FD` returns for a vCPU
//! (or VM) fd, and the parsed layout of that file (header, id string, descriptors, data block;
//! see the `KVM_GET_STATS_FD` section of the kernel's `Documentation/virt/kvm/api.rst`).
//!
//! Data flow: a [`KvmStats`] is opened once per vCPU right after the vCPU is created
//! ([`KvmStats::from_fd`]); that reads the header and descriptors once and keeps the
//! [`StatsLayout`]. Afterwards, readers (reports, live views) and the vCPU thread at its end call
//! [`KvmStats::read_scalars`] (or [`KvmStats::read_map`] for reports), which `pread`s only the
//! data block, so a `KvmStats` has no seek state and can be shared between threads. Values are
//! the kernel's raw counters since the vCPU was created; deltas since a reset are computed by the
//! caller from a baseline it keeps. Histogram statistics (`size > 1`) are described in the layout
//! but not read by the scalar readers.
//!
//! The backend hands a [`KvmStats`] to the rest of the VMM only as a
//! [`VcpuStats`](crate::hypervisor::stats::VcpuStats) (it is the [`StatsSource`] behind it), so
//! the accounting reads names, kinds and values without a KVM type.
//!
//! [`StatsLayout::parse`] is pure parsing of untrusted bytes: every offset, size and count is
//! checked with checked arithmetic and bounded, and garbage yields an error, never a panic.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

use kvm_bindings::{
    KVM_STATS_TYPE_CUMULATIVE, KVM_STATS_TYPE_INSTANT, KVM_STATS_TYPE_LINEAR_HIST,
    KVM_STATS_TYPE_LOG_HIST, KVM_STATS_TYPE_MASK, KVM_STATS_TYPE_PEAK, KVM_STATS_TYPE_SHIFT,
    KVM_STATS_UNIT_BOOLEAN, KVM_STATS_UNIT_BYTES, KVM_STATS_UNIT_CYCLES, KVM_STATS_UNIT_MASK,
    KVM_STATS_UNIT_NONE, KVM_STATS_UNIT_SECONDS, KVM_STATS_UNIT_SHIFT,
};

use crate::hypervisor::stats::{KnownStat, StatKind, StatsError, StatsSource};

/// The ioctl number, in a private module so the macro's `pub fn` stays crate-internal.
mod ioctls {
    use kvm_bindings::KVMIO;
    use vmm_sys_util::ioctl_io_nr;

    ioctl_io_nr!(KVM_GET_STATS_FD, KVMIO, 0xce);
}

/// Size in bytes of `struct kvm_stats_header`.
const HEADER_SIZE: usize = std::mem::size_of::<kvm_bindings::kvm_stats_header>();
/// Size in bytes of `struct kvm_stats_desc` without its trailing name.
const DESC_FIXED_SIZE: usize = std::mem::size_of::<kvm_bindings::kvm_stats_desc>();
/// Largest accepted `name_size` (the kernel uses 48).
pub const MAX_NAME_SIZE: u32 = 1024;
/// Largest accepted `num_desc` (a vCPU has a few dozen).
pub const MAX_NUM_DESC: u32 = 4096;
/// Largest accepted header-plus-descriptors prefix and data block, in bytes; bounds what
/// [`KvmStats`] allocates for a hostile or corrupted layout (real ones are a few KiB).
pub const MAX_BLOCK_LEN: u64 = 16 << 20;

/// An error opening, parsing or reading KVM binary statistics.
#[derive(Debug, thiserror::Error)]
pub enum KvmStatsError {
    /// The `KVM_GET_STATS_FD` ioctl failed (for instance, the kernel does not support it).
    #[error("KVM_GET_STATS_FD failed")]
    Ioctl(#[source] std::io::Error),
    /// Reading the statistics file failed or it ended early.
    #[error("reading the KVM statistics file failed")]
    Read(#[source] std::io::Error),
    /// The header, id or descriptors are inconsistent.
    #[error("the KVM statistics file is malformed: {0}")]
    Malformed(String),
    /// The output slice given to [`KvmStats::read_scalars`] is shorter than the scalar count.
    #[error("the output slice holds {got} values but there are {needed} scalar statistics")]
    OutputTooShort {
        /// [`KvmStats::scalar_count`].
        needed: usize,
        /// The length of the slice given.
        got: usize,
    },
}

/// The type of a statistic (`flags` bits 0-3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvmStatType {
    /// A counter that only grows.
    Cumulative,
    /// A current value that may go up and down.
    Instant,
    /// The highest value seen.
    Peak,
    /// A histogram with `bucket_size`-wide buckets.
    LinearHist,
    /// A histogram with power-of-two buckets.
    LogHist,
    /// A type this code does not know, with its raw value.
    Unknown(u32),
}

impl KvmStatType {
    fn from_flags(flags: u32) -> Self {
        match (flags & KVM_STATS_TYPE_MASK) >> KVM_STATS_TYPE_SHIFT {
            KVM_STATS_TYPE_CUMULATIVE => Self::Cumulative,
            KVM_STATS_TYPE_INSTANT => Self::Instant,
            KVM_STATS_TYPE_PEAK => Self::Peak,
            KVM_STATS_TYPE_LINEAR_HIST => Self::LinearHist,
            KVM_STATS_TYPE_LOG_HIST => Self::LogHist,
            other => Self::Unknown(other),
        }
    }
}

/// The unit of a statistic (`flags` bits 4-7); scaled by `10^exponent` (or `2^exponent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatUnit {
    /// A plain count.
    None,
    /// Bytes.
    Bytes,
    /// Seconds.
    Seconds,
    /// CPU cycles.
    Cycles,
    /// 0 or 1.
    Boolean,
    /// A unit this code does not know, with its raw value (shifted down to 0-15).
    Unknown(u32),
}

impl StatUnit {
    fn from_flags(flags: u32) -> Self {
        // The KVM_STATS_UNIT_* constants are already shifted into place.
        match flags & KVM_STATS_UNIT_MASK {
            KVM_STATS_UNIT_NONE => Self::None,
            KVM_STATS_UNIT_BYTES => Self::Bytes,
            KVM_STATS_UNIT_SECONDS => Self::Seconds,
            KVM_STATS_UNIT_CYCLES => Self::Cycles,
            KVM_STATS_UNIT_BOOLEAN => Self::Boolean,
            other => Self::Unknown(other >> KVM_STATS_UNIT_SHIFT),
        }
    }
}

/// One decoded statistics descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatDesc {
    /// The statistic's name, e.g. `exits` or `halt_wait_ns`.
    pub name: String,
    /// Its type.
    pub kind: KvmStatType,
    /// Its unit.
    pub unit: StatUnit,
    /// The power (of 10, or of 2 for base-2 statistics) that scales a value into `unit`.
    pub exponent: i16,
    /// The number of `u64` values (1 for a scalar, the bucket count for a histogram).
    pub size: u16,
    /// The byte offset of its values from the start of the data block.
    pub offset: u32,
    /// The bucket width of a linear histogram (0 otherwise).
    pub bucket_size: u32,
}

/// The parsed layout of a stats file, built once; pure parsing, unit-testable on synthetic bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsLayout {
    /// The id string, e.g. `kvm-1234/vcpu-0`.
    pub id: String,
    /// Every descriptor, in file order.
    pub descs: Vec<StatDesc>,
    /// The file offset of the data block.
    pub data_offset: u64,
    /// The number of bytes from `data_offset` that covers every descriptor's values.
    pub data_len: usize,
}

/// The decoded and validated header.
#[derive(Debug, Clone, Copy)]
struct Header {
    name_size: usize,
    num_desc: usize,
    id_offset: usize,
    desc_offset: usize,
    data_offset: u64,
    /// Bytes from file offset 0 to the end of the id string and descriptors, whichever is later.
    prefix_len: usize,
}

fn malformed(what: impl Into<String>) -> KvmStatsError {
    KvmStatsError::Malformed(what.into())
}

/// `N` bytes at `at`, or an error naming `what` when `bytes` is too short.
fn field<const N: usize>(bytes: &[u8], at: usize, what: &str) -> Result<[u8; N], KvmStatsError> {
    at.checked_add(N)
        .and_then(|end| bytes.get(at..end))
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| malformed(format!("{what} is truncated")))
}

fn u32_at(bytes: &[u8], at: usize, what: &str) -> Result<u32, KvmStatsError> {
    field::<4>(bytes, at, what).map(u32::from_ne_bytes)
}

/// Converts a bounded `u64` to `usize`.
fn to_usize(v: u64, what: &str) -> Result<usize, KvmStatsError> {
    usize::try_from(v).map_err(|_| malformed(format!("{what} does not fit in memory")))
}

/// Decodes a NUL-terminated name that fills a `name_size` field.
fn c_name(raw: &[u8], what: &str) -> Result<String, KvmStatsError> {
    let len = raw
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| malformed(format!("{what} is not NUL-terminated")))?;
    Ok(String::from_utf8_lossy(&raw[..len]).into_owned())
}

impl Header {
    /// Decodes and validates the header in the first [`HEADER_SIZE`] bytes.
    fn decode(bytes: &[u8]) -> Result<Self, KvmStatsError> {
        if bytes.len() < HEADER_SIZE {
            return Err(malformed(format!(
                "the header needs {HEADER_SIZE} bytes but {} were given",
                bytes.len()
            )));
        }
        // Offsets per struct kvm_stats_header: flags, name_size, num_desc, id_offset,
        // desc_offset, data_offset; `flags` is reserved and ignored.
        let name_size = u32_at(bytes, 4, "the header")?;
        let num_desc = u32_at(bytes, 8, "the header")?;
        let id_offset = u32_at(bytes, 12, "the header")?;
        let desc_offset = u32_at(bytes, 16, "the header")?;
        let data_offset = u32_at(bytes, 20, "the header")?;
        if name_size == 0 || name_size > MAX_NAME_SIZE {
            return Err(malformed(format!(
                "the header's name size {name_size} is outside 1..={MAX_NAME_SIZE}"
            )));
        }
        if num_desc > MAX_NUM_DESC {
            return Err(malformed(format!(
                "the header's descriptor count {num_desc} exceeds {MAX_NUM_DESC}"
            )));
        }
        let desc_size = u64::from(name_size) + DESC_FIXED_SIZE as u64;
        let id_end = u64::from(id_offset) + u64::from(name_size);
        let desc_end = u64::from(num_desc)
            .checked_mul(desc_size)
            .and_then(|len| len.checked_add(u64::from(desc_offset)))
            .ok_or_else(|| malformed("the descriptor block's end overflows"))?;
        let prefix_len = id_end.max(desc_end).max(HEADER_SIZE as u64);
        if prefix_len > MAX_BLOCK_LEN {
            return Err(malformed(format!(
                "the id and descriptors end at byte {prefix_len}, beyond {MAX_BLOCK_LEN}"
            )));
        }
        Ok(Self {
            name_size: to_usize(name_size.into(), "the name size")?,
            num_desc: to_usize(num_desc.into(), "the descriptor count")?,
            id_offset: to_usize(id_offset.into(), "the id offset")?,
            desc_offset: to_usize(desc_offset.into(), "the descriptor offset")?,
            data_offset: data_offset.into(),
            prefix_len: to_usize(prefix_len, "the descriptor block")?,
        })
    }
}

impl StatsLayout {
    /// Parses a stats file's content from offset 0 up to at least the end of the id string
    /// and the descriptors (the data block need not be present).
    ///
    /// Every offset, size and count is checked: names must be NUL-terminated within
    /// `name_size` (invalid UTF-8 is replaced), `name_size` is bounded by [`MAX_NAME_SIZE`],
    /// `num_desc` by [`MAX_NUM_DESC`], and the data block by [`MAX_BLOCK_LEN`]. Descriptors of
    /// size 0 are kept (they have no values). Garbage yields [`KvmStatsError::Malformed`].
    pub fn parse(bytes: &[u8]) -> Result<Self, KvmStatsError> {
        let h = Header::decode(bytes)?;
        if bytes.len() < h.prefix_len {
            return Err(malformed(format!(
                "the id and descriptors end at byte {} but only {} bytes were given",
                h.prefix_len,
                bytes.len()
            )));
        }
        // In bounds: prefix_len covers id_offset + name_size and bytes.len() >= prefix_len.
        let id_raw = bytes
            .get(h.id_offset..h.id_offset + h.name_size)
            .ok_or_else(|| malformed("the id string is truncated"))?;
        let id = c_name(id_raw, "the id string")?;
        let desc_size = DESC_FIXED_SIZE + h.name_size;
        let mut descs = Vec::with_capacity(h.num_desc);
        let mut data_end: u64 = 0;
        for i in 0..h.num_desc {
            // Cannot overflow: i * desc_size + desc_offset <= prefix_len <= MAX_BLOCK_LEN.
            let at = h.desc_offset + i * desc_size;
            let what = format!("descriptor {i}");
            let raw = bytes
                .get(at..at + desc_size)
                .ok_or_else(|| malformed(format!("{what} is truncated")))?;
            // Offsets per struct kvm_stats_desc: flags, exponent, size, offset, bucket_size,
            // name.
            let flags = u32_at(raw, 0, &what)?;
            let exponent = i16::from_ne_bytes(field::<2>(raw, 4, &what)?);
            let size = u16::from_ne_bytes(field::<2>(raw, 6, &what)?);
            let offset = u32_at(raw, 8, &what)?;
            let bucket_size = u32_at(raw, 12, &what)?;
            let name = c_name(&raw[DESC_FIXED_SIZE..], &format!("the name of {what}"))?;
            // At most 2^32 + 2^19: no overflow in u64.
            let end = u64::from(offset) + u64::from(size) * 8;
            data_end = data_end.max(end);
            descs.push(StatDesc {
                name,
                kind: KvmStatType::from_flags(flags),
                unit: StatUnit::from_flags(flags),
                exponent,
                size,
                offset,
                bucket_size,
            });
        }
        if data_end > MAX_BLOCK_LEN {
            return Err(malformed(format!(
                "the data block is {data_end} bytes long, beyond {MAX_BLOCK_LEN}"
            )));
        }
        // data_offset < 2^32 and data_end <= MAX_BLOCK_LEN: the end fits a file offset (i64).
        Ok(Self {
            id,
            descs,
            data_offset: h.data_offset,
            data_len: to_usize(data_end, "the data block")?,
        })
    }

    /// Indices (into `descs`) of the scalar statistics (`size == 1`), in file order.
    fn scalar_indices(&self) -> Vec<usize> {
        self.descs
            .iter()
            .enumerate()
            .filter(|(_, d)| d.size == 1)
            .map(|(i, _)| i)
            .collect()
    }
}

/// An open stats fd with its layout. Reads use `pread` (no seek state), so reads take `&self`
/// and the struct can be shared (it is `Send + Sync`) between a sampler thread and readers.
#[derive(Debug)]
pub struct KvmStats {
    file: File,
    layout: StatsLayout,
    /// Indices into `layout.descs` of the descriptors with `size == 1`.
    scalars: Vec<usize>,
    /// Scalar index of each statistic the accounting reads at every sample, found once.
    known: [Option<usize>; KnownStat::ALL.len()],
}

/// The name in KVM's binary statistics of a statistic the accounting reads at every sample.
pub fn kvm_name(k: KnownStat) -> &'static str {
    match k {
        KnownStat::Exits => "exits",
        KnownStat::HaltExits => "halt_exits",
        KnownStat::HaltWaitNs => "halt_wait_ns",
        KnownStat::Blocking => "blocking",
    }
}

impl KvmStats {
    /// Issues `KVM_GET_STATS_FD` on a vCPU (or VM) fd, reads the header, then the id and
    /// descriptors, and parses them. The returned value owns the new stats fd.
    pub fn from_fd(fd: &impl AsRawFd) -> Result<Self, KvmStatsError> {
        // SAFETY: KVM_GET_STATS_FD is an _IO ioctl: it takes no argument and writes no user
        // memory, so the only requirement is a valid fd, which `fd: &impl AsRawFd` borrows
        // for the duration of the call. The return value is checked below.
        let ret = unsafe { vmm_sys_util::ioctl::ioctl(fd, ioctls::KVM_GET_STATS_FD()) };
        if ret < 0 {
            return Err(KvmStatsError::Ioctl(std::io::Error::last_os_error()));
        }
        // SAFETY: `ret` is a non-negative fd the kernel has just created for this call; nothing
        // else in the process knows or owns it, so `OwnedFd` may take sole ownership and close
        // it on drop.
        let owned = unsafe { OwnedFd::from_raw_fd(ret) };
        Self::from_stats_file(File::from(owned))
    }

    /// Reads and parses the layout of an already-open stats file.
    fn from_stats_file(file: File) -> Result<Self, KvmStatsError> {
        let mut head = [0u8; HEADER_SIZE];
        file.read_exact_at(&mut head, 0)
            .map_err(KvmStatsError::Read)?;
        let h = Header::decode(&head)?;
        let mut prefix = vec![0u8; h.prefix_len];
        file.read_exact_at(&mut prefix, 0)
            .map_err(KvmStatsError::Read)?;
        let layout = StatsLayout::parse(&prefix)?;
        let scalars = layout.scalar_indices();
        let mut s = Self {
            file,
            layout,
            scalars,
            known: [None; KnownStat::ALL.len()],
        };
        s.known = KnownStat::ALL.map(|k| s.scalar_index(kvm_name(k)));
        Ok(s)
    }

    /// Scalar index of a known statistic (None if this kernel has no such statistic).
    pub fn known_index(&self, k: KnownStat) -> Option<usize> {
        self.known[k as usize]
    }

    /// How scalar `i` accumulates (None past the last scalar).
    pub fn scalar_kind(&self, i: usize) -> Option<KvmStatType> {
        self.scalars.get(i).map(|&d| self.layout.descs[d].kind)
    }

    /// The parsed layout (every descriptor, including histograms).
    #[cfg(test)]
    pub fn layout(&self) -> &StatsLayout {
        &self.layout
    }

    /// Names of the scalar statistics (size == 1), in the order `read_scalars` fills.
    pub fn scalar_names(&self) -> impl Iterator<Item = &str> {
        self.scalars
            .iter()
            .map(|&i| self.layout.descs[i].name.as_str())
    }

    /// The number of scalar statistics: the length `read_scalars` needs.
    #[cfg(test)]
    pub fn scalar_count(&self) -> usize {
        self.scalars.len()
    }

    /// Index (into the scalar order) of a scalar stat by name.
    pub fn scalar_index(&self, name: &str) -> Option<usize> {
        self.scalar_names().position(|n| n == name)
    }

    /// Reads every scalar's current value into `out[..scalar_count()]` (`out` may be longer;
    /// the rest is left alone) with one `pread` of the data block into `scratch`. `scratch`
    /// is resized to the data block on the first call and reused after, so a call with a
    /// reused `scratch` does not allocate.
    pub fn read_scalars(
        &self,
        scratch: &mut Vec<u8>,
        out: &mut [u64],
    ) -> Result<(), KvmStatsError> {
        if out.len() < self.scalars.len() {
            return Err(KvmStatsError::OutputTooShort {
                needed: self.scalars.len(),
                got: out.len(),
            });
        }
        let len = self.layout.data_len;
        if scratch.len() < len {
            scratch.resize(len, 0);
        }
        let block = &mut scratch[..len];
        self.file
            .read_exact_at(block, self.layout.data_offset)
            .map_err(KvmStatsError::Read)?;
        for (slot, &i) in out.iter_mut().zip(&self.scalars) {
            // parse() made offset + size * 8 <= data_len for every descriptor.
            let at = self.layout.descs[i].offset as usize;
            *slot = u64::from_ne_bytes(field::<8>(block, at, "a statistic's value")?);
        }
        Ok(())
    }

    /// Convenience for reports: (name, value) of every scalar, in scalar order (allocates).
    #[cfg(test)]
    pub fn read_map(&self) -> Result<Vec<(String, u64)>, KvmStatsError> {
        let mut scratch = Vec::new();
        let mut values = vec![0u64; self.scalars.len()];
        self.read_scalars(&mut scratch, &mut values)?;
        Ok(self.scalar_names().map(str::to_owned).zip(values).collect())
    }
}

impl StatsSource for KvmStats {
    fn scalars(&self) -> Vec<(String, StatKind)> {
        self.scalar_names()
            .enumerate()
            .map(|(i, name)| {
                let kind = match self.scalar_kind(i) {
                    Some(KvmStatType::Cumulative) => StatKind::Cumulative,
                    _ => StatKind::Current,
                };
                (name.to_string(), kind)
            })
            .collect()
    }

    fn known_index(&self, k: KnownStat) -> Option<usize> {
        KvmStats::known_index(self, k)
    }

    fn read(&self, scratch: &mut Vec<u8>, out: &mut [u64]) -> Result<(), StatsError> {
        self.read_scalars(scratch, out)
            .map_err(|e| StatsError(Box::new(e)))
    }
}

#[cfg(test)]
mod tests;
