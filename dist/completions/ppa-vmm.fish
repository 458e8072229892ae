# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_ppa_vmm_global_optspecs
    string join \n h/help V/version
end

function __fish_ppa_vmm_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_ppa_vmm_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_ppa_vmm_using_subcommand
    set -l cmd (__fish_ppa_vmm_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c ppa-vmm -n "__fish_ppa_vmm_needs_command" -s h -l help -d 'Print help'
complete -c ppa-vmm -n "__fish_ppa_vmm_needs_command" -s V -l version -d 'Print version'
complete -c ppa-vmm -n "__fish_ppa_vmm_needs_command" -f -a "run" -d 'Boot a VM and run it until every vCPU has exited'
complete -c ppa-vmm -n "__fish_ppa_vmm_needs_command" -f -a "demo" -d 'Run the embedded demo: 4 vCPUs of the tiny guest with the mixed workload'
complete -c ppa-vmm -n "__fish_ppa_vmm_needs_command" -f -a "firecracker" -d 'Serve Firecracker\'s API (and take its flags): a VM started by Firecracker\'s tools, with our accounting (docs/firecracker.md). Also what this binary does when called `firecracker`'
complete -c ppa-vmm -n "__fish_ppa_vmm_needs_command" -f -a "ctl" -d 'Send one request to a running VMM\'s control socket and print the result'
complete -c ppa-vmm -n "__fish_ppa_vmm_needs_command" -f -a "top" -d 'A live per-vCPU table of a running VMM, like esxtop'
complete -c ppa-vmm -n "__fish_ppa_vmm_needs_command" -f -a "host" -d 'Every VM of the run directory: list, top, one metrics endpoint'
complete -c ppa-vmm -n "__fish_ppa_vmm_needs_command" -f -a "completions" -d 'Print a shell completion script (install it where the shell looks; dist/ has them)'
complete -c ppa-vmm -n "__fish_ppa_vmm_needs_command" -f -a "man" -d 'Print the man page (roff; dist/man/ppa-vmm.1)'
complete -c ppa-vmm -n "__fish_ppa_vmm_needs_command" -f -a "schema" -d 'Print the JSON Schema of a socket message, the final report or the config file'
complete -c ppa-vmm -n "__fish_ppa_vmm_needs_command" -f -a "bench" -d 'Measure the VMM itself'
complete -c ppa-vmm -n "__fish_ppa_vmm_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l config -d 'JSON config file with the same fields as the flags (flags win)' -r -F
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l vcpus -d 'Number of vCPUs (1..=256)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l memory-mib -d 'Guest memory in MiB (RAM past 3 GiB is placed above 4 GiB)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l prefault -d 'Fault every page of guest memory in before the guest starts (default true: a first touch inside the guest can block in the host kernel, time no figure explains)' -r -f -a "true\t''
false\t''"
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l guest -d 'Embedded guest to boot (`tiny`)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l tiny-image -d 'A tiny-guest ELF image file (the protocol of the embedded tiny guest)' -r -F
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l kernel -d 'A Linux kernel to boot (bzImage or ELF vmlinux)' -r -F
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l initrd -d 'The Linux guest\'s initial RAM disk' -r -F
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l cmdline -d 'More of the Linux guest\'s command line (after `console=ttyS0 reboot=k panic=1 pci=off` and `ppa.page=`)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l workload -d 'Workload `SPEC` for all vCPUs or `I=SPEC` for vCPU I (repeatable; later ones win)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l report -d 'Final report format' -r -f -a "json\t'One JSON object on stdout (or the report file)'
text\t'A table for people'
none\t'No report'"
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l report-file -d 'Write the report to this file instead of stdout' -r -F
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l histograms-file -d 'Write every histogram in the kstats text form (`slot S vcpu V count C avg A p P`) here' -r -F
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l max-runtime -d 'Stop every vCPU after this many seconds' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l kvm-device -d 'KVM device node' -r -F
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l accounting -d 'Accounting level at start: off, basic or full (switchable at run time)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l histogram-bits -d 'Fractional bits of the log-linear histograms (0..=5)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l kernel-trace -d 'At level full, also open the kernel\'s tracepoints on each vCPU thread (KVM\'s exits, host interrupts, sched_switch: kvm_ns, interrupted_ns, pressure) where allowed (default true)' -r -f -a "true\t''
false\t''"
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l threshold -d 'A threshold counter, NAME=NS (exit_handling_ns, guest_run_ns, wakeup_latency_ns, steal_window_ns); repeatable' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l name -d 'The VM\'s name: the `vm` label of the metrics (default `ppa-vmm-PID`). With a name the VM registers in the run directory (docs/operations.md, "Many VMs on one host")' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l run-dir -d 'The run directory where the VM puts `NAME.sock` (unless --api-sock says otherwise) and its descriptor `NAME.json` (default /run/ppa-vmm, or $XDG_RUNTIME_DIR/ppa-vmm for users other than root; used when --name or --run-dir is given)' -r -F
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l api-sock -d 'Serve the control socket (JSON Lines, mode 0600) at this path while the VM runs' -r -F
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l metrics-addr -d 'Serve the metrics over HTTP at http://IP:PORT/metrics while the VM runs' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l client-timeout -d 'Close a client of either that takes longer than this to send a request it has begun (an HTTP client: its whole head), or leaves its answers unread this long (default 10)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l idle-timeout -d 'Close a control client with nothing in flight and no subscription after this long without a request (default 300; 0: never)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l cpu-limit -d 'VM-wide CPU limit: N% of one CPU (100 ms period) or QUOTA/PERIOD (e.g. 15ms/10ms), with ,scope=vm to cover the device threads too (default scope=vcpus)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l vcpu-group -d 'A vCPU group with its own CPU limit, NAME:VCPUS:LIMIT (e.g. dataplane:0-1:50%); repeatable' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l limit-backend -d 'Who enforces the limits: vmm (precise, default) or cgroup (CFS bandwidth control, for comparison)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l limit-kick -d 'How the vmm backend stops a vCPU: timer (its own kick timer, fired by the kernel; the limiter thread as fallback; default) or limiter (the limiter thread\'s kicks alone)' -r -f -a "timer\t'Each vCPU\'s kick timer, armed by the vCPU thread for the CPU its runway allows and fired by the kernel; the limiter thread keeps the books and kicks when a timer is late'
limiter\t'The limiter thread\'s kicks alone, at its looks'"
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l runaway -d 'Raise an overload event when a vCPU stays in the guest this long (ms) without an exit or an idle (PPA\'s runaway process)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l overload -d 'Raise an overload event when a vCPU uses more than PCT % of its time for WINDOWS windows of 100 ms in a row' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l overload-action -d 'What a runaway or overload does besides the event: notify, pause or throttle:LIMIT' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l ppa-page-size -d 'Size of the PPA page shared with the guest, bytes (default 65536; 0: none)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l ppa-page-file -d 'Back the PPA page with this file, so host tools can map it (removed at the end)' -r -F
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l guest-metrics-threads -d 'Guest threads the metrics name, the busiest by CPU (0 to 100, default 10); the others are summed under tid="rest"' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l seccomp -d 'After set-up, each thread drops its capabilities and confines itself to its system calls: kill (the binary\'s default: a forbidden call stops the VMM, exit status 159), log (the kernel logs it) or none (docs/security.md). Unset in code: none, since a filter stays on the thread that built the VM' -r -f -a "none\t'No filter, no capability drop (the library\'s default)'
log\t'Allow it and have the kernel log it (audit type 1326)'
kill\t'Stop the VMM: a message on stderr naming the thread and the call, exit status 159'"
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l net -d 'A virtio-net device on a tap: tap=NAME[,mac=MAC][,queues=N][,mtu=M][,id=ID][,rate=B] (repeatable: net0, net1, …; rate=tx-bytes:125M/1s+rx-packets:100k/1s: docs/limits.md)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l disk -d 'A virtio-blk disk on a raw file (or block device): path=FILE[,readonly=on][,id=NAME][,queues=N][,rate=B] (repeatable: blk0, blk1, …; the file is locked: a disk one VMM may write is never opened by another; rate=ops:1k/1s)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l pin -d 'Which host CPUs threads run on, KEY=CPUS (repeatable; the most specific KEY wins): KEY vcpus, vcpuN, a device id (net0: all its threads), a queue pair (net0-qp1) or service; CPUS in the kernel\'s list form (4, 0-3,6)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l memory-backing -d 'What backs guest RAM: hugepages (2 MiB), hugepages=2M or hugepages=1G from the kernel\'s pool (refused before any vCPU runs when it has too few free pages), or anonymous (4 KiB pages, the default)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -l numa-node -d 'Bind guest RAM to NUMA node N (mbind) and keep threads no --pin names on its CPUs' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand run" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand demo" -s h -l help -d 'Print help'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand firecracker" -l api-sock -d 'The API socket (Firecracker\'s default: /run/firecracker.socket)' -r -F
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand firecracker" -l config-file -d 'A config file in Firecracker\'s JSON layout: the VM starts at once, without any API call' -r -F
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand firecracker" -l id -d 'The instance id: `GET /`\'s id and the VM\'s name in the run directory' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand firecracker" -l level -d 'Log level: Error, Warning, Info, Debug, Trace or Off (default: Warning)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand firecracker" -l log-path -d 'Log to this file or named pipe instead of stderr' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand firecracker" -l module -d 'Only log lines of modules under this path' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand firecracker" -l metrics-path -d 'Write the metrics lines to this file or named pipe (as `PUT /metrics`)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand firecracker" -l http-api-max-payload-size -d 'The largest request body, bytes' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand firecracker" -l seccomp-filter -d 'Refused: PPA-VMM\'s filters are built in, one per thread kind (docs/security.md)' -r -F
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand firecracker" -l start-time-us -d 'The jailer\'s start time (accepted, not used)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand firecracker" -l start-time-cpu-us -d 'The jailer\'s start CPU time (accepted, not used)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand firecracker" -l parent-cpu-time-us -d 'The jailer\'s parent\'s CPU time (accepted, not used)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand firecracker" -l ppa-config -d 'Ours: run options in `ppa-vmm run`\'s config-file layout, under Firecracker\'s (CPU limits, accounting level, thresholds, --metrics-addr, a final report file)' -r -F
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand firecracker" -l run-dir -d 'Ours: the run directory where the VM registers (default as `ppa-vmm run`\'s)' -r -F
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand firecracker" -l no-api -d 'Serve no API (needs --config-file)'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand firecracker" -l show-level -d 'Put the level in each log line'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand firecracker" -l show-log-origin -d 'Put the source file and line in each log line'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand firecracker" -l no-seccomp -d 'No seccomp filters (ours: `--seccomp none`)'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand firecracker" -l boot-timer -d 'Refused: PPA-VMM has no boot-timer device'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand firecracker" -s h -l help -d 'Print help'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand ctl" -l api-sock -d 'The VMM\'s control socket (`run --api-sock`)' -r -F
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand ctl" -l text -d 'Print a readable form instead of JSON'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand ctl" -s h -l help -d 'Print help'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand top" -l api-sock -d 'The VMM\'s control socket (`run --api-sock`)' -r -F
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand top" -l interval -d 'Refresh interval in ms (rates are computed over it; at least 10)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand top" -l sort -d 'Sort column' -r -f -a "vcpu\t'VCPU: the vCPU index (ascending)'
used\t'USED%: on-CPU time (guest + VMM)'
guest\t'GUEST%: on-CPU inside KVM_RUN (guest code only where SYS% is measured)'
sys\t'SYS%: on-CPU inside KVM_RUN in KVM\'s exit handling (kvm_ns), where measured'
vmm\t'VMM%: on-CPU in the VMM outside KVM_RUN'
rdy\t'RDY%: runnable but waiting for a host CPU (steal)'
idle\t'IDLE%: parked at the guest\'s request or halted'
lmtd\t'LMTD%: parked by a CPU limit'
psd\t'PSD%: parked by an operator\'s pause'
exits\t'EXITS/s: userspace exits per second'"
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand top" -l once -d 'Print one table and exit'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand top" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and not __fish_seen_subcommand_from list top serve help" -s h -l help -d 'Print help'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and not __fish_seen_subcommand_from list top serve help" -f -a "list" -d 'Every VM of the run directory: name, pid, state, vCPUs, uptime, host CPU now'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and not __fish_seen_subcommand_from list top serve help" -f -a "top" -d 'esxtop\'s CPU screen for the host: one row per VM'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and not __fish_seen_subcommand_from list top serve help" -f -a "serve" -d 'One Prometheus endpoint for every VM of the run directory'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and not __fish_seen_subcommand_from list top serve help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and __fish_seen_subcommand_from list" -l run-dir -d 'The run directory (default /run/ppa-vmm, or $XDG_RUNTIME_DIR/ppa-vmm for others)' -r -F
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and __fish_seen_subcommand_from list" -l timeout-ms -d 'How long to give every VM to answer, ms (the interval comes on top)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and __fish_seen_subcommand_from list" -l interval-ms -d 'Time between the two samples that give host CPU now, ms' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and __fish_seen_subcommand_from list" -l json -d 'One JSON array instead of the table'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and __fish_seen_subcommand_from list" -s h -l help -d 'Print help'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and __fish_seen_subcommand_from top" -l run-dir -d 'The run directory (default /run/ppa-vmm, or $XDG_RUNTIME_DIR/ppa-vmm for others)' -r -F
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and __fish_seen_subcommand_from top" -l batch -d 'This many screens, one per interval, without clearing (for scripts)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and __fish_seen_subcommand_from top" -l interval-ms -d 'Interval between the samples, ms' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and __fish_seen_subcommand_from top" -l sort -d 'Column to sort by (descending): used, guest, rdy, lmtd, idle, some, full, dev, name' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and __fish_seen_subcommand_from top" -l expand -d 'Show this VM\'s vCPUs under its row' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and __fish_seen_subcommand_from top" -l timeout-ms -d 'How long to give every VM to answer, ms' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and __fish_seen_subcommand_from top" -l once -d 'One screen, then exit'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and __fish_seen_subcommand_from top" -s h -l help -d 'Print help'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and __fish_seen_subcommand_from serve" -l run-dir -d 'The run directory (default /run/ppa-vmm, or $XDG_RUNTIME_DIR/ppa-vmm for others)' -r -F
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and __fish_seen_subcommand_from serve" -l metrics-listen -d 'Where to serve GET /metrics (port 0: any free port, printed at start)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and __fish_seen_subcommand_from serve" -l compat -d 'Other tools\' series to add, comma-separated' -r -f -a "kubevirt\t'KubeVirt\'s `kubevirt_vmi_vcpu_seconds_total` and `kubevirt_vmi_vcpu_delay_seconds_total`'
libvirt\t'The libvirt exporter\'s `libvirt_domain_vcpu_time_seconds_total` and `libvirt_domain_vcpu_delay_seconds_total`'"
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and __fish_seen_subcommand_from serve" -l scrape-timeout-ms -d 'How long a scrape waits for each VM, ms' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and __fish_seen_subcommand_from serve" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and __fish_seen_subcommand_from help" -f -a "list" -d 'Every VM of the run directory: name, pid, state, vCPUs, uptime, host CPU now'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and __fish_seen_subcommand_from help" -f -a "top" -d 'esxtop\'s CPU screen for the host: one row per VM'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and __fish_seen_subcommand_from help" -f -a "serve" -d 'One Prometheus endpoint for every VM of the run directory'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand host; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand completions" -s h -l help -d 'Print help'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand man" -s h -l help -d 'Print help'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand schema" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand bench" -l window-ms -d 'Length of each run\'s measured window, ms (socket)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand bench" -l vcpus -d 'vCPUs of the VM (socket)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand bench" -l rate -d '`stats` requests per second in the loaded runs (socket)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand bench" -l client-nice -d 'Nice value of the client thread (socket; below 0 needs CAP_SYS_NICE)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand bench" -l periods -d 'Periods per run (limit)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand bench" -l packets -d 'Frames per transmit run (net)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand bench" -l echoes -d 'Echo round trips (net)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand bench" -l blocks -d '4 KiB blocks written and read per run (disk)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand bench" -l poll-us -d 'The disk\'s `poll_us=`: how long its request thread polls an emptied ring (disk; 0: it does not)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand bench" -l rounds -d 'Rounds of alternated runs (default: overhead 45, socket 5, limit 5, net 5, disk 5, start 10, stops 3)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand bench" -l exits -d 'Exits per run (default: overhead 8,000, net 20,000; socket refuses it, the others ignore it)' -r
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand bench" -l json -d 'Print one JSON object whose last key is "verdict"'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand bench" -l hogs -d 'Run beside one spinning process per CPU (limit)'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand bench" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand help; and not __fish_seen_subcommand_from run demo firecracker ctl top host completions man schema bench help" -f -a "run" -d 'Boot a VM and run it until every vCPU has exited'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand help; and not __fish_seen_subcommand_from run demo firecracker ctl top host completions man schema bench help" -f -a "demo" -d 'Run the embedded demo: 4 vCPUs of the tiny guest with the mixed workload'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand help; and not __fish_seen_subcommand_from run demo firecracker ctl top host completions man schema bench help" -f -a "firecracker" -d 'Serve Firecracker\'s API (and take its flags): a VM started by Firecracker\'s tools, with our accounting (docs/firecracker.md). Also what this binary does when called `firecracker`'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand help; and not __fish_seen_subcommand_from run demo firecracker ctl top host completions man schema bench help" -f -a "ctl" -d 'Send one request to a running VMM\'s control socket and print the result'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand help; and not __fish_seen_subcommand_from run demo firecracker ctl top host completions man schema bench help" -f -a "top" -d 'A live per-vCPU table of a running VMM, like esxtop'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand help; and not __fish_seen_subcommand_from run demo firecracker ctl top host completions man schema bench help" -f -a "host" -d 'Every VM of the run directory: list, top, one metrics endpoint'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand help; and not __fish_seen_subcommand_from run demo firecracker ctl top host completions man schema bench help" -f -a "completions" -d 'Print a shell completion script (install it where the shell looks; dist/ has them)'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand help; and not __fish_seen_subcommand_from run demo firecracker ctl top host completions man schema bench help" -f -a "man" -d 'Print the man page (roff; dist/man/ppa-vmm.1)'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand help; and not __fish_seen_subcommand_from run demo firecracker ctl top host completions man schema bench help" -f -a "schema" -d 'Print the JSON Schema of a socket message, the final report or the config file'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand help; and not __fish_seen_subcommand_from run demo firecracker ctl top host completions man schema bench help" -f -a "bench" -d 'Measure the VMM itself'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand help; and not __fish_seen_subcommand_from run demo firecracker ctl top host completions man schema bench help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand help; and __fish_seen_subcommand_from host" -f -a "list" -d 'Every VM of the run directory: name, pid, state, vCPUs, uptime, host CPU now'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand help; and __fish_seen_subcommand_from host" -f -a "top" -d 'esxtop\'s CPU screen for the host: one row per VM'
complete -c ppa-vmm -n "__fish_ppa_vmm_using_subcommand help; and __fish_seen_subcommand_from host" -f -a "serve" -d 'One Prometheus endpoint for every VM of the run directory'
