#!/usr/bin/env bash
# Install (or upgrade, or roll back) edged from this unpacked tarball, without any network.
#
#   sudo ./install.sh              install or upgrade; the previous release is kept for --rollback
#   sudo ./install.sh --rollback   switch back to the previous release
#
# Options: --root DIR (install under DIR instead of /: directories and files only, no users, no systemctl;
#          the units are enabled by links as `systemctl --root DIR enable` makes, and the first boot's
#          systemd-sysusers and systemd-tmpfiles create the user and give /etc/edged its group edged),
#          --no-systemd (create the user and directories by hand, do not install the units),
#          --dry-run (check everything, print what would be done, change nothing), --python PATH,
#          --no-restart (leave edged running as it is: edged-update restarts it itself and checks it).
#
# Layout: /opt/edged/releases/<version> is a venv (--system-site-packages, so JetPack's TensorRT is
# visible); /opt/edged/current and /opt/edged/previous are symlinks switched atomically (rename of a new
# link over the old one). A release is built in a temporary directory and renamed into place at the end;
# any failure removes it and leaves the installed release untouched (one killed before its cleanup, by a
# power cut or kill -9, is removed by the next run's prune). The venv's paths are written for
# /opt/edged (never for --root), so an image staged with --root runs at its real path. The units travel with
# the release (share/edged/systemd): they are installed when the release becomes current, and --rollback
# reinstalls the previous release's units.
set -euo pipefail
umask 022

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT=""
DRY_RUN=0
ROLLBACK=0
USE_SYSTEMD=auto
RESTART=1
PYTHON=""
MIN_FREE_MB=0

say() { printf 'install.sh: %s\n' "$*"; }
die() { printf 'install.sh: error: %s\n' "$*" >&2; exit 1; }
act() {  # run a command that changes the system, or print it under --dry-run
    if [ "$DRY_RUN" = 1 ]; then printf 'install.sh: would run: %s\n' "$*"; else "$@"; fi
}
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; }  # the header

parse_args() {
    while [ $# -gt 0 ]; do
        case "$1" in
            --root) ROOT="${2:?--root needs a directory}"; shift ;;
            --root=*) ROOT="${1#--root=}" ;;
            --no-systemd) USE_SYSTEMD=no ;;
            --dry-run) DRY_RUN=1 ;;
            --rollback) ROLLBACK=1 ;;
            --no-restart) RESTART=0 ;;
            --python) PYTHON="${2:?--python needs a path}"; shift ;;
            --python=*) PYTHON="${1#--python=}" ;;
            --min-free-mb) MIN_FREE_MB="${2:?--min-free-mb needs a number}"; shift ;;
            -h|--help) usage; exit 0 ;;
            *) die "unknown option $1 (see --help)" ;;
        esac
        shift
    done
    if [ -n "$ROOT" ]; then
        mkdir -p "$ROOT" && ROOT="$(cd "$ROOT" && pwd)"
        [ "$ROOT" = / ] && ROOT=""
    fi
    OPT="$ROOT/opt/edged"
    if [ "$USE_SYSTEMD" = auto ]; then
        if [ -z "$ROOT" ] && [ -d /run/systemd/system ]; then USE_SYSTEMD=yes; else USE_SYSTEMD=no; fi
    fi
}

manifest() {  # manifest KEY: a top-level value of manifest.json
    "$PYTHON" -c 'import json,sys; v=json.load(open(sys.argv[1]))[sys.argv[2]]; print("" if v is None else v)' \
        "$HERE/manifest.json" "$1"
}

find_python() {
    local want candidate
    want="$(grep -o '"python": *"[0-9.]*"' "$HERE/manifest.json" | grep -o '[0-9][0-9.]*' || true)"
    [ -n "$want" ] || die "$HERE/manifest.json names no Python version: is this an edged tarball?"
    if [ -z "$PYTHON" ]; then
        for candidate in "python$want" python3 /usr/bin/python3; do
            if command -v "$candidate" >/dev/null 2>&1; then PYTHON="$(command -v "$candidate")"; break; fi
        done
    fi
    [ -n "$PYTHON" ] || die "this package is built for Python $want and no python$want was found; install it or pass --python PATH"
    if [ "${PYTHON#*/}" = "$PYTHON" ]; then  # a bare name, as for python3.10: looked up on PATH
        command -v "$PYTHON" >/dev/null 2>&1 || die "--python $PYTHON: no such command on PATH; pass the path of a Python $want"
        PYTHON="$(command -v "$PYTHON")"
    fi
    [ -f "$PYTHON" ] && [ -x "$PYTHON" ] || die "--python $PYTHON: not an executable file; pass the path of a Python $want (for example /usr/bin/python$want)"
    local have
    have="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" \
        || die "$PYTHON does not run as a Python interpreter (\"$PYTHON -c 'import sys'\" failed); pass the path of a Python $want"
    [ "$have" = "$want" ] || die "this package is built for Python $want, but $PYTHON is Python $have: use a tarball built with --python $have, or pass --python PATH to a Python $want"
    "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null \
        || die "$PYTHON cannot create virtual environments: install python$want-venv"
}

