#!/usr/bin/env bash
# The device side on the devices' architecture (issue 21): edgekit-runtime on aarch64, under emulation.
#
#  1. a Debian bookworm arm64 rootfs (scripts/arm64/rootfs.sh; cached; cold about 7 minutes on 2 cores);
#  2. aarch64 wheels of edgekit-runtime's dependencies (scripts/arm64/requirements.txt; cached) and a
#     wheel of edgekit-runtime built here from runtime/;
#  3. digits-cnn bundles built here with .venv for raspberry-pi-5 and arm64-cpu at fp32 and int8,
#     signed with a throwaway fleet key;
#  4. inside the rootfs (proot + qemu-aarch64, Python 3.11): a venv with those wheels, then
#     `edgekit-agent install` of each bundle (signature, hashes, golden self-check on ARM kernels);
#  5. `edgekit-agent run` with one bundle and the broker at 127.0.0.1:1883; from the host one
#     /v1/infer request (answer compared with x86) and one telemetry window seen by a subscriber.
#
# Prints a PASS/FAIL summary with timings and exits 1 when anything failed, including when the
# check cannot run at all (no mirror, no broker, no proot). Needs the Debian packages debootstrap,
# proot, qemu-user-static and a broker on 127.0.0.1:1883 (.ci/run installs and starts them).
# Environment: EDGEKIT_ARM64_CACHE (default /var/cache/edgekit), EDGEKIT_ARM64_MIRROR,
# EDGEKIT_ARM64_KEEP=1 keeps the work directory, MQTT_PORT (default 1883).
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
cache="${EDGEKIT_ARM64_CACHE:-/var/cache/edgekit}"
export EDGEKIT_ARM64_CACHE="$cache" HF_HUB_OFFLINE=1
broker_port="${MQTT_PORT:-1883}"
work="$(mktemp -d /tmp/edgekit-arm64.XXXXXX)"
bundles=(raspberry-pi-5-fp32 raspberry-pi-5-int8 arm64-cpu-fp32 arm64-cpu-int8)
served=raspberry-pi-5-int8
fleet="ci-arm64-$$"

names=() results=() seconds=()
api_port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
overall_start=$SECONDS

summary() {
    local i status=PASS
    echo "" >&2
    echo "check_arm64: summary (emulated aarch64, Debian bookworm, Python 3.11)" >&2
    for i in "${!names[@]}"; do
        printf '  %-4s %6ss  %s\n' "${results[$i]}" "${seconds[$i]}" "${names[$i]}" >&2
        [ "${results[$i]}" = PASS ] || status=FAIL
    done
    [ "${#names[@]}" -gt 0 ] || status=FAIL
    printf 'check_arm64: %s in %s s\n' "$status" "$((SECONDS - overall_start))" >&2
}

cleanup() {
    local rc=$?
    summary
    if [ "$rc" -ne 0 ] || [ "${EDGEKIT_ARM64_KEEP:-0}" = 1 ]; then
        echo "check_arm64: work directory kept: $work" >&2
    else
        rm -rf "$work"
    fi
    exit "$rc"
}
trap cleanup EXIT

# step ID DESCRIPTION COMMAND...: run it with its output in $work/logs/ID.log; on failure show the
# log's end and stop.
step() {
    local log="$work/logs/$1.log" name=$2 start=$SECONDS
    shift 2
    echo "check_arm64: $name ..." >&2
    # In the background so that `set -e` holds inside the step (an `if` or `||` would switch it off).
    "$@" >"$log" 2>&1 &
    if wait $!; then
        names+=("$name") results+=(PASS) seconds+=("$((SECONDS - start))")
    else
        names+=("$name") results+=(FAIL) seconds+=("$((SECONDS - start))")
        echo "check_arm64: FAIL: $name; last lines of $log:" >&2
        tail -n 40 "$log" >&2
        exit 1
    fi
}

