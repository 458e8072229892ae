//! Seccomp end to end: each thread kind's filter stops a forbidden call (in a child process of
//! this test binary), and the binary under `--seccomp kill` completes every workload and every
//! control path, so the allow-lists are complete (a missing entry would end the run with status
//! 159 and the SIGSYS message on stderr).

mod common;

use std::ffi::CStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Output};
use std::time::Duration;

use common::vmm::{bin, temp_dir, Conn, Vmm};
use ppa_vmm::accounting::switches::PERF_FLAG_FD_CLOEXEC;
use ppa_vmm::seccomp::{self, Kind, Mode, EXIT_SECCOMP};
use serde_json::{json, Value};

/// KVM_RUN's number (<linux/kvm.h>, x86_64; a unit test checks that the KVM backend's, which
/// the vCPU thread's filter allows, is this one).
const KVM_RUN: u64 = 0xae80;

/// A system call a child makes after it entered a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    /// socket(AF_INET, SOCK_STREAM): no thread opens sockets after set-up.
    Socket,
    /// execve of /bin/true.
    Execve,
    /// mmap of an executable anonymous page.
    MmapExec,
    /// mmap of a read-write anonymous page.
    MmapData,
    /// tgkill of a thread of this process with SIGKILL (not the kick signal).
    TgkillOther,
    /// tgkill of a thread of this process with SIGABRT (a panic's abort).
    TgkillAbort,
    /// openat for writing.
    OpenWrite,
    /// openat of /proc/self/stat read-only.
    OpenRead,
    /// ioctl KVM_CREATE_VM on a bad descriptor.
    IoctlCreateVm,
    /// ioctl KVM_RUN on a bad descriptor (EBADF when allowed).
    IoctlRun,
    /// ptrace(PTRACE_TRACEME).
    Ptrace,
    /// perf_event_open of a software event on the calling thread, as level full opens its
    /// context-switch records (it may fail by perf_event_paranoid; the filter must let it be made).
    PerfSelf,
    /// perf_event_open of the same event on process 1: another process observed.
    PerfOther,
}

const CALLS: [Call; 13] = [
    Call::Socket,
    Call::Execve,
    Call::MmapExec,
    Call::MmapData,
    Call::TgkillOther,
    Call::TgkillAbort,
    Call::OpenWrite,
    Call::OpenRead,
    Call::IoctlCreateVm,
    Call::IoctlRun,
    Call::Ptrace,
    Call::PerfSelf,
    Call::PerfOther,
];

