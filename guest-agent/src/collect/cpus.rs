//! The per-CPU half of a sample: `/proc/stat`, `/proc/softirqs`, `/proc/interrupts` and
//! `/proc/schedstat`, kept open and read with pread, into one [`GuestCpu`] record per CPU.
//!
//! Data flow: [`CpuFiles::open`] opens the files (those a kernel lacks are left out and their
//! figures stay 0) and sizes the table from the CPUs `/proc/stat` lists; each
//! [`CpuFiles::sample`] rereads them, fills the records and returns the system-wide fork
//! count, which tells the thread half whether any task was created since the last sample.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use ppa_guest_abi::ppa_page::GuestCpu;

use crate::procfs;

/// Reads all of `f` from offset 0 into `buf` with pread. A /proc file hands over everything
/// that fits in one read, so a read that leaves room is the whole file.
pub fn pread_all(f: &File, buf: &mut Vec<u8>) -> io::Result<usize> {
    if buf.len() < 4096 {
        buf.resize(4096, 0);
    }
    let mut n = 0;
    loop {
        let got = f.read_at(&mut buf[n..], n as u64)?;
        n += got;
        if got == 0 || n < buf.len() {
            return Ok(n);
        }
        buf.resize(buf.len() * 2, 0);
    }
}

/// The system-wide files and the records made from them.
#[derive(Debug)]
pub struct CpuFiles {
    stat: File,
    softirqs: Option<File>,
    interrupts: Option<File>,
    schedstat: Option<File>,
    records: Vec<GuestCpu>,
    seen: Vec<bool>,
    tick_ns: u64,
}

impl CpuFiles {
    /// Opens the files; the table has one record per CPU up to the highest `/proc/stat`
    /// lists now (a CPU brought online later with a higher number is not published).
    pub fn open(buf: &mut Vec<u8>, tick_ns: u64) -> io::Result<CpuFiles> {
        let stat = File::open("/proc/stat")?;
        let n = pread_all(&stat, buf)?;
        let s = procfs::system_stat(&buf[..n])
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "/proc/stat lists no CPU"))?;
        let nr = s.cpus.iter().map(|c| c.cpu + 1).max().unwrap_or(1);
        let mut schedstat = File::open("/proc/schedstat").ok();
        // Only a version the parser reads counts as present.
        if let Some(f) = &schedstat {
            let n = pread_all(f, buf)?;
            if procfs::cpu_timeslices(&buf[..n]).is_none() {
                schedstat = None;
            }
        }
        Ok(CpuFiles {
            stat,
            softirqs: File::open("/proc/softirqs").ok(),
            interrupts: File::open("/proc/interrupts").ok(),
            schedstat,
            records: (0..nr)
                .map(|cpu| GuestCpu {
                    cpu,
                    ..Default::default()
                })
                .collect(),
            seen: vec![false; nr as usize],
            tick_ns,
        })
    }

    /// Number of CPU records.
    pub fn nr_cpus(&self) -> u32 {
        self.records.len() as u32
    }

    /// Whether per-CPU context switches are available (/proc/schedstat).
    pub fn switches(&self) -> bool {
        self.schedstat.is_some()
    }

    /// The records of CPUs seen at least once.
    pub fn records(&self) -> impl Iterator<Item = (usize, &GuestCpu)> {
        self.records
            .iter()
            .enumerate()
            .filter(|(i, _)| self.seen[*i])
    }

    /// Rereads the files into the records, stamped `now_ns`; returns the fork count.
    pub fn sample(&mut self, buf: &mut Vec<u8>, now_ns: u64) -> io::Result<u64> {
        let n = pread_all(&self.stat, buf)?;
        let s = procfs::system_stat(&buf[..n])
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "/proc/stat unreadable"))?;
        let t = self.tick_ns;
        for c in &s.cpus {
            let Some(r) = self.records.get_mut(c.cpu as usize) else {
                continue;
            };
            let [user, nice, system, idle, iowait, irq, softirq, steal] = c.ticks;
            r.user_ns = (user + nice) * t;
            r.system_ns = system * t;
            r.idle_ns = idle * t;
            r.iowait_ns = iowait * t;
            r.irq_ns = irq * t;
            r.softirq_ns = softirq * t;
            r.steal_ns = steal * t;
            r.updated_ns = now_ns;
            self.seen[c.cpu as usize] = true;
        }
        if let Some(f) = &self.softirqs {
            let n = pread_all(f, buf)?;
            for (cpu, counts) in procfs::softirqs(&buf[..n]).unwrap_or_default() {
                if let Some(r) = self.records.get_mut(cpu as usize) {
                    r.softirqs = counts;
                }
            }
        }
        if let Some(f) = &self.interrupts {
            let n = pread_all(f, buf)?;
            for (cpu, count) in procfs::interrupts(&buf[..n]).unwrap_or_default() {
                if let Some(r) = self.records.get_mut(cpu as usize) {
                    r.interrupts = count;
                }
            }
        }
        if let Some(f) = &self.schedstat {
            let n = pread_all(f, buf)?;
            for (cpu, slices) in procfs::cpu_timeslices(&buf[..n]).unwrap_or_default() {
                if let Some(r) = self.records.get_mut(cpu as usize) {
                    r.context_switches = slices;
                }
            }
        }
        Ok(s.processes)
    }
}
