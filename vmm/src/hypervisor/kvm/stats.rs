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
mod tests {
    use super::*;

    const NAME_SIZE: usize = 48;

    /// Builds a stats file: header, id, descriptors, data (values `base + k`).
    /// Each entry is (flags, exponent, size, name); offsets are packed in order.
    fn build(id: &str, descs: &[(u32, i16, u16, &str)], base: u64) -> Vec<u8> {
        let id_offset = HEADER_SIZE;
        let desc_offset = id_offset + NAME_SIZE;
        let desc_size = DESC_FIXED_SIZE + NAME_SIZE;
        let data_offset = desc_offset + descs.len() * desc_size;
        let mut f = Vec::new();
        for v in [
            0u32,
            NAME_SIZE as u32,
            descs.len() as u32,
            id_offset as u32,
            desc_offset as u32,
            data_offset as u32,
        ] {
            f.extend_from_slice(&v.to_ne_bytes());
        }
        let name = |s: &str, f: &mut Vec<u8>| {
            let mut raw = [0u8; NAME_SIZE];
            raw[..s.len()].copy_from_slice(s.as_bytes());
            f.extend_from_slice(&raw);
        };
        name(id, &mut f);
        let mut offset = 0u32;
        for &(flags, exponent, size, n) in descs {
            f.extend_from_slice(&flags.to_ne_bytes());
            f.extend_from_slice(&exponent.to_ne_bytes());
            f.extend_from_slice(&size.to_ne_bytes());
            f.extend_from_slice(&offset.to_ne_bytes());
            f.extend_from_slice(&0u32.to_ne_bytes());
            name(n, &mut f);
            offset += u32::from(size) * 8;
        }
        assert_eq!(f.len(), data_offset);
        for k in 0..u64::from(offset / 8) {
            f.extend_from_slice(&(base + k).to_ne_bytes());
        }
        f
    }

    fn sample_descs() -> Vec<(u32, i16, u16, &'static str)> {
        vec![
            (
                KVM_STATS_TYPE_CUMULATIVE | KVM_STATS_UNIT_NONE,
                0,
                1,
                "exits",
            ),
            (
                KVM_STATS_TYPE_LOG_HIST | KVM_STATS_UNIT_SECONDS,
                -9,
                32,
                "halt_poll_success_hist",
            ),
            (
                KVM_STATS_TYPE_CUMULATIVE | KVM_STATS_UNIT_SECONDS,
                -9,
                1,
                "halt_wait_ns",
            ),
        ]
    }

    fn sample() -> Vec<u8> {
        build("kvm-1/vcpu-0", &sample_descs(), 100)
    }

    #[test]
    fn parse_synthetic_file() {
        let f = sample();
        let l = StatsLayout::parse(&f).unwrap();
        assert_eq!(l.id, "kvm-1/vcpu-0");
        assert_eq!(l.data_offset, (HEADER_SIZE + NAME_SIZE + 3 * 64) as u64);
        assert_eq!(l.data_len, 34 * 8);
        assert_eq!(
            l.descs[0],
            StatDesc {
                name: "exits".into(),
                kind: KvmStatType::Cumulative,
                unit: StatUnit::None,
                exponent: 0,
                size: 1,
                offset: 0,
                bucket_size: 0,
            }
        );
        assert_eq!(l.descs[1].name, "halt_poll_success_hist");
        assert_eq!(l.descs[1].kind, KvmStatType::LogHist);
        assert_eq!(l.descs[1].unit, StatUnit::Seconds);
        assert_eq!(l.descs[1].exponent, -9);
        assert_eq!(l.descs[1].size, 32);
        assert_eq!(l.descs[1].offset, 8);
        assert_eq!(l.descs[2].name, "halt_wait_ns");
        assert_eq!(l.descs[2].offset, 33 * 8);
        assert_eq!(l.scalar_indices(), vec![0, 2]);
        // Only the prefix is needed.
        assert_eq!(StatsLayout::parse(&f[..l.data_offset as usize]).unwrap(), l);
    }

    #[test]
    fn flags_decode() {
        assert_eq!(
            KvmStatType::from_flags(KVM_STATS_TYPE_INSTANT),
            KvmStatType::Instant
        );
        assert_eq!(
            KvmStatType::from_flags(KVM_STATS_TYPE_PEAK),
            KvmStatType::Peak
        );
        assert_eq!(
            KvmStatType::from_flags(KVM_STATS_TYPE_LINEAR_HIST),
            KvmStatType::LinearHist
        );
        assert_eq!(KvmStatType::from_flags(9), KvmStatType::Unknown(9));
        assert_eq!(StatUnit::from_flags(KVM_STATS_UNIT_BYTES), StatUnit::Bytes);
        assert_eq!(
            StatUnit::from_flags(KVM_STATS_UNIT_CYCLES),
            StatUnit::Cycles
        );
        assert_eq!(
            StatUnit::from_flags(KVM_STATS_UNIT_BOOLEAN),
            StatUnit::Boolean
        );
        assert_eq!(StatUnit::from_flags(0x70), StatUnit::Unknown(7));
        // Base bits are ignored by kind and unit.
        assert_eq!(
            StatUnit::from_flags(kvm_bindings::KVM_STATS_BASE_POW2 | KVM_STATS_UNIT_BYTES),
            StatUnit::Bytes
        );
    }

