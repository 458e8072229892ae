//! End-to-end checks of the tiny guest on KVM with AMD SVM, run inside the nested test host
//! (`scripts/nested-run.sh`: QEMU TCG emulating an SVM CPU, Debian's kernel with kvm-amd). This
//! machine's own KVM (the PVM backend) behaves differently in places, so these runs are our only
//! check of SVM: exact exit counts through KVM's statistics there, KVM's own tracepoints
//! splitting each KVM_RUN at level full (kvm_ns, in-kernel exits by reason adding up to KVM's
//! `exits` statistic exactly, CPUIDs counted one by one), and a triple fault that ends the run. Each case boots the nested host once (about 10 s here); QEMU must be installed
//! (scripts/setup.sh does it), and its absence is a failure, not a skip. One more case boots the
//! Linux guest image (images/linux/) directly under QEMU, to check its init and workload.

mod common;

use std::process::{Command, Output};

use common::nested::*;
use serde_json::Value;

/// How many runs [`nested_retrying_emulated_triple_faults`] makes at most.
const TRIPLE_FAULT_TRIES: usize = 3;

/// [`nested`] with kvm-amd's shadow paging (`npt=0`), run again (up to [`TRIPLE_FAULT_TRIES`]
/// runs, each retry printed) when a vCPU of the tiny guest still ends in a triple fault with
/// its registers in reset state. Why (docs/linux.md, "A fault of the emulator"): with nested
/// paging the same 4-vCPU exits workload made a vCPU triple-fault in 6 of 75 runs in the nested
/// SVM host (both accounting levels, this build and the one before), right after an MMIO or
/// port exit, and in 0 of 40 on this machine's KVM; with `npt=0`, 0 of 25. It is the emulated
/// CPU's nested paging that the Linux guest's test already avoids. A regression that faults
/// every run still fails the test.
fn nested_retrying_emulated_triple_faults(args: &[&str]) -> Output {
    for attempt in 1..=TRIPLE_FAULT_TRIES {
        let out = nested_with(args, Some("npt=0"));
        let faulted = serde_json::from_slice::<Value>(&out.stdout)
            .ok()
            .and_then(|r| r["vcpus"].as_array().cloned())
            .is_some_and(|vs| {
                vs.iter().any(|v| {
                    let f = &v["failure"];
                    f["regs"]["reset"] == true
                        && f["reason"]
                            .as_str()
                            .is_some_and(|r| r.contains("triple fault"))
                })
            });
        if !faulted || attempt == TRIPLE_FAULT_TRIES {
            return out;
        }
        eprintln!(
            "run {attempt} of {TRIPLE_FAULT_TRIES}: a vCPU triple-faulted in the emulated SVM \
             host ({}); running again",
            ends(&out)
        );
    }
    unreachable!("the last run returns")
}