/// Makes `call` with a raw system call.
fn make(call: Call) {
    const PROC_STAT: &CStr = c"/proc/self/stat";
    const NO_FILE: &CStr = c"/nonexistent/ppa-seccomp-test";
    const TRUE: &CStr = c"/bin/true";
    // SAFETY: each call takes plain integers or pointers to the static strings and arrays
    // here; one the filter lets through fails harmlessly (a bad descriptor, a missing path, a
    // thread id that cannot exist) or is undone by the child's exit (a mapping, a socket);
    // execve of /bin/true replaces the child, which then exits 0 like an allowed call.
    unsafe {
        match call {
            Call::Socket => {
                libc::syscall(libc::SYS_socket, libc::AF_INET, libc::SOCK_STREAM, 0);
            }
            Call::Execve => {
                let argv = [TRUE.as_ptr(), std::ptr::null()];
                let envp: [*const libc::c_char; 1] = [std::ptr::null()];
                libc::syscall(
                    libc::SYS_execve,
                    TRUE.as_ptr(),
                    argv.as_ptr(),
                    envp.as_ptr(),
                );
            }
            Call::MmapExec | Call::MmapData => {
                let prot = if call == Call::MmapExec {
                    libc::PROT_READ | libc::PROT_EXEC
                } else {
                    libc::PROT_READ | libc::PROT_WRITE
                };
                let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
                libc::syscall(libc::SYS_mmap, 0, 4096, prot, flags, -1, 0);
            }
            Call::TgkillOther | Call::TgkillAbort => {
                let sig = if call == Call::TgkillOther {
                    libc::SIGKILL
                } else {
                    libc::SIGABRT
                };
                libc::syscall(libc::SYS_tgkill, libc::getpid(), i32::MAX, sig);
            }
            Call::OpenWrite => {
                libc::syscall(
                    libc::SYS_openat,
                    libc::AT_FDCWD,
                    NO_FILE.as_ptr(),
                    libc::O_WRONLY,
                );
            }
            Call::OpenRead => {
                libc::syscall(
                    libc::SYS_openat,
                    libc::AT_FDCWD,
                    PROC_STAT.as_ptr(),
                    libc::O_RDONLY,
                );
            }
            Call::IoctlCreateVm => {
                libc::syscall(libc::SYS_ioctl, -1, 0xae01u64, 0);
            }
            Call::IoctlRun => {
                libc::syscall(libc::SYS_ioctl, -1, KVM_RUN, 0);
            }
            Call::Ptrace => {
                libc::syscall(libc::SYS_ptrace, libc::PTRACE_TRACEME, 0, 0, 0);
            }
            Call::PerfSelf | Call::PerfOther => {
                // perf_event_attr: type PERF_TYPE_SOFTWARE (1), size 128 (PERF_ATTR_SIZE_VER8),
                // config PERF_COUNT_SW_DUMMY (9), disabled and exclude_kernel.
                let mut attr = [0u64; 16];
                attr[0] = 1 | (128 << 32);
                attr[1] = 9;
                attr[5] = 1 | (1 << 5);
                let pid: libc::c_int = if call == Call::PerfSelf { 0 } else { 1 };
                let fd = libc::syscall(
                    libc::SYS_perf_event_open,
                    attr.as_ptr(),
                    pid,
                    -1 as libc::c_int,
                    -1 as libc::c_int,
                    PERF_FLAG_FD_CLOEXEC,
                );
                if fd >= 0 {
                    libc::close(fd as libc::c_int);
                }
            }
        }
    }
}

/// The environment variable that makes [`child_process`] a child: `KIND MODE CALL-INDEX...`.
const CHILD: &str = "PPA_VMM_SECCOMP_TEST_CHILD";