# The emulated machine: a Cortex-A76 (the Raspberry Pi 5's core) with the /proc/cpuinfo and CPU lists
# of a 4-core Pi 5 bound over the host's. ONNX Runtime's CPU detection (cpuinfo) reads both; with the
# host's x86 /proc/cpuinfo and /sys it segfaults at import, and with no /sys at all it fails to
# initialise and the agent later dies of heap corruption. Set in main once the rootfs is known.
proot_cmd=()
set_proot_cmd() {
    mkdir -p "$work/cpu"
    local list
    for list in possible present online; do echo 0-3 >"$work/cpu/$list"; done
    proot_cmd=(proot -q "qemu-aarch64-static -cpu cortex-a76" -r "$rootfs" -b /dev -b /proc
               -b "$repo/scripts/arm64/proc-cpuinfo:/proc/cpuinfo" -b "$work/cpu:/sys/devices/system/cpu"
               -b "$work:/check" -w /check
               /usr/bin/env -i HOME=/root LANG=C.UTF-8 PATH=/usr/local/bin:/usr/bin:/bin /bin/bash /check/guest.sh)
}

guest() {
    "${proot_cmd[@]}" "$@"
}

preflight() {
    local tool
    for tool in debootstrap proot qemu-aarch64-static; do
        command -v "$tool" || { echo "$tool not found: apt-get install debootstrap proot qemu-user-static"; return 1; }
    done
    [ -x .venv/bin/python ] || { echo ".venv is missing: run ./scripts/setup.sh first"; return 1; }
    (exec 3<>"/dev/tcp/127.0.0.1/$broker_port") || { echo "no MQTT broker on 127.0.0.1:$broker_port"; return 1; }
}

rootfs_ready() {
    scripts/arm64/rootfs.sh >"$work/rootfs.path"
    [ -f "$(cat "$work/rootfs.path")/.edgekit-ready" ]
}

fetch_wheels() {
    local flags=(--only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none
                 --platform manylinux_2_36_aarch64 --platform manylinux_2_28_aarch64
                 --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64)
    local key dir
    key="$(cat scripts/arm64/requirements.txt <(printf '%s\n' "${flags[@]}") | sha256sum | cut -c1-16)"
    dir="$cache/arm64-wheels/$key"
    if [ ! -f "$dir/.complete" ]; then
        rm -rf "$dir.partial"
        .venv/bin/python -m pip download --disable-pip-version-check --dest "$dir.partial" "${flags[@]}" \
            -r scripts/arm64/requirements.txt
        touch "$dir.partial/.complete"
        rm -rf "$dir"
        mv "$dir.partial" "$dir"
        # wheels of an older list are stale
        find "$cache/arm64-wheels" -mindepth 1 -maxdepth 1 ! -name "$key" -exec rm -rf {} +
    else
        echo "reusing $dir"
    fi
    cp -r "$dir" "$work/wheels"
    ls "$work/wheels"
}

build_runtime_wheel() {
    cp -r runtime "$work/runtime-src"
    rm -rf "$work/runtime-src/"*.egg-info "$work/runtime-src/build"
    .venv/bin/python -m pip wheel --disable-pip-version-check --no-deps --no-build-isolation \
        "$work/runtime-src" -w "$work/local-wheels"
    rm -rf "$work/runtime-src"
}