check_platform() {
    local platform machine
    platform="$(manifest platform)"
    machine="linux_$(uname -m)"
    [ "$platform" = "$machine" ] \
        || die "this package is built for $platform, but this machine is $machine: build one with --platform $machine"
}

check_sums() {
    say "checking SHA256SUMS"
    (cd "$HERE" && sha256sum --quiet --strict -c SHA256SUMS) >&2 \
        || die "the package is damaged (SHA256SUMS mismatch above); download or copy it again"
}

check_space() {
    local need_kb free_kb dir="$OPT"
    need_kb=$(( $(du -sk "$HERE/wheelhouse" | cut -f1) * 4 + 65536 + MIN_FREE_MB * 1024 ))
    while [ ! -d "$dir" ]; do dir="$(dirname "$dir")"; done
    free_kb="$(df -Pk "$dir" | awk 'NR == 2 { print $4 }')"
    [ "$free_kb" -ge "$need_kb" ] \
        || die "not enough free space on $dir: need $(( need_kb / 1024 )) MB, have $(( free_kb / 1024 )) MB; free some space (old releases live in $OPT/releases)"
}

PARTIAL=""
CREATED=""  # the topmost directory this run created for the release, removed again on failure
cleanup() {
    local status=$?
    if [ -n "$PARTIAL" ] && [ "$DRY_RUN" = 0 ]; then
        say "failed: removing the incomplete release $PARTIAL"
        rm -rf "$PARTIAL"
        if [ -n "$CREATED" ]; then rm -rf "$CREATED"; fi
    fi
    exit "$status"
}

switch_link() {  # switch_link NAME TARGET: point $OPT/NAME at TARGET (relative) by renaming a new link over it
    act ln -sfn "$2" "$OPT/.$1.new"
    act mv -T "$OPT/.$1.new" "$OPT/$1"
}

relocate() {  # relocate TMP FINAL: rewrite the venv's own paths before it is renamed into place
    # FINAL is the path the release has on the running device (no --root prefix): an image staged with
    # --root must start at its real path. The rewrite is a literal string replacement (no sed pattern),
    # so paths holding | & or \ are safe.
    local tmp="$1" final="$2"
    if [ "$DRY_RUN" = 1 ]; then say "would rewrite the venv's paths from $tmp to $final"; return; fi
    "$PYTHON" - "$tmp" "$final" <<'PY'
import os, sys
tmp, final = sys.argv[1], sys.argv[2]
old, new = tmp.encode(), final.encode()
names = [os.path.join(tmp, "pyvenv.cfg")]
bin_dir = os.path.join(tmp, "bin")
names += [os.path.join(bin_dir, n) for n in os.listdir(bin_dir)]
for name in names:
    if os.path.islink(name) or not os.path.isfile(name):
        continue  # bin/python links to the system interpreter: nothing of ours inside
    with open(name, "rb") as f:
        data = f.read()
    if old in data:
        mode = os.stat(name).st_mode
        with open(name + ".relocate", "wb") as f:
            f.write(data.replace(old, new))
        os.chmod(name + ".relocate", mode)
        os.replace(name + ".relocate", name)
PY
    # Byte code carries source paths for tracebacks: compile all of it (-f: pip's own came from ensurepip
    # with the temporary path) for the final path; the service cannot write to /opt at run time.
    act "$tmp/bin/python" -m compileall -f -q -j 0 -s "$tmp" -p "$final" "$tmp/lib" >/dev/null
}

build_release() {  # build_release VERSION EXTRAS
    local version="$1" extras="$2" rel="$OPT/releases/$1" tmp="$OPT/releases/.partial-$1" spec="edged"
    if [ -f "$rel/.edged-release" ]; then say "release $version is already installed in $rel"; return; fi
    if [ -e "$rel" ]; then say "removing the incomplete release $rel"; act rm -rf "$rel"; fi
    local dir="$OPT/releases"
    while [ ! -e "$dir" ]; do CREATED="$dir"; dir="$(dirname "$dir")"; done
    [ -n "$extras" ] && spec="edged[$extras]"
    act mkdir -p "$OPT/releases"
    PARTIAL="$tmp"
    act rm -rf "$tmp"
    say "creating the venv for $version (with the system site packages, for JetPack's TensorRT)"
    act "$PYTHON" -m venv --system-site-packages "$tmp"
    say "installing $spec==$version from the wheelhouse (no network)"
    act env PIP_NO_INDEX=1 PIP_CONFIG_FILE=/dev/null "$tmp/bin/python" -m pip install --quiet --no-index \
        --no-cache-dir --no-compile --disable-pip-version-check --find-links "$HERE/wheelhouse" "$spec==$version"
    relocate "$tmp" "${rel#"$ROOT"}"
    act mkdir -p "$tmp/share/edged" "$tmp/share/doc/edged"
    # The units travel with the release: activation and --rollback install the ones of the release they
    # switch to.
    act cp -R "$HERE/systemd" "$HERE/edged.toml" "$HERE/manifest.json" "$HERE/install.sh" "$HERE/uninstall.sh" \
        "$tmp/share/edged/"
    act cp "$HERE/README.md" "$tmp/share/doc/edged/README.md"
    act touch "$tmp/.edged-release"
    act mv -T "$tmp" "$rel"
    PARTIAL=""
    say "installed edged $version in $rel"
}

