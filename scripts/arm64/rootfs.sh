#!/usr/bin/env bash
# Build (or reuse) a Debian bookworm arm64 root file system for scripts/check_arm64.sh, without
# privileges: `debootstrap --foreign` on the host, then its second stage under proot + qemu-aarch64.
#
# Usage: scripts/arm64/rootfs.sh            prints the path of a ready rootfs on stdout
# Cache: $EDGEKIT_ARM64_CACHE (default /var/cache/edgekit)/arm64-rootfs/<key>, where <key> hashes
#        this script, the suite, the mirror and the package list, so an edit rebuilds it and a later
#        run on the same machine reuses it. Needs: debootstrap, proot, qemu-user-static.
set -euo pipefail

suite=bookworm
mirror="${EDGEKIT_ARM64_MIRROR:-http://deb.debian.org/debian}"
# python3-venv brings ensurepip (pip for a venv inside the rootfs); minbase keeps the emulated
# second stage (dpkg under qemu, the slow part) as short as it can be.
packages=python3,python3-venv

cache_root="${EDGEKIT_ARM64_CACHE:-/var/cache/edgekit}/arm64-rootfs"
key="$(cat "$0" <(printf '%s\n' "$suite" "$mirror" "$packages") | sha256sum | cut -c1-16)"
rootfs="$cache_root/$key"

log() { printf 'arm64-rootfs: %s\n' "$*" >&2; }

for tool in debootstrap proot qemu-aarch64-static; do
    command -v "$tool" >/dev/null || { log "FAIL: $tool not found (apt-get install debootstrap proot qemu-user-static)"; exit 1; }
done

mkdir -p "$cache_root"
exec 9>"$cache_root/.lock"
flock 9   # one builder at a time; a second run waits and then reuses the result

if [ -f "$rootfs/.edgekit-ready" ]; then
    log "reusing $rootfs"
    printf '%s\n' "$rootfs"
    exit 0
fi

work="$cache_root/.build-$key"
rm -rf "$work"
start=$SECONDS
log "building $suite arm64 rootfs ($packages) from $mirror into $rootfs (about 7-8 minutes on 2 cores)"
if ! debootstrap --arch=arm64 --foreign --variant=minbase --include="$packages" \
        "$suite" "$work" "$mirror" >"$cache_root/.debootstrap-$key.log" 2>&1; then
    log "FAIL: debootstrap first stage failed (mirror $mirror reachable?); last lines of the log:"
    tail -n 20 "$cache_root/.debootstrap-$key.log" >&2
    exit 1
fi
log "first stage done in $((SECONDS - start)) s; second stage under qemu-aarch64"
# In a container the first stage may leave proc as a link to the host's /proc; proot binds it instead.
if [ -L "$work/proc" ]; then rm "$work/proc" && mkdir "$work/proc"; fi
if ! proot -0 -q qemu-aarch64-static -r "$work" -w / -b /dev -b /proc -b /sys \
        /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBOOTSTRAP_DIR=/debootstrap \
        /debootstrap/debootstrap --second-stage >>"$cache_root/.debootstrap-$key.log" 2>&1; then
    log "FAIL: debootstrap second stage failed; last lines of the log:"
    tail -n 20 "$cache_root/.debootstrap-$key.log" >&2
    [ ! -f "$work/debootstrap/debootstrap.log" ] || tail -n 20 "$work/debootstrap/debootstrap.log" >&2
    exit 1
fi
machine="$(proot -q qemu-aarch64-static -r "$work" -w / /usr/bin/uname -m)"
[ "$machine" = aarch64 ] || { log "FAIL: the rootfs reports machine '$machine', not aarch64"; exit 1; }
rm -rf "$work/var/cache/apt/archives/"*.deb
mv "$cache_root/.debootstrap-$key.log" "$work/.edgekit-debootstrap.log"
touch "$work/.edgekit-ready"
rm -rf "$rootfs"
mv "$work" "$rootfs"
# Whatever other keys left (an edited script, an interrupted build) is stale: keep only this one.
find "$cache_root" -mindepth 1 -maxdepth 1 ! -name "$key" ! -name .lock -exec rm -rf {} +
log "built $rootfs in $((SECONDS - start)) s"
printf '%s\n' "$rootfs"
