//! The `ppa-agent` binary against page files it must refuse, and the ways it stops: each bad
//! input is named in its message and leaves the file as it was; `--probe`'s exit codes; a
//! region rewritten or a guest header written by someone else while it runs; SIGTERM.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use ppa_agent::page::{vmm_header, write_region_file};
use ppa_guest_abi::ppa_page::{
    read_record, GuestAgent, GuestHeader, RegionHeader, AGENT_MAGIC, AGENT_STOPPED, GUEST_MAGIC,
};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_ppa-agent")
}

/// A fresh directory for one test.
fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ppa-agent-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs the agent with `args` (and no config file); returns code, stderr, stdout.
fn run(args: &[&str]) -> (i32, String, String) {
    let out: Output = Command::new(bin())
        .args(["--config", "/dev/null"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn header_bytes(h: &RegionHeader) -> [u8; 64] {
    // SAFETY: RegionHeader is 64 bytes of repr(C) integers (asserted in the ABI crate).
    unsafe { std::mem::transmute_copy(h) }
}

/// A page file whose region header is `h`, `size` bytes.
fn page_with(dir: &Path, name: &str, h: &RegionHeader, size: usize) -> PathBuf {
    let p = dir.join(name);
    let mut bytes = vec![0u8; size];
    bytes[..64].copy_from_slice(&header_bytes(h));
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Runs `--once` on `page` and checks it fails with `code` and `needle`, writing nothing.
fn refused(page: &Path, code: i32, needle: &str) {
    let before = std::fs::read(page).unwrap();
    let (c, err, _) = run(&["--once", "--page-file", page.to_str().unwrap()]);
    assert_eq!(c, code, "{err}");
    assert!(err.contains(needle), "no {needle:?} in: {err}");
    assert_eq!(
        std::fs::read(page).unwrap(),
        before,
        "the page was written: {err}"
    );
}

#[test]
fn pages_the_agent_does_not_understand_are_left_alone() {
    let d = dir("bad");
    let good = vmm_header(65536, 2);

    let tiny = d.join("tiny");
    std::fs::write(&tiny, [0u8; 10]).unwrap();
    refused(&tiny, 4, "has 10 bytes, too few for a region header");

    let p = page_with(
        &d,
        "magic",
        &RegionHeader {
            magic: 0x1234_5678,
            ..good
        },
        65536,
    );
    refused(&p, 4, "the region's magic is 0x12345678, not \"PPAP\"");

    let p = page_with(
        &d,
        "major",
        &RegionHeader {
            major: 2,
            minor: 0,
            ..good
        },
        65536,
    );
    refused(
        &p,
        4,
        "the region has layout 2.0; this agent writes layout 1.x only",
    );

    // The header promises 64 KiB; the file has 8.
    let p = page_with(&d, "short", &good, 8192);
    refused(
        &p,
        4,
        "says the region is 65536 bytes, but 8192 bytes are there",
    );

    let p = page_with(
        &d,
        "outside",
        &RegionHeader {
            guest_size: 70000,
            ..good
        },
        65536,
    );
    refused(&p, 4, "the guest section (70000 bytes at offset 448)");

    // 29 vCPUs' host records and the VM record leave a 4 KiB page's guest section 192 bytes.
    let p = page_with(&d, "full", &vmm_header(4096, 29), 4096);
    refused(&p, 1, "the guest section has 192 bytes; the agent needs");

    // A newer minor version of the same major is read and published into.
    let p = page_with(&d, "minor", &RegionHeader { minor: 7, ..good }, 65536);
    let (c, err, _) = run(&["--once", "--page-file", p.to_str().unwrap()]);
    assert_eq!(c, 0, "{err}");
    let bytes = std::fs::read(&p).unwrap();
    let magic = u32::from_le_bytes(bytes[448 + 4..448 + 8].try_into().unwrap());
    assert_eq!(magic, GUEST_MAGIC, "a guest header was published");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn probe_exit_codes_say_found_none_or_unusable() {
    let d = dir("probe");
    // This machine has no PPA-VMM CPUID leaves and no ppa.page= (a test host).
    let (c, err, _) = run(&["--probe"]);
    assert_eq!(c, 3, "{err}");
    assert!(err.contains("no PPA page here"), "{err}");
    assert!(
        err.contains("CPUID") && err.contains("kernel command line"),
        "{err}"
    );

    let good = d.join("good");
    write_region_file(&good, 65536, 3).unwrap();
    let before = std::fs::read(&good).unwrap();
    let (c, err, _) = run(&["--probe", "--page-file", good.to_str().unwrap()]);
    assert_eq!(c, 0, "{err}");
    assert!(
        err.contains("PPA page found through the --page-file"),
        "{err}"
    );
    assert!(err.contains("3 vCPUs"), "{err}");
    assert!(err.contains("taskstats:"), "{err}");
    assert_eq!(
        std::fs::read(&good).unwrap(),
        before,
        "probing writes nothing"
    );

    let (c, err, _) = run(&["--probe", "--page-file", d.join("none").to_str().unwrap()]);
    assert_eq!(c, 4, "{err}");
    assert!(err.contains("cannot open the page file"), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_bad_config_file_is_named_with_its_line() {
    let d = dir("config");
    let conf = d.join("agent.conf");
    std::fs::write(&conf, "interval = 1s\nspeed = fast\n").unwrap();
    let out = Command::new(bin())
        .args(["--probe", "--config", conf.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("agent.conf:2: unknown key `speed`"), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// A running agent publishing into `page` every 20 ms.
fn agent(page: &Path, extra: &[&str]) -> Child {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(bin());
    cmd.args(["--config", "/dev/null", "--interval", "20ms", "--page-file"])
        .arg(page)
        .args(extra)
        .stderr(Stdio::piped());
    // SAFETY: the closure runs in the child between fork and exec and only calls prctl,
    // which is async-signal-safe. The agent dies with the test thread that started it, so
    // a failed assertion (which aborts the test process) leaves none behind.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        })
    };
    cmd.spawn().unwrap()
}

/// The guest header and agent record now in the page file (guest section at 448, after the host records and the VM record); `None`
/// when the copy caught either mid-write.
fn published(page: &Path) -> Option<(GuestHeader, GuestAgent)> {
    let bytes = std::fs::read(page).unwrap();
    let words: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let base = words.as_ptr().cast::<u8>();
    // SAFETY: `words` is 8-aligned and holds the whole file; nobody writes this copy.
    unsafe {
        Some((
            read_record(base.add(448).cast::<GuestHeader>(), 1).ok()?,
            read_record(base.add(448 + 64).cast::<GuestAgent>(), 1).ok()?,
        ))
    }
}

/// Waits (bounded) until the agent has taken `n` samples.
fn wait_samples(page: &Path, n: u64) -> (GuestHeader, GuestAgent) {
    for _ in 0..1000 {
        if let Some((h, a)) = published(page) {
            if a.magic == AGENT_MAGIC && a.samples >= n {
                return (h, a);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("the agent did not take {n} samples");
}

fn stderr_of(child: Child) -> (i32, String) {
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_region_rewritten_under_the_agent_stops_it() {
    let d = dir("rewrite");
    let page = d.join("page");
    write_region_file(&page, 65536, 2).unwrap();
    let child = agent(&page, &[]);
    wait_samples(&page, 2);
    // The VMM side rewrites the region header (here: another major version).
    let f = std::fs::OpenOptions::new().write(true).open(&page).unwrap();
    f.write_all_at(
        &header_bytes(&RegionHeader {
            major: 2,
            ..vmm_header(65536, 2)
        }),
        0,
    )
    .unwrap();
    let (code, err) = stderr_of(child);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("the region header changed under the agent"),
        "{err}"
    );
    let layout = format!("layout 2.{}", ppa_guest_abi::ppa_page::MINOR);
    assert!(err.contains(&layout), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn another_writer_in_the_guest_header_stops_the_agent() {
    let d = dir("foreign");
    let page = d.join("page");
    write_region_file(&page, 65536, 2).unwrap();
    let child = agent(&page, &[]);
    let (h, _) = wait_samples(&page, 2);
    // A second agent on the same page is refused while the first (which has
    // published, so holds the lock) runs.
    let (c, err, _) = run(&["--once", "--page-file", page.to_str().unwrap()]);
    assert_eq!(c, 4, "{err}");
    assert!(
        err.contains("another ppa-agent is publishing into this page"),
        "{err}"
    );
    // Something else writes the guest header: its counter moves by a whole write. (Until
    // the agent notices: a store that lands inside one of the agent's own writes is
    // overwritten by it, as a second writer's would be.)
    let f = std::fs::OpenOptions::new().write(true).open(&page).unwrap();
    let mut child = child;
    for _ in 0..100 {
        f.write_all_at(&(h.seq.wrapping_add(1000) & !1).to_le_bytes(), 448)
            .unwrap();
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(30));
    }
    let (code, err) = stderr_of(child);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("another writer changed the guest header"),
        "{err}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn sigterm_ends_with_a_last_publication_marked_stopped() {
    let d = dir("term");
    let page = d.join("page");
    write_region_file(&page, 65536, 2).unwrap();
    let child = agent(&page, &[]);
    wait_samples(&page, 3);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let (code, err) = stderr_of(child);
    assert_eq!(code, 0, "{err}");
    let (h, a) = published(&page).expect("nobody writes the page any more");
    assert_ne!(a.flags & AGENT_STOPPED, 0, "{a:?}");
    assert!(a.samples >= 3 && a.interval_ns == 20_000_000, "{a:?}");
    assert!(h.threads_count > 0 && a.threads_published == h.threads_count);
    assert!(err.contains("stopped after"), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn show_prints_each_vcpu_of_the_host_section() {
    let d = dir("show");
    let page = d.join("page");
    write_region_file(&page, 65536, 3).unwrap();
    let (c, err, out) = run(&["show", "--page-file", page.to_str().unwrap()]);
    assert_eq!(c, 0, "{err}");
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.trim_start().starts_with(char::is_numeric))
        .collect();
    assert_eq!(rows.len(), 3, "{out}");
    assert!(out.contains("GUEST STEAL"), "{out}");
    std::fs::remove_dir_all(&d).unwrap();
}
