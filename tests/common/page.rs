//! The PPA page as a host tool sees it: `--ppa-page-file` mapped read-only and shared, its
//! header and host records read with the sequence protocol.

use std::fs::File;
use std::path::Path;
use std::time::Duration;

use ppa_guest_abi::ppa_page::{read_record, HostVcpu, RegionHeader};
use ppa_vmm_api::GuestView;
use serde_json::json;
use vm_memory::{FileOffset, MmapRegion};

use super::vmm::{Conn, Vmm};

/// Three busy vCPUs (2.5 s) publishing to the PPA page, paused after 1 s so that neither the
/// guest's records nor the host's figures move: the VMM, a connection, and what `guest` said
/// 50 ms into the pause (past the stats snapshot's maximum age, 15 ms). Three busy vCPUs on
/// two cores steal, so the steal they see means something.
pub fn paused_busy_workers() -> (Vmm, Conn, GuestView) {
    let vmm = Vmm::start("workers", &["--vcpus", "3", "--workload", "busy:ms=2500"]);
    let mut c = vmm.connect();
    std::thread::sleep(Duration::from_millis(1000));
    c.ok(json!({"cmd": "pause"}));
    std::thread::sleep(Duration::from_millis(50));
    let g = serde_json::from_value(c.ok(json!({"cmd": "guest"}))).unwrap();
    (vmm, c, g)
}

/// A read-only shared mapping of a PPA page file; unmapped when dropped.
pub struct HostSection {
    map: MmapRegion,
    /// The region header, read once at mapping time (the VMM writes it before the VM starts).
    pub header: RegionHeader,
}

impl HostSection {
    /// Maps the whole file at `path`.
    pub fn map(path: &Path) -> HostSection {
        let f = File::open(path).unwrap();
        let len = f.metadata().unwrap().len() as usize;
        assert!(len >= 4096, "a page file of {len} bytes");
        let map: MmapRegion = MmapRegion::build(
            Some(FileOffset::new(f, 0)),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
        )
        .expect("the page file maps");
        // SAFETY: the header is at offset 0 of a page-aligned mapping of at least 4 KiB, which
        // lives as long as `map`.
        let header = unsafe { std::ptr::read_volatile(map.as_ptr().cast::<RegionHeader>()) };
        HostSection { map, header }
    }

    /// Size of the mapping (the file's size).
    pub fn len(&self) -> usize {
        self.map.size()
    }

    /// Host record `i` (asserted to be inside the mapping), read with up to 16 tries.
    pub fn record(&self, i: usize) -> HostVcpu {
        let h = &self.header;
        assert!(i < h.host_count as usize, "vCPU {i} of {}", h.host_count);
        let off = h.host_offset as usize + i * h.host_record_size as usize;
        assert!(off % 8 == 0 && off + std::mem::size_of::<HostVcpu>() <= self.len());
        // SAFETY: the record lies inside the mapping, 8-byte aligned (asserted above); the VMM
        // writes it under the sequence protocol, which `read_record` follows.
        unsafe { read_record(self.map.as_ptr().add(off).cast::<HostVcpu>(), 16) }
            .expect("a consistent copy")
    }
}
