"""Drives `ppa-vmm firecracker` with a Firecracker client nobody here wrote: the pinned
firecracker-python package's low-level `firecracker.api.Api` (scripts/setup.sh installs it
into target/firecracker-client/). Run by tests/firecracker.rs, which checks every answer:
each step prints one JSON line {"step", "status", "body"} on stdout.

Usage: firecracker_client.py API_SOCK CONTROL_SOCK PPA_VMM TINY_IMAGE LOG_PATH METRICS_PATH
"""

import contextlib
import io
import json
import subprocess
import sys

# Importing the package looks for a `firecracker` binary and prints a warning when there is
# none (there is none here: the VMM under test is ours); stdout is the test's.
with contextlib.redirect_stdout(io.StringIO()):
    from firecracker.api import Api, Resource
    from firecracker.exceptions import APIError

api_sock, control_sock, ppa_vmm, tiny, log_path, metrics_path = sys.argv[1:7]
api = Api(api_sock)


def emit(step, status, body):
    print(json.dumps({"step": step, "status": status, "body": body}), flush=True)


def body_of(r):
    return json.loads(r.text) if r.text else None


def call(step, resource, method, **kwargs):
    """A call through the client's own Resource methods: a success returns the response,
    a failure raises the client's APIError with Firecracker's fault_message in it."""
    try:
        r = getattr(resource, method)(**kwargs)
        emit(step, r.status_code, body_of(r))
    except APIError as e:
        emit(step, 400, {"client_error": str(e)})


def raw(step, method, path, data):
    """A request with a body the client's helpers would not send (bad JSON), on the client's
    own HTTP-over-Unix-socket session."""
    r = api.session.request(method, api.endpoint + path, data=data,
                            headers={"Content-Type": "application/json"})
    emit(step, r.status_code, body_of(r))


def ctl(step, *args):
    out = subprocess.run([ppa_vmm, "ctl", "--api-sock", control_sock, *args],
                         capture_output=True, text=True, check=False)
    result = json.loads(out.stdout) if out.returncode == 0 else out.stderr
    emit(step, out.returncode, result)
    return result


def comms(threads):
    """The kernel's names of the vCPU threads, while they run."""
    names = []
    for t in threads["vcpus"]:
        with open(f"/proc/{threads['pid']}/task/{t['host_tid']}/comm") as f:
            names.append(f.read().rstrip("\n"))
    emit("comms", 0, names)


call("describe", api.describe, "get")
call("version", api.version, "get")
call("machine-config-default", api.machine_config, "get")
call("logger", api.logger, "put", log_path=log_path, level="Info", show_level=True)
# The client names no /metrics resource; its Resource class makes one.
call("metrics", Resource(api, "/metrics"), "put", metrics_path=metrics_path)
call("machine-config", api.machine_config, "put", vcpu_count=2, mem_size_mib=64)
raw("bad-body", "PUT", "/machine-config", '{"vcpu_count": 2, "mem_size_mib": ')
call("unknown-field", api.machine_config, "put", vcpu_count=2, mem_size_mib=64, cpus=4)
call("smt", api.machine_config, "put", vcpu_count=2, mem_size_mib=64, smt=True)
call("machine-config-after-refusals", api.machine_config, "get")
# A kernel that opens (all Firecracker checks at the PUT) but does not boot: the start fails
# with a sentence and the instance stays configurable.
not_a_kernel = log_path + ".not-a-kernel"
with open(not_a_kernel, "w") as f:
    f.write("this is not a kernel\n")
call("boot-source-bad", api.boot, "put", kernel_image_path=not_a_kernel)
call("start-bad", api.actions, "put", action_type="InstanceStart")
call("describe-after-bad-start", api.describe, "get")
call("boot-source", api.boot, "put", kernel_image_path=tiny,
     boot_args="console=ttyS0 reboot=k ppa.workload=0=net-echo:ms=60000 "
               "ppa.workload=1=busy:ms=60000")
tx_limit = {"bandwidth": {"size": 1250000, "refill_time": 100}}
call("network-interface", api.network, "put", iface_id="eth0", host_dev_name="tap0",
     guest_mac="06:00:ac:10:00:02", tx_rate_limiter=tx_limit)
call("drive", api.drive, "put", drive_id="rootfs", path_on_host="/nonexistent.ext4",
     is_root_device=True, is_read_only=False)
data = log_path.rsplit("/", 1)[0] + "/data.img"
with open(data, "wb") as f:
    f.truncate(1 << 20)
call("drive-data", api.drive, "put", drive_id="data", path_on_host=data,
     is_root_device=False, is_read_only=True)
call("flush-before-start", api.actions, "put", action_type="FlushMetrics")
call("start", api.actions, "put", action_type="InstanceStart")
call("describe-running", api.describe, "get")
call("machine-config-post-boot", api.machine_config, "put", vcpu_count=1, mem_size_mib=64)
call("boot-source-post-boot", api.boot, "put", kernel_image_path=tiny)
call("network-interface-post-boot", api.network, "put", iface_id="eth1",
     host_dev_name="tap0")
call("start-again", api.actions, "put", action_type="InstanceStart")
call("drive-patch-post-boot", api.drive, "patch", drive_id="data",
     path_on_host=data + ".other")
call("drive-patch-rate", api.drive, "patch", drive_id="data",
     rate_limiter={"ops": {"size": 100, "refill_time": 1000}})
call("net-patch-same", api.network, "patch", iface_id="eth0", tx_rate_limiter=tx_limit)
call("net-patch-other", api.network, "patch", iface_id="eth0",
     rx_rate_limiter={"ops": {"size": 10, "refill_time": 100}})
call("pause", api.vm, "patch", state="Paused")
call("describe-paused", api.describe, "get")
ctl("stats-paused", "stats")
comms(ctl("threads", "threads"))
call("resume", api.vm, "patch", state="Resumed")
call("describe-resumed", api.describe, "get")
call("vm-config", api.vm_config, "get")
ctl("device", "device", "name=eth0")
ctl("device-disk", "device", "name=data")
out = subprocess.run([ppa_vmm, "host", "list", "--json", "--run-dir",
                      control_sock.rsplit("/", 1)[0]], capture_output=True, text=True,
                     check=False)
emit("host-list", out.returncode,
     json.loads(out.stdout) if out.returncode == 0 else out.stderr)
call("flush", api.actions, "put", action_type="FlushMetrics")
call("ctrl-alt-del", api.actions, "put", action_type="SendCtrlAltDel")
api.close()
