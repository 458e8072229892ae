//! The tests where KVM is not the point, on the fake hypervisor (feature `fake-hypervisor`), so
//! they run on a host without `/dev/kvm`: the control protocol over a real Unix socket, the
//! final report's shape, its identity and its exit counts against the scripted exits, and the
//! limiter stopping a busy vCPU. Each builds a whole VM in this process (`Vm::build` on a
//! `FakeHypervisor`) and runs it as `ppa-vmm run` would; the vCPUs replay scripts instead of
//! running a guest, so no test here needs, or opens, `/dev/kvm`.
//!
//! Run: `cargo test --release -p ppa-vmm-cli --features fake-hypervisor --test fake_backend`.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::thread::JoinHandle;

use common::vmm::{connect_when_up, temp_dir, Conn};
use ppa_guest_abi::{doorbell, DOORBELL_GPA, WORKLOAD_PIO_PORT};
use ppa_vmm::config::{RunOptions, VmConfig};
use ppa_vmm::fake_hypervisor::{FakeExit, FakeHypervisor, Step};
use ppa_vmm::report::Report;
use ppa_vmm::vm::{RunOutcome, Vm};
use ppa_vmm_api::{
    ErrorKind, Event, GroupStats, Response, Stats, ThrottleEndWhy, TimeSplit, VcpuEndKind,
    VcpuTimes, VmEnd, VmState,
};
use serde_json::{json, Value};

/// A port no device of the tiny guest claims (reads as zeros).
const UNCLAIMED_PORT: u16 = 0x80;
/// A guest-physical address no device claims and no RAM of these VMs covers.
const UNCLAIMED_GPA: u64 = 0x4000_0000;

/// A write of `value` to the tiny guest's doorbell at `offset`, after `spin_ns` of guest time.
fn bell(spin_ns: u64, offset: u64, value: u64) -> Step {
    Step::after(
        spin_ns,
        FakeExit::MmioWrite(DOORBELL_GPA + offset, value.to_le_bytes().to_vec()),
    )
}

/// The exit doorbell with code 0: the vCPU ends.
fn exit_bell() -> Step {
    bell(0, doorbell::EXIT, 0)
}

/// The config of `ppa-vmm run` with these flags' options, for a small VM of the tiny guest
/// (the fake ignores the image, but the payload still lays out memory and installs the
/// doorbells): no prefault, no kernel tracepoints, a 2-minute safety stop.
fn config(vcpus: usize, opts: RunOptions) -> VmConfig {
    let (c, _) = RunOptions {
        vcpus: Some(vcpus),
        memory_mib: Some(32),
        prefault: Some(false),
        kernel_trace: Some(false),
        max_runtime: Some(120.0),
        ..opts
    }
    .into_config()
    .expect("a valid config");
    c
}

/// Builds the VM of `config` on the fake hypervisor with one script per vCPU and runs it on a
/// thread of its own.
fn spawn(config: VmConfig, scripts: Vec<Vec<Step>>) -> JoinHandle<RunOutcome> {
    let vm = Vm::build(config, FakeHypervisor::new(scripts)).expect("the VM builds");
    std::thread::spawn(move || vm.run().expect("the VM runs"))
}

/// A connection to the control socket at `sock` of a VM that is starting.
fn connect(sock: &Path) -> Conn {
    Conn::new(connect_when_up(sock))
}

/// Sends `line` as it is and reads the response, which must be one line of the protocol's
/// response type (unknown fields refused) carrying `id`.
fn respond(c: &mut Conn, line: &str, id: Value) -> Response {
    c.send_raw(line.as_bytes());
    c.send_raw(b"\n");
    let raw = c.line();
    let r: Response = serde_json::from_value(raw.clone())
        .unwrap_or_else(|e| panic!("{line} -> {raw}: not a response line: {e}"));
    assert_eq!(serde_json::to_value(&r.id).unwrap(), id, "{line} -> {raw}");
    r
}

/// The error kind of a failed response to `line` (whose id is `id`), checking the error's
/// shape: no result, and a message that is a sentence.
fn error_of(c: &mut Conn, line: &str, id: Value) -> ErrorKind {
    let r = respond(c, line, id);
    assert!(!r.ok && r.result.is_none(), "{line} must fail: {r:?}");
    let e = r
        .error
        .unwrap_or_else(|| panic!("{line}: a failure without an error"));
    assert!(!e.message.trim().is_empty(), "{line}: an empty message");
    e.kind
}

/// The result of a successful response to `line` (whose id is `id`).
fn result_of(c: &mut Conn, line: &str, id: Value) -> Value {
    let r = respond(c, line, id);
    assert!(r.ok && r.error.is_none(), "{line} must succeed: {r:?}");
    r.result
        .unwrap_or_else(|| panic!("{line}: a success without a result"))
}