    /// Reads a synthetic file through the same pread path as a real stats fd.
    #[test]
    fn read_scalars_from_file() {
        let path = std::env::temp_dir().join(format!("ppa-kvm-stats-{}", std::process::id()));
        std::fs::write(&path, sample()).unwrap();
        let file = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let s = KvmStats::from_stats_file(file).unwrap();
        assert_eq!(
            s.scalar_names().collect::<Vec<_>>(),
            ["exits", "halt_wait_ns"]
        );
        assert_eq!(s.scalar_count(), 2);
        assert_eq!(s.scalar_index("halt_wait_ns"), Some(1));
        assert_eq!(s.known_index(KnownStat::HaltWaitNs), Some(1));
        assert_eq!(s.known_index(KnownStat::Exits), Some(0));
        assert_eq!(s.known_index(KnownStat::HaltExits), None);
        assert_eq!(s.scalar_kind(1), Some(s.layout().descs[s.scalars[1]].kind));
        assert_eq!(s.scalar_kind(2), None);
        assert_eq!(s.scalar_index("halt_poll_success_hist"), None);
        let mut scratch = Vec::new();
        let mut out = [0u64; 3];
        s.read_scalars(&mut scratch, &mut out).unwrap();
        assert_eq!(out, [100, 133, 0]);
        let cap = scratch.capacity();
        s.read_scalars(&mut scratch, &mut out).unwrap();
        assert_eq!(scratch.capacity(), cap);
        assert!(matches!(
            s.read_scalars(&mut scratch, &mut out[..1]),
            Err(KvmStatsError::OutputTooShort { needed: 2, got: 1 })
        ));
        assert_eq!(
            s.read_map().unwrap(),
            vec![
                ("exits".to_string(), 100),
                ("halt_wait_ns".to_string(), 133)
            ]
        );
    }

    #[test]
    fn truncated_file_is_an_error() {
        let f = sample();
        let prefix = f.len() - 34 * 8;
        for len in 0..prefix {
            assert!(
                matches!(
                    StatsLayout::parse(&f[..len]),
                    Err(KvmStatsError::Malformed(_))
                ),
                "len {len}"
            );
        }
        for len in prefix..=f.len() {
            StatsLayout::parse(&f[..len]).unwrap();
        }
    }

    /// Overwrites the header field at byte `at` with `v`.
    fn patched(f: &[u8], at: usize, v: u32) -> Vec<u8> {
        let mut f = f.to_vec();
        f[at..at + 4].copy_from_slice(&v.to_ne_bytes());
        f
    }

    #[test]
    fn bad_header_fields_are_errors() {
        // Only the header, id and descriptors, so that a descriptor past them is truncated.
        let mut f = sample();
        f.truncate(f.len() - 34 * 8);
        let cases = [
            (4, 0),                 // name_size 0
            (4, MAX_NAME_SIZE + 1), // name_size huge
            (4, u32::MAX),          // name_size max
            (4, 47),                // name_size off by one: names shift, NUL lost or truncated
            (8, MAX_NUM_DESC + 1),  // num_desc huge
            (8, u32::MAX),          // num_desc max
            (8, 4),                 // one descriptor past the end
            (12, f.len() as u32),   // id past the end
            (12, u32::MAX),         // id offset max
            (16, f.len() as u32),   // descriptors past the end
            (16, u32::MAX - 10),    // descriptor offset max
        ];
        for (at, v) in cases {
            let r = StatsLayout::parse(&patched(&f, at, v));
            assert!(
                matches!(r, Err(KvmStatsError::Malformed(_))),
                "{at} {v}: {r:?}"
            );
        }
        // A name without NUL.
        let mut g = f.clone();
        let name = HEADER_SIZE + NAME_SIZE + DESC_FIXED_SIZE;
        g[name..name + NAME_SIZE].fill(b'a');
        assert!(StatsLayout::parse(&g).is_err());
        // Invalid UTF-8 is replaced, not rejected.
        let mut g = f.clone();
        g[name] = 0xff;
        assert_eq!(
            StatsLayout::parse(&g).unwrap().descs[0].name,
            "\u{fffd}xits"
        );
        // A descriptor whose values end beyond MAX_BLOCK_LEN.
        let offset = HEADER_SIZE + NAME_SIZE + 8;
        let r = StatsLayout::parse(&patched(&f, offset, u32::MAX));
        assert!(matches!(r, Err(KvmStatsError::Malformed(_))), "{r:?}");
        // data_offset is not checked against the prefix (the data block need not be present),
        // but a huge one still parses to an in-range layout.
        let l = StatsLayout::parse(&patched(&f, 20, u32::MAX)).unwrap();
        assert_eq!(l.data_offset, u64::from(u32::MAX));
    }

