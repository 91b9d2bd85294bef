#!/usr/bin/env bash
# Remove what edged's install.sh put down: the releases in /opt/edged, the units, the sysusers and
# tmpfiles entries and the runtime directory. The configuration (/etc/edged), the state (/var/lib/edged)
# and the logs (/var/log/edged) are kept unless --purge, which also removes the edged user.
#
# Options: --root DIR (uninstall from under DIR), --no-systemd (do not call systemctl), --purge, --dry-run.
set -euo pipefail

ROOT=""
PURGE=0
DRY_RUN=0
USE_SYSTEMD=auto

say() { printf 'uninstall.sh: %s\n' "$*"; }
die() { printf 'uninstall.sh: error: %s\n' "$*" >&2; exit 1; }
act() { if [ "$DRY_RUN" = 1 ]; then printf 'uninstall.sh: would run: %s\n' "$*"; else "$@"; fi; }
done_say() { [ "$DRY_RUN" = 1 ] || say "$*"; }  # what happened: a dry run printed "would run" instead

parse_args() {
    while [ $# -gt 0 ]; do
        case "$1" in
            --root) ROOT="${2:?--root needs a directory}"; shift ;;
            --root=*) ROOT="${1#--root=}" ;;
            --purge) PURGE=1 ;;
            --dry-run) DRY_RUN=1 ;;
            --no-systemd) USE_SYSTEMD=no ;;
            -h|--help) sed -n '2,7p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
            *) die "unknown option $1 (see --help)" ;;
        esac
        shift
    done
    if [ -n "$ROOT" ]; then
        [ -d "$ROOT" ] || die "--root $ROOT is not a directory"
        ROOT="$(cd "$ROOT" && pwd)"
        [ "$ROOT" = / ] && ROOT=""
    fi
    if [ "$USE_SYSTEMD" = auto ]; then
        if [ -z "$ROOT" ] && [ -d /run/systemd/system ]; then USE_SYSTEMD=yes; else USE_SYSTEMD=no; fi
    fi
}

remove() {  # remove PATH...: delete what exists, say what went
    local path
    for path in "$@"; do
        if [ -e "$path" ] || [ -L "$path" ]; then act rm -rf "$path"; done_say "removed $path"; fi
    done
}

stop_units() {
    [ "$USE_SYSTEMD" = yes ] || return 0
    act systemctl disable --now edged-update.path edged-update.service edged.service edged.socket || true
    # on its own: one unit file missing (an install older than it) would stop the line above
    act systemctl disable --now edged-grpc.socket || true
}

main() {
    parse_args "$@"
    [ -z "$ROOT" ] && [ "$(id -u)" != 0 ] && [ "$DRY_RUN" = 0 ] && die "run as root (or use --root DIR)"
    stop_units
    remove "$ROOT/etc/systemd/system/edged.service" "$ROOT/etc/systemd/system/edged.socket" \
        "$ROOT/etc/systemd/system/edged-grpc.socket" \
        "$ROOT/etc/systemd/system/edged-update.service" "$ROOT/etc/systemd/system/edged-update.path" \
        "$ROOT/etc/sysusers.d/edged.conf" "$ROOT/etc/tmpfiles.d/edged.conf" \
        "$ROOT/opt/edged" "$ROOT/run/edged"
    # the enable links: systemctl disable removes them on a live system; a staged image (--root) has them from
    # install.sh --root, and a link left to a removed unit file would be a dangling "wants" at its next boot
    remove "$ROOT/etc/systemd/system/sockets.target.wants/edged.socket" \
        "$ROOT/etc/systemd/system/sockets.target.wants/edged-grpc.socket" \
        "$ROOT/etc/systemd/system/multi-user.target.wants/edged.service" \
        "$ROOT/etc/systemd/system/multi-user.target.wants/edged-update.service" \
        "$ROOT/etc/systemd/system/paths.target.wants/edged-update.path"
    [ "$USE_SYSTEMD" = yes ] && act systemctl daemon-reload
    if [ "$PURGE" = 1 ]; then
        remove "$ROOT/etc/edged" "$ROOT/var/lib/edged" "$ROOT/var/log/edged" "$ROOT/var/lib/edged-update" \
            "$ROOT/etc/systemd/system/edged.service.d"
        if [ -z "$ROOT" ] && id edged >/dev/null 2>&1; then act userdel edged; done_say "removed the user edged"; fi
    else
        say "$( [ "$DRY_RUN" = 1 ] && echo "would keep" || echo kept ) the configuration $ROOT/etc/edged, the state $ROOT/var/lib/edged and the logs $ROOT/var/log/edged (--purge removes them)"
    fi
    if [ "$DRY_RUN" = 1 ]; then say "dry run: nothing was changed"; else say "done"; fi
}

main "$@"
