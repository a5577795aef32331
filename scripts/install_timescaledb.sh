#!/usr/bin/env bash
# OPTIONAL, not run by CI or scripts/setup.sh: build TimescaleDB from source and install it into the system
# PostgreSQL (Debian's postgresql-15), so the fleet store's TimescaleDB path and tests/fleet/test_timescale_store.py
# can run. TimescaleDB is in neither Debian's archive nor PyPI/npm, so it is built here.
#
#   sudo scripts/install_timescaledb.sh                      # git clone of tag $TIMESCALEDB_TAG from GitHub
#   sudo TIMESCALEDB_SRC=/path/to/timescaledb scripts/install_timescaledb.sh   # an unpacked source tree
#   sudo TIMESCALEDB_GIT_DIR=/path/to/timescaledb.git scripts/install_timescaledb.sh   # a local clone or bare
#        mirror without network access: the tag is exported from it (git archive) into $TIMESCALEDB_WORK/src
#
# The tree's version.config must name $TIMESCALEDB_TAG (checked: a snapshot of another branch is refused).
# Re-running is safe: the build folder is made anew (BUILD_FORCE_REMOVE), and the installed library is checked.
#
# 2.28.3 is the last release that builds for PostgreSQL 15 (2.29 supports 16-18 only). Installing copies
# timescaledb*.so into `pg_config --pkglibdir` and the extension scripts into `pg_config --sharedir`/extension;
# nothing is loaded until a server sets shared_preload_libraries='timescaledb' (and restarts): a running server
# is not touched. The fleet store then creates the extension in its database when it opens (docs/fleet.md).
set -euo pipefail

TAG="${TIMESCALEDB_TAG:-2.28.3}"
PG_MAJOR="${PG_MAJOR:-15}"
WORK="${TIMESCALEDB_WORK:-/tmp/ts}"

PACKAGES=("postgresql-server-dev-${PG_MAJOR}" libkrb5-dev libssl-dev cmake gcc make git)
apt-get install -y -q "${PACKAGES[@]}" || { apt-get update -q && apt-get install -y -q "${PACKAGES[@]}"; }

mkdir -p "$WORK"
if [[ -n "${TIMESCALEDB_SRC:-}" ]]; then
    SRC="$TIMESCALEDB_SRC"
elif [[ -n "${TIMESCALEDB_GIT_DIR:-}" ]]; then
    SRC="$WORK/src"
    rm -rf "$SRC" && mkdir -p "$SRC"
    git --git-dir="$TIMESCALEDB_GIT_DIR" rev-parse --verify -q "refs/tags/$TAG" >/dev/null || {
        echo "TIMESCALEDB_GIT_DIR=$TIMESCALEDB_GIT_DIR has no tag $TAG (git tag there lists what it has)" >&2; exit 1; }
    git --git-dir="$TIMESCALEDB_GIT_DIR" archive "$TAG" | tar -x -C "$SRC"
else
    SRC="$WORK/src"
    rm -rf "$SRC"
    git clone --depth 1 --branch "$TAG" https://github.com/timescale/timescaledb.git "$SRC"
fi

cd "$SRC"
FOUND="$(sed -n 's/^version *= *//p' version.config | head -1)"
if [[ "$FOUND" != "$TAG" ]]; then
    echo "$SRC/version.config says version $FOUND, not $TIMESCALEDB_TAG=$TAG: export the $TAG tag (or set TIMESCALEDB_TAG)" >&2
    exit 1
fi
BUILD_FORCE_REMOVE=true ./bootstrap -DREGRESS_CHECKS=OFF -DTAP_CHECKS=OFF -DWARNINGS_AS_ERRORS=OFF -DCMAKE_BUILD_TYPE=Release \
    -DPG_CONFIG="$(command -v pg_config)"
make -C build -j"$(nproc)"
make -C build install

LIB="$(pg_config --pkglibdir)/timescaledb-$TAG.so"
[[ -f "$LIB" ]] || { echo "make install did not leave $LIB" >&2; exit 1; }
echo "installed: $(ls "$(pg_config --pkglibdir)"/timescaledb*.so | tr '\n' ' ')"
echo "use it: start a server with -c shared_preload_libraries=timescaledb (tests do so on a private instance)"