    /// A small xorshift generator: deterministic garbage without a dependency.
    fn xorshift(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut st = 0x9e37_79b9_7f4a_7c15u64;
        let f = sample();
        for round in 0..20_000 {
            let bytes: Vec<u8> = if round % 2 == 0 {
                // Pure garbage, with small plausible header values half the time.
                let len = (xorshift(&mut st) % 600) as usize;
                let mut b: Vec<u8> = (0..len).map(|_| xorshift(&mut st) as u8).collect();
                if round % 4 == 0 && b.len() >= HEADER_SIZE {
                    for at in (4..HEADER_SIZE).step_by(4) {
                        let v = (xorshift(&mut st) % 300) as u32;
                        b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
                    }
                }
                b
            } else {
                // A valid file with a few bytes flipped and maybe cut.
                let mut b = f.clone();
                for _ in 0..1 + xorshift(&mut st) % 4 {
                    let at = (xorshift(&mut st) as usize) % b.len();
                    b[at] = xorshift(&mut st) as u8;
                }
                let len = (xorshift(&mut st) as usize) % (b.len() + 1);
                b.truncate(len.max(b.len() / 2));
                b
            };
            if let Ok(l) = StatsLayout::parse(&bytes) {
                for d in &l.descs {
                    assert!(d.offset as usize + d.size as usize * 8 <= l.data_len);
                }
                assert!(l.data_len as u64 <= MAX_BLOCK_LEN);
            }
        }
    }

    #[test]
    fn kvm_stats_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<KvmStats>();
    }

    /// The neutral view the accounting reads: the same names, kinds, known indices and values.
    #[test]
    fn vcpu_stats_over_a_kvm_stats_file() {
        let path = std::env::temp_dir().join(format!("ppa-vcpu-stats-{}", std::process::id()));
        std::fs::write(&path, sample()).unwrap();
        let file = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let kvm = KvmStats::from_stats_file(file).unwrap();
        let want_kinds: Vec<Option<KvmStatType>> = (0..3).map(|i| kvm.scalar_kind(i)).collect();
        let s = crate::hypervisor::stats::VcpuStats::new(Box::new(kvm));
        assert_eq!(
            s.scalar_names().collect::<Vec<_>>(),
            ["exits", "halt_wait_ns"]
        );
        assert_eq!(s.scalar_count(), 2);
        for (i, want) in want_kinds.into_iter().enumerate() {
            let neutral = want.map(|k| match k {
                KvmStatType::Cumulative => StatKind::Cumulative,
                _ => StatKind::Current,
            });
            assert_eq!(s.scalar_kind(i), neutral);
        }
        assert_eq!(s.known_index(KnownStat::HaltWaitNs), Some(1));
        assert_eq!(s.known_index(KnownStat::Blocking), None);
        let mut out = [0u64; 2];
        s.read_scalars(&mut Vec::new(), &mut out).unwrap();
        assert_eq!(out, [100, 133]);
        assert!(s.read_scalars(&mut Vec::new(), &mut out[..1]).is_err());
    }

    #[test]
    fn vcpu_stats_from_kvm() {
        use kvm_ioctls::Kvm;

        let kvm = Kvm::new().unwrap_or_else(|e| panic!("this test needs /dev/kvm: {e}"));
        let vm = kvm.create_vm().expect("KVM_CREATE_VM");
        let vcpu = vm.create_vcpu(0).expect("KVM_CREATE_VCPU");
        let stats = KvmStats::from_fd(&vcpu).expect("vCPU stats");
        let names: Vec<&str> = stats.scalar_names().collect();
        println!("id: {}", stats.layout().id);
        println!("scalars ({}): {names:?}", names.len());
        for d in &stats.layout().descs {
            println!(
                "  {:<32} {:?} {:?} exp={} size={} offset={} bucket={}",
                d.name, d.kind, d.unit, d.exponent, d.size, d.offset, d.bucket_size
            );
        }
        assert!(names.contains(&"exits"), "no `exits` in {names:?}");
        assert!(
            names.contains(&"halt_wait_ns"),
            "no `halt_wait_ns` in {names:?}"
        );
        let hw = &stats.layout().descs[stats.scalars[stats.scalar_index("halt_wait_ns").unwrap()]];
        assert_eq!((hw.unit, hw.exponent), (StatUnit::Seconds, -9));
        let mut scratch = Vec::new();
        let mut a = vec![0u64; stats.scalar_count()];
        let mut b = vec![0u64; stats.scalar_count()];
        stats.read_scalars(&mut scratch, &mut a).unwrap();
        stats.read_scalars(&mut scratch, &mut b).unwrap();
        // The vCPU never ran: its exit count stays put.
        let exits = stats.scalar_index("exits").unwrap();
        assert_eq!(a[exits], b[exits]);
        let map = stats.read_map().unwrap();
        assert_eq!(map.len(), stats.scalar_count());
        // A VM fd works too.
        let vm_stats = KvmStats::from_fd(&vm).expect("VM stats");
        println!("VM id: {}", vm_stats.layout().id);
        assert!(vm_stats.scalar_count() > 0);
    }
}