#[test]
fn the_control_protocol_answers_requests_and_refuses_bad_ones() {
    let dir = temp_dir("fake-protocol");
    let sock = dir.as_path().join("api.sock");
    // Both vCPUs park (the tiny guest's halt doorbell) for up to a minute: the VM runs, idle,
    // until the shutdown request below stops it.
    let park = || vec![bell(0, doorbell::HALT, 60_000_000_000), exit_bell()];
    let runner = spawn(
        config(
            2,
            RunOptions {
                api_sock: Some(sock.clone()),
                ..Default::default()
            },
        ),
        vec![park(), park()],
    );
    let mut c = connect(&sock);

    let v = result_of(&mut c, r#"{"id":1,"cmd":"version"}"#, json!(1));
    let v: ppa_vmm_api::VersionInfo = serde_json::from_value(v).expect("a version result");
    assert_eq!(v.api, ppa_vmm_api::API_VERSION);
    assert_eq!(v.version, env!("CARGO_PKG_VERSION"));

    // The socket answers before the vCPUs are released: `created`, then `running`.
    let s = (0..2000)
        .map(|_| {
            let s = result_of(&mut c, r#"{"id":"s","cmd":"stats"}"#, json!("s"));
            let s: Stats = serde_json::from_value(s).expect("a stats result");
            assert!(
                matches!(s.vm.state, VmState::Created | VmState::Running),
                "{:?}",
                s.vm.state
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
            s
        })
        .find(|s| s.vm.state == VmState::Running)
        .expect("the VM reaches the running state within 2000 polls");
    assert_eq!(
        s.vcpus.iter().map(|v| v.id).collect::<Vec<_>>(),
        vec![0, 1],
        "one summary per vCPU, in order"
    );

    let one = result_of(&mut c, r#"{"id":2,"cmd":"vcpu","vcpu":1}"#, json!(2));
    let one: VcpuTimes = serde_json::from_value(one).expect("a vcpu result");
    assert_eq!(one.id, 1);

    // A limit set, then seen in `groups`, then removed.
    let set = result_of(
        &mut c,
        r#"{"id":3,"cmd":"set-limit","group":"vm","limit":"50%"}"#,
        json!(3),
    );
    let groups: Vec<GroupStats> = serde_json::from_value(set).expect("the groups");
    let vm_group = groups.iter().find(|g| g.name == "vm").expect("group vm");
    assert_eq!(vm_group.limit, "50%");
    assert_eq!(vm_group.vcpus, vec![0, 1]);
    let groups: Vec<GroupStats> =
        serde_json::from_value(result_of(&mut c, r#"{"id":4,"cmd":"groups"}"#, json!(4)))
            .expect("the groups");
    assert_eq!(groups.len(), 1, "{groups:?}");
    result_of(
        &mut c,
        r#"{"id":5,"cmd":"set-limit","group":"vm","limit":"none"}"#,
        json!(5),
    );

    // Bad requests: each refused with its kind, the connection still usable after each.
    let bad: [(&str, Value, ErrorKind); 7] = [
        (r#"{"id":6,"cmd":"#, Value::Null, ErrorKind::BadJson),
        ("[1,2,3]", Value::Null, ErrorKind::BadJson),
        (
            r#"{"id":7,"cmd":"reboot"}"#,
            json!(7),
            ErrorKind::UnknownCommand,
        ),
        (
            r#"{"id":8,"cmd":"stats","verbose":true}"#,
            json!(8),
            ErrorKind::BadRequest,
        ),
        (
            r#"{"id":9,"cmd":"vcpu","vcpu":2}"#,
            json!(9),
            ErrorKind::NoSuchVcpu,
        ),
        (
            r#"{"id":10,"cmd":"set-limit","group":"vm","limit":"lots"}"#,
            json!(10),
            ErrorKind::BadLimit,
        ),
        (
            r#"{"id":11,"cmd":"set-limit","group":"nosuch","limit":"50%"}"#,
            json!(11),
            ErrorKind::BadLimit,
        ),
    ];
    for (line, id, kind) in bad {
        assert_eq!(error_of(&mut c, line, id), kind, "{line}");
    }
    let too_long = format!(
        r#"{{"id":12,"cmd":"version","x":"{}"}}"#,
        "x".repeat(ppa_vmm_api::MAX_REQUEST_BYTES)
    );
    assert_eq!(error_of(&mut c, &too_long, Value::Null), ErrorKind::TooLong);
    let v = result_of(&mut c, r#"{"id":13,"cmd":"version"}"#, json!(13));
    assert_eq!(v["api"], json!(ppa_vmm_api::API_VERSION), "still answering");

    let stopping = result_of(&mut c, r#"{"id":14,"cmd":"shutdown"}"#, json!(14));
    assert_eq!(stopping["state"], json!("stopping"));
    let out = runner.join().expect("the run thread");
    assert_eq!(out.report.vm.end, VmEnd::Shutdown);
    for v in &out.report.vcpus {
        assert_eq!(v.end, VcpuEndKind::Stopped, "vCPU {}", v.times.id);
    }
}

/// The exits of `script` by reason, as the report names them.
fn scripted_exits(script: &[Step]) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for s in script {
        let reason = match s.exit {
            FakeExit::MmioWrite(..) => "mmio_write",
            FakeExit::MmioRead(..) => "mmio_read",
            FakeExit::IoOut(..) => "io_out",
            FakeExit::IoIn(..) => "io_in",
            FakeExit::Hlt => "hlt",
            FakeExit::Shutdown => "shutdown",
            FakeExit::InternalError(_) => "internal_error",
        };
        *m.entry(reason.to_string()).or_insert(0) += 1;
    }
    m
}

/// Checks vCPU `i`'s object in the report's JSON: every part of the time split is there as a
/// number (null for the two parts level basic does not measure), `identity_error_ns` is wall minus the parts, and the identity of spec section 4
/// holds (within its tolerance, or short by what the host's own steal explains).
fn check_vcpu_json(r: &Report, json: &Value, i: usize) {
    let v = &json["vcpus"][i];
    let parts: Vec<u64> = TimeSplit::NAMES
        .iter()
        .map(|n| {
            let x = &v[format!("{n}_ns")];
            // kvm_ns and interrupted_ns are null where they are not measured (level basic).
            if x.is_null() && ["kvm", "interrupted"].contains(n) {
                return 0;
            }
            x.as_u64()
                .unwrap_or_else(|| panic!("vCPU {i}: {n}_ns is not a number: {x}"))
        })
        .collect();
    let split = TimeSplit::from_values(parts.try_into().expect("every part"));
    assert_eq!(
        v["identity_error_ns"].as_i64(),
        Some(split.identity_error_ns()),
        "vCPU {i}: identity_error_ns is wall minus its parts"
    );
    assert_eq!(split, r.vcpus[i].times.split(), "vCPU {i}: JSON = report");
    common::assert_identity(r, &r.vcpus[i]);
}

#[test]
fn the_report_has_its_shape_the_identity_and_every_scripted_exit() {
    // vCPU 0 runs, exits through every I/O kind and idles; vCPU 1 idles and ends.
    let mut busy: Vec<Step> = (0..20)
        .map(|_| bell(200_000, doorbell::WORKLOAD, 0))
        .collect();
    busy.extend(
        (0..5).map(|_| Step::after(100_000, FakeExit::IoOut(WORKLOAD_PIO_PORT, vec![0; 4]))),
    );
    busy.extend((0..3).map(|_| Step::now(FakeExit::IoIn(UNCLAIMED_PORT, 1))));
    busy.extend((0..2).map(|_| Step::now(FakeExit::MmioRead(UNCLAIMED_GPA, 8))));
    busy.push(bell(0, doorbell::HALT, 2_000_000));
    busy.push(bell(
        0,
        doorbell::REPORT_BASE + 8 * ppa_guest_abi::report::SPIN_NS,
        4_500_000,
    ));
    busy.push(exit_bell());
    let idle = vec![bell(0, doorbell::HALT, 5_000_000), exit_bell()];
    let scripts = vec![busy, idle];
    let expected: Vec<BTreeMap<String, u64>> = scripts.iter().map(|s| scripted_exits(s)).collect();

    let out = spawn(config(2, RunOptions::default()), scripts)
        .join()
        .expect("the run thread");
    let r = &out.report;
    common::assert_all_exited_ok(r);
    assert_eq!(out.exit_code, 0);
    assert_eq!(r.vm.end, VmEnd::Completed);
    assert_eq!(r.vm.info.vcpus, 2);
    assert_eq!(
        r.vm.info.kvm_exit_cost_ns, None,
        "the fake measures no exit cost"
    );
    assert!(r.groups.is_empty(), "no limit, no group: {:?}", r.groups);

    for (i, want) in expected.iter().enumerate() {
        let got: BTreeMap<String, u64> = r.vcpus[i]
            .times
            .exits
            .iter()
            .filter(|(_, &n)| n > 0)
            .map(|(k, &n)| (k.clone(), n))
            .collect();
        assert_eq!(
            &got, want,
            "vCPU {i}: the exits are the scripted ones, exactly"
        );
    }
    let tiny = r.vcpus[0].tiny().expect("the tiny guest's fields");
    assert_eq!(tiny.doorbells["workload_mmio"], 20);
    assert_eq!(tiny.doorbells["workload_pio"], 5);
    assert_eq!(tiny.guest_reported["spin_ns"], 4_500_000);
    // The 2 ms halt parked vCPU 0 once. Its 2 ms went to idle, or, where the host kept the
    // thread off a CPU between the doorbell and the park past the halt's deadline, to steal
    // and the VMM's handling: the guest asked to wait until then, and was not idle for lack of
    // a CPU. Either way they are in the vCPU's time, not lost.
    let t = &r.vcpus[0].times;
    assert_eq!(t.parks, 1, "the halt doorbell parked vCPU 0: {t:?}");
    assert!(
        t.idle_ns + t.steal_ns + t.vmm_ns >= 2_000_000,
        "the halt's 2 ms are idle, steal or VMM time: {t:?}"
    );

    // The JSON a reader gets: the report's sections, each vCPU's figures flat on its object.
    let json = serde_json::to_value(r).expect("the report serialises");
    for key in ["vm", "vcpus", "groups", "devices", "guest"] {
        assert!(json.get(key).is_some(), "the report has {key}: {json}");
    }
    assert_eq!(json["vm"]["end"], json!("completed"));
    assert_eq!(json["vcpus"].as_array().map(Vec::len), Some(2));
    for i in 0..2 {
        check_vcpu_json(r, &json, i);
        let exits: BTreeMap<String, u64> =
            serde_json::from_value(json["vcpus"][i]["exits"].clone()).expect("exits by reason");
        assert_eq!(
            exits
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .collect::<BTreeMap<_, _>>(),
            expected[i],
            "vCPU {i}: the JSON's exits"
        );
    }
}

#[test]
fn a_busy_vcpu_under_a_limit_is_stopped_and_accounted_limited() {
    let dir = temp_dir("fake-limit");
    let sock = dir.as_path().join("api.sock");
    // 200 ms of guest work in 1 ms steps under 25 % of a CPU (5 ms per 20 ms period): the
    // limit must stop it in most periods. A kicked step loses the rest of its spin (as a
    // real kick does) but still makes its exit.
    const STEPS: u64 = 200;
    let mut busy: Vec<Step> = (0..STEPS)
        .map(|_| bell(1_000_000, doorbell::WORKLOAD, 0))
        .collect();
    busy.push(exit_bell());
    let config = config(
        1,
        RunOptions {
            api_sock: Some(sock.clone()),
            cpu_limit: Some("5ms/20ms".into()),
            ..Default::default()
        },
    );
    let runner = spawn(config, vec![busy]);
    // Subscribed once the socket is up: throttle events of the first periods may come before,
    // so the count below is bounded by the throttled periods, not equal to them. A period
    // holds more than one start only after a release within it (a throttle-end of why
    // "redistributed"), and the period still open when the vCPU exits is in no count.
    let mut c = connect(&sock);
    result_of(
        &mut c,
        r#"{"id":1,"cmd":"subscribe","events":["throttle-start","throttle-end","vcpu-exit"]}"#,
        json!(1),
    );
    let mut starts = 0u64;
    let mut redistributed = 0u64;
    loop {
        let line = c.line();
        let e: Event = serde_json::from_value(line.clone())
            .unwrap_or_else(|err| panic!("{line}: not an event: {err}"));
        match e {
            Event::ThrottleStart {
                group,
                vcpus,
                quota_ns,
                ..
            } => {
                assert_eq!(group, "vm");
                assert_eq!(vcpus, vec![0]);
                assert_eq!(quota_ns, 5_000_000);
                starts += 1;
            }
            Event::ThrottleEnd { group, why, .. } => {
                assert_eq!(group, "vm");
                if why == ThrottleEndWhy::Redistributed {
                    redistributed += 1;
                }
            }
            Event::VcpuExit { vcpu, end, .. } => {
                assert_eq!((vcpu, end), (0, VcpuEndKind::Exited));
                break;
            }
            other => panic!("not subscribed to {other:?}"),
        }
    }
    let out = runner.join().expect("the run thread");
    let r = &out.report;
    common::assert_all_exited_ok(r);
    let v = &r.vcpus[0];
    assert!(v.times.limited_ns > 0, "limited_ns: {:?}", v.times);
    assert_eq!(
        v.times.exits.get("mmio_write").copied(),
        Some(STEPS + 1),
        "every scripted exit is made, kicked or not"
    );
    common::assert_identity(r, v);
    let g = r.groups.iter().find(|g| g.name == "vm").expect("group vm");
    assert!(g.throttled_periods > 0, "{g:?}");
    assert!(starts > 0, "no throttle-start event");
    assert!(
        starts <= g.throttled_periods + redistributed + 1,
        "{starts} throttle-start events, {} throttled periods, {redistributed} releases \
         within a period",
        g.throttled_periods
    );
    assert_eq!(
        g.limited_ns, v.times.limited_ns,
        "one member: its limited_ns"
    );
}
