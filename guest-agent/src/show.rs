//! `ppa-agent show`: the guest's view of the host. For each vCPU, the time the host measured
//! (the page's host section, refreshed by the VMM every few ms) beside the guest kernel's own
//! steal figure for the same CPU (`/proc/stat`, which comes from the paravirtual steal clock
//! when the hypervisor offers one, and is 0 otherwise).
//!
//! Data flow: discovery and a read-only mapping as `--probe` makes them; each host record is
//! read with the sequence protocol (8 tries; one that stays mid-update is shown as such);
//! `/proc/stat` is read once; one line per vCPU goes to stdout, then (layout 1.3) one line
//! of the VM-wide host record: the VM's CPU pressure as the host computed it.

use std::fmt::Write as _;

use ppa_guest_abi::ppa_page::{HostVcpu, HostVm, VM_PRESSURE};

use crate::agent::AgentError;
use crate::config::Config;
use crate::discover::Discovery;
use crate::page::{Access, Page};

/// The guest kernel's steal per CPU, ns (`None` when /proc/stat cannot be read).
fn guest_steal() -> Option<Vec<(u32, u64)>> {
    let text = std::fs::read("/proc/stat").ok()?;
    // SAFETY: sysconf has no preconditions.
    let tick = 1_000_000_000 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let s = crate::procfs::system_stat(&text)?;
    Some(s.cpus.iter().map(|c| (c.cpu, c.ticks[7] * tick)).collect())
}

/// The table for `records` (vCPU i's host record or `None` if it stayed mid-update) beside
/// the guest's steal.
pub fn table(records: &[Option<HostVcpu>], steal: Option<&[(u32, u64)]>) -> String {
    let ms = |ns: u64| format!("{:.2}", ns as f64 / 1e6);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>4} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}   {:>12}",
        "vCPU",
        "WALL ms",
        "USED ms",
        "STEAL ms",
        "LMTD ms",
        "HALT ms",
        "PAUSED ms",
        "BLKD ms",
        "GUEST STEAL"
    );
    for (i, r) in records.iter().enumerate() {
        let g = steal
            .and_then(|s| s.iter().find(|(c, _)| *c as usize == i))
            .map_or("-".to_string(), |(_, ns)| ms(*ns));
        match r {
            Some(h) => {
                let _ = writeln!(
                    out,
                    "{i:>4} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}   {g:>12}",
                    ms(h.wall_ns),
                    ms(h.used_ns),
                    ms(h.steal_ns),
                    ms(h.limited_ns),
                    ms(h.halted_ns),
                    ms(h.paused_ns),
                    ms(h.blocked_ns)
                );
            }
            None => {
                let _ = writeln!(out, "{i:>4} (the host record stayed mid-update)   {g:>12}");
            }
        }
    }
    out
}

/// The VM-wide line: pressure when the host filled it, else why there is none.
pub fn vm_line(vm: Option<Option<HostVm>>) -> String {
    let pct = |h: u32| format!("{}.{:02}", h / 100, h % 100);
    match vm {
        None => "VM pressure: not in this page (a VMM before layout 1.3)".to_string(),
        Some(None) => "VM pressure: the host record stayed mid-update".to_string(),
        Some(Some(v)) if v.flags & VM_PRESSURE == 0 => {
            "VM pressure: not filled by this VMM".to_string()
        }
        Some(Some(v)) => format!(
            "VM pressure: some avg10={} avg60={} avg300={} total={} us; full avg10={} avg60={} avg300={} total={} us",
            pct(v.pressure_some_avg[0]),
            pct(v.pressure_some_avg[1]),
            pct(v.pressure_some_avg[2]),
            v.pressure_some_total_us,
            pct(v.pressure_full_avg[0]),
            pct(v.pressure_full_avg[1]),
            pct(v.pressure_full_avg[2]),
            v.pressure_full_total_us
        ),
    }
}

/// Prints the table; returns the exit code.
pub fn show(cfg: &Config) -> Result<(), AgentError> {
    let d = Discovery::run(cfg.page_file.as_deref());
    let (source_name, place) = d.choice().ok_or(AgentError::NoPage)?;
    let page = Page::open(&place, Access::Look).map_err(|source| AgentError::Page {
        source_name,
        source,
    })?;
    let h = page.header();
    println!(
        "PPA page: {} ({} bytes, layout {}.{}); host records refreshed every {} ms; times since each vCPU started",
        page.at(),
        h.total_size,
        h.major,
        h.minor,
        h.host_refresh_ns / 1_000_000
    );
    let records: Vec<Option<HostVcpu>> = (0..h.host_count)
        .map(|i| page.host(i, 8).and_then(Result::ok))
        .collect();
    let steal = guest_steal();
    print!("{}", table(&records, steal.as_deref()));
    println!("{}", vm_line(page.host_vm(8).map(Result::ok)));
    println!(
        "STEAL and LMTD: time the vCPU was runnable but the host ran something else, and time the host held it back under a CPU limit (the host's figures); GUEST STEAL: what this kernel counts as steal for that CPU"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_vcpu_beside_the_guests_steal() {
        let r = HostVcpu {
            wall_ns: 2_000_000_000,
            used_ns: 1_500_000_000,
            steal_ns: 250_000_000,
            limited_ns: 100_000_000,
            blocked_ns: 5_000_000,
            ..Default::default()
        };
        let t = table(&[Some(r), None], Some(&[(0, 240_000_000), (1, 0)]));
        let lines: Vec<Vec<&str>> = t.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(lines[0][0], "vCPU");
        assert_eq!(
            lines[1],
            ["0", "2000.00", "1500.00", "250.00", "100.00", "0.00", "0.00", "5.00", "240.00"]
        );
        assert!(t.lines().nth(2).unwrap().contains("stayed mid-update"));
        assert_eq!(lines[2].last(), Some(&"0.00"));
        let t = table(&[Some(r)], None);
        assert_eq!(
            t.lines().nth(1).unwrap().split_whitespace().last(),
            Some("-")
        );
    }

    #[test]
    fn the_vm_line_prints_pressure_as_psi_files_do_and_says_why_when_there_is_none() {
        let v = HostVm {
            flags: VM_PRESSURE,
            pressure_some_total_us: 1234,
            pressure_some_avg: [8647, 105, 7],
            pressure_full_avg: [0, 0, 1],
            ..Default::default()
        };
        assert_eq!(
            vm_line(Some(Some(v))),
            "VM pressure: some avg10=86.47 avg60=1.05 avg300=0.07 total=1234 us; full avg10=0.00 avg60=0.00 avg300=0.01 total=0 us"
        );
        assert!(vm_line(None).contains("before layout 1.3"));
        assert!(vm_line(Some(None)).contains("mid-update"));
        let empty = HostVm::default();
        assert!(vm_line(Some(Some(empty))).contains("not filled"));
    }
}