/// Runs this test binary again as a child that enters `kind` under `mode` and makes `calls`
/// in order; returns its exit status (-signal if a signal ended it) and its stderr.
fn in_child(kind: Kind, mode: Mode, calls: &[Call]) -> (i32, String) {
    use std::os::unix::process::ExitStatusExt;
    let mut spec = format!("{} {}", kind.name(), mode.name());
    for c in calls {
        spec += &format!(" {}", CALLS.iter().position(|x| x == c).unwrap());
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD, spec)
        .output()
        .unwrap();
    let code = out
        .status
        .code()
        .unwrap_or_else(|| -out.status.signal().unwrap_or(0));
    (code, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The child of [`in_child`] (does nothing in a normal test run).
#[test]
fn child_process() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let mut words = spec.split(' ');
    let kind = words.next().unwrap();
    let kind = Kind::ALL.into_iter().find(|k| k.name() == kind).unwrap();
    let mode = match words.next().unwrap() {
        "kill" => Mode::Kill,
        _ => Mode::Log,
    };
    let calls: Vec<Call> = words.map(|w| CALLS[w.parse::<usize>().unwrap()]).collect();
    seccomp::arm(mode);
    if let Err(e) = seccomp::enter_with(kind, mode) {
        eprintln!("cannot enter {}: {e}", kind.name());
        std::process::exit(3);
    }
    for c in calls {
        make(c);
    }
    // SAFETY: _exit ends the child at once; the harness has nothing to clean up for it.
    unsafe { libc::_exit(0) };
}

#[test]
fn a_forbidden_call_from_each_kind_stops_the_process() {
    let forbidden = [
        (Call::Socket, libc::SYS_socket),
        (Call::Execve, libc::SYS_execve),
        (Call::MmapExec, libc::SYS_mmap),
        (Call::TgkillOther, libc::SYS_tgkill),
        (Call::Ptrace, libc::SYS_ptrace),
        (Call::IoctlCreateVm, libc::SYS_ioctl),
        (Call::OpenWrite, libc::SYS_openat),
    ];
    for kind in Kind::ALL {
        for (call, nr) in forbidden {
            if kind == Kind::Main && call == Call::OpenWrite {
                continue; // the main thread writes the report
            }
            let (code, stderr) = in_child(kind, Mode::Kill, &[call]);
            assert_eq!(code, EXIT_SECCOMP, "{} {call:?}: {stderr}", kind.name());
            let says = format!("the {} thread made system call {nr},", kind.name());
            assert!(stderr.contains(&says), "{} {call:?}: {stderr}", kind.name());
        }
    }
}

#[test]
fn listed_calls_pass_and_log_mode_lets_forbidden_ones_through() {
    for kind in Kind::ALL {
        let listed = [Call::MmapData, Call::OpenRead, Call::TgkillAbort];
        let (code, stderr) = in_child(kind, Mode::Kill, &listed);
        assert_eq!(code, 0, "{}: {stderr}", kind.name());
        let (code, stderr) = in_child(kind, Mode::Log, &[Call::Socket, Call::IoctlCreateVm]);
        assert_eq!(code, 0, "{} in log mode: {stderr}", kind.name());
    }
    let (code, stderr) = in_child(Kind::Vcpu, Mode::Kill, &[Call::IoctlRun]);
    assert_eq!(code, 0, "KVM_RUN from a vCPU thread: {stderr}");
    let (code, _) = in_child(Kind::Api, Mode::Kill, &[Call::IoctlRun]);
    assert_eq!(code, EXIT_SECCOMP, "KVM_RUN from the api thread");
    // Level full's records: a vCPU thread may open a perf event on itself, not on another
    // process, and no other kind may open one.
    let (code, stderr) = in_child(Kind::Vcpu, Mode::Kill, &[Call::PerfSelf]);
    assert_eq!(
        code, 0,
        "perf_event_open on itself from a vCPU thread: {stderr}"
    );
    let (code, stderr) = in_child(Kind::Vcpu, Mode::Kill, &[Call::PerfOther]);
    assert_eq!(code, EXIT_SECCOMP, "perf_event_open on process 1: {stderr}");
    let says = format!("made system call {},", libc::SYS_perf_event_open);
    assert!(stderr.contains(&says), "{stderr}");
    let (code, _) = in_child(Kind::Api, Mode::Kill, &[Call::PerfSelf]);
    assert_eq!(code, EXIT_SECCOMP, "perf_event_open from the api thread");
}

/// Asserts that a run under `--seccomp kill` was not stopped by a filter.
fn assert_not_killed(out: &Output, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() != Some(EXIT_SECCOMP) && !stderr.contains("seccomp filter forbids"),
        "{what}: {stderr}"
    );
}