/// Why each vCPU ended, from the JSON report on stdout (or the start of stdout when it is not
/// one): what a failed run's message needs beside stderr.
fn ends(o: &Output) -> String {
    match serde_json::from_slice::<Value>(&o.stdout) {
        Ok(r) => r["vcpus"]
            .as_array()
            .map(|vs| {
                vs.iter()
                    .map(|v| {
                        format!(
                            "vCPU {}: {} {} {}",
                            v["id"], v["end"], v["exit_code"], v["failure"]
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_default(),
        Err(_) => String::from_utf8_lossy(&o.stdout)
            .chars()
            .take(2000)
            .collect(),
    }
}

fn count(v: &Value, path: &[&str]) -> u64 {
    let mut at = v;
    for key in path {
        at = &at[*key];
    }
    at.as_u64()
        .unwrap_or_else(|| panic!("vCPU {} has no count at {path:?}: {at}", v["id"]))
}

/// At level full on SVM, KVM's tracepoints split every KVM_RUN: KVM's in-kernel exits by
/// reason with the userspace exits that came from a VM exit make up KVM's `exits` statistic
/// exactly, and kvm_ns is measured. With `strict` (vCPUs that run for seconds), the records'
/// time on a CPU also agrees with the clock's and the on-CPU time inside KVM_RUN is guest, kvm
/// and the interrupts taken there within the identity's tolerance; for short vCPUs the two are
/// printed, not asserted: under QEMU's emulation with the outer host loaded the two clocks were
/// seen 8 % apart on a 130 ms vCPU (CI, stop 30), and the comparison is the accuracy test's on
/// this machine's own KVM (tests/accuracy.rs), where time means something.
fn assert_kvm_split(v: &Value, strict: bool) {
    let id = &v["id"];
    let n = |k: &str| {
        v[k].as_u64()
            .unwrap_or_else(|| panic!("vCPU {id} has no {k}: {v}"))
    };
    assert_eq!(v["split_source"], "tracepoints", "vCPU {id}: {v}");
    assert_eq!(n("records_lost"), 0, "vCPU {id}");
    // Measured (not null), and positive unless the split had nothing left for it: it takes
    // vmm_ns and interrupted_ns from the records first, and on a short vCPU under this
    // emulation the records can see milliseconds more on a CPU than the thread CPU clock
    // (printed below), whose reads there lag and then jump: one advanced 8.65 ms across a
    // KVM_RUN of 50 µs wall (2026-12-01), and a 7 ms vCPU's clock ended 2 ms below its
    // records. That needs the records above the clock, so a kvm_ns of 0 with the records at
    // or below it still fails.
    let squeezed = !strict && n("records_on_cpu_ns") > n("used_ns") - n("park_cpu_ns");
    assert!(
        n("kvm_ns") > 0 || squeezed,
        "vCPU {id}: kvm_ns 0 with the records at or below the clock: {v}"
    );
    let (guest, kvm, irq) = (n("guest_ns"), n("kvm_ns"), n("interrupted_ns"));
    assert_eq!(guest + kvm + irq + n("vmm_ns"), n("used_ns"), "vCPU {id}");
    let in_kernel: u64 = v["kvm_exits"]
        .as_object()
        .expect("kvm_exits")
        .values()
        .map(|x| x.as_u64().unwrap())
        .sum();
    let to_user = n("kvm_exits_to_user");
    assert_eq!(
        in_kernel + to_user,
        count(v, &["kvm_stats", "exits"]),
        "vCPU {id}: in-kernel exits {in_kernel} + {to_user} that reached userspace: {v}"
    );
    // Every userspace exit but `intr` is one VM exit KVM forwarded; an `intr` exit follows an
    // exit KVM handled itself, or none (a kick before entry).
    let user: u64 = v["exits"]
        .as_object()
        .unwrap()
        .values()
        .map(|x| x.as_u64().unwrap())
        .sum();
    assert_eq!(
        to_user,
        user - count(v, &["exits", "intr"]),
        "vCPU {id}: {to_user} of {user} userspace exits came from a VM exit: {v}"
    );
    // The records measured the time on a CPU per interval, inside KVM_RUN and out; the split
    // takes the thread CPU clock's total (used_ns). The two see the same time but stamp each
    // context switch at different points (perf writes the switch-in record after scheduling
    // the thread's events in, the clock starts before: docs/accounting.md), a few µs per
    // switch on hardware and tens under this emulation, so for long vCPUs they agree within
    // the identity's tolerance plus 5 % of the time on a CPU here.
    let (wall, in_run) = (n("wall_ns"), n("kvm_run_cpu_ns"));
    let records = n("records_on_cpu_ns");
    assert!(
        in_run <= records,
        "vCPU {id}: {in_run} inside KVM_RUN of {records}: {v}"
    );
    let on = n("used_ns") - n("park_cpu_ns");
    let parts = guest + kvm + irq;
    if strict {
        let tol = ppa_vmm_api::TimeSplit::identity_tolerance_ns(wall, true) + on / 20;
        assert!(
            records.abs_diff(on) <= tol,
            "vCPU {id}: the records saw {records} ns on a CPU, the clock {on} (tolerance {tol})"
        );
        // Issue 25's bar for the Linux guest: guest + kvm + interrupted is the time on a CPU
        // inside KVM_RUN within the identity's own tolerance (interrupts outside KVM_RUN are in
        // interrupted_ns too). Its vCPUs run for seconds, so the clocks' difference at switches
        // (0.2-0.6 % of on-CPU time here) stays inside it.
        let tol = ppa_vmm_api::TimeSplit::identity_tolerance_ns(wall, true);
        assert!(
            parts + tol >= in_run && parts <= in_run + irq + tol,
            "vCPU {id}: guest {guest} + kvm {kvm} + interrupted {irq} against {in_run} on a \
             CPU inside KVM_RUN (tolerance {tol})"
        );
    }
    eprintln!(
        "vCPU {id}: guest {guest} kvm {kvm} interrupted {irq} ns, {} ns more than the records \
         saw inside KVM_RUN; clock - records {} ns; in-kernel exits {}; interrupts {}",
        parts as i64 - in_run as i64,
        on as i64 - records as i64,
        v["kvm_exits"],
        v["interrupts"]
    );
}

#[test]
fn exits_workloads_make_exactly_n_mmio_and_pio_exits_on_svm() {
    let (mmio, pio, pio_one, cpuid) = (1000, 1000, 1, 1000);
    // Level full: KVM's tracepoints split each vCPU's time too (assert_kvm_split), and the
    // CPUIDs of vCPU 3 never reach the VMM.
    let out = nested_retrying_emulated_triple_faults(&[
        "run",
        "--vcpus",
        "4",
        "--workload",
        &format!("0=exits:n={mmio},kind=mmio"),
        "--workload",
        &format!("1=exits:n={pio},kind=pio"),
        "--workload",
        &format!("2=exits:n={pio_one},kind=pio"),
        "--workload",
        &format!("3=exits:n={cpuid},kind=cpuid"),
        "--accounting",
        "full",
        "--report",
        "json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}; ends: {}",
        stderr(&out),
        ends(&out)
    );
    let r = report(&out);
    assert_eq!(r["vm"]["end"], "completed");
    let vcpus = r["vcpus"].as_array().expect("a vcpus array");
    assert_eq!(vcpus.len(), 4);
    for v in vcpus {
        assert_eq!(v["exit_code"], 0, "vCPU {} ended {}", v["id"], v["end"]);
        assert_kvm_split(v, false);
    }
    // Each CPUID was one in-kernel exit, exactly, and none reached the VMM.
    let c = &vcpus[3];
    assert_eq!(count(c, &["kvm_exits", "cpuid"]), cpuid, "{c}");
    assert_eq!(count(c, &["guest_reported", "iterations"]), cpuid);
    assert!(count(c, &["kvm_exit_ns", "cpuid"]) > 0, "{c}");
    assert_eq!(
        c["histograms"]["kvm_exit_handling.cpuid"]["count"], cpuid,
        "one handling time per CPUID: {c}"
    );
    for (v, kind, n) in [
        (&vcpus[0], "mmio", mmio),
        (&vcpus[1], "pio", pio),
        (&vcpus[2], "pio", pio_one),
    ] {
        assert_eq!(v["exit_code"], 0, "vCPU {} ended {}", v["id"], v["end"]);
        let bell = format!("workload_{kind}");
        assert_eq!(count(v, &["doorbells", &bell]), n, "vCPU {}", v["id"]);
        assert_eq!(count(v, &["guest_reported", "iterations"]), n);
        // The protocol's own doorbells (console, reports, exit) are MMIO writes too.
        let protocol = count(v, &["doorbells", "console"])
            + count(v, &["doorbells", "report"])
            + count(v, &["doorbells", "exit"]);
        let (mmio_writes, io_outs) = match kind {
            "mmio" => (n + protocol, 0),
            _ => (protocol, n),
        };
        assert_eq!(count(v, &["exits", "mmio_write"]), mmio_writes);
        assert_eq!(count(v, &["exits", "io_out"]), io_outs);
        // On SVM, KVM counts a port write that reached the VMM as an I/O exit and every MMIO
        // write as an MMIO exit (on this machine's PVM backend, port I/O is insn_emulation).
        assert_eq!(count(v, &["kvm_stats", "io_exits"]), io_outs);
        assert_eq!(count(v, &["kvm_stats", "mmio_exits"]), mmio_writes);
    }
}

#[test]
fn a_fault_ends_the_run_with_exit_code_1_and_the_others_stop_on_svm() {
    let out = nested(&[
        "run",
        "--vcpus",
        "3",
        "--workload",
        "busy:ms=5000",
        "--workload",
        "1=fault:kind=hlt",
        "--report",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(1), "stderr: {}", stderr(&out));
    let r = report(&out);
    assert_eq!(r["vm"]["end"], "failed");
    let f = &r["vcpus"][1];
    assert_eq!(f["end"], "failed");
    assert_eq!(count(f, &["exits", "shutdown"]), 1);
    let reason = f["failure"]["reason"].as_str().expect("a failure reason");
    assert!(reason.contains("shut down"), "{reason}");
    // SVM hands the registers of a triple-faulted vCPU back in reset state (CS 0xf000, RIP
    // 0xfff0), unlike this machine's KVM: print what came back, check only that it came.
    assert!(f["failure"]["regs"].is_object(), "registers reported: {f}");
    eprintln!("registers after the fault on SVM: {}", f["failure"]["regs"]);
    // The 5 s busy vCPUs cannot have finished: the VMM stopped them, without failure.
    for other in [&r["vcpus"][0], &r["vcpus"][2]] {
        assert_eq!(other["end"], "stopped", "vCPU {}", other["id"]);
        assert!(other["failure"].is_null(), "vCPU {}", other["id"]);
    }
}

#[test]
fn bad_input_comes_back_as_exit_code_2_with_stderr_apart_from_stdout() {
    // An argument with spaces in it must reach ppa-vmm in the nested host as one argument.
    let spec = "busy:ms=1 two words";
    let out = nested(&["run", "--workload", spec, "--report", "json"]);
    assert_eq!(out.status.code(), Some(2), "stderr: {}", stderr(&out));
    assert!(out.stdout.is_empty(), "nothing on stdout: {:?}", out.stdout);
    let err = stderr(&out);
    assert!(
        err.contains(&format!("`{spec}`")),
        "stderr names the whole spec: {err}"
    );
    assert!(
        err.contains("nested-run: ppa-vmm exited with 2 after "),
        "the script reports its tries: {err}"
    );
}

/// The `key=value` fields of the first console line that starts with `tag` and has `name=NAME`.
fn console_fields(console: &str, tag: &str, name: &str) -> Vec<(String, String)> {
    let line = console
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .find(|l| l.starts_with(tag) && l.split(' ').any(|w| w == format!("name={name}")))
        .unwrap_or_else(|| panic!("no {tag} line for {name} on the console:\n{console}"));
    line.split(' ')
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn the_linux_guest_image_runs_its_workload_and_reboots_under_qemu() {
    let _g = NESTED.lock().unwrap_or_else(|e| e.into_inner());
    require_qemu();
    let ms = 300u64;
    let run = || {
        Command::new(repo_path("images/linux/qemu-run.sh"))
            .args(["--timeout", TRY_TIMEOUT_S])
            .arg(format!("ppa.workload=spin:threads=2,ms={ms}"))
            .output()
            .expect("images/linux/qemu-run.sh runs")
    };
    // A second try only when QEMU hung (exit 124): the image's own faults fail at once.
    let mut out = run();
    if out.status.code() == Some(124) {
        out = run();
    }
    let console = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}\nconsole:\n{console}",
        stderr(&out)
    );
    for name in ["spin-0", "spin-1"] {
        let fields = console_fields(&console, "PPA-THREAD ", name);
        let cpu_ns: u64 = fields
            .iter()
            .find(|(k, _)| k == "cpu_ns")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} has no cpu_ns: {fields:?}"));
        assert!(
            cpu_ns >= ms * 1_000_000,
            "{name} spun {cpu_ns} ns of its CPU clock, at least {ms} ms"
        );
    }
    assert!(console.contains("PPA-PROC-STAT cpu "), "{console}");
    assert!(
        console.contains("PPA-WORKLOAD-DONE workload=spin:threads=2,ms=300 rc=0 "),
        "{console}"
    );
}

/// The steal the guest's kernel saw on `cpu` (its /proc/stat line at the workload's end), ns.
fn guest_steal_ns(console: &str, cpu: usize) -> u64 {
    let tag = format!("PPA-PROC-STAT cpu{cpu} ");
    let line = console
        .lines()
        .find_map(|l| l.split_once(&tag).map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no {tag:?} line on the console"));
    // user nice system idle iowait irq softirq steal …, in USER_HZ (100) ticks.
    let steal: u64 = line
        .split_whitespace()
        .nth(7)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no steal field in {line:?}"));
    steal * 10_000_000
}

#[test]
fn a_linux_guest_boots_runs_its_workload_on_two_vcpus_and_every_figure_adds_up_on_svm() {
    let ms = 500u64;
    // The nested host's kvm-amd runs this guest with shadow paging (npt=0): with the emulated
    // CPU's nested paging (QEMU 7.2 TCG) about 1 boot in 10 triple-faulted in mid-boot, and the
    // nested host's KVM trace of one showed the emulator at fault: the first instruction after
    // a VMRUN, at the kernel text address the guest had just executed, took a not-present #PF
    // on its fetch (SHUTDOWN with intr_info 0x80000b0e, error code 0x10), with nothing between
    // the exit and the entry but a port read of the serial line (docs/linux.md).
    let out = nested_with(
        &[
            "run",
            "--kernel",
            "/images/linux/vmlinuz",
            "--initrd",
            "/images/linux/initrd.img",
            "--vcpus",
            "2",
            "--memory-mib",
            "512",
            "--accounting",
            "full",
            "--cmdline",
            &format!("ppa.workload=spin:threads=2,ms={ms}"),
            "--report",
            "json",
        ],
        Some("npt=0"),
    );
    let err = stderr(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {err}\nstdout (the report, with each vCPU's end and registers): {}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The guest's console lines reach stderr tagged with their device.
    let console: String = err
        .lines()
        .filter_map(|l| l.strip_prefix("[ttyS0] "))
        .collect::<Vec<_>>()
        .join("\n");
    let r = report(&out);
    // The guest rebooted through the keyboard controller when its workload was done.
    assert_eq!(r["vm"]["end"], "completed", "stderr: {err}");
    assert!(
        console.contains("PPA-WORKLOAD-DONE workload=spin:threads=2,ms=500 rc=0 "),
        "{err}"
    );
    let cmdline = r["vm"]["cmdline"].as_str().expect("the command line");
    assert!(cmdline.contains("ppa.page=0x"), "{cmdline}");
    // The guest agent published the finished workload: init waited one agent interval after
    // it, and the agent keeps an exited thread published (state X, its final figures) for
    // 3 samples, so the page at the reboot still lists both threads.
    let g = &r["guest"];
    assert_eq!(g["published"], true, "the agent published: {g}");
    assert!(
        g["agent"].is_object(),
        "the agent's record is in the report: {g}"
    );
    let threads = g["threads"].as_array().expect("the guest's threads");
    let mut guest_cpu = 0;
    for name in ["spin-0", "spin-1"] {
        let fields = console_fields(&console, "PPA-THREAD ", name);
        let cpu_ns: u64 = fields
            .iter()
            .find(|(k, _)| k == "cpu_ns")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} has no cpu_ns: {fields:?}"));
        assert!(cpu_ns >= ms * 1_000_000, "{name} spun {cpu_ns} ns");
        guest_cpu += cpu_ns;
        let t = threads
            .iter()
            .find(|t| t["comm"] == name)
            .unwrap_or_else(|| panic!("the agent did not publish {name}: {g}"));
        let on_cpu = t["on_cpu_ns"].as_u64().expect("on_cpu_ns");
        eprintln!(
            "{name}: published {on_cpu} ns, its own clock {cpu_ns} ns, state {}",
            t["state"]
        );
        assert!(
            on_cpu >= ms * 1_000_000,
            "{name}: published {on_cpu} ns, less than the {ms} ms it spun: {t}"
        );
        // With exit notifications the figure is the scheduler's at the exit, which the
        // thread's last clock read (the console's cpu_ns, counted from its start) made current.
        if g["agent"]["taskstats"] == true {
            assert!(
                on_cpu >= cpu_ns,
                "{name}: published {on_cpu} ns < {cpu_ns} ns: {t}"
            );
        }
        assert_eq!(t["state"], "X", "{name} exited: {t}");
    }
    let vcpus = r["vcpus"].as_array().expect("a vcpus array");
    assert_eq!(vcpus.len(), 2);
    let mut guest_ns = 0;
    for (i, v) in vcpus.iter().enumerate() {
        let n = |k: &str| {
            v[k].as_u64()
                .unwrap_or_else(|| panic!("vCPU {i} has no {k}: {v}"))
        };
        assert!(
            n("guest_ns") > 0 && n("used_ns") >= n("guest_ns"),
            "vCPU {i}"
        );
        // KVM's tracepoints split every KVM_RUN of a Linux guest too: its in-kernel exits by
        // reason, kvm_ns, the interrupts (and the identity below holds with them).
        assert_kvm_split(v, true);
        // A Linux guest halts in the kernel (in-kernel irqchip) and its exits are mostly
        // handled there: both show in KVM's statistics.
        assert!(n("halted_ns") > 0, "vCPU {i} never halted: {v}");
        assert!(count(v, &["kvm_stats", "halt_exits"]) > 0, "vCPU {i}");
        assert!(
            count(v, &["kvm_stats", "exits"]) > count(v, &["exits", "io_out"]),
            "vCPU {i}: KVM handled no exit in the kernel"
        );
        let (wall, e) = (n("wall_ns"), v["identity_error_ns"].as_i64().unwrap());
        assert!(
            ppa_vmm_api::identity_within(wall, e, true),
            "vCPU {i}: identity error {e} ns of wall {wall}: {v}"
        );
        // The guest's steal clock is KVM's view of the same run-queue wait, counted until
        // the guest read /proc/stat, in 10 ms ticks (rounded down). x86 KVM counts the vCPU
        // thread's wait from the thread's creation, before the VMM's clocks started: the
        // report gives that part as steal_before_start_ns (10-22 ms here, where a fixed
        // 20 ms allowance once fell short of the guest's excess by 0.7 ms).
        let seen = guest_steal_ns(&console, i);
        let before = n("steal_before_start_ns");
        eprintln!(
            "vCPU {i}: guest /proc/stat steal {seen} ns, steal_ns {} ns, before start {before} ns",
            n("steal_ns")
        );
        assert!(
            seen <= n("steal_ns") + before,
            "vCPU {i}: the guest saw {seen} ns of steal, the VMM {} ns and {before} ns before \
             its clocks started",
            n("steal_ns")
        );
        // The guest's threads' clocks count KVM's exits and the host's interrupts while
        // they ran: guest code alone can be below them, what ran inside KVM_RUN cannot.
        // (A figure that is not measured is inside guest_ns.)
        let measured = |k: &str| v[k].as_u64().unwrap_or(0);
        guest_ns += n("guest_ns") + measured("kvm_ns") + measured("interrupted_ns");
    }
    assert!(
        guest_ns >= guest_cpu,
        "the vCPUs' time inside KVM_RUN {guest_ns} ns is below what the guest's threads ran \
         {guest_cpu} ns"
    );
}

/// The Debian image (images/linux/build-rootfs.sh) on a virtio-blk root disk, booted by this
/// build in the nested host, through systemd to its workload and a clean power-off. Slow (the
/// whole of Debian's boot under an emulated CPU's nested KVM: docs/linux.md has the time), so
/// it runs only when asked for and the image is built:
///
///     images/linux/build.sh && images/linux/build-rootfs.sh
///     PPA_NESTED_SLOW=1 cargo test --release -p ppa-vmm-cli --test nested debian -- --nocapture
///
/// Otherwise it says why it did nothing and passes (CI builds no Debian image).
#[test]
fn the_debian_image_boots_from_its_disk_through_systemd_to_its_workload_on_svm() {
    let image = repo_path("images/linux/out/rootfs.ext4");
    if std::env::var_os("PPA_NESTED_SLOW").is_none_or(|v| v != "1") || !image.is_file() {
        eprintln!(
            "skipped: the Debian image's boot in the nested host runs with PPA_NESTED_SLOW=1 and \
             a built {} (images/linux/build-rootfs.sh); see docs/linux.md",
            image.display()
        );
        return;
    }
    let _g = NESTED.lock().unwrap_or_else(|e| e.into_inner());
    require_qemu();
    let ms = 500u64;
    let spec = format!("spin:threads=2,ms={ms}");
    let out = Command::new(repo_path("scripts/nested-run.sh"))
        .args(["--timeout", "900", "--tries", "2", "--"])
        .args([
            "run",
            "--kernel",
            "/images/linux/vmlinuz",
            "--initrd",
            "/images/linux/initrd.img",
            "--disk",
            "path=/images/linux/rootfs.ext4",
            "--cmdline",
            &format!("root=/dev/vda ppa.workload={spec}"),
            "--vcpus",
            "2",
            "--memory-mib",
            "1024",
            "--report",
            "json",
        ])
        .env("PPA_VMM", env!("CARGO_BIN_EXE_ppa-vmm"))
        .env("NESTED_KVM_AMD", "npt=0")
        .env("NESTED_ROOTFS", &image)
        .env_remove("NESTED_TAP_QUEUES")
        .output()
        .expect("scripts/nested-run.sh runs");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "stderr: {err}");
    let console = console(&out);
    let r = report(&out);
    assert_eq!(r["vm"]["end"], "completed", "stderr: {err}");
    assert!(
        console.contains("PPA-ROOT dev=/dev/vda mounted"),
        "{console}"
    );
    assert!(console.contains("init=systemd"), "{console}");
    assert!(
        console.contains(&format!(
            "PPA-WORKLOAD-DONE workload={spec} rc=0 agent=running "
        )),
        "{console}"
    );
    // The agent that published is the process systemd started for its unit. (The unit's
    // lines reach the console through the journal, after a `run-workload[PID]: ` prefix.)
    let after_tag: String = console
        .lines()
        .find_map(|l| {
            l.split_once("PPA-AGENT-UNIT ")
                .map(|(_, rest)| rest.to_string())
        })
        .unwrap_or_else(|| panic!("no PPA-AGENT-UNIT line on the console:\n{console}"));
    let unit = fields(&format!("PPA-AGENT-UNIT {after_tag}"), "PPA-AGENT-UNIT ");
    let g = &r["guest"];
    assert_eq!(g["published"], true, "{g}");
    assert_eq!(
        g["agent"]["pid"].as_u64(),
        Some(field(&unit, "pid")),
        "{unit:?} {g}"
    );
    assert!(
        unit.iter()
            .any(|(k, v)| k == "cgroup" && v.ends_with("/ppa-agent.service")),
        "{unit:?}"
    );
    assert_eq!(field(&unit, "delayacct"), 1, "{unit:?}");
    let threads = g["threads"].as_array().expect("the guest's threads");
    for name in ["spin-0", "spin-1", "systemd"] {
        assert!(
            threads.iter().any(|t| t["comm"] == name),
            "the agent did not publish {name}: {g}"
        );
    }
    // The root disk served the boot: reads, and systemd's writes.
    let disk = r["devices"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["kind"] == "blk"))
        .unwrap_or_else(|| panic!("no disk in the report: {}", r["devices"]));
    let reads = disk["blk"]["requests"]["read"].as_u64().unwrap_or(0);
    assert!(reads > 0, "{disk}");
}
