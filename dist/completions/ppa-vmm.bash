_ppa__vmm() {
    local i cur prev opts cmd
    COMPREPLY=()
    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
        cur="$2"
    else
        cur="${COMP_WORDS[COMP_CWORD]}"
    fi
    prev="$3"
    cmd=""
    opts=""

    for i in "${COMP_WORDS[@]:0:COMP_CWORD}"
    do
        case "${cmd},${i}" in
            ",$1")
                cmd="ppa__vmm"
                ;;
            ppa__vmm,bench)
                cmd="ppa__vmm__subcmd__bench"
                ;;
            ppa__vmm,completions)
                cmd="ppa__vmm__subcmd__completions"
                ;;
            ppa__vmm,ctl)
                cmd="ppa__vmm__subcmd__ctl"
                ;;
            ppa__vmm,demo)
                cmd="ppa__vmm__subcmd__demo"
                ;;
            ppa__vmm,firecracker)
                cmd="ppa__vmm__subcmd__firecracker"
                ;;
            ppa__vmm,help)
                cmd="ppa__vmm__subcmd__help"
                ;;
            ppa__vmm,host)
                cmd="ppa__vmm__subcmd__host"
                ;;
            ppa__vmm,man)
                cmd="ppa__vmm__subcmd__man"
                ;;
            ppa__vmm,run)
                cmd="ppa__vmm__subcmd__run"
                ;;
            ppa__vmm,schema)
                cmd="ppa__vmm__subcmd__schema"
                ;;
            ppa__vmm,top)
                cmd="ppa__vmm__subcmd__top"
                ;;
            ppa__vmm__subcmd__help,bench)
                cmd="ppa__vmm__subcmd__help__subcmd__bench"
                ;;
            ppa__vmm__subcmd__help,completions)
                cmd="ppa__vmm__subcmd__help__subcmd__completions"
                ;;
            ppa__vmm__subcmd__help,ctl)
                cmd="ppa__vmm__subcmd__help__subcmd__ctl"
                ;;
            ppa__vmm__subcmd__help,demo)
                cmd="ppa__vmm__subcmd__help__subcmd__demo"
                ;;
            ppa__vmm__subcmd__help,firecracker)
                cmd="ppa__vmm__subcmd__help__subcmd__firecracker"
                ;;
            ppa__vmm__subcmd__help,help)
                cmd="ppa__vmm__subcmd__help__subcmd__help"
                ;;
            ppa__vmm__subcmd__help,host)
                cmd="ppa__vmm__subcmd__help__subcmd__host"
                ;;
            ppa__vmm__subcmd__help,man)
                cmd="ppa__vmm__subcmd__help__subcmd__man"
                ;;
            ppa__vmm__subcmd__help,run)
                cmd="ppa__vmm__subcmd__help__subcmd__run"
                ;;
            ppa__vmm__subcmd__help,schema)
                cmd="ppa__vmm__subcmd__help__subcmd__schema"
                ;;
            ppa__vmm__subcmd__help,top)
                cmd="ppa__vmm__subcmd__help__subcmd__top"
                ;;
            ppa__vmm__subcmd__help__subcmd__host,list)
                cmd="ppa__vmm__subcmd__help__subcmd__host__subcmd__list"
                ;;
            ppa__vmm__subcmd__help__subcmd__host,serve)
                cmd="ppa__vmm__subcmd__help__subcmd__host__subcmd__serve"
                ;;
            ppa__vmm__subcmd__help__subcmd__host,top)
                cmd="ppa__vmm__subcmd__help__subcmd__host__subcmd__top"
                ;;
            ppa__vmm__subcmd__host,help)
                cmd="ppa__vmm__subcmd__host__subcmd__help"
                ;;
            ppa__vmm__subcmd__host,list)
                cmd="ppa__vmm__subcmd__host__subcmd__list"
                ;;
            ppa__vmm__subcmd__host,serve)
                cmd="ppa__vmm__subcmd__host__subcmd__serve"
                ;;
            ppa__vmm__subcmd__host,top)
                cmd="ppa__vmm__subcmd__host__subcmd__top"
                ;;
            ppa__vmm__subcmd__host__subcmd__help,help)
                cmd="ppa__vmm__subcmd__host__subcmd__help__subcmd__help"
                ;;
            ppa__vmm__subcmd__host__subcmd__help,list)
                cmd="ppa__vmm__subcmd__host__subcmd__help__subcmd__list"
                ;;
            ppa__vmm__subcmd__host__subcmd__help,serve)
                cmd="ppa__vmm__subcmd__host__subcmd__help__subcmd__serve"
                ;;
            ppa__vmm__subcmd__host__subcmd__help,top)
                cmd="ppa__vmm__subcmd__host__subcmd__help__subcmd__top"
                ;;
            *)
                ;;
        esac
    done

    case "${cmd}" in
        ppa__vmm)
            opts="-h -V --help --version run demo firecracker ctl top host completions man schema bench help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 1 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__bench)
            opts="-h --json --window-ms --vcpus --rate --client-nice --periods --hogs --packets --echoes --blocks --poll-us --rounds --exits --help overhead socket limit net disk start stops"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --window-ms)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --vcpus)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --rate)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --client-nice)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --periods)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --packets)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --echoes)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --blocks)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --poll-us)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --rounds)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --exits)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__completions)
            opts="-h --help bash elvish fish powershell zsh"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__ctl)
            opts="-h --api-sock --text --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --api-sock)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__demo)
            opts="-h --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__firecracker)
            opts="-h --api-sock --config-file --no-api --id --level --log-path --show-level --show-log-origin --module --metrics-path --http-api-max-payload-size --no-seccomp --seccomp-filter --boot-timer --start-time-us --start-time-cpu-us --parent-cpu-time-us --ppa-config --run-dir --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --api-sock)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --config-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --id)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --level)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --log-path)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --module)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --metrics-path)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --http-api-max-payload-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --seccomp-filter)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --start-time-us)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --start-time-cpu-us)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --parent-cpu-time-us)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --ppa-config)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --run-dir)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__help)
            opts="run demo firecracker ctl top host completions man schema bench help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__help__subcmd__bench)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__help__subcmd__completions)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__help__subcmd__ctl)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__help__subcmd__demo)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__help__subcmd__firecracker)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__help__subcmd__help)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__help__subcmd__host)
            opts="list top serve"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__help__subcmd__host__subcmd__list)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__help__subcmd__host__subcmd__serve)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__help__subcmd__host__subcmd__top)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__help__subcmd__man)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__help__subcmd__run)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__help__subcmd__schema)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__help__subcmd__top)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__host)
            opts="-h --help list top serve help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__host__subcmd__help)
            opts="list top serve help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__host__subcmd__help__subcmd__help)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__host__subcmd__help__subcmd__list)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__host__subcmd__help__subcmd__serve)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__host__subcmd__help__subcmd__top)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 4 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__host__subcmd__list)
            opts="-h --run-dir --json --timeout-ms --interval-ms --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --run-dir)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --timeout-ms)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --interval-ms)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__host__subcmd__serve)
            opts="-h --run-dir --metrics-listen --compat --scrape-timeout-ms --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --run-dir)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --metrics-listen)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --compat)
                    COMPREPLY=($(compgen -W "kubevirt libvirt" -- "${cur}"))
                    return 0
                    ;;
                --scrape-timeout-ms)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__host__subcmd__top)
            opts="-h --run-dir --once --batch --interval-ms --sort --expand --timeout-ms --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --run-dir)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --batch)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --interval-ms)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --sort)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --expand)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --timeout-ms)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__man)
            opts="-h --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__run)
            opts="-h --config --vcpus --memory-mib --prefault --guest --tiny-image --kernel --initrd --cmdline --workload --report --report-file --histograms-file --max-runtime --kvm-device --accounting --histogram-bits --kernel-trace --threshold --name --run-dir --api-sock --metrics-addr --client-timeout --idle-timeout --cpu-limit --vcpu-group --limit-backend --limit-kick --runaway --overload --overload-action --ppa-page-size --ppa-page-file --guest-metrics-threads --seccomp --net --disk --pin --memory-backing --numa-node --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --config)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --vcpus)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --memory-mib)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --prefault)
                    COMPREPLY=($(compgen -W "true false" -- "${cur}"))
                    return 0
                    ;;
                --guest)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tiny-image)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --kernel)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --initrd)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --cmdline)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --workload)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --report)
                    COMPREPLY=($(compgen -W "json text none" -- "${cur}"))
                    return 0
                    ;;
                --report-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --histograms-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-runtime)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --kvm-device)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --accounting)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --histogram-bits)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --kernel-trace)
                    COMPREPLY=($(compgen -W "true false" -- "${cur}"))
                    return 0
                    ;;
                --threshold)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --name)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --run-dir)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --api-sock)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --metrics-addr)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --client-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --idle-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --cpu-limit)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --vcpu-group)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --limit-backend)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --limit-kick)
                    COMPREPLY=($(compgen -W "timer limiter" -- "${cur}"))
                    return 0
                    ;;
                --runaway)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --overload)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --overload-action)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --ppa-page-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --ppa-page-file)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --guest-metrics-threads)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --seccomp)
                    COMPREPLY=($(compgen -W "none log kill" -- "${cur}"))
                    return 0
                    ;;
                --net)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --disk)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --pin)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --memory-backing)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --numa-node)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__schema)
            opts="-h --help request response event version stats vcpu threads groups guest report config"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        ppa__subcmd__vmm__subcmd__top)
            opts="-h --api-sock --once --interval --sort --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --api-sock)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --interval)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --sort)
                    COMPREPLY=($(compgen -W "vcpu used guest sys vmm rdy idle lmtd psd exits" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
    esac
}

if [[ "${BASH_VERSINFO[0]}" -eq 4 && "${BASH_VERSINFO[1]}" -ge 4 || "${BASH_VERSINFO[0]}" -gt 4 ]]; then
    complete -F _ppa__vmm -o nosort -o bashdefault -o default ppa-vmm
else
    complete -F _ppa__vmm -o bashdefault -o default ppa-vmm
fi