resolved() {  # resolved LINK: the release directory LINK points at, absolute, with --root applied
    local target
    target="$(readlink "$1" 2>/dev/null)" || return 0
    case "$target" in
        /*) target="$ROOT$target" ;;  # an absolute link names a path on the device, i.e. under --root
        *) target="$(dirname "$1")/$target" ;;
    esac
    realpath -m "$target"
}

release_of() {  # release_of LINK: "releases/<version>" for the release LINK resolves to, or nothing
    local target
    target="$(resolved "$1")"
    [ -n "$target" ] && [ "$(realpath -m "$(dirname "$target")")" = "$(realpath -m "$OPT/releases")" ] \
        && printf 'releases/%s\n' "${target##*/}"
    return 0
}

activate() {  # activate VERSION: previous <- current, current <- the release
    local new="releases/$1" old
    old="$(release_of "$OPT/current")"
    if [ "$old" = "$new" ]; then say "edged $1 is already the current release"; return; fi
    if [ -n "$old" ]; then switch_link previous "$old"; say "previous -> $old"; fi
    switch_link current "$new"
    say "current -> $new"
}

prune() {  # keep only the current and the previous release, compared as resolved paths
    local keep_current keep_previous dir
    keep_current="$(resolved "$OPT/current")"
    keep_previous="$(resolved "$OPT/previous")"
    # a run killed mid-build (power cut, kill -9: its cleanup never ran) leaves its .partial-<v>: never served
    for dir in "$OPT"/releases/.partial-*; do
        [ -d "$dir" ] || continue
        say "removing the incomplete release $dir"; act rm -rf "$dir"
    done
    for dir in "$OPT"/releases/*; do
        [ -d "$dir" ] || continue
        case "$(realpath -m "$dir")" in
            "$keep_current"|"$keep_previous") ;;
            *) say "removing the old release $dir"; act rm -rf "$dir" ;;
        esac
    done
}

setup_user_and_dirs() {  # setup_user_and_dirs RELEASE_DIR
    local units="$1/share/edged/systemd"
    if [ -n "$ROOT" ]; then
        act install -d -m 0750 "$ROOT/etc/edged" "$ROOT/var/lib/edged" "$ROOT/var/log/edged"
        return
    fi
    if [ "$USE_SYSTEMD" = yes ]; then
        act systemd-sysusers "$units/sysusers.d/edged.conf"
        act systemd-tmpfiles --create "$units/tmpfiles.d/edged.conf"
        return
    fi
    getent group edged >/dev/null || act groupadd --system edged
    id edged >/dev/null 2>&1 || act useradd --system --gid edged --home-dir /var/lib/edged --no-create-home \
        --shell /usr/sbin/nologin --comment "edged inference daemon" edged
    local group
    for group in video render; do
        if getent group "$group" >/dev/null; then act usermod -aG "$group" edged; fi
    done
    act install -d -m 0750 -o edged -g edged /var/lib/edged /var/log/edged
    act install -d -m 0750 -o root -g edged /etc/edged
}

put() {  # put SOURCE DEST: install a 0644 file by renaming it over DEST, so a unit is never half written
    act install -D -m 0644 "$1" "$2.new"
    act mv -T "$2.new" "$2"
}

install_units() {  # install_units RELEASE_DIR: the units of the release that is (now) current
    [ "$USE_SYSTEMD" = yes ] || [ -n "$ROOT" ] || { say "not installing the systemd units (--no-systemd)"; return; }
    local units="$1/share/edged/systemd"
    [ "$DRY_RUN" = 1 ] || [ -f "$units/edged.service" ] || die "$units holds no edged.service"
    put "$units/edged.service" "$ROOT/etc/systemd/system/edged.service"
    put "$units/edged.socket" "$ROOT/etc/systemd/system/edged.socket"
    put "$units/sysusers.d/edged.conf" "$ROOT/etc/sysusers.d/edged.conf"
    put "$units/tmpfiles.d/edged.conf" "$ROOT/etc/tmpfiles.d/edged.conf"
    local unit
    for unit in edged-update.service edged-update.path edged-grpc.socket; do  # older releases lack them
        if [ -f "$units/$unit" ] || [ "$DRY_RUN" = 1 ]; then put "$units/$unit" "$ROOT/etc/systemd/system/$unit"; fi
    done
    if [ "$USE_SYSTEMD" = yes ]; then act systemctl daemon-reload; fi
    say "installed the units of ${1#"$OPT/"} in $ROOT/etc/systemd/system"
}

want() {  # want TARGET UNIT: the link `systemctl --root enable` makes for a unit's WantedBy=TARGET
    act install -d -m 0755 "$ROOT/etc/systemd/system/$1.wants"
    act ln -sfn "/etc/systemd/system/$2" "$ROOT/etc/systemd/system/$1.wants/$2"
}

enable_staged_units() {  # a staged image has no systemd running: its units are enabled by their links
    want sockets.target edged.socket
    want multi-user.target edged.service
    if [ -f "$ROOT/etc/systemd/system/edged-update.path" ] || [ "$DRY_RUN" = 1 ]; then
        want paths.target edged-update.path
        want multi-user.target edged-update.service
    fi
    say "enabled edged.socket and edged.service in $ROOT/etc/systemd/system (they start at the image's boot)"
}

enable_units() {
    if [ -n "$ROOT" ]; then enable_staged_units; return; fi
    [ "$USE_SYSTEMD" = yes ] || return 0
    act systemctl enable edged.socket edged.service
    if [ -f /etc/systemd/system/edged-update.path ] || [ "$DRY_RUN" = 1 ]; then
        act systemctl enable edged-update.path edged-update.service
        act systemctl start edged-update.path
    fi
    if [ "$RESTART" = 1 ]; then act systemctl try-restart edged.service; fi
    say "enabled edged.socket and edged.service (start now: systemctl start edged)"
    # edged-grpc.socket is installed, not enabled: gRPC is off until [server] grpc_socket is set (README)
}

install_config() {
    local config="$ROOT/etc/edged/edged.toml"
    if [ -e "$config" ]; then
        say "kept the existing $config (the new defaults are in $OPT/current/share/edged/edged.toml)"
        return
    fi
    if [ -n "$ROOT" ]; then act install -m 0640 "$HERE/edged.toml" "$config"
    else act install -m 0640 -o root -g edged "$HERE/edged.toml" "$config"; fi
    say "wrote the default configuration $config"
}

install_ota_root() {
    # The fleet's trusted root (build-tarball --ota-root): the first trust anchor of [ota]; an existing one is
    # kept, because python-tuf rotates the trusted root through the repository's own metadata afterwards.
    [ -f "$HERE/ota-root.json" ] || return 0
    local root="$ROOT/etc/edged/ota/root.json"
    if [ -e "$root" ]; then
        say "kept the existing trusted OTA root $root"
        return
    fi
    act install -d -m 0755 "$ROOT/etc/edged/ota"
    act install -m 0644 "$HERE/ota-root.json" "$root"
    say "installed the fleet's trusted OTA root $root"
}

rollback() {
    local current previous
    previous="$(release_of "$OPT/previous")"
    current="$(release_of "$OPT/current")"
    [ -n "$previous" ] || die "no previous release to roll back to in $OPT"
    [ -f "$OPT/$previous/.edged-release" ] || die "the previous release $OPT/$previous is missing or incomplete"
    switch_link current "$previous"
    if [ -n "$current" ]; then switch_link previous "$current"; fi
    say "rolled back: current -> $previous${current:+ (previous -> $current)}"
    install_units "$OPT/$previous"
    if [ "$USE_SYSTEMD" = yes ] && [ "$RESTART" = 1 ]; then act systemctl try-restart edged.service; fi
}

main() {
    parse_args "$@"
    [ -z "$ROOT" ] && [ "$(id -u)" != 0 ] && [ "$DRY_RUN" = 0 ] && die "run as root (or use --root DIR)"
    if [ "$ROLLBACK" = 1 ]; then rollback; return; fi
    find_python
    check_platform
    check_sums
    check_space
    local version extras
    version="$(manifest version)"
    extras="$("$PYTHON" -c 'import json,sys; print(",".join(json.load(open(sys.argv[1]))["extras"]))' "$HERE/manifest.json")"
    [ "$DRY_RUN" = 1 ] && say "dry run: nothing will be changed"
    trap cleanup EXIT
    build_release "$version" "$extras"
    setup_user_and_dirs "$OPT/releases/$version"
    install_config
    install_ota_root
    activate "$version"
    install_units "$OPT/releases/$version"
    prune
    enable_units
    say "done: edged $version is installed in $OPT/current${ROOT:+ (under $ROOT)}"
}

main "$@"