/// `ppa-vmm run --seccomp kill ARGS`.
fn run(args: &[&str]) -> Output {
    common::require_kvm();
    Command::new(bin())
        .args(["run", "--seccomp", "kill"])
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn every_workload_completes_under_kill() {
    let _g = common::serial();
    let dir = temp_dir("seccomp-workloads");
    let report = dir.as_path().join("report.json");
    let hist = dir.as_path().join("hist.txt");
    let out = run(&[
        "--max-runtime",
        "60",
        "--vcpus",
        "9",
        "--accounting",
        "full",
        "--workload",
        "0=busy:ms=300",
        "--workload",
        "1=idle:ms=300",
        "--workload",
        "2=periodic:count=60",
        "--workload",
        "3=exits:n=2000",
        "--workload",
        "4=exits:n=2000,kind=pio",
        "--workload",
        "5=memtouch:mib=4",
        "--workload",
        "6=hostile:ms=200,mode=all",
        "--workload",
        "7=mixed:ms=300",
        "--workload",
        "8=mixed:ms=300",
        "--report",
        "json",
        "--report-file",
        report.to_str().unwrap(),
        "--histograms-file",
        hist.to_str().unwrap(),
    ]);
    assert_not_killed(&out, "workloads");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(r["vcpus"].as_array().unwrap().len(), 9);
    assert!(std::fs::metadata(&hist).unwrap().len() > 0);
}

#[test]
fn faults_timeouts_limits_and_overload_actions_complete_under_kill() {
    let _g = common::serial();
    let cases: [(&[&str], i32); 6] = [
        // A vCPU's failure reads its registers (KVM_GET_REGS, KVM_GET_SREGS) for the report.
        (
            &[
                "--vcpus",
                "2",
                "--workload",
                "1=fault:kind=ud",
                "--workload",
                "0=busy:ms=2000",
            ],
            1,
        ),
        (&["--workload", "busy:ms=5000", "--max-runtime", "0.3"], 1),
        (
            &[
                "--vcpus",
                "2",
                "--workload",
                "busy:ms=400",
                "--cpu-limit",
                "50%",
                "--vcpu-group",
                "g:0:30%",
            ],
            0,
        ),
        (
            &[
                "--vcpus",
                "2",
                "--workload",
                "busy:ms=400",
                "--cpu-limit",
                "50%",
                "--limit-backend",
                "cgroup",
            ],
            0,
        ),
        (
            &[
                "--workload",
                "busy:ms=400",
                "--runaway",
                "50",
                "--overload-action",
                "throttle:50%",
            ],
            0,
        ),
        (
            &[
                "--workload",
                "busy:ms=3000",
                "--runaway",
                "50",
                "--overload-action",
                "pause",
                "--max-runtime",
                "0.6",
            ],
            1,
        ),
    ];
    for (args, code) in cases {
        let mut all = vec!["--report", "none"];
        if !args.contains(&"--max-runtime") {
            all.extend(["--max-runtime", "60"]);
        }
        all.extend_from_slice(args);
        let out = run(&all);
        assert_not_killed(&out, &args.join(" "));
        assert_eq!(
            out.status.code(),
            Some(code),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET /metrics over HTTP/1.0; the status line.
fn scrape(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.lines().next().unwrap_or_default().to_string()
}

/// Every command, /metrics, a subscriber and the PPA page, with `backend`'s limits.
fn control_paths(backend: &str) {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let vmm = Vmm::with_page(
        &format!("seccomp-api-{backend}"),
        &[
            "--seccomp",
            "kill",
            "--vcpus",
            "2",
            "--workload",
            "mixed:ms=60000",
            "--vcpu-group",
            "g:0-1:80%",
            "--limit-backend",
            backend,
            "--metrics-addr",
            &addr,
        ],
    );
    let mut sub = BufReader::new(std::os::unix::net::UnixStream::connect(&vmm.sock).unwrap());
    sub.get_mut()
        .write_all(b"{\"id\":0,\"cmd\":\"subscribe\"}\n")
        .unwrap();
    let mut line = String::new();
    sub.read_line(&mut line).unwrap();
    assert!(line.contains("\"ok\":true"), "{line}");
    let mut c: Conn = vmm.connect();
    let requests = [
        json!({"cmd": "version"}),
        json!({"cmd": "stats"}),
        json!({"cmd": "vcpu", "vcpu": 1}),
        json!({"cmd": "histogram", "name": "exit_handling"}),
        json!({"cmd": "histogram", "name": "guest_run", "vcpu": 0, "format": "text"}),
        json!({"cmd": "set-level", "level": "full"}),
        json!({"cmd": "set-thresholds", "exit_handling_ns": 1000, "guest_run_ns": 1000}),
        json!({"cmd": "threads"}),
        json!({"cmd": "set-limit", "group": "g", "limit": "60%"}),
        json!({"cmd": "groups"}),
        json!({"cmd": "guest"}),
        json!({"cmd": "pause"}),
        json!({"cmd": "resume"}),
        json!({"cmd": "reset", "vcpu": 0}),
        json!({"cmd": "reset"}),
        json!({"cmd": "metrics"}),
        json!({"cmd": "set-level", "level": "basic"}),
    ];
    for (i, mut r) in requests.into_iter().enumerate() {
        r["id"] = json!(i + 1);
        if backend == "cgroup" && r["cmd"] == "set-limit" {
            // Refused at run time with the cgroup backend (docs/limits.md).
            assert_eq!(c.call(r)["error"]["kind"], "bad-limit");
        } else {
            c.ok(r);
        }
        std::thread::sleep(Duration::from_millis(30));
    }
    assert_eq!(
        c.error_kind(b"{\"id\":99,\"cmd\":\"nope\"}"),
        "unknown-command"
    );
    for _ in 0..3 {
        assert_eq!(scrape(port), "HTTP/1.1 200 OK");
    }
    // An event reaches the subscriber (a threshold at 1 µs of exit handling is crossed).
    line.clear();
    sub.read_line(&mut line).unwrap();
    assert!(line.contains("\"event\""), "{line}");
    drop(c);
    let (code, report) = vmm.shutdown();
    assert_eq!(code, 0, "{report}");
}

#[test]
fn the_control_socket_metrics_and_page_work_under_kill() {
    let _g = common::serial();
    control_paths("vmm");
}

#[test]
fn the_control_paths_with_the_cgroup_backend_work_under_kill() {
    let _g = common::serial();
    control_paths("cgroup");
}

/// Every vCPU of a JSON report split level full with context-switch records.
fn assert_records(report: &Value, what: &str) {
    let vcpus = report["vcpus"].as_array().unwrap();
    assert!(!vcpus.is_empty(), "{what}: {report}");
    for v in vcpus {
        assert_eq!(v["split_source"], "records", "{what}: vCPU {}", v["id"]);
    }
}

#[test]
fn level_full_opens_its_records_under_the_default_mode() {
    let _g = common::serial();
    common::require_kvm();
    // No --seccomp: the binary's default (kill). Level full from the start: each vCPU thread
    // opens its context-switch records (perf_event_open, mmap, PERF_EVENT_IOC_ENABLE) after it
    // entered its filter.
    let dir = temp_dir("seccomp-full");
    let report = dir.as_path().join("report.json");
    let out = Command::new(bin())
        .args([
            "run",
            "--max-runtime",
            "60",
            "--vcpus",
            "2",
            "--accounting",
            "full",
            "--workload",
            "mixed:ms=300",
            "--report",
            "json",
            "--report-file",
            report.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_not_killed(&out, "--accounting full");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_records(&r, "--accounting full");

    // Level basic at start, full by the socket, then basic again: the records are opened and
    // enabled at run time, then disabled, all under the filter. vCPU 1 of `mixed` exits often
    // (vCPU 0 spins in the guest and may not reach a KVM_RUN boundary at level full).
    let vmm = Vmm::start(
        "seccomp-set-level",
        &["--vcpus", "2", "--workload", "mixed:ms=60000"],
    );
    let mut c: Conn = vmm.connect();
    c.ok(json!({"id": 1, "cmd": "set-level", "level": "full"}));
    std::thread::sleep(Duration::from_millis(300));
    let v = c.ok(json!({"id": 2, "cmd": "vcpu", "vcpu": 1}));
    assert_eq!(v["split_source"], "records", "{v}");
    c.ok(json!({"id": 3, "cmd": "set-level", "level": "basic"}));
    std::thread::sleep(Duration::from_millis(100));
    drop(c);
    let (code, report) = vmm.shutdown();
    assert_eq!(code, 0, "{report}");
    let v1 = &report["vcpus"][1];
    assert_eq!(
        v1["split_source"], "records",
        "set-level full at run time: {v1}"
    );
}