build_bundles() {
    local name target precision
    .venv/bin/edgekit keygen --out "$work/keys"
    for name in "${bundles[@]}"; do
        target=${name%-*} precision=${name##*-}
        .venv/bin/edgekit build recipes/digits-cnn.yaml --target "$target" --precision "$precision" \
            --out "$work/bundles/$name"
        .venv/bin/edgekit sign "$work/bundles/$name" --key "$work/keys/fleet.key.pem"
    done
}

write_agent_configs() {
    local name
    mkdir -p "$work/agents"
    for name in "${bundles[@]}"; do
        mkdir -p "$work/state/$name/bundles"
        cat >"$work/agents/$name.yaml" <<YAML
# written by scripts/check_arm64.sh; paths are inside the emulated rootfs (/check is the work directory)
device_id: arm64-$name
fleet: $fleet
broker:
  url: mqtt://127.0.0.1:$broker_port
bundles:
  dir: /check/state/$name/bundles
  public_key: /check/keys/fleet.pub.pem
api:
  address: 127.0.0.1:$api_port
telemetry:
  interval_s: 3
  spool:
    path: /check/state/$name/spool.db
power:
  sensor: none
YAML
    done
    cat "$work/agents/$served.yaml"
}

install_bundle() {
    guest install "$1"
}

serve_one_request() {
    "${proot_cmd[@]}" agent "$served" >"$work/logs/agent-run.log" 2>&1 &
    local agent_pid=$!  # proot's; the agent is its child
    # The agent by its command line (qemu runs it under proot; proot's children are not always just the agent), so
    # that the SIGTERM reaches it and no emulated agent outlives the step.
    local agent_command="edgekit-agent -v run --config /check/agents/$served.yaml"
    # shellcheck disable=SC2064  # expand now: this step runs in its own subshell
    trap "pkill -KILL -f -- '$agent_command'; pkill -KILL -P $agent_pid; kill -KILL $agent_pid 2>/dev/null || true" EXIT
    local rc=0
    .venv/bin/python scripts/arm64/drive_agent.py --api "127.0.0.1:$api_port" --broker "127.0.0.1:$broker_port" \
        --fleet "$fleet" --device "arm64-$served" --bundle "$work/bundles/$served" || rc=$?
    # SIGTERM to the agent itself (proot's child, which guest.sh exec'd), so that it stops as systemd
    # would stop it; proot exits with it. Only if it does not within 60 s is proot killed.
    local agent waited=0 status=0
    agent="$(pgrep -f -- "$agent_command" | head -n 1 || true)"
    [ -n "$agent" ] || agent="$(pgrep -P "$agent_pid" | head -n 1 || true)"
    echo "check_arm64: SIGTERM to the agent, pid ${agent:-$agent_pid (proot: no agent process found)}" >&2
    kill -TERM "${agent:-$agent_pid}" 2>/dev/null || true
    while kill -0 "$agent_pid" 2>/dev/null && [ "$waited" -lt 60 ]; do sleep 1; waited=$((waited + 1)); done
    pkill -KILL -f -- "$agent_command" 2>/dev/null || true
    kill -KILL "$agent_pid" 2>/dev/null || true
    wait "$agent_pid" || status=$?
    trap - EXIT
    echo "--- agent log (tail)"
    tail -n 30 "$work/logs/agent-run.log"
    echo "agent (proot) exited with status $status after SIGTERM"
    grep -q "agent stopped" "$work/logs/agent-run.log" || { echo "the agent did not log 'agent stopped'"; rc=1; }
    [ "$status" -eq 0 ] || rc=1
    return "$rc"
}

mkdir -p "$work/logs"
cp scripts/arm64/guest.sh "$work/guest.sh"
step preflight "preflight (tools, .venv, broker on 127.0.0.1:$broker_port)" preflight
step rootfs "arm64 rootfs (cache $cache/arm64-rootfs)" rootfs_ready
rootfs="$(cat "$work/rootfs.path")"
echo "check_arm64: rootfs $rootfs" >&2
set_proot_cmd
step wheels "aarch64 wheels (cache $cache/arm64-wheels)" fetch_wheels
step runtime-wheel "edgekit-runtime wheel from runtime/" build_runtime_wheel
step bundles "bundles: digits-cnn for ${bundles[*]}" build_bundles
step configs "agent configs" write_agent_configs
step guest-setup "guest venv: edgekit-runtime + aarch64 wheels" guest setup
grep '^guest:' "$work/logs/guest-setup.log" >&2 || true
for name in "${bundles[@]}"; do
    step "install-$name" "self-check on aarch64: $name (edgekit-agent install)" install_bundle "$name"
done
step agent "edgekit-agent run ($served): one /v1/infer, one telemetry window" serve_one_request
grep '^{' "$work/logs/agent.log" >&2 || true
