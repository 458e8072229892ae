//! End-to-end tests of the VMM's end as an operator or a supervisor causes it: SIGTERM,
//! SIGINT and SIGHUP during a run (the final report, exit code 0, no socket file left), a
//! second signal (an immediate exit with 128 + its number), and the files a run leaves: a
//! report file checked before the VM starts and written whole or not at all, and a control
//! socket file removed only while it is still this VMM's.

mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::vmm::{bin, connect_when_up, temp_dir, Conn};
use ppa_vmm_api::{Stats, VmState};
use serde_json::{json, Value};
use vmm_sys_util::tempdir::TempDir;

/// A `ppa-vmm run` child with a control socket, a report file and a PPA page file in a private
/// directory.
struct Run {
    child: Child,
    dir: TempDir,
}

impl Run {
    fn start(tag: &str, args: &[&str]) -> Run {
        common::require_kvm();
        let dir = temp_dir(tag);
        let child = Command::new(bin())
            .arg("run")
            .arg("--api-sock")
            .arg(dir.as_path().join("api.sock"))
            .arg("--report-file")
            .arg(dir.as_path().join("report.json"))
            // In the same directory, so that `others` sees it if it outlives the run.
            .arg("--ppa-page-file")
            .arg(dir.as_path().join("page"))
            .args(["--report", "json", "--max-runtime", "120", "--name", tag])
            // Its descriptor in the test's own run directory, never the host's.
            .arg("--run-dir")
            .arg(dir.as_path().join("run"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ppa-vmm starts");
        let run = Run { child, dir };
        drop(connect_when_up(&run.sock()));
        run
    }

    fn sock(&self) -> PathBuf {
        self.dir.as_path().join("api.sock")
    }

    /// Waits until every vCPU has run: the VM is `running` and each vCPU thread has started.
    fn wait_running(&self) {
        let mut c = Conn::new(connect_when_up(&self.sock()));
        for _ in 0..2000 {
            let s: Stats = serde_json::from_value(c.ok(json!({"cmd": "stats"}))).unwrap();
            if s.vm.state == VmState::Running && s.vcpus.iter().all(|v| v.wall_ns > 0) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("the VM did not start running");
    }

    fn signal(&self, signo: libc::c_int) {
        // SAFETY: kill takes plain integers; the pid is our own child, still unwaited.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, signo) };
        assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
    }

    /// Waits for the child; returns its output and its report file, if it wrote one.
    fn finish(self) -> (Output, Option<Value>, TempDir) {
        let out = self.child.wait_with_output().unwrap();
        let path = self.dir.as_path().join("report.json");
        let report = std::fs::read(&path).ok().map(|b| {
            serde_json::from_slice(&b).unwrap_or_else(|e| {
                panic!(
                    "the report file is not whole JSON: {e}: {}",
                    String::from_utf8_lossy(&b)
                )
            })
        });
        (out, report, self.dir)
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Files of `dir` other than `keep` (temporary files left behind would show here), and those
/// of its run directory `run/` other than the calibration cache (a descriptor left behind
/// would show as `run/NAME.json`).
fn others(dir: &Path, keep: &[&str]) -> Vec<String> {
    let names = |d: &Path| -> Vec<String> {
        std::fs::read_dir(d)
            .map(|r| {
                r.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let run = names(&dir.join("run"))
        .into_iter()
        .filter(|n| n != "calibration.json")
        .map(|n| format!("run/{n}"));
    names(dir)
        .into_iter()
        .filter(|n| n != "run" && !keep.contains(&n.as_str()))
        .chain(run)
        .collect()
}

/// One stop signal during a run of `workload`: the run ends as `shutdown` with its report,
/// exit code 0, and no socket file.
fn stopped_by(tag: &str, signo: libc::c_int, name: &str, args: &[&str]) {
    let _g = common::serial();
    let run = Run::start(tag, args);
    run.wait_running();
    let sock = run.sock();
    run.signal(signo);
    let (out, report, dir) = run.finish();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{tag}: stderr {err}");
    let r = report.unwrap_or_else(|| panic!("{tag}: no report file; stderr {err}"));
    assert_eq!(r["vm"]["end"], "shutdown", "{tag}");
    assert_eq!(r["vm"]["signal"], name, "{tag}");
    assert_eq!(r["vm"]["name"], tag, "{tag}");
    for v in r["vcpus"].as_array().unwrap() {
        assert_eq!(v["end"], "stopped", "{tag}: {v}");
        assert!(v["wall_ns"].as_u64().unwrap() > 0, "{tag}: {v}");
    }
    assert!(!sock.exists(), "{tag}: the socket file is removed");
    assert!(err.contains(name), "{tag}: the signal is logged: {err}");
    assert_eq!(
        others(dir.as_path(), &["report.json"]),
        Vec::<String>::new(),
        "{tag}"
    );
}

#[test]
fn sigterm_on_busy_vcpus_writes_the_report() {
    stopped_by(
        "sig-busy",
        libc::SIGTERM,
        "SIGTERM",
        &["--vcpus", "2", "--workload", "busy:ms=60000"],
    );
}

#[test]
fn sigterm_on_idle_vcpus_writes_the_report() {
    stopped_by(
        "sig-idle",
        libc::SIGTERM,
        "SIGTERM",
        &["--vcpus", "2", "--workload", "idle:ms=60000"],
    );
}

#[test]
fn sigint_on_a_mixed_vm_writes_the_report() {
    stopped_by(
        "sig-mixed",
        libc::SIGINT,
        "SIGINT",
        &["--vcpus", "4", "--workload", "mixed:ms=60000"],
    );
}

#[test]
fn sighup_on_a_limited_vm_writes_the_report() {
    stopped_by(
        "sig-limit",
        libc::SIGHUP,
        "SIGHUP",
        &[
            "--vcpus",
            "2",
            "--workload",
            "busy:ms=60000",
            "--vcpu-group",
            "g:0-1:50%",
        ],
    );
}

#[test]
fn sigterm_on_a_paused_vm_writes_the_report() {
    let _g = common::serial();
    let run = Run::start(
        "sig-paused",
        &["--vcpus", "2", "--workload", "busy:ms=60000"],
    );
    run.wait_running();
    let mut c = Conn::new(connect_when_up(&run.sock()));
    c.ok(json!({"cmd": "pause"}));
    run.signal(libc::SIGTERM);
    let (out, report, _dir) = run.finish();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(report.unwrap()["vm"]["end"], "shutdown");
}

#[test]
fn a_second_signal_exits_at_once_without_a_report() {
    let _g = common::serial();
    let run = Run::start(
        "sig-twice",
        &["--vcpus", "2", "--workload", "busy:ms=60000"],
    );
    run.wait_running();
    let sock = run.sock();
    // Two different signals (two of one kind could merge into one pending signal): the first
    // read starts the shutdown, the second exits before any report can be written.
    run.signal(libc::SIGTERM);
    run.signal(libc::SIGINT);
    let (out, report, dir) = run.finish();
    let err = stderr(&out);
    let code = out.status.code();
    assert!(
        code == Some(128 + libc::SIGTERM) || code == Some(128 + libc::SIGINT),
        "exit code {code:?}: {err}"
    );
    assert!(err.contains("second stop signal"), "{err}");
    assert!(report.is_none(), "no report after a forced exit");
    assert!(!sock.exists(), "the forced exit removes our socket file");
    // The forced exit runs no destructor, but removes the files this VMM made: the socket
    // and the PPA page file (docs/operations.md).
    assert_eq!(others(dir.as_path(), &[]), Vec::<String>::new());
}

/// The trial's finding (issue 28): `--ppa-page-file` followed a symbolic link and overwrote
/// its target, and overwrote (then removed) a regular file at the path. Both are refused
/// before the VM is built, with exit code 2, and what was there stays as it was.
#[test]
fn a_page_file_path_that_exists_or_is_a_link_is_refused_and_left_whole() {
    common::require_kvm();
    let dir = temp_dir("sig-pagefile");
    let victim = dir.as_path().join("victim.txt");
    std::fs::write(&victim, b"the victim's own bytes").unwrap();
    let link = dir.as_path().join("page.ppa");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    for (path, what) in [(&link, "a symbolic link"), (&victim, "a file")] {
        let out = Command::new(bin())
            .args([
                "run",
                "--vcpus",
                "1",
                "--workload",
                "busy:ms=50",
                "--report",
                "none",
            ])
            .arg("--ppa-page-file")
            .arg(path)
            .output()
            .unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{what}: {err}");
        assert!(err.contains(&format!("{what} is already there")), "{err}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"the victim's own bytes");
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    }
    // A new path works, and the file is gone at the end.
    let fresh = dir.as_path().join("fresh.ppa");
    let out = Command::new(bin())
        .args([
            "run",
            "--vcpus",
            "1",
            "--workload",
            "busy:ms=50",
            "--report",
            "none",
        ])
        .arg("--ppa-page-file")
        .arg(&fresh)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!fresh.exists());
    let mut left = others(dir.as_path(), &[]);
    left.sort();
    assert_eq!(left, ["page.ppa", "victim.txt"]);
}

#[test]
fn a_report_file_that_cannot_be_written_is_refused_before_the_vm_starts() {
    common::require_kvm();
    let dir = temp_dir("sig-files");
    let cases: [(PathBuf, &str); 3] = [
        // sysfs refuses new files even to root.
        (
            PathBuf::from("/sys/ppa-vmm-report.json"),
            "cannot create a file in /sys",
        ),
        (dir.as_path().join("missing/report.json"), "does not exist"),
        (dir.as_path().to_path_buf(), "is a directory"),
    ];
    for (path, needle) in cases {
        for flag in ["--report-file", "--histograms-file"] {
            let out = Command::new(bin())
                .args(["run", "--vcpus", "1", "--workload", "busy:ms=10"])
                .arg(flag)
                .arg(&path)
                .output()
                .unwrap();
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(2), "{flag} {path:?}: {err}");
            assert!(err.contains(needle), "{flag} {path:?}: {err}");
            assert!(!err.contains("tiny:"), "no vCPU ran: {err}");
        }
    }
}

/// Runs `ppa-vmm run ARGS` with files limited to `max_file` bytes (a full disk, as far as the
/// report is concerned); SIGXFSZ is ignored so that the write fails with EFBIG instead.
fn run_with_file_limit(args: &[&str], max_file: u64) -> Output {
    let mut cmd = Command::new(bin());
    cmd.arg("run").args(args);
    // SAFETY: between fork and exec the closure only calls setrlimit and signal, both
    // async-signal-safe, on plain values.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: max_file,
                rlim_max: max_file,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    cmd.output().unwrap()
}

#[test]
fn a_report_that_does_not_fit_leaves_the_old_file_whole() {
    common::require_kvm();
    let _g = common::serial();
    let dir = temp_dir("sig-full");
    let path = dir.as_path().join("report.json");
    std::fs::write(&path, b"{\"previous\": true}\n").unwrap();
    let out = run_with_file_limit(
        &[
            "--vcpus",
            "2",
            "--workload",
            "exits:n=100",
            "--ppa-page-size",
            "0",
            "--report",
            "json",
            "--report-file",
            path.to_str().unwrap(),
        ],
        4096,
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("the run ended (completed) but cannot write"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "{\"previous\": true}\n",
        "the old report is untouched"
    );
    assert_eq!(
        others(dir.as_path(), &["report.json"]),
        Vec::<String>::new(),
        "no temporary file is left"
    );
}

#[test]
fn a_socket_file_that_another_vmm_took_over_is_left_alone() {
    let _g = common::serial();
    let c = Run::start(
        "sig-sock-c",
        &["--vcpus", "1", "--workload", "idle:ms=60000"],
    );
    let sock = c.sock();
    // A connection to C that outlives its socket file.
    let mut to_c = Conn::new(connect_when_up(&sock));
    std::fs::remove_file(&sock).unwrap();
    // D serves the same path.
    let dir_d = temp_dir("sig-sock-d");
    let mut d = Command::new(bin())
        .args([
            "run",
            "--vcpus",
            "1",
            "--workload",
            "idle:ms=60000",
            "--report",
            "none",
        ])
        .arg("--api-sock")
        .arg(&sock)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut to_d = Conn::new(connect_when_up(&sock));
    // C ends: D's socket file stays, and D still answers on it.
    to_c.ok(json!({"cmd": "shutdown"}));
    let (out, _, _dir) = c.finish();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(sock.exists(), "C removed D's socket file");
    let mut again = Conn::new(connect_when_up(&sock));
    assert_eq!(again.ok(json!({"cmd": "version"}))["api"], json!(1));
    // D ends and removes its own.
    to_d.ok(json!({"cmd": "shutdown"}));
    assert_eq!(d.wait().unwrap().code(), Some(0));
    assert!(!sock.exists(), "D removed its own socket file");
    drop(dir_d);
}

/// Makes a FIFO at `path`; nobody writes it, so whoever opens it to read waits in `open`.
fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// Waits (up to 10 s) until process `pid`'s main thread sleeps in the kernel's `open` of a
/// FIFO (`fifo_open`, or `wait_for_partner` inside it, as /proc/PID/wchan names it).
fn wait_in_fifo_open(pid: u32) {
    for _ in 0..1000 {
        let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
        if wchan == "fifo_open" || wchan == "wait_for_partner" {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("pid {pid} never waited in the open of a FIFO");
}

/// A child killed (SIGKILL) and reaped when dropped, so that a failed test leaves no VMM.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Issue 39, item 5: a VMM blocked at start (a FIFO planted as its descriptor) ignored SIGTERM
/// twice and SIGINT, and only SIGKILL ended it: the stop signals were blocked from the start
/// but nothing took them until the VM was built. Now the `signals` thread starts first thing,
/// and a VMM stuck anywhere in its start-up (here in `open` of a FIFO named as its tiny image,
/// or as its config file) ends on the first stop signal within a second, with 128 + its
/// number and a sentence.
#[test]
fn a_vmm_stuck_in_start_up_ends_on_a_stop_signal_within_a_second() {
    common::require_kvm();
    let dir = temp_dir("sig-startup");
    let fifo = dir.as_path().join("stuck");
    mkfifo(&fifo);
    let run_dir = dir.as_path().join("run");
    let fifo_s = fifo.to_str().unwrap();
    let run_s = run_dir.to_str().unwrap();
    let cases: [(&[&str], libc::c_int, &str); 3] = [
        (
            &[
                "--tiny-image",
                fifo_s,
                "--name",
                "stuck",
                "--run-dir",
                run_s,
            ],
            libc::SIGTERM,
            "SIGTERM",
        ),
        (&["--config", fifo_s], libc::SIGINT, "SIGINT"),
        (&["--tiny-image", fifo_s], libc::SIGHUP, "SIGHUP"),
    ];
    for (args, signo, name) in cases {
        let mut child = KillOnDrop(
            Command::new(bin())
                .arg("run")
                .args(args)
                .args(["--report", "none"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        wait_in_fifo_open(child.0.id());
        // SAFETY: kill takes plain integers; the pid is our own child, still unwaited.
        assert_eq!(unsafe { libc::kill(child.0.id() as libc::pid_t, signo) }, 0);
        let mut ended = None;
        for _ in 0..100 {
            if let Some(s) = child.0.try_wait().unwrap() {
                ended = Some(s);
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let Some(status) = ended else {
            panic!("{args:?}: {name} did not end the VMM stuck in its start-up within 1 s");
        };
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.0.stderr.take().unwrap(), &mut err).unwrap();
        assert_eq!(status.code(), Some(128 + signo), "{args:?}: {err}");
        assert!(
            err.contains(&format!("{name} from pid")) && err.contains("being set up"),
            "{args:?}: {err}"
        );
    }
}
